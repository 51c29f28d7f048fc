"""Every crash point (src/gpuyard/observability/crash_points.py), for real: the server
runs with ``GPUYARD_CRASH_AT=<point>``, the test makes it reach the point through the
API, the server dies by SIGKILL there, is started again without the variable, and
must converge: crash_invariants.violations() empty within 60 s.

A handful of cheap points run in every suite (SAMPLED); the rest only with
``GPUYARD_CRASH_ALL=1`` (``make test-crash``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.observability.crash_points import CRASH_POINTS, ENV_VAR
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.crash_invariants import violations
from tests.e2e.podman_host import HOSTS_HOW, PodmanHost, available
from tests.e2e.test_server_e2e import ServerProcess, wait_status
from tests.helpers import free_port
from tests.required_parts import needs, needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

ALL = os.environ.get("GPUYARD_CRASH_ALL") == "1"
# A server that reached its point dies at once; one that never does is a broken test.
DEATH_S = 240

LOCAL_HOST = 1  # the server's own machine is always host 1

CLUSTER = {
    "gpu_type": "NVIDIA RTX A6000",
    "gpu_count": 1,
    "docker_image": DEV_IMAGE,
    "volume_gb": 1,
    "memory_gb": 1,
    "cpu_cores": 1,
}


@dataclass
class Run:
    """One crash test's server and client, and what its action made (for the checks)."""

    server: ServerProcess
    c: httpx.Client
    made: dict[str, Any] = field(default_factory=dict)


Action = Callable[[Run], None]


def create(run: Run, **extra: Any) -> str:
    r = run.c.post("/v1/clusters", json={**CLUSTER, **extra})
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    run.made.setdefault("clusters", []).append(cid)
    return cid


def running(run: Run, **extra: Any) -> str:
    cid = create(run, **extra)
    assert wait_status(run.c, cid, {"running", "error"}, timeout=120)["status"] == "running"
    return cid


def stopped(run: Run, **extra: Any) -> str:
    cid = running(run, **extra)
    assert run.c.post(f"/v1/clusters/{cid}/stop").status_code == 200
    wait_status(run.c, cid, {"stopped"})
    return cid


def snapshot_of(run: Run, cid: str) -> str:
    r = run.c.post(f"/v1/clusters/{cid}/snapshots", json={"name": "crash"})
    assert r.status_code == 202, r.text
    sid: str = r.json()["data"]["id"]
    deadline = time.monotonic() + 180
    while run.c.get(f"/v1/snapshots/{sid}").json()["data"]["status"] == "creating":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert run.c.get(f"/v1/snapshots/{sid}").json()["data"]["status"] == "ready"
    return sid


def network_volume(run: Run) -> str:
    r = run.c.post("/v1/networkvolumes", json={"name": "crash", "size": 1, "dataCenterId": "local"})
    assert r.status_code == 201, r.text
    vid: str = r.json()["data"]["id"]
    return vid


def mounted_network_volume(run: Run) -> str:
    """A network volume with an engine volume (a cluster mounted it, now terminated)."""
    vid = network_volume(run)
    body = {k: v for k, v in CLUSTER.items() if k != "volume_gb"}
    cid = running(run, **body, network_volume_id=vid)
    run.c.delete(f"/v1/clusters/{cid}")
    wait_status(run.c, cid, {"terminated"})
    return vid


# -- the actions, one per point --------------------------------------------------------


def a_create(run: Run) -> None:
    create(run)


def a_idempotent_create(run: Run) -> None:
    run.c.post("/v1/clusters", json=CLUSTER, headers={"Idempotency-Key": "crash-once"})


def a_start(run: Run) -> None:
    cid = stopped(run)
    run.c.post(f"/v1/clusters/{cid}/start")


def a_start_while_stopping(run: Run) -> None:
    # PID 1 without a SIGTERM handler: the stop takes the whole stop timeout, so the
    # start surely finds the cluster stopping.
    cid = running(run, docker_args="sleep 3600")
    run.c.post(f"/v1/clusters/{cid}/stop")
    run.c.post(f"/v1/clusters/{cid}/start")


def a_stop(run: Run) -> None:
    cid = running(run)
    run.c.post(f"/v1/clusters/{cid}/stop")


def a_terminate(run: Run) -> None:
    cid = running(run)
    run.c.delete(f"/v1/clusters/{cid}")


def a_snapshot(run: Run) -> None:
    cid = running(run)
    run.c.post(f"/v1/clusters/{cid}/snapshots", json={"name": "crash"})


