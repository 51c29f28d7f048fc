"""The resources training clusters use, over real HTTP: projects, locations, plans,
SSH keys, images, reserved IPs and security groups (shapes, validation errors naming
the field, isolation between accounts, ``active_iam``), plus the CLI commands."""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from pydantic import BaseModel

from gpuyard.api.rest.schemas import resources as rs
from gpuyard.cli.main import cli
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.runtimes.slurm.image import SLURM_IMAGE
from gpuyard.services.access import reserved_ips as reserved_ips_service
from gpuyard.services.access.reserved_ips import get_reserved_ip
from gpuyard.services.access.security_groups import groups_by_ids
from gpuyard.services.access.ssh_keys import keys_by_ids
from gpuyard.services.catalog.images import get_image_version
from gpuyard.services.catalog.plans import get_plan
from gpuyard.services.installation.bootstrap import first_start
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.store.schema import Member, ReservedIp, TrainingCluster, utcnow
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

A6000 = "NVIDIA RTX A6000"
POOL = "127.0.10.0/29"  # 6 usable addresses: .1 to .6
POOL_SIZE = 6


# -- helpers ------------------------------------------------------------------------


@dataclass
class Account:
    key: str
    account_id: int
    user_id: int
    project_id: int


def new_account(srv: LiveServer, email: str, scope: Scope = Scope.WRITE) -> Account:
    with srv.server.ctx.transaction() as s:
        user, account, project = create_account(s, email=email, name=email)
        key = issue_key(s, user_id=user.id, account_id=account.id, name="k", scope=scope).key
        return Account(key, account.id, user.id, project.id)


def admin_account(srv: LiveServer) -> Account:
    with srv.server.ctx.transaction() as s:
        member = s.query(Member).order_by(Member.id).first()
        assert member is not None
    with srv.client() as c:
        default = next(p for p in c.get("/v1/projects").json()["data"]["projects"])
    return Account(srv.key, member.account_id, member.user_id, default["id"])


def add_member(srv: LiveServer, account_id: int, user_id: int, role: str = "member") -> int:
    with srv.server.ctx.transaction() as s:
        m = Member(account_id=account_id, user_id=user_id, role=role)
        s.add(m)
        s.flush()
        return m.id


def err(r: httpx.Response, status: int, code: str, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is False and body["error"]["code"] == code, body
    assert body["meta"]["request_id"]
    if field is not None:
        assert body["error"]["details"]["field"] == field, body
    return dict(body["error"])


def data(r: httpx.Response, status: int, envelope: type[BaseModel]) -> Any:
    assert r.status_code == status, r.text
    body = r.json()
    envelope.model_validate(body)
    return body["data"]


def ed25519_line(comment: str = "me@host") -> str:
    """A well-formed ssh-ed25519 public key line (random key bytes)."""
    blob = b"".join(struct.pack(">I", len(f)) + f for f in (b"ssh-ed25519", os.urandom(32)))
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}".strip()


def insert_training_cluster(
    srv: LiveServer, acct: Account, *, security_group_ids: list[int] | None = None
) -> int:
    with srv.server.ctx.transaction() as s:
        row = TrainingCluster(
            account_id=acct.account_id,
            project_id=acct.project_id,
            location="local",
            name="tc",
            status="running",
            image_version_id=1,
            gpu_type=A6000,
            gpus_per_node=1,
            cpus_per_node=8,
            memory_gb_per_node=32,
            ssh_key_ids=[],
            security_group_ids=security_group_ids or [],
            munge_key="secret",
        )
        s.add(row)
        s.flush()
        return row.id


@pytest.fixture
def pool_srv(tmp_path: Path, fake_runtime: FakeRuntime) -> Iterator[LiveServer]:
    """A server with a reserved-IP pool and compute prices."""
    settings = make_settings(
        tmp_path / "pool-home",
        reserved_ips=POOL,
        price_vcpu_hour=0.01,
        price_memory_gb_hour=0.001,
    )
    # Its own runtime over the same (fake) engine: a second installation.
    with live_server(settings, fake_runtime.sharing_engine()) as server:
        yield server


# -- projects -----------------------------------------------------------------------


def test_projects_list_create_and_validate(srv: LiveServer) -> None:
    with srv.client() as c:
        listed = data(c.get("/v1/projects"), 200, rs.ProjectListEnvelope)["projects"]
        assert [(p["name"], p["is_default"]) for p in listed] == [("default", True)]
        made = data(c.post("/v1/projects", json={"name": " research "}), 201, rs.ProjectEnvelope)
        assert made["name"] == "research" and made["is_default"] is False
        assert made["created_at"].endswith("Z")
        names = [p["name"] for p in c.get("/v1/projects").json()["data"]["projects"]]
        assert names == ["default", "research"]
        for body, field in (
            ({}, "name"),
            ({"name": 5}, "name"),
            ({"name": "   "}, "name"),
            ({"name": "x" * 201}, "name"),
            ({"name": "a", "extra": 1}, "extra"),
        ):
            err(c.post("/v1/projects", json=body), 400, "VALIDATION_ERROR", field)
        bad_json = c.post(
            "/v1/projects", content=b"{", headers={"content-type": "application/json"}
        )
        err(bad_json, 400, "VALIDATION_ERROR", "body")
        err(
            c.get("/v1/projects", params={"active_iam": "x"}), 400, "VALIDATION_ERROR", "active_iam"
        )
    reader = new_account(srv, "ro@example.com", Scope.READ)
    with srv.client(reader.key) as c:
        assert c.get("/v1/projects").status_code == 200
        err(c.post("/v1/projects", json={"name": "x"}), 403, "FORBIDDEN")
    with httpx.Client(base_url=srv.url, verify=trusted_tls()) as anon:
        err(anon.get("/v1/projects"), 401, "UNAUTHORIZED")


