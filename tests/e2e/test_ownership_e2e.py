"""Ownership and recovery with real server processes on real Podman (issue 10).

- Two installations on one engine never touch each other's objects: not while both run,
  not when one terminates a cluster, not when one starts over with a new home (a new
  installation), and a database restored from an older backup quarantines, never
  deletes, the volume it does not know.
- An engine restart (its service stopped, the container killed) brings a running
  cluster back with its volume; nothing is declared dead while the engine is away, and
  its GPUs are never offered to anyone else meanwhile.
- A container that exits on its own is restarted with back-off and ends in ``error``
  with its exit code after the limit, keeping its stopped container (and logs).

Each server gets its own host-port range, and every clean-up removes only objects
labelled with an installation id the test made (ServerProcess.cleanup).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_INSTALLATION
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.observability.metrics import FULL_PASSES
from gpuyard.runtimes.engines.engine import vanished_mid_removal
from gpuyard.runtimes.engines.url import PodmanService
from tests.e2e.conftest import DEV_IMAGE, SERVICE_HOW
from tests.e2e.test_server_e2e import (
    ServerProcess,
    container_name,
    sh,
    sh_in,
    volume_name,
    wait_status,
)
from tests.helpers import PORT_BLOCK_SIZE, free_port
from tests.required_parts import need, needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

# The servers here heartbeat and observe their engine every second (5 s by default):
# what the tests wait for (a crash seen, an orphan collected) comes within seconds.
FAST_OBSERVE = {"GPUYARD_HEARTBEAT_INTERVAL_S": "1", "GPUYARD_OBSERVE_INTERVAL_S": "1"}
# A check held over this many full reconcile passes (each observed every engine the
# server owns) outlasts a 2 s orphan grace: a container wrongly taken for an unknown
# one would be first seen by the first pass, collected by the third and gone by the
# fourth.
OBSERVE_PASSES = 4

ServerFactory = Callable[..., ServerProcess]


@pytest.fixture
def engine(engine_url: str) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=engine_url)
    yield client
    client.close()


def _servers(
    tmp_path: Path, before_cleanup: Callable[[], object] = lambda: None
) -> Iterator[ServerFactory]:
    made: list[ServerProcess] = []

    def make(name: str, url: str, *, start: bool = True, **env: str) -> ServerProcess:
        server = ServerProcess(tmp_path / name, url, free_port())  # a port block of its own
        server.extra_env = {**FAST_OBSERVE, **env}
        made.append(server)
        if start:
            server.start()
        return server

    try:
        yield make
    finally:
        for server in made:
            server.stop()
        before_cleanup()
        for server in made:
            server.cleanup()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    """Starts servers (name, engine URL, extra settings; ``start=False``: made, not
    started); stops them after and removes what their installations left on the engine."""
    yield from _servers(tmp_path)


def start_together(*servers: ServerProcess) -> None:
    """Start ``servers`` side by side (their imports and starts overlap)."""
    for server in servers:
        server.launch()
    for server in servers:
        server.wait_up()


# -- helpers -----------------------------------------------------------------------------


def create(c: httpx.Client, **body: Any) -> str:
    r = c.post(
        "/v1/clusters",
        json={
            "gpu_type": "NVIDIA RTX A6000",
            "gpu_count": 1,
            "docker_image": DEV_IMAGE,
            "volume_gb": 1,
            **body,
        },
    )
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    return cid


def container_state(engine: docker.DockerClient, name: str) -> str | None:
    """The engine's state of the container ``name`` (None: there is none)."""
    try:
        status: str = engine.containers.get(name).status
    except docker.errors.APIError as e:
        if vanished_mid_removal(e):  # being removed right now
            return None
        raise
    return status


def volume_exists(engine: docker.DockerClient, name: str) -> bool:
    try:
        engine.volumes.get(name)
    except docker.errors.NotFound:
        return False
    return True


def volume_file(engine: docker.DockerClient, name: str, path: str) -> str:
    """A file inside volume ``name``, read by a short-lived container of this test that
    mounts it read-only: a sized volume's data lies in its own file system image,
    mounted only while a container uses it, so the host's mount point is empty."""
    out = engine.containers.run(
        DEV_IMAGE,
        ["cat", f"/v/{path}"],
        volumes={name: {"bind": "/v", "mode": "ro"}},
        network_mode="none",
        labels={"gpuyard.test": "ownership-read"},
        remove=True,
    )
    return out.decode() if isinstance(out, bytes) else str(out)


