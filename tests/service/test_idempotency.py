"""Idempotent creates (services/idempotency.py) on SQLite and PostgreSQL: a key places
at most once, even when many requests with it race; another body under the key is
refused; keys are per account and route and expire."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import func, select

from gpuyard.core.errors import Forbidden, IdempotencyKeyReused, InsufficientCapacity
from gpuyard.services import idempotency as idem
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.use_cases import create_cluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.services.training import use_cases as training
from gpuyard.store.schema import (
    Cluster,
    GpuAllocation,
    IdempotencyKey,
    ImageVersion,
    TrainingCluster,
)
from tests.conftest import new_principal

A6000 = "NVIDIA RTX A6000"


def body(**extra: Any) -> CreateCluster:
    return CreateCluster.model_validate(
        {"name": "once", "gpu_type": A6000, "gpu_count": 1, "docker_image": "img", **extra}
    )


def create(
    ctx: Context,
    who: Principal,
    key: str | None,
    request: CreateCluster,
    route: str = idem.ROUTE_CLUSTERS,
) -> tuple[str, bool]:
    """What the REST route does: claim, then create at most once."""
    claim = idem.claim_for(ctx, who, route, key, request.model_dump(mode="json"))
    return idem.create_once(
        ctx, claim, lambda c: create_cluster(ctx, who, request, idempotency=c).id
    )


def count(ctx: Context, model: Any, *where: Any) -> int:
    with ctx.read() as session:
        return int(session.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def test_a_retry_answers_the_same_cluster_and_places_once(ctx: Context, alice: Principal) -> None:
    first, replayed = create(ctx, alice, "k-1", body())
    assert not replayed
    again, replayed = create(ctx, alice, "k-1", body())
    assert (again, replayed) == (first, True)
    assert count(ctx, Cluster) == 1
    assert count(ctx, GpuAllocation) == 1
    # Without a key every request creates.
    assert create(ctx, alice, None, body())[0] != first
    assert count(ctx, Cluster) == 2


def test_the_same_key_with_another_body_is_refused(ctx: Context, alice: Principal) -> None:
    create(ctx, alice, "k-2", body())
    with pytest.raises(IdempotencyKeyReused) as err:
        create(ctx, alice, "k-2", body(name="other"))
    assert err.value.code == "IDEMPOTENCY_KEY_REUSED" and err.value.http_status == 422
    assert count(ctx, Cluster) == 1


def test_sixteen_concurrent_requests_with_one_key_place_exactly_once(
    ctx: Context, alice: Principal
) -> None:
    threads = 16
    start = threading.Barrier(threads)

    def one(_: int) -> tuple[str, bool]:
        start.wait()
        return create(ctx, alice, "race", body(gpu_count=2))

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(one, range(threads)))

    ids = {cluster_id for cluster_id, _ in results}
    assert len(ids) == 1, results
    assert sum(1 for _, replayed in results if not replayed) == 1
    (cluster_id,) = ids
    assert count(ctx, Cluster) == 1
    assert count(ctx, GpuAllocation) == 2
    assert count(ctx, GpuAllocation, GpuAllocation.cluster_id == cluster_id) == 2
    assert count(ctx, IdempotencyKey) == 1


def test_a_request_that_loses_the_race_answers_the_winner(ctx: Context, alice: Principal) -> None:
    """Deterministically: another request with the key commits between this one's
    look-up and its transaction. This one's insert of the key fails, nothing of it
    is kept, and it answers the winner's cluster."""
    request = body()
    claim = idem.claim_for(ctx, alice, idem.ROUTE_CLUSTERS, "late", request.model_dump(mode="json"))
    winners: list[str] = []

    def create_after_a_winner(c: idem.Claim | None) -> str:
        winners.append(create_cluster(ctx, alice, request, idempotency=c).id)
        return create_cluster(ctx, alice, request, idempotency=c).id

    answer = idem.create_once(ctx, claim, create_after_a_winner)
    assert answer == (winners[0], True)
    assert count(ctx, Cluster) == 1
    assert count(ctx, GpuAllocation) == 1


def test_a_loser_with_another_body_hears_key_reused(ctx: Context, alice: Principal) -> None:
    mine, theirs = body(), body(name="theirs")
    claim = idem.claim_for(ctx, alice, idem.ROUTE_CLUSTERS, "k", mine.model_dump(mode="json"))
    other = idem.claim_for(ctx, alice, idem.ROUTE_CLUSTERS, "k", theirs.model_dump(mode="json"))

    def create_after_a_winner(c: idem.Claim | None) -> str:
        create_cluster(ctx, alice, theirs, idempotency=other)
        return create_cluster(ctx, alice, mine, idempotency=c).id

    with pytest.raises(IdempotencyKeyReused):
        idem.create_once(ctx, claim, create_after_a_winner)
    assert count(ctx, Cluster) == 1


