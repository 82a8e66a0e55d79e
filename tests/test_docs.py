"""Documentation that runs. Every `sh` and `python` block of README.md and docs/*.md is run
here, as written, unless it says why not (tests/doc_blocks.py: the `doc-test` directives),
with the `stockade` the README's set-up step 1 installed in a fresh checkout
(tests/checkout.py), in a scratch directory holding EXAMPLE_FILES and every block marked as a
file. And the README's two set-up steps, one after the other, with two interpreters; and the
documentation as a site (mkdocs.yml), built without a warning: a broken link fails it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doc_blocks import DATA, RUN, TEXT, TREE, all_blocks, asserts, set_up_commands

BLOCKS = all_blocks()
BLOCK_TIMEOUT = 300  # seconds (one example boots a VM: ~10 s here)
STEP_TWO = "bash scripts/test.sh"
README_LINES = 200  # a newcomer reads it in five minutes; the reference is docs/
# What `mkdocs build` reads: mkdocs.yml, the hooks it names, docs/ and the pages they add.
SITE_SOURCES = ("mkdocs.yml", "scripts/mkdocs_hooks.py", "README.md", "SECURITY.md",
                "CHANGELOG.md", "docs")

# What the examples take for granted in the directory they run from ("./proj", "make", ...).
MAKEFILE = "all:\n\t@echo built\ntest:\n\t@echo tests pass\n"
EXAMPLE_FILES = {
    "Makefile": MAKEFILE,
    "proj/Makefile": MAKEFILE,
    "proj/sub/": "",
    "dist/": "",
    "script.py": "print('hello from script.py')\n",
    "main.py": "print('hello from a module')\n",
    "build.py": "import pathlib, sys\n"
                "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
                "(out / 'built.txt').write_text('built\\n')\n",
}

# Runs a Python block as the REPL would (`await` at the top level allowed).
PYTHON_RUNNER = """
import ast, asyncio, sys
code = compile(sys.stdin.read(), sys.argv[1], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
outcome = eval(code, {"__name__": "__main__"})
if asyncio.iscoroutine(outcome):
    asyncio.run(outcome)
"""


def test_every_block_runs_or_says_why() -> None:
    problems = []
    files = [block.file for block in BLOCKS if block.file]
    for block in BLOCKS:
        if block.not_run is not None:
            if not block.not_run:
                problems.append(f"{block.name}: not-run, but no reason")
        elif block.integration:
            if block.document != "docs/integrations.md" or block.language != "python":
                problems.append(f"{block.name}: only docs/integrations.md has integrations "
                                "blocks, in Python")
        elif block.file is not None:
            if not block.file or files.count(block.file) > 1:
                problems.append(f"{block.name}: a file needs a name of its own")
        elif block.directive:
            problems.append(f"{block.name}: unknown directive {block.directive!r}")
        elif block.language not in (*RUN, TEXT):
            kind = "data" if block.language in DATA else f"{block.language or 'bare'!r}"
            problems.append(f"{block.name}: a {kind} block must be a file or not-run (and a "
                            "diagram is ```text)")
    assert problems == []
    assert any(block.runs for block in BLOCKS if block.document == "README.md")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs], ids=lambda b: b.name)
def test_the_example_runs_as_written(block, readme_checkout, tmp_path) -> None:
    scratch = tmp_path / "example"
    for name, content in EXAMPLE_FILES.items():
        path = scratch / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    for other in BLOCKS:
        if other.file:
            (scratch / other.file).write_text(other.text)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = {**os.environ, "PATH": f"{readme_checkout.bin}:{os.environ['PATH']}",
           "STOCKADE_STATE_DIR": str(state)}
    if block.language == "sh":
        argv, given = ["sh", "-e", "-c", block.text], None
    else:
        argv, given = [str(readme_checkout.bin / "python"), "-c", PYTHON_RUNNER, block.name], \
            block.text
    try:
        done = subprocess.run(argv, cwd=scratch, env=env, input=given, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT)
    finally:
        _stop_daemon(state / "daemon.sock")  # one the example started and did not end
    assert done.returncode == 0, \
        f"{block.name} exited {done.returncode}:\n{done.stdout}"
    shown, at = done.stdout, 0
    for text in block.prints:
        found = shown.find(text, at)
        assert found >= 0, f"{block.name} does not print {text!r} (after offset {at}):\n{shown}"
        at = found + len(text)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs], ids=lambda b: b.name)
def test_the_example_checks_what_it_shows(block) -> None:
    """An example that only exits 0 proves little: each says what it shows, and is held to it."""
    claims = asserts(block) if block.language == "python" else len(block.prints)
    assert claims, f"{block.name} checks nothing it shows: add asserts or `# prints:` comments"


def _stop_daemon(path: Path) -> None:
    """SIGTERM the daemon listening on `path` (known by the socket's peer credentials: the
    daemon an example started), and wait until it has ended."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return
        pid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                   12))[0]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry under `root` but byte-code caches: (mode, size, link target)."""
    found = {}
    for directory, names, files in os.walk(root):
        names[:] = [name for name in names if name != "__pycache__"]
        for name in names + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            target = os.readlink(path) if os.path.islink(path) else None
            found[os.path.relpath(path, root)] = (info.st_mode, info.st_size, target)
    return found


def test_the_readme_set_up_steps_work_one_after_the_other(readme_checkout) -> None:
    """The README holds two set-up commands. Step 1 ran in a fresh checkout with a `python3`
    that is not scripts/test.sh's (the fixture); step 2's set-up (`--setup-only`: its venv,
    without the system packages and the suite, which is this) leaves step 1's install as it
    was and working, and makes its own; run with step 1's interpreter, it remakes its own."""
    commands = set_up_commands()
    assert len(commands) == 2 and commands[1] == STEP_TWO, commands
    assert "the sandbox held" in readme_checkout.output
    root, python3 = readme_checkout.root, readme_checkout.python3
    step_one = _tree(root / ".venv")
    env = {name: value for name, value in os.environ.items() if name != "STOCKADE_PYTHON"}
    for interpreter in (None, python3):
        chosen = env if interpreter is None else {**env, "STOCKADE_PYTHON": str(interpreter)}
        done = subprocess.run([*STEP_TWO.split(), "--setup-only"], cwd=root, env=chosen,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert _tree(root / ".venv") == step_one
        demo = subprocess.run([str(readme_checkout.bin / "stockade"), "demo"],
                              capture_output=True, text=True, timeout=120)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        made = os.path.realpath(root / ".venv-test" / "bin" / "python")
        assert (made == os.path.realpath(python3)) == (interpreter is not None), made
        for tool in (["python", "-m", "pytest", "--version"], ["ruff", "--version"]):
            subprocess.run([str(root / ".venv-test" / "bin" / tool[0]), *tool[1:]],
                           check=True, capture_output=True)


def _build_site(tree: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `tree` (never quiet: strict counts the warnings it logs)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=tree, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=120)


def test_the_site_builds_without_a_warning(tmp_path) -> None:
    """Every page is in the nav, and every link and anchor leads to a page of the site."""
    done = _build_site(TREE, tmp_path / "site")
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()  # the README, as the home page


@pytest.mark.parametrize("broken", [
    ("README.md", "[a page](docs/no-such-page.md)", "no-such-page.md"),
    ("docs/cli.md", "[a heading](windows.md#no-such-heading)", "no-such-heading"),
    ("SECURITY.md", "[a file](stockade/no-such-file.py)", "no-such-file.py"),
    ("docs/no-such-nav-entry.md", "# A page the nav leaves out", "no-such-nav-entry.md"),
], ids=lambda broken: broken[0])
def test_the_site_build_fails_on_a_broken_link(broken, tmp_path) -> None:
    """The build is the check that the links work: a link that leads nowhere (a page, an
    anchor, a file of the tree that is no page) or a page outside the nav fails it, naming it."""
    document, line, named = broken
    tree = tmp_path / "tree"
    for name in SITE_SOURCES:
        source = TREE / name
        if source.is_dir():
            shutil.copytree(source, tree / name)
        else:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, tree / name)
    with open(tree / document, "a") as page:
        page.write(f"\n{line}\n")
    done = _build_site(tree, tmp_path / "site")
    assert done.returncode != 0 and named in done.stderr, done.stdout + done.stderr


def test_the_readme_is_short_and_security_opens_with_its_summary() -> None:
    readme = (TREE / "README.md").read_text().splitlines()
    assert len(readme) < README_LINES, f"README.md has {len(readme)} lines"
    security = (TREE / "SECURITY.md").read_text()
    summary = security.index("| | namespaces | landlock tier | VM |")
    assert summary < security.index("\n## Protected\n")
