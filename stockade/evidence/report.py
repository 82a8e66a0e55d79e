"""Render an evidence run: a plain-text line per row (as it comes), a summary, Markdown tables."""

from __future__ import annotations

from collections.abc import Sequence

from stockade.evidence.runner import Matrix, Verdict

STATUS_WIDTH = 8


def text_line(verdict: Verdict) -> str:
    """One row: verdict, id, what was tried, what was observed."""
    head = f"{verdict.status:<{STATUS_WIDTH}} {verdict.id:<26} {verdict.attempt}"
    if verdict.status == "not-enforced":
        return f"{head}\n{'':<{STATUS_WIDTH}} {'':<26} -> {verdict.observed}"
    seen = verdict.verdict if verdict.status == "not-run" else verdict.observed
    pad = f"{'':<{STATUS_WIDTH}} {'':<26}"
    proof = ", ".join(verdict.mutations) or f"none ({verdict.unproven or 'not here'})"
    lines = [head, f"{pad} -> {seen}", f"{pad}    proven by switching off: {proof}"]
    if verdict.control:
        lines.append(f"{pad}    control: {verdict.control}")
    return "\n".join(lines)


def summary(matrix: Matrix) -> str:
    """The closing lines: counts, completeness and the total run time."""
    host = matrix.host
    counts = (f"{matrix.count('pass')} passed, {matrix.count('FAIL')} failed, "
              f"{matrix.count('ERROR')} errors, {matrix.count('not-run')} not run"
              + (f", {matrix.count('not-enforced')} not enforced by this isolation"
                 if matrix.count("not-enforced") else "") + "; "
              f"{matrix.proven} proven, {matrix.controlled} controlled")
    return (f"{counts} — {len(matrix.verdicts)} rows in {matrix.seconds:.1f}s "
            f"({host['mode']}, uid {host['uid']}, kernel {host['kernel']}, "
            f"{host['cpus']} CPUs)")


def markdown_host(matrix: Matrix) -> str:
    """What a run ran on, as a Markdown list."""
    host = matrix.host
    lines = [f"- kernel {host['kernel']} ({host['machine']}), {host['cpus']} CPUs, "
             f"Python {host['python']}",
             f"- user {host['user']} (uid {host['uid']}, {host['mode']}), "
             f"backend {host['backend']}"]
    if "landlock" in host:
        abilities = [name for name, on in host["landlock"].items() if on is True]
        lines.append(f"- Landlock ABI {host['landlock']['abi']}: {', '.join(abilities)}")
        knobs = ", ".join(f"`{k}` = {v}" for k, v in host["kernel_knobs"].items())
        lines.append(f"- kernel knobs: {knobs}")
    lines.append("- features: " + "; ".join(f"{name} ({how})"
                                           for name, how in host["features"].items()))
    lines.append(f"- {summary(matrix)}")
    return "\n".join(lines)


def markdown_rows(runs: Sequence[tuple[str, Matrix]]) -> str:
    """A table with one line per row and one verdict column per run (e.g. root, rootless);
    the observation shown is the first run's."""
    first = runs[0][1]
    columns = " | ".join(label for label, _ in runs)
    report = any(v.capability for v in first.verdicts)  # (a tier's rows name its report's)
    lines = [f"| id | category | attempt | expected | {columns} | "
             + ("report row | " if report else "")
             + f"proven by switching off ({runs[0][0]}) | observed ({runs[0][0]}) |",
             "| --- " * (6 + report + len(runs)) + "|"]
    by_run = [{v.id: v for v in matrix.verdicts} for _, matrix in runs]
    for verdict in first.verdicts:
        cells = [by_id[verdict.id].verdict if verdict.id in by_id else "absent"
                 for by_id in by_run]
        observed = verdict.observed if verdict.status != "not-run" else ""
        if verdict.control:
            observed += f" \u2014 control: {verdict.control}"
        proof = ", ".join(verdict.mutations) or f"none: {verdict.unproven or 'not on this host'}"
        capability = [f"`{verdict.capability}`"] if report else []
        lines.append("| " + " | ".join(_cell(text) for text in (
            f"`{verdict.id}`", verdict.category, verdict.attempt, verdict.expected, *cells,
            *capability, proof, observed)) + " |")
    return "\n".join(lines)


def markdown(matrix: Matrix) -> str:
    """`stockade evidence --markdown`: the host, then the table."""
    return f"{markdown_host(matrix)}\n\n{markdown_rows([(matrix.host['mode'], matrix)])}\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
