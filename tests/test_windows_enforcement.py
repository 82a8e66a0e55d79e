"""The W1 matrix: real children in the real Windows sandbox (AppContainer, Job, ACL grants,
private desktop), Windows only (marked `windows`; conftest.py deselects them elsewhere). Each
test has a sandboxed process attempt the forbidden thing and checks that it failed, next to a
control showing the permitted thing works: outside read and write; junction and multi-link
admission; TCP, UDP, DNS, loopback and listeners under `none`; a host named pipe; an ambient
secret and an outside credential file; a host HKCU value; the parent process and its token; a
descendant's token and Job; owner death, timeout and cancellation; a 64-launch soak's residue;
a quarantined identity; a junction made during the run, set aside while the revert propagates.
.github/workflows/windows.yml runs them with STOCKADE_REQUIRE_WINDOWS=1,
which turns "cannot run here" into a failure instead of a skip."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from stockade.errors import UnavailableError, UnenforceableError
from stockade.launch.backend import Stdio
from stockade.launch.request import LaunchRequest, LimitSpec, PathGrant

pytestmark = pytest.mark.windows  # deselected off Windows (conftest.py)

PYTHON_ROOT = os.path.realpath(sys.base_prefix)
SYSTEM_ROOT = os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows"))
MEMORY = 512 << 20


# The W1 matrix (issue 20, item 6): each row and the test that shows it (docs/windows.md).
W1 = {
    "outside read/write denied": "test_reading_or_writing_outside_the_roots_fails",
    "junction and multi-hard-link admission refused":
        "test_a_junction_or_a_multiply_linked_file_in_a_root_is_refused_untouched",
    "TCP, UDP, DNS, loopback connect and listener denied under none":
        "test_tcp_udp_dns_loopback_and_listeners_are_denied_under_none",
    "a host named pipe, an ambient secret, an outside credential file, a HKCU value, the parent "
    "process and its token out of reach":
        "test_the_hosts_pipes_secrets_credentials_registry_and_parent_are_out_of_reach",
    "a descendant keeps the AppContainer token and the Job":
        "test_a_descendant_keeps_the_appcontainer_token_and_the_job",
    "owner death drains the tree":
        "test_killing_the_owner_kills_the_whole_tree_and_reconcile_reverts_its_grants",
    "timeout and cancellation drain the tree":
        "test_a_timeout_or_a_cancellation_ends_the_whole_tree",
    "a 64-launch concurrent soak leaves no ACE, ledger record or profile":
        "test_64_concurrent_launches_leave_no_entry_record_or_profile_behind",
    "a quarantined identity is never reused":
        "test_a_quarantined_identity_is_never_handed_out_again",
    "a junction made during the run carries no revert outside the root":
        "test_a_junction_the_child_makes_does_not_carry_the_revert_outside_the_root",
}


@pytest.fixture(scope="module", autouse=True)
def windows():
    """The backend must be able to run here, and the ledger must accept its records."""
    from stockade.windows import records
    from stockade.windows.backend import WindowsBackend
    try:
        WindowsBackend().probe()
        from stockade.lifecycle import removers
        missing = set(records.KINDS) - set(removers.REMOVERS)
        if missing:
            raise UnavailableError("backend_unavailable", "importing the backend did not "
                                   f"register the Windows ledger kinds {sorted(missing)}")
    except (UnavailableError, ImportError) as exc:
        if os.environ.get("STOCKADE_REQUIRE_WINDOWS"):
            pytest.fail(f"the Windows backend cannot run here but is required: {exc}")
        pytest.skip(f"the Windows backend cannot run here: {exc}")


@functools.cache
def python() -> str:
    """The program the sandboxed children run: the one the readiness probe runs, a venv's base
    interpreter and, for the Store's Python, the program its app execution alias names (the
    alias's folder may not be a root: admission.py)."""
    from stockade.windows.probe import Win32Host

    return Win32Host().interpreter()