def a_start_with_restore(run: Run) -> None:
    cid = stopped(run)
    sid = snapshot_of(run, cid)
    run.c.post(f"/v1/clusters/{cid}/start", json={"restore_from_snapshot": sid})


def a_network_volume_create(run: Run) -> None:
    network_volume(run)


def a_network_volume_delete(run: Run) -> None:
    vid = mounted_network_volume(run)
    run.c.delete(f"/v1/networkvolumes/{vid}")


def a_network_volume_restore(run: Run) -> None:
    vid = mounted_network_volume(run)
    r = run.c.post(f"/v1/networkvolumes/{vid}/snapshots", json={"name": "crash"})
    assert r.status_code == 202, r.text
    sid = r.json()["data"]["id"]
    deadline = time.monotonic() + 180
    while run.c.get(f"/v1/snapshots/{sid}").json()["data"]["status"] == "creating":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    run.c.post(f"/v1/networkvolumes/{vid}/restore", json={"snapshot_id": sid})


def local_host(run: Run) -> int:
    hosts = run.c.get("/v1/hosts").json()["data"]
    hosts = hosts if isinstance(hosts, list) else hosts["hosts"]
    return int(hosts[0]["id"])


def a_drain(run: Run) -> None:
    running(run)
    run.c.post(f"/v1/hosts/{local_host(run)}/drain")


def a_budget_stop(run: Run) -> None:
    """Two clusters of a prepaid account whose credit runs out within seconds."""
    r = run.c.post("/v1/accounts", json={"name": "spent", "owner_email": "spent@example.com"})
    assert r.status_code == 201, r.text
    data = r.json()["data"]
    account_id = data["account"]["id"]
    assert (
        run.c.patch(
            f"/v1/accounts/{account_id}/budget", json={"billing_mode": "prepaid"}
        ).status_code
        == 200
    )
    assert (
        run.c.post(f"/v1/accounts/{account_id}/credits", json={"amount": 0.005}).status_code == 201
    )
    with httpx.Client(
        base_url=run.server.url,
        headers={"Authorization": f"Bearer {data['api_key']['key']}"},
        timeout=120,
        verify=trusted_tls(),
    ) as owner:
        for _ in range(2):
            assert owner.post("/v1/clusters", json=CLUSTER).status_code == 201


@dataclass(frozen=True)
class Case:
    point: str
    action: Action
    sampled: bool = False
    env: tuple[tuple[str, str], ...] = ()  # the server's environment for this case
    converge_s: float = 60
    # Whether the checks see the crash's leftovers before the restart (so they can
    # fail): False where the point leaves a state that is correct as it stands (a
    # removal the reconciler finishes, a cordoned host).
    leaves_work: bool = True


CASES = [
    Case("create.after_row", a_create, sampled=True),
    Case("create.idempotent_after_row", a_idempotent_create),
    Case("start.after_request", a_start),
    Case("start.pending_before_start", a_start_while_stopping),
    Case("start.after_image", a_create),
    Case("start.after_container_create", a_create, sampled=True),
    Case("start.after_create_recorded", a_create),
    Case("start.after_container_start", a_create),
    Case("start.after_running", a_create, leaves_work=False),
    Case("start.restore.after_restoring_step", a_start_with_restore),
    Case("start.restore.after_unpack", a_start_with_restore),
    Case("start.restore.after_swap", a_start_with_restore),
    Case("stop.after_request", a_stop),
    Case("stop.after_container_stop", a_stop, sampled=True),
    Case("terminate.after_request", a_terminate),
    Case("terminate.after_container_stop", a_terminate, sampled=True),
    Case("terminate.after_volume_remove", a_terminate),
    Case("snapshot.after_request", a_snapshot),
    Case("snapshot.after_claim", a_snapshot),
    Case("snapshot.after_upload", a_snapshot),
    Case("restore.network_volume.after_unpack", a_network_volume_restore),
    Case("restore.network_volume.after_swap", a_network_volume_restore),
    Case("network_volume.create.after_row", a_network_volume_create, True, leaves_work=False),
    Case("network_volume.delete.after_row", a_network_volume_delete, leaves_work=False),
    Case("network_volume.delete.after_engine_remove", a_network_volume_delete, leaves_work=False),
    Case("drain.after_cordon", a_drain, leaves_work=False),
    Case("budget.stop.after_first_stop", a_budget_stop),
]

# Points no test here reaches, with the reason (none at present).
NOT_HERE: dict[str, str] = {}


def test_every_point_has_a_case_or_a_reason() -> None:
    cased = {case.point for case in CASES + MOVE_CASES + TRAINING_CASES}
    assert cased.isdisjoint(NOT_HERE)
    assert cased | set(NOT_HERE) == set(CRASH_POINTS)


