"""Stockade's way in on Windows, guarded on Linux (issue 20): every module on the Windows path
imports, the command line parses and answers, and choosing a backend ends in a typed refusal,
all in a fresh interpreter made to look like Windows CPython (tests/windows_like.py: POSIX-only
modules and attributes absent, sys.platform "win32", the Windows-only modules stubbed).

This is a guard, not an emulator. No Win32 call runs here (each is an OSError), os.path is
still posixpath and the files and processes are Linux's: a pass says only that the code got as
far as it should (an import, a parsed command line, a typed refusal) without reaching for
anything Windows CPython lacks. What Windows itself does is the Windows workflow's to show
(.github/workflows/windows.yml, docs/windows.md).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from windows_like import run_as_windows

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import windows_ci  # noqa: E402 -- from scripts/: the one list of what is POSIX-only

EXIT_USAGE, EXIT_SETUP = 2, 70
WINDOWS_ENV = {"USERNAME": "stockade-guard", "SystemRoot": "C:\\Windows"}  # (Windows sets them)


def _as_windows(code: str, **options: object) -> dict:
    """Run `code` as Windows CPython would; the JSON object its last line prints."""
    done = run_as_windows(code, env={**os.environ, **WINDOWS_ENV}, **options)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _modules() -> list[str]:
    """Every module of the source tree, by name (read from the files: nothing imported)."""
    top = ROOT / "stockade"
    names = []
    for path in sorted(top.rglob("*.py")):
        parts = path.relative_to(top.parent).with_suffix("").parts
        if "attacks" in parts:  # (the evidence attacks are scripts run in a sandbox)
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture
def policies(tmp_path: Path) -> dict[str, str]:
    """Policy files whose roots exist on this host (os.path is posixpath here): one the
    backend is asked to run, one asking for a VM, one that is no policy."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    base = {"version": 1, "filesystem": {"read": [str(tmp_path)], "write": [str(workspace)]},
            "network": {"mode": "none"}, "process": {"cwd": str(workspace)}}
    files = {"good": base, "vm": base | {"containment": "vm"},
             "invalid": base | {"no_such_section": {}},
             "exec": {"version": 1, "containment": "processcontainer",
                      "process": {"commandLine": "cmd /d /c exit 0"}}}
    for name, body in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    return {name: str(tmp_path / f"{name}.json") for name in files}


def test_the_guard_is_armed():
    # (so that a guard that no longer hides what Windows lacks cannot pass the tests below)
    seen = _as_windows("""
        import ctypes, json, os, select, signal, socket, sys
        try:
            import fcntl
            posix = "imported"
        except ModuleNotFoundError:
            posix = "absent"
        try:
            ctypes.WinDLL("kernel32")
            dll = "loaded"
        except OSError:
            dll = "OSError"
        import msvcrt, winreg
        print(json.dumps({"platform": sys.platform, "fcntl": posix, "dll": dll,
                          "posix": [hasattr(socket, "AF_UNIX"), hasattr(os, "fork"),
                                    hasattr(os, "getuid"), hasattr(signal, "SIGKILL"),
                                    hasattr(select, "poll"), hasattr(os, "O_CLOEXEC")],
                          "build": sys.getwindowsversion().build}))
    """)
    assert seen == {"platform": "win32", "fcntl": "absent", "dll": "OSError",
                    "posix": [False] * 6, "build": 20348}


def test_every_module_on_the_windows_path_imports():
    modules = _modules()
    on_path = [name for name in modules if windows_ci.imported_by_the_smoke(name)]
    # the modules named POSIX-only one by one (not the Linux package) do need POSIX: the list
    # is no longer than it must be
    named = [name for name in windows_ci.POSIX_ONLY if name in modules
             and not any(other.startswith(name + ".") for other in modules)]
    assert len(on_path) > 100 and len(named) == len(windows_ci.POSIX_ONLY) - 1
    seen = _as_windows(f"""
        import importlib, json, traceback
        failed = {{}}
        for name in {on_path + named!r}:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failed[name] = f"{{type(exc).__name__}}: {{exc}}"
        print(json.dumps(failed))
    """)
    assert {name: why for name, why in seen.items() if name not in named} == {}
    assert sorted(seen) == sorted(named)


def test_the_api_chooses_a_windows_backend_and_refuses_typed_never_trying_linux(policies):
    seen = _as_windows(f"""
        import json, sys
        import stockade
        from stockade.errors import StockadeError
        from stockade.launch import registry
        from stockade.launch.compile import CompileContext, compile_policy
        from stockade.launch.manager import SandboxManager
        from stockade.policy import load_policy

        out = {{}}
        tried, create = [], registry.create
        def recorded(entry):
            tried.append(entry.name)
            return create(entry)
        registry.create = recorded
        def attempt(name, action):
            tried.clear()
            try:
                action()
                out[name] = "ran"
            except StockadeError as exc:
                out[name] = [type(exc).__name__, exc.code, *tried]
        attempt("native", lambda: stockade.run(["cmd", "/c", "exit 0"],
                                               policy={policies["good"]!r}))
        attempt("vm", lambda: stockade.run(["cmd", "/c", "exit 0"], policy={policies["vm"]!r}))
        out["loaded"] = sorted(name for name in sys.modules
                               if name.startswith(("stockade.linux", "stockade.vm.qemu")))
        request = compile_policy(load_policy({policies["vm"]!r}), ["cmd"],
                                 CompileContext.current(None))
        # (another host's driver, required by name: its import fails here, typed)
        attempt("qemu", lambda: SandboxManager("qemu-vm", "require").select(request))
        print(json.dumps(out))
    """)
    # (the refusal, then the backends tried: in auto mode, only this host's)
    assert seen["native"] == ["UnavailableError", "backend_unavailable",  # (no Win32 DLL here)
                              "windows"]
    assert seen["vm"] == ["UnavailableError", "windows_sandbox_unavailable", "windows-sandbox"]
    assert seen["qemu"] == ["UnavailableError", "backend_unavailable", "qemu-vm"]
    # auto tried neither Linux nor QEMU: of theirs, only the entries were read
    assert seen["loaded"] == ["stockade.linux", "stockade.linux.registration"]


