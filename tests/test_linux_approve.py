"""Approvals while a sandbox runs (issue 34 item 3, the Python API part): real children whose
requests leave through the allowlist proxy, which asks the caller's function about each
destination network.allow leaves out. Names resolve only by the proxy's hook."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pty
import re
import select
import subprocess
import sys
import termios
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import FETCH, PYTHON, policy_for

import stockade
from stockade.errors import UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux.backend import LinuxBackend
from stockade.net.approve import ALLOW_ONCE, ALLOW_RUN, DENY, MAX_PENDING, Approval, Ask
from stockade.policy.model import Credential, NetworkPolicy

pytestmark = pytest.mark.usefixtures("linux")
NAMES = {"asked.test": "127.0.0.1", "private.test": "10.0.0.1", "denied.test": "127.0.0.1"}


def run(workspace, port: int, paths: list[str], approver, timeout: float = 5.0,
        **network: object) -> stockade.Result:
    """Each of `paths` (a URL on a test name) fetched in turn by a child (FETCH)."""
    policy = dataclasses.replace(policy_for("read-only"), network=NetworkPolicy(
        "allowlist", (f"127.0.0.1:{port}",), **network))
    request = compile_policy(policy, [PYTHON, "-c", FETCH, *paths],
                             CompileContext.current(workspace))
    backend = LinuxBackend(resolver=lambda host: [NAMES[host]] if host in NAMES else [])
    return execute(backend.with_approval(Approval(approver, timeout)), request)


def test_an_approved_host_is_reached_and_logged(ws, plain_server):
    workspace, _ = ws
    asked: list[Ask] = []

    def approver(ask: Ask) -> str:
        asked.append(ask)
        return ALLOW_ONCE

    url = f"http://asked.test:{plain_server.port}/once"
    r = run(workspace, plain_server.port, [url, url], approver)
    assert r.stdout.split() == [b"200", b"200"], r.stderr
    assert asked == [Ask("asked.test", plain_server.port, "not_allowed")] * 2  # (once: asked again)
    assert [s.path for s in plain_server.seen] == ["/once", "/once"]
    assert [(e["decision"], e["reason"]) for e in r.network_log] == [
        ("allow", "approved_once")] * 2
    assert r.violations == ()


def test_allowed_for_the_run_is_asked_once(ws, plain_server):
    workspace, _ = ws
    asked: list[Ask] = []
    url = f"http://asked.test:{plain_server.port}/run"
    r = run(workspace, plain_server.port, [url, url, url],
            lambda ask: asked.append(ask) or ALLOW_RUN)
    assert r.stdout.split() == [b"200"] * 3 and len(asked) == 1
    assert [e["reason"] for e in r.network_log] == ["approved_for_run"] * 3


@pytest.mark.parametrize("answer", ["slow", "deny", "raises", "yes"])
def test_no_timely_approval_is_a_denial(ws, plain_server, answer):
    workspace, _ = ws

    def approver(ask: Ask) -> str:
        if answer == "slow":
            time.sleep(3)
            return ALLOW_RUN
        if answer == "raises":
            raise RuntimeError("the caller's bug")
        return DENY if answer == "deny" else answer

    url = f"http://asked.test:{plain_server.port}/no"
    started = time.monotonic()
    r = run(workspace, plain_server.port, [url], approver, timeout=0.5)
    assert r.stdout.split() == [b"403"] and plain_server.seen == []
    assert time.monotonic() - started < 30
    (entry,) = r.network_log
    assert entry["reason"] == "not_allowed" and "was asked" in entry["message"]


def test_an_approval_lifts_no_address_check_nor_a_deny_pattern(ws, plain_server):
    workspace, _ = ws
    asked: list[Ask] = []
    port = plain_server.port
    r = run(workspace, port, ["http://private.test/", f"http://denied.test:{port}/"],
            lambda ask: asked.append(ask) or ALLOW_RUN, deny=("denied.test",))
    assert r.stdout.split() == [b"403", b"403"] and plain_server.seen == []
    assert [a.host for a in asked] == ["private.test"]  # (a deny pattern is never asked)
    assert [e["reason"] for e in r.network_log] == ["address_private", "denied_by_rule"]


def test_the_ask_names_the_credentials_of_the_host(ws, plain_server, monkeypatch):
    workspace, _ = ws
    monkeypatch.setenv("STOCKADE_TEST_APPROVE_TOKEN", "t0ken")
    asked: list[Ask] = []
    run(workspace, plain_server.port, [f"https://asked.test:{plain_server.port}/"],  # (a CONNECT)
        lambda ask: asked.append(ask) or DENY,
        credentials=(Credential("tok", "asked.test", "TOKEN", header="X-Token",
                                from_env="STOCKADE_TEST_APPROVE_TOKEN"),))
    assert asked == [Ask("asked.test", plain_server.port, "not_allowed", ("tok",))]


def test_the_api_asks_and_still_refuses_a_loopback_address(ws, plain_server):
    """stockade.run(approve=...): asked about a loopback destination, approved, and refused
    all the same by the address checks (no approval lifts them)."""
    workspace, _ = ws
    asked: list[Ask] = []
    policy = dataclasses.replace(policy_for("read-only"), network=NetworkPolicy(
        "allowlist", ("example.com",)))
    r = stockade.run([PYTHON, "-c", FETCH, f"http://127.0.0.1:{plain_server.port}/"], policy,
                     workspace=workspace, approve=lambda ask: asked.append(ask) or ALLOW_RUN)
    assert r.stdout.split() == [b"403"] and plain_server.seen == []
    assert asked == [Ask("127.0.0.1", plain_server.port, "not_allowed")]
    assert [e["reason"] for e in r.network_log] == ["address_loopback"]


def test_approve_needs_the_allowlist(ws):
    workspace, _ = ws
    with pytest.raises(UsageError, match="allowlist"):
        stockade.run(["true"], preset="read-only", workspace=workspace,
                     approve=lambda ask: DENY)


def _at_a_terminal(args: list[str], answer: bytes, cwd, ahead: bytes = b""
                   ) -> tuple[subprocess.CompletedProcess, bytes]:
    """`python -m stockade ARGS` in a session of its own whose controlling terminal is a new
    pty; `ahead` typed at once, `answer` once the question shows (`{host}` in it: the host and
    port the question names). Returns the run and what the terminal showed."""
    master, slave = pty.openpty()

    def take_the_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
           "STOCKADE_SERVER_IDLE": "0"}
    process = subprocess.Popen([sys.executable, "-m", "stockade", *args], stdin=slave,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                               start_new_session=True, preexec_fn=take_the_terminal)
    os.close(slave)
    os.write(master, ahead)
    shown = b""
    try:
        deadline = time.monotonic() + 60
        while not re.search(rb"\(\d+s\):? $", shown) and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                shown += os.read(master, 4096)
        host = re.search(rb"reach (\S+), which", shown)
        os.write(master, answer.replace(b"{host}", host[1] if host else b"?"))
        out, err = process.communicate(timeout=60)
        if select.select([master], [], [], 1)[0]:
            shown += os.read(master, 4096)  # (the decision said after the answer)
    finally:
        process.kill()
        os.close(master)
    return subprocess.CompletedProcess(args, process.returncode, out, err), shown


@pytest.mark.parametrize(("ahead", "answer", "reason"), [
    (b"", b"r {host}\n", "address_loopback"), (b"", b"n {host}\n", "not_allowed"),
    (b"", b"r\n", "not_allowed"), (b"", b"r pypi.org:443\n", "not_allowed"),
    (b"n\n", b"r {host}\n", "address_loopback")],
    ids=["run", "no", "without-host", "another-host", "typed-ahead"])
def test_stockade_run_ask_asks_at_the_terminal_not_the_commands_stdio(ws, plain_server,
                                                                      tmp_path, ahead, answer,
                                                                      reason):
    """`stockade run --ask`: the question shows on the terminal (never in the command's
    output), names the destination, takes the answer typed there naming the host and port
    asked (a choice without them, or naming another host, as a person would type who read what
    the command wrote over the real host's cells, is a denial (A4); what was typed before the
    question is discarded); the command's colours are reset before the question and the
    decision is said after it; approved, a loopback address is refused all the same."""
    workspace, _ = ws
    log = tmp_path / "network.jsonl"
    done, shown = _at_a_terminal(
        ["run", "--allow-domain", "example.com", "--ask", "--network-log", str(log),
         "--workspace", str(workspace), "--", PYTHON, "-c", FETCH,
         f"http://127.0.0.1:{plain_server.port}/"], answer, workspace, ahead)
    asked = f"127.0.0.1:{plain_server.port}"
    assert f"\x1b[0m\r\nstockade: the command asks to reach {asked}, which network.allow leaves "\
        "out".encode() in shown
    said = "approved for the run" if reason == "address_loopback" else "denied"
    assert f"\x1b[0mstockade: {asked} {said}\r\n".encode() in shown, shown
    assert done.stdout.split() == [b"403"], done.stderr
    assert b"asks to reach" not in done.stdout + done.stderr
    assert plain_server.seen == []
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["reason"] == reason


def test_a_warm_sandbox_asks_for_each_of_its_commands(ws, plain_server):
    workspace, _ = ws
    asked: list[Ask] = []
    policy = dataclasses.replace(policy_for("read-only"), network=NetworkPolicy(
        "allowlist", ("example.com",)))
    fetch = [PYTHON, "-c", FETCH, f"http://127.0.0.1:{plain_server.port}/"]
    with stockade.Sandbox(policy, workspace=workspace,
                          approve=lambda ask: asked.append(ask) or ALLOW_ONCE) as sandbox:
        results = [sandbox.run(fetch) for _ in range(2)]
    assert [r.stdout.split() for r in results] == [[b"403"], [b"403"]]
    assert asked == [Ask("127.0.0.1", plain_server.port, "not_allowed")] * 2
    assert [[e["reason"] for e in r.network_log] for r in results] == [["address_loopback"]] * 2
    assert plain_server.seen == []
    with pytest.raises(UsageError, match="allowlist"):
        stockade.Sandbox(preset="read-only", workspace=workspace, approve=lambda ask: DENY)


def test_an_async_approver_answers_on_the_callers_loop(ws, plain_server):
    import asyncio

    workspace, _ = ws
    asked: list[tuple[Ask, asyncio.AbstractEventLoop]] = []
    policy = dataclasses.replace(policy_for("read-only"), network=NetworkPolicy(
        "allowlist", ("example.com",)))
    fetch = [PYTHON, "-c", FETCH, f"http://127.0.0.1:{plain_server.port}/"]

    async def approve(ask: Ask) -> str:
        await asyncio.sleep(0.01)
        asked.append((ask, asyncio.get_running_loop()))
        return ALLOW_ONCE

    async def main() -> tuple[stockade.Result, stockade.Result]:
        one = await stockade.arun(fetch, policy, workspace=workspace, approve=approve)
        async with stockade.AsyncSandbox(policy, workspace=workspace,
                                         approve=approve) as sandbox:
            two = await sandbox.run(fetch)
        return one, two

    loop = asyncio.new_event_loop()
    try:
        results = loop.run_until_complete(main())
    finally:
        loop.close()
    assert [r.stdout.split() for r in results] == [[b"403"], [b"403"]]
    assert [(ask.host, running is loop) for ask, running in asked] == [("127.0.0.1", True)] * 2


def test_unanswered_questions_are_bounded():
    """A3: a person who does not answer and a command that keeps asking: past MAX_PENDING
    questions waiting at once, a new one is denied without a thread to wait in."""
    gate = threading.Event()
    calls = []

    def away(ask: Ask) -> str:
        calls.append(ask.host)
        gate.wait(30)
        return DENY

    approval = Approval(away, timeout=0.01)
    before = threading.active_count()
    try:
        assert {approval.answer(Ask(f"h{i}.test", 443, "not_allowed"))
                for i in range(300)} == {DENY}
        assert threading.active_count() - before <= MAX_PENDING
    finally:
        gate.set()
    assert calls == ["h0.test"]  # (the others were denied before their turn came)


def test_a_question_whose_connection_was_denied_is_not_asked_late():
    """A2: questions that waited their turn past the timeout (their connections denied) are
    not put to the person afterwards, where an answer for the run would stick."""
    asked = []

    def slow(ask: Ask) -> str:
        asked.append(ask.host)
        time.sleep(0.6)
        return ALLOW_RUN

    approval = Approval(slow, timeout=0.2)
    threads = [threading.Thread(target=approval.answer, args=(Ask(h, 443, "not_allowed"),))
               for h in ("a.test", "b.test", "c.test")]
    for thread in threads:
        thread.start()
        time.sleep(0.02)  # (a.test first)
    for thread in threads:
        thread.join()
    time.sleep(1.5)
    assert asked == ["a.test"]


def test_a_workspace_asks_each_calls_own_approver_for_that_call_only(ws, plain_server):
    """Workspace(approvals=True), as `stockade mcp --ask` uses it: the approve function a
    call brings is asked while that call's command runs; what it allows for the run lasts for
    that call, not for the next call in the same warm sandbox; a call that brings none is
    denied unasked; an approval lifts no address check (a loopback port the allow list does
    not name literally stays refused)."""
    from stockade.integrations.workspace import Workspace

    workspace, _ = ws
    policy = dataclasses.replace(policy_for("read-only"), network=NetworkPolicy(
        "allowlist", (f"127.0.0.1:{plain_server.port}",)))
    url, guarded = f"http://localhost:{plain_server.port}/w", "http://127.0.0.1:9/"
    asked: list[tuple[int, Ask]] = []

    def answering(call: int, answer: str):
        return lambda ask: asked.append((call, ask)) or answer

    with Workspace(policy, workspace=workspace, approvals=True, approve_timeout=5) as shared:
        first = shared.exec([PYTHON, "-c", FETCH, url, url, guarded],
                            approve=answering(1, ALLOW_RUN))
        second = shared.exec([PYTHON, "-c", FETCH, url], approve=answering(2, DENY))
        third = shared.exec([PYTHON, "-c", FETCH, url])
        assert len(shared._started) == 1  # (one warm sandbox served all three)
    assert first.stdout.split() == ["200", "200", "403"], first
    assert second.stdout.split() == ["403"] and third.stdout.split() == ["403"]
    assert asked == [(1, Ask("localhost", plain_server.port, "not_allowed")),
                     (1, Ask("127.0.0.1", 9, "port_not_allowed")),
                     (2, Ask("localhost", plain_server.port, "not_allowed"))]
    assert [s.path for s in plain_server.seen] == ["/w", "/w"]
    assert [d.grant for d in first.denials] == ["network.allow 127.0.0.1:9"]


def test_workspace_approvals_need_the_allowlist_and_are_asked_for(ws):
    from stockade.integrations.workspace import Workspace

    workspace, _ = ws
    with pytest.raises(UsageError, match="allowlist"):
        Workspace(policy_for("read-only"), workspace=workspace, approvals=True)
    with Workspace(policy_for("read-only"), workspace=workspace) as plain, \
            pytest.raises(UsageError, match="approvals=True"):
        plain.exec(["true"], approve=lambda ask: DENY)


def test_workspace_approvals_are_not_had_with_keep_detached(ws):
    """Issue 34, W1: a process a call detached would ask during a later call, whose approver
    the proxy cannot tell it from: the combination is refused, naming both knobs."""
    from stockade.integrations.workspace import Workspace

    workspace, _ = ws
    policy = dataclasses.replace(policy_for("read-only"), network=NetworkPolicy(
        "allowlist", ("example.com",)))
    with pytest.raises(UsageError, match="keep_detached"):
        Workspace(policy, workspace=workspace, approvals=True, keep_detached=True)


# Two requests through the proxy, the second queued behind the first's question; the
# command exits while both wait (everything it started dies with it).
QUEUED = textwrap.dedent("""
    import os, socket, sys, threading, time
    port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
    def send(raw):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(raw)
        time.sleep(30)
    threading.Thread(target=send, daemon=True,
                     args=(b"CONNECT first.example:443 HTTP/1.1\\r\\n\\r\\n",)).start()
    time.sleep(0.3)
    threading.Thread(target=send, daemon=True, args=(
        f"GET http://localhost:{sys.argv[1]}/exfil HTTP/1.1\\r\\n\\r\\n".encode(),)).start()
    time.sleep(0.5)
