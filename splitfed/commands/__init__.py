"""CLI subcommands; each module is discovered by :mod:`splitfed.cli`."""
