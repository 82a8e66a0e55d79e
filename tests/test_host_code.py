"""The code the host runs next is never the command's to change (issue 29): a workspace that
holds the venv Stockade runs from (project/.venv, run from project/), or a directory on the
host's import path, is read-only in the sandbox's view and cannot be moved; the landlock tier,
which has no view, refuses such a launch, typed. The host here is a real process whose
interpreter is a venv inside the workspace; real children attack it; every check of what
happened is made on the host."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import venv
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ATTEMPT, PYTHON, policy_for

import stockade
from stockade.evidence.launches import WRAPPED_HOOK
from stockade.launch.compile import CompileContext, compile_policy

pytestmark = pytest.mark.usefixtures("linux")

REPO = str(Path(stockade.__file__).resolve().parent.parent)

# Each given path: a write into it (a file is appended to, a directory gets a .pth file),
# then a rename of it (only the rename, prefixed `rename:`); one line per attempt, `name:
# errno` or `name: DONE`; then an everyday write in the workspace.
ATTACK = ATTEMPT + """
import os, sys
def plant(path):
    if os.path.isdir(path):
        path = os.path.join(path, "evil.pth")
    with open(path, "a") as f:
        f.write("import os; os.system('touch /tmp/escaped')\\n")
for path in sys.argv[1:]:
    renamed_only = path.startswith("rename:")
    path = path.removeprefix("rename:")
    if not renamed_only:
        attempt("write " + path, lambda: plant(path))
    attempt("rename " + path, lambda: os.rename(path, path + ".moved"))
attempt("everyday", lambda: open("made-by-the-command", "w").close())
"""

# The host: a program started by the venv's interpreter, which runs the attack with
# Stockade (from this checkout, on PYTHONPATH) and prints the result as JSON.
HOST = """
import json, sys
from dataclasses import replace
from stockade.errors import StockadeError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux.backend import LinuxBackend
from stockade.policy import preset
workspace, isolation, weaken, *argv = sys.argv[1:]
backend = LinuxBackend(frozenset(filter(None, weaken.split(",")))).tier(isolation)
policy = preset("workspace-write")
# (no pids limit: the landlock tier refuses one as root, before it looks at the roots)
policy = replace(policy, isolation=isolation, limits=replace(policy.limits, pids=None))
try:
    request = compile_policy(policy, argv, CompileContext.current(workspace))
    backend.check(request)
    result = execute(backend, request)
except StockadeError as exc:
    print(json.dumps({"refused": exc.code, "message": exc.message}))
else:
    print(json.dumps({"exit": result.exit_code, "stdout": result.stdout.decode(),
                      "stderr": result.stderr.decode(), "enforced": result.enforced,
                      "violations": [[v.kind, v.detail] for v in result.violations]}))
"""


@pytest.fixture
def project(tmp_path) -> Path:
    """A project whose .venv (two levels down, so the pins count) is the host's interpreter,
    with a site-packages holding a module and a .pth of the host's."""
    project = tmp_path / "project"
    env = project / "a" / ".venv"
    venv.EnvBuilder(symlinks=True, with_pip=False).create(env)
    site = next(env.glob("lib/python3*/site-packages"))
    (site / "mod.py").write_text("VALUE = 1\n")
    (site / "host.pth").write_text("# the host's own\n")
    return project


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes | str]]:
    """Every entry below `root`: its inode and, for a file, its contents (a link: its target)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            content = os.readlink(path) if path.is_symlink() else \
                path.read_bytes() if path.is_file() else b""
            found[str(path.relative_to(root))] = (info.st_dev, info.st_ino, content)
    return found


def host(project: Path, *targets: str, isolation: str = "namespaces",
         weaken: str = "") -> dict:
    python = project / "a" / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", HOST, str(project), isolation, weaken, PYTHON, "-c", ATTACK,
         *targets], cwd=project, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def attempts(result: dict) -> dict[str, str]:
    assert result.get("exit") == 0, result
    return dict(line.split(": ", 1) for line in result["stdout"].splitlines())


def targets(project: Path) -> list[str]:
    env = project / "a" / ".venv"
    site = next(env.glob("lib/python3*/site-packages"))
    return [*map(str, (site / "mod.py", site, env / "pyvenv.cfg", env)),
            f"rename:{project / 'a'}"]


def test_the_venv_stockade_runs_from_is_read_only_and_immovable_in_the_sandbox(project):
    """The host runs Stockade with project/a/.venv's interpreter: the command can neither
    plant a .pth in its site-packages, nor change a module or pyvenv.cfg, nor move the venv
    (or the directory above it) aside to put its own in its place; the rest of the workspace
    stays the command's."""
    before = snapshot(project / "a")
    result = host(project, *targets(project))
    got = attempts(result)
    # (the result names what is read-only, and why a write there failed)
    assert result["enforced"]["host_code_read_only"] == [str(project / "a" / ".venv")]
    assert got.pop("everyday") == "DONE"
    assert (project / "made-by-the-command").exists()
    assert got and all(outcome in ("EROFS", "EBUSY") for outcome in got.values()), got
    assert snapshot(project / "a") == before
    assert not list(project.glob("a*.moved")) and not (project / "a" / ".venv.moved").exists()


def test_with_the_layer_off_the_same_attack_changes_the_host_code(project):
    """Control: with the layer switched off (`host_code`, tests only) the same attack plants
    the .pth and moves the venv: the test above sees the layer, not the weather."""
    site = Path(targets(project)[1])
    got = attempts(host(project, *targets(project), weaken="host_code"))
    assert got[f"write {site}"] == got[f"rename {project / 'a'}"] == "DONE", got
    moved = Path(str(site).replace("/a/.venv/", "/a.moved/.venv.moved/") + ".moved")
    assert (moved / "evil.pth").exists()


def test_the_landlock_tier_refuses_a_workspace_holding_the_host_code(project):
    """With no mount view nothing keeps the venv read-only: the launch is refused, typed,
    naming the place and the remedy, and nothing runs."""
    got = host(project, *targets(project), isolation="landlock")
    assert got.get("refused") == "unenforceable:filesystem.host_code", got
    assert str(project / "a" / ".venv") in got["message"] and "pipx" in got["message"]
    assert not (project / "made-by-the-command").exists()


def test_a_workspace_that_is_the_host_code_is_refused(tmp_path):
    """A write root that is a directory on the host's import path (or lies inside one) cannot
    be made read-only without taking the grant away: refused, typed."""
    lib = tmp_path / "lib"
    lib.mkdir()
    ctx = CompileContext(str(lib), str(tmp_path) + "-home", str(tmp_path),
                         {"PYTHONPATH": str(lib)})
    with pytest.raises(stockade.UnenforceableError) as refused:
        compile_policy(policy_for(), ["true"], ctx)
    assert refused.value.code == "unenforceable:filesystem.host_code"
    assert f"is the write root {lib}" in refused.value.message


