"""The egress fence service (stockade/windows/fence*.py, wfpengine.py, netfence.py): its
protocol, who may ask it for what (read from the kernel, never from the request), the fence's
ledger records and their reconciliation after a crash, the client, what the backend refuses
without it, a launch's network (the host's proxy, the fence asked for and given back), the WFP
and exemption-list calls over a fake of their documented behaviour, and the install plan.

No Windows here: the firewall is tests/windows_fence_fakes.py's model, the pipe a socket pair,
the ledger the real one. What a Windows host shows is tests/windows_fence_host.py's (the
workflow's `fence` and `network-any` jobs)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest
from test_windows_fakes import ADMINS, USER, USERS, FakeTree, bind_win32
from windows_fence_fakes import FakeFence, ModelFirewall, SocketTransport, read_filter

from stockade.errors import SetupError, UnenforceableError
from stockade.launch.request import CredentialSpec, HttpRule, LaunchRequest, NetworkSpec, PathGrant
from stockade.lifecycle import removers
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.lifecycle.removers import RemovalError
from stockade.windows import (
    acl,
    fence,
    fenceclient,
    fenceinstall,
    fencepipe,
    fenceproto,
    identity,
    netfence,
    rules,
    wfp,
    wfpengine,
)
from stockade.windows.fence import TokenFacts

TESTS = os.path.dirname(os.path.abspath(__file__))
SID = "S-1-15-2-2067022373-1386325468-3431155434-2426632640-3089004462-2553425549-105248742"
OTHER_SID = "S-1-15-2-1-2-3-4-5-6-7"
FOREIGN_SID = "S-1-15-2-11-12-13-14-15-16-17"  # an administrator's own exemption (Edge's, say)
PROFILE = "stockade-ac-" + "0123456789abcdef01234567"
OTHER_PROFILE = "stockade-ac-" + "fedcba9876543210fedcba98"
DERIVED = {PROFILE: SID, OTHER_PROFILE: OTHER_SID}
PORT = 50123
OWNER = TokenFacts(user=USER, appcontainer=False, package="", integrity=0x2000,
                   restricted=False, created=1000)
CHILD = TokenFacts(user=USER, appcontainer=True, package=SID, integrity=0x1000,
                   restricted=False, created=2000)
ACCEPTED = 1500


def fence_request(**changes) -> dict:
    body = {"v": 1, "op": "fence", "mode": "allowlist", "profile": PROFILE, "pid": 4242,
            "proxy_port": PORT}
    return {name: value for name, value in (body | changes).items() if value is not None}


# --- the protocol ------------------------------------------------------------------------------

def reader(data: bytes):
    left = [data]

    def read(size: int) -> bytes:  # a pipe hands out pieces, never more than asked
        chunk, left[0] = left[0][:min(size, 3)], left[0][min(size, 3):]
        return chunk

    return read


def test_frames_round_trip_and_a_request_of_this_version_is_accepted():
    for body in ({"v": 1, "op": "status"}, fence_request(), {"v": 1, "op": "release"},
                 fence_request(mode="any", proxy_port=None)):
        assert fenceproto.request(fenceproto.read_frame(reader(fenceproto.encode(body)))) \
            == body
    assert fenceproto.read_frame(reader(b"")) is None  # closed between frames


def test_an_oversized_frame_is_refused_from_its_header_and_never_sent():
    asked = []

    def read(size: int) -> bytes:
        asked.append(size)
        return struct.pack(">I", fenceproto.MAX_FRAME + 1) if len(asked) == 1 else b"x" * size

    with pytest.raises(fenceproto.ProtocolError) as refused:
        fenceproto.read_frame(read)
    assert refused.value.code == "fence_frame_too_large" and asked == [4]  # body never read
    with pytest.raises(fenceproto.ProtocolError, match="more than"):
        fenceproto.encode({"v": 1, "op": "status", "pad": "x" * fenceproto.MAX_FRAME})


@pytest.mark.parametrize(("frame", "code"), [
    (b'{"v":1,"op":"status","op":"status"}', "fence_frame_invalid"),   # a key twice
    (b"[1]", "fence_frame_invalid"),
    (b"\xff\xfe", "fence_frame_invalid"),
    (b"{", "fence_frame_invalid"),
])
def test_a_frame_that_is_not_one_json_object_is_refused(frame, code):
    with pytest.raises(fenceproto.ProtocolError) as refused:
        fenceproto.read_frame(reader(struct.pack(">I", len(frame)) + frame))
    assert refused.value.code == code


def test_a_frame_cut_short_is_refused():
    with pytest.raises(fenceproto.ProtocolError, match="inside a frame"):
        fenceproto.read_frame(reader(fenceproto.encode({"v": 1, "op": "status"})[:-2]))


@pytest.mark.parametrize(("body", "code"), [
    ({"v": 2, "op": "status"}, "fence_version"),
    ({"v": "1", "op": "status"}, "fence_version"),
    ({"v": True, "op": "status"}, "fence_version"),
    ({"op": "status"}, "fence_version"),
    ({"v": 1, "op": "exempt"}, "fence_request_invalid"),
    ({"v": 1}, "fence_request_invalid"),
    ({"v": 1, "op": "status", "sid": SID}, "fence_request_invalid"),           # unknown field
    (fence_request(sid=SID), "fence_request_invalid"),      # the SID is never the caller's say
    (fence_request(pid=None), "fence_request_invalid"),
    (fence_request(pid=0), "fence_request_invalid"),
    (fence_request(pid=True), "fence_request_invalid"),
    (fence_request(pid=2 ** 32), "fence_request_invalid"),
    (fence_request(proxy_port=0), "fence_request_invalid"),
    (fence_request(proxy_port=65536), "fence_request_invalid"),
    (fence_request(proxy_port=None), "fence_request_invalid"),
    (fence_request(mode="any"), "fence_request_invalid"),    # no proxy port under any
    (fence_request(mode="none"), "fence_request_invalid"),
    (fence_request(profile="Microsoft.MicrosoftEdge_8wekyb3d8bbwe"), "fence_request_invalid"),
    ({"v": 1, "op": "release", "now": True}, "fence_request_invalid"),
])
def test_a_request_this_version_does_not_define_exactly_is_refused(body, code):
    with pytest.raises(fenceproto.ProtocolError) as refused:
        fenceproto.request(body)
    assert refused.value.code == code


def test_the_client_reads_a_refusal_as_a_typed_error_and_anything_else_as_another_version():
    with pytest.raises(SetupError) as refused:
        fenceproto.answer(fenceproto.refused("fence_exists", "fenced already"))
    assert refused.value.code == "fence_exists" and refused.value.stage == "network"
    for body in ({"v": 2, "ok": True}, {"v": 1, "ok": "yes"},
                 {"v": 1, "ok": False, "code": "unenforceable", "message": "x"}):
        with pytest.raises(SetupError) as refused:
            fenceproto.answer(body)
        assert refused.value.code == "fence_version"
    with pytest.raises(SetupError, match="closed") as refused:
        fenceproto.answer(None)
    assert refused.value.code == "fence_lost"


# --- who may ask, for what ---------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "code"), [
    ({"appcontainer": True, "package": OTHER_SID}, "fence_caller_sandboxed"),
    ({"restricted": True}, "fence_caller_sandboxed"),
    ({"integrity": 0x1000}, "fence_caller_sandboxed"),                  # Low
    ({"created": ACCEPTED + 1}, "fence_caller_unknown"),                # a pid reused
])
def test_a_caller_in_a_sandbox_or_no_longer_there_is_refused(changes, code):
    from dataclasses import replace

    assert fence.caller_refusal(OWNER, ACCEPTED) is None
    assert fence.caller_refusal(replace(OWNER, integrity=0x3000), ACCEPTED) is None  # High
    assert fence.caller_refusal(replace(OWNER, **changes), ACCEPTED).code == code


@pytest.mark.parametrize(("changes", "profile", "code"), [
    ({"appcontainer": False, "package": ""}, PROFILE, "fence_target_not_appcontainer"),
    ({"package": "S-1-15-2-1"}, PROFILE, "fence_target_not_appcontainer"),  # every package's
    ({"user": "S-1-5-21-1-2-3-1002"}, PROFILE, "fence_target_other_user"),
    ({}, OTHER_PROFILE, "fence_target_not_stockade"),       # its package is another profile's
    ({}, "Microsoft.Edge", "fence_target_not_stockade"),
    ({"created": 999}, PROFILE, "fence_target_older"),
])
def test_the_target_must_be_a_stockade_launch_of_the_callers_own(changes, profile, code):
    from dataclasses import replace

    assert fence.target_refusal(OWNER, CHILD, PROFILE, SID) is None
    refusal = fence.target_refusal(OWNER, replace(CHILD, **changes), profile,
                                   DERIVED.get(profile, OTHER_SID))
    assert refusal is not None and refusal.code == code



@pytest.mark.parametrize(("owners", "fenced"), [([], True), ([USER], True),
                                               (["S-1-5-21-1-2-3-1002"], False),
                                               ([USER, "S-1-5-21-1-2-3-1002"], False)])
def test_a_package_sid_another_users_process_holds_is_not_fenced(tmp_path, owners, fenced):
    """Attack round on issue 36, F3: the package SID is the profile name's, whoever's; user B
    who makes an AppContainer of user A's profile name, and asks for a fence of it, would
    fence and exempt A's processes too. Refused while another user's process holds it."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    model = ModelFirewall()
    model.state["owners"] = {SID: owners}
    fence.register_kinds(model)
    connection = fence.Connection(fence.Fences(model, Ledger(str(state))), OWNER, ACCEPTED,
                                  lambda pid: CHILD, DERIVED.__getitem__)
    said = connection.answer({"v": 1, "op": "fence", "mode": "allowlist", "profile": PROFILE,
                              "pid": 4242, "proxy_port": PORT})
    assert said["ok"] == fenced and (SID in model.exempt_list) == fenced
    if not fenced:
        assert said["code"] == "fence_target_shared" and not model.of(SID)
    connection.close()


