"""The OpenAI Agents SDK's shell and apply_patch tools on Stockade: a real `Agent` run by the
SDK's `Runner`, driven by the SDK's own ScriptedModel (agents.testing), so the SDK itself
calls the executor and the editor, and every command and file change happens in the real
sandbox."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest
from agents import (
    Agent,
    ApplyPatchTool,
    RunConfig,
    Runner,
    ShellTool,
    set_tracing_disabled,
)
from agents.run_config import SandboxRunConfig
from agents.sandbox import Manifest, SandboxAgent
from agents.testing import ScriptedModel, assistant_message, function_call
from cancelling import check_cancelled, check_next_call, one_slot, tree
from conftest import policy_for
from openai.types.responses import ResponseApplyPatchToolCall, ResponseFunctionShellToolCall

from stockade.integrations.openai_agents import (
    StockadeEditor,
    StockadeSandboxClient,
    StockadeShellExecutor,
)
from stockade.integrations.workspace import Workspace

pytestmark = pytest.mark.usefixtures("linux")
set_tracing_disabled(True)  # (no trace leaves this machine)


def shell(number: int, *commands: str, timeout_ms: int | None = None):
    return ResponseFunctionShellToolCall(
        id=f"sh-{number}", call_id=f"call-{number}", status="completed", type="shell_call",
        action={"commands": list(commands), "timeout_ms": timeout_ms})


def patch(number: int, kind: str, path: str, diff: str | None = None):
    operation = {"type": kind, "path": path} | ({"diff": diff} if diff is not None else {})
    return ResponseApplyPatchToolCall(id=f"ap-{number}", call_id=f"call-{number}",
                                      status="completed", type="apply_patch_call",
                                      operation=operation)


def run_agent(workspace: Workspace, *steps) -> dict[str, object]:
    """Run an agent whose model takes `steps` (one tool call each), then says "done"; the
    outputs the SDK recorded, by call id."""
    model = ScriptedModel([[step] for step in steps] + [[assistant_message("done")]])
    agent = Agent(name="coder", model=model, tools=[
        ShellTool(executor=StockadeShellExecutor(workspace)),
        ApplyPatchTool(editor=StockadeEditor(workspace))])
    result = asyncio.run(Runner.run(agent, "go"))
    assert result.final_output == "done"
    outputs = {}
    for item in result.new_items:
        raw = item.raw_item
        call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
        if item.type.endswith("output_item") and call_id:
            outputs[call_id] = item.output
    return outputs


def test_shell_calls_run_in_the_sandbox(ws):
    root, outside = ws
    with Workspace(policy_for("workspace-write", timeout=2.0), workspace=root) as workspace:
        outputs = run_agent(
            workspace,
            shell(1, "echo made > made.txt && pwd", "no-such-tool",
                  f"touch {outside}/escaped; echo $?"),
            shell(2, "sleep 30", timeout_ms=600_000))
    first, slow = str(outputs["call-1"]), str(outputs["call-2"])
    assert f"$ echo made > made.txt && pwd\n{root}\n" in first, first
    assert "no-such-tool: not found\nexit code: 127" in first, first
    assert (root / "made.txt").read_text() == "made\n"
    assert os.listdir(outside) == []  # the touch outside failed
    assert slow.endswith("stockade: the command was killed after 2s, the sandbox's time limit; "
                         "the policy grant that would allow it: limits.timeout\nstatus: "
                         "timeout"), slow


# Fetches a URL through the policy's proxy (allowlist mode sets http_proxy): 403 when refused.
FETCH = ("import urllib.request, sys\n"
         "try: urllib.request.urlopen(sys.argv[1], timeout=10)\n"
         "except urllib.error.HTTPError as e: print(e.code)\n")


def limited(**changes):
    """workspace-write, allowing only allowed.example through its proxy, with `changes`."""
    policy = policy_for("workspace-write", **changes)
    return dataclasses.replace(policy, network=dataclasses.replace(
        policy.network, mode="allowlist", allow=("allowed.example",)))


def test_a_shell_call_says_what_the_sandbox_cut_or_denied(ws):
    """Output cut at limits.output and a proxy refusal reach the model in words, each with
    the policy grant that would allow it."""
    root, _ = ws
    (root / "fetch.py").write_text(FETCH)
    with Workspace(limited(output=1024), workspace=root) as workspace:
        outputs = run_agent(workspace, shell(1, "head -c 5000 /dev/zero | tr '\\0' a",
                                             "python3 fetch.py http://denied.example/"))
    said = str(outputs["call-1"])
    assert "stderr:\nstockade: stdout cut at 1024 bytes, the sandbox's output limit: the rest " \
        "of it was dropped; the policy grant that would allow it: limits.output\n" in said, \
        said[-400:]
    assert "403\n\nstderr:\nstockade: the sandbox's network proxy refused http " \
        "denied.example:80: not_allowed: the host is not in network.allow; the policy grant " \
        "that would allow it: network.allow denied.example:80" in said, said[-400:]


def test_apply_patch_edits_inside_the_workspace_only(ws):
    root, outside = ws
    (outside / "secret").write_text("outside\n")
    os.mkdir(root / ".git")
    (root / ".git" / "config").write_text("[core]\n")
    with Workspace(policy_for("workspace-write"), workspace=root) as workspace:
        workspace.exec(["ln", "-s", str(outside), "link"])
        outputs = run_agent(
            workspace,
            patch(1, "create_file", "notes.txt", "+one\n+two\n"),
            patch(2, "update_file", "notes.txt", "@@\n one\n-two\n+three\n"),
            patch(3, "create_file", "link/secret", "+changed\n"),
            patch(4, "update_file", ".git/config", "@@\n [core]\n+\thooksPath = /tmp\n"),
            patch(5, "create_file", str(outside / "new"), "+escaped\n"),
            patch(6, "delete_file", "link"))
    assert (root / "notes.txt").read_text().splitlines() == ["one", "three"]
    assert "symlink_refused" in str(outputs["call-3"])
    assert "permission_denied" in str(outputs["call-4"])
    assert "filesystem.write" in str(outputs["call-4"])
    assert "outside_workspace" in str(outputs["call-5"])
    assert not os.path.lexists(root / "link")  # the link itself was deleted, not its target
    assert (outside / "secret").read_text() == "outside\n"
    assert sorted(os.listdir(outside)) == ["secret"]
    assert (root / ".git" / "config").read_text() == "[core]\n"


def test_a_sandbox_agent_runs_in_stockade(ws):
    """The SDK's sandbox interface: a SandboxAgent whose session comes from
    StockadeSandboxClient; the model's exec_command calls run confined."""
    root, outside = ws
    (outside / "secret").write_text("outside\n")
    model = ScriptedModel([
        [function_call("exec_command", {"cmd": "echo made > made.txt; pwd"}, call_id="c1")],
        [function_call("exec_command", {"cmd": f"echo x > {outside}/new; cat {outside}/secret"},
                       call_id="c2")],
        [function_call("exec_command", {"cmd": "no-such-tool"}, call_id="c3")],
        [assistant_message("done")]])
    agent = SandboxAgent(name="coder", model=model,
                         default_manifest=Manifest(root=str(root)))
    client = StockadeSandboxClient(policy_for("workspace-write"))
    config = RunConfig(sandbox=SandboxRunConfig(client=client))
    result = asyncio.run(Runner.run(agent, "go", run_config=config))
    assert result.final_output == "done"
    outputs = {item.raw_item["call_id"]: item.output for item in result.new_items
               if item.type == "tool_call_output_item"}
    assert str(root) in outputs["c1"] and (root / "made.txt").read_text() == "made\n"
    assert "No such file or directory" in outputs["c2"] and "outside\n" not in outputs["c2"]
    assert "127" in outputs["c3"]
    assert sorted(os.listdir(outside)) == ["secret"]


