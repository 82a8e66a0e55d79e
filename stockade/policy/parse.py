"""Parse, validate and merge policy documents (TOML or JSON, one schema) into a `Policy`.

Merge rule: a document with `preset = "NAME"` starts from that preset (`merge(base, document)`
from `base`; otherwise from the model's defaults) and its sections override the base key by key,
as `schema.FIELDS` says (`schema.merge_rule` in words, docs/policy.md lists them):
scalars and lists replace the base's value, except the deny lists (`filesystem.deny`,
`network.deny`), which add to the base's, so a preset's denials are never dropped;
`filesystem.protected`, which adds to the base's names, and removes those written `"!NAME"`
(one the base does not protect is an error); and the `env.set` table, which merges by variable
name.

The result is canonical: lists deduplicated and sorted, paths tidied (`paths.tidy_path`), domain
patterns normalised, variables in `env.set` dropped from `env.pass` (set wins), durations in
seconds, sizes in bytes (`policy_to_document` writes them back with a unit, "2GiB" or "2GB",
so the two are told apart). Ambiguous results are refused: a path both read and written, a
read or write root equal to or inside a denied path, allow patterns outside allowlist mode,
allowlist mode without allow patterns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, replace
from functools import cache
from typing import Any

from stockade.errors import PolicyError, UsageError
from stockade.policy import paths
from stockade.policy.decode import load_document
from stockade.policy.model import SCHEMA_VERSION, FilesystemPolicy, NetworkPolicy, Policy
from stockade.policy.presets import PRESET_DOCUMENTS, PRESETS
from stockade.policy.render import show
from stockade.policy.schema import (
    CONTAIN,
    FIELDS,
    ISOLATE,
    SECTIONS,
    SIZE_LIMITS,
    UNLIMITED,
    Invalid,
    check_keys,
    sorted_unique,
    table,
)
from stockade.policy.units import format_size


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and validate a `.toml` or `.json` policy file."""
    name = os.fsdecode(path)
    return parse_policy(load_document(name), file=name)


def parse_policy(document: Mapping[str, Any], *, file: str = "") -> Policy:
    """Validate a decoded policy document (starting from its `preset`, if it names one)."""
    try:
        top = table(document, "")
        check_keys(top, ("version", "preset", "containment", "isolation", *SECTIONS), "")
        if "version" not in top:
            raise Invalid(f'missing required key "version" (expected {SCHEMA_VERSION})', "version")
        _check_version(top["version"])
        base = _preset(top["preset"]) if "preset" in top else Policy()
        return _apply(base, top)
    except Invalid as exc:
        raise PolicyError(exc.message, file=file, key=exc.key) from None


def merge(base: Policy, override_document: Mapping[str, Any], *, file: str = "") -> Policy:
    """`base` with a document's sections laid over it (the rule is in the module docstring)."""
    try:
        top = table(override_document, "")
        check_keys(top, ("version", "containment", "isolation", *SECTIONS), "")
        if "version" in top:
            _check_version(top["version"])
        return _apply(base, top)
    except Invalid as exc:
        raise PolicyError(exc.message, file=file, key=exc.key) from None


def preset(name: str) -> Policy:
    """The named preset as a Policy."""
    try:
        return _preset(name)
    except Invalid as exc:
        raise PolicyError(exc.message, key=exc.key) from None


DEFAULT_PRESET = "read-only"  # the policy of a caller who names none


def resolve_policy(policy: Policy | str | os.PathLike[str] | None, preset_name: str | None,
                   ) -> Policy:
    """A Policy from a Policy object, a policy file path, or a preset name (default
    DEFAULT_PRESET); UsageError for both at once."""
    if policy is not None and preset_name is not None:
        raise UsageError("give either policy or preset, not both")
    if isinstance(policy, Policy):
        return policy
    if policy is not None:
        if not isinstance(policy, str | os.PathLike):
            raise UsageError(f"policy must be a Policy or a policy file's path, got "
                             f"{type(policy).__name__}")
        return load_policy(policy)
    if preset_name == "":  # (not the default: an empty name is a mistake, said as one)
        raise UsageError(f"preset: an empty name (known: {', '.join(PRESETS)})")
    return preset(DEFAULT_PRESET if preset_name is None else preset_name)


def policy_to_document(policy: Policy) -> dict[str, Any]:
    """The canonical, JSON-ready document for `policy`; parsing it gives the policy back."""
    fs, net, env = policy.filesystem, policy.network, policy.env
    document: dict[str, Any] = {"version": policy.version}
    if policy.preset is not None:
        document["preset"] = policy.preset
    if policy.containment != Policy.containment:
        document["containment"] = policy.containment
    if policy.isolation != Policy.isolation:
        document["isolation"] = policy.isolation
    document["filesystem"] = {
        "read": list(sorted_unique(fs.read)),
        "write": list(sorted_unique(fs.write)),
        "deny": list(sorted_unique(fs.deny)),
        "protected": _protected_entries(policy),
        "git": fs.git,
        "home": fs.home,
        "exec_from_write": fs.exec_from_write,
    }
    if fs.workspace != "direct":  # (said only when it is not the default)
        document["filesystem"]["workspace"] = fs.workspace
    document["network"] = {
        "mode": net.mode,
        "allow": list(sorted_unique(net.allow)),
        "deny": list(sorted_unique(net.deny)),
        "reach": list(sorted_unique(net.reach)),
        "unix_sockets": net.unix_sockets,
    }
    if net.credentials:  # (said only when there are some, as are the rules below)
        document["network"]["credentials"] = [
            {name: value for name, value in asdict(credential).items() if value}
            for credential in net.credentials]
    if net.http:
        document["network"]["http"] = [
            {"host": rule.host, "methods": list(rule.methods), "paths": list(rule.paths)}
            for rule in net.http]
    document["env"] = {"pass": list(sorted_unique(env.passthrough)), "set": dict(sorted(env.set))}
    document["limits"] = {
        name: format_size(value) if name in SIZE_LIMITS else _plain(value)
        for name, value in asdict(policy.limits).items() if value is not None
    }
    if policy.limits.pids is None and policy.preset is not None \
            and _built_preset(policy.preset).limits.pids is not None:
        document["limits"]["pids"] = UNLIMITED  # (the preset's, lifted)
    document["process"] = {}
    if policy.process.stdin is not None:
        document["process"]["stdin"] = policy.process.stdin
    if policy.process.cwd is not None:
        document["process"]["cwd"] = policy.process.cwd
    return document


