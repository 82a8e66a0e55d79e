"""limits.memory, seen: a command that runs out of address space shows a `limits.memory`
violation on its Result and on the CLI's summary, whatever it died of (stockade/linux/
memwatch.c: the sandbox's pid 1 refuses, and counts, each request that would pass the limit).
Real children, in Python and in C; a command that crashes far below the limit, or stays under
it, has none."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, policy_for, sandbox

from stockade.cli import main
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux.backend import LinuxBackend
from stockade.policy import policy_to_document

pytestmark = pytest.mark.usefixtures("linux")

LIMIT = 256 << 20
ALLOCATE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    size_t step = (size_t)atol(argv[1]) << 20, total = 0;
    for (char *p; (p = malloc(step)); total += step)
        memset(p, 1, step);
    printf("allocated %zu MiB\n", total >> 20);
    return 1;
}
"""
CRASH = "int main(void) { *(volatile int *)0 = 1; return 0; }\n"


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> Path:
    """The C programs, built into a directory the tests grant as a read root."""
    where = tmp_path_factory.mktemp("programs")
    for name, source in (("allocate", ALLOCATE), ("crash", CRASH)):
        (where / f"{name}.c").write_text(source)
        subprocess.run(["gcc", "-O0", "-o", str(where / name), str(where / f"{name}.c")],
                       check=True)
    return where


def memory_violations(result) -> list[str]:
    return [v.detail for v in result.violations if v.kind == "limits.memory"]


@pytest.mark.parametrize("code", [
    "x = bytearray(1 << 30)",                                   # one request past the limit
    "held = []\nwhile True: held.append(bytearray(1 << 20))",   # growing until refused
])
def test_python_running_out_shows_a_memory_violation(ws, code):
    workspace, _ = ws
    r = sandbox([PYTHON, "-c", code], workspace, memory=LIMIT)
    assert r.returncode == 1 and b"MemoryError" in r.stderr
    (detail,) = memory_violations(r)
    assert "refused at the 256.0 MiB address-space limit" in detail, detail
    assert r.enforced["memory_watched"] is True


@pytest.mark.parametrize(("step", "asked"), [("1", "the largest asked 2.0 MiB"),
                                            ("1024", "the largest asked 1025.0 MiB")])
def test_c_running_out_shows_a_memory_violation(ws, programs, step, asked):
    workspace, _ = ws
    r = sandbox([str(programs / "allocate"), step], workspace, read=(str(programs),),
                memory=LIMIT)
    assert r.returncode == 1 and r.stdout.startswith(b"allocated "), r
    (detail,) = memory_violations(r)
    assert asked in detail, detail
    if step == "1":  # it got close to the limit before it was refused
        assert int(r.stdout.split()[1]) > (LIMIT >> 20) - 16


def test_a_crash_far_below_the_limit_is_no_memory_violation(ws, programs):
    workspace, _ = ws
    for argv in ([str(programs / "crash")], ["sh", "-c", "kill -SEGV $$"],
                 [PYTHON, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]):
        r = sandbox(argv, workspace, read=(str(programs),), memory=LIMIT)
        assert r.signal == 11 and r.returncode == -11, (argv, r)
        assert memory_violations(r) == [], argv


def test_a_command_within_the_limit_has_none(ws):
    workspace, _ = ws
    r = sandbox([PYTHON, "-c", "x = bytearray(128 << 20); print(len(x))"], workspace,
                memory=LIMIT)
    assert (r.returncode, r.stdout) == (0, b"134217728\n")
    assert memory_violations(r) == [] and r.enforced["memory_watched"] is True


def test_a_refusal_is_reported_even_when_the_program_recovers(ws):
    """The violation says the limit refused something, not how the program took it."""
    workspace, _ = ws
    code = "try:\n    bytearray(1 << 30)\nexcept MemoryError:\n    print('recovered')"
    r = sandbox([PYTHON, "-c", code], workspace, memory=LIMIT)
    assert (r.returncode, r.stdout) == (0, b"recovered\n")
    assert len(memory_violations(r)) == 1


def test_without_a_memory_limit_nothing_is_watched(ws):
    workspace, _ = ws
    r = sandbox([PYTHON, "-c", "x = bytearray(512 << 20)"], workspace, memory=None)
    assert r.returncode == 0 and memory_violations(r) == []
    assert "memory_watched" not in r.enforced


def test_without_rlimits_there_is_no_limit_to_watch(ws):
    """The "rlimits" weakening (tests only) takes the limit away, and its watch with it."""
    workspace, _ = ws
    request = compile_policy(policy_for(memory=LIMIT), [PYTHON, "-c", "bytearray(1 << 30)"],
                             CompileContext.current(workspace))
    r = execute(LinuxBackend(weaken=frozenset({"rlimits"})), request)
    assert r.returncode == 0 and memory_violations(r) == []
    assert "memory_watched" not in r.enforced


def test_the_cli_summarises_the_memory_violation(ws, tmp_path):
    workspace, _ = ws
    policy = tmp_path / "policy.json"
    document = policy_to_document(policy_for(memory=LIMIT))
    policy.write_text(json.dumps(document))
    assert document["limits"]["memory"] == "256MiB"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "stockade", "run", "--policy", str(policy), "--workspace",
         str(workspace), "--", PYTHON, "-c", "bytearray(1 << 30)"],
        capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    summary = done.stderr.splitlines()[-1]
    assert re.match(r"stockade: the sandbox's memory limit refused memory: \d+ allocations? "
                    r"refused at the 256\.0 MiB address-space limit; the largest asked "
                    r"1025\.0 MiB.*; the policy grant that would allow it: limits\.memory$",
                    summary), done.stderr


def test_the_json_result_lists_the_memory_violation(ws, capsys, monkeypatch):
    workspace, _ = ws
    monkeypatch.chdir(workspace)
    policy = workspace.parent / "policy.json"
    policy.write_text(json.dumps(policy_to_document(policy_for(memory=LIMIT))))
    assert main(["run", "--json", "--policy", str(policy), "--", PYTHON, "-c",
                 "bytearray(1 << 30)"]) == 1
    body = json.loads(capsys.readouterr().out)
    assert [v["kind"] for v in body["violations"]] == ["limits.memory"]
