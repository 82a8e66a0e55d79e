"""Inspect AI on Stockade: Inspect's own portable conformance checks for sandbox environments
(inspect_ai.util._sandbox.self_check), run whole against StockadeSandboxEnvironment (the one
check it fails, Inspect's own local sandbox fails too: run against it here), and a real
Inspect eval (mockllm model) whose sample runs its commands in the sandbox."""

from __future__ import annotations

import os
import time

import pytest
from cancelling import GONE_WITHIN, NEXT_WITHIN, one_slot, tree
from conftest import marked, policy_for
from inspect_ai import Task, eval, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, get_model
from inspect_ai.model._providers.mockllm import MockLLM
from inspect_ai.scorer import CORRECT, INCORRECT, Score, accuracy, includes, match, scorer
from inspect_ai.solver import Generate, TaskState, generate, solver, use_tools
from inspect_ai.tool import bash, python, text_editor
from inspect_ai.util import SandboxUserUnsupportedError, sandbox
from inspect_ai.util._sandbox import self_check
from inspect_ai.util._sandbox._cli import SANDBOX_TOOLS_DIR
from inspect_ai.util._sandbox.local import LocalSandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - Inspect's checks, collected here

from stockade.integrations.inspect_sandbox import TOOLS_NAME, StockadeSandboxEnvironment

pytestmark = pytest.mark.usefixtures("linux")

# The checks Inspect's own local sandbox fails too (Inspect's own runner marks them so): each
# is run against it below, and fails there as well.
SHARED = {
    "test_exec_as_user": "a sandbox runs as its caller, the one `user` it accepts (as Inspect's "
                         "local sandbox does): rootless, `root` is SandboxUserUnsupportedError; "
                         "as root, adduser fails (/etc is read-only in the sandbox)",
}
FAILED = (AssertionError, SandboxUserUnsupportedError)  # how a check fails


@pytest.fixture
async def sandbox_env(request):
    reason = SHARED.get(request.node.originalname)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, raises=FAILED, reason=reason))
    environment = StockadeSandboxEnvironment(policy_for("workspace-write"))
    try:
        yield environment
    finally:
        environment.close()
    assert not os.path.exists(environment.directory)


@pytest.mark.rootless_only("as root, Inspect's local sandbox would run adduser on this host")
@pytest.mark.parametrize("check", sorted(SHARED))
async def test_inspects_local_sandbox_fails_the_check_too(check):
    """The reference: Inspect's own LocalSandboxEnvironment, through the same check."""
    environments = await LocalSandboxEnvironment.sample_init("reference", None, {})
    try:
        with pytest.raises(FAILED):
            await getattr(self_check, check)(environments["default"])
    finally:
        await LocalSandboxEnvironment.sample_cleanup("reference", None, environments, False)


def test_an_eval_runs_its_sample_in_the_sandbox(ws, tmp_path):
    """A real Inspect eval (its mockllm model): the solver's commands run in the sample's
    sandbox; a write outside fails and nothing changes on the host."""
    _, outside = ws
    (outside / "secret").write_text("outside\n")

    directories = []

    @solver
    def probe():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            directories.append(sandbox().as_type(StockadeSandboxEnvironment).directory)
            inside = await sandbox().exec(["sh", "-c", "echo made > made.txt; cat made.txt"])
            escape = await sandbox().exec(["sh", "-c", f"echo x > {outside}/new"])
            state.output.completion = f"{inside.stdout.strip()} {escape.returncode}"
            return state
        return solve

    @task
    def confined():
        return Task(dataset=[Sample(input="go", target="made 2")], solver=probe(),
                    scorer=match(), sandbox=("stockade", "workspace-write"))

    [log] = eval(confined(), model="mockllm/model", log_dir=str(tmp_path / "logs"),
                 display="none")
    assert len(directories) == 1 and not os.path.exists(directories[0])  # (its cleanup)
    assert log.status == "success", log.error
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    assert sorted(os.listdir(outside)) == ["secret"]


def test_a_samples_time_limit_kills_its_command(ws, tmp_path, monkeypatch):
    """Inspect's own sample `time_limit` ends a sample whose command would run 30 s: the
    solver ends at the limit, the command's tree is gone by then, and the scorer's command
    runs at once in the same sandbox (one slot)."""
    one_slot(monkeypatch)
    command, marker = tree()
    seen: dict[str, object] = {}

    @solver
    def slow():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            seen["began"] = time.monotonic()
            await sandbox().exec(["sh", "-c", command])
            return state
        return solve

    @scorer(metrics=[accuracy()])
    def next_call():
        async def score(state: TaskState, target: object) -> Score:
            seen["limited"] = began = time.monotonic()
            seen["left"] = marked(marker)
            done = await sandbox().exec(["true"])
            seen["next"] = time.monotonic() - began
            return Score(value=CORRECT if done.success else INCORRECT)
        return score

    @task
    def limited():
        return Task(dataset=[Sample(input="go")], solver=slow(), scorer=next_call(),
                    sandbox=("stockade", "workspace-write"), time_limit=3)

    [log] = eval(limited(), model="mockllm/model", log_dir=str(tmp_path / "logs"),
                 display="none")
    assert log.status == "success", log.error
    assert log.samples[0].limit is not None and log.samples[0].limit.type == "time"
    assert seen["limited"] - seen["began"] < 3 + GONE_WITHIN, "the sample outran its limit"
    assert seen["left"] == []
    assert seen["next"] < NEXT_WITHIN
    assert log.results.scores[0].metrics["accuracy"].value == 1.0


