"""The policy language: units, domain patterns, paths, schema, presets, merging, files."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from stockade.errors import PolicyError
from stockade.policy import (
    PRESETS,
    Limits,
    Policy,
    load_policy,
    merge,
    parse_policy,
    policy_to_document,
    preset,
)
from stockade.policy.domains import normalise_pattern
from stockade.policy.model import DEFAULT_PROTECTED
from stockade.policy.paths import lexical_key, tidy_path
from stockade.policy.presets import (
    DENY_DEFAULTS,
    ENV_PASS_DEFAULTS,
    PRESET_DOCUMENTS,
    SYSTEM_READ,
    WINDOWS_SYSTEM_READ,
    preset_documents,
)
from stockade.policy.schema import FIELDS, merge_rule
from stockade.policy.units import format_size, parse_duration, parse_size


def doc(**sections: Any) -> dict[str, Any]:
    return {"version": 1, **sections}


def refused(document: Any, *, file: str = "") -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        parse_policy(document, file=file)
    return caught.value


# -- units -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("1024B", 1024),
    ("512MiB", 512 << 20),
    ("1GB", 10**9),
    ("10k", 10 << 10),
    ("10K", 10 << 10),
    ("3kb", 3000),
    ("1.5GiB", 3 << 29),
    ("1 KiB", 1024),
    ("7B", 7),
    ("2T", 2 << 40),
    (" 64mib ", 64 << 20),
    ("1.9B", 1),
])
def test_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


SIZE = 'expected a size with a unit, such as "512MiB", "2GB" or "4096B", got '


@pytest.mark.parametrize(("value", "message"), [
    ("lots", SIZE + '"lots"'),
    (True, SIZE + "true"),
    (1.5, SIZE + "1.5"),
    (None, SIZE + "null"),
    ("-5MiB", SIZE + '"-5MiB"'),
    ("5 mebibytes", SIZE + '"5 mebibytes"'),
    ("9" * 30, SIZE + '"' + "9" * 30 + '"'),
    # A number without its unit: bytes or MiB cannot be told, so neither is guessed.
    (2048, 'expected a size with a unit, such as "2048MiB" or "2048B", got 2048'),
    ("2048", 'expected a size with a unit, such as "2048MiB" or "2048B", got "2048"'),
    (" 1.5 ", 'expected a size with a unit, such as "1.5MiB" or "1.5B", got " 1.5 "'),
    (0, 'expected a size with a unit, such as "0MiB" or "0B", got 0'),
    (2**80, SIZE + "1208925819614629174706176"),
    ("0B", 'expected a positive size, got "0B"'),
    ("0.5B", 'expected a positive size, got "0.5B"'),
    ("16777216TiB", "expected a size of at most 9223372036854775807 bytes, "
                    'got "16777216TiB"'),
])
def test_size_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_size(value)


@pytest.mark.parametrize(("size", "shown"), [
    (2 << 30, "2GiB"), (2 * 10**9, "2GB"), (3 << 29, "1536MiB"), (10**6, "1MB"),
    (1 << 20, "1MiB"), (1000, "1KB"), (1024, "1KiB"), (1001, "1001B"), (7, "7B"),
    (5 << 40, "5TiB"), (3 * 10**12, "3TB"), (2**63 - 1, "9223372036854775807B"),
])
def test_sizes_are_shown_in_their_shortest_exact_form(size: int, shown: str) -> None:
    """"2GB" and "2GiB" are different sizes, and are shown so; "2G" is shown as "2GiB"."""
    assert format_size(size) == shown
    assert parse_size(shown) == size


@pytest.mark.parametrize(("value", "seconds"), [
    (90, 90.0),
    (0.25, 0.25),
    ("90", 90.0),
    ("90s", 90.0),
    ("5m", 300.0),
    ("1h", 3600.0),
    ("2d", 172800.0),
    ("500ms", 0.5),
    ("1m30s", 90.0),
    ("1.5h", 5400.0),
    ("1d1h1m1s1ms", 90061.001),
])
def test_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)
    assert isinstance(parse_duration(value), float)


@pytest.mark.parametrize(("value", "message"), [
    ("5M", 'expected a duration such as "90s", "1m30s" or 90, got "5M"'),
    ("30s1m", 'expected a duration such as "90s", "1m30s" or 90, got "30s1m"'),
    ("1m 30s", 'expected a duration such as "90s", "1m30s" or 90, got "1m 30s"'),
    ("", 'expected a duration such as "90s", "1m30s" or 90, got ""'),
    ("soon", 'expected a duration such as "90s", "1m30s" or 90, got "soon"'),
    (True, 'expected a duration such as "90s", "1m30s" or 90, got true'),
    (math.inf, 'expected a duration such as "90s", "1m30s" or 90, got inf'),
    (math.nan, 'expected a duration such as "90s", "1m30s" or 90, got nan'),
    ([1], 'expected a duration such as "90s", "1m30s" or 90, got an array'),
    (0, "expected a positive duration, got 0"),
    (-3, "expected a positive duration, got -3"),
    ("0s", 'expected a positive duration, got "0s"'),
    ("366d", 'expected a duration of at most 365 days, got "366d"'),
])
def test_duration_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_duration(value)


# -- domain patterns -------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "normalised"), [
    ("Example.COM", "example.com"),
    ("*.Example.com", "*.example.com"),
    ("example.com:443", "example.com:443"),
    ("example.com:0443", "example.com:443"),
    ("localhost", "localhost"),
    ("xn--bcher-kva.de", "xn--bcher-kva.de"),
    ("a-b.c-d.org", "a-b.c-d.org"),
    ("192.0.2.1", "192.0.2.1"),
    ("192.0.2.1:8080", "192.0.2.1:8080"),
    ("[::1]", "[::1]"),
    ("[0:0::1]:443", "[::1]:443"),
    ("[2001:DB8::1]:65535", "[2001:db8::1]:65535"),
])
def test_domain_pattern(pattern: str, normalised: str) -> None:
    assert normalise_pattern(pattern) == normalised


@pytest.mark.parametrize(("pattern", "problem"), [
    ("*", 'a bare "*" is not allowed (use network.mode = "any")'),
    ("*.com", 'a wildcard needs a suffix of at least two labels, as in "*.example.com"'),
    ("*.*.example.com", 'a wildcard may only be a whole first label, as in "*.example.com"'),
    ("ex*.com", 'a wildcard may only be a whole first label, as in "*.example.com"'),
    ("https://example.com", 'expected a domain pattern, not a URL (drop the "scheme://")'),
    ("example.com/path", "expected a domain pattern without a path"),
    ("user@example.com", "expected a domain pattern without user info"),
    ("a..example.com", "expected a host name without empty labels"),
    ("example.com.", "expected a host name without empty labels"),
    (":443", "expected a host name without empty labels"),
    ("a" * 64 + ".com", "expected host name labels of at most 63 characters"),
    (".".join(["a" * 60] * 5), "expected a host name of at most 253 characters"),
    ("under_score.com", 'expected host name labels of letters, digits and inner "-"'),
    ("-lead.com", 'expected host name labels of letters, digits and inner "-"'),
    ("sp ace.com", 'expected host name labels of letters, digits and inner "-"'),
    ("nul\0.com", 'expected host name labels of letters, digits and inner "-"'),
    ("bücher.de", "expected an ASCII domain pattern (write a non-ASCII name in its xn-- form)"),
    ("example.com:0", "expected a port from 1 to 65535"),
    ("example.com:65536", "expected a port from 1 to 65535"),
    ("example.com:", "expected a port from 1 to 65535"),
    ("example.com:http", "expected a port from 1 to 65535"),
    ("01.2.3.4", "expected a valid IPv4 address (a host name cannot end in digits)"),
    ("1.2.3", "expected a valid IPv4 address (a host name cannot end in digits)"),
    ("*.1.2.3.4", "a wildcard applies to domain names, not IP addresses"),
    ("::1", 'expected an IPv6 address in brackets, as in "[::1]:443"'),
    ("[::1", 'expected "]" after a bracketed IPv6 address'),
    ("[::1]443", 'expected ":port" after a bracketed IPv6 address'),
    ("[fe80::1%eth0]", "expected a valid IPv6 address inside the brackets"),
    ("[example.com]", "expected a valid IPv6 address inside the brackets"),
    ("", 'expected a domain pattern such as "example.com"'),
])
def test_domain_pattern_refused(pattern: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        normalise_pattern(pattern)
    assert str(caught.value).startswith(problem + ", got ")


def test_domain_pattern_must_be_a_string() -> None:
    expected = 'expected a domain pattern such as "example.com", got 3'
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        normalise_pattern(3)


# -- paths -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "tidied"), [
    ("/usr/", "/usr"),
    ("//usr//lib/./x", "/usr/lib/x"),
    ("/", "/"),
    ("/a/../b", "/a/../b"),
    ("{workspace}", "{workspace}"),
    ("{tmp}/x/", "{tmp}/x"),
    ("{home}/.cache", "{home}/.cache"),
    ("~", "{home}"),
    ("~/.cache", "{home}/.cache"),
    ("src", "src"),
    ("./src/", "src"),
    (".", "."),
    ("a/../b", "a/../b"),
    ("./~x", "./~x"),
])
def test_tidy_path(path: str, tidied: str) -> None:
    assert tidy_path(path) == tidied
    assert tidy_path(tidied) == tidied


def test_optional_root_marker() -> None:
    assert tidy_path("?/lib32/", optional_allowed=True) == "?/lib32"
    assert lexical_key("?/lib32") == ("/", "lib32")
    assert tidy_path("?/lib32") == "./?/lib32"  # without the marker, "?" is a file name


@pytest.mark.parametrize(("path", "message"), [
    ("", 'expected a path such as "/usr" or "{workspace}/src", got ""'),
    (7, 'expected a path such as "/usr" or "{workspace}/src", got 7'),
    ("/a\0b", "expected a path without NUL bytes"),
    ("/" + "a" * 4096, "expected a path of at most 4096 characters"),
    ("{foo}/x", 'unknown placeholder "{foo}" (known: {workspace}, {tmp}, {home})'),
    ("{work", 'unknown placeholder "{work" (known: {workspace}, {tmp}, {home})'),
    ("{workspace}x", 'a placeholder must end the path or be followed by "/", got "{workspace}x"'),
    ("/data/{workspace}", 'placeholders may only start a path, got "/data/{workspace}"'),
    ("~root/x", '"~user" paths are not supported, got "~root/x"'),
    ("a/../..", 'relative path escapes the workspace, got "a/../.."'),
    ("..", 'relative path escapes the workspace, got ".."'),
    ("{workspace}/..", 'path escapes {workspace}, got "{workspace}/.."'),
    ("~/../x", 'path escapes {home}, got "~/../x"'),
])
def test_tidy_path_refused(path: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tidy_path(path)


def test_lexical_key() -> None:
    assert lexical_key("src/../lib") == ("{workspace}", "lib")
    assert lexical_key(".") == lexical_key("{workspace}") == ("{workspace}",)
    assert lexical_key("/..") == ("/",)


# -- the document schema ---------------------------------------------------------------------

def test_minimal_document_is_the_model_default() -> None:
    policy = parse_policy(doc())
    assert policy.preset is None
    assert policy.filesystem.read == policy.filesystem.write == policy.filesystem.deny == ()
    assert set(policy.filesystem.protected) == set(DEFAULT_PROTECTED)
    assert policy.network.mode == "none"
    assert policy.limits == Limits()
    assert policy.process.stdin is None  # the caller chooses (the API: /dev/null)


NAME = ('expected a file name such as ".agents" (no "/"), or "!NAME" to stop protecting an '
        "inherited one, got ")
GIT_IS_NOT_A_NAME = ('{}: .git is not a protected name; filesystem.git says how it is '
                     'protected ("guarded", the default: hooks, config and pointers read-only; '
                     '"read-only": all of it; "writable")')


@pytest.mark.parametrize(("document", "key", "message"), [
    ({}, "version", 'missing required key "version" (expected 1)'),
    ({"version": 2}, "version", "expected 1 (the only schema version), got 2"),
    ({"version": True}, "version", "expected 1 (the only schema version), got true"),
    ({"version": "1"}, "version", 'expected 1 (the only schema version), got "1"'),
    ({"version": 1.0}, "version", "expected 1 (the only schema version), got 1.0"),
    ([], "", "expected the policy document to be a table (a JSON object), got an array"),
    ("version = 1", "", "expected the policy document to be a table (a JSON object), "
                        "got a string"),
    (doc(netwrk={}), "", 'unknown key "netwrk" (known: version, preset, containment, '
                         "isolation, filesystem, network, env, limits, process)"),
    (doc(filesystem={"reed": []}), "filesystem",
     'unknown key "reed" (known: read, write, deny, protected, git, home, exec_from_write, '
     'workspace)'),
    (doc(network={"modes": "none"}), "network",
     'unknown key "modes" (known: mode, allow, deny, reach, unix_sockets, credentials, http)'),
    (doc(env={"passthrough": []}), "env", 'unknown key "passthrough" (known: pass, set)'),
    (doc(limits={"mem": 1}), "limits",
     'unknown key "mem" (known: timeout, memory, cpu, pids, output, file_size)'),
    (doc(process={"dir": "/"}), "process", 'unknown key "dir" (known: cwd, stdin)'),
    ({"version": 1, 3: 4}, "", "unknown key 3 (known: version, preset, containment, "
                               "isolation, filesystem, network, env, limits, process)"),
    (doc(filesystem=[]), "filesystem", "expected a table (a JSON object), got an array"),
    (doc(limits="1h"), "limits", "expected a table (a JSON object), got a string"),
    (doc(preset="foo"), "preset", 'unknown preset "foo" (known: read-only, workspace-write, '
                                  "workspace-write-no-exec, offline-build, networked-build)"),
    (doc(preset=1), "preset", "unknown preset 1 (known: read-only, workspace-write, "
                              "workspace-write-no-exec, offline-build, networked-build)"),
    # filesystem
    (doc(filesystem={"read": "/usr"}), "filesystem.read", "expected an array, got a string"),
    (doc(filesystem={"read": ["/a", "/b", "{foo}"]}), "filesystem.read[2]",
     'unknown placeholder "{foo}" (known: {workspace}, {tmp}, {home})'),
    (doc(filesystem={"write": ["x/../../y"]}), "filesystem.write[0]",
     'relative path escapes the workspace, got "x/../../y"'),
    (doc(filesystem={"deny": ["/a\0"]}), "filesystem.deny[0]",
     "expected a path without NUL bytes"),
    (doc(filesystem={"read": [None]}), "filesystem.read[0]",
     'expected a path such as "/usr" or "{workspace}/src", got null'),
    (doc(filesystem={"protected": ["a/b"]}), "filesystem.protected[0]", NAME + '"a/b"'),
    (doc(filesystem={"protected": [".hg", ".."]}), "filesystem.protected[1]", NAME + '".."'),
    (doc(filesystem={"protected": ["."]}), "filesystem.protected[0]", NAME + '"."'),
    (doc(filesystem={"protected": [""]}), "filesystem.protected[0]", NAME + '""'),
    (doc(filesystem={"protected": ["a\0"]}), "filesystem.protected[0]", NAME + '"a\\u0000"'),
    (doc(filesystem={"protected": ["!"]}), "filesystem.protected[0]", NAME + '"!"'),
    (doc(filesystem={"protected": ["!a/b"]}), "filesystem.protected[0]", NAME + '"!a/b"'),
    (doc(filesystem={"protected": [".hg", ".GIT"]}), "filesystem.protected[1]",
     GIT_IS_NOT_A_NAME.format('".GIT"')),
    (doc(filesystem={"protected": ["!.git"]}), "filesystem.protected[0]",
     GIT_IS_NOT_A_NAME.format('"!.git"')),
    (doc(preset="read-only", filesystem={"protected": ["!.hg"]}), "filesystem.protected[0]",
     '"!.hg" removes a name the base does not protect (it protects: '
     + ", ".join(DEFAULT_PROTECTED) + ")"),
    (doc(filesystem={"protected": [".codex", "!.CODEX"]}), "filesystem.protected[1]",
     '".CODEX" is both added and removed'),
    (doc(filesystem={"git": "rw"}), "filesystem.git",
     'expected one of "guarded", "read-only", "writable", got "rw"'),
    (doc(filesystem={"git": True}), "filesystem.git",
     'expected one of "guarded", "read-only", "writable", got true'),
    (doc(filesystem={"exec_from_write": 1}), "filesystem.exec_from_write",
     "expected true or false, got 1"),
    (doc(filesystem={"exec_from_write": "yes"}), "filesystem.exec_from_write",
     'expected true or false, got "yes"'),
    # network
    (doc(network={"mode": "some"}), "network.mode",
     'expected one of "none", "allowlist", "any", got "some"'),
    (doc(network={"mode": "allowlist", "allow": ["*"]}), "network.allow[0]",
     'a bare "*" is not allowed (use network.mode = "any"), got "*"'),
    (doc(network={"mode": "any", "deny": ["https://evil.example"]}), "network.deny[0]",
     'expected a domain pattern, not a URL (drop the "scheme://"), got "https://evil.example"'),
    (doc(network={"mode": "allowlist"}), "network.mode",
     'mode "allowlist" needs at least one pattern in network.allow'),
    (doc(network={"mode": "allowlist", "allow": []}), "network.mode",
     'mode "allowlist" needs at least one pattern in network.allow'),
    (doc(network={"allow": ["pypi.org"]}), "network.allow",
     'allow patterns need mode "allowlist" (mode is "none"); set allow = [] or change the mode'),
    (doc(network={"mode": "any", "allow": ["pypi.org"]}), "network.allow",
     'allow patterns need mode "allowlist" (mode is "any"); set allow = [] or change the mode'),
    # env
    (doc(env={"pass": ["PATH", "1BAD"]}), "env.pass[1]",
     'expected a variable name such as "PATH", got "1BAD"'),
    (doc(env={"pass": ["A=B"]}), "env.pass[0]",
     'expected a variable name such as "PATH", got "A=B"'),
    (doc(env={"pass": [""]}), "env.pass[0]", 'expected a variable name such as "PATH", got ""'),
    (doc(env={"set": {"BAD-NAME": "x"}}), "env.set",
     'expected a variable name such as "PATH", got "BAD-NAME"'),
    (doc(env={"set": {"N": 5}}), "env.set.N", "expected a string value, got an integer"),
    (doc(env={"set": {"N": "a\0b"}}), "env.set.N", "expected a value without NUL bytes"),
    (doc(env={"set": ["N=1"]}), "env.set", "expected a table (a JSON object), got an array"),
    # limits
    (doc(limits={"memory": "lots"}), "limits.memory", SIZE + '"lots"'),
    (doc(limits={"memory": True}), "limits.memory", SIZE + "true"),
    (doc(limits={"memory": 2048}), "limits.memory",
     'expected a size with a unit, such as "2048MiB" or "2048B", got 2048'),
    (doc(limits={"memory": "512KiB"}), "limits.memory",
     'expected a memory limit of at least "1MiB" (no program starts in less address space), '
     'got "512KiB"'),
    (doc(limits={"output": "0B"}), "limits.output", 'expected a positive size, got "0B"'),
    (doc(limits={"output": 1000}), "limits.output",
     'expected a size with a unit, such as "1000MiB" or "1000B", got 1000'),
    (doc(limits={"file_size": "-1k"}), "limits.file_size", SIZE + '"-1k"'),
    (doc(limits={"timeout": "forever"}), "limits.timeout",
     'expected a duration such as "90s", "1m30s" or 90, got "forever"'),
    (doc(limits={"timeout": -5}), "limits.timeout", "expected a positive duration, got -5"),
    (doc(limits={"pids": True}), "limits.pids",
     "expected a whole number of processes from 1 to 4194304, or \"unlimited\", got true"),
    (doc(limits={"pids": 0}), "limits.pids",
     "expected a whole number of processes from 1 to 4194304, or \"unlimited\", got 0"),
    (doc(limits={"pids": 2.0}), "limits.pids",
     "expected a whole number of processes from 1 to 4194304, or \"unlimited\", got 2.0"),
    (doc(limits={"cpu": "2"}), "limits.cpu",
     'expected a number of cores such as 2 or 0.5, got "2"'),
    (doc(limits={"cpu": False}), "limits.cpu",
     "expected a number of cores such as 2 or 0.5, got false"),
    (doc(limits={"cpu": 0}), "limits.cpu",
     "expected a number of cores above 0 and at most 4096, got 0"),
    (doc(limits={"cpu": math.inf}), "limits.cpu",
     "expected a number of cores above 0 and at most 4096, got inf"),
    # process
    (doc(process={"stdin": "pipe"}), "process.stdin",
     'expected one of "null", "inherit", got "pipe"'),
    (doc(process={"cwd": "../up"}), "process.cwd",
     'relative path escapes the workspace, got "../up"'),
    (doc(process={"cwd": ""}), "process.cwd",
     'expected a path such as "/usr" or "{workspace}/src", got ""'),
])
def test_refused(document: Any, key: str, message: str) -> None:
    error = refused(document, file="policy.toml")
    assert (error.file, error.key, error.message) == (
        "policy.toml", key, ": ".join(part for part in ("policy.toml", key, message) if part))
    assert error.code == "policy_invalid"
    assert error.exit_code == 2


def test_a_presets_pids_limit_can_be_lifted_and_stays_lifted() -> None:
    """`limits.pids = "unlimited"` lifts a base's limit (the landlock tier cannot bind root's
    processes); written back, it says so, or the preset's would return."""
    policy = parse_policy({"version": 1, "preset": "workspace-write",
                           "limits": {"pids": "unlimited"}})
    assert policy.limits.pids is None
    document = policy_to_document(policy)
    assert document["limits"]["pids"] == "unlimited"
    assert parse_policy(json.loads(json.dumps(document))) == policy
    assert "pids" not in policy_to_document(parse_policy({"version": 1}))["limits"]
    assert refused(doc(limits={"memory": "unlimited"})).key == "limits.memory"


