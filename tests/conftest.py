"""Shared fixtures: a workspace and an outside directory per test, `sandbox()` that runs a
real command in the real Linux sandbox with the workspace as `{workspace}`, and loopback HTTP
and HTTPS servers (tests/tlsworld.py).

A test that cannot run fails with the reason: a missing guarantee is never a green skip. Off
Linux, the Linux tests are not run at all: the two modules that load Linux system calls when
imported are not collected, and every test that uses the `linux` fixture or mark is
deselected (the summary counts them, the header says why). Likewise off Windows for the tests
marked `windows` (real children in the Windows backend), on Windows for those marked
`not_windows`, and rootless for those marked `root_only` (the summary lists each with its
reason; the root pass of scripts/test.sh runs them, and its rootless pass those whose
`unless_env` fixture, made by root, it is given); as root, those marked `rootless_only` (its
rootless pass runs them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

import leftovers
import pytest

import stockade
from stockade.errors import UnavailableError
from stockade.lifecycle import homes, statedir, treewalk
from stockade.policy import preset

if TYPE_CHECKING:
    from tlsworld import Server

# The interpreter running the tests, visible inside the sandbox too.
PYTHON = os.path.realpath(sys.executable)
PYTHON_ROOT = os.path.realpath(sys.base_prefix)


RUN_TOKEN = leftovers.mark_run()  # (before any test starts a process: see tests/leftovers.py)
LEFT_RUNNING: dict[int, str] = {}  # what outlived the run: found, ended, and reported
BASETEMP: list[str] = []  # the run's base temporary directory, once made
OWN_TEMP: list[str] = []  # the private directory holding it, unless --basetemp was given


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The run's temporary files go below a directory of its own, not pytest's shared
    /tmp/pytest-of-USER, where each new session removes all but the last three sessions'
    directories: runs side by side (CI's root suite and integrations) would share a name."""
    if config.option.basetemp is None:
        OWN_TEMP.append(tempfile.mkdtemp(prefix="stockade-tests-"))
        config.option.basetemp = os.path.join(OWN_TEMP[0], "run")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Nothing outlives the run: its processes are ended (a run that left any fails) and its
    temporary files removed, unless they were put in a --basetemp given to keep them. (Last:
    the fixtures of the last module and of the session are torn down before.)"""
    LEFT_RUNNING.update(leftovers.carrying(RUN_TOKEN))
    if LEFT_RUNNING:
        from stockade.evidence import watch  # (here: conftest also loads on Windows)
        watch.end_processes(list(LEFT_RUNNING))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if OWN_TEMP:
        if sys.platform != "win32":
            treewalk.remove(OWN_TEMP[0])
        else:  # (treewalk walks by descriptors, which Windows cannot open on a directory)
            shutil.rmtree(OWN_TEMP[0])
        # (the private homes of the run's workspaces, which launches keep beside the seal
        # key's directory, outside the run's temporary files: their workspaces are gone now)
        keys = statedir.key_dir()
        if keys and BASETEMP:
            homes.prune(keys, os.path.realpath(BASETEMP[0]))


@pytest.fixture(scope="session", autouse=True)
def state_dir(tmp_path_factory):
    """Launch records and attestations of this test run stay in its own state directory, and
    no `stockade run` of a test starts a CLI server there that outlives it
    (stockade/cli/autoserver.py; tests/test_autoserver.py starts them in directories of its
    own)."""
    BASETEMP.append(str(tmp_path_factory.getbasetemp()))
    path = tmp_path_factory.mktemp("stockade-state")
    os.chmod(path, 0o700)
    previous = os.environ.get("STOCKADE_STATE_DIR")
    os.environ["STOCKADE_STATE_DIR"] = str(path)
    os.environ["STOCKADE_SERVER_IDLE"] = "0"
    yield path
    if previous is None:
        del os.environ["STOCKADE_STATE_DIR"]
    else:
        os.environ["STOCKADE_STATE_DIR"] = previous


LINUX = sys.platform.startswith("linux")
WINDOWS = sys.platform == "win32"
# Not collected off Linux: each module tests what exists on POSIX hosts only and loads it when
# imported. Every other module loads on Windows too (tests/test_windows_suite.py checks both, in
# an interpreter made to look like Windows: a module that no longer needs to be here fails it).
POSIX_ONLY_MODULES = {
    "test_evidence.py": "the Linux evidence matrix",
    "test_evidence_mutations.py": "the Linux layers' switches",
    "test_evidence_network.py": "the Linux evidence matrix's network rows",
    "test_linux_layers.py": "the Linux backend",
    "test_linux_memory.py": "the Linux backend",
    "test_linux_notfound.py": "the Linux backend",
    "test_linux_prepared.py": "the Linux backend",
    "test_linux_status.py": "the Linux backend's reading of pid 1's status pipe",
    "test_linux_supervisor.py": "the Linux backend",
    "test_linux_unavailable.py": "the Linux backend",
    "test_landlock_tier_reach.py": "the Linux backend's landlock tier",
    "test_memfd_exec.py": "the Linux backend",
    "test_network_any.py": "the Linux backend's network any",
    "test_network_any_inbound.py": "the Linux backend's network any",
    "test_network_any_ipv6.py": "the Linux backend's network any",
    "test_restricted_hosts.py": "the Linux backend's landlock tier",
    "test_unix_socket_roots.py": "unix sockets in the Linux backend",
    "test_probe.py": "the Linux backend's probe (Windows': test_windows_probe.py)",
    "test_report.py": "the Linux backend's report (Windows': test_windows_probe.py)",
    "test_helpers_boundary.py": "Stockade's unix-socket helpers attacked from a Linux sandbox",
    "test_cli_server.py": "the CLI server (unix sockets)",
    "test_server_clients.py": "the clients of the unix-socket servers",
    "test_proxy.py": "the allowlist proxy on its unix socket (refused on Windows)",
    "test_vm_qemu.py": "the QEMU driver",
    "test_linux_approve.py": "the Linux backend's approvals and `run --ask` (a terminal)",
    "test_linux_credentials.py": "the Linux backend's credential injection",
}
collect_ignore = [] if LINUX else sorted(POSIX_ONLY_MODULES)


def pytest_report_header(config: pytest.Config) -> str | None:
    if LINUX:
        return "not Windows: the tests of the Windows backend's real children deselected"
    header = (f"not Linux ({sys.platform}): {', '.join(collect_ignore)} not collected, and "
              "the tests of the Linux backend deselected")
    return header if WINDOWS else header + "; not Windows: the Windows ones too"


ROOT_ONLY: list[tuple[str, str]] = []  # (test id, why) deselected in a rootless run
ROOTLESS_ONLY: list[tuple[str, str]] = []  # (test id, why) deselected in a root run
COLLECT_ALL = "STOCKADE_TEST_COLLECT_ALL"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    elsewhere = [item for item in items if not _runs_here(item)]
    # (COLLECT_ALL: tests/test_mutants.py asks which ids exist, root-only ones too)
    if hasattr(os, "getuid") and os.getuid() != 0 and not os.environ.get(COLLECT_ALL):
        # A separate, reported selection (never a green skip): scripts/test.sh runs these in
        # its root pass, and the summary lists each with its reason.
        for item in items:
            marker = item.get_closest_marker("root_only")
            given = marker is not None and os.environ.get(marker.kwargs.get("unless_env", ""))
            if marker is not None and not given and item not in elsewhere:
                elsewhere.append(item)
                ROOT_ONLY.append((item.nodeid, marker.args[0] if marker.args else "needs root"))
    if hasattr(os, "getuid") and os.getuid() == 0 and not os.environ.get(COLLECT_ALL):
        for item in items:  # (likewise: scripts/test.sh runs these in its rootless pass)
            marker = item.get_closest_marker("rootless_only")
            if marker is not None and item not in elsewhere:
                elsewhere.append(item)
                ROOTLESS_ONLY.append((item.nodeid, marker.args[0]))
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's hook
    if LEFT_RUNNING:
        terminalreporter.section(f"FAILED: {len(LEFT_RUNNING)} process(es) this run started "
                                 "outlived it (now killed)", red=True)
        for pid, line in LEFT_RUNNING.items():
            terminalreporter.write_line(f"{pid}: {line[:300]}")
    if ROOT_ONLY:
        terminalreporter.section(f"{len(ROOT_ONLY)} root-only tests not run here (rootless)")
        for nodeid, why in ROOT_ONLY:
            terminalreporter.write_line(f"{nodeid}: {why}")
    if ROOTLESS_ONLY:
        terminalreporter.section(f"{len(ROOTLESS_ONLY)} rootless-only tests not run here (root)")
        for nodeid, why in ROOTLESS_ONLY:
            terminalreporter.write_line(f"{nodeid}: {why}")


def _runs_here(item: pytest.Item) -> bool:
    """Off Linux, nothing needing the Linux backend; off Windows, nothing marked `windows`; on
    Windows, nothing marked `not_windows`."""
    if not LINUX and ("linux" in item.fixturenames or item.get_closest_marker("linux")):
        return False
    if WINDOWS:
        return not item.get_closest_marker("not_windows")
    return not item.get_closest_marker("windows")


def only_backends(monkeypatch: pytest.MonkeyPatch, *backends: object) -> None:
    """For one test, the registry (stockade/launch/registry.py) holds only `backends`: native,
    running on this host, best first, each made as the very object given."""
    from stockade.launch import registry

    registry.entries()  # (the platforms' own entries are loaded, then set aside)
    monkeypatch.setattr(registry, "ENTRIES", {
        backend.name: registry.Entry(backend.name, registry.NATIVE, (sys.platform,),
                                     lambda backend=backend: lambda: backend)
        for backend in backends})


def unavailable(reason: str) -> NoReturn:
    """The test cannot run on this host: it fails, with `reason`."""
    pytest.fail(f"required but cannot run here: {reason}")


@pytest.fixture(scope="session")
def linux() -> None:
    from stockade.linux.backend import LinuxBackend
    try:
        LinuxBackend().probe()
    except UnavailableError as exc:
        unavailable(f"Linux backend unavailable here: {exc}")


@pytest.fixture
def plain_server() -> Iterator[Server]:
    """A loopback HTTP server that records what it receives (tests/tlsworld.py)."""
    from tlsworld import serving  # (here: conftest also loads on Windows)

    with serving() as server:
        yield server


@pytest.fixture
def tls_server(pki: tuple[str, str]) -> Iterator[Server]:
    """The same over HTTPS, its certificate from the test module's own `pki` fixture (a test
    CA's and a leaf's files, tlsworld.make_ca's)."""
    from tlsworld import serving

    with serving(pki[1]) as server:
        yield server


