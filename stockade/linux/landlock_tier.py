"""The landlock tier (`isolation = "landlock"`): a sandbox without any namespace, for hosts where
none can be made (a container runtime's seccomp filter, user.max_user_namespaces = 0, an LSM
that restricts user namespaces), used only when the policy, the call or `--isolation` asks.

A keeper process (forked by the zygote, or by the `stockade` command itself) stands where a
sandbox's pid 1 would: it reads the launch from the request pipe, computes the command's
Landlock rules on the host's own view, forks the command and confines it (a new session,
rlimits, securebits and every capability dropped, Landlock, no_new_privs, seccomp, only stdio
inherited), then reaps everything the command leaves behind: it is the tree's child
subreaper, so a daemonised or double-forked descendant is reparented to it, and it kills every
descendant (each pinned by a pidfd before it is signalled) when the command exits, when the
owner's lifeline closes, or on a timeout. Its events on the status pipe are pid 1's (init.py),
so the owner's LinuxHandle runs it unchanged.

With no mount view, every boundary is a Landlock rule, a seccomp rule or a limit:

- the roots are Landlock rules; a protected object or denied path inside a root is carved out
  (`grants`): the root's rule is replaced by rules for each of its other entries, so the
  directories on the way to it accept no new entry and lose none (Landlock cannot grant a
  right beneath a directory and withhold it beneath one of its children); a root that holds
  a place of Stockade's state is refused (`refuse_state_in_roots`);
- the host's /proc is readable (other processes are visible, but Landlock keeps their memory,
  environment and descriptors out of reach and scopes signals: Landlock ABI 6 is required),
  /dev holds only null, zero, full, random and urandom, and /tmp and /dev/shm are the host's,
  unreachable unless granted;
- seccomp: the Linux backend's hardening, plus no socket of AF_UNIX (pathname sockets, the
  daemon's among them, are not governed by Landlock up to ABI 7), AF_INET, AF_INET6 or
  AF_NETLINK (the host's network namespace is shared); Landlock also denies TCP bind and
  connect; no other process's limits, priority, affinity or scheduling by pid, no extended
  attribute set, no mode that lets other users write, no inotify (ENOSYS: a watch outside the
  roots would tell of the host's activity there; callers poll instead) (Landlock governs none
  of these);
- limits.pids is RLIMIT_NPROC, which counts every process of the user: it is set to the user's
  current count plus `pids`. It does not bind root: as root a preset's limit is lifted at
  compile (launch/compile.py `pids_lifted`, said), a policy's own refused.
"""

from __future__ import annotations

import errno
import os
import resource
import select
import signal
import struct
from dataclasses import replace
from typing import NoReturn

from stockade.errors import SetupError, StockadeError, UnavailableError, UnenforceableError
from stockade.launch.backend import Capability
from stockade.launch.request import LaunchRequest
from stockade.linux import init, landlock, limits, mnt, privilege, protect, seccomp
from stockade.linux.frame import parse_frame, read_frame
from stockade.linux.hints import hint
from stockade.linux.syscalls import prctl

SCOPE_ABI = 6  # signal and abstract unix socket scoping: without them the tier is refused
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_LAUNCH = struct.Struct("<III")  # after the view digest: umask, argc, envc (launcher.py)
_DIGEST = 32
# What the tier does not enforce on any host, as `enforced["not_enforced"]` and the report say.
NOT_ENFORCED = (
    "host processes are visible in /proc (their command lines and status; Landlock keeps "
    "their memory, environment and descriptors out of reach and scopes signals)",
    "/tmp and /dev/shm are the host's: unreachable unless granted, and shared when granted",
    "no mount view: protected names, repositories' guarded files and denied paths are "
    "Landlock rules; a directory on the way to one accepts no new entry; a root that holds "
    "Stockade's state directory is refused",
    "no unix sockets at all (AF_UNIX is refused; socketpair works), whatever "
    "network.unix_sockets says",
    "limits.pids is RLIMIT_NPROC, which counts every process of the user (set to the user's "
    "count at launch plus pids)",
    "executing a memfd the command wrote is not prevented (vm.memfd_noexec is the host's)",
    "exec_from_write = false withholds execve only: a written file can still be run through "
    "ld.so or mapped executable (no exec watch in this tier)",
    "file metadata is not governed: chmod and utime work on any file the user owns, outside "
    "the roots too (set-user-id and set-group-id bits, a mode that lets other users write and "
    "every extended attribute stay refused)",
    "the command's own children and threads cannot be reniced, limited or pinned by pid "
    "either (only pid 0, the caller itself): a filter cannot tell them from the host's",
    "the keeper is a host process: killed by another host process, it leaves the command's "
    "grandchildren running",
    "the host's hostname, IPC objects and cgroup are shared",
)


