"""`stockade doctor`: why the Linux backend is unavailable or weakened on this host, and the
exact remedy for each cause.

It reads the host (kernel, LSM list, Landlock ABI, the user-namespace sysctls, this process's
own seccomp filter, container markers), tries in a throwaway child what a sandbox needs (a
user namespace, its id map, a mount in it), and runs the readiness probe of each isolation
(a real launch, stockade/launch/probe.py). Each cause found has a stable code, what it
blocks, and the remedy as commands and settings. Every refusal of the Linux backend points
here (hints.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from dataclasses import asdict, dataclass, field

PROFILE_PATH = "/etc/apparmor.d/stockade"
SYSCTL_FILE = "/etc/sysctl.d/99-stockade.conf"
# What Stockade's sandboxes call that a container runtime's default seccomp profile refuses
# without CAP_SYS_ADMIN: a profile must allow them (clone with namespace flags included).
CONTAINER_SYSCALLS = ("clone", "unshare", "setns", "mount", "umount2", "pivot_root",
                      "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount",
                      "mount_setattr")
_CLONE_NEWUSER, _CLONE_NEWNS = 0x10000000, 0x00020000
_FSOPEN = {"x86_64": 430, "aarch64": 430}


@dataclass(frozen=True)
class Cause:
    code: str
    blocks: str  # "namespaces", "landlock", "both" (isolations it keeps from running), "weakens",
    # or a capability it keeps from this host ("network.any")
    summary: str
    remedy: tuple[str, ...]


@dataclass
class Diagnosis:
    host: dict[str, object]
    isolations: dict[str, dict[str, object]] = field(default_factory=dict)
    causes: list[Cause] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.causes and all(i["ready"] for i in self.isolations.values())

    def to_json(self) -> dict:
        return {"ok": self.ok, "host": self.host, "isolations": self.isolations,
                "causes": [asdict(cause) for cause in self.causes]}

    def text(self) -> str:
        h = self.host
        lines = [f"Linux {h['kernel']}, {h['run_as']}; Landlock ABI {h['landlock_abi']} "
                 f"(LSMs: {h['lsm'] or 'not readable'}); this process's seccomp: "
                 f"{_seccomp_text(h)}; a user namespace: {h['userns_trial']}", ""]
        for name, state in self.isolations.items():
            said = "ready" if state["ready"] else \
                f"NOT READY ({state['reason']}: {state['message']})"
            lines.append(f"isolation {name}: {said}")
            for weakness in state.get("not_enforced", ()):
                lines.append(f"    does not enforce: {weakness}")
        for cause in self.causes:
            lines += ["", f"cause {cause.code} (blocks: {cause.blocks}): {cause.summary}",
                      "  remedy:"]
            lines += [f"    {line}" for line in cause.remedy]
        lines += ["", "everything Stockade can use is available" if self.ok else
                  "not everything Stockade can use is available (see above)"]
        return "\n".join(lines)


def diagnose(probe: bool = True) -> Diagnosis:
    """What this host offers and lacks; with `probe`, each isolation's readiness probe too."""
    from stockade.linux import landlock, supervisor
    from stockade.linux.backend import USERNS_KNOBS, _read

    host: dict[str, object] = {
        "kernel": os.uname().release, "run_as": "root" if os.geteuid() == 0 else "rootless",
        "landlock_abi": landlock.abi_version(), "lsm": _read("/sys/kernel/security/lsm"),
        "knobs": {path: _read(path) for path, _, _ in USERNS_KNOBS},
        "in_user_namespace": _nested_user_namespace(), "container": _container(),
        "supervisor": supervisor.built(), **_own_seccomp(),
    }
    host["userns_trial"] = _try_namespaces()
    found = Diagnosis(host)
    found.causes = _causes(host)
    if probe:
        found.isolations = _isolations()
        if not found.causes:
            found.causes += [_unexplained(name, state) for name, state in found.isolations.items()
                             if not state["ready"]]
    return found