def test_active_iam_acts_for_another_account_only_through_a_membership(srv: LiveServer) -> None:
    admin = admin_account(srv)
    bob = new_account(srv, "bob@example.com")
    carol = new_account(srv, "carol@example.com")
    # An admin of the other account: creating projects there is an admin's.
    bob_in_admin = add_member(srv, admin.account_id, bob.user_id, role="admin")
    carol_in_admin = add_member(srv, admin.account_id, carol.user_id)
    with srv.client(bob.key) as c:
        own = c.get("/v1/projects").json()["data"]["projects"]
        assert [p["id"] for p in own] == [bob.project_id]
        acting = c.get("/v1/projects", params={"active_iam": bob_in_admin}).json()["data"]
        assert [p["id"] for p in acting["projects"]] == [admin.project_id]
        made = c.post("/v1/projects", params={"active_iam": bob_in_admin}, json={"name": "shared"})
        assert made.status_code == 201
        err(c.get("/v1/projects", params={"active_iam": carol_in_admin}), 403, "FORBIDDEN")
        err(c.get("/v1/projects", params={"active_iam": 999999}), 403, "FORBIDDEN")
        err(c.get("/v1/ssh-keys", params={"active_iam": carol_in_admin}), 403, "FORBIDDEN")
        err(c.get("/v1/reserved-ips", params={"active_iam": carol_in_admin}), 403, "FORBIDDEN")
        err(c.get("/v1/security-groups", params={"active_iam": carol_in_admin}), 403, "FORBIDDEN")
        # A project of the account acted for, reached through the membership.
        groups = c.get(
            "/v1/security-groups",
            params={"active_iam": bob_in_admin, "project_id": admin.project_id},
        )
        assert groups.status_code == 200
        err(
            c.get("/v1/security-groups", params={"project_id": admin.project_id}),
            404,
            "PROJECT_NOT_FOUND",
        )
    with srv.client() as c:
        names = [p["name"] for p in c.get("/v1/projects").json()["data"]["projects"]]
        assert "shared" in names


# -- locations and plans ------------------------------------------------------------


def test_locations_show_hosts_and_free_gpus(srv: LiveServer) -> None:
    with srv.client() as c:
        locs = data(c.get("/v1/locations"), 200, rs.LocationListEnvelope)["locations"]
        assert [(loc["location"], loc["hosts"], loc["healthy_hosts"]) for loc in locs] == [
            ("local", 1, 1)
        ]
        gpus = {g["gpu_type"]: (g["total_gpus"], g["free_gpus"]) for g in locs[0]["gpu_types"]}
        assert gpus == {A6000: (4, 4), "NVIDIA GeForce RTX 4090": (4, 4)}
        made = c.post("/v1/clusters", json={"gpu_type": A6000, "gpu_count": 1, "docker_image": "i"})
        assert made.status_code == 201
        locs = c.get("/v1/locations").json()["data"]["locations"]
        gpus = {g["gpu_type"]: (g["total_gpus"], g["free_gpus"]) for g in locs[0]["gpu_types"]}
        assert gpus[A6000] == (4, 3)


def test_plans_are_seeded_priced_and_stable(pool_srv: LiveServer) -> None:
    with pool_srv.client() as c:
        plans = data(c.get("/v1/plans"), 200, rs.PlanListEnvelope)["plans"]
        gpu_types = c.get("/v1/gpu-types").json()["data"]["gpu_types"]
    assert len(plans) == 4 * len(gpu_types)
    by_name = {p["name"]: p for p in plans}
    two = by_name["A6000x2"]
    assert (two["gpu_type"], two["gpus_per_node"]) == (A6000, 2)
    assert (two["cpus_per_node"], two["memory_gb_per_node"]) == (16, 64)
    # 2 x 0.76 (secure on-demand) + 16 vCPU x 0.01 + 64 GB x 0.001
    assert two["price_per_hour"] == pytest.approx(1.744)
    assert {"4090x1", "4090x8", "H100SXMx4", "6000Adax8"} <= set(by_name)
    assert [p["sku_id"] for p in plans] == sorted(p["sku_id"] for p in plans)
    # Seeding again (a restart) adds nothing and renumbers nothing.
    first_start(pool_srv.server.ctx)
    with pool_srv.client() as c:
        assert c.get("/v1/plans").json()["data"]["plans"] == plans
    with pool_srv.server.ctx.read() as s:
        assert get_plan(s, two["sku_id"]).name == "A6000x2"
        for bad in (999_999, 2**40, "3", True, None):
            with pytest.raises(ValidationFailed) as info:
                get_plan(s, bad)  # type: ignore[arg-type]
            assert info.value.field == "sku_id"
        with pytest.raises(ValidationFailed, match="plan 999999 not found"):
            get_plan(s, 999_999)


