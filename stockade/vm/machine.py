"""The machine for a policy: which host directories the guest sees (each read root and write
root as its own 9p share, nothing else of the host), the guest's init script, and the QEMU
command line. Pure: nothing here starts a process."""

from __future__ import annotations

import errno
import json
import os
import shlex
import stat
from dataclasses import dataclass

from stockade.errors import UnenforceableError
from stockade.launch.request import LaunchRequest, LimitSpec
from stockade.linux import limits, mnt, protect, seccomp
from stockade.vm import egress
from stockade.vm.initramfs import Kernel

QEMU = "qemu-system-x86_64"
PORT_NAME = "stockade"  # the virtio-serial port the agent speaks on
MAX_SHARES = 20  # one PCI slot each, on q35's root bus (32 slots, a few taken)
MEMORY_MIB = 512
VCPUS = 1  # so any `limits.cpu` of at least one core holds
_9P = "trans=virtio,version=9p2000.L,msize=262144"
# A core dump's destination that can never be created (the guest's /proc is read-only): not a
# pipe, so a crash starts no helper; and RLIMIT_CORE is 0 for every command anyway.
CORE_PATTERN = "/proc/core-dumps-are-disabled"
# The agent's entry in the guest: load the package from its own directory (as the Linux session
# does); apply the policy's rlimits (argv[4], JSON) as the Linux backend does, inherited by every
# command (RLIMIT_NPROC counts two tasks of the agent's own beside theirs; the guest's init has
# set pid_max); become the host user's uid and gid (argv[2], argv[3]: the guest sees the shares'
# host ownership, so permissions work out as on the host) without any capability (for uid 0:
# securebits locked, every set emptied) and with no_new_privs (prctl 38), so commands cannot
# undo the guest's mounts; then serve the session.
GUEST_BOOT = ("import os, sys, json, importlib.util as u; p = sys.argv[1]; "
              "s = u.spec_from_file_location('stockade', p + '/__init__.py', "
              "submodule_search_locations=[p]); m = u.module_from_spec(s); "
              "sys.modules['stockade'] = m; s.loader.exec_module(m); "
              "from stockade.launch.request import LimitSpec; "
              "from stockade.linux import limits; "
              "limits.apply_rlimits(LimitSpec(**json.loads(sys.argv[4])), 2); "
              "from stockade.linux.privilege import drop_all, prepare; "
              "uid, gid = int(sys.argv[2]), int(sys.argv[3]); "
              "os.setgroups([]); os.setresgid(gid, gid, gid); "
              "os.setresuid(uid, uid, uid) if uid else (prepare(), drop_all()); "
              "from stockade.linux.syscalls import prctl; prctl(38, 1); "
              "from stockade.linux import seccomp; f = bytes.fromhex(sys.argv[5]); "
              "f and seccomp.install(f); "
              "from stockade.session.agent import main; sys.exit(main())")


@dataclass(frozen=True)
class Share:
    tag: str
    path: str  # canonical host path, mounted at the same path in the guest
    writable: bool


@dataclass(frozen=True)
class Guest:
    """What the guest sees: the shares, symlinks recreating the policy's aliases (`/lib` ->
    `usr/lib`), paths hidden (deny), made read-only (`frozen`: protected names in write roots
    and what they name, what of each repository there is guarded, and files there with more
    than one hard link, see protect.guards)
    and pinned as mount points (`kept`: the directories between a write root and a protected
    name or a hidden path, which a rename would otherwise carry away), each list ancestors
    first."""

    shares: tuple[Share, ...]
    links: tuple[tuple[str, str], ...]
    hidden: tuple[str, ...]
    frozen: tuple[str, ...]
    kept: tuple[str, ...] = ()
    exec_from_write: bool = False  # else write roots and the guest's /tmp are noexec
    egress: bool = False  # allowlist: a NIC whose only way out is the proxy (egress.py)
    pid_max: int | None = None  # the guest kernel's, for `limits.pids` (limits.pid_max_for)


