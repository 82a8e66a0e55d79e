"""Sizes and durations as written in policy limits.

Sizes: a plain integer is bytes. A string is a number and an optional unit, case-insensitive:
`B`; `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` are powers of 1024; `KB`, `MB`, `GB`, `TB`
are powers of 1000. A fraction ("1.5GiB") is rounded down to whole bytes.

Durations: a plain number is seconds, as is a bare numeric string. Otherwise one or more
number-and-unit parts in decreasing order, from `d`, `h`, `m`, `s`, `ms`: "90s", "1m30s", "500ms",
"1.5h". Units are lower case ("5M" is refused, lest it read as months).

Both must be positive; a size is at most 2**63 - 1 bytes, a duration at most 365 days.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from stockade.policy.render import show

MAX_SIZE = 2**63 - 1
MAX_DURATION = 365 * 86400.0

_NUMBER = r"(\d{1,18}(?:\.\d{1,9})?)"
_SIZE = re.compile(_NUMBER + r" ?([a-z]*)", re.ASCII | re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}
_DURATION_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", Fraction(1, 1000)))
_DURATION = re.compile("".join(f"(?:{_NUMBER}{unit})?" for unit, _ in _DURATION_UNITS), re.ASCII)
_PLAIN = re.compile(_NUMBER, re.ASCII)


def parse_size(value: object) -> int:
    """Bytes for a size such as 1024, "512MiB", "1GB" or "10k"; ValueError if invalid."""
    expected = f'expected a size such as "512MiB" or 1048576, got {show(value)}'
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(expected)
    size = value
    if isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        unit = _SIZE_UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise ValueError(expected)
        size = math.floor(Fraction(match.group(1)) * unit)
    if size <= 0:
        raise ValueError(f"expected a positive size, got {show(value)}")
    if size > MAX_SIZE:
        raise ValueError(f"expected a size of at most {MAX_SIZE} bytes, got {show(value)}")
    return size


def parse_duration(value: object) -> float:
    """Seconds for a duration such as 90, "90s", "5m", "1m30s" or "500ms"; ValueError if invalid."""
    expected = f'expected a duration such as "90s", "1m30s" or 90, got {show(value)}'
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(expected)
    seconds = _duration_string(value.strip(), expected) if isinstance(value, str) else value
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise ValueError(expected)
    if seconds <= 0:
        raise ValueError(f"expected a positive duration, got {show(value)}")
    if seconds > MAX_DURATION:
        raise ValueError(f"expected a duration of at most 365 days, got {show(value)}")
    return float(seconds)


def _duration_string(text: str, expected: str) -> Fraction:
    if _PLAIN.fullmatch(text):
        return Fraction(text)
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(expected)
    return sum(
        (Fraction(number) * scale
         for number, (_, scale) in zip(match.groups(), _DURATION_UNITS, strict=True)
         if number is not None),
        Fraction(0),
    )