def request(workspace: str, code: str, *args: str, read=(), limits=None,
            env=()) -> LaunchRequest:
    roots = sorted({PYTHON_ROOT, SYSTEM_ROOT, os.path.dirname(python()), *read})
    return LaunchRequest(
        argv=(python(), "-I", "-S", "-c", textwrap.dedent(code), *args), cwd=workspace,
        env=(("PATH", os.path.dirname(python())), ("SystemRoot", SYSTEM_ROOT), *env),
        read=tuple(PathGrant(p, p) for p in roots),
        write=(PathGrant(workspace, workspace),), protected=(".git",),
        limits=limits or LimitSpec(timeout=60, memory=MEMORY, pids=16))


def run(req: LaunchRequest) -> tuple[int | None, str, str]:
    from stockade.windows.backend import WindowsBackend

    handle = WindowsBackend().spawn(req, Stdio(subprocess.DEVNULL, subprocess.PIPE,
                                               subprocess.PIPE))
    out: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda n=n, s=s: out.__setitem__(n, s.read()))
               for n, s in (("out", handle.stdout), ("err", handle.stderr))]
    for reader in readers:
        reader.start()
    end = handle.wait(90)
    if end is None:
        handle.kill()
        end = handle.wait()
    for reader in readers:
        reader.join()
    assert end.failure is None, end.failure
    return end.exit_code, out["out"].decode().strip(), out["err"].decode()


@pytest.fixture
def ws(tmp_path):
    """(workspace, outside): real paths (long names), only the workspace is ever granted."""
    base = os.path.realpath(tmp_path)
    workspace, outside = os.path.join(base, "ws"), os.path.join(base, "outside")
    os.mkdir(workspace)
    os.mkdir(outside)
    return workspace, outside


TRY = """
    import sys
    def attempt(action, path):
        try:
            with open(path, "r" if action == "read" else "a") as f:
                f.read() if action == "read" else f.write("x")
            return "ok"
        except PermissionError:
            return "denied"
    print(" ".join(attempt(*pair.split("=", 1)) for pair in sys.argv[1:]))
"""


def test_reading_or_writing_outside_the_roots_fails(ws):
    workspace, outside = ws
    secret, mine = os.path.join(outside, "secret.txt"), os.path.join(workspace, "mine.txt")
    for path in (secret, mine):
        with open(path, "w") as f:
            f.write("data")
    code, out, err = run(request(workspace, TRY, f"read={mine}", f"read={secret}",
                                 f"write={secret}", f"write={outside}\\planted.txt"))
    assert (code, out) == (0, "ok denied denied denied"), err
    with open(secret) as f:
        assert f.read() == "data"
    assert not os.path.exists(os.path.join(outside, "planted.txt"))


def test_writing_a_read_root_or_a_protected_name_fails_and_the_write_root_works(ws, tmp_path):
    workspace, _ = ws
    read_root = os.path.join(os.path.realpath(tmp_path), "tools")
    os.mkdir(read_root)
    os.mkdir(os.path.join(workspace, ".git"))
    for path in (os.path.join(read_root, "tool.cfg"), os.path.join(workspace, ".git", "config")):
        with open(path, "w") as f:
            f.write("original")
    code, out, err = run(request(
        workspace, TRY, f"write={read_root}\\tool.cfg", f"write={workspace}\\.git\\config",
        f"write={workspace}\\.git\\hooks-planted", f"write={workspace}\\made.txt",
        f"read={read_root}\\tool.cfg", read=(read_root,)))
    assert (code, out) == (0, "denied denied denied ok ok"), err
    with open(os.path.join(workspace, "made.txt")) as f:
        assert f.read() == "x"
    with open(os.path.join(workspace, ".git", "config")) as f:
        assert f.read() == "original"


EXEC = """
    import os, shutil, subprocess, sys
    copy = shutil.copy(sys.executable, os.path.join(os.getcwd(), "copy.exe"))
    try:
        subprocess.run([copy, "-c", "pass"])
        ran = "ran"
    except PermissionError:
        ran = "denied"
    icacls = os.path.join(os.environ["SystemRoot"], "System32", "icacls.exe")
    granted = subprocess.run([icacls, copy, "/grant", "*S-1-1-0:(RX)"],
                             capture_output=True).returncode
    print(ran, "regranted" if granted == 0 else "not-regranted")
"""


