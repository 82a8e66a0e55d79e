"""What the proxy does to the requests it reads: `network.credentials` and `network.http`.

The proxy reads a request when it is plain HTTP, or HTTPS to a host a credential or an HTTP
rule names (intercepted: see authority.py); every other tunnel stays blind. For a request it
reads:

- a credential's placeholder bound for any host but the credential's own (in the host name, the
  request line, a header, or the body) is refused: `credential_exfiltration`. Only the proxy
  turns a placeholder's credential into its secret, and only in the place the policy names, for
  the credential's host, over TLS (plain HTTP to that host is refused,
  `credential_needs_https`: the secret would cross the network readable);
- each HTTP rule whose host matches must allow the method (`method_not_allowed`) and the path
  (`path_not_allowed`; a path whose meaning a server could read differently from its text, with
  dot segments, encoded `/`, `\\` or `.`, `;`, `%25`, `%u`, or control or non-ASCII bytes, is
  refused, `path_ambiguous`);
- framing must be unambiguous (`ambiguous_framing`: both Content-Length and Transfer-Encoding,
  differing lengths, a transfer coding other than chunked, a bare CR or LF in a chunk line or
  a trailer), and exactly the framed body is passed
  on: nothing a client sends after it reaches the server, so no second request rides inside the
  first past the rules.

The secret itself is never logged, shown in a message, or put anywhere but the request's slot.
"""

from __future__ import annotations

import base64
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from stockade.net import http
from stockade.net.rules import Rule, compile_rules
from stockade.net.stream import Closed, Stream
from stockade.policy.model import HttpRule

_BODY_CHUNK = 64 * 1024
_MAX_CHUNK_LINE = 4096
_AMBIGUOUS = re.compile(r"%2f|%5c|%2e|\\", re.IGNORECASE)
# What servers read differently from its text: `;` (path parameters: Tomcat's `..;/`), a
# second round of decoding (`%25`), IIS's `%u`, control and non-ASCII bytes, encoded or not
# (overlong UTF-8, full-width dots, `..%09` trimmed, `%00` cut).
# (no IGNORECASE: case folding would let the non-ASCII range match `s` and `k`)
_UNCLEAR = re.compile(r"[;\x00-\x1f\x7f-\uffff]|%(?:25|[uU]|[01][0-9a-fA-F]|7[fF]"
                      r"|[89a-fA-F][0-9a-fA-F])")


@dataclass(frozen=True)
class Injection:
    """One credential at launch: the secret the proxy puts in requests to `host` (a pattern)
    in place of `placeholder` (see policy.model.Credential for the places)."""

    name: str
    host: str
    placeholder: str
    secret: str = field(repr=False)
    header: str = ""
    prefix: str = ""
    basic_user: str = ""
    query: str = ""


@dataclass(frozen=True)
class Refusal:
    """A request the proxy will not pass on: a stable `reason`, words, the rule that decided."""

    reason: str
    message: str
    rule: str | None = None
    status: int = 403
    # The host name itself carries a credential's placeholder or secret: recorded as WITHHELD
    # (the message names the credential), never as sent (issue 34, D3).
    withhold_host: bool = False


