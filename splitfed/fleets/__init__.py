"""The fleets splitfed ships: the fleet files beside this module, each named by its stem (``--fleet small``).

Read with :func:`splitfed.profile.fleet.load_fleet`; listed here without it (and without numpy or torch), so
that ``splitfed optimize --help`` names them at once.
"""

from importlib import resources


def shipped_fleets() -> list[str]:
    """The names of the shipped fleets, sorted."""
    return sorted(f.name[:-5] for f in resources.files(__name__).iterdir() if f.name.endswith(".toml"))
