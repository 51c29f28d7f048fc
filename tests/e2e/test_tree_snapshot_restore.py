"""Snapshots of the volume's files (``tree``), as earlier versions took them with restic
beside the volume, still restore: as a tar rebuilt from the snapshot
(storage/restic_dump.py ``dump_as_volume_tar``) written through the engine's archive
upload, with every kind of file and its metadata, on the local Podman.

Such a snapshot is made here as those versions made it: restic backing up ``/data``,
here in a private mount namespace chrooted into a directory that holds restic, /usr and
the volume at /data (root, this machine). The trees are written straight into the
volumes' directories and compared both there and through ``volume_checksum`` (a tar
helper)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from gpuyard.core.ownership import LABEL_CLUSTER
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.volumes.copy import fill_volume, volume_checksum
from gpuyard.storage.restic import ResticRepository
from gpuyard.storage.restic_dump import dump_as_volume_tar
from tests.e2e.test_volume_copy import first_mount, listing, mountpoint
from tests.required_parts import as_root, needs, needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("restic", "podman", "unshare", how="apt-get install restic podman util-linux"),
    # Writes volumes directly.
    needs("root", as_root(), how="run the tests as root"),
]

OLD = 978_307_200  # 2001-01-01
SMALL_FILES = 100
SMALL_SIZE = 16 << 10


def write_tree(root: Path, big: int = 8 << 20) -> None:
    """Every kind of file a volume holds, with owners, modes and times to keep."""
    (root / "big.bin").write_bytes(os.urandom(big))
    small = root / "small"
    small.mkdir()
    for i in range(SMALL_FILES):
        (small / f"f{i:03d}").write_bytes(os.urandom(SMALL_SIZE))
    (root / "public").write_text("hello\n")
    os.chmod(root / "public", 0o644)
    (root / "setuid").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "setuid", 0o4755)
    (root / ".hidden").write_text("dot\n")
    os.symlink("public", root / "link")
    os.symlink("/nowhere/at/all", root / "dangling")
    os.link(root / "public", root / "hardlink")
    os.link(root / "public", small / "hardlink-elsewhere")
    (root / "empty-dir").mkdir()
    shared = root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o2775)
    os.mkfifo(root / "fifo")
    os.mknod(root / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    owned = root / "owned"
    owned.mkdir()
    (owned / "by-1234").write_text("mine\n")
    os.chown(owned / "by-1234", 1234, 1234)
    os.chown(owned, 1234, 5)
    os.utime(root / "public", (OLD, OLD))
    # restic's dump rounds mtimes to the nearest second; tar (and the listing) truncate.
    os.utime(small / "f000", ns=(OLD * 10**9 + 750_000_000,) * 2)
    os.utime(owned, (OLD, OLD))
    # The volume root's own owner, mode and mtime travel too.
    os.chown(root, 1000, 1000)
    os.chmod(root, 0o711)
    os.utime(root, (OLD, OLD))


@pytest.fixture
def repo(tmp_path: Path) -> ResticRepository:
    return ResticRepository(
        str(tmp_path / "repo"), tmp_path / "secrets" / "snapshot.password", tmp_path / "cache"
    )


def tree_snapshot(repo: ResticRepository, source: Path, work: Path) -> str:
    """``restic backup /data`` of the directory ``source``, as earlier versions' helper
    ran it. Returns the snapshot's full id."""
    repo.ensure()
    root = work / "chroot"
    for d in ("data", "repo", "cache", "usr", "proc", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64"):
        if not (root / link).is_symlink():
            os.symlink(f"usr/{link}", root / link)
    (root / "pw").touch()
    script = f"""set -e
mount --make-rprivate /
mount --rbind /usr {root}/usr
mount --bind {source} {root}/data
mount --bind {work / "repo"} {root}/repo
mount --bind {work / "cache"} {root}/cache
mount --bind {work / "secrets" / "snapshot.password"} {root}/pw
exec chroot {root} restic --repo /repo --password-file /pw --cache-dir /cache \
    backup /data --json --host gy-test --tag tree --force
"""
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    summary = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    short_id = next(d["snapshot_id"] for d in summary if d.get("message_type") == "summary")
    return repo.resolve_id(short_id, host="gy-test", tags=["tree"], path="/data")


def test_a_tree_snapshot_restores_through_the_tar_path(
    local: Engine, repo: ResticRepository, tmp_path: Path
) -> None:
    src = local.owner.volume("srccluster0001")
    local.ensure_volume(src, {LABEL_CLUSTER: "srccluster0001"})
    first_mount(local, src)
    root = mountpoint(local, src)
    write_tree(root)
    restic_id = tree_snapshot(repo, root, tmp_path)

    dst = local.owner.volume("tarcluster0001")
    with dump_as_volume_tar(repo, restic_id, chunk_size=256 << 10) as chunks:
        fill_volume(local, dst, {LABEL_CLUSTER: "tarcluster0001"}, chunks)
    assert listing(mountpoint(local, dst)) == listing(root)
    assert volume_checksum(local, dst) == volume_checksum(local, src)
    assert repo.check().ok