class Inspector:
    """The decisions on read requests, for one launch's credentials and HTTP rules.
    `unchecked` (tests only: the evidence matrix shows that its rows notice) skips the search
    for placeholders and secrets bound elsewhere ("credentials"), the HTTP rules ("http") or
    the refusal of ambiguous framing ("framing")."""

    def __init__(self, injections: Sequence[Injection] = (),
                 limits: Sequence[HttpRule] = ()) -> None:
        self.injections = [(_rule(i.host, "network.credentials"), i) for i in injections]
        self.limits = [(_rule(limit.host, "network.http"), limit) for limit in limits]
        self.unchecked: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        return bool(self.injections or self.limits)

    def intercepts(self, host: str, port: int) -> bool:
        """Whether HTTPS to `host`:`port` is read (a credential or a rule names the host)."""
        return any(_matches(rule, host, port) for rule, _ in (*self.injections, *self.limits))

    def injection(self, host: str, port: int) -> Injection | None:
        return next(iter(self.injections_for(host, port)), None)

    def injections_for(self, host: str, port: int) -> list[Injection]:
        return [i for rule, i in self.injections if _matches(rule, host, port)]

    def foreign(self, host: str, port: int) -> list[Injection]:
        """The credentials whose placeholders must not go to `host`:`port`."""
        if "credentials" in self.unchecked:
            return []
        return [i for rule, i in self.injections if not _matches(rule, host, port)]

    def in_name(self, host: str) -> Refusal | None:
        """A refusal if a host name carries any placeholder (it would reach DNS, and SNI)."""
        lowered = host.lower().encode("latin-1", "replace")
        for _, injection in () if "credentials" in self.unchecked else self.injections:
            for needle, what in _carried(injection):
                if needle in lowered:
                    return replace(_exfiltration(injection, "the host name", what),
                                   withhold_host=True)
        return None

    def exfiltration(self, text: str, host: str, port: int) -> Refusal | None:
        """A refusal if `text` carries the placeholder of a credential of another host, or
        its secret (which a response of its own host let through re-encoded, say)."""
        lowered = text.lower().encode("latin-1", "replace")
        for injection in self.foreign(host, port):
            for needle, what in _carried(injection):
                if needle in lowered:
                    return _exfiltration(injection, "the request", what)
        return None

    def judge(self, request: http.Request, host: str, port: int, *, tls: bool) -> Refusal | None:
        """The refusal of a read request's head to `host`:`port`, or None to pass it on."""
        head = "\n".join([request.method, request.path,
                          *(f"{name}: {value}" for name, value in request.headers)])
        refusal = self.exfiltration(head, host, port)
        if refusal is not None:
            return refusal
        injection = self.injection(host, port)
        if injection is not None and not tls:
            return Refusal("credential_needs_https", f"credential {injection.name!r} is sent "
                           "only over HTTPS (plain HTTP would carry it readable)",
                           injection.host)
        for rule, limit in () if "http" in self.unchecked else self.limits:
            if _matches(rule, host, port):
                refusal = _limited(limit, request)
                if refusal is not None:
                    return refusal
        return None

    def body_scanner(self, host: str, port: int) -> Scanner:
        return Scanner(self.foreign(host, port))

    def withholder(self, host: str, port: int) -> Withholder:
        """What keeps the secret of `host`'s credential out of its responses."""
        injection = self.injection(host, port)
        return Withholder(injection)

    def forward_head(self, request: http.Request, host: str, port: int) -> bytes:
        """The head sent upstream (origin form, Host set, hop-by-hop headers dropped), with
        the credential of `host`, if any, in its place."""
        injection = self.injection(host, port)
        if injection is None:
            return http.forward_head(request, host)
        path = request.path
        # (identity only: a compressed response would hide an echoed secret from Withholder)
        headers = [(n, v) for n, v in request.headers if n.lower() != "accept-encoding"]
        if injection.query:
            base, _, query = path.partition("?")
            kept = [p for p in query.split("&") if p and p.partition("=")[0] != injection.query]
            kept.append(f"{injection.query}={urllib.parse.quote(injection.secret, safe='')}")
            path = f"{base}?{'&'.join(kept)}"
        else:
            name = injection.header or "Authorization"
            value = injection.prefix + injection.secret if injection.header else "Basic " + \
                base64.b64encode(f"{injection.basic_user}:{injection.secret}".encode()).decode()
            headers = [(n, v) for n, v in headers if n.lower() != name.lower()]
            headers.append((name, value))
        return http.forward_head(http.Request(request.method, request.host, request.port,
                                              request.version, path, tuple(headers)), host)


def _rule(pattern: str, key: str) -> Rule:
    return compile_rules([pattern], key)[0]


def _matches(rule: Rule, host: str, port: int) -> bool:
    return rule.matches_host(host) and rule.port in (None, port)


def _exfiltration(injection: Injection, where: str, what: str = "placeholder") -> Refusal:
    return Refusal("credential_exfiltration", f"{where} carries the {what} of credential "
                   f"{injection.name!r} to a host other than {injection.host} (an exfiltration "
                   "attempt)", injection.host)


