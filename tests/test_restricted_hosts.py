"""Restricted hosts, built on this machine (restricted_host.py): a container runtime's seccomp
filter, user.max_user_namespaces = 0 in a user namespace of our own, and namespaces whose
mounts are refused. Stockade must refuse typed and at once there on every path (CLI, API, warm
Sandbox, daemon), say why in `stockade doctor`, and confine with isolation = "landlock" when
asked. Every subprocess has a hard timeout: a hang fails the test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace

import pytest
from conftest import PYTHON, gone, marked, policy_for

import stockade
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux import peer
from stockade.linux.backend import LandlockTier

pytestmark = pytest.mark.usefixtures("linux")

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER = os.path.join(HERE, "restricted_host.py")
# This process's import path for the hosts it starts: its directories only (a relative entry is
# a path hook's key, such as setuptools' editable finder's, which a child would take for a
# directory under its working directory: a workspace, then a missing import-path entry there).
IMPORT_PATH = [entry for entry in sys.path if os.path.isabs(entry)]
STOCKADE = os.path.join(os.path.dirname(sys.executable), "stockade")
HOSTS = ("container", "no-userns", "no-mounts")
REFUSAL = {"container": "userns_unavailable", "no-userns": "userns_unavailable",
           "no-mounts": "setup_failed"}
CAUSE = {"container": ("container_seccomp", "hostUsers: false"),
         "no-userns": ("max_user_namespaces", "sysctl -w user.max_user_namespaces="),
         "no-mounts": ("mount_refused", "systempaths=unconfined")}
BOUND = 30  # seconds: far above a refusal's, far below a hang's
ROOT = os.geteuid() == 0


def on_host(host: str, argv: list[str], tmp_path, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(IMPORT_PATH),
           "STOCKADE_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run([sys.executable, HELPER, host, "--", *argv], capture_output=True,
                          text=True, timeout=BOUND, env=env, cwd=tmp_path, **kwargs)


def tier_policy(name: str = "workspace-write", **changes) -> stockade.Policy:
    """A preset in the landlock tier; as root without limits.pids, which the tier refuses
    there."""
    policy = replace(policy_for(name, **changes), isolation="landlock")
    return replace(policy, limits=replace(policy.limits, pids=None)) if ROOT else policy


API = textwrap.dedent("""
    import sys, stockade
    try:
        if sys.argv[1] == "api":
            stockade.run(["touch", "ran"], preset="workspace-write", workspace=".")
        else:
            with stockade.Sandbox(preset="workspace-write", workspace=".") as sb:
                sb.run(["touch", "ran"])
    except stockade.StockadeError as exc:
        print(exc.code)
        print(exc.message)
""")


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("path", ["cli", "api", "sandbox"])
def test_refused_typed_and_at_once(host, path, tmp_path):
    started = time.monotonic()
    if path == "cli":
        done = on_host(host, [STOCKADE, "run", "--preset", "workspace-write", "--", "touch",
                              "ran"], tmp_path)
        assert done.returncode == 70, done.stderr
        said = done.stderr
    else:
        done = on_host(host, [sys.executable, "-c", API, path], tmp_path)
        assert done.returncode == 0, done.stderr
        said = done.stdout
    assert said.split()[0].removeprefix("stockade:").strip(":") == REFUSAL[host] or \
        f"{REFUSAL[host]}:" in said, said
    assert "stockade doctor" in said
    assert not (tmp_path / "ran").exists()
    assert time.monotonic() - started < 10


DAEMON = textwrap.dedent("""
    set -u
    daemon=$("$STOCKADE" daemon --background 2>/dev/null) || exit 99
    "$STOCKADE" run --preset workspace-write -- touch ran; echo "run $?"
    "$STOCKADE" session exec s --preset workspace-write -- touch ran; echo "session $?"
    test -S "$STOCKADE_STATE_DIR/cli.sock" && echo served
    kill "$daemon"