@pytest.fixture
def ws(tmp_path):
    """(workspace, outside): two sibling directories; only the workspace is ever granted."""
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    for directory in (workspace, outside):  # (a home a run interrupted there left: the
        homes.discard(str(directory), statedir.key_dir())  # numbered temp dirs come again)
    return workspace, outside


# A child script's way to say how each attempt went, one line each: `name: DONE` or
# `name: ERRNO` (prefixed to the scripts of the tests that attack from inside).
ATTEMPT = """
import errno
def attempt(name, action):
    try:
        action()
        print(name + ": DONE")
    except OSError as exc:
        print(name + ": " + errno.errorcode[exc.errno])
"""

# A child script that fetches each URL of its arguments in turn, one line each: the status (a
# proxy's refusal: 403), or `refused` where no answer came (a CONNECT the proxy refused).
FETCH = textwrap.dedent("""
    import sys, urllib.request, urllib.error
    for url in sys.argv[1:]:
        try:
            print(urllib.request.urlopen(url, timeout=90).status)
        except urllib.error.HTTPError as e:
            print(e.code)
        except OSError:
            print("refused")
""")


def policy_for(name: str = "workspace-write", **changes) -> stockade.Policy:
    """A preset, with the test interpreter readable, and filesystem/limits fields replaced."""
    base = preset(name)
    fs = base.filesystem
    read = fs.read if PYTHON_ROOT.startswith("/usr") else fs.read + (PYTHON_ROOT,)
    fs_changes = {k: v for k, v in changes.items() if k in ("read", "write", "deny",
                                                             "protected", "git", "home",
                                                             "exec_from_write",
                                                             "workspace")}
    if "read" in fs_changes:
        fs_changes["read"] = read + tuple(fs_changes["read"])
    else:
        fs_changes["read"] = read
    limit_changes = {k: v for k, v in changes.items() if k in ("timeout", "memory", "pids",
                                                                "output", "file_size")}
    return replace(base, filesystem=replace(fs, **fs_changes),
                   limits=replace(base.limits, **limit_changes))