def test_error_without_file_or_key() -> None:
    assert str(refused([])) == (
        "policy_invalid: expected the policy document to be a table (a JSON object), got an array")
    assert str(refused(doc(limits={"pids": 0}))) == (
        "policy_invalid: limits.pids: "
        'expected a whole number of processes from 1 to 4194304, or "unlimited", got 0')


def test_env_set_value_never_in_message() -> None:
    for value in (12345678, ["hunter2"], "hunter2\0"):
        error = refused(doc(env={"set": {"SECRET_THING": value}}))
        assert "hunter2" not in str(error) and "12345678" not in str(error)


def test_long_values_are_shortened_in_messages() -> None:
    error = refused(doc(limits={"memory": "x" * 500}))
    assert len(str(error)) < 150


@pytest.mark.parametrize(("filesystem", "key", "message"), [
    ({"read": ["/data"], "write": ["/data/"]}, "filesystem.write",
     '"/data" is listed in both read and write'),
    ({"read": ["."], "write": ["{workspace}"]}, "filesystem.write",
     '"{workspace}" is listed in both read and write (read lists it as ".")'),
    ({"read": ["{home}/x"], "write": ["~/y/../x"]}, "filesystem.write",
     '"{home}/y/../x" is listed in both read and write (read lists it as "{home}/x")'),
    ({"read": ["~/.ssh"], "deny": ["{home}/.ssh"]}, "filesystem.read",
     '"{home}/.ssh" is also the denied path "{home}/.ssh"'),
    ({"read": ["{home}/.ssh/config"], "deny": ["~/.ssh"]}, "filesystem.read",
     '"{home}/.ssh/config" is inside the denied path "{home}/.ssh"'),
    ({"write": ["secrets/keys"], "deny": ["{workspace}/secrets"]}, "filesystem.write",
     '"secrets/keys" is inside the denied path "{workspace}/secrets"'),
    ({"read": ["/usr"], "deny": ["/"]}, "filesystem.read",
     '"/usr" is inside the denied path "/"'),
    ({"read": ["?/opt/x"], "deny": ["/opt"]}, "filesystem.read",
     '"?/opt/x" is inside the denied path "/opt"'),
])
def test_ambiguous_filesystem(filesystem: dict[str, Any], key: str, message: str) -> None:
    error = refused(doc(filesystem=filesystem))
    assert (error.key, error.message) == (key, f"{key}: {message}")


