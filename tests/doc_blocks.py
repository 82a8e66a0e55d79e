"""The fenced code blocks of the documentation (README.md, docs/*.md), as tests/test_docs.py
runs them.

A block is run according to its language (the word after the opening fence) and the
directive on the line just before it, an HTML comment a rendered page does not show:

- `sh` and `python` blocks run; `<!-- doc-test: not-run: REASON -->` says why one does not
  (it needs Windows, the network, ...; REASON is required). A block that runs checks what it
  shows: a Python block with `assert`s, a shell block with comments that end `prints: TEXT`,
  each TEXT to be found in what the block prints (stdout and stderr), in the order written;
- `<!-- doc-test: file NAME -->` makes the block the file NAME in the directory where every
  example runs (a policy or config the other examples use), instead of running it;
- `<!-- doc-test: integrations -->` (docs/integrations.md only): the block needs an agent
  framework, and tests/integrations/test_doc_examples.py runs it with the frameworks installed;
- `text` blocks (diagrams, layouts) are not code; `toml` and `json` blocks must be a `file`
  or `not-run`; any other language must be `not-run`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent
DOCUMENTS = (TREE / "README.md", *sorted((TREE / "docs").glob("*.md")))
RUN = ("sh", "python")
DATA = ("toml", "json")
TEXT = "text"
INTEGRATIONS = "integrations"

_FENCE = re.compile(r"^```(\S*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->$")
_PRINTS = re.compile(r"#.*?\bprints:\s*(.+?)\s*$")


@dataclass(frozen=True)
class Block:
    document: str  # relative to the tree
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    directive: str  # "" or what follows `doc-test:` ("not-run: ...", "file NAME")

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """The reason the block is not run, if it says so ("" if it gives none)."""
        head, colon, reason = self.directive.partition(":")
        return reason.strip() if head.strip() == "not-run" and colon else None

    @property
    def file(self) -> str | None:
        """The file this block is, if it is one."""
        head, _, name = self.directive.partition(" ")
        return name.strip() if head == "file" else None

    @property
    def integration(self) -> bool:
        """Run by tests/integrations/test_doc_examples.py, with the frameworks installed."""
        return self.directive == INTEGRATIONS

    @property
    def prints(self) -> list[str]:
        """What a shell block says it prints (its `# prints: TEXT` comments), in order."""
        if self.language != "sh":
            return []
        return [found.group(1) for line in self.text.splitlines()
                if (found := _PRINTS.search(line))]

    @property
    def runs(self) -> bool:
        return self.language in RUN and not self.directive


def blocks(document: Path) -> list[Block]:
    """Every fenced block of `document`, in order; an unclosed fence is an error."""
    found = []
    lines = document.read_text().splitlines()
    opened: tuple[int, str, str] | None = None
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        fence = _FENCE.match(line)
        if opened is None:
            if fence:
                before = next((lines[i] for i in range(number - 2, -1, -1) if lines[i].strip()),
                              "")
                directive = _DIRECTIVE.match(before.strip())
                opened = (number, fence.group(1), directive.group(1) if directive else "")
                body = []
        elif line.strip() == "```":
            start, language, directive = opened
            found.append(Block(str(document.relative_to(TREE)), start, language,
                               "\n".join(body) + "\n", directive))
            opened = None
        else:
            body.append(line)
    if opened is not None:
        raise ValueError(f"{document}:{opened[0]}: a fence that never closes")
    return found


def all_blocks() -> list[Block]:
    return [block for document in DOCUMENTS for block in blocks(document)]


def set_up_commands() -> list[str]:
    """The commands of the README's one block under "## Set up" (comments and blank lines
    left out)."""
    readme = TREE / "README.md"
    lines = readme.read_text().splitlines()
    start = lines.index("## Set up") + 1
    end = next((i + 1 for i in range(start, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    [block] = [b for b in blocks(readme) if start < b.line < end]
    return [line for line in block.text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def asserts(block: Block) -> int:
    """How many `assert` statements a Python block holds (an example's claims, checked)."""
    tree = compile(block.text, block.name, "exec",
                   flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    return sum(isinstance(node, ast.Assert) for node in ast.walk(tree))
