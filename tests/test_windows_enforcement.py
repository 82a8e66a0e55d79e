"""Real children in the real Windows sandbox (AppContainer, Job, ACL grants, private desktop):
each test has a sandboxed process attempt the forbidden thing and checks that it failed, next
to a control showing the permitted thing works. Windows only; CI runs them on windows-latest
(.github/workflows/windows.yml) with STOCKADE_REQUIRE_WINDOWS=1, which turns "cannot run here"
into a failure instead of a skip."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from stockade.errors import UnavailableError
from stockade.launch.backend import Stdio
from stockade.launch.request import LaunchRequest, LimitSpec, PathGrant

pytestmark = pytest.mark.windows  # deselected off Windows (conftest.py)

PYTHON = os.path.realpath(sys.executable)
PYTHON_ROOT = os.path.realpath(sys.base_prefix)
SYSTEM_ROOT = os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows"))
MEMORY = 512 << 20


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


def request(workspace: str, code: str, *args: str, read=(), limits=None) -> LaunchRequest:
    roots = sorted({PYTHON_ROOT, SYSTEM_ROOT, *read})
    return LaunchRequest(
        argv=(PYTHON, "-I", "-S", "-c", textwrap.dedent(code), *args), cwd=workspace,
        env=(("PATH", os.path.dirname(PYTHON)), ("SystemRoot", SYSTEM_ROOT)),
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


def test_reading_outside_the_roots_fails(ws):
    workspace, outside = ws
    secret, mine = os.path.join(outside, "secret.txt"), os.path.join(workspace, "mine.txt")
    for path in (secret, mine):
        with open(path, "w") as f:
            f.write("data")
    code, out, err = run(request(workspace, TRY, f"read={mine}", f"read={secret}"))
    assert (code, out) == (0, "ok denied"), err


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
    print(json.dumps({"appcontainer": is_appcontainer, "sid": sid.value,
                      "capabilities": w.DWORD.from_buffer(info(30)).value}))
"""


def test_the_childs_token_is_a_fresh_appcontainer_token_without_capabilities(ws):
    workspace, _ = ws
    seen = []
    for _ in range(2):
        code, out, err = run(request(workspace, TOKEN))
        assert code == 0, err
        seen.append(json.loads(out))
    for facts in seen:
        assert facts["appcontainer"] == 1 and facts["capabilities"] == 0
        assert facts["sid"].startswith("S-1-15-2-")
    assert seen[0]["sid"] != seen[1]["sid"]  # one AppContainer per launch


JOB = """
    import ctypes, json, subprocess, sys
    from ctypes import wintypes as w
    kernel = ctypes.WinDLL("kernel32")
    kernel.QueryInformationJobObject.argtypes = [w.HANDLE, ctypes.c_int, ctypes.c_void_p,
                                                 w.DWORD, ctypes.POINTER(w.DWORD)]
    info = ctypes.create_string_buffer(144)  # JOBOBJECT_EXTENDED_LIMIT_INFORMATION (x64)
    assert kernel.QueryInformationJobObject(None, 9, info, 144, None)
    mine = {"flags": int.from_bytes(info.raw[16:20], "little"),
            "memory": int.from_bytes(info.raw[120:128], "little"),
            "processes": int.from_bytes(info.raw[40:44], "little")}
    if len(sys.argv) > 1:  # the grandchild
        print(json.dumps(mine))
    else:
        grandchild = subprocess.run([sys.executable, "-I", "-S", "-c", CODE, "grandchild"],
                                    capture_output=True, text=True)
        print(json.dumps({"child": mine, "grandchild": json.loads(grandchild.stdout)}))
"""


def test_the_child_and_its_descendants_are_in_the_launchs_job(ws):
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
        deadline = time.monotonic() + 60
        while not os.path.exists(pids_file) or not open(pids_file).read().strip():
            assert time.monotonic() < deadline, "the sandboxed child never wrote its pids"
            time.sleep(0.1)
        child, grandchild = map(int, open(pids_file).read().split())
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