def test_unambiguous_nesting_is_fine() -> None:
    policy = parse_policy(doc(filesystem={
        "read": ["/data", "{home}"], "write": ["/data/out"], "deny": ["/data/out/keys", "~/.ssh"],
    }))
    assert policy.filesystem.write == ("/data/out",)


def test_lists_are_canonical() -> None:
    policy = parse_policy(doc(
        filesystem={"read": ["/usr", "/etc/", "/usr", "~/.cache"], "protected": ["zz", ".hg"]},
        network={"mode": "allowlist", "allow": ["PyPI.org", "pypi.org", "a.example.com"],
                 "deny": ["B.example.com", "b.example.com"]},
        env={"pass": ["TERM", "PATH", "TERM", "HOME"], "set": {"PATH": "/bin", "A": "1"}},
    ))
    assert policy.filesystem.read == ("/etc", "/usr", "{home}/.cache")
    assert policy.filesystem.protected == tuple(sorted({*DEFAULT_PROTECTED, "zz", ".hg"}))
    assert policy.network.allow == ("a.example.com", "pypi.org")
    assert policy.network.deny == ("b.example.com",)
    assert policy.env.passthrough == ("HOME", "TERM")  # PATH is set, and set wins
    assert policy.env.set == (("A", "1"), ("PATH", "/bin"))


