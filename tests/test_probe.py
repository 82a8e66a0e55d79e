"""The readiness probe: a real throwaway sandbox, an attestation asserted field by field, typed
reasons for every missing or weakened layer, and the manager's cache."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import only_backends

import stockade
from stockade.launch import manager
from stockade.launch import probe as probe_module
from stockade.launch.request import LaunchRequest
from stockade.lifecycle.ledger import Ledger
from stockade.linux import landlock, privilege
from stockade.linux import probe as linux_probe
from stockade.linux.backend import LinuxBackend
from stockade.linux.hints import hint
from stockade.linux.limits import INIT_TASKS

REPO = Path(__file__).resolve().parent.parent
NAMESPACES = ["cgroup", "ipc", "mnt", "net", "pid", "user", "uts"]
linux = pytest.mark.usefixtures("linux")


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(str(tmp_path / "state"))


def cli(*args: str, state: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stockade", "--state-dir", str(state), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


@linux
def test_the_attestation_field_by_field(ledger):
    a = stockade.probe(LinuxBackend(), ledger)
    assert a.ready, a
    assert (a.reason, a.stage, a.message) == (None, None, None)
    assert a.backend == "linux" and a.version == 1
    assert a.run_as == ("root" if os.geteuid() == 0 else "rootless")
    assert a.versions["stockade"] == stockade.__version__
    assert a.versions["kernel"] == platform.release()
    assert a.versions["landlock_abi"] == landlock.abi_version() >= 1
    assert re.fullmatch(r"\d+\.\d+\.\d+", a.versions["libseccomp"])
    assert a.versions["python"] == platform.python_version()
    assert set(a.timings) == {"backend", "ledger", "launch", "checks"}
    assert a.duration_ms >= sum(a.timings.values()) * 0.99 > 0
    f = a.facts
    assert f["new_namespaces"] == NAMESPACES
    # filesystem: mount layer
    assert f["write_root"] == "ok" and f["write_root_noexec"] is True
    assert f["read_root_read_only"] is True
    assert f["outside_path"] == "ENOENT"            # not mounted at all
    assert f["protected_name"] == "EROFS"           # re-mounted read-only
    assert f["denied_path"] == "EACCES"             # masked
    # Landlock: a directory that is mounted (stat works) but granted by no rule
    assert f["landlock_abi"] == landlock.abi_version()
    assert f["landlock_ungranted_dir"] == "EACCES"
    # seccomp and privileges
    assert f["seccomp_mode"] == 2
    assert f["seccomp_unshare"] == f["seccomp_ptrace"] == f["seccomp_tiocsti"] == "EPERM"
    assert f["no_new_privs"] == 1 and f["securebits"] == privilege.SECUREBITS
    assert f["capabilities"] == dict.fromkeys(
        ("inheritable", "permitted", "effective", "bounding", "ambient"), 0)
    assert f["inherited_fds"] == [0, 1, 2]
    # network: the host's listeners saw nothing, whatever the sandbox's own loopback did
    assert f["network_interfaces"] == ["lo"]
    assert f["tcp_loopback"] in ("EACCES", "ECONNREFUSED")
    assert f["tcp_loopback"] == ("EACCES" if landlock.abi_version() >= 4 else "ECONNREFUSED")
    assert isinstance(f["udp_loopback"], str)
    assert f["unix_abstract"] in ("ECONNREFUSED", "EPERM")
    assert f["link_local"] in ("EACCES", "ENETUNREACH")
    assert f["dns"] not in ("ok", "EAI_NONAME", "EAI_NODATA")
    assert f["host_listeners_untouched"] is True
    assert f["environment"] == ["STOCKADE_PROBE"]
    # limits: what the probe's policy asked for
    limits = linux_probe.PROBE_LIMITS
    assert f["rlimit_as"] == [limits.memory] * 2
    # (counted in threads per user namespace: the command's pids and its init's two)
    assert f["rlimit_nproc"] == [limits.pids + INIT_TASKS] * 2
    assert f["rlimit_fsize"] == [limits.file_size] * 2
    assert f["rlimit_core"] == [0, 0]
    assert f["pid_max"] == 300 + limits.pids
    # lifetime: the daemon it left is gone; so are its directory and ledger record
    assert f["daemon_started"] is True and f["leftover_processes"] == 0
    assert f["ledger_settled"] is True
    assert ledger.records() == []  # (ledger_settled: its directory in the temp dir is gone)
    # network any (this host has pasta, nft and a route): pasta's interface besides lo; the
    # host's loopback is the sandbox's own (nothing listens); the host's address, which pasta
    # gives the sandbox's interface too, the guard refuses (issue 32: it said nothing before)
    assert f["any_interfaces"] == 2
    assert (f["any_host_loopback"], f["any_host_address"]) == ("ECONNREFUSED", "EHOSTUNREACH")
    assert f["any_listeners_untouched"] is True
    expected = {fact for checks in (linux_probe.EXPECTATIONS | linux_probe.ANY_EXPECTATIONS
                                    ).values() for fact in checks}
    # (memfd_exec: the report says what it is, readiness needs neither)
    assert expected <= set(f) and set(f) - expected == {"udp_loopback", "memfd_exec"}


@linux
def test_the_attestation_names_no_path_secret_or_environment_value(ledger, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2-value")
    text = json.dumps(stockade.probe(LinuxBackend(), ledger).to_json())
    for leak in ("hunter2", ledger.root, os.path.expanduser("~"), "/usr"):
        assert leak not in text


@linux
def test_probe_cli(tmp_path):
    done = cli("probe", "--json", state=tmp_path / "state")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ready"] is True
    done = cli("probe", state=tmp_path / "state")
    assert done.returncode == 0 and done.stdout.startswith("linux: ready")
    assert "landlock_ungranted_dir: \"EACCES\"" in done.stdout


@linux
def test_probe_explain_says_what_every_fact_is(tmp_path):
    """Issue 32: the probe's facts are raw keys; --explain gives each one line, --json with it
    a legend of every fact observed (root and rootless observe different sets)."""
    done = cli("probe", "--explain", state=tmp_path / "state")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()[1:]
    assert lines and all(" -- " in line for line in lines), done.stdout
    assert any(line.startswith("  tcp_loopback: ") and "host's loopback" in line
               for line in lines)
    attestation = json.loads(cli("probe", "--json", "--explain", state=tmp_path / "state").stdout)
    assert set(attestation["facts"]) <= set(attestation["legend"])


def test_every_fact_the_linux_tables_judge_has_a_line_of_legend():
    tables = (linux_probe.EXPECTATIONS, linux_probe.ANY_EXPECTATIONS,
              linux_probe.tier_expectations())
    judged = {fact for table in tables for checks in table.values() for fact in checks}
    assert judged <= set(linux_probe.LEGEND)


# --- failures: stable reason and stage ---------------------------------------------------------


# Each stage of the probe, the weakening that fails it first and the fact that says so; the
# stages another weakening reaches only behind an earlier stage are in LATER_STAGES.
FIRST_STAGES = [
    ("landlock", "landlock_not_enforced", "landlock", "landlock_ungranted_dir"),
    ("seccomp", "seccomp_not_enforced", "seccomp", "seccomp_mode"),
    ("network", "namespaces_not_enforced", "namespaces", "new_namespaces"),
    ("read_only", "filesystem_not_enforced", "filesystem", "read_root_read_only"),
    ("protected", "filesystem_not_enforced", "filesystem", "protected_name"),
    ("deny", "filesystem_not_enforced", "filesystem", "denied_path"),
    ("rlimits", "limits_not_enforced", "limits", "rlimit_as"),
    ("stockade_state", "helpers_not_enforced", "helpers", "stockade_state"),
    ("unix_sockets", "network_not_enforced", "network", "host_listeners_untouched"),
    ("usernet_isolation", "network_any_not_enforced", "network_any", "any_host_loopback"),
    ("descriptors", "descriptors_not_enforced", "descriptors", "inherited_fds"),
    ("environment", "environment_not_enforced", "environment", "environment"),
]
# (stage, weakening, fact): the weakening fails an earlier stage first (privileges: root reads
# the denied path; pid_namespace: the namespaces), but this stage's fact fails too.
LATER_STAGES = [
    ("privileges", "privileges", "securebits"),
    ("lifetime", "pid_namespace", "leftover_processes"),
]


def test_every_stage_of_the_probe_has_a_weakening_that_fails_it():
    """Issue 30 part 3: a stage added to the probe without a weakening in the tests below
    fails here (a stage whose check always passed would go unnoticed)."""
    stages = set(linux_probe.EXPECTATIONS) | set(linux_probe.ANY_EXPECTATIONS)
    covered = [stage for _, _, stage, _ in FIRST_STAGES] + [s for s, _, _ in LATER_STAGES]
    assert sorted(set(covered)) == sorted(stages)
    for stage, _, fact in LATER_STAGES:
        assert fact in linux_probe.EXPECTATIONS[stage]
    for _, _, stage, fact in FIRST_STAGES:
        assert fact in (linux_probe.EXPECTATIONS | linux_probe.ANY_EXPECTATIONS)[stage]


@linux
@pytest.mark.parametrize("weaken, reason, stage, fact", FIRST_STAGES)
def test_a_weakened_layer_fails_readiness_at_its_stage(ledger, weaken, reason, stage, fact):
    a = stockade.probe(LinuxBackend(weaken=frozenset({weaken})), ledger)
    assert (a.ready, a.reason, a.stage) == (False, reason, stage)
    assert a.message.startswith(f"{fact}: observed ")


@linux
@pytest.mark.parametrize("stage, weaken, fact", LATER_STAGES)
def test_a_weakened_layer_fails_its_later_stage_too(ledger, stage, weaken, fact):
    a = stockade.probe(LinuxBackend(weaken=frozenset({weaken})), ledger)
    assert not a.ready
    assert fact in a.facts and not linux_probe.verified(a.facts, fact), a.facts.get(fact)


@linux
def test_dropped_privileges_are_checked(ledger):
    a = stockade.probe(LinuxBackend(weaken=frozenset({"privileges"})), ledger)
    assert not a.ready
    assert a.facts["securebits"] == 0 and any(a.facts["capabilities"].values())


@linux
def test_weakened_network_reaches_the_hosts_listener(ledger):
    a = stockade.probe(LinuxBackend(weaken=frozenset({"network"})), ledger)
    assert a.facts["host_listeners_untouched"] is False  # the UDP datagram arrived


def test_no_landlock_is_the_backend_stage(ledger, monkeypatch):
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)
    a = stockade.probe(LinuxBackend(), ledger)
    assert (a.ready, a.reason, a.stage) == (False, "landlock_unsupported", "backend")
    assert a.facts == {} and a.message == hint(
        "the kernel offers no Landlock (or not the ABI needed), or it is disabled")


@linux
def test_no_user_namespaces_for_real(tmp_path):
    """The probe runs under a seccomp filter that forbids new namespaces, as on hosts that
    disable them: the launch fails and the reason is typed."""
    code = textwrap.dedent("""
        import ctypes, sys
        from stockade.cli import main
        from stockade.linux import seccomp
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # no_new_privs
        seccomp.install(seccomp.compile_filter())
        sys.exit(main(sys.argv[1:]))
    """)
    done = subprocess.run([sys.executable, "-c", code, "--state-dir", str(tmp_path / "state"),
                           "probe", "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 70, done.stderr
    a = json.loads(done.stdout)
    assert (a["ready"], a["reason"], a["stage"]) == (False, "userns_unavailable", "launch")


@linux
def test_a_corrupt_record_fails_readiness_and_is_kept(tmp_path):
    state = tmp_path / "state"
    records = state / "records"
    records.mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    (records / ("f" * 64 + ".json")).write_bytes(b"\x00garbage")
    done = cli("probe", "--json", state=state)
    assert done.returncode == 70
    a = json.loads(done.stdout)
    assert (a["ready"], a["reason"], a["stage"]) == (False, "ledger_corrupt", "ledger")
    (kept,) = os.listdir(state / "quarantine")
    assert (state / "quarantine" / kept).read_bytes() == b"\x00garbage"
    assert cli("probe", "--json", state=state).returncode == 70  # until someone looks
    done = cli("reconcile", state=state)
    assert done.returncode == 1 and "1 record(s) in quarantine" in done.stdout


@linux
def test_an_unsafe_state_dir_fails_readiness(tmp_path):
    state = tmp_path / "state"
    (state / "records").mkdir(parents=True)
    state.chmod(0o777)
    a = stockade.probe(LinuxBackend(), Ledger(str(state)))
    assert (a.ready, a.reason, a.stage) == (False, "ledger_unusable", "ledger")


# --- the manager's cache -----------------------------------------------------------------------


class _Fake(LinuxBackend):
    name = "fake-for-cache"


@pytest.fixture
def probes(monkeypatch, tmp_path):
    """Replace the probe by a scripted one; yields the list of answers still to give."""
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    answers: list[bool] = []
    calls: list[int] = []

    def scripted(backend, ledger=None):
        calls.append(1)
        ready = answers.pop(0)
        return probe_module.Attestation(
            ready=ready, backend=backend.name, run_as="rootless", versions={}, facts={},
            enforced={}, timings={}, duration_ms=1.0,
            reason=None if ready else "seccomp_not_enforced",
            stage=None if ready else "seccomp", message=None if ready else "scripted")

    monkeypatch.setattr(probe_module, "probe", scripted)
    monkeypatch.setattr(probe_module, "_cache", {})
    return answers, calls


def test_a_pass_is_cached_for_the_process(probes):
    answers, calls = probes
    answers += [True]
    for _ in range(3):
        assert probe_module.require_ready(_Fake()).ready
    assert len(calls) == 1


def test_a_pass_is_stored_for_later_processes_of_this_boot(probes, monkeypatch):
    answers, calls = probes
    answers += [True]
    assert probe_module.require_ready(_Fake()).ready
    monkeypatch.setattr(probe_module, "_cache", {})  # as if a new process
    assert probe_module.require_ready(_Fake()).ready
    assert len(calls) == 1
    real_key = linux_probe._host_key
    monkeypatch.setattr(linux_probe, "_host_key", lambda: {**real_key(), "boot": "another"})
    monkeypatch.setattr(probe_module, "_cache", {})
    answers += [True]
    assert probe_module.require_ready(_Fake()).ready
    assert len(calls) == 2  # another boot (or uid, or version) probes again


def test_a_failure_is_cached_for_a_bounded_time_then_probed_again(probes, monkeypatch):
    answers, calls = probes
    answers += [False, True]
    clock = [1000.0]
    monkeypatch.setattr(probe_module.time, "monotonic", lambda: clock[0])
    for _ in range(2):
        with pytest.raises(stockade.UnavailableError) as info:
            probe_module.require_ready(_Fake())
        assert info.value.code == "seccomp_not_enforced"
    assert len(calls) == 1
    clock[0] += probe_module.NEGATIVE_TTL
    assert probe_module.require_ready(_Fake()).ready and len(calls) == 2


def test_the_manager_refuses_a_backend_that_is_not_ready(probes, monkeypatch):
    answers, _ = probes
    answers += [False]
    fake = _Fake()
    monkeypatch.setattr(fake, "probe", lambda: None)
    only_backends(monkeypatch, fake)
    spawned = []
    monkeypatch.setattr(fake, "spawn", lambda *a: spawned.append(a))
    request = LaunchRequest(argv=("true",), cwd="/", env=())
    with pytest.raises(stockade.UnavailableError) as info:
        manager.SandboxManager().run(request)
    assert info.value.code == "seccomp_not_enforced" and not spawned


@pytest.mark.parametrize("ended", [{"exit_code": 1, "stdout": b"{}"},
                                   {"exit_code": 0, "stdout": b"not json"}])
def test_a_child_that_does_not_report_is_probe_child_failed_said_readably(ended):
    # (the Linux half's own message: the shared stage has none for it)
    from types import SimpleNamespace

    with pytest.raises(probe_module.Refused) as refused:
        linux_probe._observations(SimpleNamespace(**ended))
    assert refused.value.reason == "probe_child_failed"
    assert refused.value.message == "the probe's child did not report its observations"
