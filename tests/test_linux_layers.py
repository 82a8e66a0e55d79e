"""The Linux confinement layers, proven with real child processes.

Each test forks a child, applies one layer there, attempts something the layer must stop, and
sends what happened back through a pipe. The parent checks that the attempt failed *and* that
nothing changed outside the child. Positive controls show the same attempt works without the
layer, so a denial cannot come from somewhere else.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import platform
import shutil
import signal
import socket
import stat
import subprocess
import termios
import threading
import tty
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import unavailable

from stockade.errors import UnavailableError
from stockade.linux import landlock, privilege, seccomp, syscalls

pytestmark = pytest.mark.linux

_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_SECUREBITS = 27
_PR_GET_NO_NEW_PRIVS = 39
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                   0x40000000)
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PTRACE_ATTACH = 16
TIOCLINUX = 0x541C
X32_SYSCALL_BIT = 0x40000000
ROOT = os.geteuid() == 0

libc = syscalls.libc
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_void_p]
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
libc.personality.argtypes = [ctypes.c_ulong]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


# --- running things in a child ---------------------------------------------------------------

_report_fd = -1  # in a child: the pipe its result goes back through


def in_child(body: Callable[[], object]) -> tuple[object, int]:
    """Run `body` in a forked child; return (its JSON result or error, its wait status)."""
    global _report_fd
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            signal.alarm(30)
            _report_fd = write_fd
            try:
                result: object = {"ok": body()}
            except OSError as exc:
                result = {"errno": errno.errorcode.get(exc.errno or 0, exc.errno),
                          "error": str(exc)}
            except BaseException as exc:  # noqa: B036 - everything must reach the parent
                result = {"exception": repr(exc)}
            os.write(write_fd, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    return (json.loads(data) if data else None), status


def ok(body: Callable[[], object]) -> object:
    """Run `body` in a child that must finish normally; return its result."""
    result, status = in_child(body)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert isinstance(result, dict) and "ok" in result, result
    return result["ok"]


def attempt(action: Callable[[], object]) -> str:
    """'ok' if `action` worked, else the errno name it failed with."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def libc_call(function: Callable[..., int], *args: object) -> int:
    result = function(*args)
    if result == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def raw(name: str, *args: object) -> int:
    return syscalls.syscall(syscalls.number(name), *args)


def write_file(path: Path | str, data: str) -> None:
    with open(path, "w") as handle:
        handle.write(data)


def read_file(path: Path | str) -> str:
    with open(path) as handle:
        return handle.read()


def own_user_ns() -> None:
    """Without root, enter a fresh user namespace so capability operations are permitted."""
    if not ROOT:
        libc_call(libc.unshare, CLONE_NEWUSER)


# --- Landlock ----------------------------------------------------------------------------------

# Landlock is part of the Linux backend: without it these tests fail, with the reason.
requires_landlock = pytest.mark.usefixtures("landlock_available")


@pytest.fixture
def landlock_available() -> None:
    if landlock.abi_version() == 0:
        unavailable("this kernel has no Landlock, or it is disabled")
SYSTEM_READ = tuple(p for p in ("/usr", "/etc") if os.path.isdir(p) and not os.path.islink(p))


def rules(read: tuple[str, ...] = (), write: tuple[str, ...] = (),
          devices: tuple[str, ...] = (), exec_from_write: bool = False,
          deny_tcp: bool = False, scope: bool = False) -> landlock.LandlockRules:
    return landlock.LandlockRules(read=read, write=write, devices=devices,
                                  exec_from_write=exec_from_write, deny_tcp=deny_tcp,
                                  scope=scope)


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / name for name in ("read", "write", "outside")}
    for path in paths.values():
        path.mkdir()
    write_file(paths["read"] / "readable.txt", "public")
    write_file(paths["outside"] / "secret.txt", "secret")
    return paths