def test_values_are_converted() -> None:
    policy = parse_policy(doc(
        limits={"timeout": "1m30s", "memory": "512MiB", "cpu": 2, "pids": 64, "output": "1000B",
                "file_size": "1GB"},
        process={"cwd": "./src/", "stdin": "inherit"},
        filesystem={"exec_from_write": True},
        network={"mode": "any", "reach": ["10.0.0.5:05432", "192.168.1.7/24"]},
    ))
    assert policy.limits == Limits(timeout=90.0, memory=512 << 20, cpu=2.0, pids=64, output=1000,
                                   file_size=10**9)
    assert (policy.process.cwd, policy.process.stdin) == ("src", "inherit")
    assert policy.filesystem.exec_from_write is True
    assert policy.network.reach == ("10.0.0.5:5432", "192.168.1.0/24")


@pytest.mark.parametrize(("network", "key", "message"), [
    ({"mode": "any", "deny": ["evil.example"]}, "network.deny",
     'mode "any" guards destinations by address and cannot deny a name; deny patterns need '
     'mode "allowlist"'),
    ({"mode": "none", "reach": ["10.0.0.5"]}, "network.reach",
     'reach entries lift the destination guard of mode "any" (mode is "none"); set reach = [] '
     "or change the mode"),
    ({"mode": "any", "reach": ["db.internal"]}, "network.reach[0]", "not by name"),
    ({"mode": "any", "reach": ["10.0.0.5:0"]}, "network.reach[0]",
     "expected a port from 1 to 65535"),
    ({"mode": "any", "reach": ["[fd00::1"]}, "network.reach[0]", 'expected "[IPv6]"'),
    # Issue 32: loopback, which reach can never open, is refused saying why.
    ({"mode": "any", "reach": ["10.0.0.5", "127.0.0.1:5432"]}, "network.reach[1]",
     "is loopback: in the sandbox that is its own (always reachable), and the host's loopback "
     "is never reachable from mode any"),
    ({"mode": "any", "reach": ["127.1.0.0/16"]}, "network.reach[0]", "is loopback"),
    ({"mode": "any", "reach": ["[::1]:80"]}, "network.reach[0]", "is loopback"),
    ({"mode": "any", "reach": ["::ffff:127.0.0.1"]}, "network.reach[0]", "is loopback"),
])
def test_reach_is_for_network_any_and_by_address(network: dict, key: str, message: str) -> None:
    error = refused(doc(network=network))
    assert error.key == key and message in error.message, error.message


