"""Snapshots end to end: the real server, real Podman containers and the real restic
repository. A tree written into a running cluster's volume is snapshotted, changed,
restored with seed 000's start body and cloned, byte for byte (contents, owners,
modes, mtimes, symlinks, empty directories); a second snapshot after a small change
stores far less; kill -9 of the server during a snapshot and during a restore leaves
the volume intact and the repository passing ``restic check``."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.storage.restic import ResticLocked, ResticRepository
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import ServerProcess, running_server, sh, wait_status
from tests.helpers import free_port
from tests.moto_s3 import S3_ENV, make_bucket, moto_s3, moto_server_path
from tests.required_parts import needs, needs_tools

pytestmark = [pytest.mark.e2e, needs_tools("restic", how="apt-get install restic")]

# A tree with every kind of entry a user's volume holds.
WRITE_TREE = """
set -e
cd /workspace
mkdir -p data/nested empty-dir code
dd if=/dev/urandom of=data/big.bin bs=1M count={big_mb} 2>/dev/null
for i in $(seq 1 40); do echo "line $i of a small file" > code/f$i.txt; done
echo secret > code/private.txt && chmod 600 code/private.txt
printf '#!/bin/sh\\necho hi\\n' > code/run.sh && chmod 755 code/run.sh
ln -sfn data/big.bin link-to-big
ln -sfn /does/not/exist dangling
echo owned > data/nested/owned.txt && chown 1234:1234 data/nested/owned.txt
chmod 2775 data/nested
touch -d @1600000000 code/f1.txt
"""

# One line per entry: name, type, mode, owner, size, mtime, link target or content hash.
CHECKSUM = r"""
cd /workspace && find . | sort | while read -r p; do
  if [ -L "$p" ]; then t="link $(readlink "$p")";
  elif [ -f "$p" ]; then t="file $(sha256sum < "$p" | cut -c1-64)";
  else t=dir; fi
  echo "$p $(stat -c '%a %u %g %s %Y' "$p") $t";
done | sha256sum | cut -c1-64
"""


def tree_checksum(engine: docker.DockerClient, server: ServerProcess, cid: str) -> str:
    code, out = sh(engine, server, cid, CHECKSUM)
    assert code == 0, out
    return out.strip()


def create_cluster(c: httpx.Client, **extra: Any) -> str:
    r = c.post(
        "/v1/clusters",
        json={
            "gpu_type": "NVIDIA RTX A6000",
            "gpu_count": 1,
            "docker_image": DEV_IMAGE,
            "volume_gb": 5,
            "memory_gb": 1,
            "cpu_cores": 1,
            **extra,
        },
    )
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    data = wait_status(c, cid, {"running", "error"}, timeout=120)
    assert data["status"] == "running", data
    return cid


def wait_snapshot(c: httpx.Client, sid: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        data: dict[str, Any] = c.get(f"/v1/snapshots/{sid}").json()["data"]
        if data["status"] != "creating":
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.2)


def take_snapshot(c: httpx.Client, cid: str, name: str) -> dict[str, Any]:
    r = c.post(f"/v1/clusters/{cid}/snapshots", json={"name": name, "description": "e2e"})
    assert r.status_code == 202, r.text
    assert r.json()["data"]["status"] == "creating"
    data = wait_snapshot(c, r.json()["data"]["id"])
    assert data["status"] == "ready", data
    return data


def snapshot_format(server: ServerProcess, snapshot_id: str) -> str:
    """How the server kept the snapshot (not shown by the API): its row's ``format``."""
    db = sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True, timeout=10)
    try:
        row = db.execute("SELECT format FROM snapshots WHERE id = ?", (snapshot_id,)).fetchone()
    finally:
        db.close()
    return str(row[0])


def repositories(server: ServerProcess) -> list[ResticRepository]:
    """The accounts' snapshot repositories the server made."""
    keys = server.home / "snapshot-keys"
    return [
        ResticRepository(
            str(server.home / "snapshots" / "accounts" / key.stem.removeprefix("account-")),
            key,
            cache_dir=server.home / "cache" / "restic",
        )
        for key in sorted(keys.glob("account-*.password"))
    ]