def test_an_import_path_entry_reached_through_a_link_in_the_workspace_is_refused(tmp_path):
    """PYTHONPATH names ws/lib, a symbolic link to a directory outside: the command could
    point the link at its own code, which the next host call imports."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "lib").symlink_to(outside)
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(tmp_path),
                         {"PYTHONPATH": str(ws / "lib")})
    with pytest.raises(stockade.UnenforceableError) as refused:
        compile_policy(policy_for(), ["true"], ctx)
    assert f"symbolic link {ws / 'lib'}" in refused.value.message


def test_a_missing_import_path_entry_in_the_workspace_is_refused(tmp_path):
    """PYTHONPATH names ws/lib, which does not exist: the command could make it."""
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path),
                         {"PYTHONPATH": str(tmp_path / "lib")})
    with pytest.raises(stockade.UnenforceableError) as refused:
        compile_policy(policy_for(), ["true"], ctx)
    assert "does not exist inside a write root" in refused.value.message


def test_a_path_hooks_key_on_the_import_path_is_not_made(tmp_path, monkeypatch):
    """setuptools' editable install puts a path hook's key, a relative name, on sys.path: it
    names no directory yet, but the file system's hook, ahead of the editable one, takes a
    directory the command makes there (attack 40 T1): it is not made during the run, and the
    launch is not refused (every CLI run from a workspace with an editable install was,
    `does not exist inside a write root`)."""
    key = "__editable__.x-1.0.finder.__path_hook__"

    def hook(entry: str) -> object:
        if entry != key:
            raise ImportError(entry)
        return object()  # (the editable install's finder of its own)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path, key])
    monkeypatch.setattr(sys, "path_hooks", [hook, *sys.path_hooks])
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path),
                         {"PYTHONPATH": "relative/lib"})
    request = compile_policy(policy_for(), ["true"], ctx)
    assert request.host_code == () and str(tmp_path / key) in request.unmade, request


def test_a_relative_entry_on_the_import_path_is_the_directory_it_names(tmp_path, monkeypatch):
    """Attack 33 A2: a program run from its project put "src" on sys.path; Python joins it to
    the working directory at every import, yet relative entries were taken for path hooks'
    keys and kept nowhere: the command planted src/stockade/__init__.py and the program's
    next run imported it. One that names no directory yet is not made during the run (it may
    be a path hook's key: attack 40 T1)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path, "src"])
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(tmp_path / "src") in compile_policy(policy_for(), ["true"], ctx).unmade
    (tmp_path / "src").mkdir()
    assert str(tmp_path / "src") in compile_policy(policy_for(), ["true"], ctx).host_code


def test_a_directory_once_on_the_import_path_is_host_code(tmp_path, monkeypatch):
    """Attack 33 A1: the program put ws/lib on sys.path only while it imported its plugin;
    every import made meanwhile searched ws/lib first (the plugin's `import colorsys` too),
    and the next run does the same, but ws/lib was kept nowhere once it left the path: the
    command planted ws/lib/colorsys.py. A directory the process's imports searched is host
    code."""
    import importlib.machinery
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.setitem(sys.path_importer_cache, str(lib), importlib.machinery.FileFinder(
        str(lib)))
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(lib) in compile_policy(policy_for(), ["true"], ctx).host_code


@pytest.mark.parametrize("started", ["script", "module"])
def test_an_entry_put_before_the_starting_directory_is_no_starting_directory(
        tmp_path, monkeypatch, started):
    """Attack 33 A6, F1: the first entry of sys.path was taken for the starting directory,
    whatever put it there. A host program that put the workspace first (to import a plugin)
    had it taken for its own, kept nowhere (the command rewrote the plugin); `python -m
    pytest` run in a project, which puts tests/ first, had the project (its real starting
    directory) taken for an import-path directory and refused. The starting directory is
    the one the interpreter put there, as its command line says."""
    ws, elsewhere = tmp_path / "ws", tmp_path / "app"
    for path in (ws / "tests", elsewhere):
        path.mkdir(parents=True)
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    if started == "script":  # (python app/host.py, which put the workspace first)
        monkeypatch.setattr(sys, "orig_argv", [sys.executable, str(elsewhere / "host.py")])
        monkeypatch.setattr(sys, "path", [str(ws), str(elsewhere), *sys.path[1:]])
        with pytest.raises(stockade.UnenforceableError) as refused:
            compile_policy(policy_for(), ["true"], ctx)
        assert f"is the write root {ws}" in refused.value.message
        return
    started_as(monkeypatch, ["-m", "pytest"], ws, [str(ws / "tests"), str(ws)], ws)
    assert compile_policy(policy_for(), ["true"], ctx).host_code == (str(ws / "tests"),)


def test_an_ordinary_project_venv_stays_writable(tmp_path):
    """The everyday job: a venv in the workspace that is not the host's own is the command's
    (pip install into it works); nothing of the host's code lies in the workspace."""
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    assert compile_policy(policy_for(), ["true"], ctx).host_code == ()
    assert sys.prefix not in str(tmp_path)


@pytest.mark.parametrize("pth", ["__editable__.atk-0.1.pth", ".atk.pth"])
def test_a_missing_directory_a_pth_file_names_in_the_workspace_is_refused(tmp_path, pth):
    """A .pth in the site-packages of the venv Stockade runs from (outside the workspace)
    names ws/src, which does not exist (an editable install whose sources are gone): `site`
    skips it, yet the host's next interpreter imports from it once it exists. A real command
    that would make it with a `stockade` package is refused, typed, before it runs, and the
    next interpreter's import path does not hold it. A hidden .pth too (issue 29 S2: Python
    before 3.13 reads it; failed before: the command made the package)."""
    env, ws = tmp_path / "venv", tmp_path / "ws"
    venv.EnvBuilder(symlinks=True, with_pip=False).create(env)
    ws.mkdir()
    site = next(env.glob("lib/python3*/site-packages"))
    (site / pth).write_text(f"# an editable install\n{ws / 'src'}\n")
    python = str(env / "bin" / "python")
    plant = "import os; os.makedirs('src/stockade'); open('src/stockade/__init__.py', 'w')"
    done = subprocess.run(
        [python, "-c", HOST, str(ws), "namespaces", "", PYTHON, "-c", plant],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got.get("refused") == "unenforceable:filesystem.host_code", got
    assert str(ws / "src") in got["message"] and ".pth" in got["message"]
    assert not (ws / "src").exists()
    after = subprocess.run([python, "-c", "import sys; print(sys.path)"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert str(ws / "src") not in after.stdout


# In a private mount namespace, the host's code shown in the workspace `ws` under a name no
# path tells (attacks 27, 28); the command writes there (`target`). `lib` (outside the
# workspace) is on the host's import path (PYTHONPATH). Forms: "bind" (lib bound at ws/pp),
# "overlay-upper" (lib an overlay whose upper layer lies in ws), "file-onto" (ws/sc.py bound
# onto lib/sitecustomize.py), "dir-onto" (ws/src/mypkg bound onto lib/mypkg), "symlink"
# (lib/sitecustomize.py a link to ws/sc.py), "start-root" (everyday: run from "/", a volume
# bound at ws/node_modules stays the command's).
SHOWN_HOST_CODE = """
import os, subprocess, sys
from dataclasses import replace
sys.path.append(sys.argv[1])  # (sys.path[0] stays the starting directory: "start-root")
import stockade
from conftest import PYTHON, policy_for
ws, lib, spare, isolation, form = sys.argv[2:]
def bind(source, at):
    subprocess.run(["mount", "--bind", source, at], check=True)
if form == "bind":
    os.mkdir(ws + "/pp")
    bind(lib, ws + "/pp")
    target, host = ws + "/pp/json.py", lib + "/json.py"
elif form == "overlay-upper":
    for name in ("up", "wk"):
        os.mkdir(ws + "/" + name)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={spare},upperdir={ws}/up,workdir={ws}/wk", lib], check=True)
    target, host = ws + "/up/json.py", lib + "/json.py"
elif form in ("file-onto", "symlink"):
    with open(ws + "/sc.py", "w") as f:
        f.write("X = 1\\n")
    if form == "symlink":
        os.symlink(ws + "/sc.py", lib + "/sitecustomize.py")
    else:
        open(lib + "/sitecustomize.py", "w").close()
        bind(ws + "/sc.py", lib + "/sitecustomize.py")
    target, host = ws + "/sc.py", lib + "/sitecustomize.py"
elif form == "dir-onto":
    for at in (ws + "/src/mypkg", lib + "/mypkg"):
        os.makedirs(at)
        open(at + "/__init__.py", "w").close()
    bind(ws + "/src/mypkg", lib + "/mypkg")
    target, host = ws + "/src/mypkg/__init__.py", lib + "/mypkg/__init__.py"
else:  # start-root
    os.mkdir(ws + "/node_modules")
    bind(spare, ws + "/node_modules")
    target, host = ws + "/node_modules/made", spare + "/made"
policy = replace(policy_for(pids=None), isolation=isolation)
try:
    r = stockade.run([PYTHON, "-c", "import sys; open(sys.argv[1], 'a').write('PLANTED')",
                      target], policy, workspace=ws)
    print("EXIT", r.exit_code, r.stderr.decode()[-200:])
except stockade.StockadeError as exc:
    print("REFUSED", exc.code, exc)
try:
    with open(host) as f:
        print("PLANTED" if "PLANTED" in f.read() else "CLEAN")
except FileNotFoundError:
    print("CLEAN")
"""


@pytest.mark.root_only("a bind or overlay mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ["namespaces", "landlock"])
@pytest.mark.parametrize("form", ["bind", "overlay-upper", "file-onto", "dir-onto", "symlink"])
def test_the_host_code_shown_in_the_workspace_under_another_name_is_kept(tmp_path, isolation,
                                                                         form):
    """Attacks 27 H1, H2 and 28 H5, H6, H8: the host's code shown in the workspace under a
    name no path tells — a directory on its import path (PYTHONPATH) bound there, an overlay
    over it whose upper layer lies there, a file or package of the workspace bound onto it or
    linked into it: the command wrote json.py, sitecustomize.py, a package, and the host's
    next Python ran it. Each such name is kept read-only like the place itself (the landlock
    tier, which has no view, refuses); an overlay whose layer the workspace holds is refused,
    typed."""
    ws, lib, spare = tmp_path / "ws", tmp_path / "lib", tmp_path / "spare"
    for path in (ws, lib, spare):
        path.mkdir()
    said = shown_host_code(tmp_path, isolation, form)
    assert said.endswith("CLEAN\n"), said
    if form == "overlay-upper":
        assert f"REFUSED unenforceable:filesystem.host_code unenforceable:filesystem." \
               f"host_code: the host's code at {lib} lies on an overlay (at {lib}) whose " \
               f"layer {ws}/up the root {ws} holds or lies in" in said, said
    elif isolation == "landlock":
        assert "REFUSED unenforceable:filesystem.host_code" in said and str(ws) in said, said
    else:
        assert "EXIT 1" in said and "Read-only file system" in said, said


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
def test_a_volume_in_the_workspace_stays_the_commands_when_run_from_the_root_directory(
        tmp_path):
    """Attack 28 F11: run from "/" (a container's default working directory), "/" is the
    program's starting directory, first on its import path; it is host code only whole, so a
    volume bound into the workspace (node_modules) stays the command's to write."""
    for name in ("ws", "lib", "spare"):
        (tmp_path / name).mkdir()
    said = shown_host_code(tmp_path, "namespaces", "start-root", cwd="/")
    assert "EXIT 0" in said and (tmp_path / "spare" / "made").read_text() == "PLANTED", said


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("form", ["prefix", "prefix-part", "link-chain"])
def test_the_interpreter_shown_in_the_workspace_under_another_name_is_kept(tmp_path, form):
    """Attack 28 V1, V2, V3: the interpreter's prefix (a venv: bin/python, pyvenv.cfg) bound
    into the workspace whole or its bin directory alone, or the interpreter reached through a
    chain of links (venv/bin/python -> lnk/python3 -> the real one) whose middle link's
    directory is bound there: the command replaced bin/python or the link, and the host ran
    its program next. The bound prefix is kept read-only there (request.host_code, which the
    view mounts read-only: the tests above); the link refuses, typed, naming it at the name
    the workspace shows it by."""
    ws, lnk, venv = tmp_path / "ws", tmp_path / "lnk", tmp_path / "venv"
    for path in (ws / "lnk", ws / "venv", lnk, venv / "bin"):
        path.mkdir(parents=True)
    (lnk / "python3").symlink_to(os.path.realpath(sys.executable))
    (venv / "bin" / "python").symlink_to(lnk / "python3")
    source, at = {"prefix": (venv, ws / "venv"), "prefix-part": (venv / "bin", ws / "venv"),
                  "link-chain": (lnk, ws / "lnk")}[form]
    script = f"""
import subprocess, sys
sys.path.insert(0, {REPO!r})
subprocess.run(["mount", "--bind", {str(source)!r}, {str(at)!r}], check=True)
if {form!r} == "link-chain":
    sys.executable = {str(venv / "bin" / "python")!r}
else:
    sys.prefix = sys.exec_prefix = {str(venv)!r}
from stockade.launch.compile import CompileContext, compile_policy
from stockade.policy import preset
try:
    request = compile_policy(preset("workspace-write"), ["true"],
                             CompileContext.current({str(ws)!r}))
    print("KEPT", *request.host_code)
except Exception as exc:
    print("REFUSED", exc)
"""
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = done.stdout
    if form == "link-chain":
        assert f"symbolic link {ws}/lnk/python3, inside a write root" in said, said
    else:
        assert said.startswith("KEPT") and f" {ws}/venv" in said, said


def shown_host_code(tmp_path, isolation: str, form: str, cwd: str | None = None) -> str:
    """What SHOWN_HOST_CODE printed, its mounts made in a private mount namespace."""
    lib = tmp_path / "lib"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{lib}"}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           SHOWN_HOST_CODE, os.path.dirname(__file__), str(tmp_path / "ws"),
                           str(lib), str(tmp_path / "spare"), isolation, form],
                          capture_output=True, text=True, timeout=180, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_bytecode_cache_prefix_in_the_workspace_is_host_code(tmp_path):
    """Attack 29 N4: with PYTHONPYCACHEPREFIX (direnv style) in the workspace, every module's
    bytecode, the standard library's and Stockade's too, is read from there: the command
    forged json's and the host's next `stockade` ran it. Kept read-only; a missing one, which
    the command could make, is refused, typed, naming the variable."""
    cache = tmp_path / ".pyc"
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path),
                         {"PYTHONPYCACHEPREFIX": str(cache)})
    with pytest.raises(stockade.UnenforceableError) as refused:
        compile_policy(policy_for(), ["true"], ctx)
    assert "unset PYTHONPYCACHEPREFIX" in refused.value.message
    cache.mkdir()
    assert str(cache) in compile_policy(policy_for(), ["true"], ctx).host_code


def imported(monkeypatch: pytest.MonkeyPatch, name: str, file: Path) -> None:
    """This process imports the module `name` from `file` by a finder of its own (as an
    editable install's or a plugin loader does), for the test's time."""
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, name, module)


def started_as(monkeypatch: pytest.MonkeyPatch, argv: list[str], started_in: Path,
               first: list[str], now_in: Path) -> None:
    """This process as a program started with `argv` in `started_in` (where it first
    imported Stockade), `first` at the top of its import path, now working in `now_in`."""
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, *argv])
    monkeypatch.setattr(stockade, "_started_in", str(started_in))
    monkeypatch.setattr(sys, "path", [*first, *sys.path[1:]])
    monkeypatch.chdir(now_in)


