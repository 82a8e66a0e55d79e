"""The one-shot launch broker (issue 36, item 3: stockade/windows/manifest.py, manifestfile.py,
broker.py, brokered.py). Here, on any platform: its frames (canonical, versioned, closed,
bounded); the manifest file through its Win32 calls on a model volume (tests/windows_volume.py:
closed from its creation, consumed once, refused when missing or replaced between the write and
the consume as the broker's open would see it); each refusal of the broker, with nothing
launched; its accept path, which calls the launcher with exactly what the canonical request
says; the host's binding with a broker that refuses, fails, crashes or never answers; and a
real broker process bound to its real PID. On Windows (marked `windows`), the same against
NTFS and a real broker process: .github/workflows/windows.yml's `broker` step requires those
to have run and passed."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import ntpath
import os
import secrets
import subprocess
import sys
from dataclasses import replace

import pytest
from test_windows_fakes import PACKAGE, USER, bind_win32
from windows_processes import Processes
from windows_volume import Volume

from stockade.errors import BrokerError, CommandNotFound, StartError
from stockade.launch.request import LaunchRequest, NetworkSpec, PathGrant
from stockade.lifecycle import removers
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.windows import (
    aclstore,
    broker,
    brokered,
    cmdline,
    envblock,
    handle,
    manifestfile,
    netfence,
    process,
    procid,
    program,
    records,
)
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.admission import Entry
from stockade.windows.manifest import (
    MAX_CONTROL,
    MAX_MANIFEST,
    Answer,
    Context,
    Control,
    Manifest,
    decode_answer,
    decode_control,
    decode_manifest,
)

PYTHON = "C:\\py\\python.exe"
DIRECTORY = "C:\\Users\\u\\.local\\state\\stockade\\broker"
BROKER_PID = 5150
NONCE = "ab" * 32
RUNTIME = "S-1-15-3-1024-1-2-3-4-5-6-7-8"
CONTEXT = Context(package_sid=PACKAGE, capabilities=(RUNTIME,),
                  desktop="WinSta0\\stockade-" + "5" * 24,
                  temp="C:\\Users\\u\\AppData\\Local\\Packages\\stockade-ac-1\\AC\\Temp",
                  job=0x104, stdio=(0x10, 0x14, 0x18))
CREATED = process.Created(process=0x4011, thread=0x4012, pid=4242, thread_id=4243)


def base(**changes) -> LaunchRequest:
    request = LaunchRequest(
        argv=(PYTHON, "-c", "print(1)"), cwd="C:\\ws",
        env=(("PATH", "C:\\py"), ("SystemRoot", "C:\\Windows")),
        read=(PathGrant("C:\\py", "C:\\py"),), write=(PathGrant("C:\\ws", "C:\\ws"),),
        protected=(".git",), request_id="1d" * 16)
    return replace(request, **changes)


def resolve(request: LaunchRequest) -> str:
    """program.executable over a host whose only program is PYTHON, a plain file."""
    return program.executable(request, is_file=lambda path: path == PYTHON,
                              entry=lambda path: Entry(path, False, 0x20, 0),
                              link_target=lambda path: None)


def rewritten(data: bytes, change) -> bytes:
    """A frame with `change(body)` made to its JSON, in canonical form again."""
    body = json.loads(data)
    change(body)
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class Launcher:
    """The AppContainer launcher, as a record of what it was asked to launch."""

    def __init__(self, fails: OSError | None = None) -> None:
        self.launched: list[process.Launch] = []
        self.fails = fails

    def __call__(self, launch: process.Launch) -> process.Created:
        self.launched.append(launch)
        if self.fails:
            raise self.fails
        return CREATED


@pytest.fixture
def volume(monkeypatch) -> Volume:
    model = Volume()
    bind_win32(monkeypatch, model, manifestfile, aclstore)
    return model


@pytest.fixture(autouse=True)
def kinds(monkeypatch):
    """The Windows backend's ledger kinds registered (as on Windows), for this test only."""
    monkeypatch.setattr(removers, "REMOVERS", dict(removers.REMOVERS))
    monkeypatch.setattr(removers, "_VALIDATORS", dict(removers._VALIDATORS))
    records.register_kinds()


@pytest.fixture
def processes(monkeypatch) -> Processes:
    model = Processes()
    bind_win32(monkeypatch, model, procid)
    return model


def write(request: LaunchRequest, *, pid: int = BROKER_PID, change=None,
          data: bytes | None = None) -> tuple[manifestfile.Written, bytes]:
    """The host's manifest for `request` (its JSON changed by `change`) in DIRECTORY, and the
    control frame it sends the broker."""
    encoded = Manifest.for_launch(pid, NONCE, request, CONTEXT).encode()
    written = manifestfile.write(manifestfile.fresh_path(DIRECTORY), data if data is not None else
                                 rewritten(encoded, change) if change else encoded, USER)
    return written, Control(NONCE, request.digest, written.path, written.file_id).encode()


def consume(path: str, file_id: str, limit: int) -> bytes:
    return manifestfile.consume(path, file_id, limit, USER)


def refused(frame: bytes, launcher: Launcher | None = None, pid: int = BROKER_PID) -> BrokerError:
    """The broker's refusal of `frame`, having launched nothing."""
    launcher = launcher or Launcher()
    with pytest.raises(BrokerError) as raised:
        broker.Broker(pid, consume, launcher, resolve).launch(frame)
    assert launcher.launched == []
    assert raised.value.exit_code == 70 and raised.value.stage == "broker"
    return raised.value


# --- the frames -----------------------------------------------------------------------------------


def test_a_manifest_is_canonical_and_decodes_to_the_same_launch():
    request = base()
    data = Manifest.for_launch(BROKER_PID, NONCE, request, CONTEXT).encode()
    assert data == rewritten(data, lambda body: None)  # sorted keys, no spaces, ASCII
    assert data.isascii() and b": " not in data and b", " not in data
    manifest = decode_manifest(data)
    assert manifest.request == request and manifest.context == CONTEXT
    assert (manifest.broker_pid, manifest.nonce, manifest.digest) == (BROKER_PID, NONCE,
                                                                      request.digest)
    control = Control(NONCE, request.digest, "C:\\m", "0000abcd-0000000000000001")
    assert decode_control(control.encode()) == control
    answer = Answer("launched", {"pid": 1, "thread_id": 2})
    assert decode_answer(answer.encode()) == answer