def test_a_program_written_into_a_write_root_cannot_run_nor_be_made_runnable(ws):
    workspace, _ = ws
    code, out, err = run(request(workspace, EXEC))
    assert (code, out) == (0, "denied not-regranted"), err


TOKEN = """
    import ctypes, json
    from ctypes import wintypes as w
    advapi, kernel = ctypes.WinDLL("advapi32"), ctypes.WinDLL("kernel32")
    kernel.GetCurrentProcess.restype = w.HANDLE
    advapi.OpenProcessToken.argtypes = [w.HANDLE, w.DWORD, ctypes.POINTER(w.HANDLE)]
    advapi.GetTokenInformation.argtypes = [w.HANDLE, ctypes.c_int, ctypes.c_void_p, w.DWORD,
                                           ctypes.POINTER(w.DWORD)]
    advapi.ConvertSidToStringSidW.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_wchar_p)]
    token, size = w.HANDLE(), w.DWORD()
    assert advapi.OpenProcessToken(kernel.GetCurrentProcess(), 8, ctypes.byref(token))
    def info(klass):
        buffer = ctypes.create_string_buffer(1024)
        assert advapi.GetTokenInformation(token, klass, buffer, 1024, ctypes.byref(size))
        return buffer
    is_appcontainer = w.DWORD.from_buffer(info(29)).value
    sid = ctypes.c_wchar_p()
    advapi.ConvertSidToStringSidW(ctypes.c_void_p.from_buffer(info(31)).value, ctypes.byref(sid))
    groups, capabilities = info(30), []  # TOKEN_GROUPS: a count, then (PSID, DWORD) pairs
    for i in range(w.DWORD.from_buffer(groups).value):
        capability = ctypes.c_wchar_p()
        advapi.ConvertSidToStringSidW(ctypes.c_void_p.from_buffer(groups, 8 + 16 * i).value,
                                      ctypes.byref(capability))
        capabilities.append(capability.value)
    print(json.dumps({"appcontainer": is_appcontainer, "sid": sid.value,
                      "capabilities": capabilities}))
"""


def test_the_childs_token_is_a_fresh_appcontainer_token_with_only_runtime_capabilities(ws):
    """No capability but the standing grants' of the roots it reads (issue 31, D10: elevated,
    the interpreter's root has one; unelevated it is open to every AppContainer, none)."""
    from stockade.windows import standing

    workspace, _ = ws
    seen = []
    for _ in range(2):
        req = request(workspace, TOKEN)
        code, out, err = run(req)
        assert code == 0, err
        seen.append(json.loads(out))
    records = [standing.StandingGrants().load(g.path) for g in req.read]
    runtime = {record["capability"] for record in records if record}
    for facts in seen:
        assert facts["appcontainer"] == 1 and set(facts["capabilities"]) <= runtime
        assert len(facts["capabilities"]) == len(set(facts["capabilities"]))
        assert facts["sid"].startswith("S-1-15-2-")
    assert seen[0]["capabilities"] == seen[1]["capabilities"]  # standing: the same each time
    assert seen[0]["sid"] != seen[1]["sid"]  # one AppContainer per launch


