"""network.unix_sockets = "own" in read roots (issue 29 part 7): a host process listening on a
unix socket in a directory granted as a read root is out of the sandbox's reach (the socket
file is masked, found in the host's /proc/net/unix); the host listener receives nothing. With
"any", or with the layer off, the same connect works (the attempt is real); the command's own
sockets work."""

from __future__ import annotations

import os
import socket
import textwrap
import threading

import pytest
from conftest import PYTHON, policy_for

from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux.backend import LinuxBackend
from stockade.policy import merge

pytestmark = [pytest.mark.linux, pytest.mark.usefixtures("linux")]

CONNECT = textwrap.dedent("""
    import os, socket, sys
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
        s.sendall(b"from the sandbox")
        print("host", "connected")
    except OSError as exc:
        print("host", exc.errno)
    own = os.path.join(sys.argv[2], "own.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(own)
    server.listen()
    client = socket.socket(socket.AF_UNIX)
    client.connect(own)
    print("own", "connected")
    os.unlink(own)
""")


@pytest.fixture
def listener(tmp_path):
    """A host socket in a directory only ever granted as a read root, and what it received."""
    shared = tmp_path / "run"
    shared.mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(shared / "daemon.sock"))
    server.listen()
    server.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                peer, _ = server.accept()
            except TimeoutError:
                continue
            with peer:
                received.append(peer.recv(100) or b"(connected)")
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield shared, received
    stop.set()
    thread.join(5)
    server.close()


def attempt(workspace, shared, mode="own", backend=None) -> dict[str, str]:
    argv = [PYTHON, "-c", CONNECT, str(shared / "daemon.sock"), str(workspace)]
    policy = merge(policy_for(read=[str(shared)]), {"network": {"unix_sockets": mode}})
    request = compile_policy(policy, argv, CompileContext.current(workspace))
    r = execute(backend or LinuxBackend(), request)
    assert r.exit_code == 0, r.stderr
    return dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())


def test_a_host_socket_in_a_read_root_is_unreachable(ws, listener):
    workspace, _ = ws
    shared, received = listener
    seen = attempt(workspace, shared)
    assert seen["host"] != "connected" and seen["own"] == "connected", seen
    assert received == []  # the host's own look: nothing reached the listener


def test_the_attempt_is_real(ws, listener):
    """With "any", or with the mask switched off, the sandbox reaches the host's listener."""
    workspace, _ = ws
    shared, received = listener
    assert attempt(workspace, shared, mode="any")["host"] == "connected"
    weak = LinuxBackend(weaken=frozenset({"unix_sockets"}))
    assert attempt(workspace, shared, backend=weak)["host"] == "connected"
    for _ in range(50):
        if len(received) == 2:
            break
        threading.Event().wait(0.1)
    assert received == [b"from the sandbox"] * 2


def test_read_everything_leaves_no_host_socket_reachable(ws):
    """read = ["/"]: a host listener under /var/tmp (the host's, not the sandbox's own /tmp)
    is masked too; nothing reaches it."""
    import shutil
    import tempfile

    workspace, _ = ws
    shared = tempfile.mkdtemp(dir="/var/tmp", prefix="stockade-test-")
    try:
        server = socket.socket(socket.AF_UNIX)
        server.bind(f"{shared}/daemon.sock")
        server.listen()
        server.setblocking(False)
        argv = [PYTHON, "-c", CONNECT, f"{shared}/daemon.sock", str(workspace)]
        request = compile_policy(policy_for(read=["/"]), argv, CompileContext.current(workspace))
        r = execute(LinuxBackend(), request)
        assert r.exit_code == 0, r.stderr
        seen = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
        assert seen["host"] != "connected" and seen["own"] == "connected", seen
        with pytest.raises(BlockingIOError):
            server.accept()  # the host's own look: nobody connected
        server.close()
    finally:
        shutil.rmtree(shared)


def test_a_host_socket_bound_through_a_symbolic_link_is_masked_where_it_lies(ws, tmp_path):
    """Bound by a name through a link (as /var/run/x.sock with /var/run a link to /run): the
    mask goes on the socket's real place, and the launch goes on (it failed: the mask's source
    was opened by the listed name, no link followed). One socket's link stays in the read root,
    another's leads out of every root; by neither name, nor the real one, does the sandbox reach
    a listener. With "any" the first is reached by both names (the attempt is real)."""
    workspace, outside = ws
    shared = tmp_path / "run"
    (shared / "real").mkdir(parents=True)
    (shared / "link").symlink_to("real")
    (shared / "away").symlink_to(outside)
    servers = []
    for name in ("link/in.sock", "away/out.sock"):
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(shared / name))
        server.listen()
        server.setblocking(False)
        servers.append(server)
    names = [shared / "link/in.sock", shared / "real/in.sock", shared / "away/out.sock"]
    code = "import socket, sys\nfor name in sys.argv[1:]:\n" \
           "    s = socket.socket(socket.AF_UNIX)\n" \
           "    try:\n        s.connect(name)\n        print('connected')\n" \
           "    except OSError as exc:\n        print(exc.errno)\n"

    def attempts(mode: str) -> list[str]:
        policy = merge(policy_for(read=[str(shared)]), {"network": {"unix_sockets": mode}})
        request = compile_policy(policy, [PYTHON, "-c", code, *map(str, names)],
                                 CompileContext.current(workspace))
        r = execute(LinuxBackend(), request)
        assert r.exit_code == 0, r.stderr
        return r.stdout.decode().split()

    seen = attempts("own")
    assert "connected" not in seen, seen
    for server in servers:
        with pytest.raises(BlockingIOError):
            server.accept()  # the host's own look: nobody connected
    seen = attempts("any")
    assert seen[:2] == ["connected", "connected"] and seen[2] != "connected", seen
    for server in servers:
        server.close()


def test_a_host_socket_renamed_after_bind_in_a_write_root_is_masked_at_its_new_name(ws):
    """The kernel's list keeps the name a socket was bound by; in a write root the walk finds
    socket files by what they are, so one renamed since (itself and its directory) is masked
    where it now lies; the launch goes on though the listed name is gone. (Renamed in a read
    root it is not found: SECURITY.md, "Not protected".)"""
    workspace, _ = ws
    (workspace / "was").mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(workspace / "was" / "bound.sock"))
    server.listen()
    server.setblocking(False)
    os.rename(workspace / "was" / "bound.sock", workspace / "was" / "renamed.sock")
    os.rename(workspace / "was", workspace / "now")
    moved = workspace / "now" / "renamed.sock"
    code = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n" \
           "    s.connect(sys.argv[1])\n    print('connected')\n" \
           "except OSError as exc:\n    print(exc.errno)\n"

    def attempt(mode: str) -> str:
        policy = merge(policy_for(), {"network": {"unix_sockets": mode}})
        request = compile_policy(policy, [PYTHON, "-c", code, str(moved)],
                                 CompileContext.current(workspace))
        r = execute(LinuxBackend(), request)
        assert r.exit_code == 0, r.stderr
        return r.stdout.decode().strip()

    assert attempt("own") != "connected"
    with pytest.raises(BlockingIOError):
        server.accept()  # the host's own look: nobody connected
    assert attempt("any") == "connected"  # (the attempt is real)
    server.close()