def editable_finder(monkeypatch: pytest.MonkeyPatch, name: str, path: Path) -> None:
    """What `pip install -e` of a flat layout installs (setuptools' finder, put on
    sys.meta_path by a .pth file's `import` line): a module holding MAPPING, name -> path."""
    finder = type(sys)(f"__editable___{name}_0_1_finder")
    finder.MAPPING = {name: str(path)}
    finder.Finder = type("_EditableFinder", (), {"__module__": finder.__name__})
    monkeypatch.setitem(sys.modules, finder.__name__, finder)
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder.Finder])


def test_a_package_an_editable_finder_maps_into_the_workspace_is_host_code(tmp_path,
                                                                         monkeypatch):
    """Attack 29 N2: `pip install -e` of a flat-layout project installs an import finder (a
    .pth file's `import` line) that maps the package to the workspace, where no path entry
    names it: the command rewrote it and the host's next program imported it. The finder's
    directories are host code: kept read-only."""
    package = tmp_path / "proj" / "myagent"
    package.mkdir(parents=True)
    editable_finder(monkeypatch, "myagent", package)
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(package) in compile_policy(policy_for(), ["true"], ctx).host_code


def test_the_files_a_link_tree_on_the_import_path_shows_are_host_code(tmp_path):
    """Attack 29 N2s: setuptools' strict editable install makes a tree of links in the
    workspace (its .pth names it) to each file of the project: the tree was kept read-only,
    the files it links to were not, and the command rewrote them. Each link's target in a
    write root is host code too."""
    tree, source = tmp_path / "build" / "tree", tmp_path / "src"
    for path in (tree / "myagent", source):
        path.mkdir(parents=True)
    (source / "core.py").write_text("X = 1\n")
    (tree / "myagent" / "core.py").symlink_to(source / "core.py")
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path),
                         {"PYTHONPATH": str(tree)})
    kept = compile_policy(policy_for(), ["true"], ctx).host_code
    assert str(tree) in kept and str(source / "core.py") in kept, kept


