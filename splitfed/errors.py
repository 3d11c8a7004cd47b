"""Errors a user can act on: the CLI prints them as one line and exits with their ``exit_code``."""


class SplitfedError(Exception):
    """Base class for errors caused by input (bad cuts, bad config, bad model path): exit code 2.

    Failures of a run that had started (a round, the simulation engine) say ``exit_code = 1``,
    so a script can tell "refused before anything ran" from "ran and failed".
    """

    exit_code = 2


class CutError(SplitfedError):
    """A cut vector is illegal for the model, or the model has no legal cut."""


class ConfigError(SplitfedError):
    """A config, fleet file or CLI value is malformed or impossible."""


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


class Unavailable(TierError):
    code = "UNAVAILABLE"
