"""`stockade run`'s cold start (issue 32 item 6): the command line imports what its command
needs and builds the parser of that command alone; bench/run.py says the figure against its
budget, measured in the same run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stockade import cli

REPO = Path(__file__).resolve().parent.parent

# What only some runs need: never imported by `stockade run --preset read-only -- true`.
ELSEWHERE = (
    "stockade.lifecycle.changes",      # the change sets of an overlaid workspace
    "stockade.linux.usernet",          # network "any"
    "stockade.linux.guard",            # network "any"'s destination guard
    "stockade.linux.landlock_tier",    # isolation "landlock"
    "stockade.launch.execconfig",      # `stockade exec`
    "stockade.cli.server",             # `stockade daemon`
    "tempfile",                        # a full readiness probe's workspace
)

# (What the interpreter had imported before the program, its site hooks' included, is not
# counted.)
PROGRAM = """
import sys
before = set(sys.modules)
from stockade.program import main
sys.argv = ["stockade", *sys.argv[1:]]
status = main()
import json
sys.stdout.flush()
print(json.dumps(sorted(set(sys.modules) - before)), file=sys.stderr)
sys.exit(status)
"""


def test_run_imports_nothing_only_other_runs_need(tmp_path):
    # Real runs, in real sandboxes, by the program as installed would start them (no server).
    # The first in a state directory probes the host in full (what it needs is the probe's);
    # the second is the everyday one, with the probe's attestation stored.
    env = {**os.environ, "STOCKADE_NO_SERVER": "1", "STOCKADE_STATE_DIR": str(tmp_path / "s")}
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", PROGRAM, "run", "--preset", "read-only",
                               "--workspace", str(tmp_path), "--", "sh", "-c", "echo ran"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
    imported = set(json.loads(done.stderr.splitlines()[-1]))
    assert "stockade.linux.backend" in imported  # (so that the list is the run's)
    assert sorted(imported.intersection(ELSEWHERE)) == []


def test_each_command_line_builds_only_its_commands_parser():
    full = _choices(cli.build_parser())
    assert set(full) == {name for names, _ in cli.ADDERS for name in names}
    for names, _ in cli.ADDERS:
        for name in names:
            assert set(_choices(cli.build_parser(name))) == set(names), name
    assert set(_choices(cli.build_parser(None))) == set(full)


@pytest.mark.parametrize(("head", "named"), [
    (["run", "--preset", "read-only"], "run"),
    (["--state-dir", "run", "policy", "check", "p.toml"], "policy"),  # (a directory named run)
    (["--state-dir=/s", "sandbox-exec", "p.json"], "sandbox-exec"),
    (["apply", "--json"], "apply"),
    (["session", "list"], "session"),
    ([], None), (["--help"], None), (["--version"], None), (["--state-dir"], None),
    (["--state", "/s", "run"], None),  # (an abbreviation: the whole parser reads it)
    (["runn"], None), (["--state-dirx", "d", "run"], None),
])
def test_the_command_a_command_line_names(head, named):
    assert cli._named(head) == named


@pytest.mark.parametrize("head", [
    ["run", "--preset", "workspace-write", "--read", "/opt", "--json"],
    ["--state-dir", "/s", "run", "--network", "any", "--reach", "10.0.0.5:5432"],
    ["sandbox-exec", "p.json"],
    ["exec", "--experimental", "c.json"],
    ["policy", "show", "--preset", "read-only", "--toml"],
    ["changes", "--stat"],
    ["session", "exec", "name", "--env", "A=1"],
])
def test_a_commands_own_parser_reads_its_command_line_as_the_whole_one_does(head):
    alone = cli.build_parser(cli._named(head)).parse_known_args(head)
    whole = cli.build_parser().parse_known_args(head)
    assert vars(alone[0]) == vars(whole[0]) and alone[1] == whole[1]


def test_mistakes_are_said_as_the_whole_parser_says_them(capsys):
    assert cli.main(["runn", "--", "true"]) == 2
    said = capsys.readouterr().err
    assert "invalid choice: 'runn'" in said and "'sandbox-exec'" in said  # (every command)
    assert cli.main(["run", "--no-such-flag", "--", "true"]) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_the_bench_says_the_cli_figure_against_its_budget_of_the_same_run():
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    medians = {"python -c pass": 20.0, "bwrap": 5.0, "stockade CLI": 75.0,
               "stockade CLI, daemon running": 30.0}
    text = bench.render({name: None for name in medians}, medians, {}, {}, False)
    assert ("stockade CLI: 75.00 ms against a budget of 1.5 × (interpreter 20.00 + bwrap "
            "5.00) = 37.50 ms (2.00 × the budget)") in text
    assert "stockade CLI, daemon running: 30.00 ms against a budget of" in text
    assert "(0.80 × the budget)" in text


def _choices(parser) -> list[str]:
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    return list(commands.choices)
