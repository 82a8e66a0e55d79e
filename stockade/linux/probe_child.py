"""The readiness probe's child: runs INSIDE a sandbox and prints one JSON object of what it saw.

It is handed to the interpreter with `-c` (Stockade itself is not visible in the sandbox), so
it imports only the standard library. Its one argument is JSON naming what to try: the
workspace (write root), a read root, a host path outside every root, the host's loopback
listeners and a marker. Outcomes are "ok" or an errno name; nothing it prints is a path or a
value of the environment. The owner judges the facts (see probe.py); this only observes.
"""

import ctypes
import errno
import fcntl
import json
import os
import resource
import select
import socket
import sys
import time

NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")
CLONE_NEWUSER = 0x10000000
PTRACE_TRACEME = 0
TIOCSTI = 0x5412
PR_GET_SECUREBITS = 27
LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture
LANDLOCK_CREATE_RULESET_VERSION = 1
CAPABILITY_SETS = {"CapInh": "inheritable", "CapPrm": "permitted", "CapEff": "effective",
                   "CapBnd": "bounding", "CapAmb": "ambient"}
DAEMON_SECONDS = 120  # the daemon outlives the probe unless the sandbox kills it
libc = ctypes.CDLL(None, use_errno=True)


def outcome(action) -> str:
    """ "ok", or the name of the error `action` raised."""
    try:
        action()
    except socket.gaierror as exc:
        return next((n for n in dir(socket) if n.startswith("EAI_")
                     and getattr(socket, n) == exc.errno), "EAI_UNKNOWN")
    except OSError as exc:
        return errno.errorcode.get(exc.errno, "E?")
    return "ok"


def call_outcome(result: int) -> str:
    return "ok" if result != -1 else errno.errorcode.get(ctypes.get_errno(), "E?")


def write(path: str) -> None:
    with open(path, "w") as f:
        f.write("probe")


def connect(family: int, kind: int, address: object) -> None:
    with socket.socket(family, kind) as sock:
        sock.settimeout(2)
        if kind == socket.SOCK_DGRAM:
            sock.sendto(b"stockade-probe", address)
        else:
            sock.connect(address)


def open_fds() -> list[int]:
    """Descriptors open now (the listing's own is already closed when it is looked at)."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        fds.append(int(name))
    return sorted(fds)


def filesystem(params: dict) -> dict:
    workspace = params["workspace"]
    return {
        # (in a directory of the workspace: in the landlock tier, the directory above a
        # protected name takes no new entry)
        "write_root": outcome(lambda: write(os.path.join(workspace, "work", "written"))),
        "write_root_noexec": bool(os.statvfs(workspace).f_flag & os.ST_NOEXEC),
        "read_root_read_only": bool(os.statvfs(params["read_root"]).f_flag & os.ST_RDONLY),
        "outside_path": outcome(lambda: os.stat(params["outside"])),
        "outside_read": outcome(lambda: open(params["outside"]).close()),
        "protected_name": outcome(lambda: write(os.path.join(workspace, ".agents", "written"))),
        "git_hooks": outcome(lambda: write(os.path.join(workspace, ".git", "hooks", "written"))),
        "git_metadata": outcome(lambda: write(os.path.join(workspace, ".git", "written"))),
        "denied_path": outcome(lambda: os.listdir(os.path.join(workspace, "secret"))),
    }


def helpers(params: dict) -> dict:
    """Stockade's own state, privilege bits, address families, socket files, written memory."""
    unix, stream = socket.AF_UNIX, socket.SOCK_STREAM
    return {
        "stockade_state": outcome(lambda: os.listdir(params["state"])),
        "privilege_bits": outcome(lambda: os.chmod(
            os.path.join(params["workspace"], "work", "written"), 0o4755)),
        "socket_vsock": outcome(lambda: socket.socket(40, stream).close()),  # never connected
        "unix_socket_file": outcome(lambda: connect(unix, stream, params["socket_file"])),
        "memfd_exec": memfd_exec(),
    }


def memfd_exec() -> str:
    """Execute this interpreter from a memfd it is copied into, in a throwaway child."""
    fd = os.memfd_create("stockade-probe", 0)
    with open(sys.executable, "rb") as f:
        os.write(fd, f.read())
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(fd, [sys.executable, "-I", "-S", "-c", "pass"], {})
        except OSError as exc:
            os._exit(100 + exc.errno)
        os._exit(99)
    os.close(fd)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return "ok" if status == 0 else errno.errorcode.get(status - 100, "E?")