@pytest.mark.parametrize(("frame", "decode"), [
    (Manifest.for_launch(BROKER_PID, NONCE, base(), CONTEXT).encode(), decode_manifest),
    (Control(NONCE, "cd" * 32, "C:\\m", "0000abcd-0000000000000001").encode(), decode_control),
    (Answer("failed", {"winerror": 5, "message": "denied"}).encode(), decode_answer),
], ids=["manifest", "control", "answer"])
def test_every_frame_refuses_an_unknown_field_an_unknown_version_and_its_oversize(frame, decode):
    unknown = refused_frame(decode, rewritten(frame, lambda body: body.update(extra=1)))
    assert unknown.code == "broker_unknown_field" and "extra" in unknown.message
    for version in (2, 0, "1", None, 1.0, True):
        wrong = refused_frame(decode, rewritten(frame, lambda b, v=version: b.update(version=v)))
        assert wrong.code == "broker_unknown_version"
    missing = refused_frame(decode, rewritten(frame, lambda body: body.pop("version")))
    assert missing.code == "broker_unknown_version"
    bound = {decode_manifest: MAX_MANIFEST, decode_control: MAX_CONTROL}.get(decode, 32 << 10)
    padded = frame[:-1] + b" " * (bound + 1 - len(frame)) + b"}"
    assert refused_frame(decode, padded).code == "broker_frame_oversized"
    assert decode(frame[:-1] + b" " * (bound - len(frame)) + b"}")  # (at the bound: read)
    for garbage in (b"", b"[1]", b"\xff", b"{"):
        assert refused_frame(decode, garbage).code == "broker_frame_invalid"


def test_an_answer_holds_one_known_outcome():
    for answer, code in ((Answer("exploded", {}), "broker_frame_invalid"),
                         (Answer("launched", {"pid": 1, "thread_id": 2, "more": 3}),
                          "broker_unknown_field"),
                         (Answer("launched", {"pid": 1}), "broker_frame_invalid"),
                         (Answer("refused", {"kind": "other", "code": "x", "message": "y"}),
                          "broker_frame_invalid")):
        assert refused_frame(decode_answer, answer.encode()).code == code


def refused_frame(decode, data: bytes) -> BrokerError:
    with pytest.raises(BrokerError) as raised:
        decode(data)
    return raised.value


@pytest.mark.parametrize(("change", "code", "names"), [
    (lambda b: b["context"].update(more=1), "broker_unknown_field", "manifest.context.more"),
    (lambda b: b["request"].update(more=1), "broker_request_invalid", "unknown request field"),
    (lambda b: b["request"]["network"].update(more=1), "broker_request_invalid",
     "network.more"),
    (lambda b: b["request"].update(version=2), "broker_request_invalid", "version"),
    (lambda b: b.pop("nonce"), "broker_frame_invalid", "manifest.nonce is missing"),
    (lambda b: b.update(nonce="AB" * 32), "broker_frame_invalid", "manifest.nonce"),
    (lambda b: b.update(broker_pid=True), "broker_frame_invalid", "manifest.broker_pid"),
    (lambda b: b.update(broker_pid=0), "broker_frame_invalid", "manifest.broker_pid"),
    # The context names a launch's own things only: no other desktop, no user's SID, no
    # capability beyond a runtime root's (internetClient is S-1-15-3-1), three real handles.
    (lambda b: b["context"].update(desktop="WinSta0\\Default"), "broker_frame_invalid",
     "desktop"),
    (lambda b: b["context"].update(package_sid=USER), "broker_frame_invalid", "package_sid"),
    (lambda b: b["context"].update(capabilities=["S-1-15-3-1"]), "broker_frame_invalid",
     "capabilities"),
    (lambda b: b["context"].update(stdio=[1, 2]), "broker_frame_invalid", "stdio"),
    (lambda b: b["context"].update(job=0), "broker_frame_invalid", "job"),
])
def test_a_manifest_that_is_not_one_is_refused_typed(change, code, names):
    data = rewritten(Manifest.for_launch(BROKER_PID, NONCE, base(), CONTEXT).encode(), change)
    error = refused_frame(decode_manifest, data)
    assert error.code == code and names in error.message


# --- the manifest file ----------------------------------------------------------------------------


def test_the_manifest_is_closed_from_its_creation_and_consumed_once(volume):
    written, _ = write(base())
    node = volume.node(written.path)
    # One entry, this user's; protected: nothing inherited, no AppContainer's, no group's.
    assert node.dacl.aces == manifestfile.closed_dacl(USER).aces and node.dacl.protected
    assert ntpath.dirname(written.path) == DIRECTORY
    data = consume(written.path, written.file_id, MAX_MANIFEST)
    assert decode_manifest(data).request == base()
    assert not volume.exists(written.path) and volume.handles == {}
    assert refused_consume(written).code == "broker_manifest_missing"


def test_a_sandbox_could_not_open_the_manifest(volume):
    """An AppContainer process is granted only what an entry for its package SID, ALL
    APPLICATION PACKAGES or a capability it holds allows: the closed DACL has none."""
    written, _ = write(base())
    volume.token_sids = (PACKAGE, sids.ALL_APP_PACKAGES, RUNTIME)  # (the AppContainer half)
    assert refused_consume(written).code == "broker_manifest_replaced"
    assert volume.exists(written.path)


def test_a_name_someone_took_first_fails_the_write(volume):
    planted = manifestfile.fresh_path(DIRECTORY)
    volume.replace(planted, b"{}")
    with pytest.raises(OSError) as failed:
        manifestfile.write(planted, b"{}", USER)
    assert failed.value.winerror == c.ERROR_FILE_EXISTS


def refused_consume(written: manifestfile.Written, limit: int = MAX_MANIFEST) -> BrokerError:
    with pytest.raises(BrokerError) as raised:
        consume(written.path, written.file_id, limit)
    return raised.value


# What another process of this user could put at the manifest's name between the host's write
# and the broker's consume, and what the broker's open sees there.
def _replaced(volume: Volume, path: str) -> None:
    volume.replace(path)  # the same bytes, the same DACL: another file


def _symlink(volume: Volume, path: str) -> None:
    volume.move(path, path + ".kept")
    volume.symlink(path, path + ".kept")  # a link to the host's own file


