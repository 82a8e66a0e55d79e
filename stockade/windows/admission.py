"""Which paths the Windows backend may change access control on, decided before any change.

Two kinds of evidence, both judged by pure functions here:

- the path as written (`lexical_refusal`): only canonical drive paths (`C:\\…`) are admitted.
  UNC paths (the server decides access), device and Win32-namespace paths (`\\\\?\\`, `\\\\.\\`,
  `\\??\\`), alternate data streams, reserved device names (`NUL`, `COM1`, …), components ending
  in a dot or a space (Win32 strips them, so they alias another name) and 8.3 short names
  (`PROGRA~1`) that the filesystem does not confirm as the long name are refused: each is a
  second spelling of something, and policy decisions (protected names, denied paths) are made
  by name.
- what is on disk (`entry_refusal`): a grant on a directory is inherited by everything below it,
  and Windows writes that inheritance into each file's own security descriptor. A reparse point
  (junction, symbolic link, mount point, or any other) could carry it elsewhere, and a file with
  several hard links shares one descriptor with names outside the root, so either refuses the
  launch. `walk` visits a root without following any reparse point; it takes the directory
  lister and `stat` as arguments, which on Windows are `fsinfo.scan` and `fsinfo.entry`.
"""

from __future__ import annotations

import ntpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stockade.windows.constants import FILE_ATTRIBUTE_REPARSE_POINT

FILESYSTEMS = ("NTFS", "ReFS")  # the filesystems whose ACLs the backend relies on
_DRIVE_PATH = re.compile(r"[A-Za-z]:\\")
_RESERVED_CHARS = re.compile(r'[<>:"|?*\x00-\x1f]')
_DEVICE_NAMES = re.compile(r"(con|prn|aux|nul|conin\$|conout\$|(com|lpt)[0-9¹²³])", re.IGNORECASE)
_SHORT_NAME = re.compile(r"[^~.\\]{1,6}~[0-9]{1,6}(\.[^.\\]{0,3})?")


@dataclass(frozen=True)
class Entry:
    """What `stat` (without following reparse points) says about one path."""

    path: str
    is_dir: bool
    attributes: int
    reparse_tag: int = 0
    links: int = 1

    @property
    def name(self) -> str:
        return ntpath.basename(self.path)


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
    if short and (long_path is None or long_path(path).casefold() != path.casefold()):
        return "a component looks like an 8.3 short name that the filesystem does not " \
               "confirm as the long name"
    return None


def filesystem_refusal(name: str) -> str | None:
    if name not in FILESYSTEMS:
        return f"the filesystem is {name or 'unknown'}; only NTFS and ReFS are supported"
    return None


def entry_refusal(entry: Entry) -> tuple[str, str] | None:
    """(capability, reason) if access control must not be changed over `entry`, else None."""
    if entry.attributes & FILE_ATTRIBUTE_REPARSE_POINT:
        return ("filesystem.reparse_point",
                f"{entry.path} is a reparse point (tag 0x{entry.reparse_tag:08X}): a junction, "
                "symbolic link or mount point could carry a grant outside the root")
    if not entry.is_dir and entry.links > 1:
        return ("filesystem.hard_link",
                f"{entry.path} has {entry.links} hard links: a grant on it would reach its "
                "other names, which may lie outside every root")
    return None


def walk(root: str, scan: Callable[[str], list[Entry]],
         stat: Callable[[str], Entry]) -> Iterator[Entry]:
    """`root` and everything below it, parents before children, never entering a reparse
    point; the caller judges each entry with `entry_refusal`."""
    pending = [stat(root)]
    while pending:
        entry = pending.pop()
        yield entry
        if entry.is_dir and not entry.attributes & FILE_ATTRIBUTE_REPARSE_POINT:
            pending.extend(reversed(scan(entry.path)))


def inside(path: str, root: str) -> bool:
    """Whether `path` is `root` or below it, comparing components without regard to case."""
    path, root = path.casefold(), root.casefold().rstrip("\\")
    return path == root or path.startswith(root + "\\")
