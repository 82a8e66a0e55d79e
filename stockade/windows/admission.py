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
  that stands for another name could carry it elsewhere, so it refuses the launch. A file with
  several hard links shares one descriptor (and one content) with its other names: in a read
  root that gives the sandbox nothing the root does not (the same bytes, read-only), and uv,
  conda and pnpm environments are made of such links, so it is admitted there; in a write root
  the sandbox could change a file outside every root (the package manager's store) through it,
  so it refuses the launch, naming how to make the environment with copies. Reparse
  points are told apart by tag: cloud-file placeholders (OneDrive's Files On-Demand,
  `IO_REPARSE_TAG_CLOUD` and its variants), compressed (`IO_REPARSE_TAG_WOF`) and deduplicated
  (`IO_REPARSE_TAG_DEDUP`) files are the file or directory itself, whose data a filter fills
  in place, so they are admitted like any file (`in_place`); an app execution alias
  (`IO_REPARSE_TAG_APPEXECLINK`, the Store's `WindowsApps\\python.exe`) inside a root is
  refused with a remedy (a program that is one is run as its target: `app_link_target`); junctions,
  mount points, symbolic links and every other tag are refused. `walk` visits a root without
  entering any reparse point but a cloud directory; it takes the directory lister and `stat` as
  arguments, which on Windows are `fsinfo.scan` and `fsinfo.entry`.
"""

from __future__ import annotations

import ntpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stockade.launch.hostpaths import inside_windows as inside
from stockade.launch.hostpaths import lexical_refusal
from stockade.windows import constants as c
from stockade.windows.constants import FILE_ATTRIBUTE_REPARSE_POINT

__all__ = ["FILESYSTEMS", "Entry", "app_alias", "app_link_target", "entry_refusal",
           "filesystem_refusal", "in_place", "inside", "lexical_refusal", "opaque", "walk"]

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


def in_place(tag: int) -> bool:
    """Whether a reparse point of `tag` is the file or directory itself rather than a stand-in
    for another name. None of these tags carries the name-surrogate bit ("the file or
    directory represents another named entity", MS-FSCC 2.1.2.1):

    - a cloud-files placeholder, any of the sixteen cloud tags (winnt.h: IO_REPARSE_TAG_CLOUD,
      CLOUD_1 ... CLOUD_F, which differ only in IO_REPARSE_TAG_CLOUD_MASK): its missing data is
      fetched from the sync provider and "stored on disk in the placeholder"
      (learn.microsoft.com, CfHydratePlaceholder);
    - a file the Windows Overlay Filter compressed (IO_REPARSE_TAG_WOF: `compact /c /exe`,
      CompactOS, so Python installs and C:\\Windows files alike): the filter decompresses its
      own data, kept with the file, on read;
    - a file Data Deduplication optimised (IO_REPARSE_TAG_DEDUP, Windows Server volumes): the
      filter reads its chunks from the volume's chunk store, which has no name a program
      opens.

    In each, no other name is ever opened, so a grant stays on the file."""
    return (tag & ~c.IO_REPARSE_TAG_CLOUD_MASK == c.IO_REPARSE_TAG_CLOUD
            or tag in (c.IO_REPARSE_TAG_WOF, c.IO_REPARSE_TAG_DEDUP))


def opaque(entry: Entry) -> bool:
    """Whether `entry` is a reparse point the backend neither enters nor grants over."""
    return bool(entry.attributes & FILE_ATTRIBUTE_REPARSE_POINT) and not in_place(
        entry.reparse_tag)


def app_alias(entry: Entry) -> bool:
    """Whether `entry` is an app execution alias (IO_REPARSE_TAG_APPEXECLINK)."""
    return opaque(entry) and entry.reparse_tag == c.IO_REPARSE_TAG_APPEXECLINK


def entry_refusal(entry: Entry, write: bool = True) -> tuple[str, str] | None:
    """(capability, reason) if access control must not be changed over `entry`, else None;
    `write` when `entry` lies in a write root."""
    if app_alias(entry):
        return ("filesystem.reparse_point",
                f"{entry.path} is an app execution alias (a Store app's stand-in for its "
                "program, which Windows opens only through app activation): name the program "
                "it opens instead (`where.exe` lists the alias; the program lies in the app's "
                "package folder), or keep the alias's folder out of the roots")
    if opaque(entry):
        return ("filesystem.reparse_point",
                f"{entry.path} is a reparse point (tag 0x{entry.reparse_tag:08X}): a junction, "
                "symbolic link or mount point could carry a grant outside the root")
    if write and not entry.is_dir and entry.links > 1:
        return ("filesystem.hard_link",
                f"{entry.path} has {entry.links} hard links in a write root: what the sandbox "
                "writes to it would change its other names, which may lie outside every root "
                "(a package manager's shared store). Make the environment with copies: "
                "UV_LINK_MODE=copy for uv, `conda config --set always_copy true` for conda, "
                "`pnpm config set package-import-method copy` for pnpm")
    return None


def walk(root: str, scan: Callable[[str], list[Entry]],
         stat: Callable[[str], Entry]) -> Iterator[Entry]:
    """`root` and everything below it, parents before children, never entering a reparse
    point; the caller judges each entry with `entry_refusal`."""
    pending = [stat(root)]
    while pending:
        entry = pending.pop()
        yield entry
        if entry.is_dir and not opaque(entry):
            pending.extend(reversed(scan(entry.path)))


def app_link_target(data: bytes) -> str | None:
    """The program an app execution alias opens, from its reparse data (FSCTL_GET_REPARSE_POINT's
    REPARSE_DATA_BUFFER: tag, data length, reserved, then the alias's own data); None unless
    it is an alias naming a canonical drive path. The alias's data is not documented by
    Microsoft: a ULONG count of NUL-terminated UTF-16 strings — package, app user model ID,
    the program's path, the app's type — as libuv (src/win/fs.c) and CPython's launcher read
    it; anything else is not trusted."""
    if len(data) < 12 or int.from_bytes(data[:4], "little") != c.IO_REPARSE_TAG_APPEXECLINK:
        return None
    length = int.from_bytes(data[4:6], "little")
    count = int.from_bytes(data[8:12], "little")
    strings = data[12:8 + length].decode("utf-16-le", "replace").split("\0")
    if count < 3 or len(strings) < 4:  # three strings at least, each NUL-terminated
        return None
    target = strings[2]
    return target if lexical_refusal(target) is None else None
