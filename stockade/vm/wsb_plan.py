"""What a Windows Sandbox guest sees of the host, for a compiled request (docs/windows-sandbox.md).

Pure: the filesystem facts it needs (is a denied path a directory, where do protected names
occur in a write root) come through a `HostView`, so every policy shape is tested on Linux.

- Read roots are mapped read-only, write roots read-write, each at its own host path in the
  guest (so argv, cwd and paths mean the same on both sides). A read root inside another read
  root is folded into it; a read root inside a write root, and a write root inside a read root,
  get their own mapping nested in the outer one.
- `C:\\Windows` (and below it), `C:\\Program Files` and `C:\\Program Files (x86)` are not
  mapped: the guest has its own copies (its image is built from the host's Windows files).
- A denied directory inside a mapped root is covered by a mapping of an empty, read-only
  per-boot folder holding a marker the guest checks (a *mask*); a denied file cannot be covered
  (Windows Sandbox maps folders only) and is refused. A denied path outside every mapped root
  needs nothing: the guest never sees it.
- Each protected name found in a write root is mapped again, read-only, over itself (a
  *freeze*); a protected file is refused for the same reason. `.git` is protected so too
  unless `filesystem.git` is "writable" (a guarded `.git` is kept whole here).
- Paths are admitted with the Windows backend's rules (`hostpaths.lexical_refusal`): canonical
  drive paths only, never UNC or device paths; and on `C:` only (the guest has one drive).
- `network.mode` "none" is a guest without a network (the agent's channel is then the spool,
  wsb_spool); "allowlist" a guest whose firewall lets it reach only the host's proxy, at the
  port the host chose (`proxy_port`); "any" is refused, as in the QEMU driver.
"""

from __future__ import annotations

import ntpath
import os
from collections.abc import Callable
from dataclasses import dataclass

from stockade.errors import UnenforceableError
from stockade.launch import hostcode
from stockade.launch.hostpaths import inside_windows as inside
from stockade.launch.hostpaths import lexical_refusal
from stockade.launch.request import LaunchRequest, NetworkSpec
from stockade.policy.model import protected_whole

GUEST_ROOT = "C:\\stockade"  # the guest's own folders; no host root may be mapped here
GUEST_BOOT = GUEST_ROOT + "\\boot"  # read-only: the bootstrap, the guest entry, the masks
GUEST_RENDEZVOUS = GUEST_ROOT + "\\rendezvous"  # read-write: the secret in, the rendezvous out
GUEST_USER_PROFILE = "C:\\Users\\WDAGUtilityAccount"  # the guest's own account
IMAGE_ROOTS = ("C:\\Windows", "C:\\Program Files", "C:\\Program Files (x86)")
MAX_MAPPINGS = 64  # a bound on the guest's start-up work (and on the configuration's size)
MIN_MEMORY_MB = 2048  # Windows Sandbox raises smaller values to what Windows needs to boot
MASK_MARKER = "stockade-masked"  # file name prefix in each mask folder; the boot id follows
ACCEPTED_NETWORK = ("none", "allowlist")


@dataclass(frozen=True)
class Mapping:
    """One MappedFolder: `host` seen at `guest`, read-only or not."""

    host: str
    guest: str
    read_only: bool


@dataclass(frozen=True)
class HostView:
    """The facts the plan needs from the host's filesystem. `kind(path)` is "dir", "file" or
    None (absent); `occurrences(root, names)` lists (path, is_dir) of every entry below `root`
    named one of `names`, without following links; `long_path` confirms 8.3-looking names
    (GetLongPathNameW on Windows; None refuses them)."""

    kind: Callable[[str], str | None]
    occurrences: Callable[[str, tuple[str, ...]], list[tuple[str, bool]]]
    long_path: Callable[[str], str] | None = None