# --- fences, their records, and taking them back -----------------------------------------------

@pytest.fixture
def state(tmp_path):
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return str(path)


@pytest.fixture
def firewall():
    model = ModelFirewall()
    model.state["exempt"] = [FOREIGN_SID]
    model.foreign("00000000-0000-4000-8000-000000000001", SID)
    fence.register_kinds(model)
    return model


def test_an_allowlist_fence_is_recorded_before_it_is_applied_and_taken_back_exactly(
        state, firewall):
    ledger = Ledger(state)
    held = fence.Fences(firewall, ledger).fence("allowlist", SID, PORT)
    assert (held.filters, held.exemption) == (6, True)
    (record,) = ledger.records()
    with open(os.path.join(ledger.records_dir, record)) as f:
        lines = [json.loads(line) for line in f][1:]
    assert [line["add"]["kind"] for line in lines] == ["wfpfilters", "loopexempt"]
    keys = lines[0]["add"]["detail"]["keys"]
    assert lines[0]["add"]["detail"]["sid"] == SID and lines[1]["add"]["name"] == SID
    assert sorted(keys) == [key for key in firewall.of(SID)
                            if firewall.filters[key]["provider"] == str(wfp.PROVIDER)]
    assert firewall.exempt_list == [FOREIGN_SID, SID]
    fence.Fences(firewall, ledger).release(held)
    assert firewall.exempt_list == [FOREIGN_SID]  # the administrator's own exemption kept
    assert firewall.of(SID) == ["00000000-0000-4000-8000-000000000001"]  # another's filter
    assert ledger.records() == []


