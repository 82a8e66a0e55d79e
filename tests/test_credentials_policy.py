"""`[[network.credentials]]` and `[[network.http]]` in the policy language: every key known,
each refusal naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from stockade.errors import PolicyError
from stockade.policy import parse_policy, policy_to_document
from stockade.policy.model import Credential, HttpRule

CREDENTIAL = {"name": "gh", "host": "api.example.com", "env": "GH_TOKEN",
              "header": "Authorization", "prefix": "Bearer ", "from_env": "MY_TOKEN"}


def document(credentials: list[Any] | None = None, http: list[Any] | None = None,
             mode: str = "allowlist") -> dict[str, Any]:
    network: dict[str, Any] = {"mode": mode}
    if mode == "allowlist":
        network["allow"] = ["api.example.com"]
    if credentials is not None:
        network["credentials"] = credentials
    if http is not None:
        network["http"] = http
    return {"version": 1, "network": network}


def refusal(doc: dict[str, Any]) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        parse_policy(doc)
    assert caught.value.code == "policy_invalid"
    return caught.value


def test_a_credential_and_a_rule_parse_and_round_trip() -> None:
    policy = parse_policy(document(
        [CREDENTIAL, {"name": "files", "host": "*.example.org", "env": "KEY",
                      "query": "api_key", "from_file": "~/.config/key"}],
        [{"host": "api.example.com", "methods": ["HEAD", "GET"], "paths": ["/repos/org/"]}]))
    assert policy.network.credentials[0] == Credential(
        "gh", "api.example.com", "GH_TOKEN", header="Authorization", prefix="Bearer ",
        from_env="MY_TOKEN")
    assert policy.network.credentials[1].from_file == "{home}/.config/key"
    assert policy.network.http == (HttpRule("api.example.com", ("GET", "HEAD"),
                                            ("/repos/org/",)),)
    assert parse_policy(policy_to_document(policy)) == policy


@pytest.mark.parametrize(("entry", "key", "words"), [
    (CREDENTIAL | {"token": "x"}, "network.credentials[0]", 'unknown key "token"'),
    ({k: v for k, v in CREDENTIAL.items() if k != "env"}, "network.credentials[0]",
     'missing required key "env"'),
    (CREDENTIAL | {"query": "k"}, "network.credentials[0]", "exactly one of header, "
     "basic_user, query"),
    (CREDENTIAL | {"from_file": "/k"}, "network.credentials[0]", "exactly one of from_env, "
     "from_file"),
    ({k: v for k, v in CREDENTIAL.items() if k != "from_env"}, "network.credentials[0]",
     "exactly one of from_env, from_file"),
    ({k: v for k, v in CREDENTIAL.items() if k != "header"} | {"query": "k"},
     "network.credentials[0].prefix", "prefix needs header"),
    (CREDENTIAL | {"host": "https://x.com/"}, "network.credentials[0].host", "domain"),
    (CREDENTIAL | {"header": "Bad Header"}, "network.credentials[0].header", "header name"),
    (CREDENTIAL | {"prefix": "Bearer\r\nX: y"}, "network.credentials[0].prefix",
     "printable ASCII"),
    (CREDENTIAL | {"name": "GH!"}, "network.credentials[0].name", "lower-case"),
])
def test_a_credential_is_refused_at_its_key(entry: dict[str, Any], key: str,
                                            words: str) -> None:
    error = refusal(document([entry]))
    assert error.key == key and words in error.message


def test_two_credentials_cannot_share_a_variable() -> None:
    error = refusal(document([CREDENTIAL, CREDENTIAL | {"name": "other"}]))
    assert error.key == "network.credentials[1].env"


@pytest.mark.parametrize(("rule", "key", "words"), [
    ({"host": "api.example.com", "verbs": ["GET"]}, "network.http[0]", 'unknown key "verbs"'),
    ({"methods": ["GET"]}, "network.http[0]", 'missing required key "host"'),
    ({"host": "api.example.com", "methods": ["get"]}, "network.http[0].methods[0]",
     "upper-case"),
    ({"host": "api.example.com", "paths": ["repos/"]}, "network.http[0].paths[0]",
     "path prefix"),
    ({"host": "api.example.com", "paths": ["/repos/../admin"]}, "network.http[0].paths[0]",
     '".."'),
    ({"host": "api.example.com", "paths": ["/a%2f"]}, "network.http[0].paths[0]",
     "path prefix"),
])
def test_a_rule_is_refused_at_its_key(rule: dict[str, Any], key: str, words: str) -> None:
    error = refusal(document(http=[rule]))
    assert error.key == key and words in error.message


@pytest.mark.parametrize("name", ["credentials", "http"])
def test_the_sections_need_the_proxy(name: str) -> None:
    entry = CREDENTIAL if name == "credentials" else {"host": "api.example.com"}
    error = refusal(document(**{name: [entry]}, mode="none"))
    assert error.key == f"network.{name}" and '"allowlist"' in error.message


def test_a_credential_error_never_shows_more_than_the_key() -> None:
    error = refusal(document([CREDENTIAL | {"from_env": "not a name: s3cr3t-value"}]))
    assert error.key == "network.credentials[0].from_env"
