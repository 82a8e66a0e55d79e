"""The `stockade` command line: in-process through `main()` and as `python -m stockade`."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import interrupted_json_run

import stockade
from stockade import demo
from stockade.cli import main, to_toml
from stockade.policy import parse_policy, preset

REPO = Path(__file__).resolve().parent.parent


def sandboxed(test: Callable) -> Callable:
    """Marks a test that runs a real sandbox (conftest's `linux` fixture skips or fails it)."""
    return pytest.mark.linux(pytest.mark.usefixtures("linux")(test))


def cli(*args: str, cwd: Path, **options: Any) -> subprocess.CompletedProcess[str]:
    """`python -m stockade ARGS` in a fresh process, as an operator would run it (`options`
    go to subprocess.run: `input`, `stdin`)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "stockade", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, **options)


def one_error_line(stderr: str, code: str) -> str:
    """The single stderr line of a Stockade error with `code`."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"stockade: {code}: "), stderr
    return lines[0]


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def bad_policy(tmp_path: Path) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"version": 1, "preset": "read-only",
                                "filesystem": {"raed": ["/opt"]}}))
    return path


# --- run: exit status and output ---------------------------------------------------------------


@sandboxed
def test_run_passes_output_and_exit_status_through(workspace, capfd):
    status = main(["run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"])
    out, err = capfd.readouterr()
    assert (status, out, err) == (7, "out\n", "err\n")


