"""Proxy decisions without network traffic: patterns, address classes, the gate (resolve once,
check every answer, never let DNS widen the policy)."""

from __future__ import annotations

import ipaddress
import os
import socket
import stat

import pytest
from conftest import unavailable

from stockade.errors import PolicyError, SetupError
from stockade.net import addresses
from stockade.net.env import proxy_environment
from stockade.net.gate import Gate
from stockade.net.log import DecisionLog
from stockade.net.proxy import Proxy
from stockade.net.rules import Ruleset, target_host


def decide(allow, host, port, deny=()):
    return Ruleset(allow, deny).decide(target_host(host), port)


@pytest.mark.parametrize("allow, host, port, allowed", [
    (["example.com"], "example.com", 443, True),
    (["example.com"], "EXAMPLE.Com", 80, True),
    (["Example.COM"], "example.com", 443, True),
    (["example.com"], "example.com.", 443, True),
    (["example.com"], "www.example.com", 443, False),
    (["example.com"], "example.org", 443, False),
    (["*.example.com"], "a.example.com", 443, True),
    (["*.example.com"], "a.b.example.com", 443, True),
    (["*.example.com"], "example.com", 443, False),
    (["*.example.com"], "badexample.com", 443, False),
    (["*.example.com"], "a.example.com.evil.net", 443, False),
    (["example.com"], "example.com", 22, False),
    (["example.com"], "example.com", 8080, False),
    (["example.com:8443"], "example.com", 8443, True),
    (["example.com:8443"], "example.com", 443, False),
    (["*.example.com:22"], "git.example.com", 22, True),
    (["example.com"], "93.184.216.34", 443, False),
    (["93.184.216.34"], "93.184.216.34", 443, True),
    (["93.184.216.34"], "93.184.216.35", 443, False),
    (["[2001:db8::1]:443"], "2001:db8:0:0::1", 443, True),
    (["[2001:db8::1]:443"], "[2001:DB8::1]", 443, True),
    (["[2001:db8::1]:443"], "2001:db8::2", 443, False),
    (["[2001:db8::1]"], "2001:db8::1", 8080, False),
])
def test_allow_patterns(allow, host, port, allowed):
    assert decide(allow, host, port).allowed is allowed


def test_deny_is_checked_before_allow_and_covers_every_port():
    rules = Ruleset(["*.example.com", "api.example.com:8080"], ["api.example.com"])
    for port in (443, 8080):
        decision = rules.decide("api.example.com", port)
        assert (decision.allowed, decision.reason, decision.rule) == (
            False, "denied_by_rule", "api.example.com")
    assert rules.decide("www.example.com", 443).allowed


def test_deny_with_port_only_denies_that_port():
    rules = Ruleset(["example.com", "example.com:8443"], ["example.com:443"])
    assert not rules.decide("example.com", 443).allowed
    assert rules.decide("example.com", 80).allowed


def test_reasons_name_the_rule():
    rules = Ruleset(["example.com"])
    assert rules.decide("example.com", 22).reason == "port_not_allowed"
    assert rules.decide("example.com", 22).rule == "example.com"
    assert rules.decide("other.com", 443).reason == "not_allowed"
    assert rules.decide("example.com", 443).rule == "example.com"


@pytest.mark.parametrize("host", [
    "", "*.example.com", "*", "a..b", "127.1", "0x7f.0.0.1", "2130706433", "017.0.0.1",
    "exa mple.com", "ex_ample.com", "a/b", "user@host", "fe80::1%eth0", "[::1", "caf\xe9.com",
])
def test_invalid_targets_are_refused(host):
    with pytest.raises(ValueError):
        target_host(host)


def test_invalid_patterns_raise_policy_errors():
    with pytest.raises(PolicyError, match="network.allow"):
        Ruleset(["*"])
    with pytest.raises(PolicyError, match="network.deny"):
        Ruleset([], ["http://example.com"])


