"""Execution configs (`stockade exec CONFIG.json`): a config document mapped onto a Stockade
Policy, an argv and a containment. Pure: nothing here runs anything. The format is in
docs/exec-config.md.

Every problem is a PolicyError (code `policy_invalid`, exit 2) located `file: key` in the
config's own key names (`filesystem.readRoots[0]`, `process.timeout`), never in the policy's.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stockade.errors import PolicyError
from stockade.policy import Policy, merge, preset
from stockade.policy.decode import load_document
from stockade.policy.render import kind, show
from stockade.policy.schema import Invalid, check_keys, table
from stockade.policy.units import MAX_DURATION

SUPPORTED_VERSIONS = (1,)
# The config's containment names and the Policy containment each maps onto.
CONTAINMENTS = {"processcontainer": "native", "windows_sandbox": "vm"}
NETWORK_MODES = ("none", "allowlist")  # "any" is enforced by no backend: not offered
# What the config does not say comes from this preset: the system roots readable, the
# credential stores denied, a closed environment, no executing from write roots, its limits.
BASE_PRESET = "workspace-write-no-exec"
MAX_TIMEOUT_MS = int(MAX_DURATION * 1000)
MAX_IDLE_TIMEOUT_MS = 86_400_000  # one day
PIPE_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}", re.ASCII)

_TOP_KEYS = ("version", "containment", "process", "filesystem", "network", "experimental")
_PROCESS_KEYS = ("commandLine", "timeout")
_FILESYSTEM_KEYS = ("readRoots", "writeRoots", "deny")
_NETWORK_KEYS = ("mode", "allow", "deny")
_EXPERIMENTAL_KEYS = ("windows_sandbox",)
_WINDOWS_SANDBOX_KEYS = ("idleTimeoutMs", "daemonPipeName")
# Policy keys as the config names them, for errors the policy parser locates (a key equal to
# one of these, or followed by "[index]").
_CONFIG_KEYS = {"filesystem.read": "filesystem.readRoots",
                "filesystem.write": "filesystem.writeRoots",
                "limits.timeout": "process.timeout"}


@dataclass(frozen=True)
class WindowsSandboxOptions:
    """`experimental.windows_sandbox`: knobs of the Windows Sandbox driver. Validated
    everywhere; only Windows Sandbox would use them (the QEMU VM ignores them)."""

    idle_timeout_ms: int | None = None
    daemon_pipe_name: str | None = None

    @property
    def given(self) -> tuple[str, ...]:
        """The config keys that were set."""
        return tuple(key for key, value in (("idleTimeoutMs", self.idle_timeout_ms),
                                            ("daemonPipeName", self.daemon_pipe_name))
                     if value is not None)


@dataclass(frozen=True)
class ExecConfig:
    containment: str               # as the config names it: "processcontainer" | "windows_sandbox"
    policy: Policy                 # limits.timeout is process.timeout; containment native or vm
    command_line: str              # process.commandLine as written
    argv: tuple[str, ...]          # command_line split by POSIX shell rules (shlex)
    windows_sandbox: WindowsSandboxOptions


def load_exec_config(path: str | os.PathLike[str]) -> ExecConfig:
    """Read and map an execution config file (JSON; a TOML file of the same shape also reads)."""
    name = os.fsdecode(path)
    return parse_exec_config(load_document(name), file=name)


def parse_exec_config(document: object, *, file: str = "") -> ExecConfig:
    """Map a decoded config document; PolicyError (located `file: key`) if it cannot be."""
    try:
        return _parse(document)
    except Invalid as exc:
        raise PolicyError(exc.message, file=file, key=exc.key) from None


def _parse(document: object) -> ExecConfig:
    top = table(document, "")
    check_keys(top, _TOP_KEYS, "")
    _version(_required(top, "version", ""))
    containment = _containment(_required(top, "containment", ""))
    process = table(_required(top, "process", ""), "process")
    check_keys(process, _PROCESS_KEYS, "process")
    command_line = _required(process, "commandLine", "process")
    argv = _split(command_line)
    # (stdin: /dev/null, as docs/exec-config.md says, whatever the caller's stdin is)
    sections: dict[str, Any] = {"containment": CONTAINMENTS[containment],
                                "process": {"stdin": "null"}}
    if "timeout" in process:
        sections["limits"] = {"timeout": _milliseconds(process["timeout"], "process.timeout",
                                                       MAX_TIMEOUT_MS) / 1000}
    sections["filesystem"] = _filesystem(top.get("filesystem", {}))  # never the preset's roots
    if "network" in top:
        sections["network"] = _network(top["network"])
    options = _experimental(top.get("experimental", {}), containment)
    return ExecConfig(containment, _policy(sections), command_line, argv, options)


def _required(section: Mapping[Any, Any], key: str, where: str) -> Any:
    if key not in section:
        raise Invalid(f"missing required key {show(key)}", where)
    return section[key]


def _version(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value not in SUPPORTED_VERSIONS:
        listed = ", ".join(map(str, SUPPORTED_VERSIONS))
        raise Invalid(f"expected a supported version ({listed}), got {show(value)}", "version")


def _containment(value: object) -> str:
    if not isinstance(value, str) or value not in CONTAINMENTS:
        listed = ", ".join(f'"{name}"' for name in CONTAINMENTS)
        raise Invalid(f"expected one of {listed}, got {show(value)}", "containment")
    return value


def _split(command_line: object) -> tuple[str, ...]:
    key = "process.commandLine"
    if not isinstance(command_line, str):
        raise Invalid(f"expected a string, got {kind(command_line)}", key)
    if "\0" in command_line:
        raise Invalid("expected a command line without NUL bytes", key)
    try:
        argv = shlex.split(command_line)
    except ValueError as exc:  # an unterminated quote or escape
        raise Invalid(f"cannot split the command line: {exc}", key) from None
    if not argv:
        raise Invalid("the command line names no command", key)
    if not argv[0]:
        raise Invalid("the command, the line's first word, is empty ('' or \"\")", key)
    return tuple(argv)


def _milliseconds(value: object, key: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise Invalid(f"expected a whole number of milliseconds from 1 to {most}, "
                      f"got {show(value)}", key)
    return value


def _filesystem(value: object) -> dict[str, Any]:
    section = table(value, "filesystem")
    check_keys(section, _FILESYSTEM_KEYS, "filesystem")
    base = preset(BASE_PRESET).filesystem
    mapped: dict[str, Any] = {"write": section.get("writeRoots", [])}
    read = section.get("readRoots", [])
    # The config's roots go first, so that an error's [index] counts the config's entries.
    mapped["read"] = [*read, *base.read] if isinstance(read, list) else read
    if "deny" in section:
        mapped["deny"] = section["deny"]
    return mapped


def _network(value: object) -> dict[str, Any]:
    section = table(value, "network")
    check_keys(section, _NETWORK_KEYS, "network")
    mode = section.get("mode", "none")
    if not isinstance(mode, str) or mode not in NETWORK_MODES:
        listed = ", ".join(f'"{name}"' for name in NETWORK_MODES)
        raise Invalid(f"expected one of {listed}, got {show(mode)}", "network.mode")
    return {"mode": mode, "allow": section.get("allow", []), **(
        {"deny": section["deny"]} if "deny" in section else {})}


def _experimental(value: object, containment: str) -> WindowsSandboxOptions:
    section = table(value, "experimental")
    check_keys(section, _EXPERIMENTAL_KEYS, "experimental")
    if "windows_sandbox" not in section:
        return WindowsSandboxOptions()
    key = "experimental.windows_sandbox"
    if containment != "windows_sandbox":
        raise Invalid(f'applies only to containment "windows_sandbox" (this config\'s is '
                      f"{show(containment)})", key)
    knobs = table(section["windows_sandbox"], key)
    check_keys(knobs, _WINDOWS_SANDBOX_KEYS, key)
    idle = None
    if "idleTimeoutMs" in knobs:
        idle = _milliseconds(knobs["idleTimeoutMs"], f"{key}.idleTimeoutMs", MAX_IDLE_TIMEOUT_MS)
    pipe = knobs.get("daemonPipeName")
    if "daemonPipeName" in knobs and (not isinstance(pipe, str) or not PIPE_NAME.fullmatch(pipe)):
        raise Invalid("expected a pipe name of 1 to 128 letters, digits, '.', '_' or '-', "
                      f"got {show(pipe)}", f"{key}.daemonPipeName")
    return WindowsSandboxOptions(idle, pipe)


def _policy(sections: dict[str, Any]) -> Policy:
    """The base preset with the mapped sections laid over it; the policy parser's errors are
    re-located at the config's key."""
    try:
        return merge(preset(BASE_PRESET), sections)
    except PolicyError as exc:
        raise Invalid(_unlocated(exc), _config_key(exc.key)) from None


def located(error: PolicyError, file: str) -> PolicyError:
    """`error`, about the mapped policy (compile's: a root that does not exist), located at
    the config's own key in `file` (`filesystem.readRoots`, not `filesystem.read`)."""
    return PolicyError(_unlocated(error), file=file, key=_config_key(error.key), code=error.code)


def _unlocated(error: PolicyError) -> str:
    return error.message.removeprefix(f"{error.key}: ") if error.key else error.message


def _config_key(policy_key: str) -> str:
    for name, config_name in _CONFIG_KEYS.items():
        if policy_key == name or policy_key.startswith(name + "["):
            return config_name + policy_key[len(name):]
    return policy_key