@requires_landlock
def test_landlock_confines_files_to_roots(tree: dict[str, Path]) -> None:
    read, write, outside = tree["read"], tree["write"], tree["outside"]

    def body() -> dict[str, str]:
        landlock.apply(rules(read=(str(read),), write=(str(write),), devices=("/dev/null",)))
        return {
            "read_outside": attempt(lambda: read_file(outside / "secret.txt")),
            "list_outside": attempt(lambda: os.listdir(outside)),
            "create_outside": attempt(lambda: write_file(outside / "created.txt", "x")),
            "append_read_root": attempt(lambda: open(read / "readable.txt", "a").close()),
            "create_in_read_root": attempt(lambda: write_file(read / "new.txt", "x")),
            "read_read_root": attempt(lambda: read_file(read / "readable.txt")),
            "write_write_root": attempt(lambda: write_file(write / "made.txt", "made")),
            "link_out_of_write_root": attempt(
                lambda: os.link(write / "made.txt", outside / "linked.txt")),
            "write_granted_device": attempt(lambda: write_file("/dev/null", "x")),
            "read_other_device": attempt(lambda: open("/dev/zero", "rb").close()),
        }

    assert ok(body) == {
        "read_outside": "EACCES",
        "list_outside": "EACCES",
        "create_outside": "EACCES",
        "append_read_root": "EACCES",
        "create_in_read_root": "EACCES",
        "read_read_root": "ok",
        "write_write_root": "ok",
        "link_out_of_write_root": "EACCES",
        "write_granted_device": "ok",
        "read_other_device": "EACCES",
    }
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert sorted(os.listdir(read)) == ["readable.txt"]
    assert read_file(read / "readable.txt") == "public"
    assert read_file(write / "made.txt") == "made"


@requires_landlock
def test_landlock_status_reports_what_is_restricted(tree: dict[str, Path]) -> None:
    def body() -> dict[str, object]:
        status = landlock.apply(rules(read=(str(tree["read"] / "readable.txt"),),
                                      write=(str(tree["write"]),), deny_tcp=True, scope=True))
        return {"status": status.__dict__, "nnp": syscalls.prctl(_PR_GET_NO_NEW_PRIVS),
                "file_root": read_file(tree["read"] / "readable.txt")}

    abi = landlock.abi_version()
    result = ok(body)
    assert isinstance(result, dict)
    status = result["status"]
    assert result["nnp"] == 1 and result["file_root"] == "public"
    assert status["abi"] == abi
    assert "execute" in status["handled_fs"] and "make_block" in status["handled_fs"]
    assert ("ioctl_dev" in status["handled_fs"]) == (abi >= 5)
    assert status["tcp_restricted"] == (abi >= 4)
    assert status["scopes"] == (["abstract_unix_socket", "signal"] if abi >= 6 else [])


@requires_landlock
@pytest.mark.parametrize("exec_from_write", [False, True])
def test_landlock_exec_from_write_root(tree: dict[str, Path], exec_from_write: bool) -> None:
    write = tree["write"]
    tool = write / "tool"
    write_file(tool, f"#!/bin/sh\necho ran > {write}/marker\n")
    tool.chmod(0o755)

    def body() -> dict[str, object]:
        landlock.apply(rules(read=SYSTEM_READ, write=(str(write),),
                             exec_from_write=exec_from_write))
        system = subprocess.run(["/bin/true"]).returncode
        try:
            return {"system": system, "tool": subprocess.run([str(tool)]).returncode}
        except PermissionError:
            return {"system": system, "tool": "EACCES"}

    result = ok(body)
    if exec_from_write:
        assert result == {"system": 0, "tool": 0}
        assert read_file(write / "marker") == "ran\n"
    else:
        assert result == {"system": 0, "tool": "EACCES"}
        assert not (write / "marker").exists()


@requires_landlock
@pytest.mark.parametrize("deny_tcp", [True, False])
def test_landlock_denies_tcp(deny_tcp: bool) -> None:
    if deny_tcp and landlock.abi_version() < 4:
        unavailable("Landlock ABI < 4 cannot restrict TCP")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]

    def body() -> dict[str, str]:
        landlock.apply(rules(deny_tcp=deny_tcp))
        with socket.socket() as client, socket.socket() as server:
            return {"connect": attempt(lambda: client.connect(("127.0.0.1", port))),
                    "bind": attempt(lambda: server.bind(("127.0.0.1", 0)))}

    with listener:
        result = ok(body)
        try:
            listener.accept()[0].close()
            accepted = True
        except BlockingIOError:
            accepted = False
    if deny_tcp:
        assert result == {"connect": "EACCES", "bind": "EACCES"}
        assert not accepted
    else:
        assert result == {"connect": "ok", "bind": "ok"}
        assert accepted


