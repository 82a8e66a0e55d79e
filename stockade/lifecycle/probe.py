"""The readiness probe: a real throwaway launch under the production backend, checked from
inside (probe_child.py) and from outside, summed up in an attestation.

Stages, in order; the first that fails names the reason and the stage:

- `backend`: the backend's own host checks (user namespaces, Landlock, libseccomp);
- `ledger`: reconcile what crashed launches left, and fail (`ledger_corrupt`) while a
  quarantined record awaits inspection;
- `launch`: a fresh probe directory under the state directory, recorded in the ledger,
  holding a workspace (write root, with a protected `.agents`, a repository's `.git` and a
  denied `secret`) and an
  `outside` file no root grants; host loopback listeners (TCP, UDP, abstract unix) the sandbox
  must not reach; then the probe child runs in a sandbox with a minimal policy;
- one stage per layer judging the facts (namespaces, filesystem, landlock, seccomp,
  privileges, descriptors, network, environment, limits), each failing as `<stage>_not_enforced`;
- `lifetime`: the daemon the child left behind is gone, and so are the probe directory and
  its ledger record.

An attestation never holds a path, a secret or an environment value: facts are errno names,
numbers, flags and namespace, interface and variable names. `require_ready` is the manager's
cache: a pass holds for the process lifetime, a failure for NEGATIVE_TTL seconds.

The stages `backend`, `ledger` and the cache are shared; what a launch observes and what its
facts must be are the backend's platform half (`PlatformProbe`, chosen by `platform_probe`):
`LinuxProbe` here, `stockade.windows.probe.WindowsProbe` for the Windows backend.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from stockade import __version__
from stockade.errors import StockadeError, UnavailableError
from stockade.launch.backend import Backend
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result
from stockade.lifecycle import facts, probe_child, statedir
from stockade.lifecycle.ledger import Ledger
from stockade.linux.doctor import hint
from stockade.policy import model

ATTESTATION_VERSION = 1
NEGATIVE_TTL = 30.0  # seconds a failed probe is trusted before the manager probes again
_MESSAGES = {  # every platform's
    "ledger_corrupt": "a launch record could not be trusted and was quarantined for "
                      "inspection; see `stockade reconcile`",
}
_LINUX_MESSAGES = {
    "probe_child_failed": "the probe's child did not report its observations",
    "userns_unavailable": hint("user namespaces cannot be created here"),
    "landlock_unsupported": hint("the kernel offers no Landlock (or not the ABI needed), or "
                                 "it is disabled"),
    "seccomp_unavailable": hint("libseccomp or the kernel's seccomp filters are missing"),
    "supervisor_not_built": hint("the sandbox's supervisor was not built at install"),
}


@dataclass(frozen=True)
class Attestation:
    """What the probe verified on this host, or the stable reason and stage it failed at."""

    ready: bool
    backend: str
    run_as: str                      # "root" or "rootless"; on Windows "elevated" or "unelevated"
    versions: dict[str, object]
    facts: dict[str, object]         # one field per verified fact
    enforced: dict                   # what the probe sandbox's pid 1 reported applying
    timings: dict[str, float]        # milliseconds per probe stage
    duration_ms: float
    reason: str | None = None
    stage: str | None = None
    message: str | None = None
    version: int = ATTESTATION_VERSION

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Run:
    """One probe in progress: what it has seen so far, and the stage it is at."""

    backend: Backend
    facts: dict[str, object] = field(default_factory=dict)
    enforced: dict = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stage: str = "backend"

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        self.stage, started = stage, time.monotonic()
        try:
            yield
        finally:
            self.timings[stage] = round((time.monotonic() - started) * 1000, 3)


class Refused(Exception):
    """The probe failed for `reason` (a stable code), said by `message`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message = message