""")


@pytest.mark.parametrize("host", HOSTS)
def test_refused_through_the_daemon(host, tmp_path):
    done = on_host(host, ["env", f"STOCKADE={STOCKADE}", "sh", "-c", DAEMON], tmp_path)
    assert "run 70" in done.stdout and "session 70" in done.stdout, (done.stdout, done.stderr)
    assert "served" in done.stdout  # the CLI server runs there too, and refused
    assert done.stderr.count("stockade doctor") >= 2, done.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("host", HOSTS)
def test_doctor_names_the_cause_and_the_remedy(host, tmp_path):
    done = on_host(host, [STOCKADE, "doctor", "--json"], tmp_path)
    assert done.returncode == 1, done.stderr
    found = json.loads(done.stdout)
    code, remedy = CAUSE[host]
    causes = {cause["code"]: cause for cause in found["causes"]}
    assert code in causes, found["causes"]
    assert any(remedy in line for line in causes[code]["remedy"]), causes[code]
    assert not found["isolations"]["namespaces"]["ready"]
    assert found["isolations"]["landlock"]["ready"]
    text = on_host(host, [STOCKADE, "doctor"], tmp_path)
    assert text.returncode == 1 and f"cause {code}" in text.stdout


def test_doctor_here_finds_nothing_missing(tmp_path):
    done = subprocess.run([STOCKADE, "doctor", "--json"], capture_output=True, text=True,
                          timeout=BOUND)
    found = json.loads(done.stdout)
    assert done.returncode == 0 and found["ok"], found["causes"]
    assert found["host"]["userns_trial"] == "ok"


TIER_CHILD = textwrap.dedent("""
    import os, socket, sys
    def attempt(action):
        try:
            action()
        except OSError as exc:
            return exc.errno
        return 0
    def write(path):
        with open(path, "w") as f:
            f.write("x")
    outside = sys.argv[1]
    seen = {
        "outside_read": attempt(lambda: open(os.path.join(outside, "secret")).read()),
        "outside_write": attempt(lambda: write(os.path.join(outside, "new"))),
        "protected": attempt(lambda: write(os.path.join(".agents", "x"))),
        "work": attempt(lambda: write(os.path.join("work", "x"))),
        "tcp": attempt(lambda: socket.create_connection(("127.0.0.1", int(sys.argv[2])), 2)),
        "udp": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
            b"x", ("127.0.0.1", int(sys.argv[2])))),
        "dns": attempt(lambda: socket.getaddrinfo("localhost", 53)) or
               attempt(lambda: socket.getaddrinfo("example.com", 443)),
        "unix": attempt(lambda: socket.socket(socket.AF_UNIX)),
        "signal_owner": attempt(lambda: os.kill(int(sys.argv[3]), 0)),
    }
    print(" ".join(f"{k}={v}" for k, v in seen.items()))
    sys.exit(7)