def _protected_entries(policy: Policy) -> list[str]:
    """`policy`'s protected names, and `!NAME` for each name its base (its preset, or the
    model's defaults) protects and it does not: what parses back to the same names."""
    base = _built_preset(policy.preset) if policy.preset is not None else Policy()
    names = set(policy.filesystem.protected)
    removed = {name for name in base.filesystem.protected
               if name.casefold() not in {n.casefold() for n in names}}
    return [*sorted(names), *sorted("!" + name for name in removed)]


@cache
def _built_preset(name: str) -> Policy:
    return replace(_apply(Policy(), PRESET_DOCUMENTS[name]), preset=name)


def _preset(name: object) -> Policy:
    if not isinstance(name, str) or name not in PRESETS:
        raise Invalid(f"unknown preset {show(name)} (known: {', '.join(PRESETS)})", "preset")
    return _built_preset(name)


def _apply(base: Policy, top: Mapping[Any, Any]) -> Policy:
    """`base` overridden by the sections in `top` (its keys already checked), then checked."""
    changes = {
        section: _section(getattr(base, section), top[section], section)
        for section in SECTIONS if section in top
    }
    if "containment" in top:
        changes["containment"] = CONTAIN(top["containment"], "containment")
    if "isolation" in top:
        changes["isolation"] = ISOLATE(top["isolation"], "isolation")
    policy = _canonical(replace(base, **changes))
    _check_filesystem(policy.filesystem)
    _check_network(policy.network)
    return policy


def _section(base: Any, value: object, section: str) -> Any:
    fields = FIELDS[section]
    entries = table(value, section)
    check_keys(entries, tuple(fields), section)
    changes = {}
    for name, item in entries.items():
        attribute, convert, combine = fields[name]
        key = f"{section}.{name}"
        new = convert(item, key)
        changes[attribute] = combine(getattr(base, attribute), new, key) if combine else new
    return replace(base, **changes)


def _canonical(policy: Policy) -> Policy:
    fs, net, env = policy.filesystem, policy.network, policy.env
    assigned = {name for name, _ in env.set}
    return replace(
        policy,
        filesystem=replace(fs, read=sorted_unique(fs.read), write=sorted_unique(fs.write),
                           deny=sorted_unique(fs.deny), protected=sorted_unique(fs.protected)),
        network=replace(net, allow=sorted_unique(net.allow), deny=sorted_unique(net.deny),
                        reach=sorted_unique(net.reach)),
        env=replace(env, set=sorted_unique(env.set),
                    passthrough=sorted_unique(n for n in env.passthrough if n not in assigned)),
    )


def _check_version(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value != SCHEMA_VERSION:
        raise Invalid(f"expected {SCHEMA_VERSION} (the only schema version), got {show(value)}",
                      "version")


def _check_filesystem(fs: FilesystemPolicy) -> None:
    read = {paths.lexical_key(path): path for path in fs.read}
    for path in fs.write:
        same = read.get(paths.lexical_key(path))
        if same is not None:
            alias = "" if same == path else f" (read lists it as {show(same)})"
            raise Invalid(f"{show(path)} is listed in both read and write{alias}",
                          "filesystem.write")
    denied = [(paths.lexical_key(path), path) for path in fs.deny]
    for section, roots in (("read", fs.read), ("write", fs.write)):
        for root in roots:
            key = paths.lexical_key(root)
            for deny_key, deny in denied:
                if paths.is_within(key, deny_key):
                    how = "is also" if key == deny_key else "is inside"
                    raise Invalid(f"{show(root)} {how} the denied path {show(deny)}",
                                  f"filesystem.{section}")


def _check_network(net: NetworkPolicy) -> None:
    if net.mode == "allowlist" and not net.allow:
        raise Invalid('mode "allowlist" needs at least one pattern in network.allow',
                      "network.mode")
    if net.mode != "allowlist" and net.allow:
        raise Invalid(f'allow patterns need mode "allowlist" (mode is {show(net.mode)}); '
                      "set allow = [] or change the mode", "network.allow")
    if net.mode == "any" and net.deny:
        raise Invalid('mode "any" guards destinations by address and cannot deny a name; '
                      'deny patterns need mode "allowlist"', "network.deny")
    for name in ("credentials", "http"):
        if net.mode != "allowlist" and getattr(net, name):
            raise Invalid(f'{name} are kept by the proxy of mode "allowlist" (mode is '
                          f"{show(net.mode)}); set {name} = [] or change the mode",
                          f"network.{name}")
    if net.mode != "any" and net.reach:
        raise Invalid(f'reach entries lift the destination guard of mode "any" (mode is '
                      f'{show(net.mode)}); set reach = [] or change the mode', "network.reach")


def _plain(value: float | int) -> float | int:
    return int(value) if isinstance(value, float) and value.is_integer() else value
