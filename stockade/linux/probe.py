"""The Linux backend's half of the readiness probe (the shared stages are
stockade/launch/probe.py's): what its launch does and what each fact it observes must be.

- `launch`: a fresh probe directory under the temp directory, recorded in the ledger, holding a
  workspace (write root, with a protected `.agents`, a repository's `.git` and a denied
  `secret`) and an `outside` file no root grants; host loopback listeners (TCP, UDP, abstract
  unix) the sandbox must not reach; then the probe child (probe_child.py) runs in a sandbox
  with a minimal policy and reports what it saw from inside;
- one stage per layer judging the facts (namespaces, filesystem, landlock, seccomp,
  privileges, descriptors, network, environment, limits, helpers), each failing as
  `<stage>_not_enforced` (EXPECTATIONS);
- `lifetime`: the daemon the child left behind is gone, and so are the probe directory and
  its ledger record;
- `network_any`, where this host can make network "any" (usernet.py): a second child, in a
  sandbox of that mode, finds pasta's interface and tries the host's listeners on its loopback
  and on its own address, which must stay out of reach (pasta forwards no port and gives the
  sandbox the host's outbound address as its own). The guard's ranges beyond the host are not
  tried: with the guard gone, the attempt would leave the host (the evidence rows prove them).
  A host that cannot make the mode, or a launch of it refused, leaves these facts out: the
  report then says the mode is accepted but not verified.

A passing attestation is stored for later processes of this user on this boot (`storage`).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import socket
import sys
import time
from dataclasses import replace
from types import ModuleType

from stockade import __version__
from stockade.errors import StockadeError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.probe import Refused, Run
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result
from stockade.lifecycle import facts, statedir
from stockade.lifecycle.ledger import Ledger
from stockade.linux import probe_child
from stockade.linux.hints import hint
from stockade.linux.limits import INIT_TASKS, PID_MAX_FLOOR, RESERVED_PIDS
from stockade.linux.privilege import SECUREBITS
from stockade.linux.probe_child import NAMESPACES
from stockade.policy import model

MESSAGES = {
    "probe_child_failed": "the probe's child did not report its observations",
    "userns_unavailable": hint("user namespaces cannot be created here"),
    "landlock_unsupported": hint("the kernel offers no Landlock (or not the ABI needed), or "
                                 "it is disabled"),
    "seccomp_unavailable": hint("libseccomp or the kernel's seccomp filters are missing"),
    "supervisor_not_built": hint("the sandbox's supervisor was not built at install"),
}
PROBE_ENV = (("STOCKADE_PROBE", "1"),)
PROBE_FILE_SIZE = 1 << 20
PROBE_LIMITS = model.Limits(timeout=30.0, memory=facts.PROBE_MEMORY, pids=facts.PROBE_PIDS,
                            output=1 << 20, file_size=PROBE_FILE_SIZE)

# What each fact is, in one line (`stockade probe --explain`): an attempt's outcome is "ok" or
# the errno name it failed with, and must be a failure unless the line says otherwise.
LEGEND = {
    "inherited_fds": "descriptors open in the sandbox at start (only stdin, stdout, stderr)",
    "write_root": "a file written in the workspace, a write root (must work: ok)",
    "write_root_noexec": "the write root is mounted noexec",
    "read_root_read_only": "a read root is mounted read-only",
    "outside_path": "a host file outside every root, looked up (not in the sandbox's view)",
    "outside_read": "that host file opened for reading",
    "protected_name": "a file written under a protected name (.agents) in the workspace",
    "git_hooks": "a file written in the repository's .git/hooks",
    "git_metadata": "a file written in the repository's .git (git's own writes: must be ok)",
    "denied_path": "a denied directory of the workspace listed",
    "stockade_state": "Stockade's own state directory listed",
    "privilege_bits": "a written file made setuid (chmod 4755)",
    "socket_vsock": "a vsock socket made (a way to a hypervisor or its guests)",
    "unix_socket_file": "a host unix socket file in the workspace connected to",
    "memfd_exec": "a program copied into memory (memfd) and executed",
    "landlock_abi": "the Landlock ABI version the kernel offers",
    "landlock_ungranted_dir": "a directory no Landlock rule grants, listed",
    "securebits": "the securebits set and locked (no privilege back through setuid)",
    "seccomp_mode": "the seccomp mode (2: a filter)",
    "no_new_privs": "no_new_privs (1: exec gains no privilege)",
    "capabilities": "the capability sets (all empty)",
    "seccomp_ptrace": "ptrace, tried (the seccomp filter's EPERM)",
    "seccomp_unshare": "unshare of a new user namespace, tried (the seccomp filter's EPERM)",
    "seccomp_tiocsti": "a keystroke pushed into the terminal (TIOCSTI), tried",
    "network_interfaces": "the network interfaces seen (network none: only lo)",
    "tcp_loopback": "a TCP connection to a listener on the host's loopback",
    "udp_loopback": "a UDP datagram to the host's loopback (with namespaces: the sandbox's "
                    "own lo takes it, which is not the host's)",
    "unix_abstract": "a connection to a host abstract unix socket",
    "link_local": "a connection to 169.254.169.254 (cloud metadata)",
    "dns": "a name resolved (network none: no resolver reachable)",
    "environment": "the names in the command's environment (only what the policy set)",
    "rlimit_as": "RLIMIT_AS (soft, hard): the memory limit",
    "rlimit_nproc": "RLIMIT_NPROC (soft, hard): the process limit, with the sandbox's own",
    "rlimit_fsize": "RLIMIT_FSIZE (soft, hard): the largest file it may write",
    "rlimit_core": "RLIMIT_CORE (soft, hard): no core dumps",
    "pid_max": "pid_max of the sandbox's pid namespace",
    "daemon_started": "a daemon (double fork, setsid) left behind by the probe child",
    "new_namespaces": "the namespaces the sandbox has that are not the host's",
    "host_listeners_untouched": "the host's listeners above accepted nothing (seen from "
                                "outside)",
    "leftover_processes": "processes of the launch left once it ended (the daemon: 0)",
    "ledger_settled": "the launch's record and directory removed once it ended",
    "any_host_address": "network any: a connection to a listener on the host's own address",
    "any_host_loopback": "network any: a connection to a listener on the host's loopback",
    "any_interfaces": "network any: the interfaces seen (lo and pasta's)",
    "any_listeners_untouched": "network any: those listeners accepted nothing (from outside)",
}


class LinuxProbe:
    """The Linux backend's half: the probe child's observations (see the module docstring)."""

    messages = MESSAGES
    legend = LEGEND

    def run_as(self) -> str:
        return "root" if os.geteuid() == 0 else "rootless"

    def versions(self) -> dict[str, object]:
        return _versions()

    def launch(self, run: Run, ledger: Ledger) -> None:
        _launch(run, ledger)
        _launch_network_any(run, ledger)

    def judge(self, observed: dict[str, object]) -> None:
        facts.judge(observed, EXPECTATIONS)
        if ANY_FACTS[0] in observed:
            facts.judge(observed, ANY_EXPECTATIONS)

    def storage(self) -> tuple[dict[str, object], float]:
        return _host_key(), time.clock_gettime(time.CLOCK_BOOTTIME)

    def explain(self, message: str) -> str:
        return hint(message)


class LandlockTierProbe(LinuxProbe):
    """The landlock tier's half: the same child and launch, judged by the tier's table."""

    def launch(self, run: Run, ledger: Ledger) -> None:
        _launch(run, ledger, tier_limits(), state_in_workspace=False)

    def judge(self, observed: dict[str, object]) -> None:
        facts.judge(observed, tier_expectations())


def _host_key() -> dict[str, object]:
    """What a stored attestation is only valid for."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return {"boot": boot, "uid": os.geteuid(), "versions": _versions()}



