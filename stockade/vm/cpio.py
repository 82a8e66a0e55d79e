"""The cpio "newc" format the kernel unpacks as an initramfs (Documentation/driver-api/
early-userspace/buffer-format.rst), written with the stdlib only."""

from __future__ import annotations

import stat

TRAILER = "TRAILER!!!"


class Archive:
    """An in-memory newc archive: directories, regular files and symlinks, owned by root."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._inode = 0

    def directory(self, name: str, mode: int = 0o755) -> None:
        self._entry(name, stat.S_IFDIR | mode, b"")

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def finish(self) -> bytes:
        self._entry(TRAILER, 0, b"")
        return bytes(self._data)

    def _entry(self, name: str, mode: int, data: bytes) -> None:
        self._inode += 1
        encoded = name.encode() + b"\0"
        fields = (self._inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        self._data += b"070701" + b"".join(b"%08X" % value for value in fields) + encoded
        self._pad()
        self._data += data
        self._pad()

    def _pad(self) -> None:
        self._data += b"\0" * (-len(self._data) % 4)
