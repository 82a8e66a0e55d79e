"""A small internet of the test's own, and a `stockade run` inside it (tests/test_network_any.py).

Run as a program: `python networld.py SPEC` (SPEC: JSON). It moves into network and mount
namespaces of its own (rootless: a user namespace first, where it is root), so nothing it does
reaches this machine's network, and builds:

- the "host": this process's namespace, with 198.51.100.2/24 on a veth (its own address), a
  default route via 198.51.100.1, servers on its loopback and its own address (what the
  sandbox must not reach), a resolver on its loopback (127.0.0.53, as systemd-resolved's
  stub), and /etc/resolv.conf naming the internet's resolver (or the spec's `resolv`, with
  `resolv_link` a symbolic link into a directory no sandbox sees, as systemd-resolved makes
  it: /etc is then a copy of the host's);
- the "internet", a namespace behind the veth: the router 198.51.100.1, a public host
  203.0.113.10, a resolver 203.0.113.53 (public.test, metadata.test), a fake metadata service
  169.254.169.254, a link-local host on pasta's DNS forward address (169.254.1.1: what
  leaves for it is not pasta's relay) and a private host 10.9.9.9 — every address served by
  the same servers,
  which record the address each connection or datagram reached — and "another machine",
  203.0.113.66, which on request (a line `ADDRESS PORT` to its TCP port KNOCK) knocks
  unsolicited at ADDRESS:PORT: a UDP datagram from itself and one from the public host (port
  9, not its echo's), and a TCP connection, and answers what each did (from OTHER6 and
  PUBLIC6 when ADDRESS is IPv6);
- and the same in IPv6 (the `*6` names): the host has HOST6/64 on the veth with a default route
  via ROUTER6 (so pasta gives the sandbox IPv6 too), a second address of its own (HOST_LO6, on
  its loopback: off the veth, reached only by routing) and servers on ::1, HOST6 and HOST_LO6;
  the internet answers on a documentation host, a global-looking one, a ULA host, the AWS
  metadata address, a site-local one, NAT64 (64:ff9b::/96, and the local-use 64:ff9b:1::/48)
  and 6to4 forms of the private and the public IPv4 hosts, an IPv4-compatible and an
  IPv4-translated form of the private host, a multicast group and the router's link-local
  fe80::1 (the sandbox reaches it with its interface as scope); OTHER6 knocks as OTHER does.
  The resolver answers AAAA queries for NAMES6.

Then it runs the spec's `stockade run` (rootless: as the caller's uid, in a user namespace
nested in the first, so Stockade has no privilege at all) and prints JSON: its exit code and
output, and what each server saw.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
HOST, ROUTER = "198.51.100.2", "198.51.100.1"
PUBLIC, RESOLVER, METADATA, PRIVATE = "203.0.113.10", "203.0.113.53", "169.254.169.254", \
    "10.9.9.9"
STUB = "127.0.0.53"
FORWARD = "169.254.1.1"
OTHER = "203.0.113.66"
PORT = 80  # every TCP server; UDP echo on 7, DNS on 53, bulk transfers on BULK
BULK = 19
KNOCK = 99
REFLECT = 3478
NAMES = {"public.test": PUBLIC, "metadata.test": METADATA}
HOST6, ROUTER6, HOST_LO6 = "2001:db8:100::2", "2001:db8:100::1", "2001:db8:7::2"
ROUTER_LINK6 = "fe80::1"
PUBLIC6, GLOBAL6, OTHER6 = "2001:db8:203::10", "2a00:f00::10", "2001:db8:203::66"
ULA6, METADATA6, SITE6 = "fd00:9::9", "fd00:ec2::254", "fec0::9"
GROUP6 = "ff0e::7"  # a global-scope multicast group the internet's echo joins
NAT64_PRIVATE, NAT64_PUBLIC = "64:ff9b::a09:909", "64:ff9b::cb00:710a"
LOCAL_NAT64_PRIVATE = "64:ff9b:1::a09:909"  # RFC 8215's local-use prefix
SIX_TO_FOUR_PRIVATE, SIX_TO_FOUR_PUBLIC = "2002:a09:909::1", "2002:cb00:710a::1"
COMPATIBLE_PRIVATE, TRANSLATED_PRIVATE = "::a09:909", "::ffff:0:a09:909"
INTERNET6 = (PUBLIC6, GLOBAL6, ULA6, METADATA6, SITE6, NAT64_PRIVATE, NAT64_PUBLIC,
             LOCAL_NAT64_PRIVATE, SIX_TO_FOUR_PRIVATE, SIX_TO_FOUR_PUBLIC, COMPATIBLE_PRIVATE,
             TRANSLATED_PRIVATE)
NAMES6 = {"public6.test": PUBLIC6, "global6.test": GLOBAL6, "ula.test": ULA6,
          "metadata6.test": METADATA6, "nat64.test": NAT64_PRIVATE}
_libc = ctypes.CDLL(None, use_errno=True)


def unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare: {os.strerror(errno)}")


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class Seen:
    """What the servers saw: (server, the address reached, protocol)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def add(self, server: str, reached: str, protocol: str) -> None:
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps([server, reached, protocol]) + "\n")

    def read(self) -> list:
        try:
            with open(self.path) as f:
                return [json.loads(line) for line in f]
        except FileNotFoundError:
            return []