def plan(request: LaunchRequest) -> Guest:
    """The guest for a compiled request; refuses what the VM cannot enforce."""
    if request.network.mode not in ("none", "allowlist"):
        raise UnenforceableError("network", f"network mode {request.network.mode!r}: the VM "
                                 "driver has no device for it ('none' and 'allowlist' only)")
    if request.network.credentials or request.network.http:
        raise UnenforceableError("network.credentials", "network.credentials and network.http "
                                 "are kept by the native Linux backend's proxy only, not yet "
                                 "in a VM")
    if request.limits.cpu is not None and request.limits.cpu < VCPUS:
        raise UnenforceableError("limits.cpu", f"limits.cpu = {request.limits.cpu:g}: the "
                                 f"guest has {VCPUS} vCPU and no finer CPU limit")
    shares: list[Share] = []
    links: dict[str, str] = {}
    grants = [(g, False) for g in request.read] + [(g, True) for g in request.write]
    for grant, writable in sorted(grants, key=lambda item: item[0].path):
        if grant.alias != grant.path and os.path.islink(grant.alias):
            links[grant.alias] = os.readlink(grant.alias)
        if not writable and any(_inside(grant.path, s.path) for s in shares if not s.writable):
            continue  # already visible, read-only, through an enclosing share
        shares.append(Share(f"s{len(shares)}", grant.path, writable))
    if len(shares) > MAX_SHARES:
        raise UnenforceableError("filesystem", f"{len(shares)} roots: the VM driver shares at "
                                 f"most {MAX_SHARES}")
    guards = _guards(request, tuple(g.path for g in request.deny if os.path.lexists(g.path)))
    return Guest(tuple(sorted(shares, key=lambda s: s.path.count("/"))),
                 tuple(sorted(links.items())), tuple(g.path for g in request.deny),
                 tuple(g.path for g in guards if g.kind == "protected"),
                 tuple(g.path for g in guards if g.kind == "keep"),
                 request.exec_from_write, request.network.mode == "allowlist",
                 limits.pid_max_for(request.limits))


def _guards(request: LaunchRequest, hidden: tuple[str, ...]) -> list[protect.Guard]:
    """What the Linux backend re-mounts and pins in the write roots, found the same way
    (protect.py): the `hidden` paths are pinned too."""
    roots: list[tuple[str, int]] = []
    try:
        for grant in request.write:
            fd = mnt.open_source(grant.path, "filesystem.write")
            roots.append((grant.path, fd))
        return protect.guards([(path, fd) for path, fd in roots
                               if stat.S_ISDIR(os.fstat(fd).st_mode)],
                              frozenset(request.protected), request.git, hidden,
                              request.host_code + request.home_code)
    finally:
        for _, fd in roots:
            os.close(fd)


