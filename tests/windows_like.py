"""A fresh interpreter made to look like Windows CPython, for the tests that guard Stockade's way
in on Windows: importing its modules, parsing a command line, choosing a backend.

This is a guard, not an emulator. Before the code under test runs, `look_like_windows()`:

- sets `sys.platform` to "win32" and gives `sys` a `getwindowsversion()` (a recent build);
  `platform.machine()` answers "AMD64" and `platform.system()` "Windows", as on x64 Windows;
  `io._WindowsConsoleIO` exists (a class nothing here is an instance of), and
  `tempfile.TemporaryFile` is `NamedTemporaryFile`, as tempfile chooses on Windows;
- makes the POSIX-only modules (fcntl, pwd, grp, resource, termios, tty, pty, posix,
  _posixsubprocess, ...) unimportable, and removes the POSIX-only attributes of os, signal,
  socket, select and time that Stockade could reach (os.fork, os.getuid, os.O_CLOEXEC,
  os.environb, signal.SIGKILL, socket.AF_UNIX, socket.SO_PEERCRED, select.poll, ...), adding
  the few Windows-only ones it uses (os.O_BINARY, os.O_NOINHERIT);
- stubs the Windows-only modules (msvcrt, winreg, _winapi, _overlapped): they import, and
  calling anything in them raises OSError;
- stubs ctypes' Windows half: `ctypes.WinDLL` (and windll, oledll) raises OSError when a DLL is
  loaded, `ctypes.WinError`, `get_last_error` and `set_last_error` exist.

What it does not do: `os.path` is still posixpath, files and processes are still Linux's, and
a few standard modules whose shape is chosen at import (subprocess, selectors) are imported
beforehand, in their POSIX shape, since their Windows shape needs the real `_winapi`. Nothing
Windows-only is exercised: a Win32 call is an OSError here. So a pass says only that the code
path got as far as it should (an import, a usage error, a typed refusal) without touching
anything Windows lacks; Windows itself is the Windows workflow's to show
(.github/workflows/windows.yml).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

TESTS = os.path.dirname(os.path.abspath(__file__))
WINDOWS_BUILD = 20348  # Windows Server 2022, as the workflow's windows-2022 runner
WINDOWS_MACHINE = "AMD64"  # platform.machine() on x64 Windows (not "x86_64")

POSIX_ONLY_MODULES = frozenset({
    "fcntl", "grp", "pwd", "resource", "termios", "tty", "pty", "posix", "_posixsubprocess",
    "_posixshmem", "syslog", "crypt", "spwd", "nis", "readline", "curses", "_curses",
})
WINDOWS_ONLY_MODULES = ("msvcrt", "winreg", "_winapi", "_overlapped")
# Imported before the platform changes, in their POSIX shape (see the module docstring).
SHAPED_AT_IMPORT = ("subprocess", "selectors", "ctypes", "ctypes.util")

POSIX_ONLY_ATTRIBUTES = {
    "os": (
        "fork", "forkpty", "register_at_fork", "getuid", "geteuid", "getgid", "getegid",
        "getgroups", "getgrouplist", "initgroups", "setuid", "seteuid", "setgid", "setegid",
        "setgroups", "setreuid", "setregid", "setresuid", "setresgid", "getresuid",
        "getresgid", "setsid", "getsid", "setpgid", "getpgid", "setpgrp", "getpgrp", "killpg",
        "tcgetpgrp", "tcsetpgrp", "ctermid", "openpty", "ttyname", "login_tty", "pidfd_open",
        "pread", "pwrite", "preadv", "pwritev", "readv", "writev", "sendfile", "splice",
        "copy_file_range", "uname", "sync", "fdatasync", "getloadavg", "sched_getaffinity",
        "sched_setaffinity", "statvfs", "fstatvfs", "mkfifo", "mknod", "makedev", "major",
        "minor", "chown", "fchown", "lchown", "chroot", "fchdir", "nice", "getpriority",
        "setpriority", "wait3", "wait4", "waitid", "WNOHANG", "WIFEXITED", "WEXITSTATUS",
        "WIFSIGNALED", "WTERMSIG", "WIFSTOPPED", "WSTOPSIG", "WCOREDUMP", "WUNTRACED",
        "WCONTINUED", "posix_spawn", "posix_spawnp", "posix_fadvise", "posix_fallocate",
        "memfd_create", "eventfd", "getxattr", "setxattr", "listxattr", "removexattr", "pipe2",
        "lockf", "sysconf", "confstr", "pathconf", "fpathconf", "unshare", "setns",
        "get_blocking", "set_blocking", "environb", "getenvb",
        "O_CLOEXEC", "O_NOFOLLOW", "O_DIRECTORY", "O_PATH", "O_NONBLOCK", "O_NOCTTY",
        "O_ASYNC", "O_DSYNC", "O_SYNC", "O_RSYNC", "O_NDELAY", "O_NOATIME", "O_TMPFILE",
        "O_LARGEFILE", "O_DIRECT", "O_ACCMODE",
    ),
    "signal": (
        "SIGKILL", "SIGHUP", "SIGCHLD", "SIGIO", "SIGPIPE", "SIGALRM", "SIGUSR1", "SIGUSR2",
        "SIGQUIT", "SIGSTOP", "SIGCONT", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGWINCH",
        "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGSYS", "SIGTRAP", "SIGBUS", "SIGURG",
        "SIGPOLL", "SIGPWR", "SIGRTMIN", "SIGRTMAX", "SIGSTKFLT", "SIGIOT", "SIGCLD",
        "pthread_sigmask", "pthread_kill", "pidfd_send_signal", "setitimer", "getitimer",
        "siginterrupt", "alarm", "pause", "sigwait", "sigtimedwait", "sigwaitinfo",
        "sigpending", "SIG_BLOCK", "SIG_UNBLOCK", "SIG_SETMASK", "ITIMER_REAL",
        "ITIMER_VIRTUAL", "ITIMER_PROF",
    ),
    "socket": (
        "AF_UNIX", "SO_PEERCRED", "SO_PEERSEC", "SO_PASSCRED", "SCM_RIGHTS", "SCM_CREDENTIALS",
        "AF_NETLINK", "AF_PACKET", "AF_VSOCK", "AF_ALG", "SOCK_CLOEXEC", "SOCK_NONBLOCK",
        "MSG_CMSG_CLOEXEC", "CMSG_LEN", "CMSG_SPACE", "sethostname",
    ),
    "select": ("poll", "epoll", "devpoll", "kqueue", "PIPE_BUF", "POLLIN", "POLLOUT",
               "POLLPRI", "POLLERR", "POLLHUP", "POLLNVAL", "POLLRDHUP", "EPOLLIN",
               "EPOLLOUT", "EPOLLERR", "EPOLLHUP", "EPOLLET", "EPOLLRDHUP"),
    "time": ("clock_gettime", "clock_gettime_ns", "clock_settime", "clock_settime_ns",
             "clock_getres", "pthread_getcpuclockid", "tzset", "CLOCK_BOOTTIME",
             "CLOCK_MONOTONIC", "CLOCK_MONOTONIC_RAW", "CLOCK_REALTIME",
             "CLOCK_PROCESS_CPUTIME_ID", "CLOCK_THREAD_CPUTIME_ID", "CLOCK_TAI"),
}
SOCKET_METHODS = ("sendmsg", "recvmsg", "recvmsg_into")  # absent from Windows sockets
WINDOWS_ONLY_ATTRIBUTES = {"os": {"O_BINARY": 0x8000, "O_NOINHERIT": 0x80, "O_TEXT": 0x4000}}


class _WindowsVersion(tuple):
    """What sys.getwindowsversion() returns: a struct sequence (indexed, and by name)."""

    def __new__(cls) -> _WindowsVersion:
        return super().__new__(cls, (10, 0, WINDOWS_BUILD, 2, ""))

    major, minor, build, platform, service_pack = (property(lambda self, i=i: self[i])
                                                   for i in range(5))
    platform_version = property(lambda self: (10, 0, WINDOWS_BUILD))


class _Absent:
    """A class attribute that is not there (hasattr is false)."""

    def __get__(self, instance: object, owner: type | None = None) -> object:
        raise AttributeError("not on Windows")


def _stub(name: str):
    if name.startswith("__"):  # (a module's own attributes, __file__ and such: absent)
        raise AttributeError(name)

    def stub(*args: object, **kwargs: object) -> object:
        raise OSError(f"{name}: a stub (this interpreter only looks like Windows)")
    return stub


class _Refuser:
    """A meta path finder: the POSIX-only modules cannot be imported."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in POSIX_ONLY_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r} (not on Windows)", name=name)


