"""FakeRuntime follows the Runtime contracts the real driver follows."""

from __future__ import annotations

import threading

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import (
    ContainerSpec,
    ContainerState,
    PortBinding,
    Runtime,
)
from gpuyard.testing.fake_runtime import FakeRuntime

OWNER = Ownership.new()


def volume_name(cluster_id: str) -> str:
    return OWNER.volume(cluster_id)


IMAGE = "localhost/gpuyard/busybox:latest"


def spec(
    cluster_id: str = "c1", *, volume: bool = True, image: str = IMAGE, port: int = 20001
) -> ContainerSpec:
    return ContainerSpec(
        cluster_id=cluster_id,
        image=image,
        command=None,
        env={"A": "1"},
        ports=(PortBinding(8888, port),),
        volume_name=volume_name(cluster_id) if volume else None,
        volume_mount_path="/workspace",
        cpu_cores=1,
        memory_gb=1,
        gpu_indices=(),
    )


@pytest.fixture
def rt() -> FakeRuntime:
    runtime = FakeRuntime(images={IMAGE})
    runtime.bind(OWNER)
    return runtime


def test_satisfies_protocol(rt: FakeRuntime) -> None:
    runtime: Runtime = rt  # checked by mypy; the assert keeps the line meaningful at runtime
    assert runtime.available() is None
    assert runtime.capabilities().stats


def test_lifecycle_states(rt: FakeRuntime) -> None:
    assert rt.observe("c1").state is ContainerState.MISSING
    cid = rt.create(spec())
    obs = rt.observe("c1")
    assert (obs.state, obs.container_id) == (ContainerState.CREATED, cid)
    rt.start("c1")
    rt.start("c1")  # idempotent
    obs = rt.observe("c1")
    assert obs.state is ContainerState.RUNNING and obs.started_at
    rt.crash("c1", exit_code=3, error="boom")
    obs = rt.observe("c1")
    assert (obs.state, obs.exit_code, obs.error) == (ContainerState.EXITED, 3, "boom")
    rt.stop("c1")
    rt.stop("c1")  # missing is fine
    assert rt.observe("c1").state is ContainerState.MISSING


def test_create_replaces_previous_container(rt: FakeRuntime) -> None:
    first = rt.create(spec())
    rt.start("c1")
    second = rt.create(spec())
    assert first != second
    assert rt.observe("c1").state is ContainerState.CREATED
    assert [m.container_id for m in rt.list_managed()] == [second]


def test_volume_survives_stop_container_disk_does_not(rt: FakeRuntime) -> None:
    rt.create(spec())
    rt.start("c1")
    rt.write_file("c1", "/workspace/model.bin", "weights")
    rt.write_file("c1", "/root/scratch", "tmp")
    rt.stop("c1")
    rt.create(spec())
    rt.start("c1")
    assert rt.volume_files(volume_name("c1")) == {"model.bin": "weights"}
    assert rt.containers["c1"].disk == {}


def test_remove_volume_refuses_in_use_and_tolerates_missing(rt: FakeRuntime) -> None:
    rt.create(spec())
    with pytest.raises(RuntimeFailure, match="in use"):
        rt.remove_volume(volume_name("c1"))
    rt.stop("c1")
    rt.remove_volume(volume_name("c1"))
    rt.remove_volume(volume_name("c1"))
    assert volume_name("c1") not in rt.volumes


def test_ensure_image_failures() -> None:
    rt = FakeRuntime(pullable=True)
    rt.bind(OWNER)
    rt.ensure_image("x:1")
    assert "x:1" in rt.images
    rt.fail_image("bad:1", "manifest unknown")
    with pytest.raises(RuntimeFailure, match=r"bad:1 .*could not be pulled: manifest unknown"):
        rt.ensure_image("bad:1")
    offline = FakeRuntime(pullable=False)
    offline.bind(OWNER)
    with pytest.raises(RuntimeFailure, match="could not be pulled"):
        offline.ensure_image("y:1")
    with pytest.raises(RuntimeFailure, match="not present"):
        offline.create(spec(image="y:1"))


def test_start_without_create_fails(rt: FakeRuntime) -> None:
    with pytest.raises(RuntimeFailure, match="create it first"):
        rt.start("nope")


def test_stats_logs_and_list(rt: FakeRuntime) -> None:
    rt.create(spec("a"))
    rt.create(spec("b", volume=False))
    assert rt.stats("a") is None  # not running
    rt.start("a")
    stats = rt.stats("a")
    assert stats is not None and stats.memory_percent == rt.memory_percent
    assert "started a" in rt.logs("a")
    assert rt.logs("missing") == ""
    states = {m.cluster_id: m.state for m in rt.list_managed()}
    assert states == {"a": ContainerState.RUNNING, "b": ContainerState.CREATED}


def test_injected_failures_and_unavailable(rt: FakeRuntime) -> None:
    rt.fail_next["start"] = "engine exploded"
    rt.create(spec())
    with pytest.raises(RuntimeFailure, match="engine exploded"):
        rt.start("c1")
    rt.start("c1")  # only once
    rt.unavailable = "no container engine reachable"
    assert rt.available() == "no container engine reachable"
    with pytest.raises(RuntimeFailure):
        rt.observe("c1")
    assert rt.calls["start"] == 2


def test_thread_safety(rt: FakeRuntime) -> None:
    def worker(n: int) -> None:
        for i in range(50):
            cid = f"t{n}-{i}"
            # A host port of its own: the fake, like an engine, refuses a taken one.
            rt.create(spec(cid, port=20001 + n * 50 + i))
            rt.start(cid)
            rt.observe(cid)
            if i % 2:
                rt.stop(cid)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    managed = rt.list_managed()
    assert len(managed) == 8 * 25
    assert len({m.container_id for m in managed}) == len(managed)
