"""Filesystem facts on Windows, gathered for admission.py's pure decisions: one `Entry` per path
(from `os.lstat`, which never follows a reparse point and reports attributes, reparse tag, link
count and file id there), the filesystem a path is on, a path's long form, and whether this process
may change a path's DACL."""

from __future__ import annotations

import ctypes
import os
import stat

from stockade.windows import constants as c
from stockade.windows.admission import Entry
from stockade.windows.api import win32

_MAX_PATH = 32768


def entry(path: str) -> Entry:
    info = os.lstat(path)
    return Entry(path=path, is_dir=stat.S_ISDIR(info.st_mode),
                 attributes=info.st_file_attributes, reparse_tag=info.st_reparse_tag,
                 links=info.st_nlink, file_id=file_id(info))


def scan(directory: str) -> list[Entry]:
    return [entry(os.path.join(directory, name)) for name in sorted(os.listdir(directory))]


def file_id(info: os.stat_result) -> str:
    """Volume serial and file index: which file a name denoted when `info` was taken."""
    return f"{info.st_dev:x}:{info.st_ino:x}"


def dacl_writable(path: str) -> bool:
    """Whether this process may change `path`'s DACL: asked by opening it for WRITE_DAC alone
    (the reparse point itself, never what it points to), which is Windows' own access check."""
    api = win32()
    try:
        handle = api.CreateFileW(
            path, c.WRITE_DAC, c.FILE_SHARE_READ | c.FILE_SHARE_WRITE | c.FILE_SHARE_DELETE,
            None, c.OPEN_EXISTING,
            c.FILE_FLAG_BACKUP_SEMANTICS | c.FILE_FLAG_OPEN_REPARSE_POINT, None)
    except OSError as exc:
        if exc.winerror == _ACCESS_DENIED:
            return False
        raise
    api.CloseHandle(handle)
    return True


_ACCESS_DENIED = 5


def filesystem(path: str) -> str:
    """The name of the filesystem holding `path` ("NTFS", "ReFS", "FAT32", ...)."""
    api = win32()
    volume = ctypes.create_unicode_buffer(_MAX_PATH)
    api.GetVolumePathNameW(path, volume, _MAX_PATH)
    name = ctypes.create_unicode_buffer(261)
    api.GetVolumeInformationW(volume.value, None, 0, None, None, None, name, 261)
    return name.value


def long_path(path: str) -> str:
    """The long form of `path`; "" when the system cannot give one (then nothing matches)."""
    buffer = ctypes.create_unicode_buffer(_MAX_PATH)
    try:
        length = win32().GetLongPathNameW(path, buffer, _MAX_PATH)
    except OSError:
        return ""
    return buffer.value if length < _MAX_PATH else ""
