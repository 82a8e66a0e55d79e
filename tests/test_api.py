"""`stockade.run` and `stockade.arun`, shaped like subprocess.run: real commands in the real
sandbox (check, text, output destinations, env, os.PathLike, shell, timeout), and the refusals
of what the API cannot mean."""

from __future__ import annotations

import asyncio
import inspect
import os
import pydoc
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import PYTHON, policy_for

import stockade
from stockade.errors import PolicyError, UsageError

pytestmark = pytest.mark.usefixtures("linux")


def test_a_result_answers_as_a_completed_process(ws):
    workspace, _ = ws
    r = stockade.run(["sh", "-c", "echo out; echo err >&2; exit 3"], workspace=workspace)
    assert (r.returncode, r.args, r.stdout, r.stderr) == (
        3, ["sh", "-c", "echo out; echo err >&2; exit 3"], b"out\n", b"err\n")
    assert r.exit_code == 3 and r.exit_status == 3  # (the older names still answer)
    with pytest.raises(subprocess.CalledProcessError) as caught:
        r.check_returncode()
    error = caught.value
    assert isinstance(error, stockade.CommandFailed) and error.result is r
    assert (error.returncode, error.cmd, error.stdout, error.stderr) == (
        3, r.args, b"out\n", b"err\n")
    assert "returned non-zero exit status 3" in str(error)
    assert stockade.run(["true"], workspace=workspace).check_returncode() is None


def test_check_raises_for_a_failure_and_returns_a_success(ws):
    workspace, _ = ws
    with pytest.raises(stockade.CommandFailed) as caught:
        stockade.run(["sh", "-c", "echo partial; exit 5"], workspace=workspace, check=True)
    assert caught.value.returncode == 5 and caught.value.output == b"partial\n"
    assert stockade.run(["echo", "ok"], workspace=workspace, check=True).stdout == b"ok\n"


def test_a_command_killed_by_a_signal_has_a_negative_returncode(ws):
    """As subprocess: -N; `exit_status` is the shell's 128 + N, what `stockade run` exits."""
    workspace, _ = ws
    r = stockade.run(["sh", "-c", "kill -TERM $$"], workspace=workspace)
    assert (r.returncode, r.exit_status, r.signal, r.exit_code) == (-15, 143, 15, None)
    with pytest.raises(stockade.CommandFailed, match=r"died with <Signals.SIGTERM: 15>"):
        r.check_returncode()
    assert r.to_json()["returncode"] == -15 and r.to_json()["exit_status"] == 143


def test_text_mode_takes_and_gives_str(ws):
    workspace, _ = ws
    r = stockade.run(["sh", "-c", 'cat; printf "a\\r\\nb\\rc"'], workspace=workspace,
                     input="é input\n", text=True)
    assert r.stdout == "é input\na\nb\nc" and r.stderr == ""  # universal newlines
    latin = stockade.run(["printf", "\\351"], workspace=workspace, encoding="latin-1")
    assert latin.stdout == "é"
    replaced = stockade.run(["printf", "\\377"], workspace=workspace, text=True,
                            errors="replace", encoding="utf-8")
    assert replaced.stdout == "\ufffd"
    with pytest.raises(UsageError, match="input is a str: pass text=True"):
        stockade.run(["cat"], workspace=workspace, input="text")


def test_text_output_cut_inside_a_character_is_decoded_up_to_it(ws):
    workspace, _ = ws
    r = stockade.run(["printf", "aé"], policy_for(output=2), workspace=workspace, text=True,
                     encoding="utf-8")
    assert r.stdout == "a" and r.stdout_truncated


def test_output_destinations(ws, tmp_path, capfd):
    workspace, _ = ws
    both = ["sh", "-c", "echo out; echo err >&2"]
    dropped = stockade.run(both, workspace=workspace, stdout=stockade.DEVNULL)
    assert (dropped.stdout, dropped.stderr) == (None, b"err\n")
    merged = stockade.run(["sh", "-c", "echo 1; echo 2 >&2; echo 3"], workspace=workspace,
                          stderr=stockade.STDOUT)
    assert (merged.stdout, merged.stderr) == (b"1\n2\n3\n", None)
    log = tmp_path / "log"
    with open(log, "w") as f:
        f.write("first\n")  # buffered: flushed before the command's output follows it
        relayed = stockade.run(both, workspace=workspace, stdout=f, stderr=f.fileno())
    assert (relayed.stdout, relayed.stderr) == (None, None)
    assert sorted(log.read_text().splitlines()) == ["err", "first", "out"]
    assert log.read_text().startswith("first\n")
    capfd.readouterr()
    shown = stockade.run(both, workspace=workspace, capture_output=False)
    assert (shown.stdout, shown.stderr) == (None, None)
    assert capfd.readouterr() == ("out\n", "err\n")
    captured = stockade.run(both, workspace=workspace, capture_output=True)
    assert (captured.stdout, captured.stderr) == (b"out\n", b"err\n")


