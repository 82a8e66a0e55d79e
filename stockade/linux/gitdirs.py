"""What stays read-only in a repository when `.git` is guarded (`filesystem.git = "guarded"`,
the default): git works — objects, refs, the index, logs, stashes, rebases and new worktrees
are all writable — but what makes git run code later, or read another gitdir or configuration,
is not.

For every gitdir found in a write root (a `.git` directory; the gitdir a `.git` file names; the
common dir a gitdir's `commondir` names; each linked worktree's gitdir, `worktrees/*`; each
submodule's, `modules/**`), these are mounted read-only where they lie in a write root:

- `config` of a common dir (a linked worktree's gitdir has none git reads), and
  `config.worktree`: what git runs is set there (core.fsmonitor, core.sshCommand, core.pager,
  aliases, filter and diff drivers, credential helpers, hooks paths, ...);
- each file those include (`include.path`, `includeIf.*.path`, whatever the condition), and the
  files those include, as git follows them;
- `hooks/` of a common dir, and the directory `core.hooksPath` names (relative to each work
  tree of the gitdir, as git runs hooks there);
- the pointers that decide which gitdir and configuration git uses: `.git` files, `commondir`
  and a linked worktree's `gitdir`.

What git would read there but is missing at launch, the command could create. Inside a gitdir
(`hooks/`, `config`, `config.worktree` once `extensions.worktreeConfig` is on, an include kept
there) it is made empty first, as git makes them: an empty hooks directory or configuration
changes nothing git does. Elsewhere (an include or a hooks path in a work tree, or the gitdir a
pointer names) the launch is refused. A `commondir` cannot be made so, since its presence alone
changes which directory git uses; one a command adds to a gitdir that has none is not covered
(SECURITY.md says so). Only a launch makes anything: a view prepared ahead of one (a zygote's
template, a CLI server's skeleton) is built while no run is going on, when the host may be
changing or removing the workspace (a program deleting its workspace after `stockade.run`
returned found `.git/config` made again meanwhile); where something would be made, it is not
prepared, and the next launch makes it.

Only these places are looked at: objects, refs and logs are never read here (protect.py's walk
still looks at every file, for hard links and sockets). Symbolic links are not followed where
the command could replace them: one at any of these places, or on the way to an include or a
gitdir, that lies in a write root is refused (`unenforceable:filesystem.git`).
"""

from __future__ import annotations

import os
import stat

from stockade.errors import UnenforceableError
from stockade.linux import gitconfig

MAX_INCLUDE_DEPTH = 10  # git's own
MAX_CONFIG_BYTES = 1 << 20
MAX_MODULE_DEPTH = 16   # submodule names with slashes nest their gitdirs below modules/
CAPABILITY = "filesystem.git"


