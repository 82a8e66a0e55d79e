"""`stockade session start|exec|stop|list` against a real daemon (served on a thread of this
process), driven through `main()` and, where live output or stdin matter, a CLI subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import gone, marked
from test_cli import REPO, one_error_line
from test_session_daemon import serving

from stockade.cli import main
from stockade.session.client import DaemonClient


@pytest.fixture
def daemon(linux, tmp_path):
    with serving(str(tmp_path / "run" / "daemon.sock")) as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def session(daemon, action: str, *words: str) -> list[str]:
    """`session ACTION WORDS...` with the test daemon's socket (and `-- argv` kept last)."""
    cut = words.index("--") if "--" in words else len(words)
    return ["session", action, *words[:cut], "--socket", daemon.path, *words[cut:]]


def cli(args: list[str], **options) -> subprocess.Popen:
    """`python -m stockade ARGS` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "stockade", *args], env=env, **options)


def test_start_exec_list_stop_round_trip(daemon, workspace, capfd):
    source = ("--preset", "workspace-write", "--workspace", str(workspace))
    assert main(session(daemon, "start", "a", *source)) == 0
    assert "session 'a' is ready" in capfd.readouterr().err
    status = main(session(daemon, "exec", "a", *source, "--",
                          "sh", "-c", "echo one > /tmp/mark; echo out; echo err >&2; exit 7"))
    assert (status, *capfd.readouterr()) == (7, "out\n", "err\n")
    assert main(session(daemon, "exec", "a", *source, "--", "cat", "/tmp/mark")) == 0
    assert capfd.readouterr().out == "one\n"  # the same warm sandbox: its /tmp persisted
    assert main(session(daemon, "list", "--json")) == 0
    [listed] = json.loads(capfd.readouterr().out)
    assert (listed["session"], listed["ready"], listed["busy"]) == ("a", True, False)
    assert main(session(daemon, "list")) == 0
    header, row = capfd.readouterr().out.splitlines()
    assert header.split() == ["SESSION", "READY", "BUSY", "COMMANDS", "IDLE"]
    assert row.split()[:4] == ["a", "yes", "no", str(listed["commands"])]
    assert main(session(daemon, "stop", "a")) == 0
    assert main(session(daemon, "list")) == 0
    assert capfd.readouterr().out.endswith("no sessions\n")


def test_exec_boots_a_session_and_a_different_policy_is_a_mismatch(daemon, workspace, capfd):
    assert main(session(daemon, "exec", "b", "--workspace", str(workspace), "--", "true")) == 0
    status = main(session(daemon, "exec", "b", "--preset", "workspace-write",
                          "--workspace", str(workspace), "--", "true"))
    assert status == 70
    one_error_line(capfd.readouterr().err, "session_mismatch")


@pytest.mark.parametrize(("script", "status"), [("exit 7", 7), ("kill -9 $$", 137), ("true", 0)])
def test_exit_status_passes_through(daemon, workspace, script, status):
    assert main(session(daemon, "exec", "s", "--workspace", str(workspace), "--",
                        "sh", "-c", script)) == status


def test_cwd_env_and_timeout_reach_the_command(daemon, workspace, capfd):
    (workspace / "sub").mkdir()
    status = main(session(daemon, "exec", "s", "--preset", "workspace-write",
                          "--workspace", str(workspace), "--cwd", str(workspace / "sub"),
                          "--env", "GREETING=hi there", "--timeout", "1s",
                          "--", "sh", "-c", 'echo "$PWD $GREETING"; sleep 5'))
    out, err = capfd.readouterr()
    assert status == 137 and out == f"{workspace / 'sub'} hi there\n"
    assert "limits.timeout" in err


def test_json_prints_the_result(daemon, workspace, capfd):
    status = main(session(daemon, "exec", "s", "--workspace", str(workspace), "--json", "--",
                          "sh", "-c", "echo out; exit 3"))
    result = json.loads(capfd.readouterr().out)
    assert status == 3 and result["returncode"] == 3 and result["stdout"] == "out\n"
    assert result["backend"] == "linux-session"


def test_command_not_found_is_71_with_one_line(daemon, workspace, capfd):
    assert main(session(daemon, "exec", "s", "--workspace", str(workspace), "--",
                        "no-such-command-xyz")) == 71
    one_error_line(capfd.readouterr().err, "command_not_found")


def test_output_is_relayed_as_it_arrives(daemon, workspace):
    command = cli(session(daemon, "exec", "live", "--workspace", str(workspace), "--",
                          "sh", "-c", "echo first; sleep 3; echo second"),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = command.stdout.readline()
    seen = time.monotonic()
    rest, _ = command.communicate(timeout=60)
    assert (first, rest, command.returncode) == (b"first\n", b"second\n", 0)
    assert time.monotonic() - seen > 2  # the first line came while the command still ran


def test_stdin_is_handed_over_when_the_policy_inherits_it(daemon, workspace, tmp_path):
    policy = tmp_path / "stdin.toml"
    policy.write_text('version = 1\npreset = "read-only"\n[process]\nstdin = "inherit"\n')
    data = bytes(range(256)) * 64
    command = cli(session(daemon, "exec", "in", "--policy", str(policy),
                          "--workspace", str(workspace), "--", "cat"),
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = command.communicate(data, timeout=60)
    assert (command.returncode, out) == (0, data)


def test_stdin_is_not_handed_over_when_the_policy_says_null(daemon, workspace):
    # As `stockade run`: the presets read stdin from /dev/null.
    command = cli(session(daemon, "exec", "null", "--workspace", str(workspace), "--", "cat"),
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = command.communicate(b"not for the sandbox", timeout=60)
    assert (command.returncode, out) == (0, b"")


def _start_marked(daemon, source: tuple[str, ...], token: str) -> subprocess.Popen:
    """`session exec` of a command that leaves a child in the background and a grandchild
    in a session of its own, all three with `token` in their argv; returns once all run."""
    command = cli(session(daemon, "exec", "long", *source, "--", "sh", "-c",
                          f"touch /tmp/mark; sleep {token} & setsid sleep {token} & "
                          f"echo started; sleep {token}"),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert command.stdout.readline() == b"started\n"
    deadline = time.monotonic() + 10
    while len(marked(f"sleep\0{token}")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(marked(f"sleep\0{token}")) == 3
    return command


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_cancels_the_command_and_the_session_is_free_at_once(daemon, workspace, stop):
    """Ctrl-C (or SIGTERM) on `session exec`: the command and all it started end; the CLI
    exits 128 + the signal once they have; the next command in the same warm session runs at
    once."""
    token = f"{os.getpid()}.{stop}"  # (`sleep` takes a fraction: an argv no other test uses)
    source = ("--preset", "workspace-write", "--workspace", str(workspace))
    command = _start_marked(daemon, source, token)
    try:
        command.send_signal(stop)
        began = time.monotonic()
        _, err = command.communicate(timeout=15)
        ended = time.monotonic() - began
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode == 128 + stop, err
    assert marked(f"sleep\0{token}") == []  # gone by the time the CLI exits
    assert ended < 10 and b"cancelled" in err, (ended, err)  # (bounded, generous under load)
    [listed] = DaemonClient(daemon.path).sessions()
    assert (listed["session"], listed["busy"]) == ("long", False)
    began = time.monotonic()
    status = main(session(daemon, "exec", "long", *source, "--", "test", "-e", "/tmp/mark"))
    assert (status, time.monotonic() - began < 10) == (0, True)  # answered, not stuck


def test_a_killed_client_cancels_its_command(daemon, workspace):
    """A `session exec` killed outright (no handler runs): its connection closing is enough
    for the daemon to end the command and all it started."""
    token = f"{os.getpid()}.99"
    command = _start_marked(daemon, ("--workspace", str(workspace)), token)
    command.kill()
    command.communicate()
    assert gone(f"sleep\0{token}", within=5)


def test_stopping_an_unknown_session_is_1_with_a_message(daemon, capfd):
    assert main(session(daemon, "stop", "nobody")) == 1
    err = capfd.readouterr().err
    assert err == "stockade: no_session: no session named 'nobody' " \
                  "(see 'stockade session list')\n"


# --- without a daemon, and usage errors (nothing reaches a daemon) ----------------------------

@pytest.mark.parametrize("action", [["list"], ["stop", "x"], ["start", "x"],
                                    ["exec", "x", "--", "true"]])
def test_no_daemon_is_daemon_unavailable_exit_70(tmp_path, capfd, action):
    args = ["session", action[0], *action[1:2], "--socket", str(tmp_path / "none.sock"),
            *action[2:]]
    assert main(args) == 70
    out, err = capfd.readouterr()
    assert out == ""
    one_error_line(err, "daemon_unavailable")


def test_no_daemon_with_json_prints_an_error_object(tmp_path, capfd):
    assert main(["session", "exec", "x", "--socket", str(tmp_path / "none.sock"), "--json",
                 "--", "true"]) == 70
    out, err = capfd.readouterr()
    assert json.loads(out)["error"]["code"] == "daemon_unavailable"
    one_error_line(err, "daemon_unavailable")


@pytest.mark.parametrize(("args", "needle"), [
    (["session", "exec", "x", "--bogus", "--", "true"], "--bogus"),
    (["session", "exec", "x", "true"], "put the command after '--'"),
    (["session", "exec", "x"], "missing '--'"),
    (["session", "exec", "x", "--"], "no command after '--'"),
    (["session", "exec", "x", "--timeout", "soon", "--", "true"], "--timeout"),
    (["session", "exec", "x", "--env", "NOVALUE", "--", "true"], "NAME=VALUE"),
    (["session", "exec", "x", "--preset", "no-such", "--", "true"], "unknown preset"),
    (["session", "exec", "x", "--preset", "read-only", "--policy", "p.toml", "--", "true"],
     "not allowed with"),
    (["session", "start"], "NAME"),
    (["session", "stop", "x", "--", "true"], "'--'"),
    (["session", "list", "extra"], "extra"),
    (["session"], "ACTION"),
])
def test_bad_usage_is_exit_2_with_one_line(tmp_path, capfd, args, needle):
    assert main(args) == 2
    err = capfd.readouterr().err
    assert len(err.splitlines()) == 1 and needle in err, err
    assert err.startswith(("stockade: usage: ", "stockade: policy_invalid: "))


def test_a_refused_variable_is_exit_2(tmp_path, capfd):
    assert main(["session", "exec", "x", "--socket", str(tmp_path / "none.sock"), "--env",
                 "LD_PRELOAD=/x.so", "--", "true"]) == 2
    assert "/x.so" not in one_error_line(capfd.readouterr().err, "env_refused")