def test_relayed_output_is_cut_at_the_output_limit(ws, tmp_path):
    """Issue 30: output relayed into a file (or this process's stdout) is cut at
    limits.output like captured output, and the Result says so for each stream."""
    workspace, _ = ws
    log, errors = tmp_path / "log", tmp_path / "errors"
    with open(log, "wb") as out, open(errors, "wb") as err:
        r = stockade.run(["sh", "-c", "head -c 100000 /dev/zero; head -c 5000 /dev/zero >&2"],
                         policy_for(output=1000), workspace=workspace, stdout=out, stderr=err)
    assert r.exit_code == 0 and (r.stdout, r.stderr) == (None, None)
    assert log.read_bytes() == b"\0" * 1000 and errors.read_bytes() == b"\0" * 1000
    assert [v.detail for v in r.violations if v.kind == "limits.output"] == [
        "stdout cut at 1000 bytes", "stderr cut at 1000 bytes"]


@pytest.mark.parametrize(("options", "message"), [
    ({"capture_output": True, "stdout": subprocess.DEVNULL}, "may not be given with"),
    ({"stdout": subprocess.STDOUT}, "STDOUT is for stderr"),
    ({"stdout": object()}, "stdout must be PIPE, DEVNULL, None, a descriptor or a file"),
    ({"stderr": True}, "stderr must be PIPE"),
    ({"timeout": "5 parsecs"}, "timeout='5 parsecs': expected a duration"),
    ({"timeout": True}, "timeout=True: expected a duration"),
    ({"timeout": -1}, "expected a positive duration"),
    ({"input": 5}, "input must be bytes (str in text mode), got int"),
    ({"env": ["A=1"]}, "env must be a mapping"),
])
def test_what_the_api_cannot_mean_is_a_usage_error(ws, options, message):
    workspace, _ = ws
    marker = workspace / "ran"
    with pytest.raises(UsageError, match=re.escape(message)):
        stockade.run(["touch", str(marker)], policy_for(), workspace=workspace, **options)
    assert not marker.exists()


def test_a_workspace_or_cwd_that_is_no_directory_is_named(ws, tmp_path):
    workspace, _ = ws
    (workspace / "file").write_text("")
    for options, error, text in (
            ({"workspace": tmp_path / "missing"}, UsageError,
             f'workspace {tmp_path / "missing"}: not a directory'),
            ({"workspace": workspace / "file"}, UsageError, "not a directory"),
            ({"workspace": workspace, "cwd": workspace / "missing"}, PolicyError,
             f"process.cwd: working directory {workspace / 'missing'} does not exist"),
            ({"workspace": workspace, "cwd": workspace / "file"}, PolicyError,
             f"process.cwd: working directory {workspace / 'file'} is not a directory")):
        with pytest.raises(error, match=re.escape(text)):
            stockade.run(["true"], **options)


def test_a_string_is_refused_unless_shell_is_asked_for(ws):
    workspace, _ = ws
    with pytest.raises(UsageError, match=r"not a string .*shell=True"):
        stockade.run("echo hi", workspace=workspace)
    assert stockade.run("echo $((6 * 7))", workspace=workspace, shell=True).stdout == b"42\n"
    r = stockade.run(['echo "$0 $1"', "zero", "one"], workspace=workspace, shell=True)
    assert (r.stdout, r.args) == (b"zero one\n", ['echo "$0 $1"', "zero", "one"])
    assert stockade.run("exit 4", workspace=workspace, shell=True).args == "exit 4"


def test_env_adds_to_the_closed_environment(ws):
    workspace, _ = ws
    r = stockade.run(["sh", "-c", 'echo "$GREETING $WHERE $PATH"'], workspace=workspace,
                     env={"GREETING": "hello", "WHERE": workspace / "sub"})
    greeting, where, path = r.stdout.decode().split()
    assert (greeting, where) == ("hello", str(workspace / "sub"))
    assert path == os.environ["PATH"]  # the policy's own variables are kept


@pytest.mark.parametrize(("name", "why"), [
    ("LD_PRELOAD", "loader injection"), ("GITHUB_TOKEN", "looks like a credential"),
    ("BASH_ENV", "loader injection")])
