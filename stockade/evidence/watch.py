"""Host-side watches: each is armed before a launch and says afterwards whether anything outside
the sandbox changed (a file tree, a process that was signalled or traced or survived, a mount, a
terminal, a host that stopped responding). The network ones are in servers.py.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import os
import platform
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Finding:
    """A verdict on one side of a row: `ok`, and what was seen. Not ok is a FAIL (something
    got out), or with `error` an ERROR: nothing could be shown either way."""

    ok: bool
    text: str
    error: bool = False


class Watch(abc.ABC):
    """Armed when created; `finish` judges (once, after the launch); `close` releases."""

    @abc.abstractmethod
    def finish(self) -> Finding:
        """The host side's verdict."""

    def close(self) -> None:  # noqa: B027 - most watches hold nothing to release
        """Release threads, sockets and processes (idempotent)."""


def snapshot(path: Path, skipped: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every name below `path` (or `path` itself) with its type, mode, size and content, but
    what lies under the relative names `skipped` (never read); symbolic links are recorded,
    never followed. A missing path is an empty snapshot."""
    out: dict[str, tuple] = {}
    if not os.path.lexists(path):
        return out
    for dirpath, dirnames, filenames in os.walk(path) if path.is_dir() else [("", [], [path])]:
        dirnames[:] = [name for name in dirnames
                       if os.path.relpath(os.path.join(dirpath, name), path) not in skipped]
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            info = os.lstat(full)
            if stat.S_ISREG(info.st_mode):
                with open(full, "rb") as f:
                    body: bytes | str | None = f.read()
            else:
                body = os.readlink(full) if stat.S_ISLNK(info.st_mode) else None
            out[os.path.relpath(full, path) if path.is_dir() else "."] = (
                info.st_mode, info.st_size, info.st_nlink, body)
    return out


class Unchanged(Watch):
    """A file tree (or one file) that must be exactly as it was, but for what lies under
    `ignored` (relative names: what Stockade itself makes there, never the attack) and the
    directories above it, which making it makes."""

    def __init__(self, path: Path, label: str, ignored: tuple[str, ...] = ()) -> None:
        self.path, self.label, self.ignored = path, label, ignored
        self.above = {os.path.dirname(top) for top in ignored}
        while "" not in self.above and self.above:
            self.above |= {os.path.dirname(name) for name in self.above}
        self.before = snapshot(path, ignored)

    def finish(self) -> Finding:
        after = snapshot(self.path, self.ignored)
        changed = sorted(name for name in set(self.before) | set(after)
                         if self.before.get(name) != after.get(name)
                         and name not in self.above
                         and not any(name == top or name.startswith(top + "/")
                                     for top in self.ignored))
        if changed:
            return Finding(False, f"{self.label} CHANGED: {', '.join(changed[:5])}")
        return Finding(True, f"{self.label} unchanged")


def processes_with(marker: str, word: str | None = None) -> list[int]:
    """Pids of the host's processes whose command line contains `marker` (and, if given,
    `word` as one whole argument)."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    line = f.read()
            except OSError:
                continue
            if needle in line and (word is None or word.encode() in line.split(b"\0")):
                found.append(int(entry))
    return found


class Survivors(Watch):
    """No process started by the attack (all carry its marker) may outlive the sandbox. Its
    teardown gets `grace` seconds: the kernel's of a pid namespace, or a landlock-tier keeper
    killing the tree it reaps (in this process's own pid namespace)."""

    GRACE = 5.0

    def __init__(self, marker: str, grace: float = GRACE) -> None:
        self.marker, self.grace = marker, grace

    def finish(self) -> Finding:
        deadline = time.monotonic() + self.grace
        while (left := [p for p in processes_with(self.marker) if p != os.getpid()]) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            return Finding(False, f"{len(left)} process(es) SURVIVED the sandbox: {left[:5]}")
        return Finding(True, "no survivors")


