"""The evidence judges' logic (pure: no sandbox): a row passes only when every attempt was
refused by a mechanism it names; an escape is a FAIL; anything that shows nothing — a missing
tool, another errno, an attack that did not finish, a proxy that decided by another rule — is an
ERROR; and a positive control must show the attack working where nothing refuses it."""

from __future__ import annotations

from stockade.evidence.command import EXIT_ERROR, EXIT_FAILED, exit_status
from stockade.evidence.judges import (
    Denied,
    Logged,
    ProxyRefused,
    Recorded,
    refused_by,
    worked_everywhere,
)
from stockade.evidence.runner import Matrix, Verdict
from stockade.launch.result import Result, Violation

LANDLOCK_OR_VIEW = Denied((refused_by("mount_view", "ENOENT"), refused_by("landlock", "EACCES")))


def result(*lines: str, exit_code: int = 0, log: tuple[dict, ...] = (),
           violations: tuple[Violation, ...] = ()) -> Result:
    return Result(exit_code=exit_code, signal=None, stdout="\n".join(lines).encode(),
                  stderr=b"", stdout_truncated=False, stderr_truncated=False, timed_out=False,
                  cancelled=False, duration=0.1, backend="linux", digest="", request_id="",
                  network_log=log, violations=violations)


def test_every_attempt_refused_by_a_named_mechanism_passes() -> None:
    found = LANDLOCK_OR_VIEW.check(result("read a: denied ENOENT", "read b: denied EACCES"))
    assert found.ok and not found.error
    assert "ENOENT: mount_view ×1" in found.text and "EACCES: landlock ×1" in found.text


def test_an_attempt_that_worked_is_a_fail_not_an_error() -> None:
    found = LANDLOCK_OR_VIEW.check(result("read a: denied ENOENT", "read b: ALLOWED secret"))
    assert not found.ok and not found.error and "read b" in found.text


def test_another_errno_is_an_error() -> None:
    found = LANDLOCK_OR_VIEW.check(result("read a: denied EINVAL"))
    assert not found.ok and found.error and "EINVAL" in found.text


def test_an_attempt_that_could_not_be_made_is_an_error() -> None:
    found = LANDLOCK_OR_VIEW.check(result("read a: denied ENOENT", "via proxy: error no proxy"))
    assert found.error and "could not try" in found.text


def test_an_attack_that_made_no_attempt_or_did_not_finish_is_an_error() -> None:
    assert LANDLOCK_OR_VIEW.check(result("x: note nothing")).error
    assert LANDLOCK_OR_VIEW.check(result("read a: denied ENOENT", exit_code=1)).error


def test_errnos_are_named_per_attempt() -> None:
    expect = Denied((refused_by("seccomp", "ENOSYS", attempts="clone3"),
                     refused_by("seccomp", "EPERM", attempts="unshare")))
    assert expect.check(result("clone3(plain): denied ENOSYS")).ok
    assert expect.check(result("unshare(x): denied ENOSYS")).error


def test_a_proxy_refusal_must_be_logged_with_the_rule_the_row_tests() -> None:
    expect = ProxyRefused((refused_by("proxy_addresses", "HTTP_403"),),
                          reasons=("address_loopback",))
    line = "via:a.test:8080: denied HTTP_403"
    by_address = ({"host": "a.test", "port": 8080, "reason": "address_loopback"},)
    by_port = ({"host": "a.test", "port": 8080, "reason": "port_not_allowed"},)
    assert expect.check(result(line, log=by_address)).ok
    assert expect.check(result(line, log=by_port)).error
    assert expect.check(result(line)).error


def test_a_time_out_is_a_refusal_only_with_the_denial_of_its_destination_logged() -> None:
    expect = Logged((refused_by("address_guard", "EACCES"),
                     refused_by("address_guard", "TimeoutError", attempts="tcp [fe80")),
                    silent=("TimeoutError",))
    line = "tcp [fe80::1%eth0]:4000: denied TimeoutError"
    denial = {"protocol": "tcp", "host": "fe80::1", "port": 4000, "decision": "deny"}
    assert expect.check(result(line, "udp [fd00::2]:53: denied EACCES", log=(denial,))).ok
    assert expect.check(result(line)).error
    assert expect.check(result(line, log=({**denial, "port": 4001},))).error
    assert expect.check(result(line, log=({**denial, "protocol": "udp"},))).error
    # (another attempt's time-out is no refusal at all)
    assert expect.check(result("tcp [fd00::2]:80: denied TimeoutError", log=(
        {**denial, "host": "fd00::2", "port": 80},))).error


