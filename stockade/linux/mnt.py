"""The sandbox's filesystem view, built in a fresh mount namespace and entered by pivot_root.

Order: every source is opened first (no symlinks followed; a root's descriptor is held, every
other's inode recorded), then a private tmpfs becomes the new root and is populated: roots and
the sandbox's own /dev, /proc and /tmp by depth, then protected names re-mounted read-only, then
denied paths masked. Targets that lie inside host trees are opened without following symlinks
and checked to be the very inode that was surveyed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass

from stockade.errors import SetupError, StockadeError, UnenforceableError
from stockade.launch.request import LaunchRequest
from stockade.linux import dns, hostsockets, overlay, protect
from stockade.linux.mountapi import (
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOEXEC,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
    RESOLVE_BENEATH,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    attach,
    clone_tree,
    file_handle,
    make_rprivate,
    new_fs,
    open_path_nofollow,
    openat2,
    pivot_into,
    set_attrs,
)

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
SYSTEM_DIRS = ("/dev", "/proc", "/tmp")
# What each sandbox has of its own even when its mounts are a view template's copy
# (own_filesystems).
OWN_FILESYSTEMS = ("/proc", "/tmp", "/dev/shm", "/dev/pts")
RO = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
_BENEATH = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS


@dataclass
class _Mount:
    path: str                     # where it appears inside the sandbox
    kind: str                     # read | write | system | protected | keep | deny
    source_fd: int = -1           # held for roots only (see _opened)
    is_dir: bool = True
    tree: int = -1                # a root's clone, taken before the new root exists
    inode: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of what the survey opened
    seen: str = ""                # its part of the survey's identity

    @property
    def depth(self) -> int:
        return 0 if self.path == "/" else self.path.count("/")


@dataclass
class Survey:
    """Everything the view is built from, surveyed: roots (held open), protected objects and
    denied paths (each recorded, see _opened)."""

    roots: list[_Mount]
    guarded: list[_Mount]
    denied: list[_Mount]

    def identity(self) -> bytes:
        """A digest of what was opened (kind, path, the inode with its change time, and the
        filesystem's handle for it). Two surveys with the same identity yield the same view: a
        prepared view is only used when a fresh survey at launch gives its identity (see
        zygote.py). The handle's generation and the change time tell a directory re-made
        under a reused inode number from the one that was bound."""
        parts = [f"{m.kind}\0{m.path}\0{m.seen}" for m in self.roots + self.guarded + self.denied]
        return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).digest()

    def close(self) -> None:
        for m in self.roots + self.guarded + self.denied:
            if m.source_fd >= 0:
                os.close(m.source_fd)
                m.source_fd = -1


def survey(request: LaunchRequest, weaken: frozenset[str] = frozenset(),
           listing: str = hostsockets.OWN, *, make: bool = True) -> Survey:
    """Open every source of the view (no symlinks followed) and find the protected names and
    the host's sockets in the roots (`listing`: the host's /proc/net/unix, hostsockets.py).
    Not `make` (a view prepared ahead): nothing is made on the host (protect.walk).
    `weaken` (tests only) skips layers: "protected", "deny", "deny_links", "unix_sockets"."""
    found = Survey([_Mount(g.path, "read") for g in request.read]
                   + [_Mount(g.path, "write") for g in request.write]
                   + [_Mount(request.cwd, kind) for kind in [hidden_cwd(request)] if kind],
                   [], [])
    try:
        for m in found.roots:
            m.source_fd = _opened(m, open_source(m.path, "filesystem." + m.kind), hold=True)
        for grant in () if "deny" in weaken else request.deny:
            try:
                fd = open_path_nofollow(grant.path)
            except FileNotFoundError:
                continue  # nothing there to hide
            except PermissionError:
                # (below a directory of an owner this namespace does not map, which the
                # command, holding no more than this process, cannot reach either; attack 12)
                continue
            except OSError as exc:
                raise _fail("filesystem.deny", grant.path, exc) from None
            found.denied.append(_Mount(grant.path, "deny"))
            _opened(found.denied[-1], fd)
        mask_sockets = (request.network.unix_sockets == "own"
                        and "unix_sockets" not in weaken)
        protecting = "protected" not in weaken
        linked = {} if "deny_links" in weaken else denied_files(
            request, [m.path for m in found.denied])
        guarded, sockets, aliases = _walk_write_roots(
            request, found.roots, protecting, mask_sockets, tuple(m.path for m in found.denied),
            linked, make)
        # (the roots no walk looks through: the read roots, and a write root that is a file)
        protect.refuse_unfound(linked, [m.path for m in found.roots
                                        if m.kind == "read" or not m.is_dir])
        # (not `protecting`, a test's weakening: nothing re-mounted read-only, multiply-linked
        # files included; the pins stay, unless weakened apart)
        found.guarded = [m for m in guarded if (protecting or m.kind != "protected")
                         and ("pins" not in weaken or m.kind != "keep")]
        for m in found.guarded:  # (a pin that cannot be opened fails the launch, named)
            _opened(m, open_source(m.path, "filesystem.protected" if m.kind == "protected"
                                   else "filesystem.pin"))
        for m in aliases:
            _opened(m, open_source(m.path, "filesystem.deny"))
            found.denied.append(m)
        for m in sockets if mask_sockets else []:
            _opened(m, open_source(m.path, "network.unix_sockets"))
            found.denied.append(m)
        if mask_sockets:
            _mask_host_sockets(request, found, listing)
    except BaseException:
        found.close()
        raise
    return found


def _opened(m: _Mount, fd: int, *, hold: bool = False) -> int:
    """Record what the survey opened at `fd` in `m`; close `fd` unless `hold` (a root's,
    cloned later). A descriptor held per protected, pinned or masked object ran a workspace
    with a thousand hard links out of descriptors (EMFILE): each is found again by its path
    when it is mounted on, and must then be the inode recorded here."""
    try:
        info = os.fstat(fd)
        m.is_dir = stat.S_ISDIR(info.st_mode)
        m.inode = (info.st_dev, info.st_ino)
        handle = file_handle(fd).hex()
        # (a masked path's content is never shown: what it holds may change, as the private
        # homes' directory does with every other workspace's first run; the handle alone
        # tells it from a directory re-made there. Where there is none, the change time does.)
        changed = "" if m.kind == "deny" and handle else str(info.st_ctime_ns)
        m.seen = f"{info.st_dev}:{info.st_ino}:{changed}:{handle}"
    except BaseException:
        os.close(fd)
        raise
    if hold:
        return fd
    os.close(fd)
    return -1


def hidden_cwd(request: LaunchRequest) -> str | None:
    """The kind ("read" or "write") of the root granting the working directory, when only a
    root above /tmp grants it (`read = ["/"]` run from /tmp/x: the sandbox's own /tmp covers
    the host's, and the command could not start there);
    the view then mounts the working directory itself, as that root would. Else None."""
    cwd = request.cwd
    grants = [(g.path, "read") for g in request.read] + [(g.path, "write") for g in request.write]
    holders = [(path, kind) for path, kind in grants if path == cwd or protect_inside(cwd, path)]
    if not holders:
        return None
    path, kind = max(holders, key=lambda holder: (len(holder[0]), holder[1] == "write"))
    # (/tmp only: /proc and /dev are no place for a workspace, and their own instances in
    # the view are read-only)
    if protect_inside(cwd, "/tmp") and protect_inside("/tmp", path):
        return kind
    return None


def _mask_host_sockets(request: LaunchRequest, found: Survey, listing: str) -> None:
    """Masks for the host's listening sockets in any root, read roots too (hostsockets.py)."""
    masked = {m.path for m in found.denied}
    own = [p for p in OWN_FILESYSTEMS + SYSTEM_DIRS if all(r.path != p for r in found.roots)]
    for path in hostsockets.in_roots(listing, [m.path for m in found.roots], own):
        if path not in masked:
            try:
                fd = open_path_nofollow(path)
            except FileNotFoundError:
                continue  # (gone since it was listed)
            except OSError as exc:
                raise _fail("network.unix_sockets", path, exc) from None
            found.denied.append(_Mount(path, "deny"))
            _opened(found.denied[-1], fd)


def identity_now(request: LaunchRequest, weaken: frozenset[str] = frozenset()) -> bytes:
    """The identity a view built now would have (run by the owner, on the host's own view);
    empty when the survey fails: the launch itself then reports why."""
    try:
        found = survey(request, weaken)
    except (OSError, StockadeError):
        return b""
    try:
        return found.identity()
    finally:
        found.close()


def build(request: LaunchRequest, stage: str, weaken: frozenset[str] = frozenset(),
          *, identify: bool = False, proc: int | None = None, resolv_conf: str | None = None
          ) -> tuple[list[str], bytes]:
    """Build the view on `stage` and pivot into it. Returns the protected paths mounted and,
    if `identify` (a view prepared ahead), the survey's identity; else b"". `proc` is the
    detached proc to mount at /proc (default: a fresh one). `resolv_conf`: the sandbox's own
    /etc/resolv.conf (network "any", which is never prepared ahead). `weaken` (tests only) skips
    layers (frame.LAYERS): "mount_view" (then nothing is built: the sandbox keeps its copy
    of the host's mounts), "read_only", "protected", "deny", "noexec", "nosuid"."""
    if "mount_view" in weaken:
        return [], b""
    # A view prepared ahead is built while no run is going on (after one returned, or when
    # the host's mounts changed): it makes nothing in the workspace, which its owner may be
    # removing by then. What is missing is made by the launch that needs it.
    found = survey(request, weaken, hostsockets.parents_listing(), make=not identify)
    roots, guarded, denied = found.roots, found.guarded, found.denied
    identity = found.identity() if identify else b""
    device_fds = {name: open_path_nofollow("/dev/" + name) for name in DEVICES}

    make_rprivate("/")
    layered = overlaid(request, weaken)
    # Every root is cloned before the new root is mounted on `stage`: a root that contains
    # the stage (`/`, or `/tmp` itself) would otherwise carry the view inside it.
    for m in roots:
        m.tree = _tree(m, request, layered, weaken)
    root_fs = new_fs("tmpfs", {"mode": "0755", "size": "1m"}, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
    stage_fd = os.open(stage, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    attach(root_fs, stage_fd)
    for fd in (root_fs, stage_fd):
        os.close(fd)
    base = os.open(stage, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    top = os.dup(base)
    own_devs = {os.fstat(top).st_dev}

    taken = {r.path for r in roots}
    system = [_Mount(p, "system") for p in SYSTEM_DIRS if p not in taken]
    for m in sorted(roots + system, key=lambda m: (m.depth, m.path, m.kind != "system")):
        if m.kind == "system":
            _mount_system(top, own_devs, m.path, request, device_fds, proc, weaken)
        else:
            _mount_root(top, own_devs, m, request.exec_from_write, weaken)
            if m.path == "/":
                # The root now covers the tmpfs: every later lookup must start on top of it.
                os.close(top)
                top = os.open(stage, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    nested = _grants_inside_protected(roots, guarded, layered)
    # (the real directory of each overlaid root: the host's path to it may be covered by now)
    lower = {m.path: m.source_fd for m in roots if m.path in layered}
    for m in guarded:
        if not _below_any(m.path, nested):
            _mount_over(top, m, lower=lower)
    for m in nested:
        _mount_root(top, own_devs, m, request.exec_from_write, weaken - {"read_only"})
    for m in guarded:  # and what is protected below them, over them
        if _below_any(m.path, nested):
            _mount_over(top, m, lower=lower)
    holders = [m for m in denied if m.is_dir and _below_any_path(roots, m.path)]
    regranted = [m for m in roots if _below_any(m.path, holders)]
    later = [m for m in denied if m in holders or _below_any(m.path, regranted)]
    _mask(top, [m for m in denied if m not in later], lower)
    _regrant(top, own_devs, holders, regranted, request.exec_from_write, weaken)
    for m in guarded:  # (what is protected or masked in a root granted back, again over it)
        if _below_any(m.path, regranted):
            _mount_over(top, m, lower=lower)
    _mask(top, [m for m in later if m not in holders], lower)
    if resolv_conf is not None and all(m.path != dns.HOST_CONF for m in denied):
        _own_resolv_conf(top, resolv_conf)  # (a denied one stays masked)
    _refuse_case_aliases(top, [m for m in guarded + denied if not m.is_dir])
    _aliases(top, own_devs, request)
    set_attrs(base, MOUNT_ATTR_RDONLY, recursive=False)
    for fd in (top, base):
        os.close(fd)
    pivot_into(stage)
    found.close()
    return [m.path for m in guarded if m.kind == "protected"], identity


def overlaid(request: LaunchRequest, weaken: frozenset[str] = frozenset()) -> dict[str, int]:
    """The write roots mounted as overlays (filesystem.workspace = "overlay"), each with its
    index in the request (which names its layers in the change set). The "overlay" weakening
    (tests only) mounts them directly: the command then writes the real workspace; without
    the mount view there is no mount at all."""
    if request.workspace != "overlay" or weaken & {"overlay", "mount_view"}:
        return {}
    return {g.path: index for index, g in enumerate(request.write)}


def _tree(m: _Mount, request: LaunchRequest, layered: dict[str, int],
          weaken: frozenset[str]) -> int:
    """A detached copy of root `m`: the real tree, or an overlay over it."""
    if m.kind == "write" and m.path in layered and m.is_dir:
        return overlay.mount(m.source_fd, request.changes_dir, layered[m.path],
                             weakened(_write_attrs(request.exec_from_write), weaken))
    return clone_tree(m.source_fd)


def in_overlay(path: str, layered: dict[str, int]) -> bool:
    """Whether `path` appears inside one of the overlaid write roots."""
    return any(protect_inside(path, root) for root in layered)


def open_source(path: str, key: str) -> int:
    """An O_PATH descriptor on `path` (no symlink followed), or SetupError naming `key`."""
    try:
        return open_path_nofollow(path)
    except OSError as exc:
        raise _fail(key, path, exc) from None


def _fail(key: str, path: str, exc: OSError) -> SetupError:
    why = "a component became a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
    return SetupError("mount_source_invalid", f"{key}: cannot open {path}: {why}", stage="mount")


def denied_files(request: LaunchRequest, denied: list[str]
                 ) -> dict[tuple[int, int], protect.DeniedFile]:
    """The multiply-linked files among and inside the `denied` paths (protect.denied_files),
    but Stockade's own places: those are masked whole and hold what sandboxes wrote (the
    private homes, change sets), whose other names are theirs (a package cache hard-linked
    into a workspace's virtual environment), and walking them would cost every launch a walk
    of every home."""
    own = set(request.stockade_state)
    return protect.denied_files(path for path in denied if path not in own)


def _walk_write_roots(request: LaunchRequest, roots: list[_Mount], protecting: bool,
                      mask_sockets: bool, masked: tuple[str, ...],
                      linked: dict[tuple[int, int], protect.DeniedFile], make: bool
                      ) -> tuple[list[_Mount], list[_Mount], list[_Mount]]:
    """Re-mounts for protected names and repositories in write roots (protect.guards), pins
    of the directories above them and above the `masked` paths (and, `mask_sockets`, above the
    unix socket files, which are masked), and masks for those socket files and for the other
    names of the `linked` denied files; not yet opened. Not `protecting` (a test's
    weakening), no name or `.git` is protected, nothing made."""
    writes = [(m.path, m.source_fd) for m in roots if m.kind == "write" and m.is_dir]
    names, git = (frozenset(request.protected), request.git) if protecting \
        else (frozenset(), "writable")
    # (the directories of the names the command may not make are pinned: namewatch.c
    # knows each by its inode, which a rename would carry away)
    walked = protect.walk(writes, names, git, masked + request.unmade,
                          pin_sockets=mask_sockets,
                          readonly=request.host_code + request.home_code, denied=linked,
                          shown_in=tuple(m.path for m in roots), make=make)
    return ([_Mount(g.path, g.kind, is_dir=g.is_dir) for g in walked.guards],
            [_Mount(path, "deny", is_dir=False) for path in walked.sockets],
            [_Mount(path, "deny", is_dir=False) for path in walked.aliases])


def protect_inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def _target(top: int, own_devs: set[int], path: str, *, is_dir: bool, create: bool) -> int:
    """Open `path` inside the new root without following symlinks; create it only where it
    would lie on the sandbox's own tmpfs, never inside a host tree."""
    fd = os.dup(top)
    parts = [p for p in path.split("/") if p]
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        try:
            nxt = openat2(fd, part, os.O_PATH, _BENEATH)
        except FileNotFoundError:
            if not create or os.fstat(fd).st_dev not in own_devs:
                os.close(fd)
                raise
            if last and not is_dir:
                os.close(os.open(part, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC,
                                 0o600, dir_fd=fd))
            else:
                os.mkdir(part, 0o755, dir_fd=fd)
            nxt = openat2(fd, part, os.O_PATH, _BENEATH)
        os.close(fd)
        fd = nxt
    return fd


def _mount_root(top: int, own_devs: set[int], m: _Mount, exec_from_write: bool,
                weaken: frozenset[str]) -> None:
    if m.kind == "read":
        attrs = RO if "read_only" not in weaken else MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
    else:
        attrs = _write_attrs(exec_from_write)
    set_attrs(m.tree, weakened(attrs, weaken))
    target = _target(top, own_devs, m.path, is_dir=m.is_dir, create=True)
    attach(m.tree, target)
    for fd in (m.tree, target):
        os.close(fd)
    m.tree = -1


def _write_attrs(exec_from_write: bool) -> int:
    return MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (0 if exec_from_write else MOUNT_ATTR_NOEXEC)


def weakened(attrs: int, weaken: frozenset[str]) -> int:
    """The mount attributes of a root, /tmp or /dev/shm, less what a test's weakening takes
    away ("nosuid", "noexec")."""
    if "nosuid" in weaken:
        attrs &= ~MOUNT_ATTR_NOSUID
    if "noexec" in weaken:
        attrs &= ~MOUNT_ATTR_NOEXEC
    return attrs


def _grants_inside_protected(roots: list[_Mount], guarded: list[_Mount],
                             layered: dict[str, int]) -> list[_Mount]:
    """The write roots granted inside a protected object of another write root
    (`home/.codex/x` with `home` a write root), each with a fresh clone to mount. Such a root
    is an exact grant, which wins: it is mounted again over the read-only re-mount, and then
    what is protected inside it is re-mounted over it, as in any write root."""
    protected = [g.path for g in guarded if g.kind == "protected"]
    nested = [m for m in roots if m.kind == "write"
              and any(m.path == p or protect_inside(m.path, p) for p in protected)]
    for m in nested:
        if m.path in layered:  # (one overlay per upper layer: the first is unmounted)
            raise UnenforceableError(
                overlay.CAPABILITY, f"the write root {m.path} lies inside a protected "
                "name of another write root, which an overlaid workspace cannot honour")
        m.tree = clone_tree(m.source_fd)
    return nested


def _below_any(path: str, roots: list[_Mount]) -> bool:
    return any(protect_inside(path, m.path) for m in roots)


def _below_any_path(roots: list[_Mount], path: str) -> bool:
    return any(protect_inside(m.path, path) for m in roots)


def _regrant(top: int, own_devs: set[int], holders: list[_Mount], regranted: list[_Mount],
             exec_from_write: bool, weaken: frozenset[str]) -> None:
    """Cover each denied directory that holds roots (the private homes' directory, holding
    the run's own home: compile.py) with an empty tmpfs of its own, mount those roots on it
    again, and make it read-only: nothing else of what it hides shows. Where the view shows
    nothing of the host's there (its own tmpfs, no root above), nothing is hidden."""
    covers = []
    for m in holders:
        try:
            target = openat2(top, m.path.lstrip("/"), os.O_PATH, _BENEATH)
        except FileNotFoundError:
            continue
        try:
            info = os.fstat(target)
            if info.st_dev in own_devs:
                continue
            if (info.st_dev, info.st_ino) != m.inode:
                raise _changed(m)
            cover = new_fs("tmpfs", {"mode": "0755", "size": "16k"},
                           MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)
            attach(cover, target)
        finally:
            os.close(target)
        own_devs.add(os.fstat(cover).st_dev)  # (so that the roots' mount points are made)
        covers.append((m, cover))
    for m in sorted(regranted, key=lambda m: (m.depth, m.path)):
        if any(protect_inside(m.path, held.path) for held, _ in covers):
            m.tree = clone_tree(m.source_fd)
            _mount_root(top, own_devs, m, exec_from_write, weaken)
    for _, cover in covers:
        set_attrs(cover, MOUNT_ATTR_RDONLY, recursive=False)
        os.close(cover)


def _mount_over(top: int, m: _Mount, mask: int | None = None,
                lower: dict[str, int] | None = None) -> None:
    """Re-mount a protected object read-only on itself, or cover a denied one with a mask.

    Inside an overlaid write root the object seen there is the overlay's, another inode than
    the real one surveyed: a protected object is covered by the real one, read-only (the one
    the survey recorded, so nothing written in the upper layer can stand in for it); a directory
    kept in place is pinned as the overlay shows it; a denied one is masked by its path."""
    try:
        target = openat2(top, m.path.lstrip("/"), os.O_PATH, _BENEATH)
    except FileNotFoundError:
        return  # not visible inside the sandbox at all
    try:
        same = os.fstat(target)
        overlaid_here = in_overlay(m.path, lower or {})
        if overlaid_here and stat.S_ISDIR(same.st_mode) != m.is_dir:
            raise _changed(m)
        if not overlaid_here and (same.st_dev, same.st_ino) != m.inode:
            raise _changed(m)
        if m.kind == "deny":
            tree = clone_tree(mask, recursive=False)
            set_attrs(tree, RO | MOUNT_ATTR_NOEXEC, recursive=False)
        elif overlaid_here and m.kind == "protected":
            tree = _real_tree(m, lower or {})
            set_attrs(tree, RO)
        else:
            tree = clone_tree(target)
            set_attrs(tree, RO if m.kind == "protected" else 0)
        attach(tree, target)
        os.close(tree)
    finally:
        os.close(target)


def _real_tree(m: _Mount, lower: dict[str, int]) -> int:
    """A clone of the real object at `m.path`, found below the real directory of the overlaid
    root holding it (`lower`), which must be the one the survey recorded."""
    root = max((r for r in lower if protect_inside(m.path, r)), key=len)
    try:
        source = openat2(lower[root], os.path.relpath(m.path, root), os.O_PATH, _BENEATH)
    except OSError as exc:
        raise _fail("filesystem.protected", m.path, exc) from None
    try:
        info = os.fstat(source)
        if (info.st_dev, info.st_ino) != m.inode:
            raise _changed(m)
        return clone_tree(source)
    finally:
        os.close(source)


def _changed(m: _Mount) -> SetupError:
    return SetupError("mount_target_changed",
                      f"{m.path} changed while the sandbox was being built", stage="mount")


def _mask(top: int, denied: list[_Mount], lower: dict[str, int]) -> None:
    """Cover each denied path with an inaccessible (mode 000) empty directory or file, made on
    a detached tmpfs of their own, which is never in the view itself."""
    if not denied:
        return
    holder = new_fs("tmpfs", {"mode": "0700", "size": "4k"},
                    MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)
    os.mkdir("d", 0, dir_fd=holder)
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0, dir_fd=holder))
    masks = {True: openat2(holder, "d", os.O_PATH, _BENEATH),
             False: openat2(holder, "f", os.O_PATH, _BENEATH)}
    for m in denied:
        _mount_over(top, m, mask=masks[m.is_dir], lower=lower)
    for fd in (*masks.values(), holder):
        os.close(fd)


def _own_resolv_conf(top: int, text: str) -> None:
    """Cover /etc/resolv.conf (a file, or a symbolic link, which is covered itself, not
    followed) with a read-only file of the sandbox's own holding `text` (dns.py). Nothing is
    done where the view has no /etc/resolv.conf (no /etc granted)."""
    try:
        target = openat2(top, dns.HOST_CONF.lstrip("/"), os.O_PATH | os.O_NOFOLLOW, _BENEATH)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EXDEV, errno.ELOOP):
            return  # (not in the view, or not plainly beneath its root)
        raise
    holder = new_fs("tmpfs", {"mode": "0755", "size": "16k"},
                    MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)
    try:
        if stat.S_ISDIR(os.fstat(target).st_mode):
            return
        fd = os.open("resolv.conf", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644,
                     dir_fd=holder)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        source = openat2(holder, "resolv.conf", os.O_PATH, _BENEATH)
        tree = clone_tree(source, recursive=False)
        os.close(source)
        set_attrs(tree, RO | MOUNT_ATTR_NOEXEC, recursive=False)
        attach(tree, target)
        os.close(tree)
    finally:
        os.close(holder)
        os.close(target)


def _refuse_case_aliases(top: int, files: list[_Mount]) -> None:
    """A mount covers one name. On a filesystem that folds case without the kernel knowing
    (FUSE), another spelling of a protected or denied *file* reaches the file itself, beside
    the mount. Directories cannot alias like that. Such a filesystem cannot be protected by
    mounts: refuse it."""
    for m in files:
        parent, name = os.path.split(m.path)
        alias = name.swapcase()
        if alias == name:
            continue
        try:
            fd = openat2(top, os.path.join(parent, alias).lstrip("/"), os.O_PATH, _BENEATH)
        except OSError:
            continue  # no such spelling: the filesystem does not fold case
        try:
            reached = os.fstat(fd)
            same_file = (reached.st_dev, reached.st_ino) == m.inode
            covered = m.kind == "protected" and os.fstatvfs(fd).f_flag & os.ST_RDONLY
        finally:
            os.close(fd)
        if same_file and not covered:
            raise UnenforceableError(
                "filesystem.case_alias",
                f"{m.path} can be reached as {alias} on a case-folding filesystem that "
                "mounts cannot cover; keep protected and denied files off it")


def _mount_system(top: int, own_devs: set[int], path: str, request: LaunchRequest,
                  device_fds: dict[str, int], proc: int | None, weaken: frozenset[str]) -> None:
    target = _target(top, own_devs, path, is_dir=True, create=True)
    fs = proc if path == "/proc" and proc is not None else _new_system_fs(path, request, weaken)
    attach(fs, target)
    os.close(fs)
    os.close(target)
    # Reopen by path: a descriptor taken before the mount still points below it.
    mounted = openat2(top, path.lstrip("/"), os.O_PATH, _BENEATH)
    own_devs.add(os.fstat(mounted).st_dev)
    if path == "/dev":
        _populate_dev(mounted, device_fds, request, weaken)
        set_attrs(mounted, MOUNT_ATTR_RDONLY, recursive=False)
    os.close(mounted)


@dataclass(frozen=True)
class SystemFs:
    """A filesystem the sandbox has an instance of its own of (see SYSTEM_DIRS and
    OWN_FILESYSTEMS): where, what type, its options and its mount attributes."""

    path: str
    fstype: str
    options: dict[str, str]
    attrs: int


def system_fs(path: str, request: LaunchRequest, weaken: frozenset[str] = frozenset()
              ) -> SystemFs:
    if path == "/proc":
        # Read-only: nothing in a fresh /proc needs writing by ordinary tools, and it keeps
        # /proc/sys and /proc/sysrq-trigger out of reach even for a sandbox run by root.
        return SystemFs(path, "proc", {}, RO | MOUNT_ATTR_NOEXEC)
    if path == "/dev":
        return SystemFs(path, "tmpfs", {"mode": "0755", "size": "64k"},
                        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)
    if path == "/dev/pts":
        return SystemFs(path, "devpts", {"ptmxmode": "0666", "mode": "0620"},
                        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)
    # /tmp and /dev/shm: world-writable RAM, bounded by the memory limit, since what is
    # stored there is memory no rlimit counts.
    options = {"mode": "1777"}
    if request.limits.memory is not None:
        options["size"] = str(request.limits.memory)
    noexec = 0 if path == "/tmp" and request.exec_from_write else MOUNT_ATTR_NOEXEC
    return SystemFs(path, "tmpfs", options,
                    weakened(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | noexec, weaken))


def _new_system_fs(path: str, request: LaunchRequest, weaken: frozenset[str]) -> int:
    """A fresh, detached instance of the filesystem the sandbox has at `path`. Without a pid
    namespace of its own (tests only) no proc can be made: the host's is bound instead."""
    if path == "/proc" and "pid_namespace" in weaken:
        host = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            tree = clone_tree(host)
        finally:
            os.close(host)
        set_attrs(tree, RO | MOUNT_ATTR_NOEXEC)
        return tree
    fs = system_fs(path, request, weaken)
    return new_fs(fs.fstype, fs.options, fs.attrs)


def _populate_dev(dev: int, device_fds: dict[str, int], request: LaunchRequest,
                  weaken: frozenset[str]) -> None:
    for name, source in device_fds.items():
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666, dir_fd=dev))
        tree = clone_tree(source, recursive=False)
        set_attrs(tree, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, recursive=False)
        target = openat2(dev, name, os.O_PATH, _BENEATH)
        attach(tree, target)
        for fd in (tree, target, source):
            os.close(fd)
    for name in ("pts", "shm"):
        os.mkdir(name, 0o755, dir_fd=dev)
        fs = _new_system_fs("/dev/" + name, request, weaken)
        target = openat2(dev, name, os.O_PATH, _BENEATH)
        attach(fs, target)
        os.close(fs)
        os.close(target)
    for link, to in (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                     ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(to, link, dir_fd=dev)


def own_filesystems(request: LaunchRequest, weaken: frozenset[str] = frozenset()
                    ) -> list[SystemFs]:
    """What a sandbox cloned from a view template (template.py), whose mounts are the
    template's, covers with fresh instances of its own (template.c does): OWN_FILESYSTEMS, but
    a /tmp that is a root itself, which is the root's as in the template."""
    return [system_fs(path, request, weaken) for path in OWN_FILESYSTEMS
            if not (path == "/tmp" and _tmp_is_root(request))]


def freeze_own(request: LaunchRequest) -> None:
    """In a view template: make its own instances of OWN_FILESYSTEMS read-only. No spare uses
    them (each covers them with fresh ones), and in a spare's copy they stay locked so."""
    for path in OWN_FILESYSTEMS:
        if path == "/tmp" and _tmp_is_root(request):
            continue  # a root's, not the sandbox's own
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            set_attrs(fd, MOUNT_ATTR_RDONLY, recursive=False)
        finally:
            os.close(fd)


def _tmp_is_root(request: LaunchRequest) -> bool:
    return any(g.path == "/tmp" for g in request.read + request.write)


@dataclass(frozen=True)
class Carried:
    """One thing on a view template's /tmp, which each spare makes again on its fresh /tmp
    (template.c): a mount (a recursive clone of it), a symbolic link, or else a directory."""

    path: str               # relative to /tmp
    mount: bool = False
    link: str | None = None


def carried_below_tmp(request: LaunchRequest) -> list[Carried]:
    """In a view template, once its view is built: what lies on its /tmp (roots below it, the
    directories leading to them, aliases), parents first. Nothing when /tmp is a root."""
    if _tmp_is_root(request):
        return []
    tmp = os.open("/tmp", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _carry(tmp, os.fstat(tmp).st_dev, "")
    finally:
        os.close(tmp)


def _carry(tmp: int, tmp_dev: int, rel: str) -> list[Carried]:
    found: list[Carried] = []
    directory = openat2(tmp, rel or ".", os.O_RDONLY | os.O_DIRECTORY, _BENEATH)
    try:
        names = os.listdir(directory)
    finally:
        os.close(directory)
    for name in names:
        path = os.path.join(rel, name)
        info = os.stat(path, dir_fd=tmp, follow_symlinks=False)
        if info.st_dev != tmp_dev:
            found.append(Carried(path, mount=True))
        elif stat.S_ISLNK(info.st_mode):
            found.append(Carried(path, link=os.readlink(path, dir_fd=tmp)))
        elif stat.S_ISDIR(info.st_mode):
            found.append(Carried(path))
            found += _carry(tmp, tmp_dev, path)
    return found


def _aliases(top: int, own_devs: set[int], request: LaunchRequest) -> None:
    """Offer each root under its lexical name too (e.g. /bin -> /usr/bin on merged-/usr)."""
    for grant in request.read + request.write:
        if grant.alias == grant.path:
            continue
        parent, name = os.path.split(grant.alias)
        try:
            parent_fd = openat2(top, parent.lstrip("/") or ".", os.O_PATH, _BENEATH)
        except OSError:
            continue
        try:
            if os.fstat(parent_fd).st_dev in own_devs:  # never write into a host tree
                os.symlink(grant.path, name, dir_fd=parent_fd)
        except FileExistsError:
            pass  # the name is already taken by a real root
        finally:
            os.close(parent_fd)
