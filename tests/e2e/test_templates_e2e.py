"""Templates on real containers (``gpuyard serve``, a private Podman service, the
offline busybox image): a template's start script is what a cluster made from it runs
when it has no docker args (its output is in the cluster's logs), docker args of the
create win, and registry credentials a template and a live cluster name are kept from
deletion until neither does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import running_server, wait_status

pytestmark = pytest.mark.e2e

MARK = "from-the-start-script"


def container_lines(c: httpx.Client, cid: str, want: str, timeout: float = 60) -> list[str]:
    """The cluster's container output once a line holds ``want`` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        r = c.get(f"/v1/clusters/{cid}/logs", params={"tail": 1000})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        lines = [e["line"] for e in body["data"] if e["source"] == "container"]
        if any(want in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.3)


def test_start_script_runs_and_credentials_in_use_are_kept(tmp_path: Path, engine_url: str) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        auth = c.post("/v1/registry-auths", json={"name": "r", "username": "u", "password": "p"})
        assert auth.status_code == 201, auth.text
        aid = auth.json()["data"]["id"]
        template = {
            "name": "scripted",
            "docker_image": DEV_IMAGE,
            "start_script": f"echo {MARK} $MODE\nexec sleep 3600\n",
            "env": {"MODE": "from-template"},
            # A localhost/ image is never pulled: the credentials are only named.
            "container_registry_auth_id": str(aid),
        }
        made = c.post("/v1/templates", json=template)
        assert made.status_code == 201, made.text
        tid = made.json()["data"]["id"]
        base = {"template_id": tid, "gpu_count": 0, "memory_gb": 1, "cpu_cores": 1}

        r = c.post("/v1/clusters", json=base)
        assert r.status_code == 201, r.text
        scripted = r.json()["data"]
        assert scripted["registry_auth_id"] == aid
        assert wait_status(c, scripted["id"], {"running", "error"})["status"] == "running"
        lines = container_lines(c, scripted["id"], MARK)
        assert f"{MARK} from-template" in lines, lines

        r = c.post(
            "/v1/clusters", json={**base, "docker_args": "sh -c 'echo own-args; sleep 3600'"}
        )
        assert r.status_code == 201, r.text
        own = r.json()["data"]
        assert wait_status(c, own["id"], {"running", "error"})["status"] == "running"
        lines = container_lines(c, own["id"], "own-args")
        assert "own-args" in lines and not any(MARK in line for line in lines), lines

        refused = c.delete(f"/v1/registry-auths/{aid}")
        assert refused.status_code == 409, refused.text
        details = refused.json()["error"]["details"]
        assert details["template_ids"] == [tid]
        assert sorted(details["cluster_ids"]) == sorted([scripted["id"], own["id"]])

        assert c.delete(f"/v1/templates/{tid}").status_code == 200
        for cid in (scripted["id"], own["id"]):
            assert c.delete(f"/v1/clusters/{cid}").is_success
        for cid in (scripted["id"], own["id"]):
            wait_status(c, cid, {"terminated"})
        gone = c.delete(f"/v1/registry-auths/{aid}")
        assert gone.status_code == 200, gone.text
