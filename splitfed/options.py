"""A model factory's keyword arguments (``--model-kwargs``, ``model-kwargs``) as one canonical JSON text.

Light (no torch): the command-line parsers read it when they parse their flags, and a run's settings keep it
as sorted JSON, so that a resume compares it with its checkpoint's as one value.
"""

from __future__ import annotations

import json
from typing import Any

from splitfed.errors import ConfigError

EXAMPLE = '\'{"width": 32}\''


def kwargs_json(text: str, key: str = "model-kwargs") -> str:
    """``text`` as sorted JSON ("" for none or ``{}``), or a ConfigError naming ``key`` ("": named by the
    caller, as argparse names a flag) and what it must be."""
    what = f"{key} must be" if key else "must be"
    if not text.strip():
        return ""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{what} a JSON object of the model factory's keyword arguments (e.g. {EXAMPLE}), "
                          f"got {text[:80]!r}: {str(e).split(';')[0]}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{what} a JSON object of the model factory's keyword arguments (e.g. {EXAMPLE}), "
                          f"got a {type(value).__name__}: {text[:80]}")
    return json.dumps(value, sort_keys=True) if value else ""


def kwargs_of(text: str) -> dict[str, Any]:
    """The keyword arguments a :func:`kwargs_json` text holds."""
    return dict(json.loads(text)) if text else {}