def _hard_link(volume: Volume, path: str) -> None:
    volume.link(path, path + ".second")


def _directory(volume: Volume, path: str) -> None:
    volume.remove(path)
    volume.mkdir(path)


def _held(volume: Volume, path: str) -> None:
    volume.hold(path, c.FILE_SHARE_READ | c.FILE_SHARE_WRITE | c.FILE_SHARE_DELETE)


def _widened(volume: Volume, path: str) -> None:
    volume.widen(path, sids.ALL_APP_PACKAGES, c.FILE_GENERIC_READ)


@pytest.mark.parametrize(("change", "why"), [
    (_replaced, "not the one the host wrote"), (_symlink, "reparse point"),
    (_hard_link, "more than one name"), (_directory, "cannot be opened alone"),
    (_held, "cannot be opened alone"), (_widened, "open to more than this user"),
], ids=["another-file", "symlink", "hard-link", "directory", "held-open", "dacl-widened"])
def test_a_manifest_replaced_between_write_and_consume_is_refused(volume, change, why):
    request = base()
    written, control = write(request)
    change(volume, written.path)
    error = refused(control)
    assert error.code == "broker_manifest_replaced" and why in error.message


def test_a_manifest_missing_at_consume_is_refused(volume):
    written, control = write(base())
    volume.remove(written.path)
    assert refused(control).code == "broker_manifest_missing"
    volume.symlink(written.path, written.path + ".gone")  # (a link to nothing: opened itself)
    assert refused(control).code == "broker_manifest_replaced"


def test_the_manifest_is_read_only_up_to_its_bound(volume):
    written = manifestfile.write(manifestfile.fresh_path(DIRECTORY), b"x" * 65, USER)
    error = refused_consume(written, limit=64)
    assert error.code == "broker_frame_oversized" and not volume.exists(written.path)
    written = manifestfile.write(manifestfile.fresh_path(DIRECTORY), b"x" * 64, USER)
    assert consume(written.path, written.file_id, 64) == b"x" * 64


def test_a_manifest_past_its_bound_is_refused_unread(volume):
    written, control = write(base(), data=b"{" + b" " * MAX_MANIFEST + b"}")
    assert refused(control).code == "broker_frame_oversized"
    assert not volume.exists(written.path)  # (consumed all the same)


# --- the broker's refusals ------------------------------------------------------------------------


# Every part of the canonical request the digest covers, changed in the manifest after the host
# took the request's digest (which the manifest and the control frame still name).
TAMPERED = {
    "argv": lambda b: b["request"].update(argv=[PYTHON, "-c", "import os; os.system('x')"]),
    "cwd": lambda b: b["request"].update(cwd="C:\\ws\\sub"),
    "read": lambda b: b["request"]["read"].append({"path": "C:\\", "alias": "C:\\"}),
    "write": lambda b: b["request"]["write"].append({"path": "C:\\py", "alias": "C:\\py"}),
    "deny": lambda b: b["request"].update(deny=[]) or b["request"]["protected"].clear(),
    "network": lambda b: b["request"]["network"].update(mode="any"),
    "env": lambda b: b["request"]["env"].append(["ZZ_SECRET", "x"]),
    "limits": lambda b: b["request"]["limits"].update(memory=1 << 40),
    "exec_from_write": lambda b: b["request"].update(exec_from_write=True),
}


@pytest.mark.parametrize("part", sorted(TAMPERED))
def test_a_manifest_whose_request_is_not_the_digested_one_is_refused(volume, part):
    request = base(deny=(PathGrant("C:\\ws\\secret", "C:\\ws\\secret"),))
    _, control = write(request, change=TAMPERED[part])
    assert refused(control).code == "broker_digest_mismatch"


def test_a_digest_rewritten_to_match_a_tampered_request_is_refused_by_the_hosts(volume):
    """The manifest made consistent again (its digest recomputed for the changed request): the
    control frame, out of band, still names the host's."""
    request = base()
    tampered = replace(request, argv=(PYTHON, "-c", "evil()"))
    _, control = write(request, data=Manifest.for_launch(BROKER_PID, NONCE, tampered,
                                                         CONTEXT).encode())
    assert refused(control).code == "broker_digest_mismatch"
    # and a control frame naming another digest than an untouched manifest's
    _, control = write(request)
    other = rewritten(control, lambda body: body.update(digest="0" * 64))
    assert refused(other).code == "broker_digest_mismatch"
    # and a manifest naming another digest than its untouched request's and the host's
    _, control = write(request, change=lambda body: body.update(digest="0" * 64))
    assert refused(control).code == "broker_digest_mismatch"


def test_a_manifest_bound_to_another_process_is_refused(volume):
    _, control = write(base(), pid=BROKER_PID + 4)
    error = refused(control)
    assert error.code == "broker_pid_mismatch" and str(BROKER_PID + 4) in error.message


def test_a_control_frame_with_another_nonce_is_refused(volume):
    _, control = write(base())
    other = rewritten(control, lambda body: body.update(nonce="cd" * 32))
    assert refused(other).code == "broker_nonce_mismatch"


def test_a_broker_takes_one_manifest_whatever_became_of_it(volume):
    request = base()
    launcher = Launcher()
    one = broker.Broker(BROKER_PID, consume, launcher, resolve)
    written, control = write(request)
    assert one.launch(control) == CREATED and len(launcher.launched) == 1
    # The same manifest put back at its name and its frame sent again: reused.
    volume.replace(written.path, Manifest.for_launch(BROKER_PID, NONCE, request,
                                                     CONTEXT).encode())
    with pytest.raises(BrokerError) as again:
        one.launch(control)
    assert again.value.code == "broker_manifest_reused" and len(launcher.launched) == 1
    # A fresh, valid manifest for the same spent broker: reused all the same.
    _, fresh = write(request)
    with pytest.raises(BrokerError) as spent:
        one.launch(fresh)
    assert spent.value.code == "broker_manifest_reused" and len(launcher.launched) == 1
    # A broker that refused its first frame is spent too.
    refusing = broker.Broker(BROKER_PID, consume, launcher, resolve)
    with pytest.raises(BrokerError):
        refusing.launch(b"{}")
    _, control = write(request)
    with pytest.raises(BrokerError) as after:
        refusing.launch(control)
    assert after.value.code == "broker_manifest_reused" and len(launcher.launched) == 1