def _launch(run: Run, ledger: Ledger, limits: model.Limits = PROBE_LIMITS, *,
            state_in_workspace: bool = True) -> None:
    """Run the probe child in a sandbox, recording what it and the host saw into `run`. A
    state directory of Stockade's lies inside the workspace (the view must mask it), or, for
    the landlock tier, which refuses a root that holds one, beside it (outside every root)."""
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
            top = os.path.join(_tempdir(), record.fresh_name("probe"))
            record.add("dir", top)
            state = os.path.join(top, "ws" if state_in_workspace else "", "state")
            request = _request(top, request_id, limits, state)
            # A socket file in the workspace, made before the launch: the view masks it. (By
            # the workspace's descriptor: its full path may be longer than a socket address.)
            workspace_fd = os.open(request.cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            stack.callback(os.close, workspace_fd)
            in_workspace = stack.enter_context(_listener(
                socket.AF_UNIX, socket.SOCK_STREAM, f"/proc/self/fd/{workspace_fd}/host.sock"))
            params = {"workspace": request.cwd, "read_root": request.read[0].path,
                      "outside": os.path.join(top, "outside", "file"), "marker": marker,
                      "tcp_port": tcp.getsockname()[1], "udp_port": udp.getsockname()[1],
                      "abstract": abstract_name, "state": state,
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


# The network-any child: pasta's interface there, and the host's listeners out of reach.
ANY_CHILD = """
import errno, json, socket, sys
params = json.loads(sys.argv[1])
def attempt(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "ok"
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
with open("/proc/net/dev") as dev:
    interfaces = len(dev.readlines()) - 2
print(json.dumps({"any_host_address": attempt(params["address"], params["address_port"]),
                  "any_host_loopback": attempt("127.0.0.1", params["loopback_port"]),
                  "any_interfaces": interfaces}))
"""
ANY_FACTS = ("any_host_address", "any_host_loopback", "any_interfaces",
             "any_listeners_untouched")


def _launch_network_any(run: Run, ledger: Ledger) -> None:
    """The `network_any` facts (see the module docstring), where this host can make it."""
    from stockade.launch.manager import execute

    address = _own_address()
    if address is None or _usernet().missing() is not None:
        return
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    request_id = os.urandom(16).hex()
    with contextlib.ExitStack() as stack:
        loopback = stack.enter_context(_listener(socket.AF_INET, socket.SOCK_STREAM,
                                                 ("127.0.0.1", 0)))
        own = stack.enter_context(_listener(family, socket.SOCK_STREAM, (str(address), 0)))
        params = {"address": str(address), "address_port": own.getsockname()[1],
                  "loopback_port": loopback.getsockname()[1]}
        with ledger.launch(request_id) as record:
            top = os.path.join(_tempdir(), record.fresh_name("probe"))
            record.add("dir", top)
            workspace = os.path.join(top, "ws")
            os.mkdir(top, 0o700)
            os.mkdir(workspace, 0o700)
            policy = model.Policy(
                filesystem=model.FilesystemPolicy(read=(*_interpreter_roots(), "{workspace}")),
                network=model.NetworkPolicy("any"), env=model.EnvPolicy(set=PROBE_ENV),
                limits=PROBE_LIMITS, process=model.ProcessPolicy(cwd="{workspace}",
                                                                 stdin="null"))
            argv = [os.path.realpath(sys.executable), "-I", "-S", "-c", ANY_CHILD,
                    json.dumps(params)]
            context = CompileContext(workspace=workspace, home=top, tmp=top, host_env={})
            request = replace(compile_policy(policy, argv, context), request_id=request_id)
            try:
                result = execute(run.backend, request)
            except StockadeError:
                return  # (refused here: the report says so, from the backend's own check)
            run.facts |= _observations(result, namespaces=False)
            run.facts["any_listeners_untouched"] = all(_untouched(sock)
                                                       for sock in (loopback, own))


def _usernet() -> ModuleType:
    from stockade.linux import usernet  # (only a full probe needs it, not a stored one)

    return usernet


def _tempdir() -> str:
    import tempfile

    return tempfile.gettempdir()


def _own_address() -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """One of this host's own addresses that is not loopback or link-local (the guard's
    "host's own address" case), IPv4 first; None if it has none."""
    found = [ipaddress.ip_address(a) for a in _usernet().host_addresses()]
    usable = [a for a in found if not (a.is_loopback or a.is_link_local)]
    return min(usable, key=lambda a: a.version, default=None)


def _request(top: str, request_id: str, limits: model.Limits, state: str) -> LaunchRequest:
    """The probe's minimal policy, compiled: the interpreter read-only, a workspace, and
    Stockade's state directory at `state` (made, if not in the workspace: there the compiler
    makes it)."""
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
        env=model.EnvPolicy(set=PROBE_ENV),
        limits=limits,
        process=model.ProcessPolicy(cwd="{workspace}", stdin="null"),
    )
    with open(probe_child.__file__) as f:
        source = f.read()
    argv = [os.path.realpath(sys.executable), "-I", "-S", "-c", source]
    if not state.startswith(workspace + "/"):
        os.mkdir(state, 0o700)
    context = CompileContext(workspace=workspace, home=top, tmp=top,
                             host_env={statedir.ENV: state})
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


def _observations(result: Result, namespaces: bool = True) -> dict[str, object]:
    if result.exit_code != 0:
        raise Refused("probe_child_failed", MESSAGES["probe_child_failed"])
    try:
        seen = json.loads(result.stdout)
    except ValueError:
        raise Refused("probe_child_failed", MESSAGES["probe_child_failed"]) from None
    if not namespaces:
        return seen
    host = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in NAMESPACES}
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


