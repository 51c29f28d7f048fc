"""restic beside a volume, reaching the repository only through the operation's REST
backend server (storage/volume_restic.py), on the local Podman with the real restic:
a snapshot and its byte-identical restore, an incremental that reads only the changed
file, and a tenant's volume whose symlinks point at the repository, at /etc and at the
helper's own work directory (where the server's URL and key password are)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_CLUSTER
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.volumes.copy import VolumeCopyFailed, volume_checksum
from gpuyard.runtimes.volumes.restic_helper import ROLE_RESTIC_HELPER, restic_helper
from gpuyard.storage.rest_objects import Mode
from gpuyard.storage.rest_process import RestServer
from gpuyard.storage.restic import ResticRepository
from gpuyard.storage.volume_restic import backup_in_helper, restore_in_helper
from tests.e2e.test_tree_snapshot_restore import SMALL_FILES, write_tree
from tests.e2e.test_volume_copy import first_mount, listing, mountpoint
from tests.required_parts import as_root, needs, needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("restic", "podman", how="apt-get install restic podman"),
    needs("root", as_root(), how="run the tests as root"),
]

HOST = "gy-test"


@pytest.fixture
def repo(tmp_path: Path) -> ResticRepository:
    repository = ResticRepository(
        str(tmp_path / "repo"), tmp_path / "secrets" / "snapshot.password", tmp_path / "cache"
    )
    repository.ensure()
    return repository


def volume_with(engine: Engine, cluster: str) -> tuple[str, Path]:
    name = engine.owner.volume(cluster)
    engine.ensure_volume(name, {LABEL_CLUSTER: cluster})
    first_mount(engine, name)
    return name, mountpoint(engine, name)


def helpers_left(engine: Engine) -> list[str]:
    return [
        str(r.get("Names")) for r in engine.list_containers(f"gpuyard.role={ROLE_RESTIC_HELPER}")
    ]


def restic_ls(repo: ResticRepository, restic_id: str, tmp_path: Path) -> str:
    done = subprocess.run(
        [
            "restic",
            "--repo",
            str(tmp_path / "repo"),
            "--password-file",
            str(tmp_path / "secrets" / "snapshot.password"),
            "--no-cache",
            "ls",
            "--long",
            restic_id,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_snapshot_incremental_and_restore_beside_the_volume(
    local: Engine, repo: ResticRepository, tmp_path: Path
) -> None:
    src, root = volume_with(local, "rhsrc0000001")
    write_tree(root)
    seen: list[int] = []
    first = backup_in_helper(
        local, src, repo, tags=["t1"], host=HOST, parent=None, on_progress=seen.append
    )
    assert first.files_unmodified == 0 and first.files_new >= SMALL_FILES
    assert seen and seen[-1] == first.bytes

    # One file changed: restic compares against the parent and reads only it.
    (root / "small" / "f007").write_bytes(os.urandom(16 << 10))
    second = backup_in_helper(local, src, repo, tags=["t2"], host=HOST, parent=first.restic_id)
    assert second.files_changed == 1
    assert second.files_new == 0
    assert second.files_unmodified == first.files - 1
    assert second.data_added < first.data_added / 10

    dst = local.owner.volume("rhdst0000001")
    restore_in_helper(local, dst, {LABEL_CLUSTER: "rhdst0000001"}, repo, second.restic_id)
    assert listing(mountpoint(local, dst)) == listing(root)
    assert volume_checksum(local, dst) == volume_checksum(local, src)
    assert repo.check().ok
    assert helpers_left(local) == []
    # Nothing of the operations is left in the repository: no lock, no extra key.
    assert os.listdir(tmp_path / "repo" / "locks") == []
    assert len(os.listdir(tmp_path / "repo" / "keys")) == 1  # the cheap one, made here


def test_symlinks_in_the_volume_lead_only_into_the_helper(
    local: Engine, repo: ResticRepository, tmp_path: Path
) -> None:
    """A tenant's links at the repository's path, its password file, /etc and the
    helper's work directory are kept as links: restic reads none of their targets, and
    the restore writes them back as links."""
    src, root = volume_with(local, "rhevil000001")
    (root / "data.bin").write_bytes(b"mine\n")
    targets = {
        "to-repo": str(tmp_path / "repo"),
        "to-config": str(tmp_path / "repo" / "config"),
        "to-password": str(tmp_path / "secrets" / "snapshot.password"),
        "to-etc": "/etc",
        "to-shadow": "/etc/shadow",
        "to-work": "/gy",
        "to-key-password": "/gy/pw",
        "to-url": "/gy/repo",
        "to-proc": "/proc/1/environ",
    }
    for name, target in targets.items():
        os.symlink(target, root / name)
    (root / "dir").mkdir()
    os.symlink("/gy", root / "dir" / "work")
    taken = backup_in_helper(local, src, repo, tags=["evil"], host=HOST, parent=None)
    assert taken.files == 1  # data.bin; the links are links
    listed = restic_ls(repo, taken.restic_id, tmp_path)
    for name, target in targets.items():
        assert f"/data/{name} -> {target}" in listed
    password = (tmp_path / "secrets" / "snapshot.password").read_text().strip()
    assert password not in listed

    dst = local.owner.volume("rhevil000002")
    restore_in_helper(local, dst, {LABEL_CLUSTER: "rhevil000002"}, repo, taken.restic_id)
    restored = mountpoint(local, dst)
    for name, target in targets.items():
        assert (restored / name).is_symlink()
        assert os.readlink(restored / name) == target
    assert (restored / "data.bin").read_bytes() == b"mine\n"
    assert listing(restored) == listing(root)
    assert repo.check().ok


def test_the_helper_holds_only_the_volume_and_its_one_time_access(
    local: Engine, repo: ResticRepository, tmp_path: Path
) -> None:
    """While restic runs: the helper has the volume read-only, its work directory and a
    tmpfs, no network and its own PID namespace, and no secret in its configuration;
    the server listens only inside the helper's namespace. After it: the one-time key's
    password (which a tenant's race could read in the helper) opens nothing."""
    src, _root = volume_with(local, "rhlook000001")
    access = repo.helper_access()
    assert access is not None
    root, key = access
    with restic_helper(
        local, src, ["--no-cache", "cat", "config"], binary=repo.binary(), read_only=True
    ) as run:
        with RestServer(root, Mode.BACKUP, {key.name: key.content}) as srv:
            srv.listen(run.netns_fd)
            info = local.api.inspect_container(run.name)
            # Nothing on this machine's own loopback answers for the repository.
            assert srv.port is not None
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
            run.go({"repo": srv.url().encode(), "pw": key.password.encode()})
            result = run.wait()
        url, password = srv.url(), key.password
    assert result.exit_status == 0, result.stderr
    host = info["HostConfig"]
    assert host.get("NetworkMode") == "none"
    assert host.get("PidMode") in ("", "private", None)
    assert not host.get("Privileged")
    mounts = sorted((m["Destination"], m["RW"], m.get("Name") or "") for m in info["Mounts"])
    assert [m[:2] for m in mounts] == [("/data", False), ("/gy", True)], mounts
    assert mounts[0][2] == src
    configured = json.dumps(info["Config"])
    for secret in (password, url, repo_password(tmp_path)):
        assert secret not in configured
    # The leaked one-time password opens no key the repository holds.
    leaked = tmp_path / "leaked"
    leaked.write_text(password)
    done = subprocess.run(
        ["restic", "--repo", str(tmp_path / "repo"), "--password-file", str(leaked),
         "--no-cache", "cat", "config"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "wrong password" in done.stderr
    assert helpers_left(local) == []


def repo_password(tmp_path: Path) -> str:
    return (tmp_path / "secrets" / "snapshot.password").read_text().strip()


def test_a_backup_waits_out_another_process_holding_the_repository(
    local: Engine, repo: ResticRepository, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process's exclusive lock (a prune by a second server on the same
    repository) refuses restic at once; the backup runs again once the lock is gone
    instead of failing the snapshot."""
    src, root = volume_with(local, "rhlock000001")
    (root / "data").write_bytes(os.urandom(64 << 10))
    # ``restic key passwd`` takes the exclusive lock, then waits for the new password
    # on its stdin: the lock is held until that pipe closes.
    holder = subprocess.Popen(
        [
            "restic",
            "--repo",
            str(tmp_path / "repo"),
            "--password-file",
            str(tmp_path / "secrets" / "snapshot.password"),
            "key",
            "passwd",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: bool(os.listdir(tmp_path / "repo" / "locks")), "the holder's lock")
        caplog.set_level(logging.INFO, logger="gpuyard.storage.volume_restic")
        done: list[Any] = []
        backup = threading.Thread(
            target=lambda: done.append(
                backup_in_helper(local, src, repo, tags=["t1"], host=HOST, parent=None)
            )
        )
        backup.start()
        wait_for(lambda: "waits for a lock" in caplog.text, "the backup refused for the lock")
        assert backup.is_alive() and not done
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # no new password: restic gives up and drops its lock
        holder.wait(30)
    backup.join(300)
    assert done and done[0].files_new == 1
    assert os.listdir(tmp_path / "repo" / "locks") == []
    assert repo.check().ok


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def _rest_servers_of_this_process() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("PPid:"))
        if ppid == os.getpid() and b"gpuyard.storage.rest_server" in cmdline:
            found.append(int(entry))
    return found


def test_a_repository_server_that_dies_ends_the_backup_at_once(
    local: Engine, repo: ResticRepository
) -> None:
    """restic retries a repository that stopped answering for many minutes; the
    operation watches its server and ends when it is gone."""
    src, root = volume_with(local, "rhdead000001")
    for i in range(8):
        (root / f"big-{i}").write_bytes(os.urandom(16 << 20))
    killed: list[int] = []

    def kill_the_server(_done: int) -> None:
        if not killed:
            for pid in _rest_servers_of_this_process():
                os.kill(pid, 9)
                killed.append(pid)

    began = time.monotonic()
    with pytest.raises(RuntimeFailure, match="repository server"):
        backup_in_helper(
            local, src, repo, tags=["t"], host=HOST, parent=None, on_progress=kill_the_server
        )
    assert killed
    assert time.monotonic() - began < 60
    assert helpers_left(local) == []


def test_a_volume_gone_before_the_helper_mounts_it_is_not_snapshotted_empty(
    local: Engine, repo: ResticRepository
) -> None:
    """The engine makes a missing named volume when a container mounts it: a volume
    removed after it was checked would be read as an empty one."""
    gone = local.owner.volume("rhgone000001")
    try:
        with (
            pytest.raises(VolumeCopyFailed),
            restic_helper(local, gone, ["version"], binary=repo.binary(), read_only=True),
        ):
            pass
        assert helpers_left(local) == []
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            local.api.remove_volume(gone)  # the one the engine made for this test's helper