@dataclass(frozen=True)
class Plan:
    mappings: tuple[Mapping, ...]  # outer before nested: the order of the .wsb
    masks: tuple[Mapping, ...]  # the empty folders over denied directories (also in mappings)
    read_only: tuple[str, ...]  # guest paths the guest verifies it cannot write
    network: str
    proxy_port: int | None
    memory_mb: int | None
    boot_id: str
    pids: int | None = None  # each command's Job holds at most this many processes
    # what the guest's proxy is made of at its boot (allow, deny, reach): a kept guest serves
    # every later execution with it, so it is part of the shape
    egress: NetworkSpec = NetworkSpec()

    @property
    def networking(self) -> bool:
        """Whether the guest has a network adapter at all (not for "none")."""
        return self.network != "none"

    def shape(self) -> tuple:
        """What a guest booted from this plan offers, whatever its boot: two plans of the same
        shape can run each other's commands (the host's daemon reuses a guest on that)."""
        own = {GUEST_BOOT, GUEST_RENDEZVOUS}
        masks = {m.guest for m in self.masks}
        return (tuple((m.guest, m.read_only, "" if m.guest in masks else m.host)
                      for m in self.mappings if m.guest not in own),
                self.network, self.egress, self.memory_mb, self.pids)


def plan(request: LaunchRequest, *, boot_dir: str, rendezvous_dir: str, boot_id: str,
         view: HostView, proxy_port: int | None = None) -> Plan:
    """The guest for `request` (the agent's request: the policy's roots plus the interpreter
    and Stockade's package); refuses, typed, what Windows Sandbox cannot enforce."""
    hostcode.refuse_unkept(request, "a Windows Sandbox guest")
    if request.network.credentials or request.network.http:
        raise UnenforceableError("network.credentials", "network.credentials and network.http "
                                 "are kept by the native Linux backend's proxy only, not yet "
                                 "in a Windows Sandbox guest")
    network = _network(request.network.mode, proxy_port)
    memory_mb = _memory(request)
    _limits(request)
    mappings: list[Mapping] = []
    for path, read_only in _roots(request):
        _admit(path, view, "filesystem.path")
        mappings.append(Mapping(path, path, read_only))
    masks = _masks(request, mappings, boot_dir, view)
    frozen = _frozen(request, mappings, view)
    own = [Mapping(boot_dir, GUEST_BOOT, True), Mapping(rendezvous_dir, GUEST_RENDEZVOUS, False)]
    ordered = tuple(own + sorted(mappings + frozen + masks, key=_depth))
    if len(ordered) > MAX_MAPPINGS:
        raise UnenforceableError("filesystem", f"{len(ordered)} mapped folders: the Windows "
                                 f"Sandbox driver maps at most {MAX_MAPPINGS}")
    read_only = tuple(m.guest for m in ordered if m.read_only and m not in masks)
    return Plan(ordered, tuple(masks), read_only, network, proxy_port, memory_mb, boot_id,
                request.limits.pids, request.network)


def _network(mode: str, proxy_port: int | None) -> str:
    if mode not in ACCEPTED_NETWORK:
        raise UnenforceableError(f"network.{mode}", f"network mode {mode!r}: a Windows Sandbox "
                                 "guest has no destination guard, so unrestricted egress is not "
                                 "offered (use allowlist)")
    if (mode == "allowlist") != (proxy_port is not None):
        raise UnenforceableError(f"network.{mode}", "the allowlist, and only it, needs the "
                                 "host's proxy port")
    return mode