def test_an_any_fence_adds_filters_and_no_exemption(state, firewall):
    held = fence.Fences(firewall, Ledger(state)).fence("any", SID, None)
    assert held.filters == len(wfp.any_plan(SID)) and not held.exemption
    assert firewall.exempt_list == [FOREIGN_SID]


def test_one_appcontainer_is_fenced_once(state, firewall):
    fences = fence.Fences(firewall, Ledger(state))
    held = fences.fence("any", SID, None)
    with pytest.raises(fence.Refusal) as refused:
        fences.fence("allowlist", SID.lower().upper(), PORT)
    assert refused.value.code == "fence_exists"
    fences.release(held)
    fences.release(fences.fence("allowlist", SID, PORT))


def test_a_fence_that_fails_halfway_leaves_nothing(state, firewall):
    firewall.fail_adding = True
    fences = fence.Fences(firewall, Ledger(state))
    with pytest.raises(fence.Refusal) as refused:
        fences.fence("allowlist", SID, PORT)
    assert refused.value.code == "fence_apply_failed"
    assert firewall.exempt_list == [FOREIGN_SID] and len(firewall.of(SID)) == 1
    assert Ledger(state).records() == []
    firewall.fail_adding = False
    fences.release(fences.fence("allowlist", SID, PORT))  # (and it is not "fenced already")


def test_filters_stay_while_a_process_of_the_appcontainer_runs(state, firewall):
    ledger = Ledger(state)
    fences = fence.Fences(firewall, ledger)
    held = fences.fence("any", SID, None)
    firewall.state["live"] = [SID]
    with pytest.raises(fence.Refusal) as kept:
        fences.release(held)
    assert kept.value.code == "fence_kept"
    assert len(firewall.of(SID)) == len(wfp.any_plan(SID)) + 1 and ledger.records()
    assert ledger.reconcile().failed == 1  # still running: kept again
    firewall.state["live"] = []
    done = ledger.reconcile()
    assert (done.reconciled, ledger.records(), len(firewall.of(SID))) == (1, [], 1)


def test_the_exemption_goes_at_once_even_while_the_filters_must_wait(state, firewall):
    fences = fence.Fences(firewall, Ledger(state))
    held = fences.fence("allowlist", SID, PORT)
    firewall.state["live"] = [SID]
    with pytest.raises(fence.Refusal):
        fences.release(held)
    assert firewall.exempt_list == [FOREIGN_SID]  # loopback isolation back: fails closed
    assert len(firewall.of(SID)) == 7


def test_the_filters_stay_while_the_exemption_cannot_be_removed(state, firewall, monkeypatch):
    """Attack round on issue 36, F7: a failed exemption removal kept the record but deleted
    the filters (the ledger goes on past a failure): the SID exempt with no filter. Now the
    filters stay with it, and the reconcile takes both back once the exemption goes."""
    ledger = Ledger(state)
    held = fence.Fences(firewall, ledger).fence("allowlist", SID, PORT)
    unexempt = firewall.unexempt

    def failing(sid: str) -> None:
        raise OSError(None, "NetworkIsolationSetAppContainerConfig: error 5")

    monkeypatch.setattr(firewall, "unexempt", failing)
    with pytest.raises(fence.Refusal) as kept:
        fence.Fences(firewall, ledger).release(held)
    assert kept.value.code == "fence_kept"
    assert SID in firewall.exempt_list and len(firewall.of(SID)) == 7 and ledger.records()
    assert ledger.reconcile().failed == 1  # (still failing: both kept again)
    assert len(firewall.of(SID)) == 7
    monkeypatch.setattr(firewall, "unexempt", unexempt)
    assert ledger.reconcile().reconciled == 1
    assert firewall.exempt_list == [FOREIGN_SID] and len(firewall.of(SID)) == 1


