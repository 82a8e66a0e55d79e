"""`stockade mcp` end to end: two clients nobody here wrote, the official SDK's own and the MCP
Inspector's CLI (npm), talk to the server over stdio and over streamable HTTP on loopback, and
every tool call runs in the real sandbox. Hostile
calls (a shell string without `shell`, a path outside, a link the command planted, a protected
file) come back as typed tool errors, and nothing changes on the host. Every server starts in its
workspace, never in the checkout: `python -m` and `-c` put the working directory first on the
module path, and the checkout's `stockade` is not the installed one the tests are of."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types
import pytest
from cancelling import NEXT_WITHIN, arunning, check_gone, check_next_call, running, tree
from conftest import FETCH, PYTHON
from mcp import Client
from mcp.client.stdio import StdioServerParameters

import stockade

pytestmark = pytest.mark.usefixtures("linux")

TOOLS = {"run", "read_file", "write_file", "list_dir", "session_start", "session_exec",
         "session_stop"}


# `stockade mcp` whose Workspace runs one sandbox at a time (the cancellation tests)
ONE_SLOT = ("import sys; from stockade.integrations import workspace; "
            "workspace.MAX_SANDBOXES = 1; from stockade.cli import main; "
            "sys.exit(main(sys.argv[1:]))")


def server(workspace, *flags: str, one_slot: bool = False) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[
        *(["-c", ONE_SLOT] if one_slot else ["-m", "stockade"]), "mcp", "--workspace",
        str(workspace), *flags], cwd=str(workspace), env=server_env())


def server_env() -> dict[str, str]:
    return {"HOME": os.environ.get("HOME", "/"), "PATH": os.environ["PATH"],
            "STOCKADE_STATE_DIR": os.environ["STOCKADE_STATE_DIR"]}


def calls(parameters, *steps: tuple[str, dict]) -> list:
    """Call each (tool, arguments) in one session of a client; the results in order."""
    async def session() -> list:
        async with Client(parameters) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            assert listed == TOOLS
            return [await client.call_tool(name, arguments) for name, arguments in steps]
    return asyncio.run(session())


def test_commands_and_files_round_trip(ws):
    root, _ = ws
    ran, refused, shelled, wrote, read, listed = calls(
        server(root, "--preset", "workspace-write"),
        ("run", {"argv": ["sh", "-c", "echo hi; pwd; echo err >&2"]}),
        ("run", {"argv": "echo $0"}),
        ("run", {"argv": "echo from a shell; exit 4", "shell": True, "stdin": "x"}),
        ("write_file", {"path": "notes/a.txt", "content": "one\n"}),
        ("read_file", {"path": "notes/a.txt"}),
        ("list_dir", {"path": "notes"}))
    assert not ran.is_error
    assert ran.structured_content | {"denials": []} == {
        "exit_code": 0, "stdout": f"hi\n{root}\n", "stderr": "err\n", "truncated": False,
        "timed_out": False, "denials": []}
    assert refused.is_error and refused.structured_content["error"] == "usage"
    assert shelled.structured_content["exit_code"] == 4
    assert shelled.structured_content["stdout"] == "from a shell\n"
    assert not wrote.is_error and (root / "notes" / "a.txt").read_text() == "one\n"
    assert read.structured_content["content"] == "one\n"
    assert listed.structured_content["entries"] == [{"name": "a.txt", "kind": "file",
                                                    "size": 4}]


def test_hostile_paths_are_typed_errors_and_change_nothing(ws):
    root, outside = ws
    (outside / "secret").write_text("outside\n")
    os.mkdir(root / ".git")
    (root / ".git" / "config").write_text("[core]\n")
    planted, through_link, outside_path, protected, missing = calls(
        server(root, "--preset", "workspace-write"),
        ("run", {"argv": ["ln", "-s", str(outside), "link"]}),
        ("write_file", {"path": "link/secret", "content": "changed"}),
        ("write_file", {"path": str(outside / "secret"), "content": "changed"}),
        ("write_file", {"path": ".git/config", "content": "[core]\n\thooksPath = /tmp\n"}),
        ("run", {"argv": ["no-such-tool"]}))
    assert planted.structured_content["exit_code"] == 0
    assert through_link.structured_content["error"] == "symlink_refused"
    assert outside_path.structured_content["error"] == "outside_workspace"
    assert protected.is_error
    assert protected.structured_content["error"] == "permission_denied"
    assert protected.structured_content["grant"] == f"filesystem.write {root}/.git/config"
    assert missing.structured_content["exit_code"] == 127
    assert (outside / "secret").read_text() == "outside\n"
    assert os.listdir(outside) == ["secret"]
    assert (root / ".git" / "config").read_text() == "[core]\n"


def test_a_call_cannot_lengthen_the_policys_timeout(ws, tmp_path):
    root, _ = ws
    policy = tmp_path / "short.toml"
    policy.write_text('version = 1\npreset = "workspace-write"\n[limits]\ntimeout = "1s"\n')
    began = time.monotonic()
    [slow] = calls(server(root, "--policy", str(policy)),
                   ("run", {"argv": ["sleep", "30"], "timeout": 600}))
    assert time.monotonic() - began < 20
    assert slow.structured_content["exit_code"] == 124
    assert slow.structured_content["timed_out"] is True
    assert slow.structured_content["denials"] == [
        {"kind": "limits.timeout", "detail": "killed after 1s", "grant": "limits.timeout",
         "network": None}]  # (a network denial's proxy record; none for a limit)


LIMITED = """version = 1
preset = "workspace-write"
[limits]
timeout = "1s"
output = "1KiB"
[network]
mode = "allowlist"
allow = ["allowed.example"]
"""


def test_what_the_sandbox_stopped_is_said_in_the_tool_result(ws, tmp_path):
    """The text a model reads says what the sandbox stopped or cut, and the policy grant that
    would allow it: the policy's time limit, output cut at limits.output, a network denial."""
    root, _ = ws
    policy = tmp_path / "limited.toml"
    policy.write_text(LIMITED)
    slow, cut, denied = (result.content[0].text for result in calls(
        server(root, "--policy", str(policy)),
        ("run", {"argv": ["sleep", "30"]}),
        ("run", {"argv": "head -c 5000 /dev/zero | tr '\\0' a", "shell": True}),
        ("run", {"argv": ["python3", "-c", FETCH, "http://denied.example/"]})))
    assert slow.endswith("\nstockade: the command was killed after 1s, the sandbox's time "
                         "limit; the policy grant that would allow it: limits.timeout"), slow
    assert cut.endswith("a\nstockade: stdout cut at 1024 bytes, the sandbox's output limit: "
                        "the rest of it was dropped; the policy grant that would allow it: "
                        "limits.output"), cut[-300:]
    assert denied == ("exit code 0\n403\n\nstockade: the sandbox's network proxy refused http "
                      "denied.example:80: not_allowed: the host is not in network.allow; the "
                      "policy grant that would allow it: network.allow denied.example:80"), denied


