"""The mutation suite's table (tests/mutants.py) stays in step with the code: each mutant's old
text is in its file exactly once (else scripts/mutants.py could not apply it: a refactor that
moved the line must move the mutant too), it changes something, and each test it names exists.
Running the mutants themselves is scripts/mutants.py's (docs/testing.md): minutes, on demand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import COLLECT_ALL
from mutants import INTEGRATIONS, MUTANTS

REPO = Path(__file__).resolve().parent.parent


def test_names_are_unique():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if not m.owner], ids=lambda m: m.name)
def test_each_mutant_applies_and_names_existing_tests(mutant):
    text = (REPO / mutant.path).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.path}: the old text is not there once"
    assert mutant.old != mutant.new and mutant.tests
    for test in mutant.tests:
        path, _, name = test.partition("::")
        function = re.sub(r"\[.*\]$", "", name)
        source = (REPO / path).read_text()
        assert re.search(rf"^(async )?def {function}\(", source, re.M), test


def test_the_suite_covers_enough_properties():
    """Issue 30: at least the audit's classes and 25 mutants of our own."""
    assert len([m for m in MUTANTS if not m.owner]) >= 25


def test_every_named_test_id_is_collected():
    """A parametrized id (or a test renamed) that pytest would not find fails here, not in a
    run of the suite that then reports a usage error instead of a catch."""
    # (tests/integrations' need the frameworks, which this venv has not: their names are
    # checked above, in the source; scripts/mutants.py runs them from .venv-integrations)
    wanted = {t for m in MUTANTS if not m.owner for t in m.tests
              if not t.startswith(INTEGRATIONS)}
    files = sorted({t.partition("::")[0] for t in wanted})
    listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only",
                             "-p", "no:cacheprovider", *files], cwd=REPO, capture_output=True,
                            text=True, timeout=300,
                            env={**os.environ, COLLECT_ALL: "1"}).stdout.splitlines()
    # (a function's id stands for all its parametrized ones)
    missing = [t for t in wanted if t not in listed
               and not any(item.startswith(t + "[") for item in listed)]
    assert missing == []
