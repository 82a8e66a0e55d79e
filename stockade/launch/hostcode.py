"""The code the host runs next, outside any sandbox: Stockade's own package, the script that
started this process, the interpreter (its prefixes and executable) and every place on its
import path (sys.path, the PYTHONPATH the next call inherits, the user's site-packages, the
directories the .pth files in site-packages name, made yet or not).

A command that may write there plants code the next `stockade ...` (or the program that calls
Stockade) runs on the host: a `.pth` file or a sitecustomize in site-packages, a changed
stockade/__init__.py, a pyvenv.cfg, an entry script. compile.py makes what of it lies inside a
write root read-only in the sandbox's view (`request.host_code`), and refuses what it cannot
keep so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stockade.errors import UnenforceableError
from stockade.lifecycle import aliases

if TYPE_CHECKING:
    from stockade.launch.request import LaunchRequest

# What a place is, for what compile.py may do with it (see `Place.kind`).
KINDS = {
    "package": "Stockade's own package",
    "script": "the script this process runs",
    "prefix": "the interpreter's prefix",
    "interpreter": "the interpreter",
    "import_path": "a directory on the interpreter's import path",
    "user_site": "the user's site-packages",
    "pth_entry": "a directory a .pth file in site-packages names",
    "start": "the program's starting directory (first on its import path)",
    "searched": "a directory this process's imports searched, once on its import path",
    "cwd": "the working directory, which \"\" on the import path names at each import",
    "package_path": "a directory a package's __path__ was given besides its own",
    "linked_entry": "a symbolic link at the top of a directory on the import path",
    "editable": "a path an import finder holds (an editable install's, a plugin loader's)",
    "module": "a module this process imported from outside its import path",
    "pycache_dir": "the bytecode cache of a module this process imports",
    "pycache": "the bytecode cache prefix (PYTHONPYCACHEPREFIX)",
}


@dataclass(frozen=True)
class Place:
    """One place of host code: `path` absolute as the host names it (not resolved); `kind`
    one of KINDS. A "prefix" holds more than code (a write root below /usr is no write to
    the interpreter: its code directories are places of their own); a "start" directory, the
    program's own, is protected only below a write root (a workspace that is the program's
    directory stays writable); a missing "user_site" or "pycache_dir" is made when it lies in
    a write root, to be kept."""

    path: str
    kind: str


def places(host_env: Mapping[str, str]) -> list[Place]:
    """This process's host code, and the PYTHONPATH entries of `host_env` (the environment
    the next call on this host inherits)."""
    import stockade

    found = [Place(os.path.dirname(os.path.abspath(stockade.__file__)), "package")]
    if sys.argv and sys.argv[0] and os.path.isfile(sys.argv[0]):
        found.append(Place(os.path.abspath(sys.argv[0]), "script"))
    found += [Place(os.path.abspath(prefix), "prefix") for prefix in
              {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}]
    if sys.executable:
        found.append(Place(os.path.abspath(sys.executable), "interpreter"))
    entries = list(sys.path)
    # (the entry the interpreter put first, wherever the program moved it: one it put in
    # front of it is no starting directory; attack 33 A6, F1)
    here = _working_directory()  # (None: removed; "" and relative entries then name nothing)
    started_in = stockade._started_in or here
    # (a relative entry is joined to the working directory at each import: to this one, and
    # to the starting directory, where the program's next run imports from; attack 40 T4)
    bases = [base for base in dict.fromkeys([here, started_in]) if base]
    start = _start_entry(started_in) if started_in else None
    if start is None and "" in entries and here == started_in:
        start = ""  # (a program put "" where the interpreter put its directory: ipykernel)
    start_path = None
    if start is not None and start in entries:
        entries.remove(start)
        start_path = _at(start, started_in or "/")
        found.append(Place(start_path, "start"))
    # ("" is the working directory at each import: where the program is now, if it moved
    # away from its start, is searched first by its later imports; attack 35 B8)
    if "" in sys.path and here and here != start_path:
        found.append(Place(here, "cwd"))
    # (a relative entry names a directory from each base whatever path hook takes it: the
    # file system's own takes it once it exists, a hook of the program's own searches it
    # too (attacks 33 A2, 40 T1); one missing there is not made, rather than refused: it may
    # be a hook's key, as setuptools' "__editable__.NAME.finder.__path_hook__" is, which
    # the file system's hook would take once made. PYTHONPATH's relative entries the next
    # call resolves from a working directory not known here)
    found += [Place(path, "import_path" if os.path.isabs(entry) or os.path.lexists(path)
                    else "searched")
              for entry in entries if isinstance(entry, str) and entry
              for path in _located(entry, bases)]
    found += [Place(_at(entry), "import_path") for entry
              in host_env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(entry)]
    # (a directory once on the import path, searched by an import then: the next run
    # searches it again at that point; attack 33 A1; below the starting directory too,
    # which is not kept whole, but for the program's own packages there: attack 35 B9)
    on_path = [place.path for place in found if place.kind in ("import_path", "cwd")]
    own, extended = _package_paths(bases)
    found += [Place(path, "searched") for path in _searched(bases)
              if path != start_path and path not in own
              and not any(aliases.at_or_below(path, entry) for entry in on_path)]
    # (a directory a package's __path__ was given besides its own, as a plugin loader does:
    # every module there is imported as the package's; attack 36 B10)
    found += [Place(path, "package_path") for path in extended]
    user_site = _user_site()
    if user_site:
        found.append(Place(os.path.abspath(user_site), "user_site"))
    named = {place.path for place in found}
    # (and those of every directory on the import path: a program's `site.addsitedir` at
    # run time, as virtualenv's activate_this.py does, reads them; attack 39 S1, S2)
    listing: dict[str, list[os.DirEntry[str]]] = {}  # (each directory listed once)
    found += [Place(entry, "pth_entry") for entry in _pth_entries(
        user_site, [place.path for place in found if place.kind == "import_path"], listing)
        if entry not in named]
    imported = _imported(bases)
    # (a module file a finder holds is judged as the module this process imported: pytest's
    # assertion rewriter keeps those of the tests it imported)
    files = {path for _, path in imported}
    for path in _editable_mappings():
        if path not in files:
            found += _module_places(path, "editable")
    found += [Place(link, "linked_entry") for link in _linked_entries(
        [place.path for place in found if place.kind in ("import_path", "user_site",
                                                          "pth_entry", "editable")],
        listing)]
    # (a module under the starting directory is the program's own only where an import of
    # its name through that directory takes it: the starting directory stays the command's
    # where it is the workspace; attack 31's evidence row, a package another finder imported
    # from a workspace below it)
    # (nor is a module below a prefix covered by it: a prefix holds more than code, and a
    # write root below it is allowed; attack 32 P1-P3)
    directories = [place.path for place in found
                   if place.kind not in ("script", "start", "prefix")]
    starts = [place.path for place in found if place.kind == "start"]
    mounts: list[aliases.Mounts] = []  # (read at the first module found through a start)
    for names, path in imported:
        if any(path.startswith(directory.rstrip("/") + "/") for directory in directories) \
                or any(_found_through(names, path, start) and _lies_in(path, start, mounts)
                       for start in starts):
            continue
        found += _module_places(path, "module")
    # (every module's bytecode, the standard library's too, is read from there when newer
    # than its source by the source's own record: attack 29 N4; a relative one from each
    # base, as the next call here resolves it: attacks 30 N8, 40 T4)
    found += [Place(path, "pycache") for prefix in
              {sys.pycache_prefix, host_env.get("PYTHONPYCACHEPREFIX")} if prefix
              for path in _located(prefix, bases)]
    return list(dict.fromkeys(found))


def _start_entry(started_in: str) -> str | None:
    """What the interpreter put first on sys.path at start-up, as sys.orig_argv tells, from
    the working directory `started_in` (the one when Stockade was first imported: the
    program may have moved since; attack 34 B1, B2, F5): "" (the working directory at each
    import) for -c, a script read from standard input, or none; for -m that directory (where
    sys.path names it); a script's own directory, links resolved; a directory or zip file
    run as a script, as given; None under -P or -I."""
    if sys.flags.safe_path:
        return None
    args = iter(sys.orig_argv[1:])
    for arg in args:
        if arg in ("-", "--check-hash-based-pycs") or arg.startswith("--"):
            if arg == "-":
                return ""
            if arg == "--check-hash-based-pycs":
                next(args, None)  # (its value)
            continue
        if not arg.startswith("-"):
            path = os.path.join(started_in, arg)
            if os.path.isdir(path) or (os.path.isfile(path) and _zip(path)):
                return arg  # (a directory or zip file run whole)
            return os.path.dirname(os.path.realpath(path))
        for at, flag in enumerate(arg[1:], 1):  # (flags run together: -bBc, -Wd, -Xdev)
            if flag == "c":
                return ""
            if flag == "m":
                return started_in if started_in in sys.path else None
            if flag in "WX":
                if at == len(arg) - 1:
                    next(args, None)  # (its value, the next word)
                break
    return ""  # (interactive)


def _zip(path: str) -> bool:
    import zipfile

    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _searched(bases: list[str]) -> list[str]:
    """The places the imports of this process searched (sys.path_importer_cache's keys),
    absolute (a relative one from each of `bases`, and where its finder was made: its
    `path`; attack 40 T4): missing ones too, which the next run searches again once they
    exist (attack 34 B5a)."""
    found: list[str] = []
    for key, finder in list(sys.path_importer_cache.items()):
        if isinstance(key, str) and key:
            path = getattr(finder, "path", None)
            found += _located(key, bases) + ([_at(path)] if isinstance(path, str)
                                             and os.path.isabs(path) else [])
    return list(dict.fromkeys(found))


def _at(path: str, base: str = "") -> str:
    """`path` (a relative one from `base`) absolute, as the kernel resolves it: ".." after
    the directory it follows, links resolved (a package reached through a link that adds
    "its/../plugins" to its path: attack 40 T5), the rest lexically (a link on the way
    keeps its name, for compile.py to judge)."""
    parts = os.path.join(base, path).split(os.sep)
    if ".." not in parts:
        return os.path.normpath(os.sep.join(parts))
    last = len(parts) - parts[::-1].index("..")
    return os.path.normpath(os.path.join(os.path.realpath(os.sep.join(parts[:last]) or "."),
                                         *parts[last:]))


def _located(path: str, bases: list[str]) -> list[str]:
    """Where `path` lies: itself if absolute, else joined to each of `bases`."""
    if os.path.isabs(path):
        return [_at(path)]
    return list(dict.fromkeys(_at(path, base) for base in bases))


def _working_directory() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # (removed while the program ran in it)
        return None


def _package_paths(bases: list[str]) -> tuple[set[str], set[str]]:
    """The directories the packages this process imported search (`__path__`, a relative
    entry from each of `bases`: attacks 37 N2, 40 T4): each one's own — its
    `__init__`'s directory (a module file given a `__path__` has none); for a package with no
    file (a namespace package, one a program made from a spec), its name's directory in each
    entry of the path it was found on — and the
    others a package was given (`__path__.append`, plugin loaders: attacks 36 B10, 37 N1,
    N3)."""
    own: set[str] = set()
    extended: set[str] = set()
    for name, module in list(sys.modules.items()):
        try:
            paths = _absolute_entries(getattr(module, "__path__", None) or (), bases)
            if not paths:
                continue  # (no package: no directory to tell its own from the others)
            origin = getattr(module, "__file__", None)
            if isinstance(origin, str) and os.path.basename(origin).startswith("__init__."):
                homes = {os.path.dirname(path) for path in _located(origin, bases)}
            elif isinstance(origin, str):  # (a module file made a package: none its own;
                homes = set()              # attack 38 P1)
            else:
                parent, _, last = name.rpartition(".")
                found_on = sys.path if not parent else \
                    getattr(sys.modules.get(parent), "__path__", None) or ()
                homes = {os.path.join(entry, last)
                         for entry in _absolute_entries(found_on, bases)}
        except Exception:  # noqa: BLE001 (a module's own attributes may raise: not ours)
            continue
        own.update(path for path in paths if path in homes)
        extended.update(path for path in paths if path not in homes)
    return own, extended - own


def _absolute_entries(entries: object, bases: list[str]) -> list[str]:
    """The import-path `entries` that are strings, absolute (a relative one from each of
    `bases`)."""
    return [path for entry in list(entries) if isinstance(entry, str)
            for path in _located(entry, bases)]


def _editable_mappings() -> list[str]:
    """What the import finders on sys.meta_path hold: the tables setuptools' editable finder
    (`__editable___*_finder`, which a .pth file's `import` line installs for a flat layout)
    keeps in its module, MAPPING and NAMESPACES (a package's directory, or a module's path
    without its suffix): the host imports them from there, though no path entry names them
    (attack 29 N2); and every absolute path the finder or its class holds, as a str or
    os.PathLike, alone or in a list, tuple or table of them: hatchling's `editables` keeps its
    `_redirections` on the finder class (attack 32 E1); scikit-build-core's rebuilding finder
    its build directory, where it runs cmake at import; a plugin loader its directory (attack
    40 T2). Not "/" (a finder's separator, as FrozenImporter's `_SEP`). What this process
    imported through finders that keep their paths otherwise is found by `_imported`."""
    found: list[str] = []
    for finder in sys.meta_path:
        module = sys.modules.get(getattr(finder, "__module__", "") or "")
        holders = [finder] if isinstance(finder, type) else [finder, type(finder)]
        values = [getattr(module, "MAPPING", None), getattr(module, "NAMESPACES", None)] + [
            value for holder in holders
            for value in list(getattr(holder, "__dict__", {}).values())]
        for value in values:
            items = list(value.values()) if isinstance(value, dict) else [value]
            for item in items:
                paths = item if isinstance(item, (list, tuple)) else [item]
                found += [_at(path) for path in map(_path_of, paths)
                          if path and os.path.isabs(path) and path != os.sep]
    return list(dict.fromkeys(found))


def _path_of(value: object) -> str | None:
    """`value` as a path, if it is a str or os.PathLike naming one by a str."""
    try:
        path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    except Exception:  # noqa: BLE001 (a finder's own __fspath__ may raise: not ours)
        return None
    return path if isinstance(path, str) else None


def _imported(bases: list[str]) -> list[tuple[set[str], str]]:
    """The files of the modules this process imported, a package's by its `__init__`, each
    with the names it is known by: the program calling Stockade runs them again, whatever
    finder found them (an editable install's of any kind: attack 30 N7); a relative one
    (a loader given a relative path: attack 40 T3) from each of `bases`."""
    found = []
    for key, module in list(sys.modules.items()):
        if key == "__main__":
            continue  # (the script: run from its source, never from a cache; attack 32 F1)
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path:
            found += [({key, str(getattr(module, "__name__", key))}, located)
                      for located in _located(path, bases)]
    return found


def _lies_in(path: str, start: str, mounts: list[aliases.Mounts]) -> bool:
    """Whether the file at `path` lies in the directory `start` itself: reached through no
    symbolic link out of it and no mount below it, which show the workspace's files there
    (attack 32 S1, S2). `mounts` holds the mount table once it is read."""
    real, top = os.path.realpath(path), os.path.realpath(start)
    if not aliases.at_or_below(real, top):
        return False
    if not mounts:
        mounts.append(aliases.table())
    return not any(point != top and aliases.at_or_below(point, top)
                   and aliases.at_or_below(real, point) for point in mounts[0].at)


def _found_through(names: set[str], path: str, directory: str) -> bool:
    """Whether an import of one of `names` through the path entry `directory` takes the
    module at `path` (directory/a/b.py is `a.b`, directory/a/__init__.py is `a`)."""
    parts = os.path.relpath(path, directory).split(os.sep)
    if parts[0] == "..":
        return False
    stem = parts[-1].split(".", 1)[0]
    return ".".join(parts[:-1] + ([] if stem == "__init__" else [stem])) in names


def _module_places(path: str, kind: str) -> list[Place]:
    """The places of the module at `path`: a package's whole directory (its `__init__`'s,
    or the directory an editable finder names); a module's file (for a path without its
    suffix, each file an import would take: attack 30 N10) with its bytecode cache directory,
    whose forged .pyc an import takes for the source (made, if missing, to be kept); the zip
    file a module was imported from (attack 31 H3)."""
    import importlib.machinery
    import importlib.util

    archive = path
    while not os.path.lexists(archive) and archive != os.path.dirname(archive):
        archive = os.path.dirname(archive)
    if archive != path and os.path.isfile(archive):
        return [Place(archive, kind)]  # (imported from a zip file: the archive is the code)
    if os.path.basename(path).startswith("__init__.") or os.path.isdir(path):
        return [Place(os.path.dirname(path) if not os.path.isdir(path) else path, kind)]
    files = [path] if os.path.splitext(path)[1] else [
        path + suffix for suffix in importlib.machinery.all_suffixes()
        if os.path.lexists(path + suffix)] or [path]
    found = [Place(file, kind) for file in files]
    sources = [file for file in files if file.endswith(".py")]
    if sources:
        found.append(Place(os.path.dirname(importlib.util.cache_from_source(sources[0])),
                           "pycache_dir"))
    return found


def shadowing(path: str) -> list[str]:
    """The other names beside the module file at `path` that an import of its name takes
    first once they exist: a package directory of its name, and a file of another suffix (an
    extension module before the source: attack 31 H1, H2)."""
    import importlib.machinery

    suffixes = importlib.machinery.all_suffixes()
    stem = next((path[:-len(suffix)] for suffix in sorted(suffixes, key=len, reverse=True)
                 if path.endswith(suffix)), None)
    if stem is None or os.path.basename(stem) == "__init__":
        return []  # (no module file; a package's: its directory is kept whole)
    return [stem, *(stem + suffix for suffix in suffixes if stem + suffix != path)]


def links_in(top: str) -> list[str]:
    """Every symbolic link below the directory `top`, its own links not followed."""
    found, pending = [], [top]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        found.append(entry.path)
                    elif entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except OSError:
            continue  # (not a directory, or gone: nothing below it)
    return found


def _listed(directory: str, listing: dict[str, list[os.DirEntry[str]]]
            ) -> list[os.DirEntry[str]]:
    """The entries of `directory` (none if it is not there or no directory), listed once per
    compile in `listing`: its .pth files and the links at its top are read from one listing."""
    if directory not in listing:
        try:
            with os.scandir(directory) as entries:
                listing[directory] = list(entries)
        except OSError:
            listing[directory] = []
    return listing[directory]


def _linked_entries(directories: list[str], listing: dict[str, list[os.DirEntry[str]]]
                    ) -> list[str]:
    """The symbolic links at the top of the import-path `directories`: what each names is
    imported, or run at start-up, as if it lay there (a package, a .pth file or a
    sitecustomize linked in from elsewhere, as `flit install --symlink` links a package;
    attack 28 H6). The program's starting directory is not among them: a workspace that is
    the program's directory stays the command's."""
    found = []
    for directory in dict.fromkeys(directories):
        found += [entry.path for entry in _listed(directory, listing) if entry.is_symlink()]
    return sorted(found)


def _pth_entries(user_site: str | None, more: list[str],
                 listing: dict[str, list[os.DirEntry[str]]]) -> list[str]:
    """The directories the .pth files of the site directories name, as `site` reads them,
    missing ones too: `site` skips a missing one, so it is on no import path now, yet the
    next interpreter started here puts it there once it exists (an editable install whose
    source directory is gone), ahead of what a later .pth names. Hidden ones (`.x.pth`) too:
    `site` skips them only from Python 3.13 on, and a site directory may be shared by several
    of the host's pythons (Debian's /usr/lib/python3/dist-packages); reading more is safe.
    The directories `more` are read too (a site directory added at run time)."""
    import site

    found = []
    for sitedir in dict.fromkeys([*site.getsitepackages(), *([user_site] if user_site else []),
                                  *more]):
        for name in sorted(entry.name for entry in _listed(sitedir, listing)
                           if entry.name.endswith(".pth")):
            try:
                with open(os.path.join(sitedir, name), encoding="utf-8-sig",
                          errors="surrogateescape") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue  # (site skips an unreadable one too)
            found += [_at(line.rstrip(), os.path.abspath(sitedir)) for line in lines
                      if line.strip() and not line.startswith(("#", "import ", "import\t"))]
    return found


def _user_site() -> str | None:
    """The user's site-packages when the interpreter reads it (which it does once it
    exists: a command that makes it plants code in the next run)."""
    import site

    return site.getusersitepackages() if site.ENABLE_USER_SITE else None


# What takes each kind of place out of the write roots (said by every refusal of one).
_REMEDIES = {
    "script": "run the program from outside the write roots",
    "start": "start the program from a directory outside the write roots, or with python -P",
    "searched": "keep the directories the program imports from out of the write roots",
    "cwd": "do not change into the write roots before running Stockade (\"\" on the import "
           "path searches the working directory first), or run the program with python -P",
    "package_path": "keep the directories the program's packages load plugins from out of "
                    "the write roots",
    "import_path": "take it off the import path (PYTHONPATH)",
    "pth_entry": "take it off the import path (remove the .pth file naming it)",
    "user_site": "set PYTHONNOUSERSITE=1",
    "linked_entry": "remove the link from the import path",
    "editable": "uninstall the editable install, or install the project normally (or keep "
                "the paths the program's import finders hold out of the write roots)",
    "module": "the program imported it from there: keep what it imports out of the write "
              "roots",
    "pycache_dir": "the program imported from there: keep what it imports out of the write "
                   "roots",
    "pycache": "unset PYTHONPYCACHEPREFIX",
}


def remedy(kind: str) -> str:
    """What takes a place of `kind` (KINDS) out of the write roots, besides choosing a
    workspace that does not hold it."""
    return _REMEDIES.get(kind, "install Stockade outside the write roots (pipx install "
                               "stockade, or a venv elsewhere) and run it from there")


def refuse_unkept(request: LaunchRequest, where: str, remedy_here: str = "") -> None:
    """Refuse, typed, a launch whose write roots hold code the host runs next
    (request.host_code, each of request.host_code_kinds) in a sandbox that cannot make it
    read-only (`where`), saying what the place is and what takes it out."""
    if request.host_code:
        kind = (request.host_code_kinds or ("package",))[0]
        raise UnenforceableError("filesystem.host_code", (
            f"{request.host_code[0]} ({KINDS[kind]}) is code this host runs outside the "
            f"sandbox and lies in a write root, which {where} cannot keep read-only: "
            f"{remedy(kind)}, choose a workspace that does not hold it"
            f"{', ' + remedy_here if remedy_here else ''}"))
