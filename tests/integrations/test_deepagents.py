"""The deepagents backend: langchain-tests' own conformance suite for sandbox backends, run
whole against StockadeSandbox and against deepagents' own BaseSandbox unsandboxed (the checks
Stockade fails, it fails too), and a real deep agent (driven by LangChain's fake chat model) whose
tool calls run in the real sandbox."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cancelling import check_cancelled, check_next_call, one_slot, tree
from conftest import policy_for
from deepagents import create_deep_agent
from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_tests.integration_tests import SandboxIntegrationTests

from stockade.integrations.deepagents import ARTIFACTS, StockadeSandbox
from stockade.integrations.workspace import Workspace

pytestmark = pytest.mark.usefixtures("linux")


# langchain-tests 1.1.9 asks for what deepagents' own BaseSandbox (0.7.32) no longer does:
# these run through deepagents' unchanged glob and write, whatever the backend, and fail the
# same on the unsandboxed reference below.
FRAMEWORK_SKEW = {
    "test_write_existing_file_fails":
        "BaseSandbox.write overwrites an existing file (its documented behaviour)",
    **{name: "BaseSandbox.glob returns absolute paths of regular files only" for name in (
        "test_glob", "test_glob_basic_pattern", "test_glob_with_directories",
        "test_glob_hidden_files_explicitly", "test_glob_with_character_class",
        "test_glob_with_question_mark")},
}


@pytest.fixture(autouse=True)
def framework_skew(request):
    """Strict expectations for the suite's tests the framework itself fails."""
    reason = FRAMEWORK_SKEW.get(request.node.name)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


class TestStockadeSandboxConformance(SandboxIntegrationTests):
    """The suite, whole, over a workspace of its own under the recommended preset: its files
    live under `sandbox_root_dir`."""

    root = ""  # set when the class's sandbox is made

    @pytest.fixture(scope="class")
    def sandbox(self, tmp_path_factory) -> Iterator[StockadeSandbox]:
        root = tmp_path_factory.mktemp("deepagents-conformance")
        type(self).root = str(root)
        backend = StockadeSandbox(Workspace(policy_for("workspace-write"), workspace=root))
        try:
            yield backend
        finally:
            backend.close()

    @property
    def sandbox_root_dir(self) -> str:
        return self.root + "/"


class Unsandboxed(BaseSandbox):
    """The reference: deepagents' own BaseSandbox over plain subprocesses and file I/O on the
    host, nothing confined (with `python` on PATH, as the suite needs)."""

    def __init__(self, root: str) -> None:
        self.root = root

    @property
    def id(self) -> str:
        return f"unsandboxed:{self.root}"

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', os.defpath)}"
        done = subprocess.run(["/bin/sh", "-c", command], cwd=self.root, capture_output=True,
                              timeout=timeout or None, env={**os.environ, "PATH": path})
        return ExecuteResponse(output=(done.stdout + done.stderr).decode("utf-8", "replace"),
                               exit_code=done.returncode, truncated=False)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            try:
                _absolute(path)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as file:
                    file.write(content)
                responses.append(FileUploadResponse(path=path))
            except (OSError, ValueError) as exc:
                responses.append(FileUploadResponse(path=path, error=_error(exc)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            try:
                with open(_absolute(path), "rb") as file:
                    responses.append(FileDownloadResponse(path=path, content=file.read()))
            except (OSError, ValueError) as exc:
                responses.append(FileDownloadResponse(path=path, error=_error(exc)))
        return responses


def _absolute(path: str) -> str:
    if not os.path.isabs(path):
        raise ValueError(path)  # (deepagents' paths are absolute)
    return path


def _error(exc: Exception) -> str:
    return {FileNotFoundError: "file_not_found", IsADirectoryError: "is_directory",
            PermissionError: "permission_denied", ValueError: "invalid_path"}.get(
                type(exc), str(exc))


class TestUnsandboxedReference(SandboxIntegrationTests):
    """The same suite against the reference: FRAMEWORK_SKEW fails there too (strict)."""

    root = ""

    @pytest.fixture(scope="class")
    def sandbox(self, tmp_path_factory) -> Unsandboxed:
        type(self).root = str(tmp_path_factory.mktemp("deepagents-reference"))
        return Unsandboxed(self.root)

    @property
    def sandbox_root_dir(self) -> str:
        return self.root + "/"


# Fetches a URL through the policy's proxy (allowlist mode sets http_proxy): 403 when refused.
FETCH = ("import urllib.request, sys\n"
         "try: urllib.request.urlopen(sys.argv[1], timeout=10)\n"
         "except urllib.error.HTTPError as e: print(e.code)\n")


class ScriptedModel(GenericFakeChatModel):
    """LangChain's fake chat model, answering with the scripted messages (tool calls first);
    it accepts the agent's tools as a real model would."""

    def bind_tools(self, tools, **kwargs):  # noqa: ANN001, ANN003, ANN201 - LangChain's
        return self


def call(name: str, number: int, **args: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args,
                                              "id": f"call-{number}"}])


