"""pydantic-ai on Stockade: its own conformance suite for workspace backends
(`pydantic_ai.workspaces.conformance`) against StockadeWorkspaceBackend, and a real Agent, driven
by pydantic-ai's FunctionModel, whose tool calls run in the real sandbox."""

from __future__ import annotations

import dataclasses
import os
import shutil

import anyio
import pytest
from cancelling import check_cancelled, check_next_call, one_slot, tree
from conftest import policy_for
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.workspaces import LocalWorkspaceBackend, WorkspaceError
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite

from stockade.errors import PolicyError
from stockade.integrations.pydantic_ai import StockadeWorkspace, StockadeWorkspaceBackend

pytestmark = pytest.mark.usefixtures("linux")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class TestStockadeWorkspaceConformance(WorkspaceBackendSuite):
    """The suite, with its optional rules on (not `fresh_backend`: like pydantic-ai's local
    backend, a directory is its environment, so the ref exists before the first operation)."""

    @pytest.fixture
    def backends(self):
        made = []
        yield made
        for backend in made:
            backend.close()

    @pytest.fixture
    def backend(self, tmp_path, backends):
        backends.append(StockadeWorkspaceBackend(tmp_path, policy_for("workspace-write")))
        return backends[-1]

    @pytest.fixture
    def attach_backend(self, backends):
        def attach(ref):
            backends.append(StockadeWorkspaceBackend(ref.id, policy_for("workspace-write")))
            return backends[-1]
        return attach

    @pytest.fixture
    def destructive_backend(self, tmp_path_factory, backends):
        def make():
            root = tmp_path_factory.mktemp("destroyed")
            backends.append(StockadeWorkspaceBackend(root, policy_for("workspace-write")))
            return backends[-1]
        return make

    @pytest.fixture
    def destroy_environment(self):
        async def destroy(backend):
            shutil.rmtree(backend.root)
        return destroy


# The reference's PATH, less what this user cannot search (a rootless run started by root
# inherits root's, and a missing program is then EACCES, 126, on the host)
SEARCHABLE = {"PATH": ":".join(directory for directory in os.environ["PATH"].split(":")
                               if os.access(directory, os.X_OK))}


class TestLocalWorkspaceReference(WorkspaceBackendSuite):
    """The reference: the same suite, its optional rules on the same way, against pydantic-ai's
    own LocalWorkspaceBackend (unsandboxed): its skips are Stockade's."""

    @pytest.fixture
    def backend(self, tmp_path):
        return LocalWorkspaceBackend(tmp_path, env=SEARCHABLE)

    @pytest.fixture
    def attach_backend(self):
        return lambda ref: LocalWorkspaceBackend(ref.id, env=SEARCHABLE)

    @pytest.fixture
    def destructive_backend(self, tmp_path_factory):
        return lambda: LocalWorkspaceBackend(tmp_path_factory.mktemp("destroyed"),
                                             env=SEARCHABLE)

    @pytest.fixture
    def destroy_environment(self):
        async def destroy(backend):
            shutil.rmtree(await backend.working_dir())
        return destroy


def test_an_agents_tool_calls_run_in_the_sandbox(ws):
    """A real Agent with the StockadeWorkspace capability; pydantic-ai's FunctionModel plays the
    model, calling the tools in turn, and every workspace operation runs in the sandbox."""
    root, outside = ws
    (outside / "secret").write_text("outside\n")
    os.mkdir(root / ".git")
    (root / ".git" / "config").write_text("[core]\n")
    calls = [("execute", {"command": "echo made > made.txt; no-such-tool"}),
             ("write", {"path": ".git/config", "content": "[core]\n\tx = 1\n"}),
             ("write", {"path": str(outside / "new"), "content": "escaped\n"}),
             ("execute", {"command": f"cat {outside}/secret"})]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        made = sum(isinstance(m, ModelResponse) for m in messages)
        if made < len(calls):
            name, args = calls[made]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{made}")])
        return ModelResponse(parts=[TextPart("done")])

    capability = StockadeWorkspace(root, policy=policy_for("workspace-write"))
    agent = Agent(FunctionModel(model), capabilities=[capability])

    @agent.tool
    async def execute(ctx: RunContext[None], command: str) -> str:
        done = await ctx.workspace.run(command, shell=True)
        return f"{done.exit_code}: {done.stdout}{done.stderr}"

    @agent.tool
    async def write(ctx: RunContext[None], path: str, content: str) -> str:
        try:
            await ctx.workspace.write_text(path, content)
        except OSError as exc:
            return f"refused: {type(exc).__name__}"
        return "written"

    try:
        result = agent.run_sync("go")
    finally:
        capability.close()
    returns = {part.tool_call_id: part.content for message in result.all_messages()
               for part in getattr(message, "parts", ()) if isinstance(part, ToolReturnPart)}
    assert result.output == "done"
    assert returns["c0"].startswith("127: ") and (root / "made.txt").read_text() == "made\n"
    assert returns["c1"].startswith("refused"), returns
    assert not returns["c3"].startswith("0: "), returns  # outside is not even readable
    assert (root / ".git" / "config").read_text() == "[core]\n"
    # the write outside (c2) landed, at most, in the sandbox's own /tmp: never on the host
    assert sorted(os.listdir(outside)) == ["secret"]


