"""The launch ledger: write-ahead records, leases, reconciliation, quarantine, the state
directory; crash tests that SIGKILL a real owner at each stage of a launch; a 64-launch soak.

What a launch creates durably today: the readiness probe's directory (a workspace, a protected
`.git`, a denied path and an outside file) is the one durable host resource in the code base,
recorded in the ledger by every probe. A sandbox itself leaves nothing on the host by
construction: its root, /tmp and mounts live in its own mount namespace, its processes in its
own pid namespace (killed with it), and no cgroup is created on this host (cgroup v1 plus an
empty v2: limits are rlimits). The allowlist proxy listens on the sandbox's own loopback
(no socket file). The crash and soak tests therefore record, as the probe does, a per-launch
workspace directory in the ledger around real launches, and check the host for every kind of
residue: processes, mounts, directories, sockets and records.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import policy_for

from stockade.errors import SetupError, UnavailableError, UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import SandboxManager
from stockade.lifecycle import ledger as ledger_module
from stockade.lifecycle import removers, statedir
from stockade.lifecycle.ledger import Ledger

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(str(tmp_path / "state"))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory with a path short enough for a unix socket inside it."""
    path = Path(tempfile.mkdtemp(prefix="l", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def dead_owner(ledger: Ledger, resources: list[tuple[str, str, dict]]) -> str:
    """Record `resources` from a process that then dies by SIGKILL; returns the record name."""
    code = (
        "import json, os, signal, sys\n"
        "from stockade.lifecycle.ledger import Ledger\n"
        "with Ledger(sys.argv[1]).launch(os.urandom(16).hex()) as record:\n"
        "    for kind, name, detail in json.loads(sys.argv[2]):\n"
        "        record.add(kind, name, detail)\n"
        "    print(os.path.basename(record.path), flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, ledger.root, json.dumps(resources)],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout.strip()


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), **extra}


def _locked(path: str) -> bool:
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# --- write-ahead records and leases ----------------------------------------------------------


def test_a_launch_that_creates_nothing_durable_writes_nothing(ledger):
    with ledger.launch("r1") as record:
        assert record.fresh_name("proxy").startswith("stockade-proxy-")
    assert not os.path.exists(ledger.root)


def test_record_is_written_ahead_locked_and_removed_after_its_resources(ledger, work):
    with ledger.launch("request-1") as record:
        path = str(work / record.fresh_name("proxy"))
        record.add("dir", path)
        assert not os.path.exists(path)  # written ahead: the resource does not exist yet
        assert os.path.basename(record.path) == hashlib.sha256(b"request-1").hexdigest() + ".json"
        header, entry = (json.loads(line) for line in Path(record.path).read_text().splitlines())
        assert header["format"] == "stockade-ledger" and header["version"] == 1
        assert entry == {"add": {"kind": "dir", "name": path, "detail": {}}}
        assert _locked(record.path)  # the lease
        assert oct(os.stat(ledger.root).st_mode & 0o777) == "0o700"
        assert not [n for n in os.listdir(ledger.records_dir) if n.endswith(".tmp")]
        os.mkdir(path)
        (Path(path) / "proxy.sock").touch()
    assert not os.path.exists(path)
    assert ledger.records() == []


def test_resources_are_removed_even_when_the_launch_fails(ledger, work):
    with pytest.raises(RuntimeError), ledger.launch("r") as record:
        path = str(work / record.fresh_name("work"))
        record.add("dir", path)
        os.mkdir(path)
        raise RuntimeError("launch failed")
    assert not os.path.exists(path) and ledger.records() == []


@pytest.mark.parametrize("kind, name, detail", [
    ("tempfile", "/tmp/stockade-x-" + "0" * 24, {}),
    ("dir", "relative/stockade-proxy-" + "0" * 24, {}),
    ("dir", "/tmp/../etc/stockade-proxy-" + "0" * 24, {}),
    ("dir", "/home/someone", {}),
    ("socket", "/tmp/stockade-proxy-short", {}),
    ("process", "daemon", {"pid": 1}),
])
def test_add_refuses_what_no_remover_could_act_on(ledger, kind, name, detail):
    with ledger.launch("r") as record, pytest.raises(ValueError):
        record.add(kind, name, detail)
    assert ledger.records() == []


def test_a_request_id_is_recorded_once(ledger, work):
    with ledger.launch("same") as record:
        record.add("dir", str(work / record.fresh_name("a")))
        with ledger.launch("same") as again, pytest.raises(SetupError) as info:
            again.add("dir", str(work / again.fresh_name("b")))
        assert info.value.code == "ledger_identity_reused"


def test_settle_failure_keeps_the_record_for_the_next_reconcile(ledger, work):
    with pytest.raises(SetupError) as info, ledger.launch("r") as record:
        path = work / record.fresh_name("work")
        record.add("dir", str(path))
        path.write_text("a file where a directory was recorded: never guessed at")
    assert info.value.code == "ledger_settle_failed"
    assert len(ledger.records()) == 1 and path.exists()
    path.unlink()
    done = ledger.reconcile()
    assert (done.reconciled, done.failed) == (1, 0) and ledger.records() == []


# --- reconciliation ----------------------------------------------------------------------------


def test_reconcile_settles_a_dead_owners_record_and_skips_live_ones(ledger, work, short):
    dead_dir = str(work / removers.fresh_name("proxy"))
    os.mkdir(dead_dir)
    (Path(dead_dir) / "proxy.sock").touch()
    dead_socket = str(short / removers.fresh_name("ctl"))
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(dead_socket)
    dead_owner(ledger, [("dir", dead_dir, {}), ("socket", dead_socket, {})])
    with ledger.launch("live") as record:
        live = str(work / record.fresh_name("proxy"))
        record.add("dir", live)
        os.mkdir(live)
        done = ledger.reconcile()
        assert (done.reconciled, done.live, done.failed, done.quarantined) == (1, 1, 0, 0)
        assert sorted(done.removed) == sorted([("dir", dead_dir), ("socket", dead_socket)])
        assert not os.path.exists(dead_dir) and not os.path.exists(dead_socket)
        assert os.path.isdir(live)
        again = ledger.reconcile()  # idempotent
        assert (again.reconciled, again.live, again.removed) == (0, 1, [])
    assert ledger.records() == []


def test_concurrent_reconcilers_remove_each_resource_once(ledger, work):
    paths = []
    for _ in range(8):
        path = str(work / removers.fresh_name("work"))
        os.mkdir(path)
        paths.append(path)
        dead_owner(ledger, [("dir", path, {})])
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: Ledger(ledger.root).reconcile(), range(8)))
    assert sum(r.reconciled for r in results) == 8
    assert sum(r.failed + r.quarantined for r in results) == 0
    assert sorted(p for r in results for _, p in r.removed) == sorted(paths)
    assert ledger.records() == [] and os.listdir(work) == []


