"""Host-side setups: each plants a row's bait in its scene, arms the watches that will show
whether anything outside the sandbox changed, and fills in the placeholders its attack's
arguments use. A setup that cannot work on this host raises NotRunnable with the reason.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from stockade.evidence.casefold import STORED
from stockade.evidence.scene import NotRunnable, Scene
from stockade.evidence.servers import (
    InheritedSocket,
    Prober,
    StandInDialer,
    StockadeDaemon,
    port_of,
    tcp_server,
    udp_port_bound,
    udp_server,
    unix_server,
)
from stockade.evidence.testhost import KnockingHost, TestHost
from stockade.evidence.watch import (
    AppendedFile,
    AtMost,
    Attributes,
    BindMount,
    CallerTerminal,
    DeepBindMount,
    Heartbeat,
    HostTerminal,
    ModeSet,
    Mounted,
    NoMounts,
    NoPrivilegeBits,
    NoResidue,
    OverlayMount,
    Unchanged,
    Victim,
    processes_with,
)
from stockade.evidence.web import Approver, StandInNames, WebServer, make_ca, need_cryptography
from stockade.lifecycle import statedir
from stockade.lifecycle.homes import SUFFIX
from stockade.policy.presets import DENY_DEFAULTS, is_deny_file

Setup = Callable[[Scene], None]
M = TypeVar("M", Mounted, DeepBindMount)
NOBODY = 65534
# Set-user-id programs that wait on a terminal, so their effective uid can be read.
WAITING_SETUID = ("su", "passwd", "chfn", "chsh", "newgrp")


def nothing(scene: Scene) -> None:
    """Only the scene's standing bait: the outside tree and its secret."""


def workspace_files(scene: Scene) -> None:
    """A file and a directory in the workspace, which must stay as they are."""
    scene.plant("ws/file", "original content\n")
    scene.plant("ws/dir/inner", "inner content\n")
    scene.watch(Unchanged(scene.ws, "workspace"))


def overlay_workspace(scene: Scene) -> None:
    """Files and a directory in the workspace for the attack to change in every way
    (attacks/fs_overlay.py); the host's workspace must stay exactly as it was."""
    for name in ("file", "append", "truncate", "rename", "remove", "mode", "dir/inner"):
        scene.plant(f"ws/{name}", f"original content of {name}\n")
    scene.watch(Unchanged(scene.ws, "workspace"))


def overlay_review(scene: Scene) -> None:
    """A file in an overlaid workspace, which must stay as it was: what the attack plants
    stays in the change set (attacks/fs_review.py)."""
    scene.plant("ws/file", "original content\n")
    scene.watch(Unchanged(scene.ws, "workspace"))


def read_only_file(scene: Scene) -> None:
    """One file in the workspace, which the row's preset makes read-only."""
    scene.plant("ws/file", "keep me exactly as I am\n")
    scene.watch(Unchanged(scene.ws, "workspace"))


HOOK = "#!/bin/sh\nexit 0\n"


def _gitdir(scene: Scene, relative: str, config: str = "[core]\n") -> None:
    """A gitdir at `relative` below the scene root, as git makes one: HEAD, config, a hook."""
    for name, content in (("HEAD", "ref: refs/heads/main\n"), ("config", config),
                          ("hooks/pre-commit", HOOK)):
        scene.plant(f"{relative}/{name}", content)


def nested_repository(scene: Scene) -> None:
    """A `.git` directory and a protected `.agents` two levels down in the workspace."""
    _gitdir(scene, "ws/a/b/.git")
    scene.plant("ws/a/b/.agents/rules", "be careful\n")
    scene.watch(Unchanged(scene.ws / "a", "workspace/a (holding a/b/.git and a/b/.agents)"))


CODE_RUNNING = (".mcp.json", ".vscode/tasks.json", ".claude/commands/review.md", ".gitmodules",
                ".envrc", ".bashrc", ".idea/workspace.xml", ".devcontainer/devcontainer.json")


def code_running_files(scene: Scene) -> None:
    """Files a host tool runs code from later (an MCP server list, editor tasks, an agent's
    commands, submodule URLs, direnv, a shell's start-up file), two levels down."""
    for rel in CODE_RUNNING:
        scene.plant(f"ws/a/b/{rel}", "original\n")
    scene.watch(Unchanged(scene.ws / "a", "workspace/a (holding a/b/.mcp.json, .vscode, ...)"))


def host_code_in_workspace(scene: Scene) -> None:
    """A directory on the host's import path (the PYTHONPATH the launch's compile sees, as a
    CLI's would), two levels down in the workspace, holding a module and a .pth file: the
    next host call imports from there."""
    site = scene.plant("ws/a/lib/site/mod.py", "VALUE = 1\n").parent
    scene.plant("ws/a/lib/site/host.pth", "# the host's own\n")
    scene.host_env["PYTHONPATH"] = str(site)
    scene.watch(Unchanged(scene.ws / "a", "workspace/a (holding a/lib/site, on the host's "
                          "import path)"))


def host_code_bound_in_workspace(scene: Scene) -> None:
    """A directory on the host's import path (`lib`, the PYTHONPATH the launch's compile sees,
    as a CLI's would), outside the workspace, holding a module, and bound in the workspace at
    `pp` (a bind mount on the host, root's, undone after): the command writes the host's code
    under that other name, as a json.py the host's next Python imports before the standard
    library's (attack 27, H1)."""
    lib = scene.plant("lib/mod.py", "VALUE = 1\n").parent
    (scene.ws / "pp").mkdir()
    mounted(scene, BindMount(lib, scene.ws / "pp"))
    scene.host_env["PYTHONPATH"] = str(lib)
    scene.watch(Unchanged(lib, "lib (on the host's import path)"))


def host_code_on_overlay_of_workspace_upper(scene: Scene) -> None:
    """A directory on the host's import path (`lib`, the PYTHONPATH the launch's compile sees),
    outside the workspace, that is an overlay (its lower layer `spare`, holding a module) whose
    upper layer lies in the workspace (`up`, its work directory `wk`; an overlay mount on the
    host, root's, undone after): what the command writes in `up` the host's next Python
    imports from `lib` (attack 27, H2)."""
    spare = scene.plant("spare/mod.py", "VALUE = 1\n").parent
    for name in ("lib", "ws/up", "ws/wk"):
        (scene.root / name).mkdir()
    lib = scene.root / "lib"
    mounted(scene, OverlayMount(lib, (str(spare),), upper=(scene.ws / "up", scene.ws / "wk")))
    scene.host_env["PYTHONPATH"] = str(lib)
    scene.watch(Unchanged(lib, "lib (on the host's import path)"))


def workspace_file_bound_onto_host_code(scene: Scene) -> None:
    """A directory on the host's import path (`lib`, the PYTHONPATH the launch's compile
    sees), outside the workspace, whose sitecustomize.py is a workspace file (`sc.py`) bound
    onto it (a bind mount on the host, root's, undone after): what the command writes in
    `sc.py` the host's next Python runs at start-up (attack 28, H5)."""
    source = scene.plant("ws/sc.py", "VALUE = 1\n")
    entry = scene.plant("lib/sitecustomize.py", "")
    mounted(scene, BindMount(source, entry))
    scene.host_env["PYTHONPATH"] = str(entry.parent)
    scene.watch(Unchanged(entry.parent, "lib (on the host's import path)"))


def host_code_linked_to_workspace(scene: Scene) -> None:
    """A directory on the host's import path (`lib`, the PYTHONPATH the launch's compile
    sees), outside the workspace, whose sitecustomize.py is a symbolic link to a workspace
    file (`sc.py`), as `flit install --symlink` links a package: what the command writes in
    `sc.py` the host's next Python runs at start-up (attack 28, H6)."""
    source = scene.plant("ws/sc.py", "VALUE = 1\n")
    (scene.root / "lib").mkdir()
    (scene.root / "lib" / "sitecustomize.py").symlink_to(source)
    scene.host_env["PYTHONPATH"] = str(scene.root / "lib")
    scene.watch(Unchanged(source, "ws/sc.py (lib/sitecustomize.py, on the host's import "
                          "path, links to it)"))


def workspace_package_imported(scene: Scene) -> None:
    """A workspace package (`{module}`, ws/pkg/__init__.py) the launch's compile imported by
    a finder of its own, as an editable install's finder imports it, started in the scene's
    root, above the workspace (launches.compiled_after_importing): the host's program runs
    what the command writes in it when it next imports `pkg` (attack 30, N7)."""
    scene.values["module"] = str(scene.plant("ws/pkg/__init__.py", "VALUE = 1\n"))
    scene.values["module_name"] = "pkg"
    scene.watch(Unchanged(scene.ws / "pkg", "ws/pkg (a package the host imported)"))


