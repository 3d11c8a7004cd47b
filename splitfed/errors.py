"""Errors a user can act on: the CLI prints them as one line and exits with their ``exit_code``."""

import difflib
from collections.abc import Iterable


class SplitfedError(Exception):
    """Base class for errors caused by input (bad cuts, bad config, bad model path): exit code 2.

    Failures of a run that had started (a round, the simulation engine) say ``exit_code = 1``,
    so a script can tell "refused before anything ran" from "ran and failed".
    """

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``docker stop``, systemd, Slurm): stop the way Ctrl-C does, exit code 143."""


class CutError(SplitfedError):
    """A cut vector is illegal for the model, or the model has no legal cut."""


class ConfigError(SplitfedError):
    """A config, fleet file or CLI value is malformed or impossible."""


class RunFolderError(SplitfedError):
    """The run folder could not be written (disk full, read-only, gone) while a run was going: what it
    held before the failed write is kept, so the run can be continued with ``--resume`` once it is fixed."""

    exit_code = 1


class TierError(SplitfedError):
    """A tier refused a message; ``code`` names the gRPC status the transport sends back."""

    code = "INTERNAL"


class NotFound(TierError):
    code = "NOT_FOUND"


class InvalidArgument(TierError):
    code = "INVALID_ARGUMENT"


class FailedPrecondition(TierError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(TierError):
    code = "RESOURCE_EXHAUSTED"


class PermissionDenied(TierError):
    code = "PERMISSION_DENIED"


class Unavailable(TierError):
    code = "UNAVAILABLE"


def unknown_key(key: str, known: Iterable[str], where: str) -> ConfigError:
    """The refusal of a key outside ``known`` (a config, fleet file or node config): the key, the nearest
    known one when one is close (``edge_address`` -> ``edge-address``), and every known key."""
    known = sorted(known)
    return ConfigError(f"{where}: unknown key {key!r}{did_you_mean(key, known)}; known: {', '.join(known)}")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name`` (:func:`nearest`), "" when none is close."""
    near = nearest(name, known)
    return f" (did you mean {near!r}?)" if near else ""


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to a mistyped one (in any case, ``_`` or ``-``), None when none is close."""
    known = list(known)
    for form in dict.fromkeys((name, name.lower(), name.replace("_", "-").lower(), name.replace("-", "_").lower())):
        if near := difflib.get_close_matches(form, known, n=1, cutoff=0.6):
            return near[0]
    return None