def test_a_consumed_manifest_replayed_to_another_broker_is_refused(volume):
    """A copy of a manifest its broker consumed, put back at a name for a second broker (which
    was told its file): bound to the first broker's PID."""
    request = base()
    written, control = write(request)
    data = bytes(volume.node(written.path).data)
    assert broker.Broker(BROKER_PID, consume, Launcher(), resolve).launch(control) == CREATED
    again, _ = write(request, data=data)
    replay = rewritten(control, lambda body: body.update(path=again.path,
                                                         file_id=again.file_id))
    assert refused(replay, pid=BROKER_PID + 4).code == "broker_pid_mismatch"


@pytest.mark.parametrize(("change", "code"), [
    (lambda b: b.update(extra=1), "broker_unknown_field"),
    (lambda b: b.update(version=2), "broker_unknown_version"),
    (lambda b: b.update(path="C:\\x" * 400), "broker_frame_invalid"),
])
def test_a_control_frame_that_is_not_one_is_refused_before_any_manifest_is_touched(
        volume, change, code):
    written, control = write(base())
    assert refused(rewritten(control, change)).code == code
    assert volume.exists(written.path)  # (its broker never opened it: the host discards it)


def test_a_control_frame_past_its_bound_is_refused_unread(volume):
    written, control = write(base())
    padded = control[:-1] + b" " * MAX_CONTROL + b"}"
    assert refused(padded).code == "broker_frame_oversized"
    assert volume.exists(written.path)


# --- the accept path ------------------------------------------------------------------------------


def test_the_broker_launches_exactly_what_the_canonical_request_says(volume):
    request = base(exec_from_write=False, env=(("PATH", "C:\\py"), ("SystemRoot", "C:\\Windows"),
                                               ("TOKEN", "x")))
    written, control = write(request)
    launcher = Launcher()
    assert broker.Broker(BROKER_PID, consume, launcher, resolve).launch(control) == CREATED
    (launch,) = launcher.launched
    assert launch == process.Launch(
        application=PYTHON, command_line=cmdline.command_line(request.argv),
        environment=envblock.environment_block(envblock.with_temp(request.env, CONTEXT.temp)),
        cwd=request.cwd, desktop=CONTEXT.desktop, package_sid=CONTEXT.package_sid,
        capabilities=CONTEXT.capabilities, job=CONTEXT.job, stdio=CONTEXT.stdio,
        mitigations=process.mitigations(False))
    assert launch == broker.launch_for(request, CONTEXT, resolve)
    assert not volume.exists(written.path)  # consumed
    # The program is looked up again from the request: one outside every root is the command's.
    _, control = write(base(read=()))
    with pytest.raises(CommandNotFound):
        broker.Broker(BROKER_PID, consume, Launcher(), resolve).launch(control)


def test_the_network_capability_is_granted_from_the_request_for_any_alone(volume):
    """internetClient (S-1-15-3-1) is added to the context's capabilities for `any` and for
    nothing else: from the request the digest binds, the one the host verifies the token by
    (netfence.capabilities); an `allowlist` child holds no network capability at all."""
    for mode, network in (("none", ()), ("allowlist", ()), ("any", ("S-1-15-3-1",))):
        request = base(network=NetworkSpec(mode, ("example.com",) if mode == "allowlist" else ()))
        _, control = write(request)
        launcher = Launcher()
        broker.Broker(BROKER_PID, consume, launcher, resolve).launch(control)
        (launch,) = launcher.launched
        assert launch.capabilities == CONTEXT.capabilities + network
        assert netfence.capabilities(request) == network


def test_the_broker_can_call_nothing_but_the_appcontainer_launcher():
    """It starts nothing itself: no subprocess, no os.system/spawn/exec/startfile, no ctypes;
    its process (main) is given process.create as its launcher, and nothing else launches."""
    source = inspect.getsource(broker)
    tree = ast.parse(source)
    nodes = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    imported = {alias.name for node in nodes for alias in node.names} | {
        node.module for node in nodes if isinstance(node, ast.ImportFrom)}
    assert not imported & {"subprocess", "multiprocessing", "ctypes", "_winapi", "pty"}
    starts = {name for name in dir(os) if name.startswith(("exec", "spawn", "posix_spawn"))}
    called = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id == "os"}
    assert not called & (starts | {"system", "startfile", "popen", "fork"})
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef)
                and node.name == "main")
    assert "process.create" in ast.unparse(main)


# --- the host's binding ---------------------------------------------------------------------------


class ModelBroker:
    """A broker process as brokered.py sees one (subprocess.Popen's surface), a process of the
    model `processes`, running the real broker over the model volume when it is given its
    frame; `behaviour` makes it answer late (never), crash, or answer something of its own."""

    def __init__(self, handles: tuple[int, ...], launcher: Launcher, behaviour: str,
                 processes: Processes) -> None:
        self.handles, self.launcher, self.behaviour = handles, launcher, behaviour
        self.processes, self.process = processes, processes.start()
        self.pid = self.process.pid
        self.returncode: int | None = None
        self.killed = False

    def communicate(self, input: bytes | None = None, timeout: float | None = None):
        if self.killed:
            return self._ends(1, b"", b"")
        if self.behaviour == "hangs":
            raise subprocess.TimeoutExpired("broker", timeout)
        if self.behaviour == "crashes":
            return self._ends(1, b"", b"Traceback ...\nModuleNotFoundError: No module named "
                                      b"'stockade'\n")
        said = broker.answer(broker.Broker(self.pid, consume, self.launcher, resolve), input)
        return self._ends(0, said.encode(), b"")

    def _ends(self, code: int, out: bytes, err: bytes) -> tuple[bytes, bytes]:
        self.returncode = code
        self.processes.exit(self.process)
        return out, err

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.killed = True


class HostDied(BaseException):
    """The host's process ends here: nothing after runs (its `finally` blocks neither)."""


class Noted:
    """A launch's ledger record as brokered.create adds to it: each resource validated as the
    ledger validates it, and kept."""

    def __init__(self) -> None:
        self.added: list[tuple[str, str, dict]] = []

    def add(self, kind: str, name: str, detail: dict | None = None) -> None:
        removers.validate(kind, name, detail or {})
        self.added.append((kind, name, detail or {}))


