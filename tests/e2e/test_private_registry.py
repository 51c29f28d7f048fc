"""A real private registry on loopback (Debian's ``docker-registry`` with htpasswd
auth) and a real Podman pull through the server: a cluster whose image needs
credentials fails with the fixed message without them, runs with a registry auth, and
a copy of the image on the host does not let a cluster without credentials run it.

The registry, its Podman service (one that treats this registry as plain HTTP) and
the server are this test's own; what it pushed and pulled is removed at the end.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuyard.core.ownership import Ownership
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.runtimes.engines.pull_errors import CREDENTIALS_NEEDED
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.engines.url import PodmanService
from gpuyard.runtimes.records import RegistryCredentials
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import ServerProcess, wait_status
from tests.helpers import free_port
from tests.required_parts import needs_tools

pytestmark = needs_tools(
    "docker-registry", "htpasswd", "podman", how="apt-get install docker-registry apache2-utils"
)

USER = "robot"
PASSWORD = "registry-e2e-" + "z" * 12


@contextlib.contextmanager
def private_registry(root: Path) -> Iterator[int]:
    """``docker-registry`` on a free loopback port, htpasswd auth, storage under
    ``root``; yields the port once it answers."""
    port = free_port()
    htpasswd = root / "htpasswd"
    hashed = subprocess.run(
        ["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True
    ).stdout
    htpasswd.write_text(hashed)
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: gpuyard-test\n    path: {htpasswd}\n"
    )
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if (
                    httpx.get(
                        f"http://127.0.0.1:{port}/v2/", timeout=2, verify=trusted_tls()
                    ).status_code
                    == 401
                ):
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (root / "registry.log").read_text()
            assert time.monotonic() < deadline, "the registry did not answer"
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@contextlib.contextmanager
def insecure_podman(registry: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Podman service of this test's own that pulls from ``registry`` over plain
    HTTP (a registries.conf naming it insecure); the shared storage, so the dev image
    is there."""
    workdir = Path(tempfile.mkdtemp(prefix="gy-reg-"))
    conf = workdir / "registries.conf"
    conf.write_text(
        "unqualified-search-registries = []\n\n[[registry]]\n"
        f'location = "{registry}"\ninsecure = true\n'
    )
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    service = PodmanService(workdir / "podman.sock")
    try:
        yield service.start()
    finally:
        service.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)


def test_a_private_image_runs_only_with_its_credentials(
    tmp_path: Path, engine_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # engine_url: the session's service built the dev image into the shared storage.
    assert engine_url
    root = tmp_path / "registry"
    root.mkdir()
    with private_registry(root) as port:
        registry = f"127.0.0.1:{port}"
        image = f"{registry}/busybox:1"
        pushed = podman(
            "push",
            "--tls-verify=false",
            "--creds",
            f"{USER}:{PASSWORD}",
            DEV_IMAGE,
            f"docker://{image}",
        )
        assert pushed.returncode == 0, pushed.stderr
        # Anonymous pulls are refused by the registry itself.
        anonymous = podman("pull", "--tls-verify=false", image)
        assert anonymous.returncode != 0
        with insecure_podman(registry, monkeypatch) as url:
            server = ServerProcess(tmp_path / "home", url, free_port())
            server.extra_env["GPUYARD_ALLOWED_REGISTRIES"] = registry
            try:
                server.start()
                with server.client() as c:
                    run_the_three_clusters(c, image)
                server_log = "".join(
                    p.read_text(errors="replace") for p in (tmp_path / "home").rglob("*.log")
                )
                assert PASSWORD not in server_log
            finally:
                server.cleanup()
                podman("rmi", "--force", image)


def run_the_three_clusters(c: httpx.Client, image: str) -> None:
    bare = c.post("/v1/clusters", json={"docker_image": image})
    assert bare.status_code == 201, bare.text
    failed = wait_status(c, bare.json()["data"]["id"], {"error", "running"}, timeout=120)
    assert failed["status"] == "error", failed
    assert CREDENTIALS_NEEDED in failed["error_message"], failed["error_message"]

    r = c.post("/v1/registry-auths", json={"name": "local", "username": USER, "password": PASSWORD})
    assert r.status_code == 201, r.text
    auth_id = r.json()["data"]["id"]
    assert PASSWORD not in r.text
    good = c.post("/v1/clusters", json={"docker_image": image, "registry_auth_id": auth_id})
    assert good.status_code == 201, good.text
    running = wait_status(c, good.json()["data"]["id"], {"error", "running"}, timeout=120)
    assert running["status"] == "running", running

    # The image is on the host now; a cluster without credentials still may not run it.
    again = c.post("/v1/clusters", json={"docker_image": image})
    assert again.status_code == 201, again.text
    refused = wait_status(c, again.json()["data"]["id"], {"error", "running"}, timeout=120)
    assert refused["status"] == "error", refused
    assert CREDENTIALS_NEEDED in refused["error_message"]
    for cid in (bare.json()["data"]["id"], good.json()["data"]["id"], again.json()["data"]["id"]):
        c.delete(f"/v1/clusters/{cid}")


def test_credentials_on_a_local_image_ask_no_registry(engine_url: str) -> None:
    """A localhost/ image is never pulled, with credentials or without."""
    rt = DockerEngineRuntime(engine_url, timeout_s=60, owner=Ownership.new())
    rt.ensure_image(DEV_IMAGE, credentials=RegistryCredentials(USER, PASSWORD), fresh=True)
