"""Quota routes over real HTTP: who may set what, validation, the answers' shapes, and
creates (REST and GraphQL) refused with 403 QUOTA_EXCEEDED and its details."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from gpuyard.api.rest.schemas import quotas as qs
from gpuyard.cli.main import cli
from gpuyard.services.tenancy.auth import default_project_id
from gpuyard.store.schema import AuditEvent
from tests.helpers import LiveServer, account_with_members, v1_error

A6000 = "NVIDIA RTX A6000"


def test_set_and_show_permissions(srv: LiveServer) -> None:
    acct, project, keys = account_with_members(srv, "q@example.com", ("admin", "member"))
    other, _, other_keys = account_with_members(srv, "other@example.com", ("admin", "member"))
    op = srv.client()
    owner, admin = srv.client(keys["owner"]), srv.client(keys["admin"])
    member, stranger = srv.client(keys["member"]), srv.client(other_keys["owner"])
    base = f"/v1/accounts/{acct}"

    # The account's limits: the operator only.
    r = op.put(f"{base}/quotas", json={"gpus": 4, "gpus_by_type": {A6000: 2}, "vcpus": 32})
    assert r.status_code == 200, r.text
    done = qs.QuotasSetEnvelope.model_validate(r.json()).data
    assert done.project_id is None and done.limits.gpus == 4
    assert done.limits.gpus_by_type == {A6000: 2} and done.limits.volume_gb is None
    v1_error(owner.put(f"{base}/quotas", json={"gpus": 100}), 403, "FORBIDDEN")
    v1_error(member.put(f"{base}/quotas", json={"gpus": 100}), 403, "FORBIDDEN")
    v1_error(stranger.put(f"{base}/quotas", json={"gpus": 1}), 404, "NOT_FOUND")

    # A project's: the operator, the owner and admins, within the account's limits.
    path = f"{base}/projects/{project}/quotas"
    r = admin.put(path, json={"running_clusters": 2, "vcpus": 16})
    assert r.status_code == 200, r.text
    assert qs.QuotasSetEnvelope.model_validate(r.json()).data.project_id == project
    assert owner.put(path, json={"vcpus": 20}).status_code == 200
    assert op.put(path, json={"vcpus": 24}).status_code == 200
    v1_error(member.put(path, json={"vcpus": 1}), 403, "FORBIDDEN")
    v1_error(stranger.put(path, json={"vcpus": 1}), 404, "NOT_FOUND")
    over = v1_error(owner.put(path, json={"vcpus": 33}), 400, "VALIDATION_ERROR")
    assert over["details"]["field"] == "vcpus" and over["details"]["account_limit"] == 32
    # A project of another account is not this account's.
    with srv.server.ctx.read() as s:
        foreign = default_project_id(s, other)
    missing = op.put(f"{base}/projects/{foreign}/quotas", json={"vcpus": 1})
    v1_error(missing, 404, "PROJECT_NOT_FOUND")

    # Bad values are 400s naming the field.
    for body, field in (
        ({"gpus": -1}, "gpus"),
        ({"vcpus": 10**12}, "vcpus"),
        ({"volume_gb": "10"}, "volume_gb"),
        ({"gpus_by_type": {"TPU v9": 1}}, "gpus_by_type.TPU v9"),
        ({"bogus": 1}, "bogus"),
    ):
        err = v1_error(op.put(f"{base}/quotas", json=body), 400, "VALIDATION_ERROR")
        assert field in err["details"]["field"], err

    # Any member reads them; strangers get 404.
    for who in (op, owner, admin, member):
        r = who.get(f"{base}/quotas")
        assert r.status_code == 200, r.text
        shown = qs.AccountQuotasEnvelope.model_validate(r.json()).data
        assert shown.account.limits.vcpus == 32 and shown.account.usage.gpus == 0
        assert shown.projects[0].project_id == project
        assert shown.projects[0].limits.vcpus == 24
    v1_error(stranger.get(f"{base}/quotas"), 404, "NOT_FOUND")

    # null removes, absent keeps.
    r = op.put(f"{base}/quotas", json={"gpus": None})
    limits = qs.QuotasSetEnvelope.model_validate(r.json()).data.limits
    assert limits.gpus is None and limits.vcpus == 32 and limits.gpus_by_type == {A6000: 2}
    with srv.server.ctx.read() as s:
        audited = s.query(AuditEvent).filter(AuditEvent.action == "quota.set").count()
    assert audited == 5


def test_create_over_quota_is_403_with_details(srv: LiveServer) -> None:
    acct, project, keys = account_with_members(srv, "full@example.com", ("admin", "member"))
    op, owner = srv.client(), srv.client(keys["owner"])
    assert op.put(f"/v1/accounts/{acct}/quotas", json={"gpus": 2}).status_code == 200
    body = {"gpu_type": A6000, "gpu_count": 2, "docker_image": "img", "cpu_cores": 2}
    r = owner.post("/v1/clusters", json=body)
    assert r.status_code == 201, r.text
    refused = v1_error(
        owner.post("/v1/clusters", json={**body, "gpu_count": 1}), 403, "QUOTA_EXCEEDED"
    )
    assert refused["details"] == {
        "resource": "gpus",
        "scope": "account",
        "account_id": acct,
        "project_id": None,
        "gpu_type": None,
        "limit": 2,
        "in_use": 2,
        "asked": 1,
    }
    shown = qs.AccountQuotasEnvelope.model_validate(owner.get(f"/v1/accounts/{acct}/quotas").json())
    assert shown.data.account.usage.gpus == 2
    assert shown.data.account.usage.gpus_by_type == {A6000: 2}
    assert shown.data.account.usage.running_clusters == 1
    assert shown.data.projects[0].usage.vcpus == 2

    # GraphQL deploys go through the same check.
    answer = srv.graphql(
        'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
        'gpuCount: 1, imageName: "img"}) { id } }',
        key=keys["owner"],
    )
    error_ = answer["errors"][0]["extensions"]
    assert error_["code"] == "QUOTA_EXCEEDED" and error_["details"]["limit"] == 2
    del project


def run_cli(srv: LiveServer, *args: str, key: str | None = None) -> Result:
    env = {
        "GPUYARD_URL": srv.url,
        "GPUYARD_API_KEY": key or srv.key,
        "GPUYARD_HOME": str(srv.server.ctx.settings.home),
    }
    return CliRunner().invoke(cli, list(args), env=env)


def test_cli_show_and_set(srv: LiveServer) -> None:
    acct, project, keys = account_with_members(srv, "cli@example.com", ("admin", "member"))
    done = run_cli(
        srv,
        "quotas",
        "set",
        str(acct),
        "--gpus",
        "8",
        "--gpu-type",
        f"{A6000}=4",
        "--vcpus",
        "64",
        "--volume-gb",
        "500",
    )
    assert done.exit_code == 0, done.output
    assert "gpus[NVIDIA RTX A6000]" in done.output
    shown = run_cli(srv, "quotas", "show", str(acct), "--json", key=keys["member"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["account"]["limits"]["gpus_by_type"] == {A6000: 4}
    assert data["account"]["limits"]["volume_gb"] == 500
    # A project's, as the owner; 'none' removes a limit.
    r = run_cli(srv, "quotas", "set", str(acct), "--project", str(project), "--vcpus", "8",
                key=keys["owner"])  # fmt: skip
    assert r.exit_code == 0, r.output
    r = run_cli(srv, "quotas", "set", str(acct), "--gpus", "none", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["limits"]["gpus"] is None
    table = run_cli(srv, "quotas", "show", str(acct))
    assert f"project {project} (default)" in table.output and "volume_gb" in table.output
    # Refusals come back as the API's errors; bad input as usage errors.
    denied = run_cli(srv, "quotas", "set", str(acct), "--gpus", "1", key=keys["owner"])
    assert denied.exit_code != 0 and "FORBIDDEN" in denied.output
    bad = run_cli(srv, "quotas", "set", str(acct), "--gpus", "-3")
    assert bad.exit_code == 2 and "--gpus" in bad.output
    nothing = run_cli(srv, "quotas", "set", str(acct))
    assert nothing.exit_code == 2
