"""Volume copies through real engines: two volumes on the local Podman, and two
simulated hosts (their own namespaces and Podman services, reached over TCP).

The trees are written and compared straight on the volumes' directories (root, this
machine), so the comparison does not go through the tar code under test: contents,
owners, modes, mtimes, link targets and hard-link counts of every path."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.core.ownership import LABEL_CLUSTER, Ownership
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.volumes.copy import (
    LABEL_ROLE,
    ROLE_VOLUME_COPY,
    SourceUnreachable,
    VolumeCopyFailed,
    copy_volume,
    volume_checksum,
    volume_manifest,
)
from tests.e2e.podman_host import HOSTS_HOW, PodmanHost, available
from tests.required_parts import as_root, need, needs

# Writes volumes directly.
pytestmark = needs("root", as_root(), how="run the tests as root")

OLD = 978_307_200  # 2001-01-01


def write_tree(root: Path) -> None:
    """Every kind of file a volume holds, with owners, modes and times to keep."""
    (root / "big.bin").write_bytes(os.urandom(50 << 20))
    sparse = root / "sparse.bin"
    with open(sparse, "wb") as f:
        f.truncate(20 << 20)
        f.seek(10 << 20)
        f.write(b"middle")
    (root / "private").write_text("secret\n")
    os.chmod(root / "private", 0o700)
    (root / "public").write_text("hello\n")
    os.chmod(root / "public", 0o644)
    (root / "setuid").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "setuid", 0o4755)
    os.symlink("public", root / "link")
    os.symlink("/nowhere/at/all", root / "dangling")
    os.link(root / "public", root / "hardlink")
    (root / "empty-dir").mkdir()
    owned = root / "owned"
    owned.mkdir()
    (owned / "by-1234").write_text("mine\n")
    os.chown(owned / "by-1234", 1234, 1234)
    os.chown(owned, 1234, 5)
    deep = root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (deep / ("long-name-" + "x" * 120)).write_text("long\n")
    (root / "odd name\twith tab").write_text("odd\n")
    os.utime(root / "public", (OLD, OLD))
    os.utime(owned, (OLD, OLD))
    # The volume root's own owner and mode travel too.
    os.chown(root, 1000, 1000)
    os.chmod(root, 0o750)
    os.utime(root, (OLD, OLD))


def first_mount(engine: Engine, volume: str) -> None:
    """Mount ``volume`` once, as its cluster's container would have: on a volume's first
    mount Podman gives its root the mountpoint's owner and mode from the image, which
    would otherwise happen to the tree written below on the copy's first read."""
    volume_checksum(engine, volume)


def listing(root: Path) -> dict[str, tuple[object, ...]]:
    """Path -> (mode, uid, gid, size, mtime, nlink, content hash or link target)."""
    out: dict[str, tuple[object, ...]] = {}
    paths = [root, *sorted(root.rglob("*"))]
    for path in paths:
        st = os.lstat(path)
        if path.is_symlink():
            what: object = os.readlink(path)
        elif path.is_file():
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            what = None
        mtime = None if path.is_symlink() else int(st.st_mtime)
        size = None if path.is_dir() else st.st_size
        nlink = st.st_nlink if path.is_file() else None
        out[str(path.relative_to(root))] = (
            oct(st.st_mode), st.st_uid, st.st_gid, size, mtime, nlink, what,
        )  # fmt: skip
    return out


def mountpoint(engine: Engine, volume: str) -> Path:
    return Path(engine.api.inspect_volume(volume)["Mountpoint"])


def helpers_left(engine: Engine) -> list[str]:
    return [str(r.get("Names")) for r in engine.list_containers(f"{LABEL_ROLE}={ROLE_VOLUME_COPY}")]


