"""The steps of .github/workflows/windows.yml that are more than one command, each exiting
non-zero when what it checks does not hold (the workflow gates on them):

    python scripts/windows_ci.py imports       each module on the Windows path imports, fresh
    python scripts/windows_ci.py open-interpreter  (as an administrator) every AppContainer may
                                               read this interpreter, as under C:\\Program Files
    python scripts/windows_ci.py exit-codes    sandbox-exec: the command's status, 2, 70 and 71
    python scripts/windows_ci.py probe FILE    `stockade probe --json`, the attestation kept
    python scripts/windows_ci.py evidence FILE the W1 matrix: each row's real-child test, kept
    python scripts/windows_ci.py tests         the whole suite, Windows required (no skip passes)
    python scripts/windows_ci.py secure-interpreter  (as an administrator) this interpreter's
                                               tree an administrator's alone, as under
                                               C:\\Program Files, so the fence service may run it
    python scripts/windows_ci.py fence         the allowlist fence's real-child rows (the
                                               service installed: `stockade fence install`)
    python scripts/windows_ci.py network-any   network any's real-child row (the service too)
    python scripts/windows_ci.py broker        the one-shot broker's tests, this host's required
    python scripts/windows_ci.py wsb-agent     (as an administrator) the Windows Sandbox guest's
                                               agent on this host: commands as a fresh standard
                                               user, each in a Job of its own
    python scripts/windows_ci.py wsb-sandbox   commands in a real Windows Sandbox; on a host
                                               without the feature, says why and passes (the
                                               one step that may: Windows Server lacks it)

None of them can pass vacuously: `tests` fails when pytest ran no test, passed none, skipped one
or ran none of the W1 real-child tests; `evidence` fails unless every W1 row's test ran and
passed (a row whose test was skipped, deselected or not collected is a failure, not a pass);
`fence` and `network-any` likewise, for each of their rows (tests/windows_fence_host.py);
`broker` fails unless each of its tests against this host ran and passed.

Run from the checkout, with Stockade installed (`pip install .[test]`). Standard library only.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

STOCKADE = [sys.executable, "-m", "stockade"]
EXIT_USAGE, EXIT_SETUP, EXIT_START = 2, 70, 71


# What runs on POSIX hosts only, off the Windows path (the registry never loads it there): the
# Linux backend's package; the CLI server (unix sockets, peers known by SO_PEERPIDFD: on Windows
# the client runs the command line itself); the session agent and its child (a POSIX guest's:
# a Windows Sandbox guest runs vm/wsb_agent.py instead); the QEMU driver. Every other
# module imports on Windows: here, and in tests/test_windows_import.py's Windows-like guard.
POSIX_ONLY = ("stockade.linux", "stockade.cli.server", "stockade.session.agent",
              "stockade.session.child", "stockade.vm.qemu", "stockade.vm.machine",
              "stockade.cli.ask")


# Not imported by the smoke at all: the integrations that need their framework (an extra;
# tests/integrations imports each with it), and fileop, a script run inside a Linux sandbox.
NOT_IMPORTED = ("stockade.integrations.mcp", "stockade.integrations.pydantic_ai",
                "stockade.integrations.openai_agents", "stockade.integrations.deepagents",
                "stockade.integrations.inspect_sandbox", "stockade.integrations.fileop",
                "stockade.integrations.ray")


def on_the_windows_path(name: str) -> bool:
    return not any(name == posix or name.startswith(posix + ".") for posix in POSIX_ONLY)


def imported_by_the_smoke(name: str) -> bool:
    return on_the_windows_path(name) and name not in NOT_IMPORTED


def imports() -> int:
    """Each module on the Windows path, imported first in its own isolated interpreter: an
    import cycle or a POSIX-only module shows up as that module's failure."""
    import stockade

    names = sorted(m.name for m in pkgutil.walk_packages(stockade.__path__, "stockade.")
                   if imported_by_the_smoke(m.name))
    failed = []
    for name in ["stockade", *names]:
        done = subprocess.run([sys.executable, "-I", "-c", f"import {name}"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode:
            failed.append(name)
            print(f"FAIL import {name}:\n{done.stderr.strip()}", flush=True)
    print(f"{len(names) + 1 - len(failed)} modules imported, {len(failed)} failed")
    return 1 if failed else 0


def _policy(directory: str, name: str, body: dict) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        json.dump(body, f)
    return path


def exit_codes() -> int:
    """sandbox-exec's contract: the command's own status through, 2 for an invalid policy, 70
    for one the backend refuses, 71 for a command that cannot start."""
    system_root = os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows"))
    with tempfile.TemporaryDirectory() as top:
        top = os.path.realpath(top)
        workspace = os.path.join(top, "ws")
        os.mkdir(workspace)
        base = {"version": 1, "filesystem": {"read": [system_root], "write": [workspace]},
                "network": {"mode": "none"},
                "env": {"set": {"SystemRoot": system_root,
                                "PATH": os.path.join(system_root, "System32")}},
                "process": {"cwd": workspace}}
        good = _policy(top, "policy.json", base)
        refused = _policy(top, "refused.json", base | {"limits": {"file_size": "1M"}})
        invalid = _policy(top, "invalid.json", base | {"no_such_section": {}})
        cases = [(good, ["cmd", "/d", "/c", "exit", "0"], 0),
                 (good, ["cmd", "/d", "/c", "exit", "7"], 7),
                 # an NTSTATUS (a crash's 0xC0000005): all 32 bits through sys.exit
                 (good, ["cmd", "/d", "/c", "exit", "-1073741819"], 0xC0000005),
                 (invalid, ["cmd", "/d", "/c", "exit", "0"], EXIT_USAGE),
                 (refused, ["cmd", "/d", "/c", "exit", "0"], EXIT_SETUP),
                 (good, ["stockade-no-such-program"], EXIT_START)]
        wrong = 0
        for policy, argv, expected in cases:
            done = subprocess.run([*STOCKADE, "sandbox-exec", policy, "--", *argv],
                                  capture_output=True, text=True, timeout=300, cwd=workspace)
            ok = done.returncode == expected
            wrong += not ok
            print(f"{'ok  ' if ok else 'FAIL'} sandbox-exec {os.path.basename(policy)} -- "
                  f"{' '.join(argv)}: exit {done.returncode}, expected {expected}"
                  + ("" if ok else f"\n{done.stderr.strip()}"), flush=True)
    return 1 if wrong else 0


def _kept(argv: list[str], path: str) -> int:
    """Run `argv`, keep its stdout in `path` (an artifact), pass its stderr and status on."""
    with open(path, "w") as out:
        return subprocess.run(argv, stdout=out, timeout=1800).returncode


def probe(path: str) -> int:
    code = _kept([*STOCKADE, "probe", "--json"], path)
    with open(path) as f:
        print(f.read())
    return code


W1_MODULE = "test_windows_enforcement"


def outcomes(junit: str) -> dict[str, str]:
    """Each test case's outcome in a pytest JUnit XML report: "passed", "failed", "error" or
    "skipped", by `module::name` (the module without its directories and `.py`)."""
    seen = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").rpartition(".")[2]
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            if case.find(kind) is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
        seen[f"{module}::{case.get('name', '')}"] = outcome
    return seen


def _not_clean(seen: dict[str, str]) -> list[str]:
    """Why a run with these outcomes is not clean: nothing may fail or be skipped, and
    something must pass."""
    why = []
    counts = {kind: sum(1 for o in seen.values() if o == kind)
              for kind in ("passed", "failed", "error", "skipped")}
    if not seen or not counts["passed"]:
        why.append(f"{len(seen)} tests ran, {counts['passed']} passed: a run of nothing")
    for kind in ("failed", "error", "skipped"):
        if counts[kind]:
            why.append(f"{counts[kind]} {kind}")
    return why


def judged(seen: dict[str, str]) -> list[str]:
    """Why a suite run with these outcomes is not a pass (empty when it is): nothing may fail
    or be skipped, something must pass, and the W1 real-child tests must have run."""
    why = _not_clean(seen)
    if not [name for name, o in seen.items() if name.startswith(W1_MODULE + "::")
            and o == "passed"]:
        why.append(f"no W1 real-child test ({W1_MODULE}) passed")
    return why


BROKER_MODULE = "test_windows_broker"
# The broker's tests against this host itself (NTFS, a real broker process, a real launch):
# each must have run and passed, not merely been collected.
BROKER_HOST_TESTS = ("test_on_this_host_the_manifest_is_closed_and_consumed_once",
                     "test_on_this_host_a_manifest_replaced_or_linked_is_refused",
                     "test_on_this_host_a_real_broker_refuses_a_tampered_manifest_and_another_pid",
                     "test_on_this_host_a_launch_is_the_brokers")


def broker_judged(seen: dict[str, str]) -> list[str]:
    """Why the broker's run is not a pass: as a clean run, and each of BROKER_HOST_TESTS ran
    and passed."""
    return _not_clean(seen) + [f"{test} did not run and pass" for test in BROKER_HOST_TESTS
                               if seen.get(f"{BROKER_MODULE}::{test}") != "passed"]


def _pytest(junit: str, *targets: str) -> int:
    env = dict(os.environ, STOCKADE_REQUIRE_WINDOWS="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
                           f"--junitxml={junit}", *targets], env=env).returncode


def tests() -> int:
    with tempfile.TemporaryDirectory() as top:
        junit = os.path.join(top, "tests.xml")
        status = _pytest(junit, "tests")
        why = judged(outcomes(junit)) if os.path.exists(junit) else ["pytest wrote no report"]
    for reason in why:
        print(f"FAIL tests: {reason}", flush=True)
    return status or (1 if why else 0)


def broker() -> int:
    """The one-shot broker's tests (tests/test_windows_broker.py), those against this host
    required (issue 36, item 3)."""
    with tempfile.TemporaryDirectory() as top:
        junit = os.path.join(top, "broker.xml")
        status = _pytest(junit, os.path.join("tests", BROKER_MODULE + ".py"))
        why = broker_judged(outcomes(junit)) if os.path.exists(junit) \
            else ["pytest wrote no report"]
    for reason in why:
        print(f"FAIL broker: {reason}", flush=True)
    return status or (1 if why else 0)


def w1_matrix(seen: dict[str, str]) -> list[dict[str, str]]:
    """One row per W1 row: its test and what became of it ("not run" when it never ran)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from test_windows_enforcement import W1

    rows = []
    for row, test in W1.items():
        ran = [o for name, o in seen.items()
               if name.split("[")[0] == f"{W1_MODULE}::{test}"]
        outcome = "not run" if not ran else ("passed" if set(ran) == {"passed"} else
                                             next(o for o in ran if o != "passed"))
        rows.append({"row": row, "test": test, "outcome": outcome})
    return rows


def evidence(path: str) -> int:
    """The W1 matrix (tests/test_windows_enforcement.py): real children in the real sandbox,
    one row each; kept in `path`; a pass only when every row's test ran and passed."""
    with tempfile.TemporaryDirectory() as top:
        junit = os.path.join(top, "w1.xml")
        status = _pytest(junit, os.path.join("tests", W1_MODULE + ".py"))
        seen = outcomes(junit) if os.path.exists(junit) else {}
    rows = w1_matrix(seen)
    with open(path, "w") as f:
        json.dump({"matrix": "W1", "rows": rows}, f, indent=2)
    for row in rows:
        print(f"{'ok  ' if row['outcome'] == 'passed' else 'FAIL'} {row['row']}: "
              f"{row['outcome']}", flush=True)
    failed = [row for row in rows if row["outcome"] != "passed"]
    return status or (1 if failed or not rows else 0)


def open_interpreter() -> int:
    """The runner's interpreter (C:\\hostedtoolcache, made by an administrator) readable by every
    AppContainer, as the python.org installer's C:\\Program Files location is: a standard
    user may not change its DACL, which a grant would need (issue 31, D5)."""
    root = os.path.realpath(sys.base_prefix)
    return subprocess.run(["icacls", root, "/grant", "*S-1-15-2-1:(OI)(CI)(RX)", "/Q"],
                          timeout=1800).returncode


def secure_interpreter() -> int:
    """The runner's interpreter (C:\\hostedtoolcache, made below C:\\, whose entries give
    Authenticated Users modify on what an administrator makes there) made an administrator's
    alone, as the python.org installer's C:\\Program Files location is: the fence service runs
    it as LocalSystem, and `stockade fence install` refuses an interpreter anyone else could
    change (stockade/windows/fenceinstall.py). The whole top directory below the drive: one
    above the interpreter that others may rename would do as much."""
    root = os.path.realpath(sys.base_prefix)
    drive, rest = os.path.splitdrive(root)
    top = os.path.join(drive + os.sep, rest.strip(os.sep).split(os.sep)[0])
    grants = ["*S-1-5-18:(OI)(CI)F", "*S-1-5-32-544:(OI)(CI)F", "*S-1-5-32-545:(OI)(CI)RX",
              "*S-1-15-2-1:(OI)(CI)RX"]
    for command in (["icacls", top, "/inheritance:r", "/grant:r", *grants, "/C", "/Q"],
                    ["icacls", os.path.join(top, "*"), "/reset", "/T", "/C", "/Q"],
                    ["icacls", top, "/setowner", "*S-1-5-32-544", "/T", "/C", "/Q"]):
        status = subprocess.run(command, timeout=3600).returncode
        if status:
            return status
    return 0


FENCE_MODULE = "windows_fence_host"
FENCE_ROWS = {
    "fence": {
        "an allowlist sandbox reaches the proxy and nothing else on the host":
            "test_an_allowlist_sandbox_reaches_the_proxy_and_nothing_else_on_the_host",
        "a crashed service takes back what it recorded":
            "test_a_crashed_service_takes_back_what_it_recorded_when_it_restarts",
    },
    "network-any": {
        "an any sandbox reaches the internet, not the guarded ranges nor the host":
            "test_an_any_sandbox_reaches_the_internet_but_not_the_guarded_ranges",
    },
}


def fence_rows(step: str) -> int:
    """`step`'s rows of tests/windows_fence_host.py, each of which must run and pass."""
    rows = FENCE_ROWS[step]
    with tempfile.TemporaryDirectory() as top:
        junit = os.path.join(top, "fence.xml")
        status = _pytest(junit, *(f"{os.path.join('tests', FENCE_MODULE + '.py')}::{name}"
                                  for name in rows.values()))
        seen = outcomes(junit) if os.path.exists(junit) else {}
    failed = 0
    for row, name in rows.items():
        outcome = seen.get(f"{FENCE_MODULE}::{name}", "not run")
        failed += outcome != "passed"
        print(f"{'ok  ' if outcome == 'passed' else 'FAIL'} {row}: {outcome}", flush=True)
    return status or (1 if failed else 0)


WSB_USER = "stockade-ci-cmd"  # the standard user wsb-agent makes, and removes


def wsb_agent() -> int:
    """The Windows Sandbox guest's agent (stockade/vm/wsb_agent.py) as the guest runs it, here
    on the host itself (no Sandbox needed): as an administrator, serving a session over a
    socket, and starting each command as a fresh standard user in a Job of its own
    (wsb_winproc). What the user is, what it may not do, streamed output, stdin, exit codes,
    the timeout and what a command leaves behind (the Job's end), the process limit."""
    import secrets
    import socket
    import threading

    from stockade.errors import StartError
    from stockade.session.exchange import Exchange
    from stockade.session.protocol import Message
    from stockade.vm import wsb_winproc
    from stockade.vm.wsb_agent import KILLED, Agent, SocketTransport
    from stockade.vm.wsb_channel import SocketChannel

    system_root = os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows"))
    system32 = os.path.join(system_root, "System32")
    env = {"SystemRoot": system_root, "PATH": system32, "PATHEXT": ".COM;.EXE;.BAT;.CMD"}
    password = "Aa1!" + secrets.token_urlsafe(24)
    subprocess.run(["net", "user", WSB_USER, password, "/add"], check=True, timeout=120,
                   capture_output=True)
    host, guest = socket.socketpair()
    secret = secrets.token_bytes(32)
    agent = Agent(secret, SocketTransport(guest), wsb_winproc.spawner(WSB_USER, password, 8))
    thread = threading.Thread(target=agent.serve, daemon=True)
    thread.start()
    channel = SocketChannel(host)
    numbers = iter(range(1, 1000))

    def run(argv: list[str], *, data: bytes | None = None, timeout: float | None = None,
            cwd: str = system_root, first: threading.Event | None = None) -> tuple[dict, bytes]:
        exchange = Exchange(channel, next(numbers), data, 1 << 20, timeout, first)
        events = exchange.run({"argv": argv, "cwd": cwd, "env": env, "timeout": timeout})
        out = b""
        try:
            while True:
                event = next(events)
                out += event.data
                if first is not None:
                    first.set()  # (a cancel once the first output is in: it was streamed)
        except StopIteration as done:
            return done.value.result, out

    def left() -> str:
        """The command user's processes still running 10 s on (a console host may take a
        moment to follow its last client)."""
        deadline = time.monotonic() + 10
        while True:
            listed = subprocess.run(["tasklist", "/fi", f"USERNAME eq {WSB_USER}", "/nh"],
                                    capture_output=True, text=True, timeout=60).stdout
            if "No tasks" in listed or time.monotonic() >= deadline:
                return "" if "No tasks" in listed else listed.strip()
            time.sleep(0.5)

    def start_refused(cwd: str) -> str:
        try:
            run(["whoami"], cwd=cwd)
        except StartError as exc:
            return exc.code
        return "started"

    wrong = 0
    try:
        channel.send(Message("hello", body={"nonce": secret.hex()}))
        channel.receive(60)
        checks = [
            ("commands run as the standard user",
             lambda: run(["whoami"])[1].decode().strip().lower().endswith("\\" + WSB_USER)),
            ("the command user is no administrator",
             lambda: run(["net", "session"])[0]["exit_code"] != 0),
            ("the command user cannot change the firewall", lambda: run(
                ["netsh", "advfirewall", "set", "currentprofile", "state", "on"])[0]["exit_code"]
             != 0),
            ("output, stdin and the exit code", lambda: _status_and_output(run(
                ["cmd", "/d", "/c", "findstr x & exit 7"], data=b"axb\r\n")) == (7, b"axb")),
            ("output is streamed: a cancel after the first line ends the command", lambda: run(
                ["cmd", "/d", "/c", "echo first& ping -n 60 127.0.0.1 >nul"],
                first=threading.Event())[0]["signal"] == KILLED),
            ("a timeout ends the command and all it started", lambda: run(
                ["cmd", "/d", "/c", "start /b ping -n 60 127.0.0.1 >nul & ping -n 60 "
                 "127.0.0.1 >nul"], timeout=2)[0]["timed_out"] and not left()),
            ("what a command leaves running ends with it", lambda: run(
                ["cmd", "/d", "/c", "start /b ping -n 60 127.0.0.1 >nul"])[0]["exit_code"] == 0
             and not left()),
            ("a Job holds at most pids processes (8): 2 nested shells run, 9 do not", lambda:
             b"deep" in run(["cmd", "/d", "/c", "cmd /d /c echo deep"])[1]
             and b"deep" not in run(["cmd", "/d", "/c", "cmd /d /c " * 8 + "echo deep"])[1]),
            ("a cwd that is no folder is refused", lambda: start_refused(
                os.path.join(system_root, "no-such-folder")) == "cwd_invalid"),
        ]
        for name, check in checks:
            try:
                ok = bool(check())
            except Exception as exc:  # noqa: BLE001 - each check reports, the next still runs
                ok, name = False, f"{name} ({exc.__class__.__name__}: {exc})"
            wrong += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}", flush=True)
        channel.send(Message("shutdown"))
        thread.join(60)
    finally:
        channel.close()
        subprocess.run(["net", "user", WSB_USER, "/delete"], timeout=120, capture_output=True)
    return 1 if wrong or thread.is_alive() else 0


