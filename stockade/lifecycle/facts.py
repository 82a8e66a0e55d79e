"""What the readiness probe demands of each fact it observes, stage by stage.

The probe sandbox runs under PROBE_POLICY's limits and environment; each fact has a test and
the expectation it states. `judge` names the first stage whose facts do not hold; the report
asks `verified` about the facts each capability rests on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from stockade.lifecycle.probe_child import NAMESPACES
from stockade.policy import model

PROBE_ENV = (("STOCKADE_PROBE", "1"),)
PROBE_MEMORY, PROBE_PIDS, PROBE_FILE_SIZE = 512 << 20, 32, 1 << 20
PROBE_LIMITS = model.Limits(timeout=30.0, memory=PROBE_MEMORY, pids=PROBE_PIDS, output=1 << 20,
                            file_size=PROBE_FILE_SIZE)

Check = tuple[Callable[[object], bool], str]  # the test, and what it expects (for messages)


class NotEnforced(Exception):
    """A fact of `stage` does not hold."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


Table = dict[str, dict[str, Check]]  # stage -> fact -> its check


def judge(facts: dict[str, object], table: Table | None = None) -> None:
    """Raise NotEnforced for the first stage with a fact that does not hold. `table` defaults
    to the Linux probe's (`expectations()`); another platform passes its own."""
    for stage, checks in (table or expectations()).items():
        for fact, (accept, expected) in checks.items():
            value = facts.get(fact)
            if not accept(value):
                raise NotEnforced(stage, f"{fact}: observed {value!r}, expected {expected}")


def verified(facts: dict[str, object], *names: str, table: Table | None = None) -> bool:
    """Whether each named fact is present and holds (`table` as for `judge`)."""
    checks = {fact: accept for stage in (table or expectations()).values()
              for fact, (accept, _) in stage.items()}
    return all(name in facts and name in checks and checks[name](facts[name])
               for name in names)


def exactly(wanted: object) -> Check:
    """A check that a fact is `wanted`, of the same type (True is not 1)."""
    return (lambda value: type(value) is type(wanted) and value == wanted), repr(wanted)


def _denied(value: object) -> bool:
    return isinstance(value, str) and value != "ok"


def _equal(wanted: object) -> Check:
    return (lambda value: value == wanted), repr(wanted)


@functools.cache
def expectations() -> dict[str, dict[str, Check]]:
    from stockade.linux.limits import INIT_TASKS, PID_MAX_FLOOR, RESERVED_PIDS
    from stockade.linux.privilege import SECUREBITS

    denied = (_denied, "an error")
    return {
        "namespaces": {"new_namespaces": _equal(sorted(NAMESPACES))},
        "filesystem": {
            "write_root": _equal("ok"), "write_root_noexec": _equal(True),
            "read_root_read_only": _equal(True), "outside_path": denied, "outside_read": denied,
            "protected_name": denied, "git_hooks": denied, "git_metadata": _equal("ok"),
            "denied_path": denied,
        },
        "landlock": {"landlock_abi": (lambda v: isinstance(v, int) and v >= 1, "at least 1"),
                     "landlock_ungranted_dir": _equal("EACCES")},
        "seccomp": {"seccomp_mode": _equal(2), "seccomp_unshare": _equal("EPERM"),
                    "seccomp_ptrace": _equal("EPERM"), "seccomp_tiocsti": _equal("EPERM")},
        "privileges": {"no_new_privs": _equal(1), "securebits": _equal(SECUREBITS),
                       "capabilities": (lambda v: isinstance(v, dict) and len(v) == 5
                                        and not any(v.values()), "every set empty")},
        "descriptors": {"inherited_fds": _equal([0, 1, 2])},
        "network": {
            "network_interfaces": _equal(["lo"]), "tcp_loopback": denied,
            "unix_abstract": denied, "link_local": denied,
            "dns": (lambda v: _denied(v) and v not in ("EAI_NONAME", "EAI_NODATA"),
                    "no resolver reachable"),
            "host_listeners_untouched": _equal(True),
        },
        "environment": {"environment": _equal(sorted(name for name, _ in PROBE_ENV))},
        "limits": {
            "rlimit_as": _equal([PROBE_MEMORY] * 2),
            "rlimit_nproc": _equal([PROBE_PIDS + INIT_TASKS] * 2),
            "rlimit_fsize": _equal([PROBE_FILE_SIZE] * 2),
            "rlimit_core": _equal([0, 0]),
            "pid_max": _equal(max(PID_MAX_FLOOR, RESERVED_PIDS + PROBE_PIDS)),
        },
        "lifetime": {"daemon_started": _equal(True), "leftover_processes": _equal(0),
                     "ledger_settled": _equal(True)},
        "helpers": {"stockade_state": denied, "privilege_bits": _equal("EPERM"),
                    "socket_vsock": _equal("EAFNOSUPPORT"), "unix_socket_file": denied},
    }


@functools.cache
def tier_expectations() -> dict[str, dict[str, Check]]:
    """The landlock tier's table (stockade/linux/landlock_tier.py): no namespace, so no mount
    flags, interfaces or pid_max to judge; denials by Landlock and seccomp instead."""
    import os

    from stockade.linux.landlock_tier import SCOPE_ABI
    from stockade.linux.privilege import SECUREBITS

    table = {stage: dict(checks) for stage, checks in expectations().items()}
    denied = (_denied, "an error")
    table["namespaces"] = {"new_namespaces": _equal([])}
    # (no mount view: a path outside the roots can be looked up, only not opened)
    for fact in ("write_root_noexec", "read_root_read_only", "git_metadata", "outside_path"):
        del table["filesystem"][fact]
    table["landlock"]["landlock_abi"] = (lambda v: isinstance(v, int) and v >= SCOPE_ABI,
                                         f"at least {SCOPE_ABI}")
    if os.geteuid() != 0:  # (only root may lock securebits or shrink the bounding set there)
        del table["privileges"]["securebits"]
        table["privileges"]["capabilities"] = (
            lambda v: isinstance(v, dict) and len(v) == 5
            and not any(value for name, value in v.items() if name != "bounding"),
            "every set empty but the bounding set (no_new_privs: exec gains none)")
    else:
        table["privileges"]["securebits"] = _equal(SECUREBITS)
    del table["network"]["network_interfaces"]
    table["network"]["udp_loopback"] = denied
    del table["limits"]["pid_max"]
    if os.geteuid() == 0:  # (the tier refuses limits.pids as root: tier_limits)
        del table["limits"]["rlimit_nproc"]
    else:
        table["limits"]["rlimit_nproc"] = (
            lambda v: isinstance(v, list) and len(v) == 2 and v[0] == v[1] >= PROBE_PIDS,
            f"the user's tasks plus {PROBE_PIDS}")
    return table


def tier_limits() -> model.Limits:
    """The probe's limits in the landlock tier: without pids as root, whom RLIMIT_NPROC does
    not bind (the tier refuses the limit there)."""
    import os
    from dataclasses import replace

    return replace(PROBE_LIMITS, pids=None) if os.geteuid() == 0 else PROBE_LIMITS