ROOT_PIDS = ("limits.pids, as root (RLIMIT_NPROC does not bind uid 0): a preset's limit is "
             "lifted, a policy's own is refused")


def not_enforced() -> list[str]:
    """NOT_ENFORCED, and as root what it adds."""
    return [*NOT_ENFORCED, *([ROOT_PIDS] if os.geteuid() == 0 else [])]


def check(request: LaunchRequest) -> None:
    """Refuse, typed, what this tier cannot enforce (beyond the Linux backend's own checks)."""
    if request.network.mode == "allowlist":
        raise UnenforceableError(
            "network.allowlist", "the landlock tier does not run Stockade's proxy yet: with no "
            "network namespace its port would be the host's; use network none, or isolation "
            "namespaces")
    if request.network.mode == "any":
        raise UnenforceableError(
            "network.any", "the landlock tier has no network namespace of its own, so nothing "
            "could keep the command from the host's loopback and addresses: use isolation "
            "namespaces for network any")
    if request.network.unix_sockets == "any":
        raise UnenforceableError(
            "network.unix_sockets", "the landlock tier cannot let a command reach unix sockets "
            "without letting it reach every pathname socket of the host (Landlock does not "
            "govern them): use unix_sockets own or none")
    if request.limits.pids is not None and os.geteuid() == 0:
        raise UnenforceableError(
            "limits.pids", "the landlock tier has no pid namespace, and RLIMIT_NPROC does not "
            'bind root: run as an ordinary user, or lift the limit (limits.pids = "unlimited" '
            "in the policy; a preset's own limit is lifted there, and said)")


def refuse_state_in_roots(request: LaunchRequest) -> None:
    """Refuse, typed, a root that holds a place of Stockade's state (the ledger, the servers'
    sockets, change sets; request.stockade_state, existing or not): Landlock rules only add
    rights, and with no mount view nothing could hide it from a command granted a root
    above it, nor keep out a state directory made there while the command runs."""
    for roots, knob in ((request.write, "filesystem.write"), (request.read, "filesystem.read")):
        for root in roots:
            for state in request.stockade_state:
                if state == root.path or state.startswith(root.path.rstrip("/") + "/"):
                    raise UnenforceableError("filesystem.stockade_state", (
                        f"the {knob} root {root.path} holds Stockade's state directory "
                        f"{state}, which the landlock tier cannot hide (Landlock rules only "
                        f"add rights): grant a directory that does not hold it (a workspace "
                        f"below {root.path}), set STOCKADE_STATE_DIR (or --state-dir) outside "
                        f"every root if it is that one, or use isolation namespaces"))


def require_landlock() -> int:
    """This kernel's Landlock ABI; UnavailableError if the tier cannot run on it."""
    abi = landlock.abi_version()
    if abi == 0:
        raise UnavailableError("landlock_unsupported", hint(
            "the landlock tier needs Landlock, which this kernel does not offer"))
    if abi < SCOPE_ABI:
        raise UnavailableError("landlock_unsupported", hint(
            f"the landlock tier needs Landlock ABI {SCOPE_ABI} (Linux 6.12: signal and "
            f"abstract unix socket scoping); this kernel offers ABI {abi}"))
    return abi


def seccomp_program(weaken: frozenset[str]) -> bytes:
    """The command's filter: the backend's, without unix or internet sockets, without acting
    on any other process by pid, setting extended attributes, giving other users write
    through a mode or watching files (inotify). Each goes with a weakening of its own, tests
    only ("unix_sockets", "network", "pid_scope", "xattr", "world_write", "inotify"), and all
    with "seccomp"."""
    return seccomp.compile_filter("unix_sockets" in weaken, "network" in weaken,
                                  other_processes="pid_scope" in weaken,
                                  xattrs="xattr" in weaken, world_write="world_write" in weaken,
                                  inotify="inotify" in weaken)


def start(fds: list[int]) -> int:
    """Fork the keeper of one launch (its six descriptors, launcher.LAUNCH_FDS, which the
    caller still closes); a pidfd of it."""
    from stockade.linux import ns

    pid, pidfd = ns.clone_sandbox(namespaces=0, network=False)
    if pid == 0:
        try:
            privilege.close_fds(set(fds))
            _keep(fds)
        finally:  # (the owner gone mid-launch: its status pipe refuses a write)
            try:
                kill_descendants()
            finally:
                os._exit(70)
    return pidfd


