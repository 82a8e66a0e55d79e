"""`stockade policy check|show`: validate (and, for `check`, compile here) and print normalised
policies."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from stockade.cli.common import no_command, subcommand
from stockade.errors import PolicyError, UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.policy import DEFAULT_PRESET, PRESETS, load_policy, policy_to_document, preset


def add_policy(commands: Any) -> None:
    policy = subcommand(commands, "policy", None, "check or show policies",
                        "stockade policy check agent.toml",
                        "stockade policy show --preset workspace-write")
    actions = policy.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = subcommand(actions, "check", _policy_check,
                       "validate a policy file, check that it compiles here, and print its "
                       "normalised form", "stockade policy check agent.toml",
                       "stockade policy check agent.toml --workspace ./proj")
    check.add_argument("file", metavar="FILE", help="a TOML or JSON policy file")
    check.add_argument("--workspace", metavar="DIR",
                       help="what {workspace} means for the check (default: the current "
                            "directory)")
    show = subcommand(actions, "show", _policy_show,
                      "print a preset or a policy file as its normalised document",
                      "stockade policy show", "stockade policy show --preset offline-build --toml",
                      "stockade policy show agent.toml")
    source = show.add_mutually_exclusive_group()
    source.add_argument("--preset", metavar="NAME",
                        help=f"{', '.join(PRESETS)} (default {DEFAULT_PRESET})")
    source.add_argument("file", metavar="FILE", nargs="?", help="a TOML or JSON policy file")
    show.add_argument("--toml", action="store_true", help="print TOML instead of JSON")


def _policy_check(args: argparse.Namespace, command: list[str] | None) -> int:
    """Valid is not enough: the policy is also compiled on this host, as `stockade run` would
    (every root that is not optional must exist, the working directory lie in a root, ...),
    so that "ok" means it can run here."""
    no_command(command)
    policy = load_policy(args.file)
    if args.workspace is not None and not os.path.isdir(args.workspace):
        raise UsageError(f"--workspace {args.workspace}: not a directory")
    workspace = os.path.abspath(args.workspace or os.getcwd())
    try:
        compile_policy(policy, ["true"], CompileContext.current(workspace))
    except PolicyError as exc:
        raise PolicyError(f"valid, but it cannot run here (workspace {workspace}): "
                          f"{exc.message}", file=args.file) from None
    document = policy_to_document(policy)
    print("ok")
    print(json.dumps(document, indent=2))
    return 0


def _policy_show(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    chosen = load_policy(args.file) if args.file else preset(args.preset or DEFAULT_PRESET)
    document = policy_to_document(chosen)
    print(to_toml(document) if args.toml else json.dumps(document, indent=2))
    return 0


def to_toml(document: dict[str, Any]) -> str:
    """A policy document (as from `policy_to_document`) written as TOML."""
    top = [f"{key} = {_toml_value(value)}" for key, value in document.items()
           if not isinstance(value, dict)]
    tables = [f"\n[{key}]\n" + "\n".join(f"{name} = {_toml_value(item)}"
                                         for name, item in value.items())
              for key, value in document.items() if isinstance(value, dict)]
    return "\n".join(top) + "\n" + "\n".join(tables) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)