@pytest.mark.parametrize("address, kind", [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("169.254.1.1", "link_local"), ("fe80::1", "link_local"), ("fe80::1%1", "link_local"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("172.31.255.255", "private"),
    ("192.168.1.1", "private"), ("100.64.0.1", "private"), ("100.127.255.254", "private"),
    ("fc00::1", "private"), ("fd12:3456::1", "private"),
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"),
    ("100.100.100.200", "metadata"), ("168.63.129.16", "metadata"),
    ("255.255.255.255", "reserved"), ("192.0.2.1", "reserved"), ("198.18.0.1", "reserved"),
    ("2001:db8::1", "reserved"), ("100::1", "reserved"), ("::8.8.8.8", "reserved"),
])
def test_forbidden_addresses(address, kind):
    assert addresses.classify(ipaddress.ip_address(address)) == (kind, "")


@pytest.mark.parametrize("address, kind, via", [
    ("::ffff:127.0.0.1", "loopback", ""),          # mapped: judged as the IPv4 it is
    ("::ffff:169.254.169.254", "metadata", ""),
    ("::ffff:10.0.0.1", "private", ""),
    ("64:ff9b::7f00:1", "loopback", "NAT64"),
    ("64:ff9b::a9fe:a9fe", "metadata", "NAT64"),
    ("64:ff9b::c0a8:101", "private", "NAT64"),
    ("2002:7f00:1::", "loopback", "6to4"),
    ("2002:a9fe:a9fe::1", "metadata", "6to4"),
    ("2002:a00:1::", "private", "6to4"),
    ("::127.0.0.1", "loopback", "IPv4-compatible"),
    ("::169.254.169.254", "metadata", "IPv4-compatible"),
])
def test_embedded_ipv4_forms_are_judged_by_their_ipv4(address, kind, via):
    assert addresses.classify(ipaddress.ip_address(address)) == (kind, via)


@pytest.mark.parametrize("address", [
    "8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "64:ff9b::808:808",
    "2002:808:808::1", "::ffff:8.8.8.8",
])
def test_public_addresses_pass(address):
    assert addresses.classify(ipaddress.ip_address(address)) is None


def _local_address() -> str | None:
    """A non-loopback address of this host (a UDP connect sends nothing), if it has one."""
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                return sock.getsockname()[0]
        except OSError:
            continue
    return None


def test_host_addresses_are_recognised():
    assert addresses.is_host_address(ipaddress.ip_address("127.0.0.2"))
    assert not addresses.is_host_address(ipaddress.ip_address("203.0.113.77"))
    local = _local_address()
    if local is None:
        unavailable("this host has no non-loopback address")
    assert addresses.is_host_address(ipaddress.ip_address(local))


def test_a_public_looking_host_address_is_refused(monkeypatch):
    monkeypatch.setattr(addresses, "is_host_address", lambda address: True)
    assert addresses.classify(ipaddress.ip_address("8.8.8.8")) == ("host_address", "")


def gate(allow, answers, deny=()):
    calls = []

    def resolver(host):
        calls.append(host)
        return answers[host]
    return Gate(Ruleset(allow, deny), resolver), calls


def test_gate_dials_only_checked_addresses_and_resolves_once():
    g, calls = gate(["example.com"], {"example.com": ["127.0.0.1", "8.8.8.8", "::ffff:1.1.1.1"]})
    verdict = g.decide("example.com", 443)
    assert verdict.decision == "allow"
    assert verdict.addresses == ("8.8.8.8", "1.1.1.1")
    assert calls == ["example.com"]


@pytest.mark.parametrize("answer, reason", [
    ("127.0.0.1", "address_loopback"), ("::ffff:127.0.0.1", "address_loopback"),
    ("169.254.169.254", "address_metadata"), ("64:ff9b::a9fe:a9fe", "address_metadata"),
    ("10.0.0.5", "address_private"), ("fe80::1", "address_link_local"),
])
def test_gate_refuses_a_name_resolving_to_a_forbidden_address(answer, reason):
    g, _ = gate(["rebind.test"], {"rebind.test": [answer]})
    verdict = g.decide("rebind.test", 443)
    assert (verdict.decision, verdict.reason) == ("deny", reason)
    assert verdict.address == str(ipaddress.ip_address(answer))
    assert verdict.address in verdict.message and not verdict.addresses


@pytest.mark.parametrize("answer, port, rule", [
    ("198.18.0.7", 443, "198.18.0.7:443"), ("fd00::5", 8080, "[fd00::5]:8080"),
    ("::ffff:10.0.0.5", 80, "10.0.0.5:80"),
])
def test_gate_refusing_an_answer_names_the_rule_that_would_allow_it(answer, port, rule):
    """Issue 32: the refusal names the fix, and the fix works."""
    g, _ = gate([f"registry.test:{port}"], {"registry.test": [answer]})
    refused = g.decide("registry.test", port)
    assert f'allow "{rule}" (--allow-domain {rule})' in refused.message, refused.message
    g, _ = gate([f"registry.test:{port}", rule], {"registry.test": [answer]})
    assert g.decide("registry.test", port).decision == "allow"


def test_gate_exempts_only_a_literally_listed_address_and_port():
    g, _ = gate(["svc.test:8080", "127.0.0.1:8080"], {"svc.test": ["127.0.0.1"]})
    assert g.decide("svc.test", 8080).addresses == ("127.0.0.1",)
    g, _ = gate(["svc.test:8080", "127.0.0.1"], {"svc.test": ["127.0.0.1"]})
    assert g.decide("svc.test", 8080).reason == "address_loopback"


def test_gate_applies_literal_deny_patterns_to_answers():
    g, _ = gate(["example.com"], {"example.com": ["8.8.8.8"]}, deny=["8.8.8.8"])
    verdict = g.decide("example.com", 443)
    assert (verdict.decision, verdict.reason, verdict.rule) == ("deny", "denied_by_rule", "8.8.8.8")


def test_gate_never_resolves_a_denied_name():
    g, calls = gate(["*.example.com"], {}, deny=["bad.example.com"])
    assert g.decide("bad.example.com", 443).decision == "deny"
    assert g.decide("other.org", 443).reason == "not_allowed"
    assert calls == []


def test_gate_literal_targets_skip_the_resolver():
    g, calls = gate(["127.0.0.1:9", "[::1]:9"], {})
    assert g.decide("127.0.0.1", 9).addresses == ("127.0.0.1",)
    assert g.decide("::1", 9).addresses == ("::1",)
    assert g.decide("169.254.169.254", 80).reason == "not_allowed"
    assert calls == []


@pytest.mark.parametrize("answers", [[], ["not-an-address"], KeyError])
def test_gate_resolution_failures_are_errors_not_allows(answers):
    def resolver(host):
        if answers is KeyError:
            raise KeyError(host)
        return answers
    verdict = Gate(Ruleset(["example.com"]), resolver).decide("example.com", 443)
    assert (verdict.decision, verdict.reason) == ("error", "resolve_failed")


def test_gate_invalid_host_and_port():
    g, _ = gate(["example.com"], {})
    assert g.decide("exa mple.com", 443).reason == "invalid_host"
    assert g.decide("x" * 5000, 443).host == "x" * 255
    assert g.decide("example.com", 0).reason == "invalid_port"


def test_proxy_environment():
    env = proxy_environment(3128)
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        assert env[name] == env[name.lower()] == "http://127.0.0.1:3128"
    assert env["ALL_PROXY"] == env["all_proxy"] == "socks5h://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == ""
    assert "nc -X 5 -x 127.0.0.1:3128 %h %p" in env["GIT_SSH_COMMAND"]
    with pytest.raises(Exception, match="1-65535"):
        proxy_environment(0)


def test_denials_kept_in_memory_are_capped_but_all_reach_the_file(tmp_path):
    log = DecisionLog("r", str(tmp_path / "log.jsonl"), max_kept=2)
    for port in range(1, 6):
        log.record(protocol="connect", host="h", port=port, decision="deny", reason="x",
                   message="m")
    log.record(protocol="connect", host="h", port=9, decision="allow", reason="y", message="m")
    log.close()
    assert [d["port"] for d in log.denials()] == [1, 2] and log.dropped == 3
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 5
    assert stat.S_IMODE(os.stat(tmp_path / "log.jsonl").st_mode) == 0o600


def test_an_unusable_socket_directory_is_a_setup_error(tmp_path):
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    with pytest.raises(SetupError, match="proxy_listen_failed"):
        Proxy([], socket_dir=str(deep)).start()
    assert list(deep.iterdir()) == []
