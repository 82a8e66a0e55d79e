"""The integration tests run against Stockade installed from its wheel (scripts/test.sh builds
it with scripts/build_wheel.sh and installs it with `--only-binary :all:` and a PATH holding no
compiler): this checks that is what is imported, that the wheel carried the native programs,
and that the installed `stockade` runs its demo and the whole evidence matrix with no C
compiler reachable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import stockade

BIN = os.path.dirname(sys.executable)
NO_COMPILER = {"PATH": BIN, "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}


def test_stockade_comes_from_the_installed_wheel() -> None:
    package = os.path.dirname(os.path.realpath(stockade.__file__))
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert package == os.path.join(site, "stockade"), (package, site)
    for program in ("linux/supervisor", "linux/librelay.so"):
        assert os.access(os.path.join(package, program), os.R_OK), program
    record = [name for name in os.listdir(site) if name.startswith("stockade-")
              and name.endswith(".dist-info")]
    assert len(record) == 1, record
    with open(os.path.join(site, record[0], "WHEEL")) as wheel:
        tags = [line.split(": ", 1)[1].strip() for line in wheel if line.startswith("Tag:")]
    assert tags and all(tag.startswith("py3-none-manylinux") for tag in tags), tags


def test_demo_and_evidence_run_with_no_compiler_on_path() -> None:
    for compiler in ("cc", "gcc", "clang"):
        assert shutil.which(compiler, path=NO_COMPILER["PATH"]) is None, compiler
    stockade_program = os.path.join(BIN, "stockade")
    demo = subprocess.run([stockade_program, "demo"], env=NO_COMPILER, capture_output=True,
                          text=True, timeout=300)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "the sandbox held" in demo.stdout
    # rootless, a few rows cannot run (each says why): allowed there, never a failure
    rootless = os.getuid() != 0
    evidence = subprocess.run([stockade_program, "evidence", "--json"]
                              + ["--allow-not-run"] * rootless, env=NO_COMPILER,
                              capture_output=True, text=True, timeout=900)
    matrix = json.loads(evidence.stdout)
    assert evidence.returncode == 0, evidence.stderr[-2000:]
    assert matrix["failed"] == matrix["errors"] == 0, evidence.stdout[-2000:]
    assert rootless or matrix["not_run"] == 0
    assert matrix["passed"] > 50
