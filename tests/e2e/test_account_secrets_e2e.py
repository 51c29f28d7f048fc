"""An account secret in a real container (Podman): a cluster whose env is
``X={{ RUNPOD_SECRET_token }}`` gets the value in its container's env (read through
the engine), a changed secret at the next start; the API's answers, the events and
the server's log never hold it, and a start whose secret was deleted is refused
naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import container_name, running_server, wait_status

pytestmark = pytest.mark.e2e

VALUE = "e2e-secret-Vq93kd-value"
ROTATED = "e2e-secret-rotated-Lm20x"
REF = "{{ RUNPOD_SECRET_token }}"


def container_env(engine: docker.DockerClient, name: str) -> dict[str, str]:
    container: Any = engine.containers.get(name)
    pairs = container.attrs["Config"]["Env"] or []
    return dict(p.split("=", 1) for p in pairs)


def test_secret_reaches_the_container_and_nothing_else(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    answers: list[str] = []
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        r = c.post("/v1/secrets", json={"name": "token", "value": VALUE})
        assert r.status_code == 201, r.text
        sid = r.json()["data"]["id"]
        answers.append(r.text)
        env = {"X": REF, "AUTH": "Bearer {{RUNPOD_SECRET_token}}"}
        r = c.post(
            "/v1/clusters",
            json={
                "gpu_count": 0,
                "docker_image": DEV_IMAGE,
                "volume_gb": 0,
                "memory_gb": 1,
                "cpu_cores": 1,
                "env": env,
            },
        )
        assert r.status_code == 201, r.text
        answers.append(r.text)
        cid = r.json()["data"]["id"]
        assert wait_status(c, cid, {"running", "error"})["status"] == "running"
        inside = container_env(engine, container_name(server, cid))
        assert inside["X"] == VALUE and inside["AUTH"] == f"Bearer {VALUE}"

        # A new value at the next start.
        assert c.patch(f"/v1/secrets/{sid}", json={"value": ROTATED}).status_code == 200
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        wait_status(c, cid, {"stopped"})
        assert c.post(f"/v1/clusters/{cid}/start", json={}).status_code == 200
        assert wait_status(c, cid, {"running", "error"})["status"] == "running"
        assert container_env(engine, container_name(server, cid))["X"] == ROTATED

        for path in (
            f"/v1/clusters/{cid}",
            "/v1/clusters",
            f"/v2/clusters/{cid}",
            f"/v1/clusters/{cid}/events",
            "/v1/audit-events",
            "/v1/secrets",
        ):
            got = c.get(path)
            assert got.status_code == 200, (path, got.text)
            answers.append(got.text)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["env"] == env
        pod = httpx.post(
            f"{server.url}/graphql",
            headers={"Authorization": f"Bearer {server.key}"},
            json={"query": f'{{ pod(input: {{podId: "{cid}"}}) {{ env }} }}'},
            verify=trusted_tls(),
        )
        answers.append(pod.text)

        # Deleted: the next start is refused, naming the secret.
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        wait_status(c, cid, {"stopped"})
        assert c.delete(f"/v1/secrets/{sid}").status_code == 200
        refused = c.post(f"/v1/clusters/{cid}/start", json={})
        assert refused.status_code == 400 and "token" in refused.json()["error"]["message"]
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        log = server.log.read_text(errors="replace")
    for secret in (VALUE, ROTATED):
        assert not [a[:200] for a in answers if secret in a]
        assert secret not in log