def _keep(fds: list[int]) -> NoReturn:
    stdio, lifeline, status_fd, control = fds[:3], fds[3], fds[4], fds[5]
    os.close(control)  # (no proxy listener in this tier)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(init.PR_SET_DUMPABLE, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the owner
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (the zygote ignores it: then none reaped)
    signal.set_wakeup_fd(wake_w)
    init.stage(status_fd, "handoff")
    try:
        raw, bpf, weaken, launch = parse_frame(read_frame(lifeline))
        request = LaunchRequest.decode(raw)
        umask = _LAUNCH.unpack_from(launch, _DIGEST)[0]
    except (StockadeError, EOFError, OSError, struct.error) as exc:
        _fail(status_fd, "request_invalid", str(exc), "request")
    init.stage(status_fd, "request")
    try:
        made = ruleset(request, weaken)
    except StockadeError as exc:
        _fail(status_fd, exc.code, exc.message, "rules")
    except OSError as exc:
        _fail(status_fd, "setup_failed", f"{exc.strerror} ({exc.filename or ''})", "rules")
    init.stage(status_fd, "rules")
    processes = _nproc(request, weaken)
    command, report = _fork_command(request, stdio, umask, made, bpf, weaken, processes)
    for fd in stdio:
        os.close(fd)
    _started(status_fd, command, report, request)
    init.stage(status_fd, "exec")
    init.emit(status_fd, event="started", enforced=enforced(request, weaken, made))
    status = _wait(command, lifeline if "lifeline" not in weaken else -1, wake_r)
    init.stage(status_fd, "run")
    if "tree_kill" not in weaken:  # (tests only: what the command left behind keeps running)
        kill_descendants()
    if os.WIFSIGNALED(status):
        init.emit(status_fd, event="exit", exit_code=None, signal=os.WTERMSIG(status))
    else:
        init.emit(status_fd, event="exit", exit_code=os.WEXITSTATUS(status), signal=None)
    os._exit(0)


def ruleset(request: LaunchRequest, weaken: frozenset[str]) -> landlock.Ruleset:
    """The command's Landlock ruleset on the host's view (see `grants`)."""
    base = landlock.ruleset(landlock.LandlockRules(
        read=(), write=(), devices=(), exec_from_write=request.exec_from_write,
        deny_tcp=True, scope=True))
    return replace(base, grants=tuple(grants(request, base.handled_fs, weaken)))


def grants(request: LaunchRequest, handled: int, weaken: frozenset[str] = frozenset()
           ) -> list[tuple[str, int]]:
    """(path, rights beneath it) for the roots, with each protected object (read rights only)
    and denied path (none) carved out of every root it lies in; /proc read-only and the
    devices. A denied path that does not exist yet is carved out too, so it cannot be made."""
    read, write, device = landlock.rights(handled, request.exec_from_write)
    linked = {} if weaken & {"deny", "deny_links"} else mnt.denied_files(
        request, [g.path for g in request.deny])
    walked = _walked(request, linked, "protected" not in weaken)
    # (the roots no walk looks through: the read roots, and a write root that is a file)
    protect.refuse_unfound(linked, [g.path for g in request.read] + [
        g.path for g in request.write if not os.path.isdir(g.path)])
    excluded: dict[str, int] = {}
    if "deny" not in weaken:
        # (and every other name of a denied file: a rule holds for the inode, every name)
        excluded |= {path: 0 for path in [g.path for g in request.deny] + walked.aliases}
    if "protected" not in weaken:
        excluded |= {g.path: read for g in walked.guards
                     if g.kind == "protected" and g.path not in excluded}
    out: list[tuple[str, int]] = []
    for roots, rights in ((request.read, read), (request.write, write)):
        for grant in roots:
            _carve(grant.path, rights, excluded, out)
    _refuse_rules_on_denied(out, linked)
    _refuse_rules_above_excluded(out, excluded)
    out.append(("/proc", read & ~landlock.EXECUTE))
    out += [(path, device) for path in DEVICES if os.path.exists(path)]
    return out