class PlatformProbe(Protocol):
    """What the probe does differently per backend; the shared stages are `probe`'s."""

    messages: dict[str, str]  # a readable message per failure reason this platform adds

    def run_as(self) -> str:
        """Whom the probe runs as (`Attestation.run_as`)."""

    def versions(self) -> dict[str, object]:
        """What the attestation is valid for (`Attestation.versions`); never raises."""

    def launch(self, run: Run, ledger: Ledger) -> None:
        """The `launch` stage: a real launch, its observations recorded into `run`."""

    def judge(self, observed: dict[str, object]) -> None:
        """Raise facts.NotEnforced for the first stage whose facts do not hold."""

    def storage(self) -> tuple[dict[str, object], float] | None:
        """What a stored attestation is valid for, and seconds since boot now (sleep counted);
        None where passing attestations are not stored for later processes."""


class LinuxProbe:
    """The Linux backend's half: the probe child's observations (see the module docstring)."""

    messages = _LINUX_MESSAGES

    def run_as(self) -> str:
        return "root" if os.geteuid() == 0 else "rootless"

    def versions(self) -> dict[str, object]:
        return _versions()

    def launch(self, run: Run, ledger: Ledger) -> None:
        _launch(run, ledger)

    def judge(self, observed: dict[str, object]) -> None:
        facts.judge(observed)

    def storage(self) -> tuple[dict[str, object], float]:
        return _host_key(), time.clock_gettime(time.CLOCK_BOOTTIME)


class LandlockTierProbe(LinuxProbe):
    """The landlock tier's half: the same child and launch, judged by the tier's table."""

    def launch(self, run: Run, ledger: Ledger) -> None:
        _launch(run, ledger, facts.tier_limits())

    def judge(self, observed: dict[str, object]) -> None:
        facts.judge(observed, facts.tier_expectations())


def platform_probe(backend: Backend) -> PlatformProbe:
    """The platform half of the probe for `backend`, chosen by its name."""
    if backend.name == "linux-landlock":
        return LandlockTierProbe()
    if backend.name == "windows":
        from stockade.windows.probe import WindowsProbe
        return WindowsProbe()
    return LinuxProbe()


def probe(backend: Backend | None = None, ledger: Ledger | None = None, *,
          platform_half: PlatformProbe | None = None) -> Attestation:
    """Probe `backend` (default: the first registered) now; never raises for a failed probe.
    `platform_half` defaults to `platform_probe(backend)`."""
    if backend is None:
        from stockade.launch.manager import REGISTRY
        backend = next(iter(REGISTRY.values()))()
    half = platform_half or platform_probe(backend)
    started = time.monotonic()
    run = Run(backend)
    failure: Refused | None = None
    try:
        with run.timed("backend"):
            backend.probe()
        with run.timed("ledger"):
            ledger = ledger or Ledger()
            ledger.reconcile()
            ledger.check()
        with run.timed("launch"):
            half.launch(run, ledger)
        with run.timed("checks"):
            half.judge(run.facts)
    except StockadeError as exc:
        failure = Refused(exc.code, (_MESSAGES | half.messages).get(
            exc.code, exc.message if exc.code == "ledger_unusable"  # (it names the directory)
            else f"the {run.stage} stage failed ({exc.code})"))
        if isinstance(half, LinuxProbe) and exc.code != "ledger_corrupt":
            failure = Refused(failure.reason, hint(failure.message))
    except OSError as exc:
        where = f" at {exc.filename}" if exc.filename else ""
        failure = Refused("probe_failed", f"the {run.stage} stage failed with "
                                          f"{errno.errorcode.get(exc.errno or 0, 'an error')}"
                                          f"{where}")
    except Refused as refused:
        failure = refused
    except facts.NotEnforced as exc:
        run.stage = exc.stage
        failure = Refused(f"{exc.stage}_not_enforced", exc.message)
    return Attestation(
        ready=failure is None, backend=backend.name, run_as=half.run_as(),
        versions=half.versions(), facts=run.facts, enforced=run.enforced, timings=run.timings,
        duration_ms=round((time.monotonic() - started) * 1000, 3),
        reason=failure.reason if failure else None, stage=run.stage if failure else None,
        message=failure.message if failure else None)


_cache: dict[str, tuple[Attestation, float]] = {}
_cache_lock = threading.Lock()


