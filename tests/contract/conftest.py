"""The runtimes the contract suite runs against, each behind one :class:`Kit`: the
in-memory runtime (gpuyard.testing) and the real one on a private Podman service.

A test asks for ``kit`` and runs once per runtime. What a kit cannot share between the
two (how a container is made to print a line: the real one runs a command, the fake
one is told) is the kit's to do; what the test asserts is the same for both.

The Podman half acts for an installation of its own (a fresh :class:`Ownership`) and
removes afterwards only what carries that installation's id: the engine may be shared.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import ContainerSpec, Runtime
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.e2e.conftest import DEV_IMAGE, engine_url, purge_installation

__all__ = ["engine_url"]  # the session's Podman service (tests/e2e/conftest.py)

# What the shared container printed when it started.
SHARED_LINE = "contract-hello"


@dataclass
class Kit:
    """One runtime under contract, bound to its own installation."""

    runtime: Runtime
    owner: Ownership
    # Whether its engine takes exec calls (the in-memory one has none).
    execs: bool
    # How a container is made to have printed a line, for an engine that runs no
    # command (the in-memory one); None: the container's command prints it.
    tell: Callable[[str, str], None] | None = None
    # The clusters handed out by :meth:`cluster_id`, cleaned up afterwards.
    made: list[str] = field(default_factory=list)
    # The one running container the tests that only read share (:meth:`shared`).
    _shared: str | None = None

    def cluster_id(self) -> str:
        cid = "ct" + uuid.uuid4().hex[:12]
        self.made.append(cid)
        return cid

    def spec(self, cluster_id: str, says: str | None = None) -> ContainerSpec:
        """A container of ``cluster_id`` with a volume, printing ``says`` (when given)
        once it starts and then running until it is stopped."""
        script = 'trap "exit 0" TERM; '
        if says is not None:
            script += f"echo {says}; "
        script += "while true; do sleep 0.1; done"
        return ContainerSpec(
            cluster_id=cluster_id,
            image=DEV_IMAGE,
            command=("/bin/sh", "-c", script),
            env={},
            ports=(),
            volume_name=self.owner.volume(cluster_id),
            volume_mount_path="/workspace",
            cpu_cores=0,
            memory_gb=0,
            gpu_indices=(),
        )

    def start_saying(self, cluster_id: str, says: str) -> None:
        """Create and start ``cluster_id``'s container, which prints the line ``says``."""
        self.runtime.ensure_image(DEV_IMAGE)
        self.runtime.create(self.spec(cluster_id, says))
        self.runtime.start(cluster_id)
        if self.tell is not None:
            self.tell(cluster_id, says)

    def shared(self) -> str:
        """The cluster of a container left running for the tests that only read it
        (logs, exec), started on first use; it printed :data:`SHARED_LINE`."""
        if self._shared is None:
            self._shared = self.cluster_id()
            self.start_saying(self._shared, SHARED_LINE)
        return self._shared

    def clean_up(self) -> None:
        for cid in self.made:
            self.runtime.stop(cid, timeout_s=1)
            self.runtime.remove_volume(self.owner.volume(cid))


def _fake_kit() -> Kit:
    owner = Ownership.new()
    runtime = FakeRuntime(images={DEV_IMAGE})
    runtime.bind(owner)

    def tell(cluster_id: str, text: str) -> None:
        runtime.containers[cluster_id].log_lines.append(text)

    return Kit(runtime, owner, execs=False, tell=tell)


@pytest.fixture(
    scope="session",
    params=[
        "fake",
        pytest.param("podman", marks=pytest.mark.e2e),
    ],
)
def kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    if request.param == "fake":
        made = _fake_kit()
        yield made
        made.clean_up()
        return
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman)")
    url: str = request.getfixturevalue("engine_url")
    owner = Ownership.new()
    real = Kit(DockerEngineRuntime(url, owner=owner), owner, execs=True)
    try:
        yield real
        real.clean_up()
    finally:
        purge_installation(url, owner.installation_id)