def test_a_module_an_editable_finder_maps_is_kept_with_its_bytecode_cache(tmp_path,
                                                                        monkeypatch):
    """Attack 30 N10: for a single-module project setuptools' finder maps the module's path
    without its suffix; that was taken for a missing directory (a false refusal), and once
    made, the module file beside it and its cached bytecode stayed writable. The file each
    import would take is host code; its missing `__pycache__`, and the names an import would
    take before it, are not made during the run (nothing is made on the host)."""
    module = tmp_path / "proj" / "mymod"
    module.parent.mkdir()
    module.with_suffix(".py").write_text("X = 1\n")
    editable_finder(monkeypatch, "mymod", module)
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    request = compile_policy(policy_for(), ["true"], ctx)
    cache = os.path.dirname(importlib.util.cache_from_source(str(module) + ".py"))
    assert request.host_code == (str(module) + ".py",), request.host_code
    assert {cache, str(module)} <= set(request.unmade), request.unmade
    assert not os.path.exists(cache)


def test_a_module_this_process_imported_from_the_workspace_is_host_code(tmp_path,
                                                                       monkeypatch):
    """Attack 30 N7: an editable install whose finder keeps its table its own way (hatchling's
    `editables`, scikit-build-core, meson-python) maps the program's package to the
    workspace: whatever finder found it, a module this process imported is host code."""
    package = tmp_path / "proj" / "myagent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    imported(monkeypatch, "myagent", package / "__init__.py")
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(package) in compile_policy(policy_for(), ["true"], ctx).host_code


def test_a_relative_bytecode_cache_prefix_is_host_code_where_it_resolves(tmp_path,
                                                                        monkeypatch):
    """Attack 30 N8: PYTHONPYCACHEPREFIX=.pyc, the host run from the project: Python joins it
    to the working directory at every import; it is host code there."""
    (tmp_path / ".pyc").mkdir()
    monkeypatch.chdir(tmp_path)
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path),
                         {"PYTHONPYCACHEPREFIX": ".pyc"})
    assert str(tmp_path / ".pyc") in compile_policy(policy_for(), ["true"], ctx).host_code


def test_a_module_imported_from_a_zip_file_in_the_workspace_keeps_the_archive(tmp_path,
                                                                             monkeypatch):
    """Attack 31 H3: a module this process imported from a zip file in the workspace: its
    path lies inside the archive, where no `__pycache__` can be made (the launch was refused,
    "Not a directory"). The archive is the host code, kept read-only."""
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as made:
        made.writestr("zipmod.py", "X = 1\n")
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.delitem(sys.modules, "zipmod", raising=False)
    importlib.import_module("zipmod")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(archive)])
    # (and no search record of it: the imported module alone names the archive)
    monkeypatch.delitem(sys.path_importer_cache, str(archive), raising=False)
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(archive) in compile_policy(policy_for(), ["true"], ctx).host_code


def test_a_module_below_the_starting_directory_is_host_code_unless_imported_through_it(
        tmp_path, monkeypatch):
    """Evidence row of attack 31: a host program run from a directory above the workspace
    (an agent started from ~, workspace ~/proj) whose package another finder imported from
    the workspace: the module lay below the starting directory, which is kept only whole,
    so it was kept nowhere. A module an import of its name through the starting directory
    takes stays the program's own (and the command's, where that directory is the
    workspace); any other is host code."""
    ws = tmp_path / "ws"
    package = ws / "proj" / "myagent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    (ws / "helper.py").write_text("Y = 1\n")
    for name, file in (("myagent", package / "__init__.py"), ("helper", ws / "helper.py")):
        imported(monkeypatch, name, file)
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(tmp_path), {})
    for start in (tmp_path, ws):
        monkeypatch.setattr(sys, "path", [str(start), *sys.path[1:]])
        monkeypatch.setattr(sys, "orig_argv", [sys.executable, str(start / "prog.py")])
        kept = compile_policy(policy_for(), ["true"], ctx).host_code
        assert str(package) in kept, (start, kept)
        assert (str(ws / "helper.py") in kept) == (start == tmp_path), (start, kept)


# A host program started in `app` (its starting directory, first on its import path) that
# imported `myagent` and `helper` through it; `ws` is the workspace. Forms: "package-link"
# (app/myagent a link to ws/myagent), "module-link" (app/helper.py a link to ws/helper.py),
# "bind" (ws/myagent bound at app/myagent), "own" (started in ws itself). Prints host_code.
THROUGH_START = """
import json, os, subprocess, sys
ws, app, form = sys.argv[1:]
if form == "package-link":
    os.symlink(ws + "/myagent", app + "/myagent")
elif form == "module-link":
    os.symlink(ws + "/helper.py", app + "/helper.py")
elif form == "bind":
    os.mkdir(app + "/myagent")
    subprocess.run(["mount", "--bind", ws + "/myagent", app + "/myagent"], check=True)
import helper, myagent  # noqa: E401, F401 (through the starting directory, or the workspace)
from conftest import policy_for
from stockade.launch.compile import CompileContext, compile_policy
ctx = CompileContext(ws, ws + "-home", os.path.dirname(ws), {})
print(json.dumps(compile_policy(policy_for(), ["true"], ctx).host_code))
"""


@pytest.mark.parametrize("form", [
    "package-link", "module-link", "own",
    pytest.param("bind", marks=pytest.mark.root_only("a bind mount needs root"))])
def test_a_module_reached_through_the_top_of_the_starting_directory_is_host_code(tmp_path,
                                                                                form):
    """Attack 32 S1, S1f, S2: the program's starting directory held a link to (or a mount
    of) a package or module of the workspace; an import of its name through the starting
    directory took it, so it was taken for the program's own and kept nowhere: the command
    rewrote it and the host's next run imported it. What an import through the starting
    directory takes is the program's own only where it lies there itself; started in the
    workspace, the workspace's own modules stay the command's."""
    ws, app = tmp_path / "ws", tmp_path / "app"
    for path in (ws / "myagent", app):
        path.mkdir(parents=True)
    (ws / "myagent" / "__init__.py").write_text("X = 1\n")
    (ws / "helper.py").write_text("Y = 1\n")
    if form not in ("module-link", "own"):
        (app / "helper.py").write_text("Y = 2\n")
    if form == "module-link":
        (app / "myagent").mkdir()
        (app / "myagent" / "__init__.py").write_text("X = 2\n")
    argv = [sys.executable, "-c", THROUGH_START, str(ws), str(app), form]
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", *argv] if form == "bind" else argv,
        cwd=ws if form == "own" else app, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [REPO, str(Path(__file__).parent)])})
    assert done.returncode == 0, done.stderr
    kept = json.loads(done.stdout)
    shown = {"package-link": ws / "myagent", "module-link": ws / "helper.py",
             "bind": ws / "myagent"}
    if form == "own":
        assert kept == [], kept
    else:
        assert str(shown[form]) in kept, kept


def test_a_module_below_a_prefix_is_host_code(tmp_path, monkeypatch):
    """Attack 32 P1-P3: a module the program imported from below the interpreter's prefix but
    from no directory on its import path (a write root below the prefix is allowed: a prefix
    holds more than code) was taken as covered by the prefix and kept nowhere."""
    prefix = tmp_path / "prefix"
    tool = prefix / "share" / "tool"
    tool.mkdir(parents=True)
    (tool / "plugin.py").write_text("X = 1\n")
    imported(monkeypatch, "plugin", tool / "plugin.py")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    ctx = CompileContext(str(tool), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(tool / "plugin.py") in compile_policy(policy_for(), ["true"], ctx).host_code


def test_a_package_a_finder_class_maps_is_host_code_unimported(tmp_path, monkeypatch):
    """Attack 32 E1: hatchling's `editables` keeps its table of packages on its finder class
    (`_redirections`); a package it maps into the workspace that this process has not
    imported yet was kept nowhere, and the command rewrote it before the host's next run
    imported it."""
    package = tmp_path / "proj" / "myagent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    finder = type("RedirectingFinder", (), {
        "_redirections": {"myagent": str(package / "__init__.py")},
        "find_spec": classmethod(lambda cls, name, path=None, target=None: None)})
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder])
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(package) in compile_policy(policy_for(), ["true"], ctx).host_code