def workspace_module_imported(scene: Scene) -> None:
    """A workspace module file (`{module}`, ws/lib/mod.py, no `__pycache__` beside it) the
    launch's compile imported by a finder of its own (launches.compiled_after_importing):
    the host's next import of `mod` takes a package directory `mod`, an extension module
    `mod{ext}` or a bytecode cache made beside it first (attack 31, H1, H2)."""
    import importlib.machinery

    scene.values["module"] = str(scene.plant("ws/lib/mod.py", "VALUE = 1\n"))
    scene.values["module_name"] = "mod"
    scene.values["ext"] = importlib.machinery.EXTENSION_SUFFIXES[0]
    scene.watch(Unchanged(scene.ws / "lib", "ws/lib (holding mod.py, a module the host "
                          "imported)"))


# setuptools' editable finder for a flat layout (its editable_wheel._FINDER_TEMPLATE, the
# namespace finder left out): a module of site-packages that an `import` line of the
# install's .pth file installs on sys.meta_path.
EDITABLE_FINDER = """\
import sys
from importlib.machinery import all_suffixes as module_suffixes
from importlib.util import spec_from_file_location
from itertools import chain
from pathlib import Path

MAPPING = {mapping!r}
NAMESPACES = {{}}


class _EditableFinder:  # MetaPathFinder
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        for pkg, pkg_path in reversed(list(MAPPING.items())):
            if fullname == pkg or fullname.startswith(f"{{pkg}}."):
                rest = fullname.replace(pkg, "", 1).strip(".").split(".")
                return cls._find_spec(fullname, Path(pkg_path, *rest))
        return None

    @classmethod
    def _find_spec(cls, fullname, candidate_path):
        init = candidate_path / "__init__.py"
        candidates = (candidate_path.with_suffix(x) for x in module_suffixes())
        for candidate in chain([init], candidates):
            if candidate.exists():
                return spec_from_file_location(fullname, candidate)


def install():
    if not any(finder == _EditableFinder for finder in sys.meta_path):
        sys.meta_path.append(_EditableFinder)
"""


def workspace_package_mapped(scene: Scene) -> None:
    """A workspace package (ws/pkg) that an editable install's finder (`{finder}`, in a
    site-packages of the scene's, outside the workspace) maps `pkg` to, installed in the
    launch's compile (launches.compiled_beside_a_finder), which never imported it: the host's
    program runs what the command writes there when it first imports `pkg` (attack 29, N2)."""
    package = scene.plant("ws/pkg/__init__.py", "VALUE = 1\n").parent
    scene.values["finder"] = str(scene.plant(
        "site/__editable___x_finder.py", EDITABLE_FINDER.format(mapping={"pkg": str(package)})))
    scene.watch(Unchanged(package, "ws/pkg (a package an editable finder of the host maps)"))


def workspace_package_linked_from_start(scene: Scene) -> None:
    """A workspace package (ws/pkg) that the launch's compile, started in the directory `app`
    outside the workspace, imported through the link app/pkg to it
    (launches.compiled_started_through_a_link): an import through the starting directory
    that is not the program's own, since it lies in the workspace (attack 32, S1)."""
    package = scene.plant("ws/pkg/__init__.py", "VALUE = 1\n").parent
    (scene.root / "app").mkdir()
    (scene.root / "app" / "pkg").symlink_to(package)
    scene.watch(Unchanged(package, "ws/pkg (imported through app/pkg, a link in the host "
                          "program's starting directory)"))


def pycache_prefix_in_workspace(scene: Scene) -> None:
    """The host's bytecode cache prefix (PYTHONPYCACHEPREFIX in the environment the launch's
    compile sees, as a CLI's would) in the workspace (`{prefix}`), holding the cache of a
    module the host's next Python imports (`{pyc}`, the json package's): an import takes a
    .pyc there for its source (attack 29, N4)."""
    import importlib.util
    import json
    import py_compile

    prefix = scene.ws / "pycache"
    prefix.mkdir()
    scene.host_env["PYTHONPYCACHEPREFIX"] = str(prefix)
    source = os.path.abspath(json.__file__)
    # (where an interpreter with that prefix keeps the cache of `source`: its directory below
    # the prefix, the name it has in a __pycache__)
    pyc = Path(f"{prefix}{os.path.dirname(source)}",
               os.path.basename(importlib.util.cache_from_source(source)))
    py_compile.compile(source, cfile=str(pyc), doraise=True)
    scene.values.update(prefix=str(prefix), pyc=str(pyc))
    scene.watch(Unchanged(prefix, "ws/pycache (the host's bytecode cache prefix)"))


def relative_entries_in_workspace(scene: Scene) -> None:
    """A directory `src` (holding `mod`) and a zip file `overrides.zip` (holding `overrides`)
    in the workspace, which the launch's compile, started there, puts on its import path
    relative, as "src" and "overrides.zip", importing from each
    (launches.compiled_with_relative_entries): every later import joins them to its working
    directory, and a path hook of its own (the zip importer's) takes the zip file (attack 33,
    A2; 34, B7)."""
    import zipfile

    src = scene.plant("ws/src/mod.py", "VALUE = 1\n").parent
    with zipfile.ZipFile(scene.ws / "overrides.zip", "w") as archive:
        archive.writestr("overrides.py", "VALUE = 1\n")
    scene.watch(Unchanged(src, "ws/src (the relative entry src on the host's import path)"))
    scene.watch(Unchanged(scene.ws / "overrides.zip", "ws/overrides.zip (the relative entry "
                          "overrides.zip on the host's import path)"))


def workspace_directories_searched(scene: Scene) -> None:
    """A workspace directory (`{lib}`, ws/lib, holding `mod`) and a missing one (`{plugins}`,
    ws/plugins) that the launch's compile, started in `app` beside the workspace, put on its
    import path for an import and took off again (launches.compiled_after_searching), as a
    plugin loader does: its next run puts them back and imports what the command left there
    (attack 33, A1; 34, B5a)."""
    lib = scene.plant("ws/lib/mod.py", "VALUE = 1\n").parent
    (scene.root / "app").mkdir()
    scene.values.update(lib=str(lib), plugins=str(scene.ws / "plugins"))
    scene.watch(Unchanged(scene.ws, "workspace (holding ws/lib, searched by the host's "
                          "imports, and not ws/plugins, searched missing)"))


def working_directory_in_workspace(scene: Scene) -> None:
    """A directory `{sub}` (ws/sub) in the workspace that the launch's compile, started with
    -c in `app` beside the workspace, moved into after importing Stockade
    (launches.compiled_after_moving_in): "" on its import path names it at every later
    import, the host's `import csv` after the run among them (attack 35, B8)."""
    sub = scene.ws / "sub"
    sub.mkdir()
    (scene.root / "app").mkdir()
    scene.values.update(sub=str(sub))
    scene.watch(Unchanged(sub, "ws/sub (the working directory \"\" names on the host's "
                          "import path)"))


def workspace_directory_searched_below_start(scene: Scene) -> None:
    """The workspace's `{plugins}` (ws/plugins, empty) that the launch's compile, started in
    the scene's root (which holds the workspace: a starting directory kept only whole), put
    on its import path for an optional import and took off again, after importing its own
    package `ws.mypkg` through its starting directory
    (launches.compiled_after_searching_below_start): its next run imports what the command
    left in ws/plugins (attack 35, B9)."""
    plugins = scene.ws / "plugins"
    plugins.mkdir()
    scene.plant("ws/mypkg/__init__.py", "VALUE = 1\n")
    scene.values.update(plugins=str(plugins))
    scene.watch(Unchanged(plugins, "ws/plugins (searched by the host's imports)"))


def package_path_extended_into_workspace(scene: Scene) -> None:
    """A package `hostpkg` in `app`, beside the workspace, that the launch's compile, started
    there, imports and gives the workspace's `{plugins}` (ws/.app/plugins) on its `__path__`
    besides its own directory (launches.compiled_after_extending_a_package), as a plugin
    loader does: the host's next run imports what the command left there as hostpkg's
    (attack 36, B10)."""
    scene.plant("app/hostpkg/__init__.py", "VALUE = 1\n")
    plugins = scene.ws / ".app" / "plugins"
    plugins.mkdir(parents=True)
    scene.values.update(plugins=str(plugins))
    scene.watch(Unchanged(plugins, "ws/.app/plugins (on the __path__ of the host's package "
                          "hostpkg)"))


