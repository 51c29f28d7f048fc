"""The proxy's resolver (edge/proxy_resolver.py) and route table (edge/route_table.py):
the DNS answers Caddy's lookups get, read with an independent DNS library, over real
UDP on loopback; the table replaced atomically and read again when replaced; the
marker files published in an order that never opens a private port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from gpuyard.edge.route_table import parse_table, publish, render, table_routes, write_table

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


def test_every_port_resolves_to_its_upstream(resolver: tuple[int, Path]) -> None:
    port, _ = resolver
    target = f"{PUB}.addr.{ZONE}."
    assert ask(port, f"{PUB}.port.{ZONE}.", "SRV") == ("NOERROR", [f"0 0 40001 {target}"])
    assert ask(port, target, "A") == ("NOERROR", ["127.0.0.1"])
    assert ask(port, target, "AAAA") == ("NOERROR", [])  # the name is, with no IPv6
    assert ask(port, f"{PUB}.port.{ZONE}", "A") == ("NOERROR", [])
    assert ask(port, f"{PRIV}.port.{ZONE}", "SRV")[1] == [f"0 0 40002 {PRIV}.addr.{ZONE}."]
    assert ask(port, f"{PRIV.upper()}.PORT.{ZONE.upper()}", "SRV")[0] == "NOERROR"
    assert ask(port, f"{PRIV}.addr.{ZONE}", "A") == ("NOERROR", ["10.1.2.3"])
    v6 = "cccccccccccccc-80.addr." + ZONE
    assert ask(port, v6, "AAAA") == ("NOERROR", ["fd00::7"])
    assert ask(port, v6, "A") == ("NOERROR", [])


@pytest.mark.parametrize(
    "name",
    [
        f"zzzzzzzzzzzzzz-1.port.{ZONE}",  # no such port
        f"{PUB}.public.{ZONE}",
        f"x.{PUB}.port.{ZONE}",
        f"{PUB}.port.example.com",  # another zone
        ZONE,
    ],
)
def test_anything_else_does_not_exist(resolver: tuple[int, Path], name: str) -> None:
    assert ask(resolver[0], name, "SRV") == ("NXDOMAIN", [])


def test_a_replaced_table_is_read_at_the_next_lookup(resolver: tuple[int, Path]) -> None:
    port, table = resolver
    assert write_table(table, table_routes(ROUTES[1:])) is True
    assert ask(port, f"{PUB}.port.{ZONE}", "SRV") == ("NXDOMAIN", [])
    moved = ProxyRoute("bbbbbbbbbbbbbb", 8888, Visibility.PUBLIC, "127.0.0.1:41000")
    write_table(table, table_routes([moved]))
    assert ask(port, f"{PRIV}.port.{ZONE}", "SRV")[1] == [f"0 0 41000 {PRIV}.addr.{ZONE}."]
    table.write_bytes(b"{not json")  # a torn or foreign file: the last good table stays
    assert ask(port, f"{PRIV}.port.{ZONE}", "SRV")[0] == "NOERROR"
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


def test_markers_never_open_a_private_port(tmp_path: Path) -> None:
    table, markers = tmp_path / "routes.json", tmp_path / "routes"
    seen: list[tuple[set[str], set[str], set[str]]] = []

    def state() -> tuple[set[str], set[str], set[str]]:
        kinds = [{p.name for p in (markers / k).iterdir()} for k in ("public", "private")]
        routed = set(parse_table(table.read_bytes())) if table.exists() else set()
        return kinds[0], kinds[1], routed

    assert publish(table, markers, table_routes(ROUTES)) is True
    assert state() == ({PUB, "cccccccccccccc-80"}, {PRIV}, {PUB, PRIV, "cccccccccccccc-80"})
    assert publish(table, markers, table_routes(ROUTES)) is False  # nothing changed
    # The public port made private, the private one terminated: the public marker goes
    # before the table changes (watched at each step through the table's write).
    private_now = ProxyRoute("aaaaaaaaaaaaaa", 7860, Visibility.PRIVATE, "127.0.0.1:40001")

    def watched(path: Path, routes: Any) -> bool:
        seen.append(state())
        return write_table(path, routes)

    assert publish(table, markers, table_routes([private_now]), watched) is True
    assert seen == [(set(), set(), {PUB, PRIV, "cccccccccccccc-80"})]
    assert state() == (set(), {PUB}, {PUB})


def test_a_forward_is_a_link_to_its_socket(tmp_path: Path) -> None:
    table, markers = tmp_path / "routes.json", tmp_path / "routes"
    forwarded = ProxyRoute("dddddddddddddd", 8888, Visibility.PRIVATE, "unix//run/f/a-1.sock")
    assert publish(table, markers, table_routes([forwarded])) is True
    link = markers / "forward" / "dddddddddddddd-8888"
    assert link.is_symlink() and str(link.readlink()) == "/run/f/a-1.sock"
    assert not list((markers / "private").iterdir())
    assert publish(table, markers, table_routes([forwarded])) is False
    moved = ProxyRoute("dddddddddddddd", 8888, Visibility.PRIVATE, "unix//run/f/b-2.sock")
    assert publish(table, markers, table_routes([moved])) is True
    assert str(link.readlink()) == "/run/f/b-2.sock"
    # The resolver answers nothing for it (Caddy dials the socket itself).
    q = parse_query(dns_message.make_query(f"dddddddddddddd-8888.port.{ZONE}", "SRV").to_wire())
    rows = parse_table(table.read_bytes())
    reply = respond(q, ZONE, rows.get, lambda host: [])
    assert dns_rcode.to_text(dns_message.from_wire(reply).rcode()) == "NXDOMAIN"


def test_garbage_is_refused_without_an_answer_that_could_be_taken_for_one() -> None:
    with pytest.raises(ValueError):
        parse_query(b"\x00\x01")
    response = bytes(12)
    with pytest.raises(ValueError):
        parse_query(b"\x12\x34\x80\x00" + response[4:])  # a response, not a query
    q = parse_query(dns_message.make_query(f"{PUB}.port.{ZONE}", "SRV", use_edns=True).to_wire())
    reply = respond(q, ZONE, lambda label: None, lambda host: [])
    assert dns_rcode.to_text(dns_message.from_wire(reply).rcode()) == "NXDOMAIN"


def test_the_resolver_process_starts_is_found_again_and_stops(tmp_path: Path) -> None:
    process = ResolverProcess(tmp_path)
    write_table(process.table, table_routes(ROUTES))
    port = process.ensure()
    pid = process.pid()
    assert pid is not None and probe(port)
    assert ask(port, f"{PUB}.port.{ZONE}", "SRV")[0] == "NOERROR"
    # Another supervisor (gpuyard restarted) finds it by its port file.
    again = ResolverProcess(tmp_path)
    assert again.ensure() == port and again.pid() == pid
    again.stop()
    assert not probe(port, timeout_s=0.2)
    # Started again, it takes the same port (Caddy's configuration names it).
    assert process.ensure() == port
    process.stop()
