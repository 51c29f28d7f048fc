"""The proxy's resolver (edge/proxy_resolver.py) and route table (edge/route_table.py):
the DNS answers Caddy's lookups get, read with an independent DNS library, over real
UDP on loopback; the table replaced atomically and read again when replaced."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.core.network.proxy import ProxyRoute, Visibility
from gpuyard.edge.proxy_resolver import (
    ZONE,
    ResolverProcess,
    TableFile,
    parse_query,
    probe,
    respond,
    serve,
)
from gpuyard.edge.route_table import parse_table, render, table_routes, write_table

dns_message = pytest.importorskip("dns.message")
dns_query = pytest.importorskip("dns.query")
dns_rcode = pytest.importorskip("dns.rcode")

PUB = "aaaaaaaaaaaaaa-7860"
PRIV = "bbbbbbbbbbbbbb-8888"
ROUTES = [
    ProxyRoute("aaaaaaaaaaaaaa", 7860, Visibility.PUBLIC, "127.0.0.1:40001"),
    ProxyRoute("bbbbbbbbbbbbbb", 8888, Visibility.PRIVATE, "10.1.2.3:40002"),
    ProxyRoute("cccccccccccccc", 80, Visibility.PUBLIC, "[fd00::7]:40003"),
]


@pytest.fixture
def resolver(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    table = tmp_path / "routes.json"
    write_table(table, table_routes(ROUTES))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=serve, args=(sock, ZONE, TableFile(table)), daemon=True)
    thread.start()
    yield int(sock.getsockname()[1]), table
    sock.close()


def ask(port: int, name: str, rdtype: str) -> tuple[str, list[str]]:
    q = dns_message.make_query(name, rdtype)
    r = dns_query.udp(q, "127.0.0.1", port=port, timeout=2)
    assert r.id == q.id and r.question == q.question
    return dns_rcode.to_text(r.rcode()), [rr.to_text() for a in r.answer for rr in a]


def test_a_public_port_resolves_under_public_and_any(resolver: tuple[int, Path]) -> None:
    port, _ = resolver
    target = f"{PUB}.addr.{ZONE}."
    assert ask(port, f"{PUB}.public.{ZONE}.", "SRV") == ("NOERROR", [f"0 0 40001 {target}"])
    assert ask(port, f"{PUB}.any.{ZONE}", "SRV") == ("NOERROR", [f"0 0 40001 {target}"])
    assert ask(port, target, "A") == ("NOERROR", ["127.0.0.1"])
    assert ask(port, target, "AAAA") == ("NOERROR", [])  # the name is, with no IPv6
    v6 = "cccccccccccccc-80.addr." + ZONE
    assert ask(port, v6, "AAAA") == ("NOERROR", ["fd00::7"])
    assert ask(port, v6, "A") == ("NOERROR", [])


def test_a_private_port_resolves_only_under_any(resolver: tuple[int, Path]) -> None:
    port, _ = resolver
    assert ask(port, f"{PRIV}.public.{ZONE}", "SRV") == ("NXDOMAIN", [])
    assert ask(port, f"{PRIV}.any.{ZONE}", "SRV")[1] == [f"0 0 40002 {PRIV}.addr.{ZONE}."]
    assert ask(port, f"{PRIV.upper()}.ANY.{ZONE.upper()}", "SRV")[0] == "NOERROR"
    assert ask(port, f"{PRIV}.addr.{ZONE}", "A") == ("NOERROR", ["10.1.2.3"])


@pytest.mark.parametrize(
    "name",
    [
        f"zzzzzzzzzzzzzz-1.any.{ZONE}",  # no such port
        f"{PUB}.other.{ZONE}",
        f"x.{PUB}.any.{ZONE}",
        f"{PUB}.any.example.com",  # another zone
        ZONE,
    ],
)
def test_anything_else_does_not_exist(resolver: tuple[int, Path], name: str) -> None:
    assert ask(resolver[0], name, "SRV") == ("NXDOMAIN", [])


def test_a_replaced_table_is_read_at_the_next_lookup(resolver: tuple[int, Path]) -> None:
    port, table = resolver
    assert write_table(table, table_routes(ROUTES[1:])) is True
    assert ask(port, f"{PUB}.public.{ZONE}", "SRV") == ("NXDOMAIN", [])
    moved = ProxyRoute("bbbbbbbbbbbbbb", 8888, Visibility.PUBLIC, "127.0.0.1:41000")
    write_table(table, table_routes([moved]))
    assert ask(port, f"{PRIV}.public.{ZONE}", "SRV")[1] == [f"0 0 41000 {PRIV}.addr.{ZONE}."]
    table.write_bytes(b"{not json")  # a torn or foreign file: the last good table stays
    assert ask(port, f"{PRIV}.public.{ZONE}", "SRV")[0] == "NOERROR"
    assert probe(port) is True


def test_the_table_is_written_only_when_it_changes(tmp_path: Path) -> None:
    table = tmp_path / "d" / "routes.json"
    rows = table_routes(ROUTES)
    assert write_table(table, rows) is True
    assert write_table(table, table_routes(list(reversed(ROUTES)))) is False
    assert parse_table(table.read_bytes()) == rows
    assert render(rows) == table.read_bytes()
    assert not [p for p in table.parent.iterdir() if p.name != "routes.json"]  # no leftovers
    with pytest.raises(ValueError):
        parse_table(b'{"version": 99, "routes": {}}')


def test_garbage_is_refused_without_an_answer_that_could_be_taken_for_one() -> None:
    with pytest.raises(ValueError):
        parse_query(b"\x00\x01")
    response = bytes(12)
    with pytest.raises(ValueError):
        parse_query(b"\x12\x34\x80\x00" + response[4:])  # a response, not a query
    q = parse_query(dns_message.make_query(f"{PUB}.any.{ZONE}", "SRV", use_edns=True).to_wire())
    reply = respond(q, ZONE, lambda label: None, lambda host: [])
    assert dns_rcode.to_text(dns_message.from_wire(reply).rcode()) == "NXDOMAIN"


def test_the_resolver_process_starts_is_found_again_and_stops(tmp_path: Path) -> None:
    process = ResolverProcess(tmp_path)
    write_table(process.table, table_routes(ROUTES))
    port = process.ensure()
    pid = process.pid()
    assert pid is not None and probe(port)
    assert ask(port, f"{PUB}.public.{ZONE}", "SRV")[0] == "NOERROR"
    # Another supervisor (gpuyard restarted) finds it by its port file.
    again = ResolverProcess(tmp_path)
    assert again.ensure() == port and again.pid() == pid
    again.stop()
    assert not probe(port, timeout_s=0.2)
    # Started again, it takes the same port (Caddy's configuration names it).
    assert process.ensure() == port
    process.stop()