def _walked(request: LaunchRequest, linked: dict[tuple[int, int], protect.DeniedFile],
            protected: bool) -> protect.Walked:
    """What a view would re-mount read-only in the write roots (protect.walk: protected names,
    repositories' guarded files, files with more than one link; none unless `protected`), and
    the other names there of the `linked` denied files."""
    if not protected and not linked:
        return protect.Walked([], [], [])
    roots = [(g.path, mnt.open_source(g.path, "filesystem.write")) for g in request.write]
    try:
        dirs = [(path, fd) for path, fd in roots if os.path.isdir(f"/proc/self/fd/{fd}")]
        shown_in = tuple(g.path for g in request.read + request.write)
        denied = tuple(g.path for g in request.deny)  # (carved out: not looked into)
        if not protected:  # (the other names of denied files only; the "protected" switch)
            return protect.walk(dirs, frozenset(), "writable", denied, denied=linked,
                                shown_in=shown_in)
        return protect.walk(dirs, frozenset(request.protected), request.git, denied,
                            readonly=request.home_code, denied=linked, shown_in=shown_in)
    finally:
        for _, fd in roots:
            os.close(fd)


def _refuse_rules_on_denied(out: list[tuple[str, int]],
                            linked: dict[tuple[int, int], protect.DeniedFile]) -> None:
    """Refuse, typed, a rule that would grant anything on a denied file's inode under another
    name: Landlock rules attach to the inode, so the denied path would be granted too."""
    if not linked:
        return
    for path, rights in out:
        try:
            info = os.lstat(path)
        except OSError:
            continue  # (gone: Landlock refuses to add its rule then)
        known = linked.get((info.st_dev, info.st_ino))
        if rights and known is not None:
            raise UnenforceableError(
                "filesystem.deny",
                f"{path} is another name (a hard link) of the denied file {known.path}, and the "
                "landlock tier would grant it a rule, which holds for the denied path too "
                "(Landlock rules attach to the file): remove the link, or deny its name too")


def _refuse_rules_above_excluded(out: list[tuple[str, int]], excluded: dict[str, int]) -> None:
    """Refuse, typed, a rule that would grant more than an excluded path may have (a denied
    path nothing, a protected one reading) on a directory the path's walk passes through under
    another name: a bind mount shows a directory at a second path, and a rule there holds for
    it, every path through it (Landlock checks each directory a path's walk meets, by what it
    is, not by its name); the carve goes by names and gives that second name its rule whole
    (attack 11: a read root binding the parent of a denied path's mount, write roots binding
    each other)."""
    identity: dict[str, tuple[int, int] | None] = {}  # (each directory above one, once)
    kept_above: dict[tuple[int, int], tuple[str, int]] = {}
    for path, kept in excluded.items():
        at = path
        while at != "/":
            at = os.path.dirname(at)
            if at not in identity:
                try:
                    info = os.lstat(at)
                    identity[at] = (info.st_dev, info.st_ino)
                except OSError:
                    identity[at] = None  # (not made yet: nothing there to be granted)
            key = identity[at]
            if key is not None:
                held = kept_above.get(key)
                kept_above[key] = (path, kept) if held is None else (held[0], held[1] & kept)
    for rule, rights in out:
        try:
            info = os.lstat(rule)
        except OSError:
            continue
        held = kept_above.get((info.st_dev, info.st_ino))
        if held is not None and rights & ~held[1]:
            path, kept = held
            raise UnenforceableError(
                "filesystem.deny" if not kept else "filesystem.protected",
                f"{rule} is, under another name (a bind mount), a directory above "
                f"{path}, and the landlock tier would grant it a rule, which holds for every "
                "path through that directory (Landlock rules attach to the directory): use "
                "isolation namespaces, or roots no bind mount doubles")


def _carve(path: str, rights: int, excluded: dict[str, int], out: list[tuple[str, int]]
           ) -> None:
    """Grant `rights` beneath `path`, but no more than each excluded path's own beneath it: a
    directory above one keeps only what every excluded path below it may have, and each of its
    entries is granted on its own. Symbolic links are skipped: their targets' rules decide."""
    below = [rights & kept for other, kept in excluded.items()
             if other.startswith(path.rstrip("/") + "/")]
    if not below:
        out.append((path, rights))
        return
    common = rights
    for kept in below:
        common &= kept
    if common:
        out.append((path, common))
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.path in excluded:
                if excluded[entry.path] & rights:
                    out.append((entry.path, excluded[entry.path] & rights))
            elif entry.is_dir(follow_symlinks=False):
                _carve(entry.path, rights, excluded, out)
            elif not entry.is_symlink():
                out.append((entry.path, rights))