def test_warm_sessions(ws):
    root, _ = ws

    async def session() -> None:
        async with Client(server(root, "--preset", "workspace-write")) as client:
            started = await client.call_tool("session_start", {})
            name = started.structured_content["session"]
            first = await client.call_tool("session_exec", {
                "session": name, "argv": "echo $$ > pid; echo ok", "shell": True})
            assert first.structured_content["stdout"] == "ok\n"
            again = await client.call_tool("session_exec", {"session": name,
                                                            "argv": ["cat", "pid"]})
            assert again.structured_content["exit_code"] == 0
            stopped = await client.call_tool("session_stop", {"session": name})
            assert stopped.structured_content == {"session": name, "stopped": True}
            gone = await client.call_tool("session_exec", {"session": name, "argv": ["true"]})
            assert gone.is_error and gone.structured_content["error"] == "usage"
    asyncio.run(session())


@contextlib.contextmanager
def http_server(root, one_slot: bool = False) -> Iterator[int]:
    """`stockade mcp --http PORT` over `root`, listening: its PORT."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = subprocess.Popen([sys.executable, *(["-c", ONE_SLOT] if one_slot else
                                                 ["-m", "stockade"]), "mcp", "--preset",
                               "workspace-write", "--workspace", str(root), "--http", str(port)],
                              cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert served.poll() is None, served.stderr.read().decode()
            assert time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.2)
        yield port
    finally:
        served.terminate()
        served.wait(timeout=30)


def test_streamable_http_on_loopback(ws):
    root, _ = ws
    with http_server(root) as port:
        async def session() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                ran = await client.call_tool("run", {"argv": ["echo", "over http"]})
                assert ran.structured_content["stdout"] == "over http\n"
                # the server is a helper of Stockade's: a command it runs cannot reach it
                reach = await client.call_tool("run", {"argv": [
                    PYTHON, "-c", "import socket, sys; socket.create_connection(('127.0.0.1', "
                    "int(sys.argv[1])), timeout=5)", str(port)]})
                assert reach.structured_content["exit_code"] == 1
                stderr = reach.structured_content["stderr"]
                assert any(f"Error: [Errno {code}]" in stderr for code in (
                    errno.EACCES, errno.ENETUNREACH, errno.ECONNREFUSED)), stderr
        asyncio.run(session())


@pytest.mark.parametrize("tool", ["run", "session_exec"])
def test_a_call_the_client_cancels_kills_its_command(ws, tool):
    """The SDK's client cancels a call (an anyio scope around it: it sends
    notifications/cancelled): the command's tree is gone and its slot free."""
    root, _ = ws
    command, marker = tree()

    async def session() -> None:
        async with Client(server(root, "--preset", "workspace-write", one_slot=True)) as client:
            where = {}
            if tool == "session_exec":
                started = await client.call_tool("session_start", {})
                where = {"session": started.structured_content["session"]}
            async with anyio.create_task_group() as group:
                group.start_soon(client.call_tool, tool, {**where, "argv": command,
                                                          "shell": True})
                await arunning(marker)
                group.cancel_scope.cancel()
                cancelled_at = time.monotonic()
            await asyncio.to_thread(check_gone, marker, cancelled_at)
            with anyio.fail_after(NEXT_WITHIN):
                after = await client.call_tool(tool, {**where, "argv": ["true"]})
            assert after.structured_content["exit_code"] == 0
    asyncio.run(session())