def test_the_script_run_from_its_own_workspace_keeps_no_bytecode_cache(tmp_path, monkeypatch):
    """Attack 32 F1: a script run from its own workspace (`python ws/agent.py`) was taken
    for an imported module: its `__pycache__` in the workspace was made and kept read-only,
    though a script is never read from a cache. The script itself stays kept."""
    script = tmp_path / "agent.py"
    script.write_text("X = 1\n")
    main = type(sys)("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, str(script)])
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path[1:]])
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    request = compile_policy(policy_for(), ["true"], ctx)
    assert request.host_code == (str(script),), request.host_code
    assert not (tmp_path / "__pycache__").exists()
    assert not [name for name in request.unmade if "__pycache__" in name], request.unmade


# HOST, once it has imported `mod` from the file $IMPORTED by a finder of its own.
IMPORTED_THEN_RUN = """
import importlib.util, os, sys
sys.dont_write_bytecode = True  # (the host's own import makes no __pycache__ there)
spec = importlib.util.spec_from_file_location("mod", os.environ["IMPORTED"])
sys.modules["mod"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["mod"])
""" + HOST


def imported_then_run(module: Path, workspace: Path, isolation: str, weaken: str,
                      code: str) -> dict:
    """What HOST printed, run by this interpreter after importing `module`."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED_THEN_RUN, str(workspace), isolation, weaken, PYTHON,
         "-c", code], cwd=workspace.parent, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": REPO, "IMPORTED": str(module)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("weaken", ["", "host_code"])
def test_no_name_an_import_takes_first_is_made_beside_a_module_the_host_imported(tmp_path,
                                                                                weaken):
    """Attack 31 H1, H2: the host program imported ws/lib/mod.py (kept read-only as a file);
    the command made ws/lib/mod/__init__.py, or an extension module mod.<abi>.so, which an
    import of `mod` takes first, or a `__pycache__` holding forged bytecode, and the host's
    next run took it. None of those names is made during the run (each refused, recorded
    `filesystem.host_code`), nothing is made on the host before it, and the rest of the
    directory stays the command's. With the layer off (control) the same command makes them."""
    lib = tmp_path / "ws" / "lib"
    lib.mkdir(parents=True)
    (lib / "mod.py").write_text("X = 1\n")
    extension = "mod" + importlib.machinery.EXTENSION_SUFFIXES[0]
    plant = ATTEMPT + (
        "import os\n"
        "attempt('package', lambda: os.mkdir('lib/mod'))\n"
        f"attempt('extension', lambda: open('lib/{extension}', 'w').close())\n"
        "attempt('cache', lambda: os.mkdir('lib/__pycache__'))\n"
        "attempt('everyday', lambda: open('lib/notes.txt', 'w').close())\n")
    got = imported_then_run(lib / "mod.py", tmp_path / "ws", "namespaces", weaken, plant)
    assert got.get("exit") == 0, got
    outcomes = dict(line.split(": ", 1) for line in got["stdout"].splitlines())
    assert outcomes.pop("everyday") == "DONE"
    made = sorted(path.name for path in lib.iterdir())
    if weaken:
        assert set(outcomes.values()) == {"DONE"}, outcomes
        return
    assert set(outcomes.values()) == {"EACCES"}, outcomes
    assert made == ["mod.py", "notes.txt"], made
    assert [kind for kind, _ in got["violations"]] == ["filesystem.host_code"] * 3, got



@pytest.mark.parametrize("kind", ["imported", "pycache-prefix"])
def test_the_landlock_refusal_says_what_the_host_code_is_and_what_takes_it_out(tmp_path,
                                                                              kind):
    """A refusal names the knob that allows the launch: the landlock tier's refusal of a
    workspace holding host code says what that code is — a module the program imported, the
    bytecode cache prefix — and what takes it out of the write roots, not only "install
    Stockade elsewhere" (which would not help)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    if kind == "imported":
        (ws / "mod.py").write_text("X = 1\n")
        got = imported_then_run(ws / "mod.py", ws, "landlock", "", "open('made', 'w')")
        assert got.get("refused") == "unenforceable:filesystem.host_code", got
        assert "a module this process imported" in got["message"], got
        assert "keep what it imports out of the write roots" in got["message"], got
        assert not (ws / "made").exists()
        return
    from stockade.linux.backend import LinuxBackend
    (ws / ".pyc").mkdir()
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws),
                         {"PYTHONPYCACHEPREFIX": str(ws / ".pyc")})
    policy = policy_for(pids=None)
    request = compile_policy(replace(policy, isolation="landlock"), ["true"], ctx)
    with pytest.raises(stockade.UnenforceableError) as refused:
        LinuxBackend().tier("landlock").check(request)
    assert "the bytecode cache prefix" in refused.value.message
    assert "unset PYTHONPYCACHEPREFIX" in refused.value.message


def test_the_landlock_refusal_of_an_editable_hook_key_says_what_it_is_and_the_remedy(
        tmp_path, monkeypatch):
    """Attack 41 F1: setuptools' flat-layout editable install puts the relative key
    `__editable__.NAME.finder.__path_hook__` on sys.path; a program run from its workspace
    has it name a directory there, which the file system's hook would take in the next run
    (which has no cache entry for it): no false refusal, but the landlock tier, which
    cannot keep it unmade, says what it is and what allows the launch."""
    from stockade.linux.backend import LinuxBackend
    key = "__editable__.demo-0.1.finder.__path_hook__"
    monkeypatch.setattr(sys, "path", [*sys.path, key])
    monkeypatch.chdir(tmp_path)
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    request = compile_policy(replace(policy_for(pids=None), isolation="landlock"), ["true"],
                             ctx)
    assert str(tmp_path / key) in request.unmade
    with pytest.raises(stockade.UnenforceableError) as refused:
        LinuxBackend().tier("landlock").check(request)
    message = refused.value.message
    assert str(tmp_path / key) in message and "__path_hook__ is" in message, message
    assert "run the program from a directory outside the write roots" in message, message
    assert "isolation namespaces" in message, message


# In a private mount namespace: ws/lib bound at app/lib; an editable finder maps `mod` to
# app/lib/mod (outside the workspace, the same files). Prints the request's unmade names.
BOUND_MODULE = """
import json, os, subprocess, sys
ws, app = sys.argv[1:]
os.makedirs(app + "/lib")
subprocess.run(["mount", "--bind", ws + "/lib", app + "/lib"], check=True)
finder = type(sys)("__editable___mod_0_1_finder")
finder.MAPPING = {"mod": app + "/lib/mod"}
finder.Finder = type("_EditableFinder", (), {"__module__": finder.__name__, "find_spec":
                     classmethod(lambda cls, name, path=None, target=None: None)})