class HelperGroup(Watch):
    """A helper a row starts on the host (a server, and whatever it forks) in a process group
    of its own. The row ends the group when its launch is done (`end`); none of it may remain
    then. What does is a survivor too: reported, and killed, so that no row leaves a helper
    running (a served request's child outlives a server that is only terminated)."""

    def __init__(self, process: subprocess.Popen, label: str) -> None:
        self.process, self.label = process, label

    def end(self) -> None:
        """SIGTERM the group, and reap its leader (SIGKILLed if it lingers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(Survivors.GRACE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def finish(self) -> Finding:
        deadline = time.monotonic() + Survivors.GRACE
        while (left := group_processes(self.process.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            end_processes(left)
            return Finding(False, f"{len(left)} process(es) of {self.label} SURVIVED its end "
                                  f"(now killed): {left[:5]}")
        return Finding(True, f"{self.label} ended")

    def close(self) -> None:
        if self.process.returncode is None:
            self.end()
        end_processes(group_processes(self.process.pid))


def group_processes(group: int) -> list[int]:
    """Pids of the host's live (not zombie) processes in process group `group`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state, _, pgrp = f.read().rsplit(b")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            if int(pgrp) == group and state != b"Z":
                found.append(int(entry))
    return found


def end_processes(pids: list[int]) -> None:
    """SIGKILL each of `pids` (processes a row started), and wait a moment for them to go."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + Survivors.GRACE
    while any(os.path.exists(f"/proc/{pid}") and _status_field(pid, "State") != "Z"
              for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


_VICTIM = """
import signal, sys, time
def record(number, frame):
    sys.stdout.write(f"{number}\\n"); sys.stdout.flush()
for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, record)
sys.stdout.write("ready\\n"); sys.stdout.flush()
time.sleep(120)
"""


class Victim(Watch):
    """A host process that must stay alive, unsignalled, untraced and as it was controlled
    (its limits, priority, affinity, scheduling and I/O priority). Its command line holds
    `tag`, by which an attack that can see its pid tells it from a process of its own."""

    def __init__(self, tag: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", _VICTIM, tag],
                                     stdout=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdout is not None
        self.proc.stdout.readline()  # "ready": handlers installed
        self.pid = self.proc.pid
        self.controls = controls_of(self.pid)

    def finish(self) -> Finding:
        alive = self.proc.poll() is None
        tracer = _status_field(self.pid, "TracerPid") if alive else "?"
        changed = [name for name, value in controls_of(self.pid).items()
                   if value != self.controls[name]] if alive else []
        self.close()
        assert self.proc.stdout is not None
        received = self.proc.stdout.read().split()
        if not alive or received or tracer != "0" or changed:
            return Finding(False, f"host process {self.pid} HIT: alive={alive}, "
                                  f"signals={received}, tracer={tracer}, changed={changed}")
        return Finding(True, f"host process {self.pid} alive, no signal, not traced, its "
                             "limits, priority, affinity and scheduling unchanged")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}
_IOPRIO_WHO_PROCESS = 1


def controls_of(pid: int) -> dict[str, object]:
    """What another process of the same user could change of `pid`: its resource limits,
    nice value, CPU affinity, scheduling policy and I/O priority."""
    with open(f"/proc/{pid}/limits") as f:
        limits = f.read()
    libc = ctypes.CDLL(None, use_errno=True)
    number = _IOPRIO_GET.get(platform.machine())
    ioprio = libc.syscall(number, _IOPRIO_WHO_PROCESS, pid) if number else None
    return {"limits": limits, "nice": os.getpriority(os.PRIO_PROCESS, pid),
            "affinity": os.sched_getaffinity(pid), "scheduler": os.sched_getscheduler(pid),
            "ioprio": ioprio}


class Attributes(Watch):
    """A tree whose modes and extended attributes must stay as they were."""

    def __init__(self, path: Path, label: str) -> None:
        self.path, self.label = path, label
        self.before = self._now()

    def _now(self) -> dict[str, tuple]:
        out: dict[str, tuple] = {}
        for dirpath, dirnames, filenames in os.walk(self.path):
            for full in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                attributes = {name: os.getxattr(full, name, follow_symlinks=False)
                              for name in os.listxattr(full, follow_symlinks=False)}
                out[os.path.relpath(full, self.path)] = (os.lstat(full).st_mode, attributes)
        return out

    def finish(self) -> Finding:
        after = self._now()
        changed = sorted(name for name in set(self.before) | set(after)
                         if self.before.get(name) != after.get(name))
        if changed:
            return Finding(False, f"{self.label} CHANGED (modes, attributes): "
                                  f"{', '.join(changed[:5])}")
        return Finding(True, f"{self.label}: modes and attributes unchanged")


def _status_field(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(line.split()[1] for line in f if line.startswith(name + ":"))
    except (OSError, StopIteration):
        return ""


def mounts_under(path: Path) -> list[str]:
    """Mount points of the host (this process's mount namespace) at or below `path`."""
    prefix = str(path).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == str(path) or p.startswith(prefix)]


