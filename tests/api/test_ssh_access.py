"""SSH access as the API shows it: ``network.ssh_connection`` (gateway and direct) and
RunPod's ``myself { pubKey }`` / ``updateUserSettings(input: {pubKey})``, which read
and write the same keys as ``/v1/ssh-keys``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncssh

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings


def pub(comment: str = "") -> str:
    key = asyncssh.generate_private_key("ssh-ed25519")
    line = key.export_public_key().decode().strip()
    return f"{line} {comment}" if comment else line


def create(srv: LiveServer, **body: Any) -> str:
    with srv.client() as c:
        r = c.post("/v1/clusters", json={"name": "s", "docker_image": "img", **body})
        assert r.status_code == 201, r.text
        cid: str = r.json()["data"]["id"]
    assert srv.server.reconciler.wait_idle(10)
    return cid


def ssh_of(srv: LiveServer, cid: str) -> dict[str, Any]:
    with srv.client() as c:
        data: dict[str, Any] = c.get(f"/v1/clusters/{cid}").json()["data"]
    assert data["status"] in ("running", "stopped"), data
    out: dict[str, Any] = data["network"]["ssh_connection"]
    return out


SSH_PORT = [{"internal_port": 22, "external_port": 0, "protocol": "tcp"}]


def test_every_running_cluster_names_the_gateway(srv: LiveServer) -> None:
    plain = create(srv)
    conn = ssh_of(srv, plain)
    assert conn == {
        "host": "127.0.0.1",
        "port": 2222,
        "username": plain,
        "connection_string": f"ssh {plain}@127.0.0.1 -p 2222",
        "gateway": f"ssh {plain}@127.0.0.1 -p 2222",
        "direct": None,
    }
    with_sshd = create(srv, ports=SSH_PORT)
    conn = ssh_of(srv, with_sshd)
    assert conn["connection_string"] == f"ssh {with_sshd}@127.0.0.1 -p 2222"
    assert conn["direct"] is not None and conn["direct"].startswith("ssh root@127.0.0.1 -p ")
    with srv.client() as c:
        assert c.post(f"/v1/clusters/{with_sshd}/stop").status_code == 200
    assert srv.server.reconciler.wait_idle(10)
    assert set(ssh_of(srv, with_sshd).values()) == {None}


def test_gateway_off_leaves_the_direct_way(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "home", ssh_port=0, ssh_host="unused.example")
    with live_server(settings, FakeRuntime()) as srv:
        plain = create(srv)
        assert set(ssh_of(srv, plain).values()) == {None}
        cid = create(srv, ports=SSH_PORT)
        conn = ssh_of(srv, cid)
        assert conn["gateway"] is None and conn["username"] == "root"
        assert (
            conn["connection_string"] == conn["direct"] == (f"ssh root@127.0.0.1 -p {conn['port']}")
        )


def test_advertised_gateway_host_and_port(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "home", ssh_host="ssh.gpu.example", ssh_port=22)
    with live_server(settings, FakeRuntime()) as srv:
        cid = create(srv)
        assert ssh_of(srv, cid)["connection_string"] == f"ssh {cid}@ssh.gpu.example -p 22"


PUBKEY = "{ myself { id pubKey } }"
UPDATE = "mutation($k: String) { updateUserSettings(input: {pubKey: $k}) { id pubKey } }"


def test_pub_key_reads_and_replaces_the_account_keys(srv: LiveServer) -> None:
    assert srv.graphql(PUBKEY)["data"]["myself"]["pubKey"] is None
    first = pub("laptop")
    with srv.client() as c:
        kept = c.post("/v1/ssh-keys", json={"name": "laptop", "public_key": first}).json()
    assert srv.graphql(PUBKEY)["data"]["myself"]["pubKey"] == first

    second = pub()
    text = f"# my keys\n{first}\n\n{second}\n{first}\n"
    answer = srv.graphql(UPDATE, {"k": text})
    assert "errors" not in answer, answer
    assert answer["data"]["updateUserSettings"]["pubKey"] == f"{first}\n{second}"
    with srv.client() as c:
        listed = c.get("/v1/ssh-keys").json()["data"]["ssh_keys"]
    # The key already stored keeps its id and name; the new one is named for itself.
    assert listed[0]["id"] == kept["data"]["id"]
    assert listed[0]["name"] == "laptop" and listed[1]["name"].startswith("key ")
    assert len(listed) == 2

    # A bad line refuses the whole update and says which line.
    bad = srv.graphql(UPDATE, {"k": f"{second}\nssh-ed25519 nope"})
    assert bad["errors"][0]["extensions"]["code"] == "VALIDATION_ERROR"
    assert "line 2" in bad["errors"][0]["message"]
    assert srv.graphql(PUBKEY)["data"]["myself"]["pubKey"] == f"{first}\n{second}"

    # Null leaves the keys alone; an empty string removes them all.
    assert srv.graphql(UPDATE, {"k": None})["data"]["updateUserSettings"]["pubKey"]
    assert srv.graphql(UPDATE, {"k": ""})["data"]["updateUserSettings"]["pubKey"] is None
    with srv.client() as c:
        assert c.get("/v1/ssh-keys").json()["data"]["ssh_keys"] == []
