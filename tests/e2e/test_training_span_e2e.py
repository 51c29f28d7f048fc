"""A training cluster bigger than any one host spans hosts: the real server with real
Slurm nodes on three simulated hosts reached over SSH (each its own network namespace,
Podman with its own storage that starts without the node image, 2 GPUs declared), and a
fourth added later. Nothing of the cluster runs on this machine's engine.

What a user of a multi-node cluster relies on is checked on the real thing: Slurm runs
one task per worker across the hosts, 100 MB sent over TCP between workers on different
hosts arrives intact (the overlay between the hosts), a container of another account on
the same hosts reaches no node (TCP and ICMP), a drained host's worker is recreated on
another host and rejoins, and a worker added on the one host with room joins while a
job runs on the others. Root, podman, sshd and nft needed; builds the Slurm node
image when this machine's engine lacks it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from sqlalchemy import select

from gpuyard.store.schema import TrainingNode
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.podman_host import HOSTS_HOW, available
from tests.e2e.training_fleet import (
    BASE,
    TrainingFleet,
    create_training,
    node_containers,
    scope_of,
    training_fleet,
    wait,
    wait_running,
)
from tests.required_parts import needs

pytestmark = [pytest.mark.e2e, needs("simulated hosts", available(), how=HOSTS_HOW)]


class Span(TrainingFleet):
    def sh(self, host_id: int, container: str, script: str) -> tuple[int, str]:
        return self.exec(host_id, container, ["sh", "-c", script])

    def nodes(self, cid: int) -> dict[str, tuple[int, str]]:
        """Node name -> (host id, fixed address)."""
        with self.server.server.ctx.read() as s:
            rows = s.scalars(select(TrainingNode).where(TrainingNode.cluster_id == cid))
            return {n.name: (int(n.host_id or 0), str(n.address)) for n in rows}


@pytest.fixture(scope="module")
def span(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Span]:
    home = Path(tmp_path_factory.mktemp("training-span")) / "home"
    # Four hosts, three added now: the fourth is added where the test needs it. The
    # busybox image is for the other account's cluster.
    with training_fleet(
        home, engine_url, 4, added=3, load=(DEV_IMAGE,), volume_images=False
    ) as fleet:
        yield Span(fleet.server, fleet.sims, fleet.hosts)


def other_account(span: Span, c: httpx.Client) -> httpx.Client:
    r = c.post("/v1/accounts", json={"name": "neighbour", "owner_email": "n@example.com"})
    assert r.status_code == 201, r.text
    key = r.json()["data"]["api_key"]["key"]
    return span.server.client(key)


def test_a_cluster_spans_three_hosts_with_one_private_network(span: Span, engine_url: str) -> None:
    with span.server.client() as c:
        params = scope_of(c)
        cid = create_training(c, params, "wide", workers=3, gpus_per_node=2)
        wait_running(c, cid, params, 900)

        nodes = span.nodes(cid)
        prefix = span.server.server.ctx.ownership.training_prefix(cid)
        controller, workers = f"{prefix}-controller", [f"{prefix}-worker-{i}" for i in (1, 2, 3)]
        # One worker per host, each container on its own host's engine; none here.
        assert sorted(nodes[w][0] for w in workers) == sorted(span.hosts)
        for host_id in span.hosts:
            assert span.labelled(host_id, cid) == {n for n, (h, _) in nodes.items() if h == host_id}
        here = docker.DockerClient(base_url=engine_url)
        try:
            assert node_containers(here, span.server.server.ctx.ownership, cid) == []
        finally:
            here.close()

        # Slurm runs one task on each worker, across the three hosts.
        ctl_host = nodes[controller][0]
        code, out = span.sh(ctl_host, controller, "srun -N3 hostname | sort")
        assert code == 0 and out.split() == sorted(workers), out

        # 100 MB over TCP from worker 1 to worker 2 (different hosts), by name.
        (h1, _), (h2, _) = nodes[workers[0]], nodes[workers[1]]
        assert h1 != h2
        listen = (
            "perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalPort=>5001,Listen=>1,"
            "ReuseAddr=>1) or die; $c=$s->accept; binmode $c; binmode STDOUT; "
            "while(sysread($c,$b,65536)){print $b}' | sha256sum > /tmp/got"
        )
        api = span.api(h2)
        run = api.exec_create(workers[1], ["sh", "-c", listen])
        api.exec_start(run["Id"], detach=True)
        time.sleep(1)
        code, sent = span.sh(
            h1,
            workers[0],
            "head -c 100000000 /dev/urandom > /tmp/blob && sha256sum < /tmp/blob && "
            f"bash -c 'cat /tmp/blob > /dev/tcp/{workers[1]}/5001'",
        )
        assert code == 0, sent

        def received() -> bool:
            return span.sh(h2, workers[1], "test -s /tmp/got")[0] == 0

        wait(received, 60, "the 100 MB to arrive")
        got = span.sh(h2, workers[1], "cat /tmp/got")[1]
        assert got.split()[0] == sent.split()[0]

        # Another account's container on the same hosts reaches no node.
        with other_account(span, c) as neighbour:
            r = neighbour.post(
                "/v1/clusters",
                json={"name": "nosy", "gpu_count": 0, "docker_image": DEV_IMAGE,
                      "memory_gb": 1, "cpu_cores": 1},
            )  # fmt: skip
            assert r.status_code == 201, r.text
            nosy = r.json()["data"]["id"]

            def nosy_running() -> bool:
                data = neighbour.get(f"/v1/clusters/{nosy}").json()["data"]
                return bool(data["status"] == "running")

            wait(nosy_running, 120, "the neighbour's cluster running")
            name = span.server.server.ctx.ownership.container(nosy)
            where = next(
                h for h in span.hosts
                if name in {r["Names"][0].lstrip("/") for r in span.api(h).containers()}
            )  # fmt: skip
            # ICMP works from it (to its own gateway), so a failed ping below means blocked.
            gateway = "$(ip route | awk '/default/ {print $3}')"
            code, out = span.sh(where, name, f"ping -c 1 -W 2 {gateway}")
            assert code == 0, out
            for node, (_, address) in nodes.items():
                code, out = span.sh(where, name, f"ping -c 1 -W 2 {address}")
                assert code != 0, f"ping reached {node}: {out}"
                code, out = span.sh(where, name, f"nc -w 2 {address} 22 </dev/null")
                assert code != 0 and "SSH" not in out, f"TCP reached {node}: {out}"
            assert neighbour.delete(f"/v1/clusters/{nosy}").status_code in (200, 202, 204)

        # A drained host's worker is recreated, same name, on the one host with room.
        fourth = span.add_host(c, span.sims[3], "sim-3", 2)
        drained = nodes[workers[1]][0]
        r = c.post(f"/v1/hosts/{drained}/drain")
        assert r.status_code == 200, r.text
        assert span.nodes(cid)[workers[1]][0] == fourth
        wait_running(c, cid, params, 600)
        assert span.labelled(fourth, cid) == {workers[1]}
        code, out = span.sh(ctl_host, controller, "srun -N3 hostname | sort")
        assert code == 0 and out.split() == sorted(workers), out

        # A job holds the three workers; a worker added where there is room (the drained
        # host, back in service) joins while the job runs.
        assert c.post(f"/v1/hosts/{drained}/uncordon").status_code == 200
        code, out = span.sh(ctl_host, controller, "sbatch -N3 --wrap 'sleep 600'")
        assert code == 0, out
        r = c.put(
            f"{BASE}{cid}/", params=params, json={"action": "scale_cluster", "additional_nodes": 1}
        )
        assert r.status_code == 200, r.text
        wait_running(c, cid, params, 600)
        new = f"{prefix}-worker-4"
        assert span.nodes(cid)[new][0] == drained
        code, out = span.sh(ctl_host, controller, "sinfo -h -N -o '%N %T'")
        states = dict(line.split() for line in out.splitlines() if line.strip())
        assert states.get(new) == "idle", out
        assert all(states.get(w) in ("allocated", "alloc") for w in workers), out

        assert c.delete(f"{BASE}{cid}/", params=params).status_code in (200, 202, 204)

        def gone() -> bool:
            return all(not span.labelled(h, cid) for h in span.hosts)

        wait(gone, 180, "the cluster's nodes removed from every host")
