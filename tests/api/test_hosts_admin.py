"""``/v1/hosts`` as an operator uses it, over real HTTP: add a host by its engine URL
(declared inventory kept, the rest left to the heartbeat), list and show every host
with reachability, capacity and what runs on it, cordon and uncordon, delete only an
empty host, and the installation's SSH key. Every refusal in the v1 envelope."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gpuyard.api.rest.schemas.hosts import (
    HostDeletedEnvelope,
    HostDrainEnvelope,
    HostEnvelope,
    HostListEnvelope,
    SshPublicKeyEnvelope,
)
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.store.schema import Cluster, Host, HostGpu, VolumeMove
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings, refused, v1_error

H100 = "NVIDIA H100 80GB HBM3"
SSH_HOST = {
    "name": "gpu-1",
    "engine_url": "ssh://gpuyard@gpu-1.example.com:2222",
    "location": "eu-west",
    "cloud_type": "COMMUNITY",
    # A display name is taken for the catalog's id.
    "gpus": "H100 SXM:2",
    "vcpus": 32,
    "memory_gb": 256,
    "disk_gb": 2000,
}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[LiveServer]:
    """A server whose periodic heartbeats are an hour apart: a host added during a test
    is heartbeaten only when the test says (``heartbeat``)."""
    settings = make_settings(tmp_path / "home", heartbeat_interval_s=3600)
    with live_server(settings, FakeRuntime()) as server:
        yield server


def heartbeat(srv: LiveServer) -> None:
    srv.server.reconciler.heartbeat_now()


def add(srv: LiveServer, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    with srv.client(key) as c:
        return c.post("/v1/hosts", json=body)


def added(srv: LiveServer, body: dict[str, Any]) -> dict[str, Any]:
    r = add(srv, body)
    assert r.status_code == 201, r.text
    HostEnvelope.model_validate(r.json())
    data: dict[str, Any] = r.json()["data"]
    return data


def get(srv: LiveServer, path: str) -> dict[str, Any]:
    with srv.client() as c:
        r = c.get(path)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def key_of_scope(srv: LiveServer, scope: Scope) -> str:
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email=f"{scope}@example.com", name="u")
        return issue_key(session, user_id=user.id, account_id=account.id, name="k", scope=scope).key


def test_an_added_host_keeps_what_was_declared_and_waits_for_its_first_heartbeat(
    fleet: LiveServer,
) -> None:
    host = added(fleet, SSH_HOST)
    assert host["status"] == "active"
    assert host["reachability"] == "unknown" and host["healthy"] is False
    assert host["last_heartbeat_at"] is None and host["is_local"] is False
    assert host["engine_url"] == SSH_HOST["engine_url"]
    assert host["address"] == "gpu-1.example.com"  # the engine URL's host
    assert (host["location"], host["cloud_type"]) == ("eu-west", "COMMUNITY")
    assert host["inventory"] == {
        "vcpus": "declared",
        "memory_gb": "declared",
        "disk_gb": "declared",
        "gpus": "declared",
    }
    assert host["gpu_source"] == "declared"
    assert host["capacity"]["total"] == {
        "gpus": {H100: 2},
        "vcpus": 32,
        "memory_gb": 256,
        "disk_gb": 2000,
    }
    assert host["capacity"]["free"]["gpus"] == {H100: 2}
    assert host["clusters"] == []
    with fleet.server.ctx.read() as s:
        rows = s.scalars(select(HostGpu).where(HostGpu.host_id == host["id"])).all()
        assert [(g.gpu_index, g.gpu_type) for g in rows] == [(0, H100), (1, H100)]
        stored = s.get(Host, host["id"])
        assert stored is not None and set(stored.declared) >= {"vcpus", "memory_gb", "disk_gb"}

    # Every host is listed, healthy or not.
    listed = get(fleet, "/v1/hosts")
    HostListEnvelope.model_validate({"success": True, "data": listed, "meta": {"request_id": "x"}})
    assert [h["name"] for h in listed["hosts"]][1:] == ["gpu-1"]

    heartbeat(fleet)
    after = get(fleet, f"/v1/hosts/{host['id']}")
    assert after["reachability"] == "reachable" and after["healthy"] is True
    assert after["last_heartbeat_at"] is not None and after["engine"]["reachable"] is True


def test_fields_not_declared_are_left_to_discovery(fleet: LiveServer) -> None:
    host = added(fleet, {"name": "bare", "engine_url": "unix:///run/other/podman.sock"})
    assert host["inventory"] == {
        "vcpus": "discovered",
        "memory_gb": "discovered",
        "disk_gb": "discovered",
        "gpus": "discovered",
    }
    assert host["gpus"] == [] and host["declared"] == []
    assert host["cloud_type"] == "SECURE" and host["location"] == "local"
    # A unix:// engine is on the server's machine: its address is the server's.
    local = get(fleet, "/v1/hosts")["hosts"][0]
    assert host["address"] == local["address"]


def test_a_failed_first_heartbeat_shows_why(fleet: LiveServer) -> None:
    host = added(fleet, {"name": "away", "engine_url": "ssh://root@10.0.0.9"})
    runtime = fleet.server.reconciler.fleet.local
    assert isinstance(runtime, FakeRuntime)
    runtime.unavailable = "ssh: connect to host 10.0.0.9 port 22: No route to host"
    try:
        heartbeat(fleet)
    finally:
        runtime.unavailable = None
    seen = get(fleet, f"/v1/hosts/{host['id']}")
    assert seen["reachability"] == "unreachable" and seen["healthy"] is False
    assert "No route to host" in seen["heartbeat_error"]
    assert seen["engine"] == {"reachable": False, "message": seen["heartbeat_error"]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"engine_url": "http://gpu-1:2375"}, "engine_url"),
        ({"engine_url": "ssh://gpu-1.example.com"}, "engine_url"),  # no user
        ({"engine_url": "ssh://root:secret@gpu-1"}, "engine_url"),  # a password
        ({"engine_url": "ssh://root@gpu-1:99999"}, "engine_url"),
        ({"engine_url": "ssh://root@gpu_1!"}, "engine_url"),
        ({"engine_url": "ssh://root@gpu-1/run/../etc/x.sock"}, "engine_url"),
        ({"engine_url": "unix://relative.sock"}, "engine_url"),
        ({"engine_url": "tcp://gpu-1"}, "engine_url"),  # no port
        ({"engine_url": "tcp://gpu-1:2376?tls=1"}, "engine_url"),
        ({"engine_url": "tcp://gpu-1:2376"}, "engine_tls_dir"),  # not loopback, no TLS
        ({"engine_url": "ssh://root@gpu-1", "engine_tls_dir": "/etc/certs"}, "engine_tls_dir"),
        ({"engine_url": "tcp://gpu-1:2376", "engine_tls_dir": "certs"}, "engine_tls_dir"),
        ({"gpus": "NVIDIA Imaginary 9000:2"}, "gpus"),
        ({"gpus": "RTX A6000"}, "gpus"),
        ({"gpus": "RTX A6000:0"}, "gpus"),
        ({"gpus": [{"gpu_type": "RTX A6000", "count": "4"}]}, "gpus"),
        (
            {"gpus": [{"gpu_type": "RTX A6000", "count": 40}, {"gpu_type": "L4", "count": 40}]},
            "gpus",
        ),
        ({"gpus": 4}, "gpus"),
        ({"cloud_type": "private"}, "cloud_type"),
        ({"vcpus": "8"}, "vcpus"),
        ({"vcpus": 0}, "vcpus"),
        ({"name": "a\x1b[31mred"}, "name"),
        ({"name": "   "}, "name"),
        ({"address": "gpu 1"}, "address"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_bodies_are_refused_naming_the_field(
    fleet: LiveServer, body: dict[str, Any], field: str
) -> None:
    full = {"name": "h", "engine_url": "ssh://root@gpu-1", **body}
    refused(add(fleet, full), field)
    assert len(get(fleet, "/v1/hosts")["hosts"]) == 1  # nothing was stored


def test_tcp_engines_need_tls_unless_on_loopback(fleet: LiveServer, tmp_path: Path) -> None:
    added(fleet, {"name": "lo", "engine_url": "tcp://127.0.0.1:2375"})
    certs = tmp_path / "certs"
    certs.mkdir()
    for name in ("ca.pem", "cert.pem"):
        (certs / name).write_text("x")
    body = {"name": "tls", "engine_url": "tcp://gpu-2.example.com:2376"}
    refused(add(fleet, {**body, "engine_tls_dir": str(certs)}), "engine_tls_dir")
    (certs / "key.pem").write_text("x")
    host = added(fleet, {**body, "engine_tls_dir": str(certs)})
    assert host["engine_tls_dir"] == str(certs) and host["address"] == "gpu-2.example.com"


def test_a_name_or_engine_already_registered_is_a_conflict(fleet: LiveServer) -> None:
    first = added(fleet, {"name": "gpu-1", "engine_url": "ssh://core@GPU-1.example.com"})
    err = v1_error(
        add(fleet, {"name": "gpu-1", "engine_url": "ssh://core@other"}), 409, "HOST_EXISTS"
    )
    assert err["details"] == {"field": "name", "host_id": first["id"]}
    # The same engine, spelled otherwise (case of the host, the default port).
    err = v1_error(
        add(fleet, {"name": "again", "engine_url": "ssh://core@gpu-1.example.com:22/"}),
        409,
        "HOST_EXISTS",
    )
    assert err["details"] == {"field": "engine_url", "host_id": first["id"]}
    # Another user's engine on that machine (rootless Podman) is another engine.
    added(fleet, {"name": "gpu-1-alice", "engine_url": "ssh://alice@gpu-1.example.com"})


def test_every_route_needs_an_admin_key(fleet: LiveServer) -> None:
    writer = key_of_scope(fleet, Scope.WRITE)
    calls = [
        ("GET", "/v1/hosts", None),
        ("POST", "/v1/hosts", SSH_HOST),
        ("GET", "/v1/hosts/1", None),
        ("GET", "/v1/hosts/ssh-key", None),
        ("POST", "/v1/hosts/1/cordon", None),
        ("POST", "/v1/hosts/1/uncordon", None),
        ("DELETE", "/v1/hosts/1", None),
    ]
    for method, path, body in calls:
        with fleet.client(writer) as c:
            v1_error(c.request(method, path, json=body), 403, "FORBIDDEN")
        r = httpx.request(method, fleet.url + path, json=body, verify=trusted_tls())
        v1_error(r, 401, "UNAUTHORIZED")
    assert len(get(fleet, "/v1/hosts")["hosts"]) == 1
    assert get(fleet, "/v1/hosts/1")["status"] == "active"


def test_unknown_and_malformed_ids(fleet: LiveServer) -> None:
    with fleet.client() as c:
        for method, path in (
            ("GET", "/v1/hosts/999"),
            ("POST", "/v1/hosts/999/cordon"),
            ("POST", "/v1/hosts/999/uncordon"),
            ("DELETE", "/v1/hosts/999"),
        ):
            v1_error(c.request(method, path), 404, "HOST_NOT_FOUND")
        refused(c.get("/v1/hosts/abc"), "host_id")
        refused(c.post("/v1/hosts/0/cordon"), "host_id")


def test_cordon_and_uncordon_set_the_status(fleet: LiveServer) -> None:
    host = added(fleet, SSH_HOST)
    path = f"/v1/hosts/{host['id']}"
    with fleet.client() as c:
        for _ in range(2):  # idempotent
            r = c.post(path + "/cordon")
            assert r.status_code == 200, r.text
            HostEnvelope.model_validate(r.json())
            assert r.json()["data"]["status"] == "cordoned"
        assert c.get(path).json()["data"]["status"] == "cordoned"
        assert c.post(path + "/uncordon").json()["data"]["status"] == "active"
        # A draining host is cordoned already; uncordon ends the drain.
        with fleet.server.ctx.transaction() as s:
            row = s.get(Host, host["id"])
            assert row is not None
            row.status = "draining"
        assert c.post(path + "/cordon").json()["data"]["status"] == "draining"
        assert c.post(path + "/uncordon").json()["data"]["status"] == "active"
        # The server's own host may be cordoned too.
        assert c.post("/v1/hosts/1/cordon").json()["data"]["status"] == "cordoned"
        assert c.post("/v1/hosts/1/uncordon").json()["data"]["status"] == "active"


def _wait(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_host_holding_a_cluster_is_deleted_only_once_the_cluster_is_gone(
    fleet: LiveServer,
) -> None:
    host = added(fleet, SSH_HOST)
    host_id = host["id"]
    heartbeat(fleet)  # healthy: placement may use it
    with fleet.client() as c:
        # Only the new host has H100s.
        r = c.post(
            "/v1/clusters",
            json={"docker_image": "img", "gpu_type": H100, "gpu_count": 1, "cloud_type": "ALL",
                  "volume_gb": 5, "ports": [{"internal_port": 22}]},
        )  # fmt: skip
        assert r.status_code in (200, 201), r.text
        cluster_id = r.json()["data"]["id"]
        with fleet.server.ctx.read() as s:
            cluster = s.get(Cluster, cluster_id)
            assert cluster is not None and cluster.host_id == host_id

        shown = c.get(f"/v1/hosts/{host_id}").json()["data"]
        [on] = shown["clusters"]
        assert (on["kind"], on["id"], on["gpu_count"], on["gpus_held"]) == (
            "cluster",
            cluster_id,
            1,
            1,
        )
        assert shown["capacity"]["allocated"]["gpus"] == {H100: 1}
        assert shown["capacity"]["free"]["gpus"] == {H100: 1}

        err = v1_error(c.delete(f"/v1/hosts/{host_id}"), 409, "HOST_NOT_EMPTY")
        left = err["details"]["left"]
        assert left["clusters"] == [cluster_id]
        assert left["reservations"] == [cluster_id]
        assert left["gpu_allocations"] == [{"gpu_index": 0, "holder": cluster_id}]
        assert [p["holder"] for p in left["port_allocations"]] == [cluster_id]
        assert cluster_id in err["message"]

        assert c.delete(f"/v1/clusters/{cluster_id}").status_code == 200
        _wait(lambda: c.get(f"/v1/clusters/{cluster_id}").json()["data"]["status"] == "terminated")
        r = c.delete(f"/v1/hosts/{host_id}")
        assert r.status_code == 200, r.text
        HostDeletedEnvelope.model_validate(r.json())
        assert r.json()["data"] == {"id": host_id, "name": "gpu-1", "deleted": True}
        v1_error(c.get(f"/v1/hosts/{host_id}"), 404, "HOST_NOT_FOUND")
        # The terminated cluster is still answered; it no longer names the host.
        r = c.get(f"/v1/clusters/{cluster_id}")
        assert r.status_code == 200, r.text
    with fleet.server.ctx.read() as s:
        assert s.scalars(select(HostGpu).where(HostGpu.host_id == host_id)).all() == []
        cluster = s.get(Cluster, cluster_id)
        assert cluster is not None and cluster.host_id is None


def test_a_volume_moving_to_or_from_the_host_keeps_it(fleet: LiveServer) -> None:
    host = added(fleet, SSH_HOST)
    with fleet.server.ctx.transaction() as s:
        s.add(
            VolumeMove(
                cluster_id="abcdefghijklmn",
                from_host_id=1,
                to_host_id=host["id"],
                volume_gb=5,
                source_volume="v",
                reason="test",
                status="copying",
            )
        )
    with fleet.client() as c:
        err = v1_error(c.delete(f"/v1/hosts/{host['id']}"), 409, "HOST_NOT_EMPTY")
        assert err["details"]["left"] == {
            "volume_moves": [
                {
                    "cluster_id": "abcdefghijklmn",
                    "from_host_id": 1,
                    "to_host_id": host["id"],
                    "status": "copying",
                }
            ]
        }
        # The source host counts the volume until the move ends.
        assert c.get("/v1/hosts/1").json()["data"]["capacity"]["allocated"]["disk_gb"] == 5
        with fleet.server.ctx.transaction() as s:
            move = s.get(VolumeMove, "abcdefghijklmn")
            assert move is not None
            move.status = "done"
        # A finished move is history: it goes with the host.
        assert c.delete(f"/v1/hosts/{host['id']}").status_code == 200
    with fleet.server.ctx.read() as s:
        assert s.get(VolumeMove, "abcdefghijklmn") is None


def test_the_servers_own_host_cannot_be_deleted(fleet: LiveServer) -> None:
    with fleet.client() as c:
        err = v1_error(c.delete("/v1/hosts/1"), 409, "LOCAL_HOST")
    assert "runs on" in err["message"]
    assert get(fleet, "/v1/hosts/1")["is_local"] is True


def test_the_ssh_key_is_the_installations(fleet: LiveServer) -> None:
    """Made on first use; the same line afterwards; the private half is the server's
    alone (0600 in a 0700 directory)."""
    keys = fleet.server.ctx.settings.home / "ssh"
    with fleet.client() as c:
        first = c.get("/v1/hosts/ssh-key")
        again = c.get("/v1/hosts/ssh-key")
    assert first.status_code == 200, first.text
    SshPublicKeyEnvelope.model_validate(first.json())
    line = first.json()["data"]["public_key"]
    assert line.startswith("ssh-ed25519 ") and again.json()["data"]["public_key"] == line
    assert (keys / "id_ed25519.pub").read_text().strip() == line
    assert (keys / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert keys.stat().st_mode & 0o777 == 0o700


def test_a_cordoned_host_takes_no_new_cluster_until_uncordoned(fleet: LiveServer) -> None:
    host = added(fleet, SSH_HOST)
    heartbeat(fleet)
    body = {"docker_image": "img", "gpu_type": H100, "gpu_count": 1, "cloud_type": "ALL"}
    with fleet.client() as c:
        assert c.post(f"/v1/hosts/{host['id']}/cordon").status_code == 200
        # Only this host has H100s: nothing can take the cluster.
        v1_error(c.post("/v1/clusters", json=body), 409, "INSUFFICIENT_CAPACITY")
        assert c.post(f"/v1/hosts/{host['id']}/uncordon").status_code == 200
        r = c.post("/v1/clusters", json=body)
        assert r.status_code in (200, 201), r.text
    with fleet.server.ctx.read() as s:
        cluster = s.get(Cluster, r.json()["data"]["id"])
        assert cluster is not None and cluster.host_id == host["id"]


def test_drain_moves_a_stopped_cluster_and_stops_a_running_one(fleet: LiveServer) -> None:
    host = added(fleet, SSH_HOST)
    host_id = host["id"]
    heartbeat(fleet)
    body = {
        "docker_image": "img",
        "gpu_type": H100,
        "gpu_count": 1,
        "volume_gb": 5,
        "cloud_type": "ALL",
    }
    with fleet.client() as c:
        running = c.post("/v1/clusters", json=body).json()["data"]["id"]
        resting = c.post("/v1/clusters", json=body).json()["data"]["id"]

        def status(cid: str) -> str:
            return str(c.get(f"/v1/clusters/{cid}").json()["data"]["status"])

        _wait(lambda: status(running) == "running" and status(resting) == "running")
        assert c.post(f"/v1/clusters/{resting}/stop").status_code == 200
        _wait(lambda: status(resting) == "stopped")

        r = c.post(f"/v1/hosts/{host_id}/drain")
        assert r.status_code == 200, r.text
        HostDrainEnvelope.model_validate(r.json())
        data = r.json()["data"]
        assert data["host"]["status"] == "draining"
        assert data["drain"] == {
            "stopping": [running],
            "moving": [resting],
            "cannot_move": [],
            "training_nodes": {"moving": [], "cannot_move": []},
        }
        # The stopped cluster's volume goes to the only other host (the server's own).
        _wait(lambda: c.get(f"/v1/clusters/{resting}").json()["data"]["host"]["id"] == 1)
        assert status(resting) == "stopped"
        # No other host has H100s: the running one stops and stays until it can move.
        _wait(lambda: status(running) == "stopped")
        heartbeat(fleet)  # the drain's scan tries to start it elsewhere, and cannot
        shown = c.get(f"/v1/clusters/{running}").json()["data"]
        assert shown["host"]["id"] == host_id and shown["status"] == "stopped"
        v1_error(c.post("/v1/hosts/999999/drain"), 404, "HOST_NOT_FOUND")

        assert c.delete(f"/v1/clusters/{running}").status_code == 200
        _wait(lambda: status(running) == "terminated")
        assert c.delete(f"/v1/hosts/{host_id}").status_code == 200