CRASH = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    from windows_fence_fakes import ModelFirewall
    from stockade.lifecycle.ledger import LaunchRecord, Ledger
    from stockade.windows import fence
    model = ModelFirewall({path!r}, crash_at={crash_at!r})
    fence.register_kinds(model)
    fences = fence.Fences(model, Ledger({state!r}))
    fences.fence("any", {other!r}, None)
    fences.fence("allowlist", {sid!r}, {port!r})
    os._exit(9)  # the service dies with both fences in force
""")


@pytest.mark.parametrize("crash_at", ["add_filters", "after_filters", "exempt", "after_exempt",
                                      ""],
                         ids=["before-the-filters", "after-the-filters", "before-the-exemption",
                              "after-the-exemption", "both-applied"])
def test_reconcile_after_a_crash_removes_what_was_recorded_and_only_that(state, tmp_path,
                                                                         crash_at):
    path = str(tmp_path / "firewall.json")
    before = ModelFirewall(path)
    before.state["exempt"] = [FOREIGN_SID]
    before.foreign("00000000-0000-4000-8000-000000000001", SID)
    before.foreign("00000000-0000-4000-8000-000000000002", OTHER_SID)
    script = CRASH.format(tests=TESTS, path=path, crash_at=crash_at, state=state, sid=SID,
                          other=OTHER_SID, port=PORT)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 9, done.stderr
    crashed = ModelFirewall(path)
    if crash_at != "add_filters":
        assert len(crashed.of(OTHER_SID)) > 1 and Ledger(state).records()
    if not crash_at:
        assert crashed.exempt_list == [FOREIGN_SID, SID]
    after = ModelFirewall(path)
    fence.register_kinds(after)
    done = Ledger(state).reconcile()
    assert done.failed == 0 and done.quarantined == 0 and Ledger(state).records() == []
    final = ModelFirewall(path)
    assert final.exempt_list == [FOREIGN_SID]
    assert final.filters.keys() == {"00000000-0000-4000-8000-000000000001",
                                    "00000000-0000-4000-8000-000000000002"}
    assert {kind for kind, _ in done.removed} <= {"wfpfilters", "loopexempt"}


def test_a_record_naming_anothers_filter_removes_nothing(state, firewall):
    key = "00000000-0000-4000-8000-000000000001"  # the foreign filter's
    record = LaunchRecord(Ledger(state), "forged")
    record.add(fence.FILTERS_KIND, removers.fresh_name("fence"), {"sid": SID, "keys": [key]})
    record.abandon()
    done = Ledger(state).reconcile()
    assert done.failed == 1 and key in firewall.filters


def good_filters(**changes) -> dict:
    return {"sid": SID, "keys": [str(uuid.uuid4())]} | changes


@pytest.mark.parametrize(("kind", "name", "detail"), [
    ("wfpfilters", "stockade-fence-0", good_filters()),
    ("wfpfilters", "stockade-proxy-" + "0" * 24, good_filters()),
    ("wfpfilters", "stockade-fence-" + "0" * 24, good_filters(sid=USER)),     # never a user's
    ("wfpfilters", "stockade-fence-" + "0" * 24, good_filters(sid="S-1-15-2-1")),
    ("wfpfilters", "stockade-fence-" + "0" * 24, good_filters(keys=[])),
    ("wfpfilters", "stockade-fence-" + "0" * 24, good_filters(keys=["{" + "0" * 8 + "}"])),
    ("wfpfilters", "stockade-fence-" + "0" * 24, good_filters(keys=[str(uuid.UUID(int=1))] * 2)),
    ("wfpfilters", "stockade-fence-" + "0" * 24,
     good_filters(keys=[str(uuid.uuid4()) for _ in range(wfp.MAX_FILTERS + 1)])),
    ("wfpfilters", "stockade-fence-" + "0" * 24, good_filters(layer="x")),
    ("loopexempt", USER, {}),
    ("loopexempt", "S-1-15-2-1", {}),
    ("loopexempt", SID, {"keys": []}),
])
def test_records_the_fence_could_not_act_on_safely_are_refused(kind, name, detail):
    validator, _ = fence.kinds(ModelFirewall())[kind]
    with pytest.raises(ValueError):
        validator(name, detail)


# --- a connection, over a socket pair as its pipe -----------------------------------------------

@contextlib.contextmanager
def served(state: str, firewall: ModelFirewall, caller: TokenFacts = OWNER,
           targets: dict | None = None):
    """A client's transport to a connection served on a thread, as the service serves one."""
    fences = fence.Fences(firewall, Ledger(state))
    targets = {4242: CHILD} if targets is None else targets

    def target(pid: int) -> TokenFacts:
        if pid not in targets:
            raise OSError(None, "OpenProcess: Win32 error 87")
        return targets[pid]

    ours, theirs = socket.socketpair()
    connection = fence.Connection(fences, caller, ACCEPTED, target, DERIVED.__getitem__)
    def run() -> None:  # as the service's thread: serve, then close its end
        try:
            fence.serve(theirs.recv, theirs.sendall, connection)
        finally:
            theirs.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield SocketTransport(ours)
    finally:
        ours.close()
        thread.join(10)


