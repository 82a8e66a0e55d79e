"""The first real Windows host's checklist, in one command: run it from the checkout, with
Stockade installed (`python -m pip install .[test]`), once elevated and once as a standard user:

    python scripts/windows_first_run.py [DIRECTORY]

Each stage runs in turn, whatever became of the one before, and prints its outcome on one line
(PASS or FAIL, how long it took, where its output is); everything it wrote is kept in
DIRECTORY (default: stockade-first-run; give the two runs different ones) to send back. The
exit status is 0 only when every stage passed.

1. host        Windows build, elevated or not, whether this process is already in a Job (a
               fact, not a failure: whether the sandbox's Job kept its UI limits there is the
               probe's `job_ui_restrictions`), Python
2. imports     every module on the Windows path, each first in a fresh interpreter
3. probe       `stockade probe --json`: the readiness attestation (kept: attestation.json)
4. report      `stockade report --json`: what is enforced here (kept: report.json)
5. exit-codes  sandbox-exec: the command's status, 2, 70, 71
6. evidence    the W1 matrix, every row's real-child test (kept: evidence.json)
7. tests       the whole suite, Windows required (no skip, none run is a failure)
8. broker      the one-shot broker's tests, those against this host required
9. wsb-sandbox commands in a real Windows Sandbox (passes, saying why, without the feature)

Standard library only.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CI = [sys.executable, os.path.join(HERE, "windows_ci.py")]
STOCKADE = [sys.executable, "-m", "stockade"]
EXIT_USAGE = 2


def host_facts() -> dict[str, object]:
    """What the host is, as Win32 says (Windows only)."""
    kernel = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    shell = ctypes.WinDLL("shell32")  # type: ignore[attr-defined]
    kernel.GetCurrentProcess.restype = ctypes.c_void_p
    kernel.IsProcessInJob.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.POINTER(ctypes.c_int)]
    in_job = ctypes.c_int()
    if not kernel.IsProcessInJob(kernel.GetCurrentProcess(), None, ctypes.byref(in_job)):
        raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
    version = sys.getwindowsversion()  # type: ignore[attr-defined]
    return {"build": version.build, "release": platform.release(),
            "edition": platform.win32_edition(), "machine": platform.machine(),
            "elevated": bool(shell.IsUserAnAdmin()), "in_job": bool(in_job.value),
            "python": platform.python_version()}


def stages(directory: str) -> list[tuple[str, list[str] | None, str]]:
    """(name, argv or None for the host stage, the file its output goes to)."""
    def kept(name: str) -> str:
        return os.path.join(directory, name)
    return [
        ("host", None, kept("host.json")),
        ("imports", [*CI, "imports"], kept("imports.log")),
        ("probe", [*CI, "probe", kept("attestation.json")], kept("probe.log")),
        ("report", [*STOCKADE, "report", "--json"], kept("report.json")),
        ("exit-codes", [*CI, "exit-codes"], kept("exit-codes.log")),
        ("evidence", [*CI, "evidence", kept("evidence.json")], kept("evidence.log")),
        ("tests", [*CI, "tests"], kept("tests.log")),
        ("broker", [*CI, "broker"], kept("broker.log")),
        ("wsb-sandbox", [*CI, "wsb-sandbox"], kept("wsb-sandbox.log")),
    ]


def host_verdict(facts: dict[str, object]) -> tuple[bool, str]:
    """Whether the host can run the backend at all (its build), and a one-line note. An owner
    in a Job is not a failure: a venv's python.exe and py.exe always run Python in one, whose
    children break away, and in one that keeps them the sandbox's Job drops only its UI limits
    (docs/windows.md)."""
    note = ", ".join(f"{k} {v}" for k, v in facts.items())
    if facts["in_job"]:
        note += " (already in a Job: the probe's job_ui_restrictions says whether UI limits held)"
    return int(str(facts["build"])) >= 17763, note


def run_stage(argv: list[str] | None, output: str) -> tuple[bool, str]:
    """Run one stage; whether it passed, and a one-line note."""
    if argv is None:
        facts = host_facts()
        with open(output, "w") as f:
            json.dump(facts, f, indent=2)
        return host_verdict(facts)
    with open(output, "w") as f:
        done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=3600)
    return done.returncode == 0, f"exit {done.returncode}"


def main(argv: list[str]) -> int:
    if sys.platform != "win32":
        print("windows_first_run: this checklist is for a Windows host", file=sys.stderr)
        return EXIT_USAGE
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(__doc__, file=sys.stderr)
        return EXIT_USAGE
    directory = argv[0] if argv else "stockade-first-run"
    os.makedirs(directory, exist_ok=True)
    failed = 0
    checklist = stages(directory)
    for name, command, output in checklist:
        start = time.monotonic()
        try:
            ok, note = run_stage(command, output)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            ok, note = False, f"{type(exc).__name__}: {exc}"
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name:<10} {time.monotonic() - start:7.1f} s  "
              f"{note}  -> {output}", flush=True)
    print(f"{len(checklist) - failed} of {len(checklist)} stages passed; everything is in "
          f"{directory}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
