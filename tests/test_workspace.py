"""The Workspace every integration wraps, with real children in the real sandbox: commands and
file operations run inside it, file operations stay in the workspace whatever the command
planted there, a call cannot lengthen the policy's timeout, and outcomes follow the shell's
conventions."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest
from conftest import PYTHON, policy_for, sandbox

from stockade.errors import UsageError
from stockade.integrations.workspace import (
    Entry,
    FileError,
    Workspace,
    outcome,
    read_only_policy,
)
from stockade.launch.denials import denial_lines, with_denials

pytestmark = pytest.mark.usefixtures("linux")


@pytest.fixture
def workspace(ws):
    root, _ = ws
    with Workspace(policy_for("workspace-write"), workspace=root) as opened:
        yield opened


def test_files_and_commands_round_trip(workspace):
    workspace.write_file("notes/a.txt", "one\n")
    assert workspace.read_file("notes/a.txt") == b"one\n"
    mtime = os.lstat(os.path.join(workspace.root, "notes", "a.txt")).st_mtime
    assert workspace.list_dir("notes") == [Entry("a.txt", "file", 4, mtime)]
    done = workspace.exec(["sh", "-c", "cat notes/a.txt; echo two >> notes/a.txt"])
    assert (done.exit_code, done.stdout) == (0, "one\n")
    assert workspace.read_file(os.path.join(workspace.root, "notes/a.txt")) == b"one\ntwo\n"
    assert workspace.exec("echo $0; exit 3", shell=True).exit_code == 3
    workspace.remove_file("notes/a.txt")
    assert workspace.list_dir("notes") == []


def test_shell_conventions_for_exit_codes(workspace):
    assert workspace.exec(["no-such-command"]).exit_code == 127
    workspace.write_file("plain.txt", "x")
    assert workspace.exec([os.path.join(workspace.root, "plain.txt")]).exit_code == 126
    assert workspace.exec("kill -9 $$", shell=True).exit_code == 128 + 9


def test_a_call_cannot_lengthen_the_policys_timeout(ws):
    root, _ = ws
    with Workspace(policy_for("workspace-write", timeout=1.0), workspace=root) as workspace:
        began = time.monotonic()
        done = workspace.exec(["sleep", "30"], timeout=60)
        assert time.monotonic() - began < 10
        assert (done.exit_code, done.timed_out) == (124, True)
        assert [(d.kind, d.grant) for d in done.denials] == [("limits.timeout",
                                                              "limits.timeout")]
        assert workspace.timeout(0.5) == 0.5
        with pytest.raises(UsageError):
            workspace.exec(["true"], timeout=0)


def test_each_limit_is_said_in_words_with_what_would_allow_it(ws):
    """What the sandbox stopped or cut reaches a model as words (denial_lines): the policy's
    time limit and its grant, a call's own shorter timeout (no grant: a longer timeout for the
    call would do), output cut at limits.output."""
    root, _ = ws
    policy = policy_for("workspace-write", timeout=1.0, output=1024)
    with Workspace(policy, workspace=root) as workspace:
        slow = workspace.exec(["sleep", "30"])
        assert denial_lines(slow.denials) == [
            "stockade: the command was killed after 1s, the sandbox's time limit; the policy "
            "grant that would allow it: limits.timeout"]
        shortened = workspace.exec(["sleep", "30"], timeout=0.5)
        assert [(d.kind, d.grant) for d in shortened.denials] == [("limits.timeout", None)]
        assert denial_lines(shortened.denials) == [
            "stockade: the command was killed after 0.5s, the timeout this call asked for "
            "(shorter than the sandbox's time limit, limits.timeout): a longer one would let "
            "it run on"]
        cut = workspace.exec("head -c 5000 /dev/zero | tr '\\0' a", shell=True)
        assert cut.truncated and cut.exit_code == 0
        assert with_denials(cut.stdout, cut.denials) == "a" * 1024 + (
            "\nstockade: stdout cut at 1024 bytes, the sandbox's output limit: the rest of it "
            "was dropped; the policy grant that would allow it: limits.output\n")
        whole = workspace.exec(["echo", "fine"])
        assert with_denials(whole.stdout, whole.denials) == "fine\n"


def test_a_memory_refusal_is_said_in_words(ws):
    """A run's limits.memory violation (pid 1 refused an allocation at the limit), in words."""
    root, _ = ws
    result = sandbox([PYTHON, "-c", "x = bytearray(1 << 30)"], root, memory=256 << 20)
    [line] = denial_lines(outcome(result).denials)
    assert line.startswith("stockade: the sandbox's memory limit refused memory: "), line
    assert " refused at the 256.0 MiB address-space limit; " in line, line
    assert line.endswith("; the policy grant that would allow it: limits.memory"), line


