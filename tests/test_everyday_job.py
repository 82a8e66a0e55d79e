"""The everyday agent job, inside the `workspace-write` preset, as an agent does it: in a git
repository holding a Python package with a compiled extension, create a venv, install from
local wheels, import, run pytest, build and run a binary with make, and git add / commit /
branch / stash, also in a nested repository. Everything succeeds; what would let code run
later on the host (hooks, config) stays unwritable, and the host is unchanged there."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from conftest import policy_for

import stockade
from stockade.policy import merge

pytestmark = [pytest.mark.linux, pytest.mark.usefixtures("linux")]

PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "hello"
        version = "1.0"
        """,
    "setup.py": """
        from setuptools import Extension, setup
        setup(packages=["hello"], package_dir={"": "src"},
              ext_modules=[Extension("hello._speed", ["src/hello/_speed.c"])])
        """,
    "src/hello/__init__.py": """
        from hello._speed import double
        """,
    "src/hello/_speed.c": """
        #include <Python.h>
        static PyObject *twice(PyObject *self, PyObject *arg) {
            return PyNumber_Add(arg, arg);
        }
        static PyMethodDef methods[] = {{"double", twice, METH_O, ""}, {NULL, NULL, 0, NULL}};
        static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speed", "", -1, methods};
        PyMODINIT_FUNC PyInit__speed(void) { return PyModule_Create(&module); }
        """,
    "tests/test_hello.py": """
        import hello

        def test_double():
            assert hello.double(21) == 42
        """,
    "Makefile": """
        hello: hello.c
        \tcc -o hello hello.c
        """,
    "hello.c": """
        #include <stdio.h>
        int main(void) { puts("built and run"); return 0; }
        """,
}

JOB = """
set -eux
python3 -m venv .venv
.venv/bin/pip install --quiet --no-index --find-links wheels hello
.venv/bin/python -c 'import hello; assert hello.double(2) == 4; print("compiled import ok")'
echo "$TEST_SITE" > .venv/lib/python{version}/site-packages/host-test-tools.pth
.venv/bin/python -m pytest -q -p no:cacheprovider tests
make
./hello
git add -A
git commit -q -m "the agent's change"
git branch feature
git checkout -q feature
echo more >> hello.c
git stash -q
git stash pop -q
git commit -q -am "more"
git -C vendor/lib commit -q --allow-empty -m "nested"
echo JOB DONE
"""


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body).lstrip())


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=host", "-c", "user.email=host@example.test", *args],
                   cwd=cwd, check=True, capture_output=True)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def repository(tmp_path) -> Path:
    """A git repository with the package, a nested repository, and the package's wheel built
    on the host (no network inside the sandbox)."""
    workspace = tmp_path / "ws"
    write_tree(workspace, PACKAGE)
    git("init", "-q", cwd=workspace)
    git("add", "-A", cwd=workspace)
    git("commit", "-q", "-m", "initial", cwd=workspace)
    nested = workspace / "vendor" / "lib"
    nested.mkdir(parents=True)
    git("init", "-q", cwd=nested)
    git("commit", "-q", "--allow-empty", "-m", "nested initial", cwd=nested)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(workspace / "wheels"),
                            str(workspace)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (workspace / ".gitignore").write_text("wheels/\n.venv/\nbuild/\n*.egg-info/\nhello\n")
    return workspace


def test_the_agent_job_works_inside_workspace_write(repository):
    workspace = repository
    site = sysconfig.get_paths()["purelib"]  # pytest, from the test environment, read-only
    policy = merge(policy_for("workspace-write", read=(site,)), {
        "env": {"set": {"TEST_SITE": site, "GIT_AUTHOR_NAME": "agent",
                        "GIT_AUTHOR_EMAIL": "agent@example.test",
                        "GIT_COMMITTER_NAME": "agent",
                        "GIT_COMMITTER_EMAIL": "agent@example.test"}},
        "limits": {"timeout": "5m"}})
    debian = os.path.realpath("/usr/bin/python3")
    assert debian.startswith("/usr/"), "the job uses the system's python3, as an agent would"
    job = JOB.format(version=subprocess.run(
        [debian, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True, text=True, check=True).stdout.strip())
    r = stockade.run(["sh", "-c", job], policy, workspace=workspace)
    assert r.exit_code == 0, r.stderr.decode()[-3000:]
    out = r.stdout.decode()
    assert "compiled import ok" in out and "built and run" in out and "JOB DONE" in out
    log = subprocess.run(["git", "log", "--oneline", "--all"], cwd=workspace,
                         capture_output=True, text=True, check=True).stdout
    assert "the agent's change" in log and "more" in log
    nested = subprocess.run(["git", "log", "--oneline"], cwd=workspace / "vendor" / "lib",
                            capture_output=True, text=True, check=True).stdout
    assert "nested" in nested.splitlines()[0]


ATTACK = """
for target in .git/hooks/pre-commit vendor/lib/.git/hooks/post-checkout; do
    printf '#!/bin/sh\\necho pwned\\n' > "$target" && echo "WROTE $target"
done
for config in .git/config vendor/lib/.git/config; do
    printf '[core]\\n\\thooksPath = /tmp\\n' >> "$config" && echo "WROTE $config"
done
git config core.fsmonitor 'echo pwned' && echo "WROTE config via git"
true
"""


def test_what_would_run_later_on_the_host_stays_unwritable(repository):
    workspace = repository
    watched = [workspace / ".git" / "config", workspace / "vendor" / "lib" / ".git" / "config"]
    before = {path: digest(path) for path in watched}
    hooks = {path: sorted(p.name for p in path.iterdir())
             for path in (workspace / ".git" / "hooks",
                          workspace / "vendor" / "lib" / ".git" / "hooks")}
    r = stockade.run(["sh", "-c", ATTACK], policy_for("workspace-write"), workspace=workspace)
    assert r.exit_code == 0, r.stderr
    assert b"WROTE" not in r.stdout, r.stdout
    assert {path: digest(path) for path in watched} == before
    assert {path: sorted(p.name for p in path.iterdir()) for path in hooks} == hooks
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists()