""")


def tier_scene(tmp_path):
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    for directory in (workspace / ".agents", workspace / "work", outside):
        directory.mkdir(parents=True)
    (outside / "secret").write_text("secret")
    listener = socket.create_server(("127.0.0.1", 0))
    return workspace, outside, listener


def check_tier_child(output: str, listener: socket.socket) -> None:
    seen = dict(item.split("=") for item in output.split())
    assert seen["work"] == "0"  # the positive control: the workspace is writable
    for denied in ("outside_read", "outside_write", "protected", "tcp", "udp", "unix",
                   "signal_owner"):
        assert seen[denied] != "0", (denied, seen)
    listener.settimeout(0.2)
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing reached the host's listener


@pytest.mark.parametrize("host", HOSTS)
def test_landlock_tier_confines_on_a_restricted_host(host, tmp_path):
    workspace, outside, listener = tier_scene(tmp_path)
    policy = tmp_path / "tier.json"
    read = ["/usr", "/etc", "?/bin", "?/lib", "?/lib64", os.path.dirname(PYTHON)]
    policy.write_text(json.dumps({"version": 1, "isolation": "landlock", "filesystem": {
        "read": read, "write": ["{workspace}"]}, "env": {"pass": ["PATH"]},
        "limits": {"timeout": "20s"}}))
    with listener:
        done = on_host(host, [STOCKADE, "run", "--policy", str(policy), "--workspace",
                              str(workspace), "--", PYTHON, "-c", TIER_CHILD, str(outside),
                              str(listener.getsockname()[1]), str(os.getpid())], tmp_path)
        assert done.returncode == 7, done.stderr  # the command's exit status passes through
        check_tier_child(done.stdout, listener)


def test_landlock_tier_here_through_the_api(ws, tmp_path):
    workspace, outside = ws
    (workspace / ".agents").mkdir()
    (workspace / "work").mkdir()
    (outside / "secret").write_text("secret")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        result = stockade.run([PYTHON, "-c", TIER_CHILD, str(outside),
                               str(listener.getsockname()[1]), str(os.getpid())],
                              tier_policy(), workspace=workspace)
        assert result.returncode == 7, result.stderr
        assert result.backend == "linux-landlock"
        assert result.enforced["isolation"] == "landlock" and result.enforced["not_enforced"]
        check_tier_child(result.stdout.decode(), listener)


def test_landlock_tier_is_never_a_fallback(ws):
    """Without the key, nothing about a launch says landlock."""
    result = stockade.run(["true"], policy_for(), workspace=ws[0])
    assert result.backend == "linux" and "isolation" not in result.enforced


def sleeping(marker: str) -> list[int]:
    """The `sleep MARKER` processes."""
    def argv0(pid: int) -> bytes:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().split(b"\0")[0]
        except OSError:
            return b""
    return [pid for pid in marked(marker) if argv0(pid).endswith(b"sleep")]


def test_landlock_tier_kills_the_tree_with_its_owner(ws):
    workspace, _ = ws
    marker = f"{time.time_ns() % 10**9}.{os.getpid()}"
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, stockade
        sys.path.insert(0, {HERE!r})
        from test_restricted_hosts import tier_policy
        stockade.run(['sh', '-c', '(setsid sleep {marker} &) ; sleep {marker}'],
                     tier_policy(), workspace={str(workspace)!r})
    """)], env={**os.environ, "PYTHONPATH": os.pathsep.join(IMPORT_PATH)})
    try:
        deadline = time.monotonic() + 15
        while len(sleeping(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sleeping(marker)) == 2, "the command and its daemon never both ran"
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=BOUND)
        assert gone(marker)
    finally:
        owner.kill()


def test_landlock_tier_kills_a_daemonised_descendant_when_the_command_exits(ws):
    marker = f"{time.time_ns() % 10**9}.{os.getpid()}"
    result = stockade.run(["sh", "-c", f"(setsid sleep {marker} &); exit 0"], tier_policy(),
                          workspace=ws[0])
    assert result.returncode == 0
    assert gone(marker, within=2)


def test_landlock_tier_timeout_kills_the_tree(ws):
    marker = f"{time.time_ns() % 10**9}.{os.getpid()}"
    started = time.monotonic()
    result = stockade.run(["sh", "-c", f"(setsid sleep {marker} &); sleep {marker}"],
                          tier_policy(timeout=1.0), workspace=ws[0])
    assert result.timed_out and time.monotonic() - started < 10
    assert gone(marker, within=2)


