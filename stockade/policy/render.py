"""How a policy value is shown in an error message: short, escaped, never a whole blob."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

_MAX_CHARS = 40


def show(value: object) -> str:
    """A short, printable rendering of `value` for "got ..." in error messages."""
    if isinstance(value, str):
        text = value if len(value) <= _MAX_CHARS else value[:_MAX_CHARS] + "..."
        return json.dumps(text)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 128 else "a very large integer"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return kind(value)


def kind(value: object) -> str:
    """The kind of `value` in document terms ("a string", "an array"), without its content."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return f"a {type(value).__name__}"
