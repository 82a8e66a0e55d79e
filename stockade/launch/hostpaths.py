"""How paths are compared and admitted, the same for every layer that needs it: compile (is a
working directory inside a root?), the Windows backend (admission.py) and the Windows Sandbox
driver (vm/wsb_plan.py). Pure, and importable everywhere.

- `inside_posix`: canonical paths compared as strings, "/"-separated;
- `inside_windows`: "\\"-separated components compared without regard to case, as Windows
  compares names (`upcase`);
- `inside`: this host's;
- `holding_root`, `meeting_root`: which of a launch's roots holds a path, or shows something
  of a mount there;
- `lexical_refusal`: why a Windows path is not admitted as written (only canonical drive
  paths are: see stockade/windows/admission.py).
"""

from __future__ import annotations

import ntpath
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stockade.launch.request import PathGrant

_DRIVE_PATH = re.compile(r"[A-Za-z]:\\")
_RESERVED_CHARS = re.compile(r'[<>:"|?*\x00-\x1f]')
_DEVICE_NAMES = re.compile(r"(con|prn|aux|nul|conin\$|conout\$|(com|lpt)[0-9¹²³])", re.IGNORECASE)
_SHORT_NAME = re.compile(r"[^~.\\]{1,6}~[0-9]{1,6}(\.[^.\\]{0,3})?")


def lexical_refusal(path: str, long_path: Callable[[str], str] | None = None) -> str | None:
    """Why `path` is not admitted as written, or None. `long_path` (GetLongPathNameW on
    Windows) confirms that a component shaped like an 8.3 short name is the real long name."""
    if path[:4] in ("\\\\?\\", "\\\\.\\", "\\??\\", "//?/", "//./"):
        return "device and Win32-namespace paths are not supported"
    if path[:2] in ("\\\\", "//"):
        return "UNC paths are not supported: the server decides access there"
    if not _DRIVE_PATH.match(path):
        return "only absolute drive paths (C:\\...) are supported"
    if ntpath.normpath(path) != path or "/" in path:
        return "the path is not in canonical form"
    short = False
    for part in path[3:].split("\\") if len(path) > 3 else ():
        if part.endswith((".", " ")):
            return f"component {part!r} ends in a dot or a space, which Windows strips"
        if _RESERVED_CHARS.search(part):
            return f"component {part!r} holds a reserved character (':' names a data stream)"
        if _DEVICE_NAMES.fullmatch(part.split(".")[0].rstrip(" ")):
            return f"component {part!r} is a reserved device name"
        short = short or bool(_SHORT_NAME.fullmatch(part))
    if short and (long_path is None or upcase(long_path(path)) != upcase(path)):
        return "a component looks like an 8.3 short name that the filesystem does not " \
               "confirm as the long name"
    return None




def upcase(text: str) -> str:
    """`text` as Windows compares names without regard to case: each UTF-16 code unit
    upper-cased on its own, never into more than one unit, surrogates as they are (NTFS and
    ReFS compare names through the volume's upcase table, one unit at a time; the environment
    block's names are ordered the same way). The result is a string of code units, so two
    results compare as Windows orders the names. Unlike `str.casefold`, which folds "ß" into
    "ss": to Windows, "straße" and "STRASSE" are two names."""
    units = text.encode("utf-16-le", "surrogatepass")
    out = []
    for i in range(0, len(units), 2):
        unit = chr(int.from_bytes(units[i:i + 2], "little"))
        upper = unit.upper() if not "\ud800" <= unit < "\ue000" else unit
        out.append(upper if len(upper) == 1 and upper < "\U00010000" else unit)
    return "".join(out)


def inside_windows(path: str, root: str) -> bool:
    """Whether `path` is `root` or below it, comparing components without regard to case."""
    path, root = upcase(path), upcase(root).rstrip("\\")
    return path == root or path.startswith(root + "\\")


def inside_posix(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies below it (canonical paths, compared as strings)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


inside = inside_windows if sys.platform == "win32" else inside_posix


def holding_root(path: str, roots: Iterable[PathGrant]) -> str | None:
    """The first of `roots` that `path` lies inside, if any."""
    return next((root.path for root in roots if inside(path, root.path)), None)


def meeting_root(point: str, roots: Sequence[PathGrant]) -> str | None:
    """The first of `roots` that a mount at `point` shows something of: one it lies inside,
    else one inside it."""
    return holding_root(point, roots) or next(
        (root.path for root in roots if inside(root.path, point)), None)