def require_ready(backend: Backend) -> Attestation:
    """The cached attestation of `backend`, probing first if there is none or a failed one
    has expired; raises UnavailableError with its reason unless it is ready.

    A passing attestation is also kept in the state directory, for later processes of the same
    user on the same boot, with the same versions, for STORED_TTL seconds (so that each
    `stockade run` does not launch a probe sandbox first). Such a process still runs the
    backend's host checks and reconciles the ledger, as every start must."""
    with _cache_lock:
        cached = _cache.get(backend.name)
        if cached is None or (not cached[0].ready
                              and time.monotonic() - cached[1] >= NEGATIVE_TTL):
            cached = (_stored_or_probe(backend), time.monotonic())
            _cache[backend.name] = cached
    attestation = cached[0]
    if not attestation.ready:
        raise UnavailableError(attestation.reason or "probe_failed", attestation.message or "")
    return attestation


STORED_TTL = 600.0  # seconds a stored passing attestation is trusted by a new process


def _stored_or_probe(backend: Backend) -> Attestation:
    storage = platform_probe(backend).storage()
    if storage is None:
        return probe(backend)
    key, now = storage
    path = os.path.join(statedir.state_dir(), f"attestation-{backend.name}.json")
    stored = _load(path, key, now)
    if stored is not None:
        try:
            backend.probe()
            ledger = Ledger()
            ledger.reconcile()
            ledger.check()
            return stored
        except StockadeError:
            pass  # something changed: the full probe says what
    attestation = probe(backend)
    if attestation.ready:
        _store(path, attestation, key, now)
    return attestation


def _host_key() -> dict[str, object]:
    """What a stored attestation is only valid for."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return {"boot": boot, "uid": os.geteuid(), "versions": _versions()}


def _load(path: str, key: dict[str, object], now: float) -> Attestation | None:
    try:
        with open(path) as f:
            body = json.load(f)
        if body["key"] != key or not 0 <= now - body["at"] < STORED_TTL:
            return None
        attestation = Attestation(**body["attestation"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return attestation if attestation.ready and attestation.version == ATTESTATION_VERSION \
        else None


def _store(path: str, attestation: Attestation, key: dict[str, object], now: float) -> None:
    """Atomically (and only where the state directory is ours; never fatal)."""
    body = {"key": key, "at": now, "attestation": attestation.to_json()}
    try:
        statedir.ensure(os.path.dirname(path))
        temporary = f"{path}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        os.replace(temporary, path)
    except (OSError, StockadeError):
        pass


def _launch(run: Run, ledger: Ledger, limits: model.Limits = facts.PROBE_LIMITS) -> None:
    """Run the probe child in a sandbox, recording what it and the host saw into `run`."""
    from stockade.launch.manager import execute

    marker = os.urandom(16).hex()
    request_id = os.urandom(16).hex()
    abstract_name = f"stockade-probe-{marker}"
    with contextlib.ExitStack() as stack:
        tcp = stack.enter_context(_listener(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)))
        udp = stack.enter_context(_listener(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)))
        abstract = stack.enter_context(_listener(socket.AF_UNIX, socket.SOCK_STREAM,
                                                 "\0" + abstract_name))
        with ledger.launch(request_id) as record:
            # In the temp dir, not the state directory, which every sandbox's view masks.
            top = os.path.join(tempfile.gettempdir(), record.fresh_name("probe"))
            record.add("dir", top)
            request = _request(top, request_id, limits)
            # A socket file in the workspace, made before the launch: the view masks it. (By
            # the workspace's descriptor: its full path may be longer than a socket address.)
            workspace_fd = os.open(request.cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            stack.callback(os.close, workspace_fd)
            in_workspace = stack.enter_context(_listener(
                socket.AF_UNIX, socket.SOCK_STREAM, f"/proc/self/fd/{workspace_fd}/host.sock"))
            params = {"workspace": request.cwd, "read_root": request.read[0].path,
                      "outside": os.path.join(top, "outside", "file"), "marker": marker,
                      "tcp_port": tcp.getsockname()[1], "udp_port": udp.getsockname()[1],
                      "abstract": abstract_name, "state": os.path.join(request.cwd, "state"),
                      "socket_file": "host.sock"}  # (relative to the child's cwd, the workspace)
            result = execute(run.backend,
                             replace(request, argv=(*request.argv, json.dumps(params))))
            run.enforced = result.enforced
            run.facts |= _observations(result)
            run.facts["host_listeners_untouched"] = all(
                _untouched(sock) for sock in (tcp, udp, abstract, in_workspace))
            run.facts["leftover_processes"] = _processes_with(marker)
        run.facts["ledger_settled"] = (not os.path.lexists(top)
                                       and os.path.basename(record.path) not in ledger.records())


def _request(top: str, request_id: str, limits: model.Limits = facts.PROBE_LIMITS
             ) -> LaunchRequest:
    """The probe's minimal policy, compiled: the interpreter read-only, a workspace."""
    workspace = os.path.join(top, "ws")
    os.mkdir(top, 0o700)
    for directory in (workspace, os.path.join(workspace, "work"),
                      os.path.join(workspace, ".agents"),
                      os.path.join(workspace, ".git"), os.path.join(workspace, ".git", "hooks"),
                      os.path.join(workspace, "secret"), os.path.join(top, "outside")):
        os.mkdir(directory, 0o700)
    for path, text in ((os.path.join(top, "outside", "file"), "outside every root\n"),
                       (os.path.join(workspace, ".git", "config"), "[core]\n")):
        with open(path, "w") as f:
            f.write(text)
    policy = model.Policy(
        filesystem=model.FilesystemPolicy(read=_interpreter_roots(), write=("{workspace}",),
                                          deny=("{workspace}/secret",), protected=(".agents",),
                                          git="guarded"),
        network=model.NetworkPolicy("none"),
        env=model.EnvPolicy(set=facts.PROBE_ENV),
        limits=limits,
        process=model.ProcessPolicy(cwd="{workspace}", stdin="null"),
    )
    with open(probe_child.__file__) as f:
        source = f.read()
    argv = [os.path.realpath(sys.executable), "-I", "-S", "-c", source]
    # A state directory of Stockade's inside the workspace: the view must mask it.
    context = CompileContext(workspace=workspace, home=top, tmp=top,
                             host_env={statedir.ENV: os.path.join(workspace, "state")})
    return replace(compile_policy(policy, argv, context), request_id=request_id)