def test_reconcile_kills_a_recorded_process_only_if_it_is_the_same_process(ledger):
    same = subprocess.Popen(["sleep", "60"])
    recycled = subprocess.Popen(["sleep", "60"])
    try:
        reused = removers.process_identity(recycled.pid)
        reused["start"] -= 1  # as if the pid now belonged to a later process
        dead_owner(ledger, [("process", "daemon", removers.process_identity(same.pid)),
                            ("process", "other", reused)])
        done = ledger.reconcile()
        assert done.reconciled == 1
        assert same.wait(timeout=10) == -signal.SIGKILL
        assert recycled.poll() is None
    finally:
        for proc in (same, recycled):
            proc.kill()
            proc.wait()


def test_an_abandoned_temporary_record_is_removed_after_a_grace_period(ledger, monkeypatch):
    statedir.ensure(ledger.root)
    statedir.ensure(ledger.records_dir)
    temporary = Path(ledger.records_dir) / f".{'a' * 64}.{'b' * 16}.tmp"
    temporary.write_text("{}\n")
    ledger.reconcile()
    assert temporary.exists()  # young: its owner may be about to lock it
    monkeypatch.setattr(ledger_module, "TEMPORARY_GRACE", 0.0)
    ledger.reconcile()
    assert not temporary.exists()


# --- corruption and quarantine -----------------------------------------------------------------


def _plant(ledger: Ledger, content: bytes, name: str = "c" * 64 + ".json") -> Path:
    statedir.ensure(ledger.root)
    statedir.ensure(ledger.records_dir)
    path = Path(ledger.records_dir) / name
    path.write_bytes(content)
    return path