def package_paths_given_without_an_origin(scene: Scene) -> None:
    """A namespace package `hostns` (app/hostns, no __init__) in `app`, beside the workspace,
    that the launch's compile, started there, imports and gives the workspace's `{plugins}`
    (ws/.app/plugins) on its `__path__`, and a package `hostspec` it makes from a spec with
    no origin and gives the missing `{extensions}` (ws/.app/extensions)
    (launches.compiled_after_giving_originless_packages): neither has a file whose directory
    is its own, and the host's next run imports what the command left there as theirs
    (attack 37, N1, N3)."""
    (scene.root / "app" / "hostns").mkdir(parents=True)
    plugins = scene.ws / ".app" / "plugins"
    plugins.mkdir(parents=True)
    scene.values.update(plugins=str(plugins), extensions=str(scene.ws / ".app" / "extensions"))
    scene.watch(Unchanged(scene.ws / ".app", "ws/.app (holding ws/.app/plugins, on the "
                          "__path__ of the host's namespace package hostns, and not "
                          "ws/.app/extensions, on that of its package hostspec)"))


def module_loaded_as_a_package(scene: Scene) -> None:
    """A workspace module file `{loader}` (ws/.app/loader.py) that the launch's compile,
    started in `app` beside the workspace, loads as a package `hostplug`, its directory
    ws/.app its `__path__` (launches.compiled_after_loading_a_module_as_a_package): that
    directory is no package's own, and the host's next run imports what the command left
    there as hostplug's (attack 38, P1)."""
    loader = scene.plant("ws/.app/loader.py", "VALUE = 1\n")
    (scene.root / "app").mkdir()
    scene.values.update(loader=str(loader))
    scene.watch(Unchanged(loader.parent, "ws/.app (the __path__ of the host's package "
                          "hostplug, loaded from ws/.app/loader.py)"))


HELD_SHAPES = ("str", "table", "list", "set", "keys", "slots", "entry")


def directories_finders_hold(scene: Scene) -> None:
    """Workspace directories below `{held}` (ws/.held) that import finders of a plugin
    loader's hold, which the launch's compile, started in `app` beside the workspace,
    installs (launches.compiled_beside_holding_finders), each directory of HELD_SHAPES held in
    that shape: no import path entry names them, yet the host's next run imports what the
    command left there (attacks 40 T2, 41 U1). (One held missing is refused: the launch
    cannot keep it unmade.)"""
    held = scene.ws / ".held"
    for shape in HELD_SHAPES:
        (held / shape).mkdir(parents=True)
    (scene.root / "app").mkdir()
    scene.values.update(held=str(held))
    scene.watch(Unchanged(held, "ws/.held (holding the directories the host's import finders "
                          "hold)"))


def relative_entries_of_a_program_moved_out(scene: Scene) -> None:
    """The workspace's `tools` (holding `tool`) and `plugins`, missing, that the launch's
    compile, started in the workspace with a path hook of its own, puts on its import path
    relative, as "tools" and "plugins", before it moves to `{app}` outside the workspace
    (launches.compiled_after_moving_out): the host's next run, started in the workspace
    again, joins them to it, whatever hook takes them (attack 40 T1, T4)."""
    tools = scene.plant("ws/tools/tool.py", "VALUE = 1\n").parent
    (scene.root / "app").mkdir()
    scene.values.update(app=str(scene.root / "app"))
    scene.watch(Unchanged(scene.ws, "workspace (holding ws/tools and not ws/plugins, relative "
                          "entries on the host's import path)"))
    scene.watch(Unchanged(tools, "ws/tools (the relative entry tools on the host's import "
                          "path)"))


# A package that loads plugins from beside itself, "<its directory>/../mypkg_plugins".
DOT_DOT_PACKAGE = """import os
__path__.append(os.path.join(os.path.dirname(__file__), "..", "mypkg_plugins"))
"""


def package_linked_with_dot_dot_path(scene: Scene) -> None:
    """A workspace package ws/src/mypkg that `{lib}` (app/lib, outside the workspace) links to
    as mypkg (as `flit install --symlink` makes it), which the launch's compile imports
    through the link (launches.compiled_after_importing_through_a_link): it gives its
    __path__ app/lib/mypkg/../mypkg_plugins, which the kernel resolves after the link, to the
    missing ws/src/mypkg_plugins, not lexically to app/lib/mypkg_plugins; the host's next run
    imports what the command made there (attack 40 T5)."""
    package = scene.plant("ws/src/mypkg/__init__.py", DOT_DOT_PACKAGE).parent
    lib = scene.root / "app" / "lib"
    lib.mkdir(parents=True)
    (lib / "mypkg").symlink_to(package)
    scene.values.update(lib=str(lib))
    scene.watch(Unchanged(package.parent, "ws/src (holding the package mypkg, and not "
                          "ws/src/mypkg_plugins, on its __path__ through a link)"))


def modules_loaded_by_relative_path_and_origin(scene: Scene) -> None:
    """Workspace modules the launch's compile, started in `app` beside the workspace, loads
    (launches.compiled_after_loading_by_origin): ws/hooks/agent_hooks.py by the relative path
    "../ws/hooks/agent_hooks.py", and `{plugin}` (ws/plugins/myplug.py) by a loader of its
    own, the path only its spec's origin; the host's next run loads what the command wrote there
    (attack 40 T3, 41 U3)."""
    hook = scene.plant("ws/hooks/agent_hooks.py", "HOOK = 1\n")
    plugin = scene.plant("ws/plugins/myplug.py", "X = 1\n")
    (scene.root / "app").mkdir()
    scene.values.update(plugin=str(plugin))
    for path, what in ((hook, "loaded by a relative path"), (plugin, "its spec's origin")):
        scene.watch(Unchanged(path, f"{path.relative_to(scene.root)} (a module the host "
                              f"loaded, {what})"))


def plugin_below_a_working_directory(scene: Scene) -> None:
    """A workspace plugin `{plugin}` (ws/plugins/myplug.py) the launch's compile, started in
    `app` beside the workspace, loads after moving into the scene's root, which holds the
    workspace (launches.compiled_after_moving_above): that working directory is kept only
    whole (not at all), so it covers no module below it, and the host's next run loads what
    the command wrote (attack 41 U2)."""
    plugin = scene.plant("ws/plugins/myplug.py", "X = 1\n")
    (scene.root / "app").mkdir()
    scene.values.update(plugin=str(plugin))
    scene.watch(Unchanged(plugin, "ws/plugins/myplug.py (a module the host loaded below its "
                          "working directory)"))


def client_script_in_workspace(scene: Scene) -> None:
    """The `stockade` script a client runs, `{client}` (ws/bin/stockade, as a project's venv
    keeps it), in the workspace (launches.served_by_a_cli_server): a served run must judge
    the client's host code, not the server's (attack A11)."""
    client = scene.plant("ws/bin/stockade", "import sys\n\nfrom stockade.program import "
                         "main\n\nsys.exit(main())\n")
    scene.values.update(client=str(client))
    scene.watch(Unchanged(client, "ws/bin/stockade (the script of the host's client)"))


def site_directory_added_names_missing_directory(scene: Scene) -> None:
    """A site directory `{sitedir}` (app/venv-site, outside the workspace) that the launch's
    compile, started in `app`, adds at run time (launches.compiled_after_adding_a_site_directory,
    as virtualenv's activate_this.py does), whose .pth names `{ws}/src`, missing (an editable
    install whose sources are gone): `site` skips it, yet the host's next run that adds the
    site directory imports from it once it exists (attack 39, S1, S2). The workspace must stay
    empty."""
    sitedir = scene.plant("app/venv-site/__editable__.myproj-0.1.pth",
                          f"{scene.ws / 'src'}\n").parent
    scene.values.update(sitedir=str(sitedir))
    scene.watch(Unchanged(scene.ws, "workspace"))


def pth_names_missing_directory(scene: Scene) -> None:
    """A venv (`{venv_python}`, the interpreter the launch is compiled by, as if Stockade were
    installed there) whose site-packages holds a .pth naming `{ws}/src`, missing (an editable
    install whose sources are gone): `site` skips it, yet the venv's next interpreter imports
    from it, first, once it exists. The workspace must stay empty."""
    import venv

    venv.EnvBuilder(symlinks=True, with_pip=False).create(scene.root / "venv")
    site = next((scene.root / "venv").glob("lib/python3*/site-packages"))
    (site / "__editable__.evidence-0.1.pth").write_text(f"{scene.ws / 'src'}\n")
    scene.values["venv_python"] = str(scene.root / "venv" / "bin" / "python")
    scene.watch(Unchanged(scene.ws, "workspace"))


def venv_bin_bound_in_workspace(scene: Scene) -> None:
    """A venv (`{venv_python}`, the interpreter the launch is compiled by, as if Stockade were
    installed there; a copy, as `python -m venv --copies` makes it) whose bin directory is
    bound in the workspace at `vbin` (a bind mount on the host, root's, undone after): the
    command writes the interpreter the host's next `stockade` runs under that other name
    (attack 28, V2)."""
    import venv

    venv.EnvBuilder(symlinks=False, with_pip=False).create(scene.root / "venv")
    bin_directory = scene.root / "venv" / "bin"
    (scene.ws / "vbin").mkdir()
    mounted(scene, BindMount(bin_directory, scene.ws / "vbin"))
    scene.values["venv_python"] = str(bin_directory / "python")
    scene.watch(Unchanged(bin_directory, "venv/bin (the interpreter's)"))