def _carried(injection: Injection) -> list[tuple[bytes, str]]:
    """What of `injection` no request to another host may carry (lowered), and its name."""
    return [(injection.placeholder.lower().encode(), "placeholder"),
            *((form, "secret") for form in secret_forms(injection))]


def _limited(limit: HttpRule, request: http.Request) -> Refusal | None:
    if limit.methods and request.method not in limit.methods:
        return Refusal("method_not_allowed", f"method {request.method} is not in "
                       f"network.http methods {list(limit.methods)} for {limit.host}",
                       limit.host)
    if not limit.paths:
        return None
    path = request.path.partition("?")[0]
    segments = urllib.parse.unquote(path).split("/")
    if _AMBIGUOUS.search(path) or any(s in (".", "..") for s in segments):
        return Refusal("path_ambiguous", "the path has dot segments or encoded separators, "
                       f"which network.http paths for {limit.host} cannot judge", limit.host)
    if _UNCLEAR.search(path):
        return Refusal("path_ambiguous", "the path has `;`, `%25`, `%u`, or control or "
                       "non-ASCII bytes (encoded or not), which servers may read as another "
                       f"path: network.http paths for {limit.host} cannot judge it", limit.host)
    if not any(path.startswith(prefix) for prefix in limit.paths):
        return Refusal("path_not_allowed", f"the path is not under network.http paths "
                       f"{list(limit.paths)} for {limit.host}", limit.host)
    return None


def framing(request: http.Request, *, lenient: bool = False) -> int | None:
    """The body's length (0: none), or None when chunked; Refusal (raised as FramingError)
    when the head frames it ambiguously. `lenient` (tests only: the `proxy_framing` switch)
    reads an ambiguous head as a lax server would: chunked if any coding is, else by the first
    length."""
    lengths = {value.strip() for name, value in request.headers
               if name.lower() == "content-length"}
    codings = [value.strip().lower() for name, value in request.headers
               if name.lower() == "transfer-encoding"]
    if lenient and codings:
        return None
    if lenient and lengths:
        lengths = {next(value.strip() for name, value in request.headers
                        if name.lower() == "content-length")}
    if codings and lengths:
        raise FramingError("both Content-Length and Transfer-Encoding")
    if codings:
        if codings != ["chunked"]:
            raise FramingError("a transfer coding other than chunked")
        return None
    if len(lengths) > 1:
        raise FramingError("differing Content-Length values")
    if not lengths:
        return 0
    (text,) = lengths
    if not text.isdigit() or not text.isascii() or len(text) > 18:
        raise FramingError("an invalid Content-Length")
    return int(text)


class FramingError(Exception):
    """A request whose end cannot be told for sure: refused, `ambiguous_framing`."""

    def refusal(self) -> Refusal:
        return Refusal("ambiguous_framing", f"the request has {self}: its end is ambiguous",
                       status=400)


class Scanner:
    """Finds the placeholders and secrets of `injections` in a body passed in pieces (one
    split between two pieces, or two chunks, is found)."""

    def __init__(self, injections: Iterable[Injection]) -> None:
        self.needles = [(needle, what, i) for i in injections for needle, what in _carried(i)]
        self.keep = max((len(n) for n, _, _ in self.needles), default=1) - 1
        self.tail = b""

    def feed(self, data: bytes) -> Refusal | None:
        """A refusal if the body so far, joined as the server reads it, carries a needle."""
        if not self.needles:
            return None
        window = self.tail + data.lower()
        found = self.alone(window)
        self.tail = window[-self.keep:] if self.keep else b""
        return found

    def alone(self, data: bytes) -> Refusal | None:
        """A refusal if `data` (a chunk line, a trailer: a server reads each apart from the
        body) carries a needle; the body's join is left as it was."""
        lowered = data.lower()
        for needle, what, injection in self.needles:
            if needle in lowered:
                return _exfiltration(injection, "the request's body", what)
        return None


