"""TOML for the files splitfed reads (run configs, fleets) and the few it writes (Flower run and node
configs, fleet entries)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from splitfed.errors import ConfigError


def read_text(path: Path, what: str) -> str:
    """The text of a TOML file, or a ConfigError naming ``what`` and the file (missing, unreadable, not UTF-8)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {e.start}): TOML files are UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None


def parse(text: str, source: str) -> dict[str, Any]:
    """A TOML document, or a ConfigError naming ``source``: a syntax error, or an integer of more than 4300
    digits (a plain ValueError from Python's int()). A leading byte order mark (Notepad, PowerShell 5's
    ``Out-File -Encoding utf8``) is dropped: tomllib refused it as "Invalid statement (at line 1, column 1)",
    a character the user cannot see."""
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))
    except ValueError as e:  # TOMLDecodeError is one
        raise ConfigError(f"{source}: not valid TOML: {e}") from None


def value(v: Any) -> str:
    """``v`` as a TOML literal. A JSON string, left in UTF-8, is a TOML basic string once DEL is escaped too
    (JSON escapes the other control characters the same way; its surrogate pairs TOML would refuse)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return json.dumps(str(v), ensure_ascii=False).replace("\x7f", "\\u007f")
