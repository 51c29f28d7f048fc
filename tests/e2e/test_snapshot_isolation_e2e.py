"""A tenant who turns a directory of their volume into a symlink to the server's home
while a snapshot reads it gets nothing of the snapshot repositories, and one account's
snapshots cannot be decrypted with anything another account can obtain (real server,
real Podman, real restic).

The attack: account B's volume holds ``g2`` with one large sparse file (to keep the
reader busy in it) and entries named like the server's home (``snapshot.password``,
``snapshots``, ``cache``, ``snapshot-keys``); once the snapshot is reading, B replaces
``g2`` with a symlink to the server's home. A reader that lists ``g2`` and then opens
its entries by path, beside the home's files, would store the repository's password
and files in B's snapshot (what restic run beside the volume did)."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.volumes.copy import LABEL_HELPER_VOLUME, volume_tar_stream
from tests.e2e.conftest import purge_installation
from tests.e2e.test_network_isolation import as_key, new_account_key
from tests.e2e.test_server_e2e import ServerProcess, running_server, sh
from tests.e2e.test_snapshots_e2e import create_cluster, take_snapshot, wait_snapshot
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("restic", "podman", how="apt-get install restic podman runc"),
]

# Big enough that the snapshot is still reading it when the swap is made.
SPARSE_GB = 4
# Members larger than this are not searched (the sparse file's zeros).
SEARCHED_BYTES = 64 << 20


@pytest.fixture
def engine(engine_url: str) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=engine_url)
    yield client
    client.close()


def row(server: ServerProcess, snapshot_id: str) -> tuple[str, str, int]:
    """(restic id, format, account id) of a snapshot, from the server's database."""
    db = sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True, timeout=10)
    try:
        found = db.execute(
            "SELECT restic_id, format, account_id FROM snapshots WHERE id = ?", (snapshot_id,)
        ).fetchone()
    finally:
        db.close()
    assert found is not None and found[0], snapshot_id
    return str(found[0]), str(found[1]), int(found[2])


def repository_of(server: ServerProcess, account_id: int) -> tuple[str, Path]:
    """(repository, password file) that hold ``account_id``'s snapshots: its own
    repository, or the installation-wide one where there is no per-account key."""
    own = server.home / "snapshot-keys" / f"account-{account_id}.password"
    if own.exists():
        return str(server.home / "snapshots" / "accounts" / str(account_id)), own
    return str(server.home / "snapshots"), server.home / "snapshot.password"


def restic(repository: str, password_file: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["restic", "--repo", repository, "--password-file", str(password_file), "--no-cache",
         *args],
        capture_output=True,
        timeout=600,
    )  # fmt: skip