def test_a_sandbox_agent_is_told_what_the_sandbox_cut_or_stopped(ws):
    """Output past limits.output is never cut silently with exit 0, and the policy's time
    limit is said as such (not as the call's own timeout): both in words on the command's
    stderr, with the policy grant that would allow it."""
    root, _ = ws
    model = ScriptedModel([
        [function_call("exec_command", {
            "cmd": "head -c 100000 /dev/zero | tr '\\0' a; echo END-MARKER",
            "yield_time_ms": 60_000}, call_id="c1")],
        [function_call("exec_command", {"cmd": "sleep 30", "yield_time_ms": 60_000},
                       call_id="c2")],
        [assistant_message("done")]])
    agent = SandboxAgent(name="coder", model=model, default_manifest=Manifest(root=str(root)))
    client = StockadeSandboxClient(policy_for("workspace-write", timeout=2.0, output=65536))
    result = asyncio.run(Runner.run(agent, "go", run_config=RunConfig(
        sandbox=SandboxRunConfig(client=client))))
    outputs = {item.raw_item["call_id"]: item.output for item in result.new_items
               if item.type == "tool_call_output_item"}
    cut, slow = outputs["c1"], outputs["c2"]
    assert "END-MARKER" not in cut
    assert cut.endswith("a\nstockade: stdout cut at 65536 bytes, the sandbox's output limit: "
                        "the rest of it was dropped; the policy grant that would allow it: "
                        "limits.output\n"), cut[-400:]
    assert "Process exited with code 124" in slow, slow
    assert slow.endswith("stockade: the command was killed after 2s, the sandbox's time "
                         "limit; the policy grant that would allow it: limits.timeout\n"), slow


def test_cancelling_the_run_kills_its_shell_command(ws, monkeypatch):
    """Cancelling the task running `Runner.run` while a shell call's command runs: the
    command's tree is gone and the workspace's one slot free for the next command."""
    root, _ = ws
    one_slot(monkeypatch)
    command, marker = tree()
    model = ScriptedModel([[shell(1, command)], [assistant_message("done")]])
    with Workspace(policy_for("workspace-write"), workspace=root) as workspace:
        agent = Agent(name="coder", model=model,
                      tools=[ShellTool(executor=StockadeShellExecutor(workspace))])
        check_cancelled(lambda: Runner.run(agent, "go"), marker)
        check_next_call(lambda: workspace.exec(["true"]))
