"""The fence service's accept loop against callers who hold its pipe (attack round on issue 36,
F1/F2): any Authenticated User may open the pipe, which has at most 64 instances.

Real Windows behaviour modelled: CreateNamedPipeW fails with ERROR_PIPE_BUSY (231) once
nMaxInstances instances exist (Microsoft, "Named Pipe Instances"), an OSError from the
binding's errcheck; ConnectNamedPipe returns once a client opened the pipe (here at once); a
blocking read waits until the client writes or the server disconnects the instance
(DisconnectNamedPipe fails the pending read). The service, its connections and the fence
logic are the real ones."""

from __future__ import annotations

import threading
import time

import pytest
from windows_fence_fakes import ModelFirewall

from stockade.windows import fence, fencepipe, fenceproto, fenceservice
from stockade.windows.fence import TokenFacts

USER = "S-1-5-21-1-2-3-1002"


def caller(user: str) -> TokenFacts:
    return TokenFacts(user=user, appcontainer=False, package="", integrity=0x2000,
                      restricted=False, created=1000)


class Pipes:
    """The pipe's instances: made by server_pipe, freed when their transport closes. Each
    client never writes; a disconnect fails its pending read."""

    def __init__(self, users) -> None:
        self.live: dict[int, threading.Event] = {}
        self.next = 0x100
        self.lock = threading.Lock()
        self.connected = 0
        self.busy_errors = 0
        self.written: list[bytes] = []
        self.users = users  # (the n-th connection's user)

    def server_pipe(self, first: bool) -> int:
        with self.lock:
            if len(self.live) >= fencepipe.MAX_CONNECTIONS:
                self.busy_errors += 1
                error = OSError(None, "CreateNamedPipeW: All pipe instances are busy.")
                error.winerror = 231
                raise error
            self.next += 4
            self.live[self.next] = threading.Event()
            return self.next

    def connect(self, pipe: int, overlapped: object) -> bool:
        with self.lock:
            self.connected += 1
        return True

    def disconnect(self, pipe: int) -> bool:
        with self.lock:
            cut = self.live.get(pipe)
        if cut is not None:
            cut.set()
        return True


class Transport:
    def __init__(self, pipes: Pipes, handle: int) -> None:
        self.pipes, self.handle = pipes, handle

    def read(self, size: int) -> bytes:
        with self.pipes.lock:
            cut = self.pipes.live[self.handle]
        cut.wait()
        raise BrokenPipeError

    def write(self, data: bytes) -> None:
        self.pipes.written.append(data)

    def close(self) -> None:
        with self.pipes.lock:
            self.pipes.live.pop(self.handle, None)