def _header(name: str = "c" * 64, version: int = 1) -> str:
    return json.dumps({"format": "stockade-ledger", "version": version, "request": name})


@pytest.mark.parametrize("content", [
    b"not json at all",
    b"",
    (_header() + "\n" + '{"add": {"kind": "dir", "na').encode(),  # torn, no final newline
    (_header(version=2) + "\n").encode(),
    (_header("d" * 64) + "\n").encode(),  # header of another record
    (_header() + "\n" + json.dumps({"add": {"kind": "cgroup", "name": "/sys/fs/cgroup/x",
                                            "detail": {}}}) + "\n").encode(),
    (_header() + "\n" + json.dumps({"add": {"kind": "dir", "name": "/home", "detail": {}}})
     + "\n").encode(),
    (_header() + "\n" + json.dumps({"remove": {}}) + "\n").encode(),
])
def test_an_untrusted_record_is_quarantined_never_acted_on(ledger, tmp_path, content):
    victim = tmp_path / "victim"
    victim.mkdir()
    planted = _plant(ledger, content)
    done = ledger.reconcile()
    assert (done.quarantined, done.reconciled, done.removed) == (1, 0, [])
    assert victim.exists() and not planted.exists()
    (kept,) = ledger.quarantined()
    assert (Path(ledger.quarantine_dir) / kept).read_bytes() == content  # left for inspection
    with pytest.raises(UnavailableError) as info:
        ledger.check()
    assert info.value.code == "ledger_corrupt"


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_a_record_that_is_no_file_is_quarantined_not_followed(ledger, tmp_path, kind):
    target = tmp_path / "target"
    target.write_text("keep")
    statedir.ensure(ledger.root)
    statedir.ensure(ledger.records_dir)
    planted = Path(ledger.records_dir) / ("e" * 64 + ".json")
    if kind == "symlink":
        planted.symlink_to(target)
    else:
        planted.mkdir()
    assert ledger.reconcile().quarantined == 1
    assert target.read_text() == "keep" and ledger.records() == []


def test_names_in_a_quarantined_record_are_never_handed_out_again(ledger, work, monkeypatch):
    seen = removers.fresh_name("proxy")
    digest = hashlib.sha256(b"old-request").hexdigest()
    _plant(ledger, f"garbage {seen} garbage".encode(), digest + ".json")
    ledger.reconcile()
    assert {seen, digest} <= ledger.retired()
    with ledger.launch("old-request") as record, pytest.raises(SetupError) as info:
        record.add("dir", str(work / removers.fresh_name("proxy")))
    assert info.value.code == "ledger_identity_reused"
    with ledger.launch("new") as record:
        with pytest.raises(SetupError):
            record.add("dir", str(work / seen))
        names = iter([seen, seen, "stockade-proxy-" + "1" * 24])
        monkeypatch.setattr(removers.secrets, "token_hex", lambda n: next(names)[-24:])
        assert record.fresh_name("proxy") == "stockade-proxy-" + "1" * 24


# --- the state directory -----------------------------------------------------------------------