def test_env_refuses_what_the_policy_refuses_by_name_never_by_value(ws, name, why):
    workspace, _ = ws
    with pytest.raises(PolicyError) as caught:
        stockade.run(["true"], workspace=workspace, env={name: "hunter2-value"})
    assert caught.value.code == "env_refused"
    assert name in str(caught.value) and why in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_env_names_and_values_are_checked(ws):
    workspace, _ = ws
    for env, text in (({"BAD-NAME": "x"}, 'expected a variable name such as "PATH"'),
                      ({"N": 5}, "expected a string value, got an integer"),
                      ({"N": "a\0b"}, "without NUL")):
        with pytest.raises(PolicyError, match=text) as caught:
            stockade.run(["true"], workspace=workspace, env=env)
        assert str(caught.value).startswith("policy_invalid: env=: ")


def test_paths_may_be_path_objects(ws, tmp_path):
    workspace, outside = ws
    (workspace / "sub").mkdir()
    (outside / "data").write_text("outside data\n")
    policy = tmp_path / "policy.toml"
    policy.write_text('version = 1\npreset = "workspace-write"\n')
    r = stockade.run([Path("/bin/sh"), "-c", "pwd; cat data 2>&1 || true"], policy,
                     workspace=workspace, cwd=workspace / "sub")
    assert r.stdout.decode().splitlines()[0] == str(workspace / "sub")
    granted = stockade.policy.merge(policy_for(), {"filesystem": {
        "read": [*policy_for().filesystem.read, outside]}})
    r = stockade.run(["cat", outside / "data"], granted, workspace=Path(workspace))
    assert r.stdout == b"outside data\n" and r.args == ["cat", str(outside / "data")]


def test_a_timeout_returns_a_result_and_with_check_raises_timeout_expired(ws):
    workspace, _ = ws
    started = time.monotonic()
    r = stockade.run(["sh", "-c", "echo started; sleep 30"], workspace=workspace, timeout=1)
    assert time.monotonic() - started < 10
    assert r.timed_out and (r.returncode, r.signal) == (-signal.SIGKILL, signal.SIGKILL)
    assert r.stdout == b"started\n" and r.timeout == 1.0
    assert [v.kind for v in r.violations] == ["limits.timeout"]
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        stockade.run(["sleep", "30"], workspace=workspace, timeout="500ms", check=True)
    error = caught.value
    assert isinstance(error, stockade.CommandTimedOut)
    assert isinstance(error, subprocess.CalledProcessError) and error.returncode == -9
    assert error.timeout == 0.5 and error.result.timed_out
    assert str(error) == "Command '['sleep', '30']' timed out after 0.5 seconds"
    with pytest.raises(stockade.CommandTimedOut):
        r.check_returncode()


def test_the_api_gives_the_command_no_stdin_unless_input_is_given(ws):
    """Even when this process's stdin is a pipe, the command reads /dev/null by default."""
    workspace, _ = ws
    program = textwrap.dedent(f"""
        import stockade
        print(stockade.run(["wc", "-l"], workspace={str(workspace)!r}).stdout.decode().strip())
        print(stockade.run(["wc", "-l"], workspace={str(workspace)!r},
                           input=b"1\\n2\\n").stdout.decode().strip())
    """)
    done = subprocess.run([sys.executable, "-c", program], input="piped\n", text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.stdout.split() == ["0", "2"], done.stderr


def test_arun_takes_runs_arguments_and_check(ws):
    workspace, _ = ws
    assert list(inspect.signature(stockade.arun).parameters) == list(
        inspect.signature(stockade.run).parameters)

    async def main() -> tuple[stockade.Result, BaseException]:
        done = await stockade.arun(["cat"], workspace=workspace, input="hi", text=True)
        try:
            await stockade.arun(["false"], workspace=workspace, check=True)
        except stockade.CommandFailed as exc:
            return done, exc
        raise AssertionError("check=True did not raise")

    done, failed = asyncio.run(main())
    assert done.stdout == "hi" and failed.returncode == 1


def test_cancelling_arun_kills_the_tree(ws):
    workspace, _ = ws

    async def main() -> float:
        task = asyncio.ensure_future(stockade.arun(
            [PYTHON, "-c", "import time; time.sleep(60)"], policy_for(), workspace=workspace))
        await asyncio.sleep(1)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert asyncio.run(main()) < 10


def test_the_cancel_event_still_cancels(ws):
    workspace, _ = ws
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    r = stockade.run(["sleep", "30"], workspace=workspace, cancel=cancel)
    assert r.cancelled and r.returncode == -9


def test_help_shows_the_arguments_and_what_they_mean():
    for function in (stockade.run, stockade.arun):
        text = pydoc.render_doc(function)
        for word in ("capture_output", "check", "text", "encoding", "env", "timeout",
                     "shell", "CommandFailed", "TimeoutExpired"):
            assert word in text, (function.__name__, word)
    assert "CompletedProcess" in pydoc.render_doc(stockade.Result)
    for name, parameter in inspect.signature(stockade.run).parameters.items():
        assert parameter.annotation is not inspect.Parameter.empty, name