class Binding:
    """brokered.Calls over the model volume and ModelBrokers; `record` the launch's (by default
    one that only notes what is added). `host_dies`: the host's process ends as soon as the
    manifest is written."""

    def __init__(self, launcher: Launcher | None = None, behaviour: str = "", *,
                 processes: Processes | None = None, record=None,
                 host_dies: bool = False) -> None:
        self.launcher = launcher or Launcher()
        self.behaviour = behaviour
        self.processes = processes or Processes()
        self.record = record or Noted()
        self.host_dies = host_dies
        self.brokers: list[ModelBroker] = []
        self.opened: list[tuple[int, int]] = []
        self.written: list[manifestfile.Written] = []

    def spawn(self, handles: tuple[int, ...]) -> ModelBroker:
        self.brokers.append(ModelBroker(handles, self.launcher, self.behaviour,
                                        self.processes))
        return self.brokers[-1]

    def created(self, pid: int) -> int:
        return self.processes.table[pid].created

    def write(self, path: str, data: bytes, user: str) -> manifestfile.Written:
        self.written.append(manifestfile.write(path, data, user))
        if self.host_dies:
            raise HostDied
        return self.written[-1]

    def open(self, pid: int, thread_id: int) -> process.Created:
        self.opened.append((pid, thread_id))
        return replace(CREATED, pid=pid, thread_id=thread_id)

    def calls(self) -> brokered.Calls:
        return brokered.Calls(spawn=self.spawn, created=self.created, write=self.write,
                              discard=manifestfile.discard, opened=self.open)

    def create(self, request: LaunchRequest) -> brokered.Started:
        return brokered.create(request, CONTEXT, DIRECTORY, USER, self.record, self.calls())


def test_the_host_has_its_child_started_by_a_broker_of_its_own(volume):
    binding = Binding()
    started = binding.create(base())
    (model,) = binding.brokers
    assert model.handles == (CONTEXT.job, *CONTEXT.stdio)  # all it inherits
    assert started == brokered.Started(replace(CREATED, pid=CREATED.pid,
                                               thread_id=CREATED.thread_id), model.pid, True)
    assert binding.opened == [(CREATED.pid, CREATED.thread_id)]  # opened for verification
    (written,) = binding.written
    assert not volume.exists(written.path) and volume.handles == {}
    (launch,) = binding.launcher.launched
    assert launch == broker.launch_for(base(), CONTEXT, resolve)


def test_a_broker_refusal_reaches_the_host_typed_and_nothing_is_opened(volume):
    binding = Binding()
    with pytest.MonkeyPatch.context() as patch:  # (a manifest bound to another PID)
        patch.setattr(brokered.Manifest, "for_launch", classmethod(
            lambda cls, pid, nonce, request, context: Manifest(
                pid + 4, nonce, request.digest, request, context)))
        with pytest.raises(BrokerError) as raised:
            binding.create(base())
    assert raised.value.code == "broker_pid_mismatch" and raised.value.exit_code == 70
    assert binding.opened == [] and binding.launcher.launched == []
    # The command's own refusal stays the command's: 71, a FileNotFoundError.
    with pytest.raises(CommandNotFound) as missing:
        Binding().create(base(read=()))
    assert missing.value.exit_code == 71


def test_a_launcher_failure_reaches_the_host_as_its_oserror(volume):
    denied = OSError(None, "CreateProcessW: access denied")
    denied.winerror = c.ERROR_ACCESS_DENIED
    with pytest.raises(OSError) as raised:
        Binding(Launcher(fails=denied)).create(base())
    assert not isinstance(raised.value, StartError)
    assert raised.value.winerror == c.ERROR_ACCESS_DENIED  # (handle.start retries or types it)


@pytest.mark.parametrize("behaviour", ["hangs", "crashes"])
def test_a_broker_that_does_not_answer_is_ended_and_its_manifest_discarded(volume, behaviour):
    binding = Binding(behaviour=behaviour)
    with pytest.raises(BrokerError) as raised:
        binding.create(base())
    assert raised.value.code == "broker_failed"
    if behaviour == "crashes":
        assert raised.value.message.endswith("No module named 'stockade'")
    else:
        assert binding.brokers[0].killed
    (written,) = binding.written
    assert not volume.exists(written.path)  # the host deleted it: it was never consumed
    assert binding.launcher.launched == [] and binding.opened == []


def test_a_manifest_the_broker_left_is_deleted_by_the_host_and_said(volume, monkeypatch):
    """A broker that refused its control frame never opened its manifest: the host deletes it
    (`discard`: whether something was still there, which the launch records as not consumed,
    and the readiness probe requires consumed)."""
    binding = Binding()
    monkeypatch.setattr(brokered.Control, "encode", lambda self: b"{}")
    with pytest.raises(BrokerError):
        binding.create(base())
    (written,) = binding.written
    assert not volume.exists(written.path)
    volume.replace(written.path, b"{}")
    assert manifestfile.discard(written.path) is True and not volume.exists(written.path)
    assert manifestfile.discard(written.path) is False


def test_an_owner_in_a_job_retries_with_a_fresh_broker_and_manifest(volume, monkeypatch):
    """(handle.start: access denied to a Job with UI limits inside the owner's) each attempt is a
    broker of its own, with a manifest of its own, both consumed."""
    denied = OSError(None, "CreateProcessW: access denied")
    denied.winerror = c.ERROR_ACCESS_DENIED

    class Once(Launcher):
        def __call__(self, launch: process.Launch) -> process.Created:
            self.fails = denied if not self.launched else None
            return super().__call__(launch)

    binding = Binding(Once())
    plan = handle.job.job_plan(base().limits, cpus=4)
    dropped: list = []
    monkeypatch.setattr(handle.job, "set_ui_restrictions", lambda job, p: dropped.append(p))
    started, held = handle.start(functools.partial(binding.create, base()), 0x100, plan, True,
                                 PYTHON)
    assert held.ui_restrictions == 0 and dropped == [held]
    assert len({b.pid for b in binding.brokers}) == 2 == len(binding.launcher.launched)
    assert len({w.path for w in binding.written}) == 2
    assert started.broker_pid == binding.brokers[1].pid and started.manifest_consumed
    assert not any(volume.exists(w.path) for w in binding.written)


# --- a manifest a dead host left ------------------------------------------------------------------


@pytest.fixture
def ledger(tmp_path, monkeypatch) -> Ledger:
    monkeypatch.setattr(records.tokens, "current_user_sid", lambda: USER)  # (the remover's)
    return Ledger(str(tmp_path / "state"))