_equal, _denied = facts.equal, (facts.refused, "an error")
EXPECTATIONS: facts.Table = {
    "namespaces": {"new_namespaces": _equal(sorted(NAMESPACES))},
    "filesystem": {
        "write_root": _equal("ok"), "write_root_noexec": _equal(True),
        "read_root_read_only": _equal(True), "outside_path": _denied, "outside_read": _denied,
        "protected_name": _denied, "git_hooks": _denied, "git_metadata": _equal("ok"),
        "denied_path": _denied,
    },
    "landlock": {"landlock_abi": (lambda v: isinstance(v, int) and v >= 1, "at least 1"),
                 "landlock_ungranted_dir": _equal("EACCES")},
    "seccomp": {"seccomp_mode": _equal(2), "seccomp_unshare": _equal("EPERM"),
                "seccomp_ptrace": _equal("EPERM"), "seccomp_tiocsti": _equal("EPERM")},
    "privileges": {"no_new_privs": _equal(1), "securebits": _equal(SECUREBITS),
                   "capabilities": (lambda v: isinstance(v, dict) and len(v) == 5
                                    and not any(v.values()), "every set empty")},
    "descriptors": {"inherited_fds": _equal([0, 1, 2])},
    "network": {
        "network_interfaces": _equal(["lo"]), "tcp_loopback": _denied,
        "unix_abstract": _denied, "link_local": _denied,
        "dns": (lambda v: facts.refused(v) and v not in ("EAI_NONAME", "EAI_NODATA"),
                "no resolver reachable"),
        "host_listeners_untouched": _equal(True),
    },
    "environment": {"environment": _equal(sorted(name for name, _ in PROBE_ENV))},
    "limits": {
        "rlimit_as": _equal([facts.PROBE_MEMORY] * 2),
        "rlimit_nproc": _equal([facts.PROBE_PIDS + INIT_TASKS] * 2),
        "rlimit_fsize": _equal([PROBE_FILE_SIZE] * 2),
        "rlimit_core": _equal([0, 0]),
        "pid_max": _equal(max(PID_MAX_FLOOR, RESERVED_PIDS + facts.PROBE_PIDS)),
    },
    "lifetime": {"daemon_started": _equal(True), "leftover_processes": _equal(0),
                 "ledger_settled": _equal(True)},
    "helpers": {"stockade_state": _denied, "privilege_bits": _equal("EPERM"),
                "socket_vsock": _equal("EAFNOSUPPORT"), "unix_socket_file": _denied},
}


