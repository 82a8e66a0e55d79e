"""How rows launch their attacks: through the production path — compile the policy, ask the
backend whether it can enforce it, `execute` — once (most rows), from an owner process that is
then killed, or many times at once (the soak).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import stockade
from stockade.errors import StockadeError, UnavailableError, UnenforceableError
from stockade.evidence.judges import all_denied, notes
from stockade.evidence.row import Launch, Launcher, Row
from stockade.evidence.scene import ATTACKS, NotRunnable, Scene
from stockade.evidence.watch import AppendedFile, CallerTerminal, Finding, processes_with
from stockade.launch.backend import Backend
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result, Violation
from stockade.policy import Policy, merge, policy_to_document, preset

SOAK_THREADS = 8


def interpreter() -> tuple[str, str]:
    """(the Python that runs attacks, the root to grant for it): this interpreter's base
    installation, since a virtual environment's directory is not granted."""
    prefix = os.path.realpath(sys.base_prefix)
    running = os.path.realpath(sys.executable)
    if running.startswith(prefix + "/"):
        return running, prefix
    return os.path.join(prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"), prefix


def policy_for(row: Row, scene: Scene) -> Policy:
    """The row's preset with its overrides, plus read access to the attacks and Python."""
    base = preset(row.preset)
    document = {section: dict(values) for section, values in row.policy.items()}
    filesystem = document.setdefault("filesystem", {})
    extra = [str(ATTACKS), interpreter()[1], *scene.read_roots, *filesystem.get("read", [])]
    filesystem["read"] = [*base.filesystem.read, *extra]
    return merge(base, document, file=f"evidence row {row.id}")


def argv_for(row: Row, scene: Scene, arguments: Sequence[str] | None = None) -> list[str]:
    """The attack's command line: its program, the marker, then its arguments (placeholders
    filled; an empty one dropped; one starting with `*` split into several)."""
    program = str(ATTACKS / row.attack)
    head = ["sh", program] if row.attack.endswith(".sh") else [
        interpreter()[0], "-E", "-s", "-B", program]
    words: list[str] = []
    for template in row.args if arguments is None else arguments:
        value = scene.expand(template.lstrip("*"))
        words += value.split() if template.startswith("*") else [value] if value else []
    return [*head, scene.marker, *words]


def context_for(scene: Scene, workspace: Path | None = None) -> CompileContext:
    return CompileContext(workspace=str(workspace or scene.ws), home=str(scene.home),
                          tmp=tempfile.gettempdir(), host_env=scene.host_env)


def request_for(row: Row, scene: Scene, argv: list[str], workspace: Path | None = None
                ) -> LaunchRequest:
    return compile_policy(policy_for(row, scene), argv, context_for(scene, workspace),
                          stdin=scene.stdin)


def run_once(backend: Backend, request: LaunchRequest, scene: Scene) -> Launch:
    """Launch as the SandboxManager does: the backend must accept the request first. A host
    that cannot enforce it raises (the row is not run); other errors are the row's to judge."""
    try:
        backend.check(request)
        return Launch(execute(backend, request, cancel=scene.cancel))
    except (UnavailableError, UnenforceableError):
        raise
    except StockadeError as exc:
        return Launch(error=exc)


def attack(row: Row, scene: Scene, backend: Backend) -> Launch:
    """The default: the attack, once, under the row's policy."""
    try:
        request = request_for(row, scene, argv_for(row, scene))
    except (UnavailableError, UnenforceableError):
        raise
    except StockadeError as exc:
        return Launch(error=exc)
    return run_once(backend, request, scene)


def against_servers(row: Row, scene: Scene, backend: Backend) -> Launch:
    """The attack, with Stockade's own servers listening inside the workspace, where it can
    reach them: a daemon on `daemon.sock` (in this process) and a CLI server on `cli.sock`
    (a process of its own, as `stockade daemon` forks it). Their peer check is what the row
    tests; the `peer_check` weakening (tests only) switches it off."""
    from stockade.session.daemon import Daemon

    check = "peer_check" not in getattr(backend, "weaken", frozenset())
    daemon = Daemon(str(scene.ws / "daemon.sock"), check_peers=check)
    daemon.bind()
    serving = threading.Thread(target=daemon.serve, daemon=True)
    serving.start()
    package_parent = str(Path(stockade.__file__).resolve().parent.parent)
    cli_path = scene.ws / "cli.sock"
    cli = subprocess.Popen(
        [sys.executable, "-c", "import sys; from stockade.cli import COMMAND_LINE, server; "
         "server.serve(sys.argv[1], COMMAND_LINE, check_peers=sys.argv[2] == 'check')",
         str(cli_path),
         "check" if check else "trust"], env={**os.environ, "PYTHONPATH": package_parent},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _answers(cli_path):
            if cli.poll() is not None or time.monotonic() > deadline:
                raise NotRunnable("the CLI server did not start here")
            time.sleep(0.1)
        return attack(row, scene, backend)
    finally:
        cli.terminate()
        cli.wait(30)
        daemon.stop()
        serving.join(30)


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
            return True
        except OSError:
            return False


# Run in a process of its own whose standard streams are the caller's (a terminal, a file):
# `execute` relays them as `stockade run` does. Prints the Result as JSON on the descriptor
# its third argument names.
CALLER = """
import json, os, sys
from stockade.launch.manager import execute
from stockade.launch.request import LaunchRequest
from stockade.linux.backend import LinuxBackend
weaken = frozenset(filter(None, sys.argv[2].split(",")))
result = execute(LinuxBackend(weaken=weaken), LaunchRequest.decode(sys.argv[1].encode()),
                 stdio_inherit=True)
with os.fdopen(int(sys.argv[3]), "w") as out:
    json.dump(result.to_json(), out)
"""


def from_the_callers_streams(row: Row, scene: Scene, backend: Backend) -> Launch:
    """The attack run by a caller whose streams are the host's: the scene's CallerTerminal
    (stdin, stdout and stderr) or AppendedFile (stdout). What the command printed is what
    reached them. The `stdio_relay` weakening (tests only) hands them to the command."""
    request = request_for(row, scene, argv_for(row, scene))
    weaken = ",".join(sorted(getattr(backend, "weaken", frozenset())))
    terminal = next((w for w in scene.watches if isinstance(w, CallerTerminal)), None)
    appended = next((w for w in scene.watches if isinstance(w, AppendedFile)), None)
    package_parent = str(Path(stockade.__file__).resolve().parent.parent)
    read_end, write_end = os.pipe()
    with contextlib.ExitStack() as stack:
        if terminal is not None:
            streams = {"stdin": terminal.slave, "stdout": terminal.slave,
                       "stderr": terminal.slave}
        else:
            assert appended is not None
            log = stack.enter_context(open(appended.path, "ab"))
            streams = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": subprocess.PIPE}
        caller = subprocess.Popen(
            [sys.executable, "-c", CALLER, request.encode().decode(), weaken, str(write_end)],
            env={**scene.host_env, "PYTHONPATH": package_parent}, pass_fds=[write_end],
            start_new_session=True, **streams)
        os.close(write_end)
        with os.fdopen(read_end) as reply:
            body = reply.read()
        caller.communicate(timeout=120)
    if not body:
        return Launch(error=StockadeError("caller_failed", "the caller printed no result"))
    shown = terminal.shown() if terminal is not None else appended.path.read_bytes()
    summary = json.loads(body)
    result = Result(exit_code=summary["exit_code"], signal=summary["signal"], stdout=shown,
                    stderr=b"", stdout_truncated=False, stderr_truncated=False,
                    timed_out=summary["timed_out"], cancelled=summary["cancelled"],
                    duration=summary["duration"], backend=summary["backend"],
                    digest=summary["digest"], request_id=summary["request_id"],
                    violations=tuple(Violation(**v) for v in summary["violations"]),
                    enforced=summary["enforced"])
    return Launch(result)


def in_a_guest(row: Row, scene: Scene, backend: Backend) -> Launch:
    """The attack in a QEMU guest (`containment = "vm"`, docs/vm.md) under the row's policy;
    not run where this host cannot boot one."""
    from stockade.vm.qemu import VmSandbox, host_kernel

    try:
        host_kernel()
    except StockadeError as exc:
        raise NotRunnable(f"no VM guest here: {exc.message}") from None
    try:
        with VmSandbox(policy_for(row, scene), workspace=scene.ws) as guest:
            return Launch(guest.run(argv_for(row, scene), timeout=120))
    except (UnavailableError, UnenforceableError):
        raise
    except StockadeError as exc:
        return Launch(error=exc)


def owner_killed(row: Row, scene: Scene, backend: Backend) -> Launch:
    """`stockade run` in a process of its own, killed with SIGKILL once the attack's daemon
    runs. (It uses the production backend as the command line builds it.)"""
    policy_file = scene.root / "policy.json"
    policy_file.write_text(json.dumps(policy_to_document(policy_for(row, scene))))
    package_parent = str(Path(stockade.__file__).resolve().parent.parent)
    owner = subprocess.Popen(
        [sys.executable, "-m", "stockade", "run", "--policy", str(policy_file), "--workspace",
         str(scene.ws), "--", *argv_for(row, scene)],
        env={**scene.host_env, "PYTHONPATH": package_parent},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def sandboxed() -> int:  # the owner's own command line carries the marker too
        return len(set(processes_with(scene.marker)) - {owner.pid})

    deadline = time.monotonic() + 10
    while sandboxed() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    running = sandboxed()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    return Launch(facts={"running": running, "owner_status": owner.returncode})


def owner_killed_judge(scene: Scene, launch: Launch) -> Finding:
    running, status = launch.facts["running"], launch.facts["owner_status"]
    ok = running >= 2 and status == -signal.SIGKILL
    return Finding(ok, f"{running} sandboxed processes running (attack and daemon) when the owner "
                       f"was killed (owner status {status})")


def soak(count: int) -> Launcher:
    """`count` launches, `SOAK_THREADS` at a time, each in its own workspace with a token of its
    own, each trying to read three neighbours' tokens."""
    def launch(row: Row, scene: Scene, backend: Backend) -> Launch:
        workspaces = sorted((scene.root / "soak").iterdir())
        tokens = [secrets.token_hex(8) for _ in workspaces]

        def one(index: int) -> Launch:
            others = [str(workspaces[(index + step) % count] / "token") for step in (1, 2, 3)]
            argv = argv_for(row, scene, [tokens[index], *others])
            return run_once(backend, request_for(row, scene, argv, workspaces[index]), scene)

        with ThreadPoolExecutor(SOAK_THREADS) as pool:
            launches = list(pool.map(one, range(count)))
        errors = [str(item.error) for item in launches if item.error]
        runs = tuple(item.result for item in launches if item.result)
        kept = [(ws / "token").read_text() if (ws / "token").exists() else "" for ws in workspaces]
        return Launch(runs=runs, facts={"tokens": tokens, "kept": kept, "errors": errors})
    return launch


def soak_judge(scene: Scene, launch: Launch) -> Finding:
    """Every launch ran, with its own request id and token, and read no neighbour's token."""
    tokens, errors = launch.facts["tokens"], launch.facts["errors"]
    if errors:
        return Finding(False, f"{len(errors)} launches failed: {errors[0]}")
    ids = {run.request_id for run in launch.runs}
    reported = [notes(run).get("token") for run in launch.runs]
    verdicts = [all_denied(run, {}) for run in launch.runs]
    problems = [f.text for f in verdicts if not f.ok]
    if len(ids) != len(tokens):
        problems.append(f"only {len(ids)} distinct request ids for {len(tokens)} launches")
    if sorted(reported, key=str) != sorted(tokens) or launch.facts["kept"] != tokens:
        problems.append("a launch saw or left another launch's token")
    if problems:
        return Finding(False, "; ".join(problems))
    return Finding(True, f"{len(launch.runs)} launches, {len(ids)} distinct request ids, "
                         f"each token in its own workspace only, "
                         f"{3 * len(launch.runs)} neighbour reads denied")