def tcp_server(name: str, address: str, seen: Seen, port: int = PORT) -> None:
    listener = socket.socket(family(address))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if ":" in address:  # (IPv6 alone: the IPv4 listener on the same port is another)
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    bind(listener, (address, port))
    listener.listen(64)

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            reached = str(ipaddress.ip_address(conn.getsockname()[0]))  # (::a09:909 as such)
            seen.add(name, reached, "tcp")
            conn.sendall(f"{name} {reached}\n".encode())
            conn.close()
    threading.Thread(target=serve, daemon=True).start()


def family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def bulk_server() -> None:
    """On port BULK: read a size (8 bytes), send that many bytes, close (bench/usernet.py)."""
    listener = socket.create_server(("0.0.0.0", BULK), backlog=64)
    chunk = b"x" * (1 << 20)

    def serve(conn: socket.socket) -> None:
        with conn:
            left = int.from_bytes(conn.recv(8), "big")
            while left > 0:
                left -= conn.send(chunk[:min(left, len(chunk))])

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()


def dns_server(name: str, address: str, seen: Seen) -> None:
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind((address, 53))

    def serve() -> None:
        while True:
            query, peer = dns.recvfrom(2048)
            seen.add(name, address, "dns")
            dns.sendto(dns_answer(query), peer)
    threading.Thread(target=serve, daemon=True).start()


def udp_servers(seen: Seen) -> None:
    """An echo on port 7 of each of the internet's addresses, the resolver, and on the
    public hosts' port REFLECT a reflector that answers the address and port a datagram came
    from (as a STUN server does; unrecorded)."""
    def serve_echo(echo: socket.socket, address: str) -> None:
        while True:
            data, peer = echo.recvfrom(2048)
            seen.add("internet", address, "udp")
            echo.sendto(data, peer)

    def serve_reflector(reflector: socket.socket) -> None:
        while True:
            _, peer = reflector.recvfrom(2048)
            reflector.sendto(f"{peer[0]}:{peer[1]}".encode(), peer)

    for address in (ROUTER, PUBLIC, METADATA, PRIVATE, ROUTER6, *INTERNET6, GROUP6):
        echo = socket.socket(family(address), socket.SOCK_DGRAM)
        bind(echo, (address, 7))
        if address == GROUP6:
            echo.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, socket.inet_pton(
                socket.AF_INET6, GROUP6) + socket.if_nametoindex("inet").to_bytes(4, "little"))
        threading.Thread(target=serve_echo, args=(echo, address), daemon=True).start()
    link = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    bind(link, (ROUTER_LINK6, 7, 0, socket.if_nametoindex("inet")))
    threading.Thread(target=serve_echo, args=(link, ROUTER_LINK6), daemon=True).start()
    for address in (PUBLIC, PUBLIC6):
        reflector = socket.socket(family(address), socket.SOCK_DGRAM)
        bind(reflector, (address, REFLECT))
        threading.Thread(target=serve_reflector, args=(reflector,), daemon=True).start()
    dns_server("resolver", RESOLVER, seen)


