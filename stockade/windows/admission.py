"""Which paths the Windows backend may change access control on, decided before any change.

Two kinds of evidence, both judged by pure functions here:

- the path as written (`lexical_refusal`, shared with compile and the Windows Sandbox driver:
  stockade/launch/hostpaths.py): only canonical drive paths (`C:\\…`) are admitted.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stockade.launch.hostpaths import inside_windows as inside
from stockade.launch.hostpaths import lexical_refusal
from stockade.windows.constants import FILE_ATTRIBUTE_REPARSE_POINT

__all__ = ["FILESYSTEMS", "Entry", "entry_refusal", "filesystem_refusal", "inside",
           "lexical_refusal", "walk"]

FILESYSTEMS = ("NTFS", "ReFS")  # the filesystems whose ACLs the backend relies on


@dataclass(frozen=True)
class Entry:
    """What `stat` (without following reparse points) says about one path."""

    path: str
    is_dir: bool
    attributes: int
    reparse_tag: int = 0
    links: int = 1
    file_id: str = ""  # volume serial and file index (fsinfo.file_id); "" where not known

    @property
    def name(self) -> str:
        return ntpath.basename(self.path)


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