def protected_create_places(scene: Scene) -> None:
    """The workspace and a/b below it, each with a file to link and rename and a dangling
    symlink to a protected name (fs_protected_create.py): the workspace must stay as made."""
    for where in ("ws", "ws/a/b"):
        scene.plant(f"{where}/source", "original\n")
        os.symlink(".envrc", scene.root / where / "dangling")
    scene.watch(Unchanged(scene.ws, "workspace (holding source, a dangling link to .envrc, "
                          "a/b with the same)"))


def git_file(scene: Scene) -> None:
    """A `.git` file (a worktree pointer) and the gitdir it points to, both in the workspace."""
    scene.plant("ws/sub/.git", "gitdir: ../.repo-git\n")
    _gitdir(scene, "ws/.repo-git")
    scene.watch(Unchanged(scene.ws / "sub" / ".git", "workspace/sub/.git"))
    scene.watch(Unchanged(scene.ws / ".repo-git", "workspace/.repo-git"))


def git_pointers(scene: Scene) -> None:
    """A repository whose config includes a file in the work tree, with a linked worktree
    (`wt/.git`, and the commondir and gitdir of `.git/worktrees/wt`) and a submodule
    (`sub/.git`, `.git/modules/sub`), as git lays them out."""
    ws = scene.ws
    _gitdir(scene, "ws/.git", "[include]\n\tpath = ../shared.gitconfig\n")
    scene.plant("ws/shared.gitconfig", "[alias]\n\tst = status\n")
    for name, content in (("HEAD", "ref: refs/heads/wt\n"), ("commondir", "../..\n"),
                          ("gitdir", f"{ws}/wt/.git\n")):
        scene.plant(f"ws/.git/worktrees/wt/{name}", content)
    scene.plant("ws/wt/.git", f"gitdir: {ws}/.git/worktrees/wt\n")
    _gitdir(scene, "ws/.git/modules/sub", "[core]\n\tworktree = ../../../sub\n")
    scene.plant("ws/sub/.git", "gitdir: ../.git/modules/sub\n")
    scene.watch(Unchanged(scene.ws, "workspace"))


def git_include_absent(scene: Scene) -> None:
    """A repository whose config includes a file in the work tree that does not exist."""
    _gitdir(scene, "ws/.git", "[include]\n\tpath = ../local.gitconfig\n")
    scene.watch(Unchanged(scene.ws, "workspace"))


def denied_paths(scene: Scene) -> None:
    """Secrets inside the workspace, at paths the row's policy denies."""
    scene.plant_secret("ws/keys/id")
    scene.plant_secret("ws/token")
    scene.watch(Unchanged(scene.ws, "workspace"))


def denied_below_directories(scene: Scene) -> None:
    """Secrets two directories down in the workspace, at paths the row's policy denies (a file
    and a directory), each below directories a command may otherwise rename."""
    scene.plant_secret("ws/a/b/token")
    scene.plant_secret("ws/c/d/keys/id")
    scene.watch(Unchanged(scene.ws, "workspace"))


def denied_file_linked(scene: Scene) -> None:
    """A secret at a path the row's policy denies, and a hard link of it the host made
    elsewhere in the workspace before the launch: the same file under another name."""
    secret = scene.plant_secret("ws/keys/id")
    (scene.ws / "backup").mkdir()
    os.link(secret, scene.ws / "backup" / "id.bak")
    scene.watch(Unchanged(scene.ws, "workspace"))


def denied_file_linked_in_read_root(scene: Scene) -> None:
    """A secret at a path the row's policy denies, and a hard link of it the host made in a
    read root (which the launch looks through for it) before the launch."""
    (scene.root / "ro").mkdir()
    os.link(scene.plant_secret("ws/keys/id"), scene.root / "ro" / "id.bak")
    scene.read_roots.append(str(scene.root / "ro"))
    scene.watch(Unchanged(scene.ws, "workspace"))
    scene.watch(Unchanged(scene.root / "ro", "read-only root"))


def denied_file_linked_in_overlay_layer(scene: Scene) -> None:
    """A secret at a path the row's policy denies, a hard link of it the host made in
    `layer`, a directory outside every root, and an overlay whose lower layer `layer` is
    mounted in a read root (`ro/m`; an overlay mount on the host, root's, undone after): the
    overlay's directories lie on a device of its own, not the file's (attack 34, H2)."""
    secret = scene.plant_secret("ws/keys/id")
    for name in ("layer", "empty", "ro/m"):
        (scene.root / name).mkdir(parents=True)
    os.link(secret, scene.root / "layer" / "id")
    mounted(scene, OverlayMount(scene.root / "ro" / "m",
                                (str(scene.root / "layer"), str(scene.root / "empty"))))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.watch(Unchanged(scene.ws, "workspace"))
    scene.watch(Unchanged(scene.root / "layer", "the overlay's lower layer"))


def denied_dir_unlisted(scene: Scene) -> None:
    """A secret in a directory the row's policy denies, which may be entered but not listed
    (0311: the launch cannot look for its files' other names there), and a hard link of it
    the host made elsewhere in the workspace before the launch (attack 8, dl1)."""
    secret = scene.plant_secret("ws/keys/id")
    (scene.ws / "backup").mkdir()
    os.link(secret, scene.ws / "backup" / "id.bak")
    scene.watch(ModeSet(scene.ws / "keys", 0o311))
    scene.watch(Unchanged(scene.ws, "workspace", ignored=("keys",)))
    scene.watch(Unchanged(secret, "the denied file"))


def denied_link_bound_into_read_root(scene: Scene) -> None:
    """A secret at a path the row's policy denies, a hard link of it in another directory of
    the workspace, and that directory bound into a read root (a bind mount on the host,
    root's, undone after): the link is seen at a path no walk of the write root meets (attack
    9, dl9c)."""
    secret = scene.plant_secret("ws/keys/id")
    (scene.ws / "backup").mkdir()
    os.link(secret, scene.ws / "backup" / "id.bak")
    (scene.root / "ro" / "view").mkdir(parents=True)
    mounted(scene, BindMount(scene.ws / "backup", scene.root / "ro" / "view"))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.watch(Unchanged(scene.ws, "workspace"))


def removed_link_bound_into_read_root(scene: Scene) -> None:
    """A secret at a path the row's policy denies, a hard link of it in the workspace bound on
    a file of a read root (a bind mount on the host, root's, undone after), then the link
    removed: the file has one name again, which no walk looks for others of, and the mount
    table names the bind by the removed path (`//deleted`), not by what it shows (attack 11,
    dl9c-filebind_src_removed)."""
    secret = scene.plant_secret("ws/keys/id")
    link = scene.ws / "backup" / "id.bak"
    link.parent.mkdir()
    os.link(secret, link)
    mounted(scene, BindMount(link, scene.plant("ro/view.bak")))
    link.unlink()
    scene.read_roots.append(str(scene.root / "ro"))
    scene.watch(Unchanged(scene.ws, "workspace"))


DEEP_NAME = "d" * 250  # (NAME_MAX is 255)
DEEP_LEVELS = 20  # (20 x 251 bytes: past PATH_MAX, 4096)


def deep_vault_in_read_root(scene: Scene) -> None:
    """A secret in a vault the row's policy denies (`{vault}`), bound (a bind mount on the
    host, root's, undone after) at the end of a chain of directories in a read root whose path
    is longer than the kernel looks up whole (PATH_MAX): the mount table lists it, no lookup
    of its point reaches it, and a command can, a directory at a time (attack 16, M2)."""
    scene.plant_secret("vault/id")
    (scene.root / "ro").mkdir()
    mounted(scene, DeepBindMount(scene.root / "vault", scene.root / "ro", DEEP_NAME,
                                 DEEP_LEVELS))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.values.update(vault=str(scene.root / "vault"), deep_name=DEEP_NAME,
                        deep_levels=str(DEEP_LEVELS))
    scene.watch(Unchanged(scene.root / "vault", "the vault"))


def overlaid_vault_in_read_root(scene: Scene) -> None:
    """A secret in a vault the row's policy denies (`{vault}`), and an overlay whose lower
    layer is the vault mounted in a read root (`ro/m`; an overlay mount on the host, root's,
    undone after): its files are the vault's on a device of its own, where no name is
    compared with the denied ones (attack 18, O1)."""
    scene.plant_secret("vault/id")
    (scene.root / "empty").mkdir()
    (scene.root / "ro" / "m").mkdir(parents=True)
    mounted(scene, OverlayMount(scene.root / "ro" / "m",
                                (str(scene.root / "vault"), str(scene.root / "empty"))))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.values["vault"] = str(scene.root / "vault")
    scene.watch(Unchanged(scene.root / "vault", "the vault"))