# -- SSH keys -----------------------------------------------------------------------


def test_ssh_keys_crud_and_isolation(srv: LiveServer) -> None:
    line = ed25519_line("  laptop  key ")
    with srv.client() as c:
        assert data(c.get("/v1/ssh-keys"), 200, rs.SshKeyListEnvelope) == {"ssh_keys": []}
        made = data(
            c.post("/v1/ssh-keys", json={"name": "laptop", "public_key": "  " + line + "\n"}),
            201,
            rs.SshKeyEnvelope,
        )
        key_type, blob = line.split()[:2]
        assert made["public_key"] == f"{key_type} {blob} laptop  key"
        assert made["fingerprint"].startswith("SHA256:")
        kid = made["id"]
        assert data(c.get(f"/v1/ssh-keys/{kid}"), 200, rs.SshKeyEnvelope) == made
        listed = c.get("/v1/ssh-keys").json()["data"]["ssh_keys"]
        assert [k["id"] for k in listed] == [kid]
        err(c.get("/v1/ssh-keys/abc"), 400, "VALIDATION_ERROR", "ssh_key_id")
        err(c.get("/v1/ssh-keys/1.5"), 400, "VALIDATION_ERROR", "ssh_key_id")
        # Ids are 1..MAX_ID (OpenAPI says so): anything else is refused, never looked up.
        err(c.get("/v1/ssh-keys/99999999999999999999"), 400, "VALIDATION_ERROR", "ssh_key_id")
        err(c.get("/v1/ssh-keys/0"), 400, "VALIDATION_ERROR", "ssh_key_id")
    bob = new_account(srv, "bob@example.com")
    with srv.client(bob.key) as c:
        assert c.get("/v1/ssh-keys").json()["data"]["ssh_keys"] == []
        err(c.get(f"/v1/ssh-keys/{kid}"), 404, "SSH_KEY_NOT_FOUND")
        err(c.delete(f"/v1/ssh-keys/{kid}"), 404, "SSH_KEY_NOT_FOUND")
    reader = new_account(srv, "ro@example.com", Scope.READ)
    with srv.client(reader.key) as c:
        err(c.post("/v1/ssh-keys", json={"name": "x", "public_key": line}), 403, "FORBIDDEN")
        err(c.delete(f"/v1/ssh-keys/{kid}"), 403, "FORBIDDEN")
    with srv.client() as c:
        gone = data(c.delete(f"/v1/ssh-keys/{kid}"), 200, rs.DeletedEnvelope)
        assert gone == {"id": kid, "deleted": True}
        err(c.get(f"/v1/ssh-keys/{kid}"), 404, "SSH_KEY_NOT_FOUND")
        err(c.delete(f"/v1/ssh-keys/{kid}"), 404, "SSH_KEY_NOT_FOUND")


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({"name": "k"}, "public_key", "required"),
        ({"public_key": "ssh-ed25519 AAAA"}, "name", "required"),
        ({"name": "", "public_key": "GOOD"}, "name", "at least 1 character"),
        ({"name": "k", "public_key": 7}, "public_key", "string"),
        ({"name": "k", "public_key": ""}, "public_key", "empty"),
        (
            {"name": "k", "public_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END"},
            "public_key",
            "PRIVATE key",
        ),
        ({"name": "k", "public_key": "ssh-dss AAAA"}, "public_key", "unsupported key type"),
        ({"name": "k", "public_key": "ssh-rsa GOODBLOB"}, "public_key", "declares 'ssh-rsa'"),
        ({"name": "k", "public_key": "ssh-ed25519 %%%"}, "public_key", "base64"),
        ({"name": "k", "public_key": "GOOD", "comment": "x"}, "comment", "unknown field"),
    ],
)
def test_ssh_key_validation_names_the_field(
    srv: LiveServer, body: dict[str, Any], field: str, needle: str
) -> None:
    good = ed25519_line()
    for k, v in list(body.items()):
        if isinstance(v, str):
            body[k] = v.replace("GOODBLOB", good.split()[1]).replace("GOOD", good)
    with srv.client() as c:
        e = err(c.post("/v1/ssh-keys", json=body), 400, "VALIDATION_ERROR", field)
    assert needle in e["message"], e