def members(server: ServerProcess, snapshot_id: str) -> dict[str, tuple[str, bytes]]:
    """Every entry of the snapshot as its owner could read it back: name -> (kind,
    content for a regular file of at most SEARCHED_BYTES, link target for a symlink)."""
    restic_id, fmt, account_id = row(server, snapshot_id)
    repository, password = repository_of(server, account_id)
    path = "/data" if fmt == "tree" else "/volume.tar"
    argv = ["restic", "--repo", repository, "--password-file", str(password), "--no-cache"]
    found: dict[str, tuple[str, bytes]] = {}
    with subprocess.Popen(
        [*argv, "dump", restic_id, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                if member.issym():
                    found[member.name] = ("symlink", member.linkname.encode())
                elif member.isfile():
                    data = b""
                    if member.size <= SEARCHED_BYTES:
                        extracted = tar.extractfile(member)
                        assert extracted is not None
                        data = extracted.read()
                    found[member.name] = ("file", data)
                else:
                    found[member.name] = ("dir" if member.isdir() else "other", b"")
        stderr = proc.stderr.read()
    assert proc.returncode == 0, stderr.decode()
    return {name.removeprefix("data/").removeprefix("./"): v for name, v in found.items()}


def home_files(home: Path) -> dict[str, bytes]:
    """The sha256 of each file under the server's home (its repositories, keys, cache,
    database) -> its path."""
    out: dict[str, bytes] = {}
    for path in home.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= SEARCHED_BYTES:
            with path.open("rb") as f:
                out[str(path)] = f.read()
    return out


def secrets_of(home: Path) -> list[bytes]:
    """Every snapshot password the server holds: the installation's, each account's."""
    found = [(home / "snapshot.password").read_bytes().strip()]
    keys = home / "snapshot-keys"
    if keys.is_dir():
        found += [p.read_bytes().strip() for p in sorted(keys.iterdir())]
    assert all(found)
    return found


def swap_during_snapshot(
    c: httpx.Client, engine: docker.DockerClient, server: ServerProcess, cid: str
) -> dict[str, Any]:
    """Start a snapshot of ``cid``, swap ``g2`` for a symlink to the home once it reads,
    and return the snapshot as it ended (ready or failed)."""
    r = c.post(f"/v1/clusters/{cid}/snapshots", json={"name": "swap"})
    assert r.status_code == 202, r.text
    sid = r.json()["data"]["id"]
    deadline = time.monotonic() + 120
    while True:
        data = c.get(f"/v1/snapshots/{sid}").json()["data"]
        assert data["status"] == "creating", data  # still inside the sparse file
        if data["progress"]["bytes_done"]:
            break
        assert time.monotonic() < deadline, data
        time.sleep(0.05)
    home = server.home
    code, out = sh(
        engine,
        server,
        cid,
        f"cd /workspace && mv g2 g2.was && ln -s {home} g2 "
        f"&& mv g3 g3.was && ln -s {home}/snapshots g3 || test -L g2",
    )
    assert code == 0, out
    return wait_snapshot(c, sid, timeout=600)


def test_a_symlink_swapped_in_during_a_snapshot_reaches_no_repository(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as a:
        # Account A keeps a secret in a snapshot.
        a_cluster = create_cluster(a)
        code, out = sh(engine, server, a_cluster, "echo a-secret-4711 > /workspace/secret.txt")
        assert code == 0, out
        a_snap = take_snapshot(a, a_cluster, "a")

        # Account B prepares the swap.
        b = as_key(server, new_account_key(server, "b@example.com"))
        b_cluster = create_cluster(b)
        code, out = sh(
            engine,
            server,
            b_cluster,
            "cd /workspace && mkdir -p g2/snapshots g2/cache g2/snapshot-keys g3/keys "
            f"&& dd if=/dev/zero of=g2/a-sparse bs=1 count=0 seek={SPARSE_GB}G 2>/dev/null "
            "&& echo decoy > g2/snapshot.password && echo decoy > g2/snapshots/config "
            "&& echo decoy > g2/cache/CACHEDIR.TAG && echo decoy > g2/snapshot-keys/x "
            f"&& dd if=/dev/zero of=g3/a-sparse bs=1 count=0 seek={SPARSE_GB}G 2>/dev/null "
            "&& echo decoy > g3/config && echo decoy > g3/keys/x",
        )
        assert code == 0, out

        swapped = swap_during_snapshot(b, engine, server, b_cluster)
        # The swap may have made the snapshot fail (entries gone while read); one
        # taken afterwards holds g2 as it is now: a symlink.
        sh(engine, server, b_cluster, "rm -f /workspace/g2.was/a-sparse /workspace/g3.was/a-sparse")
        after = take_snapshot(b, b_cluster, "after")
        taken = [s["id"] for s in (swapped, after) if s["status"] == "ready"]

        home = server.home
        passwords = secrets_of(home)
        files = home_files(home)
        by_hash = {hashlib.sha256(data).digest(): path for path, data in files.items()}
        for sid in taken:
            for name, (kind, data) in members(server, sid).items():
                if kind != "file" or len(data) < 8:
                    continue
                assert hashlib.sha256(data).digest() not in by_hash, (
                    f"snapshot {sid} holds {by_hash.get(hashlib.sha256(data).digest())} as {name}"
                )
                for secret in passwords:
                    assert secret not in data, f"snapshot {sid} holds a password in {name}"
        # Symlinks are stored as what they are.
        held = members(server, after["id"])
        assert held["g2"] == ("symlink", str(home).encode()), held.get("g2")
        assert held["g3"] == ("symlink", f"{home}/snapshots".encode()), held.get("g3")

        # A's snapshot cannot be opened with anything B has or can obtain: B's
        # password, nor any small file B's snapshots hold.
        a_restic_id, _fmt, a_account = row(server, a_snap["id"])
        _bid, _bfmt, b_account = row(server, after["id"])
        a_repo, a_password = repository_of(server, a_account)
        b_repo, b_password = repository_of(server, b_account)
        assert restic(a_repo, a_password, "cat", "config").returncode == 0
        candidates = [b_password.read_bytes()]
        for sid in taken:
            candidates += [
                data for kind, data in members(server, sid).values() if kind == "file" and data
            ]
        for i, candidate in enumerate(dict.fromkeys(candidates)):
            guess = tmp_path / f"guess-{i}"
            guess.write_bytes(candidate)
            opened = restic(a_repo, guess, "cat", "snapshot", a_restic_id)
            assert opened.returncode != 0, f"account A's snapshot opens with {candidate[:40]!r}"
        assert a_repo != b_repo


def test_the_reader_of_a_volume_holds_nothing_but_that_volume(engine_url: str) -> None:
    """The helper whose tar a snapshot stores: that volume alone, read-only, no
    network, its own PID namespace, no privileges beyond the engine's defaults."""
    owner = Ownership.new()
    local = Engine(engine_url, owner=owner)
    try:
        volume = owner.volume("readcluster001")
        local.ensure_volume(volume)
        with volume_tar_stream(local, volume) as chunks:
            (helper,) = local.list_containers(f"{LABEL_HELPER_VOLUME}={volume}")
            info = local.api.inspect_container(helper["Id"])
            b"".join(chunks)
        host = info["HostConfig"]
        assert host.get("PidMode") in ("", "private", None), host.get("PidMode")
        assert host.get("NetworkMode") == "none"
        assert not host.get("Privileged")
        mounts = info["Mounts"]
        assert [(m.get("Name"), m["Destination"], m["RW"]) for m in mounts] == [
            (volume, "/data", False)
        ], mounts
        assert not [k for k in info["Config"].get("Env") or [] if "PASSWORD" in k or "AWS_" in k]
    finally:
        purge_installation(engine_url, owner.installation_id)
