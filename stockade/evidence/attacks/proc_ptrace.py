"""Trace other processes: our parent (the sandbox's init), a host process by its pid (argv:
pid and the tag in its command line), and a child of our own; read our child's memory with
process_vm_readv. Any attachment or read is an escape."""

import ctypes
import os
import signal
import time

from _common import ARGS, NR, attempt, note, seen_as, syscall

PTRACE_SEIZE = 0x4206
host_pid, host_tag = int(ARGS[0]), ARGS[1]


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def attach(pid):
    """PTRACE_SEIZE: attached without stopping it (where nothing refuses it, the tracee may
    be the process that runs this row: it must not stop); detached when we exit."""
    syscall(NR["ptrace"], PTRACE_SEIZE, pid, 0, 0)
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
attempt("ptrace our parent", lambda: attach(os.getppid()))
if seen_as(host_pid, host_tag) is False:
    note("skipped", f"pid {host_pid} names another process here, not the host's")
else:
    attempt("ptrace the host process", lambda: attach(host_pid))
attempt("ptrace our own child", lambda: attach(child))
attempt("process_vm_readv our own child", lambda: read_memory(child))
os.kill(child, signal.SIGKILL)