def test_keys_expire(ctx: Context, alice: Principal, clock: FakeClock) -> None:
    ttl_s = ctx.settings.idempotency_ttl_hours * 3600
    first, _ = create(ctx, alice, "k-3", body())
    clock.advance(ttl_s - 1)
    assert create(ctx, alice, "k-3", body()) == (first, True)
    # After the TTL the key is free again, for any body: the old row is replaced.
    clock.advance(2)
    second, replayed = create(ctx, alice, "k-3", body(name="new"))
    assert second != first and not replayed
    assert count(ctx, IdempotencyKey) == 1
    assert create(ctx, alice, "k-3", body(name="new")) == (second, True)
    assert count(ctx, Cluster) == 2


def test_purge_expired_deletes_only_expired_keys(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    create(ctx, alice, "old", body())
    clock.advance(3600)
    create(ctx, alice, "new", body())
    clock.advance(ctx.settings.idempotency_ttl_hours * 3600 - 1800)
    assert idem.purge_expired(ctx) == 1
    with ctx.read() as session:
        assert list(session.scalars(select(IdempotencyKey.key))) == ["new"]


def test_keys_are_per_account_and_per_route(ctx: Context, alice: Principal, bob: Principal) -> None:
    mine, _ = create(ctx, alice, "shared", body())
    theirs, replayed = create(ctx, bob, "shared", body())
    assert theirs != mine and not replayed
    elsewhere, replayed = create(ctx, alice, "shared", body(), route=idem.ROUTE_GRAPHQL)
    assert elsewhere not in (mine, theirs) and not replayed
    assert count(ctx, Cluster) == 3


def test_a_failed_create_keeps_no_key(ctx: Context, alice: Principal) -> None:
    too_big = body(gpu_count=5)  # the host has 4 A6000s
    for _ in range(2):  # the retry runs again (no replay of a failure)
        with pytest.raises(InsufficientCapacity):
            create(ctx, alice, "k-4", too_big)
    assert count(ctx, IdempotencyKey) == 0
    # The key is free for the request that fits.
    _, replayed = create(ctx, alice, "k-4", body(gpu_count=4))
    assert not replayed and count(ctx, Cluster) == 1


def test_a_key_needs_write_scope(ctx: Context) -> None:
    reader = new_principal(ctx, "reader@example.com", Scope.READ)
    with pytest.raises(Forbidden):
        idem.claim_for(ctx, reader, idem.ROUTE_CLUSTERS, "k-5", {})


SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGe4tciPtcKsqalQ5MYQNCKBAGbS1rO94qvBwyD7hpHy k1"


def test_concurrent_training_creates_with_one_key_place_once(
    ctx: Context, alice: Principal
) -> None:
    with ctx.transaction() as session:
        key_id = add_key(session, alice.account_id, "k1", SSH_KEY).id
        image_id = session.scalar(select(ImageVersion.id).order_by(ImageVersion.id))
    scope = training.Scope(project_id=alice.default_project_id, location="local")
    spec = {
        "name": "t",
        "image_version_id": image_id,
        "ssh_key_ids": [key_id],
        "no_of_nodes": 2,
        "gpu_type": A6000,
        "gpus_per_node": 1,
        "cpus_per_node": 2,
        "memory_gb_per_node": 4,
    }
    threads = 8
    start = threading.Barrier(threads)

    def one(_: int) -> tuple[str, bool]:
        claim = idem.claim_for(ctx, alice, idem.ROUTE_TRAINING, "train", spec)
        start.wait()
        return idem.create_once(
            ctx,
            claim,
            lambda c: str(training.create_cluster(ctx, alice, scope, spec, idempotency=c)),
        )

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(one, range(threads)))

    assert len({cluster_id for cluster_id, _ in results}) == 1, results
    assert [replayed for _, replayed in results].count(False) == 1
    assert count(ctx, TrainingCluster) == 1
    assert count(ctx, GpuAllocation) == 2  # two workers, one GPU each
    with pytest.raises(IdempotencyKeyReused):
        idem.create_once(
            ctx,
            idem.claim_for(ctx, alice, idem.ROUTE_TRAINING, "train", {**spec, "no_of_nodes": 1}),
            lambda c: str(training.create_cluster(ctx, alice, scope, spec, idempotency=c)),
        )