def _interpreter_roots() -> tuple[str, ...]:
    """Read roots holding this interpreter, its standard library and shared libraries."""
    roots = ["/usr", "?/lib", "?/lib64"]
    prefix = os.path.realpath(sys.base_prefix)
    if prefix != "/usr" and not prefix.startswith("/usr/"):
        roots.append(prefix)
    return tuple(roots)


@contextlib.contextmanager
def _listener(family: int, kind: int, address: object):
    sock = socket.socket(family, kind)
    try:
        sock.bind(address)
        if kind == socket.SOCK_STREAM:
            sock.listen(1)
        sock.setblocking(False)
        yield sock
    finally:
        sock.close()


def _untouched(sock: socket.socket) -> bool:
    try:
        if sock.type == socket.SOCK_STREAM:
            sock.accept()[0].close()
        else:
            sock.recv(1)
    except BlockingIOError:
        return True
    return False


def _observations(result: Result) -> dict[str, object]:
    if result.exit_code != 0:
        raise Refused("probe_child_failed", _MESSAGES["probe_child_failed"])
    try:
        seen = json.loads(result.stdout)
    except ValueError:
        raise Refused("probe_child_failed", _MESSAGES["probe_child_failed"]) from None
    host = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in probe_child.NAMESPACES}
    seen["new_namespaces"] = sorted(name for name, inode in seen.pop("namespaces").items()
                                    if inode != host[name])
    return seen


def _processes_with(marker: str) -> int:
    """How many host processes have `marker` in their command line."""
    needle = marker.encode()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    count += needle in f.read()
            except OSError:
                continue  # exited, or not ours to read
    return count


def _versions() -> dict[str, object]:
    from stockade.linux import landlock, seccomp, supervisor

    described = seccomp.describe()
    return {"stockade": __version__, "kernel": os.uname().release,
            "landlock_abi": landlock.abi_version(),
            "libseccomp": described.get("libseccomp"), "python": sys.version.split()[0],
            "supervisor": "built" if supervisor.built() else "not built"}