def _isolations() -> dict[str, dict[str, object]]:
    from stockade.launch.probe import probe
    from stockade.linux import landlock_tier
    from stockade.linux.backend import LandlockTier, LinuxBackend

    out = {}
    for name, backend in (("namespaces", LinuxBackend()), ("landlock", LandlockTier())):
        attestation = probe(backend)
        out[name] = {"ready": attestation.ready, "reason": attestation.reason,
                     "stage": attestation.stage, "message": attestation.message}
        if name == "landlock":
            out[name]["not_enforced"] = landlock_tier.not_enforced()
    return out


def _causes(host: dict) -> list[Cause]:
    causes: list[Cause] = []
    if not host["supervisor"]:
        causes.append(Cause("supervisor_not_built", "namespaces", "the sandbox's supervisor "
                            "(a small C program) was not built when Stockade was installed", (
                                "apt-get install gcc libc6-dev   # Debian, Ubuntu "
                                "(Fedora: dnf install gcc glibc-static)",
                                "pip install --force-reinstall --no-deps stockade   # or the "
                                "checkout you installed from: it builds at install",
                            )))
    if not _libseccomp():
        causes.append(Cause("seccomp_unavailable", "both", "libseccomp.so.2 cannot be loaded",
                            ("apt-get install libseccomp2   # Fedora: dnf install libseccomp",)))
    causes += _landlock_causes(host)
    causes += _userns_causes(host)
    causes += _network_any_causes()
    causes += _overlay_causes(host)
    return causes


def _network_any_causes() -> list[Cause]:
    from stockade.linux import usernet

    found = usernet.diagnosis()
    if found is None:
        return []
    code, summary, remedy = found
    return [Cause(code, "network.any", summary, remedy)]


OVERLAY_KERNEL = (6, 13)  # overlayfs takes its layers as descriptors (stockade/linux/overlay.py)


def _overlay_causes(host: dict) -> list[Cause]:
    """The copy-on-write workspace is built from descriptors only (no layer looked up by
    name): an older kernel refuses every run that asks for it."""
    release = str(host["kernel"])
    try:
        version = tuple(int(part) for part in release.split("-")[0].split(".")[:2])
    except ValueError:
        return []  # (a release string of another shape: the launch says what fails)
    if version >= OVERLAY_KERNEL:
        return []
    return [Cause("overlay_kernel_old", "weakens", f"this kernel ({release}) cannot take "
                  "overlay layers as descriptors (Linux 6.13): the copy-on-write workspace "
                  '(filesystem.workspace = "overlay", stockade run --overlay) is refused', (
                      "upgrade to Linux 6.13 or later",
                      'or keep filesystem.workspace = "direct" (the default): the command '
                      "then writes the real workspace",
                  ))]


def _landlock_causes(host: dict) -> list[Cause]:
    from stockade.linux.landlock_tier import SCOPE_ABI

    abi, lsm = host["landlock_abi"], host["lsm"]
    if abi == 0:
        listed = lsm.split(",") if isinstance(lsm, str) else None
        if listed is not None and "landlock" not in listed:
            wanted = ",".join([*listed, "landlock"])
            return [Cause("landlock_unsupported", "both", f"Landlock is not among the kernel's "
                          f"active LSMs ({lsm})", (
                              f'add lsm={wanted} to GRUB_CMDLINE_LINUX in /etc/default/grub',
                              "update-grub && reboot   # (grub2-mkconfig -o /boot/grub2/grub.cfg"
                              " on Fedora)",
                          ))]
        return [Cause("landlock_unsupported", "both", "this kernel offers no Landlock (built "
                      "without CONFIG_SECURITY_LANDLOCK, older than Linux 5.13, or not in the "
                      "lsm= list)", (
                          f"a kernel of Linux 6.12 or later (Landlock ABI {SCOPE_ABI}) with "
                          "CONFIG_SECURITY_LANDLOCK=y",
                          "and landlock in its LSM list: lsm=...,landlock on the kernel "
                          "command line",
                      ))]
    if abi < SCOPE_ABI:
        tcp = "TCP rules (ABI 4, Linux 6.7) and " if abi < 4 else ""
        return [Cause("kernel_old", "weakens", f"Landlock ABI {abi}: this kernel "
                      f"({host['kernel']}) lacks {tcp}"
                      "signal and abstract unix socket scoping (ABI 6, Linux 6.12); the "
                      "landlock isolation needs them, namespaces are weakened without them", (
                          "upgrade to Linux 6.12 or later",
                      ))]
    return []


