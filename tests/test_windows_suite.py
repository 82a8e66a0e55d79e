"""The suite itself runs on Windows (issue 31, D2), guarded here: in an interpreter made to look
like Windows CPython (tests/windows_like.py), pytest collects every test module conftest does
not leave out, with no error, and conftest's hooks run; conftest leaves out only modules that
do need POSIX to load. A new POSIX-only import in a module the Windows workflow runs fails here,
before a Windows host would abort its collection."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from conftest import POSIX_ONLY_MODULES
from windows_like import run_as_windows

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(path.name for path in (ROOT / "tests").glob("test_*.py"))


def _collect_as_windows() -> tuple[int, str, dict]:
    """pytest's collection of the suite as on Windows: its status, what it said, and each
    module's collection outcome."""
    done = run_as_windows("""
        import json, sys
        import pytest
        modules = {}
        class Seen:
            def pytest_collectreport(self, report):
                if report.nodeid.endswith(".py"):
                    modules[report.nodeid.rpartition("/")[2]] = report.outcome
        status = pytest.main(["--collect-only", "-p", "no:cacheprovider", "tests"],
                             plugins=[Seen()])
        print(json.dumps({"status": int(status), "modules": modules}))
    """, cwd=str(ROOT), timeout=300)
    seen = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    return seen.get("status", done.returncode), done.stdout + done.stderr, seen.get("modules", {})


def test_pytest_collects_every_module_on_windows_and_conftests_hooks_run():
    status, said, modules = _collect_as_windows()
    assert status == 0, said[-3000:]
    assert "INTERNALERROR" not in said and "Traceback" not in said, said[-3000:]
    # conftest's header and its deselection (the Linux tests) ran
    summary = said.splitlines()[-2]
    assert "not Linux (win32)" in said and "deselected" in summary, said[-500:]
    assert not re.search(r"\berrors?\b", summary), said[-3000:]
    assert modules == {name: "passed" for name in MODULES if name not in POSIX_ONLY_MODULES}
    assert {name for name in MODULES if name.startswith("test_windows_")} <= set(modules)


def test_conftest_leaves_out_only_modules_that_need_posix_to_load():
    assert set(POSIX_ONLY_MODULES) <= set(MODULES)
    assert not [name for name in POSIX_ONLY_MODULES if name.startswith("test_windows_")]
    done = run_as_windows(f"""
        import importlib, json, sys
        sys.path.insert(0, "tests")
        loaded = []
        for name in {sorted(POSIX_ONLY_MODULES)!r}:
            try:
                importlib.import_module(name[:-3])
                loaded.append(name)
            except Exception:
                pass
        print(json.dumps(loaded))
    """, cwd=str(ROOT), env={**os.environ}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []  # each one needs POSIX
