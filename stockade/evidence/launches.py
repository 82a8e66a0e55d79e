"""How rows launch their attacks: through the production path — compile the policy, ask the
backend whether it can enforce it, `execute` — once (most rows), from a caller process of its own
(whose streams, environment or descriptors are the row's bait, or which is then killed), or many
times at once (the soak). Every launcher also runs with no backend at all (`None`): the attack
on the host, with no sandbox, as a positive control.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stockade
from stockade.errors import StockadeError, UnavailableError, UnenforceableError
from stockade.evidence.judges import Denied, Expect, attempts, error, notes, worked_everywhere
from stockade.evidence.row import Launch, Launcher, Row
from stockade.evidence.scene import ATTACKS, NotRunnable, Scene
from stockade.evidence.watch import (
    AppendedFile,
    CallerTerminal,
    Finding,
    HelperGroup,
    group_processes,
    processes_with,
)
from stockade.launch.backend import Backend
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result, Violation
from stockade.policy import Policy, merge, policy_to_document, preset

SOAK_THREADS = 8
HOST_TIMEOUT = 120.0  # seconds an attack may run on the host before it is killed
CALLER_TIMEOUT = 120.0
_SCENE_VALUE = re.compile(r"\{scene:(\w+)\}")
PACKAGE_PARENT = str(Path(stockade.__file__).resolve().parent.parent)


def interpreter() -> tuple[str, str]:
    """(the Python that runs attacks, the root to grant for it): this interpreter's base
    installation, since a virtual environment's directory is not granted."""
    prefix = os.path.realpath(sys.base_prefix)
    running = os.path.realpath(sys.executable)
    if running.startswith(prefix + "/"):
        return running, prefix
    return os.path.join(prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"), prefix


def _with_scene_values(value: Any, scene: Scene) -> Any:
    """`value` (a policy override) with its {scene:name} placeholders filled."""
    if isinstance(value, str):
        return _SCENE_VALUE.sub(lambda m: scene.values[m.group(1)], value)
    if isinstance(value, Mapping):
        return {key: _with_scene_values(item, scene) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_with_scene_values(item, scene) for item in value]
    return value


def policy_for(row: Row, scene: Scene) -> Policy:
    """The row's preset with its overrides, plus read access to the attacks and Python, in
    the row's isolation."""
    base = preset(row.preset)
    document: dict[str, Any] = {section: dict(_with_scene_values(values, scene))
                                for section, values in row.policy.items()}
    filesystem = document.setdefault("filesystem", {})
    extra = [str(ATTACKS), interpreter()[1], *scene.read_roots, *filesystem.get("read", [])]
    filesystem["read"] = [*base.filesystem.read, *extra]
    if row.isolation != base.isolation:
        document["isolation"] = row.isolation
    return merge(base, document, file=f"evidence row {row.id}")


def argv_for(row: Row, scene: Scene, arguments: Sequence[str] | None = None) -> list[str]:
    """The attack's command line: its program, the marker, then its arguments (placeholders
    filled; an empty one dropped; one starting with `*` split into several)."""
    program = str(ATTACKS / row.attack)
    head = ["sh", program] if row.attack.endswith(".sh") else [
        interpreter()[0], "-E", "-s", "-B", program]
    words: list[str] = []
    for template in row.args if arguments is None else arguments:
        value = scene.expand(template.lstrip("*"))
        words += value.split() if template.startswith("*") else [value] if value else []
    return [*head, scene.marker, *words]


def context_for(scene: Scene, workspace: Path | None = None) -> CompileContext:
    return CompileContext(workspace=str(workspace or scene.ws), home=str(scene.home),
                          tmp=tempfile.gettempdir(), host_env=scene.host_env,
                          key_dir=scene.key_dir, passwd_home=scene.passwd_home)


def request_for(row: Row, scene: Scene, argv: list[str], workspace: Path | None = None
                ) -> LaunchRequest:
    return compile_policy(policy_for(row, scene), argv, context_for(scene, workspace),
                          stdin=scene.stdin)


def host_env_for(row: Row, scene: Scene) -> dict[str, str]:
    """The environment the attack has on the host: the caller's, with what the policy sets."""
    added = _with_scene_values(row.policy.get("env", {}).get("set", {}), scene)
    return {**scene.host_env, **added}


def run_on_host(argv: Sequence[str], env: Mapping[str, str], cwd: str,
                stdin: int | None = subprocess.DEVNULL) -> Result:
    """`argv` with no sandbox, in a session of its own, killed (its group) after HOST_TIMEOUT;
    as a Result."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=HOST_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    status = proc.returncode
    return Result(exit_code=status if status >= 0 else None,
                  signal=-status if status < 0 else None, stdout=out, stderr=err,
                  stdout_truncated=False, stderr_truncated=False, timed_out=False,
                  cancelled=False, duration=time.monotonic() - started, backend="host",
                  digest="", request_id="", args=list(argv))


def on_host(row: Row, scene: Scene, argv: list[str], workspace: Path | None = None) -> Launch:
    """The attack with no sandbox at all: as the caller, in the workspace."""
    stdin = 0 if scene.stdin == "inherit" else subprocess.DEVNULL
    return Launch(run_on_host(argv, host_env_for(row, scene), str(workspace or scene.ws), stdin))


def run_once(backend: Backend, request: LaunchRequest, scene: Scene) -> Launch:
    """Launch as the SandboxManager does: the backend must accept the request first. A host
    that cannot enforce it raises (the row is not run); other errors are the row's to judge."""
    return _settled(_executed(backend, scene, lambda: request))


def attack(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The default: the attack, once, under the row's policy (or on the host)."""
    if backend is None:
        return on_host(row, scene, argv_for(row, scene))
    return _settled(_executed(backend, scene, lambda: request_for(row, scene,
                                                                  argv_for(row, scene))))


def in_the_home(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack with the home directory (`{home}`) as its workspace, as a `stockade run`
    started in $HOME runs it (or on the host, there)."""
    argv = argv_for(row, scene)
    if backend is None:
        return on_host(row, scene, argv, scene.home)
    return _settled(_executed(backend, scene, lambda: request_for(row, scene, argv, scene.home)))


# The launch compiled by the scene's `{venv_python}`, as a `stockade run`
# installed there compiles it (its site-packages is the row's bait): the request, encoded, or
# the error that refused it, as JSON on stdout.
COMPILER = """
import json, sys
from stockade.errors import StockadeError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.policy import parse_policy
spec = json.loads(sys.argv[1])
try:
    request = compile_policy(parse_policy(spec["policy"]), spec["argv"],
                             CompileContext(**spec["context"]))
    print(json.dumps({"request": request.encode().decode()}))
except StockadeError as exc:
    print(json.dumps({"error": exc.code, "message": exc.message}))
"""


def compiled_in_the_venv(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack, its launch compiled by the interpreter of the scene's venv (COMPILER) and
    run here; a launch it refuses ends there, typed. (On the host: the attack as every
    row's.)"""
    if backend is None:
        return attack(row, scene, None)
    return _compiled_by([scene.values["venv_python"], "-c", COMPILER], row, scene, backend)


# Before COMPILER: the module `{module}` (a file argv[2] names, a package's __init__.py)
# imported as `{module_name}` (argv[3]) by a finder of its own, as an editable install's finder
# imports it (hatchling's `editables`), no path entry naming its directory (attack 30, N7).
IMPORTING = """
import importlib.util, sys
sys.dont_write_bytecode = True  # (the host's import writes nothing the scene watches)
spec = importlib.util.spec_from_file_location(sys.argv[3], sys.argv[2])
sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
"""
# Before COMPILER: setuptools' editable finder for a flat layout installed (its module, the
# file `{finder}`, as the install's .pth file's `import` line installs it), which maps
# packages to the workspace; none of them imported (attack 29, N2).
FINDING = """
import importlib.util, sys
sys.dont_write_bytecode = True
spec = importlib.util.spec_from_file_location("__editable___x_finder", sys.argv[2])
sys.modules[spec.name] = finder = importlib.util.module_from_spec(spec)
spec.loader.exec_module(finder)
finder.install()
"""
# Before COMPILER: `pkg` imported through the starting directory (first on the import path,
# as `python -c` and a script's directory put it there), which holds a link to it (attack 32,
# S1).
STARTED = """
import sys
sys.dont_write_bytecode = True
import pkg
"""
# Before COMPILER, started in the workspace: the relative entries "src" (a directory) and
# "overrides.zip" (a zip file, which the zip importer's path hook takes) put on the import
# path, a module imported through each (attack 33 A2, 34 B7).
RELATIVE = """
import sys
sys.dont_write_bytecode = True
sys.path[1:1] = ["src", "overrides.zip"]
import mod, overrides
"""
# Before COMPILER, started beside the workspace: `{lib}` (argv[2]) put on the import path
# for an import of `mod` through it, and the missing `{plugins}` (argv[3]) for an optional
# import, each taken off again: only sys.path_importer_cache remembers them (attack 33 A1,
# 34 B5a).
SEARCHED = """
import sys
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[2])
import mod
sys.path.remove(sys.argv[2])
sys.path.insert(0, sys.argv[3])
try:
    import plugin
except ImportError:
    pass
sys.path.remove(sys.argv[3])
"""
# Before COMPILER, started with -c ("" first on the import path) beside the workspace: Stockade
# and what COMPILER imports imported there (where Stockade takes the program to have
# started), then into `{sub}` (argv[2]), a directory in the workspace, which "" names at every
# later import, none of them before the compile (attack 35 B8).
MOVED = """
import json, os, sys
sys.dont_write_bytecode = True
import stockade.errors, stockade.launch.compile, stockade.policy
os.chdir(sys.argv[2])
"""
# Before COMPILER, started in the scene's root (which holds the workspace: a starting
# directory kept only whole): its own package `ws.mypkg` imported through it, and the
# workspace's `{plugins}` (argv[2]) put on the import path for an optional import and taken
# off again (attack 35 B9).
PLUGINS = """
import sys
sys.dont_write_bytecode = True
import ws.mypkg
sys.path.insert(0, sys.argv[2])
try:
    import site_plugins
except ImportError:
    pass
sys.path.remove(sys.argv[2])
"""
# Before COMPILER, started in `app` beside the workspace: its package `hostpkg` imported
# through it, and the workspace's `{plugins}` (argv[2]) added to the package's __path__, as a
# plugin loader does (every module there imports as hostpkg's), none imported before the
# compile (attack 36 B10).
EXTENDED = """
import sys
sys.dont_write_bytecode = True
import hostpkg
hostpkg.__path__.append(sys.argv[2])
"""
# Before COMPILER, started in `app` beside the workspace: its namespace package `hostns` (a
# directory with no __init__) imported through it and given the workspace's `{plugins}`
# (argv[2]) on its __path__, and a package `hostspec` the program made from a spec with no
# origin, as a plugin system does, given the missing `{extensions}` (argv[3]) (attack 37 N1,
# N3).
ORIGINLESS = """
import importlib.machinery, importlib.util, sys
sys.dont_write_bytecode = True
import hostns
hostns.__path__.append(sys.argv[2])
spec = importlib.machinery.ModuleSpec("hostspec", None, is_package=True)
spec.submodule_search_locations.append(sys.argv[3])
sys.modules["hostspec"] = importlib.util.module_from_spec(spec)
"""
# Before COMPILER, started in `app` beside the workspace: the workspace's module file
# `{loader}` (argv[2]) loaded as a package `hostplug`, its directory its __path__, as a plugin
# loader does with `spec_from_file_location(..., submodule_search_locations=[])` (attack 38
# P1).
AS_PACKAGE = """
import importlib.util, sys
sys.dont_write_bytecode = True
spec = importlib.util.spec_from_file_location("hostplug", sys.argv[2],
                                              submodule_search_locations=[])
sys.modules["hostplug"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
"""
# Before COMPILER, started in `app` beside the workspace: the site directory `{sitedir}`
# (argv[2]) added at run time, as virtualenv's activate_this.py does; a .pth file there names
# a missing workspace directory, which `site` skips (attack 39 S1, S2).
SITE_ADDED = """
import site, sys
sys.dont_write_bytecode = True
site.addsitedir(sys.argv[2])
"""

# Before COMPILER, started in `app` beside the workspace: import finders of a plugin loader's
# holding the directories of `{held}` (argv[2]) as their attributes, one shape each (a str, a
# table's pathlib.Path value, a list of them, a set, a table's key, a __slots__ slot), on
# sys.meta_path, and a path-entry finder a hook of the program's own made for an entry naming
# no directory, in sys.path_importer_cache, holding `entry` (attacks 40 T2, 41 U1).
HELD = """
import os, pathlib, sys
sys.dont_write_bytecode = True
held = sys.argv[2]
class PluginFinder:
    def find_spec(self, name, path=None, target=None):
        return None
class SlotsFinder(PluginFinder):
    __slots__ = ("directory",)
finder, slotted, entry = PluginFinder(), SlotsFinder(), PluginFinder()
finder.directory = os.path.join(held, "str")
finder.table = {"extra": pathlib.Path(held, "table")}
finder.dirs = [pathlib.Path(held, "list")]
finder.roots = {os.path.join(held, "set")}
finder.prefixes = {os.path.join(held, "keys"): "myapp_"}
slotted.directory = os.path.join(held, "slots")
entry.directory = os.path.join(held, "entry")
sys.meta_path += [finder, slotted]
sys.path_importer_cache["myapp-plugins"] = entry
"""

# A path hook of the program's own, for every entry: a FileFinder wrapped (attack 40 T1; the
# tests of the host-code check run it too).
WRAPPED_HOOK = """
import importlib._bootstrap_external, importlib.machinery, sys
class WrapFinder:
    def __init__(self, path):
        self.inner = importlib.machinery.FileFinder(
            path, *importlib._bootstrap_external._get_supported_file_loaders())
    def find_spec(self, name, target=None):
        return self.inner.find_spec(name, target)
    def invalidate_caches(self):
        self.inner.invalidate_caches()
sys.path_hooks.insert(0, WrapFinder)
sys.path_importer_cache.clear()
"""

# Before COMPILER, started in the workspace: Stockade and what COMPILER imports imported there
# (where Stockade takes the program to have started), WRAPPED_HOOK first, the relative entries
# "tools" and "plugins" (missing: that hook takes it, as it takes every entry) put on the import
# path, neither searched yet (a module imported from one is host code by its file), then a move
# to `{app}` (argv[2]) outside it: the next run, started in the workspace again, resolves both
# there (attack 40 T1, T4).
RELATIVE_MOVED = """
import json, os, sys
sys.dont_write_bytecode = True
import stockade.errors, stockade.launch.compile, stockade.policy
""" + WRAPPED_HOOK + """
sys.path += ["tools", "plugins"]
os.chdir(sys.argv[2])
"""

# Before COMPILER, started in `app` beside the workspace: `mypkg` imported through `{lib}`
# (argv[2]), where it is a link into the workspace; it gave its __path__
# "<its directory>/../mypkg_plugins" (attack 40 T5).
THROUGH_A_LINK = """
import sys
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[2])
import mypkg
"""

# Before COMPILER, started in `app` beside the workspace: a module loaded by the relative path
# "../ws/hooks/agent_hooks.py" (its __file__ stays relative; attack 40 T3), and the plugin
# `{plugin}` (argv[2]) loaded by a loader of the program's own through
# `spec_from_loader(name, loader, origin=path)`: no __file__, its path only its spec's origin
# (attack 41 U3).
BY_ORIGIN = """
import importlib.machinery, importlib.util, sys
sys.dont_write_bytecode = True
loader = importlib.machinery.SourceFileLoader("agent_hooks", "../ws/hooks/agent_hooks.py")
module = importlib.util.module_from_spec(importlib.util.spec_from_loader("agent_hooks", loader))
loader.exec_module(module)
sys.modules["agent_hooks"] = module
class PluginLoader:
    def __init__(self, path):
        self.path = path
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(compile(open(self.path).read(), self.path, "exec"), vars(module))
spec = importlib.util.spec_from_loader("myplug", PluginLoader(sys.argv[2]), origin=sys.argv[2])
sys.modules["myplug"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
"""

# Before COMPILER, started with -c ("" first on the import path) in `app` beside the
# workspace: Stockade and what COMPILER imports imported there (where Stockade takes the
# program to have started), then into `{root}` (argv[2]), the directory holding the
# workspace, as a notebook kernel moves, and the plugin `{plugin}` (argv[3]) loaded from there
# (attack 41 U2).
MOVED_ABOVE = """
import importlib.util, json, os, sys
sys.dont_write_bytecode = True
import stockade.errors, stockade.launch.compile, stockade.policy
os.chdir(sys.argv[2])
spec = importlib.util.spec_from_file_location("myplug", sys.argv[3])
sys.modules["myplug"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
"""


def compiled_after(prelude: str, *values: str, start: str = "") -> Launcher:
    """A launcher: the attack, its launch compiled by this interpreter started in the scene's
    root (or its directory `start`), after `prelude` ran there with the scene's `values` as its
    arguments (the workspace below its starting directory, as an agent run from ~ for a
    workspace in ~/proj); run here. (On the host: the attack as every row's.)"""
    def launch(row: Row, scene: Scene, backend: Backend | None) -> Launch:
        if backend is None:
            return attack(row, scene, None)
        return _compiled_by([sys.executable, "-c", prelude + COMPILER], row, scene, backend,
                            *(scene.values[name] for name in values),
                            cwd=scene.root / start)
    return launch


compiled_after_importing = compiled_after(IMPORTING, "module", "module_name")
compiled_beside_a_finder = compiled_after(FINDING, "finder")
compiled_started_through_a_link = compiled_after(STARTED, start="app")
compiled_with_relative_entries = compiled_after(RELATIVE, start="ws")
compiled_after_searching = compiled_after(SEARCHED, "lib", "plugins", start="app")
compiled_after_moving_in = compiled_after(MOVED, "sub", start="app")
compiled_after_searching_below_start = compiled_after(PLUGINS, "plugins")
compiled_after_extending_a_package = compiled_after(EXTENDED, "plugins", start="app")
compiled_after_giving_originless_packages = compiled_after(ORIGINLESS, "plugins", "extensions",
                                                           start="app")
compiled_after_loading_a_module_as_a_package = compiled_after(AS_PACKAGE, "loader", start="app")
compiled_after_adding_a_site_directory = compiled_after(SITE_ADDED, "sitedir", start="app")
compiled_beside_holding_finders = compiled_after(HELD, "held", start="app")
compiled_after_moving_out = compiled_after(RELATIVE_MOVED, "app", start="ws")
compiled_after_importing_through_a_link = compiled_after(THROUGH_A_LINK, "lib", start="app")
compiled_after_loading_by_origin = compiled_after(BY_ORIGIN, "plugin", start="app")
compiled_after_moving_above = compiled_after(MOVED_ABOVE, "root", "plugin", start="app")


def _compiled_by(command: list[str], row: Row, scene: Scene, backend: Backend,
                 *extra: str, cwd: Path | None = None) -> Launch:
    """The attack, its launch compiled by `command` (COMPILER's, with the spec and `extra`
    after it) in `cwd` (the scene's root), and run here; a launch it refuses ends there,
    typed."""
    argv = argv_for(row, scene)
    spec = {"policy": policy_to_document(policy_for(row, scene)), "argv": argv,
            "context": vars(context_for(scene))}
    done = subprocess.run([*command, json.dumps(spec), *extra],
                          env={**scene.host_env, "PYTHONPATH": PACKAGE_PARENT},
                          cwd=cwd or scene.root, capture_output=True, text=True,
                          timeout=HOST_TIMEOUT, check=False)
    if not done.stdout:
        raise NotRunnable(f"the compiling interpreter compiled nothing: {done.stderr[-300:]}")
    compiled = json.loads(done.stdout)
    if "error" in compiled:
        if compiled["error"].startswith("unenforceable:"):
            raise UnenforceableError(compiled["error"].removeprefix("unenforceable:"),
                                     compiled["message"])
        return Launch(error=StockadeError(compiled["error"], compiled["message"]))
    return run_once(backend, LaunchRequest.decode(compiled["request"].encode()), scene)


def _executed(backend: Backend, scene: Scene,
              request: Callable[[], LaunchRequest]) -> Result | Launch:
    """The Result of the request `request()` makes, or the Launch of a refusal the row judges
    (a host that cannot enforce it raises)."""
    try:
        made = request()
        backend.check(made)
        return execute(backend, made, cancel=scene.cancel)
    except (UnavailableError, UnenforceableError):
        raise
    except StockadeError as exc:
        return Launch(error=exc)


def _settled(result: Result | Launch) -> Launch:
    if isinstance(result, Launch):
        return result
    if result.changes is not None:
        # An overlaid run's change set holds only what the attack wrote: the row judges the
        # host's workspace, and nothing of it may stay pending in the user's state directory.
        result.changes.discard()
    return Launch(result)


def reviewed(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack in an overlaid workspace, then its change set reviewed on the host as
    `stockade changes` shows it (every change's line and diff, from one scan): one attempt,
    `review`, denied `ESCAPED` when no control character of what the attack planted reached
    the screen raw. The `review_escape` weakening (tests only) shows them as they are."""
    if backend is None:
        return Launch(error=StockadeError("no_review", "on the host there is no change set"))
    result = _executed(backend, scene, lambda: request_for(row, scene, argv_for(row, scene)))
    if isinstance(result, Launch):
        return result
    if result.changes is None:
        return Launch(result)  # (no overlay, or nothing written: the judge finds no attempt)
    from dataclasses import replace

    from stockade.lifecycle import changeview

    escaped = "review_escape" not in weakenings(backend)
    try:
        found = result.changes.changes()
        shown = "".join(f"{changeview.line(c, escaped=escaped)}\n" for c in found)
        shown += "".join(changeview.diff(c, escaped=escaped) for c in found)
    finally:
        result.changes.discard()
    raw = sorted({f"{ord(c):#04x}" for c in shown if ord(c) < 0x20 and c not in "\n\t"})
    line = (f"review: ALLOWED raw control characters on screen: {' '.join(raw)}" if raw else
            "review: denied ESCAPED")
    return Launch(replace(result, stdout=result.stdout + f"{line}\n".encode()))


def weakenings(backend: Backend | None) -> frozenset[str]:
    return frozenset(getattr(backend, "weaken", frozenset()))


def against_servers(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack, with Stockade's own servers listening inside the workspace, where it can
    reach them: a daemon on `daemon.sock` (in this process) and a CLI server on `cli.sock`
    (a process of its own, as `stockade daemon` forks it). Their peer check is what the row
    tests, behind the mask of host sockets in a root (unix_sockets); the `peer_check`
    weakening (tests only) switches it off."""
    from stockade.session.daemon import Daemon

    check = "peer_check" not in weakenings(backend)
    daemon = Daemon(str(scene.ws / "daemon.sock"), check_peers=check)
    daemon.bind()
    serving = threading.Thread(target=daemon.serve, daemon=True)
    serving.start()
    cli_path = scene.ws / "cli.sock"
    # (what a thin client of this interpreter sends, as `stockade run` is: the attack sends
    # the same, see helper_servers)
    (scene.ws / "cli.facts").write_text(subprocess.run(
        [sys.executable, "-c", "import json; from stockade.cliwire import program_facts; "
         "print(json.dumps(program_facts()))"], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": PACKAGE_PARENT}).stdout)
    cli = scene.watch(HelperGroup(subprocess.Popen(
        [sys.executable, "-c", "import sys; from stockade.cli import COMMAND_LINE, server; "
         "server.serve(sys.argv[1], COMMAND_LINE, check_peers=sys.argv[2] == 'check')",
         str(cli_path),
         "check" if check else "trust"], env={**os.environ, "PYTHONPATH": PACKAGE_PARENT},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True), "the CLI server"))  # (its group: it and what it forks)
    try:
        deadline = time.monotonic() + 60
        from stockade.linux import servercheck  # (POSIX-only: its rows run on Linux)

        while not servercheck.answers(str(cli_path)):
            if cli.process.poll() is not None or time.monotonic() > deadline:
                raise NotRunnable("the CLI server did not start here")
            time.sleep(0.05)
        return attack(row, scene, backend)
    finally:
        cli.end()
        daemon.stop()
        serving.join(30)


def served_by_a_cli_server(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack as `stockade run --json --policy` (the row's policy) of the client
    `{client}` (a script in the workspace), started in the scene's root (from the workspace,
    the editable hook key a test venv puts on the import path would be refused by the landlock
    tier first), runs it where a CLI server serves that client: one started as a run starts it
    (stockade/cli/autoserver.py), its state directory the scene's. The server's own backend
    makes the sandbox: no switch of the row's backend reaches it. A client the server did not
    serve (its waiting child still there after the run) makes the row not runnable: a run of
    its own proves nothing of the server."""
    if backend is None:
        return attack(row, scene, None)
    from stockade.cliwire import IDLE_ENV, SOCKET_NAME
    from stockade.linux import servercheck

    state = scene.root / "state"
    env = {**host_env_for(row, scene), "PYTHONPATH": PACKAGE_PARENT,
           "STOCKADE_STATE_DIR": str(state), IDLE_ENV: "600"}
    env.pop("STOCKADE_NO_SERVER", None)
    server = scene.watch(HelperGroup(subprocess.Popen(
        [sys.executable, "-P", "-m", "stockade.cli.autoserver"], cwd="/", env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True), "the CLI server"))
    try:
        deadline = time.monotonic() + 60
        # (one spare: one that went, as when it was started before the server could see it,
        # may still be seen)
        while not (servercheck.answers(str(state / SOCKET_NAME))
                   and len(waiting := _spares(server.process.pid)) == 1):
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise NotRunnable("the CLI server did not start here")
            time.sleep(0.05)
        policy = scene.root / "policy.json"
        policy.write_text(json.dumps(policy_to_document(policy_for(row, scene))))
        done = subprocess.run(
            [sys.executable, scene.values["client"], "run", "--json", "--policy", str(policy),
             "--workspace", str(scene.ws), "--", *argv_for(row, scene)], env=env,
            cwd=scene.root, stdin=subprocess.DEVNULL, capture_output=True,
            timeout=HOST_TIMEOUT, check=False)
        deadline = time.monotonic() + 10  # (the child that served exits after its answer)
        while waiting <= _spares(server.process.pid):
            if time.monotonic() > deadline:
                raise NotRunnable("the CLI server did not serve the client")
            time.sleep(0.05)
    finally:
        server.end()
    summary = json.loads(done.stdout or b"{}")
    if "error" in summary:
        code, message = summary["error"]["code"], summary["error"]["message"]
        if code.startswith("unenforceable:"):
            raise UnenforceableError(code.removeprefix("unenforceable:"), message)
        return Launch(error=StockadeError(code, message))
    if "exit_code" not in summary:
        raise NotRunnable(f"the client printed no result: {done.stderr[-300:]!r}")
    return Launch(summarised(summary, summary["stdout"].encode(), summary["stderr"].encode()))


def _spares(server: int) -> set[int]:
    """The CLI server's children, the spare waiting for a request (it leaves once it took
    one, and the server forks the next; a client turned away leaves it waiting)."""
    found = set()
    for pid in group_processes(server):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat", "rb") as stat:
                # (the parent's pid: the second field after the command's parenthesis)
                if int(stat.read().rpartition(b")")[2].split()[1]) == server:
                    found.add(pid)
    return found


def planted_servers(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack plants cli.sock and daemon.sock in `{ws}/state` and listens; meanwhile the
    host's clients take that directory for their state directory: `stockade run` (a process
    of its own, with a secret in its environment) and a session list. The clients' server
    check is what the row tests; the `server_check` weakening (tests only) switches it off.
    The attack stops listening once `{ws}/done` appears."""
    check = "server_check" not in weakenings(backend)
    state = scene.ws / "state"
    launched: list[Launch] = []
    planting = threading.Thread(target=lambda: launched.append(attack(row, scene, backend)))
    planting.start()
    try:
        deadline = time.monotonic() + 60
        # (seen, not connected to: a connection of ours would count as a client's)
        while planting.is_alive() and not all(
                (state / name).exists() for name in ("cli.sock", "daemon.sock")):
            if time.monotonic() > deadline:
                raise NotRunnable("the planted servers did not start listening")
            time.sleep(0.05)
        if planting.is_alive():
            _host_clients(state, check)
    finally:
        (scene.ws / "done").touch()
        planting.join(HOST_TIMEOUT)
    if not launched:
        raise NotRunnable("the planting attack did not end")
    return launched[0]


def _host_clients(state: Path, check: bool) -> None:
    """`stockade run` and `stockade session list` on the host, their state directory `state`
    (a run refused as soon as it runs here: only what it would send matters)."""
    from stockade.session.client import DaemonClient

    env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT, "STOCKADE_STATE_DIR": str(state),
           "STOCKADE_EVIDENCE_SECRET": secrets.token_hex(8)}
    env.pop("STOCKADE_NO_SERVER", None)
    subprocess.run([sys.executable, "-c", "import sys; from stockade import program; "
                    f"sys.exit(program.main(check_server={check}))", "run", "--preset",
                    "no-such-preset", "--", "true"], env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=HOST_TIMEOUT,
                   check=False)
    with contextlib.suppress(StockadeError):
        DaemonClient(str(state / "daemon.sock"), check_server=check).sessions()


def planted_changes(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack plants a change set in `{ws}/state` whose root is `{outside}` (with a key
    of its own there, sealing it: "keyed"); meanwhile the host applies the newest change set
    of that state directory and writes its answer ("applied", or the refusal's code) to
    `{ws}/answer`. The store check, the seal and the seal key's place are what the rows test;
    the `change_store_check`, `change_seal` and `change_seal_key` weakenings (tests only)
    switch them off (the last verifies under the key in `{ws}/state`)."""
    from stockade.lifecycle import changes

    check = "change_store_check" not in weakenings(backend)
    check_seal = "change_seal" not in weakenings(backend)
    key_dir = str(scene.ws / "state") if "change_seal_key" in weakenings(backend) else None
    meta = scene.ws / "state" / "changes" / ("0" * 32) / "meta.json"
    launched: list[Launch] = []
    answer = "error"  # (the host never got to apply)
    planting = threading.Thread(target=lambda: launched.append(attack(row, scene, backend)))
    planting.start()
    try:
        deadline = time.monotonic() + 60
        while planting.is_alive() and not meta.exists():
            if time.monotonic() > deadline:
                raise NotRunnable("the planted change set did not appear")
            time.sleep(0.05)
        if "keyed" in row.args:
            _sealed_as_stockade_seals(scene.ws / "state", meta)
        try:
            changes.load(state=str(scene.ws / "state"), check_store=check).apply(
                check_seal=check_seal, key_dir=key_dir)
            answer = "applied"
        except StockadeError as exc:
            answer = exc.code
    finally:
        (scene.ws / "answer.part").write_text(answer)  # (whole, by a rename: the attack
        (scene.ws / "answer.part").rename(scene.ws / "answer")  # reads it once it is there)
        planting.join(HOST_TIMEOUT)
    if not launched:
        raise NotRunnable("the planting attack did not end")
    return launched[0]


def _sealed_as_stockade_seals(state: Path, meta: Path) -> None:
    """NotRunnable unless the planted set's seal verifies under the key planted beside it:
    a forgery Stockade would not make under that key proves nothing of where apply looks."""
    from stockade.lifecycle import changeseal

    try:
        changeseal.verify(str(state), json.loads(meta.read_text()),
                          [(meta.parent / "base-0.json").read_bytes()])
    except (StockadeError, OSError, ValueError) as exc:
        raise NotRunnable(f"the planted set's seal is not one Stockade makes ({exc})") from None


# A caller of its own: a process that compiles nothing (it gets the request, encoded) and runs
# it as `stockade run` does: forking its sandbox itself, relaying the command's output to its
# own streams. Its environment, streams and descriptors are the launching process's that the
# row baits. It prints the Result as JSON (or the error that stopped it) on the descriptor its
# third argument names.
CALLER = """
import json, os, sys
from stockade.errors import StockadeError
from stockade.launch.manager import execute, isolated
from stockade.launch.request import LaunchRequest
from stockade.linux import zygote
from stockade.linux.backend import LinuxBackend
weaken = frozenset(filter(None, sys.argv[2].split(",")))
zygote.fork_directly()
request = LaunchRequest.decode(sys.argv[1].encode())
try:
    backend = isolated(LinuxBackend(weaken=weaken), request.isolation)
    backend.check(request)  # (as the SandboxManager launches: what it cannot enforce, refused)
    summary = execute(backend, request, stdio_inherit=True).to_json()
except StockadeError as exc:
    summary = {"error": exc.code, "message": exc.message}
with os.fdopen(int(sys.argv[3]), "w") as out:
    json.dump(summary, out)
"""


@dataclass
class Caller:
    """A caller process running one launch (see CALLER), or the attack itself on the host."""

    proc: subprocess.Popen
    reply: int   # our end of the pipe it answers on (-1: on the host, no answer)
    started: float

    def result(self, shown: bytes) -> Launch:
        """Wait for it; the Launch, with `shown` (what reached its stdout) as the output."""
        if self.reply < 0:
            try:
                self.proc.wait(CALLER_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            status = self.proc.returncode
            return Launch(Result(
                exit_code=status if status >= 0 else None,
                signal=-status if status < 0 else None, stdout=shown, stderr=b"",
                stdout_truncated=False, stderr_truncated=False, timed_out=False,
                cancelled=False, duration=time.monotonic() - self.started, backend="host",
                digest="", request_id=""))
        with os.fdopen(self.reply) as reply:
            body = reply.read()
        try:
            self.proc.wait(CALLER_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not body:
            return Launch(error=StockadeError("caller_failed", "the caller printed no result"))
        summary = json.loads(body)
        if "error" in summary:
            return Launch(error=StockadeError(summary["error"], summary["message"]))
        return Launch(summarised(summary, shown))


def summarised(summary: dict, stdout: bytes, stderr: bytes = b"") -> Result:
    """The Result a run's JSON summary (Result.to_json) says, its command's output `stdout`
    and `stderr`."""
    return Result(
        exit_code=summary["exit_code"], signal=summary["signal"], stdout=stdout, stderr=stderr,
        stdout_truncated=False, stderr_truncated=False, timed_out=summary["timed_out"],
        cancelled=summary["cancelled"], duration=summary["duration"],
        backend=summary["backend"], digest=summary["digest"], request_id=summary["request_id"],
        violations=tuple(Violation(**v) for v in summary["violations"]),
        enforced=summary["enforced"], network_log=tuple(summary["network_log"]))


def start_caller(row: Row, scene: Scene, backend: Backend | None,
                 streams: Mapping[str, Any], pass_fds: Sequence[int] = ()) -> Caller:
    """The row's launch in a caller of its own with `streams` (stdin, stdout, stderr) and
    `pass_fds`, its environment the scene's host environment; with no backend, the attack
    itself in its place (a positive control)."""
    if backend is None:
        return Caller(subprocess.Popen(argv_for(row, scene), env=host_env_for(row, scene),
                                       cwd=scene.ws, pass_fds=pass_fds, start_new_session=True,
                                       **streams), -1, time.monotonic())
    request = request_for(row, scene, argv_for(row, scene))
    read_end, write_end = os.pipe()
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, request.encode().decode(),
         ",".join(sorted(weakenings(backend))), str(write_end)],
        env={**scene.host_env, "PYTHONPATH": PACKAGE_PARENT},
        pass_fds=[write_end, *pass_fds], start_new_session=True, **streams)
    os.close(write_end)
    return Caller(caller, read_end, time.monotonic())


def from_the_callers_streams(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack run by a caller whose streams are the host's: the scene's CallerTerminal
    (stdin, stdout and stderr) or AppendedFile (stdout). What the command printed is what
    reached them. The `stdio_relay` weakening (tests only) hands them to the command."""
    terminal = next((w for w in scene.watches if isinstance(w, CallerTerminal)), None)
    appended = next((w for w in scene.watches if isinstance(w, AppendedFile)), None)
    with contextlib.ExitStack() as stack:
        if terminal is not None:
            streams: dict[str, Any] = {"stdin": terminal.slave, "stdout": terminal.slave,
                                       "stderr": terminal.slave}
        else:
            assert appended is not None
            log = stack.enter_context(open(appended.path, "ab"))
            streams = {"stdin": subprocess.DEVNULL, "stdout": log,
                       "stderr": subprocess.DEVNULL}
        caller = start_caller(row, scene, backend, streams)
        launch = caller.result(b"")
    shown = terminal.shown() if terminal is not None else appended.path.read_bytes()
    return _shown(launch, shown)


def _shown(launch: Launch, shown: bytes) -> Launch:
    if launch.result is None:
        return launch
    from dataclasses import replace
    return replace(launch, result=replace(launch.result, stdout=shown))


def from_a_caller(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack run by a caller of its own (its environment is the scene's host
    environment: the row's secrets are in it), as `stockade run` runs it."""
    caller = start_caller(row, scene, backend, {"stdin": subprocess.DEVNULL,
                                                "stdout": subprocess.PIPE,
                                                "stderr": subprocess.DEVNULL})
    assert caller.proc.stdout is not None
    shown = caller.proc.stdout.read()
    return caller.result(shown)


def with_an_inheritable_socket(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack run by a caller holding one end of a connected socket pair, inheritable, as
    a launching program that leaks a descriptor would (the scene's InheritedSocket): the
    caller forks its sandbox itself, so the leaked descriptor is in the sandbox's first process
    unless Stockade closes it. Its number is the attack's argument."""
    from stockade.evidence.servers import InheritedSocket

    leaked = next(w for w in scene.watches if isinstance(w, InheritedSocket))
    scene.values["leaked_fd"] = str(leaked.fd)
    caller = start_caller(row, scene, backend, {"stdin": subprocess.DEVNULL,
                                                "stdout": subprocess.PIPE,
                                                "stderr": subprocess.DEVNULL},
                          pass_fds=[leaked.fd])
    assert caller.proc.stdout is not None
    shown = caller.proc.stdout.read()
    return caller.result(shown)


def in_a_guest(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack in a QEMU guest (`containment = "vm"`, docs/vm.md) under the row's policy;
    not run where this host cannot boot one. (On the host: the attack as every row's.)"""
    if backend is None:
        return attack(row, scene, None)
    from stockade.vm.qemu import VmSandbox, host_kernel

    try:
        host_kernel()
    except StockadeError as exc:
        raise NotRunnable(f"no VM guest here: {exc.message}") from None
    try:
        with VmSandbox(policy_for(row, scene), workspace=scene.ws) as guest:
            return Launch(guest.run(argv_for(row, scene), timeout=120))
    except (UnavailableError, UnenforceableError):
        raise
    except StockadeError as exc:
        return Launch(error=exc)


def owner_killed(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """A caller of its own (as `stockade run`), killed with SIGKILL once the attack has said
    its daemon started and both run. (Its output is read until then: killed before the
    attack's last write, the attack would die of SIGPIPE, and its keeper would end the tree
    whatever the lifeline did.)"""
    caller = start_caller(row, scene, backend, {"stdin": subprocess.DEVNULL,
                                                "stdout": subprocess.PIPE,
                                                "stderr": subprocess.DEVNULL})
    program = str(ATTACKS / row.attack)

    def sandboxed() -> int:  # (the caller's forks carry the marker too, not as a word)
        return len(processes_with(scene.marker, word=program))

    started = time.monotonic()
    deadline = started + 60  # (a bound, not a wait: a loaded host starts slowly)
    assert caller.proc.stdout is not None
    said = _said(caller.proc.stdout.fileno(), b"daemon: note started", deadline)
    # (the sample that ends the wait is the one kept: /proc read again a moment later can
    # miss the daemon, forked that instant, while its parent is already gone)
    while (running := sandboxed()) < 2 and time.monotonic() < deadline \
            and caller.proc.poll() is None:
        time.sleep(0.02)
    waited = time.monotonic() - started
    caller.proc.send_signal(signal.SIGKILL)
    caller.proc.wait()
    caller.proc.stdout.close()
    if caller.reply >= 0:
        os.close(caller.reply)
    return Launch(facts={"running": running, "owner_status": caller.proc.returncode,
                         "waited": waited, "said": said})


def _said(fd: int, line: bytes, deadline: float) -> bool:
    """Whether `line` came out of `fd` before its end or `deadline`."""
    seen = b""
    while line not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return False
        chunk = os.read(fd, 4096)
        if not chunk:
            return False
        seen += chunk
    return True


@dataclass(frozen=True)
class OwnerKilled(Expect):
    """The attack and its daemon ran when their owner was killed; the host side (no
    survivors) is the mechanism's evidence."""

    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        running, status = launch.facts["running"], launch.facts["owner_status"]
        text = (f"{running} sandboxed processes running (attack and daemon) when the owner "
                f"was killed (owner status {status})")
        if running < 2 or status != -signal.SIGKILL or not launch.facts["said"]:
            said = "" if launch.facts["said"] else ", the attack never said its daemon started"
            return error(f"{text}, after {launch.facts['waited']:.1f} s{said}")
        return Finding(True, text)

    def describe(self) -> str:
        return "host side: no process of the sandbox survives its owner (lifeline)"

    def worked(self, launch: Launch, host: Sequence[Finding],
               attempted: Mapping[str, str], name: Any) -> Finding:
        hit = [f.text for f in host if not f.ok and not f.error]
        return Finding(bool(hit), "; ".join(hit) or "nothing survived")


def soak(count: int) -> Launcher:
    """`count` launches, `SOAK_THREADS` at a time, each in its own workspace holding a token of
    its own, each trying to read three neighbours' tokens."""
    def launch(row: Row, scene: Scene, backend: Backend | None) -> Launch:
        workspaces = sorted((scene.root / "soak").iterdir())
        tokens = [secrets.token_hex(8) for _ in workspaces]
        for ws, token in zip(workspaces, tokens, strict=True):
            (ws / "token").write_text(token)

        def one(index: int) -> Launch:
            others = [str(workspaces[(index + step) % count] / "token") for step in (1, 2, 3)]
            argv = argv_for(row, scene, others)
            if backend is None:
                return on_host(row, scene, argv, workspaces[index])
            return run_once(backend, request_for(row, scene, argv, workspaces[index]), scene)

        with ThreadPoolExecutor(SOAK_THREADS) as pool:
            launches = list(pool.map(one, range(count)))
        errors = [str(item.error) for item in launches if item.error]
        runs = tuple(item.result for item in launches if item.result)
        kept = [(ws / "token").read_text() if (ws / "token").exists() else "" for ws in workspaces]
        return Launch(runs=runs, facts={"tokens": tokens, "kept": kept, "errors": errors})
    return launch


@dataclass(frozen=True)
class Soak(Denied):
    """Every launch ran (with its own request id), read its own token and no neighbour's."""

    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        tokens, errors = launch.facts["tokens"], launch.facts["errors"]
        if errors:
            return error(f"{len(errors)} launches failed: {errors[0]}")
        verdicts = [self.check(run) for run in launch.runs]
        escaped = [f.text for f in verdicts if not f.ok and not f.error]
        if escaped:
            return Finding(False, "; ".join(escaped[:3]))
        broken = [f.text for f in verdicts if f.error]
        if broken:
            return error("; ".join(broken[:3]))
        ids = {run.request_id for run in launch.runs}
        problems = []
        if len(ids) != len(tokens):
            problems.append(f"only {len(ids)} distinct request ids for {len(tokens)} launches")
        reported = [notes(run).get("token") for run in launch.runs]
        if sorted(reported, key=str) != sorted(tokens) or launch.facts["kept"] != tokens:
            problems.append("a launch did not see its own token, or one changed")
        if problems:
            return Finding(False, "; ".join(problems))
        return Finding(True, f"{len(launch.runs)} launches, {len(ids)} distinct request ids, "
                             f"each read its own token, "
                             f"{sum(len(attempts(run)) for run in launch.runs)} neighbour "
                             f"reads denied ({self.check(launch.runs[0]).text})")

    def describe(self) -> str:
        return (f"{super().describe()}; disjoint request ids; no residue (processes, /tmp, "
                "mounts)")

    def worked(self, launch: Launch, host: Sequence[Finding],
               attempted: Mapping[str, str], name: Any) -> Finding:
        found = [worked_everywhere(run, {}, name) for run in launch.runs]
        bad = [f.text for f in found if not f.ok]
        if bad or not found:
            return Finding(False, f"{len(bad)} of {len(found)} launches did not read their "
                                  f"neighbours: {bad[:1]}")
        reads = sum(len(attempts(run)) for run in launch.runs)
        return Finding(True, f"{len(found)} launches read {reads} neighbour tokens")


def marker_processes(scene: Scene) -> Iterator[int]:
    """Processes of this host carrying the scene's marker, but never this one."""
    return (pid for pid in processes_with(scene.marker) if pid != os.getpid())


def through_stand_ins(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """The attack, the allowlist proxy resolving names and connecting through the scene's
    stand-ins (setups.stand_in_network), and verifying intercepted hosts with its CA."""
    return attack(row, scene, _with_stand_ins(scene, backend))


def _with_stand_ins(scene: Scene, backend: Backend | None) -> Backend | None:
    with_stand_ins = getattr(backend, "with_stand_ins", None)
    if with_stand_ins is not None and scene.stand_ins is not None:
        return with_stand_ins(*scene.stand_ins, scene.upstream_ca)
    return backend


def approved(row: Row, scene: Scene, backend: Backend | None) -> Launch:
    """As `through_stand_ins`, the caller's approval function (the scene's web.Approver)
    asked about every destination network.allow leaves out, as stockade.run(approve=...)
    asks it."""
    from stockade.evidence.web import Approver
    from stockade.net.approve import Approval

    backend = _with_stand_ins(scene, backend)
    with_approval = getattr(backend, "with_approval", None)
    if with_approval is not None:
        approver = next(w for w in scene.watches if isinstance(w, Approver))
        backend = with_approval(Approval(approver))
    return attack(row, scene, backend)