def bind(sock: socket.socket, address: tuple) -> None:
    """`sock` bound to `address`, once the kernel lets it (an IPv6 address on a link that has
    just come up is unusable for a moment)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return sock.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def knocker() -> None:
    """Another machine's knocks at whatever address and port it is asked (see the docstring)."""

    def knock(line: str) -> dict:
        address, port = line.split()
        target = (address, int(port))
        done = {}
        other, public = (OTHER6, PUBLIC6) if ":" in address else (OTHER, PUBLIC)
        for source in ((other, 0), (public, 9)):
            with socket.socket(family(address), socket.SOCK_DGRAM) as udp:
                udp.bind(source)
                udp.sendto(f"unsolicited from {source[0]}:{source[1]}".encode(), target)
            done[f"udp from {source[0]}:{source[1]}"] = "sent"
        try:
            with socket.create_connection(target, timeout=2, source_address=(other, 0)):
                done["tcp"] = "connected"
        except OSError as exc:
            done["tcp"] = f"error {exc.errno}"
        return done

    def serve(listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                line = conn.makefile().readline()
                conn.sendall(json.dumps(knock(line)).encode() + b"\n")
    for address in (OTHER, OTHER6):
        listener = socket.socket(family(address))
        bind(listener, (address, KNOCK))
        listener.listen(8)
        threading.Thread(target=serve, args=(listener,), daemon=True).start()


def dns_answer(query: bytes) -> bytes:
    """The answer to an A query for a name in NAMES, or an AAAA query for one in NAMES6
    (no answer for the other type; NXDOMAIN for a name in neither)."""
    labels, at = [], 12
    while query[at]:
        labels.append(query[at + 1:at + 1 + query[at]].decode())
        at += 1 + query[at]
    question = query[12:at + 5]
    name = ".".join(labels).lower()
    qtype = int.from_bytes(query[at + 1:at + 3], "big")
    known = name in NAMES or name in NAMES6
    address = NAMES.get(name) if qtype == 1 else NAMES6.get(name) if qtype == 28 else None
    flags = 0x8180 if known else 0x8183
    answers = 1 if address else 0
    head = query[:2] + flags.to_bytes(2, "big") + b"\0\1" + answers.to_bytes(2, "big") + \
        b"\0\0\0\0"
    body = question
    if answers:
        packed = socket.inet_pton(family(address), address)
        body += b"\xc0\x0c" + qtype.to_bytes(2, "big") + b"\0\1\0\0\0\x3c" + \
            len(packed).to_bytes(2, "big") + packed
    return head + body


def internet(ready_w: int, linked_r: int, seen: Seen) -> None:
    """The internet's process: its own namespace, configured once the veth is in it."""
    unshare(CLONE_NEWNET)
    no_dad()
    os.write(ready_w, b"1")
    os.read(linked_r, 1)
    ip("link", "set", "lo", "up")
    ip("addr", "add", f"{ROUTER}/24", "dev", "inet")
    ip("addr", "add", f"{ROUTER6}/64", "dev", "inet", "nodad")
    ip("addr", "add", f"{ROUTER_LINK6}/64", "dev", "inet", "nodad")
    ip("link", "set", "inet", "up")
    for address in (PUBLIC, RESOLVER, METADATA, PRIVATE, FORWARD, OTHER):
        ip("addr", "add", f"{address}/32", "dev", "lo")
    for address in (*INTERNET6, OTHER6):
        ip("addr", "add", f"{address}/128", "dev", "lo")
    ip("route", "add", f"{HOST_LO6}/128", "via", HOST6)  # (the host's second address)
    knocker()
    tcp_server("internet", "0.0.0.0", seen)
    tcp_server("internet", "::", seen)
    bulk_server()
    udp_servers(seen)
    os.write(ready_w, b"2")
    while True:
        time.sleep(3600)


def no_dad() -> None:
    """IPv6 addresses usable at once (no duplicate detection: nothing else is on these links)."""
    for scope in ("all", "default"):
        write(f"/proc/sys/net/ipv6/conf/{scope}/accept_dad", "0")


def enter(uid: int, gid: int) -> None:
    """This process into namespaces of its own: rootless, a user namespace where it is root."""
    if uid == 0:
        unshare(CLONE_NEWNET | CLONE_NEWNS)
    else:
        unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS)
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"0 {uid} 1")
        write("/proc/self/gid_map", f"0 {gid} 1")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)


