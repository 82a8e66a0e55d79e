"""A case-folding filesystem for the case-alias row, where the kernel offers none.

A small FUSE server (the kernel protocol spoken directly over /dev/fuse, no library) that
passes through to a backing directory and looks names up without regard to case, as vfat,
ntfs3, SMB shares and ext4/tmpfs `casefold` directories do: `.GIT/config` is `.git/config`.
Every spelling of a name leads to the same node. Mounting it needs root (CAP_SYS_ADMIN): there
is no `fusermount` here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import stat
import struct
import threading
from pathlib import Path

from stockade.evidence.scene import NotRunnable
from stockade.evidence.watch import Finding, Watch

MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
ROOT_ID = 1
IN_HEADER = struct.Struct("<IIQQIIIHH")     # len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")          # len error unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")   # ino size blocks a/m/ctime, nsecs, mode nlink ...
BUFFER = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)


class CaseFoldingMount(Watch):
    """`backing` served at `target`, case-insensitively, until `close`."""

    def __init__(self, backing: Path, target: Path) -> None:
        if os.geteuid() != 0:
            raise NotRunnable("no case-folding filesystem: the kernel has none here, and "
                              "mounting the FUSE stand-in needs root")
        self.backing, self.target = backing, target
        self.paths: dict[int, str] = {ROOT_ID: str(backing)}
        self.ids: dict[str, int] = {str(backing): ROOT_ID}
        self.handles: dict[int, int] = {}
        try:
            self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise NotRunnable(f"no case-folding filesystem: /dev/fuse: {exc.strerror}") from None
        options = (f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other,"
                   "default_permissions").encode()
        if _libc.mount(b"evidence-casefold", bytes(target), b"fuse", MS_NOSUID | MS_NODEV,
                       options) != 0:
            os.close(self.fd)
            raise NotRunnable(f"cannot mount FUSE: {os.strerror(ctypes.get_errno())}")
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def finish(self) -> Finding:
        return Finding(True, "case-folding FUSE stand-in served the workspace")

    def close(self) -> None:
        if self.fd >= 0:
            _libc.umount2(bytes(self.target), MNT_DETACH)
            self.stopped.set()
            self.thread.join()
            os.close(self.fd)  # aborts the connection wherever the mount is still referenced
            self.fd = -1

    # --- the protocol ------------------------------------------------------------------------

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not self.stopped.is_set():
            if not poller.poll(100):
                continue
            try:
                request = os.read(self.fd, BUFFER)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted
            _, opcode, unique, node, *_ = IN_HEADER.unpack_from(request)
            body = request[IN_HEADER.size:]
            handler = getattr(self, f"_op{opcode}", None)
            if opcode in (2, 36, 42):  # FORGET, INTERRUPT, BATCH_FORGET: no reply
                continue
            try:
                reply = handler(node, body) if handler else -errno.ENOSYS
            except OSError as exc:
                reply = -(exc.errno or errno.EIO)
            self._reply(unique, reply)

    def _reply(self, unique: int, reply: bytes | int) -> None:
        error, data = (reply, b"") if isinstance(reply, int) else (0, reply)
        try:
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(data), error, unique) + data)
        except OSError:
            pass  # the request was interrupted meanwhile

    def _path(self, node: int) -> str:
        return self.paths[node]

    def _child(self, node: int, name: bytes) -> str:
        """The stored entry of `node` whose name matches `name` ignoring case (or `name`)."""
        wanted = os.fsdecode(name).casefold()
        directory = self._path(node)
        for entry in os.listdir(directory):
            if entry.casefold() == wanted:
                return os.path.join(directory, entry)
        return os.path.join(directory, os.fsdecode(name))

    def _entry(self, path: str) -> bytes:
        node = self.ids.setdefault(path, len(self.ids) + 1)
        self.paths[node] = path
        return struct.pack("<QQQQII", node, 0, 0, 0, 0, 0) + self._attr(path)

    def _attr(self, path: str) -> bytes:
        s = os.lstat(path)
        return ATTR.pack(s.st_ino, s.st_size, s.st_blocks, int(s.st_atime), int(s.st_mtime),
                         int(s.st_ctime), 0, 0, 0, s.st_mode, s.st_nlink, s.st_uid, s.st_gid,
                         s.st_rdev, 4096, 0)

    def _attr_out(self, path: str) -> bytes:
        return struct.pack("<QII", 0, 0, 0) + self._attr(path)

    @staticmethod
    def _names(body: bytes) -> list[bytes]:
        return body.split(b"\0")

    def _op26(self, node: int, body: bytes) -> bytes:  # INIT
        _, _, readahead = struct.unpack_from("<III", body)
        return struct.pack("<IIIIHHIIHHII", 7, 31, readahead, 0, 16, 12, BUFFER >> 1, 1, 0, 0,
                           0, 0) + bytes(24)

    def _op1(self, node: int, body: bytes) -> bytes:  # LOOKUP
        return self._entry(self._child(node, self._names(body)[0]))

    def _op3(self, node: int, body: bytes) -> bytes:  # GETATTR
        return self._attr_out(self._path(node))

    def _op4(self, node: int, body: bytes) -> bytes:  # SETATTR
        valid, _, fh, size = struct.unpack_from("<IIQQ", body)
        mode = struct.unpack_from("<I", body, 68)[0]
        path = self._path(node)
        if valid & 8:
            os.truncate(path, size)
        if valid & 1:
            os.chmod(path, stat.S_IMODE(mode))
        return self._attr_out(path)

    def _op5(self, node: int, body: bytes) -> bytes:  # READLINK
        return os.fsencode(os.readlink(self._path(node)))

    def _op6(self, node: int, body: bytes) -> bytes:  # SYMLINK
        name, target = self._names(body)[:2]
        path = self._child(node, name)
        os.symlink(os.fsdecode(target), path)
        return self._entry(path)

    def _op9(self, node: int, body: bytes) -> bytes:  # MKDIR
        mode = struct.unpack_from("<I", body)[0]
        path = self._child(node, self._names(body[8:])[0])
        os.mkdir(path, stat.S_IMODE(mode))
        return self._entry(path)

    def _op10(self, node: int, body: bytes) -> bytes:  # UNLINK
        os.unlink(self._child(node, self._names(body)[0]))
        return b""

    def _op11(self, node: int, body: bytes) -> bytes:  # RMDIR
        os.rmdir(self._child(node, self._names(body)[0]))
        return b""

    def _op12(self, node: int, body: bytes, skip: int = 8) -> bytes:  # RENAME
        new_dir = struct.unpack_from("<Q", body)[0]
        old, new = self._names(body[skip:])[:2]
        os.rename(self._child(node, old), self._child(new_dir, new))
        return b""

    def _op45(self, node: int, body: bytes) -> bytes:  # RENAME2 (flags refused)
        if struct.unpack_from("<I", body, 8)[0]:
            return -errno.EINVAL
        return self._op12(node, body, skip=16)

    def _op14(self, node: int, body: bytes) -> bytes:  # OPEN
        flags = struct.unpack_from("<I", body)[0]
        fd = os.open(self._path(node), flags & ~(os.O_CREAT | os.O_EXCL | os.O_NOCTTY))
        self.handles[fd] = fd
        return struct.pack("<QIi", fd, 0, 0)

    def _op15(self, node: int, body: bytes) -> bytes:  # READ
        fh, offset, size = struct.unpack_from("<QQI", body)
        return os.pread(fh, size, offset)

    def _op16(self, node: int, body: bytes) -> bytes:  # WRITE
        fh, offset, size = struct.unpack_from("<QQI", body)
        return struct.pack("<II", os.pwrite(fh, body[40:40 + size], offset), 0)

    def _op17(self, node: int, body: bytes) -> bytes:  # STATFS
        s = os.statvfs(self.backing)
        return struct.pack("<QQQQQIIII", s.f_blocks, s.f_bfree, s.f_bavail, s.f_files,
                           s.f_ffree, s.f_bsize, 255, s.f_frsize, 0) + bytes(24)

    def _op18(self, node: int, body: bytes) -> bytes:  # RELEASE
        fh = struct.unpack_from("<Q", body)[0]
        os.close(self.handles.pop(fh, fh))
        return b""

    def _op25(self, node: int, body: bytes) -> bytes:  # FLUSH
        return b""

    def _op27(self, node: int, body: bytes) -> bytes:  # OPENDIR
        return struct.pack("<QIi", 0, 0, 0)

    def _op28(self, node: int, body: bytes) -> bytes:  # READDIR
        _, offset, size = struct.unpack_from("<QQI", body)
        names = [".", "..", *sorted(os.listdir(self._path(node)))]
        out = b""
        for index, name in enumerate(names[offset:], start=offset + 1):
            raw = os.fsencode(name)
            entry = struct.pack("<QQII", 1, index, len(raw), 0) + raw
            entry += bytes(-len(entry) % 8)
            if len(out) + len(entry) > size:
                break
            out += entry
        return out

    def _op29(self, node: int, body: bytes) -> bytes:  # RELEASEDIR
        return b""

    def _op35(self, node: int, body: bytes) -> bytes:  # CREATE
        flags, mode = struct.unpack_from("<II", body)
        path = self._child(node, self._names(body[16:])[0])
        fd = os.open(path, flags | os.O_CREAT, stat.S_IMODE(mode))
        self.handles[fd] = fd
        return self._entry(path) + struct.pack("<QIi", fd, 0, 0)
