"""A training cluster's host loses its link and gets it back: the real server, real
Slurm nodes on one simulated host reached over SSH (its own network namespace and
Podman, tests/e2e/podman_host.py). While the link is down the nodes show
``host_status: "unreachable"`` and bill nothing from the host's last answered
heartbeat; once it answers they show ``reachable`` and bill from then on, and the
cluster still runs. Root, podman and sshd needed; builds the Slurm node image when
this machine's engine lacks it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gpuyard.core.training.clusters import node_owner
from gpuyard.store.schema import Host, UsageInterval
from tests.e2e.podman_host import HOSTS_HOW, PodmanHost, available
from tests.e2e.training_fleet import (
    BASE,
    create_training,
    detail,
    scope_of,
    training_fleet,
    wait,
    wait_running,
)
from tests.helpers import LiveServer
from tests.required_parts import needs

pytestmark = [pytest.mark.e2e, needs("simulated hosts", available(), how=HOSTS_HOW)]


@pytest.fixture(scope="module")
def remote(
    tmp_path_factory: pytest.TempPathFactory, engine_url: str
) -> Iterator[tuple[LiveServer, int, PodmanHost]]:
    home = Path(tmp_path_factory.mktemp("training-link")) / "home"
    # A cut link answers nothing: each heartbeat gives up after remote_engine_timeout_s.
    with training_fleet(
        home, engine_url, 1, heartbeat_misses=3, remote_engine_timeout_s=5.0
    ) as fleet:
        [(host_id, sim)] = fleet.hosts.items()
        yield fleet.server, host_id, sim


def intervals(server: LiveServer, holder: str) -> list[tuple[datetime, datetime | None]]:
    with server.server.ctx.read() as s:
        return [
            (r.started_at, r.ended_at)
            for r in s.execute(
                select(UsageInterval.started_at, UsageInterval.ended_at)
                .where(UsageInterval.cluster_id == holder)
                .order_by(UsageInterval.id)
            )
        ]


def test_nodes_on_a_cut_off_host_show_it_and_bill_nothing_until_it_answers(
    remote: tuple[LiveServer, int, PodmanHost],
) -> None:
    server, host_id, sim = remote
    with server.client() as c:
        params = scope_of(c)
        cid = create_training(c, params, "cut", workers=1, gpus_per_node=1)
        wait_running(c, cid, params, 600)
        [worker] = [n for n in detail(c, cid, params)["nodes"] if n["role"] == "worker"]
        holder = node_owner(worker["id"])
        assert worker["host_id"] == host_id and worker["host_status"] == "reachable"
        assert {end for _, end in intervals(server, holder)} == {None}  # billing

        sim.down()
        try:

            def cut_off() -> bool:
                nodes = detail(c, cid, params)["nodes"]
                return all(n["host_status"] == "unreachable" for n in nodes)

            wait(cut_off, 120, "the nodes to show their host unreachable")
            with server.server.ctx.read() as s:
                host = s.get(Host, host_id)
                assert host is not None and host.last_heartbeat_at is not None
                last_answer = host.last_heartbeat_at.replace(microsecond=0)
            # Nothing billed from the last answered heartbeat on.
            assert {end for _, end in intervals(server, holder)} == {last_answer}
            assert detail(c, cid, params)["status"] == "running"
        finally:
            sim.up()
        cut_until = datetime.now(UTC).replace(tzinfo=None, microsecond=0)

        def back() -> bool:
            nodes = detail(c, cid, params)["nodes"]
            return all(n["host_status"] == "reachable" for n in nodes)

        wait(back, 120, "the nodes to show their host reachable again")
        # Billed again from the host's first answer, not before the link came back.
        reopened = [start for start, end in intervals(server, holder) if end is None]
        assert reopened and all(start.replace(tzinfo=None) >= cut_until for start in reopened)
        events = c.get(f"{BASE}{cid}/events/", params=params)
        assert events.status_code == 200, events.text
        text = str(events.json()["data"])
        assert "unreachable" in text and "answers again" in text
        assert detail(c, cid, params)["status"] == "running"

        assert c.delete(f"{BASE}{cid}/", params=params).status_code in (200, 202, 204)
        wait(lambda: detail_gone(c, cid, params), 180, "the cluster deleted")


def detail_gone(c: httpx.Client, cid: int, params: dict[str, Any]) -> bool:
    return c.get(f"{BASE}{cid}/", params=params).status_code == 404