def full_passes(server: ServerProcess) -> int:
    """The server's count of full reconcile passes (``/metrics``)."""
    r = httpx.get(
        server.url + "/metrics",
        headers={"Authorization": f"Bearer {server.key}"},
        timeout=30,
        verify=trusted_tls(),
    )
    assert r.status_code == 200, r.text
    for line in r.text.splitlines():
        if line.startswith(FULL_PASSES + "_total "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no {FULL_PASSES} in /metrics")


def holds(check: Callable[[], None], *servers: ServerProcess, passes: int = OBSERVE_PASSES) -> None:
    """``check`` passes now and keeps passing until every one of ``servers`` has made
    ``passes`` more full reconcile passes (polled; the first failure is raised at once)."""
    marks = {server: full_passes(server) + passes for server in servers}
    deadline = time.monotonic() + 120
    while True:
        check()
        if all(full_passes(server) >= mark for server, mark in marks.items()):
            check()
            return
        assert time.monotonic() < deadline, "the servers made no full reconcile passes"
        time.sleep(0.2)


def eventually(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def cluster(c: httpx.Client, cid: str) -> dict[str, Any]:
    data: dict[str, Any] = c.get(f"/v1/clusters/{cid}").json()["data"]
    return data


def quarantined(server: ServerProcess) -> dict[str, tuple[str | None, str | None]]:
    """Rows of the server's ``orphan_volumes`` table: name -> (cluster id, deleted_at)."""
    db = sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute("SELECT name, cluster_id, deleted_at FROM orphan_volumes").fetchall()
    finally:
        db.close()
    return {str(name): (cluster_id, deleted_at) for name, cluster_id, deleted_at in rows}


def backup_db(server: ServerProcess, target: Path) -> None:
    """A consistent copy of the server's live SQLite database (WAL included)."""
    src = sqlite3.connect(server.db_path, timeout=10)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def restore_db(server: ServerProcess, copy: Path) -> None:
    """Put ``copy`` back as the (stopped) server's database."""
    for suffix in ("-wal", "-shm"):
        Path(f"{server.db_path}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(copy, server.db_path)


# -- two installations on one engine -------------------------------------------------------


def test_two_installations_share_an_engine(
    servers: ServerFactory, engine_url: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    # A collects unknown containers of its own after 2 s: were B's containers or the
    # previous installation's taken for A's, they would be gone within the hold below.
    a = servers("a", engine_url, start=False, GPUYARD_ORPHAN_CONTAINER_GRACE_S="2")
    b = servers("b", engine_url, start=False)
    start_together(a, b)
    a_id, b_id = a.installation, b.installation
    assert a_id != b_id

    ports = [{"internal_port": 8888, "external_port": 0, "protocol": "http"}]
    with a.client() as ca, b.client() as cb:
        a1, a2 = create(ca, name="a1", ports=ports), create(ca, name="a2")
        b1, b2 = create(cb, name="b1", ports=ports), create(cb, name="b2")
        for c, cid in ((ca, a1), (ca, a2), (cb, b1), (cb, b2)):
            assert wait_status(c, cid, {"running", "error"}, timeout=90)["status"] == "running"
        for c, cid, srv in ((ca, a1, a), (cb, b1, b)):
            port = cluster(c, cid)["ports"][0]["external_port"]
            assert srv.port_block <= port < srv.port_block + PORT_BLOCK_SIZE
        for server, cid in ((a, a1), (a, a2), (b, b1), (b, b2)):
            assert sh(engine, server, cid, f"echo {cid} > /workspace/mark")[0] == 0
            name = container_name(server, cid)
            assert name.startswith(server.installation.prefix + "-")
            labels = engine.containers.get(name).labels
            assert labels[LABEL_INSTALLATION] == server.installation.installation_id

        def all_run(*pairs: tuple[ServerProcess, httpx.Client, str]) -> Callable[[], None]:
            def check() -> None:
                for server, c, cid in pairs:
                    assert cluster(c, cid)["status"] == "running", cid
                    assert container_state(engine, container_name(server, cid)) == "running"
                    assert volume_exists(engine, volume_name(server, cid)), cid

            return check

        everything = all_run((a, ca, a1), (a, ca, a2), (b, cb, b1), (b, cb, b2))
        holds(everything, a, b)
        for server, cid in ((a, a1), (a, a2), (b, b1), (b, b2)):
            assert sh(engine, server, cid, "cat /workspace/mark") == (0, f"{cid}\n")

        # Terminating in A leaves B's untouched.
        a1_container, a1_volume = container_name(a, a1), volume_name(a, a1)
        assert ca.delete(f"/v1/clusters/{a1}").status_code == 200
        wait_status(ca, a1, {"terminated"})
        assert container_state(engine, a1_container) is None
        assert not volume_exists(engine, a1_volume)
        all_run((a, ca, a2), (b, cb, b1), (b, cb, b2))()
        assert sh(engine, b, b1, "cat /workspace/mark") == (0, f"{b1}\n")

        # B's database as it is now, before b3 exists (restored further down).
        old_b_db = tmp_path / "b-before-b3.db"
        backup_db(b, old_b_db)
        b3 = create(cb, name="b3")
        assert wait_status(cb, b3, {"running", "error"}, timeout=90)["status"] == "running"
        assert sh(engine, b, b3, "echo precious > /workspace/data")[0] == 0
        b3_container, b3_volume = container_name(b, b3), volume_name(b, b3)

    # A starts over with a new home: a new installation, which owns none of the old
    # one's objects (nor B's) and deletes nothing.
    a2_container, a2_volume = container_name(a, a2), volume_name(a, a2)
    a.stop()
    shutil.rmtree(a.home)
    a.start()
    assert a.installation not in (a_id, b_id)
    assert a.installations == {a_id.installation_id, a.installation.installation_id}
    with b.client() as cb:

        def nothing_lost() -> None:
            all_run((b, cb, b1), (b, cb, b2), (b, cb, b3))()
            assert container_state(engine, a2_container) == "running"
            assert volume_exists(engine, a2_volume)

        holds(nothing_lost, a, b)
        assert not quarantined(a)  # the old installation's volumes are not the new one's
        assert sh_in(engine.containers.get(a2_container), "cat /workspace/mark") == (0, f"{a2}\n")

    # B's database restored from the copy that predates b3: b3's volume is quarantined,
    # not deleted, and b3's (unknown) container is stopped and kept after the grace.
    b.stop()
    restore_db(b, old_b_db)
    b.extra_env["GPUYARD_ORPHAN_CONTAINER_GRACE_S"] = "2"
    b.start()
    with b.client() as cb:
        assert cb.get(f"/v1/clusters/{b3}").status_code == 404
        eventually(
            lambda: quarantined(b).get(b3_volume) == (b3, None), 30, "b3's volume quarantined"
        )
        eventually(
            lambda: container_state(engine, b3_container) == "exited",
            30,
            "b3's unknown container stopped (and kept) after the grace",
        )
        assert volume_exists(engine, b3_volume)
        assert volume_file(engine, b3_volume, "data") == "precious\n"
        r = cb.get("/v1/orphans")
        assert r.status_code == 200, r.text
        listed = {o["name"]: o for o in r.json()["data"]["orphans"]}
        assert listed[b3_volume]["status"] == "quarantined"
        assert listed[b3_volume]["cluster_id"] == b3
        assert r.json()["data"]["installation_id"] == b_id.installation_id
        # Only b3's volume: the volumes the copy knows, A's and the old installation's
        # are not orphans of B.
        assert set(listed) == {b3_volume}
        all_run((b, cb, b1), (b, cb, b2))()
        assert container_state(engine, a2_container) == "running"
        assert volume_file(engine, a2_volume, "mark") == f"{a2}\n"


# -- backup and restore ------------------------------------------------------------------


def gpuyard_command(server: ServerProcess, *args: str) -> str:
    """Run ``gpuyard ARGS`` with the server's home (as an operator on its machine)."""
    done = subprocess.run(
        [sys.executable, "-m", "gpuyard", *args],
        env={**os.environ, "GPUYARD_HOME": str(server.home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_restore_into_a_new_home_adopts_old_clusters_and_quarantines_newer_ones(
    servers: ServerFactory, engine_url: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    server = servers("s", engine_url, GPUYARD_ORPHAN_CONTAINER_GRACE_S="2")
    owner = server.installation
    with server.client() as c:
        old = [create(c, name="old1"), create(c, name="old2")]
        for cid in old:
            assert wait_status(c, cid, {"running", "error"}, timeout=90)["status"] == "running"
            assert sh(engine, server, cid, f"echo {cid} > /workspace/mark")[0] == 0
        started = {cid: engine.containers.get(container_name(server, cid)).id for cid in old}
        archive = tmp_path / "backups" / "s.tar.gz"
        out = gpuyard_command(server, "backup", str(archive))  # while it runs
        assert owner.installation_id in out
        new = [create(c, name="new1"), create(c, name="new2")]
        for cid in new:
            assert wait_status(c, cid, {"running", "error"}, timeout=90)["status"] == "running"
            assert sh(engine, server, cid, "echo precious > /workspace/data")[0] == 0

    # The machine is lost: its home goes. The backup brings the installation back.
    server.stop()
    shutil.rmtree(server.home)
    gpuyard_command(server, "restore", str(archive))
    server.start()
    assert server.installation == owner
    with server.client() as c:
        for cid in new:
            assert c.get(f"/v1/clusters/{cid}").status_code == 404
        for cid in new:
            eventually(
                lambda cid=cid: container_state(engine, container_name(server, cid)) == "exited",
                60,
                f"{cid}'s container stopped and kept",
            )

        def adopted() -> None:
            for cid in old:
                assert cluster(c, cid)["status"] == "running", cid
                container = engine.containers.get(container_name(server, cid))
                # The very container the backup knew, never restarted nor recreated.
                assert container.status == "running" and container.id == started[cid]
            for cid in new:
                assert container_state(engine, container_name(server, cid)) == "exited"
                assert volume_exists(engine, volume_name(server, cid)), cid

        holds(adopted, server)
        for cid in old:
            assert sh(engine, server, cid, "cat /workspace/mark") == (0, f"{cid}\n")

        def newer_orphans() -> dict[str, dict[str, Any]] | None:
            rows = c.get("/v1/orphans").json()["data"]["orphans"]
            found = {o["cluster_id"]: o for o in rows if o["cluster_id"] in new}
            return found if len(found) == len(new) else None

        listed = eventually(newer_orphans, 60, "the newer clusters' volumes listed as orphans")
        # Older than the restore: kept until an admin deletes them, whatever the retention.
        assert all(o["status"] == "quarantined" for o in listed.values())
        assert all(o["delete_after"] is None for o in listed.values())
        for cid in new:
            assert volume_file(engine, volume_name(server, cid), "data") == "precious\n"
        # An admin lets one go: its stopped container, which holds the volume, goes too.
        gone = new[0]
        r = c.delete(f"/v1/orphans/{listed[gone]['id']}")
        assert r.status_code == 200, r.text
        assert container_state(engine, container_name(server, gone)) is None
        assert not volume_exists(engine, volume_name(server, gone))
        assert container_state(engine, container_name(server, new[1])) == "exited"


# -- engine restart --------------------------------------------------------------------


@pytest.fixture
def private_engine(engine_url: str) -> Iterator[PodmanService]:
    """A Podman service of this test's own (same storage as the suite's), so the test
    can stop and start it without disturbing the session's service. ``engine_url``
    is requested first so the offline image exists."""
    workdir = Path(tempfile.mkdtemp(prefix="gy-eng-"))
    service = PodmanService(workdir / "podman.sock")
    try:
        service.start()
    except RuntimeFailure as e:
        shutil.rmtree(workdir, ignore_errors=True)
        need("podman system service", f"cannot start it: {e.message}", how=SERVICE_HOW)
    try:
        yield service
    finally:
        service.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def servers_on_private(private_engine: PodmanService, tmp_path: Path) -> Iterator[ServerFactory]:
    """Like ``servers``; torn down before the private engine, which is started again
    first if the test left it stopped (the clean-up goes through it)."""
    yield from _servers(tmp_path, before_cleanup=private_engine.start)


def _log_count(server: ServerProcess, text: str) -> int:
    return server.log.read_text(errors="replace").count(text)


def test_engine_restart_brings_running_clusters_back(
    servers_on_private: ServerFactory, private_engine: PodmanService, engine: docker.DockerClient
) -> None:
    # Heartbeats every second (FAST_OBSERVE): as many misses as the 5 s default would
    # allow in the time the engine is away, so it is never taken for unreachable here.
    server = servers_on_private("eng", private_engine.url, GPUYARD_HEARTBEAT_MISSES="30")
    all_gpus = {"gpu_type": "NVIDIA RTX A6000", "gpu_count": 4, "docker_image": DEV_IMAGE}
    with server.client() as c:
        cid = create(c, gpu_count=2)
        before = wait_status(c, cid, {"running", "error"}, timeout=90)
        assert before["status"] == "running" and before["restarts"] == 0, before
        assert sh(engine, server, cid, "echo survived > /workspace/state")[0] == 0
        name = container_name(server, cid)
        first_id = engine.containers.get(name).id

        def no_gpu_for_anyone_else() -> None:
            r = c.post("/v1/clusters", json=all_gpus)
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "INSUFFICIENT_CAPACITY", r.text

        # The engine goes away, and with it (as a restart would) the container.
        failures_before = _log_count(server, "does not answer")
        private_engine.stop()
        subprocess.run(["podman", "kill", name], check=True, capture_output=True)
        assert container_state(engine, name) in ("exited", "stopped")
        # Nothing is declared dead while the engine does not answer: wait until the
        # server's observe pass has met the silent engine twice, checking throughout.
        deadline = time.monotonic() + 30
        while _log_count(server, "does not answer") < failures_before + 2:
            assert time.monotonic() < deadline, "the server never observed the engine"
            seen = cluster(c, cid)
            assert (seen["status"], seen["restarts"]) == ("running", 0), seen
            no_gpu_for_anyone_else()
            time.sleep(0.5)
        seen = cluster(c, cid)
        assert (seen["status"], seen["restarts"]) == ("running", 0), seen

        private_engine.start()  # same socket: the engine is back

        def back() -> dict[str, Any] | None:
            data = cluster(c, cid)
            assert data["status"] == "running", data  # never error, never released
            no_gpu_for_anyone_else()
            up = data["restarts"] >= 1 and container_state(engine, name) == "running"
            return data if up else None

        after = eventually(back, 60, "the cluster's container brought back")
        assert after["gpu_indices"] == before["gpu_indices"] and len(before["gpu_indices"]) == 2
        assert after["last_exit"] is not None and after["last_exit"]["restarted_at"]
        assert engine.containers.get(name).id != first_id  # recreated
        assert sh(engine, server, cid, "cat /workspace/state") == (0, "survived\n")
        events = c.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
        assert any(e["type"] == "restart" for e in events), events
        no_gpu_for_anyone_else()
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        wait_status(c, cid, {"terminated"})


# -- a container that exits on its own -------------------------------------------------


def test_crashing_container_backs_off_then_errors_keeping_its_logs(
    servers: ServerFactory, engine_url: str, engine: docker.DockerClient
) -> None:
    server = servers(
        "crash",
        engine_url,
        GPUYARD_RESTART_BACKOFF_INITIAL_S="1",
        GPUYARD_RESTART_BACKOFF_MAX_S="2",
        GPUYARD_RESTART_LIMIT="3",
    )
    with server.client() as c:
        cid = create(c, docker_args='sh -c "echo crash-report; sleep 2; exit 7"')
        assert wait_status(c, cid, {"running", "error"}, timeout=90)["status"] == "running"
        name = container_name(server, cid)

        def restarted() -> dict[str, Any] | None:
            data = cluster(c, cid)
            last = data.get("last_exit") or {}
            return data if data["restarts"] >= 1 and last.get("exit_code") == 7 else None

        data = eventually(restarted, 60, "a restart after exit code 7")
        assert data["status"] in ("running", "error"), data
        events = c.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
        restarting = [e["message"] for e in events if e["type"] == "restart"]
        assert any("exited with code 7" in m and "restarting in" in m for m in restarting), events

        failed = wait_status(c, cid, {"error"}, timeout=90)
        message = failed["error_message"]
        assert "exited with code 7" in message and "gave up after 3 failures" in message, message
        assert "crash-report" in message  # the last log lines are kept
        assert failed["restarts"] >= 2, failed
        # The stopped container is kept, its logs readable through the engine.
        assert container_state(engine, name) == "exited"
        assert b"crash-report" in engine.containers.get(name).logs()
        holds(lambda: _still_there(engine, name), server)  # observe passes do not collect it

        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        wait_status(c, cid, {"terminated"})
        assert container_state(engine, name) is None
        assert not volume_exists(engine, volume_name(server, cid))


def _still_there(engine: docker.DockerClient, name: str) -> None:
    assert container_state(engine, name) == "exited"