JOB = """
    import ctypes, json, subprocess, sys
    from ctypes import wintypes as w
    kernel = ctypes.WinDLL("kernel32")
    kernel.QueryInformationJobObject.argtypes = [w.HANDLE, ctypes.c_int, ctypes.c_void_p,
                                                 w.DWORD, ctypes.POINTER(w.DWORD)]
    kernel.GetCurrentProcess.restype = w.HANDLE
    advapi = ctypes.WinDLL("advapi32")
    advapi.OpenProcessToken.argtypes = [w.HANDLE, w.DWORD, ctypes.POINTER(w.HANDLE)]
    advapi.GetTokenInformation.argtypes = [w.HANDLE, ctypes.c_int, ctypes.c_void_p, w.DWORD,
                                           ctypes.POINTER(w.DWORD)]
    advapi.ConvertSidToStringSidW.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_wchar_p)]
    info = ctypes.create_string_buffer(144)  # JOBOBJECT_EXTENDED_LIMIT_INFORMATION (x64)
    assert kernel.QueryInformationJobObject(None, 9, info, 144, None)
    token, size, sid = w.HANDLE(), w.DWORD(), ctypes.c_wchar_p()
    assert advapi.OpenProcessToken(kernel.GetCurrentProcess(), 8, ctypes.byref(token))
    package = ctypes.create_string_buffer(1024)  # TokenAppContainerSid, read while alive
    assert advapi.GetTokenInformation(token, 31, package, 1024, ctypes.byref(size))
    advapi.ConvertSidToStringSidW(ctypes.c_void_p.from_buffer(package).value, ctypes.byref(sid))
    mine = {"flags": int.from_bytes(info.raw[16:20], "little"),
            "memory": int.from_bytes(info.raw[120:128], "little"),
            "processes": int.from_bytes(info.raw[40:44], "little"), "sid": sid.value}
    if len(sys.argv) > 1:  # the grandchild
        print(json.dumps(mine))
    else:
        grandchild = subprocess.run([sys.executable, "-I", "-S", "-c", CODE, "grandchild"],
                                    capture_output=True, text=True)
        print(json.dumps({"child": mine, "grandchild": json.loads(grandchild.stdout)}))
"""


def test_a_descendant_keeps_the_appcontainer_token_and_the_job(ws):
    workspace, _ = ws
    body = textwrap.dedent(JOB)
    code_text = f"CODE = {body!r}\n" + body
    code, out, err = run(request(workspace, code_text))
    assert code == 0, err
    facts = json.loads(out)
    for who in ("child", "grandchild"):
        assert facts[who]["flags"] & 0x2000, who  # KILL_ON_JOB_CLOSE
        assert not facts[who]["flags"] & (0x800 | 0x1000), who  # no breakaway
        assert facts[who]["memory"] == MEMORY and facts[who]["processes"] == 16, who
    assert facts["child"]["sid"].startswith("S-1-15-2-")
    assert facts["grandchild"]["sid"] == facts["child"]["sid"]  # the same AppContainer


OWNER = """
    import subprocess, sys, time
    from stockade.launch.backend import Stdio
    from stockade.launch.request import LaunchRequest
    from stockade.windows.backend import WindowsBackend
    with open(sys.argv[1], "rb") as f:
        request = LaunchRequest.decode(f.read())
    handle = WindowsBackend().spawn(request, Stdio(subprocess.DEVNULL, subprocess.DEVNULL,
                                                   subprocess.DEVNULL))
    print("launched", flush=True)
    time.sleep(600)
"""

SPAWNER = """
    import os, subprocess, sys, time
    sleeper = [sys.executable, "-I", "-S", "-c", "import time; time.sleep(600)"]
    grandchild = subprocess.Popen(sleeper)
    with open(sys.argv[1], "w") as f:
        f.write(f"{os.getpid()} {grandchild.pid}")
    time.sleep(600)
"""


def gone_within(pid: int, seconds: float) -> bool:
    kernel = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel.OpenProcess.restype = ctypes.c_void_p
    kernel.OpenProcess.argtypes = [ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32]
    kernel.WaitForSingleObject.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    kernel.CloseHandle.argtypes = [ctypes.c_void_p]
    handle = kernel.OpenProcess(0x00100000, False, pid)  # SYNCHRONIZE
    if not handle:
        return True  # no such process any more
    try:
        return kernel.WaitForSingleObject(handle, int(seconds * 1000)) == 0
    finally:
        kernel.CloseHandle(handle)


