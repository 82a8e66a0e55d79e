"""The Windows workflow (.github/workflows/windows.yml), checked here where it cannot run: it
parses, it gates (no continue-on-error, nothing that swallows a failure, only artifact uploads
run after one), it runs on windows-2022 and windows-2025, elevated and not, the steps the issue
asks for (the Windows Sandbox job's too), and every command it runs exists in this
repository."""

from __future__ import annotations

import functools
import operator
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from stockade.windows import constants as c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKFLOW = os.path.join(ROOT, ".github", "workflows", "windows.yml")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import windows_ci  # noqa: E402 -- from scripts/

ACTIONS = {"actions/checkout@v4", "actions/setup-python@v5", "actions/upload-artifact@v4"}


@pytest.fixture(scope="module")
def workflow() -> dict:
    with open(WORKFLOW) as f:
        document = yaml.safe_load(f)
    document["on"] = document.pop(True, document.get("on"))  # YAML 1.1 reads `on` as true
    return document


def walk(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, (*path, index))


def commands(step: dict) -> list[list[str]]:
    """The commands a step's `run` runs, each as argv (a pwsh wrapper's inner command too)."""
    out = []
    for line in step.get("run", "").splitlines():
        argv = shlex.split(line)
        if not argv:
            continue
        out.append(argv)
        if argv[0] == "pwsh":
            out += [shlex.split(inner) for inner in argv[2:]]
    return out


def test_the_workflow_gates(workflow):
    assert workflow["on"] and {"push", "pull_request"} <= set(workflow["on"])
    for path, node in walk(workflow):
        assert not (path and path[-1] == "continue-on-error"), path
        if isinstance(node, str):
            for swallow in ("|| true", "|| exit 0", "continue-on-error", "-ErrorAction Ignore",
                            "set +e"):
                assert swallow not in node, path
    for name, job in workflow["jobs"].items():
        assert "continue-on-error" not in job and job.get("timeout-minutes"), name
        for step in job["steps"]:
            # Only keeping an artifact may run after a failure; it never turns one green.
            if "if" in step:
                assert step["if"] == "always()" and step["uses"].startswith(
                    "actions/upload-artifact@"), step
            assert "uses" not in step or step["uses"] in ACTIONS, step
            assert "shell" not in step, step  # the default (pwsh) stops on a failed command


def test_it_runs_on_both_windows_images_elevated_and_not(workflow):
    jobs = workflow["jobs"]
    assert set(jobs) == {"elevated", "unelevated", "fence", "network-any", "windows-sandbox"}
    for job in (jobs["elevated"], jobs["unelevated"], jobs["fence"], jobs["network-any"]):
        assert job["runs-on"] == "${{ matrix.os }}"
        assert job["strategy"]["matrix"]["os"] == ["windows-2022", "windows-2025"]
    unelevated = [argv for step in jobs["unelevated"]["steps"] for argv in commands(step)]
    wrapped = [argv for argv in unelevated if argv[0] == "pwsh"]
    assert wrapped and all(argv[1] == "scripts/windows-unelevated.ps1" for argv in wrapped)
    assert not [argv for argv in unelevated
                if argv[:2] == ["python", "scripts/windows_ci.py"]
                and argv[2:] != ["open-interpreter"]  # (the administrator's preparation)
                and ["pwsh", "scripts/windows-unelevated.ps1", shlex.join(argv)] not in wrapped]


def steps_run(job: dict) -> list[str]:
    return [argv[2] for step in job["steps"] for argv in commands(step)
            if argv[:2] == ["python", "scripts/windows_ci.py"]]


def test_it_runs_what_the_issue_asks_for(workflow):
    elevated, unelevated = workflow["jobs"]["elevated"], workflow["jobs"]["unelevated"]
    assert steps_run(elevated) == ["imports", "probe", "exit-codes", "tests", "broker",
                                   "evidence"]
    assert steps_run(unelevated) == ["imports", "open-interpreter", "probe", "exit-codes",
                                     "tests", "broker", "evidence"]
    # the agent on the runner, then a real Windows Sandbox (the one step that passes on a host
    # without the feature, saying why: windows_ci.wsb_sandbox)
    assert steps_run(workflow["jobs"]["windows-sandbox"]) == ["wsb-agent", "wsb-sandbox"]
    for job in (elevated, unelevated):
        uploads = {step["with"]["path"]: step["with"] for step in job["steps"]
                   if step.get("uses", "").startswith("actions/upload-artifact@")}
        assert set(uploads) == {"attestation.json", "evidence.json"}
        assert all(kept.get("retention-days") == 90 for kept in uploads.values())


