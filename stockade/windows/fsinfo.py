"""Filesystem facts on Windows, gathered for admission.py's pure decisions: one `Entry` per path,
the filesystem a path is on, a path's long form, whether this process may change a path's DACL,
the program an app execution alias opens, and every name of a file with several hard links.

An entry's attributes and reparse tag are read from its directory's listing (FindFirstFileW's
data, through `os.scandir`: Microsoft's documented way to read a tag is that data's
`dwReserved0`), which never opens the entry. `os.lstat` does not do for them: CPython opens
only name surrogates (symbolic links, junctions) as themselves and resolves every other reparse
point "as for stat()", reporting tag 0 there — so a OneDrive placeholder would show the
reparse-point attribute with no tag, and a tag that redirected would not show at all. The link
count and the file id, which listings do not hold, are `os.lstat`'s (the file itself for the
entries admitted).
"""

from __future__ import annotations

import ctypes
import ntpath
import os

from stockade.launch.hostpaths import upcase
from stockade.windows import admission
from stockade.windows import constants as c
from stockade.windows.admission import Entry
from stockade.windows.api import last_error, win32
from stockade.windows.structs import DWORD

_MAX_PATH = 32768
_SHORT_ENOUGH = 247  # characters: CreateDirectoryW's limit (248 with the NUL), below MAX_PATH
_DIRECTORY = 0x10  # FILE_ATTRIBUTE_DIRECTORY


def win32_path(path: str) -> str:
    """`path` as handed to Windows. Win32 path calls refuse a path past MAX_PATH (260 with the
    NUL; 248 for a directory) unless the LongPathsEnabled policy is set and the program is
    long-path aware; the Win32 file namespace (`\\\\?\\`) has no such limit and takes the path
    without normalising it, which only a canonical drive path (as admission admits) can bear.
    So a longer path gets that form, a shorter one is as it is."""
    return path if len(path) <= _SHORT_ENOUGH else "\\\\?\\" + path


def entry(path: str) -> Entry:
    parent, name = ntpath.split(path)
    if not name:  # a drive's root, which no directory lists (and which is no reparse point)
        info = os.lstat(path)
        return Entry(path=path, is_dir=True, attributes=info.st_file_attributes,
                     file_id=file_id(info))
    # The name itself, else the one name Windows finds by it without regard to case: in a
    # case-sensitive directory `.git` and `.GIT` are two entries, and `.GIT` opens only itself.
    with os.scandir(win32_path(parent)) as listing:
        same = [(found.name, found.stat(follow_symlinks=False)) for found in listing
                if upcase(found.name) == upcase(name)]
    exact = [info for found, info in same if found == name]
    if exact or len(same) == 1:
        return _entry(path, (exact or [same[0][1]])[0])
    raise FileNotFoundError(path)


def scan(directory: str) -> list[Entry]:
    with os.scandir(win32_path(directory)) as listing:
        found = sorted((ntpath.join(directory, e.name), e.stat(follow_symlinks=False))
                       for e in listing)
    return [_entry(path, info) for path, info in found]


def _entry(path: str, listed: os.stat_result) -> Entry:
    attributes = listed.st_file_attributes
    tag = listed.st_reparse_tag if attributes & c.FILE_ATTRIBUTE_REPARSE_POINT else 0
    is_dir = bool(attributes & _DIRECTORY)
    found = Entry(path=path, is_dir=is_dir, attributes=attributes, reparse_tag=tag)
    if admission.opaque(found):
        return found  # (refused anyway: never opened)
    info = os.lstat(win32_path(path))
    return Entry(path=path, is_dir=is_dir, attributes=attributes, reparse_tag=tag,
                 links=1 if is_dir else info.st_nlink, file_id=file_id(info))


def names(path: str) -> list[str]:
    """Every name of the file `path` (its hard links), as drive paths. FindFirstFileNameW and
    FindNextFileNameW list them from the volume's root without its drive ("\\dir\\file"), so
    each is joined to `path`'s volume; the list ends with ERROR_HANDLE_EOF."""
    api = win32()
    volume = ctypes.create_unicode_buffer(_MAX_PATH)
    api.GetVolumePathNameW(win32_path(path), volume, _MAX_PATH)
    prefix = volume.value.removeprefix("\\\\?\\").rstrip("\\")
    name, size = ctypes.create_unicode_buffer(_MAX_PATH), DWORD(_MAX_PATH)
    handle = api.FindFirstFileNameW(win32_path(path), 0, ctypes.byref(size), name)
    found = [prefix + name.value]
    try:
        while True:
            size.value = _MAX_PATH
            if not api.FindNextFileNameW(handle, ctypes.byref(size), name):
                error = last_error()
                if error == _HANDLE_EOF:
                    return found
                raise ctypes.WinError(error)
            found.append(prefix + name.value)
    finally:
        api.FindClose(handle)


_HANDLE_EOF = 38  # ERROR_HANDLE_EOF: no more names


def file_id(info: os.stat_result) -> str:
    """Volume serial and file index: which file a name denoted when `info` was taken."""
    return f"{info.st_dev:x}:{info.st_ino:x}"


def dacl_writable(path: str) -> bool:
    """Whether this process may change `path`'s DACL: asked by opening it for WRITE_DAC alone
    (the reparse point itself, never what it points to), which is Windows' own access check."""
    api = win32()
    try:
        handle = api.CreateFileW(
            win32_path(path), c.WRITE_DAC,
            c.FILE_SHARE_READ | c.FILE_SHARE_WRITE | c.FILE_SHARE_DELETE, None, c.OPEN_EXISTING,
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
    api.GetVolumePathNameW(win32_path(path), volume, _MAX_PATH)
    name = ctypes.create_unicode_buffer(261)
    api.GetVolumeInformationW(volume.value, None, 0, None, None, None, name, 261)
    return name.value


def long_path(path: str) -> str:
    """The long form of `path`; "" when the system cannot give one (then nothing matches)."""
    buffer = ctypes.create_unicode_buffer(_MAX_PATH)
    try:
        length = win32().GetLongPathNameW(win32_path(path), buffer, _MAX_PATH)
    except OSError:
        return ""
    return buffer.value.removeprefix("\\\\?\\") if length < _MAX_PATH else ""


def app_link_target(path: str) -> str | None:
    """The program the app execution alias at `path` opens (admission.app_link_target), read
    from its reparse data without following it; None if it is none."""
    api = win32()
    handle = api.CreateFileW(
        win32_path(path), c.FILE_READ_ATTRIBUTES,
        c.FILE_SHARE_READ | c.FILE_SHARE_WRITE | c.FILE_SHARE_DELETE, None, c.OPEN_EXISTING,
        c.FILE_FLAG_BACKUP_SEMANTICS | c.FILE_FLAG_OPEN_REPARSE_POINT, None)
    try:
        data = reparse_data(api, handle)
    finally:
        api.CloseHandle(handle)
    return admission.app_link_target(data)


def reparse_data(api: object, handle: int) -> bytes:
    """The reparse data of the reparse point open as `handle` (FSCTL_GET_REPARSE_POINT)."""
    data = ctypes.create_string_buffer(c.MAXIMUM_REPARSE_DATA_BUFFER_SIZE)
    size = DWORD()
    api.DeviceIoControl(handle, c.FSCTL_GET_REPARSE_POINT, None, 0,  # type: ignore[attr-defined]
                        data, len(data), ctypes.byref(size), None)
    return data.raw[:size.value]