# A client of its own process, killed mid-call: no notifications/cancelled, only its end.
GONE_CLIENT = """
import asyncio, sys
from mcp import Client
from mcp.client.stdio import StdioServerParameters
target, command = sys.argv[1], sys.argv[2]
if not target.startswith("http"):
    target = StdioServerParameters(**__import__("json").loads(target))

async def call():
    async with Client(target) as client:
        await client.call_tool("run", {"argv": command, "shell": True})
asyncio.run(call())
"""


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_client_gone_mid_call_kills_its_command(ws, transport):
    """A client that disconnects (its process killed) mid-call: the command's tree is gone,
    and over HTTP, where the server stays, the next client's call runs at once."""
    root, _ = ws
    command, marker = tree()
    with contextlib.ExitStack() as stack:
        if transport == "http":
            port = stack.enter_context(http_server(root, one_slot=True))
            target = f"http://127.0.0.1:{port}/mcp"
        else:
            target = server(root, "--preset", "workspace-write").model_dump_json()
        client = subprocess.Popen([sys.executable, "-c", GONE_CLIENT, target, command],
                                  cwd=root, stderr=subprocess.DEVNULL)
        try:
            running(marker)
        finally:
            client.kill()
            client.wait()
        check_gone(marker, time.monotonic())
        if transport == "http":
            check_next_call(lambda: asyncio.run(next_call(target)))


async def next_call(target: str) -> None:
    async with Client(target) as client:
        after = await client.call_tool("run", {"argv": ["true"]})
        assert after.structured_content["exit_code"] == 0


# The MCP Inspector's CLI (npm; scripts/test.sh installs it beside the integrations' venv): a
# client nobody here wrote, on the TypeScript SDK.
INSPECTOR = os.path.join(os.path.dirname(sys.prefix), ".mcp-inspector", "node_modules", ".bin",
                         "mcp-inspector")


