"""Seed 002's training-cluster API over real HTTP: envelope, scope parameters, every
validation error and the actions' bookkeeping. Nodes are not built here (no operator:
the fake runtime runs no Slurm); tests/e2e/test_training_e2e.py does that for real."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.services.training import stops as training_stops
from gpuyard.store.schema import GpuAllocation, Member, TrainingCluster
from tests.helpers import LiveServer, live_server, make_settings

A = "NVIDIA RTX A6000"
BASE = "/distributed_jobs_v2/cluster/"


@pytest.fixture
def tsrv(tmp_path: Path) -> Iterator[LiveServer]:
    from gpuyard.testing.fake_runtime import FakeRuntime

    settings = make_settings(tmp_path / "home", reserved_ips="127.0.10.0/29")
    with live_server(settings, FakeRuntime()) as server:
        yield server


def public_key(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True
    )
    return (tmp_path / f"{name}.pub").read_text().strip()


@pytest.fixture
def setup(tsrv: LiveServer, tmp_path: Path) -> dict[str, Any]:
    with tsrv.client() as c:
        key = c.post(
            "/v1/ssh-keys", json={"name": "me", "public_key": public_key(tmp_path, "k1")}
        ).json()["data"]
        images = c.get("/v1/images").json()["data"]
        image = images[0] if isinstance(images, list) else images["images"][0]
        project = c.get("/v1/projects").json()["data"]
        projects = project if isinstance(project, list) else project["projects"]
    return {"key_id": key["id"], "image_id": image["id"], "project_id": projects[0]["id"]}


def params(setup: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"project_id": setup["project_id"], "location": "local", **extra}


def body(setup: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": "trainer",
        "image_version_id": setup["image_id"],
        "ssh_key_ids": [setup["key_id"]],
        "no_of_nodes": 2,
        "gpu_type": A,
        "gpus_per_node": 1,
        "cpus_per_node": 4,
        "memory_gb_per_node": 8,
        **extra,
    }


def assert_error(r: httpx.Response, status: int, code: str, field: str | None = None) -> None:
    payload = r.json()
    assert r.status_code == status == payload["code"], payload
    assert payload["errors"]["code"] == code, payload
    assert payload["data"] == {}
    if field is not None:
        assert payload["errors"]["field"] == field, payload


def set_status(srv: LiveServer, cluster_id: int, status: str) -> None:
    with srv.server.ctx.transaction() as session:
        row = session.get(TrainingCluster, cluster_id)
        assert row is not None
        row.status = status
        row.operation = None


def allocated_gpus(srv: LiveServer) -> int:
    with srv.server.ctx.read() as session:
        return int(session.scalar(select(func.count()).select_from(GpuAllocation)) or 0)


def test_create_list_get_delete(tsrv: LiveServer, setup: dict[str, Any]) -> None:
    with tsrv.client() as c:
        r = c.post(BASE, params=params(setup), json=body(setup))
        payload = r.json()
        assert r.status_code == 201 == payload["code"], payload
        assert payload["errors"] == {} and payload["message"]
        cluster = payload["data"]
        assert isinstance(cluster["id"], int)
        assert cluster["status"] == "creating" and cluster["no_of_nodes"] == 2
        roles = sorted(n["role"] for n in cluster["nodes"])
        assert roles == ["controller", "worker", "worker"]
        workers = [n for n in cluster["nodes"] if n["role"] == "worker"]
        assert all(len(n["gpu_indices"]) == 1 for n in workers)
        assert cluster["ssh"]["port"] > 0 and cluster["ssh"]["user"] == "root"
        assert "munge" not in r.text.lower()
        assert allocated_gpus(tsrv) == 2

        listed = c.get(BASE, params=params(setup)).json()
        assert [x["id"] for x in listed["data"]] == [cluster["id"]]
        assert c.get(BASE, params=params(setup, location="elsewhere")).json()["data"] == []
        got = c.get(f"{BASE}{cluster['id']}/", params=params(setup)).json()
        assert got["data"]["name"] == "trainer"
        # Without the trailing slash, and with ?apikey= instead of a header.
        bare = httpx.get(
            f"{tsrv.url}{BASE}{cluster['id']}",
            params=params(setup, apikey=tsrv.key),
            verify=trusted_tls(),
        )
        assert bare.status_code == 200 and bare.json()["data"]["id"] == cluster["id"]
        events = c.get(f"{BASE}{cluster['id']}/events/", params=params(setup)).json()["data"]
        assert [(e["from_status"], e["to_status"]) for e in events] == [(None, "creating")]
        # Paged like the list: a page at a time, following next_cursor.
        set_status(tsrv, cluster["id"], "running")
        for action in ("restart_workers", "restart_cluster"):
            r = c.put(f"{BASE}{cluster['id']}/", params=params(setup), json={"action": action})
            assert r.status_code == 200, r.text
            set_status(tsrv, cluster["id"], "running")
        seen, cursor = [], None
        while True:
            extra = {"per_page": 1} | ({"cursor": cursor} if cursor else {})
            page = c.get(f"{BASE}{cluster['id']}/events/", params=params(setup, **extra)).json()
            assert page["code"] == 200 and len(page["data"]) == 1, page
            assert page["pagination"]["total"] == 3
            seen += [e["to_status"] for e in page["data"]]
            cursor = page["pagination"]["next_cursor"]
            if cursor is None:
                break
        assert seen == ["creating", "restarting", "restarting"]
        # A cursor of another list is refused, naming the field.
        other = c.get(BASE, params=params(setup, per_page=1)).json()["pagination"]["next_cursor"]
        if other:
            r = c.get(f"{BASE}{cluster['id']}/events/", params=params(setup, cursor=other))
            assert_error(r, 400, "VALIDATION_ERROR", "cursor")
        bad = c.get(f"{BASE}{cluster['id']}/events/", params=params(setup, cursor="zz"))
        assert_error(bad, 400, "VALIDATION_ERROR", "cursor")
        assert_error(
            c.get(f"{BASE}{cluster['id']}/events/", params=params(setup, location="elsewhere")),
            404,
            "TRAINING_CLUSTER_NOT_FOUND",
        )

        # No operator here (nothing was built): the delete completes at once and
        # releases every GPU and port.
        r = c.delete(f"{BASE}{cluster['id']}/", params=params(setup))
        assert r.status_code == 200 and r.json()["data"]["status"] == "deleted"
        assert allocated_gpus(tsrv) == 0
        assert_error(
            c.get(f"{BASE}{cluster['id']}/", params=params(setup)),
            404,
            "TRAINING_CLUSTER_NOT_FOUND",
        )


def test_hostile_input_gets_the_envelope(tsrv: LiveServer, setup: dict[str, Any]) -> None:
    huge = "9" * 30
    with tsrv.client() as c:
        for path, query in (
            (f"{BASE}{2**40}/", params(setup)),
            (f"{BASE}{huge}/", params(setup)),
            (BASE, params(setup, project_id=2**40)),
            (BASE, params(setup, project_id=huge)),
        ):
            r = c.get(path, params=query)
            assert r.status_code in (400, 404) and r.json()["code"] == r.status_code, r.text
        # Out of the id range OpenAPI declares (1..2**31-1): refused, never looked up.
        assert_error(
            c.get(BASE, params=params(setup, active_iam=2**40)),
            400,
            "VALIDATION_ERROR",
            "active_iam",
        )
        for raw in (rb'{"name": "\ud800"}', b"[" * 100_000 + b"]" * 100_000):
            r = c.post(BASE, params=params(setup), content=raw)
            assert_error(r, 400, "VALIDATION_ERROR", "body")
        r = c.post(BASE, params=params(setup), content=b" " * (300 * 1024) + b"{}")
        assert_error(r, 413, "PAYLOAD_TOO_LARGE")
        # A long id list is refused before any of it is looked up.
        r = c.post(BASE, params=params(setup), json=body(setup, ssh_key_ids=list(range(20_000))))
        assert_error(r, 400, "VALIDATION_ERROR", "ssh_key_ids")
        assert "at most 100" in r.json()["message"]
        other = c.post("/v1/projects", json={"name": "other"}).json()["data"]
        group = c.post(
            "/v1/security-groups",
            params={"project_id": other["id"]},
            json={"name": "elsewhere", "rules": []},
        ).json()["data"]
        r = c.post(BASE, params=params(setup), json=body(setup, security_group_id=group["id"]))
        assert_error(r, 400, "VALIDATION_ERROR", "security_group_id")


def test_create_validation_names_the_field(tsrv: LiveServer, setup: dict[str, Any]) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": ""}, "name"),
        ({"image_version_id": 9999}, "image_version_id"),
        ({"image_version_id": "x"}, "image_version_id"),
        ({"ssh_key_ids": []}, "ssh_key_ids"),
        ({"ssh_key_ids": [9999]}, "ssh_key_ids"),
        ({"ssh_key_ids": "1"}, "ssh_key_ids"),
        ({"no_of_nodes": 0}, "no_of_nodes"),
        ({"no_of_nodes": "two"}, "no_of_nodes"),
        ({"gpu_type": "H9000"}, "gpu_type"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"sku_id": 1}, "gpu_type"),
        ({"security_group_id": 9999}, "security_group_id"),
        ({"lifecycle_script": 5}, "lifecycle_script"),
        ({"colour": "blue"}, "colour"),
    ]
    with tsrv.client() as c:
        for change, field in cases:
            r = c.post(BASE, params=params(setup), json=body(setup, **change))
            assert_error(r, 400, "VALIDATION_ERROR", field)
        no_plan = body(setup)
        for f in ("gpu_type", "gpus_per_node", "cpus_per_node", "memory_gb_per_node"):
            no_plan.pop(f)
        assert_error(
            c.post(BASE, params=params(setup), json=no_plan), 400, "VALIDATION_ERROR", "sku_id"
        )
        partial = body(setup)
        partial.pop("cpus_per_node")
        assert_error(
            c.post(BASE, params=params(setup), json=partial),
            400,
            "VALIDATION_ERROR",
            "cpus_per_node",
        )
        assert_error(
            c.post(BASE, params=params(setup), content=b"{nope"), 400, "VALIDATION_ERROR", "body"
        )
        assert_error(c.post(BASE, params=params(setup), json=[1]), 400, "VALIDATION_ERROR", "body")
        assert_error(
            c.post(BASE, params={"location": "local"}, json=body(setup)),
            400,
            "VALIDATION_ERROR",
            "project_id",
        )
        assert_error(
            c.post(BASE, params={"project_id": "x", "location": "local"}, json=body(setup)),
            400,
            "VALIDATION_ERROR",
            "project_id",
        )
        assert_error(
            c.post(BASE, params={"project_id": setup["project_id"]}, json=body(setup)),
            400,
            "VALIDATION_ERROR",
            "location",
        )
        assert_error(
            c.post(BASE, params=params(setup, location="mars"), json=body(setup)),
            400,
            "VALIDATION_ERROR",
            "location",
        )
        # 4 A6000s on the host: 3 workers of 2 cannot fit; nothing is created or held.
        r = c.post(BASE, params=params(setup), json=body(setup, no_of_nodes=3, gpus_per_node=2))
        assert_error(r, 409, "INSUFFICIENT_CAPACITY")
        # What the whole cluster needs against what the host has free before the try
        # (not what a half-placed attempt left).
        details = r.json()["errors"]["details"]
        assert details["needed"] == {"gpu_type": A, "gpus": 6, "vcpus": 14, "memory_gb": 28}
        assert details["available"][0]["gpus"][A] == 4
        assert "6x NVIDIA RTX A6000, 14 vCPUs and 28 GB" in r.json()["message"]
        assert c.get(BASE, params=params(setup)).json()["data"] == []
        assert allocated_gpus(tsrv) == 0
        # With a plan from /v1/plans.
        plans = c.get("/v1/plans").json()["data"]
        plans = plans if isinstance(plans, list) else plans["plans"]
        plan = next(p for p in plans if p["gpu_type"] == A and p["gpus_per_node"] == 1)
        sized = {
            k: v for k, v in body(setup).items() if not k.endswith("_per_node") and k != "gpu_type"
        }
        r = c.post(
            BASE, params=params(setup), json={**sized, "sku_id": plan["sku_id"], "no_of_nodes": 1}
        )
        assert r.status_code == 201, r.json()
        assert r.json()["data"]["plan"]["sku_id"] == plan["sku_id"]
        assert_error(
            c.post(BASE, params=params(setup), json={**sized, "sku_id": 99999}),
            400,
            "VALIDATION_ERROR",
            "sku_id",
        )


def test_scope_misuse_never_leaks(tsrv: LiveServer, setup: dict[str, Any]) -> None:
    ctx = tsrv.server.ctx
    with ctx.transaction() as s:
        user, account, project = create_account(s, email="b@example.com", name="b")
        other_key = issue_key(
            s, user_id=user.id, account_id=account.id, name="k", scope=Scope.WRITE
        ).key
        other_project = project.id
        admin_member = s.scalar(select(Member).where(Member.account_id != account.id))
        assert admin_member is not None
        admin_membership = admin_member.id
        # b becomes a member of the admin's account: active_iam = that membership.
        shared = Member(account_id=admin_member.account_id, user_id=user.id, role="member")
        s.add(shared)
        s.flush()
        shared_id = shared.id
    with tsrv.client() as c:
        cluster = c.post(BASE, params=params(setup), json=body(setup, no_of_nodes=1)).json()["data"]
    with tsrv.client(other_key) as c:
        # The admin's project and cluster do not exist for b.
        assert_error(c.get(BASE, params=params(setup)), 404, "PROJECT_NOT_FOUND")
        assert_error(
            c.get(
                f"{BASE}{cluster['id']}/", params={"project_id": other_project, "location": "local"}
            ),
            404,
            "TRAINING_CLUSTER_NOT_FOUND",
        )
        # A membership that is not b's: 403.
        assert_error(
            c.get(BASE, params=params(setup, active_iam=admin_membership)), 403, "FORBIDDEN"
        )
        assert_error(
            c.get(BASE, params=params(setup, active_iam="x")), 400, "VALIDATION_ERROR", "active_iam"
        )
        # b's real membership of the admin's account: sees the admin's cluster.
        shared_view = c.get(f"{BASE}{cluster['id']}/", params=params(setup, active_iam=shared_id))
        assert shared_view.status_code == 200 and shared_view.json()["data"]["id"] == cluster["id"]
    r = httpx.get(f"{tsrv.url}{BASE}", params=params(setup), verify=trusted_tls())
    assert_error(r, 401, "UNAUTHORIZED")
    r = httpx.get(f"{tsrv.url}{BASE}", params=params(setup, apikey="nope"), verify=trusted_tls())
    assert_error(r, 401, "UNAUTHORIZED")
    # Without a key nothing about the request is judged: a malformed body is still 401.
    r = httpx.post(
        f"{tsrv.url}{BASE}", params=params(setup), content=b"{nope", verify=trusted_tls()
    )
    assert_error(r, 401, "UNAUTHORIZED")
    r = httpx.put(f"{tsrv.url}{BASE}1/", params=params(setup), content=b"[1]", verify=trusted_tls())
    assert_error(r, 401, "UNAUTHORIZED")


def test_a_suspension_stops_training_clusters_and_refuses_new_ones(
    tsrv: LiveServer, setup: dict[str, Any]
) -> None:
    with tsrv.client() as c:
        cluster = c.post(BASE, params=params(setup), json=body(setup)).json()["data"]
        url = f"{BASE}{cluster['id']}/"
        set_status(tsrv, cluster["id"], "running")
        assert allocated_gpus(tsrv) == 2
        accounts = c.get("/v1/accounts").json()["data"]
        aid = (accounts if isinstance(accounts, list) else accounts["accounts"])[0]["id"]
        r = c.patch(f"/v1/accounts/{aid}", json={"status": "suspended", "reason": "audit"})
        assert r.status_code == 200, r.text

        # Billing ends at once; the GPUs stay held until the nodes are gone.
        got = c.get(url, params=params(setup)).json()["data"]
        assert got["status"] == "stopping" and got["status_reason"] == "account suspended: audit"
        # Only the auto-termination policy may change while it stops.
        assert got["allowed_actions"] == ["update_auto_terminate"]
        assert allocated_gpus(tsrv) == 2
        assert_error(c.post(BASE, params=params(setup), json=body(setup)), 403, "ACCOUNT_SUSPENDED")
        # No operator runs here: what it does once the nodes are removed.
        with tsrv.server.ctx.read() as session:
            row = session.get(TrainingCluster, cluster["id"])
            assert row is not None and row.operation is not None
            token = row.operation["token"]
        assert training_stops.finish_stop(tsrv.server.ctx, cluster["id"], token)
        got = c.get(url, params=params(setup)).json()["data"]
        assert got["status"] == "stopped"
        assert got["allowed_actions"] == ["restart_cluster", "update_auto_terminate"]
        assert got["price_per_hour"] == 0
        r = c.put(url, params=params(setup), json={"action": "restart_cluster"})
        assert_error(r, 403, "ACCOUNT_SUSPENDED")
        assert allocated_gpus(tsrv) == 0

        assert c.patch(f"/v1/accounts/{aid}", json={"status": "active"}).status_code == 200
        r = c.put(url, params=params(setup), json={"action": "restart_cluster"})
        assert r.status_code in (200, 202), r.text
        got = c.get(url, params=params(setup)).json()["data"]
        assert got["status"] == "restarting" and allocated_gpus(tsrv) == 2


def test_actions_validate_and_apply(tsrv: LiveServer, setup: dict[str, Any]) -> None:
    with tsrv.client() as c:
        cluster = c.post(BASE, params=params(setup), json=body(setup, no_of_nodes=1)).json()["data"]
        url = f"{BASE}{cluster['id']}/"
        # Creating: only a delete is possible.
        r = c.put(url, params=params(setup), json={"action": "restart_workers"})
        assert_error(r, 409, "INVALID_STATE")
        assert "creating" in r.json()["message"]
        set_status(tsrv, cluster["id"], "running")

        assert_error(c.put(url, params=params(setup), json={}), 400, "VALIDATION_ERROR", "action")
        assert_error(
            c.put(url, params=params(setup), json={"action": "explode"}),
            400,
            "VALIDATION_ERROR",
            "action",
        )
        for action, field in (
            ("update_ssh_keys", "ssh_key_ids"),
            ("update_image", "image_version_id"),
            ("scale_cluster", "additional_nodes"),
            ("attach_ip", "reserved_ip_id"),
            ("add_security_group", "security_groups_ids"),
            ("remove_security_group", "security_group_id"),
        ):
            r = c.put(url, params=params(setup), json={"action": action})
            assert_error(r, 400, "VALIDATION_ERROR", field)
        assert_error(
            c.put(url, params=params(setup), json={"action": "detach_ip", "reserved_ip_id": 1}),
            400,
            "VALIDATION_ERROR",
            "ip_type",
        )
        assert_error(
            c.put(url, params=params(setup), json={"action": "restart_workers", "force": True}),
            400,
            "VALIDATION_ERROR",
            "force",
        )
        assert_error(
            c.put(f"{BASE}abc/", params=params(setup), json={"action": "restart_workers"}),
            400,
            "VALIDATION_ERROR",
            "Cluster_Id",
        )
        assert_error(
            c.put(f"{BASE}99999/", params=params(setup), json={"action": "restart_workers"}),
            404,
            "TRAINING_CLUSTER_NOT_FOUND",
        )

        # scale_cluster: 4 GPUs, 1 used; 4 more do not fit and nothing is added.
        r = c.put(
            url, params=params(setup), json={"action": "scale_cluster", "additional_nodes": 4}
        )
        assert_error(r, 409, "INSUFFICIENT_CAPACITY")
        assert r.json()["errors"]["details"]["available"][0]["gpus"][A] == 3
        assert "nothing was added" in r.json()["message"]
        assert allocated_gpus(tsrv) == 1
        assert_error(
            c.put(
                url, params=params(setup), json={"action": "scale_cluster", "additional_nodes": 0}
            ),
            400,
            "VALIDATION_ERROR",
            "additional_nodes",
        )
        r = c.put(
            url, params=params(setup), json={"action": "scale_cluster", "additional_nodes": 2}
        )
        assert r.status_code == 200, r.json()
        scaled = r.json()["data"]
        assert scaled["status"] == "scaling" and scaled["no_of_nodes"] == 3
        assert allocated_gpus(tsrv) == 3
        set_status(tsrv, cluster["id"], "running")

        # Reserved IPs: attach answers the Reserved IP object, detach an empty object.
        ip = c.post("/v1/reserved-ips", params={"project_id": setup["project_id"]}).json()["data"]
        r = c.put(
            url, params=params(setup), json={"action": "attach_ip", "reserved_ip_id": ip["id"]}
        )
        assert r.status_code == 200, r.json()
        attached = r.json()["data"]
        assert attached["id"] == ip["id"] and attached["address"] == ip["address"]
        assert attached["status"] == "attached" and attached["training_cluster_id"] == cluster["id"]
        assert c.delete(f"/v1/reserved-ips/{ip['id']}").status_code == 409
        shown = c.get(url, params=params(setup)).json()["data"]
        assert shown["reserved_ips"] == [{"id": ip["id"], "address": ip["address"]}]
        assert_error(
            c.put(
                url,
                params=params(setup),
                json={"action": "detach_ip", "reserved_ip_id": ip["id"], "ip_type": "x"},
            ),
            400,
            "VALIDATION_ERROR",
            "ip_type",
        )
        r = c.put(
            url,
            params=params(setup),
            json={"action": "detach_ip", "reserved_ip_id": ip["id"], "ip_type": "public"},
        )
        assert r.status_code == 200 and r.json()["data"] == {}
        assert_error(
            c.put(
                url,
                params=params(setup),
                json={"action": "detach_ip", "reserved_ip_id": ip["id"], "ip_type": "public"},
            ),
            400,
            "VALIDATION_ERROR",
            "reserved_ip_id",
        )

        # Security groups: a success string each way.
        group = c.post(
            "/v1/security-groups",
            json={
                "name": "ssh",
                "rules": [{"protocol": "tcp", "port_range": "22", "source_cidr": "127.0.0.2/32"}],
            },
        ).json()["data"]
        r = c.put(
            url,
            params=params(setup),
            json={"action": "add_security_group", "security_groups_ids": [group["id"]]},
        )
        assert r.status_code == 200 and isinstance(r.json()["data"], str)
        assert c.get(url, params=params(setup)).json()["data"]["security_groups"] == [
            {"id": group["id"], "name": "ssh"}
        ]
        assert c.delete(f"/v1/security-groups/{group['id']}").status_code == 409
        assert_error(
            c.put(
                url,
                params=params(setup),
                json={"action": "add_security_group", "security_groups_ids": [9999]},
            ),
            400,
            "VALIDATION_ERROR",
            "security_groups_ids",
        )
        r = c.put(
            url,
            params=params(setup),
            json={"action": "remove_security_group", "security_group_id": group["id"]},
        )
        assert r.status_code == 200 and isinstance(r.json()["data"], str)
        assert_error(
            c.put(
                url,
                params=params(setup),
                json={"action": "remove_security_group", "security_group_id": group["id"]},
            ),
            400,
            "VALIDATION_ERROR",
            "security_group_id",
        )

        # Long actions move the cluster to a transitional status.
        for action, extra, status in (
            ("restart_workers", {}, "restarting"),
            ("restart_cluster", {}, "restarting"),
            ("update_ssh_keys", {"ssh_key_ids": [setup["key_id"]]}, "updating"),
            ("update_image", {"image_version_id": setup["image_id"]}, "updating"),
        ):
            r = c.put(url, params=params(setup), json={"action": action, **extra})
            assert r.status_code == 200 and r.json()["data"]["status"] == status, r.json()
            again = c.put(url, params=params(setup), json={"action": action, **extra})
            assert_error(again, 409, "INVALID_STATE")
            set_status(tsrv, cluster["id"], "running")


def test_cli_training_commands(tsrv: LiveServer, setup: dict[str, Any]) -> None:
    from click.testing import CliRunner

    from gpuyard.cli.main import cli

    env = {"GPUYARD_URL": tsrv.url, "GPUYARD_API_KEY": tsrv.key}
    runner = CliRunner()
    scope = ["--project-id", str(setup["project_id"])]

    def run(*args: str) -> Any:
        result = runner.invoke(cli, list(args), env=env)
        return result

    created = run(
        "--json", "training", "create", *scope, "--name", "cli",
        "--image-version-id", str(setup["image_id"]), "--ssh-key-id", str(setup["key_id"]),
        "--nodes", "1", "--gpu-type", A, "--gpus-per-node", "1", "--cpus-per-node", "2",
        "--memory-gb-per-node", "4",
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    cid = json.loads(created.output)["id"]
    listed = run("training", "list", *scope)
    assert listed.exit_code == 0 and "cli" in listed.output and "creating" in listed.output
    shown = run("training", "get", *scope, str(cid))
    prefix = tsrv.server.ctx.ownership.training_prefix(cid)
    assert shown.exit_code == 0 and f"{prefix}-controller" in shown.output
    assert "LIFECYCLE" in shown.output
    refused = run("training", "action", *scope, str(cid), "restart_workers")
    assert refused.exit_code == 1 and "INVALID_STATE" in refused.output
    set_status(tsrv, cid, "running")
    missing = run("training", "action", *scope, str(cid), "scale_cluster")
    assert missing.exit_code == 1 and "additional_nodes" in missing.output
    scaled = run(
        "--json", "training", "action", *scope, str(cid), "scale_cluster", "--additional-nodes", "1"
    )
    assert scaled.exit_code == 0 and json.loads(scaled.output)["no_of_nodes"] == 2
    history = run("training", "events", *scope, str(cid))
    assert history.exit_code == 0, history.output
    assert "- -> creating" in history.output and "running -> scaling" in history.output
    deleted = run("training", "delete", *scope, str(cid))
    assert deleted.exit_code == 0 and str(cid) in deleted.output
    gone = run("training", "get", "--project-id", "99999", str(cid))
    assert gone.exit_code == 1 and "PROJECT_NOT_FOUND" in gone.output


def test_another_projects_reserved_ip_is_not_found_on_attach_and_detach(
    tsrv: LiveServer, setup: dict[str, Any]
) -> None:
    with tsrv.client() as c:
        cluster = c.post(BASE, params=params(setup), json=body(setup, no_of_nodes=1)).json()["data"]
        set_status(tsrv, cluster["id"], "running")
        url = f"{BASE}{cluster['id']}/"
        other = c.post("/v1/projects", json={"name": "other"}).json()["data"]["id"]
        theirs = c.post("/v1/reserved-ips", params={"project_id": other}).json()["data"]
        missing = 999_999
        for action, extra in (("attach_ip", {}), ("detach_ip", {"ip_type": "public"})):
            answers = []
            for ip_id in (theirs["id"], missing):
                r = c.put(
                    url,
                    params=params(setup),
                    json={"action": action, "reserved_ip_id": ip_id, **extra},
                )
                assert_error(r, 400, "VALIDATION_ERROR", "reserved_ip_id")
                # Neither the address nor that the id exists is told.
                assert theirs["address"] not in r.text
                answers.append(
                    r.json()["message"].replace(f"reserved IP {ip_id} ", "reserved IP N ")
                )
            assert answers[0] == answers[1], answers
        shown = c.get(f"/v1/reserved-ips/{theirs['id']}", params={"project_id": other})
        assert shown.json()["data"]["status"] == "reserved"