def init_script(guest: Guest, argv: list[str]) -> str:
    """The guest's /init: modules, then the kernel's settings fixed for good (kernel_settings),
    a fresh tmpfs root with its own read-only /proc, /sys and /dev and a writable /tmp, the
    shares on it (after those, so a write root under /tmp stays visible), the deny and
    protected overlays, the root made read-only, then the agent on the virtio-serial port (its
    stderr on the console, which is the host's boot log)."""
    q = shlex.quote
    # As the Linux backend mounts them: nothing the commands can write is executable unless
    # the policy says exec_from_write, and no setuid bit counts anywhere they can write.
    writable = "nosuid,nodev" + ("" if guest.exec_from_write else ",noexec")
    lines = ["#!/bin/busybox sh", "export PATH=/bin", "set -e",
             "busybox mount -t devtmpfs dev /dev", "busybox mount -t sysfs sys /sys",
             "busybox mount -t proc proc /proc",  # busybox's remount reads /proc/mounts
             "for m in /m/*.ko; do busybox insmod $m; done"]
    for name, value in kernel_settings(guest):  # a failed write ends the boot (set -e)
        knob = f"/proc/sys/{name}"
        write = f"echo {q(value)} > {knob}"
        # hotplug exists only in kernels built with CONFIG_UEVENT_HELPER
        lines.append(write if name != "kernel/hotplug" else f"[ ! -e {knob} ] || {write}")
    lines.append("busybox mount -t tmpfs -o mode=0755,nosuid,nodev root /newroot")
    # /proc, /sys and /dev read-only: /proc/sys, /proc/sysrq-trigger and sysfs's attributes
    # are the guest kernel's settings, which a command run as uid 0 could otherwise write (a
    # read-only mount also binds any /proc it mounts later in a namespace of its own).
    for sub, kind, options in (("proc", "proc", "nosuid,nodev,noexec"),
                               ("sys", "sysfs", "nosuid,nodev,noexec"),
                               ("dev", "devtmpfs", "nosuid,noexec"), ("tmp", "tmpfs", writable)):
        lines += [f"busybox mkdir -p /newroot/{sub}",
                  f"busybox mount -t {kind} -o {options} {sub} /newroot/{sub}"]
        if sub != "tmp":
            lines.append(_read_only(f"/newroot/{sub}", options))
    lines += ["busybox chmod 1777 /newroot/tmp", "busybox ip link set lo up"]
    if guest.egress:  # no route: only the user-mode network's own /24, where the proxy is
        lines += [f"busybox ip addr add {egress.GUEST_ADDRESS}/24 dev eth0",
                  "busybox ip link set eth0 up"]
    # A share inside a frozen path (a root granted inside a protected name: an exact grant,
    # which wins) is mounted after the frozen binds, which would hide it, and what is kept or
    # frozen inside it after it.
    later = [s for s in guest.shares if any(_inside(s.path, f) for f in guest.frozen)]
    # A hidden directory that holds shares (the private homes' directory, holding the run's
    # own home: compile.py) is covered by an empty tmpfs before they are mounted on it, which
    # is then made read-only: nothing else of what it hides shows.
    holders = [h for h in guest.hidden
               if any(s.path != h and _inside(s.path, h) for s in guest.shares)]
    held = [s for s in guest.shares if any(_inside(s.path, h) for h in holders)]
    for share in [s for s in guest.shares if s not in later + held]:
        lines += _mount_share(share, writable)
    for holder in holders:
        target = q("/newroot" + holder)
        lines += [f"busybox mkdir -p {target}",
                  f"busybox mount -t tmpfs -o mode=0755,size=16k,nosuid,nodev,noexec homes "
                  f"{target}"]
    lines += [line for share in held if share not in later
              for line in _mount_share(share, writable)]
    lines += [_read_only(q("/newroot" + holder), "nosuid,nodev,noexec") for holder in holders]
    for link, target in guest.links:
        lines.append(f"[ -e {q('/newroot' + link)} ] || busybox ln -s {q(target)} "
                     f"{q('/newroot' + link)}")
    # As the Linux backend orders them: kept directories (recursively, so that the shares
    # inside stay as they are), then frozen paths (a read-only bind of that one mount: a kept
    # directory inside it is read-only with it), then what is hidden, which nothing covers.
    inside = {path for path in guest.kept + guest.frozen
              if any(path != s.path and _inside(path, s.path) for s in later)}
    for phase, shares in ((False, []), (True, later)):
        lines += [line for share in shares for line in _mount_share(share, writable)]
        for path in guest.kept:
            if (path in inside) == phase:
                target = q("/newroot" + path)
                lines.append(f"busybox mount --rbind {target} {target}")
        for path in guest.frozen:
            if (path in inside) == phase:
                target = q("/newroot" + path)
                lines += [f"busybox mount --bind {target} {target}",
                          _read_only(target, writable)]
    for path in [h for h in guest.hidden if h not in holders]:
        target = q("/newroot" + path)
        lines.append(f"if [ -d {target} ]; then busybox mount -t tmpfs -o ro,size=0 deny {target}; "
                     f"elif [ -e {target} ]; then busybox mount --bind /dev/null {target}; fi")
    lines += ["port=",
              "for p in /sys/class/virtio-ports/*; do",
              f"  [ \"$(busybox cat $p/name)\" = {PORT_NAME} ] && port=/dev/${{p##*/}}",
              "done",
              "[ -n \"$port\" ] || { echo 'stockade init: no agent port'; exit 1; }",
              # nothing can be created beside the mounts: no program of the command's
              # at a path the kernel would run
              "busybox mount -o remount,ro,nosuid,nodev /newroot",
              "busybox umount /sys /proc",
              "exec busybox switch_root /newroot " + " ".join(q(a) for a in argv)
              + " 0<>\"/newroot$port\" 1>&0"]
    return "\n".join(lines) + "\n"


def kernel_settings(guest: Guest) -> list[tuple[str, str]]:
    """What the guest's init writes under /proc/sys once the modules are in, before any
    command exists: no module can be loaded any more, the kernel runs no helper program of a
    path's choosing (modprobe, hotplug, a core_pattern pipe), no user namespace can be made
    (the Linux backend's seccomp filter refuses them too), and pid_max for `limits.pids`."""
    settings = [("kernel/modules_disabled", "1"), ("kernel/modprobe", ""),
                ("kernel/hotplug", ""), ("kernel/core_pattern", CORE_PATTERN),
                ("user/max_user_namespaces", "0")]
    if guest.pid_max is not None:
        settings.append(("kernel/pid_max", str(guest.pid_max)))
    return settings