ANY_EXPECTATIONS: facts.Table = {"network_any": {
    "any_host_address": _denied, "any_host_loopback": _denied,
    "any_interfaces": (lambda v: isinstance(v, int) and v >= 2, "lo and pasta's"),
    "any_listeners_untouched": _equal(True),
}}


def verified(observed: dict[str, object], *names: str) -> bool:
    """Whether each named fact was observed and holds (for the report's rows)."""
    return facts.verified(observed, *names, table=EXPECTATIONS | ANY_EXPECTATIONS)


@functools.cache
def tier_expectations() -> facts.Table:
    """The landlock tier's table (stockade/linux/landlock_tier.py): no namespace, so no mount
    flags, interfaces or pid_max to judge; denials by Landlock and seccomp instead."""
    table = {stage: dict(checks) for stage, checks in EXPECTATIONS.items()}
    table["namespaces"] = {"new_namespaces": _equal([])}
    # (no mount view: a path outside the roots can be looked up, only not opened)
    for fact in ("write_root_noexec", "read_root_read_only", "git_metadata", "outside_path"):
        del table["filesystem"][fact]
    from stockade.linux.landlock_tier import SCOPE_ABI

    table["landlock"]["landlock_abi"] = (lambda v: isinstance(v, int) and v >= SCOPE_ABI,
                                         f"at least {SCOPE_ABI}")
    if os.geteuid() != 0:  # (only root may lock securebits or shrink the bounding set there)
        del table["privileges"]["securebits"]
        table["privileges"]["capabilities"] = (
            lambda v: isinstance(v, dict) and len(v) == 5
            and not any(value for name, value in v.items() if name != "bounding"),
            "every set empty but the bounding set (no_new_privs: exec gains none)")
    del table["network"]["network_interfaces"]
    table["network"]["udp_loopback"] = _denied
    del table["limits"]["pid_max"]
    if os.geteuid() == 0:  # (the tier refuses limits.pids as root: tier_limits)
        del table["limits"]["rlimit_nproc"]
    else:
        table["limits"]["rlimit_nproc"] = (
            lambda v: isinstance(v, list) and len(v) == 2 and v[0] == v[1] >= facts.PROBE_PIDS,
            f"the user's tasks plus {facts.PROBE_PIDS}")
    return table


def tier_limits() -> model.Limits:
    """The probe's limits in the landlock tier: without pids as root, whom RLIMIT_NPROC does
    not bind (the tier refuses the limit there)."""
    return replace(PROBE_LIMITS, pids=None) if os.geteuid() == 0 else PROBE_LIMITS


def tier_verified(observed: dict[str, object], *names: str) -> bool:
    """As `verified`, by the landlock tier's table."""
    return facts.verified(observed, *names, table=tier_expectations())