def test_killing_the_owner_kills_the_whole_tree_and_reconcile_reverts_its_grants(ws, tmp_path):
    from stockade.lifecycle.ledger import Ledger
    from stockade.windows import sid as sids
    from stockade.windows.aclstore import WindowsAclStore

    workspace, _ = ws
    pids_file = os.path.join(workspace, "pids")
    encoded = os.path.join(os.path.realpath(tmp_path), "request.json")
    with open(encoded, "wb") as f:
        f.write(request(workspace, SPAWNER, pids_file).encode())
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(OWNER), encoded],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "launched"
        child, grandchild = started_tree(pids_file)
        assert not gone_within(grandchild, 0.5)
    finally:
        owner.kill()  # TerminateProcess: no cleanup runs in the owner
        owner.wait()
    assert gone_within(child, 10) and gone_within(grandchild, 10)
    done = Ledger().reconcile()
    assert done.reconciled >= 1 and done.failed == 0
    store = WindowsAclStore()
    for path in (workspace, PYTHON_ROOT):
        assert not [a for a in store.read(path).aces if sids.is_appcontainer(a.sid)], path


def test_kill_ends_a_running_sandbox_and_reports_it_killed(ws):
    from stockade.windows.backend import WindowsBackend
    from stockade.windows.handle import KILLED_SIGNAL

    workspace, _ = ws
    handle = WindowsBackend().spawn(request(workspace, "import time; time.sleep(600)"),
                                    Stdio(subprocess.DEVNULL, subprocess.DEVNULL,
                                          subprocess.DEVNULL))
    assert handle.wait(1) is None
    handle.kill()
    end = handle.wait(30)
    assert end is not None and (end.exit_code, end.signal) == (None, KILLED_SIGNAL)
    assert end.failure is None


# --- admission: links refused before any access control changes -------------------------------


def spawn_refusal(req: LaunchRequest, ledger_root: str):
    from stockade.lifecycle.ledger import Ledger
    from stockade.windows.handle import WindowsHandle

    with pytest.raises(UnenforceableError) as refused:
        WindowsHandle(req, Stdio(subprocess.DEVNULL, subprocess.DEVNULL, subprocess.DEVNULL),
                      ledger=Ledger(ledger_root))
    return refused.value


def test_a_junction_or_a_multiply_linked_file_in_a_root_is_refused_untouched(ws, tmp_path):
    import _winapi

    from stockade.windows.aclstore import WindowsAclStore

    workspace, outside = ws
    target = os.path.join(outside, "target.txt")
    with open(target, "w") as f:
        f.write("outside")
    store = WindowsAclStore()
    for plant, capability in (
            (lambda: _winapi.CreateJunction(outside, os.path.join(workspace, "j")),
             "filesystem.reparse_point"),
            (lambda: os.link(target, os.path.join(workspace, "linked.txt")),
             "filesystem.hard_link")):
        before = (store.read(workspace), store.read(outside), store.read(target))
        plant()
        refusal = spawn_refusal(request(workspace, "pass"), str(tmp_path / "ledger"))
        assert refusal.capability == capability
        assert (store.read(workspace), store.read(outside), store.read(target)) == before
        for name in ("j", "linked.txt"):
            path = os.path.join(workspace, name)
            if os.path.lexists(path):
                os.rmdir(path) if os.path.isdir(path) else os.unlink(path)


JUNCTION = """
    import _winapi, os, sys
    _winapi.CreateJunction(sys.argv[1], "j")
    print("made" if os.path.isfile(os.path.join("j", "f.txt")) else "not made")
"""


def test_a_junction_the_child_makes_does_not_carry_the_revert_outside_the_root(ws):
    """WINREAD 7: the child makes a junction in the workspace to another write root (a folder
    it can write, which Windows requires of a sandboxed process's junction). Reverting the
    workspace's grant propagates below it; the junction is set aside meanwhile, so the other
    root's file keeps the inherited entries of its own parent, and the junction is put back.
    The workspace passes Guests read below it, its parent does not: through the junction, the
    file would have gained it."""
    from dataclasses import replace

    from stockade.windows import acl
    from stockade.windows.acl import Ace
    from stockade.windows.aclstore import WindowsAclStore

    workspace, outside = ws
    target = os.path.join(outside, "f.txt")
    with open(target, "w") as f:
        f.write("outside")
    store = WindowsAclStore()
    with store.opened(workspace) as opened:
        dacl = opened.read()
        opened.write((*dacl.explicit, Ace.allow("S-1-5-32-546", 0x1200A9, acl.OBJECT_INHERIT
                                                | acl.CONTAINER_INHERIT)), dacl.protected)
    before = (store.read(outside), store.read(target))
    req = request(workspace, JUNCTION, outside)
    status, out, err = run(replace(req, write=(*req.write, PathGrant(outside, outside))))
    assert (status, out) == (0, "made"), err
    assert (store.read(outside), store.read(target)) == before
    junction = os.path.join(workspace, "j")
    assert os.lstat(junction).st_reparse_tag == 0xA0000003  # IO_REPARSE_TAG_MOUNT_POINT
    os.rmdir(junction)  # (the junction, not the folder it names)


