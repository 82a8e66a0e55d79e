"""The integration tests run against Stockade installed from its wheel (scripts/test.sh builds
it with scripts/build_wheel.sh and installs it with `--only-binary :all:` and a PATH holding
only the new venv's bin: no compiler could have been called): this checks that is what is
imported, that the wheel carried the native programs, and that the installed `stockade` runs
its demo and the whole evidence matrix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

from leftovers import TOKEN_VARIABLE

import stockade

BIN = os.path.dirname(sys.executable)


def system() -> dict[str, str]:
    """The system's programs first: the demo's children run the system's python3 (the venv's
    is in no read root), then the venv's `stockade`; this run's state directory and token
    (tests/conftest.py), never the user's own state directory, which another run may share."""
    return {"PATH": f"/usr/bin:/bin:{BIN}", "HOME": os.environ.get("HOME", "/"),
            "LANG": "C.UTF-8", "STOCKADE_STATE_DIR": os.environ["STOCKADE_STATE_DIR"],
            TOKEN_VARIABLE: os.environ[TOKEN_VARIABLE]}


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


def test_the_install_built_nothing() -> None:
    """What was installed is what the wheel carried: the programs are listed in its RECORD
    (an install that compiled them would have made them outside it)."""
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    [info] = [name for name in os.listdir(site) if name.startswith("stockade-")
              and name.endswith(".dist-info")]
    with open(os.path.join(site, info, "RECORD")) as record:
        listed = {line.split(",", 1)[0] for line in record}
    assert {"stockade/linux/supervisor", "stockade/linux/librelay.so"} <= listed


def test_demo_and_evidence_run_from_the_wheel() -> None:
    stockade_program = os.path.join(BIN, "stockade")
    demo = subprocess.run([stockade_program, "demo"], env=system(), capture_output=True,
                          text=True, timeout=300)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "the sandbox held" in demo.stdout
    # rootless, a few rows cannot run (each says why): allowed there, never a failure
    rootless = os.getuid() != 0
    evidence = subprocess.run([stockade_program, "evidence", "--json"]
                              + ["--allow-not-run"] * rootless, env=system(),
                              capture_output=True, text=True, timeout=900)
    matrix = json.loads(evidence.stdout)
    wrong = {row["id"]: f"{row['status']}: {row['observed']}" for row in matrix["rows"]
             if row["status"] not in ("pass", "not-run")}
    assert evidence.returncode == 0 and not wrong, (wrong, evidence.stderr[-2000:])
    assert matrix["failed"] == matrix["errors"] == 0, evidence.stdout[-2000:]
    assert rootless or matrix["not_run"] == 0
    assert matrix["passed"] > 50