def closed(transport: SocketTransport) -> bool:
    """Whether the service closed the connection (a reset too: it left bytes unread), within
    a few seconds."""
    transport.sock.settimeout(5)
    try:
        return transport.read(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_connection_fences_its_launch_and_gives_it_back(state, firewall):
    with served(state, firewall) as transport:
        client = fenceclient.FenceClient(lambda: transport)
        assert client.status()["service"] == "stockade-fence"
        assert client.fence("allowlist", PROFILE, 4242, PORT) == {
            "v": 1, "ok": True, "filters": 6, "exemption": True}
        assert SID in firewall.exempt_list and len(firewall.of(SID)) == 7
        with pytest.raises(SetupError) as twice:
            client.fence("allowlist", PROFILE, 4242, PORT)
        assert twice.value.code == "fence_state"
        client.release()
        assert firewall.exempt_list == [FOREIGN_SID] and len(firewall.of(SID)) == 1
        with pytest.raises(SetupError) as again:
            client.release()
        assert again.value.code == "fence_state"


def test_a_caller_gone_without_giving_its_fence_back_loses_it(state, firewall):
    with served(state, firewall) as transport:
        fenceclient.FenceClient(lambda: transport).fence("any", PROFILE, 4242, None)
        assert len(firewall.of(SID)) > 1
    assert len(firewall.of(SID)) == 1 and Ledger(state).records() == []


def test_a_sandboxed_caller_is_answered_nothing_but_a_refusal_and_cut_off(state, firewall):
    from dataclasses import replace

    sandboxed = replace(OWNER, appcontainer=True, package=SID)
    with served(state, firewall, caller=sandboxed) as transport:
        client = fenceclient.FenceClient(lambda: transport)
        with pytest.raises(SetupError) as refused:
            client.fence("allowlist", PROFILE, 4242, PORT)
        assert refused.value.code == "fence_caller_sandboxed"
        assert closed(transport)  # the service closed the connection
    assert firewall.exempt_list == [FOREIGN_SID] and len(firewall.of(SID)) == 1


def test_a_target_that_is_not_the_callers_launch_is_refused(state, firewall):
    from dataclasses import replace

    targets = {4242: replace(CHILD, user="S-1-5-21-1-2-3-1002")}
    with served(state, firewall, targets=targets) as transport:
        client = fenceclient.FenceClient(lambda: transport)
        with pytest.raises(SetupError) as refused:
            client.fence("allowlist", PROFILE, 4242, PORT)
        assert refused.value.code == "fence_target_other_user"
        with pytest.raises(SetupError) as gone:
            client.fence("allowlist", PROFILE, 4343, PORT)  # no such process
        assert gone.value.code == "fence_target_not_appcontainer"
        assert client.status()["ok"]  # a decision keeps the connection
    assert SID not in firewall.exempt_list


def test_a_frame_the_protocol_refuses_ends_the_connection_and_its_fence(state, firewall):
    with served(state, firewall) as transport:
        client = fenceclient.FenceClient(lambda: transport)
        client.fence("allowlist", PROFILE, 4242, PORT)
        with pytest.raises(SetupError) as refused:
            client.ask({"v": 1, "op": "release", "force": True})
        assert refused.value.code == "fence_request_invalid"
        assert closed(transport)
    assert firewall.exempt_list == [FOREIGN_SID] and len(firewall.of(SID)) == 1


def test_an_oversized_frame_ends_the_connection_unread(state, firewall):
    with served(state, firewall) as transport:
        transport.write(struct.pack(">I", 1 << 20) + b"{")
        answer = fenceproto.read_frame(transport.read)
        assert answer["code"] == "fence_frame_too_large"
        assert closed(transport)


# --- the client, and what the backend refuses without the service -----------------------------

def test_without_the_service_the_refusal_names_how_to_install_it():
    def absent() -> fenceclient.Transport:
        raise FileNotFoundError(2, "The system cannot find the file specified")

    why = fenceclient.helper_refusal(absent)
    assert "not running" in why and "stockade fence install" in why


def test_a_service_of_another_version_is_not_used(state, firewall):
    ours, theirs = socket.socketpair()

    def answer() -> None:
        fenceproto.read_frame(theirs.recv)
        theirs.sendall(fenceproto.encode({"v": 2, "ok": True}))

    thread = threading.Thread(target=answer)
    thread.start()
    why = fenceclient.helper_refusal(lambda: SocketTransport(ours))
    thread.join(10)
    theirs.close()
    assert "another version" in why and "stockade fence install" in why


def test_a_service_that_answers_is_used(state, firewall):
    with served(state, firewall) as transport:
        assert fenceclient.helper_refusal(lambda: transport) is None


def test_only_a_pipe_localsystem_owns_is_the_services():
    assert fencepipe.server_refusal("S-1-5-18") is None
    for squatter in (USER, ADMINS, "S-1-5-19"):
        assert fencepipe.server_refusal(squatter)



def test_the_pipe_is_systems_open_to_users_for_data_only_and_to_no_appcontainer():
    # Owned by SYSTEM (what clients check); Authenticated Users: read and write data, read
    # attributes and the descriptor, synchronize: not FILE_APPEND_DATA, which on a pipe is
    # FILE_CREATE_PIPE_INSTANCE (serving it); no entry an AppContainer matches (AC, a package
    # or capability SID); below Medium integrity nothing may write.
    assert fencepipe.PIPE_SDDL == "O:SYD:P(A;;GA;;;SY)(A;;0x120083;;;AU)S:(ML;;NW;;;ME)"
    assert 0x120083 & 0x4 == 0 and fencepipe.CLIENT_ACCESS & ~0x120083 == 0


def request(**network) -> LaunchRequest:
    return LaunchRequest(argv=("cmd.exe",), cwd="C:\\ws", env=(),
                         read=(PathGrant("C:\\ws", "C:\\ws"),), network=NetworkSpec(**network))


@pytest.mark.parametrize("mode", ["allowlist", "any"])
def test_allowlist_and_any_are_refused_without_the_service_naming_how_to_install_it(mode):
    with pytest.raises(UnenforceableError) as refused:
        rules.check(request(mode=mode))
    assert refused.value.code == f"unenforceable:network.{mode}"
    assert "stockade fence install" in refused.value.message
    with pytest.raises(UnenforceableError) as refused:
        rules.check(request(mode=mode), fence=lambda: "the pipe is not there; install it")
    assert refused.value.message == "the pipe is not there; install it"
    rules.check(request(mode=mode), fence=lambda: None)
    rules.check(request(mode="none"))  # (asks nobody)


@pytest.mark.parametrize(("network", "capability"), [
    ({"mode": "allowlist", "credentials": (CredentialSpec(
        "api", "api.example.com", "API_TOKEN", "stockade-cred-x"),)}, "network.credentials"),
    ({"mode": "allowlist", "http": (HttpRule("api.example.com"),)}, "network.http"),
    ({"mode": "any", "reach": ("10.0.0.5",)}, "network.reach"),
])
def test_what_the_windows_fence_does_not_offer_is_refused(network, capability):
    with pytest.raises(UnenforceableError) as refused:
        rules.check(request(**network), fence=lambda: None)
    assert refused.value.capability == capability


# --- a launch's network -------------------------------------------------------------------------

class Recorded:
    """A transport that answers like the service and keeps what it was asked."""

    def __init__(self) -> None:
        self.asked: list[dict] = []
        self.closed = False
        self._answers = b""

    def write(self, data: bytes) -> None:
        body = fenceproto.request(fenceproto.read_frame(reader(data)))
        self.asked.append(body)
        answer = fenceproto.ok(filters=6, exemption=True) if body["op"] == "fence" \
            else fenceproto.ok()
        self._answers += fenceproto.encode(answer)

    def read(self, size: int) -> bytes:
        data, self._answers = self._answers[:size], self._answers[size:]
        return data

    def close(self) -> None:
        self.closed = True


def test_an_allowlist_launch_gets_the_hosts_proxy_and_is_fenced_to_its_port():
    transport = Recorded()
    env = (("HTTPS_PROXY", "http://127.0.0.1:3128"), ("PATH", "C:\\Windows"))
    network = netfence.LaunchNetwork(LaunchRequest(
        argv=("x",), cwd="C:\\", env=env, network=NetworkSpec("allowlist", ("example.com",)),
        request_id="r1"), connect=lambda: transport)
    try:
        assert network.capabilities == ()  # no network capability at all
        port = network.port
        shown = dict(network.environment(env))
        assert shown["HTTPS_PROXY"] == shown["HTTP_PROXY"] == f"http://127.0.0.1:{port}"
        assert "http_proxy" not in shown  # (one name per variable: Windows ignores case)
        assert shown["ALL_PROXY"] == f"socks5h://127.0.0.1:{port}" and shown["NO_PROXY"] == ""
        assert shown["PATH"] == "C:\\Windows"
        assert network.attach(PROFILE, 4242) == {"fence": "allowlist", "filters": 6,
                                                  "loopback_exemption": True}
        assert transport.asked == [fence_request()  | {"proxy_port": port}]
        # the proxy on the host's loopback applies the policy's rules and logs what it denies
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"CONNECT evil.example.net:443 HTTP/1.1\r\n"
                           b"Host: evil.example.net:443\r\n\r\n")
            assert client.recv(100).startswith(b"HTTP/1.1 403")
    finally:
        network.close()
    assert transport.asked[-1] == {"v": 1, "op": "release"} and transport.closed
    assert [d["host"] for d in network.denials()] == ["evil.example.net"]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_an_any_launch_holds_internet_client_and_no_proxy():
    transport = Recorded()
    network = netfence.LaunchNetwork(LaunchRequest(argv=("x",), cwd="C:\\", env=(),
                                                   network=NetworkSpec("any")),
                                     connect=lambda: transport)
    assert network.capabilities == ("S-1-15-3-1",) and network.port is None
    assert network.environment((("A", "b"),)) == (("A", "b"),)
    network.attach(PROFILE, 4242)
    network.close()
    assert transport.asked == [fence_request(mode="any", proxy_port=None),
                               {"v": 1, "op": "release"}]