# --- network under `none` ----------------------------------------------------------------------

NETWORK = """
    import json, os, socket, sys, time
    tcp_port, udp_port = int(sys.argv[1]), int(sys.argv[2])
    def attempt(action):
        try:
            action()
            return "ok"
        except OSError as exc:
            return type(exc).__name__ + ":" + str(getattr(exc, "winerror", None) or exc.errno)
    def tcp(address):
        socket.create_connection(address, timeout=5).close()
    def udp(address):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"escape", address)
    listener = socket.socket()
    listening = attempt(lambda: (listener.bind(("127.0.0.1", 0)), listener.listen(1)))
    port = listener.getsockname()[1] if listening == "ok" else 0
    with open("listening", "w") as f:
        f.write(str(port))
    deadline = time.monotonic() + 20
    while not os.path.exists("knocked") and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({
        "tcp_loopback": attempt(lambda: tcp(("127.0.0.1", tcp_port))),
        "tcp_outside": attempt(lambda: tcp(("1.1.1.1", 53))),
        "udp_loopback": attempt(lambda: udp(("127.0.0.1", udp_port))),
        "udp_outside": attempt(lambda: udp(("1.1.1.1", 53))),
        "dns": attempt(lambda: socket.getaddrinfo("example.com", 443)),
        "listening": listening}))
"""


def test_tcp_udp_dns_loopback_and_listeners_are_denied_under_none(ws):
    import socket

    workspace, _ = ws
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    for sock in (tcp, udp):
        sock.setblocking(False)
    result: dict = {}
    launch = threading.Thread(target=lambda: result.update(out=run(request(
        workspace, NETWORK, str(tcp.getsockname()[1]), str(udp.getsockname()[1])))))
    launch.start()
    listening = os.path.join(workspace, "listening")
    deadline = time.monotonic() + 60
    while not (os.path.exists(listening) and open(listening).read()):
        assert time.monotonic() < deadline, "the child never listened"
        time.sleep(0.05)
    port = int(open(listening).read())
    knocked_in = "refused"
    if port:  # it may listen; nothing outside may connect in
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            knocked_in = "ok"
        except OSError:
            pass
    open(os.path.join(workspace, "knocked"), "w").close()
    launch.join(120)
    code, out, err = result["out"]
    assert code == 0, err
    seen = json.loads(out)
    for attempt in ("tcp_loopback", "tcp_outside", "udp_outside", "dns"):
        assert seen[attempt] != "ok", (attempt, seen)
    assert knocked_in == "refused", seen
    for receive in (tcp.accept, lambda: udp.recv(16)):
        with pytest.raises(BlockingIOError):  # the host's listeners saw nothing
            receive()
    # Positive control: the same listeners answer an unconfined client.
    for sock in (tcp, udp):
        sock.settimeout(5)
    with socket.create_connection(tcp.getsockname(), timeout=5):
        tcp.accept()[0].close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.sendto(b"control", udp.getsockname())
        assert udp.recv(16) == b"control"
    tcp.close()
    udp.close()


# --- the host's named pipes, environment, files, registry and processes ------------------------