class Repositories:
    """The repositories met in the write roots `roots` (canonical paths), and what of them is
    guarded: `found` each `.git` the walk meets, then ask `guarded`."""

    def __init__(self, roots: list[str], make: bool = True) -> None:
        self.roots = roots
        self.make = make  # whether what is missing may be made (at a launch only)
        self.tops: dict[str, set[str]] = {}      # gitdir -> its work trees' top directories
        self.common: dict[str, str | None] = {}  # gitdir -> its common dir (None: unknown)
        self.objects: dict[str, bool] = {}       # guarded path -> is a directory
        self.configs: dict[str, list[gitconfig.Entry]] = {}

    def found(self, path: str, is_dir: bool) -> None:
        """A `.git` directory or file at `path` (canonical), met by the walk."""
        top = os.path.dirname(path)
        if is_dir:
            self._gitdir(path, top)
            return
        self._guard(path, False)
        target = self.pointer(path, "gitdir: ")
        if target is not None:
            self._gitdir(target, top)

    def guarded(self) -> list[tuple[str, bool]]:
        """Every object to mount read-only, with whether it is a directory; what is missing
        inside a gitdir made first. Raises UnenforceableError for what cannot be kept."""
        for gitdir in list(self.tops):
            common = self.common[gitdir]
            chain: list[str] = []
            if common == gitdir:
                self._require(os.path.join(gitdir, "config"), False, made=True)
                self._require(os.path.join(gitdir, "hooks"), True, made=True)
            if common is not None:
                chain += self._chain(os.path.join(common, "config"), gitdir)
            worktree = os.path.join(gitdir, "config.worktree")
            if os.path.lexists(worktree) or self._worktree_config(chain):
                self._require(worktree, False, made=True)
                chain += self._chain(worktree, gitdir)
            self._hooks_paths(gitdir, chain)
        return list(self.objects.items())

    # --- finding the gitdirs ---------------------------------------------------------------

    def _gitdir(self, path: str, top: str | None = None) -> None:
        if path in self.tops:
            self.tops[path].update({top} if top else ())
            return
        self.tops[path] = {top} if top else set()
        pointer = os.path.join(path, "commondir")
        mode = self._mode(pointer)
        if mode is not None:
            self._guard(pointer, stat.S_ISDIR(mode))
            common = self.pointer(pointer, "") if stat.S_ISREG(mode) else None
            self.common[path] = common
            if common is not None:
                self._gitdir(common)
            backlink = os.path.join(path, "gitdir")  # a linked worktree's, to its `.git` file
            if self._mode(backlink) is not None:
                self._guard(backlink, False)
                self.tops[path].update(_work_tree_of(backlink))
            return
        self.common[path] = path
        for linked in self._entries(os.path.join(path, "worktrees")):
            self._gitdir(linked)
        self._modules(os.path.join(path, "modules"), 0)

    def _modules(self, directory: str, depth: int) -> None:
        """Submodules' gitdirs: the directories below `modules/` holding a HEAD or a config;
        the others are the leading parts of submodule names with slashes."""
        for entry in self._entries(directory):
            if any(os.path.lexists(os.path.join(entry, name)) for name in ("HEAD", "config")):
                self._gitdir(entry)
            elif depth < MAX_MODULE_DEPTH:
                self._modules(entry, depth + 1)

    def _entries(self, directory: str) -> list[str]:
        """The directories in `directory` (none if it is not one), refusing symbolic links."""
        if self._mode(directory) is None or not os.path.isdir(directory):
            return []
        found = []
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            mode = self._mode(path)
            if mode is not None and stat.S_ISDIR(mode):
                found.append(path)
        return found

    # --- configuration ---------------------------------------------------------------------

    def _chain(self, config: str, gitdir: str, depth: int = 0) -> list[str]:
        """`config` and every file it includes, as git follows them, each guarded where it lies
        in a write root; those that are files, in the order git reads them."""
        entries = self._entries_of(config)
        if entries is None:
            return []
        chain = [config]
        for section, _, key, value in entries:
            if key != "path" or section not in ("include", "includeif") or not value:
                continue
            target, exists = self._resolve(os.path.dirname(config), _expand(value),
                                           f"{config} includes {value}, and on the way")
            if target is None or not (exists or self._inside(target)):
                continue  # nothing git can read, or nothing the command can create
            self._require(target, False, made=_within(target, gitdir), why=(
                f"{config} includes {target}, which does not exist: the command could create "
                "it and git would read it; create it (an empty file will do) or remove the "
                "include"))
            if depth + 1 < MAX_INCLUDE_DEPTH:
                chain += self._chain(target, gitdir, depth + 1)
        return chain

    def _entries_of(self, config: str) -> list[gitconfig.Entry] | None:
        """The entries of the configuration file `config`, or None if there is none."""
        if config in self.configs:
            return self.configs[config]
        mode = self._mode(config)
        if mode is None or not stat.S_ISREG(mode):
            return None  # (a directory in its place is guarded as it is: git cannot read it)
        self._guard(config, False)
        try:
            with open(config, "rb") as f:
                data = f.read(MAX_CONFIG_BYTES + 1)
        except OSError:
            return None  # unreadable to the user git runs as, too
        if len(data) > MAX_CONFIG_BYTES:
            raise UnenforceableError(CAPABILITY, f"{config} is larger than {MAX_CONFIG_BYTES} "
                                     "bytes, more than Stockade reads to find what it includes")
        try:
            entries = gitconfig.entries(data.decode("utf-8", "surrogateescape"))
        except ValueError as exc:
            raise UnenforceableError(CAPABILITY, (
                f"{config}: {exc}: Stockade cannot read it as git would, to find what it "
                f"includes; fix it (git config --file {config} --list says whether git "
                "can)")) from None
        self.configs[config] = entries
        return entries

    def _values(self, chain: list[str], section: str, key: str) -> list[str | None]:
        return [value for config in chain for s, sub, k, value in self.configs[config]
                if (s, sub, k) == (section, None, key)]

    def _worktree_config(self, chain: list[str]) -> bool:
        values = self._values(chain, "extensions", "worktreeconfig")
        return bool(values) and gitconfig.truth(values[-1])

    def _hooks_paths(self, gitdir: str, chain: list[str]) -> None:
        """The directories `core.hooksPath` names, relative to where git runs the gitdir's
        hooks: each of its work trees' tops (core.worktree's too), or the gitdir if bare."""
        tops = set(self.tops[gitdir])
        for value in self._values(chain, "core", "worktree"):
            if value:
                tops.add(os.path.normpath(os.path.join(gitdir, _expand(value))))
        for value in self._values(chain, "core", "hookspath"):
            if not value:
                continue
            for top in sorted(tops) or [gitdir]:
                target, _ = self._resolve(top, _expand(value),
                                          f"core.hooksPath = {value} of {gitdir}, on the way")
                if target is not None and self._inside(target):
                    self._require(target, True, made=_within(target, gitdir), why=(
                        f"core.hooksPath of {gitdir} names {target}, which does not exist: "
                        "the command could create hooks there; create the directory or "
                        "change core.hooksPath"))

    # --- paths -----------------------------------------------------------------------------

    def pointer(self, path: str, prefix: str) -> str | None:
        """The directory the pointer file `path` names (a `.git` file's `gitdir: `, or a
        `commondir`), resolved as git resolves it: from the pointer's directory. None if `path`
        is not such a pointer (git refuses it too). A pointer to nothing in a write root is
        refused: the command could make a gitdir there, which git would use."""
        try:
            with open(path, "rb") as f:
                text = f.read(4096).decode("utf-8", "surrogateescape").rstrip("\r\n")
        except OSError:
            return None  # unreadable to the user git runs as, too
        if not text.startswith(prefix):
            return None
        value = text[len(prefix):]
        target, exists = self._resolve(os.path.dirname(path), value,
                                       f"{path} points to {value}, and on the way")
        if target is not None and not (exists and os.path.isdir(target)):
            if self._inside(target):
                raise UnenforceableError(CAPABILITY, (
                    f"{path} points to {target}, which is not a directory: the command could "
                    "make a gitdir there that git would use; remove the pointer or restore "
                    "its target (git worktree repair, git submodule update)"))
            return None
        return target

    def _resolve(self, base: str, path: str, what: str) -> tuple[str | None, bool]:
        """`path` resolved from the directory `base` as the kernel would now: (canonical path,
        whether it exists). A symbolic link on the way that lies in a write root is refused;
        others are followed. (None, False) for a path git cannot use (`%(prefix)/`)."""
        if path.startswith("%("):
            return None, False
        current = "/" if os.path.isabs(path) else base
        parts = [p for p in path.split("/") if p and p != "."]
        links = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                current = os.path.dirname(current)
                continue
            candidate = os.path.join(current, part)
            try:
                mode = os.lstat(candidate).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return os.path.normpath(os.path.join(candidate, *parts)), False
            if stat.S_ISLNK(mode):
                if self._inside(candidate):
                    raise _link(candidate, what)
                links += 1
                if links > 40:
                    return None, False  # ELOOP: git cannot use it either
                current = os.path.realpath(candidate)
                continue
            current = candidate
        return current, True

    def _mode(self, path: str) -> int | None:
        """`path`'s file type and mode (None if missing); a symbolic link in a write root is
        refused, since the command could put anything in its place."""
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(mode) and self._inside(path):
            raise _link(path, f"{path}, which git reads,")
        return mode

    def _require(self, path: str, is_dir: bool, *, made: bool, why: str = "") -> None:
        """Guard `path` (in a write root); if it is missing, make it empty first when `made`
        (refused if this walk makes nothing: a view prepared ahead), else refuse with `why`."""
        if not self._inside(path):
            return
        mode = self._mode(path)
        if mode is None and made and not self.make:
            raise UnenforceableError(CAPABILITY, f"{path} is missing: only a launch makes it, "
                                     "not a view prepared ahead of one")
        if mode is None and made:
            try:
                if is_dir:
                    os.mkdir(path, 0o755)
                else:
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW
                                     | os.O_CLOEXEC, 0o644))
            except FileExistsError:
                pass  # made meanwhile: looked at again below
            except OSError as exc:
                raise UnenforceableError(CAPABILITY, f"{path} is missing and cannot be made "
                                         f"({exc.strerror}), and the command could create "
                                         "it; create it") from None
            mode = self._mode(path)
        if mode is None:
            raise UnenforceableError(CAPABILITY, why or f"{path} does not exist")
        self._guard(path, stat.S_ISDIR(mode))

    def _guard(self, path: str, is_dir: bool) -> None:
        if self._inside(path):
            self.objects.setdefault(path, is_dir)

    def _inside(self, path: str) -> bool:
        return any(_within(path, root) for root in self.roots)


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _expand(value: str) -> str:
    """A path value as git expands it (`~/` and `~user/`; `%(prefix)/` is left to _resolve)."""
    return os.path.expanduser(value) if value.startswith("~") else value


def _work_tree_of(backlink: str) -> set[str]:
    """The top of the work tree a linked worktree's `gitdir` file names (it names the work
    tree's `.git` file); none if unreadable."""
    try:
        with open(backlink, "rb") as f:
            named = f.read(4096).decode("utf-8", "surrogateescape").strip()
    except OSError:
        return set()
    return {os.path.dirname(os.path.normpath(named))} if os.path.isabs(named) else set()


def _link(path: str, what: str) -> UnenforceableError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return UnenforceableError(CAPABILITY, (
        f"{what} {path} is a symbolic link (to {target}) in a write root, which the command "
        "could point elsewhere and no mount can keep in place; replace it with what it points "
        "to"))