def test_a_launch_without_network_asks_the_service_nothing():
    def never() -> fenceclient.Transport:
        raise AssertionError("the fence service was asked")

    network = netfence.LaunchNetwork(LaunchRequest(argv=("x",), cwd="C:\\", env=()),
                                     connect=never)
    assert (network.capabilities, network.attach(PROFILE, 4242)) == ((), {})
    network.close()


# --- WFP and the exemption list, over their documented behaviour ------------------------------

@pytest.fixture
def wfp_fake(monkeypatch):
    fake = FakeFence()
    monkeypatch.setattr(wfpengine, "fence_win32", lambda: fake)
    monkeypatch.setattr(wfpengine, "win32", lambda: fake)
    bind_win32(monkeypatch, fake, identity)
    return fake


def test_the_sublayer_is_stockades_own_and_of_the_highest_weight(wfp_fake):
    engine = wfpengine.windows_firewall()
    assert wfp_fake.providers == {wfp.PROVIDER}
    assert wfp_fake.sublayers == {wfp.SUBLAYER: {"weight": 0xFFFF, "provider": wfp.PROVIDER}}
    engine.ensure_sublayer()  # (a restarted service: they exist already)
    engine.remove_sublayer()
    assert (wfp_fake.providers, wfp_fake.sublayers) == (set(), {})