# -- presets ---------------------------------------------------------------------------------

def test_preset_names() -> None:
    assert PRESETS == ("read-only", "workspace-write", "workspace-write-no-exec",
                       "offline-build", "networked-build")


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_has_the_safe_defaults(name: str) -> None:
    policy = preset(name)
    assert policy.preset == name
    assert set(DENY_DEFAULTS) <= set(policy.filesystem.deny)
    for path in ("{home}/.ssh", "{home}/.aws", "{home}/.gnupg", "{home}/.config/gcloud",
                 "{home}/.docker", "{home}/.netrc", "{home}/.kube", "/etc/shadow",
                 "/etc/gshadow", "/etc/sudoers", "/etc/ssh"):
        assert path in policy.filesystem.deny
    assert set(DEFAULT_PROTECTED) <= set(policy.filesystem.protected)
    assert set(SYSTEM_READ) <= set(policy.filesystem.read)
    assert policy.env.passthrough == tuple(sorted(ENV_PASS_DEFAULTS))
    assert policy.process.stdin is None  # left to the caller: the API reads nothing
    assert all(getattr(policy.limits, name) for name in ("timeout", "memory", "pids", "output",
                                                          "file_size"))
    assert parse_policy(policy_to_document(policy)) == policy


def test_the_presets_here_are_the_linux_ones_and_windows_gets_its_own() -> None:
    assert preset_documents("linux") == PRESET_DOCUMENTS
    windows = preset_documents("win32")
    assert list(windows) == list(PRESETS)
    for name, document in windows.items():
        policy = parse_policy(document)
        linux = preset(name)
        assert set(WINDOWS_SYSTEM_READ) <= set(policy.filesystem.read)
        assert not any(path.startswith(("/", "?/")) for path in policy.filesystem.read)
        assert not any(path.startswith("/") for path in policy.filesystem.deny)
        assert "{home}/.ssh" in policy.filesystem.deny
        assert {"SystemRoot", "PATHEXT", "ComSpec", "USERPROFILE", "SystemDrive"} <= set(
            policy.env.passthrough)
        # the owner's temp folder is not the sandbox's: the backend sets TEMP and TMP
        assert not {"TEMP", "TMP"} & {name.upper() for name in policy.env.passthrough}
        assert policy.limits.file_size is None  # Windows has none; its backend refuses one
        assert policy.limits == dataclasses.replace(linux.limits, file_size=None)
        assert (policy.network, policy.filesystem.exec_from_write, policy.filesystem.write) == (
            linux.network, linux.filesystem.exec_from_write, linux.filesystem.write)


