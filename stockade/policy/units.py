"""Sizes and durations as written in policy limits.

Sizes: a string, a number and its unit, case-insensitive: `B` (bytes); `KiB`, `MiB`, `GiB`,
`TiB` and their short forms `K`, `M`, `G`, `T` are powers of 1024; `KB`, `MB`, `GB`, `TB` are
powers of 1000. A fraction ("1.5GiB") is rounded down to whole bytes. A number without a unit
(2048, "2048") is refused: whether it meant bytes or mebibytes cannot be told, and a memory
limit of 2048 bytes starts nothing. `format_size` writes a size back in its shortest exact
form ("2GiB", "2GB", "1536MiB", "1001B").

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
# (19 digits: every size up to MAX_SIZE can be written in bytes)
_SIZE = re.compile(r"(\d{1,19}(?:\.\d{1,9})?) ?([a-z]*)", re.ASCII | re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}
_DURATION_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", Fraction(1, 1000)))
_DURATION = re.compile("".join(f"(?:{_NUMBER}{unit})?" for unit, _ in _DURATION_UNITS), re.ASCII)
_PLAIN = re.compile(_NUMBER, re.ASCII)


# The units `format_size` writes, largest first within each base.
_SHOWN_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10),
                ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))


def parse_size(value: object) -> int:
    """Bytes for a size such as "512MiB", "2GB", "10KiB" or "4096B"; ValueError if invalid
    (a number without a unit included)."""
    expected = ('expected a size with a unit, such as "512MiB", "2GB" or "4096B", '
                f"got {show(value)}")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(expected)
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if isinstance(value, int) or (match is not None and not match.group(2)):
        number = str(value).strip()  # (bytes or mebibytes? said, not guessed)
        raise ValueError(f'expected a size with a unit, such as "{number}MiB" or "{number}B", '
                         f"got {show(value)}" if len(number) <= 20 else expected)
    unit = _SIZE_UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ValueError(expected)
    size = math.floor(Fraction(match.group(1)) * unit)
    if size <= 0:
        raise ValueError(f"expected a positive size, got {show(value)}")
    if size > MAX_SIZE:
        raise ValueError(f"expected a size of at most {MAX_SIZE} bytes, got {show(value)}")
    return size


def format_size(size: int) -> str:
    """`size` bytes in the exact form with the smallest number: a binary unit when it divides
    as well as a decimal one ("2GiB", "2GB", "1536MiB", "1001B"); parse_size reads it back."""
    shown = [(size // scale, name) for name, scale in _SHOWN_UNITS if size % scale == 0]
    number, unit = min(shown, key=lambda pair: pair[0], default=(size, "B"))
    return f"{number}{unit}"


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
