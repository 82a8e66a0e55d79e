"""The per-launch certificate authority that lets the proxy read HTTPS to the hosts a policy
names in `network.credentials` or `network.http`, and nothing else.

`cryptography` makes the keys and certificates (the standard library cannot make either);
the standard `ssl` module terminates and originates the TLS (it is what every Python already
has, and OpenSSL under it is the library the sandbox's clients verify with too). The CA's key
exists only in this process's memory, never in a file; the sandbox gets its certificate, in
`bundle_dir`, a fresh directory holding `ca.pem` and `bundle.pem` (the host's trusted CAs
and this one). Each leaf's key reaches `ssl` through a memfd (`load_cert_chain` takes only
paths), named by this process's /proc/self/fd, which no sandbox can see.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
import tempfile
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from stockade.errors import UnenforceableError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
    from cryptography.x509 import Certificate

CA_FILE = "ca.pem"
BUNDLE_FILE = "bundle.pem"
# Where a sandboxed client looks for its trusted CAs: OpenSSL (Python, curl builds on it),
# requests, curl, git, Node (which adds these to its own: it gets the CA alone).
BUNDLE_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
CA_VARIABLES = ("NODE_EXTRA_CA_CERTS",)
_LIFETIME = datetime.timedelta(days=1)  # (a launch outliving it meets an expired leaf)
_SKEW = datetime.timedelta(minutes=5)


def _crypto():  # noqa: ANN202 - the modules, loaded only by launches that intercept
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise UnenforceableError(
            "network.credentials", "network.credentials and network.http need the "
            "`cryptography` package for the per-launch CA that reads HTTPS to their hosts: "
            "pip install 'stockade[credentials]'") from None
    return x509, hashes, serialization, ec, NameOID


def system_bundle() -> str:
    """The host's trusted CAs as PEM text ("" if the host has no bundle file)."""
    paths = ssl.get_default_verify_paths()
    for name in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt",
                 "/etc/pki/tls/certs/ca-bundle.crt"):
        if name and os.path.isfile(name):
            with open(name, encoding="ascii", errors="replace") as handle:
                return handle.read()
    return ""


LEAVES = 64  # leaf contexts kept (the hosts used last)


class Authority:
    """A CA made for one launch: `issue(host)` gives a server-side SSLContext for `host`."""

    def __init__(self, label: str) -> None:
        x509, hashes, serialization, ec, NameOID = _crypto()
        self._key: EllipticCurvePrivateKey = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                             f"Stockade launch CA {label}"[:64])])
        now = datetime.datetime.now(datetime.UTC)
        self._name = name
        self.certificate: Certificate = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW).not_valid_after(now + _LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256()))
        self.pem = self.certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._lock = threading.Lock()
        self.bundle_dir = ""

    def write_bundle(self, parent: str | None = None) -> str:
        """Write `ca.pem` and `bundle.pem` (the host's CAs and this one) into a new directory
        readable by the sandbox (they are public); returns it."""
        directory = tempfile.mkdtemp(prefix="stockade-ca-", dir=parent)
        os.chmod(directory, 0o755)
        for name, text in ((CA_FILE, self.pem),
                           (BUNDLE_FILE, system_bundle().rstrip("\n") + "\n" + self.pem)):
            fd = os.open(os.path.join(directory, name),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(text)
        self.bundle_dir = directory
        return directory

    def environment(self) -> dict[str, str]:
        """The variables that make a sandboxed client trust this CA (after write_bundle)."""
        bundle = os.path.join(self.bundle_dir, BUNDLE_FILE)
        ca = os.path.join(self.bundle_dir, CA_FILE)
        return {**dict.fromkeys(BUNDLE_VARIABLES, bundle), **dict.fromkeys(CA_VARIABLES, ca)}

    def close(self) -> None:
        if self.bundle_dir:
            shutil.rmtree(self.bundle_dir, ignore_errors=True)

    def issue(self, host: str) -> ssl.SSLContext:
        """A server context presenting a leaf for `host` (a name or an address), kept for the
        `LEAVES` hosts used last (a wildcard credential host would otherwise let the sandbox
        make the proxy keep one per name it invents). Only HTTP/1.1 is offered by ALPN: the
        proxy reads nothing else."""
        with self._lock:
            context = self._contexts.pop(host, None)
            if context is None:
                context = self._leaf_context(host)
            self._contexts[host] = context
            while len(self._contexts) > LEAVES:
                self._contexts.popitem(last=False)
            return context

    def _leaf_context(self, host: str) -> ssl.SSLContext:
        x509, hashes, serialization, ec, NameOID = _crypto()
        key = ec.generate_private_key(ec.SECP256R1())
        literal = host[1:-1] if host.startswith("[") else host
        try:
            alternative: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(literal))
        except ValueError:
            alternative = x509.DNSName(host)
        now = datetime.datetime.now(datetime.UTC)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, literal[:64])]))
            .issuer_name(self._name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW).not_valid_after(now + _LIFETIME)
            .add_extension(x509.SubjectAlternativeName([alternative]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256()))
        chain = leaf.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        fd = os.memfd_create("stockade-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, chain)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return context


def upstream_context(cafile: str | None = None) -> ssl.SSLContext:
    """How the proxy verifies the real host: the system's trust store (or `cafile`, for
    tests), the host name checked, HTTP/1.1 only."""
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    return context