def test_a_refused_name_must_be_recorded_once_per_attempt() -> None:
    expect = Recorded((refused_by("names_watch", "EACCES"),), kind="filesystem.host_code")
    lines = ("mkdir ws/lib/mod: denied EACCES", "open ws/lib/mod: denied EACCES")
    recorded = Violation("filesystem.host_code", "ws/lib/mod: not made")
    found = expect.check(result(*lines, violations=(recorded, recorded)))
    assert found.ok and "2 recorded filesystem.host_code" in found.text
    assert expect.check(result(*lines, violations=(recorded,))).error
    other = Violation("filesystem.protected", "ws/lib/mod: not made")
    assert expect.check(result(*lines, violations=(recorded, other))).error
    escaped = expect.check(result("mkdir ws/lib/mod: ALLOWED the name exists"))
    assert not escaped.ok and not escaped.error


def test_only_the_recorders_denials_must_be_recorded() -> None:
    """A read-only mount records nothing: its denials are not counted, the watch's are."""
    expect = Recorded((refused_by("host_code", "EROFS"), refused_by("names_watch", "EACCES")),
                      kind="filesystem.host_code")
    lines = ("mkdir ws/lib/x.py: denied EROFS", "open ws/lib/x.py: denied EROFS",
             "mkdir ws/plugins: denied EACCES")
    recorded = Violation("filesystem.host_code", "ws/plugins: not made")
    found = expect.check(result(*lines, violations=(recorded,)))
    assert found.ok and "1 recorded filesystem.host_code" in found.text, found.text
    assert expect.check(result(*lines)).error


def test_a_control_must_show_an_attempt_working_and_none_failing_as_in_the_sandbox() -> None:
    sandboxed = {"read a": "ENOENT", "read b": "EACCES"}
    worked = worked_everywhere(result("read a: ALLOWED x", "read b: denied EISDIR"),
                               sandboxed, str)
    assert worked.ok and "1 of 2 attempts worked, 1 failed otherwise" in worked.text
    same = worked_everywhere(result("read a: ALLOWED x", "read b: denied EACCES"),
                             sandboxed, str)
    assert not same.ok and "read b" in same.text
    assert not worked_everywhere(result("read a: denied EPERM"), sandboxed, str).ok
    assert not worked_everywhere(result("read a: ALLOWED x", exit_code=2), sandboxed, str).ok


def test_an_error_fails_the_run_but_an_escape_fails_it_first() -> None:
    def verdict(status: str) -> Verdict:
        return Verdict("x", "process", "a", "b", status, "", 0.0)
    assert exit_status(Matrix((verdict("ERROR"),), 0.0, {}), allow_not_run=True) == EXIT_ERROR
    assert exit_status(Matrix((verdict("ERROR"), verdict("FAIL")), 0.0, {}),
                       allow_not_run=True) == EXIT_FAILED


def test_a_row_that_raises_says_where(tmp_path) -> None:
    """An ERROR names the exception and where it was raised: PermissionError(13) alone, seen
    in a concurrent rootless run, could not be traced to the scene, the setup or a judge."""
    from stockade.evidence.row import Row
    from stockade.evidence.runner import run_row

    def broken_setup(scene) -> None:
        raise PermissionError(13, "Permission denied")

    row = Row("test.raises", "test", "nothing", "none.py", LANDLOCK_OR_VIEW, broken_setup,
              unproven="a test row")
    verdict = run_row(row, backend=None, base=tmp_path, tag="t")  # type: ignore[arg-type]
    assert verdict.status == "ERROR"
    assert "PermissionError(13" in verdict.observed
    assert "at test_evidence_judges.py:" in verdict.observed
    assert "(broken_setup)" in verdict.observed
