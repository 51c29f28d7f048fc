"""The HTTP proxy's route table: which cluster ports exist, who may reach them without
asking the API, and where they are. Written by the proxy-sync duty; read per request,
which is how Caddy routes without ever loading a new configuration:

- the table file (JSON), by the proxy's resolver (``edge/proxy_resolver.py``), which
  tells Caddy where a port is. It is replaced atomically (written beside it, then
  renamed), so a reader sees either the old table or the new one, never half of one;
- marker files ``{markers}/public/{label}`` and ``{markers}/private/{label}`` (empty),
  which Caddy's ``file`` matcher looks for to know a port's visibility (a ``stat`` per
  request, nothing cached), and ``{markers}/forward/{label}``: a symbolic link to the
  unix socket of an SSH forward (a private port of an ``ssh://`` host,
  runtimes/hosts/ssh_forwards.py), which Caddy both matches and dials (no DNS answer
  can name a unix socket).

:func:`publish` orders the writes so that no request is let through unchecked that
the store says is private: stale markers go first, then the table is replaced, then
new markers appear (a port made private loses its public marker before anything else;
a new port is in the table before its marker names it). Nothing here is a secret: a
route is a host name's label, a visibility and a ``host:port``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuyard.core.network.proxy import ProxyRoute, Visibility

TABLE_VERSION = 1


@dataclass(frozen=True)
class TableRoute:
    """One cluster port as the resolver answers it: ``label`` is the first label of
    its proxy host name (``{cluster_id}-{port}``)."""

    label: str
    public: bool
    host: str
    port: int
    # The unix socket of an SSH forward (then host and port are unused).
    socket: str = ""


def table_routes(routes: Iterable[ProxyRoute]) -> dict[str, TableRoute]:
    """The table's rows for ``routes``, by label."""
    out: dict[str, TableRoute] = {}
    for r in routes:
        label = f"{r.cluster_id}-{r.internal_port}"
        if r.upstream.startswith("unix/"):
            socket = r.upstream[len("unix/") :]
            out[label] = TableRoute(label, r.visibility is Visibility.PUBLIC, "", 0, socket)
            continue
        host, _, port = r.upstream.rpartition(":")
        out[label] = TableRoute(
            label=label,
            public=r.visibility is Visibility.PUBLIC,
            host=host.strip("[]"),
            port=int(port),
        )
    return out


def render(routes: Mapping[str, TableRoute]) -> bytes:
    """The file's bytes: stable for the same routes (sorted), so an unchanged table is
    not rewritten."""
    body = {
        "version": TABLE_VERSION,
        "routes": {
            label: {"public": r.public, "host": r.host, "port": r.port, "socket": r.socket}
            for label, r in sorted(routes.items())
        },
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def write_table(path: Path, routes: Mapping[str, TableRoute]) -> bool:
    """Replace the table at ``path`` atomically when it differs; True when written."""
    data = render(routes)
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
    os.replace(tmp, path)
    return True


MARKER_KINDS = ("public", "private", "forward")


def _kind(route: TableRoute) -> str:
    if route.socket:
        return "forward"
    return "public" if route.public else "private"


def _marker_target(route: TableRoute) -> str:
    """What the marker is: empty, or the socket a forward's link points at."""
    return route.socket


def _present(marker: Path) -> str | None:
    """What marker ``marker`` is now (None: none): a link's target, else empty."""
    if marker.is_symlink():
        return str(marker.readlink())
    return "" if marker.exists() else None


def publish(
    table: Path,
    markers: Path,
    routes: Mapping[str, TableRoute],
    write: Callable[[Path, Mapping[str, TableRoute]], bool] | None = None,
) -> bool:
    """Make the table at ``table`` and the marker files under ``markers`` say
    ``routes``, in the order the module docstring gives; True when anything changed.
    ``write`` replaces the table (default :func:`write_table`)."""
    wanted = {
        kind: {label: _marker_target(r) for label, r in routes.items() if _kind(r) == kind}
        for kind in MARKER_KINDS
    }
    changed = False
    for kind in MARKER_KINDS:
        folder = markers / kind
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for marker in list(folder.iterdir()):
            if marker.name.startswith("."):
                continue
            if wanted[kind].get(marker.name) != _present(marker):
                marker.unlink(missing_ok=True)
                changed = True
    changed = (write or write_table)(table, routes) or changed
    for kind in MARKER_KINDS:
        for label, target in wanted[kind].items():
            marker = markers / kind / label
            if _present(marker) is not None:
                continue
            if target:
                marker.symlink_to(target)
            else:
                marker.touch()
            changed = True
    return changed


def parse_table(data: bytes) -> dict[str, TableRoute]:
    """The routes of a table file's bytes; raises ValueError when it is not one."""
    body = json.loads(data)
    if not isinstance(body, dict) or body.get("version") != TABLE_VERSION:
        raise ValueError("not a route table of this version")
    out: dict[str, TableRoute] = {}
    for label, r in dict(body.get("routes") or {}).items():
        out[str(label).lower()] = TableRoute(
            label=str(label).lower(),
            public=bool(r["public"]),
            host=str(r["host"]),
            port=int(r["port"]),
            socket=str(r.get("socket") or ""),
        )
    return out