@sandboxed
def test_relayed_output_is_cut_at_the_output_limit(workspace):
    """Issue 30: `stockade run` relays the command's output through its own pipes, and
    limits.output holds on the way through: the rest is dropped, and said on stderr."""
    policy = workspace / "small.toml"
    policy.write_text('version = 1\npreset = "workspace-write"\n[limits]\noutput = "1KiB"\n')
    done = cli("run", "--policy", str(policy), "--", "sh", "-c", "yes | head -c 100000",
               cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "y\n" * 512
    assert done.stderr == "stockade: stdout cut at 1024 bytes, the sandbox's output limit: the " \
        "rest of it was dropped; the policy grant that would allow it: limits.output\n"


@sandboxed
def test_an_empty_argument_reaches_the_command(workspace, capfd):
    """`ssh-keygen -N ''`: an empty string is an argument like any other."""
    assert main(["run", "--", "sh", "-c", 'printf "[%s]" "$@"', "sh", "-N", "", "-f"]) == 0
    assert capfd.readouterr().out == "[-N][][-f]"


@sandboxed
def test_run_killed_by_signal_is_128_plus_n(workspace, capfd):
    assert main(["run", "--", "sh", "-c", "kill -9 $$"]) == 137


@sandboxed
@pytest.mark.parametrize(("script", "status"), [("exit 7", 7), ("kill -9 $$", 137), ("true", 0)])
def test_subprocess_exit_status(tmp_path, script, status):
    assert cli("run", "--", "sh", "-c", script, cwd=tmp_path).returncode == status


@sandboxed
def test_command_not_found_is_71_with_one_line(workspace, capfd):
    assert main(["run", "--", "no-such-command-xyz"]) == 71
    one_error_line(capfd.readouterr().err, "command_not_found")


@sandboxed
def test_subprocess_command_not_found(tmp_path):
    done = cli("run", "--", "no-such-command-xyz", cwd=tmp_path)
    assert done.returncode == 71
    one_error_line(done.stderr, "command_not_found")


@sandboxed
def test_timeout_kills_and_reports_the_violation(workspace, capfd):
    assert main(["run", "--timeout", "1s", "--", "sleep", "30"]) == 137
    err = capfd.readouterr().err
    assert "stockade: the command was killed after 1s, the sandbox's time limit; the policy " \
        "grant that would allow it: limits.timeout\n" in err


@sandboxed
def test_read_and_write_flags_extend_the_policy(workspace, tmp_path_factory, capfd):
    extra = tmp_path_factory.mktemp("extra")
    status = main(["run", "--write", str(extra), "--", "sh", "-c", f"echo x > {extra}/made"])
    assert status == 0
    assert (extra / "made").read_text() == "x\n"
    assert main(["run", "--", "sh", "-c", f"echo x > {extra}/again"]) != 0
    assert not (extra / "again").exists()


@sandboxed
def test_allow_domain_goes_through_the_proxy_and_denials_are_summarised(workspace, capfd):
    from conftest import PYTHON, PYTHON_ROOT
    fetch = ("import urllib.request as u\n"
             "try: u.urlopen('http://denied.example/', timeout=10)\n"
             "except Exception as e: print('child saw', e)")
    assert main(["run", "--allow-domain", "allowed.example", "--read", PYTHON_ROOT, "--",
                 PYTHON, "-c", fetch]) == 0
    out, err = capfd.readouterr()
    assert "child saw HTTP Error 403" in out
    assert "stockade: the sandbox's network proxy refused http denied.example:80: not_allowed: " \
        "the host is not in network.allow; the policy grant that would allow it: network.allow " \
        "denied.example:80\n" in err


@sandboxed
@pytest.mark.parametrize(("flags", "interfaces"), [
    (["--network", "any"], "lo+1"),
    (["--reach", "10.0.0.5:5432"], "lo+1"),
    (["--preset", "networked-build", "--network", "none"], "lo"),
])
def test_network_flags_set_the_mode(workspace, capfd, flags, interfaces):
    """--network and --reach switch the mode (the child counts its interfaces: mode any has
    pasta's besides its own loopback), over the policy's own network section."""
    from conftest import PYTHON, PYTHON_ROOT
    count = ("names = [line.split(':')[0].strip() for line in open('/proc/net/dev')][2:]\n"
             "print('+'.join(['lo'] + [str(len(names) - 1)] * (len(names) > 1)))")
    assert main(["run", *flags, "--read", PYTHON_ROOT, "--", PYTHON, "-c", count]) == 0
    assert capfd.readouterr().out.strip() == interfaces


@sandboxed
def test_network_any_in_the_landlock_tier_is_refused_as_unenforceable(workspace, capfd):
    policy = workspace / "any.toml"
    policy.write_text('version = 1\npreset = "read-only"\nisolation = "landlock"\n'
                      '[network]\nmode = "any"\n')
    assert main(["run", "--policy", str(policy), "--", "true"]) == 70
    one_error_line(capfd.readouterr().err, "unenforceable:network.any")


# --- run: stdin --------------------------------------------------------------------------------


@sandboxed
def test_piped_stdin_reaches_the_command_unless_told_otherwise(workspace):
    """`echo x | stockade run -- wc -l` counts 1, as the command run directly would; --stdin
    null, or a policy's process.stdin = "null", gives it /dev/null; the flag wins."""
    assert cli("run", "--", "wc", "-l", cwd=workspace, input="x\ny\n").stdout.strip() == "2"
    assert cli("run", "--stdin", "null", "--", "wc", "-l", cwd=workspace,
               input="x\n").stdout.strip() == "0"
    with open(workspace / "in.txt", "w") as f:
        f.write("from a file\n")
    with open(workspace / "in.txt") as f:
        assert cli("run", "--", "cat", cwd=workspace, stdin=f).stdout == "from a file\n"
    for mode, flag, lines in (("null", [], "0"), ("inherit", [], "1"),
                              ("inherit", ["--stdin", "null"], "0"),
                              ("null", ["--stdin", "inherit"], "1")):
        policy = workspace / f"{mode}.toml"
        policy.write_text(f'version = 1\npreset = "read-only"\n[process]\nstdin = "{mode}"\n')
        done = cli("run", "--policy", str(policy), *flag, "--", "wc", "-l", cwd=workspace,
                   input="x\n")
        assert (done.returncode, done.stdout.strip()) == (0, lines), (mode, flag, done.stderr)


@sandboxed
@pytest.mark.parametrize("flag", [[], ["--stdin", "inherit"]])
def test_what_is_typed_on_a_terminal_reaches_the_command_only_when_asked(workspace, flag):
    """On a terminal the default is /dev/null: the typed line stays for the shell. With
    --stdin inherit it arrives through a pipe: the terminal itself never enters."""
    import pty

    master, slave = pty.openpty()
    try:
        os.write(master, b"typed-secret\n")
        script = 'read -r line; echo "got:$line"; [ -t 0 ] && echo "a terminal"; true'
        done = cli("run", *flag, "--", "sh", "-c", script, cwd=workspace, stdin=slave,
                   start_new_session=True)
        assert done.returncode == 0, done.stderr
        if flag:
            assert done.stdout == "got:typed-secret\n"
        else:
            assert done.stdout == "got:\n"
            os.set_blocking(slave, False)
            assert os.read(slave, 100) == b"typed-secret\n"  # still there, for the shell
    finally:
        os.close(master)
        os.close(slave)


@sandboxed
@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_json_on_ctrl_c_prints_the_cancelled_result(workspace, sigint):
    """Issue 32: `run --json` printed nothing on Ctrl-C; now the command is cancelled and its
    Result printed (what it wrote so far, cancelled), exit 130; also where SIGINT was ignored
    when it started (its handler is its own)."""
    status, result = interrupted_json_run({**os.environ, "PYTHONPATH": str(REPO),
                                           "STOCKADE_NO_SERVER": "1"}, workspace, sigint)
    assert status == 130
    assert result["cancelled"] is True and result["stdout"] == "started\n"
    assert [v["kind"] for v in result["violations"]] == ["cancelled"]


@sandboxed
def test_a_name_the_command_chose_is_escaped_in_stockades_own_lines(workspace):
    """Issue 29, T1: the command prints nothing, but names a directory that holds an escape
    sequence, a forged "stockade: all clear ..." line and a byte that is not UTF-8; Stockade's
    own lines on the denials name it escaped, one line each, and so does --json."""
    from conftest import PYTHON, PYTHON_ROOT
    from test_protected_create import HOSTILE_NAMES
    done = cli("run", "--preset", "workspace-write", "--read", PYTHON_ROOT, "--", PYTHON,
               "-c", HOSTILE_NAMES, cwd=workspace)
    assert done.returncode == 0 and done.stdout == "", done
    assert not [p for p, dirs, _ in os.walk(workspace) if ".codex" in dirs]
    assert done.stderr.isascii() and "\x1b" not in done.stderr and "\r" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("stockade: the sandbox did not make a protected name: "), line
    assert "x\\x1b[2K\\x0d\\x0astockade: all clear." in line, line
    assert "\\x0a\\x1b[8m\\u200b\\xff/.codex: not made" in line, line
    done = cli("run", "--json", "--preset", "workspace-write", "--read", PYTHON_ROOT, "--",
               PYTHON, "-c", HOSTILE_NAMES, cwd=workspace)
    [violation] = json.loads(done.stdout)["violations"]
    assert violation["detail"].isprintable() and "\\xff/.codex" in violation["detail"]


@sandboxed
def test_a_refusal_quoting_what_the_command_chose_is_escaped(workspace):
    """Issue 29 T2: run 1 leaves a `.git` link (git's own name, which a command may make)
    in a directory whose name, like the link's text, holds an escape sequence and a forged
    "stockade: all clear" line. The next launch is refused, `unenforceable:filesystem.git`,
    quoting both: its stderr line (plain and --json) and the API's exception text hold them
    escaped, no ESC (failed before: 9 raw ESC erased the line and concealed the rest)."""
    from conftest import PYTHON, PYTHON_ROOT, policy_for
    from test_protected_create import HOSTILE_DIRECTORY
    plant = (f"import os; d = {HOSTILE_DIRECTORY!r}; os.makedirs(d); "
             f"os.symlink(d[1:], os.path.join(d, b'.git'))")
    done = cli("run", "--preset", "workspace-write", "--read", PYTHON_ROOT, "--", PYTHON,
               "-c", plant, cwd=workspace)
    assert done.returncode == 0, done.stderr
    for json_mode in ([], ["--json"]):
        done = cli("run", *json_mode, "--preset", "workspace-write", "--", "true",
                   cwd=workspace)
        line = one_error_line(done.stderr, "unenforceable:filesystem.git")
        assert done.returncode != 0 and "\x1b" not in done.stderr + done.stdout, done
        assert done.stderr.isascii() and "|sh\\x0a\\x1b[8m\\u200b\\xff/.git)" in line, line
    with pytest.raises(stockade.StockadeError) as refused:
        stockade.run(["true"], policy_for(), workspace=workspace)
    assert refused.value.code == "unenforceable:filesystem.git"
    assert "\x1b" not in str(refused.value) and "\\x1b[8m" in str(refused.value)


@sandboxed
def test_json_gives_output_that_is_not_utf8_whole_in_base64(workspace, capfd):
    """Issue 32: --json turned undecodable bytes into U+FFFD; they are now also given whole."""
    assert main(["run", "--json", "--", "sh", "-c", r"printf '\377\376ok'; printf 'fine' >&2"]) == 0
    result = json.loads(capfd.readouterr().out)
    assert result["stdout"] == "\ufffd\ufffdok"
    assert base64.b64decode(result["stdout_base64"]) == b"\xff\xfeok"
    assert (result["stderr"], result["stderr_base64"]) == ("fine", None)


@sandboxed
@pytest.mark.parametrize("script, flag, hinted", [
    ("read -r line || exit 3", [], True),          # the prompt read EOF: say why
    ("read -r line || exit 0", [], False),         # it did not fail: nothing to say
    ("read -r line || exit 3", ["--stdin", "null"], False),  # asked for: nothing to say
])
def test_a_failed_command_with_a_terminal_left_out_is_given_a_hint(workspace, script, flag,
                                                                   hinted):
    """Issue 32: a program prompting on a terminal got EOF with no hint of --stdin inherit."""
    import pty

    master, slave = pty.openpty()
    try:
        done = cli("run", *flag, "--", "sh", "-c", script, cwd=workspace, stdin=slave,
                   start_new_session=True)
    finally:
        os.close(master)
        os.close(slave)
    hint = ("stockade: hint: the command's stdin was /dev/null, not this terminal; if it "
            "asked for input, run it with --stdin inherit")
    assert (hint in done.stderr.splitlines()) is hinted, done.stderr


def test_run_help_says_the_tmp_of_the_command_does_not_last(capsys):
    """Issue 32: writes to /tmp vanished into the sandbox's own tmpfs unsaid."""
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "The command's /tmp is its own, empty, and gone when it ends" in text


def test_run_help_says_what_stdin_is_by_default(capsys):
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--stdin {null,inherit}" in text
    assert "inherit when stdin is a pipe or a file" in text
    assert "null when it is a terminal" in text


# --- run: usage and policy mistakes ------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["run"],
    ["run", "--"],
    ["run", "sh", "-c", "true"],
    ["run", "--preset", "no-such-preset", "--", "true"],
    ["run", "--timeout", "5 parsecs", "--", "true"],
    ["run", "--timeout", "-1s", "--", "true"],
    ["run", "--read", "{nowhere}/x", "--", "true"],
    ["run", "--allow-domain", "http://bad", "--", "true"],
    ["run", "--network", "allowlist", "--", "true"],
    ["run", "--network", "none", "--reach", "10.0.0.5", "--", "true"],
    ["run", "--network", "any", "--allow-domain", "example.org", "--", "true"],
    ["run", "--reach", "example.org", "--", "true"],
    ["run", "--policy", "a.toml", "--preset", "read-only", "--", "true"],
    ["sandbox-exec", "--", "true"],
    ["policy", "show", "--", "x"],
    ["no-such-command"],
    ["run", "--stdin", "terminal", "--", "true"],
    ["run", "--workspace", "", "--", "true"],
    ["run", "--", ""],
    ["run", "--policy", "no-such.toml", "--", "true"],
    ["--state-dir", "", "run", "--", "true"],
    ["daemon", "--idle", "-1"],
    ["daemon", "--idle", "soon"],
    ["session", "exec", "s", "--timeout", "-5", "--", "true"],
    ["exec", "no-such.json"],
])
def test_usage_mistakes_are_2_with_one_line(workspace, capfd, args):
    assert main(args) == 2
    err = capfd.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("stockade: "), err
    assert "Traceback" not in err


