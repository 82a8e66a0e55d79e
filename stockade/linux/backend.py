"""LinuxBackend: the Backend contract on Linux (namespaces, mounts, Landlock, seccomp, rlimits)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys

import stockade
from stockade.errors import (
    SetupError,
    StartError,
    UnavailableError,
    UnenforceableError,
)
from stockade.launch.backend import Backend, Capability, Exit, Handle, Stdio
from stockade.launch.request import LaunchRequest
from stockade.linux import landlock, seccomp
from stockade.linux.launcher import WEAKENINGS, encode_frame

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(stockade.__file__)))
# -I -S: no environment, no site-packages, no current directory on sys.path; only Stockade.
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from stockade.linux.launcher import main; main(int(sys.argv[2]), int(sys.argv[3]))")
_SYSTEM_PREFIXES = ("/proc", "/dev")


@functools.cache
def _seccomp_program() -> bytes:
    return seccomp.compile_filter()


class LinuxBackend(Backend):
    """`weaken` switches layers off, for tests that prove the evidence matrix can fail; it is
    a constructor argument only, never read from the environment or a policy."""

    name = "linux"

    def __init__(self, weaken: frozenset[str] = frozenset()) -> None:
        unknown = weaken - WEAKENINGS
        if unknown:
            raise ValueError(f"unknown weakening {sorted(unknown)[0]!r}")
        self.weaken = weaken

    def probe(self) -> None:
        if not sys.platform.startswith("linux"):
            raise UnavailableError("backend_unavailable", "the Linux backend runs only on Linux")
        for knob, bad, why in (
            ("/proc/sys/user/max_user_namespaces", "0", "user namespaces are disabled"),
            ("/proc/sys/kernel/unprivileged_userns_clone", "0",
             "unprivileged user namespaces are disabled"),
            ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
             "AppArmor restricts unprivileged user namespaces"),
        ):
            if _read(knob) == bad and not (os.getuid() == 0 and "unprivileged" in knob):
                raise UnavailableError("userns_unavailable", f"{why} ({knob} = {bad})")
        if landlock.abi_version() == 0:
            raise UnavailableError("landlock_unsupported",
                                   "this kernel has no Landlock, or it is disabled")
        _seccomp_program()  # raises seccomp_unavailable without libseccomp

    def check(self, request: LaunchRequest) -> None:
        if request.network.mode != "none":
            raise UnenforceableError(
                f"network.{request.network.mode}",
                f"network mode {request.network.mode!r} is not implemented by the Linux backend "
                "yet; only 'none' is enforced",
            )
        if request.limits.cpu is not None:
            raise UnenforceableError(
                "limits.cpu", "a CPU rate needs a delegated cgroup v2 cpu controller, "
                "which this host does not offer")
        for grant in request.read + request.write:
            if any(grant.path == p or grant.path.startswith(p + "/") for p in _SYSTEM_PREFIXES):
                raise UnenforceableError(
                    "filesystem.system_path",
                    f"{grant.path}: the sandbox provides its own /proc and /dev")

    def spawn(self, request: LaunchRequest, stdio: Stdio) -> LinuxHandle:
        return LinuxHandle(request, stdio, _seccomp_program(), self.weaken)

    def report(self) -> list[Capability]:
        abi = landlock.abi_version()
        uid = os.getuid()
        return [
            Capability("namespaces", True, "user, mnt, pid, ipc, uts, net, cgroup",
                       "rootless" if uid else "as root: uid 0 mapped to itself, no capabilities"),
            Capability("filesystem.read", True, "read-only bind mounts + Landlock"),
            Capability("filesystem.write", True, "nosuid/nodev bind mounts + Landlock"),
            Capability("filesystem.deny", True, "mode-000 masks mounted over the path"),
            Capability("filesystem.protected", True,
                       "read-only re-mounts of every existing occurrence; ancestors pinned"),
            Capability("filesystem.exec_from_write", True, "noexec mounts + Landlock EXECUTE"),
            Capability("landlock", abi > 0, f"ABI {abi}"),
            Capability("seccomp", True, "libseccomp filter", f"{len(seccomp.DENIED_SYSCALLS)} "
                       "syscalls denied, clone3 -> ENOSYS, TIOCSTI/TIOCLINUX denied"),
            Capability("network.none", True, "empty network namespace + Landlock TCP"),
            Capability("network.allowlist", False, "not implemented yet"),
            Capability("network.any", False, "not implemented yet"),
            Capability("limits.memory", True, "RLIMIT_AS", "per process, not per tree"),
            Capability("limits.pids", True,
                       "pid_max of the sandbox pid namespace" if uid == 0 else "RLIMIT_NPROC",
                       "at most pids + 300 when run as root" if uid == 0 else "exact"),
            Capability("limits.cpu", False, "needs a delegated cgroup v2 cpu controller"),
            Capability("limits.file_size", True, "RLIMIT_FSIZE"),
            Capability("limits.timeout", True, "wall clock; the pid namespace is torn down"),
            Capability("kill_on_close", True, "pid-namespace init bound to the owner's lifeline"),
        ]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class LinuxHandle(Handle):
    """A running launcher process. Killing it takes the whole sandbox down (PDEATHSIG)."""

    def __init__(self, request: LaunchRequest, stdio: Stdio, bpf: bytes,
                 weaken: frozenset[str] = frozenset()) -> None:
        request_r, self._lifeline = os.pipe()
        status_r, status_w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BOOT, _PACKAGE_PARENT,
                 str(request_r), str(status_w)],
                stdin=stdio.stdin, stdout=stdio.stdout, stderr=stdio.stderr,
                pass_fds=(request_r, status_w), env={}, cwd="/",
            )
        finally:
            os.close(request_r)
            os.close(status_w)
        self._status = os.fdopen(status_r, "rb")
        self.stdin, self.stdout = self._proc.stdin, self._proc.stdout
        self.stderr = self._proc.stderr
        self.pid = self._proc.pid
        self.enforced: dict = {}
        self._killed = False
        try:
            os.write(self._lifeline, encode_frame(request.encode(), bpf, weaken))
        except BrokenPipeError:
            pass  # the launcher died already; wait() reports why

    def wait(self, timeout: float | None = None) -> Exit | None:
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._settle()

    def kill(self) -> None:
        self._killed = True
        if self._proc.returncode is None:
            self._proc.kill()
        self._close_lifeline()

    def _close_lifeline(self) -> None:
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1

    def _settle(self) -> Exit:
        self._close_lifeline()
        events = [json.loads(line) for line in self._status.read().splitlines() if line.strip()]
        self._status.close()
        for event in events:
            if event["event"] == "started":
                self.enforced = event["enforced"]
            elif event["event"] == "exit":
                return Exit(event["exit_code"], event["signal"])
            elif event["event"] == "error":
                return Exit(None, None, _error(event))
        if self._killed:
            return Exit(None, signal.SIGKILL)
        code = self._proc.returncode
        return Exit(None, None, SetupError(
            "launcher_failed", f"the sandbox launcher ended unexpectedly (status {code})",
            stage="launcher"))


def _error(event: dict) -> Exception:
    if event["kind"] == "start":
        return StartError(event["code"], event["message"])
    if event["code"] in ("userns_unavailable", "landlock_unsupported", "seccomp_unavailable"):
        return UnavailableError(event["code"], event["message"])
    if event["code"].startswith("unenforceable:"):
        return UnenforceableError(event["code"].split(":", 1)[1], event["message"])
    return SetupError(event["code"], event["message"], stage=event.get("stage", ""))