def overlay_above_read_root(scene: Scene) -> None:
    """A secret in a vault the row's policy denies (`{vault}`), and an overlay at `m` whose
    lower layer is the vault written relative (`vault`, mounted from the scene's root, as a
    container engine writes its layers, relative to its store), above a read root (`m/sub`:
    an overlay mount on the host, root's, undone after): the mount table says `vault`, which
    cannot be told from the denied paths (attack 20, B1)."""
    scene.plant_secret("vault/sub/id")
    (scene.root / "empty").mkdir()
    (scene.root / "m").mkdir()
    mounted(scene, OverlayMount(scene.root / "m", ("vault", str(scene.root / "empty")),
                                cwd=scene.root))
    scene.read_roots.append(str(scene.root / "m" / "sub"))
    scene.values["vault"] = str(scene.root / "vault")
    scene.watch(Unchanged(scene.root / "vault", "the vault"))


def overlay_of_read_root_layer(scene: Scene) -> None:
    """A secret at `lower/vault/id` in a read root (`ro`), and an overlay outside the roots
    (`ovl`) whose lower layer is `ro/lower`: the row's policy denies the path the overlay
    shows it at (`{overlaid}` = ovl/vault), which the layer holds under its own name, as
    `overlayroot`'s lower disk does at /media/root-ro (an overlay mount on the host, root's,
    undone after; attacks 21 R1, 22)."""
    scene.plant_secret("ro/lower/vault/id")
    (scene.root / "empty").mkdir()
    (scene.root / "ovl").mkdir()
    mounted(scene, OverlayMount(scene.root / "ovl",
                                (str(scene.root / "ro" / "lower"), str(scene.root / "empty"))))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.values["overlaid"] = str(scene.root / "ovl" / "vault")
    scene.watch(Unchanged(scene.root / "ro" / "lower", "the overlay's lower layer"))


def overlay_of_shared_layer(scene: Scene) -> None:
    """A secret at `L/vault/id`, an overlay outside the roots (`ovl`) whose lower layer is `L`,
    and in a read root another (`ro/view`) whose lower layer is `L` under another name, a bind
    of it outside the roots (`Lb`; mounts on the host, root's, undone after): the row's policy
    denies the path the first shows the secret at (`{overlaid}` = ovl/vault), which the second
    shows again, its layer the same directory by identity, not by name (attack 24, B1)."""
    scene.plant_secret("L/vault/id")
    for name in ("e1", "e2", "ovl", "Lb", "ro/view"):
        (scene.root / name).mkdir(parents=True)
    layer = scene.root / "L"
    mounted(scene, OverlayMount(scene.root / "ovl", (str(layer), str(scene.root / "e1"))))
    mounted(scene, BindMount(layer, scene.root / "Lb"))
    mounted(scene, OverlayMount(scene.root / "ro" / "view",
                                (str(scene.root / "Lb"), str(scene.root / "e2"))))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.values["overlaid"] = str(scene.root / "ovl" / "vault")
    scene.watch(Unchanged(layer, "the shared layer"))


def overlay_covering_bound_vault(scene: Scene) -> None:
    """A secret in a vault the row's policy denies (`{vault}`), bound at `ro/v` in a read
    root, and an overlay mounted over that bind whose lower layer is its own point, `ro/v`
    (mounts on the host, root's, undone after): it hides the bind it shows, so the layer's name
    now names the overlay, where no name is compared with the denied ones (attack 25, C1)."""
    scene.plant_secret("vault/id")
    for name in ("empty", "ro/v"):
        (scene.root / name).mkdir(parents=True)
    point = scene.root / "ro" / "v"
    mounted(scene, BindMount(scene.root / "vault", point))
    mounted(scene, OverlayMount(point, (str(point), str(scene.root / "empty"))))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.values["vault"] = str(scene.root / "vault")
    scene.watch(Unchanged(scene.root / "vault", "the vault"))


def overlay_hiding_bound_vault(scene: Scene) -> None:
    """A secret in a vault the row's policy denies (`{vault}`), bound at `ro/v/sub` in a read
    root, and an overlay mounted at `ro/v` whose lower layer is that bind, below its own point
    (mounts on the host, root's, undone after): the overlay hides the name, which no longer
    names what the layer is (attack 25, C2; a symbolic link there is attack 26, S1)."""
    scene.plant_secret("vault/id")
    for name in ("empty", "ro/v/sub"):
        (scene.root / name).mkdir(parents=True)
    point = scene.root / "ro" / "v"
    mounted(scene, BindMount(scene.root / "vault", point / "sub"))
    mounted(scene, OverlayMount(point, (str(point / "sub"), str(scene.root / "empty"))))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.values["vault"] = str(scene.root / "vault")
    scene.watch(Unchanged(scene.root / "vault", "the vault"))


def overlay_of_bound_vault_part(scene: Scene) -> None:
    """A secret in `sub` of a vault the row's policy denies (`{vault}`), `sub` bound outside
    the roots (`Lb`), and in a read root an overlay (`ro/m`) whose lower layer is that bind
    (mounts on the host, root's, undone after): neither the layer's path nor any directory
    above the denied path is the layer; the mount table gives the filesystem and the path
    inside it that the bind shows (attack 27, P8)."""
    scene.plant_secret("vault/sub/id")
    for name in ("empty", "Lb", "ro/m"):
        (scene.root / name).mkdir(parents=True)
    mounted(scene, BindMount(scene.root / "vault" / "sub", scene.root / "Lb"))
    mounted(scene, OverlayMount(scene.root / "ro" / "m",
                                (str(scene.root / "Lb"), str(scene.root / "empty"))))
    scene.read_roots.append(str(scene.root / "ro"))
    scene.values["vault"] = str(scene.root / "vault")
    scene.watch(Unchanged(scene.root / "vault", "the vault"))


def overlay_of_proc_named_vault(scene: Scene) -> None:
    """A secret in a vault the row's policy denies (`{vault}`), and in a read root an overlay
    (`ro/m`) whose lower layer its mounter named by its own descriptor on the vault,
    `/proc/self/fd/N` (an overlay mount on the host, root's, undone after): the mount table
    keeps that name, which names what the process reading it has at N, not the vault
    (attack 27, P6)."""
    scene.plant_secret("vault/id")
    for name in ("empty", "ro/m"):
        (scene.root / name).mkdir(parents=True)
    fd = os.open(scene.root / "vault", os.O_RDONLY | os.O_DIRECTORY)
    try:
        mounted(scene, OverlayMount(scene.root / "ro" / "m",
                                    (f"/proc/self/fd/{fd}", str(scene.root / "empty")),
                                    pass_fds=(fd,)))
    finally:
        os.close(fd)
    scene.read_roots.append(str(scene.root / "ro"))
    scene.values["vault"] = str(scene.root / "vault")
    scene.watch(Unchanged(scene.root / "vault", "the vault"))


def state_on_overlay_of_shared_upper(scene: Scene) -> None:
    """Stockade's state directory (`st/state`, the scene's environment's) on an overlay (`st`)
    whose upper layer is `up/U`, a bind of `up` at `upb`, and in the write root an overlay
    (`ws/view`) whose upper layer is `upb/U`, the same directory by identity (mounts on the
    host, root's, undone after): what the command writes at ws/view/state lands in the host's
    state directory, as a planted `cli.sock` (attack 24, B4s)."""
    for name in ("e1", "e2", "st", "up/U/state", "up/W1", "up/W2", "upb", "ws/view"):
        (scene.root / name).mkdir(parents=True, exist_ok=True)
    up, upb = scene.root / "up", scene.root / "upb"
    mounted(scene, OverlayMount(scene.root / "st", (str(scene.root / "e1"),),
                                upper=(up / "U", up / "W1")))
    mounted(scene, BindMount(up, upb))
    mounted(scene, OverlayMount(scene.ws / "view", (str(scene.root / "e2"),),
                                upper=(upb / "U", upb / "W2")))
    scene.host_env["STOCKADE_STATE_DIR"] = str(scene.root / "st" / "state")
    scene.watch(Unchanged(up / "U", "the state directory's upper layer"))


def denied_through_link(scene: Scene) -> None:
    """A secret in a directory of the workspace (`b/real`), and the path the row's policy
    denies a symbolic link to it in the workspace (`a/secret -> ../b/real`), which the command
    could point elsewhere for the next launch to deny instead (attack 15, D1)."""
    scene.plant_secret("ws/b/real/id")
    (scene.ws / "a").mkdir()
    (scene.ws / "a" / "secret").symlink_to("../b/real")
    scene.watch(Unchanged(scene.ws, "workspace"))