class NoMounts(Watch):
    """No mount may appear on the host at or below `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def finish(self) -> Finding:
        found = mounts_under(self.path)
        if found:
            return Finding(False, f"host MOUNTS appeared: {found[:3]}")
        return Finding(True, "no host mount appeared")


class Mounted(Watch):
    """A mount on the host (root's) while the row runs, made by `command` (the point last,
    run in `cwd`); undone when the scene closes, before its tree is removed. The verdict: the
    mount was still there after the attack."""

    def __init__(self, point: Path, command: list[str], cwd: Path | None = None,
                 pass_fds: tuple[int, ...] = ()) -> None:
        self.point = point
        done = subprocess.run([*command, str(point)], check=False, capture_output=True,
                              text=True, cwd=cwd, pass_fds=pass_fds)
        self.made = done.returncode == 0
        self.why = done.stderr.strip()

    def finish(self) -> Finding:
        if str(self.point) in mounts_under(self.point):
            return Finding(True, f"{self.point} stayed mounted")
        return Finding(False, f"{self.point} is no longer mounted", error=True)

    def close(self) -> None:
        if self.made:
            subprocess.run(["umount", "-l", str(self.point)], check=False, capture_output=True)
            self.made = False


class BindMount(Mounted):
    """`source` shown at `point` too (a bind mount), as an administrator binds a home or a key
    elsewhere."""

    def __init__(self, source: Path, point: Path) -> None:
        super().__init__(point, ["mount", "--bind", str(source)])


class OverlayMount(Mounted):
    """An overlay of `layers` (lower layers, the first on top) at `point`, each layer written
    as given, mounted from `cwd` (so a relative layer stays relative in the mount table, as a
    container engine writes its layers); read-only, or with `upper` (its upper layer and work
    directory) writable. `pass_fds`: descriptors the mounter has too (a layer may name one,
    /proc/self/fd/N)."""

    def __init__(self, point: Path, layers: tuple[str, ...], cwd: Path | None = None,
                 upper: tuple[Path, Path] | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        options = "lowerdir=" + ":".join(layers)
        if upper is not None:
            options += f",upperdir={upper[0]},workdir={upper[1]}"
        super().__init__(point, ["mount", "-t", "overlay", "overlay", "-o", options], cwd,
                         pass_fds)


MS_BIND = 0x1000
MNT_DETACH = 0x2


class DeepBindMount(Watch):
    """`source` shown (root: a bind mount on the host) at the end of a chain of `levels`
    directories named `name` made below `top`, whose path is longer than the kernel looks up
    whole (PATH_MAX): made, checked and undone through descriptors, a directory at a time (by
    /proc/self/fd, never the path). Undone when the scene closes, before its tree is removed.
    The verdict: the mount was still there after the attack."""

    def __init__(self, source: Path, top: Path, name: str, levels: int) -> None:
        self.name, self.made, self.why, self.root = name, False, "", -1
        self.source = os.stat(source)
        self.above = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for level in range(levels):
                os.mkdir(name, dir_fd=self.above)
                if level < levels - 1:
                    below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                    | os.O_CLOEXEC, dir_fd=self.above)
                    os.close(self.above)
                    self.above = below
            point = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                            dir_fd=self.above)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.mount(os.fsencode(source), f"/proc/self/fd/{point}".encode(), None,
                              MS_BIND, None) != 0:
                    self.why = os.strerror(ctypes.get_errno())
                    return
            finally:
                os.close(point)
            self.made = True
            # (the mount's own root: what umount is given)
            self.root = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC,
                                dir_fd=self.above)
        except BaseException:
            self.close()
            raise

    def finish(self) -> Finding:
        shown = os.stat(self.name, dir_fd=self.above)
        if (shown.st_dev, shown.st_ino) == (self.source.st_dev, self.source.st_ino):
            return Finding(True, "the mount past PATH_MAX stayed")
        return Finding(False, "the mount past PATH_MAX is no longer there", error=True)

    def close(self) -> None:
        if self.made:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.umount2(f"/proc/self/fd/{self.root}".encode(), MNT_DETACH)
            self.made = False
        if self.root >= 0:
            os.close(self.root)
            self.root = -1
        if self.above >= 0:
            os.close(self.above)
            self.above = -1


class ModeSet(Watch):
    """`path` given `mode` while the row runs (a directory a user, or an earlier run, left
    enterable but not listable); its own mode given back when the scene closes, before its
    tree is removed. The verdict: the mode was still `mode` after the attack."""

    def __init__(self, path: Path, mode: int) -> None:
        self.path, self.mode = path, mode
        self.before: int | None = stat.S_IMODE(os.lstat(path).st_mode)
        os.chmod(path, mode)

    def finish(self) -> Finding:
        now = stat.S_IMODE(os.lstat(self.path).st_mode)
        return Finding(now == self.mode, f"{self.path} mode {now:04o} (set {self.mode:04o})")

    def close(self) -> None:
        if self.before is not None:
            os.chmod(self.path, self.before)
            self.before = None


class Heartbeat(Watch):
    """Starts `true` on the host every 50 ms during the attack; reports the worst latency."""

    LIMIT = 2.0  # seconds: slower than this and the host counts as unresponsive

    def __init__(self) -> None:
        self.worst = 0.0
        self.beats = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            started = time.monotonic()
            subprocess.run(["true"], check=False)
            self.worst = max(self.worst, time.monotonic() - started)
            self.beats += 1
            if self.stopped.wait(0.05):
                return

    def finish(self) -> Finding:
        self.close()
        text = f"host heartbeat worst {self.worst * 1000:.0f} ms over {self.beats} beats"
        if self.worst > self.LIMIT:
            return Finding(False, "host UNRESPONSIVE: " + text)
        return Finding(True, text)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()


class HostTerminal(Watch):
    """A pseudo-terminal of the host, handed to the child as its stdin (our fd 0 is swapped for
    its slave end until `finish`): no keystroke may be pushed into its input."""

    def __init__(self) -> None:
        import tty  # (POSIX: the terminal rows run on Linux only)

        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.saved = os.dup(0)
        os.dup2(self.slave, 0)

    def finish(self) -> Finding:
        self._restore()
        os.set_blocking(self.slave, False)
        try:
            injected = os.read(self.slave, 1024)
        except BlockingIOError:
            injected = b""
        self.close()
        if injected:
            return Finding(False, f"keystrokes INJECTED into the host terminal: {injected!r}")
        return Finding(True, "host terminal got no keystroke")

    def _restore(self) -> None:
        if self.saved >= 0:
            os.dup2(self.saved, 0)
            os.close(self.saved)
            self.saved = -1

    def close(self) -> None:
        self._restore()
        _close_pty(self)


class AtMost(Watch):
    """A file the attack may write, but only up to `limit` bytes."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path, self.limit = path, limit

    def finish(self) -> Finding:
        size = self.path.stat().st_size if self.path.exists() else 0
        if size > self.limit:
            return Finding(False, f"{self.path.name} GREW to {size} bytes (limit {self.limit})")
        return Finding(True, f"{self.path.name} holds {size} bytes (limit {self.limit})")


