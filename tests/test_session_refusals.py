"""A warm sandbox says what it refused on the Result of the command it refused: memory past
limits.memory (pid 1's memory watch), a protected name not made, a write in `.git` the git
guard stopped — each a violation of that command, never of the next, and in the words a
model reads from an integration's tool result. Real children in real warm sandboxes."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from conftest import PYTHON, policy_for
from test_protected_create import MANY_REFUSALS

import stockade
from stockade.integrations.workspace import Workspace
from stockade.launch.denials import with_denials

pytestmark = pytest.mark.usefixtures("linux")

LIMIT = 256 << 20
GROW = "held = []\nwhile True: held.append(bytearray(1 << 20))"


def kinds(result: stockade.Result) -> list[str]:
    return [v.kind for v in result.violations]


def test_memory_refused_is_the_violation_of_the_command_that_asked(ws):
    workspace, _ = ws
    with stockade.Sandbox(policy_for(memory=LIMIT), workspace=workspace) as sb:
        before = sb.run(["true"])
        asked = sb.run([PYTHON, "-c", "x = bytearray(1 << 30)"])
        grew = sb.run([PYTHON, "-c", GROW])
        after = sb.run(["true"])
    assert before.violations == () and after.violations == (), (before, after)
    assert asked.exit_code == 1 and b"MemoryError" in asked.stderr, asked.stderr
    memory = [v.detail for v in asked.violations if v.kind == "limits.memory"]
    assert len(memory) == 1 and re.fullmatch(r"\d+ allocations? refused at the 256\.0 MiB "
                                             r"address-space limit; the largest asked "
                                             r"102[45]\.0 MiB with .* MiB in use", memory[0]), \
        asked.violations
    grown = [v.detail for v in grew.violations if v.kind == "limits.memory"]
    assert grew.exit_code == 1 and len(grown) == 1, grew.violations
    assert "largest asked 102" not in grown[0], grown  # (its own only, not the last one's)


def test_a_protected_name_not_made_is_the_violation_of_that_command(ws):
    workspace, _ = ws
    with stockade.Sandbox(policy_for(), workspace=workspace) as sb:
        refused = sb.run(["sh", "-c", "touch .envrc; mkdir .codex; echo done"])
        after = sb.run(["sh", "-c", "touch plain.txt"])
    assert refused.exit_code == 0 and refused.stdout == b"done\n", refused.stderr
    details = [v.detail for v in refused.violations if v.kind == "filesystem.protected"]
    assert len(details) == 2, refused.violations
    assert f"{workspace}/.envrc: not made (open)" in details[0], details
    assert '"!.envrc" in filesystem.protected releases it' in details[0], details
    assert f"{workspace}/.codex: not made (mkdir)" in details[1], details
    assert after.violations == () and (workspace / "plain.txt").is_file()
    assert not (workspace / ".envrc").exists() and not (workspace / ".codex").exists()


def test_refusals_are_read_as_they_come_while_the_command_runs(ws):
    """pid 1 never waits for room in its status pipe: the session reads it while the command
    runs, so a command that fills it (101 refusals, each record some 3 KiB) still gets most of
    its records, as a one-shot run does (test_protected_create.py)."""
    workspace, _ = ws
    with stockade.Sandbox(policy_for(), workspace=workspace) as sb:
        r = sb.run([PYTHON, "-c", MANY_REFUSALS, "0.1"], timeout=20)
    assert r.exit_code == 0 and r.stdout == b"AFTER\n", r.stderr
    refused = [v.detail for v in r.violations if v.kind == "filesystem.protected"]
    assert sum("/.codex: not made (mkdir)" in detail for detail in refused) >= 50, refused


def test_past_the_bound_a_later_command_is_recorded_again(ws):
    """pid 1 records at most 100 refusals of a kind in 10 seconds (supervisor.h's budget),
    not 100 in a sandbox's life: a warm sandbox's later command still gets its own."""
    workspace, _ = ws
    with stockade.Sandbox(policy_for(), workspace=workspace) as sb:
        flood = sb.run([PYTHON, "-c", MANY_REFUSALS, "0"], timeout=20)
        time.sleep(10.5)  # (EVENT_WINDOW)
        later = sb.run(["sh", "-c", "touch .envrc"])
    assert any(v.detail.startswith("more protected names were refused")
               for v in flood.violations), flood.violations
    assert [v.detail.split(":")[0] for v in later.violations] == [f"{workspace}/.envrc"], \
        later.violations


def test_a_write_the_git_guard_stopped_is_the_violation_of_that_command(ws):
    workspace, _ = ws
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    hook = workspace / ".git" / "hooks" / "pre-commit"
    with stockade.Sandbox(policy_for(), workspace=workspace) as sb:
        refused = sb.run(["sh", "-c", "echo evil > .git/hooks/pre-commit"])
        after = sb.run(["git", "status", "--short"])
    assert refused.exit_code != 0 and not hook.exists(), refused.stderr
    guard = [v.detail for v in refused.violations if v.kind == "filesystem.git"]
    assert len(guard) == 1 and 'filesystem.git = "writable"' in guard[0], refused.violations
    assert after.exit_code == 0 and after.violations == (), after


def test_the_tool_result_says_what_was_refused_and_the_grant(ws):
    """What an integration hands its model (Workspace.exec, then with_denials): the
    refusals in words, with the policy knob that would allow each."""
    workspace, _ = ws
    with Workspace(policy_for(memory=LIMIT), workspace=workspace) as space:
        memory = space.exec([PYTHON, "-c", "x = bytearray(1 << 30)"])
        named = space.exec("touch .envrc", shell=True)
        plain = space.exec("true", shell=True)
    said = with_denials(memory.stderr, memory.denials)
    assert "stockade: the sandbox's memory limit refused memory: " in said, said
    assert "refused at the 256.0 MiB address-space limit" in said, said
    assert "the policy grant that would allow it: limits.memory" in said, said
    said = with_denials(named.stderr, named.denials)
    assert "stockade: the sandbox did not make a protected name: " in said, said
    assert ".envrc: not made (open)" in said, said
    assert "the policy grant that would allow it: filesystem.protected" in said, said
    assert plain.denials == ()