# Fetches a URL through the policy's proxy (allowlist mode sets http_proxy): 403 when refused.
FETCH = ("import urllib.request, sys\n"
         "try: urllib.request.urlopen(sys.argv[1], timeout=10)\n"
         "except urllib.error.HTTPError as e: print(e.code)\n")


def test_what_the_sandbox_stopped_or_cut_reaches_the_model(ws):
    """A tool that returns a command's outcome, or the workspace error it raised, gives the
    model words for what the sandbox did, each with the policy grant that would allow it: the
    policy's time limit (WorkspaceTimeoutError), output cut (WorkspaceOutputLimitError), a
    proxy refusal (on stderr)."""
    root, _ = ws
    (root / "fetch.py").write_text(FETCH)
    commands = ["sleep 30", "head -c 5000 /dev/zero | tr '\\0' a",
                "python3 fetch.py http://denied.example/"]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        made = sum(isinstance(m, ModelResponse) for m in messages)
        if made < len(commands):
            return ModelResponse(parts=[ToolCallPart("execute", {"command": commands[made]},
                                                     tool_call_id=f"c{made}")])
        return ModelResponse(parts=[TextPart("done")])

    policy = policy_for("workspace-write", timeout=1.0, output=1024)
    policy = dataclasses.replace(policy, network=dataclasses.replace(
        policy.network, mode="allowlist", allow=("allowed.example",)))
    capability = StockadeWorkspace(root, policy=policy)
    agent = Agent(FunctionModel(model), capabilities=[capability])

    @agent.tool
    async def execute(ctx: RunContext[None], command: str) -> str:
        try:
            done = await ctx.workspace.run(command, shell=True)
        except WorkspaceError as exc:
            return f"{type(exc).__name__}: {exc}"
        return f"{done.exit_code}: {done.stdout}{done.stderr}"

    try:
        result = agent.run_sync("go")
    finally:
        capability.close()
    said = {part.tool_call_id: part.content for message in result.all_messages()
            for part in getattr(message, "parts", ()) if isinstance(part, ToolReturnPart)}
    assert said == {
        "c0": "WorkspaceTimeoutError: stockade: the command was killed after 1s, the sandbox's "
              "time limit; the policy grant that would allow it: limits.timeout",
        "c1": "WorkspaceOutputLimitError: stockade: stdout cut at 1024 bytes, the sandbox's "
              "output limit: the rest of it was dropped; the policy grant that would allow it: "
              "limits.output",
        "c2": "0: 403\nstockade: the sandbox's network proxy refused http denied.example:80: "
              "not_allowed: the host is not in network.allow; the policy grant that would "
              "allow it: network.allow denied.example:80\n"}


def test_cancelling_the_run_kills_its_command(ws, monkeypatch):
    """Cancelling the task running `Agent.run` while a tool's command runs: the command's
    tree is gone and the workspace's one slot free for the next command."""
    root, _ = ws
    one_slot(monkeypatch)
    command, marker = tree()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("execute", {"command": command},
                                                 tool_call_id="c0")])

    capability = StockadeWorkspace(root, policy=policy_for("workspace-write"))
    agent = Agent(FunctionModel(model), capabilities=[capability])

    @agent.tool
    async def execute(ctx: RunContext[None], command: str) -> str:
        return (await ctx.workspace.run(command, shell=True)).stdout

    try:
        check_cancelled(lambda: agent.run("go"), marker)
        check_next_call(lambda: capability._backend.workspace.exec(["true"]))
    finally:
        capability.close()


def run_tools(capability: StockadeWorkspace, *calls: tuple[str, dict]) -> dict[str, str]:
    """A real Agent with `capability`, its FunctionModel calling `calls` in turn: each tool
    call's return (a refusal's exception type and message), by call (c0, c1, ...)."""
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        made = sum(isinstance(m, ModelResponse) for m in messages)
        if made < len(calls):
            name, args = calls[made]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{made}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), capabilities=[capability])

    async def refused(step) -> str:  # noqa: ANN001 - an awaitable
        try:
            return str(await step)
        except WorkspaceError as exc:
            return f"refused: {type(exc).__name__}: {exc}"

    @agent.tool
    async def execute(ctx: RunContext[None], command: str) -> str:
        async def run() -> str:
            done = await ctx.workspace.run(command, shell=True)
            return f"{done.exit_code}: {done.stdout}{done.stderr}"
        return await refused(run())

    @agent.tool
    async def write(ctx: RunContext[None], path: str, content: str) -> str:
        return await refused(ctx.workspace.write_text(path, content))

    @agent.tool
    async def read(ctx: RunContext[None], path: str) -> str:
        return await refused(ctx.workspace.read_text(path))

    @agent.tool
    async def authority(ctx: RunContext[None], path: str) -> str:
        return await ctx.workspace.authority_of(path)

    try:
        result = agent.run_sync("go")
    finally:
        capability.close()
    return {part.tool_call_id: part.content for message in result.all_messages()
            for part in getattr(message, "parts", ()) if isinstance(part, ToolReturnPart)}


