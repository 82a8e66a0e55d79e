"""The child's closed environment: only what the policy passes or sets, sorted.

Loader-injection and credential-looking variables are refused even when the policy names them,
with an error naming the variable and never its value.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from stockade.errors import PolicyError

# Variables that make a program load or run code it was not asked to run.
LOADER_VARIABLES = frozenset({
    "BASH_ENV", "BASHOPTS", "ENV", "GCONV_PATH", "GLIBC_TUNABLES", "HOSTALIASES", "IFS",
    "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS", "LOCALDOMAIN", "MALLOC_CONF",
    "NODE_OPTIONS", "PERL5DB", "PERL5OPT", "PERLLIB", "PERL5LIB", "PROMPT_COMMAND", "PS4",
    "PYTHONHOME", "PYTHONINSPECT", "PYTHONSTARTUP", "PYTHONBREAKPOINT", "RES_OPTIONS",
    "RUBYOPT", "SHELLOPTS", "ZDOTDIR",
})
LOADER_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_")

_CREDENTIAL = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|PASSPHRASE|APIKEY|API_KEY|ACCESS_KEY|PRIVATE_KEY"
    r"|CREDENTIALS?|AUTH|COOKIE)(_|$)"
    r"|^(AWS|AZURE|GOOGLE_APPLICATION|GCP|OPENAI|ANTHROPIC|GITHUB|GITLAB|NPM|PYPI|DOCKER"
    r"|HF|HUGGING_FACE|SSH_AUTH)_",
)


def refusal_reason(name: str) -> str | None:
    """Why `name` may not enter a sandbox, or None when it may."""
    upper = name.upper()
    if upper in LOADER_VARIABLES or upper.startswith(LOADER_PREFIXES):
        return "it can inject code into the child (loader injection)"
    if _CREDENTIAL.search(upper):
        return "it looks like a credential"
    return None


def close_environment(
    passthrough: tuple[str, ...],
    assigned: tuple[tuple[str, str], ...],
    host: Mapping[str, str],
) -> tuple[tuple[str, str], ...]:
    """The sorted (name, value) pairs the child gets; `assigned` wins over `passthrough`. A
    passed variable keeps the policy's spelling. On Windows it is found without regard to case:
    Windows' names are case-insensitive, and os.environ there holds each name upper-cased (so
    `SystemRoot`, `ComSpec` and `windir` are keys `SYSTEMROOT`, `COMSPEC` and `WINDIR`)."""
    if sys.platform == "win32":
        host = {key.upper(): value for key, value in host.items()}
    env: dict[str, str] = {}
    for index, name in enumerate(passthrough):
        _check(name, f"env.pass[{index}]")
        key = name.upper() if sys.platform == "win32" else name
        if key in host:
            env[name] = host[key]
    for name, value in assigned:
        _check(name, f"env.set.{name}")
        env[name] = value
    return tuple(sorted(env.items()))


def _check(name: str, key: str) -> None:
    reason = refusal_reason(name)
    if reason:
        raise PolicyError(f"variable {name} is refused: {reason}", key=key, code="env_refused")