def test_keys_by_ids_validates_every_form(srv: LiveServer) -> None:
    bob = new_account(srv, "bob@example.com")
    with srv.client() as c:
        mine = [
            c.post("/v1/ssh-keys", json={"name": f"k{i}", "public_key": ed25519_line()}).json()[
                "data"
            ]["id"]
            for i in range(2)
        ]
    with srv.client(bob.key) as c:
        theirs = c.post("/v1/ssh-keys", json={"name": "b", "public_key": ed25519_line()})
        theirs_id = theirs.json()["data"]["id"]
    admin = admin_account(srv)
    with srv.server.ctx.read() as s:
        rows = keys_by_ids(s, admin.account_id, [mine[1], mine[0], mine[1]])
        assert [r.id for r in rows] == [mine[1], mine[0]]
        for bad, needle in (
            (None, "required"),
            ("1", "must be a list"),
            ({"id": 1}, "must be a list"),
            ([], "at least one"),
            (["1"], "not an integer"),
            ([True], "not an integer"),
            ([1.5], "not an integer"),
            ([999_999], "not found"),
            ([2**40], "not found"),
            ([mine[0], theirs_id], f"SSH key {theirs_id} not found"),
        ):
            with pytest.raises(ValidationFailed) as info:
                keys_by_ids(s, admin.account_id, bad, "keys")
            assert info.value.field == "keys" and needle in info.value.message


# -- images -------------------------------------------------------------------------


def test_images_default_register_and_validate(srv: LiveServer) -> None:
    bob = new_account(srv, "bob@example.com")
    with srv.client() as c:
        listed = data(c.get("/v1/images"), 200, rs.ImageListEnvelope)["images"]
        assert [(i["name"], i["version"], i["image"]) for i in listed] == [
            ("slurm-node", "22.05-bookworm", SLURM_IMAGE)
        ]
        body = {"name": "pytorch", "version": "2.3", "image": "localhost/pt:2.3"}
        made = data(c.post("/v1/images", json=body), 201, rs.ImageEnvelope)
        assert made["description"] == ""
        assert data(c.get(f"/v1/images/{made['id']}"), 200, rs.ImageEnvelope) == made
        dup = err(c.post("/v1/images", json=body), 409, "IMAGE_EXISTS")
        assert dup["details"]["image_version_id"] == made["id"]
        err(c.get("/v1/images/x"), 400, "VALIDATION_ERROR", "image_version_id")
        err(c.get("/v1/images/424242"), 404, "IMAGE_NOT_FOUND")
        for bad, field in (
            ({**body, "image": "two words"}, "image"),
            ({**body, "image": ""}, "image"),
            ({**body, "name": "x" * 201}, "name"),
            ({**body, "version": " "}, "version"),
            ({**body, "description": 5}, "description"),
            ({"name": "a", "version": "1"}, "image"),
        ):
            err(c.post("/v1/images", json=bad), 400, "VALIDATION_ERROR", field)
    with srv.client(bob.key) as c:
        assert len(c.get("/v1/images").json()["data"]["images"]) == 2
        err(
            c.post("/v1/images", json={"name": "a", "version": "1", "image": "b"}), 403, "FORBIDDEN"
        )
    # Start-up registration is idempotent.
    first_start(srv.server.ctx)
    with srv.client() as c:
        assert len(c.get("/v1/images").json()["data"]["images"]) == 2
    with srv.server.ctx.read() as s:
        assert get_image_version(s, made["id"]).image == "localhost/pt:2.3"
        for value, needle in (
            (None, "required"),
            ("1", "integer"),
            (True, "integer"),
            (999, "not found"),
            (2**40, "not found"),
        ):
            with pytest.raises(ValidationFailed) as info:
                get_image_version(s, value)
            assert info.value.field == "image_version_id" and needle in info.value.message


# -- reserved IPs -------------------------------------------------------------------