def test_read_only_refuses_changes_and_its_sandbox_writes_nothing(ws):
    """`read_only=True`, as LocalWorkspace's: reads work, commands and writes are refused by
    pydantic-ai's ReadOnlyWorkspace, and under it the sandbox has no write root: a real
    command the backend runs cannot write in the workspace (nothing appears on the host)."""
    root, _ = ws
    (root / "a.txt").write_text("kept\n")
    returns = run_tools(StockadeWorkspace(root, policy=policy_for("workspace-write"),
                                          read_only=True),
                        ("read", {"path": "a.txt"}),
                        ("write", {"path": "a.txt", "content": "changed\n"}),
                        ("execute", {"command": "echo x > made.txt"}))
    assert returns["c0"] == "kept\n"
    assert returns["c1"].startswith("refused: WorkspaceReadOnlyError"), returns
    assert returns["c2"].startswith("refused: WorkspaceReadOnlyError"), returns
    capability = StockadeWorkspace(root, policy=policy_for("workspace-write"), read_only=True)
    try:  # the backend under the wrapper: the sandbox itself refuses the write
        done = anyio.run(lambda: capability._backend.run("echo x > made.txt", shell=True))
    finally:
        capability.close()
    assert done.exit_code != 0 and "Read-only file system" in done.stderr, done
    assert sorted(os.listdir(root)) == ["a.txt"] and (root / "a.txt").read_text() == "kept\n"


def test_env_reaches_every_command_within_the_closed_environment(ws, monkeypatch):
    """`env` adds variables for every command to the policy's closed environment: nothing else
    of this process's environment reaches a command (its secret neither)."""
    root, _ = ws
    monkeypatch.setenv("HOST_SECRET", "do-not-pass")
    returns = run_tools(StockadeWorkspace(root, policy=policy_for("workspace-write"),
                                          env={"GREETING": "hello"}),
                        ("execute", {"command": "echo $GREETING ${HOST_SECRET-unset}"}))
    assert returns["c0"] == "0: hello unset\n", returns


def test_path_authority_lowers_levels_inside_the_workspace(ws):
    """`authority` and `path_authority` label files as LocalWorkspace's do (relative paths in
    the working directory, the longest match winning)."""
    root, _ = ws
    (root / "vendor").mkdir()
    (root / "vendor" / "x.py").write_text("x\n")
    (root / "own.py").write_text("y\n")
    returns = run_tools(StockadeWorkspace(root, policy=policy_for("workspace-write"),
                                          authority="user", path_authority={"vendor": "none"}),
                        ("authority", {"path": "vendor/x.py"}),
                        ("authority", {"path": "own.py"}))
    assert (returns["c0"], returns["c1"]) == ("none", "user"), returns


def test_the_options_cannot_widen_the_policy(ws, monkeypatch):
    """No option reaches past the policy: `env` cannot set a refused variable, a
    `path_authority` path outside the working directory is refused (typed, the knob named),
    and `read_only=False` over the read-only preset leaves a real command unable to write."""
    root, outside = ws
    (outside / "secret").write_text("outside\n")
    with pytest.raises(PolicyError) as refused:
        StockadeWorkspace(root, policy=policy_for("workspace-write"),
                          env={"LD_PRELOAD": str(outside / "evil.so")})
    assert refused.value.code == "env_refused", refused.value
    for path in (str(outside / "secret"), "../outside/secret", "~/.ssh/id_rsa"):
        with pytest.raises(PolicyError) as refused:
            StockadeWorkspace(root, policy=policy_for("workspace-write"),
                              path_authority={path: "operator"})
        assert refused.value.code == "outside_workspace", path
        assert "filesystem.read" in refused.value.message
    returns = run_tools(StockadeWorkspace(root, policy=policy_for("read-only"), read_only=False,
                                          env={"TARGET": str(outside / "secret")}),
                        ("execute", {"command": 'echo x > made.txt; echo x > "$TARGET"'}))
    assert not returns["c0"].startswith("0: ") and "Read-only file system" in returns["c0"]
    assert sorted(os.listdir(root)) == [] and (outside / "secret").read_text() == "outside\n"