def test_the_manifest_is_recorded_before_it_is_written(volume):
    binding = Binding()
    written_after: list[list] = []
    write = binding.write
    binding.write = lambda path, data, user: (written_after.append(list(binding.record.added)),
                                              write(path, data, user))[1]
    binding.create(base())
    (model,) = binding.brokers
    (written,) = binding.written
    entry = (manifestfile.KIND, written.path, {"broker": model.pid,
                                               "created": model.process.created})
    assert written_after == [[entry]] and binding.record.added == [entry]


def test_a_manifest_a_dead_host_left_is_removed_by_the_next_reconcile(volume, processes,
                                                                      ledger):
    """The host dies once the manifest is written (before its control frame went, so its broker
    ends on the end of its stdin): the file stays; the next reconcile (`stockade reconcile`, or
    the readiness check of the next launch) removes it, its broker gone."""
    record = LaunchRecord(ledger, "a-host-that-dies")
    binding = Binding(processes=processes, record=record, host_dies=True)
    with pytest.raises(HostDied):
        binding.create(base())
    record.abandon()  # (its lease, which the kernel drops when a process dies)
    (written,) = binding.written
    assert volume.exists(written.path) and not processes.table
    done = ledger.reconcile()
    assert (done.reconciled, done.failed, done.quarantined) == (1, 0, 0)
    assert done.removed == [(manifestfile.KIND, written.path)]
    assert not volume.exists(written.path) and volume.handles == {} and ledger.records() == []


def test_a_launch_settles_without_asking_after_its_ended_broker(volume, processes, ledger):
    """The common case: the manifest was consumed. Settling the launch's record finds nothing
    at its path and asks nothing of a process that has the broker's id since (another user's,
    which this user may not even open)."""
    record = LaunchRecord(ledger, "a-launch")
    binding = Binding(processes=processes, record=record)
    binding.create(base())
    (model,) = binding.brokers
    assert model.pid not in processes.table
    processes.start(pid=model.pid, foreign=True)
    record.settle(strict=True)
    assert ledger.records() == [] and processes.handles == {}


def left(volume: Volume, ledger: Ledger, broker_process, data: bytes | None = None) -> str:
    """A manifest written for `broker_process` by a host that then died; its path."""
    record = LaunchRecord(ledger, secrets.token_hex(8))
    path = manifestfile.fresh_path(DIRECTORY)
    record.add(manifestfile.KIND, path, {"broker": broker_process.pid,
                                         "created": broker_process.created})
    encoded = Manifest.for_launch(broker_process.pid, NONCE, base(), CONTEXT).encode()
    manifestfile.write(path, encoded if data is None else data, USER)
    record.abandon()
    return path


def test_a_left_manifest_stays_while_its_broker_runs(volume, processes, ledger):
    broker_process = processes.start()
    path = left(volume, ledger, broker_process)
    asked: list[int] = []
    create = volume.CreateFileW
    volume.CreateFileW = lambda name, access, *rest: (asked.append(access),
                                                      create(name, access, *rest))[1]
    done = ledger.reconcile()
    assert (done.reconciled, done.failed) == (0, 1) and volume.exists(path) and ledger.records()
    assert asked == [c.FILE_READ_ATTRIBUTES]  # (is it there? no more: it may be consuming it)
    processes.exit(broker_process)
    assert ledger.reconcile().reconciled == 1 and not volume.exists(path)


def test_a_process_that_took_the_brokers_id_does_not_keep_its_manifest(volume, processes,
                                                                       ledger):
    broker_process = processes.start()
    path = left(volume, ledger, broker_process)
    processes.exit(broker_process)
    later = processes.start(pid=broker_process.pid)  # the id handed out again
    assert later.created > broker_process.created
    assert ledger.reconcile().reconciled == 1 and not volume.exists(path)
    assert later.running and later.terminated == 0


def test_an_empty_manifest_a_host_died_writing_is_removed(volume, processes, ledger):
    path = left(volume, ledger, processes.start(running=False), data=b"")
    assert ledger.reconcile().reconciled == 1 and not volume.exists(path)


def _another_file(volume: Volume, path: str) -> None:
    data = bytes(volume.node(path).data)
    volume.remove(path)
    volume.replace(path, data)  # the same content, the DACL a file made in the directory gets


def _linked_elsewhere(volume: Volume, path: str) -> None:
    volume.move(path, DIRECTORY + "\\kept")  # (the host's own manifest, moved away)
    volume.symlink(path, DIRECTORY + "\\kept")


def _another_brokers(volume: Volume, path: str) -> None:
    volume.node(path).data[:] = Manifest.for_launch(BROKER_PID + 4, NONCE, base(),
                                                    CONTEXT).encode()


def _not_a_manifest(volume: Volume, path: str) -> None:
    volume.node(path).data[:] = b'{"version":1}'


@pytest.mark.parametrize(("change", "why"), [
    (_another_file, "open to more than this user"), (_linked_elsewhere, "reparse point"),
    (_hard_link, "more than one name"), (_directory, "cannot be opened alone"),
    (_held, "cannot be opened alone"), (_widened, "open to more than this user"),
    (_another_brokers, "another broker's"), (_not_a_manifest, "not a manifest"),
    (lambda volume, path: volume.node(path).data.extend(b" " * MAX_MANIFEST), "over its bound"),
], ids=["another-file", "symlink", "hard-link", "directory", "held-open", "dacl-widened",
        "another-brokers", "not-a-manifest", "oversized"])
def test_only_what_a_host_writes_is_removed(volume, processes, ledger, change, why,
                                             monkeypatch):
    path = left(volume, ledger, processes.start(running=False))
    change(volume, path)
    names = dict(volume.names)
    failures: list[str] = []
    remove = manifestfile.remove_left
    monkeypatch.setattr(records.manifestfile, "remove_left",
                        lambda *args: _said(remove, failures, *args))
    done = ledger.reconcile()
    assert (done.reconciled, done.failed) == (0, 1) and ledger.records()
    assert volume.names == names  # nothing removed, through a link or otherwise
    assert len(failures) == 1 and why in failures[0]


def _said(remove, failures: list[str], *args) -> None:
    try:
        remove(*args)
    except removers.RemovalError as exc:
        failures.append(str(exc))
        raise


