"""Remedies a Windows user is told to run are PowerShell, not POSIX shell (WINREAD 8)."""

from __future__ import annotations

import re
import sys

import pytest

from stockade.errors import UnenforceableError
from stockade.launch import compile as compiler
from stockade.launch.compile import CompileContext
from stockade.launch.request import PathGrant


def powershell_strings(command: str) -> list[str]:
    """The single-quoted strings of a PowerShell command as PowerShell reads them: any of
    ' ‘ ’ ‚ ‛ opens and closes one, and two of them in a row inside it stand for one."""
    quote = "['\u2018\u2019\u201a\u201b]"
    return [re.sub(f"({quote})\\1", r"\1", body)
            for body in re.findall(f"{quote}((?:[^'\u2018\u2019\u201a\u201b]|{quote}{{2}})*)"
                                   f"{quote}", command)]


def test_the_missing_denied_paths_remedy_is_powershell_on_windows(monkeypatch, tmp_path):
    """A denied path that does not exist in a write root is refused with one command that
    makes them all; on Windows that was `(umask 077 && mkdir -p ... && touch ...)`."""
    home = tmp_path / "o'brien’s"  # (both quotes PowerShell reads as one)
    home.mkdir()
    ctx = CompileContext(workspace=str(home), home=str(home), tmp=None, host_env={})
    write = (PathGrant(str(home), str(home)),)
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(UnenforceableError) as refused:
        compiler._denied(("{home}/.ssh", "{home}/.config/gh", "{home}/.netrc"), ctx, write)
    command = refused.value.message.split(", with ", 1)[1].split(", or choose", 1)[0]
    assert "umask" not in command and "mkdir -p" not in command
    assert command.startswith("& { New-Item -ItemType Directory -Force -Path ")
    steps = command.removeprefix("& { ").removesuffix(" }").split("; ")
    assert [step.split(" -Path ")[0] for step in steps] == [
        "New-Item -ItemType Directory -Force", "New-Item -ItemType File"]  # never a file -Force
    assert all(step.endswith(" | Out-Null") for step in steps)
    directories, files = (powershell_strings(step) for step in steps)
    assert directories == [f"{home}/.ssh", f"{home}/.config/gh", str(home)]
    assert files == [f"{home}/.netrc"]
