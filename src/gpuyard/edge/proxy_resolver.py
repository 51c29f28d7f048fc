"""The proxy's resolver: a small DNS server that tells Caddy, per request, where a
cluster port is. It runs in a process of its own (``python -m
gpuyard.edge.proxy_resolver``), beside Caddy, started and watched by the proxy-sync
duty (:class:`ResolverProcess`); it reads the route table that duty writes
(``edge/route_table.py``) and nothing else, so user traffic never waits on the API
process or the database.

Caddy's configuration names no cluster (``edge/caddy_config.py``): it looks up, with
each request's host label ``{cluster_id}-{port}``, these names of the resolver's zone
``Z`` (docs/decisions.md "The proxy routes per request"):

- ``SRV {label}.port.Z``: the port's upstream port, for every route of the table
  (who may pass was decided before, by the table's marker files);
- ``A``/``AAAA {label}.addr.Z``: the upstream's address, the SRV answer's target (an
  SRV target must be a name, never an address literal).

Anything else is NXDOMAIN (a name of the zone with no record of the asked type:
an empty answer). Answers carry a TTL of 1 s; Caddy keeps them for its ``refresh``.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuyard.edge.route_table import TableRoute, parse_table

log = logging.getLogger(__name__)

ZONE = "gpuyard-routes.internal"
TYPE_A = 1
TYPE_AAAA = 28
TYPE_SRV = 33
CLASS_IN = 1
RCODE_OK = 0
RCODE_FORMERR = 1
RCODE_NXDOMAIN = 3
RCODE_NOTIMP = 4
_TTL_S = 1
_MAX_QUERY = 512


class DnsFormatError(ValueError):
    """A datagram that is not a DNS query this server can read."""


@dataclass(frozen=True)
class Question:
    id: int
    flags: int
    name: str
    qtype: int
    qclass: int
    raw: bytes  # the question section as it came (echoed back)


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.strip(".").split("."):
        raw = label.encode("ascii")
        if not 0 < len(raw) < 64:
            raise ValueError(f"bad DNS label in {name!r}")
        out += bytes([len(raw)]) + raw
    return out + b"\x00"


def parse_query(data: bytes) -> Question:
    """The one question of a query; raises DnsFormatError for anything else."""
    if len(data) < 12:
        raise DnsFormatError("short header")
    qid, flags, qdcount = struct.unpack("!HHH", data[:6])
    if flags & 0x8000 or qdcount != 1:
        raise DnsFormatError("not a query of one question")
    labels: list[str] = []
    i = 12
    while True:
        if i >= len(data):
            raise DnsFormatError("name runs past the end")
        n = data[i]
        i += 1
        if n == 0:
            break
        if n & 0xC0 or i + n > len(data):
            raise DnsFormatError("compressed or overlong name")
        labels.append(data[i : i + n].decode("ascii", "replace").lower())
        i += n
    if i + 4 > len(data):
        raise DnsFormatError("question runs past the end")
    qtype, qclass = struct.unpack("!HH", data[i : i + 4])
    return Question(qid, flags, ".".join(labels), qtype, qclass, data[12 : i + 4])


def _header(q: Question, rcode: int, answers: int) -> bytes:
    # QR, the query's opcode and RD, AA (this server is the zone's authority).
    flags = 0x8000 | (q.flags & 0x7900) | 0x0400 | rcode
    return struct.pack("!HHHHHH", q.id, flags, 1, answers, 0, 0)


def _record(rtype: int, rdata: bytes) -> bytes:
    # The owner is the question's name: a pointer to offset 12.
    return struct.pack("!HHHIH", 0xC00C, rtype, CLASS_IN, _TTL_S, len(rdata)) + rdata


def answer(q: Question, rcode: int, records: list[bytes]) -> bytes:
    return _header(q, rcode, len(records)) + q.raw + b"".join(records)


Lookup = Callable[[str], TableRoute | None]
AddressOf = Callable[[str], list[str]]


def respond(q: Question, zone: str, lookup: Lookup, address_of: AddressOf) -> bytes:
    """The answer to ``q`` from the routes ``lookup`` finds by label; ``address_of``
    turns an upstream host into IP addresses (a literal is itself)."""
    if q.qclass != CLASS_IN:
        return answer(q, RCODE_NOTIMP, [])
    suffix = "." + zone
    if not q.name.endswith(suffix):
        return answer(q, RCODE_NXDOMAIN, [])
    parts = q.name[: -len(suffix)].split(".")
    if len(parts) != 2:
        return answer(q, RCODE_NXDOMAIN, [])
    label, kind = parts
    route = lookup(label)
    # A forward's unix socket is dialled by Caddy itself (edge/route_table.py).
    if route is None or route.socket or kind not in ("port", "addr"):
        return answer(q, RCODE_NXDOMAIN, [])
    records: list[bytes] = []
    if kind == "port" and q.qtype == TYPE_SRV:
        target = encode_name(f"{label}.addr.{zone}")
        records.append(_record(TYPE_SRV, struct.pack("!HHH", 0, 0, route.port) + target))
    elif kind == "addr" and q.qtype in (TYPE_A, TYPE_AAAA):
        for ip in address_of(route.host):
            parsed = ipaddress.ip_address(ip)
            if parsed.version == 4 and q.qtype == TYPE_A:
                records.append(_record(TYPE_A, parsed.packed))
            elif parsed.version == 6 and q.qtype == TYPE_AAAA:
                records.append(_record(TYPE_AAAA, parsed.packed))
    return answer(q, RCODE_OK, records)


class TableFile:
    """The route table at ``path``, read again whenever the file was replaced (one
    ``stat`` per lookup; a missing or unreadable file keeps the last good table, or
    none at first)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._routes: dict[str, TableRoute] = {}

    def routes(self) -> dict[str, TableRoute]:
        try:
            st = os.stat(self.path)
        except OSError:
            return self._routes
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._routes = parse_table(self.path.read_bytes())
                self._stamp = stamp
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("route table %s unreadable: %s", self.path, e)
        return self._routes

    def lookup(self, label: str) -> TableRoute | None:
        return self.routes().get(label)