def crash_and_converge(
    server: ServerProcess, case: Case, engines: dict[int, str], prepare: Action | None = None
) -> None:
    """Run ``case``'s action on ``server`` armed with its point (``prepare`` first, on
    the same run), wait for the SIGKILL, start the server again unarmed and wait until
    every invariant holds (at most CONVERGE_S)."""
    server.extra_env = {**dict(case.env), ENV_VAR: case.point}
    server.start()
    with server.client() as c:
        run = Run(server, c)
        # A transport error: the server died under the request (the point was reached).
        with contextlib.suppress(httpx.TransportError):
            if prepare is not None:
                prepare(run)
            case.action(run)
    assert server.proc is not None
    try:
        code = server.proc.wait(timeout=DEATH_S)
    except Exception as exc:
        raise AssertionError(f"{case.point} was never reached:\n{server.log_tail()}") from exc
    assert code == -9, f"server exited {code}, not by SIGKILL:\n{server.log_tail()}"
    left = violations(server.db_path, engines, server.installation)
    assert bool(left) == case.leaves_work, f"before the restart: {left}"

    server.extra_env = dict(case.env)
    server.start()
    deadline = time.monotonic() + case.converge_s
    while True:
        found = violations(server.db_path, engines, server.installation)
        if not found:
            break
        assert time.monotonic() < deadline, (
            f"not converged {case.converge_s} s after the restart from {case.point}:\n"
            + "\n".join(found)
        )
        time.sleep(1)


def armed(cases: list[Case]) -> list[Any]:
    return [
        pytest.param(
            case,
            id=case.point,
            marks=()
            if case.sampled or ALL
            else (pytest.mark.skip(reason="set GPUYARD_CRASH_ALL=1 (make test-crash)"),),
        )
        for case in cases
    ]


@pytest.mark.parametrize("case", armed(CASES))
def test_crash_point_converges(tmp_path: Path, engine_url: str, case: Case) -> None:
    server = ServerProcess(tmp_path / "home", engine_url, free_port())
    try:
        crash_and_converge(server, case, {LOCAL_HOST: engine_url})
        # The user's retry of an idempotent create answers the one cluster it made.
        if case.point == "create.idempotent_after_row":
            with server.client() as c:
                r = c.post("/v1/clusters", json=CLUSTER, headers={"Idempotency-Key": "crash-once"})
                assert r.status_code in (200, 201), r.text
                listed = c.get("/v1/clusters").json()["data"]
                clusters = listed if isinstance(listed, list) else listed["clusters"]
                assert [x["id"] for x in clusters] == [r.json()["data"]["id"]], clusters
    finally:
        server.cleanup()


# -- moves: a second host, simulated on this machine (root) ------------------------------


