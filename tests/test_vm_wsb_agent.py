"""The Windows Sandbox guest's agent (stockade/vm/wsb_agent.py) and its spool channel
(wsb_spool.py), run here for real: the agent's logic with real POSIX processes (each in a
process group of its own, which stands for the Job wsb_winproc gives a command on Windows)
over a real socket and over real spool files, the host's side being Stockade's own channel
and exchange. Then the same agent and the guest entry under an interpreter that only looks
like Windows (tests/windows_like.py), with in-process commands.

What only Windows can show — the Job, the standard user, CreateProcessWithLogonW — is the
Windows workflow's and the manual check's (docs/windows-sandbox.md)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
from windows_like import run_as_windows
from wsb_guests import PosixProcess

from stockade.session import protocol
from stockade.session.errors import ProtocolError
from stockade.session.exchange import Exchange, Output
from stockade.session.protocol import TO_HOST, Decoder, Message, encode
from stockade.vm import wsb_agent, wsb_spool
from stockade.vm.wsb_agent import Agent, Outbox, SocketTransport
from stockade.vm.wsb_channel import SocketChannel

NONCE = bytes(range(32))
ENV = {"PATH": "/usr/bin:/bin"}
pytestmark = pytest.mark.not_windows  # (POSIX processes stand for the Job here)


class Session:
    """An agent served on a thread over `transport`, greeted through `channel`."""

    def __init__(self, channel, transport, spawn=PosixProcess) -> None:  # noqa: ANN001
        self.agent = Agent(NONCE, transport, spawn)
        self.status: list[int] = []
        self.thread = threading.Thread(target=lambda: self.status.append(self.agent.serve()),
                                       daemon=True)
        self.thread.start()
        self.channel = channel
        self.number = 0
        channel.send(Message("hello", body={"nonce": NONCE.hex()}))
        self.hello = channel.receive(10)

    def stream(self, argv, *, input=None, timeout=None, cancel=None, cwd=None):  # noqa: ANN001, ANN201
        self.number += 1
        exchange = Exchange(self.channel, self.number, input, 1 << 24, timeout, cancel)
        return exchange.run({"argv": argv, "cwd": cwd or os.getcwd(), "env": ENV,
                             "timeout": timeout})

    def run(self, argv, **kwargs):  # noqa: ANN001, ANN201
        events = self.stream(argv, **kwargs)
        outputs = []
        try:
            while True:
                outputs.append(next(events))
        except StopIteration as done:
            return outputs, done.value

    def end(self) -> int:
        self.channel.send(Message("shutdown"))
        self.thread.join(10)
        self.channel.close()
        assert not self.thread.is_alive()
        return self.status[0]


@pytest.fixture
def session():
    host, guest = socket.socketpair()
    made = Session(SocketChannel(host), SocketTransport(guest))
    yield made
    if made.thread.is_alive():
        made.end()


def test_the_agent_greets_and_runs_commands_one_after_another(session):
    assert session.hello.type == "hello" and "windows-sandbox" in session.hello.body["agent"]
    outputs, ending = session.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert ending.result["exit_code"] == 3 and ending.result["signal"] is None
    assert bytes(ending.stdout.data) == b"out\n" and bytes(ending.stderr.data) == b"err\n"
    assert Output("stdout", b"out\n") in outputs and Output("stderr", b"err\n") in outputs
    _, again = session.run(["true"])
    assert again.result["exit_code"] == 0
    assert session.end() == 0


def test_output_is_streamed_as_it_comes_not_held_to_the_end(session):
    cancel = threading.Event()
    began = time.monotonic()
    events = session.stream(["sh", "-c", "echo first; exec sleep 60"], cancel=cancel)
    assert next(events) == Output("stdout", b"first\n")
    assert time.monotonic() - began < 20  # (long before the command could end)
    cancel.set()
    with pytest.raises(StopIteration) as done:
        next(events)
    result = done.value.value.result
    assert result["cancelled"] and result["signal"] == wsb_agent.KILLED
    assert result["exit_code"] is None


def test_a_timeout_ends_the_command_and_everything_it_started(session):
    outputs, ending = session.run(["sh", "-c", "sleep 60 & echo $!; wait"], timeout=1)
    assert ending.result["timed_out"] and ending.result["signal"] == wsb_agent.KILLED
    left = int(bytes(ending.stdout.data))
    deadline = time.monotonic() + 10
    while _alive(left):
        assert time.monotonic() < deadline, f"the command's child {left} outlived it"
        time.sleep(0.05)


def test_a_far_timeout_is_waited_for_in_steps(session):
    # (one wait of all of it would overflow the event queue's clock, ending the agent)
    done: list = []
    runner = threading.Thread(target=lambda: done.append(session.run(["true"], timeout=1e10)),
                              daemon=True)
    runner.start()
    runner.join(20)
    assert done and done[0][1].result["exit_code"] == 0 and not done[0][1].result["timed_out"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stdin_flows_within_the_window(session):
    data = os.urandom(3 * protocol.STDIN_WINDOW + 5)
    _, ending = session.run(["cat"], input=data)
    assert bytes(ending.stdout.data) == data and ending.result["exit_code"] == 0


def test_input_a_command_never_reads_is_granted_back(session):
    _, ending = session.run(["true"], input=os.urandom(2 * protocol.STDIN_WINDOW))
    assert ending.result["exit_code"] == 0


@pytest.mark.parametrize("argv, cwd, code", [
    (["stockade-no-such-program"], None, "command_not_found"),
    (["true"], "C:\\ws", "cwd_invalid"),
    (["true"], "/no/such/directory", "cwd_invalid"),
])
def test_a_command_that_cannot_start_is_a_typed_error_and_the_session_goes_on(
        session, argv, cwd, code):
    from stockade.errors import StartError

    with pytest.raises(StartError) as info:
        session.run(argv, cwd=cwd)
    assert info.value.code == code
    _, ending = session.run(["sh", "-c", "echo still"])
    assert bytes(ending.stdout.data) == b"still\n"


def test_the_host_going_away_ends_the_agent_and_its_command(session):
    events = session.stream(["sh", "-c", "echo $$; exec sleep 60"])
    pid = int(next(events).data)
    session.channel.close()
    session.thread.join(10)
    assert not session.thread.is_alive() and session.status == [0]
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, "the command outlived its session"
        time.sleep(0.05)


# --- protocol violations, answered with a fatal error ---------------------------------------------

def _raw(frames: bytes) -> list[Message]:
    """What an agent says to `frames` until it ends the connection."""
    host, guest = socket.socketpair()
    agent = Agent(NONCE, SocketTransport(guest), PosixProcess)
    thread = threading.Thread(target=agent.serve, daemon=True)
    thread.start()
    host.sendall(frames)
    host.settimeout(20)
    decoder, got = Decoder(TO_HOST), []
    while chunk := host.recv(65536):
        got += decoder.feed(chunk)
    thread.join(10)
    host.close()
    return got


def _hello(**extra) -> bytes:
    return encode(Message("hello", body={"nonce": NONCE.hex(), **extra}))


def _exec(number: int, argv: list[str]) -> bytes:
    return encode(Message("exec", number, body={"argv": argv, "cwd": "/", "env": ENV}))


@pytest.mark.parametrize("frames, code", [
    (_exec(1, ["true"]), "auth_required"),
    (encode(Message("hello", body={"nonce": "ab" * 32})) + _exec(1, ["true"]), "auth_failed"),
    (_hello(keep_detached=True) + _exec(1, ["true"]), "field_invalid"),
    (_hello() + _exec(1, ["sleep", "30"]) + _exec(2, ["true"]), "busy"),
    (_hello() + _exec(2, ["stockade-no-such-program"]) + _exec(1, ["true"]),
     "sequence_invalid"),
    (_hello() + _hello(), "sequence_invalid"),
    (_hello() + _exec(1, ["sleep", "30"])
     + encode(Message("data", 1, body=b"x" * (protocol.STDIN_WINDOW + 1))), "window_exceeded"),
    (_hello() + encode(Message("eof", 5)), "sequence_invalid"),
])
def test_violations_end_the_session_with_a_typed_error(frames, code):
    got = _raw(frames)
    errors = [m for m in got if m.type == "error" and m.command == 0]
    assert errors and errors[-1].body["code"] == code, got


def test_the_outbox_holds_output_readers_past_the_high_mark():
    release, written = threading.Event(), []

    def write(data: bytes) -> None:
        release.wait()
        written.append(data)

    outbox = Outbox(write, lambda: None)
    outbox.start()
    chunk = b"x" * (256 << 10)
    outbox.put(chunk, output=True)  # (the writer takes it and waits on `release`)
    time.sleep(0.2)
    for _ in range(wsb_agent.OUTPUT_HIGH // len(chunk) - 1):  # (queued up to the mark)
        outbox.put(chunk, output=True)
    held = threading.Thread(target=outbox.put, args=(chunk,), kwargs={"output": True})
    held.start()
    held.join(0.5)
    assert held.is_alive()  # a reader waits: the command then blocks on its pipe
    outbox.put(b"control")  # (the agent's own frames never wait)
    release.set()
    held.join(10)
    assert not held.is_alive()
    outbox.close(10)
    assert b"control" in b"".join(written)


# --- the spool: the channel of a guest without a network ------------------------------------------

def test_a_session_over_the_spool(tmp_path):
    wsb_spool.create(str(tmp_path))
    made = Session(wsb_spool.SpoolChannel(str(tmp_path)), wsb_spool.SpoolTransport(str(tmp_path)))
    assert made.hello.type == "hello"
    cancel = threading.Event()
    events = made.stream(["sh", "-c", "echo first; exec sleep 60"], cancel=cancel)
    assert next(events) == Output("stdout", b"first\n")  # streamed through the files too
    cancel.set()
    with pytest.raises(StopIteration):
        next(events)
    data = os.urandom(protocol.STDIN_WINDOW + 7)
    _, ending = made.run(["cat"], input=data)
    assert bytes(ending.stdout.data) == data
    assert made.end() == 0
    assert (tmp_path / (wsb_spool.TO_HOST + wsb_spool.END)).exists()  # the agent's end


def test_a_spool_reader_sees_the_end_only_after_every_byte(tmp_path):
    wsb_spool.create(str(tmp_path))
    path = str(tmp_path / wsb_spool.TO_HOST)
    writer, reader = wsb_spool.SpoolWriter(path), wsb_spool.SpoolReader(path)
    assert reader.poll() is None
    writer.write(b"one")
    writer.write(b"two")
    writer.close()
    assert reader.poll() == b"onetwo" and reader.poll() == b""


def test_the_spool_channel_reports_the_agents_end(tmp_path):
    wsb_spool.create(str(tmp_path))
    channel = wsb_spool.SpoolChannel(str(tmp_path))
    wsb_spool.SpoolWriter(str(tmp_path / wsb_spool.TO_HOST)).close()
    from stockade.session.errors import SessionError

    with pytest.raises(SessionError) as info:
        channel.receive(5)
    assert info.value.code == "session_lost"
    channel.close()


def test_the_spool_channel_refuses_a_bad_frame(tmp_path):
    wsb_spool.create(str(tmp_path))
    channel = wsb_spool.SpoolChannel(str(tmp_path))
    writer = wsb_spool.SpoolWriter(str(tmp_path / wsb_spool.TO_HOST))
    writer.write(b"\xff\xff\xff\xff")
    with pytest.raises(ProtocolError) as info:
        channel.receive(5)
    assert info.value.code == "frame_oversized"
    channel.close()


# --- as on Windows ---------------------------------------------------------------------------

AS_WINDOWS = """
import json, os, socket, sys, threading, time
sys.path.insert(0, {tests!r})
from wsb_guests import fake_spawner
from stockade.session.exchange import Exchange
from stockade.session.protocol import Message
from stockade.vm import wsb_guest, wsb_rendezvous as rz, wsb_spool
from stockade.vm.wsb_channel import SocketChannel