def test_read_only() -> None:
    policy = preset("read-only")
    assert "{workspace}" in policy.filesystem.read
    assert policy.filesystem.write == ()
    assert policy.filesystem.exec_from_write is False
    assert policy.network.mode == "none"
    assert policy.limits == Limits(timeout=600.0, memory=2 << 30, pids=512, output=16 << 20,
                                   file_size=1 << 30)


def test_workspace_write() -> None:
    """What the job builds runs (a venv, an extension, `make && ./prog`); its no-exec twin is
    the same but for that."""
    policy = preset("workspace-write")
    assert policy.filesystem.write == ("{workspace}",)
    assert "{workspace}" not in policy.filesystem.read
    assert policy.filesystem.exec_from_write is True
    assert policy.network.mode == "none"
    strict = preset("workspace-write-no-exec")
    assert strict.filesystem == dataclasses.replace(policy.filesystem, exec_from_write=False)
    assert (strict.network, strict.limits) == (policy.network, policy.limits)


def test_offline_build() -> None:
    policy = preset("offline-build")
    assert policy.filesystem.write == ("{workspace}",)
    assert policy.filesystem.exec_from_write is True
    assert policy.network.mode == "none"
    assert policy.limits == Limits(timeout=1800.0, memory=4 << 30, pids=1024, output=64 << 20,
                                   file_size=4 << 30)


def test_networked_build() -> None:
    policy = preset("networked-build")
    assert policy.filesystem == preset("offline-build").filesystem
    assert policy.limits == preset("offline-build").limits
    assert policy.network.mode == "allowlist"
    for domain in ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "*.debian.org",
                   "github.com", "*.githubusercontent.com"):
        assert domain in policy.network.allow


def test_unknown_preset() -> None:
    with pytest.raises(PolicyError) as caught:
        preset("foo")
    assert caught.value.key == "preset"
    assert caught.value.message == (
        'preset: unknown preset "foo" (known: read-only, workspace-write, '
        "workspace-write-no-exec, offline-build, networked-build)")