def build(seen: Seen, workdir: str, spec: dict) -> int:
    """The world around this process; the internet's pid."""
    ready_r, ready_w = os.pipe()
    linked_r, linked_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            internet(ready_w, linked_r, seen)
        except BaseException:  # noqa: BLE001 - reported, and the parent sees the pipe close
            import traceback
            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(ready_w)
    os.close(linked_r)
    if os.read(ready_r, 1) != b"1":
        raise OSError("the internet did not start")
    no_dad()
    ip("link", "set", "lo", "up")
    ip("link", "add", "wan", "type", "veth", "peer", "name", "inet", "netns", str(child))
    ip("addr", "add", f"{HOST}/24", "dev", "wan")
    ip("addr", "add", f"{HOST6}/64", "dev", "wan", "nodad")
    ip("addr", "add", f"{HOST_LO6}/128", "dev", "lo")
    ip("link", "set", "wan", "up")
    os.write(linked_w, b"1")
    if os.read(ready_r, 1) != b"2":
        raise OSError("the internet could not be configured")
    ip("route", "add", "default", "via", ROUTER)
    ip("-6", "route", "add", "default", "via", ROUTER6, "dev", "wan")
    tcp_server("host-loopback", "127.0.0.1", seen)
    tcp_server("host-address", HOST, seen)
    tcp_server("host-loopback", "::1", seen)
    tcp_server("host-address", HOST6, seen)
    tcp_server("host-address", HOST_LO6, seen)
    dns_server("host-resolver", STUB, seen)
    tcp_server("host-resolver", STUB, seen, port=53)
    resolv = os.path.join(workdir, "resolv.conf")
    write(resolv, spec.get("resolv", f"nameserver {RESOLVER}\n"))
    os.chmod(resolv, 0o644)
    if spec.get("resolv_link"):
        etc = os.path.join(workdir, "etc")
        try:
            shutil.copytree("/etc", etc, symlinks=True, copy_function=_copy_readable)
        except shutil.Error:
            pass  # (directories the caller may not list: the copy leaves them out)
        if os.path.lexists(os.path.join(etc, "resolv.conf")):
            os.unlink(os.path.join(etc, "resolv.conf"))
        os.symlink(resolv, os.path.join(etc, "resolv.conf"))
        subprocess.run(["mount", "--bind", etc, "/etc"], check=True)
    else:
        subprocess.run(["mount", "--bind", resolv, "/etc/resolv.conf"], check=True)
    return child


def _copy_readable(source: str, target: str) -> None:
    try:
        shutil.copy2(source, target)
    except OSError:
        pass  # (what the caller may not read: the copy leaves it out)


def run_as(uid: int, gid: int, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`argv` as `uid` in a user namespace nested in this one (rootless), or as is (root)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()

    def nested() -> None:  # (in the child, before exec: a user namespace, mapped by us)
        unshare(CLONE_NEWUSER)
        os.write(ready_w, str(os.getpid()).encode())
        os.read(go_r, 1)

    def map_child() -> None:  # (a thread: Popen returns only once the child has exec'd)
        try:
            pid = int(os.read(ready_r, 32) or b"0")
            if pid:
                write(f"/proc/{pid}/uid_map", f"{uid} 0 1")
                write(f"/proc/{pid}/gid_map", f"{gid} 0 1")
        finally:
            os.write(go_w, b"1")
    mapper = threading.Thread(target=map_child, daemon=True)
    if uid != 0:
        mapper.start()
    try:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, preexec_fn=None if uid == 0 else nested)  # noqa: PLW1509
    finally:
        for fd in (ready_w, go_r):
            os.close(fd)
    if uid != 0:
        mapper.join()
    for fd in (ready_r, go_w):
        os.close(fd)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def main() -> None:
    spec = json.loads(sys.argv[1])
    uid, gid = os.getuid(), os.getgid()
    workdir = tempfile.mkdtemp(prefix="networld-")
    os.chmod(workdir, 0o755)
    enter(uid, gid)
    seen = Seen(os.path.join(workdir, "seen"))
    child = build(seen, workdir, spec)
    os.environ["NETWORLD_SEEN"] = seen.path  # (a spec's argv may wait on what servers saw)
    try:
        done = run_as(uid, gid, spec["argv"], spec.get("timeout", 60))
        print(json.dumps({"returncode": done.returncode, "stdout": done.stdout,
                          "stderr": done.stderr, "seen": seen.read()}))
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