def test_landlock_tier_refuses_what_it_cannot_enforce(ws):
    for changes, capability in (
            ({"network": replace(policy_for().network, mode="allowlist",
                                 allow=("example.com",))}, "network.allowlist"),
            ({"network": replace(policy_for().network, unix_sockets="any")},
             "network.unix_sockets"),
            ({"network": replace(policy_for().network, mode="any")}, "network.any")):
        with pytest.raises(stockade.UnenforceableError) as info:
            stockade.run(["true"], replace(tier_policy(), **changes), workspace=ws[0])
        assert info.value.code == f"unenforceable:{capability}"
    if ROOT:  # (a policy's own pids; a preset's is lifted, said: the test below)
        with pytest.raises(stockade.UnenforceableError) as info:
            stockade.run(["true"], replace(policy_for(pids=7), isolation="landlock"),
                         workspace=ws[0])
        assert info.value.code == "unenforceable:limits.pids"


def test_landlock_tier_runs_a_preset_with_its_pids_limit_lifted(ws, tmp_path):
    """Every preset sets limits.pids, which the tier cannot bind as root: there a preset's is
    lifted, and said; a policy's own is refused, naming the knob that lifts it, and a policy
    that does runs (rootless, all run)."""
    workspace, _ = ws
    lifted = tmp_path / "lifted.toml"
    lifted.write_text('version = 1\npreset = "workspace-write"\n[limits]\npids = "unlimited"\n')
    plain = tmp_path / "plain.toml"
    plain.write_text('version = 1\npreset = "workspace-write"\n')
    own = tmp_path / "own.toml"
    own.write_text('version = 1\npreset = "workspace-write"\n[limits]\npids = 64\n')
    runs = {}
    for name, policy in (("lifted", lifted), ("plain", plain), ("own", own)):
        runs[name] = subprocess.run(
            [STOCKADE, "run", "--isolation", "landlock", "--policy", str(policy),
             "--workspace", str(workspace), "--", "sh", "-c", f"echo ok > {name}"],
            capture_output=True, text=True, timeout=BOUND)
    assert runs["lifted"].returncode == 0, runs["lifted"].stderr
    assert (workspace / "lifted").read_text() == "ok\n"
    assert runs["plain"].returncode == 0, runs["plain"].stderr
    assert (workspace / "plain").read_text() == "ok\n"
    warned = "stockade: warning: limits.pids (the preset's 512) is not enforced"
    assert (warned in runs["plain"].stderr) is ROOT, runs["plain"].stderr
    if ROOT:
        assert runs["own"].returncode == 70
        assert 'limits.pids = "unlimited"' in runs["own"].stderr
        assert not (workspace / "own").exists()
    else:
        assert runs["own"].returncode == 0, runs["own"].stderr


def test_a_landlock_tier_process_is_not_served_by_stockade_servers(ws, tmp_path):
    """peer.py cannot see a Landlock domain, but a process of the tier differs from a server
    in its seccomp filter and no_new_privs: refused. (Its unix sockets are let through by a
    test-only weakening; in the tier itself it cannot make one, the last line shows.)"""
    path = str(tmp_path / "server.sock")
    own = peer.own_context(peer.RUN_CONTEXT)
    connect = textwrap.dedent(f"""
        import socket, sys
        try:
            s = socket.socket(socket.AF_UNIX)
        except OSError as exc:
            print("no socket", exc.errno); sys.exit(0)
        s.connect({path!r}); s.recv(1); print("connected")
    """)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen(1)
        request = compile_policy(tier_policy(read=(str(tmp_path),)), [PYTHON, "-c", connect],
                                 CompileContext.current(str(ws[0])))
        refused: list[str] = []

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                try:
                    peer.check_peer(conn, own, accepted=peer.boottime())
                    refused.append("served")
                except peer.PeerRefused as exc:
                    refused.append(f"refused: {exc}")
                conn.sendall(b"x")

        thread = threading.Thread(target=serve)
        thread.start()
        result = execute(LandlockTier(weaken=frozenset({"unix_sockets"})), request)
        thread.join(timeout=BOUND)
        assert result.stdout.strip() == b"connected", result.stderr
        assert refused and refused[0].startswith("refused"), refused
    confined = execute(LandlockTier(), request)
    assert confined.stdout.split()[:2] == [b"no", b"socket"]
