"""Execution configs: the mapping onto a policy (stockade/launch/execconfig.py), every refusal,
and `stockade exec CONFIG.json` running real sandboxes (and one QEMU guest)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import unavailable
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import REPO, one_error_line

from stockade.cli import main
from stockade.errors import PolicyError
from stockade.launch.execconfig import load_exec_config, parse_exec_config
from stockade.policy import preset

BASE = preset("workspace-write-no-exec")


def config(**changes: object) -> dict:
    """A minimal valid config with top-level keys replaced (None deletes a key)."""
    document = {"version": 1, "containment": "processcontainer",
                "process": {"commandLine": "true"}}
    document.update(changes)
    return {key: value for key, value in document.items() if value is not None}


def refusal(document: object) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        parse_exec_config(document, file="c.json")
    assert caught.value.code == "policy_invalid" and caught.value.exit_code == 2
    return caught.value


# --- the mapping ---------------------------------------------------------------------------------

def test_a_minimal_config_is_the_base_preset_with_nothing_writable():
    mapped = parse_exec_config(config())
    assert mapped.containment == "processcontainer" and mapped.policy.containment == "native"
    assert mapped.argv == ("true",) and mapped.command_line == "true"
    fs = mapped.policy.filesystem
    assert fs.read == BASE.filesystem.read and fs.write == () and fs.deny == BASE.filesystem.deny
    assert not fs.exec_from_write and mapped.policy.network.mode == "none"
    assert mapped.policy.limits == BASE.limits and mapped.policy.process.stdin == "null"
    assert mapped.windows_sandbox.given == ()


def test_the_command_line_is_split_by_posix_shell_rules():
    line = """sh -c 'echo "$HOME" > out' a\\ b "c d" """
    mapped = parse_exec_config(config(process={"commandLine": line}))
    assert mapped.argv == ("sh", "-c", 'echo "$HOME" > out', "a b", "c d")
    assert mapped.command_line == line


def test_an_empty_word_is_an_argument():
    mapped = parse_exec_config(config(process={"commandLine": "ssh-keygen -N '' -f key"}))
    assert mapped.argv == ("ssh-keygen", "-N", "", "-f", "key")


def test_the_timeout_is_milliseconds():
    mapped = parse_exec_config(config(process={"commandLine": "true", "timeout": 1500}))
    assert mapped.policy.limits.timeout == 1.5


def test_filesystem_roots_map_onto_the_policy():
    mapped = parse_exec_config(config(filesystem={
        "readRoots": ["/opt", "?/nowhere"], "writeRoots": ["{workspace}/out", "build"],
        "deny": ["{home}/.config/secret"]}))
    fs = mapped.policy.filesystem
    assert set(fs.read) == {"/opt", "?/nowhere", *BASE.filesystem.read}
    assert fs.write == ("build", "{workspace}/out")
    assert set(fs.deny) == {"{home}/.config/secret", *BASE.filesystem.deny}


def test_network_maps_onto_the_policy():
    mapped = parse_exec_config(config(network={"mode": "allowlist", "allow": ["pypi.org"],
                                               "deny": ["evil.pypi.org"]}))
    net = mapped.policy.network
    assert (net.mode, net.allow, net.deny) == ("allowlist", ("pypi.org",), ("evil.pypi.org",))
    assert parse_exec_config(config(network={})).policy.network.mode == "none"


def test_windows_sandbox_is_vm_containment_with_its_knobs():
    mapped = parse_exec_config(config(
        containment="windows_sandbox",
        experimental={"windows_sandbox": {"idleTimeoutMs": 60000, "daemonPipeName": "sbx.1"}}))
    assert mapped.policy.containment == "vm"
    assert (mapped.windows_sandbox.idle_timeout_ms,
            mapped.windows_sandbox.daemon_pipe_name) == (60000, "sbx.1")
    assert mapped.windows_sandbox.given == ("idleTimeoutMs", "daemonPipeName")
    assert parse_exec_config(config(containment="windows_sandbox",
                                     experimental={})).windows_sandbox.given == ()


def test_a_config_file_is_read(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config(process={"commandLine": "echo hi"})))
    assert load_exec_config(path).argv == ("echo", "hi")
    path.write_text('{"version": 1, "version": 1}')
    assert "duplicate" in refusal_of_file(path).message
    (tmp_path / "c.yaml").write_text("{}")
    assert refusal_of_file(tmp_path / "c.yaml").file == str(tmp_path / "c.yaml")


def refusal_of_file(path: Path) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        load_exec_config(path)
    return caught.value


# --- refusals, each located at the config's own key ---------------------------------------------

FS = "filesystem"
WS = "experimental.windows_sandbox"


@pytest.mark.parametrize(("change", "key", "needle"), [
    ({"extra": 1}, "", 'unknown key "extra"'),
    ({"version": None}, "", '"version"'),
    ({"version": 2}, "version", "supported version"),
    ({"version": True}, "version", "supported version"),
    ({"version": 1.0}, "version", "supported version"),
    ({"containment": None}, "", '"containment"'),
    ({"containment": "docker"}, "containment", '"processcontainer"'),
    ({"process": None}, "", '"process"'),
    ({"process": "true"}, "process", "a table"),
    ({"process": {}}, "process", '"commandLine"'),
    ({"process": {"commandLine": "true", "cwd": "/"}}, "process", 'unknown key "cwd"'),
    ({"process": {"commandLine": ["true"]}}, "process.commandLine", "a string"),
    ({"process": {"commandLine": "  "}}, "process.commandLine", "no command"),
    ({"process": {"commandLine": "echo 'open"}}, "process.commandLine", "closing quotation"),
    ({"process": {"commandLine": "'' echo"}}, "process.commandLine",
     "the command, the line's first word, is empty"),
    ({"process": {"commandLine": "a\0b"}}, "process.commandLine", "NUL"),
    ({"process": {"commandLine": "true", "timeout": 0}}, "process.timeout", "milliseconds"),
    ({"process": {"commandLine": "true", "timeout": 1.5}}, "process.timeout", "milliseconds"),
    ({"process": {"commandLine": "true", "timeout": "5s"}}, "process.timeout", "milliseconds"),
    ({"process": {"commandLine": "true", "timeout": False}}, "process.timeout", "milliseconds"),
    ({"process": {"commandLine": "true", "timeout": 10**12}}, "process.timeout", "milliseconds"),
    ({FS: []}, FS, "a table"),
    ({FS: {"read": ["/opt"]}}, FS, 'unknown key "read"'),
    ({FS: {"readRoots": "/opt"}}, f"{FS}.readRoots", "an array"),
    ({FS: {"readRoots": ["/opt", 7]}}, f"{FS}.readRoots[1]", "a path"),
    ({FS: {"writeRoots": ["a/../../b"]}}, f"{FS}.writeRoots[0]", ".."),
    ({FS: {"writeRoots": ["/usr"]}}, f"{FS}.writeRoots", "both read and write"),
    ({FS: {"readRoots": ["/x"], "writeRoots": ["/x"]}}, f"{FS}.writeRoots", "both"),
    ({FS: {"readRoots": ["{home}/.ssh/keys"]}}, f"{FS}.readRoots", "denied path"),
    ({FS: {"writeRoots": ["/w"], "deny": ["/"]}}, f"{FS}.readRoots", "denied path"),
    ({FS: {"deny": [""]}}, f"{FS}.deny[0]", "a path"),
    ({"network": {"mode": "any"}}, "network.mode", '"allowlist"'),
    ({"network": {"mode": "allowlist"}}, "network.mode", "at least one"),
    ({"network": {"allow": ["pypi.org"]}}, "network.allow", "allowlist"),
    ({"network": {"mode": "allowlist", "allow": ["*"]}}, "network.allow[0]", "*"),
    ({"network": {"proxy": "x"}}, "network", 'unknown key "proxy"'),
    ({"experimental": []}, "experimental", "a table"),
    ({"experimental": {"vm": {}}}, "experimental", 'unknown key "vm"'),
    ({"experimental": {"windows_sandbox": {}}}, WS, "only to containment"),
    ({"containment": "windows_sandbox", "experimental": {"windows_sandbox": 1}}, WS, "a table"),
    ({"containment": "windows_sandbox", "experimental": {"windows_sandbox": {"idle": 1}}}, WS,
     'unknown key "idle"'),
    ({"containment": "windows_sandbox",
      "experimental": {"windows_sandbox": {"idleTimeoutMs": 0}}}, f"{WS}.idleTimeoutMs", "from 1"),
    ({"containment": "windows_sandbox",
      "experimental": {"windows_sandbox": {"idleTimeoutMs": None}}}, f"{WS}.idleTimeoutMs", "null"),
    ({"containment": "windows_sandbox",
      "experimental": {"windows_sandbox": {"idleTimeoutMs": 86_400_001}}},
     f"{WS}.idleTimeoutMs", "86400000"),
    ({"containment": "windows_sandbox",
      "experimental": {"windows_sandbox": {"daemonPipeName": "\\\\.\\pipe\\x"}}},
     f"{WS}.daemonPipeName", "pipe name"),
    ({"containment": "windows_sandbox",
      "experimental": {"windows_sandbox": {"daemonPipeName": ""}}}, f"{WS}.daemonPipeName", ""),
    ({"containment": "windows_sandbox",
      "experimental": {"windows_sandbox": {"daemonPipeName": 5}}}, f"{WS}.daemonPipeName", "5"),
])
def test_each_problem_is_a_located_policy_error(change, key, needle):
    error = refusal(config(**change))
    assert (error.file, error.key) == ("c.json", key)
    assert error.message.startswith(f"c.json: {key}: " if key else "c.json: ")
    assert needle in error.message


def test_a_document_that_is_not_a_table_is_refused():
    assert "a table" in refusal(["version", 1]).message


# Arbitrary JSON, and documents with the right keys holding arbitrary JSON.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
KEYS = ["version", "containment", "process", "filesystem", "network", "experimental",
        "commandLine", "timeout", "readRoots", "writeRoots", "deny", "mode", "allow",
        "windows_sandbox", "idleTimeoutMs", "daemonPipeName"]
SHAPED = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(
        ["processcontainer", "windows_sandbox", "none", "allowlist", "/usr", "sh -c 'x'", "a'"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner,
                                                                max_size=5),
    max_leaves=16)


@settings(max_examples=300, deadline=None)
@given(document=JSON | SHAPED)
def test_any_json_maps_or_is_a_policy_error(document):
    original = copy.deepcopy(document)
    try:
        parse_exec_config(document, file="c.json")
    except PolicyError as error:
        assert error.code == "policy_invalid" and error.message.startswith("c.json")
    assert document == original  # the document is never changed


@settings(max_examples=200, deadline=None)
@given(valid=st.fixed_dictionaries({}, optional={
    "timeout": st.integers(1, 10**9), "readRoots": st.lists(st.sampled_from(["/opt", "?/x"])),
    "mode": st.sampled_from(["none", "allowlist"])}))
def test_valid_variations_map(valid):
    process = {"commandLine": "true", **({"timeout": valid["timeout"]} if "timeout" in valid
                                         else {})}
    network = ({"mode": "allowlist", "allow": ["example.com"]}
               if valid.get("mode") == "allowlist" else {"mode": "none"})
    mapped = parse_exec_config(config(process=process, network=network,
                                      filesystem={"readRoots": valid.get("readRoots", [])}))
    assert mapped.policy.network.mode == valid.get("mode", "none")
    if "timeout" in valid:
        assert mapped.policy.limits.timeout == valid["timeout"] / 1000


# --- `stockade exec` -----------------------------------------------------------------------------

def write_config(directory: Path, **changes: object) -> Path:
    path = directory / "config.json"
    path.write_text(json.dumps(config(**changes)))
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "stockade", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.usefixtures("linux")
def test_processcontainer_confines_writes_to_the_write_roots(ws):
    workspace, outside = ws
    script = f"echo in > inside; echo out > {outside}/escaped; cat {outside}/escaped; exit 3"
    path = write_config(workspace, process={"commandLine": f"sh -c '{script}'"},
                        filesystem={"writeRoots": ["{workspace}"]})
    done = cli("exec", str(path), cwd=workspace)
    assert done.returncode == 3, done.stderr  # the command's own status, passed through
    assert (workspace / "inside").read_text() == "in\n"
    assert not (outside / "escaped").exists()
    assert "escaped" in done.stderr  # the shell's own complaints, passed through live


@pytest.mark.usefixtures("linux")
def test_processcontainer_json_and_timeout(ws, capfd, monkeypatch):
    workspace, _ = ws
    monkeypatch.chdir(workspace)
    path = write_config(workspace, process={"commandLine": "sh -c 'echo hi; sleep 5'",
                                            "timeout": 500},
                        filesystem={"readRoots": ["{workspace}"]})
    assert main(["exec", "--json", str(path)]) == 137
    out, err = capfd.readouterr()
    result = json.loads(out)
    assert result["stdout"] == "hi\n" and result["timed_out"] and result["backend"] == "linux"
    assert "limits.timeout" in err


@pytest.mark.usefixtures("linux")
def test_a_working_directory_outside_every_root_is_refused(ws, capfd, monkeypatch):
    workspace, outside = ws
    monkeypatch.chdir(outside)
    path = write_config(workspace)
    assert main(["exec", str(path)]) == 2
    one_error_line(capfd.readouterr().err, "policy_invalid")


def test_windows_sandbox_needs_experimental(tmp_path, capfd):
    path = write_config(tmp_path, containment="windows_sandbox")
    assert main(["exec", str(path)]) == 2
    line = one_error_line(capfd.readouterr().err, "usage")
    assert "--experimental" in line


def test_a_bad_config_is_exit_2_with_one_located_line(tmp_path, capfd):
    path = write_config(tmp_path, filesystem={"writeRoot": ["."]})
    assert main(["exec", "--experimental", str(path)]) == 2
    line = one_error_line(capfd.readouterr().err, "policy_invalid")
    assert f"{path}: filesystem: unknown key \"writeRoot\"" in line


@pytest.mark.parametrize("args", [["exec"], ["exec", "a.json", "b.json"], ["exec", "--vm", "a"],
                                  ["exec", "a.json", "--", "true"]])
def test_bad_usage_is_exit_2(args, capfd):
    assert main(args) == 2
    assert len(capfd.readouterr().err.splitlines()) == 1


@pytest.mark.linux  # (a QEMU guest; the driver is POSIX-only)
def test_windows_sandbox_runs_in_a_qemu_guest_with_experimental(tmp_path):
    from test_vm_qemu import _vm_available

    if _vm_available() is not None:
        unavailable(f"VM containment unavailable here: {_vm_available()}")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    path = write_config(workspace, containment="windows_sandbox",
                        process={"commandLine": "sh -c 'echo made > inside; cat inside; exit 5'"},
                        filesystem={"writeRoots": ["{workspace}"]},
                        experimental={"windows_sandbox": {"idleTimeoutMs": 1000}})
    done = cli("exec", "--experimental", "--json", str(path), cwd=workspace)
    assert done.returncode == 5, done.stderr
    result = json.loads(done.stdout)
    assert (result["backend"], result["stdout"]) == ("qemu-vm", "made\n")
    assert (workspace / "inside").read_text() == "made\n"
    assert done.stderr.splitlines() == ["stockade: note: experimental.windows_sandbox."
                                        "idleTimeoutMs only apply to Windows Sandbox; ignored by "
                                        "the QEMU VM"]
