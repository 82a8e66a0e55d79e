"""The host side of the rows about what the allowlist proxy reads (network.credentials,
network.http, approvals): a test CA of the scene's own, HTTP(S) servers on loopback that say
afterwards what reached them, the proxy's stand-in DNS, and the caller's approval function.

`cryptography` makes the test CA (the standard library cannot); it is Stockade's optional
extra (`stockade[credentials]`), which the proxy's own interception needs too.
"""

from __future__ import annotations

import datetime
import importlib.util
import ipaddress
import os
import re
import socket
import ssl
import threading
from typing import BinaryIO

from stockade.evidence.scene import NotRunnable
from stockade.evidence.watch import Finding, Watch
from stockade.net.approve import ALLOW_RUN, Ask

# What a credential's placeholder looks like (launch/compile.py makes them): a server that
# hears one, or a DNS name that holds one, got what the proxy must keep from every other host.
PLACEHOLDER = re.compile(rb"stockade-cred-[a-z0-9_-]+-[0-9a-f]{32}", re.IGNORECASE)
_HEARD_MAX = 1 << 20  # bytes a server keeps of what it heard


def need_cryptography() -> None:
    """NotRunnable unless `cryptography` (the credentials extra) is installed."""
    if importlib.util.find_spec("cryptography") is None:
        raise NotRunnable("cryptography missing: the proxy's interception and the test CA need "
                          "it (pip install 'stockade[credentials]')")


def make_ca(directory: str, names: list[str]) -> tuple[str, str]:
    """A test CA (its certificate in DIRECTORY/test-ca.pem) and a server certificate and key
    for `names` (DIRECTORY/server.pem); returns (ca file, server file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("stockade test CA"))
          .issuer_name(name("stockade test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    alternatives: list[x509.GeneralName] = []
    for text in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(text)))
        except ValueError:
            alternatives.append(x509.DNSName(text))
    leaf = (x509.CertificateBuilder().subject_name(name(names[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, server_file = (os.path.join(directory, n) for n in ("test-ca.pem", "server.pem"))
    with open(ca_file, "wb") as handle:
        handle.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(server_file, "wb") as handle:
        handle.write(leaf.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    os.chmod(ca_file, 0o644)
    return ca_file, server_file


class _Incomplete(Exception):
    """The connection ended before a whole request."""


class WebServer(Watch):
    """A loopback HTTP server (HTTPS with `certfile`) answering each whole request it reads
    200, or 302 to the URL its query's `to=` names. Afterwards: a placeholder in anything it
    heard is a FAIL, and so is a whole request when it `answers` none (the rows' other
    hosts)."""

    def __init__(self, label: str, certfile: str | None = None, answers: bool = False) -> None:
        self.label, self.answers = label, answers
        self.context: ssl.SSLContext | None = None
        if certfile is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(certfile)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port: int = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.connections = self.answered = 0
        self.placeholders: list[str] = []
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self.lock:
                self.connections += 1
                self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        heard = bytearray()
        try:
            conn.settimeout(3)
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            reader: BinaryIO = conn.makefile("rb")
            method, target = _request(reader, heard)
            reply = f"seen {method} {target}".encode()
            to = target.partition("?to=")[2]
            conn.sendall((f"HTTP/1.1 {'302 Found' if to else '200 OK'}\r\n"
                          + (f"Location: {to}\r\n" if to else "")
                          + f"Content-Length: {len(reply)}\r\nConnection: close\r\n\r\n"
                          ).encode() + reply)
            with self.lock:
                self.answered += 1
        except (OSError, ValueError, _Incomplete):
            pass  # (a connection the proxy cut: what it heard is judged all the same)
        finally:
            conn.close()
            found = [m.decode("latin-1") for m in PLACEHOLDER.findall(bytes(heard))]
            with self.lock:
                self.placeholders += found

    def finish(self) -> Finding:
        self.close()
        if self.placeholders:
            return Finding(False, f"{self.label} RECEIVED a placeholder "
                                  f"({self.placeholders[0]})")
        if self.answered and not self.answers:
            return Finding(False, f"{self.label} was SENT {self.answered} whole request(s)")
        if self.answers:
            return Finding(True, f"{self.label} answered {self.answered} request(s), "
                                 "none with a placeholder")
        cut = f" ({self.connections} connection(s), no whole request)" if self.connections \
            else ""
        return Finding(True, f"{self.label} got no request{cut}")

    def close(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.acceptor.join()
        self.sock.close()
        for thread in self.threads:
            thread.join(5)


def _request(reader: BinaryIO, heard: bytearray) -> tuple[str, str]:
    """Read one request (its head, then its body as the head frames it, chunked first, as a
    lax server reads it); (method, target). `heard` gets every byte read."""
    def line() -> bytes:
        data = reader.readline(65536)
        heard.extend(data[:max(0, _HEARD_MAX - len(heard))])
        if not data.endswith(b"\n"):
            raise _Incomplete
        return data

    def exactly(n: int) -> None:
        data = reader.read(n)
        heard.extend(data[:max(0, _HEARD_MAX - len(heard))])
        if len(data) != n:
            raise _Incomplete

    method, target, _ = line().decode("latin-1").split(" ", 2)
    headers = []
    while (header := line()) not in (b"\r\n", b"\n"):
        name, _, value = header.decode("latin-1").partition(":")
        headers.append((name.strip().lower(), value.strip().lower()))
    if any(n == "transfer-encoding" and "chunked" in v for n, v in headers):
        while size := int(line().split(b";")[0], 16):
            exactly(size + 2)
        while line() not in (b"\r\n", b"\n"):
            pass
    else:
        exactly(int(next((v for n, v in headers if n == "content-length"), "0")))
    return method, target


class StandInNames(Watch):
    """The proxy's stand-in DNS: each name `answers` has (or, for a name under `domain`, the
    address `under`) is what it resolves to. A name asked that carries a placeholder (which a
    real resolver would have sent out) is a FAIL."""

    def __init__(self, answers: dict[str, list[str]], domain: str, under: str) -> None:
        self.answers, self.domain, self.under = answers, domain, under
        self.asked: list[str] = []

    def __call__(self, host: str) -> list[str]:
        self.asked.append(host)
        if host in self.answers:
            return self.answers[host]
        return [self.under] if host.endswith("." + self.domain) else []

    def finish(self) -> Finding:
        carried = [name for name in self.asked if PLACEHOLDER.search(name.encode())]
        if carried:
            return Finding(False, f"the DNS was ASKED {carried[0]}, a name with a placeholder")
        return Finding(True, f"the DNS was asked {len(self.asked)} name(s), none with a "
                             "placeholder")


class Approver(Watch):
    """The caller's approval function (stockade.run(approve=...)) at its most permissive: it
    allows every destination it is asked about for the rest of the run. Never asked, a row
    shows nothing of approvals (ERROR)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, ask: Ask) -> str:
        self.asked.append(f"{ask.host}:{ask.port}"
                          + (f" (credential {', '.join(ask.credentials)})"
                             if ask.credentials else ""))
        return ALLOW_RUN

    def finish(self) -> Finding:
        if not self.asked:
            return Finding(False, "the approval function was never asked", error=True)
        return Finding(True, "the approval function allowed " + "; ".join(
            dict.fromkeys(self.asked)))