def _userns_causes(host: dict) -> list[Cause]:
    knobs, trial = host["knobs"], host["userns_trial"]
    root = host["run_as"] == "root"
    causes = []
    if knobs.get("/proc/sys/user/max_user_namespaces") == "0":
        remedy = ["sysctl -w user.max_user_namespaces=15000",
                  f"echo user.max_user_namespaces=15000 > {SYSCTL_FILE}   # kept at boot"]
        if host["in_user_namespace"]:
            remedy.insert(0, "this process runs in a user namespace of its own: the limit is "
                             "that namespace's, set by whoever made it; set it there, or run "
                             "Stockade outside it")
        causes.append(Cause("max_user_namespaces", "namespaces",
                            "user.max_user_namespaces = 0: no user namespace can be made",
                            tuple(remedy)))
    if knobs.get("/proc/sys/kernel/unprivileged_userns_clone") == "0" and not root:
        causes.append(Cause("unprivileged_userns_clone", "namespaces",
                            "kernel.unprivileged_userns_clone = 0 (Debian's switch)", (
                                "sysctl -w kernel.unprivileged_userns_clone=1",
                                f"echo kernel.unprivileged_userns_clone=1 >> {SYSCTL_FILE}",
                            )))
    if knobs.get("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        causes.append(Cause("apparmor_userns_restricted", "namespaces",
                            "AppArmor restricts unprivileged user namespaces "
                            "(kernel.apparmor_restrict_unprivileged_userns = 1, Ubuntu 23.10 "
                            "and later): a namespace made by a program without a profile that "
                            "grants `userns` has no capabilities", _apparmor_remedy()))
    if causes:
        return causes
    if trial.startswith("unshare: EPERM") and host["seccomp_mode"] == 2:
        causes.append(Cause("container_seccomp", "namespaces",
                            f"this process runs under a seccomp filter ({host['seccomp_filters']}"
                            " filter(s)) that refuses unshare with EPERM, as a container "
                            "runtime's default profile does" + _container_said(host),
                            _container_remedy()))
    elif trial.startswith(("unshare:", "id map:")):
        causes.append(Cause("userns_denied", "namespaces", f"a user namespace cannot be made "
                            f"or used here ({trial}), and no sysctl says why: an LSM policy "
                            "(SELinux, AppArmor) or a sandbox this process runs in", (
                                "run Stockade where unprivileged user namespaces are allowed, "
                                "or use --isolation landlock (it enforces less: see "
                                "SECURITY.md)",
                            )))
    elif trial.startswith("mount:"):
        causes.append(Cause("mount_refused", "namespaces", f"a user namespace can be made but "
                            f"a mount in it is refused ({trial}): an LSM (a container's "
                            "AppArmor profile) or a masked /proc", _mount_remedy()))
    return causes


def _apparmor_remedy() -> tuple[str, ...]:
    """An AppArmor profile granting `userns` to the interpreter that runs Stockade and to its
    supervisor, where to put it, and how to load it."""
    from stockade.linux import supervisor

    python = os.path.realpath(sys.executable)
    profile = (f"abi <abi/4.0>,\ninclude <tunables/global>\n\n"
               f"profile stockade-python {python} flags=(unconfined) {{\n  userns,\n"
               f"  include if exists <local/stockade-python>\n}}\n\n"
               f"profile stockade-supervisor {supervisor.PROGRAM} flags=(unconfined) {{\n"
               f"  userns,\n}}")
    return (f"write this profile to {PROFILE_PATH}:", *profile.splitlines(),
            f"apparmor_parser -r {PROFILE_PATH}   # load it (and at every boot: it is in "
            "/etc/apparmor.d)",
            f"note: the profile names the interpreter ({python}): every program that "
            "interpreter runs may then make user namespaces; a venv's own copy of the "
            "interpreter narrows that",
            "or, host-wide and weaker: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")