class Withholder:
    """Passes a credential host's response on, holding back each piece's last bytes until the
    next shows they do not begin the secret: a response that carries the secret in a form
    `secret_forms` names is cut before it. The body is judged decoded (see
    `forward_response`), so a server's chunk framing cannot split the secret past it."""

    def __init__(self, injection: Injection | None) -> None:
        self.injection = injection
        self.needles = [] if injection is None else secret_forms(injection)
        self.keep = max((len(n) for n in self.needles), default=1) - 1
        self.held = b""

    def feed(self, data: bytes) -> bytes | None:
        """What may go to the client now; None if the secret is in the response."""
        if not self.needles:
            return data
        window = self.held + data
        lowered = window.lower()
        if any(needle in lowered for needle in self.needles):
            return None
        cut = max(0, len(window) - self.keep)
        self.held = window[cut:]
        return window[:cut]

    def flush(self) -> bytes:
        """The bytes held back, released (at the end of a part the client reads apart)."""
        held, self.held = self.held, b""
        return held

    def refusal(self) -> Refusal:
        assert self.injection is not None
        return Refusal("credential_reflected", f"the response of {self.injection.host} "
                       f"carried the secret of credential {self.injection.name!r}: cut before "
                       "it", self.injection.host)

    def unreadable(self, what: str) -> Refusal:
        assert self.injection is not None
        return Refusal("credential_response_unreadable", f"the response of "
                       f"{self.injection.host} (credential {self.injection.name!r}) is {what}, "
                       "which could carry its secret past the check: refused",
                       self.injection.host, status=502)


def secret_forms(injection: Injection) -> list[bytes]:
    """The lowered forms of `injection`'s secret looked for: as is, percent-encoded once and
    twice (a `?next=` login redirect quotes the path it got once more: issue 34, R1), hex, and
    base64 and base64url (of `user:secret` as basic auth sends it, and of the secret at each of
    the three alignments it can have inside longer base64 text; unpadded, as base64url often
    is: R2)."""
    secret = injection.secret.encode()
    quoted = urllib.parse.quote(secret, safe="")
    encoded = {base64.b64encode(injection.basic_user.encode() + b":" + secret).rstrip(b"=")}
    for shift in range(3):
        text = base64.b64encode(b"\0" * shift + secret)
        tail = 4 if (shift + len(secret)) % 3 else 0  # (depends on the bytes after it)
        aligned = text[4 if shift else 0:len(text) - tail]
        if len(aligned) >= _MIN_ALIGNED:
            encoded.add(aligned)
    forms = {secret, quoted.encode(), urllib.parse.quote(quoted, safe="").encode(),
             secret.hex().encode(), *encoded,
             *(form.translate(_URLSAFE) for form in encoded)}
    return sorted({form.lower() for form in forms}, key=len)


WITHHELD = "(withheld)"  # (the host recorded for a name that carries a credential)
_URLSAFE = bytes.maketrans(b"+/", b"-_")  # (base64 to base64url)
_MIN_ALIGNED = 8


def forward_response(stream: Stream, send: Callable[[bytes], None], withholder: Withholder,
                     method: str, limit: int, timeout: float) -> Refusal | None:
    """Pass a credential host's response from `stream` to `send`, judged as a client reads it:
    the head, then the body de-chunked (and sent re-chunked, without the server's extensions
    and trailers), so no framing splits the secret past `withholder`. A body the proxy could
    not read as the client will (compressed, a transfer coding other than chunked, ranges) is
    refused; so is a switch of protocols."""
    while True:
        stream.deadline = time.monotonic() + timeout
        head = stream.read_head(limit)
        lines = head[:-4].decode("latin-1").split("\r\n")
        status = lines[0][9:12]
        headers = [(n.strip().lower(), v.strip().lower())
                   for n, _, v in (line.partition(":") for line in lines[1:])]
        refusal = _unreadable(status, headers, withholder)
        if refusal is None and any(line[:1] in (" ", "\t") for line in lines[1:]):
            refusal = withholder.unreadable("a head with folded lines (a coding could hide in "
                                            "one)")
        if refusal is not None:
            return refusal
        safe = withholder.feed(head)
        if safe is None:
            return withholder.refusal()
        send(safe + withholder.flush())
        if not status.startswith("1"):
            break
    if method == "HEAD" or status in ("204", "304"):
        return None
    if ("transfer-encoding", "chunked") not in headers:
        while True:
            try:
                data = stream.read_some(_BODY_CHUNK, timeout)
            except Closed:
                send(withholder.flush())
                return None
            safe = withholder.feed(data)
            if safe is None:
                return withholder.refusal()
            send(safe)
    while True:
        line = stream.read_line(_MAX_CHUNK_LINE, timeout)
        size = _chunk_size(line)
        if size is None:
            return FramingError("a malformed chunk size in the response").refusal()
        if size == 0:
            break
        while size > 0:
            data = stream.read_some(min(size, _BODY_CHUNK), timeout)
            size -= len(data)
            safe = withholder.feed(data)
            if safe is None:
                return withholder.refusal()
            if safe:
                send(b"%x\r\n%b\r\n" % (len(safe), safe))
        if stream.read_exactly(2, timeout) != b"\r\n":
            return FramingError("a response chunk not ended by CRLF").refusal()
    held = withholder.flush()
    send((b"%x\r\n%b\r\n" % (len(held), held) if held else b"") + b"0\r\n\r\n")
    return None


