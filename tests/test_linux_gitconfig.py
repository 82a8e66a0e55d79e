"""The git configuration reader (stockade/linux/gitconfig.py) against git itself: what it
finds in a file is what `git config --list` finds, and it refuses what git refuses."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import unavailable

from stockade.linux.gitconfig import entries

CONFIGS = [
    '[core]\n\tbare = false\n', '[include]\npath = a b  ; c\n',
    '[includeIf "gitdir:~/x/"]\n  path = "q \\"r\\" s"  # x\n', '[Core]\nHooksPath=\n',
    '[section.Sub]\nkey\n', '[a]\nk = v\\\n  w\n', '[a]  k = 1\n',
    '[a "b\\"c"]\nk=  x   y  \t z  \n', '[a]\nk', '\ufeff[a]\r\nk=v\r\n',
    '# c\n; d\n[a] # c\n k = "#x" ;y\n', '[a]\nk = "a""b"\n', '[a]\nk = \\"\n',
    '[a.b.c]\nk=1\n', '[a]\nk=v\\', 'k = v\n',
    # what git refuses
    '[a]\nk = "unterminated\n', '[a]\nk = bad\\q\n', '[a\n', '[a]\n1k = v\n', '[a]\nk v\n',
    '[a "x"y]\n',
]


@pytest.mark.parametrize("text", CONFIGS)
def test_the_config_reader_reads_what_git_reads(tmp_path, text):
    """gitconfig.entries against `git config --list` on the same file: the same entries, or
    both refuse it."""
    (tmp_path / "config").write_text(text, encoding="utf-8")
    if not shutil.which("git"):
        unavailable("git is not installed")
    listed = subprocess.run(["git", "config", "--file", "config", "--list", "-z"],
                            cwd=tmp_path, capture_output=True)
    expected: object = "refused"
    if listed.returncode == 0:
        expected = [(name, value if has_value else None) for name, has_value, value in
                    (item.decode().partition("\n")
                     for item in listed.stdout.split(b"\0")[:-1])]
    try:
        got: object = [(".".join(p for p in (section, sub, key) if p), value)
                       for section, sub, key, value in entries(text)]
    except ValueError:
        got = "refused"
    assert got == expected
