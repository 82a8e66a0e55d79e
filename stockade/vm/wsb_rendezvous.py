"""The rendezvous between the host and a Windows Sandbox guest (docs/windows-sandbox.md).

1. Before the launch, the host writes the boot's 32-byte secret as `secret` in the per-boot
   rendezvous folder: a folder in the host user's private state directory, mapped read-write
   into the guest at `C:\\stockade\\rendezvous`.
2. In the guest, after the firewall lock is verified, the guest entry reads the secret, deletes
   the file (and checks it is gone) *before* the agent listens, so no command ever finds it.
3. It writes `rendezvous.json` (atomically: a temporary name, then a rename): how the host
   reaches the agent and a proof, HMAC-SHA256 under the secret of the boot id, the transport
   and its endpoints — never the secret. Over TCP (a guest with a network: `allowlist`) the
   endpoints are the guest's address and port and the host's address as the guest sees it (its
   default gateway: where the host serves the proxy); over the spool (a guest without one:
   `none`, wsb_spool) there are none. A guest that refuses (firewall lock unverified, no
   command user) writes a refusal instead: a stable code and a short message (a forged
   refusal can only deny service, so it carries no proof).
4. Over TCP, the host connects and sends a fresh 32-byte challenge; the agent's side answers
   HMAC-SHA256(secret, challenge). Only then does the host send the protocol's `hello`, whose
   nonce is the secret (docs/protocol.md): it never reaches an endpoint that did not prove it
   already holds the secret. The guest accepts one connection, from the host's address only,
   then stops listening: the secret is worthless after the handshake. Over the spool, the
   rendezvous's proof is that proof: only the guest entry, which deleted the secret's file,
   can have written it, and only the agent reads the spool before any command runs.

The parser is strict: bounded size, UTF-8 JSON without duplicate keys or constants, exactly the
fields of one status, each of its kind; anything else is `RendezvousError`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
from dataclasses import dataclass

from stockade.errors import StockadeError
from stockade.session.protocol import NONCE_SIZE, strict_json_object

SECRET_FILE = "secret"
RENDEZVOUS_FILE = "rendezvous.json"
RENDEZVOUS_TEMP = "rendezvous.tmp"
SECRET_SIZE = NONCE_SIZE  # the secret is the protocol's hello nonce
CHALLENGE_SIZE = 32
MAX_SIZE = 4096  # bytes: a rendezvous file is a few hundred
VERSION = 2  # 2: the transport (tcp or spool) and the host's address
TCP, SPOOL = "tcp", "spool"
READY, REFUSED = "ready", "refused"
_BOOT_ID = re.compile(r"[0-9a-f]{32}")
_PROOF = re.compile(r"[0-9a-f]{64}")
_CODE = re.compile(r"[a-z][a-z0-9_.:]{0,63}")
MAX_MESSAGE = 500
_PROOF_CONTEXT = b"stockade-wsb-rendezvous\0"
_ANSWER_CONTEXT = b"stockade-wsb-agent\0"


class RendezvousError(StockadeError):
    """The rendezvous file or the guest's answer is not what this boot's guest would write;
    the code names what (`rendezvous_invalid`, `rendezvous_proof_invalid`, ...)."""


@dataclass(frozen=True)
class Ready:
    boot: str
    transport: str  # TCP or SPOOL
    proof: str
    address: str = ""  # TCP: the agent's address and port, and the host's address as the
    port: int = 0  # guest sees it (its default gateway)
    host: str = ""


@dataclass(frozen=True)
class Refused:
    boot: str
    code: str
    message: str


_READY = {"version", "status", "boot", "transport", "proof"}
_FIELDS = {(READY, TCP): _READY | {"address", "port", "host"}, (READY, SPOOL): _READY,
           (REFUSED, ""): {"version", "status", "boot", "code", "message"}}


def proof(secret: bytes, boot: str, transport: str, address: str = "", port: int = 0,
          host: str = "") -> str:
    text = f"{boot}\0{transport}\0{address}\0{port}\0{host}".encode()
    return hmac.new(secret, _PROOF_CONTEXT + text, hashlib.sha256).hexdigest()


def answer(secret: bytes, challenge: bytes) -> bytes:
    """The guest's answer to the host's challenge on the connection."""
    return hmac.new(secret, _ANSWER_CONTEXT + challenge, hashlib.sha256).digest()


def encode(record: Ready | Refused) -> bytes:
    if isinstance(record, Ready):
        body: dict = {"status": READY, "boot": record.boot, "transport": record.transport,
                      "proof": record.proof}
        if record.transport == TCP:
            body |= {"address": record.address, "port": record.port, "host": record.host}
    else:
        body = {"status": REFUSED, "boot": record.boot, "code": record.code,
                "message": record.message[:MAX_MESSAGE]}
    return json.dumps({"version": VERSION, **body}, ensure_ascii=True).encode()


def parse(data: bytes) -> Ready | Refused:
    """The record in `data`, checked field by field; RendezvousError otherwise."""
    if len(data) > MAX_SIZE:
        raise _invalid(f"{len(data)} bytes exceeds the {MAX_SIZE}-byte bound")
    try:
        body = strict_json_object(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _invalid("not a UTF-8 JSON object") from None
    status, transport = body.get("status"), body.get("transport", "")
    if status not in (READY, REFUSED):
        raise _invalid("status is not 'ready' or 'refused'")
    expected = _FIELDS.get((status, transport)) if isinstance(transport, str) else None
    if expected is None:
        raise _invalid("transport is not 'tcp' or 'spool'")
    fields = set(body)
    if fields != expected:
        odd = sorted(fields ^ expected)
        raise _invalid(f"{'unknown' if odd[0] in fields else 'missing'} field {odd[0][:40]!r}")
    if type(body["version"]) is not int or body["version"] != VERSION:
        raise _invalid(f"version is not {VERSION}")
    boot = _text(body, "boot", _BOOT_ID)
    if status == REFUSED:
        message = body["message"]
        if not isinstance(message, str) or len(message) > MAX_MESSAGE:
            raise _invalid(f"message is not text of at most {MAX_MESSAGE} characters")
        return Refused(boot, _text(body, "code", _CODE), message)
    proved = _text(body, "proof", _PROOF)
    if transport == SPOOL:
        return Ready(boot, SPOOL, proved)
    port = body["port"]
    if type(port) is not int or not 0 < port < 65536:
        raise _invalid("port is not an integer from 1 to 65535")
    return Ready(boot, TCP, proved, _address(body["address"]), port, _address(body["host"]))


def verify(ready: Ready, secret: bytes, boot: str) -> None:
    """Raise unless `ready` is this boot's and was written by a holder of `secret`."""
    if ready.boot != boot:
        raise RendezvousError("rendezvous_stale", "the rendezvous names another boot")
    expected = proof(secret, boot, ready.transport, ready.address, ready.port, ready.host)
    if not hmac.compare_digest(expected, ready.proof):
        raise RendezvousError("rendezvous_proof_invalid",
                              "the rendezvous proof does not match this boot's secret")


def _address(value: object) -> str:
    if not isinstance(value, str) or len(value) > 15:
        raise _invalid("an address is not an IPv4 address")
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise _invalid("an address is not an IPv4 address") from None
    if str(address) != value or address.is_unspecified or address.is_multicast or \
            address == ipaddress.IPv4Address("255.255.255.255"):
        raise _invalid("an address is not a unicast IPv4 address in canonical form")
    return value


def _text(body: dict, name: str, pattern: re.Pattern[str]) -> str:
    value = body[name]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _invalid(f"{name} is malformed")
    return value


def _invalid(why: str) -> RendezvousError:
    return RendezvousError("rendezvous_invalid", f"the guest's rendezvous file: {why}")