def look_like_windows() -> None:
    """Make this interpreter look like Windows CPython (see the module docstring); before
    anything of Stockade's is imported."""
    import importlib
    import types

    for name in SHAPED_AT_IMPORT:
        importlib.import_module(name)
    import ctypes
    import select
    import signal
    import socket
    import time

    for name in list(sys.modules):
        if name.partition(".")[0] in POSIX_ONLY_MODULES:
            del sys.modules[name]
    sys.meta_path.insert(0, _Refuser)
    modules = {"os": os, "signal": signal, "socket": socket, "select": select, "time": time}
    for module_name, names in POSIX_ONLY_ATTRIBUTES.items():
        for name in names:
            for module in (modules[module_name], *(
                    [sys.modules["_socket"]] if module_name == "socket" else [])):
                if hasattr(module, name):
                    delattr(module, name)
    os.supports_bytes_environ = False
    for method in SOCKET_METHODS:
        setattr(socket.socket, method, _Absent())
    for module_name, values in WINDOWS_ONLY_ATTRIBUTES.items():
        for name, value in values.items():
            setattr(modules[module_name], name, value)
    for name in WINDOWS_ONLY_MODULES:
        stub = types.ModuleType(name, f"a stub of {name} (see tests/windows_like.py)")
        stub.__getattr__ = _stub  # type: ignore[attr-defined]  (every name: a raising stub)
        sys.modules[name] = stub
    import _ssl  # (Windows' has two functions more, which ssl.py imports there)

    for name in ("enum_certificates", "enum_crls"):
        setattr(_ssl, name, _stub(name))

    class WinDLL:
        def __init__(self, name: str, *args: object, **kwargs: object) -> None:
            raise OSError(f"{name}: no Windows DLL can be loaded here (this interpreter only "
                          "looks like Windows)")

    ctypes.WinDLL = ctypes.OleDLL = WinDLL  # type: ignore[attr-defined]
    ctypes.windll = ctypes.oledll = ctypes.LibraryLoader(WinDLL)  # type: ignore[attr-defined]
    ctypes.WINFUNCTYPE = ctypes.CFUNCTYPE  # type: ignore[attr-defined]
    ctypes.HRESULT = ctypes.c_long  # type: ignore[attr-defined]
    ctypes.WinError = lambda code=None, descr=None: OSError(  # type: ignore[attr-defined]
        code, descr or "a Win32 error (stub)")
    ctypes.FormatError = lambda code=None: "a Win32 error (stub)"  # type: ignore[attr-defined]
    last_error = [0]
    ctypes.get_last_error = lambda: last_error[0]  # type: ignore[attr-defined]

    def set_last_error(value: int) -> int:
        previous, last_error[0] = last_error[0], value
        return previous

    ctypes.set_last_error = set_last_error  # type: ignore[attr-defined]
    ctypes.GetLastError = ctypes.get_last_error  # type: ignore[attr-defined]
    import io
    import platform

    class WindowsConsoleIO(io.RawIOBase):
        """io's console class on Windows (what pytest's capture looks for); never a console
        here."""

    io._WindowsConsoleIO = WindowsConsoleIO  # type: ignore[attr-defined]
    import tempfile
    tempfile.TemporaryFile = tempfile.NamedTemporaryFile  # (its shape on Windows)
    platform.machine = lambda: WINDOWS_MACHINE
    platform.system = lambda: "Windows"
    sys.platform = "win32"
    sys.getwindowsversion = _WindowsVersion  # type: ignore[attr-defined]
    sys.winver = f"{sys.version_info.major}.{sys.version_info.minor}"  # type: ignore


def run_as_windows(code: str, *, timeout: float = 120, env: dict[str, str] | None = None,
                   cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh, isolated interpreter that looks like Windows CPython."""
    boot = (f"import sys; sys.path.insert(0, {TESTS!r}); import windows_like; "
            "windows_like.look_like_windows(); del sys.path[0]\n")
    return subprocess.run([sys.executable, "-I", "-c", boot + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
