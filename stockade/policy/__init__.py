"""The policy language: parse, validate, merge and show policies (see DESIGN.md section 2)."""

from stockade.policy.model import (
    EnvPolicy,
    FilesystemPolicy,
    Limits,
    NetworkPolicy,
    Policy,
    ProcessPolicy,
)
from stockade.policy.parse import (
    DEFAULT_PRESET,
    load_policy,
    merge,
    parse_policy,
    policy_to_document,
    preset,
    resolve_policy,
)
from stockade.policy.presets import PRESETS

__all__ = [
    "DEFAULT_PRESET",
    "PRESETS",
    "EnvPolicy",
    "FilesystemPolicy",
    "Limits",
    "NetworkPolicy",
    "Policy",
    "ProcessPolicy",
    "load_policy",
    "merge",
    "parse_policy",
    "policy_to_document",
    "preset",
    "resolve_policy",
]