def inspector(target: list[str], *arguments: str, cwd) -> dict:
    """The Inspector CLI's answer (JSON) to one method on `target` (a server's command line,
    started in `cwd` with this run's state directory, or a URL)."""
    assert os.access(INSPECTOR, os.X_OK), f"{INSPECTOR}: not installed (scripts/test.sh does)"
    done = subprocess.run([INSPECTOR, "--cli", "-e",
                           f"STOCKADE_STATE_DIR={os.environ['STOCKADE_STATE_DIR']}", *target,
                           *arguments], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_mcp_inspector_cli_lists_and_calls_the_tools(ws, transport):
    """Over stdio and streamable HTTP, the Inspector lists the tools and runs a shell command
    in the sandbox: its write in the workspace lands, its writes outside and reads of a file
    outside are refused, and nothing changes outside."""
    root, outside = ws
    (outside / "secret").write_text("outside\n")
    with contextlib.ExitStack() as stack:
        if transport == "http":
            target = [f"http://127.0.0.1:{stack.enter_context(http_server(root))}/mcp"]
        else:
            target = [sys.executable, "-m", "stockade", "mcp", "--preset", "workspace-write",
                      "--workspace", str(root)]
        listed = inspector(target, "--method", "tools/list", cwd=root)
        ran = inspector(target, "--method", "tools/call", "--tool-name", "run", "--tool-arg",
                        f"argv=echo $((6*7)) > six.txt; cat six.txt; echo x > {outside}/new",
                        "--tool-arg", "shell=true", cwd=root)
        refused = inspector(target, "--method", "tools/call", "--tool-name", "read_file",
                            "--tool-arg", f"path={outside}/secret", cwd=root)
    assert {tool["name"] for tool in listed["tools"]} == TOOLS
    assert ran["structuredContent"]["stdout"] == "42\n"
    assert ran["structuredContent"]["exit_code"] != 0, ran
    assert (root / "six.txt").read_text() == "42\n"
    assert refused["isError"] and refused["structuredContent"]["error"] == "outside_workspace"
    assert os.listdir(outside) == ["secret"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_server_loads_the_installed_stockade_not_the_callers(ws, tmp_path, monkeypatch,
                                                                 transport):
    """A `stockade` package in the test's own working directory (a checkout's, say) is not
    what a server loads: it starts in its workspace, and runs the installed one."""
    root, _ = ws
    decoy = tmp_path / "checkout" / "stockade"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the caller\\'s stockade')\n")
    (decoy / "__main__.py").write_text("raise SystemExit('the caller\\'s stockade')\n")
    monkeypatch.chdir(decoy.parent)
    with contextlib.ExitStack() as stack:
        if transport == "http":
            target = f"http://127.0.0.1:{stack.enter_context(http_server(root))}/mcp"
        else:
            target = server(root, "--preset", "workspace-write")
        asyncio.run(next_call(target))  # (the caller's would fail it: an ImportError)


def test_the_http_transport_binds_to_loopback_only(ws):
    root, _ = ws
    done = subprocess.run([sys.executable, "-m", "stockade", "mcp", "--workspace", str(root),
                           "--http", "8765", "--host", "0.0.0.0"], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("stockade: usage: --host 0.0.0.0: the HTTP transport binds "
                                  "to loopback only"), done.stderr


def test_without_the_sdk_a_typed_error_names_the_extra(ws):
    root, _ = ws
    blocked = ("import sys; sys.modules['mcp'] = None; from stockade.cli import main; "
               "sys.exit(main(['mcp', '--workspace', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-c", blocked, str(root)], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 70
    assert done.stderr == ("stockade: extra_missing: the MCP server needs the `mcp` package: "
                           "pip install 'stockade[mcp]'\n")


# --- `stockade mcp --ask`: the client asked through MCP elicitation ---------------------------

def asking_server(root, tmp_path, port: int, ask_seconds: float = 30) -> StdioServerParameters:
    """`stockade mcp --ask` over an allowlist naming only 127.0.0.1:PORT (literally, so that
    a name resolving there may be approved), its questions bounded by `ask_seconds`."""
    policy = tmp_path / "ask.toml"
    policy.write_text(f'version = 1\npreset = "workspace-write"\n[network]\n'
                      f'mode = "allowlist"\nallow = ["127.0.0.1:{port}"]\n')
    prelude = (f"import sys; from stockade.cli import run; run.ASK_SECONDS = {ask_seconds}; "
               "from stockade.cli import main; sys.exit(main(sys.argv[1:]))")
    # (the stockade these tests import, installed, or a mutant's copy: tests/mutants.py)
    imported = str(Path(stockade.__file__).resolve().parent.parent)
    return StdioServerParameters(command=sys.executable, args=[
        "-c", prelude, "mcp", "--ask", "--policy", str(policy), "--workspace", str(root)],
        cwd=str(root), env={**server_env(), "PYTHONPATH": imported})


def answering(*answers: tuple):
    """An elicitation callback giving each question the next answer: ("accept", CHOICE),
    ("decline",), or ("late", SECONDS): "run", after that long. Returns it and the questions."""
    asked: list[str] = []

    async def callback(context, params) -> mcp_types.ElicitResult:
        asked.append(params.message)
        kind, *rest = answers[len(asked) - 1]
        if kind == "late":
            await anyio.sleep(rest[0])
            return mcp_types.ElicitResult(action="accept", content={"choice": "run"})
        if kind == "accept":
            return mcp_types.ElicitResult(action="accept", content={"choice": rest[0]})
        return mcp_types.ElicitResult(action=kind)
    return callback, asked


def asked_calls(parameters, callback, *urls: list[str], mode: str = "legacy") -> list:
    """A `run` of FETCH over each list of URLs, one client session; the results."""
    async def session() -> list:
        async with Client(parameters, elicitation_callback=callback, mode=mode) as client:
            return [await client.call_tool("run", {"argv": ["python3", "-c", FETCH, *u]})
                    for u in urls]
    return asyncio.run(session())


def statuses(result) -> list[str]:
    return result.structured_content["stdout"].split()


def test_the_client_is_asked_and_its_answer_is_the_approval(ws, tmp_path, plain_server):
    """Each destination network.allow leaves out is put to the client (once, for the run,
    deny, declined): "once" allows one connection, "run" the rest of that call's command,
    and an approval lifts no address check (127.0.0.1 on a port not allowed literally)."""
    root, _ = ws
    port = plain_server.port
    named, guarded = f"http://localhost:{port}/a", "http://127.0.0.1:9/"
    callback, asked = answering(("accept", "once"), ("accept", "once"), ("accept", "run"),
                                ("accept", "run"), ("accept", "deny"), ("decline",))
    once, run, denied, declined = asked_calls(
        asking_server(root, tmp_path, port), callback, [named, named, guarded],
        [named, named, named], [named], [named])
    assert statuses(once) == ["200", "200", "403"], once
    assert statuses(run) == ["200", "200", "200"], run
    assert statuses(denied) == statuses(declined) == ["403"]
    assert [seen.path for seen in plain_server.seen] == ["/a"] * 5
    assert len(asked) == 6
    assert f"asks to reach localhost:{port}, which the policy's network.allow leaves out " \
           "(not_allowed)" in asked[0]
    assert "127.0.0.1:9" in asked[2]
    assert [d["grant"] for d in once.structured_content["denials"]] == [
        "network.allow 127.0.0.1:9"]
    assert declined.content[0].text.endswith(
        f"stockade: the sandbox's network proxy refused http localhost:{port}: not_allowed: the "
        "host is not in network.allow; the policy grant that would allow it: network.allow "
        f"localhost:{port}"), declined.content[0].text
    assert "not_asked" not in declined.structured_content


def test_no_answer_in_time_is_a_denial(ws, tmp_path, plain_server):
    """The client answers "run" only after the bound (2s here): the connection was denied at
    the bound, and the late answer allows nothing."""
    root, _ = ws
    port = plain_server.port
    callback, asked = answering(("late", 6))
    began = time.monotonic()
    [late] = asked_calls(asking_server(root, tmp_path, port, ask_seconds=2), callback,
                         [f"http://localhost:{port}/late"])
    assert statuses(late) == ["403"] and plain_server.seen == []
    assert len(asked) == 1 and time.monotonic() - began < 60


@pytest.mark.parametrize(("mode", "elicits", "why"), [
    ("legacy", False, "this client does not support MCP elicitation"),
    ("auto", True, "this client's connection cannot carry a server's request")],
    ids=["no-elicitation", "stateless-protocol"])
def test_a_client_that_cannot_be_asked_is_denied_and_told_why(ws, tmp_path, plain_server,
                                                              mode, elicits, why):
    root, _ = ws
    callback, asked = answering(("accept", "run"))
    port = plain_server.port
    [unasked] = asked_calls(asking_server(root, tmp_path, port),
                            callback if elicits else None,
                            [f"http://localhost:{port}/x"], mode=mode)
    assert statuses(unasked) == ["403"] and plain_server.seen == [] and asked == []
    [said] = unasked.structured_content["not_asked"]
    assert said == {"host": "localhost", "port": port, "why": said["why"],
                    "grant": f"network.allow localhost:{port}"}
    assert said["why"].startswith(why), said
    assert unasked.content[0].text.endswith(
        f"stockade: not asked about localhost:{port}: {said['why']} (stockade mcp --ask); the "
        f"policy grant that would allow it: network.allow localhost:{port}")


def test_ask_needs_the_allowlist(ws):
    root, _ = ws
    done = subprocess.run([sys.executable, "-m", "stockade", "mcp", "--ask", "--preset",
                           "workspace-write", "--workspace", str(root)], cwd=root,
                          env=server_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "allowlist" in done.stderr, done.stderr
