"""TOML literals for the few files splitfed writes (Flower run and node configs, fleet entries)."""

from __future__ import annotations

import json
from typing import Any


def value(v: Any) -> str:
    """``v`` as a TOML literal. A JSON string, left in UTF-8, is a TOML basic string once DEL is escaped too
    (JSON escapes the other control characters the same way; its surrogate pairs TOML would refuse)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return json.dumps(str(v), ensure_ascii=False).replace("\x7f", "\\u007f")
