"""Secret env values and munge keys on a real database (SQLite and PostgreSQL): stored
sealed, handed to the runtime in plaintext, a mask sent back keeps them, and rows an
older version stored in clear are sealed at start."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from sqlalchemy import select, text, update

from gpuyard.core.secret_env import MASK, is_sealed
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import first_start
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.secrets import SecretBox, SecretUnreadable, secret_box
from gpuyard.services.training import use_cases as training
from gpuyard.store.schema import Cluster, ImageVersion, Installation, TrainingCluster
from gpuyard.testing.fake_runtime import FakeRuntime

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGe4tciPtcKsqalQ5MYQNCKBAGbS1rO94qvBwyD7hpHy k1"
PASSWORD = "hunter2-" + "x" * 8
HUB = "hf-hub-value-1234"


def body(**kw: object) -> CreateCluster:
    return CreateCluster.model_validate({"docker_image": "img", "gpu_count": 0, **kw})


def settle(rec: Reconciler, cluster_id: str) -> None:
    for _ in range(5):
        rec.driver.drive(cluster_id)


def stored_bytes(ctx: Context) -> bytes:
    """Everything the database holds that a reader of its files could see: the SQLite
    file and its WAL, or (PostgreSQL) the env and munge key columns as text."""
    url = ctx.settings.effective_database_url
    if url.startswith("sqlite"):
        path = Path(url.split("///", 1)[1])
        return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())
    with ctx.read() as s:
        envs = s.execute(text("SELECT CAST(env AS TEXT) FROM clusters")).scalars().all()
        keys = s.execute(text("SELECT munge_key FROM training_clusters")).scalars().all()
    return "\n".join([*envs, *keys]).encode()


def stored_env(ctx: Context, cluster_id: str) -> dict[str, str]:
    with ctx.read() as s:
        row = s.get(Cluster, cluster_id)
        assert row is not None
        return dict(row.env)


def test_secret_values_are_sealed_at_rest_and_plain_in_the_container(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(
        ctx,
        alice,
        body(
            env={
                "DB_PASSWORD": PASSWORD,
                "HF_HUB": {"value": HUB, "secret": True},
                "PLAIN": "visible-value",
            }
        ),
    )
    settle(rec, c.id)
    env = runtime.containers[c.id].spec.env
    assert env["DB_PASSWORD"] == PASSWORD and env["HF_HUB"] == HUB
    assert env["PLAIN"] == "visible-value"
    raw = stored_bytes(ctx)
    assert PASSWORD.encode() not in raw and HUB.encode() not in raw
    assert b"visible-value" in raw  # the check can see what is stored in clear
    stored = stored_env(ctx, c.id)
    assert is_sealed(stored["DB_PASSWORD"]) and is_sealed(stored["HF_HUB"])
    assert stored["PLAIN"] == "visible-value"


def test_the_mask_sent_back_keeps_secrets_and_secrets_stay_secret(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(
        ctx,
        alice,
        body(env={"DB_PASSWORD": PASSWORD, "HF_HUB": {"value": HUB, "secret": True}}),
    )
    settle(rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    # A read-modify-write client sends every variable back as it read it (masked).
    update_body = StartCluster.model_validate(
        {"environment_updates": {"DB_PASSWORD": MASK, "HF_HUB": MASK, "NEW": "n"}}
    )
    uc.start_cluster(ctx, alice, c.id, update_body)
    settle(rec, c.id)
    env = runtime.containers[c.id].spec.env
    assert (env["DB_PASSWORD"], env["HF_HUB"], env["NEW"]) == (PASSWORD, HUB, "n")
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    # A new plain value of a variable marked secret stays secret.
    uc.start_cluster(
        ctx, alice, c.id, StartCluster.model_validate({"environment_updates": {"HF_HUB": "v2"}})
    )
    settle(rec, c.id)
    assert runtime.containers[c.id].spec.env["HF_HUB"] == "v2"
    assert is_sealed(stored_env(ctx, c.id)["HF_HUB"])
    assert b'v2"' not in stored_bytes(ctx)


def as_before_sealing(ctx: Context) -> None:
    """Make the database look like one from before sealed secrets: the start-up pass
    has never run on it."""
    with ctx.transaction() as s:
        s.execute(update(Installation).values(secrets_sealed_at=None))


def test_plaintext_rows_from_before_are_sealed_at_start(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, body(env={"PLAIN": "p"}))
    with ctx.transaction() as s:  # what an older version stored
        s.execute(
            update(Cluster)
            .where(Cluster.id == c.id)
            .values(env={"PLAIN": "p", "API_TOKEN": "old-token-value"})
        )
    first_start(ctx)  # the pass ran at the fixture's start: not again
    assert stored_env(ctx, c.id)["API_TOKEN"] == "old-token-value"
    as_before_sealing(ctx)
    first_start(ctx)
    stored = stored_env(ctx, c.id)
    assert is_sealed(stored["API_TOKEN"]) and stored["PLAIN"] == "p"
    assert b"old-token-value" not in stored_bytes(ctx)
    settle(rec, c.id)
    assert runtime.containers[c.id].spec.env["API_TOKEN"] == "old-token-value"


def test_a_value_that_looks_sealed_is_kept_literally(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    # Otherwise a tenant could have us "open" a token copied from elsewhere.
    other = secret_box(ctx.settings).seal("someone-else's")
    c = uc.create_cluster(ctx, alice, body(env={"PLAIN": other}))
    settle(rec, c.id)
    assert runtime.containers[c.id].spec.env["PLAIN"] == other


def test_a_lost_key_fails_the_start_with_a_message(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    c = uc.create_cluster(ctx, alice, body(env={"PLAIN": "p"}))
    foreign = SecretBox(base64.urlsafe_b64encode(b"k" * 32)).seal("x")
    with ctx.transaction() as s:
        s.execute(update(Cluster).where(Cluster.id == c.id).values(env={"DB_PASSWORD": foreign}))
    settle(rec, c.id)
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.status == "error"
    assert "secret" in (got.error_message or "") and foreign not in (got.error_message or "")


def _training_cluster(ctx: Context, alice: Principal) -> int:
    with ctx.transaction() as s:
        image = s.scalar(select(ImageVersion.id).order_by(ImageVersion.id))
        key = add_key(s, alice.account_id, "k1", SSH_KEY).id
    return training.create_cluster(
        ctx,
        alice,
        training.Scope(project_id=alice.default_project_id, location="local"),
        {
            "name": "t",
            "image_version_id": image,
            "ssh_key_ids": [key],
            "no_of_nodes": 1,
            "gpu_type": "NVIDIA RTX A6000",
            "gpus_per_node": 1,
            "cpus_per_node": 2,
            "memory_gb_per_node": 4,
        },
    )


def test_munge_keys_are_sealed_at_rest(ctx: Context, alice: Principal) -> None:
    cid = _training_cluster(ctx, alice)
    with ctx.read() as s:
        stored = s.scalar(select(TrainingCluster.munge_key).where(TrainingCluster.id == cid))
    assert stored is not None and is_sealed(stored)
    key = secret_box(ctx.settings).open(stored)
    assert len(base64.b64decode(key)) == 1024
    assert key.encode() not in stored_bytes(ctx)
    # An older version's plaintext key is sealed at start and opens to the same key.
    with ctx.transaction() as s:
        s.execute(update(TrainingCluster).where(TrainingCluster.id == cid).values(munge_key=key))
    as_before_sealing(ctx)
    first_start(ctx)
    with ctx.read() as s:
        resealed = s.scalar(select(TrainingCluster.munge_key).where(TrainingCluster.id == cid))
    assert resealed is not None and is_sealed(resealed)
    assert secret_box(ctx.settings).open(resealed) == key


def test_open_refuses_a_foreign_token(ctx: Context) -> None:
    foreign = SecretBox(base64.urlsafe_b64encode(b"z" * 32)).seal("x")
    with pytest.raises(SecretUnreadable):
        secret_box(ctx.settings).open(foreign)
    assert json.dumps(secret_box(ctx.settings).open("plain")) == '"plain"'