def test_reserved_ips_allocate_lowest_list_release(pool_srv: LiveServer) -> None:
    srv = pool_srv
    with srv.client() as c:
        first = data(c.post("/v1/reserved-ips"), 201, rs.ReservedIpEnvelope)
        second = c.post("/v1/reserved-ips").json()["data"]
        assert (first["address"], second["address"]) == ("127.0.10.1", "127.0.10.2")
        assert first["status"] == "reserved" and first["training_cluster_id"] is None
        listed = data(c.get("/v1/reserved-ips"), 200, rs.ReservedIpListEnvelope)
        assert [r["id"] for r in listed["reserved_ips"]] == [first["id"], second["id"]]
        got = data(c.get(f"/v1/reserved-ips/{first['id']}"), 200, rs.ReservedIpEnvelope)
        assert got == first
        released = data(c.delete(f"/v1/reserved-ips/{first['id']}"), 200, rs.DeletedEnvelope)
        assert released == {"id": first["id"], "deleted": True}
        err(c.get(f"/v1/reserved-ips/{first['id']}"), 404, "RESERVED_IP_NOT_FOUND")
        err(c.delete(f"/v1/reserved-ips/{first['id']}"), 404, "RESERVED_IP_NOT_FOUND")
        # The lowest free address again.
        assert c.post("/v1/reserved-ips").json()["data"]["address"] == "127.0.10.1"
        err(c.get("/v1/reserved-ips/ip"), 400, "VALIDATION_ERROR", "reserved_ip_id")
        err(c.get("/v1/reserved-ips/77777"), 404, "RESERVED_IP_NOT_FOUND")
        # Another project of the same account.
        other = c.post("/v1/projects", json={"name": "p2"}).json()["data"]["id"]
        in_other = c.post("/v1/reserved-ips", params={"project_id": other}).json()["data"]
        assert in_other["project_id"] == other
        default_ids = [r["id"] for r in c.get("/v1/reserved-ips").json()["data"]["reserved_ips"]]
        assert in_other["id"] not in default_ids
        other_list = c.get("/v1/reserved-ips", params={"project_id": other}).json()["data"]
        assert [r["id"] for r in other_list["reserved_ips"]] == [in_other["id"]]
        admin = admin_account(srv)
        err(
            c.get(f"/v1/reserved-ips/{in_other['id']}", params={"project_id": admin.project_id}),
            404,
            "RESERVED_IP_NOT_FOUND",
        )
        assert c.get(f"/v1/reserved-ips/{in_other['id']}").status_code == 200
        for params, field in (
            ({"project_id": "x"}, "project_id"),
            ({"project_id": "99999999999"}, "project_id"),
            ({"project_id": "0"}, "project_id"),
            ({"active_iam": "1.5"}, "active_iam"),
        ):
            err(c.get("/v1/reserved-ips", params=params), 400, "VALIDATION_ERROR", field)
            err(c.post("/v1/reserved-ips", params=params), 400, "VALIDATION_ERROR", field)
        err(c.post("/v1/reserved-ips", params={"project_id": 424242}), 404, "PROJECT_NOT_FOUND")
        err(c.post("/v1/reserved-ips", json={"project_id": other}), 400, "VALIDATION_ERROR", "body")
        assert c.post("/v1/reserved-ips", json={}).status_code == 201


def test_reserved_ips_are_private_to_their_account(pool_srv: LiveServer) -> None:
    srv = pool_srv
    bob = new_account(srv, "bob@example.com")
    reader = new_account(srv, "ro@example.com", Scope.READ)
    admin = admin_account(srv)
    with srv.client() as c:
        ip = c.post("/v1/reserved-ips").json()["data"]
    with srv.client(bob.key) as c:
        assert c.get("/v1/reserved-ips").json()["data"]["reserved_ips"] == []
        err(c.get(f"/v1/reserved-ips/{ip['id']}"), 404, "RESERVED_IP_NOT_FOUND")
        err(c.delete(f"/v1/reserved-ips/{ip['id']}"), 404, "RESERVED_IP_NOT_FOUND")
        err(
            c.post("/v1/reserved-ips", params={"project_id": admin.project_id}),
            404,
            "PROJECT_NOT_FOUND",
        )
        mine = c.post("/v1/reserved-ips").json()["data"]
        assert mine["address"] == "127.0.10.2"
    with srv.client(reader.key) as c:
        err(c.post("/v1/reserved-ips"), 403, "FORBIDDEN")
    with srv.server.ctx.read() as s:
        assert get_reserved_ip(s, admin.account_id, ip["id"]).address == ip["address"]
        for bad, needle in (
            (None, "required"),
            ("1", "integer"),
            (False, "integer"),
            (mine["id"], "not found"),
            (10**12, "not found"),
        ):
            with pytest.raises(ValidationFailed) as info:
                get_reserved_ip(s, admin.account_id, bad)
            assert info.value.field == "reserved_ip_id" and needle in info.value.message


def test_reserved_ip_pool_exhaustion_and_missing_pool(
    pool_srv: LiveServer, srv: LiveServer
) -> None:
    with pool_srv.client() as c:
        got = [c.post("/v1/reserved-ips").json()["data"]["address"] for _ in range(POOL_SIZE)]
        assert got == [f"127.0.10.{i}" for i in range(1, POOL_SIZE + 1)]
        e = err(c.post("/v1/reserved-ips"), 409, "INSUFFICIENT_CAPACITY")
        assert "exhausted" in e["message"] and e["details"]["pool_size"] == POOL_SIZE
    with srv.client() as c:
        e = err(c.post("/v1/reserved-ips"), 409, "INSUFFICIENT_CAPACITY")
        assert "GPUYARD_RESERVED_IPS" in e["message"]


