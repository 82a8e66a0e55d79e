"""Any input either parses to a valid, canonical Policy or raises PolicyError; nothing else."""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.errors import PolicyError
from stockade.policy import (
    PRESETS,
    Policy,
    load_policy,
    merge,
    parse_policy,
    policy_to_document,
    preset,
)
from stockade.policy.domains import normalise_pattern
from stockade.policy.paths import tidy_path
from stockade.policy.presets import PRESET_DOCUMENTS
from stockade.policy.units import parse_duration, parse_size

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

KEYS = ["version", "preset", "filesystem", "network", "env", "limits", "process", "read",
        "write", "deny", "protected", "git", "exec_from_write", "mode", "allow", "pass", "set",
        "timeout", "memory", "cpu", "pids", "output", "file_size", "cwd", "stdin"]
INTERESTING = [
    1, 0, -1, 2, True, False, 1.5, float("inf"), float("nan"), 2**64, None, "", "\0", "none",
    "allowlist", "any", "null", "inherit", "/usr", "~", "~/x", "..", "{workspace}", "{tmp}/a",
    "{home}/../x", "{nope}", "?/lib64", "pypi.org", "*.example.com", "*", "[::1]:443",
    "512MiB", "10k", "1m30s", "500ms", "PATH", "1BAD", ".git", "a/b", "read-only",
    "guarded", "writable", "!.codex", "!.agents", ".codex", "!.hg",
    "networked-build",
]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
    st.sampled_from(INTERESTING),
)
json_like = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), children,
                        max_size=4),
    ),
    max_leaves=20,
)


def check(policy: Policy) -> None:
    """What every successfully parsed policy satisfies."""
    fs, net, env = policy.filesystem, policy.network, policy.env
    for items in (fs.read, fs.write, fs.deny, fs.protected, net.allow, net.deny, env.passthrough,
                  env.set):
        assert list(items) == sorted(set(items))
    assert policy.version == 1
    assert (net.mode == "allowlist") == bool(net.allow)
    assert not {name for name, _ in env.set} & set(env.passthrough)
    for value in vars(policy.limits).values():
        assert value is None or (not isinstance(value, bool) and value > 0)
    document = policy_to_document(policy)
    assert json.loads(json.dumps(document, allow_nan=False)) == document
    assert parse_policy(document) == policy


def parses_or_refuses(document: Any) -> None:
    try:
        policy = parse_policy(document)
    except PolicyError:
        return
    check(policy)


@SETTINGS
@given(json_like)
def test_any_value(document: Any) -> None:
    parses_or_refuses(document)


@SETTINGS
@given(st.dictionaries(st.sampled_from(KEYS), json_like, max_size=5))
def test_any_table_with_a_version(document: dict[str, Any]) -> None:
    parses_or_refuses({"version": 1, **document})


VALID_DOCUMENTS = [
    *PRESET_DOCUMENTS.values(),
    {"version": 1},
    {"version": 1, "preset": "networked-build", "network": {"deny": ["evil.example.com"]}},
    {"version": 1, "preset": "workspace-write",
     "filesystem": {"read": ["/usr", "~/.cache"], "deny": ["{workspace}/.env"]},
     "env": {"set": {"LANG": "C.UTF-8"}}, "limits": {"timeout": "90s", "cpu": 1.5},
     "process": {"cwd": "src", "stdin": "inherit"}},
]
paths_into = st.lists(st.sampled_from(KEYS + [0, 1, 2]), min_size=1, max_size=3)


def mutate(document: Any, where: list[Any], value: Any) -> Any:
    """`document` with the value at `where` replaced (or added) where the path fits."""
    document = copy.deepcopy(document)
    node = document
    for step in where[:-1]:
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        else:
            return document
    last = where[-1]
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value
    return document


@SETTINGS
@given(st.sampled_from(VALID_DOCUMENTS),
       st.lists(st.tuples(paths_into, json_like), min_size=1, max_size=3))
