"""DockerEngineRuntime against real Podman, through its Docker-compatible service.

A private ``podman system service`` is started on a temporary socket for the session,
and the offline busybox image is built once. Every test acts for an installation of its
own (a fresh :class:`Ownership`), uses unique cluster ids and removes, afterwards, only
what carries that installation's id: the engine may be shared with a dev server.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_INSTALLATION, Ownership
from gpuyard.runtimes.base import (
    LABEL_CLUSTER,
    ContainerSpec,
    ContainerState,
    Observed,
    PortBinding,
    Runtime,
)
from gpuyard.runtimes.engines.devimage import SERVE_PORT
from gpuyard.runtimes.engines.engine import EnginePolicy, NotOurs
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.engines.url import PodmanService, detect_engine_url
from tests.e2e.conftest import DEV_IMAGE, purge_installation
from tests.helpers import free_port
from tests.required_parts import need, needs_tools

# These tests drive real containers.
pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

IMAGE = DEV_IMAGE


@pytest.fixture
def owner(engine_url: str) -> Iterator[Ownership]:
    """An installation of this test's own; whatever carries its id is removed after."""
    mine = Ownership.new()
    yield mine
    purge_installation(engine_url, mine.installation_id)


@pytest.fixture
def rt(engine_url: str, owner: Ownership) -> DockerEngineRuntime:
    return DockerEngineRuntime(engine_url, owner=owner)


@pytest.fixture
def new_cluster(rt: DockerEngineRuntime) -> Iterator[Callable[[], str]]:
    """Hands out unique cluster ids and removes their containers and volumes after."""
    made: list[str] = []

    def make() -> str:
        cid = "e2e" + uuid.uuid4().hex[:11]
        made.append(cid)
        return cid

    yield make
    for cid in made:
        rt.stop(cid, timeout_s=1)
        rt.remove_volume(rt.engine.owner.volume(cid))


def make_spec(
    rt: DockerEngineRuntime,
    cluster_id: str,
    command: tuple[str, ...] | None = None,
    *,
    env: dict[str, str] | None = None,
    port: int | None = None,
    cpu_cores: float = 1,
    memory_gb: float = 0.25,
) -> ContainerSpec:
    return ContainerSpec(
        cluster_id=cluster_id,
        image=IMAGE,
        command=command,
        env=env or {},
        ports=(PortBinding(SERVE_PORT, port),) if port else (),
        volume_name=rt.engine.owner.volume(cluster_id),
        volume_mount_path="/workspace",
        cpu_cores=cpu_cores,
        memory_gb=memory_gb,
        gpu_indices=(),
        labels={"gpuyard.test": "e2e"},
    )


def wait_state(
    rt: Runtime, cluster_id: str, state: ContainerState, timeout_s: float = 10
) -> Observed:
    deadline = time.monotonic() + timeout_s
    while True:
        obs = rt.observe(cluster_id)
        if obs.state is state or time.monotonic() > deadline:
            return obs
        time.sleep(0.05)