def _memory(request: LaunchRequest) -> int | None:
    memory = request.limits.memory
    if memory is None:
        return None
    mb = -(-memory // (1 << 20))
    if mb < MIN_MEMORY_MB:
        raise UnenforceableError("limits.memory", f"{mb} MiB: a Windows Sandbox guest needs at "
                                 f"least {MIN_MEMORY_MB} MiB (Windows would raise it silently)")
    return mb


def _limits(request: LaunchRequest) -> None:
    for name in ("cpu", "file_size"):
        if getattr(request.limits, name) is not None:
            raise UnenforceableError(f"limits.{name}", f"limits.{name} cannot be applied in a "
                                     "Windows Sandbox guest yet")
    if request.write and not request.exec_from_write:
        raise UnenforceableError("filesystem.exec_from_write", "a mapped folder cannot forbid "
                                 "execution: set exec_from_write = true to accept that")


def _roots(request: LaunchRequest) -> list[tuple[str, bool]]:
    """(path, read_only) to map: image roots dropped, reads inside reads folded."""
    write = sorted({g.path for g in request.write})
    for path in write:
        if _image(path):
            raise UnenforceableError("filesystem.path", f"{path} is part of the guest's own "
                                     "Windows image and cannot be granted for writing")
    reads: list[str] = []
    for path in sorted({g.path for g in request.read}, key=lambda p: (_depth_of(p), p)):
        if _image(path) or any(inside(path, r) for r in reads) or path in write:
            continue
        reads.append(path)
    return sorted([(p, True) for p in reads] + [(p, False) for p in write])


def _masks(request: LaunchRequest, mappings: list[Mapping], boot_dir: str,
           view: HostView) -> list[Mapping]:
    masks = []
    for grant in sorted({g.path for g in request.deny}):
        covering = [m for m in mappings if inside(grant, m.host)]
        if _image(grant):
            raise UnenforceableError("filesystem.deny", f"{grant} lies in the guest's own "
                                     "Windows image, which the driver cannot hide")
        if not covering:
            continue  # never mapped: the guest cannot see it
        _admit(grant, view, "filesystem.deny")
        kind = view.kind(grant)
        if kind == "file":
            raise UnenforceableError("filesystem.deny", f"{grant} is a file inside a mapped "
                                     "root: Windows Sandbox can only cover folders")
        if kind == "dir":
            masks.append(Mapping(ntpath.join(boot_dir, "mask", str(len(masks))), grant, True))
    return masks


def _frozen(request: LaunchRequest, mappings: list[Mapping], view: HostView) -> list[Mapping]:
    frozen = []
    names = tuple(sorted(protected_whole(request.protected, request.git, guards_git=False)))
    for root in (m for m in mappings if not m.read_only):
        for path, is_dir in sorted(view.occurrences(root.host, names)) if names else ():
            if not is_dir:
                raise UnenforceableError("filesystem.protected", f"{path} is a protected file: "
                                         "Windows Sandbox can only map folders read-only")
            _admit(path, view, "filesystem.protected")
            if not any(m.host == path for m in mappings + frozen):
                frozen.append(Mapping(path, path, True))
    return frozen


def _admit(path: str, view: HostView, capability: str) -> None:
    why = lexical_refusal(path, view.long_path)
    if why is None and not path[:3].casefold() == "c:\\":
        why = "the guest has a C: drive only, and paths are mapped at the same place"
    if why is None and len(path) <= 3:
        why = "a whole drive cannot be mapped"
    if why is None and (inside(path, GUEST_ROOT) or inside(path, GUEST_USER_PROFILE)):
        why = "the guest uses this location itself"
    if why is not None:
        raise UnenforceableError(capability, f"{path}: {why}")


def _image(path: str) -> bool:
    return inside(path, IMAGE_ROOTS[0]) or path.casefold() in (p.casefold() for p in IMAGE_ROOTS)


def _depth_of(path: str) -> int:
    return path.rstrip("\\").count("\\")


def _depth(mapping: Mapping) -> tuple[int, str]:
    return (_depth_of(mapping.guest), mapping.guest.casefold())


# --- the host's view on the real filesystem ------------------------------------------------------

def _kind(path: str) -> str | None:
    if os.path.isdir(path) and not os.path.islink(path):
        return "dir"
    return "file" if os.path.lexists(path) else None


def _occurrences(root: str, names: tuple[str, ...]) -> list[tuple[str, bool]]:
    """Every entry named one of `names` below `root`, not descending into them or into links
    (nor, where Python can tell, junctions)."""
    wanted = {n.casefold() for n in names}
    found = []
    pending = [root]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                link = entry.is_symlink() or getattr(entry, "is_junction", lambda: False)()
                is_dir = entry.is_dir(follow_symlinks=False) and not link
                if entry.name.casefold() in wanted:
                    found.append((entry.path, is_dir))
                elif is_dir:
                    pending.append(entry.path)
    return found


DISK = HostView(_kind, _occurrences)
