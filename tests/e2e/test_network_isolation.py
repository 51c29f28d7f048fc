"""Clusters of different accounts have no network path to each other (real Podman).

Each account's clusters join the account's own network; from a cluster of account B a
TCP connection to a cluster of account A fails, while one to B's other cluster works.
Objects are cleaned up by installation label only (tests/e2e/conftest.py).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_ACCOUNT, LABEL_INSTALLATION, Ownership
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.runtimes.engines.devimage import SERVE_PORT
from gpuyard.runtimes.engines.engine import EnginePolicy, NotOurs
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.hosts.firewall import bridge_name
from gpuyard.services.installation.bootstrap import open_store
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.settings import Settings
from gpuyard.store.db import WRITE_OPTIONS
from tests.e2e.conftest import DEV_IMAGE, purge_installation
from tests.e2e.test_server_e2e import ServerProcess, container_name, running_server, wait_status
from tests.required_parts import needs_tools

# Runtimes that keep the host firewall rules, as the server's do.
FIREWALL = EnginePolicy(manage_host_firewall=True)

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]


@pytest.fixture
def engine(engine_url: str) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=engine_url)
    yield client
    client.close()


def new_account_key(server: ServerProcess, email: str) -> str:
    """A write key of a new account (user, account, default project) in the server's
    store, made as an operator would, beside the running server."""
    engine, sessions = open_store(Settings(home=server.home))
    try:
        with sessions() as session, session.begin():
            session.connection(execution_options=WRITE_OPTIONS)
            user, account, _ = create_account(session, email=email, name=email)
            issued = issue_key(
                session, user_id=user.id, account_id=account.id, name="k", scope=Scope.WRITE
            )
        return issued.key
    finally:
        engine.dispose()


def as_key(server: ServerProcess, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
        verify=trusted_tls(),
    )


def create(c: httpx.Client, name: str) -> str:
    r = c.post("/v1/clusters", json={"name": name, "docker_image": DEV_IMAGE, "memory_gb": 1})
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    return cid


def networks_of(engine: docker.DockerClient, server: ServerProcess, cid: str) -> dict[str, Any]:
    container = engine.containers.get(container_name(server, cid))
    nets: dict[str, Any] = container.attrs["NetworkSettings"]["Networks"]
    return nets


def connects(engine: docker.DockerClient, server: ServerProcess, src: str, ip: str) -> bool:
    """Whether cluster ``src``'s container opens a TCP connection to ``ip``:8888 within
    2 s (busybox nc exits 0 once connected and stdin is at its end)."""
    container = engine.containers.get(container_name(server, src))
    code, _ = container.exec_run(["sh", "-c", f"nc -w 2 {ip} {SERVE_PORT} </dev/null"])
    return int(code) == 0


def eventually_connects(
    engine: docker.DockerClient, server: ServerProcess, src: str, ip: str
) -> bool:
    """As :func:`connects`, retried for a while: "running" means the container runs;
    its listener may need a moment more."""
    deadline = time.monotonic() + 15
    while not connects(engine, server, src, ip):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_clusters_of_other_accounts_are_unreachable(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    with running_server(tmp_path / "home", engine_url) as server:
        key_b = new_account_key(server, "b@example.com")
        key_c = new_account_key(server, "c@example.com")
        owner = server.installation
        with server.client() as a, as_key(server, key_b) as b, as_key(server, key_c) as c:
            ids = {"a1": create(a, "a1"), "a2": create(a, "a2")}
            ids |= {"b1": create(b, "b1"), "b2": create(b, "b2")}
            for name, cid in ids.items():
                client = a if name.startswith("a") else b
                data = wait_status(client, cid, {"running", "error"})
                assert data["status"] == "running", data.get("error_message")
            account_a = a.get("/v1/projects").json()["data"]["projects"][0]
            assert "id" in account_a  # the API answers for A (key and project are live)

            ip: dict[str, str] = {}
            net: dict[str, str] = {}
            for name, cid in ids.items():
                nets = networks_of(engine, server, cid)
                # Only the account's network: not also the engine's default one.
                assert len(nets) == 1, nets
                net[name], info = next(iter(nets.items()))
                ip[name] = str(info["IPAddress"])
            assert net["a1"] == net["a2"] != net["b1"] == net["b2"]
            assert net["a1"].startswith(f"{owner.prefix}-net-a")
            assert "podman" not in net.values() and "bridge" not in net.values()
            for name in ("a1", "b1"):
                info = engine.networks.get(net[name]).attrs
                assert info["Labels"][LABEL_INSTALLATION] == owner.installation_id
                assert net[name] == owner.account_network(int(info["Labels"][LABEL_ACCOUNT]))
                # NAT to the outside world, not an internal network.
                assert info["Internal"] is False

            # Same account: reachable (this also proves each listener is up).
            assert eventually_connects(engine, server, ids["b1"], ip["b2"])
            assert eventually_connects(engine, server, ids["a2"], ip["a1"])
            assert eventually_connects(engine, server, ids["a1"], ip["a2"])
            # Across accounts: no route, in either direction.
            assert not connects(engine, server, ids["b1"], ip["a1"])
            assert not connects(engine, server, ids["b2"], ip["a2"])
            assert not connects(engine, server, ids["a1"], ip["b1"])

            # Another account's network losing its last cluster (netavark 1.4 then drops
            # its shared isolation rule unless the network stays in use) opens nothing.
            c1 = create(c, "c1")
            assert wait_status(c, c1, {"running", "error"})["status"] == "running"
            assert c.post(f"/v1/clusters/{c1}/stop").status_code == 200
            wait_status(c, c1, {"stopped"})
            assert not connects(engine, server, ids["b1"], ip["a1"])
            assert not connects(engine, server, ids["a2"], ip["b2"])
            assert connects(engine, server, ids["b2"], ip["b1"])

            # A restarted cluster comes back on its account's network.
            r = b.post(f"/v1/clusters/{ids['b2']}/restart")
            assert r.status_code == 200, r.text
            assert wait_status(b, ids["b2"], {"running", "error"})["status"] == "running"
            assert list(networks_of(engine, server, ids["b2"])) == [net["b1"]]


@pytest.fixture
def owner(engine_url: str) -> Iterator[Ownership]:
    identity = Ownership.new()
    yield identity
    purge_installation(engine_url, identity.installation_id)


def test_account_network_is_created_once_under_concurrent_creates(
    engine_url: str, owner: Ownership
) -> None:
    # Separate runtimes (separate engine connections), as several replicas would be.
    runtimes = [DockerEngineRuntime(engine_url, owner=owner, policy=FIREWALL) for _ in range(6)]
    barrier = threading.Barrier(len(runtimes))
    names: list[str] = []
    errors: list[BaseException] = []

    def ensure(rt: DockerEngineRuntime) -> None:
        barrier.wait()
        try:
            names.append(rt.ensure_account_network(41))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=ensure, args=(rt,)) for rt in runtimes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert names == [owner.account_network(41)] * len(runtimes)
    ours = runtimes[0].engine.list_networks(f"{LABEL_ACCOUNT}=41")
    assert [n.name for n in ours] == [owner.account_network(41)]
    # Its bridge is named for the host rules, and those rules close it.
    info = runtimes[0].engine.api.inspect_network(owner.account_network(41))
    assert info["Internal"] is False
    firewall = runtimes[0].engine.firewall
    assert firewall is not None
    bridge = bridge_name(owner.account_network(41))
    assert [r for r in firewall.rules() if f"-o {bridge} " in r and "DROP" in r]


def test_a_network_of_that_name_not_ours_is_left_alone(engine_url: str, owner: Ownership) -> None:
    rt = DockerEngineRuntime(engine_url, owner=owner)
    name = owner.account_network(42)
    client = docker.DockerClient(base_url=engine_url)
    # Somebody else's network squatting on the name (labelled only for this test).
    squatter = client.networks.create(name, driver="bridge", labels={"gpuyard.test": "squat"})
    try:
        with pytest.raises(RuntimeFailure) as caught:
            rt.ensure_account_network(42)
        assert isinstance(caught.value, NotOurs)
        with pytest.raises(NotOurs):
            rt.engine.remove_network(name)
        assert client.networks.get(name).attrs["Labels"] == {"gpuyard.test": "squat"}
    finally:
        squatter.remove()
        client.close()


def test_an_unused_account_network_is_removed(engine_url: str, owner: Ownership) -> None:
    now = [0.0]  # the runtime's monotonic clock, moved by hand (a loaded machine may
    # take longer than any grace between two calls)
    rt = DockerEngineRuntime(
        engine_url, owner=owner, policy=FIREWALL, network_in_use_grace_s=1, clock=lambda: now[0]
    )
    name = rt.ensure_account_network(43)
    firewall = rt.engine.firewall
    assert firewall is not None
    assert any(f"-o {bridge_name(name)} " in r for r in firewall.rules())
    # Just asked for by a create: its container may not be on it yet, so it stays.
    rt.guard_networks()
    assert [n.name for n in rt.engine.list_networks(f"{LABEL_ACCOUNT}=43")] == [name]
    # No container on it for the grace period: the periodic pass gives its address
    # pool back. Its rule stays (the same name makes the same bridge when the network
    # is made again).
    now[0] += 1.0
    rt.guard_networks()
    assert rt.engine.list_networks(f"{LABEL_ACCOUNT}=43") == []
    assert rt.ensure_account_network(43, fresh=True) == name
    assert [r for r in firewall.rules() if f"-o {bridge_name(name)} " in r] != []
    # Our jump stays first in FORWARD even when something inserted a rule above it (one
    # that matches nothing here: other tests may be running).
    decoy = ["-i", "gy-no-such", "-j", "ACCEPT", "-m", "comment", "--comment", "gpuyard-test"]
    subprocess.run(["iptables", "-w", "5", "-I", "FORWARD", "1", *decoy], check=True)
    try:
        rt.engine.keep_isolation_first()
        forward = subprocess.run(
            ["iptables", "-w", "5", "-S", "FORWARD"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        assert forward[1] == f"-A FORWARD -j {firewall.chain}", forward
    finally:
        subprocess.run(["iptables", "-w", "5", "-D", "FORWARD", *decoy], check=False)