def test_a_plan_is_added_in_one_transaction_as_planned(wfp_fake):
    engine = wfpengine.windows_firewall()
    plan = wfp.any_plan(SID)
    keys = tuple(str(uuid.uuid4()) for _ in plan)
    wfp_fake.fail_filter_at = 40
    with pytest.raises(OSError):
        engine.add_filters(plan, keys)
    assert wfp_fake.filters == {}  # aborted whole
    wfp_fake.fail_filter_at = None
    engine.add_filters(plan, keys)
    assert len(wfp_fake.filters) == len(plan)
    for one, key in zip(plan, keys, strict=True):
        seen = wfp_fake.filters[uuid.UUID(key)]
        assert (seen["layer"], seen["sublayer"], seen["provider"], seen["action"]) == (
            wfp.LAYERS[one.layer], wfp.SUBLAYER, wfp.PROVIDER, wfp.FWP_ACTION_BLOCK)
        assert [field for field, *_ in seen["conditions"]] == [
            wfp.FIELDS[c.field] for c in one.conditions]
        assert seen["conditions"][0][3] == SID
    with pytest.raises(OSError) as busy:
        engine.remove_sublayer()
    assert busy.value.winerror == 0x8032000A  # FWP_E_IN_USE: the fence's filters are there


def test_only_stockades_filters_are_deleted(wfp_fake):
    engine = wfpengine.windows_firewall()
    plan = wfp.allowlist_plan(SID, PORT)
    keys = tuple(str(uuid.uuid4()) for _ in plan)
    engine.add_filters(plan, keys)
    foreign = uuid.uuid4()
    wfp_fake.filters[foreign] = read_filter(wfpengine.filter_struct(plan[0], str(foreign), [])) \
        | {"provider": uuid.uuid4()}
    engine.delete_filter(keys[0])
    engine.delete_filter(keys[0])  # gone already: done
    with pytest.raises(RemovalError):
        engine.delete_filter(str(foreign))
    assert uuid.UUID(keys[0]) not in wfp_fake.filters and foreign in wfp_fake.filters
    assert wfp_fake.leaked() == []


def test_the_exemption_list_changes_by_one_sid_keeping_the_rest(wfp_fake):
    engine = wfpengine.windows_firewall()
    wfp_fake.exempt = [FOREIGN_SID]
    engine.exempt(SID)
    assert wfp_fake.exempt == [FOREIGN_SID, SID]
    engine.exempt(SID)
    engine.unexempt(OTHER_SID)
    assert wfp_fake.set_calls == 1  # nothing to change: the list is not rewritten
    engine.unexempt(SID)
    assert wfp_fake.exempt == [FOREIGN_SID] and engine.exemptions() == [FOREIGN_SID]
    wfp_fake.exempt = []
    assert engine.exemptions() == []
    assert wfp_fake.leaked() == []  # every SID and array read was HeapFree'd, once