def enforced(request: LaunchRequest, weaken: frozenset[str], made: landlock.Ruleset
             ) -> dict[str, object]:
    """What the result reports as enforced (the "started" event)."""
    tested: dict[str, object] = {"weakened_for_testing": sorted(weaken)} if weaken else {}
    return tested | {
        "isolation": "landlock",
        "namespaces": [],
        "landlock": landlock.describe() | {"rules": len(made.grants)},
        "seccomp": {"mode": "filter", "denied_syscalls": len(seccomp.DENIED_SYSCALLS),
                    "clone3": "ENOSYS", "inotify": "ENOSYS",
                    "ioctl": "TIOCSTI/TIOCLINUX denied",
                    "sockets": "socketpair only: no unix, inet, inet6 or netlink socket"},
        "tree": "child subreaper; every descendant killed (pinned by a pidfd) when the command "
                "exits or the owner goes",
        "limits": _limits_described(request),
        "not_enforced": not_enforced(),
        "prepared_ahead": False,
    }


def _limits_described(request: LaunchRequest) -> dict[str, str]:
    described = limits.describe(request.limits)
    if "pids" in described:
        described["pids"] = ("RLIMIT_NPROC: the user's process count at launch plus pids "
                             "(it counts the user's other processes too)")
    if "memory" in described:
        described["memory"] = "RLIMIT_AS (address space, per process)"
    if "timeout" in described:
        described["timeout"] = "wall clock, every descendant killed"
    return described


def _nproc(request: LaunchRequest, weaken: frozenset[str]) -> int:
    """RLIMIT_NPROC for the command (-1: none): the user's tasks now plus `pids`."""
    if request.limits.pids is None or "rlimits" in weaken:
        return -1
    return _user_tasks(os.getuid()) + request.limits.pids


def _user_tasks(uid: int) -> int:
    """How many tasks (threads included, as RLIMIT_NPROC counts them) the user `uid` has."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
        except OSError:
            continue
        if int(fields[b"Uid"].split()[0]) == uid:
            count += int(fields[b"Threads"])
    return count


def _fork_command(request: LaunchRequest, stdio: list[int], umask: int,
                  made: landlock.Ruleset, bpf: bytes, weaken: frozenset[str], processes: int
                  ) -> tuple[int, int]:
    """Fork the command, confined; (its pid, the read end of its starter's report pipe)."""
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    keeper = os.getpid()
    pid = os.fork()
    if pid == 0:
        step = "privilege"
        try:
            os.close(report_r)
            for sig in range(1, signal.NSIG):
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    try:
                        signal.signal(sig, signal.SIG_DFL)
                    except (OSError, ValueError):
                        pass
            signal.set_wakeup_fd(-1)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.setsid()
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != keeper:
                os._exit(1)
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            os.chdir(request.cwd)
            os.umask(umask)
            if "rlimits" not in weaken:
                _rlimits(request, processes)
            try:
                init.confine_layers(lambda: made, bpf, weaken)
            except SetupError as exc:
                step = exc.stage
                raise OSError(errno.EPERM, exc.message) from None
            privilege.close_fds({report_w})
            step = "exec"
            os.execvpe(request.argv[0], list(request.argv), dict(request.env))
        except BaseException as exc:  # noqa: BLE001 - reported to the keeper, whatever it is
            code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EINVAL
            os.write(report_w, f"{step} {code}".encode())
        finally:
            os._exit(127)
    os.close(report_w)
    return pid, report_r


def _rlimits(request: LaunchRequest, processes: int) -> None:
    memory, _, file_size = limits.rlimit_values(request.limits, 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for kind, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_NPROC, processes),
                        (resource.RLIMIT_FSIZE, file_size)):
        if value >= 0:
            resource.setrlimit(kind, (value, value))


def _started(status_fd: int, command: int, report: int, request: LaunchRequest) -> None:
    """Wait for the command's exec; a typed failure (and exit) if it did not happen."""
    with os.fdopen(report, "rb") as pipe:
        said = pipe.read()
    if not said:
        return
    os.waitpid(command, 0)
    step, _, code = said.decode().partition(" ")
    why = os.strerror(int(code))
    if step == "exec" and int(code) in (errno.ENOENT, errno.ENAMETOOLONG):
        _fail(status_fd, "command_not_found", f"{request.argv[0]}: {why}", "exec", start=True)
    if step == "exec" and int(code) in (errno.EACCES, errno.ENOEXEC, errno.ENOTDIR,
                                        errno.EPERM):
        _fail(status_fd, "command_not_executable", f"{request.argv[0]}: {why}", "exec",
              start=True)
    _fail(status_fd, f"{step}_failed", why, step)


