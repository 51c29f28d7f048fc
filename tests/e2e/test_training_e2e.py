"""A training cluster end to end: the real server (``gpuyard serve``), real Podman node
containers running real Slurm (slurmctld, slurmd, munge, sshd), reached over SSH with
the user's key through the host's DNAT rules (runtimes/hosts/edge.py). Every seed 002
action is checked by its observable effect, and a worker killed under a running job
comes back.

The engine may be shared with a dev server: clean-up removes only objects labelled
with the installation id of the server a test started (ServerProcess.cleanup)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image, derive_image
from tests.e2e.test_server_e2e import ServerProcess
from tests.e2e.training_fleet import node_containers
from tests.helpers import free_port

pytestmark = pytest.mark.e2e

BASE = "/distributed_jobs_v2/cluster/"
IMAGE_V2 = "localhost/gpuyard/slurm-node:e2e-v2"
RESERVED = "127.0.10.0/29"


@pytest.fixture(scope="module")
def slurm_images(engine_url: str) -> Iterator[str]:
    try:
        build_slurm_image("podman", SLURM_IMAGE)
    except Exception as exc:  # no debootstrap / no mirror: say why
        pytest.fail(f"cannot build the Slurm node image: {exc}")
    derive_image(SLURM_IMAGE, IMAGE_V2, "v2", "podman")
    yield SLURM_IMAGE


@pytest.fixture
def server(tmp_path: Path, engine_url: str, slurm_images: str) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "home", engine_url, free_port())
    srv.extra_env = {
        "GPUYARD_RESERVED_IPS": RESERVED,
        "GPUYARD_TRAINING_BIND_ADDRESS": "127.0.0.1",
    }
    srv.start()
    try:
        yield srv
    finally:
        # What a failed run left (a passing one deletes its cluster): only objects
        # labelled with this server's installation id, never by name.
        if os.environ.get("GPUYARD_E2E_KEEP"):
            srv.stop()
        else:
            srv.cleanup()


class Ssh:
    """The system ``ssh`` client against the cluster's entry point."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def keygen(self, name: str) -> tuple[Path, str]:
        path = self.tmp / name
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)],
            check=True,
        )
        return path, (self.tmp / f"{name}.pub").read_text().strip()

    def run(
        self,
        key: Path,
        host: str,
        port: int,
        command: str,
        *,
        source: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        argv = [
            "ssh",
            "-i",
            str(key),
            "-p",
            str(port),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
        ]
        if source:
            argv += ["-b", source]
        argv += [f"root@{host}", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def wait_running(c: httpx.Client, cid: int, params: dict[str, Any], timeout: float = 240) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        data = c.get(f"{BASE}{cid}/", params=params).json()["data"]
        if data["status"] == "running":
            return data
        assert data["status"] != "error", data
        assert time.monotonic() < deadline, data
        time.sleep(1)


def act(c: httpx.Client, cid: int, params: dict[str, Any], **body: Any) -> Any:
    r = c.put(f"{BASE}{cid}/", params=params, json=body)
    assert r.status_code == 200, r.json()
    return r.json()["data"]


def host_pids(name: str, process: str) -> set[str]:
    """Host PIDs of ``process`` in container ``name`` (PIDs inside a container repeat
    across restarts, host PIDs do not)."""
    out = subprocess.run(
        ["podman", "top", name, "hpid", "comm"], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[0] for line in out.splitlines()[1:] if line.split()[1:] == [process]}


def connect(host: str, port: int, source: str | None = None) -> bool:
    """Whether a TCP connection gets the SSH banner (a refused or reset one does not)."""
    s = socket.socket()
    s.settimeout(5)
    try:
        if source:
            s.bind((source, 0))
        s.connect((host, port))
        return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False
    finally:
        s.close()


def reset_on_next_packet(s: socket.socket) -> bool:
    """Whether the next bytes sent on ``s`` get it reset (or closed) rather than an
    answer; the SSH server answers an identification line with its key exchange."""
    s.settimeout(10)
    try:
        s.sendall(b"SSH-2.0-probe\r\n")
        return s.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    finally:
        s.close()


def until(check: Any, timeout: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(1)


def test_training_cluster_end_to_end(
    server: ServerProcess, engine_url: str, tmp_path: Path
) -> None:
    engine = docker.DockerClient(base_url=engine_url)
    ssh = Ssh(tmp_path)
    key1, pub1 = ssh.keygen("first")
    key2, pub2 = ssh.keygen("second")
    with server.client() as c:
        project = c.get("/v1/projects").json()["data"]
        projects = project if isinstance(project, list) else project["projects"]
        params = {"project_id": projects[0]["id"], "location": "local"}
        k1 = c.post("/v1/ssh-keys", json={"name": "first", "public_key": pub1}).json()["data"]
        k2 = c.post("/v1/ssh-keys", json={"name": "second", "public_key": pub2}).json()["data"]
        images = c.get("/v1/images").json()["data"]
        images = images if isinstance(images, list) else images["images"]
        base = next(i for i in images if i["image"] == SLURM_IMAGE)
        v2 = c.post(
            "/v1/images", json={"name": "slurm-node", "version": "e2e-v2", "image": IMAGE_V2}
        ).json()["data"]

        created = c.post(
            BASE,
            params=params,
            json={
                "name": "e2e",
                "image_version_id": base["id"],
                "ssh_key_ids": [k1["id"]],
                "no_of_nodes": 2,
                "gpu_type": "NVIDIA RTX A6000",
                "gpus_per_node": 1,
                "cpus_per_node": 1,
                "memory_gb_per_node": 1,
                "lifecycle_script": "#!/bin/sh\necho ran > /root/lifecycle-ran\n",
            },
        )
        assert created.status_code == 201, created.json()
        cid = created.json()["data"]["id"]
        cluster = wait_running(c, cid, params)
        port = cluster["ssh"]["port"]
        prefix = server.installation.training_prefix(cid)
        w1, w2, w3 = (f"{prefix}-worker-{i}" for i in (1, 2, 3))

        # srun over SSH with the user's key runs on both workers.
        out = ssh.run(key1, "127.0.0.1", port, "srun -N2 hostname")
        assert out.returncode == 0, out.stderr
        assert sorted(out.stdout.split()) == [w1, w2]
        assert {n["state"] for n in cluster["slurm"]["nodes"]} <= {"idle", "mixed", "allocated"}
        out = ssh.run(key1, "127.0.0.1", port, f"srun -w {w1} cat /root/lifecycle-ran")
        assert out.stdout.strip() == "ran", out.stderr
        # The cluster became running after the script had finished on every node.
        assert {n["lifecycle"]["status"] for n in cluster["nodes"]} == {"succeeded"}
        assert {n["lifecycle"]["exit_code"] for n in cluster["nodes"]} == {0}

        # scale_cluster while a job runs: the job keeps running, the new node works.
        job = ssh.run(key1, "127.0.0.1", port, "sbatch --parsable -N2 --wrap 'sleep 600'")
        job_id = job.stdout.strip()
        assert job_id.isdigit(), job.stderr
        until(
            lambda: (
                ssh.run(key1, "127.0.0.1", port, f"squeue -h -j {job_id} -o %T").stdout.strip()
                == "RUNNING"
            ),
            what="job running",
        )
        act(c, cid, params, action="scale_cluster", additional_nodes=1)
        cluster = wait_running(c, cid, params)
        assert (
            ssh.run(key1, "127.0.0.1", port, f"squeue -h -j {job_id} -o %T").stdout.strip()
            == "RUNNING"
        )
        states = dict(
            line.split()
            for line in ssh.run(
                key1, "127.0.0.1", port, 'sinfo -h -N -o "%N %T"'
            ).stdout.splitlines()
        )
        assert states[w3] == "idle", states
        assert ssh.run(key1, "127.0.0.1", port, f"srun -w {w3} hostname").stdout.strip() == w3
        ssh.run(key1, "127.0.0.1", port, f"scancel {job_id}")

        # restart_workers: slurmctld keeps its PID, every slurmd gets a new one.
        ctld = host_pids(f"{prefix}-controller", "slurmctld")
        slurmds = {w: host_pids(w, "slurmd") for w in (w1, w2, w3)}
        assert ctld and all(slurmds.values())
        act(c, cid, params, action="restart_workers")
        cluster = wait_running(c, cid, params)
        assert host_pids(f"{prefix}-controller", "slurmctld") == ctld
        for w, before in slurmds.items():
            after = host_pids(w, "slurmd")
            assert after and after.isdisjoint(before), (w, before, after)
        until(
            lambda: (
                {
                    n["state"]
                    for n in c.get(f"{BASE}{cid}/", params=params).json()["data"]["slurm"]["nodes"]
                }
                == {"idle"}
            ),
            what="nodes idle after restart_workers",
        )

        # update_ssh_keys: exactly the given keys.
        act(c, cid, params, action="update_ssh_keys", ssh_key_ids=[k2["id"]])
        wait_running(c, cid, params)
        assert ssh.run(key2, "127.0.0.1", port, "hostname").stdout.strip() == f"{prefix}-controller"
        assert ssh.run(key1, "127.0.0.1", port, "hostname").returncode != 0
        assert ssh.run(key2, "127.0.0.1", port, f"srun -w {w2} hostname").returncode == 0

        # attach_ip / detach_ip: the reserved address reaches the controller's SSH.
        ip = c.post("/v1/reserved-ips", params={"project_id": params["project_id"]}).json()["data"]
        assert not connect(ip["address"], 22)
        attached = act(c, cid, params, action="attach_ip", reserved_ip_id=ip["id"])
        assert attached["address"] == ip["address"]
        until(lambda: connect(ip["address"], 22), 10, "reserved IP reachable")
        out = ssh.run(key2, ip["address"], 22, "hostname")
        assert out.stdout.strip() == f"{prefix}-controller", out.stderr

        # A security group allowing only 127.0.0.2: enforced on the port and the IP.
        group = c.post(
            "/v1/security-groups",
            json={
                "name": "only-2",
                "rules": [{"protocol": "tcp", "port_range": "22", "source_cidr": "127.0.0.2/32"}],
            },
        ).json()["data"]
        # A session from 127.0.0.3 opened before the group is cut when it is added: the
        # host's firewall resets it at its next packet, nothing more gets through.
        session = socket.create_connection(("127.0.0.1", port), 5, ("127.0.0.3", 0))
        assert session.recv(64).startswith(b"SSH-")
        act(c, cid, params, action="add_security_group", security_groups_ids=[group["id"]])
        until(lambda: not connect("127.0.0.1", port, "127.0.0.3"), 10, "127.0.0.3 refused")
        assert reset_on_next_packet(session)
        assert connect("127.0.0.1", port, "127.0.0.2")
        assert connect(ip["address"], 22, "127.0.0.2")
        assert not connect(ip["address"], 22, "127.0.0.3")
        out = ssh.run(key2, "127.0.0.1", port, "hostname", source="127.0.0.2")
        assert out.returncode == 0, out.stderr
        assert ssh.run(key2, "127.0.0.1", port, "hostname", source="127.0.0.3").returncode != 0
        act(c, cid, params, action="remove_security_group", security_group_id=group["id"])
        until(lambda: connect("127.0.0.1", port, "127.0.0.3"), 10, "open again")

        act(c, cid, params, action="detach_ip", reserved_ip_id=ip["id"], ip_type="public")
        until(lambda: not connect(ip["address"], 22), 10, "reserved IP unreachable")

        # update_image: every node runs the new image, one at a time.
        act(c, cid, params, action="update_image", image_version_id=v2["id"])
        cluster = wait_running(c, cid, params)
        assert {n["image_version_id"] for n in cluster["nodes"]} == {v2["id"]}
        for n in cluster["nodes"]:
            assert engine.containers.get(n["name"]).attrs["Config"]["Image"].endswith("e2e-v2")
        out = ssh.run(
            key2,
            "127.0.0.1",
            port,
            "cat /etc/gpuyard-image-version; srun -N3 cat /etc/gpuyard-image-version",
        )
        assert out.stdout.split() == ["v2"] * 4, out.stdout + out.stderr

        # restart_cluster: a pending job survives the controller's restart.
        pending = ssh.run(
            key2, "127.0.0.1", port, "sbatch --parsable -N1 --begin=now+3600 --wrap 'true'"
        )
        pending_id = pending.stdout.strip()
        assert pending_id.isdigit(), pending.stderr
        act(c, cid, params, action="restart_cluster")
        wait_running(c, cid, params)
        out = ssh.run(key2, "127.0.0.1", port, f"squeue -h -j {pending_id} -o %T")
        assert out.stdout.strip() == "PENDING", out.stdout + out.stderr

        # A suspended account's cluster is stopped: no node container runs (nothing is
        # billed); the queue survives, and restart_cluster brings it back once resumed.
        listed = c.get("/v1/accounts").json()["data"]
        aid = (listed if isinstance(listed, list) else listed["accounts"])[0]["id"]
        r = c.patch(f"/v1/accounts/{aid}", json={"status": "suspended", "reason": "e2e"})
        assert r.status_code == 200, r.text
        until(
            lambda: c.get(f"{BASE}{cid}/", params=params).json()["data"]["status"] == "stopped",
            120,
            "stopped",
        )
        assert node_containers(engine, server.installation, cid) == []
        assert not connect("127.0.0.1", port)
        assert c.patch(f"/v1/accounts/{aid}", json={"status": "active"}).status_code == 200
        act(c, cid, params, action="restart_cluster")
        wait_running(c, cid, params)
        out = ssh.run(key2, "127.0.0.1", port, f"squeue -h -j {pending_id} -o %T")
        assert out.stdout.strip() == "PENDING", out.stdout + out.stderr
        out = ssh.run(key2, "127.0.0.1", port, "srun -N3 cat /etc/gpuyard-image-version")
        assert out.stdout.split() == ["v2"] * 3, out.stdout + out.stderr

        # Every status change is on record, in order.
        events = c.get(f"{BASE}{cid}/events/", params=params).json()["data"]
        moves = [(e["from_status"], e["to_status"]) for e in events]
        assert moves[:2] == [(None, "creating"), ("creating", "running")]
        assert moves[-6:] == [
            ("running", "restarting"),
            ("restarting", "running"),
            ("running", "stopping"),
            ("stopping", "stopped"),
            ("stopped", "restarting"),
            ("restarting", "running"),
        ]

        # DELETE leaves nothing behind.
        assert c.delete(f"{BASE}{cid}/", params=params).status_code == 200
        until(lambda: c.get(f"{BASE}{cid}/", params=params).status_code == 404, 120, "cluster gone")
        assert node_containers(engine, server.installation, cid) == []
        assert not [n for n in engine.networks.list() if n.name.startswith(prefix)]
        assert not [v for v in engine.volumes.list() if v.name.startswith(prefix)]
        assert not connect("127.0.0.1", port)
        gpus = c.get("/v1/gpu-types").json()["data"]["gpu_types"]
        a6000 = next(g for g in gpus if g["id"] == "NVIDIA RTX A6000")
        assert a6000["available_gpus"] == a6000["total_gpus"]
    engine.close()


def test_a_killed_worker_comes_back_and_a_job_on_the_other_runs_on(
    server: ServerProcess, engine_url: str, tmp_path: Path
) -> None:
    """Desired state wins for training nodes: a worker container killed between
    operations is recreated, rejoins Slurm and is idle again; a job running on the
    other worker meanwhile finishes normally."""
    engine = docker.DockerClient(base_url=engine_url)
    ssh = Ssh(tmp_path)
    key, pub = ssh.keygen("user")
    with server.client() as c:
        project = c.get("/v1/projects").json()["data"]
        projects = project if isinstance(project, list) else project["projects"]
        params = {"project_id": projects[0]["id"], "location": "local"}
        k = c.post("/v1/ssh-keys", json={"name": "user", "public_key": pub}).json()["data"]
        images = c.get("/v1/images").json()["data"]
        images = images if isinstance(images, list) else images["images"]
        base = next(i for i in images if i["image"] == SLURM_IMAGE)
        created = c.post(
            BASE,
            params=params,
            json={
                "name": "kill",
                "image_version_id": base["id"],
                "ssh_key_ids": [k["id"]],
                "no_of_nodes": 2,
                "gpu_type": "NVIDIA RTX A6000",
                "gpus_per_node": 1,
                "cpus_per_node": 1,
                "memory_gb_per_node": 1,
            },
        )
        assert created.status_code == 201, created.json()
        cid = created.json()["data"]["id"]
        port = wait_running(c, cid, params)["ssh"]["port"]
        prefix = server.installation.training_prefix(cid)
        w1, w2 = f"{prefix}-worker-1", f"{prefix}-worker-2"

        def sh(command: str) -> str:
            out = ssh.run(key, "127.0.0.1", port, command)
            assert out.returncode == 0, (command, out.stdout, out.stderr)
            return out.stdout.strip()

        def sinfo() -> dict[str, str]:
            return dict(line.split() for line in sh('sinfo -h -N -o "%N %T"').splitlines())

        job_id = sh(f"sbatch --parsable -N1 -w {w2} --wrap 'sleep 60; hostname'")
        assert job_id.isdigit()
        until(lambda: sh(f"squeue -h -j {job_id} -o %T") == "RUNNING", what="job running")
        old_container = engine.containers.get(w1).id
        engine.containers.get(w1).kill()
        assert engine.containers.get(w1).status == "exited"

        def back() -> bool:
            view = c.get(f"{BASE}{cid}/", params=params).json()["data"]
            node = next(n for n in view["nodes"] if n["name"] == w1)
            return node["restarts"] == 1 and node["status"] == "running"

        until(back, 180, "the killed worker recreated")
        assert engine.containers.get(w1).id != old_container
        until(lambda: sinfo().get(w1) == "idle", 60, "the worker idle in sinfo again")
        assert sh(f"srun -w {w1} hostname") == w1
        view = c.get(f"{BASE}{cid}/", params=params).json()["data"]
        assert view["status"] == "running"
        assert {n["name"]: n["restarts"] for n in view["nodes"]}[w2] == 0

        # The job on the other worker was not disturbed: it runs to its normal end.
        def job() -> dict[str, str]:
            text = sh(f"scontrol show job -o {job_id}")
            return dict(f.split("=", 1) for f in text.split() if "=" in f)

        until(lambda: job()["JobState"] != "RUNNING", 120, "the job to finish")
        finished = job()
        assert (finished["JobState"], finished["ExitCode"]) == ("COMPLETED", "0:0"), finished
        assert finished["NodeList"] == w2 and finished.get("Restarts", "0") == "0", finished

        events = c.get(f"{BASE}{cid}/events/", params=params).json()["data"]
        messages = [e["message"] for e in events]
        assert any(m.startswith(f"worker {w1}: its container exited") for m in messages), messages
        assert f"back in Slurm: {w1} (restart 1)" in messages, messages

        assert c.delete(f"{BASE}{cid}/", params=params).status_code == 200
        until(lambda: c.get(f"{BASE}{cid}/", params=params).status_code == 404, 120, "gone")
        assert node_containers(engine, server.installation, cid) == []
    engine.close()


def test_a_removed_members_key_leaves_the_training_nodes(
    server: ServerProcess, engine_url: str, tmp_path: Path
) -> None:
    """The cluster's SSH port reaches the controller's sshd directly, past the
    gateway: once a member is removed, their key leaves every node within a scan,
    and the owner's stays."""
    ssh = Ssh(tmp_path)
    key, pub = ssh.keygen("owner")
    member_key, member_pub = ssh.keygen("member")
    with server.client() as c:
        project = c.get("/v1/projects").json()["data"]
        projects = project if isinstance(project, list) else project["projects"]
        params = {"project_id": projects[0]["id"], "location": "local"}
        mine = c.post("/v1/ssh-keys", json={"name": "owner", "public_key": pub}).json()["data"]
        account_id = c.get("/v1/me").json()["data"]["acting"]["account_id"]
        r = c.post(
            f"/v1/accounts/{account_id}/invitations",
            json={"email": "mia@example.com", "role": "member"},
        )
        assert r.status_code == 201, r.text
        r = httpx.post(
            f"{server.url}/v1/invitations/{r.json()['data']['token']}/accept", verify=trusted_tls()
        )
        assert r.status_code == 201, r.text
        made = r.json()["data"]
        with httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {made['api_key']['key']}"},
            verify=trusted_tls(),
        ) as member:
            r = member.post("/v1/ssh-keys", json={"name": "mia", "public_key": member_pub})
            assert r.status_code == 201, r.text
            theirs = r.json()["data"]
        images = c.get("/v1/images").json()["data"]
        images = images if isinstance(images, list) else images["images"]
        base = next(i for i in images if i["image"] == SLURM_IMAGE)
        created = c.post(
            BASE,
            params=params,
            json={
                "name": "keys",
                "image_version_id": base["id"],
                "ssh_key_ids": [mine["id"], theirs["id"]],
                "no_of_nodes": 1,
                "gpu_type": "NVIDIA RTX A6000",
                "gpus_per_node": 1,
                "cpus_per_node": 1,
                "memory_gb_per_node": 1,
            },
        )
        assert created.status_code == 201, created.json()
        cid = created.json()["data"]["id"]
        port = wait_running(c, cid, params)["ssh"]["port"]
        w1 = f"{server.installation.training_prefix(cid)}-worker-1"
        out = ssh.run(member_key, "127.0.0.1", port, "hostname")
        assert out.returncode == 0, out.stderr

        r = c.delete(f"/v1/accounts/{account_id}/members/{made['membership']['id']}")
        assert r.status_code == 200, r.text
        until(
            lambda: ssh.run(member_key, "127.0.0.1", port, "true").returncode != 0,
            60,
            "the removed member's key refused by the controller",
        )
        body = member_pub.split()[1]
        out = ssh.run(key, "127.0.0.1", port, f"srun -w {w1} cat /root/.ssh/authorized_keys")
        assert out.returncode == 0, out.stderr
        assert body not in out.stdout and pub.split()[1] in out.stdout