# -- merging ---------------------------------------------------------------------------------

def test_document_starts_from_its_preset() -> None:
    assert parse_policy(doc(preset="offline-build")) == preset("offline-build")


def test_lists_and_scalars_replace() -> None:
    policy = parse_policy(doc(preset="workspace-write",
                              filesystem={"read": ["/usr"]},
                              env={"pass": ["PATH"]},
                              limits={"timeout": "1h"}))
    base = preset("workspace-write")
    assert policy.filesystem.read == ("/usr",)
    assert policy.env.passthrough == ("PATH",)
    assert policy.limits.timeout == 3600.0
    assert policy.limits.memory == base.limits.memory  # untouched keys are kept
    assert policy.filesystem.write == base.filesystem.write
    assert policy.preset == "workspace-write"


def test_deny_and_protected_union() -> None:
    policy = parse_policy(doc(preset="read-only",
                              filesystem={"deny": ["{workspace}/.env"], "protected": [".hg"]}))
    assert set(policy.filesystem.deny) == {*DENY_DEFAULTS, "{workspace}/.env"}
    assert set(policy.filesystem.protected) == {*DEFAULT_PROTECTED, ".hg"}
    emptied = parse_policy(doc(preset="read-only", filesystem={"deny": [], "protected": []}))
    assert emptied.filesystem == preset("read-only").filesystem


def test_a_protected_name_is_added_or_removed_and_git_replaced() -> None:
    """`!NAME` removes one of the base's names (in any case); the canonical document says so,
    and parses back to the same policy; `git` replaces the base's mode."""
    policy = parse_policy(doc(preset="workspace-write", filesystem={
        "protected": ["!.CODEX", ".hg"], "git": "read-only"}))
    kept = sorted({*DEFAULT_PROTECTED, ".hg"} - {".codex"})
    assert policy.filesystem.protected == tuple(kept)
    assert policy.filesystem.git == "read-only"
    document = policy_to_document(policy)
    assert document["filesystem"]["protected"] == [*kept, "!.codex"]
    assert parse_policy(document) == policy
    assert parse_policy(doc()).filesystem.git == "guarded"
    emptied = merge(Policy(), {"filesystem": {"protected": [
        "!" + name for name in DEFAULT_PROTECTED]}})
    assert emptied.filesystem.protected == ()
    with pytest.raises(PolicyError, match="removes a name the base does not protect"):
        merge(emptied, {"filesystem": {"protected": ["!.agents"]}})


def test_the_policy_reference_states_each_keys_merge_rule() -> None:
    """The policy reference (docs/policy.md) has a row per key saying how it is laid over the
    preset, and it says what the schema does."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "policy.md").read_text()
    table = text.split("| key | over the base's value |\n", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+\.\w+)` \| ([^|]+?) \|$", table, re.MULTILINE))
    expected = {f"{section}.{key}": merge_rule(section, key)
                for section, keys in FIELDS.items() for key in keys}
    assert rows == expected


def test_network_deny_unions_and_allow_replaces() -> None:
    base = merge(preset("networked-build"), {"network": {"deny": ["bad.example.com"]}})
    policy = merge(base, {"network": {"allow": ["example.org"], "deny": ["worse.example.com"]}})
    assert policy.network.allow == ("example.org",)
    assert policy.network.deny == ("bad.example.com", "worse.example.com")


def test_env_set_merges_by_name() -> None:
    base = merge(Policy(), {"env": {"set": {"A": "1", "B": "2"}}})
    policy = merge(base, {"env": {"set": {"B": "3", "C": "4"}}})
    assert policy.env.set == (("A", "1"), ("B", "3"), ("C", "4"))


def test_override_cannot_grant_a_denied_path() -> None:
    error = refused(doc(preset="workspace-write", filesystem={"read": ["~/.aws/credentials"]}))
    assert error.message == (
        'filesystem.read: "{home}/.aws/credentials" is inside the denied path "{home}/.aws"')


def test_switching_off_the_network_needs_an_empty_allow_list() -> None:
    error = refused(doc(preset="networked-build", network={"mode": "none"}))
    assert error.key == "network.allow"
    policy = parse_policy(doc(preset="networked-build", network={"mode": "none", "allow": []}))
    assert policy.network.mode == "none"


def test_merge() -> None:
    base = preset("read-only")
    assert merge(base, {}) == base
    assert merge(base, {"version": 1}) == base
    assert merge(base, {"limits": {"pids": 7}}).limits.pids == 7
    assert merge(base, {"limits": {"pids": 7}}).preset == "read-only"
    with pytest.raises(PolicyError, match='unknown key "preset"'):
        merge(base, {"preset": "offline-build"})
    with pytest.raises(PolicyError) as caught:
        merge(base, {"version": 3}, file="extra.json")
    assert (caught.value.file, caught.value.key) == ("extra.json", "version")


# -- showing policies ------------------------------------------------------------------------

def test_policy_to_document() -> None:
    policy = parse_policy(doc(
        preset="workspace-write",
        filesystem={"read": ["/usr", "/opt"]},
        env={"set": {"LANG": "C.UTF-8"}},
        limits={"timeout": "500ms", "cpu": 1},
        process={"cwd": "src"},
    ))
    document = policy_to_document(policy)
    assert json.loads(json.dumps(document)) == document
    assert document["preset"] == "workspace-write"
    assert document["filesystem"]["read"] == ["/opt", "/usr"]
    assert document["filesystem"]["deny"] == sorted(DENY_DEFAULTS)
    assert document["env"] == {"pass": sorted(set(ENV_PASS_DEFAULTS) - {"LANG"}),
                               "set": {"LANG": "C.UTF-8"}}
    assert document["limits"]["timeout"] == 0.5
    assert document["limits"]["cpu"] == 1 and isinstance(document["limits"]["cpu"], int)
    assert document["process"] == {"cwd": "src"}
    assert parse_policy(document) == policy


def test_sizes_are_written_back_with_their_unit() -> None:
    """"2GB" (decimal) and "2GiB" (binary) are both accepted and shown apart; "2G" is 2GiB."""
    for written, shown in (("2GB", "2GB"), ("2GiB", "2GiB"), ("2G", "2GiB"), ("2048MiB", "2GiB"),
                           ("1.5GiB", "1536MiB"), ("2000MB", "2GB")):
        policy = parse_policy(doc(limits={"memory": written, "output": written,
                                          "file_size": written}))
        document = policy_to_document(policy)
        assert document["limits"] == {"memory": shown, "output": shown, "file_size": shown}
        assert parse_policy(document) == policy


def test_document_of_a_policy_without_preset_or_limits() -> None:
    document = policy_to_document(parse_policy(doc()))
    assert "preset" not in document
    assert document["limits"] == {}
    assert document["process"] == {}
    document = policy_to_document(parse_policy(doc(process={"stdin": "null"})))
    assert document["process"] == {"stdin": "null"}


# -- files -----------------------------------------------------------------------------------

TOML_POLICY = """\
version = 1
preset = "workspace-write"