def commands(channel, nonce):
    channel.send(Message("hello", body={{"nonce": nonce.hex()}}))
    said = [channel.receive(10).body["agent"]]
    for number, (argv, data, timeout) in enumerate([
            (["echo", "hi"], None, None), (["cat"], b"x" * 600000, None),
            (["fail", "7", "bad"], None, None), (["block"], None, 0.5)], 1):
        run = Exchange(channel, number, data, 1 << 24, timeout, None).run(
            {{"argv": argv, "cwd": "C:\\\\ws", "env": {{}}, "timeout": timeout}})
        try:
            while True:
                next(run)
        except StopIteration as done:
            ending = done.value
        said.append([ending.result["exit_code"], ending.result["signal"],
                     ending.result["timed_out"], len(ending.stdout.data),
                     bytes(ending.stderr.data).decode()])
    channel.send(Message("shutdown"))
    return said

top = {top!r}
secret = bytes(range(32))
report = {{"platform": sys.platform}}
for transport in ("spool", "tcp"):
    folder = os.path.join(top, transport)
    os.mkdir(folder)
    with open(os.path.join(folder, rz.SECRET_FILE), "wb") as f:
        f.write(secret)
    wsb_spool.create(folder)
    argv = [folder, "0" * 32, "-", transport] + (["127.0.0.1", "0"] if transport == "tcp" else [])
    status = []
    import io
    guest = threading.Thread(target=lambda: status.append(wsb_guest.main(
        argv, fake_spawner, io.StringIO("pw\\n"))), daemon=True)
    guest.start()
    path = os.path.join(folder, rz.RENDEZVOUS_FILE)
    while not os.path.exists(path):
        time.sleep(0.01)
    record = rz.parse(open(path, "rb").read())
    rz.verify(record, secret, "0" * 32)
    if transport == "spool":
        channel = wsb_spool.SpoolChannel(folder)
    else:
        sock = socket.create_connection((record.address, record.port))
        challenge = os.urandom(32)
        sock.sendall(challenge)
        answer = b""
        while len(answer) < 32:
            answer += sock.recv(32 - len(answer))
        assert answer == rz.answer(secret, challenge)
        channel = SocketChannel(sock)
    report[transport] = commands(channel, secret)
    guest.join(10)
    channel.close()
    report[transport + "_status"] = status