sys.modules[finder.__name__] = finder
sys.meta_path.append(finder.Finder)
from conftest import policy_for
from stockade.launch.compile import CompileContext, compile_policy
ctx = CompileContext(ws, ws + "-home", ws, {})
print(json.dumps(compile_policy(policy_for(), ["true"], ctx).unmade))
"""


@pytest.mark.root_only("a bind mount needs root")
def test_the_names_an_import_takes_first_are_unmade_under_every_name_of_the_module(tmp_path):
    """Attack 33 A4: an editable install maps `mod` to app/lib, a bind mount of ws/lib: the
    module was kept read-only under its name in the workspace, but the names an import takes
    before it were refused only beside a module whose own path lies in a write root, so the
    command made ws/lib/mod/__init__.py. They are refused under every name a write root
    shows the module by."""
    ws = tmp_path / "ws"
    (ws / "lib").mkdir(parents=True)
    (ws / "lib" / "mod.py").write_text("X = 1\n")
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", BOUND_MODULE,
         str(ws), str(tmp_path / "app")], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, str(Path(__file__).parent)])})
    assert done.returncode == 0, done.stderr
    unmade = json.loads(done.stdout)
    assert str(ws / "lib" / "mod") in unmade and str(ws / "lib" / "__pycache__") in unmade, \
        unmade


@pytest.mark.parametrize("started", ["-m", "-c"])
def test_the_starting_directory_is_where_the_program_started_not_where_it_went(
        tmp_path, monkeypatch, started):
    """Attack 34 B1, F5: the starting directory was judged from the working directory at
    launch. A program started with -m in app/ that put the workspace on its path and moved
    into it had the workspace taken for its own (kept nowhere: the command rewrote its
    plugin); one started in the workspace that moved into ws/build had its real starting
    directory, the workspace, taken for an import-path directory and refused. It is the
    directory the program was in when it first imported Stockade (and ws/build, which ""
    names at the program's later imports, is host code: attack 35 B8)."""
    ws, app = tmp_path / "ws", tmp_path / "app"
    for path in (ws / "build", app):
        path.mkdir(parents=True)
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, started, "tool"])
    if started == "-m":  # (started in app/, the workspace put first, then moved into it)
        monkeypatch.setattr(stockade, "_started_in", str(app))
        monkeypatch.setattr(sys, "path", [str(ws), str(app), *sys.path[1:]])
        monkeypatch.chdir(ws)
        with pytest.raises(stockade.UnenforceableError) as refused:
            compile_policy(policy_for(), ["true"], ctx)
        assert f"is the write root {ws}" in refused.value.message
        return
    monkeypatch.setattr(stockade, "_started_in", str(ws))  # (started in ws, moved below)
    monkeypatch.setattr(sys, "path", ["", *sys.path[1:]])
    monkeypatch.chdir(ws / "build")
    assert compile_policy(policy_for(), ["true"], ctx).host_code == (str(ws / "build"),)


def test_the_working_directory_empty_entry_names_is_host_code(tmp_path, monkeypatch):
    """Attack 35 B8: a program started with -c in app/ ("" first on its path) that moved into
    the workspace: "" names the workspace at each later import (the same process's `import
    csv` after the run, the next run doing the same), yet "" was taken for the starting
    directory alone. The workspace, a write root on the import path, is refused, saying
    what takes it out."""
    ws, app = tmp_path / "ws", tmp_path / "app"
    for path in (ws, app):
        path.mkdir()
    started_as(monkeypatch, ["-c", "..."], app, [""], ws)
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    with pytest.raises(stockade.UnenforceableError) as refused:
        compile_policy(policy_for(), ["true"], ctx)
    assert f"is the write root {ws}" in refused.value.message
    assert "python -P" in refused.value.message


def test_a_directory_searched_below_the_starting_directory_is_host_code(tmp_path, monkeypatch):
    """Attack 35 B9: an agent started with -m in ~ (kept only whole: it holds the workspace
    ~/proj) put ~/proj/plugins on its path for an optional import: a searched place below
    the starting directory was taken as covered by it, and the command planted a plugin the
    next run imported. It is host code; the program's own packages there (their `__path__`)
    stay the command's."""
    ws = tmp_path / "proj"
    for path in (ws / "plugins", ws / "mypkg"):
        path.mkdir(parents=True)
    (ws / "mypkg" / "__init__.py").write_text("X = 1\n")
    import importlib.machinery
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "agent"])
    monkeypatch.setattr(stockade, "_started_in", str(tmp_path))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path[1:]])
    for searched in (ws / "plugins", ws / "mypkg"):
        monkeypatch.setitem(sys.path_importer_cache, str(searched),
                            importlib.machinery.FileFinder(str(searched)))
    package = type(sys)("proj.mypkg")  # (imported through the starting directory)
    package.__file__, package.__path__ = str(ws / "mypkg" / "__init__.py"), [str(ws / "mypkg")]
    monkeypatch.setitem(sys.modules, "proj.mypkg", package)
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(tmp_path), {})
    assert compile_policy(policy_for(), ["true"], ctx).host_code == (str(ws / "plugins"),)


def test_a_missing_directory_the_imports_searched_is_not_made(tmp_path, monkeypatch):
    """Attack 34 B5a: the program put ws/plugins, missing, on its path while it tried an
    optional import; the command made it with the module, and the next run imported it.
    A searched place that is missing is not made during the run."""
    monkeypatch.setitem(sys.path_importer_cache, str(tmp_path / "plugins"), None)
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(tmp_path / "plugins") in compile_policy(policy_for(), ["true"], ctx).unmade