class Addresses:
    """IP addresses of upstream hosts: a literal is itself; a name is resolved by the
    system, its answer kept ``ttl_s`` seconds."""

    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self._kept: dict[str, tuple[float, list[str]]] = {}

    def __call__(self, host: str) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        now = time.monotonic()
        hit = self._kept.get(host)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            ips = sorted({str(info[4][0]) for info in infos})
        except OSError:
            ips = []
        self._kept[host] = (now + self.ttl_s, ips)
        return ips


def serve(sock: socket.socket, zone: str, table: TableFile) -> None:
    """Answer queries on ``sock`` until the process is told to stop, or the socket is
    closed (a test's resolver in a thread: its end is no error)."""
    addresses = Addresses()
    while True:
        try:
            data, peer = sock.recvfrom(_MAX_QUERY)
        except InterruptedError:
            continue
        except OSError:
            if sock.fileno() == -1:
                return
            raise
        try:
            q = parse_query(data)
        except DnsFormatError:
            if len(data) >= 12:  # a header to answer FORMERR to
                qid = struct.unpack("!H", data[:2])[0]
                sock.sendto(struct.pack("!HHHHHH", qid, 0x8000 | RCODE_FORMERR, 0, 0, 0, 0), peer)
            continue
        try:
            reply = respond(q, zone, table.lookup, addresses)
        except ValueError:  # a route whose host is no address and no name
            reply = answer(q, RCODE_OK, [])
        with contextlib.suppress(OSError):
            sock.sendto(reply, peer)


def _bind(preferred: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.1", preferred))
    except OSError:
        sock.bind(("127.0.0.1", 0))  # taken: another port, which the sync then names
    return sock


def read_port(path: Path) -> int | None:
    try:
        return int(path.read_text().strip()) or None
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> None:
    """``python -m gpuyard.edge.proxy_resolver --table T --port-file P``: bind the port
    named in ``P`` (another when it is taken), write the one bound to ``P``, serve."""
    parser = argparse.ArgumentParser(prog="gpuyard-proxy-resolver")
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--zone", default=ZONE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sock = _bind(read_port(args.port_file) or 0)
    port = int(sock.getsockname()[1])
    tmp = args.port_file.with_name(f".{args.port_file.name}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, args.port_file)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log.info("proxy resolver on 127.0.0.1:%s (zone %s, table %s)", port, args.zone, args.table)
    serve(sock, args.zone, TableFile(args.table))


def probe(port: int, zone: str = ZONE, timeout_s: float = 0.5) -> bool:
    """Whether a resolver of ``zone`` answers on ``127.0.0.1:port``."""
    qid = random.randrange(1 << 16)
    query = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    query += encode_name(f"probe.{zone}") + struct.pack("!HH", TYPE_SRV, CLASS_IN)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        try:
            s.sendto(query, ("127.0.0.1", port))
            data = s.recv(_MAX_QUERY)
        except OSError:
            return False
    return len(data) >= 12 and struct.unpack("!H", data[:2])[0] == qid and bool(data[2] & 0x80)


class ResolverProcess:
    """The resolver gpuyard runs beside its Caddy, in ``directory`` (the route table
    and its marker files, the port file, its pidfile and log). Like Caddy it runs in a
    session of its own, so a restart of gpuyard leaves it (and the proxy) serving; the
    next gpuyard finds it by its port file and a probe."""

    def __init__(self, directory: Path, zone: str = ZONE) -> None:
        self.directory = directory
        self.zone = zone
        self.table = directory / "routes.json"
        self.markers = directory / "routes"  # Caddy's marker files (edge/route_table.py)
        self.port_file = directory / "resolver.port"
        self.pidfile = directory / "resolver.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    def port(self) -> int | None:
        return read_port(self.port_file)

    def alive(self) -> bool:
        port = self.port()
        return port is not None and probe(port, self.zone)

    def ensure(self, wait_s: float = 10.0) -> int:
        """The port of a resolver that answers, started when none does. Raises
        RuntimeError when it cannot start."""
        if self._proc is not None:
            self._proc.poll()  # reap one of ours that died
        port = self.port()
        if port is not None and probe(port, self.zone):
            return port
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.directory / "resolver.log", "ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "gpuyard.edge.proxy_resolver",
                    "--table", str(self.table), "--port-file", str(self.port_file),
                    "--zone", self.zone,
                ],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                cwd=self.directory, start_new_session=True,
            )  # fmt: skip
        self.pidfile.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the proxy resolver exited at start (code {proc.returncode}); see "
                    f"{self.directory / 'resolver.log'}"
                )
            port = self.port()
            if port is not None and probe(port, self.zone, 0.2):
                self._proc = proc
                log.info("started the proxy resolver (pid %s) on 127.0.0.1:%s", proc.pid, port)
                return port
            time.sleep(0.02)
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the proxy resolver did not answer within {wait_s:.0f} s")

    def pid(self) -> int | None:
        """The pidfile's process, when it is still a resolver (a pid reused by another
        process after the resolver died is never signalled)."""
        try:
            pid = int(self.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"gpuyard.edge.proxy_resolver" in cmdline else None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the resolver this directory's pidfile names (if it runs)."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            self.pidfile.unlink(missing_ok=True)
            return
        if self._proc is not None and self._proc.pid == pid:
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        else:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.pid() is None:  # gone (a zombie has no command line either)
                    break
                time.sleep(0.02)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