def test_a_deep_agent_runs_its_tools_in_the_sandbox(ws):
    root, outside = ws
    (outside / "secret").write_text("outside\n")
    os.mkdir(root / ".git")
    (root / ".git" / "config").write_text("[core]\n")
    script = [
        call("execute", 1, command=f"echo made > made.txt; ln -s {outside} link; no-such-tool"),
        call("write_file", 2, file_path=f"{root}/.git/config", content="[core]\n\tx = 1\n"),
        call("write_file", 3, file_path=f"{outside}/new.txt", content="escaped\n"),
        call("read_file", 4, file_path=f"{root}/made.txt"),
        call("write_file", 5, file_path=f"{root}/link/through.txt", content="escaped\n"),
        AIMessage(content="done"),
    ]
    backend = StockadeSandbox(Workspace(policy_for("workspace-write"), workspace=root))
    try:
        agent = create_deep_agent(model=ScriptedModel(messages=iter(script)), backend=backend)
        state = agent.invoke({"messages": [HumanMessage("go")]})
    finally:
        backend.close()
    replies = {m.tool_call_id: m.content for m in state["messages"] if isinstance(m, ToolMessage)}
    assert "exit code 127" in replies["call-1"], replies["call-1"]
    assert (root / "made.txt").read_text() == "made\n"
    for refused in ("call-2", "call-3", "call-5"):  # protected, outside, through the link
        assert replies[refused].endswith("': permission_denied"), replies[refused]
    assert "made" in replies["call-4"]
    assert (root / ".git" / "config").read_text() == "[core]\n"
    assert sorted(os.listdir(outside)) == ["secret"]  # nothing written outside
    assert state["messages"][-1].content == "done"


def test_an_async_run_executes_in_the_sandbox(ws):
    """`ainvoke`: deepagents awaits `aexecute`, which runs the command as `execute` does."""
    root, _ = ws
    script = [call("execute", 1, command="echo made > made.txt; cat made.txt; exit 3"),
              AIMessage(content="done")]
    backend = StockadeSandbox(Workspace(policy_for("workspace-write"), workspace=root))
    try:
        agent = create_deep_agent(model=ScriptedModel(messages=iter(script)), backend=backend)
        state = asyncio.run(agent.ainvoke({"messages": [HumanMessage("go")]}))
    finally:
        backend.close()
    [reply] = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
    assert reply.startswith("made\n") and "exit code 3" in reply, reply
    assert state["messages"][-1].content == "done"


def replies(state) -> dict[str, str]:
    return {m.tool_call_id: m.content for m in state["messages"] if isinstance(m, ToolMessage)}


