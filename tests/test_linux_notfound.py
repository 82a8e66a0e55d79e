"""`command_not_found` says what is missing and which root would make it visible: the program
itself, or its ELF loader or `#!` interpreter (execve's ENOENT for both). Real launches, and in
each case the advice followed makes the same command run."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import policy_for

import stockade
from stockade.cli import main
from stockade.errors import StartError
from stockade.policy import merge

pytestmark = pytest.mark.usefixtures("linux")

LOADER = {"x86_64": "/lib64/ld-linux-x86-64.so.2",
          "aarch64": "/lib/ld-linux-aarch64.so.1"}[platform.machine()]


def refusal(argv: list[str], policy: stockade.Policy, workspace: Path) -> str:
    with pytest.raises(StartError) as caught:
        stockade.run(argv, policy, workspace=workspace)
    assert caught.value.code == "command_not_found" and caught.value.exit_code == 71
    return caught.value.message


def advised_roots(message: str) -> list[str]:
    """The roots the message says to add (`stockade run --read ROOT ...`)."""
    found = re.search(r"add (.+) to filesystem\.read "
                      r"\(stockade run (--read \S+(?: --read \S+)*)\)$", message)
    assert found, message
    roots = found.group(2).split()[1::2]
    assert found.group(1) == " and ".join(roots), message
    return roots


def with_read(policy: stockade.Policy, *roots: str) -> stockade.Policy:
    return merge(policy, {"filesystem": {"read": [*policy.filesystem.read, *roots]}})


@pytest.fixture
def places(tmp_path):
    """(granted, hidden): a directory the policies grant, and one they do not."""
    granted, hidden = tmp_path / "granted", tmp_path / "hidden"
    granted.mkdir()
    hidden.mkdir()
    return granted, hidden


def test_a_loader_outside_the_roots_is_named_with_the_root_to_add(ws):
    """docs/cli.md's trap on merged-/usr hosts: /usr and /etc readable, not /lib or /lib64."""
    workspace, _ = ws
    narrow = merge(policy_for(), {"filesystem": {"read": ["/usr", "/etc", str(workspace)]}})
    message = refusal(["/usr/bin/true"], narrow, workspace)
    assert f"/usr/bin/true is there, but its ELF interpreter (loader) {LOADER} is not " \
           "visible in the sandbox" in message, message
    roots = advised_roots(message)
    assert stockade.run(["/usr/bin/true"], with_read(narrow, *roots), workspace=workspace) \
        .returncode == 0


def test_a_custom_loader_is_named(ws, places):
    workspace, _ = ws
    granted, hidden = places
    shutil.copy(os.path.realpath(LOADER), hidden / "ld.so")
    source = granted / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n')
    subprocess.run(["gcc", "-o", str(granted / "hello"), str(source),
                    f"-Wl,--dynamic-linker={hidden}/ld.so"], check=True)
    policy = with_read(policy_for(), str(granted))
    message = refusal([str(granted / "hello")], policy, workspace)
    assert f"its ELF interpreter (loader) {hidden}/ld.so is not visible" in message, message
    assert advised_roots(message) == [str(hidden)]
    r = stockade.run([str(granted / "hello")], with_read(policy, str(hidden)),
                     workspace=workspace)
    assert (r.returncode, r.stdout) == (0, b"hello\n"), r.stderr


def test_a_hash_bang_interpreter_outside_the_roots_is_named(ws, places):
    workspace, _ = ws
    granted, hidden = places
    shutil.copy("/bin/sh", hidden / "sh")
    script = granted / "script"
    script.write_text(f"#!{hidden}/sh\necho from the script\n")
    script.chmod(0o755)
    policy = with_read(policy_for(), str(granted))
    message = refusal([str(script)], policy, workspace)
    assert f"{script} is there, but its #! interpreter {hidden}/sh is not visible" in message
    assert f"{hidden} is in no read or write root" in message, message
    r = stockade.run([str(script)], with_read(policy, *advised_roots(message)),
                     workspace=workspace)
    assert r.stdout == b"from the script\n", r.stderr


def test_a_program_outside_the_roots_is_named_by_its_host_path(ws, places):
    workspace, _ = ws
    _, hidden = places
    shutil.copy("/usr/bin/true", hidden / "tool")
    for argv, extra in (([str(hidden / "tool")], {}),
                        (["tool"], {"env": {"set": {"PATH": f"{hidden}:/usr/bin:/bin"}}})):
        policy = merge(policy_for(), extra)
        message = refusal(argv, policy, workspace)
        assert f"{hidden}/tool exists on the host but not in the sandbox" in message, message
        assert advised_roots(message) == [str(hidden)]
        assert stockade.run(argv, with_read(policy, str(hidden)), workspace=workspace) \
            .returncode == 0


def test_a_command_nowhere_says_where_it_was_looked_for(ws, capfd, monkeypatch):
    workspace, _ = ws
    monkeypatch.chdir(workspace)
    assert main(["run", "--", "no-such-command-xyz"]) == 71
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith("stockade: command_not_found: no-such-command-xyz: not found in "
                           "the sandbox's PATH (")
    assert main(["run", "--", "/no/such/program"]) == 71
    assert capfd.readouterr().err == ("stockade: command_not_found: /no/such/program: no such "
                                      "file, in the sandbox or on the host\n")
    assert main(["run", "--", "x" * 5000]) == 71  # longer than any path: not found either
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith("stockade: command_not_found: xxx")
