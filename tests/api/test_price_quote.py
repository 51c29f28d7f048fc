"""POST /v1/prices/quote: the create form's estimate is what the bill charges (the
same arithmetic), for any key; bad sizes are 400 naming the field. Real HTTP."""

from __future__ import annotations

from typing import Any

import httpx

from tests.helpers import LiveServer

SIZE: dict[str, Any] = {
    "gpu_type": "NVIDIA RTX A6000",
    "gpu_count": 2,
    "cpu_cores": 8,
    "memory_gb": 32,
    "container_disk_gb": 50,
    "volume_gb": 100,
}


def quote(c: httpx.Client, **body: Any) -> dict[str, Any]:
    r = c.post("/v1/prices/quote", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def test_a_quote_is_the_rate_the_cluster_then_bills(srv: LiveServer) -> None:
    with srv.client() as c:
        q = quote(c, **SIZE)
        made = c.post("/v1/clusters", json={**SIZE, "docker_image": "img"})
        assert made.status_code == 201, made.text
        cost = made.json()["data"]["cost"]
        assert q["hourly"]["total"] == cost["hourly_rate"], (q, cost)
        assert q["hourly"]["gpu"] > 0 and q["hourly"]["volume"] > 0
        # Stopped: the volume only.
        assert q["hourly_stopped"]["total"] == q["hourly_stopped"]["volume"] > 0
        # More GPUs cost more; a network volume takes the volume off the cluster's rate.
        assert quote(c, **{**SIZE, "gpu_count": 4})["hourly"]["gpu"] == 2 * q["hourly"]["gpu"]
        r = c.post("/v1/networkvolumes", json={"name": "d", "size": 10, "dataCenterId": "local"})
        assert r.status_code == 201, r.text
        nv = quote(c, **SIZE, network_volume_id=r.json()["data"]["id"])
        assert nv["hourly"]["volume"] == 0
        # One the account does not have is 404, as everywhere.
        r = c.post("/v1/prices/quote", json={**SIZE, "network_volume_id": "nope"})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "NETWORK_VOLUME_NOT_FOUND"


def test_bad_sizes_are_400_naming_the_field(srv: LiveServer) -> None:
    with srv.client() as c:
        for body, field in (
            ({**SIZE, "gpu_type": "no such gpu"}, "gpu_type"),
            ({**SIZE, "gpu_count": -1}, "gpu_count"),
            ({**SIZE, "interruptible": True, "bid_per_gpu": 0.01}, "bid_per_gpu"),
        ):
            r = c.post("/v1/prices/quote", json=body)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "VALIDATION_ERROR"
            assert field in (error["details"].get("field") or str(error["details"])), error