def protected_bound_in_workspace(scene: Scene) -> None:
    """A repository's hooks and a .vscode directory in the workspace, each bound at a second
    path in it (`sub/hooks`, `sub/editor`: bind mounts on the host, root's, undone after), as
    an administrator or an earlier tool binds them (attack 12, P1)."""
    _gitdir(scene, "ws/.git")
    scene.plant("ws/.vscode/tasks.json", "original\n")
    for source, alias in ((".git/hooks", "sub/hooks"), (".vscode", "sub/editor")):
        (scene.ws / alias).mkdir(parents=True)
        mounted(scene, BindMount(scene.ws / source, scene.ws / alias))
    scene.watch(Unchanged(scene.ws, "workspace (holding .git, .vscode and sub, where "
                          "bind mounts show them again)"))


def mounted(scene: Scene, mount: M) -> M:
    """`mount`, watched (undone when the scene closes); NotRunnable if it could not be made."""
    scene.watch(mount)
    if not mount.made:
        raise NotRunnable(f"cannot mount what the row needs: {mount.why}")
    return mount


def case_folding_workspace(scene: Scene) -> None:
    """What the case-folding stand-in will serve at the workspace (see casefold.py, which
    launches this row): a .git directory, a .git file, denied paths, and a directory stored as
    `.Git`, which git on that filesystem would use as `.git`."""
    for name, content in ((".git/config", "[core]\n"), (".git/hooks/pre-commit", HOOK),
                          ("sub/.git", "gitdir: ../.git\n"), ("other/.Git/config", "[core]\n"),
                          ("other/.Git/hooks/pre-commit", HOOK)):
        scene.plant(f"{STORED}/{name}", content)
    scene.plant_secret(f"{STORED}/keys/id")
    scene.plant_secret(f"{STORED}/token")
    scene.watch(Unchanged(scene.root / STORED, "workspace (as stored)"))


def planted_symlinks(scene: Scene) -> None:
    """Links in the workspace to the outside tree: absolute, relative, to the directory, `..`."""
    secret, ws = scene.outside / "secret", scene.ws
    os.symlink(secret, ws / "abs-link")
    os.symlink(os.path.relpath(secret, ws), ws / "rel-link")
    os.symlink(scene.outside, ws / "dir-link")
    os.symlink("../" * str(ws).count("/") + str(secret).lstrip("/"), ws / "dotdot-link")


def planted_hard_link(scene: Scene) -> None:
    """A hard link in the workspace to the outside secret, and a read-only root with a file."""
    os.link(scene.outside / "secret", scene.ws / "hard")
    scene.plant("ro/file", "read-only root content\n")
    scene.read_roots.append(str(scene.root / "ro"))
    scene.watch(Unchanged(scene.root / "ro", "read-only root"))


def metadata_targets(scene: Scene) -> None:
    """A protected name and a repository in the workspace, and a read-only root with a file."""
    nested_repository(scene)
    scene.plant("ro/file", "read-only root content\n")
    scene.read_roots.append(str(scene.root / "ro"))
    scene.watch(Unchanged(scene.root / "ro", "read-only root"))


def empty_workspace(scene: Scene) -> None:
    """The workspace must stay empty (no device node, no planted file)."""
    scene.watch(Unchanged(scene.ws, "workspace"))


def _openable(path: str) -> str:
    """How this process can open `path` on the host: "r", "w", "rw" or "" (not at all)."""
    modes = ""
    for mode, flags in (("r", os.O_RDONLY), ("w", os.O_WRONLY)):
        try:
            os.close(os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY))
            modes += mode
        except OSError:
            continue
    return modes


def host_devices(*candidates: str, block: bool = False) -> Setup:
    """The devices of `candidates` (and with `block`, the host's own block devices) that this
    user can open on the host, with how: what the sandbox's /dev must keep from it."""
    def setup(scene: Scene) -> None:
        names = list(candidates)
        if block:
            try:
                names += sorted(f"/dev/{name}" for name in os.listdir("/sys/block"))[:4]
            except OSError:
                pass
        found = [f"{name}:{modes}" for name in dict.fromkeys(names)
                 if (modes := _openable(name))]
        if not found:
            raise NotRunnable(f"this user can open none of {', '.join(names)} on the host "
                              "either: the sandbox's /dev has nothing of them to keep away")
        scene.values["devices"] = " ".join(found)
    setup.__doc__ = (f"The devices of {', '.join(candidates) or 'the host'}"
                     f"{' and its block devices' if block else ''} this user can open here.")
    return setup


def host_directory(scene: Scene) -> None:
    """A directory of the host that this user can list, outside every root: none of the
    roots granted for Python and the attacks lies in it (where it would be in the view)."""
    from stockade.evidence.launches import interpreter
    from stockade.evidence.scene import ATTACKS

    granted = [interpreter()[1], str(ATTACKS), str(scene.root)]
    for candidate in ("/root", "/home", "/srv", "/opt", "/mnt", "/boot"):
        if any(path == candidate or path.startswith(candidate + "/") for path in granted):
            continue
        try:
            if os.listdir(candidate):
                scene.values["host_directory"] = candidate + "/"
                return
        except OSError:
            continue
    scene.values["host_directory"] = ""


def host_families(*families: str) -> Setup:
    """The socket families of `families` (NAME=number:type) this user can create on the host:
    what seccomp must refuse (created and closed here, never connected)."""
    def setup(scene: Scene) -> None:
        made = []
        for entry in families:
            name, _, rest = entry.partition("=")
            family, _, kind = rest.partition(":")
            try:
                socket.socket(int(family), int(kind)).close()
            except OSError:
                continue
            made.append(entry)
        if not made:
            raise NotRunnable("this host offers this user none of "
                              f"{', '.join(f.partition('=')[0] for f in families)}")
        scene.values["families"] = " ".join(made)
    setup.__doc__ = "The socket families this user can create on the host."
    return setup


def loopback_tcp(scene: Scene) -> None:
    """TCP servers on the host's loopback, IPv4 and (where available) IPv6."""
    scene.values["tcp4"] = str(port_of(scene.watch(tcp_server("127.0.0.1", "host TCP 127.0.0.1"))))
    scene.values["tcp6"] = str(port_of(scene.watch(tcp_server("::1", "host TCP [::1]")))) \
        if socket.has_ipv6 and _has_loopback6() else ""


def loopback_udp(scene: Scene) -> None:
    """UDP servers on the host's loopback, IPv4 and (where available) IPv6."""
    scene.values["udp4"] = str(port_of(scene.watch(udp_server("127.0.0.1", "host UDP 127.0.0.1"))))
    scene.values["udp6"] = str(port_of(scene.watch(udp_server("::1", "host UDP [::1]")))) \
        if socket.has_ipv6 and _has_loopback6() else ""


def loopback_dns(scene: Scene) -> None:
    """A stand-in DNS server (UDP and TCP) on the host's loopback."""
    scene.values["dns_udp"] = str(port_of(scene.watch(udp_server("127.0.0.1", "host DNS/UDP"))))
    scene.values["dns_tcp"] = str(port_of(scene.watch(tcp_server("127.0.0.1", "host DNS/TCP"))))


def _has_loopback6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_host(scene: Scene, forms6: bool = False) -> None:
    """A test host outside the sandbox (see testhost.py) with TCP and UDP servers."""
    host = scene.watch(TestHost(forms6))
    scene.values.update(test_host=host.address, test_tcp=str(host.tcp_port),
                        test_udp=str(host.udp_port), **host.values6)
    scene.values["test_ipv6"] = " ".join(scene.expand(target) for target in host.targets6)


def test_host6(scene: Scene) -> None:
    """test_host, serving the IPv6 forms this host can serve too (`test_ipv6`: their targets;
    each address and port a placeholder of its own, so that the control's attempts compare)."""
    test_host(scene, forms6=True)


def knocking_peer(scene: Scene) -> None:
    """A test host that tells the sandbox the host port its datagram came from and then knocks
    there (testhost.KnockingHost), and a port for the attack to choose: free on the host,
    below the ephemeral range (where services listen)."""
    from stockade.linux.usernet import ephemeral_ports  # (POSIX-only: its rows run on Linux)

    ports = ephemeral_ports()
    for _ in range(50):
        chosen = secrets.randbelow(ports[0] - 20000) + 20000
        if not udp_port_bound(chosen):
            break
    else:
        raise NotRunnable("no free UDP port below the ephemeral range")
    peer = scene.watch(KnockingHost(chosen, ports))
    scene.values.update(peer=peer.address, peer_port=str(peer.port), chosen=str(chosen))


REBIND_NAME = "rebind.evidence.test"
METADATA_NAME = "metadata.evidence.test"
METADATA = "169.254.169.254"