@pytest.mark.parametrize(("name", "detail"), [
    (DIRECTORY + "\\" + "a" * 32 + ".manifest", {"broker": 0, "created": 1}),
    (DIRECTORY + "\\" + "a" * 32 + ".manifest", {"broker": 4, "created": "1"}),
    (DIRECTORY + "\\" + "a" * 32 + ".manifest", {"broker": 4, "created": 1, "more": 1}),
    (DIRECTORY + "\\" + "a" * 32 + ".manifest", {"broker": 4}),
    (DIRECTORY + "\\" + "a" * 31 + ".manifest", {"broker": 4, "created": 1}),
    (DIRECTORY + "\\" + "A" * 32 + ".manifest", {"broker": 4, "created": 1}),
    ("C:\\Users\\u\\" + "a" * 32 + ".manifest", {"broker": 4, "created": 1}),
    ("\\\\server\\broker\\" + "a" * 32 + ".manifest", {"broker": 4, "created": 1}),
    (DIRECTORY + "\\..\\broker\\" + "a" * 32 + ".manifest", {"broker": 4, "created": 1}),
])
def test_records_the_remover_could_not_act_on_safely_are_refused(name, detail):
    with pytest.raises(ValueError):
        records.validate_manifest(name, detail)
    records.validate_manifest(DIRECTORY + "\\" + "a" * 32 + ".manifest",
                              {"broker": 4, "created": 1})


def test_the_brokers_job_handle_may_only_put_a_process_in_the_job(monkeypatch):
    asked: list[tuple] = []

    class Duplicating:
        def GetCurrentProcess(self):  # noqa: N802
            return -1

        def DuplicateHandle(self, source, handle, target, copy, access, inherit, options):  # noqa: N802
            asked.append((source, handle, target, access, inherit, options))
            copy._obj.value = 0x208
            return 1

    bind_win32(monkeypatch, Duplicating(), handle.job)
    assert handle.job.assign_only(0x104) == 0x208
    # JOB_OBJECT_ASSIGN_PROCESS alone (not DUPLICATE_SAME_ACCESS: the Job's full handle),
    # inheritable, for this process (the broker inherits it at the same value).
    assert asked == [(-1, 0x104, -1, c.JOB_OBJECT_ASSIGN_PROCESS, True, 0)]


def test_the_host_reads_who_created_the_child(monkeypatch):
    """process.creator: NtQueryInformationProcess's ProcessBasicInformation, whose
    InheritedFromUniqueProcessId is the creating process's id (handle.py refuses a child that
    is not its broker's)."""
    asked: list[tuple] = []

    class Native:
        def NtQueryInformationProcess(self, process_, kind, info, size, returned):  # noqa: N802
            asked.append((process_, kind, size, returned))
            info._obj.UniqueProcessId, info._obj.InheritedFromUniqueProcessId = 4242, 7000
            return 0

    bind_win32(monkeypatch, Native(), process)
    assert process.creator(0x4011) == 7000
    assert asked == [(0x4011, c.PROCESS_BASIC_INFORMATION_CLASS, 48, None)]


def test_the_broker_process_is_isolated_and_inherits_only_its_handles(monkeypatch):
    made: list[tuple] = []

    class Startup:
        def __init__(self, lpAttributeList):  # noqa: N803 -- subprocess.STARTUPINFO's
            self.lpAttributeList = lpAttributeList

    monkeypatch.setattr(brokered.subprocess, "STARTUPINFO", Startup, raising=False)
    monkeypatch.setattr(brokered.subprocess, "Popen", lambda *a, **k: made.append((a, k)))
    monkeypatch.setattr(brokered.program, "interpreter", lambda: PYTHON)
    monkeypatch.setenv("SystemRoot", "C:\\Windows")
    monkeypatch.setenv("STOCKADE_TEST_SECRET", "x")
    brokered.spawn((0x104, 0x10, 0x14, 0x18))
    ((argv,), options), = made
    assert argv == [PYTHON, "-I", "-S", "-c", brokered.BOOT,
                    os.path.dirname(os.path.dirname(os.path.dirname(brokered.__file__)))]
    assert options["env"] == {"SystemRoot": "C:\\Windows"}  # nothing else of the owner's
    assert options["close_fds"] is True
    assert options["startupinfo"].lpAttributeList == {"handle_list": [0x104, 0x10, 0x14, 0x18]}
    assert options["creationflags"] == c.DETACHED_PROCESS  # (no console of the owner's)


BASE_PYTHON = getattr(sys, "_base_executable", "") or sys.executable  # (no venv launcher)


