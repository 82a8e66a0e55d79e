"""A warm sandbox confines its commands exactly like a fresh one, and its commands cannot reach
the agent's channel to the host."""

from __future__ import annotations

import textwrap

import pytest
from conftest import PYTHON, policy_for

import stockade
from stockade.session.boot import PACKAGE_DIR


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """(workspace, outside), shared by this module's one session."""
    root = tmp_path_factory.mktemp("confinement")
    for name in ("ws", "outside"):
        (root / name).mkdir()
    return root / "ws", root / "outside"


@pytest.fixture(scope="module")
def sb(linux, ws):
    with stockade.Sandbox(policy_for("workspace-write"), workspace=ws[0]) as sandbox:
        yield sandbox


def attempts(sb, code: str) -> dict[str, str]:
    """Run a snippet printing `name: outcome` lines in the session; return them."""
    r = sb.run([PYTHON, "-c", textwrap.dedent(code)])
    assert r.exit_code == 0, r.stderr
    return dict(line.split(": ", 1) for line in r.stdout.decode().splitlines())


TRY = """
import os
def attempt(name, action):
    try:
        action()
        print(f"{name}: ok")
    except OSError as exc:
        print(f"{name}: {type(exc).__name__}")
"""


def test_filesystem_is_confined(sb, ws):
    workspace, outside = ws
    (outside / "secret").write_text("s")
    res = attempts(sb, TRY + f"""
attempt("read_outside", lambda: open({str(outside / 'secret')!r}).read())
attempt("list_outside", lambda: os.listdir({str(outside)!r}))
attempt("write_read_root", lambda: open("/usr/stockade-x", "w"))
attempt("write_package", lambda: open({PACKAGE_DIR + '/x'!r}, "w"))
attempt("write_workspace", lambda: open({str(workspace / 'ok')!r}, "w").write("ok"))
""")
    assert res["read_outside"] in ("FileNotFoundError", "PermissionError")
    assert res["list_outside"] in ("FileNotFoundError", "PermissionError")
    assert res["write_read_root"] in ("PermissionError", "OSError")
    assert res["write_package"] in ("PermissionError", "OSError")
    assert res["write_workspace"] == "ok"


def test_commands_have_no_privileges(sb):
    status = dict(line.split(":\t", 1) for line in
                  sb.run(["cat", "/proc/self/status"]).stdout.decode().splitlines()
                  if ":\t" in line)
    assert status["Seccomp"].strip() == "2"
    assert status["NoNewPrivs"].strip() == "1"
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, caps
    assert sb.enforced["observed_in_sandbox"]["Seccomp"] == 2  # the agent's own, from inside


def test_a_command_inherits_only_its_stdio(sb):
    r = sb.run([PYTHON, "-c", textwrap.dedent("""
        import os
        open_fds = []
        for fd in range(1024):
            try:
                os.fstat(fd)
                open_fds.append(fd)
            except OSError:
                pass
        print(open_fds)
    """)])
    assert r.stdout == b"[0, 1, 2]\n"


def test_a_command_cannot_reach_the_agents_channel(sb):
    res = attempts(sb, TRY + """
agent = os.getppid()
attempt("agent_fd_list", lambda: os.listdir(f"/proc/{agent}/fd"))
attempt("agent_fd_target", lambda: os.readlink(f"/proc/{agent}/fd/1"))
attempt("agent_stdin", lambda: open(f"/proc/{agent}/fd/0", "wb"))
attempt("agent_stdout", lambda: open(f"/proc/{agent}/fd/1", "wb"))
attempt("agent_mem", lambda: open(f"/proc/{agent}/mem", "rb"))
attempt("agent_environ", lambda: open(f"/proc/{agent}/environ", "rb").read())
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace_agent:", "ok" if libc.ptrace(16, agent, 0, 0) == 0 else "denied")
""")
    # Its descriptors' numbers may be listed (as root), never opened or resolved.
    assert res["agent_fd_list"] in ("ok", "PermissionError")
    for name in ("agent_fd_target", "agent_stdin", "agent_stdout", "agent_mem", "agent_environ"):
        assert res[name] == "PermissionError", name
    assert res["ptrace_agent"] == "denied"
    assert sb.run(["true"]).exit_code == 0  # the session is unharmed