def _unreadable(status: str, headers: list[tuple[str, str]],
                withholder: Withholder) -> Refusal | None:
    """Why a response's body could hide the secret from a scan of its decoded bytes."""
    codings = [v for n, v in headers if n == "transfer-encoding"]
    if status == "101":
        return withholder.unreadable("a switch of protocols")
    if status == "206" or any(n == "content-type" and v.startswith("multipart/byteranges")
                              for n, v in headers):
        return withholder.unreadable("a range of a body (206, multipart/byteranges)")
    if any(n == "content-encoding" and v not in ("", "identity") for n, v in headers):
        return withholder.unreadable("compressed (Content-Encoding)")
    if codings and codings != ["chunked"]:
        return withholder.unreadable("in a transfer coding other than chunked")
    return None


def _chunk_size(line: bytes) -> int | None:
    """A chunk line's size, or None if the line is malformed."""
    size_text = line.partition(b";")[0].strip()
    if not size_text or len(size_text) > 16 or any(c not in b"0123456789abcdefABCDEF"
                                                   for c in size_text):
        return None
    return int(size_text, 16)


def forward_body(stream: Stream, length: int | None, send: Callable[[bytes], None],
                 scanner: Scanner, timeout: float) -> Refusal | None:
    """Pass exactly the framed body from `stream` to `send`, scanning it; stop at the first
    refusal (what went before it is harmless: a placeholder is no secret)."""
    if length is not None:
        return _copy(stream, length, send, scanner, timeout)
    while True:
        line = stream.read_line(_MAX_CHUNK_LINE, timeout)
        size = _chunk_size(line)
        if size is None:
            return FramingError("a malformed chunk size").refusal()
        if _bare_break(line):
            return FramingError("a bare CR or LF in a chunk line").refusal()
        # (its extension goes on too, read apart: fed to the body's join, the line would
        # split a placeholder the server joins from two chunks)
        refusal = scanner.alone(line)
        if refusal is not None:
            return refusal
        send(line)
        if size == 0:
            while (trailer := stream.read_line(_MAX_CHUNK_LINE, timeout)) != b"\r\n":
                if _bare_break(trailer):
                    return FramingError("a bare CR or LF in a trailer").refusal()
                refusal = scanner.alone(trailer)
                if refusal is not None:
                    return refusal
                send(trailer)
            send(b"\r\n")
            return None
        refusal = _copy(stream, size, send, scanner, timeout)
        if refusal is not None:
            return refusal
        if stream.read_exactly(2, timeout) != b"\r\n":
            return FramingError("a chunk not ended by CRLF").refusal()
        send(b"\r\n")


def _bare_break(line: bytes) -> bool:
    """Whether a CRLF-ended line holds a CR or LF of its own: a server that ends lines at a
    bare LF would read the rest as chunk data the proxy took for an extension."""
    return b"\r" in line[:-2] or b"\n" in line[:-2]


def _copy(stream: Stream, length: int, send: Callable[[bytes], None], scanner: Scanner,
          timeout: float) -> Refusal | None:
    while length > 0:
        data = stream.read_some(min(length, _BODY_CHUNK), timeout)
        refusal = scanner.feed(data)
        if refusal is not None:
            return refusal
        send(data)
        length -= len(data)
    return None