# --- installing -------------------------------------------------------------------------------

PYTHON = "C:\\Program Files\\Python313"


def security_of(tree: FakeTree):
    return lambda path: (tree.node(path).owner, tree.read(path).aces)


def walk_of(tree: FakeTree):
    return lambda top: [node.path for node in tree.nodes.values()
                        if node.path == top or node.path.upper().startswith(
                            top.upper().rstrip("\\") + "\\")]


def planned(tree: FakeTree, python: str = PYTHON, prefix: str | None = None,
            exists=lambda path: False):
    return fenceinstall.plan(security_of(tree), exists, walk_of(tree), prefix or python,
                             python, python + "\\Lib\\site-packages", python + "\\python.exe")


def test_an_interpreter_only_administrators_can_change_is_installed_as_this_plan():
    tree = FakeTree.stock()
    tree.add(PYTHON + "\\Lib")
    tree.add(PYTHON + "\\Lib\\site-packages")
    made, commands = planned(tree)
    assert made == list(fenceinstall.STATES)
    binary = f'"{PYTHON}\\python.exe" -I -m stockade.windows.fenceservice'
    assert commands == [
        *(["icacls", path, "/inheritance:r", "/grant:r", "*S-1-5-18:(OI)(CI)F",
           "*S-1-5-32-544:(OI)(CI)F", "/Q"] for path in fenceinstall.STATES),
        ["sc.exe", "create", "StockadeFence", "binPath=", binary, "start=", "auto",
         "obj=", "LocalSystem", "DisplayName=", "Stockade egress fence"],
        ["sc.exe", "description", "StockadeFence", commands[3][3]],
        ["sc.exe", "failure", "StockadeFence", "reset=", "86400", "actions=",
         "restart/5000/restart/5000/restart/60000"],
        ["sc.exe", "start", "StockadeFence"]]
    assert fenceinstall.uninstall_commands() == [["sc.exe", "stop", "StockadeFence"],
                                                 ["sc.exe", "delete", "StockadeFence"]]


@pytest.mark.parametrize("edition", ["windows11", "server2022"])
def test_an_interpreter_below_the_drives_root_is_refused_as_others_can_change_it(edition):
    # (C:\hostedtoolcache, made by an administrator below C:\: Windows 11's root gives
    # Authenticated Users modify there, Server 2022's lets Users add files and folders)
    tree = FakeTree.stock(edition)
    top = "C:\\hostedtoolcache\\windows\\Python"
    tree.add(top)
    tree.file(top + "\\python.exe")
    with pytest.raises(SetupError) as refused:
        planned(tree, python=top)
    assert refused.value.code == "fence_install_unsafe"
    assert "S-1-5-11" in refused.value.message or USERS in refused.value.message


def test_a_virtual_environment_is_refused():
    with pytest.raises(SetupError, match="virtual environment"):
        planned(FakeTree.stock(), prefix="C:\\Users\\u\\proj\\.venv")


def test_a_file_the_user_owns_in_the_interpreter_is_refused():
    tree = FakeTree.stock()
    tree.add(PYTHON + "\\Lib")
    tree.add(PYTHON + "\\Lib\\site-packages")
    planned(tree)
    tree.file(PYTHON + "\\Lib\\site-packages\\sitecustomize.py", owner=USER)
    with pytest.raises(SetupError, match="its owner"):
        planned(tree)


def test_a_directory_above_that_lets_another_rename_the_interpreter_is_refused():
    tree = FakeTree.stock()
    admins_only = (acl.Ace.allow(ADMINS, 0x1F01FF, acl.OBJECT_INHERIT | acl.CONTAINER_INHERIT),)
    tree.add("C:\\tools", protected=True,
             explicit=(*admins_only, acl.Ace.allow(USER, fenceinstall.FILE_DELETE_CHILD)))
    tree.add("C:\\tools\\py")
    with pytest.raises(SetupError, match="above the interpreter"):
        planned(tree, python="C:\\tools\\py")


def test_a_state_directory_someone_else_made_first_is_refused():
    tree = FakeTree.stock()
    tree.add("C:\\ProgramData", explicit=(acl.Ace.allow(ADMINS, 0x1F01FF, 3),),
             protected=True)
    tree.add(fenceinstall.STATES[0], owner=USER)
    with pytest.raises(SetupError, match="exists already"):
        planned(tree, exists=lambda path: path == fenceinstall.STATES[0])
    tree.node(fenceinstall.STATES[0]).owner = ADMINS
    made, _ = planned(tree, exists=lambda path: path == fenceinstall.STATES[0])
    assert made == [fenceinstall.STATES[1]]  # the safe one kept, the other made