def _wait(command: int, lifeline: int, wake: int) -> int:
    """The command's wait status, reaping every orphan meanwhile (zombies would count against
    RLIMIT_NPROC); if the owner's lifeline closes first, kill the tree and exit (-1: no
    lifeline is watched: tests only)."""
    while True:
        status = _reap(command)
        if status is not None:
            return status
        readable = select.select([fd for fd in (lifeline, wake) if fd >= 0], [], [])[0]
        if lifeline in readable and not os.read(lifeline, 1):
            kill_descendants()
            os._exit(1)
        if wake in readable:
            while True:
                try:
                    if not os.read(wake, 64):
                        break
                except BlockingIOError:
                    break


def _reap(command: int) -> int | None:
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == command:
            found = status


def kill_descendants() -> None:
    """SIGKILL every descendant of this process and reap them. Each is pinned by a pidfd and
    checked to still be the child of the process it was found under before it is signalled;
    as this process is the tree's subreaper, what a killed process leaves is reparented here
    and found in the next round, until no descendant is left."""
    me = os.getpid()
    while True:
        tree = _descendants(me)
        for pid, parent in tree:
            _kill_pinned(pid, parent)
        _reap(-1)
        if not tree:
            return


def _kill_pinned(pid: int, parent: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        if _parent_of(pid) == parent and not select.select([pidfd], [], [], 0)[0]:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def _descendants(root: int) -> list[tuple[int, int]]:
    """(pid, parent) of every living descendant of `root`, parents first."""
    found: list[tuple[int, int]] = []
    parents = [root]
    while parents:
        parent = parents.pop()
        for child in _children(parent):
            found.append((child, parent))
            parents.append(child)
    return found


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                children += [int(word) for word in f.read().split()]
        except OSError:
            continue
    return children


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _fail(status_fd: int, code: str, message: str, where: str, *, start: bool = False
          ) -> NoReturn:
    init.emit(status_fd, event="error", kind="start" if start else "setup", code=code,
              message=message, stage=where)
    kill_descendants()
    os._exit(71 if start else 70)



def capabilities() -> list[Capability]:
    """The tier's capability table (Backend.report)."""
    abi = landlock.abi_version()
    return [
        Capability("isolation", abi >= SCOPE_ABI, "landlock tier: no namespace",
                   "; ".join(not_enforced())),
        Capability("filesystem.read", True, "Landlock rules"),
        Capability("filesystem.write", True, "Landlock rules"),
        Capability("filesystem.deny", True, "carved out of the roots' Landlock rules"),
        Capability("filesystem.protected", True, "carved out of the write roots' rules"),
        Capability("filesystem.exec_from_write", True, "Landlock EXECUTE withheld",
                   "execve only: a written file can still be run through ld.so or mapped "
                   "executable"),
        Capability("filesystem.memfd_exec", False, "not prevented"),
        Capability("filesystem.metadata", False, "not governed: chmod and utime work on any "
                   "file the user owns", "but no mode that lets other users write, and no "
                   "extended attribute"),
        Capability("host_processes", False, "no pid namespace: host processes are visible"),
        Capability("process_control", True, "seccomp: no other process's limits, priority, "
                   "affinity or scheduling by pid (the keeper's and the host's included)"),
        Capability("filesystem.host_code", True, "a write root that holds code the host runs "
                   "next (Stockade's install, the interpreter, its import path) is refused"),
        Capability("stockade_state", True, "a root that holds it is refused; carved out of "
                   "every root; no AF_UNIX socket"),
        Capability("landlock", abi >= SCOPE_ABI, f"ABI {abi}"),
        Capability("seccomp", True, "libseccomp filter", "no unix, inet, inet6 or netlink "
                   "socket; no inotify"),
        Capability("network.none", True, "seccomp: no inet sockets; Landlock TCP"),
        Capability("network.allowlist", False, "not in this tier yet"),
        Capability("network.any", False, "not implemented yet"),
        Capability("limits.memory", True, "RLIMIT_AS", "per process"),
        Capability("limits.pids", os.geteuid() != 0, "RLIMIT_NPROC",
                   "counts every process of the user"),
        Capability("limits.cpu", False, "needs a delegated cgroup v2 cpu controller"),
        Capability("limits.file_size", True, "RLIMIT_FSIZE"),
        Capability("limits.timeout", True, "wall clock; every descendant killed"),
        Capability("kill_on_close", True, "the keeper, the tree's subreaper, kills it"),
    ]
