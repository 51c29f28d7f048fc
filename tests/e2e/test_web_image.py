"""The web test image on real Podman: built once and cached by its recipe hash, run as a
container of an installation this test makes (labelled, removed after), every endpoint
checked through the published port, and a stop that takes well under a second."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator

import docker
import httpx
import pytest
import websockets

from gpuyard.core.ownership import LABEL_INSTALLATION, Ownership
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools.web_image import (
    WEB_IMAGE,
    WEB_PORT,
    build_web_image,
    image_recipe,
    recipe_digest,
)
from tests.e2e.conftest import purge_installation
from tests.helpers import free_port
from tests.required_parts import needs_tools

# The web image is compiled (gcc) and run (podman).
pytestmark = [
    pytest.mark.e2e,
    needs_tools(
        "podman", "gcc", how="apt-get install podman runc gcc (bash scripts/setup-system.sh)"
    ),
]


def image_id() -> str:
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", WEB_IMAGE],
        capture_output=True,
        check=True,
    )
    return out.stdout.decode().strip()


@pytest.fixture(scope="module")
def web_image(engine_url: str) -> str:
    return build_web_image("podman")


@pytest.fixture
def web(engine: docker.DockerClient, engine_url: str, web_image: str) -> Iterator[tuple[str, str]]:
    """A running container of the web image: (its host:port, its container name)."""
    owner = Ownership.new()
    port = free_port()
    name = f"gy-web-test-{uuid.uuid4().hex[:8]}"
    container = engine.containers.run(
        web_image,
        name=name,
        hostname="webhost",
        detach=True,
        labels={LABEL_INSTALLATION: owner.installation_id},
        ports={f"{WEB_PORT}/tcp": ("127.0.0.1", port)},
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(
                    f"http://127.0.0.1:{port}/healthz", timeout=1, verify=trusted_tls()
                ).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield f"127.0.0.1:{port}", container.name
    finally:
        purge_installation(engine_url, owner.installation_id)


def test_build_is_cached_by_recipe(web_image: str) -> None:
    assert image_recipe(web_image, "podman") == recipe_digest()
    before = image_id()
    assert build_web_image("podman") == WEB_IMAGE
    assert image_id() == before  # the same image: nothing was built again


def test_endpoints_in_a_container(web: tuple[str, str]) -> None:
    addr, _ = web
    with httpx.Client(base_url=f"http://{addr}", verify=trusted_tls()) as client:
        page = client.get("/")
        assert page.status_code == 200 and "host: webhost" in page.text
        mib = client.get("/bytes/1048576")
        assert len(mib.content) == 1 << 20 and mib.content[:4] == b"\x00\x01\x02\x03"
        body = b"gpuyard" * 10_000
        assert client.post("/echo", content=body).content == body
        lines = []
        with client.stream("GET", "/stream?seconds=0.6&interval=0.2") as r:
            lines = list(r.iter_lines())
        assert len(lines) == 4 and lines[0].startswith("line 0")

    async def ws_echo() -> None:
        async with websockets.connect(f"ws://{addr}/ws") as ws:
            await ws.send("ping?")
            assert await ws.recv() == "ping?"
            await ws.send(b"\x00\xff" * 40_000)
            assert await ws.recv() == b"\x00\xff" * 40_000
            await asyncio.wait_for(await ws.ping(), 5)

    asyncio.run(ws_echo())


def test_stop_is_prompt(web: tuple[str, str], engine: docker.DockerClient) -> None:
    addr, name = web
    container = engine.containers.get(name)
    # A long stream holds a connection process open: the stop must not wait for it.
    with httpx.stream(
        "GET", f"http://{addr}/stream?seconds=60&interval=1", verify=trusted_tls()
    ) as r:
        next(r.iter_lines())
        t0 = time.monotonic()
        container.stop(timeout=10)
        elapsed = time.monotonic() - t0
    container.reload()
    assert container.status == "exited"
    assert container.attrs["State"]["ExitCode"] == 0
    # Ignoring SIGTERM would take the whole 10 s timeout (then SIGKILL, exit code 137).
    assert elapsed < 8, f"stop took {elapsed:.1f}s (SIGTERM ignored?)"