def _container_remedy() -> tuple[str, ...]:
    names = ", ".join(f'"{name}"' for name in CONTAINER_SYSCALLS)
    return (
        "Docker or Podman: a seccomp profile that allows what Stockade's sandboxes call: the "
        "runtime's default profile with this rule added to its syscalls (clone then without "
        "its namespace-flag condition):",
        f'    {{"names": [{names}], "action": "SCMP_ACT_ALLOW"}}',
        "docker run --security-opt seccomp=stockade-seccomp.json --security-opt "
        "systempaths=unconfined --security-opt apparmor=unconfined ...",
        "podman run --security-opt seccomp=stockade-seccomp.json --security-opt unmask=ALL ...",
        "(systempaths=unconfined / unmask=ALL: a proc can be mounted in a user namespace only "
        "where no part of /proc is masked; apparmor=unconfined where the host's docker-default "
        "AppArmor profile refuses mounts)",
        "Kubernetes: a user-namespaced pod with an unmasked proc and that profile:",
        "    spec.hostUsers: false",
        "    securityContext.procMount: Unmasked",
        "    securityContext.seccompProfile: {type: Localhost, localhostProfile: "
        "stockade-seccomp.json}",
        "    securityContext.appArmorProfile: {type: Unconfined}   # where AppArmor is on",
        "or, enforcing less (see SECURITY.md): stockade run --isolation landlock ...",
    )


def _mount_remedy() -> tuple[str, ...]:
    return (
        "Docker: --security-opt apparmor=unconfined --security-opt systempaths=unconfined; "
        "Podman: --security-opt unmask=ALL",
        "Kubernetes: securityContext.procMount: Unmasked (with spec.hostUsers: false) and "
        "appArmorProfile: {type: Unconfined}",
        "on a host with AppArmor's user-namespace restriction: see apparmor_userns_restricted",
        "or, enforcing less (see SECURITY.md): stockade run --isolation landlock ...",
    )


def _unexplained(name: str, state: dict[str, object]) -> Cause:
    return Cause(str(state["reason"]), name, f"the readiness probe of isolation {name} failed "
                 f"at stage {state['stage']}: {state['message']}",
                 ("`stockade probe --json` and `stockade report` show every fact it checked",))


def _container_said(host: dict) -> str:
    return f" (this looks like {host['container']})" if host["container"] else ""


def _seccomp_text(host: dict) -> str:
    if host["seccomp_mode"] == 0:
        return "none"
    return f"mode {host['seccomp_mode']}, {host['seccomp_filters']} filter(s)"


def _own_seccomp() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("Seccomp", "Seccomp_filters"):
                fields[key] = int(value)
    return {"seccomp_mode": fields.get("Seccomp", 0),
            "seccomp_filters": fields.get("Seccomp_filters", 0)}


def _nested_user_namespace() -> bool:
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def _container() -> str:
    if os.path.exists("/run/.containerenv"):
        return "a Podman container"
    if os.path.exists("/.dockerenv"):
        return "a Docker container"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "a Kubernetes pod"
    return ""


def _libseccomp() -> bool:
    from stockade.errors import UnavailableError
    from stockade.linux import seccomp

    try:
        seccomp.compile_filter()
    except UnavailableError:
        return False
    return True


def _try_namespaces() -> str:
    """In a throwaway child: make a user and a mount namespace, map the ids, make a tmpfs
    (never attached anywhere). "ok", or where it failed and with what errno."""
    read_end, write_end = os.pipe()
    uid, gid = os.getuid(), os.getgid()
    pid = os.fork()
    if pid == 0:
        said = "ok"
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
                said = f"unshare: {errno.errorcode.get(ctypes.get_errno(), '?')}"
            else:
                try:
                    from stockade.linux import ns

                    ns.map_ids(uid, gid)
                except OSError as exc:
                    said = f"id map: {errno.errorcode.get(exc.errno or 0, '?')}"
                else:
                    said = _try_mount(libc)
        except BaseException:  # noqa: BLE001 - said as unknown
            said = "unknown"
        finally:
            os.write(write_end, said.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode() or "unknown"
    os.waitpid(pid, 0)
    return said


def _try_mount(libc: ctypes.CDLL) -> str:
    number = _FSOPEN.get(os.uname().machine)
    if number is None:
        return "ok"
    fd = libc.syscall(ctypes.c_long(number), b"tmpfs", ctypes.c_uint(0))
    if fd < 0:
        return f"mount: {errno.errorcode.get(ctypes.get_errno(), '?')}"
    os.close(fd)
    return "ok"