def test_state_dir_resolution(monkeypatch, tmp_path):
    for name in (statedir.ENV, "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert statedir.state_dir() == str(tmp_path / ".local/state/stockade")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    assert statedir.state_dir() == str(tmp_path / ".local/state/stockade")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert statedir.state_dir() == "/var/lib/stockade"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert statedir.state_dir() == str(tmp_path / "xdg/stockade")
    monkeypatch.setenv(statedir.ENV, str(tmp_path / "own"))
    assert statedir.state_dir() == str(tmp_path / "own")
    monkeypatch.setenv(statedir.ENV, "rel")  # (each process would find its own: refused)
    with pytest.raises(UsageError, match="STOCKADE_STATE_DIR='rel' is a relative path"):
        statedir.state_dir()


@pytest.mark.parametrize("spoil", ["group_writable", "symlink"])
def test_a_state_dir_others_could_write_is_refused(tmp_path, work, spoil):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    root = tmp_path / "state"
    if spoil == "symlink":
        root.symlink_to(real)
    else:
        root.mkdir()
        root.chmod(0o770)
    ledger = Ledger(str(root))
    with pytest.raises(UnavailableError) as info, ledger.launch("r") as record:
        record.add("dir", str(work / record.fresh_name("x")))
    assert info.value.code == "ledger_unusable"


# --- crash tests: SIGKILL a real owner at each stage -------------------------------------------

OWNER = r"""
import os, sys, time
from conftest import PYTHON, policy_for
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.launch import probe
from stockade.lifecycle import ledger as ledger_module
from stockade.lifecycle.ledger import Ledger
from stockade.linux import probe as linux_probe
from stockade.linux.backend import LinuxBackend

stage, state, work, token = sys.argv[1:5]

def pause_after(owner, name, where):
    real = getattr(owner, name)
    def paused(*args, **kwargs):
        result = real(*args, **kwargs)
        print(where, flush=True)
        time.sleep(3600)
    setattr(owner, name, paused)

if stage in ("recorded", "created"):
    # The production probe: its directory is recorded, then created, then used by a sandbox.
    pause_after(*{"recorded": (ledger_module.LaunchRecord, "add"),
                  "created": (linux_probe, "_request")}[stage], stage)
    probe.probe(LinuxBackend(), Ledger(state))
else:
    with Ledger(state).launch(os.urandom(16).hex()) as record:
        top = os.path.join(work, record.fresh_name("work"))
        record.add("dir", top)
        os.mkdir(top)
        code = ("import os, sys, time\n"
                "open('running', 'w').close()\n"
                "if os.fork() == 0:\n"
                "    os.setsid()\n"
                "    if os.fork() == 0: time.sleep(3600)\n"
                "    os._exit(0)\n"
                "time.sleep(3600)\n")
        request = compile_policy(policy_for(), [PYTHON, "-c", code, token],
                                 CompileContext.current(top))
        execute(LinuxBackend(), request)
"""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                data = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            children[int(data[data.rindex(b")") + 2:].split()[1])].append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children[todo.pop()]:
            found.append(child)
            todo.append(child)
    return found


def _with_marker(token: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _entries(path: Path) -> list[str]:
    return os.listdir(path) if path.exists() else []


def _pidfds(pids: list[int]) -> list[int]:
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    return fds


def _mount_points() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def _gone(pidfds: list[int], seconds: float) -> bool:
    import select

    deadline = time.monotonic() + seconds
    try:
        for fd in pidfds:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                return False
        return True
    finally:
        for fd in pidfds:
            os.close(fd)


@pytest.mark.linux
@pytest.mark.usefixtures("linux")
@pytest.mark.parametrize("stage", ["recorded", "created", "running"])
def test_owner_killed_at_each_stage_then_the_next_start_reconciles(tmp_path, stage):
    """SIGKILL the owner (a) right after the probe's ledger record is written, before its
    directory exists; (b) once the directory exists, before the sandbox starts; (c) while a
    sandbox using a recorded workspace runs, with a daemonised grandchild. The next start —
    `stockade probe` for (a) and (b), whose ledger stage reconciles, `stockade reconcile` for
    (c) — removes what was recorded; then no process, mount, directory or record remains."""
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    probe_dirs = tmp_path / "tmp"  # the temp dir, where the probe makes its directory
    probe_dirs.mkdir()
    token = secrets.token_hex(16)
    mounts = _mount_points()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, stage, str(state), str(work), token],
        stdout=subprocess.PIPE, text=True, env=_env(TMPDIR=str(probe_dirs)))
    try:
        if stage == "running":
            deadline = time.monotonic() + 60
            while not list(work.glob("*/running")):
                assert time.monotonic() < deadline and owner.poll() is None
                time.sleep(0.02)
        else:
            assert owner.stdout.readline().strip() == stage
        assert len(os.listdir(state / "records")) == 1
        assert len(_entries(work if stage == "running" else probe_dirs)) == (
            0 if stage == "recorded" else 1)
        pidfds = _pidfds(_descendants(owner.pid))
        # running: the zygote, a spare skeleton, and the sandbox's pid 1, command and daemon
        assert len(pidfds) >= (5 if stage == "running" else 0)
        owner.kill()
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
    assert _gone(pidfds, 10), "a process of the killed owner outlived it"
    command = ["probe", "--json"] if stage != "running" else ["reconcile", "--json"]
    done = subprocess.run([sys.executable, "-m", "stockade", "--state-dir", str(state),
                           *command], capture_output=True, text=True, timeout=120,
                          env=_env(TMPDIR=str(probe_dirs)))
    assert done.returncode == 0, done.stdout + done.stderr
    if stage == "running":
        summary = json.loads(done.stdout)
        assert (summary["reconciled"], summary["failed"]) == (1, 0)
        assert [kind for kind, _ in summary["removed"]] == ["dir"]
    else:
        assert json.loads(done.stdout)["ready"] is True
    assert os.listdir(state / "records") == [] and not (state / "quarantine").exists()
    assert _entries(work) == _entries(probe_dirs) == []
    assert _with_marker(token) == []
    assert _mount_points() == mounts