@pytest.mark.parametrize("name", ["fence", "network-any"])
def test_the_fence_jobs_install_the_service_from_a_secured_interpreter_and_run_its_rows(
        workflow, name):
    # (issue 36: jobs for the fence, elevated, and for `any`)
    job = workflow["jobs"][name]
    run = [argv for step in job["steps"] for argv in commands(step)]
    assert run == [["python", "-m", "pip", "install", ".[test]"],
                   ["python", "scripts/windows_ci.py", "secure-interpreter"],
                   ["python", "-m", "stockade", "fence", "install"],
                   ["python", "scripts/windows_ci.py", name],
                   ["python", "-m", "stockade", "fence", "uninstall"]]
    assert not [argv for argv in run if argv[0] == "pwsh"]  # elevated: installing takes it


def test_each_fence_row_names_a_real_child_test_and_one_not_run_fails(tmp_path, monkeypatch):
    import windows_fence_host

    for rows in windows_ci.FENCE_ROWS.values():
        for row, name in rows.items():
            assert callable(getattr(windows_fence_host, name, None)), row
    assert windows_fence_host.pytestmark.name == "windows"
    monkeypatch.setattr(windows_ci, "_pytest", lambda junit, *targets: 0)  # ran nothing
    assert windows_ci.fence_rows("fence") == 1 and windows_ci.fence_rows("network-any") == 1


def test_the_broker_step_requires_its_tests_against_the_host_to_have_passed():
    """(issue 36, item 3) the broker's tests here run on Linux too; on the host, those against
    NTFS, a real broker process and a real launch must have run, not been deselected."""
    module = windows_ci.BROKER_MODULE
    source = open(os.path.join(ROOT, "tests", module + ".py")).read()
    for test in windows_ci.BROKER_HOST_TESTS:
        assert re.search(rf"@pytest.mark.windows\ndef {test}\(", source), test
    here = {f"{module}::test_a": "passed"}
    assert len(windows_ci.broker_judged(here)) == len(windows_ci.BROKER_HOST_TESTS)
    on_host = here | {f"{module}::{test}": "passed" for test in windows_ci.BROKER_HOST_TESTS}
    assert windows_ci.broker_judged(on_host) == []
    skipped = on_host | {f"{module}::{windows_ci.BROKER_HOST_TESTS[0]}": "skipped"}
    assert windows_ci.broker_judged(skipped) == [
        "1 skipped", f"{windows_ci.BROKER_HOST_TESTS[0]} did not run and pass"]


def test_no_step_can_pass_having_run_nothing():
    # (issue 31, D7: the evidence step passed with --allow-not-run and no Windows row)
    for path in (WORKFLOW, windows_ci.__file__):
        with open(path) as f:
            assert "allow-not-run" not in f.read(), path
    assert windows_ci.judged({}) != []
    assert windows_ci.judged({"test_cli::test_x": "passed"}) == [
        f"no W1 real-child test ({windows_ci.W1_MODULE}) passed"]
    w1 = f"{windows_ci.W1_MODULE}::test_a"
    assert windows_ci.judged({w1: "passed"}) == []
    assert windows_ci.judged({w1: "passed", "test_cli::test_y": "skipped"}) == ["1 skipped"]
    assert windows_ci.judged({w1: "skipped"}) == [
        "1 tests ran, 0 passed: a run of nothing", "1 skipped",
        f"no W1 real-child test ({windows_ci.W1_MODULE}) passed"]


def test_the_first_run_checklist_runs_every_step_and_keeps_what_it_learns(tmp_path):
    import windows_first_run

    checklist = windows_first_run.stages(str(tmp_path))
    steps = [argv[2] for _, argv, _ in checklist
             if argv and argv[:2] == windows_first_run.CI]
    # (not the steps that change ACLs or make a user, nor the fence's, which need the service
    # installed)
    assert sorted(steps) == sorted(set(windows_ci.STEPS) - {
        "open-interpreter", "secure-interpreter", "fence", "network-any", "wsb-agent"})
    assert [name for name, _, _ in checklist][:1] == ["host"]
    kept = {os.path.basename(arg) for _, argv, _ in checklist for arg in argv or ()}
    assert {"attestation.json", "evidence.json"} <= kept
    # off Windows it refuses, typed, with no traceback
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "windows_first_run.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "for a Windows host" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_first_run_checklist_passes_a_host_whose_python_runs_in_a_job():
    """WINREAD 1: a venv's python.exe (and py.exe, and pip's console-script launchers) runs
    the interpreter in a Job, so the host stage failed for nearly every user; being in a Job
    is a fact to keep, and only a build below the floor fails the stage."""
    import windows_first_run

    facts = {"build": 26100, "elevated": False, "in_job": True, "python": "3.12.7"}
    passed, note = windows_first_run.host_verdict(facts)
    assert passed and "in_job True" in note and "job_ui_restrictions" in note
    assert not windows_first_run.host_verdict(facts | {"build": 17134})[0]