@pytest.fixture
def service(tmp_path, monkeypatch):
    made: list = []

    def start(users=lambda n: USER, wait=0.3):
        pipes = Pipes(users)

        class Api:
            ConnectNamedPipe = staticmethod(pipes.connect)
            DisconnectNamedPipe = staticmethod(pipes.disconnect)

        class Win32:
            @staticmethod
            def CloseHandle(handle):  # noqa: N802
                with pipes.lock:
                    pipes.live.pop(handle, None)

        monkeypatch.setattr(fenceservice, "fence_win32", lambda: Api)
        monkeypatch.setattr(fenceservice, "win32", lambda: Win32)
        monkeypatch.setattr(fenceservice, "now", lambda: 1500)
        monkeypatch.setattr(fenceservice, "RETRY_FIRST", 0.01)
        monkeypatch.setattr(fence, "FRAME_WAIT", wait)
        monkeypatch.setattr(fencepipe, "server_pipe", pipes.server_pipe)
        monkeypatch.setattr(fencepipe, "PipeTransport", lambda handle: Transport(pipes, handle))
        monkeypatch.setattr(fencepipe, "client_pid", lambda pipe: pipe)
        monkeypatch.setattr(fencepipe, "process_facts",
                            lambda pid: caller(users((pid - 0x100) // 4)))
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        one = fenceservice.Service(ModelFirewall(), str(state))
        failed: list[BaseException] = []

        def run() -> None:
            try:
                one.serve()
            except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
                failed.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        made.append((one, pipes, thread))
        return pipes, failed

    yield start
    for one, pipes, thread in made:  # (every thread gone before the fakes are)
        one.stopping.set()
        thread.join(10)
        for event in list(pipes.live.values()):
            event.set()
        for connection in list(one._pipes.values()):
            connection.join(10)


def until(check, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def test_callers_that_send_nothing_neither_stop_the_service_nor_keep_its_instances(service):
    """F1/F2: more idle callers than the pipe has instances, each of another user: the
    service goes on serving (it stopped at the first ERROR_PIPE_BUSY), and each idle caller is
    cut after the frame wait (they held every instance forever)."""
    pipes, failed = service(users=lambda n: f"{USER}{n}")
    assert until(lambda: pipes.connected > 3 * fencepipe.MAX_CONNECTIONS)
    assert not failed
    assert pipes.busy_errors  # (every instance was taken at some point)


def test_one_user_holds_at_most_its_share_of_the_pipe(service):
    """F1: past MAX_PER_USER connections of one user, the next is answered fence_busy at
    once, so one user cannot take every instance."""
    pipes, failed = service(wait=30.0)
    assert until(lambda: len(pipes.written) >= 3)
    with pipes.lock:
        live = len(pipes.live)
    busy = [fenceproto.decode(frame[4:]) for frame in pipes.written]
    assert {said["code"] for said in busy} == {"fence_busy"}
    assert live <= fence.MAX_PER_USER + 1 and not failed


class Wire:
    """The service's end of one pipe: frames the caller sends, then nothing; a cut fails the
    pending read."""

    def __init__(self, data: bytes) -> None:
        self.data, self.cut = data, threading.Event()
        self.said: list[dict] = []

    def read(self, size: int) -> bytes:
        if self.data:
            chunk, self.data = self.data[:size], self.data[size:]
            return chunk
        self.cut.wait(10)
        raise BrokenPipeError

    def write(self, frame: bytes) -> None:
        self.said.append(fenceproto.decode(frame[4:]))


@pytest.mark.parametrize("tail,cut", [(b"", False), (b"\0\0", True)],
                         ids=["idle-holding-a-fence", "a-frame-begun-and-not-ended"])
def test_a_fence_holder_may_wait_idle_but_not_inside_a_frame(tmp_path, tail, cut):
    """F2: the frame wait does not cut a connection that holds a fence and waits for its
    release (the fence lasts as long as the connection), but does cut one that began a frame
    and sends no more of it."""
    sid = "S-1-15-2-1-2-3-4-5-6-7"
    firewall = ModelFirewall()
    fence.register_kinds(firewall)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    from stockade.lifecycle.ledger import Ledger

    target = TokenFacts(user=USER, appcontainer=True, package=sid, integrity=0x1000,
                        restricted=False, created=2000)
    connection = fence.Connection(fence.Fences(firewall, Ledger(str(state))), caller(USER),
                                  1500, lambda pid: target, lambda name: sid)
    wire = Wire(fenceproto.encode({"v": 1, "op": "fence", "mode": "any",
                                   "profile": "stockade-ac-" + "0" * 24, "pid": 42}) + tail)
    watch = fence.FrameWatch(wire.cut.set, 0.2)
    served = threading.Thread(target=fence.serve, args=(wire.read, wire.write, connection,
                                                        watch), daemon=True)
    served.start()
    served.join(1.5)
    assert wire.said and wire.said[0]["ok"]
    assert wire.cut.is_set() == cut and served.is_alive() != cut
    assert bool(firewall.of(sid)) != cut  # (a cut connection's fence is taken back)
    wire.cut.set()
    served.join(5)
