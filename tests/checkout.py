"""A fresh checkout of this tree in which the README's set-up step 1 ran as written, with a
`python3` that is not the interpreter scripts/test.sh uses: what a new user has. The
documentation's examples (test_docs.py), the packaging checks (test_packaging.py) and the
evidence matrix (test_evidence.py) run from the install it made, which is not editable."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from doc_blocks import TREE, set_up_commands

SETUP_TIMEOUT = 600  # seconds one set-up step may take (pip builds the C programs)


@dataclass(frozen=True)
class Checkout:
    root: Path  # the copy of the tree
    python3: Path  # the `python3` step 1 ran with
    output: str  # what step 1 printed

    @property
    def bin(self) -> Path:
        """Step 1's virtual environment's scripts: `stockade`, `python`."""
        return self.root / ".venv" / "bin"


def _left_out(directory: str, names: list[str]) -> set[str]:
    """Of `names` in `directory` (in the tree), what a clone would not have: .git and what
    .gitignore names (built programs, virtual environments, caches)."""
    patterns = [line.strip().rstrip("/") for line in (TREE / ".gitignore").read_text()
                .splitlines() if line.strip() and not line.startswith("#")]
    relative = os.path.relpath(directory, TREE)
    left_out = {".git"}
    for name in names:
        path = os.path.normpath(os.path.join(relative, name))
        if any(fnmatch.fnmatch(path if "/" in pattern else name, pattern)
               for pattern in patterns):
            left_out.add(name)
    return left_out


def fresh_copy(destination: Path) -> None:
    """The tree as a clone would have it, in `destination`."""
    shutil.copytree(TREE, destination, ignore=_left_out, symlinks=True)


def source_files(part: str) -> set[str]:
    """The files a clone has under `part` of the tree, relative to it."""
    found = set()
    for directory, names, files in os.walk(TREE / part):
        left_out = _left_out(directory, names + files)
        names[:] = [name for name in names if name not in left_out]
        found |= {os.path.relpath(os.path.join(directory, name), TREE / part)
                  for name in files if name not in left_out}
    return found


def other_python(destination: Path) -> Path:
    """A second Python installation, in `destination`: the interpreter running the tests,
    copied with its standard library. Its prefix and executable are its own, so it is
    another interpreter to `venv` and pip, as a pyenv or distribution build would be."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    executable = Path(os.path.realpath(sys._base_executable))  # (not a venv's)
    (destination / "bin").mkdir(parents=True)
    (destination / "lib").mkdir()
    shutil.copy2(executable, destination / "bin" / "python3")
    shutil.copytree(sysconfig.get_paths()["stdlib"], destination / "lib" / version,
                    symlinks=True, ignore=shutil.ignore_patterns("site-packages",
                                                                 "dist-packages"))
    found = subprocess.run([destination / "bin" / "python3", "-c",
                            "import sys; print(sys.base_prefix)"], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert found == str(destination), f"the copied interpreter found its prefix at {found}"
    return destination / "bin" / "python3"


def readme_step_one(root: Path) -> Checkout:
    """A fresh copy of the tree in `root`/checkout, and the README's set-up step 1 run in it,
    as written, with `other_python` first on PATH as `python3`."""
    python3 = other_python(root / "python")
    checkout = root / "checkout"
    fresh_copy(checkout)
    step_one = set_up_commands()[0]
    done = subprocess.run(["sh", "-c", step_one], cwd=checkout, capture_output=True,
                          text=True, timeout=SETUP_TIMEOUT,
                          env={**os.environ, "PATH": f"{python3.parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, f"README step 1 failed: {done.stdout}\n{done.stderr}"
    return Checkout(checkout, python3, done.stdout)