def test_the_unelevated_user_is_granted_its_window_station_and_desktop_for_the_run():
    """WINREAD 2: Start-Process -Credential starts the user on this session's window station
    and desktop, which allow it nothing: Stockade could neither add its launch's entry to the
    station nor create its desktop there (window_station_denied). The script grants the user
    what Stockade asks of the station (desktop.check_station's access, creating a desktop)
    before the command starts, and takes it back however the run ends."""
    script = open(os.path.join(ROOT, "scripts", "windows-unelevated.ps1")).read()
    rights = re.search(r"const int STATION_RIGHTS = ([0-9xA-Fa-f| ]+);", script)
    assert rights, "the script grants the user no window-station rights"
    granted = functools.reduce(operator.or_, (int(v, 0) for v in rights[1].split("|")))
    wanted = c.READ_CONTROL | c.WRITE_DAC | 0x8  # (WINSTA_CREATEDESKTOP)
    assert granted & wanted == wanted
    body, cleanup = script.split("} finally {")
    assert body.index("::Set($sid, $true)") < body.index("= Start-Process")
    assert "::Set($sid, $false)" in cleanup and "net user $name /delete" in cleanup
    assert script.index("Add-Type") < script.index("/add")  # (nothing to undo if it fails)


def test_the_w1_matrix_counts_a_row_that_did_not_run_as_a_failure(tmp_path):
    import test_windows_enforcement as w1

    rows = windows_ci.w1_matrix({})
    assert [row["row"] for row in rows] == list(w1.W1)
    assert {row["outcome"] for row in rows} == {"not run"}
    first, second = list(w1.W1.values())[:2]
    junit = tmp_path / "w1.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        f'<testcase classname="tests.{windows_ci.W1_MODULE}" name="{first}"/>'
        f'<testcase classname="tests.{windows_ci.W1_MODULE}" name="{second}">'
        '<skipped message="the Windows backend cannot run here"/></testcase>'
        '</testsuite></testsuites>')
    seen = windows_ci.outcomes(str(junit))
    assert [row["outcome"] for row in windows_ci.w1_matrix(seen)][:3] == [
        "passed", "skipped", "not run"]


def test_every_command_it_runs_exists_here(workflow):
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            for argv in commands(step):
                if argv[0] == "pwsh":
                    assert os.path.isfile(os.path.join(ROOT, argv[1])), argv
                elif argv[:2] == ["python", "scripts/windows_ci.py"]:
                    assert argv[2] in windows_ci.STEPS, argv
                elif argv[:3] == ["python", "-m", "pip"]:
                    assert argv[3:] == ["install", ".[test]"], argv
                elif argv[:3] == ["python", "-m", "stockade"]:
                    assert argv[3:] in (["fence", "install"], ["fence", "uninstall"]), argv
                else:
                    pytest.fail(f"a command this test does not know: {argv}")


def test_the_steps_refuse_what_they_do_not_know():
    assert windows_ci.main([]) == 2 and windows_ci.main(["no-such-step"]) == 2


def test_the_import_smoke_passes_here_too():
    # The same guard on this platform: each module imported first in a fresh interpreter.
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "windows_ci.py"),
                           "imports"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed" in done.stdout


def test_the_w1_matrix_is_in_the_suite_the_workflow_runs_and_only_runs_on_windows():
    import test_windows_enforcement as w1

    assert w1.pytestmark.name == "windows"  # deselected off Windows, never skipped here
    for row, name in w1.W1.items():
        assert callable(getattr(w1, name, None)), row


def test_the_w1_children_run_the_program_the_readiness_probe_runs(monkeypatch):
    """WINREAD 6: the W1 tests ran sys.executable. For the Store's Python that is an app
    execution alias in WindowsApps, whose folder, made a read root, refuses every launch
    (admission.py); in a venv, a launcher outside every root. They now run what
    Win32Host().interpreter() answers, as the probe does: the program the alias names."""
    import test_windows_enforcement as w1

    from stockade.windows.probe import Win32Host

    target = "/Program Files/WindowsApps/PythonSoftwareFoundation.Python.3.12_x64/python3.12.exe"
    monkeypatch.setattr(Win32Host, "interpreter", lambda self: target)
    w1.python.cache_clear()
    try:
        req = w1.request("/ws", "pass")
    finally:
        w1.python.cache_clear()
    assert req.argv[0] == target and dict(req.env)["PATH"] == os.path.dirname(target)
    assert os.path.dirname(target) in [grant.path for grant in req.read]


@pytest.mark.parametrize("in_job", [False, True])
def test_the_first_runs_host_stage_passes_an_owner_already_in_a_job(monkeypatch, tmp_path, in_job):
    """WINREAD 1: a venv's python.exe, py.exe and pwsh's Start-Process -Wait run Python in a
    Job, so the checklist's first stage failed for most users, though such an owner gets a
    nested Job (D4): it is said, not failed. A build before 17763 still fails."""
    import windows_first_run

    facts = {"build": 22631, "elevated": False, "in_job": in_job, "python": "3.13.1"}
    monkeypatch.setattr(windows_first_run, "host_facts", lambda: dict(facts))
    ok, note = windows_first_run.run_stage(None, str(tmp_path / "host.json"))
    assert ok and ("already in a Job" in note) == in_job
    facts["build"] = 17134
    assert not windows_first_run.run_stage(None, str(tmp_path / "host.json"))[0]
