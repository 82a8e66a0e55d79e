"""A case-folding filesystem for the case-alias row, where the kernel offers none.

A small FUSE server (the kernel protocol spoken directly over /dev/fuse, no library) that
passes through to a backing directory and looks names up without regard to case, as vfat,
ntfs3, SMB shares and ext4/tmpfs `casefold` directories do: `.GIT/config` is `.git/config`.
Every spelling of a name leads to the same node.

Mounting it needs CAP_SYS_ADMIN, which a user namespace grants over a mount namespace of its
own (FUSE allows such mounts since Linux 4.18; there is no `fusermount` here). So `launch` runs
this module as a helper process that enters a fresh user and mount namespace (its uid and gid
mapped to themselves, so the backend takes the same path as for the caller: root or rootless),
mounts the stand-in over the workspace there, compiles the row's policy and launches it through
the backend as every row does (check, `execute`): the sandbox's user namespace nests inside the
helper's. The stored files are watched from the host, as in every row.
"""

from __future__ import annotations

import ctypes
import errno
import os
import pickle
import select
import stat
import struct
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import stockade
from stockade.errors import StockadeError, UnavailableError, UnenforceableError
from stockade.evidence.launches import argv_for, context_for, policy_for
from stockade.evidence.row import Launch, Row
from stockade.evidence.scene import NotRunnable, Scene
from stockade.evidence.watch import Finding, Watch
from stockade.launch.backend import Backend
from stockade.launch.compile import compile_policy
from stockade.launch.manager import execute
from stockade.launch.result import Result
from stockade.linux.ns import CLONE_NEWNS, CLONE_NEWUSER

STORED = "stored"  # the scene's directory the stand-in serves at the workspace
NOT_RUNNABLE = 3   # the helper's exit status when this host cannot mount the stand-in
HELPER_TIMEOUT = 60.0  # seconds: a stuck stand-in fails the row instead of the whole run
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
ROOT_ID = 1
IN_HEADER = struct.Struct("<IIQQIIIHH")     # len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")          # len error unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")   # ino size blocks a/m/ctime, nsecs, mode nlink ...
BUFFER = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)


def launch(row: Row, scene: Scene, backend: Backend) -> Launch:
    """The row's attack, launched by the helper with the scene's `stored/` served at its
    workspace. The helper compiles the policy there too (a denied path that does not exist is
    dropped, and on the host the workspace is empty). Its answer is the launch's Result or the
    error that stopped it, and how many lookups the stand-in answered (shown with the host-side
    findings)."""
    compile_request = partial(compile_policy, policy_for(row, scene), argv_for(row, scene),
                              context_for(scene), stdin=scene.stdin)
    package_parent = str(Path(stockade.__file__).resolve().parent.parent)
    helper = subprocess.run(
        [sys.executable, "-m", __name__, str(scene.root / STORED), str(scene.ws)],
        input=pickle.dumps((backend, compile_request)), capture_output=True,
        timeout=HELPER_TIMEOUT, check=False, env={**os.environ, "PYTHONPATH": package_parent})
    if helper.returncode == NOT_RUNNABLE:
        raise NotRunnable(helper.stderr.decode(errors="replace").strip())
    if helper.returncode != 0:
        raise RuntimeError(f"the case-folding helper failed ({helper.returncode}): "
                           f"{helper.stderr.decode(errors='replace').strip()[-300:]}")
    lookups, outcome = pickle.loads(helper.stdout)
    scene.watch(Served(lookups))
    if isinstance(outcome, Result):
        return Launch(outcome)
    kind, code, message = outcome
    if kind is UnenforceableError:
        raise UnenforceableError(code.removeprefix("unenforceable:"), message)
    if kind is UnavailableError:
        raise UnavailableError(code, message)
    return Launch(error=StockadeError(code, message))


class Served(Watch):
    """The stand-in's account after the launch: the sandbox reached the workspace through it."""

    def __init__(self, lookups: int) -> None:
        self.lookups = lookups

    def finish(self) -> Finding:
        return Finding(self.lookups > 0, "case-folding FUSE stand-in (in the helper's user "
                                         f"namespace) answered {self.lookups} lookups")


def _helper(backing: str, target: str) -> int:
    """In the helper: enter the namespaces (while single-threaded), mount, launch, answer."""
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        return _not_runnable(f"unshare(CLONE_NEWUSER|CLONE_NEWNS): "
                             f"{os.strerror(ctypes.get_errno())}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        Path("/proc/self", name).write_text(text)
    backend, compile_request = pickle.load(sys.stdin.buffer)
    try:
        mount = CaseFoldingMount(Path(backing), Path(target))
    except NotRunnable as exc:
        return _not_runnable(str(exc))
    try:
        request = compile_request()
        backend.check(request)
        outcome: object = execute(backend, request)
    except StockadeError as exc:
        outcome = (type(exc), exc.code, exc.message)
    finally:
        mount.close()
    sys.stdout.buffer.write(pickle.dumps((mount.lookups, outcome)))
    return 0


def _not_runnable(reason: str) -> int:
    print(f"no case-folding filesystem in a user namespace: {reason}", file=sys.stderr)
    return NOT_RUNNABLE


class CaseFoldingMount:
    """`backing` served at `target`, case-insensitively, until `close`."""

    def __init__(self, backing: Path, target: Path) -> None:
        self.backing, self.target = backing, target
        self.paths: dict[int, str] = {ROOT_ID: str(backing)}
        self.ids: dict[str, int] = {str(backing): ROOT_ID}
        self.handles: dict[int, int] = {}
        self.lookups = 0
        try:
            self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise NotRunnable(f"/dev/fuse: {exc.strerror}") from None
        options = (f"fd={self.fd},rootmode=40000,user_id={os.getuid()},"
                   f"group_id={os.getgid()},allow_other,default_permissions").encode()
        if _libc.mount(b"evidence-casefold", bytes(target), b"fuse", MS_NOSUID | MS_NODEV,
                       options) != 0:
            os.close(self.fd)
            raise NotRunnable(f"mount fuse: {os.strerror(ctypes.get_errno())}")
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

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
        self.lookups += 1
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


if __name__ == "__main__":
    sys.exit(_helper(*sys.argv[1:]))