def test_the_brokers_program_finds_this_package_and_nothing_of_the_environment(tmp_path):
    """BOOT, run as brokered.spawn runs it, by the base interpreter (`-I -S`: no venv's site)
    with this package's directory, whatever PYTHONPATH says: off Windows it gets as far as
    its first Win32 call; on Windows it refuses the empty control frame, typed, on stdout."""
    (tmp_path / "stockade").mkdir()
    (tmp_path / "stockade" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    done = subprocess.run([BASE_PYTHON, "-I", "-S", "-c", brokered.BOOT,
                           os.path.dirname(os.path.dirname(os.path.dirname(brokered.__file__)))],
                          input=b"", capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    if sys.platform == "win32":
        assert decode_answer(done.stdout).body["code"] == "broker_frame_invalid"
    else:
        assert b"backend_unavailable" in done.stderr, done.stderr


# --- a real broker process ------------------------------------------------------------------------

# The broker's own serve() in a process of its own, its manifests plain files here and its
# launcher one that writes down what it was given.
CHILD = """
import dataclasses, json, os, sys
sys.path[:0] = json.loads(sys.argv[1])
from stockade.windows import broker, process
def consume(path, file_id, limit):
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    os.remove(path)
    return data
def launcher(launch):
    with open(sys.argv[2], "w") as f:
        json.dump(dataclasses.asdict(launch), f)
    return process.Created(0x4011, 0x4012, 4242, 4243)
sys.exit(broker.serve(sys.stdin.buffer, sys.stdout.buffer,
                      broker.Broker(os.getpid(), consume, launcher, lambda r: r.argv[0])))
"""


def real_calls(tmp_path, change=None) -> tuple[brokered.Calls, list[subprocess.Popen]]:
    spawned: list[subprocess.Popen] = []

    def spawn(handles: tuple[int, ...]) -> subprocess.Popen:
        spawned.append(subprocess.Popen(
            [BASE_PYTHON, "-I", "-c", CHILD, json.dumps(sys.path), str(tmp_path / "launch")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        return spawned[-1]

    def write(path: str, data: bytes, user: str) -> manifestfile.Written:
        path = str(tmp_path / "one.manifest")  # (the name given is a Windows path)
        with open(path, "wb") as f:
            f.write(rewritten(data, change) if change else data)
        return manifestfile.Written(path, "00000000-0000000000000001")

    def discard(path: str) -> bool:
        if not os.path.exists(path):
            return False
        os.remove(path)
        return True

    return brokered.Calls(spawn=spawn, created=lambda pid: 1, write=write, discard=discard,
                          opened=lambda pid, tid: replace(CREATED, pid=pid, thread_id=tid)), spawned


def test_a_real_broker_process_launches_for_its_own_pid_only(tmp_path):
    calls, spawned = real_calls(tmp_path)
    started = brokered.create(base(), CONTEXT, DIRECTORY, USER, Noted(), calls)
    assert started.broker_pid == spawned[0].pid != os.getpid() and started.manifest_consumed
    assert spawned[0].returncode == 0
    with open(tmp_path / "launch") as f:
        seen = json.load(f)
    assert seen == json.loads(json.dumps(dataclasses.asdict(
        broker.launch_for(base(), CONTEXT, lambda r: r.argv[0]))))
    os.remove(tmp_path / "launch")
    # The same, its manifest bound to the PID of this process instead of the broker's.
    calls, spawned = real_calls(tmp_path, lambda body: body.update(broker_pid=os.getpid()))
    with pytest.raises(BrokerError) as raised:
        brokered.create(base(), CONTEXT, DIRECTORY, USER, Noted(), calls)
    assert raised.value.code == "broker_pid_mismatch" and spawned[0].returncode == 1
    assert not (tmp_path / "launch").exists() and os.listdir(tmp_path) == []


# --- on Windows: NTFS and a real broker -----------------------------------------------------------


def consume_refusal(written: manifestfile.Written, user: str) -> str:
    """The code of this host's refusal to consume `written` for `user`."""
    with pytest.raises(BrokerError) as refused:
        manifestfile.consume(written.path, written.file_id, 1 << 10, user)
    return refused.value.code


@pytest.mark.windows
def test_on_this_host_the_manifest_is_closed_and_consumed_once(tmp_path):
    from stockade.windows import tokens
    from stockade.windows.aclstore import WindowsAclStore

    user = tokens.current_user_sid()
    directory = os.path.realpath(tmp_path)
    written = manifestfile.write(manifestfile.fresh_path(directory), b'{"x":1}', user)
    dacl = WindowsAclStore().read(written.path)
    assert dacl.protected and dacl.aces == manifestfile.closed_dacl(user).aces
    with pytest.raises(OSError):  # CREATE_NEW: nothing may be at the name
        manifestfile.write(written.path, b"{}", user)
    assert manifestfile.consume(written.path, written.file_id, 1 << 10, user) == b'{"x":1}'
    assert not os.path.lexists(written.path)
    assert consume_refusal(written, user) == "broker_manifest_missing"


@pytest.mark.windows
def test_on_this_host_a_manifest_replaced_or_linked_is_refused(tmp_path):
    from stockade.windows import tokens

    user = tokens.current_user_sid()
    directory = os.path.realpath(tmp_path)
    written = manifestfile.write(manifestfile.fresh_path(directory), b"{}", user)
    os.link(written.path, written.path + ".second")  # (a standard user may make hard links)
    assert consume_refusal(written, user) == "broker_manifest_replaced"
    other = manifestfile.write(manifestfile.fresh_path(directory), b"{}", user)
    os.replace(other.path, written.path + ".third")
    os.remove(written.path + ".second")
    os.replace(written.path + ".third", written.path)  # another file at the name
    assert consume_refusal(written, user) == "broker_manifest_replaced"


@pytest.mark.windows
def test_on_this_host_a_real_broker_refuses_a_tampered_manifest_and_another_pid(tmp_path):
    from stockade.launch.backend import Stdio
    from stockade.windows import job, stdio, tokens

    user = tokens.current_user_sid()
    job_handle = job.create_job(job.job_plan(base().limits, cpus=1))
    assign = job.assign_only(job_handle)
    pipes = stdio.ChildStdio(Stdio(subprocess.DEVNULL, subprocess.DEVNULL, subprocess.DEVNULL))
    context = replace(CONTEXT, job=assign, stdio=tuple(pipes.handles))
    directory = os.path.join(os.path.realpath(tmp_path), brokered.DIRECTORY)
    os.mkdir(directory)
    try:
        for change, code in ((TAMPERED["argv"], "broker_digest_mismatch"),
                             (lambda b: b.update(broker_pid=os.getpid()), "broker_pid_mismatch")):
            def tampering(path, data, sid, change=change):
                return manifestfile.write(path, rewritten(data, change), sid)

            with pytest.raises(BrokerError) as raised:
                brokered.create(base(), context, directory, user, Noted(),
                                brokered.Calls(write=tampering))
            assert raised.value.code == code
            assert os.listdir(directory) == []  # consumed, or discarded by the host
    finally:
        from stockade.windows.api import win32

        pipes.close()
        win32().CloseHandle(assign)
        win32().CloseHandle(job_handle)


@pytest.mark.windows
def test_on_this_host_a_launch_is_the_brokers(tmp_path):
    """A real launch: its child was created by the broker (another process, as read back),
    which consumed its manifest; the manifests' directory is left empty."""
    from test_windows_enforcement import request

    from stockade.launch.backend import Stdio
    from stockade.lifecycle.ledger import Ledger
    from stockade.windows.backend import WindowsBackend

    launched = WindowsBackend().spawn(request(os.path.realpath(tmp_path), "print('ran')"),
                                      Stdio(subprocess.DEVNULL, subprocess.PIPE, subprocess.PIPE))
    out = launched.stdout.read()
    end = launched.wait(90)
    assert end is not None and end.exit_code == 0 and end.failure is None and out.strip() == b"ran"
    seen = launched.enforced["broker"]
    assert seen["creator"] == seen["pid"] != os.getpid() and seen["manifest_consumed"] is True
    assert os.listdir(os.path.join(Ledger().root, brokered.DIRECTORY)) == []
