"""Packaging: `pip install .` (the README's set-up step 1, tests/checkout.py) and a wheel
(`pip wheel .`, then installed) each install every file of the package and the two C programs
setup.py builds, so that the command line, the demo and `stockade evidence` (which
test_evidence.py runs from that install) need nothing from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from checkout import source_files

BUILT = {"linux/supervisor", "linux/librelay.so"}  # by setup.py, not in the source


def _package(venv: Path) -> Path:
    [site] = (venv / "lib").glob("python3*/site-packages")
    return site / "stockade"


def _installed(package: Path) -> set[str]:
    return {os.path.relpath(os.path.join(directory, name), package)
            for directory, names, files in os.walk(package)
            if "__pycache__" not in Path(directory).parts for name in files}


def test_pip_install_and_a_wheel_install_the_whole_package(readme_checkout, tmp_path) -> None:
    wheels = tmp_path / "wheels"
    done = subprocess.run([str(readme_checkout.bin / "pip"), "wheel", "--quiet", "--no-deps",
                           "--wheel-dir", str(wheels), "."], cwd=readme_checkout.root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    [wheel] = wheels.glob("stockade-*.whl")
    venv = tmp_path / "from-wheel"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    expected = source_files("stockade") | BUILT
    for installed in (_package(readme_checkout.root / ".venv"), _package(venv)):
        assert _installed(installed) == expected, installed
        assert os.access(installed / "linux" / "supervisor", os.X_OK)
    # From anywhere, the wheel's own package runs the command line and the demo.
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import stockade; print(stockade.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).parent == _package(venv)
    demo = subprocess.run([str(venv / "bin" / "stockade"), "demo"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0 and "the sandbox held" in demo.stdout, demo.stdout + demo.stderr
