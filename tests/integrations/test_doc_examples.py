"""The examples of docs/integrations.md (the blocks marked `doc-test: integrations`), run as
written with the frameworks installed, each in a scratch directory of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from doc_blocks import TREE, asserts, blocks  # noqa: E402
from test_docs import PYTHON_RUNNER  # noqa: E402

EXAMPLES = [block for block in blocks(TREE / "docs" / "integrations.md") if block.integration]


def test_every_integration_has_an_example() -> None:
    """Each section after the Workspace's and the wheel's (but the last, the conformance
    suites) shows its integration running."""
    sections = (TREE / "docs" / "integrations.md").read_text().split("\n## ")[2:]
    assert sections.pop().startswith("Conformance suites\n")
    assert len(sections) == 7
    assert all("<!-- doc-test: integrations -->" in section for section in sections)


@pytest.mark.parametrize("block", EXAMPLES, ids=lambda block: block.name)
def test_the_example_runs_as_written_and_holds_what_it_says(block, tmp_path) -> None:
    """Each example asserts what it shows (its claims are `assert`s, not comments beside a
    print): it passes only if they hold."""
    assert asserts(block), f"{block.name} asserts nothing of what it shows"
    # A home of its own: the MCP example's server (the SDK passes it HOME, not the run's
    # STOCKADE_STATE_DIR) would keep its records in the user's own state directory.
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run([sys.executable, "-c", PYTHON_RUNNER, block.name], input=block.text,
                          cwd=tmp_path, env={**os.environ, "HOME": str(home)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