HOST = """
    import ctypes, json, os, sys, winreg
    from ctypes import wintypes as w
    pipe, credentials, key, parent = sys.argv[1:5]
    kernel = ctypes.WinDLL("kernel32", use_last_error=True)
    advapi = ctypes.WinDLL("advapi32", use_last_error=True)
    kernel.OpenProcess.restype = w.HANDLE
    kernel.OpenProcess.argtypes = [w.DWORD, w.BOOL, w.DWORD]
    advapi.OpenProcessToken.argtypes = [w.HANDLE, w.DWORD, ctypes.POINTER(w.HANDLE)]
    def attempt(action):
        try:
            action()
            return "ok"
        except OSError as exc:
            return type(exc).__name__
    def read(path):
        with open(path, "rb") as f:
            f.read(1)
    def registry():
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, key) as k:
            winreg.QueryValueEx(k, "secret")
    def process(access):
        handle = kernel.OpenProcess(access, False, int(parent))
        if not handle:
            raise ctypes.WinError(ctypes.get_last_error())
        return handle
    def token():
        handle = process(0x1000)  # PROCESS_QUERY_LIMITED_INFORMATION
        out = w.HANDLE()
        if not advapi.OpenProcessToken(handle, 0x8, ctypes.byref(out)):  # TOKEN_QUERY
            raise ctypes.WinError(ctypes.get_last_error())
    print(json.dumps({
        "pipe": attempt(lambda: open(pipe, "r+b").close()),
        "secret_variable": os.environ.get("STOCKADE_TEST_SECRET_TOKEN", "absent"),
        "passed_variable": os.environ.get("STOCKADE_TEST_PASSED", "absent"),
        "credentials": attempt(lambda: read(credentials)),
        "registry": attempt(registry),
        "parent_memory": attempt(lambda: process(0x0410)),  # QUERY_INFORMATION | VM_READ
        "parent_handles": attempt(lambda: process(0x0040)),  # DUP_HANDLE
        "parent_token": attempt(token)}))
"""


def test_the_hosts_pipes_secrets_credentials_registry_and_parent_are_out_of_reach(
        ws, monkeypatch):
    import _winapi
    import secrets as random
    import winreg

    workspace, _ = ws
    name = random.token_hex(8)
    pipe_name = rf"\\.\pipe\stockade-test-{name}"
    pipe = _winapi.CreateNamedPipe(pipe_name, _winapi.PIPE_ACCESS_DUPLEX,
                                   _winapi.PIPE_TYPE_BYTE | _winapi.PIPE_WAIT, 4, 65536, 65536,
                                   0, _winapi.NULL)
    credentials = os.path.join(os.path.expanduser("~"), f"stockade-test-credentials-{name}")
    with open(credentials, "w") as f:
        f.write("aws_secret_access_key = not-for-the-sandbox\n")
    key = rf"Software\StockadeTest-{name}"
    with winreg.CreateKey(winreg.HKEY_CURRENT_USER, key) as k:
        winreg.SetValueEx(k, "secret", 0, winreg.REG_SZ, "not-for-the-sandbox")
    monkeypatch.setenv("STOCKADE_TEST_SECRET_TOKEN", "ambient-secret-value")
    try:
        code, out, err = run(request(workspace, HOST, pipe_name, credentials, key,
                                     str(os.getpid()), env=(("STOCKADE_TEST_PASSED", "yes"),)))
        assert code == 0, err
        seen = json.loads(out)
        assert seen["secret_variable"] == "absent" and seen["passed_variable"] == "yes"
        assert "ambient-secret-value" not in out + err
        for attempt in ("pipe", "credentials", "registry", "parent_memory", "parent_handles",
                        "parent_token"):
            assert seen[attempt] != "ok", (attempt, seen)
        # Positive controls: each exists and is reachable from outside the sandbox.
        with open(credentials) as f:
            assert "not-for-the-sandbox" in f.read()
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, key) as k:
            assert winreg.QueryValueEx(k, "secret")[0] == "not-for-the-sandbox"
        with open(pipe_name, "r+b"):
            pass
    finally:
        _winapi.CloseHandle(pipe)
        os.unlink(credentials)
        winreg.DeleteKey(winreg.HKEY_CURRENT_USER, key)


# --- the tree ends with the owner, the timeout and cancellation --------------------------------

