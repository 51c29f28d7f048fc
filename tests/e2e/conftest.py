"""Real-engine fixtures: a private ``podman system service`` for the session and the
offline busybox image built once; and the one clean-up the e2e suite may do.

The engine may be shared with a running dev server or another installation (its
storage is the machine's Podman storage), so a test never removes an object by name
prefix or by ``gpuyard.managed`` alone: only objects labelled with an installation id
the test itself created (:func:`purge_installation`).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_INSTALLATION, Ownership
from gpuyard.runtimes.engines.devimage import build_dev_image
from gpuyard.runtimes.engines.engine import Engine, vanished_mid_removal
from gpuyard.runtimes.engines.url import PodmanService
from gpuyard.runtimes.hosts.edge import IptablesEdge
from gpuyard.runtimes.hosts.firewall import IptablesIsolation
from tests.required_parts import need

DEV_IMAGE = "localhost/gpuyard/busybox:latest"
# How to get a Podman that serves the Docker API (tests/required_parts.py names it).
SERVICE_HOW = "apt-get install podman runc; bash scripts/setup-system.sh (containers.conf)"


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    # A short path under /tmp: unix socket paths are limited to 108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="gy-podman-"))
    service = PodmanService(workdir / "podman.sock")
    try:
        url = service.start()
    except RuntimeFailure as e:
        shutil.rmtree(workdir, ignore_errors=True)
        need("podman system service", f"cannot start it: {e.message}", how=SERVICE_HOW)
    try:
        build_dev_image("podman", DEV_IMAGE)
        yield url
    finally:
        service.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def local(engine_url: str) -> Iterator[Engine]:
    """An :class:`Engine` on the session's engine for a new installation of the test's
    own; everything labelled with it is purged afterwards (:func:`purge_installation`)."""
    owner = Ownership.new()
    engine = Engine(engine_url, owner=owner)
    try:
        yield engine
    finally:
        purge_installation(engine_url, owner.installation_id)


@pytest.fixture
def engine(engine_url: str) -> Iterator[docker.DockerClient]:
    """A Docker SDK client of the session's engine (for looking, and for exec)."""
    client = docker.DockerClient(base_url=engine_url)
    yield client
    client.close()


def purge_installation(engine_url: str, installation_id: str) -> list[str]:
    """Remove every container, volume and network labelled with ``installation_id``
    and its host firewall chain
    (an installation the calling test created), and nothing else. Each object's label is
    checked again before it is removed, so an engine that ignored the filter cannot make
    this touch somebody else's object. Returns the names removed (for messages)."""
    wanted = f"{LABEL_INSTALLATION}={installation_id}"

    def ours(labels: dict[str, str] | None) -> bool:
        return (labels or {}).get(LABEL_INSTALLATION) == installation_id

    removed: list[str] = []
    client = docker.DockerClient(base_url=engine_url)
    try:
        # A removal the server began (it was stopped meanwhile) may still be under way,
        # or have been cut off with the server's connection: asked again until the
        # engine lists none, so no test after this one meets them.
        deadline = time.monotonic() + 60
        while left := [
            c for c in client.containers.list(all=True, filters={"label": wanted}) if ours(c.labels)
        ]:
            for container in left:
                try:
                    container.remove(force=True, v=True)
                except docker.errors.APIError as e:
                    if not vanished_mid_removal(e) and "already in progress" not in str(e):
                        raise
                if container.name not in removed:
                    removed.append(container.name)
            if time.monotonic() > deadline:
                raise AssertionError(f"containers of {installation_id} stay: {left}")
            time.sleep(0.2)
        for volume in client.volumes.list(filters={"label": wanted}):
            if ours(volume.attrs.get("Labels")):
                with contextlib.suppress(docker.errors.NotFound):
                    volume.remove(force=True)
                removed.append(volume.name)
                # A sized volume's image (runtimes/volumes/images.py), which the engine
                # does not remove with the volume: named after it, on this machine.
                device = (volume.attrs.get("Options") or {}).get("device") or ""
                if Path(device).name == f"{volume.name}.img":
                    Path(device).unlink(missing_ok=True)
        for network in client.networks.list(filters={"label": wanted}):
            if ours(network.attrs.get("Labels")):
                with contextlib.suppress(docker.errors.NotFound):
                    network.remove()
                removed.append(network.name)
    finally:
        client.close()
    # The installation's host firewall chain (runtimes/hosts/firewall.py), if it made one,
    # and its training clusters' SSH rules (runtimes/hosts/edge.py), which a killed
    # server leaves in place by design.
    IptablesIsolation(installation_id[:8]).remove()
    IptablesEdge(installation_id[:8]).uninstall()
    return removed


# What a failed test's servers logged at WARNING or above: why a cluster went to
# ``error``, a stop that had to be retried. Their whole logs stay in the test's
# temporary folder; the report shows the end of these lines.
NOTABLE_LOG_LEVELS = (" WARNING ", " ERROR ", " CRITICAL ")
EVIDENCE_CHARS = 6000


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(tmp, Path):
            report.sections.append(("servers' warnings", servers_warnings(tmp)))


def servers_warnings(root: Path) -> str:
    """The WARNING-or-worse lines of every ``server.log`` under ``root`` (the end)."""
    parts = []
    for log in sorted(root.rglob("server.log")):
        text = log.read_text(errors="replace")
        notable = [line for line in text.splitlines() if any(x in line for x in NOTABLE_LOG_LEVELS)]
        parts.append(f"{log.relative_to(root)}:\n" + "\n".join(notable or ["(none)"]))
    return ("\n".join(parts) or "(no server log)")[-EVIDENCE_CHARS:]