def test_a_removed_current_directory_is_a_usage_error(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(["sh", "-c", f'cd {gone} && rmdir {gone} && exec "$0" -m stockade run '
                                       "-- true", sys.executable],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "the current directory has been removed" in one_error_line(done.stderr, "usage")


def buffered_env() -> dict[str, str]:
    """The environment of a CLI whose stdout Python buffers, as a user's shell has it (a
    developer's PYTHONUNBUFFERED hid output that failed only when flushed at exit)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONUNBUFFERED", None)
    return env


@pytest.mark.parametrize("args", [["policy", "show"], ["policy", "show", "--toml"],
                                  ["--version"]])
def test_output_that_cannot_be_written_is_one_line_and_74(tmp_path, args):
    env = buffered_env()
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "stockade", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                              timeout=120)
    assert done.returncode == 74, done.stderr
    assert "No space left on device" in one_error_line(done.stderr, "output_failed")


def test_missing_cut_is_explained(workspace, capsys):
    assert main(["run", "sh", "-c", "true"]) == 2
    assert "put the command after '--'" in capsys.readouterr().err
    assert main(["run"]) == 2
    assert "missing '--'" in capsys.readouterr().err


def test_unknown_preset_names_the_known_ones(workspace, capsys):
    assert main(["run", "--preset", "nope", "--", "true"]) == 2
    line = one_error_line(capsys.readouterr().err, "policy_invalid")
    assert '"nope"' in line and "read-only" in line


def test_flag_errors_are_located_at_the_flag(workspace, capsys):
    assert main(["run", "--read", "/ok", "--read", "{nowhere}", "--", "true"]) == 2
    line = one_error_line(capsys.readouterr().err, "policy_invalid")
    assert "command line: filesystem.read[1]" in line


def test_bad_policy_file_is_located(workspace, bad_policy, capsys):
    assert main(["run", "--policy", str(bad_policy), "--", "true"]) == 2
    line = one_error_line(capsys.readouterr().err, "policy_invalid")
    assert f"{bad_policy}: filesystem: unknown key \"raed\"" in line


def test_subprocess_bad_policy_has_no_traceback(tmp_path, bad_policy):
    done = cli("run", "--policy", str(bad_policy), "--", "true", cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    one_error_line(done.stderr, "policy_invalid")


def test_subprocess_missing_argv(tmp_path):
    done = cli("run", "--preset", "read-only", cwd=tmp_path)
    assert done.returncode == 2
    one_error_line(done.stderr, "usage")


# --- run: what to change -----------------------------------------------------------------------


@pytest.mark.parametrize("target", ["missing-dir/log", "a-directory"])
def test_an_output_file_that_cannot_be_opened_stops_before_the_command_runs(workspace, target):
    (workspace / "a-directory").mkdir()
    marker = workspace / "ran"
    done = cli("run", "--write", ".", "--network-log", str(workspace / target), "--", "touch",
               str(marker), cwd=workspace)
    assert done.returncode == 2
    line = one_error_line(done.stderr, "usage")
    assert f"--network-log {workspace / target}: cannot be opened for appending (" in line
    assert not marker.exists()


@pytest.mark.parametrize(("redirect", "problem"), [
    (">&-", "stdout is closed"), ("1</dev/null", "stdout is open only for reading")])
def test_json_to_an_unwritable_stdout_stops_before_the_command_runs(workspace, redirect,
                                                                     problem):
    marker = workspace / "ran"
    env = buffered_env()
    done = subprocess.run(["sh", "-c", f'exec "$0" -m stockade run --write . --json -- touch '
                                       f'{marker} {redirect}', sys.executable],
                          cwd=workspace, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--json: {problem}" in one_error_line(done.stderr, "usage")
    assert not marker.exists()


@sandboxed
def test_json_that_cannot_be_written_after_the_run_keeps_the_status(workspace):
    env = buffered_env()
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "stockade", "run", "--json", "--", "sh",
                               "-c", "exit 3"], cwd=workspace, env=env, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 3
    assert done.stderr == ("stockade: output_failed: the JSON result could not be written to "
                           "stdout (No space left on device)\n")


@sandboxed
@pytest.mark.parametrize(("script", "status"), [("echo lost", 74), ("echo lost; exit 3", 3)])
def test_the_commands_output_that_cannot_be_written_on_is_said_never_lost_silently(
        workspace, script, status):
    """What the command prints is relayed: a relay that fails (a full disk) is said, and a
    command that succeeded exits 74 (its output was lost), one that failed keeps its status."""
    env = buffered_env()
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "stockade", "run", "--", "sh", "-c",
                               script], cwd=workspace, env=env, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == status, done.stderr
    assert "stockade: the command's output was not all relayed: stdout could not be written " \
        "on (No space left on device): what followed was lost\n" in done.stderr


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_run_with_a_closed_stream_is_refused_before_it_runs(workspace, closed):
    """A closed stdout or stderr: refused (usage, 2), never a traceback, nothing run."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    fd = {"stdout": 1, "stderr": 2}[closed]
    done = subprocess.run(["sh", "-c", f'exec {fd}>&-; exec "$0" -m stockade run -- touch ran',
                           sys.executable], cwd=workspace, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    shown = done.stdout + done.stderr
    assert f"{closed} is closed, so what the command prints there would be lost" in shown
    assert "Traceback" not in shown
    assert not (workspace / "ran").exists()


@pytest.mark.parametrize(("state", "problem"), [
    ("a-file", "is not a directory"), ("a-file/below", "cannot be made ("),
    ("open", "is writable by other users")])
def test_a_state_dir_problem_names_the_directory(workspace, state, problem):
    (workspace / "a-file").write_text("")
    (workspace / "open").mkdir()
    (workspace / "open").chmod(0o777)
    for command in (["run", "--", "true"], ["reconcile"]):
        done = cli("--state-dir", str(workspace / state), *command, cwd=workspace)
        assert done.returncode == 70, (command, done.stderr)
        line = one_error_line(done.stderr, "ledger_unusable")
        assert f"the state directory {workspace / state} {problem}" in line, line
        assert "choose another with --state-dir or STOCKADE_STATE_DIR" in line
    assert cli("--state-dir", "", "run", "--", "true", cwd=workspace).returncode == 2


def test_an_exec_config_path_error_names_the_configs_key(workspace):
    config = workspace / "config.json"
    config.write_text(json.dumps({"version": 1, "containment": "processcontainer",
                                  "process": {"commandLine": "true"},
                                  "filesystem": {"readRoots": [str(workspace / "missing")]}}))
    done = cli("exec", str(config), cwd=workspace)
    assert done.returncode == 2
    line = one_error_line(done.stderr, "policy_invalid")
    assert line == (f"stockade: policy_invalid: {config}: filesystem.readRoots: path "
                    f"{workspace / 'missing'} does not exist")


# --- run --json --------------------------------------------------------------------------------


@sandboxed
def test_json_result(workspace, capsys):
    assert main(["run", "--json", "--", "sh", "-c", "echo hi; exit 3"]) == 3
    result = json.loads(capsys.readouterr().out)
    assert result["exit_code"] == 3 and result["signal"] is None and result["returncode"] == 3
    assert result["stdout"] == "hi\n" and result["backend"] == "linux"
    assert len(result["digest"]) == 64 and result["duration"] > 0
    assert result["violations"] == [] and "namespaces" in result["enforced"]


@sandboxed
def test_json_result_of_a_timeout(workspace, capsys):
    assert main(["run", "--json", "--timeout", "1", "--", "sleep", "30"]) == 137
    result = json.loads(capsys.readouterr().out)
    assert result["signal"] == 9 and result["timed_out"]
    assert result["violations"] == [{"kind": "limits.timeout", "detail": "killed after 1s",
                                     "network": None}]


@sandboxed
def test_json_refusal(workspace, capsys):
    policy = workspace / "any.toml"
    policy.write_text('version = 1\npreset = "read-only"\nisolation = "landlock"\n'
                      '[network]\nmode = "any"\n')
    assert main(["run", "--json", "--policy", str(policy), "--", "true"]) == 70
    out = capsys.readouterr().out
    error = json.loads(out)["error"]
    assert error["code"] == "unenforceable:network.any" and error["message"]


# --- sandbox-exec ------------------------------------------------------------------------------


@sandboxed
def test_sandbox_exec_with_a_json_policy(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    policy = tmp_path / "module.json"
    policy.write_text(json.dumps({
        "version": 1, "preset": "read-only",
        "filesystem": {"read": ["/usr", "?/bin", "?/lib", "?/lib64"], "write": [str(work)]},
    }))
    script = f"echo data > {work}/out; cat /etc/hostname; exit 5"
    done = cli("sandbox-exec", str(policy), "--", "sh", "-c", script, cwd=work)
    assert done.returncode == 5
    assert "/etc/hostname" in done.stderr  # /etc is not in this policy
    assert (work / "out").read_text() == "data\n"


def test_sandbox_exec_bad_policy(tmp_path, bad_policy):
    done = cli("sandbox-exec", str(bad_policy), "--", "true", cwd=tmp_path)
    assert done.returncode == 2
    one_error_line(done.stderr, "policy_invalid")


# --- policy check / show -----------------------------------------------------------------------


def test_policy_check_ok(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (the workspace: not this checkout, which is host code here)
    path = tmp_path / "p.toml"
    path.write_text('version = 1\npreset = "workspace-write"\n[limits]\ntimeout = "90s"\n')
    assert main(["policy", "check", str(path)]) == 0
    first, _, document = capsys.readouterr().out.partition("\n")
    assert first == "ok"
    assert json.loads(document)["limits"]["timeout"] == 90


def test_policy_check_bad(bad_policy, capsys):
    assert main(["policy", "check", str(bad_policy)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(bad_policy) in one_error_line(captured.err, "policy_invalid")


def test_policy_check_compiles_the_policy_here(tmp_path, capsys):
    """A valid policy that cannot run here (a root that is missing, unless optional) is not
    "ok": exit 2, naming the file, the key, the path and the workspace it was checked for."""
    path = tmp_path / "p.toml"
    missing = tmp_path / "no-such-dir"
    path.write_text(f'version = 1\npreset = "workspace-write"\n[filesystem]\n'
                    f'read = ["/usr", "{missing}"]\n')
    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert main(["policy", "check", str(path), "--workspace", str(workspace)]) == 2
    captured = capsys.readouterr()
    message = one_error_line(captured.err, "policy_invalid")
    assert captured.out == ""
    for needed in (str(path), "filesystem.read", str(missing), f"workspace {workspace}"):
        assert needed in message, message
    path.write_text(path.read_text().replace(f'"{missing}"', f'"?{missing}"'))
    assert main(["policy", "check", str(path), "--workspace", str(workspace)]) == 0
    assert capsys.readouterr().out.startswith("ok\n")
    assert main(["policy", "check", str(path), "--workspace", str(missing)]) == 2
    assert "--workspace" in one_error_line(capsys.readouterr().err, "usage")


def test_policy_show_preset(capsys):
    assert main(["policy", "show", "--preset", "read-only"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["preset"] == "read-only"
    assert parse_policy(document) == preset("read-only")


@pytest.mark.parametrize("name", ["read-only", "networked-build"])
def test_policy_show_toml_round_trips(name, capsys):
    assert main(["policy", "show", "--preset", name, "--toml"]) == 0
    assert parse_policy(tomllib.loads(capsys.readouterr().out)) == preset(name)


def test_toml_strings_are_escaped():
    value = 'q"uote \\ tab\t del\x7f nl\n é 🦀'
    document = {"version": 1, "env": {"set": {"A": value}, "pass": []}}
    assert tomllib.loads(to_toml(document)) == document


def test_policy_show_tells_decimal_and_binary_sizes_apart(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('version = 1\n[limits]\nmemory = "2GB"\noutput = "2G"\n'
                    'file_size = "1.5GiB"\n')
    assert main(["policy", "show", str(path), "--toml"]) == 0
    limits = tomllib.loads(capsys.readouterr().out)["limits"]
    assert limits == {"memory": "2GB", "output": "2GiB", "file_size": "1536MiB"}
    path.write_text('version = 1\n[limits]\nmemory = 2048\n')
    assert main(["policy", "check", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err, "policy_invalid")
    assert line.endswith(f'{path}: limits.memory: expected a size with a unit, such as '
                         f'"2048MiB" or "2048B", got 2048')


def test_policy_show_file(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"version": 1, "env": {"set": {"A": "b"}}}))
    assert main(["policy", "show", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["env"]["set"] == {"A": "b"}


# --- demo, report, help ------------------------------------------------------------------------


@sandboxed
def test_demo_denies_everything_forbidden(tmp_path):
    done = cli("demo", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    denied = [line for line in done.stdout.splitlines() if "→ DENIED (" in line]
    assert len(denied) >= 6
    assert any("EACCES" in line and "/etc/shadow" in line for line in denied)
    assert "the sandbox held" in done.stdout


@sandboxed
def test_demo_reports_an_unexpected_verdict(tmp_path, capsys):
    attempts = [("read /etc/shadow", "read", "/etc/shadow", "ALLOWED")]
    assert demo._attempts("read-only", str(tmp_path), attempts) == 1
    assert "expected ALLOWED" in capsys.readouterr().out


@sandboxed
def test_report(capsys):
    assert main(["report", "--json"]) == 0
    (linux,) = json.loads(capsys.readouterr().out)["backends"]
    assert linux["name"] == "linux" and linux["ready"]
    names = {row["name"]: row["enforced"] for row in linux["capabilities"]}
    assert names["network.none"] and names["network.allowlist"] and names["network.any"]
    (any_row,) = (row for row in linux["capabilities"] if row["name"] == "network.any")
    assert "pasta" in any_row["mechanism"] and any_row["status"] == "enforced", any_row
    assert main(["report"]) == 0
    assert "network.allowlist" in capsys.readouterr().out


@pytest.mark.parametrize("args", [
    ["--help"], ["run", "--help"], ["sandbox-exec", "--help"], ["policy", "check", "--help"],
    ["policy", "show", "--help"], ["demo", "--help"], ["report", "--help"],
])
def test_help_has_examples(args, capsys):
    assert main(args) == 0
    assert "examples:" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["run"], ["sandbox-exec"], ["session", "exec"]])
def test_the_usage_line_shows_the_command_after_the_cut(args, capsys):
    """Issue 32: the command is split off before argparse parses, so its usage line must be
    told that `-- COMMAND` follows."""
    assert main([*args, "--help"]) == 0
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert usage.endswith(" -- COMMAND [ARG...]"), usage


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("stockade ")


def test_the_installed_command_is_a_plain_script_that_imports_little():
    """bin/stockade (what `pip install` puts on PATH) runs the program, and neither it nor the
    program imports `re`, as the wrapper generated for an entry point would first."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "bin" / "stockade"), "--version"],
                          capture_output=True, text=True, env=env)
    assert (done.returncode, done.stdout) == (0, "stockade 0.1.0\n"), done.stderr
    script = (REPO / "bin" / "stockade").read_text()
    imported = subprocess.run(
        [sys.executable, "-c", "import sys\nbefore = 're' in sys.modules\n"
         + script.replace("sys.exit(main())", "print(before, 're' in sys.modules)")],
        capture_output=True, text=True, env=env)
    before, after = imported.stdout.split()
    assert after == before, imported.stderr  # nothing the program does brings `re` in


# --- later additions -------------------------------------------------------------------------


@sandboxed
def test_write_flag_upgrades_a_read_root_instead_of_conflicting(workspace):
    done = cli("run", "--write", ".", "--", "sh", "-c", "echo hi > out && cat out", cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hi\n"
    assert (workspace / "out").read_text() == "hi\n"


def test_unsandboxed_is_refused_for_a_restricting_policy(workspace):
    marker = workspace / "ran"
    done = cli("run", "--unsandboxed", "--", "touch", str(marker), cwd=workspace)
    assert done.returncode == 70
    one_error_line(done.stderr, "unenforceable:unsandboxed")
    assert not marker.exists()


@sandboxed
def test_json_names_real_time_signals(workspace):
    done = cli("run", "--json", "--", "sh", "-c", "kill -40 $$", cwd=workspace)
    assert done.returncode == 128 + 40
    body = json.loads(done.stdout)
    assert body["signal"] == 40 and body["signal_name"] == "SIG40"


@sandboxed
def test_missing_root_error_names_the_path_not_a_wrong_index(workspace):
    policy = workspace / "p.toml"
    policy.write_text('version = 1\npreset = "read-only"\n[filesystem]\n'
                      'read = ["/zzz-missing", "/usr"]\n')
    done = cli("run", "--policy", str(policy), "--", "true", cwd=workspace)
    assert done.returncode == 2
    line = one_error_line(done.stderr, "policy_invalid")
    assert "filesystem.read: path /zzz-missing does not exist" in line


@sandboxed
def test_verbose_prints_launch_stages(workspace):
    done = cli("run", "--verbose", "--", "true", cwd=workspace)
    assert done.returncode == 0, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    for name in ("handoff", "request", "mounts", "confine", "exec", "run", "settle"):
        assert f"{name} " in line, line


@sandboxed
def test_the_cli_says_why_a_write_to_host_code_failed(workspace):
    """Attack 29 G5s: a directory of the workspace on the host's import path (PYTHONPATH) is
    read-only in the sandbox; the command's write there failed with only "Read-only file
    system", and no Stockade line said why. After a failed run the CLI names what was kept
    read-only as the host's code; after a run that succeeded it says nothing more."""
    from conftest import PYTHON, PYTHON_ROOT
    (workspace / "lib").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(workspace / "lib")])}

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "stockade", "run", "--preset", "workspace-write", "--read",
             PYTHON_ROOT, "--", PYTHON, "-c", code], cwd=workspace, env=env,
            capture_output=True, text=True, timeout=120)

    done = run("open('lib/json.py', 'w')")
    assert done.returncode == 1 and "Read-only file system" in done.stderr, done
    assert f"stockade: note: read-only in this sandbox, as code this host runs outside it " \
           f"(its interpreter, import path or imported modules): {workspace / 'lib'}" \
           in done.stderr, done.stderr
    assert not (workspace / "lib" / "json.py").exists()
    done = run("open('notes', 'w')")
    assert done.returncode == 0 and "stockade: note" not in done.stderr, done