# --- soak --------------------------------------------------------------------------------------

SOAK_SCRIPT = ('readlink /proc/self/ns/pid /proc/self/ns/net /proc/self/ns/mnt; : > "$1/ready"; '
               'while [ ! -e "$2" ]; do sleep 0.05; done')
WAVES, CONCURRENT = 4, 64


@pytest.mark.linux
@pytest.mark.usefixtures("linux")
def test_soak_64_concurrent_launches_in_waves_leave_no_residue(tmp_path):
    """4 waves of 64 launches through SandboxManager, each holding a ledger-recorded
    workspace, all 64 of a wave alive at once (each waits for a gate file), while a second
    Ledger reconciles in a loop: it must never touch a live launch. Identities are disjoint:
    fresh request ids and names, and 64 distinct pid, net and mount namespaces per wave, none
    the host's. Afterwards: no process, mount, directory, record, descriptor or thread left."""
    ledger = Ledger(str(tmp_path / "state"))
    work, gate = tmp_path / "work", tmp_path / "gate"
    work.mkdir()
    gate.mkdir()
    policy = policy_for(read=(str(gate),))
    SandboxManager().run(compile_policy(policy, ["true"], CompileContext.current(gate)))
    mounts, threads = _mount_points(), threading.active_count()
    fds = len(os.listdir("/proc/self/fd"))
    host = {os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "net", "mnt")}
    seen_ids: set[str] = set()
    seen_names: set[str] = set()
    tokens: list[str] = []

    def launch(go: Path, token: str) -> tuple[str, str, frozenset[str]]:
        request_id = secrets.token_hex(16)
        with ledger.launch(request_id) as record:
            workspace = work / record.fresh_name("soak")
            record.add("dir", str(workspace))
            workspace.mkdir()
            request = compile_policy(policy, ["sh", "-c", SOAK_SCRIPT, "sh", str(workspace),
                                              str(go), token],
                                     CompileContext.current(workspace))
            result = SandboxManager().run(request)
        assert result.exit_code == 0, result.stderr
        return request_id, workspace.name, frozenset(result.stdout.decode().split())

    for wave in range(WAVES):
        token = secrets.token_hex(16)
        tokens.append(token)
        go = gate / f"go-{wave}"
        stop, audits = threading.Event(), []

        def audit(stop: threading.Event = stop, audits: list = audits) -> None:
            while not stop.wait(0.01):
                audits.append(Ledger(ledger.root).reconcile())

        auditor = threading.Thread(target=audit)
        auditor.start()
        with ThreadPoolExecutor(CONCURRENT) as pool:
            futures = [pool.submit(launch, go, token) for _ in range(CONCURRENT)]
            deadline = time.monotonic() + 120
            while len(list(work.glob("*/ready"))) < CONCURRENT and time.monotonic() < deadline:
                time.sleep(0.05)
            ready = len(list(work.glob("*/ready")))
            go.touch()
            results = [f.result(timeout=120) for f in futures]
        stop.set()
        auditor.join()
        assert ready == CONCURRENT
        assert audits and all((a.reconciled, a.failed, a.quarantined) == (0, 0, 0)
                              for a in audits)
        namespaces = [ns for _, _, ns in results]
        assert len(set(namespaces)) == CONCURRENT and all(len(ns) == 3 for ns in namespaces)
        assert not any(ns & host for ns in namespaces)
        seen_ids |= {request_id for request_id, _, _ in results}
        seen_names |= {name for _, name, _ in results}
        assert os.listdir(work) == [] and ledger.records() == []
    assert len(seen_ids) == len(seen_names) == WAVES * CONCURRENT
    assert not any(_with_marker(token) for token in tokens) and _mount_points() == mounts
    assert len(os.listdir("/proc/self/fd")) == fds and threading.active_count() == threads
    assert ledger.quarantined() == []