def _status_and_output(ran: tuple[dict, bytes]) -> tuple[int | None, bytes]:
    return ran[0]["exit_code"], ran[1].strip()


def wsb_sandbox() -> int:
    """Commands in a real Windows Sandbox through stockade.run: output, a second execution in
    the kept guest, a read-only root, no network. Without the feature (Windows Server, GitHub's
    runners) it says so, with the reason, and passes."""
    import tempfile

    import stockade
    from stockade.errors import UnavailableError
    from stockade.vm import wsb

    try:
        wsb._launcher()
    except UnavailableError as exc:
        print(f"::notice title=Windows Sandbox not run::{exc.message}", flush=True)
        print(f"SKIPPED wsb-sandbox: this host lacks the feature ({exc.message})")
        return 0
    with tempfile.TemporaryDirectory(dir=os.environ.get("SystemDrive", "C:") + "\\") as top:
        top = os.path.realpath(top)
        workspace, kept = os.path.join(top, "ws"), os.path.join(top, "kept")
        os.mkdir(workspace)
        os.mkdir(kept)
        with open(os.path.join(kept, "file"), "w") as f:
            f.write("kept")
        system_root = os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows"))
        policy = _policy(top, "vm.json", {
            "version": 1, "containment": "vm",
            "filesystem": {"read": [kept], "write": [workspace], "exec_from_write": True},
            "network": {"mode": "none"},
            "env": {"set": {"SystemRoot": system_root,
                            "PATH": os.path.join(system_root, "System32")}},
            "process": {"cwd": workspace}})
        first = stockade.run(["cmd", "/d", "/c", "echo hi"], policy, workspace=workspace)
        guest = wsb.daemon().kept
        second = stockade.run(["cmd", "/d", "/c", f"echo x> {kept}\\file"], policy,
                              workspace=workspace)
        offline = stockade.run(["powershell", "-NoProfile", "-Command",
                                "Test-NetConnection 1.1.1.1 -Port 443 -InformationLevel Quiet"],
                               policy, workspace=workspace)
        checks = [("a command's output", first.stdout.strip() == b"hi"
                   and first.backend == "windows-sandbox"),
                  ("the next execution runs in the kept guest",
                   guest is not None and wsb.daemon().kept is guest),
                  ("a read-only root cannot be written", second.exit_code != 0
                   and open(os.path.join(kept, "file")).read() == "kept"),
                  ("no network", b"True" not in (offline.stdout or b""))]
        wsb.daemon().close()
    wrong = 0
    for name, ok in checks:
        wrong += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}", flush=True)
    return 1 if wrong else 0


STEPS = {"imports": imports, "open-interpreter": open_interpreter, "exit-codes": exit_codes,
         "probe": probe, "evidence": evidence, "tests": tests, "broker": broker,
         "secure-interpreter": secure_interpreter,
         "fence": lambda: fence_rows("fence"), "network-any": lambda: fence_rows("network-any"),
         "wsb-agent": wsb_agent, "wsb-sandbox": wsb_sandbox}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in STEPS:
        print(__doc__, file=sys.stderr)
        return EXIT_USAGE
    return STEPS[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