def add_host(sim: PodmanHost) -> Action:
    """The action that adds ``sim`` as a host of the local host's location and waits
    for its first heartbeat."""

    def prepare(run: Run) -> None:
        r = run.c.post(
            "/v1/hosts",
            json={"name": "sim", "engine_url": sim.ssh_url, "gpus": "NVIDIA RTX A6000:4",
                  "location": "local", "vcpus": 32, "memory_gb": 64},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        run.made["sim"] = int(r.json()["data"]["id"])
        assert run.made["sim"] == LOCAL_HOST + 1  # the engines the checks read
        deadline = time.monotonic() + 60
        while True:
            hosts = run.c.get("/v1/hosts").json()["data"]["hosts"]
            if any(h["id"] == run.made["sim"] and h["engine_version"] for h in hosts):
                return
            assert time.monotonic() < deadline, hosts
            time.sleep(0.5)

    return prepare


def stopped_on_local(run: Run) -> str:
    """A stopped cluster on the local host (the simulated one cordoned meanwhile)."""
    assert run.c.post(f"/v1/hosts/{run.made['sim']}/cordon").status_code == 200
    cid = stopped(run)
    assert run.c.post(f"/v1/hosts/{run.made['sim']}/uncordon").status_code == 200
    return cid


def a_start_elsewhere(run: Run) -> None:
    cid = stopped_on_local(run)
    assert run.c.post(f"/v1/hosts/{LOCAL_HOST}/cordon").status_code == 200
    run.c.post(f"/v1/clusters/{cid}/start")


def a_drain_resting(run: Run) -> None:
    stopped_on_local(run)
    run.c.post(f"/v1/hosts/{LOCAL_HOST}/drain")


MOVE_CASES = [
    Case("start.move.after_copy", a_start_elsewhere),
    Case("start.move.after_recorded", a_start_elsewhere),
    Case("drain.after_resting_move", a_drain_resting),
]


@needs("simulated hosts", available(), how=HOSTS_HOW)
@pytest.mark.parametrize("case", armed(MOVE_CASES))
def test_move_crash_point_converges(tmp_path: Path, engine_url: str, case: Case) -> None:
    home = tmp_path / "home"
    sim = PodmanHost(ssh_key=SshKeys(home).public_key())
    server = ServerProcess(home, engine_url, free_port())
    try:
        sim.start()
        sim.load_image(engine_url, DEV_IMAGE)
        # The simulated host's id is the next after the local host's.
        engines = {LOCAL_HOST: engine_url, LOCAL_HOST + 1: f"unix://{sim.socket}"}
        crash_and_converge(server, case, engines, prepare=add_host(sim))
    finally:
        server.cleanup()
        sim.close()


# -- training clusters (the Slurm node image, built once per machine) -----------------

TRAINING = "/distributed_jobs_v2/cluster/"
TRAINING_ENV = (
    ("GPUYARD_RESERVED_IPS", "127.0.10.0/29"),
    ("GPUYARD_TRAINING_BIND_ADDRESS", "127.0.0.1"),
)


def training_cluster(run: Run) -> tuple[int, dict[str, Any]]:
    """Create a two-node training cluster (not waited for); its id and query params."""
    projects = run.c.get("/v1/projects").json()["data"]
    projects = projects if isinstance(projects, list) else projects["projects"]
    params = {"project_id": projects[0]["id"], "location": "local"}
    key = Path(run.made["tmp"]) / "user"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    k = run.c.post(
        "/v1/ssh-keys", json={"name": "user", "public_key": key.with_suffix(".pub").read_text()}
    ).json()["data"]
    images = run.c.get("/v1/images").json()["data"]
    images = images if isinstance(images, list) else images["images"]
    base = next(i for i in images if i["image"] == SLURM_IMAGE)
    r = run.c.post(
        TRAINING,
        params=params,
        json={"name": "crash", "image_version_id": base["id"], "ssh_key_ids": [k["id"]],
              "no_of_nodes": 2, "gpu_type": "NVIDIA RTX A6000", "gpus_per_node": 1,
              "cpus_per_node": 1, "memory_gb_per_node": 1},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    return int(r.json()["data"]["id"]), params


def training_running(run: Run) -> tuple[int, dict[str, Any]]:
    cid, params = training_cluster(run)
    deadline = time.monotonic() + 300
    while (status := run.c.get(f"{TRAINING}{cid}/", params=params).json()["data"]["status"]) != (
        "running"
    ):
        assert status != "error" and time.monotonic() < deadline, status
        time.sleep(1)
    return cid, params


def a_training_create(run: Run) -> None:
    training_cluster(run)


def a_training_scale(run: Run) -> None:
    cid, params = training_running(run)
    run.c.put(
        f"{TRAINING}{cid}/", params=params, json={"action": "scale_cluster", "additional_nodes": 1}
    )


def a_training_delete(run: Run) -> None:
    cid, params = training_running(run)
    run.c.delete(f"{TRAINING}{cid}/", params=params)


# A Slurm cluster takes minutes to build on a loaded machine: its convergence is given
# that long (the other points: 60 s).
TRAINING_CASES = [
    Case(point, action, env=TRAINING_ENV, converge_s=300)
    for point, action in (
        ("training.create.after_row", a_training_create),
        ("training.build.after_node_create", a_training_create),
        ("training.scale.after_request", a_training_scale),
        ("training.delete.after_request", a_training_delete),
        ("training.teardown.after_nodes_removed", a_training_delete),
    )
]


@pytest.fixture(scope="module")
def slurm_image() -> str:
    try:
        build_slurm_image("podman", SLURM_IMAGE)
    except Exception as exc:  # no debootstrap / no mirror: say why
        pytest.fail(f"cannot build the Slurm node image: {exc}")
    return SLURM_IMAGE


@pytest.mark.parametrize("case", armed(TRAINING_CASES))
def test_training_crash_point_converges(
    tmp_path: Path, engine_url: str, slurm_image: str, case: Case
) -> None:
    server = ServerProcess(tmp_path / "home", engine_url, free_port())
    try:
        crash_and_converge(
            server,
            case,
            {LOCAL_HOST: engine_url},
            prepare=lambda run: run.made.update(tmp=str(tmp_path)),
        )
    finally:
        server.cleanup()
