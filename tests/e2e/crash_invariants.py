"""What must hold once a server killed at a crash point has been started again and has
converged (tests/e2e/test_crash_points_e2e.py): read from the engine (only objects
labelled with the server's installation id) and from its database (read-only).

:func:`violations` returns every broken invariant as a sentence; empty when all hold:

- no engine object without a row: every container and volume of the installation
  belongs to a live cluster, network volume or training cluster, or is a quarantined
  orphan volume (README "Orphans": the documented quarantine);
- no row without its objects: a running cluster has a running container, a running or
  stopped cluster its volume, a network volume some cluster mounted its engine volume;
- no leaked GPU: every GPU allocation belongs to a cluster that holds compute (running,
  or on its way) or to a node of a live training cluster;
- nothing transitional: no cluster pending/starting/stopping/terminating or with a start
  requested while it stopped still to be made, no snapshot
  ``creating``, no restore ``restoring``, no training cluster creating/scaling/deleting;
- usage intervals: per cluster and meter none overlaps another and at most one is open;
  a terminated cluster has none open, a stopped one no compute meter open; per cluster
  the intervals of all meters together leave no gap between its first and its last.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import docker

from gpuyard.core.ownership import LABEL_CLUSTER, Ownership

TRANSITIONAL = ("pending", "starting", "stopping", "terminating")
TRAINING_TRANSITIONAL = ("creating", "scaling", "deleting", "updating", "restarting")
HOLDS_GPUS = ("pending", "starting", "running", "stopping")


def _rows(db: sqlite3.Connection, sql: str) -> list[tuple[object, ...]]:
    return [tuple(r) for r in db.execute(sql).fetchall()]


def _when(value: object) -> datetime:
    return datetime.fromisoformat(str(value))


def violations(db_path: Path, engines: dict[int, str], owner: Ownership) -> list[str]:
    """Every broken invariant of the installation ``owner`` (see the module doc), its
    hosts' engines given by host id."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        found = _database_violations(db)
        found += _engine_violations(db, engines, owner)
    finally:
        db.close()
    return found


def _database_violations(db: sqlite3.Connection) -> list[str]:
    found: list[str] = []
    status = {str(cid): str(s) for cid, s in _rows(db, "SELECT id, status FROM clusters")}
    for cid, s in status.items():
        if s in TRANSITIONAL:
            found.append(f"cluster {cid} is still {s}")
    # A start requested while it stopped is still to be made.
    for (cid,) in _rows(db, "SELECT id FROM clusters WHERE pending_start IS NOT NULL"):
        found.append(f"cluster {cid} still has a start to make")
    for (sid,) in _rows(db, "SELECT id FROM snapshots WHERE status = 'creating'"):
        found.append(f"snapshot {sid} is still creating")
    for rid, holder in _rows(
        db, "SELECT id, holder_id FROM volume_restores WHERE status = 'restoring'"
    ):
        found.append(f"restore {rid} of {holder} is still restoring")
    live_training = _live_training(db)
    for tid, s in _rows(db, "SELECT id, status FROM training_clusters WHERE deleted_at IS NULL"):
        if s in TRAINING_TRANSITIONAL:
            found.append(f"training cluster {tid} is still {s}")
    nodes = {
        f"tn-{nid}": int(str(tid))
        for nid, tid in _rows(db, "SELECT id, cluster_id FROM training_nodes")
    }
    for host, index, holder in _rows(
        db, "SELECT host_id, gpu_index, cluster_id FROM gpu_allocations"
    ):
        h = str(holder)
        if h in status:
            if status[h] not in HOLDS_GPUS:
                found.append(f"GPU {index} of host {host} held by {status[h]} cluster {h}")
        elif h in nodes:
            if nodes[h] not in live_training:
                found.append(f"GPU {index} of host {host} held by node {h} of a gone cluster")
        else:
            found.append(f"GPU {index} of host {host} held by unknown {h}")
    found += _ledger_violations(db, status)
    return found


def _live_training(db: sqlite3.Connection) -> set[int]:
    return {
        int(str(tid))
        for (tid,) in _rows(db, "SELECT id FROM training_clusters WHERE deleted_at IS NULL")
    }