def test_copy_between_two_volumes_keeps_every_byte_and_attribute(local: Engine) -> None:
    src, dst = local.owner.volume("srccluster0001"), local.owner.volume("dstcluster0001")
    local.ensure_volume(src, {LABEL_CLUSTER: "srccluster0001"})
    first_mount(local, src)
    write_tree(mountpoint(local, src))
    progress: list[int] = []

    result = copy_volume(local, src, local, dst, on_progress=progress.append)

    assert listing(mountpoint(local, dst)) == listing(mountpoint(local, src))
    # Read through a helper: the target's next mount must not change its root either.
    assert volume_manifest(local, dst) == volume_manifest(local, src)
    assert volume_checksum(local, dst) == volume_checksum(local, src)
    assert result.bytes_copied > 70 << 20  # 50 MB + the sparse file's 20 MB, filled
    assert progress and progress == sorted(progress) and progress[-1] == result.bytes_copied
    labels = local.api.inspect_volume(dst)["Labels"]
    assert local.owner.owns(labels) and labels[LABEL_CLUSTER] == "srccluster0001"
    assert helpers_left(local) == []


def test_a_copy_over_a_non_empty_target_converges(local: Engine) -> None:
    src, dst = local.owner.volume("srccluster0002"), local.owner.volume("dstcluster0002")
    local.ensure_volume(src)
    root = mountpoint(local, src)
    (root / "keep").write_text("new\n")
    (root / "dir").mkdir()
    copy_volume(local, src, local, dst)
    target = mountpoint(local, dst)
    (target / "stale").write_text("from an earlier attempt\n")
    (target / "keep").write_text("changed on the target\n")
    (target / "dir" / "extra").write_text("x\n")

    copy_volume(local, src, local, dst)

    assert listing(mountpoint(local, dst)) == listing(root)
    assert not (mountpoint(local, dst) / "stale").exists()


def test_a_missing_source_volume_fails_on_the_source_side(local: Engine) -> None:
    with pytest.raises(VolumeCopyFailed) as info:
        copy_volume(local, local.owner.volume("nosuchvolume00"), local, local.owner.volume("x"))
    assert info.value.side == "source" and not info.value.unreachable
    assert info.value.details["reason"] == "volume_not_found"


def test_a_dead_source_engine_is_unreachable_and_the_target_is_untouched(local: Engine) -> None:
    dst = local.owner.volume("dstcluster0003")
    local.ensure_volume(dst)
    (mountpoint(local, dst) / "precious").write_text("still here\n")
    dead = Engine("unix:///nonexistent/gpuyard-test.sock", owner=local.owner, timeout_s=3)

    with pytest.raises(SourceUnreachable) as info:
        copy_volume(dead, "anything", local, dst)

    assert info.value.side == "source" and info.value.details["engine"] == dead.where
    assert (mountpoint(local, dst) / "precious").read_text() == "still here\n"


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[tuple[PodmanHost, PodmanHost]]:
    need("simulated hosts", available(), how=HOSTS_HOW)
    with PodmanHost() as a, PodmanHost() as b:
        yield a, b


def test_copy_between_two_simulated_hosts_and_a_cut_off_source(
    two_hosts: tuple[PodmanHost, PodmanHost],
) -> None:
    a, b = two_hosts
    owner = Ownership.new()
    source, target = Engine(a.url, owner=owner, timeout_s=5), Engine(b.url, owner=owner)
    vol = owner.volume("movecluster001")
    source.ensure_volume(vol)
    first_mount(source, vol)
    write_tree(a.volume_dir(vol))

    result = copy_volume(source, vol, target, vol)

    assert listing(b.volume_dir(vol)) == listing(a.volume_dir(vol))
    assert result.source == a.url and result.target == b.url
    assert helpers_left(source) == [] and helpers_left(target) == []

    # A real partition: the source host's link goes down.
    subprocess.run(["ip", "link", "set", f"{a.name}-o", "down"], check=True)
    try:
        with pytest.raises(SourceUnreachable):
            copy_volume(source, vol, target, vol)
        # The target kept the copy it had: an unreachable source costs it nothing.
        assert listing(b.volume_dir(vol)) == listing(a.volume_dir(vol))
    finally:
        subprocess.run(["ip", "link", "set", f"{a.name}-o", "up"], check=True)
