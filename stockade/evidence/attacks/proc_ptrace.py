"""Trace other processes: the sandbox's parent (its init), a host process by its pid, and a child
of our own; read their memory with process_vm_readv. Any attachment or read is an escape."""

import ctypes
import os
import signal
import time

from _common import ARGS, NR, attempt, syscall

PTRACE_ATTACH, PTRACE_DETACH = 16, 17
host_pid = int(ARGS[0])


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def attach(pid):
    syscall(NR["ptrace"], PTRACE_ATTACH, pid, 0, 0)
    os.waitpid(pid, 0)
    syscall(NR["ptrace"], PTRACE_DETACH, pid, 0, 0)
    return f"attached to {pid}"


def read_memory(pid):
    buffer = ctypes.create_string_buffer(8)
    local = IoVec(ctypes.addressof(buffer), 8)
    remote = IoVec(ctypes.addressof(buffer), 8)  # valid in a forked copy of this process
    syscall(NR["process_vm_readv"], pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
    return f"read {pid}'s memory"


child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
for label, pid in (("parent", os.getppid()), ("host process", host_pid), ("own child", child)):
    if label == "host process" and os.path.exists(f"/proc/{pid}"):
        continue  # that number belongs to a sandbox process here, not to the host's
    attempt(f"ptrace {label} ({pid})", lambda p=pid: attach(p))
    attempt(f"process_vm_readv {label} ({pid})", lambda p=pid: read_memory(p))
os.kill(child, signal.SIGKILL)
