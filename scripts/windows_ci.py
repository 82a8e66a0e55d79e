"""The steps of .github/workflows/windows.yml that are more than one command, each exiting
non-zero when what it checks does not hold (the workflow gates on them):

    python scripts/windows_ci.py imports       each module on the Windows path imports, fresh
    python scripts/windows_ci.py open-interpreter  (as an administrator) every AppContainer may
                                               read this interpreter, as under C:\\Program Files
    python scripts/windows_ci.py exit-codes    sandbox-exec: the command's status, 2, 70 and 71
    python scripts/windows_ci.py probe FILE    `stockade probe --json`, the attestation kept
    python scripts/windows_ci.py evidence FILE the W1 matrix: each row's real-child test, kept
    python scripts/windows_ci.py tests         the whole suite, Windows required (no skip passes)
    python scripts/windows_ci.py broker        the one-shot broker's tests, this host's required

None of them can pass vacuously: `tests` fails when pytest ran no test, passed none, skipped one
or ran none of the W1 real-child tests; `evidence` fails unless every W1 row's test ran and
passed (a row whose test was skipped, deselected or not collected is a failure, not a pass);
`broker` fails unless each of its tests against this host ran and passed.

Run from the checkout, with Stockade installed (`pip install .[test]`). Standard library only.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

STOCKADE = [sys.executable, "-m", "stockade"]
EXIT_USAGE, EXIT_SETUP, EXIT_START = 2, 70, 71


# What runs on POSIX hosts only, off the Windows path (the registry never loads it there): the
# Linux backend's package; the CLI server (unix sockets, peers known by SO_PEERPIDFD: on Windows
# the client runs the command line itself); the session agent and its child (the guest's side,
# POSIX-only today: vm/wsb_guest.py refuses it typed on Windows); the QEMU driver. Every other
# module imports on Windows: here, and in tests/test_windows_import.py's Windows-like guard.
POSIX_ONLY = ("stockade.linux", "stockade.cli.server", "stockade.session.agent",
              "stockade.session.child", "stockade.vm.qemu", "stockade.vm.machine",
              "stockade.cli.ask")


# Not imported by the smoke at all: the integrations that need their framework (an extra;
# tests/integrations imports each with it), and fileop, a script run inside a Linux sandbox.
NOT_IMPORTED = ("stockade.integrations.mcp", "stockade.integrations.pydantic_ai",
                "stockade.integrations.openai_agents", "stockade.integrations.deepagents",
                "stockade.integrations.inspect_sandbox", "stockade.integrations.fileop",
                "stockade.integrations.ray")


def on_the_windows_path(name: str) -> bool:
    return not any(name == posix or name.startswith(posix + ".") for posix in POSIX_ONLY)


def imported_by_the_smoke(name: str) -> bool:
    return on_the_windows_path(name) and name not in NOT_IMPORTED


def imports() -> int:
    """Each module on the Windows path, imported first in its own isolated interpreter: an
    import cycle or a POSIX-only module shows up as that module's failure."""
    import stockade

    names = sorted(m.name for m in pkgutil.walk_packages(stockade.__path__, "stockade.")
                   if imported_by_the_smoke(m.name))
    failed = []
    for name in ["stockade", *names]:
        done = subprocess.run([sys.executable, "-I", "-c", f"import {name}"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode:
            failed.append(name)
            print(f"FAIL import {name}:\n{done.stderr.strip()}", flush=True)
    print(f"{len(names) + 1 - len(failed)} modules imported, {len(failed)} failed")
    return 1 if failed else 0


def _policy(directory: str, name: str, body: dict) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        json.dump(body, f)
    return path


def exit_codes() -> int:
    """sandbox-exec's contract: the command's own status through, 2 for an invalid policy, 70
    for one the backend refuses, 71 for a command that cannot start."""
    system_root = os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows"))
    with tempfile.TemporaryDirectory() as top:
        top = os.path.realpath(top)
        workspace = os.path.join(top, "ws")
        os.mkdir(workspace)
        base = {"version": 1, "filesystem": {"read": [system_root], "write": [workspace]},
                "network": {"mode": "none"},
                "env": {"set": {"SystemRoot": system_root,
                                "PATH": os.path.join(system_root, "System32")}},
                "process": {"cwd": workspace}}
        good = _policy(top, "policy.json", base)
        refused = _policy(top, "refused.json", base | {"network": {"mode": "any"}})
        invalid = _policy(top, "invalid.json", base | {"no_such_section": {}})
        cases = [(good, ["cmd", "/d", "/c", "exit", "0"], 0),
                 (good, ["cmd", "/d", "/c", "exit", "7"], 7),
                 # an NTSTATUS (a crash's 0xC0000005): all 32 bits through sys.exit
                 (good, ["cmd", "/d", "/c", "exit", "-1073741819"], 0xC0000005),
                 (invalid, ["cmd", "/d", "/c", "exit", "0"], EXIT_USAGE),
                 (refused, ["cmd", "/d", "/c", "exit", "0"], EXIT_SETUP),
                 (good, ["stockade-no-such-program"], EXIT_START)]
        wrong = 0
        for policy, argv, expected in cases:
            done = subprocess.run([*STOCKADE, "sandbox-exec", policy, "--", *argv],
                                  capture_output=True, text=True, timeout=300, cwd=workspace)
            ok = done.returncode == expected
            wrong += not ok
            print(f"{'ok  ' if ok else 'FAIL'} sandbox-exec {os.path.basename(policy)} -- "
                  f"{' '.join(argv)}: exit {done.returncode}, expected {expected}"
                  + ("" if ok else f"\n{done.stderr.strip()}"), flush=True)
    return 1 if wrong else 0


def _kept(argv: list[str], path: str) -> int:
    """Run `argv`, keep its stdout in `path` (an artifact), pass its stderr and status on."""
    with open(path, "w") as out:
        return subprocess.run(argv, stdout=out, timeout=1800).returncode


def probe(path: str) -> int:
    code = _kept([*STOCKADE, "probe", "--json"], path)
    with open(path) as f:
        print(f.read())
    return code


W1_MODULE = "test_windows_enforcement"


def outcomes(junit: str) -> dict[str, str]:
    """Each test case's outcome in a pytest JUnit XML report: "passed", "failed", "error" or
    "skipped", by `module::name` (the module without its directories and `.py`)."""
    seen = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").rpartition(".")[2]
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            if case.find(kind) is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
        seen[f"{module}::{case.get('name', '')}"] = outcome
    return seen


def _not_clean(seen: dict[str, str]) -> list[str]:
    """Why a run with these outcomes is not clean: nothing may fail or be skipped, and
    something must pass."""
    why = []
    counts = {kind: sum(1 for o in seen.values() if o == kind)
              for kind in ("passed", "failed", "error", "skipped")}
    if not seen or not counts["passed"]:
        why.append(f"{len(seen)} tests ran, {counts['passed']} passed: a run of nothing")
    for kind in ("failed", "error", "skipped"):
        if counts[kind]:
            why.append(f"{counts[kind]} {kind}")
    return why


def judged(seen: dict[str, str]) -> list[str]:
    """Why a suite run with these outcomes is not a pass (empty when it is): nothing may fail
    or be skipped, something must pass, and the W1 real-child tests must have run."""
    why = _not_clean(seen)
    if not [name for name, o in seen.items() if name.startswith(W1_MODULE + "::")
            and o == "passed"]:
        why.append(f"no W1 real-child test ({W1_MODULE}) passed")
    return why


BROKER_MODULE = "test_windows_broker"
# The broker's tests against this host itself (NTFS, a real broker process, a real launch):
# each must have run and passed, not merely been collected.
BROKER_HOST_TESTS = ("test_on_this_host_the_manifest_is_closed_and_consumed_once",
                     "test_on_this_host_a_manifest_replaced_or_linked_is_refused",
                     "test_on_this_host_a_real_broker_refuses_a_tampered_manifest_and_another_pid",
                     "test_on_this_host_a_launch_is_the_brokers")


def broker_judged(seen: dict[str, str]) -> list[str]:
    """Why the broker's run is not a pass: as a clean run, and each of BROKER_HOST_TESTS ran
    and passed."""
    return _not_clean(seen) + [f"{test} did not run and pass" for test in BROKER_HOST_TESTS
                               if seen.get(f"{BROKER_MODULE}::{test}") != "passed"]


def _pytest(junit: str, *targets: str) -> int:
    env = dict(os.environ, STOCKADE_REQUIRE_WINDOWS="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
                           f"--junitxml={junit}", *targets], env=env).returncode


def tests() -> int:
    with tempfile.TemporaryDirectory() as top:
        junit = os.path.join(top, "tests.xml")
        status = _pytest(junit, "tests")
        why = judged(outcomes(junit)) if os.path.exists(junit) else ["pytest wrote no report"]
    for reason in why:
        print(f"FAIL tests: {reason}", flush=True)
    return status or (1 if why else 0)


def broker() -> int:
    """The one-shot broker's tests (tests/test_windows_broker.py), those against this host
    required (issue 36, item 3)."""
    with tempfile.TemporaryDirectory() as top:
        junit = os.path.join(top, "broker.xml")
        status = _pytest(junit, os.path.join("tests", BROKER_MODULE + ".py"))
        why = broker_judged(outcomes(junit)) if os.path.exists(junit) \
            else ["pytest wrote no report"]
    for reason in why:
        print(f"FAIL broker: {reason}", flush=True)
    return status or (1 if why else 0)


def w1_matrix(seen: dict[str, str]) -> list[dict[str, str]]:
    """One row per W1 row: its test and what became of it ("not run" when it never ran)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from test_windows_enforcement import W1

    rows = []
    for row, test in W1.items():
        ran = [o for name, o in seen.items()
               if name.split("[")[0] == f"{W1_MODULE}::{test}"]
        outcome = "not run" if not ran else ("passed" if set(ran) == {"passed"} else
                                             next(o for o in ran if o != "passed"))
        rows.append({"row": row, "test": test, "outcome": outcome})
    return rows


def evidence(path: str) -> int:
    """The W1 matrix (tests/test_windows_enforcement.py): real children in the real sandbox,
    one row each; kept in `path`; a pass only when every row's test ran and passed."""
    with tempfile.TemporaryDirectory() as top:
        junit = os.path.join(top, "w1.xml")
        status = _pytest(junit, os.path.join("tests", W1_MODULE + ".py"))
        seen = outcomes(junit) if os.path.exists(junit) else {}
    rows = w1_matrix(seen)
    with open(path, "w") as f:
        json.dump({"matrix": "W1", "rows": rows}, f, indent=2)
    for row in rows:
        print(f"{'ok  ' if row['outcome'] == 'passed' else 'FAIL'} {row['row']}: "
              f"{row['outcome']}", flush=True)
    failed = [row for row in rows if row["outcome"] != "passed"]
    return status or (1 if failed or not rows else 0)


def open_interpreter() -> int:
    """The runner's interpreter (C:\\hostedtoolcache, made by an administrator) readable by every
    AppContainer, as the python.org installer's C:\\Program Files location is: a standard
    user may not change its DACL, which a grant would need (issue 31, D5)."""
    root = os.path.realpath(sys.base_prefix)
    return subprocess.run(["icacls", root, "/grant", "*S-1-15-2-1:(OI)(CI)(RX)", "/Q"],
                          timeout=1800).returncode


STEPS = {"imports": imports, "open-interpreter": open_interpreter, "exit-codes": exit_codes,
         "probe": probe, "evidence": evidence, "tests": tests, "broker": broker}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in STEPS:
        print(__doc__, file=sys.stderr)
        return EXIT_USAGE
    return STEPS[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