@pytest.fixture
def counted_offline(monkeypatch):
    """Inspect's tool loop counts tokens with tiktoken, which downloads its encoding: a stand-in
    count here (no network)."""
    async def count(self: MockLLM, text: str) -> int:
        return len(text) // 4 + 1
    monkeypatch.setattr(MockLLM, "count_text_tokens", count)


def model_calls(tool: str, *calls: dict):
    """Inspect's mockllm model, calling `tool` with each of `calls` in turn, then saying done."""
    return get_model("mockllm/model", custom_outputs=[
        *(ModelOutput.for_tool_call("mockllm/model", tool, arguments) for arguments in calls),
        ModelOutput.from_content("mockllm/model", "done")])


def tool_replies(log) -> list:
    return [message for message in log.samples[0].messages if message.role == "tool"]


def test_text_editor_works_in_the_sandbox(tmp_path, counted_offline):
    """Inspect's text_editor() (a tool Inspect installs into the sandbox, under /var/tmp, which
    the sandbox cannot write) creates, edits and views a file in the sample's directory: its
    tools go to a directory of the sample's own."""
    seen = {}

    @scorer(metrics=[accuracy()])
    def on_the_host():
        async def score(state: TaskState, target: object) -> Score:
            directory = sandbox().as_type(StockadeSandboxEnvironment).directory
            seen["notes"] = open(os.path.join(directory, "notes.txt")).read()
            seen["tools"] = os.path.isdir(os.path.join(directory, TOOLS_NAME))
            return Score(value=CORRECT)
        return score

    @task
    def editing():
        return Task(dataset=[Sample(input="go", target="done")],
                    solver=[use_tools(text_editor()), generate()], scorer=on_the_host(),
                    sandbox=("stockade", "workspace-write"))

    model = model_calls(
        "text_editor",
        {"command": "create", "path": "notes.txt", "file_text": "one\n"},
        {"command": "str_replace", "path": "notes.txt", "old_str": "one", "new_str": "two"},
        {"command": "view", "path": "notes.txt"})
    host_tools = os.path.lexists(SANDBOX_TOOLS_DIR)
    [log] = eval(editing(), model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    assert seen == {"notes": "two\n", "tools": True}  # (in the sample's own directory)
    assert os.path.lexists(SANDBOX_TOOLS_DIR) == host_tools  # the host's /var/tmp: untouched
    created, replaced, viewed = tool_replies(log)
    assert [reply.error for reply in (created, replaced, viewed)] == [None, None, None]
    assert created.text.startswith("File created successfully"), created.text
    assert viewed.text.endswith("notes.txt:\n     1\ttwo\n     2\t\n"), viewed.text


# Fetches a URL through the policy's proxy (allowlist mode sets http_proxy): 403 when refused.
FETCH = ("import urllib.request, sys\n"
         "try: urllib.request.urlopen(sys.argv[1], timeout=10)\n"
         "except urllib.error.HTTPError as e: print(e.code)\n")
LIMITED = """version = 1
preset = "workspace-write"
[limits]
timeout = "2s"
output = "1KiB"
[network]
mode = "allowlist"
allow = ["allowed.example"]
"""


def test_what_the_sandbox_stopped_or_cut_reaches_the_model(tmp_path, counted_offline):
    """Through Inspect's bash() tool: the policy's time limit (not a bare 124), output cut at
    limits.output and a proxy refusal are said in words the model reads, each with the policy
    grant that would allow it; through python(timeout=1), the call's own timeout, shorter than
    the policy's, is said as such with Inspect's timeout error."""
    policy = tmp_path / "limited.toml"
    policy.write_text(LIMITED)

    @task
    def limited():
        return Task(dataset=[Sample(input="go", target="done", files={"fetch.py": FETCH})],
                    solver=[use_tools(bash(), python(timeout=1)), generate()],
                    scorer=includes(), sandbox=("stockade", str(policy)))

    model = get_model("mockllm/model", custom_outputs=[
        *(ModelOutput.for_tool_call("mockllm/model", "bash", {"command": command}) for command in (
            "sleep 30", "head -c 5000 /dev/zero | tr '\\0' a",
            "python3 fetch.py http://denied.example/")),
        ModelOutput.for_tool_call("mockllm/model", "python", {"code": "import time\n"
                                                                      "time.sleep(30)"}),
        ModelOutput.from_content("mockllm/model", "done")])
    [log] = eval(limited(), model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    slow, cut, denied, shortened = tool_replies(log)
    assert slow.text.startswith(
        "stockade: the command was killed after 2s, the sandbox's time limit; the policy grant "
        "that would allow it: limits.timeout\n"), slow.text
    assert cut.error.message == (
        "The tool exceeded its output limit of 1024 bytes (stockade: stdout cut at 1024 bytes, "
        "the sandbox's output limit: the rest of it was dropped; the policy grant that would "
        "allow it: limits.output)."), cut.error
    assert denied.text == (
        "stockade: the sandbox's network proxy refused http denied.example:80: not_allowed: "
        "the host is not in network.allow; the policy grant that would allow it: "
        "network.allow denied.example:80\n\n403\n"), denied.text
    assert shortened.error.type == "timeout"  # (python(timeout=1): the call's own timeout)
    assert shortened.text == (
        "stockade: the command was killed after 1s, the timeout this call asked for (shorter "
        "than the sandbox's time limit, limits.timeout): a longer one would let it run on\n"), \
        shortened.text
