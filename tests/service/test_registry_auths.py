"""Private registry credentials on a real database: created, listed and deleted per
account, the password sealed at rest and given to the engine's pull only, and
another account's credentials never usable or removable."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import select

from gpuyard.core.errors import Forbidden, ValidationFailed
from gpuyard.core.secret_env import is_sealed
from gpuyard.reconciler.loop import Reconciler
from gpuyard.runtimes.engines.pull_errors import CREDENTIALS_NEEDED
from gpuyard.runtimes.records import RegistryCredentials
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.actions import terminate_cluster
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy import registry_auths as ra
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.store.schema import AuditEvent, Cluster, RegistryAuth
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.conftest import new_principal

PASSWORD = "registry-pass-" + "q" * 10
IMAGE = "ghcr.io/team/private:1"


def settle(rec: Reconciler, cluster_id: str) -> None:
    for _ in range(5):
        rec.driver.drive(cluster_id)


def body(**kw: object) -> CreateCluster:
    return CreateCluster.model_validate({"docker_image": IMAGE, "gpu_count": 0, **kw})


def stored_bytes(ctx: Context) -> bytes:
    url = ctx.settings.effective_database_url
    if url.startswith("sqlite"):
        path = Path(url.split("///", 1)[1])
        return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())
    with ctx.read() as s:
        return "\n".join(s.scalars(select(RegistryAuth.password)).all()).encode()


def test_create_list_delete_and_the_password_is_sealed(ctx: Context, alice: Principal) -> None:
    row = ra.create_registry_auth(ctx, alice, None, " ghcr ", "robot", PASSWORD)
    assert row.name == "ghcr"
    view = ra.registry_auth_view(row)
    assert set(view) == {"id", "name", "created_at"}
    assert PASSWORD not in repr(view)
    with ctx.read() as s:
        stored = s.get(RegistryAuth, row.id)
        assert stored is not None
        assert stored.password != PASSWORD and is_sealed(stored.password)
        audit = s.scalars(select(AuditEvent).where(AuditEvent.target_type == "registry_auth"))
        assert all(PASSWORD not in repr(a.detail) for a in audit)
    assert PASSWORD.encode() not in stored_bytes(ctx)
    assert [r.id for r in ra.list_registry_auths(ctx, alice, None)] == [row.id]
    ra.delete_registry_auth(ctx, alice, None, row.id)
    assert ra.list_registry_auths(ctx, alice, None) == []
    with pytest.raises(ra.RegistryAuthNotFound):
        ra.delete_registry_auth(ctx, alice, None, row.id)


def test_names_are_unique_per_account_and_inputs_checked(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    ra.create_registry_auth(ctx, alice, None, "hub", "u", "p")
    with pytest.raises(ra.RegistryAuthExists):
        ra.create_registry_auth(ctx, alice, None, "hub", "u2", "p2")
    # Another account may use the same name.
    ra.create_registry_auth(ctx, bob, None, "hub", "u", "p")
    for name, user, password, field in [
        ("", "u", "p", "name"),
        ("a\u202eb", "u", "p", "name"),
        ("ok", "", "p", "username"),
        ("ok", "u", "", "password"),
        ("ok", 3, "p", "username"),
        ("x" * 201, "u", "p", "name"),
    ]:
        with pytest.raises(ValidationFailed) as err:
            ra.create_registry_auth(ctx, alice, None, name, user, password)
        assert err.value.field == field


def test_a_read_only_key_may_list_but_not_change(ctx: Context, alice: Principal) -> None:
    reader = new_principal(ctx, "reader@example.com", Scope.READ)
    assert ra.list_registry_auths(ctx, reader, None) == []
    with pytest.raises(Forbidden):
        ra.create_registry_auth(ctx, reader, None, "n", "u", "p")


def test_another_account_can_neither_use_nor_delete_them(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    row = ra.create_registry_auth(ctx, alice, None, "mine", "u", PASSWORD)
    with pytest.raises(ra.RegistryAuthNotFound) as missing:
        ra.delete_registry_auth(ctx, bob, None, row.id)
    with pytest.raises(ra.RegistryAuthNotFound) as unknown:
        ra.delete_registry_auth(ctx, bob, None, 999_999)
    assert missing.value.message.replace(str(row.id), "N") == unknown.value.message.replace(
        "999999", "N"
    )
    with pytest.raises(ValidationFailed) as theirs:
        uc.create_cluster(ctx, bob, body(registry_auth_id=row.id))
    with pytest.raises(ValidationFailed) as nothing:
        uc.create_cluster(ctx, bob, body(registry_auth_id=999_999))
    assert theirs.value.field == nothing.value.field == "registry_auth_id"
    assert theirs.value.message.replace(str(row.id), "N") == nothing.value.message.replace(
        "999999", "N"
    )
    assert ra.list_registry_auths(ctx, bob, None) == []
    assert [r.id for r in ra.list_registry_auths(ctx, alice, None)] == [row.id]
    # Out-of-range ids read as unknown, never a database error.
    with pytest.raises(ra.RegistryAuthNotFound):
        ra.delete_registry_auth(ctx, alice, None, 2**40)


def test_the_pull_gets_the_credentials_and_fails_clearly_without(
    ctx: Context,
    alice: Principal,
    rec: Reconciler,
    runtime: FakeRuntime,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    runtime.private_images[IMAGE] = RegistryCredentials("robot", PASSWORD)
    anonymous = uc.create_cluster(ctx, alice, body())
    settle(rec, anonymous.id)
    with ctx.read() as s:
        failed = s.get(Cluster, anonymous.id)
        assert failed is not None
        assert failed.status == "error"
        assert CREDENTIALS_NEEDED in (failed.status_reason or "")
    auth = ra.create_registry_auth(ctx, alice, None, "private", "robot", PASSWORD)
    good = uc.create_cluster(ctx, alice, body(registry_auth_id=auth.id))
    settle(rec, good.id)
    with ctx.read() as s:
        running = s.get(Cluster, good.id)
        assert running is not None and running.status == "running"
        assert running.registry_auth_id == auth.id
    assert (IMAGE, RegistryCredentials("robot", PASSWORD)) in runtime.pull_credentials
    assert PASSWORD not in caplog.text
    assert PASSWORD not in repr(RegistryCredentials("robot", PASSWORD))
    with ctx.read() as s:
        events = repr(s.scalars(select(AuditEvent)).all())
    assert PASSWORD not in events


def test_credentials_in_use_are_kept_and_deleted_ones_pull_anonymously(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    auth = ra.create_registry_auth(ctx, alice, None, "gone", "robot", PASSWORD)
    c = uc.create_cluster(ctx, alice, body(registry_auth_id=auth.id))
    assert ra.pull_credentials(ctx, c.project_id, auth.id) == RegistryCredentials("robot", PASSWORD)
    with pytest.raises(ra.RegistryAuthInUse) as refused:
        ra.delete_registry_auth(ctx, alice, None, auth.id)
    assert refused.value.details["cluster_ids"] == [c.id]
    terminate_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    ra.delete_registry_auth(ctx, alice, None, auth.id)
    assert ra.pull_credentials(ctx, c.project_id, auth.id) is None
    assert ra.pull_credentials(ctx, c.project_id, None) is None


def test_a_private_image_on_the_host_is_not_another_accounts(
    ctx: Context, alice: Principal, bob: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    runtime.private_images[IMAGE] = RegistryCredentials("robot", PASSWORD)
    auth = ra.create_registry_auth(ctx, alice, None, "private", "robot", PASSWORD)
    mine = uc.create_cluster(ctx, alice, body(registry_auth_id=auth.id))
    settle(rec, mine.id)
    assert IMAGE in runtime.images
    theirs = uc.create_cluster(ctx, bob, body())
    settle(rec, theirs.id)
    with ctx.read() as s:
        row = s.get(Cluster, theirs.id)
        assert row is not None and row.status == "error"
        assert CREDENTIALS_NEEDED in (row.status_reason or "")
    assert runtime.pull_credentials[-1] == (IMAGE, None)


def test_ids_of_deleted_credentials_are_not_reused(ctx: Context, alice: Principal) -> None:
    first = ra.create_registry_auth(ctx, alice, None, "a", "u", "p")
    ra.delete_registry_auth(ctx, alice, None, first.id)
    second = ra.create_registry_auth(ctx, alice, None, "b", "u", "p")
    assert second.id > first.id


def test_update_replaces_the_credentials_of_the_own_account_only(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    auth = ra.create_registry_auth(ctx, alice, None, "upd", "robot", PASSWORD)
    c = uc.create_cluster(ctx, alice, body(registry_auth_id=auth.id))
    with pytest.raises(ra.RegistryAuthNotFound):
        ra.update_registry_auth(ctx, bob, None, auth.id, "x", "y")
    ra.update_registry_auth(ctx, alice, None, auth.id, "robot2", "new-" + PASSWORD)
    assert ra.pull_credentials(ctx, c.project_id, auth.id) == RegistryCredentials(
        "robot2", "new-" + PASSWORD
    )
    with ctx.read() as s:
        stored = s.get(RegistryAuth, auth.id)
        assert stored is not None and is_sealed(stored.password)
