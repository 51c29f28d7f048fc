"""The HTTP proxy's route table: which cluster ports exist, who may reach them without
asking the API, and where they are. Written by the proxy-sync duty, read by the proxy's
resolver process (``edge/proxy_resolver.py``), which is how Caddy finds an upstream
for each request without ever loading a new configuration.

The file is JSON, replaced atomically (written beside it, then renamed), so a reader
sees either the old table or the new one, never half of one. It holds no secret: a
route is a host name's label, a visibility and a ``host:port``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
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


def table_routes(routes: Iterable[ProxyRoute]) -> dict[str, TableRoute]:
    """The table's rows for ``routes``, by label."""
    out: dict[str, TableRoute] = {}
    for r in routes:
        host, _, port = r.upstream.rpartition(":")
        label = f"{r.cluster_id}-{r.internal_port}"
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
            label: {"public": r.public, "host": r.host, "port": r.port}
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
        )
    return out
