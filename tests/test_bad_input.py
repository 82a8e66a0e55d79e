"""Every class of user mistake, through the API (`stockade.run`, a Sandbox's `run` and
`stream`) and the command line, is a Stockade error naming it (a StockadeError; on the command
line one `stockade: <code>: ...` line, exit 2), never a raw Python error; and what the calls
take as subprocess does (`stdin`, `universal_newlines`, string `input` and `timeout`, `shell`,
`text`) works in the real sandbox, a missing program being a FileNotFoundError too."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import policy_for

import stockade
from stockade.cli import main
from stockade.errors import CommandNotFound, StockadeError, UsageError

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("linux")

# One mistake per class: (its name, the keyword arguments, words its message must say).
MISTAKES = [
    ("args not a list", {"args": 5}, "args must be a list of arguments"),
    ("args none", {"args": None}, "args must be a list"),
    ("an argument not a str", {"args": ["echo", 5]}, "argv[1] must be a string"),
    ("args empty", {"args": []}, "argv is empty"),
    ("a NUL in an argument", {"args": ["echo", "a\0b"]}, "NUL"),
    ("a string without shell", {"args": "echo hi"}, "shell=True"),
    ("stdout closed descriptor", {"stdout": 999}, "stdout=999: not an open descriptor"),
    ("stderr closed descriptor", {"stderr": 998}, "stderr=998: not an open descriptor"),
    ("stdout a read-only descriptor", {"stdout": "READ_ONLY"}, "open only for reading"),
    ("stdout a negative descriptor", {"stdout": -5}, "stdout must be PIPE"),
    ("stdout a string", {"stdout": "out.txt"}, "stdout must be PIPE"),
    ("stdout=STDOUT", {"stdout": subprocess.STDOUT}, "STDOUT is for stderr"),
    ("capture_output and stdout", {"capture_output": True, "stdout": subprocess.DEVNULL},
     "may not be given with"),
    ("capture_output not a bool", {"capture_output": 1}, "capture_output must be"),
    ("stdin and input", {"stdin": subprocess.DEVNULL, "input": b"x"},
     "stdin and input may not both be used"),
    ("stdin closed descriptor", {"stdin": 997}, "stdin must be None, PIPE, DEVNULL"),
    ("stdin=STDOUT", {"stdin": subprocess.STDOUT}, "STDOUT is for stderr"),
    ("input not bytes", {"input": 5}, "input must be bytes"),
    ("input str without text", {"input": "x"}, "pass text=True"),
    ("input not encodable", {"input": "é", "encoding": "ascii"}, "cannot be encoded as ascii"),
    ("text and universal_newlines differ", {"text": True, "universal_newlines": False},
     "text and universal_newlines differ"),
    ("unknown encoding", {"encoding": "no-such-codec"}, "encoding='no-such-codec'"),
    ("unknown errors handler", {"errors": "no-such-handler", "text": True},
     "errors='no-such-handler'"),
    ("timeout not a duration", {"timeout": "5 parsecs"}, "expected a duration"),
    ("timeout a list", {"timeout": [1]}, "expected a duration"),
    ("timeout not finite", {"timeout": float("nan")}, "expected a duration"),
    ("timeout zero", {"timeout": 0}, "positive"),
    ("env not a mapping", {"env": ["A=1"]}, "env must be a mapping"),
    ("env name not a name", {"env": {"A=B": "x"}}, "expected a variable name"),
    ("env value not a str", {"env": {"A": 5}}, "expected a string value"),
    ("env refused name", {"env": {"LD_PRELOAD": "/x"}}, "loader injection"),
    ("cwd not a path", {"cwd": 5}, "cwd must be a path"),
    ("cwd empty", {"cwd": ""}, "cwd is an empty path"),
    ("cwd missing", {"cwd": "/no/such/dir"}, "does not exist"),
    ("cancel not an event", {"cancel": True}, "cancel must be a threading.Event"),
]
# What only stockade.run takes (a Sandbox has its policy and workspace already).
RUN_MISTAKES = [
    ("policy not a path", {"policy": 5}, "policy must be a Policy or a policy file's path"),
    ("policy a dict", {"policy": {}}, "policy must be a Policy"),
    ("policy missing", {"policy": "/no/such/policy.toml"}, "cannot read policy file"),
    ("policy and preset", {"policy": "p.toml", "preset": "read-only"}, "either policy or"),
    ("preset empty", {"preset": ""}, "preset: an empty name"),
    ("preset unknown", {"preset": "no-such"}, "unknown preset"),
    ("workspace not a path", {"workspace": 5}, "workspace must be a path"),
    ("workspace missing", {"workspace": "/no/such/dir"}, "not a directory"),
    ("backend unknown", {"backend": "no-such"}, "unknown backend"),
    ("stdin a non-file", {"stdin": object()}, "stdin must be None, PIPE, DEVNULL"),
]
# What a Sandbox refuses that stockade.run takes.
SANDBOX_MISTAKES = [
    ("stdin a descriptor", {"stdin": "READ_ONLY"}, "takes no descriptor as stdin"),
]


def _call(options: dict, read_only: int, workspace: Path) -> tuple[Path, dict, list[str]]:
    """The marker the call would make, its keyword options and its argv."""
    marker = workspace / "ran"
    options = {name: read_only if value == "READ_ONLY" else value
               for name, value in options.items()}
    return marker, options, options.pop("args", ["touch", str(marker)])


@pytest.fixture
def read_only(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    yield fd
    os.close(fd)


def _refused(call, marker: Path, text: str) -> StockadeError:
    """`call()` raises a StockadeError saying `text`, and the command never ran."""
    try:
        call()
    except StockadeError as exc:
        assert text in str(exc), str(exc)
        assert "\n" not in str(exc)
        assert not marker.exists()
        return exc
    except Exception as exc:  # noqa: BLE001 - the failure being tested for
        pytest.fail(f"a raw {type(exc).__name__}: {exc}")
    pytest.fail("not refused")


@pytest.mark.parametrize(("options", "text"), [m[1:] for m in MISTAKES + RUN_MISTAKES],
                         ids=[m[0] for m in MISTAKES + RUN_MISTAKES])
def test_a_mistake_in_run_is_a_stockade_error(ws, read_only, options, text):
    workspace, _ = ws
    marker, options, args = _call(options, read_only, workspace)
    options.setdefault("workspace", workspace) if "policy" not in options else None
    _refused(lambda: stockade.run(args, **options), marker, text)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    workspace = tmp_path_factory.mktemp("bad-input-ws")
    with stockade.Sandbox(policy_for("workspace-write"), workspace=workspace) as sandbox:
        yield sandbox, workspace


@pytest.mark.parametrize(("options", "text"), [m[1:] for m in MISTAKES + SANDBOX_MISTAKES],
                         ids=[m[0] for m in MISTAKES + SANDBOX_MISTAKES])
def test_a_mistake_in_a_sandbox_is_a_stockade_error(sandbox, read_only, options, text):
    sb, workspace = sandbox
    marker, options, args = _call(options, read_only, workspace)
    _refused(lambda: sb.run(args, **options), marker, text)
    stream = {name: value for name, value in options.items()
              if name not in ("stdout", "stderr", "capture_output")}
    if len(stream) == len(options):  # (stream takes no destinations)
        _refused(lambda: sb.stream(args, **stream), marker, text)  # at the call itself
    assert sb.run(["true"]).returncode == 0  # the sandbox is still usable


@pytest.mark.parametrize(("words", "text"), [
    (["run", "--env", "NOEQUALS", "--", "true"], "--env 'NOEQUALS': expected NAME=VALUE"),
    (["run", "--env", "=x", "--", "true"], "expected NAME=VALUE"),
    (["run", "--env", "BAD-NAME=1", "--", "true"], "expected a variable name"),
    (["run", "--env", "LD_PRELOAD=/x", "--", "true"], "loader injection"),
    (["run", "--preset", "", "--", "true"], "preset: an empty name"),
    (["run", "--preset", "no-such", "--", "true"], "unknown preset"),
    (["run", "--timeout", "5 parsecs", "--", "true"], "expected a duration"),
    (["run", "--policy", "/no/such.toml", "--", "true"], "cannot read policy file"),
    (["run", "--workspace", "/no/such/dir", "--", "true"], "not a directory"),
    (["run", "--bogus", "--", "true"], "unrecognized arguments: --bogus"),
    (["run", "true"], "unrecognized arguments: true (put the command after '--')"),
    (["run", "--"], "no command after '--'"),
    (["run", "--network", "some", "--", "true"], "invalid choice"),
    (["--state-dir", "", "run", "--", "true"], "an empty path"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_a_mistake_on_the_command_line_is_one_line(ws, capsys, words, text):
    workspace, _ = ws
    status = main(words)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("stockade: ") and text in err, err


# --- what the calls take, as subprocess does -------------------------------------------------

def test_a_missing_program_is_also_a_file_not_found_error(ws, sandbox):
    workspace, _ = ws
    with pytest.raises(FileNotFoundError) as caught:
        stockade.run(["no-such-program-xyz"], workspace=workspace)
    assert isinstance(caught.value, CommandNotFound) and caught.value.code == "command_not_found"
    assert caught.value.exit_code == 71 and "no-such-program-xyz" in str(caught.value)
    with pytest.raises(FileNotFoundError):
        sandbox[0].run(["no-such-program-xyz"])


def test_stdin_is_taken_as_subprocess_takes_it(ws, tmp_path):
    workspace, _ = ws
    data = tmp_path / "data"
    data.write_bytes(b"from a file\n")
    with data.open("rb") as source:  # relayed through a pipe, never handed over
        r = stockade.run(["sh", "-c", "cat; ls -l /proc/self/fd/0"], workspace=workspace,
                         stdin=source)
    assert r.stdout.startswith(b"from a file\n") and b"pipe:" in r.stdout
    for stdin in (subprocess.DEVNULL, subprocess.PIPE):  # EOF at once, as subprocess.run
        assert stockade.run(["cat"], workspace=workspace, stdin=stdin).stdout == b""
    r = stockade.run(["cat"], workspace=workspace, input="a\r\nb", universal_newlines=True)
    assert r.stdout == "a\nb"


def test_an_output_that_does_not_decode_carries_its_result(ws):
    workspace, _ = ws
    with pytest.raises(UsageError, match="stdout is not") as caught:
        stockade.run(["printf", "\\377"], workspace=workspace, text=True, encoding="utf-8")
    assert caught.value.result.stdout == b"\xff" and caught.value.result.returncode == 0
    r = stockade.run(["printf", "\\377"], workspace=workspace, text=True, encoding="utf-8",
                     errors="replace")
    assert r.stdout == "\ufffd"


def test_a_sandbox_takes_what_run_takes(sandbox, tmp_path):
    sb, _ = sandbox
    r = sb.run("echo $((6 * 7)); echo oops >&2", shell=True, text=True)
    assert (r.stdout, r.stderr, r.args) == ("42\n", "oops\n", "echo $((6 * 7)); echo oops >&2")
    assert sb.run(["cat"], input="héllo\r\n", text=True).stdout == "héllo\n"
    assert sb.run(["sleep", "5"], timeout="1s").timed_out
    merged = sb.run(["sh", "-c", "echo a; sleep 0.1; echo b >&2"], stderr=subprocess.STDOUT)
    assert (merged.stdout, merged.stderr) == (b"a\nb\n", None)
    with (tmp_path / "out").open("wb") as out:
        r = sb.run(["echo", "to a file"], stdout=out, stderr=subprocess.DEVNULL)
    assert (r.stdout, r.stderr) == (None, None)
    assert (tmp_path / "out").read_bytes() == b"to a file\n"
    with pytest.raises(subprocess.CalledProcessError):
        sb.run(["false"], check=True)
    assert sb.run(["sh", "-c", "echo $WHERE"], env={"WHERE": tmp_path}).stdout == (
        f"{tmp_path}\n".encode())
    events = list(sb.stream(["sh", "-c", "printf 'a\\r'; sleep 0.2; printf '\\nb'"], text=True))
    assert "".join(e.data for e in events[:-1]) == "a\nb"  # a CRLF split between chunks
    assert events[-1].stdout == "a\nb"


def test_an_async_sandbox_takes_what_run_takes(ws):
    workspace, _ = ws
    import asyncio

    async def go():
        async with stockade.AsyncSandbox(policy_for("workspace-write"),
                                         workspace=workspace) as sb:
            cancel = threading.Event()
            r = await sb.run("echo hi", shell=True, text=True, cancel=cancel)
            with pytest.raises(UsageError, match="stdout=999"):
                await sb.run(["true"], stdout=999)
            return r.stdout

    assert asyncio.run(go()) == "hi\n"


def test_run_takes_env_on_the_command_line(ws, capfd):
    workspace, _ = ws
    status = main(["run", "--env", "GREETING=hello", "--env", "PAIR=a=b", "--",
                   "sh", "-c", 'echo "$GREETING $PAIR"'])
    assert (status, capfd.readouterr().out) == (0, "hello a=b\n")


def test_a_stdout_that_would_lose_the_output_is_refused_before_the_run(ws, tmp_path):
    workspace, _ = ws
    marker = workspace / "ran"
    sink = io.BytesIO()  # no descriptor: refused, not silently dropped
    with pytest.raises(UsageError, match="stdout must be PIPE"):
        stockade.run(["touch", str(marker)], workspace=workspace, stdout=sink)
    assert not marker.exists() and sys.stdout is not None


# --- the small defects (issue 32, item 5) ----------------------------------------------------

def test_a_policy_file_that_is_a_fifo_is_refused_not_waited_on(ws, tmp_path):
    workspace, _ = ws
    fifo = tmp_path / "policy.toml"
    os.mkfifo(fifo)  # no writer will ever come: opening it for reading would block for ever
    done = subprocess.run([sys.executable, "-m", "stockade", "run", "--policy", str(fifo),
                           "--", "true"], capture_output=True, text=True, timeout=60,
                          cwd=workspace, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"stockade: policy_invalid: {fifo}: cannot read policy file (it is "
                           "a FIFO, not a regular file)\n")


def test_a_relative_state_directory_is_refused(ws, tmp_path):
    workspace, _ = ws
    env = {**os.environ, "PYTHONPATH": str(REPO), "STOCKADE_STATE_DIR": "relative"}
    done = subprocess.run([sys.executable, "-m", "stockade", "run", "--", "true"],
                          capture_output=True, text=True, timeout=60, cwd=workspace, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("stockade: usage: STOCKADE_STATE_DIR='relative' is a relative path, "
                           "which each process would find under its own working directory: "
                           "give an absolute one\n")
    assert not (workspace / "relative").exists()
    done = subprocess.run([sys.executable, "-m", "stockade", "--state-dir", "own", "run", "--",
                           "true"], capture_output=True, text=True, timeout=60, cwd=workspace,
                          env=env)  # (the flag is made absolute, and wins)
    assert done.returncode == 0, done.stderr


def test_writing_the_whole_host_is_refused_saying_so(ws, capsys):
    workspace, _ = ws
    for words in (["run", "--write", "/", "--", "true"],
                  ["run", "--preset", "read-only", "--write", "/", "--", "true"]):
        assert main(words) == 70
        err = capsys.readouterr().err
        assert err.startswith('stockade: unenforceable:filesystem.write: filesystem.write '
                              'includes "/": the whole host writable'), err
        assert "/bin" not in err and "filesystem.read" not in err  # (not a consequence)