def _ledger_violations(db: sqlite3.Connection, status: dict[str, str]) -> list[str]:
    found: list[str] = []
    by_meter: dict[tuple[str, str], list[tuple[datetime, datetime | None]]] = defaultdict(list)
    for cid, meter, start, end in _rows(
        db, "SELECT cluster_id, meter, started_at, ended_at FROM usage_intervals"
    ):
        by_meter[(str(cid), str(meter))].append(
            (_when(start), _when(end) if end is not None else None)
        )
    spans: dict[str, list[tuple[datetime, datetime | None]]] = defaultdict(list)
    for (cid, meter), intervals in by_meter.items():
        intervals.sort(key=lambda i: i[0])
        spans[cid] += intervals
        open_ = [i for i in intervals if i[1] is None]
        if len(open_) > 1:
            found.append(f"cluster {cid} has {len(open_)} open {meter} intervals")
        for (_s1, e1), (s2, _e2) in itertools.pairwise(intervals):
            if e1 is None or e1 > s2:
                found.append(f"cluster {cid}: {meter} intervals overlap at {s2}")
        if open_ and status.get(cid) == "terminated":
            found.append(f"terminated cluster {cid} still bills {meter}")
        if open_ and status.get(cid) == "stopped" and meter in ("gpu", "compute"):
            found.append(f"stopped cluster {cid} still bills {meter}")
    for cid, intervals in spans.items():
        if cid not in status:
            continue  # a network volume's or a training node's meter
        intervals.sort(key=lambda i: i[0])
        reach = intervals[0][1]
        for start, end in intervals[1:]:
            if reach is not None and start > reach:
                found.append(f"cluster {cid}: nothing billed from {reach} to {start}")
            reach = None if reach is None or end is None else max(reach, end)
    return found


def _engine_violations(
    db: sqlite3.Connection, engines: dict[int, str], owner: Ownership
) -> list[str]:
    """Per host: its engine's objects against the rows placed on it."""
    found: list[str] = []
    clusters = _rows(db, "SELECT id, status, volume_name, network_volume_id, host_id FROM clusters")
    network = _rows(
        db,
        "SELECT id, volume_name, host_id, deleted_at IS NULL FROM network_volumes n "
        "WHERE deleted_at IS NULL OR EXISTS "
        "(SELECT 1 FROM reservations r WHERE r.cluster_id = n.id)",
    )
    quarantined = _rows(db, "SELECT name, host_id FROM orphan_volumes WHERE deleted_at IS NULL")
    # A volume move in flight (copying) or whose old copy is not deleted yet (copied)
    # is work left: once converged there is none, and no old copy.
    for cid, status, from_host in _rows(
        db,
        "SELECT cluster_id, status, from_host_id FROM volume_moves "
        "WHERE status IN ('copying', 'copied')",
    ):
        found.append(f"volume move of {cid} is still {status} (old copy on host {from_host})")
    training_prefixes = tuple(owner.training_prefix(t) for t in _live_training(db))

    def training(name: str) -> bool:
        return bool(training_prefixes) and name.startswith(training_prefixes)

    mounted = {str(c[3]) for c in clusters if c[3] is not None}
    for host_id, url in engines.items():
        containers, volumes = _objects(url, owner)
        here = [c for c in clusters if c[4] == host_id]
        with_container = {str(c[0]) for c in here if c[1] in ("running", "error")}
        expected = {str(vol or owner.volume(str(cid))) for cid, s, vol, nv, _h in here
                    if s != "terminated" and nv is None}  # fmt: skip
        expected |= {str(name) for _v, name, h, _live in network if h == host_id}
        expected |= {str(name) for name, h in quarantined if h == host_id}
        by_cluster = {ct.labels.get(LABEL_CLUSTER): ct for ct in containers.values()}
        for name, ct in containers.items():
            holder = ct.labels.get(LABEL_CLUSTER) or ""
            if holder not in with_container and not training(name):
                found.append(
                    f"host {host_id}: container {name} ({ct.status}) of {holder or '?'} "
                    "has no live row"
                )
        for name in sorted(volumes - expected):
            if not training(name):
                found.append(f"host {host_id}: volume {name} has no row (nor quarantine)")
        for cid, s, vol, nv, _h in here:
            c = str(cid)
            if s == "running":
                ct = by_cluster.get(c)
                if ct is None or ct.status != "running":
                    found.append(f"running cluster {c} has no running container")
            if s in ("running", "stopped") and nv is None:
                name = str(vol or owner.volume(c))
                if name not in volumes:
                    found.append(f"{s} cluster {c} has no volume {name} on host {host_id}")
        for vid, name, h, live in network:
            if live and h == host_id and str(vid) in mounted and str(name) not in volumes:
                found.append(f"network volume {vid} has no engine volume {name}")
    return found


def _objects(url: str, owner: Ownership) -> tuple[dict[str, Container], set[str]]:
    """The installation's containers (by name) and volume names on engine ``url``: one
    list call each (no per-object inspect, which would race the server's removals)."""
    client = docker.APIClient(base_url=url)
    try:
        containers = {
            str(ct["Names"][0]).lstrip("/"): Container(
                ct.get("Labels") or {}, str(ct.get("State") or "")
            )
            for ct in client.containers(all=True, filters={"label": owner.label_filter()})
            if owner.owns(ct.get("Labels"))
        }
        listed = client.volumes(filters={"label": owner.label_filter()}) or {}
        volumes = {
            str(v["Name"]) for v in listed.get("Volumes") or [] if owner.owns(v.get("Labels"))
        }
    finally:
        client.close()
    return containers, volumes


@dataclass(frozen=True)
class Container:
    labels: dict[str, str]
    status: str
