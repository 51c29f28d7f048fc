"""Snapshots taken and restored by restic in a helper container beside the volume, on
the local Podman: every kind of file round-trips with its metadata, an incremental
snapshot reads only what changed, a helper's snapshot also restores through the tar
path (for remote engines), and no helper is left behind.

The trees are written straight into the volumes' directories (root, this machine) and
compared both there and through ``volume_checksum`` (a tar helper)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.core.ownership import LABEL_CLUSTER, Ownership
from gpuyard.runtimes.engine import Engine
from gpuyard.runtimes.volume_copy import LABEL_ROLE, fill_volume, volume_checksum
from gpuyard.storage import volume_restic
from gpuyard.storage.restic import ResticRepository
from gpuyard.storage.restic_dump import dump_as_volume_tar
from gpuyard.storage.volume_restic import (
    ROLE_RESTIC,
    ResticHelperFailed,
    backup_volume,
    helper_restic_available,
    remove_restic_helpers,
    restore_volume,
)
from tests.e2e.conftest import purge_installation
from tests.e2e.test_volume_copy import first_mount, listing, mountpoint
from tests.moto_s3 import S3_ENV, make_bucket, moto_s3, moto_server_path

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("restic") is None, reason="restic is not installed"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="writes volumes directly (root)"),
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


def helpers_left(engine: Engine) -> list[str]:
    return [str(r.get("Names")) for r in engine.list_containers(f"{LABEL_ROLE}={ROLE_RESTIC}")]


@pytest.fixture
def local(engine_url: str) -> Iterator[Engine]:
    owner = Ownership.new()
    engine = Engine(engine_url, owner=owner)
    try:
        yield engine
    finally:
        purge_installation(engine_url, owner.installation_id)


@pytest.fixture
def repo(tmp_path: Path) -> ResticRepository:
    return ResticRepository(
        str(tmp_path / "repo"), tmp_path / "secrets" / "snapshot.password", tmp_path / "cache"
    )


def test_backup_restore_incremental_and_dump(
    local: Engine, repo: ResticRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reads of the helpers' output time out and ask whether the helper still runs.
    monkeypatch.setattr(volume_restic, "POLL_S", 0.05)
    src = local.owner.volume("srccluster0001")
    local.ensure_volume(src, {LABEL_CLUSTER: "srccluster0001"})
    first_mount(local, src)
    write_tree(mountpoint(local, src))
    assert helper_restic_available(local, repo)
    progress: list[int] = []

    first = backup_volume(
        local, src, repo, tags=["vol:src"], host="gy-test", parent=None,
        on_progress=progress.append,
    )  # fmt: skip

    assert len(first.restic_id) == 64 and first.restic_id in {
        s.restic_id for s in repo.find_by_tag("vol:src")
    }
    assert first.files >= SMALL_FILES + 5 and first.files_unmodified == 0
    assert first.bytes >= (8 << 20) + SMALL_FILES * SMALL_SIZE
    assert progress and progress == sorted(progress) and progress[-1] == first.bytes

    # Restored into a new volume: the same tree, root included.
    dst = local.owner.volume("dstcluster0001")
    restored = restore_volume(local, dst, {LABEL_CLUSTER: "dstcluster0001"}, repo, first.restic_id)
    assert listing(mountpoint(local, dst)) == listing(mountpoint(local, src))
    assert volume_checksum(local, dst) == volume_checksum(local, src)
    assert restored == first.bytes - len("hello\n") * 2  # hard-linked content counted once
    labels = local.api.inspect_volume(dst)["Labels"]
    assert local.owner.owns(labels) and labels[LABEL_CLUSTER] == "dstcluster0001"

    # About 1% changes: one small file rewritten, one added.
    root = mountpoint(local, src)
    (root / "small" / "f007").write_bytes(os.urandom(SMALL_SIZE))
    (root / "small" / "new").write_bytes(os.urandom(SMALL_SIZE))
    second = backup_volume(
        local, src, repo, tags=["vol:src"], host="gy-test", parent=first.restic_id
    )
    assert second.files_new + second.files_changed == 2
    assert second.files_unmodified == second.files - 2
    assert second.data_added < 1 << 20

    # No parent given: everything is read again, though a snapshot of this host and
    # path exists (restic's own choice of a parent is not used).
    third = backup_volume(local, src, repo, tags=["vol:src"], host="gy-test", parent=None)
    assert third.files_unmodified == 0 and third.files_new == third.files

    # The incremental snapshot through the tar path, as a remote engine restores it.
    tar_copy = local.owner.volume("tarcluster0001")
    with dump_as_volume_tar(repo, second.restic_id, chunk_size=256 << 10) as chunks:
        fill_volume(local, tar_copy, {LABEL_CLUSTER: "tarcluster0001"}, chunks)
    assert listing(mountpoint(local, tar_copy)) == listing(root)
    assert volume_checksum(local, tar_copy) == volume_checksum(local, src)

    # Restoring over an existing volume converges on the snapshot.
    (mountpoint(local, dst) / "stale").write_text("from an earlier attempt\n")
    restore_volume(local, dst, {}, repo, second.restic_id)
    assert volume_checksum(local, dst) == volume_checksum(local, src)

    assert helpers_left(local) == []
    assert repo.check().ok


def test_available_only_where_the_helper_can_reach_everything(
    local: Engine, repo: ResticRepository, tmp_path: Path
) -> None:
    assert helper_restic_available(local, repo)
    owner = local.owner
    # Constructing these engines connects to nothing.
    assert not helper_restic_available(Engine("tcp://127.0.0.1:2375", owner=owner), repo)
    assert not helper_restic_available(Engine("ssh://root@203.0.113.7", owner=owner), repo)
    s3 = ResticRepository("s3:http://127.0.0.1:9/bucket", tmp_path / "pw", tmp_path / "c")
    assert helper_restic_available(local, s3)
    sftp = ResticRepository("sftp:backup@203.0.113.7:/srv/restic", tmp_path / "pw", tmp_path / "c")
    assert not helper_restic_available(local, sftp)
    missing = ResticRepository(str(tmp_path / "r"), tmp_path / "pw", tmp_path / "c", binary="no")
    assert not helper_restic_available(local, missing)


def test_a_failing_backup_raises_restics_error_and_leaves_nothing(
    local: Engine, repo: ResticRepository
) -> None:
    vol = local.owner.volume("failcluster001")
    local.ensure_volume(vol)
    (mountpoint(local, vol) / "x").write_text("x\n")

    with pytest.raises(ResticHelperFailed) as info:
        backup_volume(local, vol, repo, tags=["t"], host="gy-test", parent="deadbeef" * 8)

    assert info.value.details["exit_status"] != 0
    assert "deadbeef" in info.value.message or "deadbeef" in info.value.details["stderr"]
    secret = (Path(repo.invocation([]).password_file)).read_text().strip()
    assert secret not in info.value.message and secret not in str(info.value.details)
    assert helpers_left(local) == []


def test_an_interrupted_backup_stops_restic_and_removes_its_helper(
    local: Engine, repo: ResticRepository
) -> None:
    vol = local.owner.volume("stopcluster001")
    local.ensure_volume(vol)
    first_mount(local, vol)
    (mountpoint(local, vol) / "big.bin").write_bytes(os.urandom(64 << 20))

    class Cancelled(Exception):
        pass

    def cancel(done: int) -> None:
        raise Cancelled

    with pytest.raises(Cancelled):
        backup_volume(local, vol, repo, tags=["t"], host="gy-test", parent=None, on_progress=cancel)

    assert helpers_left(local) == []
    assert repo.find_by_tag("t") == []
    # restic got SIGINT and removed its lock itself.
    listed = subprocess.run(
        repo.invocation(["list", "locks"]).argv, capture_output=True, text=True, check=True
    )
    assert listed.stdout.split() == []
    assert repo.check().ok


def test_a_helper_removed_mid_backup_leaves_a_lock_that_recovery_removes(
    local: Engine, repo: ResticRepository
) -> None:
    vol = local.owner.volume("lockcluster001")
    local.ensure_volume(vol)
    first_mount(local, vol)
    (mountpoint(local, vol) / "big.bin").write_bytes(os.urandom(64 << 20))

    def next_runs_cleanup(done: int) -> None:
        # What the next run on this volume does after a server crash mid-backup.
        assert remove_restic_helpers(local, vol)

    with pytest.raises(ResticHelperFailed):
        backup_volume(
            local, vol, repo, tags=["t"], host="gy-test", parent=None,
            on_progress=next_runs_cleanup,
        )  # fmt: skip

    assert helpers_left(local) == []
    # The killed restic's lock names its PID on this machine: stale at once.
    assert repo.recover_after_crash().ok
    assert repo.find_by_tag("t") == []


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if moto_server_path() is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    with moto_s3(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


def test_an_s3_repository_through_the_host_network(
    local: Engine, s3_endpoint: str, tmp_path: Path
) -> None:
    make_bucket(s3_endpoint, "gpuyard-helper")
    env = {"PATH": os.environ.get("PATH", os.defpath), **S3_ENV}
    repo = ResticRepository(
        f"s3:{s3_endpoint}/gpuyard-helper/repo", tmp_path / "pw", tmp_path / "cache", env=env
    )
    src, dst = local.owner.volume("s3src00000001"), local.owner.volume("s3dst00000001")
    local.ensure_volume(src)
    first_mount(local, src)
    write_tree(mountpoint(local, src), big=1 << 20)
    assert helper_restic_available(local, repo)

    taken = backup_volume(local, src, repo, tags=["vol:s3"], host="gy-test", parent=None)
    restore_volume(local, dst, {}, repo, taken.restic_id)

    assert listing(mountpoint(local, dst)) == listing(mountpoint(local, src))
    assert helpers_left(local) == []