def stand_in_network(scene: Scene) -> None:
    """A host TCP server on loopback, and a stand-in DNS for the proxy that answers for a test
    domain (RFC 6761's .test) as a rebinding or hijacked resolver would: one name resolves to
    loopback, another to the cloud metadata endpoint, which the proxy's connections reach at a
    stand-in server of the scene's (so no test ever dials beyond loopback)."""
    loopback_tcp(scene)
    metadata = scene.watch(tcp_server("127.0.0.1", "stand-in metadata endpoint"))
    names = {REBIND_NAME: ["127.0.0.1"], METADATA_NAME: [METADATA]}

    def resolve(host: str) -> list[str]:
        return names[host]
    scene.stand_ins = (resolve, StandInDialer({(METADATA, 80): ("127.0.0.1",
                                                                port_of(metadata))}))


# The rows about what the proxy reads: every name under the test domain resolves to loopback
# (where the scene's servers are) but the metadata name; none is ever looked up for real.
EVIDENCE_DOMAIN = "evidence.test"
API_NAME = "api.evidence.test"      # a credential's host, with HTTP rules
OTHER_NAME = "other.evidence.test"  # another host, which HTTP rules name (so it is read)
APPROVED_NAME = "approved.evidence.test"  # in no allow list: asked about, and approved
SECRET_SOURCE = "STOCKADE_EVIDENCE_CREDENTIAL"  # a credential's source in the caller's environment


def credential_hosts(*answering: str) -> Setup:
    """The credential's host (`api`, HTTPS) and another host (`other_tls`, `other_plain`),
    servers on loopback under a test CA of the scene's own (the proxy verifies them with
    it), the credential's secret in a file outside (`token_file`), and a stand-in DNS. No
    server may hear a placeholder; those not `answering` may get no whole request."""
    def setup(scene: Scene) -> None:
        need_cryptography()
        pki = scene.root / "pki"
        pki.mkdir()
        ca, certificate = make_ca(str(pki), [API_NAME, OTHER_NAME])
        scene.upstream_ca = ca
        for key, label, certfile in (
                ("api", f"the credential's host {API_NAME} (HTTPS)", certificate),
                ("other_tls", f"another host {OTHER_NAME} (HTTPS)", certificate),
                ("other_plain", f"another host {OTHER_NAME} (plain HTTP)", None)):
            server = scene.watch(WebServer(label, certfile, key in answering))
            scene.values[key] = str(server.port)
        credential_file(scene)
        names = scene.watch(StandInNames({}, EVIDENCE_DOMAIN, "127.0.0.1"))
        scene.stand_ins = (names, StandInDialer({}))
    return setup


def credential_file(scene: Scene) -> None:
    """A credential's secret in a file outside (`token_file`): the proxy reads it, the
    sandbox cannot."""
    need_cryptography()
    scene.values["token_file"] = str(scene.plant_secret("outside/token"))


def guarded_hosts(scene: Scene) -> None:
    """A server on loopback (`web`) and a stand-in of the cloud metadata endpoint (the
    proxy's connections to it reach a server of the scene's), a stand-in DNS that answers the
    metadata address for METADATA_NAME and loopback for every other name of the test domain,
    the credentials' secret in a file outside, and the caller's approval function, which
    allows every destination."""
    credential_file(scene)
    scene.values["web"] = str(scene.watch(WebServer("a host server on loopback")).port)
    metadata = scene.watch(WebServer("the stand-in metadata endpoint"))
    names = scene.watch(StandInNames({METADATA_NAME: [METADATA]}, EVIDENCE_DOMAIN, "127.0.0.1"))
    scene.stand_ins = (names, StandInDialer({(METADATA, 80): ("127.0.0.1", metadata.port)}))
    scene.watch(Approver())


def approved_host(scene: Scene) -> None:
    """A server on loopback (`web`) that every name of the test domain resolves to, and the
    caller's approval function, which allows every destination."""
    scene.values["web"] = str(scene.watch(WebServer("the approved host", answers=True)).port)
    names = scene.watch(StandInNames({}, EVIDENCE_DOMAIN, "127.0.0.1"))
    scene.stand_ins = (names, StandInDialer({}))
    scene.watch(Approver())


def credential_secrets(scene: Scene) -> None:
    """Two credentials' secrets where a user keeps them: one in the launching process's
    environment (SECRET_SOURCE), one in a credential store of the home (~/.git-credentials,
    which the presets deny); for the attack, the end of each, reversed (`probes`: it never
    holds one whole)."""
    need_cryptography()
    fake_home(scene)
    value = "evidence-secret-" + secrets.token_hex(12)
    scene.host_env[SECRET_SOURCE] = value
    scene.secrets.append(value)
    stored = (scene.home / ".git-credentials").read_text()
    scene.values["probes"] = ",".join(secret[-20:][::-1] for secret in (value, stored))


def host_prober(scene: Scene) -> None:
    """A free port the attack will listen on, and a host thread trying to connect to it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scene.values["listen_port"] = str(port)
    scene.watch(Prober(port))


def abstract_socket(scene: Scene) -> None:
    """A server on an abstract unix socket of the host."""
    name = f"{scene.marker}-abstract"
    scene.watch(unix_server("\0" + name, "host abstract unix socket"))
    scene.values["abstract"] = name


def path_socket(scene: Scene) -> None:
    """A server on a unix socket file in the outside tree."""
    scene.watch(unix_server(str(scene.outside / "host.sock"), "host unix socket file"))


def socket_in_workspace(scene: Scene) -> None:
    """A host server on a unix socket file inside the workspace (a dev server's, an agent's)."""
    scene.watch(unix_server(str(scene.ws / "host.sock"), "host unix socket in the workspace"))


def state_in_workspace(scene: Scene) -> None:
    """A running `stockade daemon` whose state directory lies inside the workspace (as for a
    command started from $HOME): the launch's own compile sees it, as the CLI's would."""
    import stockade

    state = scene.ws / "state"
    scene.host_env["STOCKADE_STATE_DIR"] = str(state)
    scene.watch(StockadeDaemon(str(state), str(Path(stockade.__file__).resolve().parent.parent)))
    scene.values["state"] = str(state)


CHANGE_SET = "0" * 32


def change_set_store(scene: Scene) -> None:
    """Stockade's state directory outside every root (`{state}`), holding a pending change
    set whose upper layer (`{upper}`) has a directory and a file with an extended attribute:
    their modes and attributes, and the state directory's, must stay as they are."""
    state = scene.root / "state"
    upper = state / "changes" / CHANGE_SET / "upper"
    (upper / "dir").mkdir(parents=True)
    for directory in (state, state / "changes", upper.parent, upper, upper / "dir"):
        os.chmod(directory, 0o700)
    kept = scene.plant(f"state/changes/{CHANGE_SET}/upper/dir/file", "a change\n")
    try:
        os.setxattr(kept, "user.kept", b"1")
    except OSError as exc:
        raise NotRunnable(f"no user extended attributes where scenes live ({exc.strerror})"
                          ) from None
    scene.host_env["STOCKADE_STATE_DIR"] = str(state)
    scene.values.update(state=str(state), upper=str(upper))
    scene.watch(Attributes(state, "state directory"))


def caller_terminal(scene: Scene) -> None:
    """The caller (`execute` relaying to its own streams, as the command line does) runs on a
    host terminal, with a secret line typed on it."""
    typed = f"typed-{scene.secret}\n"
    scene.secrets.append(typed.strip())
    scene.watch(CallerTerminal(typed.encode()))


def appended_file(limit: int) -> Setup:
    def setup(scene: Scene) -> None:
        """The caller's stdout is appended to a host file holding earlier lines."""
        scene.watch(AppendedFile(scene.root / "host.log", limit))
    return setup


def privilege_bits(scene: Scene) -> None:
    """The workspace is watched for files left setuid, setgid or with a file capability."""
    scene.watch(NoPrivilegeBits(scene.ws))


def planted_root_link(scene: Scene) -> None:
    """An earlier run's `ln -s OUTSIDE build` in the workspace."""
    (scene.ws / "build").symlink_to(scene.outside)


def inherited_socket(scene: Scene) -> None:
    """One end of a connected socket pair left inheritable in the launching process."""
    scene.watch(InheritedSocket())


def victim(scene: Scene) -> None:
    """A host process that must stay alive, unsignalled and untraced."""
    tag = f"evidence-victim-{secrets.token_hex(6)}"
    scene.values.update(victim=str(scene.watch(Victim(tag)).pid), victim_tag=tag)


def host_terminal(scene: Scene) -> None:
    """The child's stdin is a terminal of the host (the policy inherits stdin)."""
    scene.stdin = "inherit"
    scene.watch(HostTerminal())


def setuid_program(scene: Scene) -> None:
    """A set-user-id program owned by another user: as root, a copy of `sleep` owned by nobody;
    otherwise one of the system's own (owned by root) that waits on a terminal."""
    if os.geteuid() == 0:
        directory = scene.root / "setuid"
        directory.mkdir()
        program = directory / "sleep"
        shutil.copy("/usr/bin/sleep", program)
        os.chown(program, NOBODY, NOBODY)
        os.chmod(program, 0o4755)
        scene.read_roots.append(str(directory))
        scene.values.update(setuid=str(program), setuid_arg="5")
        return
    for name in WAITING_SETUID:
        path = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if path and _foreign_setuid(path):
            scene.values.update(setuid=path, setuid_arg="")
            return
    raise NotRunnable("no set-user-id program owned by another user is installed")