# What a launch of the Linux backend makes in the host's /tmp (the allowlist proxy's socket
# directory). (Other names starting with "stockade" are other programs' on a shared host.)
LAUNCH_TEMPORARIES = ("stockade-proxy-",)


def residue() -> tuple[frozenset[str], frozenset[str]]:
    """Names in the host's /tmp that a launch makes, and the host's mount points: those of
    this user only (another user's runs beside this one, e.g. CI's root and rootless suites,
    make and remove theirs in the same /tmp and mount table)."""
    tmp = tempfile.gettempdir()
    names = frozenset(n for n in os.listdir(tmp) if n.startswith(LAUNCH_TEMPORARIES)
                      and _ours(os.path.join(tmp, n)))
    with open("/proc/self/mountinfo") as f:
        points = frozenset(point for line in f
                           if _ours(os.path.dirname(point := line.split()[4]) or "/"))
    return names, points


def _ours(path: str) -> bool:
    """Whether this user owns `path` (what cannot be looked at counts as ours: not hidden)."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return True


class NoResidue(Watch):
    """Nothing a launch might leave behind appears: no temporary of its in /tmp, no mount. What
    goes away within a grace period (another launch's temporary directory) is no residue."""

    def __init__(self) -> None:
        self.before = residue()

    def finish(self) -> Finding:
        deadline = time.monotonic() + Survivors.GRACE
        while True:
            names, points = (after - before for after, before in zip(residue(), self.before,
                                                                     strict=True))
            if not (names or points) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if names or points:
            return Finding(False, f"RESIDUE: /tmp entries {sorted(names)[:3]}, "
                                  f"mounts {sorted(points)[:3]}")
        return Finding(True, "no new launch temporary in /tmp, no new mount")


class NoPrivilegeBits(Watch):
    """A tree (a write root) in which no file may end up setuid, setgid or with a file
    capability: such a file would keep them on the host."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def finish(self) -> Finding:
        found = []
        for dirpath, _, filenames in os.walk(self.path):
            for name in filenames:
                full = os.path.join(dirpath, name)
                info = os.lstat(full)
                try:
                    capability = os.getxattr(full, "security.capability", follow_symlinks=False)
                except OSError:
                    capability = b""
                if info.st_mode & (stat.S_ISUID | stat.S_ISGID) or capability:
                    found.append(f"{name} {stat.filemode(info.st_mode)}")
        if found:
            return Finding(False, f"privilege bits LEFT on the host: {', '.join(found)}")
        return Finding(True, "no setuid, setgid or file capability in the workspace")


class CallerTerminal(Watch):
    """A pseudo-terminal of the host that a launch's caller has as its stdin, stdout and stderr
    (raw, so what the command prints arrives as it was printed), with a line typed on it
    before the launch: afterwards its settings must be unchanged and the typed line still
    unread (it was the shell's)."""

    def __init__(self, typed: bytes) -> None:
        import termios
        import tty  # (POSIX: the terminal rows run on Linux only)

        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.settings = termios.tcgetattr(self.slave)
        self.typed = typed
        os.write(self.master, typed)

    def shown(self) -> bytes:
        """What was written to the terminal so far."""
        os.set_blocking(self.master, False)
        out = b""
        try:
            while chunk := os.read(self.master, 65536):
                out += chunk
        except (BlockingIOError, OSError):
            pass
        return out

    def finish(self) -> Finding:
        import termios

        changed = termios.tcgetattr(self.slave) != self.settings
        os.set_blocking(self.slave, False)
        try:
            left = os.read(self.slave, 1024)
        except BlockingIOError:
            left = b""
        self.close()
        if changed:
            return Finding(False, "the terminal's settings were CHANGED")
        if left != self.typed:
            return Finding(False, f"what was typed on the terminal was READ (left: {left!r})")
        return Finding(True, "terminal settings unchanged, typed line unread")

    def close(self) -> None:
        _close_pty(self)


def _close_pty(watch: HostTerminal | CallerTerminal) -> None:
    for fd in (watch.master, watch.slave):
        try:
            os.close(fd)
        except OSError:
            pass  # already closed
    watch.master = watch.slave = -1


class AppendedFile(Watch):
    """A host file the caller's stdout is appended to, holding earlier lines: afterwards it
    must start with them, and hold at most `limit` bytes more."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path, self.limit = path, limit
        self.earlier = b"earlier lines of the host's log\n"
        path.write_bytes(self.earlier)

    def finish(self) -> Finding:
        body = self.path.read_bytes()
        if not body.startswith(self.earlier):
            return Finding(False, "the host file was TRUNCATED or overwritten")
        added = len(body) - len(self.earlier)
        if added > self.limit:
            return Finding(False, f"{added} bytes reached the host file, past the limit "
                                  f"{self.limit}")
        return Finding(True, f"earlier lines kept; {added} bytes added (limit {self.limit})")
