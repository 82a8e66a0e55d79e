"""The evidence matrix: one row per attack. Each names its program in attacks/, the arguments it
gets (placeholders filled from its scene, see setups.py), the preset and policy overrides it runs
under, the host-side setup, and how the child's side is judged. Every row is also checked on the
host: the outside tree unchanged, no secret in the child's output, no process left over.
"""

from __future__ import annotations

import os
from typing import Any

from stockade.evidence import casefold, judges, launches, setups
from stockade.evidence.judges import (
    bounded,
    completed,
    denials,
    ended_by,
    output_cut,
    refused,
    truncation_denied,
)
from stockade.evidence.row import Row
from stockade.policy.units import format_size

FORK_LIMIT = 64
MEMORY_LIMIT = 256 << 20
FILE_LIMIT = 1 << 20
OUTPUT_LIMIT = 64 << 10
SOAK_LAUNCHES = 64


def row(id: str, category: str, attempt: str, expected: str, attack: str, *args: str,
        setup: setups.Setup = setups.nothing, judge: judges.Judge | None = None,
        **options: Any) -> Row:
    return Row(id, category, attempt, expected, attack, judge or denials(), setup, args,
               **options)


def _fork_bound() -> int:
    """As root, RLIMIT_NPROC does not bind, and the sandbox's pid_max is the backstop."""
    from stockade.linux.limits import RESERVED_PIDS  # (POSIX-only: its rows run on Linux)

    return FORK_LIMIT + (RESERVED_PIDS if os.getuid() == 0 else 1)


def _limits(**limits: Any) -> dict[str, Any]:
    return {"limits": limits}


ALLOWLIST = {"network": {"mode": "allowlist", "allow": ["localhost", "evidence.test"]}}
GIT = "{ws}/a/b/.git"
# A protected name, and what of a repository stays read-only, two levels down (the rest of
# its .git is writable: git works).
NESTED_ATTEMPT = ("tamper with a protected .agents and a repository's config and hooks two "
                  "levels down in a write root")
NESTED_EXPECTED = "EROFS/EBUSY on every attempt; all unchanged"
NESTED_TARGETS = ("{ws}/a/b/.agents/rules", "{ws}/a/b/.agents", f"{GIT}/config", f"{GIT}/hooks",
                  f"{GIT}/hooks/pre-commit")