@requires_landlock
@pytest.mark.parametrize("scope", [True, False])
def test_landlock_scopes_signals_and_abstract_sockets(scope: bool) -> None:
    if scope and landlock.abi_version() < 6:
        unavailable("Landlock ABI < 6 has no scopes")
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: received.append(signum))
    name = f"\0stockade-test-{os.getpid()}-{scope}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen()
    listener.setblocking(False)
    parent = os.getpid()

    def body() -> dict[str, str]:
        landlock.apply(rules(scope=scope))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            return {"signal": attempt(lambda: os.kill(parent, signal.SIGUSR1)),
                    "abstract_connect": attempt(lambda: client.connect(name))}

    try:
        result = ok(body)
        try:
            listener.accept()[0].close()
            accepted = True
        except BlockingIOError:
            accepted = False
    finally:
        listener.close()
        signal.signal(signal.SIGUSR1, previous)
    if scope:
        assert result == {"signal": "EPERM", "abstract_connect": "EPERM"}
        assert received == [] and not accepted
    else:
        assert result == {"signal": "ok", "abstract_connect": "ok"}
        assert received == [signal.SIGUSR1] and accepted


@requires_landlock
def test_landlock_refuses_missing_or_symlinked_roots(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    link = tmp_path / "link"
    link.symlink_to(tmp_path)

    def body(root: Path) -> Callable[[], object]:
        def apply() -> object:
            return landlock.apply(rules(read=(str(root),))).abi
        return apply

    result, _ = in_child(body(missing))
    assert result == {"errno": "ENOENT", "error": result["error"]}
    assert str(missing) in result["error"]
    result, _ = in_child(body(link))
    assert result == {"errno": "ELOOP", "error": result["error"]}
    assert str(link) in result["error"]


def test_landlock_describe_matches_abi() -> None:
    described = landlock.describe()
    abi = landlock.abi_version()
    assert described["abi"] == abi
    assert described["filesystem"] == (abi >= 1)
    assert described["scope_signal"] == (abi >= 6)


# --- seccomp -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bpf() -> bytes:
    try:
        return seccomp.compile_filter()
    except UnavailableError as exc:
        unavailable(f"seccomp unavailable here: {exc}")


def confine(bpf: bytes) -> None:
    syscalls.prctl(_PR_SET_NO_NEW_PRIVS, 1)
    seccomp.install(bpf)


def test_seccomp_filter_is_classic_bpf(bpf: bytes) -> None:
    assert len(bpf) % 8 == 0 and 0 < len(bpf) // 8 <= 4096
    with pytest.raises(ValueError):
        seccomp.install(bpf[:-1])


def test_seccomp_denies_every_listed_syscall(bpf: bytes) -> None:
    # Arguments chosen so that each call would fail harmlessly (or be a no-op) if it got through.
    args: dict[str, tuple[object, ...]] = {
        "ptrace": (-1,), "finit_module": (-1, 0, 0), "kexec_load": (0, 0, 0, 0xDEAD0000),
        "kexec_file_load": (-1, -1, 0, 0, 0), "acct": (b"/nonexistent/stockade",),
        "setns": (-1, 0), "process_madvise": (-1,), "pidfd_getfd": (-1, 0, 0),
        "fsconfig": (-1,), "fsmount": (-1,), "move_mount": (-1, 0, -1), "open_tree": (-1,),
        "open_tree_attr": (-1,), "fspick": (-1,), "mount_setattr": (-1,),
        "quotactl_fd": (-1,), "io_uring_enter": (-1,), "io_uring_register": (-1,),
        "open_by_handle_at": (-1,), "name_to_handle_at": (-1,),
    }
    numbers = seccomp.describe()["eperm"]
    assert isinstance(numbers, dict)

    def body() -> dict[str, str]:
        confine(bpf)
        return {name: attempt(lambda nr=nr, name=name: syscalls.syscall(
                    nr, *args.get(name, (0, 0, 0, 0, 0, 0))))
                for name, nr in numbers.items()}

    assert ok(body) == dict.fromkeys(numbers, "EPERM")
    assert "open_tree_attr" in numbers  # from Stockade's own table where libseccomp is older


def test_seccomp_blocks_new_namespaces(bpf: bytes) -> None:
    def body() -> dict[str, object]:
        before = os.readlink("/proc/self/ns/user")
        confine(bpf)
        outcome: dict[str, object] = {
            "unshare_user": attempt(lambda: libc_call(libc.unshare, CLONE_NEWUSER)),
            "unshare_mount": attempt(lambda: libc_call(libc.unshare, CLONE_NEWNS)),
            "clone3": attempt(lambda: raw("clone3", None, 0)),
        }
        for flag in CLONE_NEW_FLAGS:
            outcome[f"clone_{flag:#x}"] = attempt(lambda flag=flag: _clone(flag))
        outcome["plain_clone"] = _clone(0)
        outcome["same_user_ns"] = os.readlink("/proc/self/ns/user") == before
        return outcome

    result = ok(body)
    expected: dict[str, object] = {"unshare_user": "EPERM", "unshare_mount": "EPERM",
                                   "clone3": "ENOSYS", "plain_clone": 0, "same_user_ns": True}
    expected |= {f"clone_{flag:#x}": "EPERM" for flag in CLONE_NEW_FLAGS}
    assert result == expected


def _clone(flags: int) -> int:
    """clone(flags | SIGCHLD) like fork; the new process exits 0 at once. Returns its status."""
    pid = raw("clone", flags | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    return os.waitpid(pid, 0)[1]


def test_unshare_and_clone3_work_without_the_filter() -> None:
    def body() -> dict[str, str]:
        return {"unshare_user": attempt(lambda: libc_call(libc.unshare, CLONE_NEWUSER)),
                "clone3": attempt(lambda: raw("clone3", None, 0))}

    assert ok(body) == {"unshare_user": "ok", "clone3": "EINVAL"}


def test_seccomp_denies_mount_api(bpf: bytes, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()

    def body() -> dict[str, object]:
        # A private mount namespace first, so a filter failure could not touch the host's.
        libc_call(libc.unshare, CLONE_NEWNS | (0 if ROOT else CLONE_NEWUSER))
        libc_call(libc.mount, None, b"/", None, MS_REC | MS_PRIVATE, None)
        confine(bpf)
        return {
            "mount": attempt(lambda: libc_call(libc.mount, b"tmpfs", bytes(target), b"tmpfs", 0,
                                               None)),
            "umount2": attempt(lambda: libc_call(libc.umount2, bytes(target), 0)),
            "chroot": attempt(lambda: os.chroot("/")),
            "fsopen": attempt(lambda: raw("fsopen", b"tmpfs", 0)),
            "open_tree": attempt(lambda: raw("open_tree", -100, bytes(tmp_path), 1)),
            "mounted": str(target) in read_file("/proc/self/mountinfo"),
        }

    assert ok(body) == {"mount": "EPERM", "umount2": "EPERM", "chroot": "EPERM",
                        "fsopen": "EPERM", "open_tree": "EPERM", "mounted": False}
    assert not os.path.ismount(target)
    assert os.listdir(target) == []


def test_seccomp_denies_ptrace(bpf: bytes) -> None:
    # The target is a process this test owns, not the test runner: if the filter ever failed,
    # PTRACE_ATTACH would stop it, and a stopped test runner would hang the suite.
    target = subprocess.Popen(["sleep", "30"])
    try:
        def body() -> str:
            confine(bpf)
            return attempt(lambda: libc_call(libc.ptrace, PTRACE_ATTACH, target.pid, None, None))

        result = ok(body)
        status = read_file(f"/proc/{target.pid}/status")
    finally:
        target.kill()
        target.wait()
    assert result == "EPERM"
    assert "TracerPid:\t0\n" in status
    assert "State:\tS" in status


def test_seccomp_denies_terminal_injection(bpf: bytes) -> None:
    master, slave = os.openpty()
    tty.setraw(slave)
    os.set_blocking(slave, False)
    try:
        def body() -> dict[str, str]:
            confine(bpf)
            return {
                "tiocsti": attempt(lambda: fcntl.ioctl(slave, termios.TIOCSTI, b"x")),
                "tiocsti_high_bits": attempt(lambda: libc_call(
                    libc.ioctl, slave, (1 << 32) | termios.TIOCSTI, ctypes.c_char_p(b"y"))),
                "tioclinux": attempt(lambda: fcntl.ioctl(slave, TIOCLINUX, b"\x06")),
                "tcgetattr": attempt(lambda: termios.tcgetattr(slave)),
            }

        result = ok(body)
        injected = attempt(lambda: os.read(slave, 16))
    finally:
        os.close(master)
        os.close(slave)
    assert result == {"tiocsti": "EPERM", "tiocsti_high_bits": "EPERM", "tioclinux": "EPERM",
                      "tcgetattr": "ok"}
    assert injected == "EAGAIN"


@pytest.mark.root_only("TIOCSTI on a terminal that is not ours needs root")
def test_tiocsti_injects_without_the_filter() -> None:
    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        assert ok(lambda: attempt(lambda: fcntl.ioctl(slave, termios.TIOCSTI, b"x"))) == "ok"
        assert os.read(slave, 16) == b"x"
    finally:
        os.close(master)
        os.close(slave)


def test_seccomp_limits_personality(bpf: bytes) -> None:
    values = (0x0, 0x8, 0xFFFFFFFF, 0x1, 0x7, 0x9, 0xC, 0x10, 0x0020000, 0x0040000, 0x0400000,
              0x0100000, 0x0800008, 0x7FFFFFFF, 0xFFFFFFFE, 0x80000000, 0xFFFFFFF7)

    def body() -> dict[str, str]:
        confine(bpf)
        outcome = {}
        for value in values:
            outcome[hex(value)] = attempt(lambda value=value: libc_call(libc.personality, value))
            libc.personality(0)
        return outcome

    assert ok(body) == {hex(v): "ok" if v in (0, 8, 0xFFFFFFFF) else "EPERM" for v in values}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 calls exist only on x86_64")
def test_seccomp_kills_foreign_architecture_calls(bpf: bytes) -> None:
    def body() -> str:
        confine(bpf)
        return attempt(lambda: syscalls.syscall(X32_SYSCALL_BIT | 39))  # x32 getpid

    result, status = in_child(body)
    assert result is None
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS


def test_seccomp_keeps_ordinary_work_working(bpf: bytes, tmp_path: Path) -> None:
    write_file(tmp_path / "in.txt", "data")

    def body() -> dict[str, object]:
        confine(bpf)
        write_file(tmp_path / "out.txt", read_file(tmp_path / "in.txt"))
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        forked = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        spawned = os.posix_spawn("/bin/true", ["true"], {})  # glibc tries clone3 first
        thread_ran: list[bool] = []
        worker = threading.Thread(target=lambda: thread_ran.append(True))
        worker.start()
        worker.join()
        echoed = subprocess.run(["/bin/echo", "hi"], capture_output=True).stdout.decode()
        return {"fork": forked, "true": subprocess.run(["/bin/true"]).returncode,
                "posix_spawn": os.waitstatus_to_exitcode(os.waitpid(spawned, 0)[1]),
                "thread": thread_ran, "echo": echoed,
                "seccomp_mode": privilege.capabilities_now()["Seccomp"]}

    assert ok(body) == {"fork": 7, "true": 0, "posix_spawn": 0, "thread": [True],
                        "echo": "hi\n", "seccomp_mode": 2}
    assert read_file(tmp_path / "out.txt") == "data"


def test_seccomp_describe_lists_the_policy() -> None:
    described = seccomp.describe()
    if not described["available"]:
        unavailable(f"seccomp unavailable here: {described['reason']}")
    assert described["eperm"] and set(described["eperm"]) <= set(seccomp.DENIED_SYSCALLS)
    assert set(described["eperm"]) | set(described["unknown_here"]) == set(
        seccomp.DENIED_SYSCALLS)
    assert described["enosys"] == ["clone3", "openat2"]
    assert described["socket_families"] == ["AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"]


# --- privileges --------------------------------------------------------------------------------

def test_drop_all_leaves_no_capabilities(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    write_file(victim, "x")
    owner = victim.stat().st_uid

    def body() -> dict[str, object]:
        own_user_ns()
        locked = privilege.prepare()
        privilege.drop_all()
        after_exec = subprocess.run(["/bin/cat", "/proc/self/status"], capture_output=True,
                                    text=True).stdout
        return {"locked": locked.locked, "securebits": syscalls.prctl(_PR_GET_SECUREBITS),
                "now": privilege.capabilities_now(), "after_exec": after_exec,
                "chown": attempt(lambda: os.chown(victim, owner + 1, -1))}

    result = ok(body)
    assert isinstance(result, dict)
    assert result["locked"] is True and result["securebits"] == privilege.SECUREBITS
    now = result["now"]
    assert {key: now[key] for key in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb")} == {
        "CapEff": 0, "CapPrm": 0, "CapInh": 0, "CapBnd": 0, "CapAmb": 0}
    assert now["NoNewPrivs"] == 1
    for field in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):  # exec as uid 0 regains nothing
        assert f"{field}:\t0000000000000000\n" in result["after_exec"]
    assert "NoNewPrivs:\t1\n" in result["after_exec"]
    # Outside a user namespace CAP_CHOWN is all that stands between root and the chown; inside
    # one, the unmapped uid fails first (EINVAL) and proves nothing.
    assert result["chown"] == ("EPERM" if ROOT else "EINVAL")
    assert victim.stat().st_uid == owner


def test_prepare_reports_missing_capability() -> None:
    def body() -> list[object]:
        own_user_ns()
        privilege.drop_all()
        locked = privilege.prepare()
        return [locked.locked, locked.reason]

    assert ok(body) == [False, "no CAP_SETPCAP in this user namespace"]


def test_close_fds_closes_leaked_descriptors(tmp_path: Path) -> None:
    leaked = os.open(tmp_path, os.O_RDONLY)  # inherited by the fork like any stray fd
    kept = os.open(tmp_path, os.O_RDONLY)
    leaked_high = fcntl.fcntl(leaked, fcntl.F_DUPFD, 1000)  # above every kept descriptor
    try:
        def body() -> dict[str, str]:
            privilege.close_fds({kept, _report_fd})
            return {"leaked": attempt(lambda: os.fstat(leaked)),
                    "leaked_high": attempt(lambda: os.fstat(leaked_high)),
                    "kept": "ok" if stat.S_ISDIR(os.fstat(kept).st_mode) else "wrong",
                    "stdio": attempt(lambda: os.fstat(2))}

        assert ok(body) == {"leaked": "EBADF", "leaked_high": "EBADF", "kept": "ok",
                            "stdio": "ok"}
        os.fstat(leaked)  # the parent's own copies are untouched
        os.fstat(leaked_high)
    finally:
        for fd in (leaked, kept, leaked_high):
            os.close(fd)


@requires_landlock
def test_layers_in_launcher_order_survive_exec(bpf: bytes, tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        unavailable("util-linux unshare(1) is not installed")

    def body() -> dict[str, object]:
        own_user_ns()
        privilege.prepare()
        landlock.apply(rules(read=SYSTEM_READ + ("/proc",), write=(str(tmp_path),),
                             devices=("/dev/null",), deny_tcp=True, scope=True))
        privilege.drop_all()
        seccomp.install(bpf)
        privilege.close_fds({0, 1, 2, _report_fd})
        status = subprocess.run(["/bin/cat", "/proc/self/status"], capture_output=True,
                                text=True).stdout
        nested = subprocess.run(["unshare", "--user", "true"], capture_output=True, text=True)
        return {"status": status, "nested": nested.returncode}

    result = ok(body)
    assert isinstance(result, dict)
    status = result["status"]
    assert "Seccomp:\t2\n" in status and "NoNewPrivs:\t1\n" in status
    assert "CapEff:\t0000000000000000\n" in status
    assert result["nested"] != 0
