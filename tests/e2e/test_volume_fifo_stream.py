"""A volume's tar read through a FIFO (an engine on this machine): the same bytes as the
attach stream, from a helper that holds the volume read-only and a directory holding
only the FIFO; failures end the stream with an error, never a hang or a short stream
taken for a whole one (real Podman)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.engines.volumes import EngineVolumeIO
from gpuyard.runtimes.volumes.copy import (
    LABEL_HELPER_VOLUME,
    VolumeCopyFailed,
    volume_tar_stream,
)
from gpuyard.runtimes.volumes.fifo_stream import OUT, volume_tar_fifo
from tests.required_parts import needs_tools

pytestmark = [pytest.mark.e2e, needs_tools("podman", how="apt-get install podman runc")]


def fill(engine: Engine, volume: str) -> Path:
    engine.ensure_volume(volume)
    root = Path(engine.api.inspect_volume(volume)["Mountpoint"])
    (root / "big.bin").write_bytes(os.urandom(3 << 20))
    (root / "dir" / "empty").mkdir(parents=True)
    (root / "dir" / "small.txt").write_text("hello\n")
    os.link(root / "dir" / "small.txt", root / "dir" / "hard.txt")
    (root / "link").symlink_to("/etc/passwd")
    return root


def digest(chunks: Iterator[bytes] | Iterator[bytes | bytearray]) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    for chunk in chunks:
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def test_the_fifo_gives_the_bytes_of_the_attach_stream(local: Engine) -> None:
    volume = local.owner.volume("fifocluster01")
    fill(local, volume)
    with volume_tar_stream(local, volume) as chunks:
        attached = digest(chunks)
    with volume_tar_fifo(local, volume) as chunks:
        through_fifo = digest(chunks)
    with EngineVolumeIO(local, "podman").read(volume) as chunks:
        read = digest(chunks)
    assert attached == through_fifo == read
    assert attached[1] > 3 << 20
    assert not local.list_containers(f"{LABEL_HELPER_VOLUME}={volume}")


def test_the_fifo_reader_holds_the_volume_read_only_and_only_the_fifo(local: Engine) -> None:
    volume = local.owner.volume("fifocluster02")
    fill(local, volume)
    with volume_tar_fifo(local, volume) as chunks:
        (helper,) = local.list_containers(f"{LABEL_HELPER_VOLUME}={volume}")
        info = local.api.inspect_container(helper["Id"])
        shared = Path(next(m["Source"] for m in info["Mounts"] if m["Destination"] == OUT))
        entries = [(e.name, stat.S_ISFIFO(e.lstat().st_mode)) for e in shared.iterdir()]
        mode = shared.stat().st_mode
        digest(chunks)
    host = info["HostConfig"]
    assert host.get("PidMode") in ("", "private", None), host.get("PidMode")
    assert host.get("NetworkMode") == "none"
    assert not host.get("Privileged")
    mounts = sorted((m.get("Name") or "", m["Destination"], m["RW"]) for m in info["Mounts"])
    assert mounts == [("", OUT, True), (volume, "/data", False)], info["Mounts"]
    assert entries == [("stream", True)]
    assert stat.S_IMODE(mode) == 0o700
    assert not shared.exists()  # removed with the helper


def test_a_missing_volume_fails_before_anything_runs(local: Engine) -> None:
    with pytest.raises(VolumeCopyFailed), volume_tar_fifo(local, local.owner.volume("nosuch01")):
        pass


def test_a_reader_that_stops_early_leaves_nothing_behind(local: Engine) -> None:
    volume = local.owner.volume("fifocluster03")
    fill(local, volume)
    with volume_tar_fifo(local, volume, chunk_size=4096) as chunks:
        next(chunks)
        (helper,) = local.list_containers(f"{LABEL_HELPER_VOLUME}={volume}")
        shared = Path(
            next(
                m["Source"]
                for m in local.api.inspect_container(helper["Id"])["Mounts"]
                if m["Destination"] == OUT
            )
        )
    assert not shared.exists()
    assert not local.list_containers(f"{LABEL_HELPER_VOLUME}={volume}")


def test_a_reader_killed_mid_stream_ends_the_stream_with_an_error(local: Engine) -> None:
    """The helper dies while the stream is read (its tar blocked on the full pipe): the
    consumer gets an error after the bytes that came, never a short stream as whole."""
    volume = local.owner.volume("fifocluster04")
    fill(local, volume)
    with volume_tar_fifo(local, volume, chunk_size=4096) as chunks:
        next(chunks)
        (helper,) = local.list_containers(f"{LABEL_HELPER_VOLUME}={volume}")
        local.api.kill(helper["Id"])
        with pytest.raises(VolumeCopyFailed) as failed:
            digest(chunks)
    assert failed.value.details.get("exit_code") not in (0, None)