""")


def test_what_a_call_left_waiting_is_denied_not_put_to_the_next_call(ws, plain_server):
    """Issue 34, W2/W2b/W3: call 1's command raises two questions (the second waits behind
    the first, which its approver is slow on) and exits; call 2, in the same warm sandbox,
    approves whatever it is asked. Call 1's questions are denied when it ends: call 2's
    approver is never asked, the dead command's request never reaches the host, and call 2's
    result names none of call 1's denials."""
    from stockade.integrations.workspace import Workspace

    workspace, _ = ws
    policy = dataclasses.replace(policy_for("read-only"), network=NetworkPolicy(
        "allowlist", (f"127.0.0.1:{plain_server.port}",)))
    asked: list[tuple[int, str]] = []

    def slow_first(ask: Ask) -> str:
        asked.append((1, ask.host))
        time.sleep(4)
        return DENY

    with Workspace(policy, workspace=workspace, approvals=True, approve_timeout=3) as shared:
        first = shared.exec([PYTHON, "-c", QUEUED, str(plain_server.port)], approve=slow_first)
        second = shared.exec(["sleep", "5"],
                             approve=lambda ask: asked.append((2, ask.host)) or ALLOW_ONCE)
        assert len(shared._started) == 1  # (call 2 had call 1's sandbox)
    assert first.exit_code == 0, first
    assert asked == [(1, "first.example")]
    assert plain_server.seen == []
    assert second.exit_code == 0 and second.denials == (), second.denials