def test_file_operations_never_follow_a_planted_link(workspace, ws):
    _, outside = ws
    secret = outside / "secret"
    secret.write_text("outside\n")
    # the command plants links (as hostile code would), the file tools are then asked to use them
    planted = workspace.exec(["sh", "-c", f"ln -s {outside} dir && ln -s {secret} file"])
    assert planted.exit_code == 0, planted
    for call in (lambda: workspace.read_file("dir/secret"), lambda: workspace.read_file("file"),
                 lambda: workspace.write_file("dir/secret", "changed"),
                 lambda: workspace.write_file("file", "changed"),
                 lambda: workspace.remove_file("dir/secret"),
                 lambda: workspace.list_dir("dir")):
        with pytest.raises(FileError) as refused:
            call()
        assert refused.value.code == "symlink_refused", refused.value
    assert secret.read_text() == "outside\n"
    assert sorted(os.listdir(outside)) == ["secret"]


def test_file_operations_stay_in_the_workspace(workspace, ws):
    _, outside = ws
    for path in ("../outside/secret", str(outside / "secret"), "/etc/passwd"):
        with pytest.raises(FileError) as refused:
            workspace.write_file(path, "x")
        assert refused.value.code == "outside_workspace"
    assert os.listdir(outside) == []


def test_protected_names_hold_with_the_grant_named(workspace):
    os.mkdir(os.path.join(workspace.root, ".git"))
    with open(os.path.join(workspace.root, ".git", "config"), "w") as config:
        config.write("[core]\n")
    workspace.close()
    workspace = Workspace(workspace.policy, workspace=workspace.root)
    with workspace, pytest.raises(FileError) as refused:
        workspace.write_file(".git/config", "[core]\n\thooksPath = /tmp\n")
    assert refused.value.code == "permission_denied"
    assert refused.value.grant == f"filesystem.write {workspace.root}/.git/config"
    with open(os.path.join(workspace.root, ".git", "config")) as config:
        assert config.read() == "[core]\n"


def test_typed_failures(workspace):
    workspace.write_file("f", "x")
    os.mkfifo(os.path.join(workspace.root, "fifo"))
    cases = {"missing": "not_found", "f/inner": "not_a_directory", ".": "is_a_directory",
             "fifo": "not_a_regular_file"}
    for path, code in cases.items():
        with pytest.raises(FileError) as refused:
            workspace.read_file(path)
        assert refused.value.code == code, path
    with pytest.raises(UsageError):
        workspace.exec("echo", shell=False)
    with pytest.raises(UsageError):
        workspace.exec([])


def test_a_read_beyond_limits_output_takes_a_limit_of_the_callers(ws):
    """A file larger than limits.output is `too_large` (its grant named), unless the caller
    takes more (Inspect's read bound): then it comes whole, in pieces each within the limit."""
    root, _ = ws
    data = os.urandom(2500)
    (root / "big").write_bytes(data)
    (root / "exact").write_bytes(data[:1000])
    with Workspace(policy_for("workspace-write", output=1000), workspace=root) as workspace:
        with pytest.raises(FileError) as refused:
            workspace.read_file("big")
        assert (refused.value.code, refused.value.grant) == ("too_large", "limits.output")
        assert workspace.read_file("exact") == data[:1000]
        assert workspace.read_file("big", limit=2500) == data
        assert workspace.read_file("big", limit=10 << 20) == data
        with pytest.raises(FileError) as refused:
            workspace.read_file("big", limit=2499)
        assert (refused.value.code, refused.value.grant) == ("too_large", None)


def test_a_read_only_policy_writes_nothing_on_the_host(ws):
    """read_only_policy (pydantic-ai's `read_only`): a real command that tries to write in the
    workspace and in its home fails, and nothing appears on the host; reads still work."""
    root, _ = ws
    (root / "a.txt").write_text("kept\n")
    policy = read_only_policy(policy_for("workspace-write"))
    assert policy.filesystem.write == () and policy.filesystem.home == "host"
    with Workspace(policy, workspace=root) as workspace:
        done = workspace.exec("cat a.txt; echo x > made.txt; echo x > a.txt; "
                              "mkdir -p \"$HOME/.cache\" && echo x > \"$HOME/.cache/made\"",
                              shell=True)
        assert done.stdout == "kept\n" and done.exit_code != 0, done
        assert "Read-only file system" in done.stderr, done.stderr
        with pytest.raises(FileError) as refused:
            workspace.write_file("made.txt", "x")
        assert refused.value.code == "permission_denied"
    assert sorted(os.listdir(root)) == ["a.txt"] and (root / "a.txt").read_text() == "kept\n"
    assert not os.path.exists(os.path.expanduser("~/.cache/made"))