folder = os.path.join(top, "refused")
os.mkdir(folder)
with open(os.path.join(folder, rz.SECRET_FILE), "wb") as f:
    f.write(secret)
import io
report["no_win32"] = wsb_guest.main([folder, "0" * 32, "-", "spool"], None, io.StringIO("pw\\n"))
report["refusal"] = rz.parse(open(os.path.join(folder, rz.RENDEZVOUS_FILE), "rb").read()).code
print(json.dumps(report))
"""


def test_the_guest_entry_and_agent_run_as_on_windows(tmp_path):
    """Under an interpreter that looks like Windows, the guest entry takes the secret, publishes
    its rendezvous and serves commands over the spool and over TCP with the agent (commands
    faked in-process: no Windows process can start here), output, input, exit codes and a
    timeout included; without the Win32 functions (the real command user's way to start
    anything) the guest refuses its boot, typed."""
    done = run_as_windows(AS_WINDOWS.format(tests=os.path.dirname(__file__), top=str(tmp_path)),
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["platform"] == "win32"
    expected = [[0, None, False, 3, ""], [0, None, False, 600000, ""], [7, None, False, 0, "bad"],
                [None, wsb_agent.KILLED, True, 6, ""]]
    for transport in ("spool", "tcp"):
        assert "windows-sandbox" in report[transport][0]
        assert report[transport][1:] == expected, transport
        assert report[transport + "_status"] == [0]
    assert report["no_win32"] == 3 and report["refusal"] == "guest_start_failed"
