"""Cluster logs on real Podman through ``gpuyard serve``: SSE follow of what a container
prints after the request began, ``Last-Event-ID`` resuming without loss or
duplicates (Podman stamps lines to the second, so several share a stamp), output kept
across stop (the container is removed) and gone with terminate.

The container prints ``tick N`` three times a second and ``bye`` when told to stop, so
gaps and repeats show as broken sequences."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from tests.api.sse import Event, events
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import gone, running_server, wait_status
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

TICKER = (
    'sh -c \'trap "echo bye; exit 0" TERM; i=0; '
    "while true; do echo tick $i; i=$((i+1)); sleep 0.3; done'"
)
TICK = re.compile(r"tick (\d+)")


def ticks(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := TICK.fullmatch(line))]


def container_ticks(stream: Iterator[Event], count: int) -> list[Event]:
    """Container events from ``stream`` until ``count`` ticks have come."""
    got: list[Event] = []
    for event in stream:
        if event.event == "message" and event.json["source"] == "container":
            got.append(event)
            if len(ticks([e.json["line"] for e in got])) >= count:
                return got
    raise AssertionError(f"the stream ended after {got}")


def lines_of(c: httpx.Client, cid: str, **params: Any) -> dict[str, Any]:
    r = c.get(f"/v1/clusters/{cid}/logs", params={"tail": 5000, **params})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_follow_resume_stop_and_terminate_on_real_containers(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        body = {
            "gpu_type": "NVIDIA RTX A6000",
            "docker_image": DEV_IMAGE,
            "docker_args": TICKER,
            "memory_gb": 1,
            "cpu_cores": 1,
        }
        r = c.post("/v1/clusters", json=body)
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        assert wait_status(c, cid, {"running", "error"})["status"] == "running"
        url = f"{server.url}/v1/clusters/{cid}/logs"
        # The key in the query, as an EventSource (which cannot set headers) sends it.
        key = {"api_key": server.key}
        with httpx.Client(timeout=20, verify=trusted_tls()) as sse:
            # tail=0: only what the container prints from now on.
            began = time.time()
            with sse.stream("GET", url, params={**key, "follow": "true", "tail": 0}) as s:
                assert s.status_code == 200
                first = container_ticks(events(s), 4)
            assert all(
                e.json["ts"] >= time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(began - 1))
                for e in first
            )
            seen = ticks([e.json["line"] for e in first])
            assert seen == list(range(seen[0], seen[0] + len(seen)))
            last = first[-1].id
            assert last is not None
            time.sleep(1.5)  # it goes on printing while nobody listens
            headers = {"Last-Event-ID": last}
            with sse.stream("GET", url, params={**key, "follow": "true"}, headers=headers) as s:
                second = container_ticks(events(s), 6)
        resumed = ticks([e.json["line"] for e in second])
        assert resumed[0] == seen[-1] + 1, (seen, resumed)
        assert resumed == list(range(resumed[0], resumed[0] + len(resumed)))
        ids = [e.id for e in first + second]
        assert len(set(ids)) == len(ids)

        # Paging with after= gives the same lines as one read.
        whole = lines_of(c, cid)["data"]
        paged: list[dict[str, Any]] = []
        cursor = "0-0-0"
        while True:
            page = lines_of(c, cid, after=cursor, tail=4)
            paged += page["data"]
            cursor = page["meta"]["cursor"]
            if not page["meta"]["more"]:
                break
        assert [e["line"] for e in paged[: len(whole)]] == [e["line"] for e in whole]

        # Stop removes the container; its output stays readable, shutdown words included.
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        wait_status(c, cid, {"stopped"})
        assert gone(engine, server, cid)
        stopped = lines_of(c, cid)
        out = [e["line"] for e in stopped["data"] if e["source"] == "container"]
        all_ticks = ticks(out)
        assert all_ticks == list(range(len(all_ticks))) and len(all_ticks) > 10
        assert out[-1] == "bye"
        system = [e["line"] for e in stopped["data"] if e["source"] == "system"]
        assert any("-> stopped" in line for line in system)

        # Terminated: the output is gone with the cluster; its events remain.
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        wait_status(c, cid, {"terminated"})
        after = lines_of(c, cid)
        assert [e for e in after["data"] if e["source"] == "container"] == []
        assert any("terminated" in e["line"] for e in after["data"])
    log = server.log.read_text()
    # The access log names the requests, the key in their query redacted.
    assert f"/v1/clusters/{cid}/logs?api_key=" in log and server.key not in log