def _mount_share(share: Share, writable: str) -> list[str]:
    target = shlex.quote("/newroot" + share.path)
    mode = f"rw,{writable}" if share.writable else "ro,nosuid,nodev"
    return [f"busybox mkdir -p {target}",
            f"busybox mount -t 9p -o {_9P},{mode} {share.tag} {target}"]


def _read_only(target: str, options: str) -> str:
    """Make the mount at `target` read-only; a bind remount sets every flag anew, so the
    mount's other `options` are given again."""
    return f"busybox mount -o remount,bind,ro,{options} {target}"


def agent_argv(python: str, package_dir: str, uid: int, gid: int,
               limits: LimitSpec, exec_from_write: bool) -> list[str]:
    """The agent's command line in the guest (see GUEST_BOOT). The timeout and output bounds
    are the agent's own, per command; the others hold for the guest's processes. Without
    `exec_from_write`, a seccomp filter (compiled here: the guest has no libseccomp) refuses
    memfd_create to the agent and every command: a memfd is written memory that the guest's
    kernel (which may predate vm.memfd_noexec, 6.3) would execute, and the guest has no exec
    watch (the Linux backend's pid 1 seals each memfd instead)."""
    held = {"memory": limits.memory, "pids": limits.pids, "file_size": limits.file_size}
    memfds = b"" if exec_from_write else seccomp.compile_rules(
        [("memfd_create", errno.EPERM, ())])
    return [python, "-I", "-S", "-B", "-c", GUEST_BOOT, package_dir, str(uid), str(gid),
            json.dumps(held), memfds.hex()]


def qemu_argv(kernel: Kernel, initrd: str, socket_path: str, log: str,
              guest: Guest, proxy_socket: str | None = None) -> list[str]:
    """A q35 machine under TCG: no disk, no display; the console on the ISA serial port into
    `log`; the agent's port on a virtio-serial controller whose chardev connects to the host's
    `socket_path`; one virtio-9p device per share; no network device, or in allowlist mode one
    whose only way out is the proxy listening on `proxy_socket` (egress.py).

    Not microvm: it has no HPET or ACPI PM timer, and under TCG the kernel's TSC calibration
    against the PIT fails now and then, which left one boot in five hanging; q35 has both."""
    argv = [QEMU, "-accel", "tcg", "-M", "q35", "-cpu", "max",
            "-m", str(MEMORY_MIB), "-smp", str(VCPUS), "-nodefaults", "-no-user-config",
            "-nographic", "-no-reboot",
            "-kernel", kernel.image, "-initrd", initrd,
            "-append", "console=ttyS0 quiet panic=-1 rdinit=/init",
            "-chardev", f"file,id=log,path={_opt(log)}", "-serial", "chardev:log",
            "-device", "virtio-serial-pci",
            "-chardev", f"socket,id=agent,path={_opt(socket_path)},server=off",
            "-device", f"virtserialport,chardev=agent,name={PORT_NAME}"]
    if guest.egress:
        assert proxy_socket is not None
        argv += ["-netdev", egress.netdev(proxy_socket),
                 "-device", "virtio-net-pci,netdev=egress"]
    else:
        argv += ["-nic", "none"]
    for share in guest.shares:
        argv += ["-fsdev", f"local,id={share.tag},path={_opt(share.path)},"
                 f"security_model={_security_model(share.writable)}"
                 f"{'' if share.writable else ',readonly=on'}",
                 "-device", f"virtio-9p-pci,fsdev={share.tag},mount_tag={share.tag}"]
    return argv


def _security_model(writable: bool) -> str:
    """`none` passes the guest's owners and modes through to the host. For a QEMU running as
    root that would let a command create a setuid-root file in a write root; `mapped-xattr`
    keeps the guest's owners and modes in extended attributes instead, and the host file stays
    a plain root-owned file (mode 0600/0700)."""
    return "mapped-xattr" if writable and os.geteuid() == 0 else "none"


def _opt(value: str) -> str:
    """`value` as a QEMU option value (a comma is written twice)."""
    return value.replace(",", ",,")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