def test_concurrent_allocations_never_share_an_address(pool_srv: LiveServer) -> None:
    results: list[httpx.Response] = []
    lock = threading.Lock()
    barrier = threading.Barrier(POOL_SIZE * 2)

    def allocate() -> None:
        with pool_srv.client() as c:
            barrier.wait()
            r = c.post("/v1/reserved-ips")
        with lock:
            results.append(r)

    threads = [threading.Thread(target=allocate) for _ in range(POOL_SIZE * 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r.json()["data"]["address"] for r in results if r.status_code == 201]
    lost = [r for r in results if r.status_code != 201]
    assert sorted(won) == [f"127.0.10.{i}" for i in range(1, POOL_SIZE + 1)]
    assert all(r.status_code == 409 for r in lost) and len(lost) == POOL_SIZE


def test_allocation_retries_when_it_loses_the_unique_key(
    pool_srv: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pool_srv.client() as c:
        assert c.post("/v1/reserved-ips").json()["data"]["address"] == "127.0.10.1"
    real = reserved_ips_service._used
    calls: list[int] = []

    def stale(session: Any) -> set[str]:
        # The first attempt misses the committed .1 (as a concurrent allocation would).
        calls.append(1)
        return set() if len(calls) == 1 else real(session)

    monkeypatch.setattr(reserved_ips_service, "_used", stale)
    with pool_srv.client() as c:
        assert c.post("/v1/reserved-ips").json()["data"]["address"] == "127.0.10.2"
    assert len(calls) == 2


def test_attached_reserved_ip_cannot_be_released(pool_srv: LiveServer) -> None:
    admin = admin_account(pool_srv)
    cluster_id = insert_training_cluster(pool_srv, admin)
    with pool_srv.client() as c:
        ip = c.post("/v1/reserved-ips").json()["data"]
        with pool_srv.server.ctx.transaction() as s:
            row = s.get(ReservedIp, ip["id"])
            assert row is not None
            row.training_cluster_id = cluster_id
        shown = c.get(f"/v1/reserved-ips/{ip['id']}").json()["data"]
        assert (shown["status"], shown["training_cluster_id"]) == ("attached", cluster_id)
        e = err(c.delete(f"/v1/reserved-ips/{ip['id']}"), 409, "INVALID_STATE")
        assert "detach it first" in e["message"]
        with pool_srv.server.ctx.transaction() as s:
            row = s.get(ReservedIp, ip["id"])
            assert row is not None
            row.training_cluster_id = None
        assert c.delete(f"/v1/reserved-ips/{ip['id']}").status_code == 200


# -- security groups ----------------------------------------------------------------

RULES: list[dict[str, object]] = [
    {"protocol": "tcp", "port_range": 22, "source_cidr": "10.0.0.0/8"},
    {"protocol": "udp", "port_range": "8000-9000", "source_cidr": "192.0.2.7"},
    {"protocol": "all", "port_range": "1-65535", "source_cidr": "2001:db8::/32"},
]


def rule(**changes: object) -> dict[str, object]:
    return {**RULES[0], **changes}


def test_security_groups_crud(srv: LiveServer) -> None:
    with srv.client() as c:
        assert data(c.get("/v1/security-groups"), 200, rs.SecurityGroupListEnvelope) == {
            "security_groups": []
        }
        made = data(
            c.post("/v1/security-groups", json={"name": "ssh", "rules": RULES}),
            201,
            rs.SecurityGroupEnvelope,
        )
        assert made["description"] == ""
        assert made["rules"] == [
            {"protocol": "tcp", "port_range": "22", "source_cidr": "10.0.0.0/8"},
            {"protocol": "udp", "port_range": "8000-9000", "source_cidr": "192.0.2.7/32"},
            {"protocol": "all", "port_range": "1-65535", "source_cidr": "2001:db8::/32"},
        ]
        gid = made["id"]
        assert data(c.get(f"/v1/security-groups/{gid}"), 200, rs.SecurityGroupEnvelope) == made
        replaced = data(
            c.put(
                f"/v1/security-groups/{gid}",
                json={"name": "web", "description": "http", "rules": [RULES[0]]},
            ),
            200,
            rs.SecurityGroupEnvelope,
        )
        assert (replaced["name"], replaced["description"], len(replaced["rules"])) == (
            "web",
            "http",
            1,
        )
        emptied = c.put(f"/v1/security-groups/{gid}", json={"name": "none", "rules": []})
        assert emptied.json()["data"]["rules"] == []
        assert emptied.json()["data"]["description"] == ""
        listed = c.get("/v1/security-groups").json()["data"]["security_groups"]
        assert [g["name"] for g in listed] == ["none"]
        err(c.get("/v1/security-groups/x"), 400, "VALIDATION_ERROR", "security_group_id")
        err(
            c.put("/v1/security-groups/x", json={"name": "a", "rules": []}), 400, "VALIDATION_ERROR"
        )
        err(c.get("/v1/security-groups/31337"), 404, "SECURITY_GROUP_NOT_FOUND")
        err(
            c.put("/v1/security-groups/31337", json={"name": "a", "rules": []}),
            404,
            "SECURITY_GROUP_NOT_FOUND",
        )
        # Project scoping: a group of another project is not in this project's list.
        other = c.post("/v1/projects", json={"name": "p2"}).json()["data"]["id"]
        g2 = c.post(
            "/v1/security-groups", params={"project_id": other}, json={"name": "g2", "rules": []}
        ).json()["data"]
        assert g2["project_id"] == other
        assert [
            g["id"] for g in c.get("/v1/security-groups").json()["data"]["security_groups"]
        ] == [gid]
        admin = admin_account(srv)
        err(
            c.get(f"/v1/security-groups/{g2['id']}", params={"project_id": admin.project_id}),
            404,
            "SECURITY_GROUP_NOT_FOUND",
        )
        assert data(c.delete(f"/v1/security-groups/{gid}"), 200, rs.DeletedEnvelope) == {
            "id": gid,
            "deleted": True,
        }
        err(c.get(f"/v1/security-groups/{gid}"), 404, "SECURITY_GROUP_NOT_FOUND")
        err(c.delete(f"/v1/security-groups/{gid}"), 404, "SECURITY_GROUP_NOT_FOUND")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "g"}, "rules"),
        ({"rules": []}, "name"),
        ({"name": " ", "rules": []}, "name"),
        ({"name": 3, "rules": []}, "name"),
        ({"name": "g", "rules": {}}, "rules"),
        ({"name": "g", "rules": [], "description": "d" * 2001}, "description"),
        ({"name": "g", "rules": [], "color": "red"}, "color"),
        ({"name": "g", "rules": ["tcp:22"]}, "rules[0]"),
        ({"name": "g", "rules": [rule(protocol="icmp")]}, "rules[0].protocol"),
        ({"name": "g", "rules": [RULES[0], rule(port_range="70000")]}, "rules[1].port_range"),
        ({"name": "g", "rules": [rule(port_range="9-1")]}, "rules[0].port_range"),
        ({"name": "g", "rules": [rule(port_range=True)]}, "rules[0].port_range"),
        ({"name": "g", "rules": [rule(source_cidr="10.0.0.1/8")]}, "rules[0].source_cidr"),
        ({"name": "g", "rules": [rule(source_cidr="any")]}, "rules[0].source_cidr"),
        ({"name": "g", "rules": [{"protocol": "tcp", "port_range": "22"}]}, "rules[0].source_cidr"),
        ({"name": "g", "rules": [rule(note="x")]}, "rules[0].note"),
        ({"name": "g", "rules": [RULES[0]] * 101}, "rules"),
    ],
)  # fmt: skip
def test_security_group_validation_names_the_field(
    srv: LiveServer, body: dict[str, Any], field: str
) -> None:
    with srv.client() as c:
        err(c.post("/v1/security-groups", json=body), 400, "VALIDATION_ERROR", field)
        gid = c.post("/v1/security-groups", json={"name": "ok", "rules": []}).json()["data"]["id"]
        err(c.put(f"/v1/security-groups/{gid}", json=body), 400, "VALIDATION_ERROR", field)


