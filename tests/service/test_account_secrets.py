"""Account secrets on a real database (SQLite and PostgreSQL): their use cases, sealed
at rest, resolved into the container's env at each start (a changed value at the
next start), never another account's, refused at create and start when missing, and
a start whose secret went away fails with an event naming it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select, text

from gpuyard.core.errors import Forbidden, ValidationFailed
from gpuyard.core.secret_env import is_sealed
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy import account_secrets as secrets
from gpuyard.services.tenancy.audit import AuditQuery, audit_view, list_audit
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.store.schema import AccountSecret, Cluster
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.conftest import new_principal

VALUE = "s3cr3t-svc-7f1c9e"
NEW_VALUE = "s3cr3t-svc-rotated-2b8d"
REF = "{{ RUNPOD_SECRET_token }}"


def body(**kw: object) -> CreateCluster:
    return CreateCluster.model_validate({"docker_image": "img", "gpu_count": 0, **kw})


def settle(rec: Reconciler, cluster_id: str) -> None:
    for _ in range(5):
        rec.driver.drive(cluster_id)


def stored_bytes(ctx: Context) -> bytes:
    url = ctx.settings.effective_database_url
    if url.startswith("sqlite"):
        path = Path(url.split("///", 1)[1])
        return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())
    with ctx.read() as s:
        values = s.execute(text("SELECT value FROM account_secrets")).scalars().all()
        envs = s.execute(text("SELECT CAST(env AS TEXT) FROM clusters")).scalars().all()
    return "\n".join([*values, *envs]).encode()


def test_crud_seals_the_value_and_answers_never_hold_it(ctx: Context, alice: Principal) -> None:
    row = secrets.create_secret(ctx, alice, "token", VALUE, "the hub token")
    view = secrets.secret_view(row)
    assert set(view) == {"id", "name", "description", "reference", "created_at", "updated_at"}
    assert view["reference"] == REF and VALUE not in str(view)
    with ctx.read() as s:
        stored = s.scalar(select(AccountSecret.value).where(AccountSecret.id == row.id))
    assert stored is not None and is_sealed(stored)
    assert VALUE.encode() not in stored_bytes(ctx)
    assert [r.name for r in secrets.list_secrets(ctx, alice)] == ["token"]
    with pytest.raises(secrets.SecretExists, match="token"):
        secrets.create_secret(ctx, alice, "token", "other")
    with pytest.raises(ValidationFailed) as err:
        secrets.create_secret(ctx, alice, "bad name", "v")
    assert err.value.details["field"] == "name"
    with pytest.raises(ValidationFailed):
        secrets.create_secret(ctx, alice, "empty", "")
    updated = secrets.update_secret(ctx, alice, row.id, NEW_VALUE)
    assert updated.description == "the hub token"
    assert secrets.opened_secrets(ctx, alice.account_id, ["token"]) == {"token": NEW_VALUE}
    secrets.delete_secret(ctx, alice, row.id)
    with pytest.raises(secrets.SecretNotFound):
        secrets.show_secret(ctx, alice, row.id)
    # The audit trail names the secret, never its value.
    with ctx.read() as s:
        trail = [audit_view(e) for e in list_audit(s, alice.account_id, AuditQuery())]
    actions = [e["action"] for e in trail if e["target"]["type"] == "secret"]
    assert sorted(actions) == ["secret.create", "secret.delete", "secret.update"]
    assert VALUE not in str(trail) and NEW_VALUE not in str(trail)


def test_a_read_key_or_a_project_key_may_not_change_secrets(ctx: Context, alice: Principal) -> None:
    row = secrets.create_secret(ctx, alice, "token", VALUE)
    reader = new_principal(ctx, "reader@example.com", Scope.READ)
    with pytest.raises(Forbidden):
        secrets.create_secret(ctx, reader, "other", VALUE)
    # A key restricted to a project: secrets are the whole account's.
    restricted = replace(alice, key_project_id=alice.default_project_id)
    for call in (
        lambda: secrets.create_secret(ctx, restricted, "other", VALUE),
        lambda: secrets.update_secret(ctx, restricted, row.id, "changed"),
        lambda: secrets.delete_secret(ctx, restricted, row.id),
    ):
        with pytest.raises(Forbidden, match="restricted to project"):
            call()
    assert [r.name for r in secrets.list_secrets(ctx, restricted)] == ["token"]


def test_another_accounts_secrets_are_not_found_and_do_not_resolve(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    row = secrets.create_secret(ctx, alice, "token", VALUE)
    for call in (
        lambda: secrets.show_secret(ctx, bob, row.id),
        lambda: secrets.update_secret(ctx, bob, row.id, "stolen"),
        lambda: secrets.delete_secret(ctx, bob, row.id),
    ):
        with pytest.raises(secrets.SecretNotFound):
            call()
    assert secrets.list_secrets(ctx, bob) == []
    # Bob's cluster naming alice's secret is refused, naming it.
    with pytest.raises(ValidationFailed, match="token") as err:
        uc.create_cluster(ctx, bob, body(env={"X": REF}))
    assert err.value.details["missing_secrets"] == ["token"]
    # Bob's own secret of the same name is his.
    secrets.create_secret(ctx, bob, "token", "bobs-value")
    assert secrets.opened_secrets(ctx, bob.account_id, ["token"]) == {"token": "bobs-value"}
    assert secrets.show_secret(ctx, alice, row.id).name == "token"


def test_resolved_at_each_start_and_stored_as_the_reference(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    row = secrets.create_secret(ctx, alice, "token", VALUE)
    env = {"X": REF, "HF_TOKEN": "Bearer {{RUNPOD_SECRET_token}}", "PLAIN": "p"}
    c = uc.create_cluster(ctx, alice, body(env=env))
    settle(rec, c.id)
    got = runtime.containers[c.id].spec.env
    assert (got["X"], got["HF_TOKEN"], got["PLAIN"]) == (VALUE, f"Bearer {VALUE}", "p")
    with ctx.read() as s:
        stored = s.scalar(select(Cluster.env).where(Cluster.id == c.id))
    assert stored == env  # the references, not the value, and not sealed
    assert uc.get_cluster(ctx, alice, c.id).env == env
    # A new value is taken at the next start.
    secrets.update_secret(ctx, alice, row.id, NEW_VALUE)
    assert runtime.containers[c.id].spec.env["X"] == VALUE  # running: unchanged
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    uc.start_cluster(ctx, alice, c.id, StartCluster.model_validate({}))
    settle(rec, c.id)
    assert runtime.containers[c.id].spec.env["X"] == NEW_VALUE
    assert VALUE.encode() not in stored_bytes(ctx)
    assert NEW_VALUE.encode() not in stored_bytes(ctx)


def test_missing_secrets_are_refused_at_create_and_start(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    with pytest.raises(ValidationFailed, match="nothere") as err:
        uc.create_cluster(ctx, alice, body(env={"X": "{{ RUNPOD_SECRET_nothere }}"}))
    assert err.value.details["field"] == "env"
    row = secrets.create_secret(ctx, alice, "token", VALUE)
    c = uc.create_cluster(ctx, alice, body(env={"X": REF}))
    settle(rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    with pytest.raises(ValidationFailed, match="gone") as err:
        update = {"environment_updates": {"Y": "{{ RUNPOD_SECRET_gone }}"}}
        uc.start_cluster(ctx, alice, c.id, StartCluster.model_validate(update))
    assert err.value.details["field"] == "environment_updates"
    secrets.delete_secret(ctx, alice, row.id)
    with pytest.raises(ValidationFailed, match="token") as err:
        uc.start_cluster(ctx, alice, c.id, StartCluster.model_validate({}))
    assert err.value.details["field"] == "env"
    assert uc.get_cluster(ctx, alice, c.id).status == "stopped"


def test_a_restart_without_its_secret_is_refused_and_the_container_kept(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    row = secrets.create_secret(ctx, alice, "token", VALUE)
    c = uc.create_cluster(ctx, alice, body(env={"X": REF}))
    settle(rec, c.id)
    secrets.delete_secret(ctx, alice, row.id)
    with pytest.raises(ValidationFailed, match="token"):
        uc.restart_cluster(ctx, alice, c.id)
    assert uc.get_cluster(ctx, alice, c.id).status == "running"
    assert runtime.containers[c.id].spec.env["X"] == VALUE


def test_a_secret_deleted_before_the_start_fails_it_with_an_event(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    row = secrets.create_secret(ctx, alice, "token", VALUE)
    c = uc.create_cluster(ctx, alice, body(env={"X": REF}))
    secrets.delete_secret(ctx, alice, row.id)  # before the reconciler builds it
    settle(rec, c.id)
    cluster = uc.get_cluster(ctx, alice, c.id)
    assert cluster.status == "error"
    assert c.id not in runtime.containers
    messages = " | ".join(e.message for e in uc.list_events(ctx, alice, c.id))
    assert "'token'" in messages and "no longer has" in messages, messages
    assert VALUE not in messages