def test_mutated_valid_documents(base: dict[str, Any],
                                 mutations: list[tuple[list[Any], Any]]) -> None:
    document = base
    for where, value in mutations:
        document = mutate(document, where, value)
    parses_or_refuses(document)


@SETTINGS
@given(st.sampled_from(PRESETS), st.dictionaries(st.sampled_from(KEYS), json_like, max_size=3))
def test_merge_onto_presets(name: str, override: dict[str, Any]) -> None:
    try:
        policy = merge(preset(name), override)
    except PolicyError:
        return
    check(policy)
    assert set(preset(name).filesystem.deny) <= set(policy.filesystem.deny)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


def loads_or_refuses(path: Path) -> None:
    try:
        policy = load_policy(path)
    except PolicyError as error:
        assert error.file == str(path)
        return
    check(policy)


TOML_LINES = [
    "version = 1", "version = 2", 'preset = "read-only"', 'preset = "networked-build"',
    "[filesystem]", "[network]", "[env]", "[limits]", "[process]", "[env.set]", "[[filesystem]]",
    'read = ["/usr", "~/x"]', 'write = ["{workspace}"]', 'deny = ["~/.ssh"]', "read = []",
    'mode = "allowlist"', 'mode = "any"', 'allow = ["pypi.org", "*.debian.org:443"]',
    'memory = "1GiB"', "pids = 0", "pids = 10", 'timeout = "1m30s"', "cpu = nan", "cpu = 0.5",
    "exec_from_write = true", 'stdin = "inherit"', "cwd = '../x'", 'PATH = "/bin"',
    "when = 1979-05-27T07:32:00Z", "x = {", "]", "=", '"', "'''", "\\", "a.b.c = 1",
]


@SETTINGS
@given(st.lists(st.sampled_from(TOML_LINES), max_size=12))
def test_toml_from_fragments(scratch: Path, lines: list[str]) -> None:
    path = scratch / "fragments.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    loads_or_refuses(path)


@SETTINGS
@given(st.text(max_size=200))
def test_any_toml_text(scratch: Path, text: str) -> None:
    path = scratch / "text.toml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    loads_or_refuses(path)


@SETTINGS
@given(st.binary(max_size=200), st.sampled_from(["b.toml", "b.json"]))
def test_any_bytes(scratch: Path, data: bytes, name: str) -> None:
    path = scratch / name
    path.write_bytes(data)
    loads_or_refuses(path)


@SETTINGS
@given(json_like)
def test_any_json_file(scratch: Path, document: Any) -> None:
    path = scratch / "doc.json"
    path.write_text(json.dumps(document, default=str), encoding="utf-8")
    loads_or_refuses(path)


@SETTINGS
@given(st.one_of(scalars, st.text(alphabet="0123456789.kKmMgGiIbBtT sd-", max_size=12)))
def test_units_refuse_only_with_value_error(value: Any) -> None:
    for parse in (parse_size, parse_duration):
        try:
            result = parse(value)
        except ValueError:
            continue
        assert result > 0


@SETTINGS
@given(st.one_of(scalars, st.text(alphabet="abcXYZ019-.*:[]/@_ ", max_size=30)))
def test_domain_patterns_normalise_to_a_fixpoint(value: Any) -> None:
    try:
        pattern = normalise_pattern(value)
    except ValueError:
        return
    assert normalise_pattern(pattern) == pattern == pattern.lower()


@SETTINGS
@given(st.one_of(scalars, st.text(alphabet="ab./~{}?", max_size=20)
                 .map(lambda text: text.replace("{", "{workspace").replace("}", "}/"))),
       st.booleans())
def test_paths_tidy_to_a_fixpoint(value: Any, optional: bool) -> None:
    try:
        path = tidy_path(value, optional_allowed=optional)
    except ValueError:
        return
    assert tidy_path(path, optional_allowed=optional) == path