def test_security_groups_isolation_and_attached_delete(srv: LiveServer) -> None:
    admin = admin_account(srv)
    bob = new_account(srv, "bob@example.com")
    reader = new_account(srv, "ro@example.com", Scope.READ)
    with srv.client() as c:
        gid = c.post("/v1/security-groups", json={"name": "g", "rules": RULES}).json()["data"]["id"]
    with srv.client(bob.key) as c:
        assert c.get("/v1/security-groups").json()["data"]["security_groups"] == []
        err(c.get(f"/v1/security-groups/{gid}"), 404, "SECURITY_GROUP_NOT_FOUND")
        err(
            c.put(f"/v1/security-groups/{gid}", json={"name": "x", "rules": []}),
            404,
            "SECURITY_GROUP_NOT_FOUND",
        )
        err(c.delete(f"/v1/security-groups/{gid}"), 404, "SECURITY_GROUP_NOT_FOUND")
        bobs = c.post("/v1/security-groups", json={"name": "b", "rules": []}).json()["data"]["id"]
    with srv.client(reader.key) as c:
        err(c.post("/v1/security-groups", json={"name": "x", "rules": []}), 403, "FORBIDDEN")
        err(c.delete(f"/v1/security-groups/{gid}"), 403, "FORBIDDEN")
    cluster_id = insert_training_cluster(srv, admin, security_group_ids=[gid])
    with srv.client() as c:
        e = err(c.delete(f"/v1/security-groups/{gid}"), 409, "INVALID_STATE")
        assert e["details"]["training_cluster_ids"] == [cluster_id]
        with srv.server.ctx.transaction() as s:
            row = s.get(TrainingCluster, cluster_id)
            assert row is not None
            row.deleted_at = utcnow()
        assert c.delete(f"/v1/security-groups/{gid}").status_code == 200
        again = c.post("/v1/security-groups", json={"name": "g", "rules": []}).json()["data"]["id"]
    with srv.server.ctx.read() as s:
        assert [g.id for g in groups_by_ids(s, admin.account_id, [again], "ids")] == [again]
        for bad, needle in (
            (None, "required"),
            ("x", "list"),
            ([], "at least one"),
            ([again, "2"], "not an integer"),
            ([gid], "not found"),
            ([bobs], "not found"),
            ([-1], "not found"),
        ):
            with pytest.raises(ValidationFailed) as info:
                groups_by_ids(s, admin.account_id, bad, "security_groups_ids")
            assert info.value.field == "security_groups_ids" and needle in info.value.message