def check_clean(server: ServerProcess) -> None:
    """``restic check`` passes (tried again while a live process of the server holds
    the repository's lock: its recovery or pruning, or the helper of an interrupted
    snapshot, which is removed only just after the snapshot is marked failed)."""
    repos = repositories(server)
    assert repos
    for repo in repos:
        check_one_clean(repo)
    # Nothing went into the installation-wide repository of earlier versions.
    assert not (server.home / "snapshots" / "config").exists()


def check_one_clean(repo: ResticRepository) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            result = repo.check()
        except ResticLocked:
            if time.monotonic() > deadline:
                raise
        else:
            if result.ok or time.monotonic() > deadline or "lock" not in result.output:
                break
        time.sleep(1)
    assert result.ok, result.output


def test_snapshot_restore_and_clone_byte_for_byte(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    """A volume kept as its files (``tree``), read by restic in a helper that mounts
    only that volume and reaches its account's own repository through the operation's
    REST backend server; the next snapshot reads only what changed."""
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        cid = create_cluster(c)
        code, out = sh(engine, server, cid, WRITE_TREE.format(big_mb=100))
        assert code == 0, out
        before = tree_checksum(engine, server, cid)

        first = take_snapshot(c, cid, "first")
        assert snapshot_format(server, first["id"]) == "tree"
        assert first["consistency"] == "crash_consistent"
        assert first["source_cluster_id"] == cid
        assert first["size_bytes"] >= 100 * 1024 * 1024
        assert first["file_count"] == 44  # the regular files of WRITE_TREE
        assert first["stored_bytes"] > 0 and first["ready_at"]
        listed = c.get("/v1/snapshots", params={"cluster_id": cid}).json()["data"]
        assert [s["id"] for s in listed["snapshots"]] == [first["id"]]

        # Change and delete files, then restore with seed 000's start body.
        code, out = sh(
            engine,
            server,
            cid,
            "cd /workspace && rm -rf code empty-dir && echo new > new.txt "
            "&& dd if=/dev/zero of=data/big.bin bs=1k count=1 conv=notrunc 2>/dev/null",
        )
        assert code == 0, out
        assert tree_checksum(engine, server, cid) != before
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        wait_status(c, cid, {"stopped"})
        r = c.post(
            f"/v1/clusters/{cid}/start",
            json={"restore_from_snapshot": first["id"], "wait_for_ready": True},
        )
        assert r.status_code == 200, r.text
        started = r.json()["data"]
        assert started["status"] == "running", started
        assert any(first["id"] in a for a in started["configuration_updates_applied"])
        assert tree_checksum(engine, server, cid) == before
        events = c.get(f"/v1/clusters/{cid}/events").json()["data"]
        assert any("restored snapshot" in str(e) for e in events.get("events", events))

        # A clone starts with the same tree.
        clone = create_cluster(c, snapshot_id=first["id"])
        assert tree_checksum(engine, server, clone) == before

        # After a 1 % change the next snapshot stores far less.
        code, out = sh(
            engine,
            server,
            cid,
            "dd if=/dev/urandom of=/workspace/data/big.bin bs=1k count=1024 seek=50000 "
            "conv=notrunc 2>/dev/null",
        )
        assert code == 0, out
        second = take_snapshot(c, cid, "second")
        assert second["stored_bytes"] < first["stored_bytes"] / 5, (first, second)
        # The next one is compared against it (the volume's previous snapshot; the
        # restore made the volume anew): restic reads only the file that changed.
        assert sh(engine, server, cid, "echo more >> /workspace/code/f2.txt")[0] == 0
        third = take_snapshot(c, cid, "third")
        events = c.get(f"/v1/clusters/{cid}/events").json()["data"]
        ready = [str(e) for e in events.get("events", events) if f"{third['id']} ready" in str(e)]
        assert ready and "43 files unchanged" in ready[0], ready

        # A snapshot of a stopped cluster says so.
        assert c.post(f"/v1/clusters/{clone}/stop").status_code == 200
        wait_status(c, clone, {"stopped"})
        assert take_snapshot(c, clone, "rest")["consistency"] == "stopped"
        check_clean(server)


def test_kill9_during_snapshot_and_restore_leaves_everything_intact(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    home = tmp_path / "home"
    server = ServerProcess(home, engine_url, free_port())
    server.start()
    try:
        with server.client() as c:
            cid = create_cluster(c)
            code, out = sh(engine, server, cid, WRITE_TREE.format(big_mb=200))
            assert code == 0, out
            at_good = tree_checksum(engine, server, cid)
            good = take_snapshot(c, cid, "good")
            # New data for the next snapshot to read (unchanged files are skipped).
            code, out = sh(
                engine, server, cid, "dd if=/dev/urandom of=/workspace/new.bin bs=1M count=200"
            )
            assert code == 0, out
            before = tree_checksum(engine, server, cid)

            # Kill -9 in the middle of a snapshot.
            r = c.post(f"/v1/clusters/{cid}/snapshots", json={"name": "cut"})
            cut = r.json()["data"]["id"]
            deadline = time.monotonic() + 60
            while True:
                data = c.get(f"/v1/snapshots/{cut}").json()["data"]
                assert data["status"] == "creating", data
                if data["progress"]["bytes_done"]:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
        server.kill9()
        server.start()
        with server.client() as c:
            data = wait_snapshot(c, cut)
            assert data["status"] == "failed" and "interrupted" in data["error"], data
            check_clean(server)
            assert tree_checksum(engine, server, cid) == before

            # Kill -9 in the middle of a restore (into a changed volume).
            assert sh(engine, server, cid, "rm -rf /workspace/code")[0] == 0
            changed = tree_checksum(engine, server, cid)
            assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
            wait_status(c, cid, {"stopped"})
            r = c.post(f"/v1/clusters/{cid}/start", json={"restore_from_snapshot": good["id"]})
            assert r.status_code == 200, r.text
            deadline = time.monotonic() + 60
            while True:
                progress = c.get(f"/v1/clusters/{cid}").json()["data"].get("startup_progress")
                if (progress or {}).get("restoring_snapshot"):
                    break
                assert time.monotonic() < deadline, progress
                time.sleep(0.02)
            assert progress is not None and progress["current_step"] == "Restoring snapshot"
            time.sleep(0.5)  # well inside the restore of a few hundred MB
            assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "starting"
        assert changed != at_good
        server.kill9()
        server.start()
        with server.client() as c:
            # The restore runs again from the start into a fresh volume and completes.
            data = wait_status(c, cid, {"running", "error"}, timeout=180)
            assert data["status"] == "running", data
            assert tree_checksum(engine, server, cid) == at_good
            check_clean(server)
    finally:
        server.cleanup()


@needs(
    "moto_server",
    None if moto_server_path() else "moto_server is not installed",
    how="pip install 'moto[server]' (make venv)",
)
def test_snapshots_in_an_s3_bucket(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    """GPUYARD_SNAPSHOT_REPOSITORY names an S3-compatible bucket (moto's server here):
    a snapshot goes there and comes back byte for byte."""
    with moto_s3(tmp_path) as endpoint:
        make_bucket(endpoint, "gpuyard")
        location = f"s3:{endpoint}/gpuyard/snapshots"
        server = ServerProcess(tmp_path / "home", engine_url, free_port())
        server.extra_env = {"GPUYARD_SNAPSHOT_REPOSITORY": location, **S3_ENV}
        try:
            server.start()
            with server.client() as c:
                cid = create_cluster(c)
                code, out = sh(engine, server, cid, WRITE_TREE.format(big_mb=8))
                assert code == 0, out
                before = tree_checksum(engine, server, cid)
                snap = take_snapshot(c, cid, "to-s3")
                assert not (server.home / "snapshots").exists()
                clone = create_cluster(c, snapshot_id=snap["id"])
                assert tree_checksum(engine, server, clone) == before
            (key,) = (server.home / "snapshot-keys").glob("account-*.password")
            account = key.stem.removeprefix("account-")
            repo = ResticRepository(
                f"{location}/accounts/{account}",
                key,
                cache_dir=tmp_path / "check-cache",
                env={"PATH": os.environ.get("PATH", os.defpath), **S3_ENV},
            )
            result = repo.check()
            assert result.ok, result.output
        finally:
            server.cleanup()
