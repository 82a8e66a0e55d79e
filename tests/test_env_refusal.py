"""Credential-looking variables are refused by name, every pattern of them (issue 30: the audit
dropped `*_TOKEN` and no test noticed, since every test used GITHUB_TOKEN, which a prefix
refuses too). Each pattern of stockade/launch/env.py has names that it alone refuses, so
losing any one of them fails here; and a real run asked to pass such names refuses before
any child starts (with the pattern lost, the child would print the value: asserted absent)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from conftest import PYTHON, policy_for

import stockade
from stockade.errors import PolicyError
from stockade.launch import env

# Each alternative of env._CREDENTIAL, and names that only it refuses (in any case: the
# check upper-cases). SSH_AUTH_ is subsumed by the AUTH word (its names all hold `_AUTH_`).
WORDS = {
    "TOKEN": ["SLACK_TOKEN", "TOKEN", "discord_bot_token", "VAULT_TOKEN_FILE"],
    "SECRET": ["CLIENT_SECRET", "SECRET", "JWT_SECRET_VALUE"],
    "PASSWORD": ["DB_PASSWORD", "PASSWORD", "mysql_root_password"],
    "PASSWD": ["LDAP_PASSWD", "PASSWD_FILE"],
    "PASS": ["DB_PASS", "PASS", "smtp_pass"],
    "PASSPHRASE": ["GPG_PASSPHRASE", "KEY_PASSPHRASE_FILE"],
    "APIKEY": ["SENDGRID_APIKEY", "APIKEY"],
    "API_KEY": ["STRIPE_API_KEY", "MAPS_API_KEY_FILE", "api_key"],
    "ACCESS_KEY": ["MINIO_ACCESS_KEY", "ACCESS_KEY_ID"],
    "PRIVATE_KEY": ["DEPLOY_PRIVATE_KEY", "PRIVATE_KEY_PATH"],
    "CREDENTIALS?": ["SERVICE_CREDENTIALS", "CREDENTIAL", "MY_CREDENTIAL_FILE"],
    "AUTH": ["BASIC_AUTH", "AUTH_HEADER", "proxy_auth"],
    "COOKIE": ["SESSION_COOKIE", "COOKIE"],
}
PREFIXES = {
    "AWS": ["AWS_PROFILE", "AWS_DEFAULT_REGION"],
    "AZURE": ["AZURE_CLIENT_ID", "AZURE_TENANT_ID"],
    "GOOGLE_APPLICATION": ["GOOGLE_APPLICATION_DEFAULT", "GOOGLE_APPLICATION_NAME"],
    "GCP": ["GCP_PROJECT", "GCP_SA_KEY"],
    "OPENAI": ["OPENAI_ORG_ID", "OPENAI_BASE_URL"],
    "ANTHROPIC": ["ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL"],
    "GITHUB": ["GITHUB_ACTOR", "GITHUB_REPOSITORY"],
    "GITLAB": ["GITLAB_HOST", "GITLAB_USER"],
    "NPM": ["NPM_CONFIG_REGISTRY", "NPM_REGISTRY"],
    "PYPI": ["PYPI_USERNAME", "PYPI_REPOSITORY"],
    "DOCKER": ["DOCKER_HOST", "DOCKER_CONFIG"],
    "HF": ["HF_HOME", "HF_ENDPOINT"],
    "HUGGING_FACE": ["HUGGING_FACE_HUB_CACHE", "HUGGING_FACE_USER"],
    "SSH_AUTH": ["SSH_AUTH_SOCK"],
}
SUBSUMED = {"SSH_AUTH": "AUTH"}
ALLOWED = ["PATH", "HOME", "LANG", "TERM", "KEYBOARD", "PASSAGE", "AUTHOR", "TOKENIZERS_PATH",
           "COOKIES_DIR", "MY_SECRETARY", "BYPASS"]


def _alternatives(group: str) -> list[str]:
    """The alternatives of the regex group that starts with `group` in env._CREDENTIAL."""
    source = env._CREDENTIAL.pattern
    start = source.index(group) + len(group)
    return source[start:source.index(")", start)].split("|")


def _matches(alternative: str, name: str, prefix: bool) -> bool:
    shape = f"^({alternative})_" if prefix else f"(^|_)({alternative})(_|$)"
    return re.search(shape, name.upper()) is not None


def test_the_names_here_cover_every_pattern_of_the_refusal():
    """A pattern added to env.py without names of its own here fails: so does a name here
    that another pattern refuses too (dropping its own would then go unnoticed)."""
    assert sorted(_alternatives("(^|_)(")) == sorted(WORDS)
    assert sorted(_alternatives("|^(")) == sorted(PREFIXES)
    for table, prefix in ((WORDS, False), (PREFIXES, True)):
        for alternative, names in table.items():
            for name in names:
                assert _matches(alternative, name, prefix), (alternative, name)
                others = [a for a in WORDS if a != alternative and _matches(a, name, False)]
                others += [a for a in PREFIXES if a != alternative and _matches(a, name, True)]
                assert others in ([], [SUBSUMED.get(alternative)]), (name, others)


@pytest.mark.parametrize("name", [n for names in [*WORDS.values(), *PREFIXES.values()]
                                  for n in names])
def test_every_credential_pattern_is_refused_by_name(name):
    assert env.refusal_reason(name) == "it looks like a credential"
    with pytest.raises(PolicyError) as refused:
        env.close_environment((name,), (), {name: "value"})
    assert refused.value.code == "env_refused" and name in str(refused.value)


@pytest.mark.parametrize("name", ALLOWED)
def test_names_that_only_contain_a_word_pass(name):
    assert env.refusal_reason(name) is None


@pytest.mark.usefixtures("linux")
def test_a_credential_passed_to_a_real_run_never_reaches_the_child(ws, monkeypatch):
    """Passed by the policy or by the API's `env`, a name of each kind is refused, typed,
    naming it and not its value, and no child ever prints the value."""
    workspace, _ = ws
    names = ["SLACK_TOKEN", "DB_PASSWORD", "STRIPE_API_KEY", "SESSION_COOKIE", "OPENAI_ORG_ID",
             "ANTHROPIC_MODEL", "HF_HOME"]
    show = [PYTHON, "-c", "import os; print(sorted(os.environ.items()))"]
    for name in names:
        value = f"hunter-{name.lower()}"
        monkeypatch.setenv(name, value)
        base = policy_for()
        passing = replace(base, env=replace(base.env, passthrough=(name, "PATH")))
        for policy, extra in ((passing, None), (policy_for(), {name: value})):
            try:
                ran = stockade.run(show, policy, workspace=workspace, env=extra)
            except PolicyError as refused:
                assert refused.code == "env_refused", refused
                assert name in str(refused) and value not in str(refused)
            else:
                assert value.encode() not in ran.stdout, f"{name} reached the child"
                pytest.fail(f"{name} was not refused")
