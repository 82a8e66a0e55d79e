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
from inspect_ai.scorer import CORRECT, INCORRECT, Score, accuracy, match, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import SandboxUserUnsupportedError, sandbox
from inspect_ai.util._sandbox import self_check
from inspect_ai.util._sandbox.local import LocalSandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - Inspect's checks, collected here

from stockade.integrations.inspect_sandbox import StockadeSandboxEnvironment

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
