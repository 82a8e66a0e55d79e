"""The session protocol: round trips, every rejection, and a real agent (in a real sandbox)
that ends the connection with a typed error — and never runs a command — on bad input."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time

import pytest
from conftest import policy_for
from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.launch.backend import Stdio
from stockade.launch.compile import CompileContext
from stockade.session import protocol
from stockade.session.boot import agent_request
from stockade.session.errors import ProtocolError
from stockade.session.protocol import MAX_FRAME, TO_AGENT, TO_HOST, Decoder, Message, encode

NONCE = bytes(range(32))

AGENT_BOUND = [
    Message("hello", body={"nonce": NONCE.hex()}),
    Message("exec", 1, body={"argv": ["echo", "hi"], "cwd": "/w", "env": {"A": "1"},
                             "timeout": 2.5}),
    Message("exec", 2, body={"argv": ["x"], "cwd": "/", "env": {}, "timeout": None}),
    Message("exec", 3, body={"argv": ["x"], "cwd": "/", "env": {}}),
    Message("exec", 4, body={"argv": ["ssh-keygen", "-N", ""], "cwd": "/", "env": {}}),
    Message("exec", 5, body={"argv": ["cmd.exe"], "cwd": "C:\\work", "env": {}}),  # (v3)
    Message("data", 1, 0, b"\x00\xffbytes"),
    Message("eof", 1),
    Message("cancel", 7),
    Message("ping", body={"seq": 42}),
    Message("shutdown"),
    Message("error", body={"code": "internal", "message": "bye"}),
]
HOST_BOUND = [
    Message("hello", body={"agent": "stockade 0.1.0", "pid": 2, "observed": {"Seccomp": 2}}),
    Message("started", 1, body={"pid": 3}),
    Message("data", 1, 1, b"out"),
    Message("data", 1, 2, b"err"),
    Message("eof", 1, 2),
    Message("window", 1, body={"bytes": 65536}),
    Message("result", 1, body={"exit_code": None, "signal": 9, "timed_out": True,
                               "cancelled": False, "start": 0.001, "wall": 1, "user": 0,
                               "system": 0.5}),
    Message("pong", body={"seq": 42}),
    Message("error", 4, body={"code": "command_not_found", "message": "x: not found"}),
]


@pytest.mark.parametrize(("table", "message"), [(TO_AGENT, m) for m in AGENT_BOUND]
                         + [(TO_HOST, m) for m in HOST_BOUND])
def test_round_trip(table, message):
    assert Decoder(table).feed(encode(message)) == [message]


def test_frames_arrive_in_pieces():
    stream = b"".join(encode(m) for m in AGENT_BOUND)
    decoder = Decoder(TO_AGENT)
    got = [m for i in range(len(stream)) for m in decoder.feed(stream[i:i + 1])]
    assert got == AGENT_BOUND
    decoder.finish()


def frame(type_code: int, payload: bytes, *, command: int = 0, stream: int = 0,
          version: int = protocol.VERSION) -> bytes:
    head = struct.pack(">BBIB", version, type_code, command, stream)
    return struct.pack(">I", len(head) + len(payload)) + head + payload


def body(value: object) -> bytes:
    return json.dumps(value).encode()


HELLO = protocol.TYPES["hello"]
EXEC = protocol.TYPES["exec"]
GOOD_EXEC = {"argv": ["true"], "cwd": "/", "env": {}}

REJECTIONS = [
    ("version_unsupported", frame(HELLO, body({"nonce": NONCE.hex()}), version=2)),  # the last
    ("version_unsupported", frame(HELLO, body({"nonce": NONCE.hex()}), version=4)),
    ("field_invalid", frame(HELLO, body({"nonce": NONCE.hex(), "keep_detached": 1}))),
    ("type_unknown", frame(99, b"{}")),
    ("type_unknown", frame(protocol.TYPES["result"], b"{}", command=1)),  # wrong direction
    ("field_unknown", frame(HELLO, body({"nonce": NONCE.hex(), "extra": 1}))),
    ("field_missing", frame(HELLO, body({}))),
    ("field_invalid", frame(HELLO, body({"nonce": "00"}))),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "argv": []}), command=1)),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "argv": ["", "x"]}), command=1)),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "cwd": "relative"}), command=1)),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "cwd": "C:relative"}), command=1)),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "cwd": "\\\\server\\share"}), command=1)),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "cwd": "\u00e9:\\x"}), command=1)),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "env": {"A=B": "x"}}), command=1)),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "timeout": -1}), command=1)),
    ("field_invalid", frame(EXEC, body({**GOOD_EXEC, "timeout": True}), command=1)),
    ("address_invalid", frame(EXEC, body(GOOD_EXEC), command=0)),
    ("address_invalid", frame(HELLO, body({"nonce": NONCE.hex()}), command=3)),
    ("address_invalid", frame(protocol.TYPES["data"], b"x", command=1, stream=1)),
    ("payload_invalid", frame(HELLO, b"not json")),
    ("payload_invalid", frame(HELLO, b"[1]")),
    ("payload_invalid", frame(HELLO, b'{"nonce": "a", "nonce": "b"}')),
    ("payload_invalid", frame(EXEC, b'{"timeout": NaN}', command=1)),
    ("payload_invalid", frame(protocol.TYPES["data"], b"", command=1)),
    ("frame_invalid", struct.pack(">I", 3) + b"abc"),
    ("frame_oversized", struct.pack(">I", MAX_FRAME + 1)),
]


@pytest.mark.parametrize(("code", "data"), REJECTIONS)
def test_rejections_are_typed(code, data):
    with pytest.raises(ProtocolError) as caught:
        Decoder(TO_AGENT).feed(data)
    assert caught.value.code == code
    assert code in protocol.FATAL_CODES


def test_truncated_stream_is_typed():
    decoder = Decoder(TO_AGENT)
    assert decoder.feed(encode(Message("ping", body={"seq": 1}))[:-1]) == []
    with pytest.raises(ProtocolError) as caught:
        decoder.finish()
    assert caught.value.code == "frame_truncated"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256), st.sampled_from([TO_AGENT, TO_HOST]))
def test_arbitrary_bytes_only_ever_raise_protocol_error(data, table):
    decoder = Decoder(table)
    try:
        decoder.feed(data)
        decoder.finish()
    except ProtocolError as exc:
        assert exc.code in protocol.FATAL_CODES


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 255), st.integers(0, 255), st.integers(0, 2**32 - 1), st.integers(0, 255),
       st.binary(max_size=64))
def test_arbitrary_headers_only_ever_raise_protocol_error(version, kind, command, stream, tail):
    try:
        Decoder(TO_AGENT).feed(frame(kind, tail, command=command, stream=stream,
                                     version=version))
    except ProtocolError as exc:
        assert exc.code in protocol.FATAL_CODES


# --- a real agent, in a real sandbox -----------------------------------------------------------


def raw_agent(workspace):
    """A real agent in a real sandbox, driven by hand: (handle, send bytes, read to the end)."""
    from stockade.linux.backend import LinuxBackend  # (the real agent: Linux only)

    ctx = CompileContext.current(workspace)
    request = agent_request(policy_for("workspace-write"), ctx)
    handle = LinuxBackend().spawn(request, Stdio(subprocess.PIPE, subprocess.PIPE,
                                                 subprocess.PIPE))

    def send(data: bytes) -> None:
        try:
            handle.stdin.write(data)
            handle.stdin.flush()
        except BrokenPipeError:
            pass  # the agent already hung up

    def replies() -> list[Message]:
        """Everything the agent says until it ends the connection (bounded wait)."""
        deadline = time.monotonic() + 20
        decoder, got = Decoder(TO_HOST), []
        while time.monotonic() < deadline:
            chunk = os.read(handle.stdout.fileno(), 65536)
            if not chunk:
                return got
            got += decoder.feed(chunk)
        raise AssertionError("the agent did not end the connection")

    return handle, send, replies


def marker_exec(workspace, number: int = 1) -> bytes:
    return encode(Message("exec", number, body={
        "argv": ["sh", "-c", f"echo ran > {workspace}/ran"], "cwd": str(workspace),
        "env": {"PATH": "/usr/bin:/bin"}}))


def hello() -> bytes:
    return encode(Message("hello", body={"nonce": NONCE.hex()}))


REAL_REJECTIONS = [
    ("auth_failed", lambda ws: NONCE + encode(Message("hello", body={"nonce": "ab" * 32}))
     + marker_exec(ws)),
    ("auth_required", lambda ws: NONCE + marker_exec(ws)),
    ("version_unsupported", lambda ws: NONCE + hello()
     + frame(EXEC, body({**GOOD_EXEC, "argv": ["touch", f"{ws}/ran"]}), command=1, version=9)),
    ("type_unknown", lambda ws: NONCE + hello() + frame(77, b"{}") + marker_exec(ws)),
    ("field_unknown", lambda ws: NONCE + hello()
     + frame(EXEC, body({"argv": ["touch", f"{ws}/ran"], "cwd": str(ws), "env": {},
                         "shell": True}), command=1)),
    ("frame_oversized", lambda ws: NONCE + hello() + struct.pack(">I", MAX_FRAME + 1)
     + b"\0" * 65536 + marker_exec(ws)),
    ("sequence_invalid", lambda ws: NONCE + hello() + hello() + marker_exec(ws)),
]


@pytest.mark.usefixtures("linux")
@pytest.mark.parametrize(("code", "make"), REAL_REJECTIONS, ids=[c for c, _ in REAL_REJECTIONS])
def test_real_agent_ends_the_connection_with_a_typed_error(ws, code, make):
    workspace, _ = ws
    handle, send, replies = raw_agent(workspace)
    try:
        send(make(workspace))
        got = replies()
    finally:
        handle.kill()
        end = handle.wait()
    errors = [m for m in got if m.type == "error"]
    assert errors and errors[-1].command == 0 and errors[-1].body["code"] == code, got
    assert not any(m.type == "started" for m in got)
    assert not (workspace / "ran").exists()
    assert end.failure is None


@pytest.mark.usefixtures("linux")
def test_real_agent_serves_after_a_good_handshake(ws):
    workspace, _ = ws
    handle, send, replies = raw_agent(workspace)
    end = None
    try:
        send(NONCE + hello() + encode(Message("ping", body={"seq": 7})) + marker_exec(workspace)
             + encode(Message("eof", 1)))
        time.sleep(0.5)
        send(encode(Message("shutdown")))
        got = replies()
        end = handle.wait(10)  # after `shutdown` the agent, and so the sandbox, ends by itself
    finally:
        if end is None:
            handle.kill()
            handle.wait()
    assert end is not None, "the sandbox did not end after shutdown"
    assert [m.type for m in got][:3] == ["hello", "pong", "started"]
    assert got[-1].type == "result" and got[-1].body["exit_code"] == 0
    assert (workspace / "ran").read_text() == "ran\n"
    assert end.exit_code == 0  # shutdown: the agent, and so the sandbox, ended cleanly


@pytest.mark.usefixtures("linux")
def test_the_posix_agent_refuses_a_windows_drive_path_as_cwd(ws):
    """Version 3's other path kind (a Windows guest's): the POSIX agent refuses it as the
    command's `cwd_invalid`, never as a name relative to where it stands."""
    workspace, _ = ws
    (workspace / "C:\\ws").mkdir()  # (a relative name a chdir would otherwise enter)
    handle, send, replies = raw_agent(workspace)
    try:
        send(NONCE + hello() + encode(Message("exec", 1, body={
            "argv": ["sh", "-c", f"echo ran > {workspace}/ran"], "cwd": str(workspace),
            "env": {"PATH": "/usr/bin:/bin"}})) + encode(Message("eof", 1)))
        time.sleep(0.5)
        send(encode(Message("exec", 2, body={"argv": ["sh", "-c", "echo x > here"],
                                             "cwd": "C:\\ws", "env": {"PATH": "/bin"}}))
             + encode(Message("shutdown")))
        got = replies()
    finally:
        handle.kill()
        handle.wait()
    refused = [m for m in got if m.command == 2]
    assert [m.type for m in refused] == ["error"] and refused[0].body["code"] == "cwd_invalid"
    assert not (workspace / "C:\\ws" / "here").exists()