def test_a_relative_entry_a_path_hook_takes_is_host_code_where_it_names_a_file(
        tmp_path, monkeypatch):
    """Attack 34 B7: "overrides.zip" on sys.path, a zip file in the working directory that
    the zip importer's hook takes: relative entries a hook takes were all taken for hooks'
    own keys, and the command rewrote the archive."""
    with zipfile.ZipFile(tmp_path / "overrides.zip", "w") as made:
        made.writestr("overrides.py", "X = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path, "overrides.zip"])
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(tmp_path / "overrides.zip") in \
        compile_policy(policy_for(), ["true"], ctx).host_code


@pytest.mark.parametrize("plugins", ["there", "missing"])
def test_a_directory_a_package_was_given_besides_its_own_is_host_code(tmp_path, monkeypatch,
                                                                      plugins):
    """Attack 36 B10: a package outside the workspace whose loader added ws/.app/plugins to
    its `__path__` (every module there is imported as the package's): the directory was
    taken for one of the program's own packages and kept nowhere; the command planted a
    plugin the next run loaded. It is host code; missing, it is not made."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (outside / "hostpkg").mkdir(parents=True)
    (outside / "hostpkg" / "__init__.py").write_text("X = 1\n")
    (ws / ".app").mkdir(parents=True)
    if plugins == "there":
        (ws / ".app" / "plugins").mkdir()
    imported(monkeypatch, "hostpkg", outside / "hostpkg" / "__init__.py")
    sys.modules["hostpkg"].__path__ = [str(outside / "hostpkg"), str(ws / ".app" / "plugins")]
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    request = compile_policy(policy_for(), ["true"], ctx)
    got = request.host_code if plugins == "there" else request.unmade
    assert str(ws / ".app" / "plugins") in got, (request.host_code, request.unmade)


def test_a_removed_working_directory_is_no_crash(tmp_path, monkeypatch):
    """Attack 36 C1: a host program whose working directory was removed: the compile asked
    for it and crashed, FileNotFoundError; "" and relative entries then name nothing."""
    gone, ws = tmp_path / "gone", tmp_path / "ws"
    for path in (gone, ws):
        path.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.setattr(sys, "path", ["", "relative", *sys.path[1:]])
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    assert compile_policy(policy_for(), ["true"], ctx).host_code == ()


def test_a_working_directory_above_the_workspace_is_kept_only_whole(tmp_path, monkeypatch):
    """Attack 36 F7: a notebook kernel ("" on its path) started in ~/proj, the workspace,
    that moved to ~: its working directory, holding the workspace, was refused as a place
    of host code holding a write root. Like the starting directory it is kept only whole
    (the workspace stays the command's)."""
    ws = tmp_path / "proj"
    ws.mkdir()
    started_as(monkeypatch, ["-m", "kernel"], ws, [""], tmp_path)
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(tmp_path), {})
    assert compile_policy(policy_for(), ["true"], ctx).host_code == ()


@pytest.mark.parametrize("weaken", ["", "host_code"])
def test_a_module_below_a_working_directory_holding_the_workspace_is_host_code(tmp_path,
                                                                               weaken):
    """Attack 41 U2: a program ("" on its path, as a notebook kernel) started in app/ moved
    into the directory holding its workspace and loaded the plugin ws/plugins/myplug.py:
    a module below any place of host code was taken as covered by it, yet the working
    directory, holding the write root, is kept only whole (not at all), and the command
    rewrote the plugin the next run loaded. The module is host code of its own (with the
    layer off, the control, the command rewrites it)."""
    ws, app = tmp_path / "ws", tmp_path / "app"
    for path in (ws / "plugins", app):
        path.mkdir(parents=True)
    (ws / "plugins" / "myplug.py").write_text("X = 1\n")
    prelude = ("import importlib.util, os, stockade\n"
               f"os.chdir({str(tmp_path)!r})\n"
               "spec = importlib.util.spec_from_file_location('myplug', "
               "'ws/plugins/myplug.py')\n"
               "sys.modules['myplug'] = importlib.util.module_from_spec(spec)\n"
               "spec.loader.exec_module(sys.modules['myplug'])\n")
    got = run_after(prelude, ws, "attempt('write', lambda: open('plugins/myplug.py', 'w'))\n"
                    "attempt('everyday', lambda: open('notes.txt', 'w').close())\n", weaken,
                    app)
    assert got.pop("everyday") == "DONE"
    assert got["write"] == ("DONE" if weaken else "EROFS"), got
    assert (ws / "plugins" / "myplug.py").read_text() == ("" if weaken else "X = 1\n")


def test_a_directory_searched_below_a_working_directory_holding_the_workspace_is_host_code(
        tmp_path, monkeypatch):
    """Attack 41 U2 (the same for a directory once on the import path): the program, moved
    into the directory holding its workspace, searched ws/plugins for an optional import; a
    searched place below the working directory was taken as covered by it. It is host
    code."""
    ws, app = tmp_path / "ws", tmp_path / "app"
    for path in (ws / "plugins", app):
        path.mkdir(parents=True)
    started_as(monkeypatch, ["-c", "..."], app, [""], tmp_path)
    monkeypatch.setitem(sys.path_importer_cache, str(ws / "plugins"),
                        importlib.machinery.FileFinder(str(ws / "plugins")))
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    assert compile_policy(policy_for(), ["true"], ctx).host_code == (str(ws / "plugins"),)


@pytest.mark.parametrize("package", ["namespace", "made-from-a-spec", "relative-entry",
                                     "module-made-a-package"])
def test_a_directory_any_package_was_given_is_host_code(tmp_path, monkeypatch, package):
    """Attack 37 N1, N3, N2: a package with no `__init__` file (a namespace package, or one
    the program made from a spec) had every `__path__` entry taken for its own, and a
    relative entry was dropped: a plugin directory given to it in the workspace was kept
    nowhere, and the command planted a plugin the next run imported. Only its name's
    directory on the path it was found on is its own; any other entry, a relative one from
    the working directory, is host code. A module file made a package (attack 38 P1:
    `spec_from_file_location(..., submodule_search_locations=[])` of ws/.app/loader.py) owns
    no directory: its `__path__` is host code too."""
    ws, app = tmp_path / "ws", tmp_path / "app"
    for path in (ws / ".app" / "plugins", app / "hostns"):
        path.mkdir(parents=True)
    monkeypatch.chdir(ws)
    monkeypatch.setattr(sys, "path", [str(app), *sys.path[1:]])
    module = type(sys)("hostns")
    if package == "module-made-a-package":
        (ws / ".app" / "loader.py").write_text("")
        module.__file__ = str(ws / ".app" / "loader.py")
        module.__path__ = [str(ws / ".app")]
    elif package == "relative-entry":
        (app / "hostns" / "__init__.py").write_text("")
        module.__file__ = str(app / "hostns" / "__init__.py")
        module.__path__ = [str(app / "hostns"), ".app/plugins"]
    else:
        module.__path__ = [str(app / "hostns"), str(ws / ".app" / "plugins")]
    monkeypatch.setitem(sys.modules, "hostns", module)
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    given = ws / ".app" / ("" if package == "module-made-a-package" else "plugins")
    assert compile_policy(policy_for(), ["true"], ctx).host_code == (str(given).rstrip("/"),)


def test_a_missing_directory_a_pth_file_of_a_site_directory_added_at_run_time_names(
        tmp_path, monkeypatch):
    """Attack 39 S2: a program activated a venv outside the workspace at run time
    (`site.addsitedir`, as virtualenv's activate_this.py does); an editable install's .pth
    there names ws/src, missing, which `site` skipped: only the interpreter's own site
    directories' .pth files were read, so the command made ws/src/myproj.py and the next
    run imported it. The .pth files of every directory on the import path are read."""
    sitedir, ws = tmp_path / "venv-site", tmp_path / "ws"
    for path in (sitedir, ws):
        path.mkdir()
    (sitedir / "__editable__.myproj.pth").write_text(f"{ws / 'src'}\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(sitedir)])
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    with pytest.raises(stockade.UnenforceableError) as refused:
        compile_policy(policy_for(), ["true"], ctx)
    assert f"{ws / 'src'} (a directory a .pth file in site-packages names" in \
        refused.value.message, refused.value.message


def run_after(prelude: str, workspace: Path, code: str, weaken: str, cwd: Path) -> dict:
    """What HOST printed, run in `cwd` by this interpreter after `prelude`, the command
    `code` (its outcomes parsed as ATTEMPT prints them)."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys\nsys.dont_write_bytecode = True\n" + prelude + HOST,
         str(workspace), "namespaces", weaken, PYTHON, "-c", ATTEMPT + code], cwd=cwd,
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got.get("exit") == 0, got
    return dict(line.split(": ", 1) for line in got["stdout"].splitlines())


@pytest.mark.parametrize("weaken", ["", "host_code"])
def test_a_missing_relative_entry_a_hook_of_the_programs_own_takes_is_not_made(tmp_path,
                                                                              weaken):
    """Attack 40 T1: a program with a path hook of its own (a FileFinder wrapped) put
    "plugins", missing, on its path and ran the command from the workspace: a relative entry
    a hook other than the file system's took was taken for the hook's key and kept nowhere;
    the command made ws/plugins/myplugin.py and the next run imported it. Every relative
    entry names its directory, whatever hook takes it: not made during the run (with the
    layer off, the control, it is)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    prelude = WRAPPED_HOOK + "import os\nsys.path.append('plugins')\nos.chdir(sys.argv[1])\n"
    got = run_after(prelude, ws, "import os\nattempt('make', lambda: os.mkdir('plugins'))\n"
                    "attempt('everyday', lambda: open('notes.txt', 'w').close())\n", weaken,
                    tmp_path)
    assert got.pop("everyday") == "DONE"
    assert got["make"] == ("DONE" if weaken else "EACCES"), got
    assert (ws / "plugins").exists() == bool(weaken)


def test_a_relative_entry_a_hook_of_the_programs_own_takes_is_host_code(tmp_path,
                                                                         monkeypatch):
    """Attack 40 T1 (the compile): the same entry, missing, is not made; once there, kept."""
    namespace: dict = {}
    exec(WRAPPED_HOOK.replace("sys.path_importer_cache.clear()", ""), namespace)
    monkeypatch.setattr(sys, "path_hooks", [namespace["WrapFinder"], *sys.path_hooks[1:]])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path, "plugins"])
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(tmp_path / "plugins") in compile_policy(policy_for(), ["true"], ctx).unmade
    (tmp_path / "plugins").mkdir()
    assert str(tmp_path / "plugins") in compile_policy(policy_for(), ["true"], ctx).host_code