[filesystem]
read = ["~/.cache/pip", "/opt/tools/"]

[network]
mode = "allowlist"
allow = ["PyPI.org", "*.example.com:443"]

[limits]
timeout = "1m30s"
memory = "512MiB"
"""


def test_load_toml(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(TOML_POLICY)
    policy = load_policy(path)
    assert policy.filesystem.read == ("/opt/tools", "{home}/.cache/pip")
    assert policy.network.allow == ("*.example.com:443", "pypi.org")
    assert policy.limits.timeout == 90.0
    assert load_policy(str(path)) == policy


def test_load_json(tmp_path: Path) -> None:
    path = tmp_path / "policy.JSON"
    path.write_text("\ufeff" + json.dumps(doc(preset="read-only", limits={"pids": 9})))
    assert load_policy(path) == merge(preset("read-only"), {"limits": {"pids": 9}})


def write_file(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(("name", "data", "message"), [
    ("p.yaml", b"version: 1", "expected a policy file name ending in .toml or .json"),
    ("policy", b"", "expected a policy file name ending in .toml or .json"),
    ("p.toml", b"version = 1\n[limits]\nmemory =\n",
     "invalid TOML: Invalid value (at line 3, column 9)"),
    ("p.toml", b"version = 1\nversion = 1\n",
     "invalid TOML: Cannot overwrite a value (at line 2, column 12)"),
    ("p.toml", b"version = 1\n\xff\n", "policy file is not valid UTF-8 (at byte 12)"),
    ("p.json", b'{"version": 1,}',
     "invalid JSON: Expecting property name enclosed in double quotes (at line 1, column 15)"),
    ("p.json", b'{"version": 1,\n "version": 1}', 'invalid JSON: duplicate key "version"'),
    ("p.json", b'{"version": NaN}', "invalid JSON: NaN is not a valid number here"),
    ("p.json", b'{"version": -Infinity}', "invalid JSON: -Infinity is not a valid number here"),
    ("p.json", b"[" * 100000 + b"]" * 100000, "invalid JSON: nested too deeply"),
    ("p.json", b'{"version": ' + b"9" * 5000 + b"}", "invalid JSON: Exceeds the limit"),
    ("p.json", b" " * (1 << 20) + b"{}", "policy file is larger than 1048576 bytes"),
])
def test_load_refused(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    path = write_file(tmp_path, name, data)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.file == path
    assert caught.value.message.startswith(f"{path}: {message}")


def test_load_document_errors_name_the_file(tmp_path: Path) -> None:
    path = write_file(tmp_path, "p.toml", b"version = 1\n[limits]\npids = 0\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert (caught.value.file, caught.value.key) == (path, "limits.pids")
    assert str(caught.value).startswith(f"policy_invalid: {path}: limits.pids: expected")


@pytest.mark.parametrize("name", ["missing.toml", "dir.toml", "nul\0.json"])
def test_unreadable_file(tmp_path: Path, name: str) -> None:
    (tmp_path / "dir.toml").mkdir()
    path = str(tmp_path / name)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.file == path
    assert "cannot read policy file" in caught.value.message


def test_version_is_checked_before_the_preset() -> None:
    assert refused({"version": 2, "preset": "nope"}).key == "version"


def test_containment_is_native_unless_the_document_asks_for_a_vm() -> None:
    assert parse_policy({"version": 1}).containment == "native"
    vm = parse_policy({"version": 1, "preset": "read-only", "containment": "vm"})
    assert vm.containment == "vm" and vm.filesystem == preset("read-only").filesystem
    assert policy_to_document(vm)["containment"] == "vm"
    assert parse_policy(policy_to_document(vm)) == vm
    assert "containment" not in policy_to_document(parse_policy({"version": 1}))
    assert merge(preset("read-only"), {"containment": "vm"}).containment == "vm"
    with pytest.raises(PolicyError) as info:
        parse_policy({"version": 1, "containment": "docker"}, file="p.toml")
    assert str(info.value) == ('policy_invalid: p.toml: containment: expected one of '
                               '"native", "vm", got "docker"')
