"""The examples of docs/integrations.md (the blocks marked `doc-test: integrations`), run as
written with the frameworks installed, each in a scratch directory of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from doc_blocks import TREE, blocks  # noqa: E402
from test_docs import PYTHON_RUNNER  # noqa: E402

EXAMPLES = [block for block in blocks(TREE / "docs" / "integrations.md") if block.integration]


def test_every_integration_has_an_example() -> None:
    text = (TREE / "docs" / "integrations.md").read_text()
    assert len(EXAMPLES) >= text.count("\n## ") - 1  # (the first section is the overview)


@pytest.mark.parametrize("block", EXAMPLES, ids=lambda block: block.name)
def test_the_example_runs_as_written(block, tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", PYTHON_RUNNER, block.name], input=block.text,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), "an example shows what it did"