def sandbox(argv, workspace, name: str = "workspace-write", *, input: bytes | None = None,
            **changes) -> stockade.Result:
    return stockade.run(list(argv), policy_for(name, **changes), workspace=workspace,
                        input=input)


def py(code: str, workspace, name: str = "workspace-write", **changes) -> stockade.Result:
    """Run a Python snippet in the sandbox."""
    return sandbox([PYTHON, "-c", code], workspace, name, **changes)


def gone(marker: str, within: float = 10.0) -> bool:
    """Whether, within `within` seconds, no host process has `marker` in its command line."""
    deadline = time.monotonic() + within
    while marked(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def api_owner(workspace, marker: str) -> subprocess.Popen:
    """A program using the API whose sandbox runs a setsid'd and a plain `sleep MARKER`."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, stockade
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from conftest import policy_for
        stockade.run(['sh', '-c', 'setsid sleep {marker} & sleep {marker}'], policy_for(),
                     workspace={str(workspace)!r})
    """)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def kill_owner_once_running(owner: subprocess.Popen, marker: str) -> None:
    """SIGKILL `owner` once its sandbox runs `marker`; then nothing may remain."""
    deadline = time.monotonic() + 10
    while not marked(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked(marker), "the sandbox never started"
    owner.kill()
    owner.wait()
    assert gone(marker)


# Prints how many processes it held at once: itself and children forked until refused.
FORK_UNTIL_REFUSED = textwrap.dedent("""
    import os, time
    held = []
    while True:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        held.append(pid)
    print(len(held) + 1)
""")


def check_the_process_limit_is_exact(workspace) -> None:
    """With pids = 1 and 3, a command that forks until it cannot holds exactly that many
    processes at once (rootless: RLIMIT_NPROC does not bind host root, see limits.py)."""
    for pids in (1, 3):
        r = py(FORK_UNTIL_REFUSED, workspace, pids=pids, timeout=30)
        assert r.exit_code == 0, r.stderr
        if os.getuid() != 0:
            assert r.stdout == f"{pids}\n".encode()


def interrupted_json_run(env: dict, cwd, sigint=signal.SIG_DFL) -> tuple[int, dict]:
    """`stockade run --json` of a command that prints, then sleeps until a Ctrl-C (SIGINT to
    the `stockade` process, started with `sigint` its disposition of SIGINT: never the test
    runner's, which a script's background job has ignored) once it is running: (exit status,
    the JSON printed)."""
    marker = f"4{time.monotonic_ns() % 10**9}"
    client = subprocess.Popen([sys.executable, "-m", "stockade", "run", "--json", "--", "sh",
                               "-c", f"echo started; exec sleep {marker}"],
                              env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    deadline = time.monotonic() + 20
    while not marked(f"sleep\0{marker}"):  # (the sleep itself: its argv is NUL-separated)
        assert time.monotonic() < deadline and client.poll() is None, "it never started"
        time.sleep(0.05)
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=30)
    assert gone(marker)
    assert out, err
    return client.returncode, json.loads(out)


def marked(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture(scope="session")
def readme_checkout(linux, tmp_path_factory):
    """A fresh copy of the tree where the README's set-up step 1 ran as written, with another
    `python3` than scripts/test.sh's (tests/checkout.py): a new user's install, not editable."""
    from checkout import readme_step_one

    return readme_step_one(tmp_path_factory.mktemp("readme"))