@pytest.mark.parametrize(("words", "status", "says"), [
    (["--help"], 0, "sandbox-exec"),
    (["run", "--help"], 0, "--containment"),
    (["sandbox-exec", "--help"], 0, "POLICY"),
    (["sandbox-exec", "{good}", "--", "cmd", "/d", "/c", "exit", "0"], EXIT_SETUP,
     "backend_unavailable"),
    (["sandbox-exec", "{invalid}", "--", "cmd", "/d", "/c", "exit", "0"], EXIT_USAGE,
     "no_such_section"),
    (["run", "--policy", "{good}", "--", "cmd", "/d", "/c", "exit", "0"], EXIT_SETUP,
     "backend_unavailable"),
    (["run", "--json", "--policy", "{good}", "--", "cmd", "/d", "/c", "exit", "0"], EXIT_SETUP,
     '"backend_unavailable"'),
    (["exec", "{exec}"], EXIT_SETUP, "unenforceable:exec.commandLine"),
    (["exec", "--json", "{exec}"], EXIT_SETUP, '"code": "unenforceable:exec.commandLine"'),
    (["exec", "{invalid}"], EXIT_USAGE, "policy_invalid"),
    (["run", "--policy", "{vm}", "--", "cmd"], EXIT_SETUP, "windows_sandbox_unavailable"),
    (["run", "--policy", "{good}", "--isolation", "landlock", "--", "cmd"], EXIT_SETUP,
     "isolation"),
    (["doctor"], EXIT_SETUP, "diagnoses the Linux backend"),
])
def test_the_command_line_answers_as_on_windows_with_no_cli_server(policies, words, status,
                                                                    says):
    # (the program's own entry, as `stockade` and `python -m stockade` run it: with no AF_UNIX
    # it asks no CLI server, and runs the command line itself)
    argv = ["stockade", *(word.format(**policies) for word in words)]
    seen = _as_windows(f"""
        import contextlib, io, json, sys
        sys.argv = {argv!r}
        out, err = io.StringIO(), io.StringIO()
        from stockade.program import main
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main()
            except SystemExit as exc:
                status = exc.code
        print(json.dumps({{"status": status, "out": out.getvalue(), "err": err.getvalue(),
                          "server": "stockade.cli.server" in sys.modules}}))
    """)
    said = seen["out"] + seen["err"]
    assert (seen["status"], "Traceback" in said, seen["server"]) == (status, False, False), said
    assert says in said


def test_the_report_lists_the_network_broker_and_windows_sandbox_rows_as_on_windows():
    """Issue 36's acceptance, as far as a host without Win32 goes: `stockade report` answers
    with the windows backend's rows, each with its status and reason: here the probe cannot
    run, the fence service does not answer, and Windows Sandbox is not installed."""
    seen = _as_windows("""
        import contextlib, io, json, sys
        sys.argv = ["stockade", "report", "--json"]
        out = io.StringIO()
        from stockade.program import main
        with contextlib.redirect_stdout(out):
            status = main()
        print(json.dumps({"status": status, "report": json.loads(out.getvalue())}))
    """)
    assert seen["status"] == 0
    (windows,) = seen["report"]["backends"]
    assert (windows["name"], windows["ready"], windows["reason"]) == (
        "windows", False, "backend_unavailable")
    rows = {row["name"]: row for row in windows["capabilities"]}
    for name in ("network.allowlist", "network.any", "broker", "windows_sandbox"):
        assert rows[name]["status"] == "unavailable" and rows[name]["reason"], name
    assert "stockade fence install" in rows["network.allowlist"]["reason"]
    assert rows["broker"]["reason"].startswith("not verified: the readiness probe failed")
    assert rows["windows_sandbox"]["reason"].startswith("windows_sandbox_unavailable: Windows "
                                                        "Sandbox is not installed")


def test_user32_refused_for_want_of_a_window_station_is_window_station_denied():
    """A user without access to its window station (started by runas or Start-Process
    -Credential on a station granting it nothing) cannot load user32.dll: LoadLibrary fails
    with ERROR_DLL_INIT_FAILED (1114), which CPython's ctypes raises as an OSError carrying
    that winerror. The backend says so, typed, with the remedy (before: backend_unavailable,
    "a Win32 function is missing")."""
    seen = _as_windows("""
        import ctypes, json, types

        def load(name, **options):
            if name != "user32":
                return types.SimpleNamespace()
            error = OSError(22, "[WinError 1114] A dynamic link library (DLL) initialization "
                                "routine failed")
            error.winerror = 1114  # (set by OSError itself on Windows)
            raise error

        ctypes.WinDLL = load
        from stockade.errors import StockadeError
        from stockade.windows.backend import WindowsBackend
        try:
            WindowsBackend().probe()
        except StockadeError as exc:
            print(json.dumps([exc.code, exc.exit_code, exc.message]))
    """)
    code, status, message = seen
    assert (code, status) == ("window_station_denied", EXIT_SETUP)
    assert "user32.dll" in message and "scripts/windows-unelevated.ps1" in message