def test_a_lost_sandbox_is_started_again(workspace):
    lost = workspace.exec(["sh", "-c", "kill -9 -1"])
    assert lost.exit_code == 137 and [d.kind for d in lost.denials] == ["sandbox.lost"]
    assert denial_lines(lost.denials) == [
        "stockade: the sandbox was lost: the command ended its agent (as kill -9 -1 does), and "
        "everything in it with it; the next command runs in a new sandbox"]
    assert workspace.exec(["echo", "again"]).stdout == "again\n"


def test_concurrent_calls_each_get_a_sandbox_and_cancel_kills_the_tree(workspace):
    cancel = threading.Event()
    outcomes = []
    slow = threading.Thread(target=lambda: outcomes.append(workspace.exec(
        ["sh", "-c", "echo $$ > pid; exec sleep 3600"], cancel=cancel)))
    slow.start()
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(workspace.root, "pid")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # the slow command holds one sandbox: this call runs beside it, in another
    assert workspace.exec(["cat", "pid"]).exit_code == 0
    cancel.set()
    slow.join(timeout=30)
    assert not slow.is_alive()
    assert [d.kind for d in outcomes[0].denials] == ["cancelled"]


def test_a_workspace_runs_at_most_its_sandboxes_at_once(ws):
    root, _ = ws
    with pytest.raises(UsageError, match="sandboxes >= 1"):
        Workspace(policy_for("workspace-write"), workspace=root, sandboxes=0)
    with Workspace(policy_for("workspace-write"), workspace=root, sandboxes=1) as one:
        cancel = threading.Event()
        slow = threading.Thread(target=lambda: one.exec(
            ["sh", "-c", "touch started; exec sleep 3600"], cancel=cancel))
        slow.start()
        deadline = time.monotonic() + 30
        while not (root / "started").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        waiting = threading.Thread(target=lambda: one.exec(["touch", "next"]))
        waiting.start()
        waiting.join(timeout=1)
        assert waiting.is_alive() and not (root / "next").exists()  # (its one sandbox: taken)
        cancel.set()
        waiting.join(timeout=30)
        slow.join(timeout=30)
        assert (root / "next").exists()


def test_each_command_gets_its_own_network_denials_with_the_grant(ws):
    root, _ = ws
    base = policy_for("workspace-write")
    policy = dataclasses.replace(base, network=dataclasses.replace(
        base.network, mode="allowlist", allow=("allowed.example",)))
    fetch = ("import urllib.request, sys\n"
             "try: urllib.request.urlopen(sys.argv[1], timeout=10)\n"
             "except urllib.error.HTTPError as e: print(e.code)")
    with Workspace(policy, workspace=root) as workspace:
        first = workspace.exec([PYTHON, "-c", fetch, "http://denied.example/"])
        assert first.stdout == "403\n", first
        assert [(d.kind, d.grant) for d in first.denials] == [
            ("network.denied", "network.allow denied.example:80")]
        [line] = denial_lines(first.denials)
        assert line.startswith("stockade: the sandbox's network proxy refused http "
                               "denied.example:80: not_allowed: "), line
        assert line.endswith("; the policy grant that would allow it: network.allow "
                             "denied.example:80"), line
        second = workspace.exec([PYTHON, "-c", fetch, "http://other.example:8080/"])
        assert [d.grant for d in second.denials] == ["network.allow other.example:8080"]


def test_a_racing_link_swap_never_leads_a_file_operation_out(workspace, ws):
    """The command swaps a directory and a link to outside as fast as it can while file
    operations write through the name: each lands in the directory or is refused."""
    _, outside = ws
    swapper = threading.Thread(target=lambda: workspace.exec(
        ["sh", "-c", f"while :; do mkdir d 2>/dev/null; rm -rf d; ln -s {outside} d; rm -f d; "
                     "done"], timeout=4))
    swapper.start()
    try:
        while swapper.is_alive():
            try:
                workspace.write_file("d/x", "raced")
            except FileError as refused:
                assert refused.code in ("symlink_refused", "not_found", "not_a_directory"), \
                    refused
    finally:
        swapper.join()
    assert os.listdir(outside) == []


def test_a_guard_refusal_names_the_reach_that_would_allow_it():
    from stockade.launch.denials import denial
    from stockade.launch.result import network_denials

    def grant(protocol: str, host: str, port: int, reason: str) -> str | None:
        record = {"protocol": protocol, "host": host, "port": port, "reason": reason,
                  "message": ""}
        (violation,) = network_denials([record])
        return denial(violation).grant

    assert grant("tcp", "10.9.9.9", 80, "address_private") == "network.reach 10.9.9.9:80"
    assert grant("udp", "fd00::1", 53, "address_private") == "network.reach [fd00::1]:53"
    assert grant("connect", "a.example", 443, "not_allowed") == "network.allow a.example:443"