def started_tree(pids_file: str) -> tuple[int, int]:
    deadline = time.monotonic() + 60
    while not os.path.exists(pids_file) or not open(pids_file).read().strip():
        assert time.monotonic() < deadline, "the sandboxed child never wrote its pids"
        time.sleep(0.1)
    child, grandchild = map(int, open(pids_file).read().split())
    return child, grandchild


@pytest.mark.parametrize("end", ["timeout", "cancel"])
def test_a_timeout_or_a_cancellation_ends_the_whole_tree(ws, end):
    from stockade.launch.manager import execute
    from stockade.windows.backend import WindowsBackend

    workspace, _ = ws
    pids_file = os.path.join(workspace, "pids")
    limits = LimitSpec(timeout=15 if end == "timeout" else 120, memory=MEMORY, pids=16)
    cancel = threading.Event()
    watcher = threading.Thread(target=lambda: (started_tree(pids_file), cancel.set())
                               if end == "cancel" else None)
    watcher.start()
    result = execute(WindowsBackend(), request(workspace, SPAWNER, pids_file, limits=limits),
                     cancel=cancel)
    watcher.join()
    assert (result.timed_out, result.cancelled) == (end == "timeout", end == "cancel")
    child, grandchild = started_tree(pids_file)
    assert gone_within(child, 10) and gone_within(grandchild, 10)


# --- residue: a concurrent soak, and identities never reused -----------------------------------


def appcontainer_entries(path: str) -> list[str]:
    from stockade.windows import sid as sids
    from stockade.windows.aclstore import WindowsAclStore

    return [a.sid for a in WindowsAclStore().read(path).aces
            if sids.is_appcontainer(a.sid) and not a.inherited]


def test_64_concurrent_launches_leave_no_entry_record_or_profile_behind(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from stockade.lifecycle.ledger import Ledger
    from stockade.windows import desktop, identity
    from stockade.windows import sid as sids

    base = os.path.realpath(tmp_path)
    workspaces = [os.path.join(base, f"ws{i}") for i in range(64)]
    for path in workspaces:
        os.mkdir(path)
    requests = [LaunchRequest(
        argv=("cmd.exe", "/d", "/c", "exit", "0"), cwd=path,
        env=(("PATH", os.path.join(SYSTEM_ROOT, "System32")), ("SystemRoot", SYSTEM_ROOT)),
        read=(PathGrant(SYSTEM_ROOT, SYSTEM_ROOT),), write=(PathGrant(path, path),),
        limits=LimitSpec(timeout=120, memory=MEMORY, pids=8)) for path in workspaces]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, requests))
    assert [code for code, _, _ in results] == [0] * 64, results[:3]
    names = [identity.profile_name(r.request_id, set()) for r in requests]
    assert not [name for name in names if identity.profile_exists(name)]
    assert not [path for path in (base, *workspaces) if appcontainer_entries(path)]
    station = desktop.change_station(desktop.window_station(), lambda aces: aces)
    assert not [a for a in station if sids.is_appcontainer(a.sid)]
    assert Ledger().records() == []


def test_a_quarantined_identity_is_never_handed_out_again(ws, tmp_path):
    from stockade.errors import SetupError
    from stockade.lifecycle.ledger import Ledger
    from stockade.windows import identity
    from stockade.windows.handle import WindowsHandle

    workspace, _ = ws
    ledger = Ledger(str(tmp_path / "ledger"))
    req = request(workspace, "pass")
    name = identity.profile_name(req.request_id, set())
    os.makedirs(ledger.records_dir)
    with open(os.path.join(ledger.records_dir, "e" * 64 + ".json"), "w") as f:
        f.write(f"not a record, but it names {name}\n")
    assert ledger.reconcile().quarantined == 1
    with pytest.raises(SetupError) as refused:
        WindowsHandle(req, Stdio(subprocess.DEVNULL, subprocess.DEVNULL, subprocess.DEVNULL),
                      ledger=ledger)
    assert refused.value.code == "ledger_identity_reused"
    assert not identity.profile_exists(name)