ROWS: tuple[Row, ...] = (
    # --- filesystem ------------------------------------------------------------------------
    row("fs.read-outside", "filesystem", "read a file and list directories outside every root",
        "ENOENT: nothing outside the roots exists in the sandbox", "read_paths.py",
        "{secret_file}", "{outside}/", "/root/"),
    row("fs.write-outside", "filesystem",
        "create, overwrite, truncate, rename and delete outside every root, also via ws/..",
        "every attempt fails; the outside tree is unchanged", "tamper.py",
        "{secret_file}", "{outside}/new", "{outside}", "{ws}/../outside/new"),
    row("fs.write-read-root", "filesystem",
        "modify a read-only root (read-only preset): write, truncate, chmod, rename, delete",
        "EROFS; the workspace is unchanged", "tamper.py", "{ws}/file", "{ws}/dir", "{ws}/new",
        preset="read-only", setup=setups.workspace_files),
    row("fs.protected-dir", "filesystem", NESTED_ATTEMPT, NESTED_EXPECTED, "tamper.py",
        *NESTED_TARGETS, setup=setups.nested_repository),
    row("fs.protected-file", "filesystem",
        "tamper with a .git file (worktree pointer) and the config and hooks of the gitdir it "
        "points to", "EROFS/EBUSY; all unchanged", "tamper.py", "{ws}/sub/.git",
        "{ws}/.repo-git/config", "{ws}/.repo-git/hooks", setup=setups.git_file),
    row("fs.protected-rename", "filesystem",
        "rename a repository's hooks or config or any directory above them, then plant a "
        "replacement", "EBUSY/EROFS; nothing renamed, nothing planted", "fs_rename.py", "{ws}",
        f"{GIT}/hooks", f"{GIT}/config", setup=setups.nested_repository),
    row("fs.git-pointers", "filesystem",
        "tamper with what leads git to other configuration: a file the config includes, a "
        "linked worktree's .git file, commondir and gitdir, a submodule's .git file, config "
        "and hooks", "EROFS/EBUSY on every attempt; all unchanged", "tamper.py",
        "{ws}/shared.gitconfig", "{ws}/wt/.git", "{ws}/.git/worktrees/wt/commondir",
        "{ws}/.git/worktrees/wt/gitdir", "{ws}/sub/.git", "{ws}/.git/modules/sub/config",
        "{ws}/.git/modules/sub/hooks", setup=setups.git_pointers),
    row("fs.git-absent", "filesystem",
        "create the file a repository's config includes, absent at launch, in the work tree",
        "the launch is refused (unenforceable:filesystem.git); nothing is created",
        "tamper.py", "{ws}/local.gitconfig", setup=setups.git_include_absent,
        fails_closed_with="unenforceable:filesystem.git"),
    row("fs.deny-in-root", "filesystem",
        "read, list, write, rename and delete denied paths inside a granted write root",
        "EACCES/EROFS; secrets never read; paths unchanged", "tamper.py", "--read",
        "{ws}/keys/id", "{ws}/keys", "{ws}/token", setup=setups.denied_paths,
        policy={"filesystem": {"deny": ["{workspace}/keys", "{workspace}/token"]}}),
    row("fs.symlink-planted", "filesystem",
        "follow links planted before launch: absolute, relative, to a directory, through ..",
        "ENOENT: the targets do not exist in the sandbox", "fs_symlink.py", "follow",
        "{ws}/abs-link", "{ws}/rel-link", "{ws}/dir-link/secret", "{ws}/dotdot-link",
        setup=setups.planted_symlinks),
    row("fs.symlink-runtime", "filesystem",
        "create absolute, relative and ..-chain links to outside paths at run time, follow them",
        "ENOENT: links resolve inside the sandbox's own view", "fs_symlink.py", "create",
        "{secret_file}", "{outside}"),
    row("fs.hardlink", "filesystem",
        "write through a planted hard link to an outside file; link outside and read-only files",
        "EROFS for the planted link; ENOENT/EXDEV for new links", "fs_hardlink.py",
        "{ws}/hard", "{secret_file}", "{root}/ro/file", setup=setups.planted_hard_link),
    row("fs.proc-root", "filesystem",
        "reach outside files through /proc/self/root, /proc/1/root and a host pid's /proc entry",
        "ENOENT/EACCES: the host's pids and files are not there", "fs_proc_root.py",
        "{secret_file}", "{host_pid}"),
    row("fs.exec-from-write", "filesystem",
        "run a program copied into the workspace, /tmp and /dev/shm (directly, via ld.so, mmap)",
        "EACCES/EPERM: write roots are noexec", "fs_exec.py", "{ws}", "/tmp", "/dev/shm",
        preset="workspace-write-no-exec"),
    row("fs.mknod", "filesystem", "create character and block device nodes",
        "EPERM: no device nodes", "fs_mknod.py", "{ws}", "/tmp", setup=setups.empty_workspace),
    row("fs.block-device", "filesystem", "open the host's block devices and common disk names",
        "ENOENT: the sandbox's /dev has no disks", "open_devices.py", "*{block_devices}",
        "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/loop0", setup=setups.host_block_devices),
    row("fs.proc-fd-reopen", "filesystem",
        "reopen a read-only descriptor writable via /proc/self/fd and /dev/fd",
        "EROFS/EBADF; the file is unchanged", "fs_proc_fd.py", "{ws}/file",
        preset="read-only", setup=setups.read_only_file),
    row("fs.truncate-read-only", "filesystem",
        "truncate a read-only file by path, by descriptor and by O_TRUNC",
        "EROFS/EINVAL; the file is unchanged", "fs_truncate.py", "{ws}/file",
        preset="read-only", setup=setups.read_only_file),
    row("fs.case-alias", "filesystem",
        "on a case-folding filesystem, reach protected and denied names by other spellings",
        "EROFS/EACCES for every spelling, or the launch refused "
        "(unenforceable:filesystem.case_alias); nothing stored changes", "fs_case_alias.py",
        "{ws}/.git", "{ws}/.GIT/config", "{ws}/.git/CONFIG", "{ws}/.Git/HOOKS/pre-commit",
        "{ws}/sub/.GIT", "{ws}/KEYS/id", "{ws}/TOKEN", "{ws}/other/.git/config",
        setup=setups.case_folding_workspace,
        policy={"filesystem": {"deny": ["{workspace}/keys", "{workspace}/token"]}},
        launch=casefold.launch, fails_closed_with="unenforceable:filesystem.case_alias"),
    row("fs.memfd-exec", "filesystem",
        "execute a program written into a memfd: fexecve, and by its /proc/self/fd path",
        "EACCES: vm.memfd_noexec = 2 in the sandbox's pid namespace", "fs_memfd.py",
        setup=setups.memfd_knob, preset="workspace-write-no-exec"),
    row("fs.privilege-bits", "filesystem",
        "make a copy of sh setuid or setgid in a write root (chmod, fchmod, fchmodat, open, "
        "mknod), give it a file capability",
        "EPERM; no privilege bit is left on the host", "fs_privilege.py", "{ws}",
        setup=setups.privilege_bits),
    row("fs.deny-whole-tree", "filesystem",
        "with the whole host tree as a read root (read = [\"/\"]): SSH keys, cloud, git, "
        "registry and cluster credentials in the home directory",
        "EACCES: the preset's masks hold whatever the roots are", "read_paths.py",
        "{home}/.ssh/", *(f"{{home}}/{name}" for name in setups.HOME_SECRETS),
        setup=setups.fake_home, policy={"filesystem": {"read": ["/"]}}),
    row("fs.deny-absent", "filesystem",
        "create a denied path that does not exist at launch inside the write root (~/.aws)",
        "the launch is refused (unenforceable:filesystem.deny); nothing is created",
        "tamper.py", "{ws}/.aws/config", policy={"filesystem": {"deny": ["{workspace}/.aws"]}},
        fails_closed_with="unenforceable:filesystem.deny"),
    row("fs.planted-root-link", "filesystem",
        "a grant redirected by a link an earlier run planted (ws/build -> outside, --write build)",
        "the launch is refused (unenforceable:filesystem.symlink); outside unchanged",
        "tamper.py", "{ws}/build/escaped", setup=setups.planted_root_link,
        policy={"filesystem": {"write": ["{workspace}", "{workspace}/build"]}},
        fails_closed_with="unenforceable:filesystem.symlink"),
    # --- network ---------------------------------------------------------------------------
    row("net.tcp-loopback", "network", "TCP to a server on the host's loopback (IPv4, IPv6)",
        "ECONNREFUSED/EACCES; the server is never contacted", "net_connect.py",
        "tcp:127.0.0.1:{tcp4}", "tcp:[::1]:{tcp6}", setup=setups.loopback_tcp),
    row("net.udp-loopback", "network", "UDP to a server on the host's loopback (IPv4, IPv6)",
        "no reply; the server receives nothing", "net_connect.py",
        "udp:127.0.0.1:{udp4}", "udp:[::1]:{udp6}", setup=setups.loopback_udp),
    row("net.dns-loopback", "network", "DNS queries (UDP and TCP) to a resolver on host loopback",
        "no answer; the resolver receives nothing", "net_connect.py",
        "dns-udp:127.0.0.1:{dns_udp}", "dns-tcp:127.0.0.1:{dns_tcp}",
        setup=setups.loopback_dns),
    row("net.test-host", "network", "TCP, UDP and DNS to a test host outside the sandbox",
        "ENETUNREACH; the test host receives nothing", "net_connect.py",
        "tcp:{test_host}:{test_tcp}", "dns-tcp:{test_host}:{test_tcp}",
        "udp:{test_host}:{test_udp}", "dns-udp:{test_host}:{test_udp}", setup=setups.test_host),
    row("net.listen", "network", "listen on a TCP port and wait for the host to connect",
        "EACCES on bind (Landlock), and the host cannot connect", "net_listen.py",
        "{listen_port}", "1.5", setup=setups.host_prober),
    row("net.unix-abstract", "network", "connect to an abstract unix socket of the host",
        "ECONNREFUSED/EPERM; the server is never contacted", "net_unix.py",
        "abstract:{abstract}", setup=setups.abstract_socket),
    row("net.unix-path", "network",
        "connect to unix socket files of the host (outside the roots, and system ones)",
        "ENOENT; the server is never contacted", "net_unix.py", "{outside}/host.sock",
        "/run/dbus/system_bus_socket", "/var/run/docker.sock", "/run/systemd/private",
        setup=setups.path_socket),
    row("net.inherited-socket", "network",
        "use a connected socket the launching process left inheritable",
        "only stdin, stdout and stderr are inherited", "net_inherited.py",
        setup=setups.inherited_socket),
    row("net.allowlist-direct", "network", "allowlist mode: connect directly, ignoring the proxy",
        "ECONNREFUSED/ENETUNREACH; the server is never contacted", "net_proxy.py",
        "direct:127.0.0.1:{tcp4}", setup=setups.loopback_tcp, policy=ALLOWLIST),
    row("net.allowlist-rebind", "network",
        "allowlist mode: CONNECT via the proxy to an allowed name resolving to loopback",
        "the proxy refuses (403); the server is never contacted", "net_proxy.py",
        "via:localhost:{tcp4}", setup=setups.loopback_tcp, policy=ALLOWLIST),
    row("net.allowlist-ip-literal", "network",
        "allowlist mode: CONNECT via the proxy to an IP literal not in the list",
        "the proxy refuses (403); the server is never contacted", "net_proxy.py",
        "via:127.0.0.1:{tcp4}", setup=setups.loopback_tcp, policy=ALLOWLIST),
    row("net.allowlist-metadata", "network",
        "allowlist mode: CONNECT via the proxy to the cloud metadata address",
        "the proxy refuses (403)", "net_proxy.py", "via:169.254.169.254:80",
        policy=ALLOWLIST),
    row("net.address-families", "network",
        "create AF_VSOCK (reaches the hypervisor from any namespace), AF_ALG, AF_PACKET, "
        "Bluetooth and AF_KEY sockets (created only, never connected)",
        "EAFNOSUPPORT: only unix, inet, inet6 and netlink sockets", "net_family.py"),
    row("net.unix-in-write-root", "network",
        "connect to a unix socket a host server listens on inside the write root",
        "ECONNREFUSED/EACCES (masked: network.unix_sockets = own); the server is never "
        "contacted", "net_unix.py", "{ws}/host.sock", setup=setups.socket_in_workspace),
    # --- process ---------------------------------------------------------------------------
    row("proc.ptrace", "process",
        "ptrace and process_vm_readv: the sandbox's init, a host process, an own child",
        "EPERM/ESRCH; the host process is not traced", "proc_ptrace.py", "{victim}",
        setup=setups.victim),
    row("proc.signal-host", "process",
        "signal a host process by pid and process group; take a pidfd on it",
        "ESRCH; the host process receives nothing", "proc_signal.py", "{victim}",
        setup=setups.victim),
    row("proc.tty-injection", "process",
        "TIOCSTI/TIOCLINUX on an own pty and on the host's terminal as stdin, made controlling",
        "EPERM; the host terminal receives no keystroke", "proc_tty.py",
        setup=setups.host_terminal),
    row("proc.caller-terminal", "process",
        "run from a host terminal (stdin, stdout, stderr): find it, change its settings, read "
        "what is typed on it, open /dev/tty",
        "ENOTTY/EBADF/ENXIO: the streams are pipes the owner relays; the terminal untouched",
        "proc_stdio.py", setup=setups.caller_terminal, launch=launches.from_the_callers_streams),
    row("proc.setuid", "process", "run a set-user-id program owned by another user",
        "its effective uid stays ours (nosuid, no_new_privs, unmapped owner)", "proc_setuid.py",
        "{setuid}", "{setuid_arg}", setup=setups.setuid_program),
    row("proc.capabilities", "process",
        "use capabilities (sethostname, raw socket); run without no_new_privs",
        "EPERM: every capability set empty, no_new_privs set", "proc_capabilities.py"),
    row("proc.user-namespace", "process",
        "create namespaces: unshare and clone with CLONE_NEWUSER, setns",
        "EPERM", "proc_syscall.py", "namespaces"),
    row("proc.mount", "process",
        "mount, bind-mount, umount, new mount API, pivot_root, chroot",
        "EPERM; no mount appears on the host", "proc_syscall.py", "mount", "{ws}/mnt",
        setup=setups.mount_point),
    row("proc.clone3", "process", "clone3 with CLONE_NEWUSER, and plain",
        "ENOSYS (so libc falls back to clone, whose flags seccomp can see)", "proc_syscall.py",
        "clone3", judge=denials({"clone3(CLONE_NEWUSER)": "ENOSYS", "clone3(plain)": "ENOSYS"})),
    row("proc.keyctl", "process", "kernel keyrings: add_key, keyctl", "EPERM",
        "proc_syscall.py", "keyctl"),
    row("proc.bpf", "process", "bpf: create a map, load a socket filter", "EPERM",
        "proc_syscall.py", "bpf"),
    row("proc.perf-event", "process", "perf_event_open on itself (allowed at paranoid 2)",
        "EPERM", "proc_syscall.py", "perf_event_open"),
    row("proc.userfaultfd", "process", "userfaultfd (user-mode only) and /dev/userfaultfd",
        "EPERM/ENOENT", "proc_syscall.py", "userfaultfd"),
    row("proc.io-uring", "process", "io_uring_setup", "EPERM", "proc_syscall.py", "io_uring"),
    row("proc.dev-mem", "process", "open /dev/mem, /dev/kmem, /dev/port, /dev/kmsg",
        "ENOENT: not in the sandbox's /dev", "open_devices.py",
        "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg"),
    # --- environment -----------------------------------------------------------------------
    row("env.parent-secrets", "environment",
        "find the parent's secret variables in the environment and in /proc/*/environ",
        "absent; no secret value in the child's output", "env_secrets.py",
        *setups.SECRET_VARIABLES, setup=setups.parent_secrets),
    row("env.loader-variables", "environment",
        "inherit LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, PYTHONSTARTUP, BASH_ENV from the parent",
        "absent from the child's environment", "env_secrets.py", *setups.LOADER_VARIABLES,
        setup=setups.loader_injection),
    row("env.refused-loader", "environment", "a policy that sets LD_PRELOAD for the child",
        "refused by name before launch (env_refused)", "env_secrets.py", "LD_PRELOAD",
        judge=refused("env_refused"),
        policy={"env": {"set": {"LD_PRELOAD": "/tmp/libevil.so"}}}),
    row("env.refused-credential", "environment",
        "a policy that passes the parent's GITHUB_TOKEN to the child",
        "refused by name before launch (env_refused)", "env_secrets.py", "GITHUB_TOKEN",
        judge=refused("env_refused"), setup=setups.credential_in_environment,
        policy={"env": {"pass": ["PATH", "GITHUB_TOKEN"]}}),
    row("env.home", "environment", "read the home directory, SSH keys and shell history",
        "ENOENT: home is not granted", "read_paths.py", "{home}/", "{home}/.ssh/id_ed25519",
        "{home}/.bash_history", "{home}/.aws/credentials", setup=setups.fake_home),
    row("env.home-credentials", "environment",
        "with home granted read: SSH keys, cloud, git, registry and cluster credentials",
        "EACCES: the preset's deny list masks them", "read_paths.py", "{home}/.ssh/",
        *(f"{{home}}/{name}" for name in setups.HOME_SECRETS), setup=setups.fake_home,
        policy={"filesystem": {"read": ["{home}"]}}),
    # --- resources -------------------------------------------------------------------------
    row("res.fork-bomb", "resources", f"fork without end (pids = {FORK_LIMIT})",
        "EAGAIN within the process limit; the host stays responsive", "res_fork.py", "2000",
        setup=setups.heartbeat(), judge=bounded("processes", _fork_bound),
        policy=_limits(pids=FORK_LIMIT, timeout="20s")),
    row("res.memory-bomb", "resources", f"allocate without end (memory = {MEMORY_LIMIT >> 20} MiB)",
        "MemoryError within the limit; the host stays responsive", "res_memory.py",
        str(4 * MEMORY_LIMIT), setup=setups.heartbeat(),
        judge=bounded("allocated MiB", lambda: MEMORY_LIMIT >> 20, " MiB"),
        policy=_limits(memory=format_size(MEMORY_LIMIT))),
    row("res.disk-fill", "resources",
        f"fill files in the workspace and /tmp (file_size = {FILE_LIMIT >> 20} MiB)",
        "EFBIG at the limit; the host stays responsive", "res_disk.py", str(8 * FILE_LIMIT),
        "{fill}", "/tmp/fill", setup=setups.heartbeat(setups.fill_target(FILE_LIMIT)),
        policy=_limits(file_size=format_size(FILE_LIMIT))),
    row("res.cpu-spin", "resources", "spin every core past the timeout (1.5 s)",
        "killed at the timeout; the host stays responsive", "res_spin.sh",
        setup=setups.heartbeat(), judge=ended_by("limits.timeout", 5.0),
        policy=_limits(timeout="1500ms")),
    row("res.output-flood", "resources",
        f"write 16 MiB to stdout (output = {OUTPUT_LIMIT >> 10} KiB)",
        "capture cut at the limit and flagged; the host stays responsive", "res_flood.py",
        str(16 << 20), setup=setups.heartbeat(), judge=output_cut(OUTPUT_LIMIT),
        policy=_limits(output=format_size(OUTPUT_LIMIT))),
    row("res.output-to-a-file", "resources",
        f"stdout appended to a host file: truncate it, write 16 MiB (output = "
        f"{OUTPUT_LIMIT >> 10} KiB)",
        "EINVAL (a pipe); the file keeps its lines and gains at most the limit",
        "res_file_out.py", str(16 << 20), setup=setups.appended_file(OUTPUT_LIMIT),
        judge=truncation_denied, launch=launches.from_the_callers_streams,
        policy=_limits(output=format_size(OUTPUT_LIMIT))),
    # --- lifecycle -------------------------------------------------------------------------
    row("life.daemon", "lifecycle", "double-fork a setsid daemon and exit",
        "the daemon dies with the sandbox", "life_daemon.py", judge=completed("daemon")),
    row("life.owner-killed", "lifecycle",
        "the process that launched the sandbox is killed with SIGKILL while a daemon runs",
        "the whole sandbox tree dies with its owner", "life_daemon.py", "stay",
        judge=launches.owner_killed_judge, launch=launches.owner_killed),
    row("life.timeout", "lifecycle", "outlive the timeout (1 s) with a daemon",
        "killed at the timeout, the daemon too", "life_daemon.py", "stay",
        judge=ended_by("limits.timeout", 4.0), policy=_limits(timeout="1s")),
    row("life.cancel", "lifecycle", "keep running with a daemon until cancelled (0.5 s)",
        "killed on cancellation, the daemon too", "life_daemon.py", "stay",
        setup=setups.cancel_after(0.5), judge=ended_by("cancelled", 4.0)),
    row("life.soak", "lifecycle",
        f"{SOAK_LAUNCHES} concurrent launches, each reading its neighbours' workspaces",
        "disjoint request ids, every neighbour denied, no residue (processes, /tmp, mounts)",
        "soak.py", judge=launches.soak_judge, launch=launches.soak(SOAK_LAUNCHES),
        setup=setups.soak_workspaces(SOAK_LAUNCHES)),
    # --- Stockade's own helpers ---------------------------------------------------------------
    row("helpers.state-dir", "helpers",
        "with a daemon serving from a state directory inside the workspace: list it, read its "
        "attestation, connect to cli.sock and daemon.sock",
        "EACCES: Stockade's state is masked in every view", "helper_state.py", "list:{state}",
        "read:{state}/attestation-linux.json", "connect:{state}/cli.sock",
        "connect:{state}/daemon.sock", preset="read-only", setup=setups.state_in_workspace),
    row("helpers.servers", "helpers",
        "reach the daemon and the CLI server (sockets in the workspace): a session and a run "
        "that write outside, the session list, the agent command line",
        "refused (peer_refused; not served): the peer is in another namespace; outside "
        "unchanged", "helper_servers.py", "{outside}", "daemon:{ws}/daemon.sock",
        "cli:{ws}/cli.sock", preset="read-only", launch=launches.against_servers),
    # --- VM containment (a QEMU guest per row) -----------------------------------------------
    row("vm.guest-kernel", "vm",
        "in a guest: set the kernel's core-dump, modprobe, hotplug and uevent helpers, trigger "
        "sysrq, unmount /proc and the root",
        "EROFS/EACCES/EPERM: the guest's kernel settings are out of the command's reach",
        "vm_kernel.py", launch=launches.in_a_guest),
    row("vm.hardlink", "vm",
        "in a guest: write through a hard link planted before boot to an outside file; link "
        "outside and read-only files", "EROFS for the planted link; ENOENT/EXDEV for new links",
        "fs_hardlink.py", "{ws}/hard", "{secret_file}", "{root}/ro/file",
        setup=setups.planted_hard_link, launch=launches.in_a_guest),
    row("vm.protected-nested", "vm", "in a guest: " + NESTED_ATTEMPT, NESTED_EXPECTED,
        "tamper.py", *NESTED_TARGETS, setup=setups.nested_repository,
        launch=launches.in_a_guest),
)