def landlock() -> dict:
    abi = libc.syscall(ctypes.c_long(LANDLOCK_CREATE_RULESET), None, ctypes.c_long(0),
                       ctypes.c_long(LANDLOCK_CREATE_RULESET_VERSION))
    # "/" is the sandbox's own mount and visible, but no Landlock rule grants it.
    os.stat("/")
    return {"landlock_abi": max(abi, 0), "landlock_ungranted_dir": outcome(lambda: os.listdir("/"))}


def status() -> dict:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {
        "securebits": libc.prctl(PR_GET_SECUREBITS, 0, 0, 0, 0),
        "seccomp_mode": int(fields["Seccomp"]),
        "no_new_privs": int(fields["NoNewPrivs"]),
        "capabilities": {name: int(fields[key], 16) for key, name in CAPABILITY_SETS.items()},
    }


def denied_syscalls() -> dict:
    """unshare and ptrace, tried in a throwaway child (if they worked, it would be changed)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        seen = {"seccomp_ptrace": call_outcome(libc.ptrace(PTRACE_TRACEME, 0, None, None)),
                "seccomp_unshare": call_outcome(libc.unshare(CLONE_NEWUSER))}
        os.write(write_end, json.dumps(seen).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        seen = json.loads(f.read())
    os.waitpid(pid, 0)
    seen["seccomp_tiocsti"] = outcome(lambda: fcntl.ioctl(0, TIOCSTI, b"x"))
    return seen


def network(params: dict) -> dict:
    with open("/proc/self/net/dev") as f:
        interfaces = sorted(line.split(":")[0].strip() for line in f.readlines()[2:])
    inet, unix = socket.AF_INET, socket.AF_UNIX
    stream, dgram = socket.SOCK_STREAM, socket.SOCK_DGRAM
    # The host listens on these; whatever the sandbox reaches must not be the host's.
    return {
        "network_interfaces": interfaces,
        "tcp_loopback": outcome(lambda: connect(inet, stream, ("127.0.0.1", params["tcp_port"]))),
        "udp_loopback": outcome(lambda: connect(inet, dgram, ("127.0.0.1", params["udp_port"]))),
        "unix_abstract": outcome(lambda: connect(unix, stream, "\0" + params["abstract"])),
        "link_local": outcome(lambda: connect(inet, stream, ("169.254.169.254", 80))),
        "dns": outcome(lambda: socket.getaddrinfo("example.com", 443)),
    }


def environment() -> list[str]:
    """Names in the environment the command was started with (Python itself may add some to
    os.environ, e.g. LC_CTYPE for its locale coercion)."""
    with open("/proc/self/environ", "rb") as f:
        return sorted(item.split(b"=", 1)[0].decode() for item in f.read().split(b"\0") if item)


def limits() -> dict:
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    return {
        "rlimit_as": list(resource.getrlimit(resource.RLIMIT_AS)),
        "rlimit_nproc": list(resource.getrlimit(resource.RLIMIT_NPROC)),
        "rlimit_fsize": list(resource.getrlimit(resource.RLIMIT_FSIZE)),
        "rlimit_core": list(resource.getrlimit(resource.RLIMIT_CORE)),
        "pid_max": pid_max,
    }


def daemon() -> bool:
    """Leave a double-forked, setsid daemon behind (its command line carries the marker)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.write(write_end, b"1")
            os.close(write_end)
            time.sleep(DAEMON_SECONDS)
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    started = bool(select.select([read_end], [], [], 5)[0]) and os.read(read_end, 1) == b"1"
    os.close(read_end)
    return started


def observe(params: dict) -> dict:
    facts: dict = {"inherited_fds": open_fds()}
    facts["namespaces"] = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in NAMESPACES}
    facts |= filesystem(params)
    facts |= helpers(params)
    facts |= landlock()
    facts |= status()
    facts |= denied_syscalls()
    facts |= network(params)
    facts["environment"] = environment()
    facts |= limits()
    facts["daemon_started"] = daemon()
    return facts


if __name__ == "__main__":
    print(json.dumps(observe(json.loads(sys.argv[1]))))