def test_what_the_sandbox_stopped_or_cut_is_said_to_the_model(ws):
    """`execute`'s result says in words what the sandbox did, with the policy grant that would
    allow it: its time limit (not a bare exit code 124), output cut at limits.output, a proxy
    refusal."""
    root, _ = ws
    (root / "fetch.py").write_text(FETCH)
    policy = policy_for("workspace-write", timeout=1.0, output=1024)
    policy = dataclasses.replace(policy, network=dataclasses.replace(
        policy.network, mode="allowlist", allow=("allowed.example",)))
    script = [call("execute", 1, command="sleep 30"),
              call("execute", 2, command="head -c 5000 /dev/zero | tr '\\0' a"),
              call("execute", 3, command="python3 fetch.py http://denied.example/"),
              AIMessage(content="done")]
    sandbox = StockadeSandbox(Workspace(policy, workspace=root))
    try:
        agent = create_deep_agent(model=ScriptedModel(messages=iter(script)),
                                  backend=sandbox.backend())
        said = replies(agent.invoke({"messages": [HumanMessage("go")]}))
    finally:
        sandbox.close()
    assert said["call-1"].startswith(
        "stockade: the command was killed after 1s, the sandbox's time limit; the policy grant "
        "that would allow it: limits.timeout\n"), said["call-1"]
    assert "a\nstockade: stdout cut at 1024 bytes, the sandbox's output limit: the rest of it " \
        "was dropped; the policy grant that would allow it: limits.output\n" in said["call-2"], \
        said["call-2"][-400:]
    assert said["call-3"].startswith(
        "403\nstockade: the sandbox's network proxy refused http denied.example:80: "
        "not_allowed: the host is not in network.allow; the policy grant that would allow it: "
        "network.allow denied.example:80\n"), said["call-3"]


def test_a_large_output_is_offloaded_into_the_workspace_and_read_back(ws):
    """deepagents offloads a large tool result to its artifacts root: with `backend()` that
    root is in the workspace (the sandbox's `/` is read-only), so the model gets a pointer and a
    preview instead of the whole output, and reads the rest back with read_file."""
    root, outside = ws
    offloaded = root / ARTIFACTS / "large_tool_results" / "call-1"
    script = [call("execute", 1, command="seq 1 1000000"),
              call("read_file", 2, file_path=str(offloaded), offset=999990, limit=10),
              AIMessage(content="done")]
    sandbox = StockadeSandbox(Workspace(policy_for("workspace-write"), workspace=root))
    try:
        agent = create_deep_agent(model=ScriptedModel(messages=iter(script)),
                                  backend=sandbox.backend())
        said = replies(agent.invoke({"messages": [HumanMessage("go")]}))
    finally:
        sandbox.close()
    assert len(said["call-1"]) < 5000 and str(offloaded) in said["call-1"], said["call-1"][:500]
    assert offloaded.read_text().startswith("".join(f"{n}\n" for n in range(1, 1000001)))
    assert said["call-2"].endswith("\n999999\n1000000"), said["call-2"]
    assert os.listdir(outside) == []


class SummarizingModel(ScriptedModel):
    """The scripted model, which also answers deepagents' summarization call (the one without
    the agent's system prompt) with a summary."""

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if any(message.type == "system" for message in messages):
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="a summary"))])


def test_summarized_history_is_offloaded_into_the_workspace(ws):
    """A conversation past the model's context (a 30,000-token profile) is summarized twice:
    deepagents saves the summarized messages to conversation_history under its artifacts
    root, in the workspace with `backend()`, the second time appended by a large edit (staged
    in the sandbox's own /tmp)."""
    root, _ = ws
    script = [call("execute", n, command="seq 1 6000") for n in range(1, 8)]
    model = SummarizingModel(messages=iter([*script, AIMessage(content="done")]),
                             profile={"max_input_tokens": 30000})
    sandbox = StockadeSandbox(Workspace(policy_for("workspace-write"), workspace=root))
    try:
        agent = create_deep_agent(model=model, backend=sandbox.backend())
        state = agent.invoke({"messages": [HumanMessage("go")]})
    finally:
        sandbox.close()
    assert state["messages"][-1].content == "done"
    [history] = (root / ARTIFACTS / "conversation_history").iterdir()
    assert history.read_text().count("## Summarized at") == 2


def test_cancelling_the_run_kills_its_command(ws, monkeypatch):
    """Cancelling the task running a deep agent (`ainvoke`) while its `execute` runs: the
    command's tree is gone and the workspace's one slot free for the next command."""
    root, _ = ws
    one_slot(monkeypatch)
    command, marker = tree()
    model = ScriptedModel(messages=iter([call("execute", 1, command=command),
                                         AIMessage(content="done")]))
    backend = StockadeSandbox(Workspace(policy_for("workspace-write"), workspace=root))

    agent = create_deep_agent(model=model, backend=backend)
    try:
        check_cancelled(
            lambda: agent.ainvoke({"messages": [HumanMessage("go")]}), marker)
        check_next_call(lambda: backend.execute("true"))
    finally:
        backend.close()