class PluginFinder:
    """A plugin loader's import finder (its shapes: attacks 40 T2, 41 U1)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        return None


class SlotsFinder(PluginFinder):
    __slots__ = ("directory",)


@pytest.mark.parametrize("held", ["str", "path-table", "path-list", "slots", "set", "keys",
                                  "path-entry"])
def test_a_path_an_import_finder_holds_is_host_code(tmp_path, monkeypatch, held):
    """Attack 40 T2: an import finder on sys.meta_path (a plugin loader; scikit-build-core's
    rebuilding editable finder, which runs cmake in its build directory at import) held its
    directory as a str attribute, or a table or list of pathlib.Path: only tables of str
    were read, and the command planted a plugin the next run imported. Attack 41 U1: nor
    were its `__slots__`, a set of paths, a table's keys, nor a path-entry finder a hook of
    the program's own made for an entry naming no directory ("myapp-plugins"). Every
    absolute path a finder holds is host code."""
    plugins = tmp_path / ".plugins"
    plugins.mkdir()
    (plugins / "extra.py").write_text("X = 1\n")
    finder = SlotsFinder() if held == "slots" else PluginFinder()
    if held in ("str", "slots", "path-entry"):
        finder.directory = str(plugins)
    elif held == "path-table":
        finder.table = {"extra": plugins / "extra.py"}
    elif held == "set":
        finder.dirs = {str(plugins)}
    elif held == "keys":
        finder.roots = {str(plugins): "myapp_"}
    else:
        finder.dirs = [plugins]
    if held == "path-entry":  # (and the workspace, where the program started, that a
        # path-entry finder searches: the command's, judged as the starting directory)
        started_as(monkeypatch, ["-m", "app"], tmp_path, [str(tmp_path)], tmp_path)
        searcher = PluginFinder()
        searcher.path = str(tmp_path)
        monkeypatch.setitem(sys.path_importer_cache, str(tmp_path), searcher)
        monkeypatch.setitem(sys.path_importer_cache, "myapp-plugins", finder)
    else:
        monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder])
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    kept = compile_policy(policy_for(), ["true"], ctx).host_code
    assert kept == ((str(plugins / "extra.py"),) if held == "path-table" else (str(plugins),))


def test_a_test_module_pytest_holds_stays_the_commands(tmp_path, monkeypatch):
    """`python -m pytest` in a project that is the workspace: pytest's assertion rewriter (a
    finder) holds the test modules it imported, which are the program's own (imported
    through its starting directory), not host code."""
    (tmp_path / "test_x.py").write_text("X = 1\n")
    started_as(monkeypatch, ["-m", "pytest"], tmp_path, [str(tmp_path)], tmp_path)
    imported(monkeypatch, "test_x", tmp_path / "test_x.py")
    rewriter = type("AssertionRewritingHook", (), {})()
    rewriter._rewritten_names = {"test_x": tmp_path / "test_x.py"}
    monkeypatch.setattr(sys, "meta_path", [rewriter, *sys.meta_path])
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert compile_policy(policy_for(), ["true"], ctx).host_code == ()


def test_a_module_loaded_by_a_relative_path_is_host_code(tmp_path, monkeypatch):
    """Attack 40 T3: a program loaded ws/hooks/agent_hooks.py by a relative path
    (SourceFileLoader, spec_from_loader): its `__file__` stays relative, and modules with
    one were skipped; the command rewrote it and the next run loaded it. Joined to the
    working directory, it is host code."""
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "agent_hooks.py").write_text("HOOK = 1\n")
    monkeypatch.chdir(tmp_path)
    loader = importlib.machinery.SourceFileLoader("agent_hooks", "hooks/agent_hooks.py")
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("agent_hooks",
                                                                             loader))
    loader.exec_module(module)
    module.__spec__ = None  # (its `__file__` alone names it, as a module made by hand may)
    monkeypatch.setitem(sys.modules, "agent_hooks", module)
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(tmp_path / "hooks" / "agent_hooks.py") in \
        compile_policy(policy_for(), ["true"], ctx).host_code


class PluginLoader(importlib.abc.Loader):
    """A plugin loader of a program's own: it reads the file it was given."""

    def __init__(self, path: str) -> None:
        self.path = path

    def exec_module(self, module: object) -> None:
        exec(compile(Path(self.path).read_text(), self.path, "exec"), vars(module))


@pytest.mark.parametrize("origin", ["absolute", "relative"])
def test_a_module_whose_spec_names_its_file_only_as_its_origin_is_host_code(tmp_path,
                                                                            monkeypatch,
                                                                            origin):
    """Attack 41 U3: a plugin loaded by a loader of the program's own through importlib's
    documented route, `spec_from_loader(name, loader, origin=path)`, has no `__file__` (its
    spec has no location): only `__file__` was read, and the command rewrote the plugin the
    next run loaded. The file its origin names is the module's."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "myplug.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    path = str(tmp_path / "plugins" / "myplug.py") if origin == "absolute" \
        else "plugins/myplug.py"
    spec = importlib.util.spec_from_loader("myplug", PluginLoader(path), origin=path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not hasattr(module, "__file__")
    monkeypatch.setitem(sys.modules, "myplug", module)
    ctx = CompileContext(str(tmp_path), str(tmp_path) + "-home", str(tmp_path), {})
    assert str(tmp_path / "plugins" / "myplug.py") in \
        compile_policy(policy_for(), ["true"], ctx).host_code


@pytest.mark.parametrize("relative", ["entry", "cached-finder", "pycache-prefix"])
def test_a_relative_place_is_host_code_where_the_next_run_resolves_it(tmp_path, monkeypatch,
                                                                      relative):
    """Attack 40 T4: a program started in the workspace put "tools" on its path (or
    PYTHONPYCACHEPREFIX=.pyc), imported from ws/tools, then moved to its own directory before
    it called Stockade: relative places were joined to the working directory at the call
    alone, while the next run, started in the workspace again, resolves them there; the
    command planted ws/tools/tools_extra.py. A relative place is host code from the starting
    directory too, and a cached finder's own directory (one made before a move) is."""
    ws, app = tmp_path / "ws", tmp_path / "app"
    for path in (ws / "tools", ws / ".pyc", app):
        path.mkdir(parents=True)
    first, env = [str(app)], {}
    if relative == "entry":
        first.append("tools")
    elif relative == "pycache-prefix":
        env = {"PYTHONPYCACHEPREFIX": ".pyc"}
    started_as(monkeypatch, [str(app / "host.py")], ws, first, app)
    if relative == "cached-finder":  # (started elsewhere: only the finder says where)
        monkeypatch.setattr(stockade, "_started_in", str(app))
        monkeypatch.setitem(sys.path_importer_cache, "tools",
                            importlib.machinery.FileFinder(str(ws / "tools")))
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(app), env)
    want = ws / (".pyc" if relative == "pycache-prefix" else "tools")
    assert compile_policy(policy_for(), ["true"], ctx).host_code == (str(want),)


# A package the program imports through a link into the workspace ($LIB/mypkg -> ws/src/mypkg,
# as `flit install --symlink` makes), which loads plugins from beside itself.
DOTDOT_PACKAGE = """import os
__path__.append(os.path.join(os.path.dirname(__file__), "..", "mypkg_plugins"))
"""


@pytest.mark.parametrize("weaken", ["", "host_code"])
def test_a_directory_after_dot_dot_through_a_link_is_not_made(tmp_path, weaken):
    """Attack 40 T5: the package's `__path__` got $LIB/mypkg/../mypkg_plugins, which the
    kernel resolves after the link, to ws/src/mypkg_plugins; it was collapsed lexically to
    $LIB/mypkg_plugins, outside the workspace, and the command made ws/src/mypkg_plugins
    with a plugin the next run imported. ".." is resolved as the kernel resolves it: the
    directory is not made during the run (with the layer off, the control, it is)."""
    ws, lib = tmp_path / "ws", tmp_path / "app" / "lib"
    for path in (ws / "src" / "mypkg", lib):
        path.mkdir(parents=True)
    (ws / "src" / "mypkg" / "__init__.py").write_text(DOTDOT_PACKAGE)
    (lib / "mypkg").symlink_to(ws / "src" / "mypkg")
    prelude = f"sys.path.insert(0, {str(lib)!r})\nimport mypkg\n"
    got = run_after(prelude, ws, "import os\n"
                    "attempt('make', lambda: os.mkdir('src/mypkg_plugins'))\n"
                    "attempt('everyday', lambda: open('notes.txt', 'w').close())\n", weaken,
                    tmp_path / "app")
    assert got.pop("everyday") == "DONE"
    assert got["make"] == ("DONE" if weaken else "EACCES"), got
    assert (ws / "src" / "mypkg_plugins").exists() == bool(weaken)


def test_a_directory_after_dot_dot_through_a_link_is_host_code(tmp_path, monkeypatch):
    """Attack 40 T5 (the compile): the same directory, there, is kept read-only."""
    ws, lib = tmp_path / "ws", tmp_path / "app" / "lib"
    for path in (ws / "src" / "mypkg", ws / "src" / "mypkg_plugins", lib):
        path.mkdir(parents=True)
    (ws / "src" / "mypkg" / "__init__.py").write_text(DOTDOT_PACKAGE)
    (lib / "mypkg").symlink_to(ws / "src" / "mypkg")
    imported(monkeypatch, "mypkg", lib / "mypkg" / "__init__.py")
    ctx = CompileContext(str(ws), str(tmp_path) + "-home", str(ws), {})
    assert str(ws / "src" / "mypkg_plugins") in \
        compile_policy(policy_for(), ["true"], ctx).host_code