def http_get(port: int, timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
                return str(resp.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_available_and_capabilities(rt: DockerEngineRuntime) -> None:
    runtime: Runtime = rt
    assert runtime.available() is None
    caps = runtime.capabilities()
    assert caps.stats
    assert not caps.real_gpus  # Podman's compat API drops DeviceRequests


def test_create_start_env_port_logs(
    rt: DockerEngineRuntime, new_cluster: Callable[[], str]
) -> None:
    cid = new_cluster()
    port = free_port()
    rt.ensure_image(IMAGE)
    command = ("sh", "-c", 'echo "FOO=$FOO"; exec /usr/local/bin/gpuyard-serve')
    container_id = rt.create(make_spec(rt, cid, command, env={"FOO": "bar baz"}, port=port))
    assert rt.observe(cid).state is ContainerState.CREATED
    rt.start(cid)
    rt.start(cid)  # idempotent
    obs = rt.observe(cid)
    assert obs.state is ContainerState.RUNNING
    assert obs.container_id == container_id and obs.started_at
    page = http_get(port)
    assert f"host: {cid}" in page
    assert "FOO=bar baz" in rt.logs(cid)


def test_observe_exit_code_and_missing(
    rt: DockerEngineRuntime, new_cluster: Callable[[], str]
) -> None:
    cid = new_cluster()
    assert rt.observe(cid).state is ContainerState.MISSING
    rt.create(make_spec(rt, cid, ("sh", "-c", "exit 7")))
    rt.start(cid)
    obs = wait_state(rt, cid, ContainerState.EXITED)
    assert (obs.state, obs.exit_code) == (ContainerState.EXITED, 7)
    assert rt.stats(cid) is None
    rt.stop(cid)
    rt.stop(cid)  # a missing container is fine
    assert rt.observe(cid).state is ContainerState.MISSING


def test_volume_survives_stop_container_disk_does_not(
    rt: DockerEngineRuntime, new_cluster: Callable[[], str]
) -> None:
    cid = new_cluster()
    write = "echo kept > /workspace/keep; echo junk > /tmp/junk"
    rt.create(make_spec(rt, cid, ("sh", "-c", write)))
    rt.start(cid)
    assert wait_state(rt, cid, ContainerState.EXITED).exit_code == 0
    rt.stop(cid)
    assert rt.observe(cid).state is ContainerState.MISSING
    check = "cat /workspace/keep; test -e /tmp/junk && echo junk-present || echo junk-gone"
    rt.create(make_spec(rt, cid, ("sh", "-c", check)))
    rt.start(cid)
    assert wait_state(rt, cid, ContainerState.EXITED).exit_code == 0
    out = rt.logs(cid)
    assert "kept" in out
    assert "junk-gone" in out


def test_a_restart_whose_volume_went_behind_our_back_gets_ours_again(
    rt: DockerEngineRuntime, new_cluster: Callable[[], str]
) -> None:
    """A restart creates its container while its volume, seen before, is checked. The
    volume removed meanwhile by someone else (the engine then makes a bare one for
    the mount): the create makes the container again on a volume of ours, labelled."""
    cid = new_cluster()
    vol = rt.engine.owner.volume(cid)
    write = "echo kept > /workspace/keep"
    rt.create(make_spec(rt, cid, ("sh", "-c", write)))
    rt.start(cid)
    assert wait_state(rt, cid, ContainerState.EXITED).exit_code == 0
    rt.stop(cid)
    # The usual restart: created beside the check, on the same volume, data kept.
    rt.create(make_spec(rt, cid, ("sh", "-c", "cat /workspace/keep")))
    rt.start(cid)
    assert wait_state(rt, cid, ContainerState.EXITED).exit_code == 0
    assert "kept" in rt.logs(cid)
    rt.stop(cid)
    subprocess.run(["podman", "volume", "rm", vol], check=True, capture_output=True)
    rt.create(make_spec(rt, cid, ("sh", "-c", "ls /workspace | wc -l")))
    rt.start(cid)
    assert wait_state(rt, cid, ContainerState.EXITED).exit_code == 0
    assert vol in {v.name for v in rt.list_volumes()}  # labelled as ours again
    assert rt.logs(cid).strip().splitlines()[-1] == "0"  # a new, empty volume


def test_create_replaces_existing_container(
    rt: DockerEngineRuntime, new_cluster: Callable[[], str]
) -> None:
    cid = new_cluster()
    first = rt.create(make_spec(rt, cid))
    rt.start(cid)
    second = rt.create(make_spec(rt, cid))
    assert first != second
    assert rt.observe(cid).state is ContainerState.CREATED


def test_stop_default_command_is_prompt(
    rt: DockerEngineRuntime, new_cluster: Callable[[], str]
) -> None:
    cid = new_cluster()
    port = free_port()
    rt.create(make_spec(rt, cid, port=port))
    rt.start(cid)
    http_get(port)  # the entrypoint has installed its trap once httpd answers
    managed = {m.cluster_id: m for m in rt.list_managed()}
    assert managed[cid].state is ContainerState.RUNNING
    t0 = time.monotonic()
    rt.stop(cid, timeout_s=20)
    elapsed = time.monotonic() - t0
    # Without the trap the stop would wait out the whole 20 s, then SIGKILL.
    assert elapsed < 12, f"stop took {elapsed:.1f} s: the image's TERM trap is not working"
    assert cid not in {m.cluster_id for m in rt.list_managed()}


def test_limits_and_stats(rt: DockerEngineRuntime, new_cluster: Callable[[], str]) -> None:
    cid = new_cluster()
    busy = ("sh", "-c", "while :; do :; done")
    rt.create(make_spec(rt, cid, busy, cpu_cores=0.5, memory_gb=0.125))
    rt.start(cid)
    caps = rt.capabilities()
    need(
        "cgroup CPU and memory limits",
        None if caps.cpu_limits and caps.memory_limits else f"the engine applies none: {caps}",
        how="an engine with cgroup controllers (bash scripts/setup-system.sh configures Podman)",
    )
    first = rt.stats(cid)
    assert first is not None
    time.sleep(1.5)
    second = rt.stats(cid)
    assert second is not None
    # 0.5 CPU of quota: measured over the interval between the two samples. The
    # ceiling is the quota; the floor is low because a loaded CI machine (2 cores
    # shared with other suites) may give the loop much less than its quota.
    assert 10 <= second.cpu_percent <= 70, second
    # The busy shell uses well under 1 MB of the 128 MiB limit.
    assert 0 < second.memory_percent < 20, second
    assert second.memory_bytes > 0


def test_list_managed_carries_cluster_label(
    rt: DockerEngineRuntime, new_cluster: Callable[[], str]
) -> None:
    a, b = new_cluster(), new_cluster()
    rt.create(make_spec(rt, a))
    rt.create(make_spec(rt, b))
    rt.start(b)
    states = {m.cluster_id: m.state for m in rt.list_managed()}
    assert states[a] is ContainerState.CREATED
    assert states[b] is ContainerState.RUNNING
    assert LABEL_CLUSTER == "gpuyard.cluster_id"


def test_remove_volume(rt: DockerEngineRuntime, new_cluster: Callable[[], str]) -> None:
    cid = new_cluster()
    vol = rt.engine.owner.volume(cid)
    rt.create(make_spec(rt, cid))
    assert _volume_exists(vol)
    with pytest.raises(RuntimeFailure, match=vol):
        rt.remove_volume(vol)  # still used by the container
    rt.stop(cid)
    rt.remove_volume(vol)
    rt.remove_volume(vol)  # missing is fine
    assert not _volume_exists(vol)


def test_concurrent_ensure_volume_all_succeed(rt: DockerEngineRuntime) -> None:
    """Two clusters sharing a network volume start together: every caller that races
    to create the volume gets it, none fails on the engine's "name in use"."""
    vol = rt.engine.owner.volume(f"race{uuid.uuid4().hex[:8]}")
    failures: list[BaseException] = []
    barrier = threading.Barrier(6)

    def ensure() -> None:
        barrier.wait()
        try:
            rt.ensure_volume(vol)
        except BaseException as e:  # collected and asserted below
            failures.append(e)

    threads = [threading.Thread(target=ensure) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert _volume_exists(vol)
    rt.remove_volume(vol)


def test_ensure_image_present_and_missing(rt: DockerEngineRuntime) -> None:
    rt.ensure_image(IMAGE, on_pull=lambda: pytest.fail("a present image was pulled"))
    with pytest.raises(RuntimeFailure) as info:
        rt.ensure_image("localhost/gpuyard/does-not-exist:1.0")
    msg = info.value.message
    assert "localhost/gpuyard/does-not-exist:1.0 is not present" in msg
    assert "could not be pulled" in msg


def test_unreachable_engine_is_reported(tmp_path: Path) -> None:
    bogus = DockerEngineRuntime(
        f"unix://{tmp_path}/nothing.sock", timeout_s=2, owner=Ownership.new()
    )
    msg = bogus.available()
    assert msg is not None and "no container engine reachable" in msg
    assert "install podman" in msg
    with pytest.raises(RuntimeFailure, match="no container engine reachable"):
        bogus.observe("x")
    assert not bogus.capabilities().stats


def _volume_exists(name: str) -> bool:
    return subprocess.run(["podman", "volume", "exists", name], check=False).returncode == 0


def test_engine_discovery_and_service_idempotence(tmp_path: Path) -> None:
    assert detect_engine_url("tcp://h:2375", env={"DOCKER_HOST": "unix:///x"}) == "tcp://h:2375"
    assert detect_engine_url(None, env={"DOCKER_HOST": "unix:///x"}) == "unix:///x"
    sock_dir = Path(tempfile.mkdtemp(prefix="gy-svc-"))
    try:
        service = PodmanService(sock_dir / "podman.sock")
        url = service.start()
        assert service.start() == url  # idempotent: no second process
        assert DockerEngineRuntime(url).available() is None
        service.stop()
        service.stop()
        assert not service.running
        assert not (sock_dir / "podman.sock").exists()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


class _StubApi:
    """Stands in for the SDK's low-level client: refuses CPU quotas like a host
    without the cpu cgroup controller would, and records each create it was sent
    (runtimes/engines/container_create.py)."""

    api_version = "1.41"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def info(self) -> dict[str, Any]:
        return {}  # nothing told of its storage

    def create_container(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        if "NanoCpus" in kwargs["host_config"]:
            raise docker.errors.APIError(
                "500 Server Error", explanation="crun: cgroup cpu controller not available"
            )
        return {"Id": "abc123"}

    def inspect_container(self, name: str) -> dict[str, Any]:
        raise docker.errors.NotFound("no such container")

    def remove_container(self, *args: Any, **kwargs: Any) -> None:
        raise docker.errors.NotFound("no such container")

    def inspect_volume(self, name: str) -> dict[str, Any]:
        return {"Name": name}


class _StubClient:
    def __init__(self) -> None:
        self.api = _StubApi()

    def version(self) -> dict[str, Any]:
        return {"Components": [{"Name": "Podman Engine"}]}


def _stubbed(allow_unenforced_limits: bool) -> tuple[DockerEngineRuntime, _StubClient]:
    rt = DockerEngineRuntime(
        "unix:///nonexistent.sock",
        owner=Ownership.new(),
        policy=EnginePolicy(allow_unenforced_limits=allow_unenforced_limits),
    )
    stub = _StubClient()
    rt.engine._client_obj = stub  # the SDK client is the one seam the engine layer has
    return rt, stub


def test_refused_limits_fail_clearly_unless_allowed() -> None:
    rt, stub = _stubbed(allow_unenforced_limits=False)
    with pytest.raises(RuntimeFailure, match="cannot enforce CPU/memory limits") as info:
        rt.create(make_spec(rt, "refuse1", cpu_cores=2, memory_gb=1))
    assert "GPUYARD_ALLOW_UNENFORCED_LIMITS" in info.value.message
    (only,) = stub.api.calls  # no retry without limits
    assert only["host_config"]["NanoCpus"] == 2_000_000_000
    caps = rt.capabilities()
    assert not caps.cpu_limits and not caps.memory_limits


def test_allowed_unenforced_limits_degrade_and_gpu_requests_are_sent() -> None:
    rt, stub = _stubbed(allow_unenforced_limits=True)
    spec = make_spec(rt, "degrade1", cpu_cores=2, memory_gb=1)
    spec = dataclasses.replace(spec, gpu_uuids=("GPU-1111", "GPU-2222"))
    assert rt.create(spec) == "abc123"
    first, retry = stub.api.calls
    sent, resent = first["host_config"], retry["host_config"]
    assert sent["NanoCpus"] == 2_000_000_000 and sent["Memory"] == 1024**3
    assert "NanoCpus" not in resent and "Memory" not in resent
    (request,) = resent["DeviceRequests"]
    assert request["DeviceIDs"] == ["GPU-1111", "GPU-2222"]
    assert request["Capabilities"] == [["gpu"]] and request["Driver"] == "nvidia"
    assert "PortBindings" not in resent and retry["labels"][LABEL_CLUSTER] == "degrade1"
    assert retry["labels"][LABEL_INSTALLATION] == rt.engine.owner.installation_id
    assert retry["name"] == f"{rt.engine.owner.prefix}-degrade1"
    assert rt.capabilities().limits_problem


def test_names_and_labels_carry_the_installation(
    rt: DockerEngineRuntime, new_cluster: Callable[[], str], engine_url: str
) -> None:
    cid = new_cluster()
    owner = rt.engine.owner
    rt.create(make_spec(rt, cid))
    client = docker.DockerClient(base_url=engine_url)
    try:
        container = client.containers.get(owner.container(cid))
        volume = client.volumes.get(owner.volume(cid))
    finally:
        client.close()
    assert container.name == f"gy{owner.short}-{cid}"
    assert container.labels[LABEL_INSTALLATION] == owner.installation_id
    assert volume.name == f"gy{owner.short}-vol-{cid}"
    assert volume.attrs["Labels"][LABEL_INSTALLATION] == owner.installation_id


def test_objects_of_others_are_never_touched(engine_url: str, owner: Ownership) -> None:
    """Another installation's container and volume, and an unlabelled container under
    a name of ours, are neither listed, stopped, removed, nor replaced."""
    other = Ownership.new()
    mine = DockerEngineRuntime(engine_url, owner=owner)
    theirs = DockerEngineRuntime(engine_url, owner=other)
    cid = "e2e" + uuid.uuid4().hex[:11]
    squatter = owner.container("sq" + uuid.uuid4().hex[:10])
    try:
        theirs.create(make_spec(theirs, cid))
        theirs.start(cid)
        # A container somebody made by hand under a name of our installation's form.
        subprocess.run(
            ["podman", "run", "-d", "--name", squatter, "--label", "gpuyard.managed=true",
             IMAGE, "sleep", "600"],
            check=True, capture_output=True,
        )  # fmt: skip
        assert cid not in {m.cluster_id for m in mine.list_managed()}
        assert theirs.engine.owner.volume(cid) not in {v.name for v in mine.list_volumes()}
        assert mine.observe(cid).state is ContainerState.MISSING  # its name is not ours
        mine.stop(cid)  # nothing of ours by that name: a no-op
        with pytest.raises(NotOurs):
            mine.remove_volume(theirs.engine.owner.volume(cid))
        squat_id = squatter.removeprefix(f"{owner.prefix}-")
        with pytest.raises(NotOurs):
            mine.stop(squat_id)
        with pytest.raises(NotOurs):
            mine.observe(squat_id)
        assert theirs.observe(cid).state is ContainerState.RUNNING
        assert _volume_exists(theirs.engine.owner.volume(cid))
        state = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Status}}", squatter],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        assert state == "running"
    finally:
        # Only what this test made: the squatter by its exact name, the other
        # installation by its id.
        subprocess.run(["podman", "rm", "-f", "-t", "0", squatter], check=False,
                       capture_output=True)  # fmt: skip
        purge_installation(engine_url, other.installation_id)