def _foreign_setuid(path: str) -> bool:
    info = os.stat(path)
    return bool(info.st_mode & stat.S_ISUID) and info.st_uid != os.getuid()


def mount_point(scene: Scene) -> None:
    """A directory in the workspace to mount on; no host mount may appear below the scene."""
    (scene.ws / "mnt").mkdir()
    scene.watch(NoMounts(scene.root))


def parent_secrets(scene: Scene) -> None:
    """Secrets in the launching process's environment, as an agent's credentials would be."""
    for name in SECRET_VARIABLES:
        value = "evidence-secret-" + os.urandom(12).hex()
        scene.host_env[name] = value
        scene.secrets.append(value)


SECRET_VARIABLES = ("STOCKADE_EVIDENCE_SECRET", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN",
                    "OPENAI_API_KEY")
LOADER_VARIABLES = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONSTARTUP", "BASH_ENV")


def loader_injection(scene: Scene) -> None:
    """Loader-injection variables in the launching process's environment."""
    evil = scene.plant("evil/libevil.so", "not really a library\n")
    for name in LOADER_VARIABLES:
        scene.host_env[name] = str(evil)
        scene.secrets.append(str(evil))


def credential_in_environment(scene: Scene) -> None:
    """A token in the launching process's environment that the row's policy tries to pass."""
    scene.host_env["GITHUB_TOKEN"] = "evidence-secret-" + os.urandom(12).hex()


HOME_SECRETS = (".ssh/id_ed25519", ".aws/credentials", ".netrc", ".git-credentials",
                ".config/gh/hosts.yml", ".docker/config.json", ".kube/config", ".pypirc")


def fake_home(scene: Scene) -> None:
    """A home directory with keys, credentials and shell history (all of them secrets)."""
    for name in (*HOME_SECRETS, ".bash_history"):
        scene.plant_secret(f"home/{name}")
    # (where the private homes of filesystem.home = "private" are, Stockade makes them, not
    # the attack: in the home when the scene's seal key's directory is in it)
    ignored = os.path.relpath(scene.key_dir + SUFFIX, scene.home)
    scene.watch(Unchanged(scene.home, "home", () if ignored.startswith("..") else (ignored,)))


def passwd_home(scene: Scene) -> None:
    """A home the password database names (the scene's `passwd_home`) that HOME does not
    (sudo -E, a CI runner, a tool that sets HOME), holding the credential stores the presets
    deny, each with a secret."""
    for name in HOME_SECRETS:
        scene.plant_secret(f"passwd-home/{name}")
    scene.passwd_home = scene.values["passwd_home"] = str(scene.root / "passwd-home")
    scene.watch(Unchanged(scene.root / "passwd-home", "the password database's home"))


def bound_vault(scene: Scene) -> None:
    """Secrets in a vault at paths the row's policy denies (a directory and a file), the
    vault bound at a second path and its key bound on a file of the workspace (bind mounts on
    the host, root's, undone after)."""
    scene.plant_secret("vault/keys/id")
    scene.plant_secret("vault/token")
    scene.plant("ws/bound")
    (scene.root / "alias").mkdir()
    for source, point in ((scene.root / "vault", scene.root / "alias"),
                          (scene.root / "vault" / "keys" / "id", scene.ws / "bound")):
        mounted(scene, BindMount(source, point))
    scene.values.update(vault=str(scene.root / "vault"), alias=str(scene.root / "alias"))
    scene.watch(Unchanged(scene.root / "vault", "the vault"))


def _stockade_made(scene: Scene) -> tuple[str, ...]:
    """What a launch whose write root is the home makes there itself (relative names): each
    state directory of the scene's environment in the home, and the private homes' (beside
    the seal key's directory), made to be masked (compile.py), never by the attack."""
    places = [*statedir.candidates(scene.host_env, str(scene.home)), scene.key_dir + SUFFIX]
    relative = (os.path.relpath(place, scene.home) for place in places)
    return tuple(name for name in relative if not name.startswith(".."))


def _home_as_workspace(scene: Scene) -> None:
    """The home ready to be a workspace, as the refusal of a missing denied path in a write
    root asks (compile.py): each credential store of the home the presets deny made, a known
    credential file holding a secret, anything else a directory."""
    for path in DENY_DEFAULTS:
        name = path.removeprefix("{home}/")
        if name == path:
            continue
        if is_deny_file(name):
            scene.plant_secret(f"home/{name}")
        else:
            (scene.home / name).mkdir(parents=True, exist_ok=True)


# Code a host program runs from the home (policy.model.HOME_CODE), existing in the row's home:
# git's configuration, a program on PATH, this Python's user site-packages.
USER_SITE = f".local/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
HOME_CODE_FILES = {".config/git/config": "[user]\n\tname = me\n",
                   ".local/bin/tool": "#!/bin/sh\nexit 0\n", f"{USER_SITE}/tool.pth": "\n"}


def home_code(scene: Scene) -> None:
    """The home, the row's workspace, holding code host programs run (HOME_CODE_FILES). It
    must stay as it is: the launch makes nothing in it either (issue 29 D1)."""
    _home_as_workspace(scene)
    for name, content in HOME_CODE_FILES.items():
        scene.plant(f"home/{name}", content)
    scene.watch(Unchanged(scene.home, "home (holding its code)", _stockade_made(scene)))


def other_private_home(scene: Scene) -> None:
    """The seal key's directory where a rootless user's is, in the home (the row's workspace)
    as the password database names it, and beside it (`{homes}`) the private home of another
    workspace (the scene's `ws`: `{other_home}`) as Stockade made it, holding the git
    configuration that workspace's next run reads; the run's environment names another state
    directory (issue 29, H2: the homes' place does not follow it). The homes' directory must
    stay as it is but for the run's own home, which its launch makes there."""
    from stockade.lifecycle import homes

    _home_as_workspace(scene)
    # (not below a hidden entry of the home: those are kept whole, homecode.py, and the row
    # proves the homes' own mask)
    scene.key_dir = str(scene.home / "state" / "stockade")
    scene.host_env["STOCKADE_STATE_DIR"] = str(scene.outside / "state")
    other = homes.home_for(os.path.realpath(scene.ws), scene.key_dir)
    homes.ensure(other)
    Path(other, homes.GIT_CONFIG).write_text("[user]\n\tname = other\n")
    own = os.path.basename(homes.home_for(os.path.realpath(scene.home), scene.key_dir))
    scene.values.update(homes=scene.key_dir + SUFFIX, other_home=other)
    scene.watch(Unchanged(Path(scene.key_dir + SUFFIX), "the private homes' directory",
                          (own, f"{homes.RECORDS}/{own}")))


def heartbeat(then: Setup = nothing) -> Setup:
    """`then`, plus a host heartbeat measured while the attack runs."""
    def setup(scene: Scene) -> None:
        then(scene)
        scene.watch(Heartbeat())
    setup.__doc__ = f"{(then.__doc__ or '').strip()} A host heartbeat runs meanwhile."
    return setup


def cancel_once_running(processes: int, bound: float = 10.0) -> Setup:
    """The caller cancels the launch once `processes` of the attack's processes run (on the
    host's /proc), or after `bound` seconds: a cancel that came before the daemon existed would
    pass without testing anything."""
    def setup(scene: Scene) -> None:
        scene.cancel = threading.Event()

        def cancel() -> None:
            deadline = time.monotonic() + bound
            while len(processes_with(scene.marker)) < processes and time.monotonic() < deadline:
                time.sleep(0.02)
            scene.cancel.set()
        threading.Thread(target=cancel, daemon=True).start()
    setup.__doc__ = f"The caller cancels the launch once {processes} of its processes run."
    return setup


def fill_target(limit: int) -> Setup:
    """Where the disk-fill attack writes in the workspace; its size is checked on the host."""
    def setup(scene: Scene) -> None:
        scene.values["fill"] = str(scene.ws / "fill")
        scene.watch(AtMost(scene.ws / "fill", limit))
    setup.__doc__ = f"The workspace file the attack fills may hold at most {limit} bytes."
    return setup


def soak_workspaces(count: int) -> Setup:
    """One workspace per concurrent launch, below the scene; no residue may appear."""
    def setup(scene: Scene) -> None:
        for index in range(count):
            Path(scene.root, "soak", f"{index:02d}").mkdir(parents=True)
        scene.watch(NoResidue())
    setup.__doc__ = f"{count} disjoint workspaces, one per launch; no residue may appear."
    return setup
