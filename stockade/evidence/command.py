"""`stockade evidence`: run the matrix here and report it; the exit status says whether every
row ran and passed."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Sequence

from stockade.errors import UsageError
from stockade.evidence.report import markdown, summary, text_line
from stockade.evidence.row import CATEGORIES
from stockade.evidence.runner import Matrix, Verdict, run_matrix, select
from stockade.evidence.tier_rows import rows_for
from stockade.launch.backend import Backend
from stockade.launch.manager import isolated

EXIT_FAILED = 1       # a row FAILed: the sandbox did not hold
EXIT_INCOMPLETE = 3   # no row failed, but some could not run here (see --allow-not-run)
EXIT_ERROR = 4        # no row failed, but some showed nothing (ERROR: not a pass)


def main(backend: Backend, *, output: str = "text", only: Sequence[str] = (),
         allow_not_run: bool = False, isolation: str = "namespaces") -> int:
    """Run the rows selected by `only` (categories or row ids) in `backend`'s `isolation` and
    print them as `output` (text, as they come; json; markdown). Returns the exit status."""
    rows = rows_for(isolation)
    known = set(CATEGORIES) | {row.id for row in rows}
    unknown = sorted(set(only) - known)
    if unknown:
        raise UsageError(f"--only {unknown[0]}: not a category ({', '.join(CATEGORIES)}) "
                         "or a row id")
    chosen = select(only, rows)
    sayers = [_printed] if output == "text" else []
    if _watched(output):
        sayers.append(_counter(len(chosen)))

    def said(verdict: Verdict) -> None:
        for say in sayers:
            say(verdict)

    matrix = run_matrix(isolated(backend, isolation), chosen, said)
    if output == "json":
        print(json.dumps(matrix.to_json(), indent=2))
    elif output == "markdown":
        print(markdown(matrix))
    print(summary(matrix), file=sys.stdout if output == "text" else sys.stderr)
    return exit_status(matrix, allow_not_run)


def _printed(verdict: Verdict) -> None:
    print(text_line(verdict), flush=True)


def _watched(output: str) -> bool:
    """Whether someone watches stderr (a terminal) but not the rows as they come: they go to
    a file or a pipe, or are printed at the end (json, markdown). A run takes minutes."""
    return sys.stderr.isatty() and not (output == "text" and sys.stdout.isatty())


def _counter(total: int) -> Callable[[Verdict], None]:
    """A progress line on stderr per verdict: how many of `total` rows are done."""
    done = itertools.count(1)
    return lambda verdict: print(f"stockade: evidence: {next(done)}/{total} {verdict.status} "
                                 f"{verdict.id}", file=sys.stderr, flush=True)


def exit_status(matrix: Matrix, allow_not_run: bool) -> int:
    if matrix.count("FAIL"):
        return EXIT_FAILED
    if matrix.count("ERROR"):
        return EXIT_ERROR
    if matrix.count("not-run") and not allow_not_run:
        return EXIT_INCOMPLETE
    return 0