def test_openapi_documents_the_resource_endpoints(srv: LiveServer) -> None:
    spec = httpx.get(srv.url + "/openapi.json", timeout=60, verify=trusted_tls()).json()
    for path, method, model in (
        ("/v1/projects", "get", "ProjectListEnvelope"),
        ("/v1/projects", "post", "ProjectEnvelope"),
        ("/v1/locations", "get", "LocationListEnvelope"),
        ("/v1/plans", "get", "PlanListEnvelope"),
        ("/v1/ssh-keys", "post", "SshKeyEnvelope"),
        ("/v1/ssh-keys/{ssh_key_id}", "delete", "DeletedEnvelope"),
        ("/v1/images", "get", "ImageListEnvelope"),
        ("/v1/reserved-ips", "post", "ReservedIpEnvelope"),
        ("/v1/security-groups/{security_group_id}", "put", "SecurityGroupEnvelope"),
    ):
        responses = spec["paths"][path][method]["responses"]
        ok_status = "201" if method == "post" else "200"
        ref = responses[ok_status]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith(model), (path, method, ref)
        assert "400" in responses and "404" in responses


# -- CLI ----------------------------------------------------------------------------


def run(srv: LiveServer, *args: str) -> Result:
    env = {
        "GPUYARD_URL": srv.url,
        "GPUYARD_API_KEY": srv.key,
        "GPUYARD_HOME": str(srv.server.ctx.settings.home),
    }
    return CliRunner().invoke(cli, list(args), env=env)


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_resource_commands(pool_srv: LiveServer, tmp_path: Path) -> None:
    srv = pool_srv
    project = ok_json(run(srv, "projects", "create", "research", "--json"))
    assert project["name"] == "research"
    table = run(srv, "projects", "list")
    assert table.exit_code == 0 and "research" in table.stdout

    if shutil.which("ssh-keygen"):
        path = tmp_path / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
            check=True,
            capture_output=True,
        )
        from_file = ok_json(
            run(srv, "ssh-keys", "add", "laptop", "--file", f"{path}.pub", "--json")
        )
        assert from_file["public_key"] == Path(f"{path}.pub").read_text().strip()
        private = run(srv, "ssh-keys", "add", "oops", "--file", str(path))
        assert private.exit_code == 1 and "PRIVATE key" in private.stderr
    key = ok_json(run(srv, "ssh-keys", "add", "ci", "--key", ed25519_line(), "--json"))
    listed = run(srv, "ssh-keys", "list")
    assert listed.exit_code == 0 and key["fingerprint"] in listed.stdout
    assert run(srv, "ssh-keys", "add", "x").exit_code == 2
    deleted = run(srv, "ssh-keys", "delete", str(key["id"]))
    assert deleted.exit_code == 0 and "deleted" in deleted.stdout
    missing = run(srv, "ssh-keys", "delete", str(key["id"]))
    assert missing.exit_code == 1 and "SSH_KEY_NOT_FOUND" in missing.stderr

    image = ok_json(
        run(
            srv, "images", "register", "--name", "pt", "--version", "1", "--image", "pt:1", "--json"
        )
    )
    assert image["image"] == "pt:1"
    images = run(srv, "images", "list")
    assert images.exit_code == 0 and "slurm-node" in images.stdout and "pt:1" in images.stdout

    plans = run(srv, "plans")
    assert plans.exit_code == 0 and "A6000x8" in plans.stdout
    assert ok_json(run(srv, "plans", "--json"))["plans"]
    locations = run(srv, "locations")
    assert locations.exit_code == 0 and "local" in locations.stdout

    ip = ok_json(run(srv, "reserved-ips", "allocate", "--project-id", str(project["id"]), "--json"))
    assert ip["address"] == "127.0.10.1" and ip["project_id"] == project["id"]
    ips = run(srv, "reserved-ips", "list", "--project-id", str(project["id"]))
    assert ips.exit_code == 0 and "127.0.10.1" in ips.stdout
    released = run(srv, "reserved-ips", "release", str(ip["id"]))
    assert released.exit_code == 0 and "released" in released.stdout

    group = ok_json(
        run(
            srv, "security-groups", "create", "ssh", "--rule", "tcp:22:10.0.0.0/8",
            "--rule", "udp:8000-9000:2001:db8::/32", "--description", "d", "--json",
        )
    )  # fmt: skip
    assert group["rules"][1] == {
        "protocol": "udp",
        "port_range": "8000-9000",
        "source_cidr": "2001:db8::/32",
    }
    groups = run(srv, "security-groups", "list")
    assert groups.exit_code == 0 and "tcp:22:10.0.0.0/8" in groups.stdout
    bad = run(srv, "security-groups", "create", "x", "--rule", "tcp:22")
    assert bad.exit_code == 2 and "PROTOCOL:PORTS:CIDR" in bad.output
    invalid = run(srv, "security-groups", "create", "x", "--rule", "tcp:99999:0.0.0.0/0")
    assert invalid.exit_code == 1 and "rules[0].port_range" in invalid.stderr
    gone = run(srv, "security-groups", "delete", str(group["id"]))
    assert gone.exit_code == 0 and "deleted" in gone.stdout
