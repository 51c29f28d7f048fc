"""The runtime contract (gpuyard/runtimes/capabilities.py), asserted alike on the
in-memory runtime and on the real one over Podman: the container lifecycle and the
state observed, volumes written and read as tar streams and copied, logs read and
followed, and the exec endpoint."""

from __future__ import annotations

import dataclasses
import io
import tarfile
import time
from collections.abc import Callable
from typing import TypeVar

import docker
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.base import ContainerState
from gpuyard.runtimes.volumes.moves import copy_volume_between
from tests.contract.conftest import DEV_IMAGE, SHARED_LINE, Kit

T = TypeVar("T")


def eventually(probe: Callable[[], T], ok: Callable[[T], bool], timeout_s: float = 15) -> T:
    """``probe()`` until ``ok`` holds of its answer (a real engine writes output a
    moment after the start returns), or its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if ok(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def tar_of(files: dict[str, bytes]) -> bytes:
    """A tar as an engine's reader writes one: the root as ``.``, entries ``./...``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        root = tarfile.TarInfo(".")
        root.type = tarfile.DIRTYPE
        root.mode = 0o755
        tar.addfile(root)
        for name, content in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def files_in(data: bytes) -> dict[str, bytes]:
    """The regular files of the tar ``data``, by path without ``./``."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            reader = tar.extractfile(member) if member.isreg() else None
            if reader is not None:
                found[member.name.removeprefix("./")] = reader.read()
    return found


def read_files(kit: Kit, volume: str) -> dict[str, bytes]:
    with kit.runtime.volume_io().read(volume) as chunks:
        return files_in(b"".join(bytes(c) for c in chunks))


# -- the container lifecycle ---------------------------------------------------------


def test_create_start_halt_stop(kit: Kit) -> None:
    rt, cid = kit.runtime, kit.cluster_id()
    assert rt.observe(cid).state is ContainerState.MISSING
    rt.ensure_image(DEV_IMAGE)
    rt.ensure_volume(kit.owner.volume(cid), cid)
    container_id = rt.create(kit.spec(cid))
    seen = rt.observe(cid)
    assert seen.state is ContainerState.CREATED and seen.container_id == container_id
    assert any(m.cluster_id == cid for m in rt.list_managed())

    rt.start(cid)
    rt.start(cid)  # idempotent
    seen = rt.observe(cid)
    assert seen.state is ContainerState.RUNNING and seen.started_at
    assert rt.stats(cid) is not None

    rt.halt(cid, timeout_s=1)
    seen = rt.observe(cid)
    assert seen.state is ContainerState.EXITED and seen.exit_code is not None
    assert rt.stats(cid) is None

    rt.stop(cid, timeout_s=1)
    rt.stop(cid, timeout_s=1)  # idempotent
    assert rt.observe(cid).state is ContainerState.MISSING
    assert not any(m.cluster_id == cid for m in rt.list_managed())
    # The volume outlives its container, until it is removed.
    assert kit.owner.volume(cid) in {v.name for v in rt.list_volumes()}
    rt.remove_volume(kit.owner.volume(cid))
    assert kit.owner.volume(cid) not in {v.name for v in rt.list_volumes()}


def test_a_missing_image_is_a_runtime_failure(kit: Kit) -> None:
    cid = kit.cluster_id()
    spec = kit.spec(cid)
    with pytest.raises(RuntimeFailure):
        kit.runtime.create(dataclasses.replace(spec, image="localhost/gpuyard/absent:none"))
    assert kit.runtime.observe(cid).state is ContainerState.MISSING


# -- volume I/O ------------------------------------------------------------------------


def test_a_volume_written_as_a_tar_reads_back(kit: Kit) -> None:
    cid = kit.cluster_id()
    volume = kit.owner.volume(cid)
    stream = tar_of({"hello.txt": b"hello volume\n", "data/n.txt": b"42\n"})
    written = kit.runtime.volume_io().write(volume, cid, [stream[:700], stream[700:]])
    assert written == len(stream)
    assert volume in {v.name for v in kit.runtime.list_volumes()}
    assert read_files(kit, volume) == {"hello.txt": b"hello volume\n", "data/n.txt": b"42\n"}
    # Written again: made anew, nothing of the first content left.
    kit.runtime.volume_io().write(volume, cid, [tar_of({"other.txt": b"x\n"})])
    assert read_files(kit, volume) == {"other.txt": b"x\n"}
    kit.runtime.volume_io().remove_readers(volume)  # nothing left: a no-op


def test_reading_a_missing_volume_fails(kit: Kit) -> None:
    with pytest.raises(RuntimeFailure), kit.runtime.volume_io().read(kit.owner.volume("nosuch")):
        pass


def test_a_volume_copies_to_another_name(kit: Kit) -> None:
    source, target = kit.cluster_id(), kit.cluster_id()
    kit.runtime.volume_io().write(
        kit.owner.volume(source), source, [tar_of({"a.txt": b"copied\n"})]
    )
    copied = copy_volume_between(
        kit.runtime, kit.owner.volume(source), kit.runtime, kit.owner.volume(target), target
    )
    assert copied > 0
    assert read_files(kit, kit.owner.volume(target)) == {"a.txt": b"copied\n"}
    # The same volume on the same runtime: nothing to copy.
    volume = kit.owner.volume(source)
    assert copy_volume_between(kit.runtime, volume, kit.runtime, volume, source) == 0


# -- logs ------------------------------------------------------------------------------


def test_logs_hold_what_the_container_printed(kit: Kit) -> None:
    cid = kit.shared()
    lines = eventually(
        lambda: kit.runtime.log_lines(cid),
        lambda got: any(line.text == SHARED_LINE for line in got),
    )
    assert SHARED_LINE in [line.text for line in lines]
    assert all(line.ts_ns > 0 for line in lines)
    assert SHARED_LINE in kit.runtime.logs(cid)
    assert kit.runtime.log_lines(kit.cluster_id()) == []  # no container: nothing


def test_a_followed_log_starts_with_what_was_printed(kit: Kit) -> None:
    cid = kit.shared()
    eventually(lambda: kit.runtime.logs(cid), lambda text: SHARED_LINE in text)
    follow = kit.runtime.follow_log(cid)
    try:
        first = next(line for line in follow if line.text == SHARED_LINE)
    finally:
        follow.close()
        follow.close()  # idempotent
    assert first.text == SHARED_LINE


# -- exec --------------------------------------------------------------------------------


def test_exec_runs_in_the_container_or_says_there_is_no_engine(kit: Kit) -> None:
    cid = kit.shared()
    if not kit.execs:
        with pytest.raises(RuntimeFailure):
            kit.runtime.exec_endpoint()
        assert kit.runtime.docker_engine() is None
        return
    endpoint = kit.runtime.exec_endpoint()
    assert endpoint.url and endpoint.ssl is None
    assert kit.runtime.docker_engine() is not None
    container = kit.runtime.observe(cid).container_id
    client = docker.APIClient(base_url=endpoint.url)
    try:
        run = client.exec_create(container, ["/bin/sh", "-c", "echo exec-$((6 * 7))"])
        output = client.exec_start(run["Id"])
    finally:
        client.close()
    assert output.decode().strip() == "exec-42"
