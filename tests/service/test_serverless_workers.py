"""The serverless scaler on a real store (SQLite and PostgreSQL), the fake runtime and
an injected clock: workers start from zero when jobs queue (both scalers), never above
``workers_max``; idle ones stop after ``idle_timeout_s`` down to ``workers_min``;
flashboot keeps stopped workers and starts them again; a dead worker container gives
its job back; a quota, no capacity or a spent budget shows on the endpoint; a deleted
endpoint drains, then every worker is terminated. Worker clusters are the endpoint's:
absent from the user's lists, refused to the user's actions, billed under the
endpoint's name, and invisible to another account."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from gpuyard.core.billing.quotas import LimitChange
from gpuyard.core.errors import ClusterNotFound, WorkerCluster
from gpuyard.core.ids import new_endpoint_id, new_job_id
from gpuyard.core.serverless.jobs import JobStatus
from gpuyard.core.states import IN_MOTION
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.serverless.queue_port import ServiceQueue
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.billing import budgets, metering, quotas
from gpuyard.services.billing.budgets import BudgetChange
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, ServerlessEndpoint, ServerlessJob, ServerlessWorker
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.conftest import new_operator

A = "NVIDIA RTX A6000"


# -- helpers: rows written directly, as the endpoint and queue services would ----------
def endpoint(ctx: Context, p: Principal, **kw: Any) -> str:
    now = ctx.clock.now()
    values: dict[str, Any] = {
        "name": "echo",
        "image": "img",
        "gpu_type_ids": [A],
        "gpu_count": 1,
        "workers_min": 0,
        "workers_max": 3,
        "idle_timeout_s": 5,
        "scaler_type": "QUEUE_DELAY",
        "scaler_value": 4,
        "flashboot": False,
        "env": {"GREETING": "hi"},
    }
    values.update(kw)
    eid = new_endpoint_id()
    with ctx.transaction() as session:
        session.add(
            ServerlessEndpoint(
                id=eid,
                account_id=p.account_id,
                project_id=p.default_project_id,
                created_at=now,
                updated_at=now,
                **values,
            )
        )
    return eid


def enqueue(ctx: Context, p: Principal, eid: str, n: int) -> list[str]:
    now = ctx.clock.now()
    ids = [new_job_id() for _ in range(n)]
    with ctx.transaction() as session:
        for i, job_id in enumerate(ids):
            at = now + timedelta(microseconds=i)
            session.add(
                ServerlessJob(
                    id=job_id,
                    endpoint_id=eid,
                    account_id=p.account_id,
                    input_json="{}",
                    created_at=at,
                    queued_at=at,
                    updated_at=at,
                )
            )
    return ids


def endpoint_row(ctx: Context, eid: str) -> ServerlessEndpoint:
    with ctx.read() as session:
        row = session.get(ServerlessEndpoint, eid)
        assert row is not None
        session.expunge(row)
        return row


def job(ctx: Context, job_id: str) -> ServerlessJob:
    with ctx.read() as session:
        row = session.get(ServerlessJob, job_id)
        assert row is not None
        session.expunge(row)
        return row


def workers(ctx: Context, eid: str, *statuses: str) -> list[ServerlessWorker]:
    with ctx.read() as session:
        q = select(ServerlessWorker).where(ServerlessWorker.endpoint_id == eid)
        if statuses:
            q = q.where(ServerlessWorker.status.in_(statuses))
        found = list(session.scalars(q.order_by(ServerlessWorker.created_at)))
        session.expunge_all()
        return found


def cluster(ctx: Context, cid: str | None) -> Cluster:
    with ctx.read() as session:
        row = session.get(Cluster, cid)
        assert row is not None
        session.expunge(row)
        return row


def set_worker(ctx: Context, wid: str, **values: Any) -> None:
    with ctx.transaction() as session:
        session.execute(update(ServerlessWorker).where(ServerlessWorker.id == wid).values(**values))


def ready(ctx: Context, wid: str) -> None:
    """The worker's first ping (the queue's routes set this)."""
    now = ctx.clock.now()
    set_worker(ctx, wid, status="ready", last_ping_at=now, last_busy_at=now)


def take(ctx: Context, wid: str, job_id: str) -> None:
    now = ctx.clock.now()
    with ctx.transaction() as session:
        session.execute(
            update(ServerlessJob)
            .where(ServerlessJob.id == job_id)
            .values(status="IN_PROGRESS", worker_id=wid, started_at=now, attempt=1)
        )
        session.execute(
            update(ServerlessWorker)
            .where(ServerlessWorker.id == wid)
            .values(jobs_in_progress=ServerlessWorker.jobs_in_progress + 1, last_busy_at=now)
        )


def finish(ctx: Context, wid: str, job_id: str) -> None:
    now = ctx.clock.now()
    with ctx.transaction() as session:
        session.execute(
            update(ServerlessJob)
            .where(ServerlessJob.id == job_id)
            .values(status="COMPLETED", completed_at=now, output_json='"ok"')
        )
        session.execute(
            update(ServerlessWorker)
            .where(ServerlessWorker.id == wid)
            .values(jobs_in_progress=ServerlessWorker.jobs_in_progress - 1, last_busy_at=now)
        )


def settle(ctx: Context, rec: Reconciler) -> None:
    """Drive every cluster in motion to rest (the reconciler's cluster steps)."""
    for _ in range(6):
        with ctx.read() as session:
            moving = list(
                session.scalars(
                    select(Cluster.id).where(Cluster.status.in_([s.value for s in IN_MOTION]))
                )
            )
        if not moving:
            return
        for cid in moving:
            rec.driver.drive(cid)


def scale(ctx: Context, rec: Reconciler) -> None:
    """One scaler pass, then the clusters it asked for brought to rest."""
    rec.serverless.run()
    settle(ctx, rec)


def all_ready(ctx: Context, eid: str) -> list[str]:
    ids = [w.id for w in workers(ctx, eid, "starting")]
    for wid in ids:
        ready(ctx, wid)
    return ids


# -- scaling up ------------------------------------------------------------------------
def test_queue_delay_scales_up_from_zero_one_worker_a_pass_up_to_the_max(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    eid = endpoint(ctx, alice, scaler_type="QUEUE_DELAY", scaler_value=4, workers_max=3)
    scale(ctx, rec)
    assert workers(ctx, eid) == []  # nothing queued: nothing started
    enqueue(ctx, alice, eid, 3)
    scale(ctx, rec)
    [first] = workers(ctx, eid)
    assert first.status == "starting" and first.endpoint_version == 1
    c = cluster(ctx, first.cluster_id)
    assert c.serverless_endpoint_id == eid and c.status == "running"
    assert c.name == "echo-worker-1" and c.gpu_type == A and c.gpu_count == 1
    env = runtime.containers[c.id].spec.env
    assert env["RUNPOD_POD_ID"] == first.id and env["RUNPOD_ENDPOINT_ID"] == eid
    assert env["GREETING"] == "hi" and env["RUNPOD_AI_API_KEY"].startswith("gyw_")
    assert env["RUNPOD_WEBHOOK_GET_JOB"].startswith("http://")
    assert c.env["RUNPOD_AI_API_KEY"].startswith("gysec:")  # stored sealed
    # Jobs that waited less than scaler_value seconds add no worker.
    clock.advance(3)
    scale(ctx, rec)
    assert len(workers(ctx, eid)) == 1
    # Past it: one more per pass, never above workers_max.
    for expected in (2, 3, 3, 3):
        clock.advance(5)
        scale(ctx, rec)
        assert len(workers(ctx, eid)) == expected
    assert endpoint_row(ctx, eid).capacity_problem is None


def test_request_count_scales_to_ceil_of_jobs_over_value_clamped_to_max(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=2, workers_max=3)
    enqueue(ctx, alice, eid, 3)
    scale(ctx, rec)
    assert len(workers(ctx, eid)) == 2  # ceil(3 / 2)
    enqueue(ctx, alice, eid, 17)
    for _ in range(3):
        clock.advance(1)
        scale(ctx, rec)
        assert len(workers(ctx, eid)) == 3  # ceil(20 / 2) = 10, clamped to 3
    with ctx.read() as session:
        live = session.scalars(
            select(Cluster.id).where(
                Cluster.serverless_endpoint_id == eid, Cluster.status == "running"
            )
        ).all()
    assert len(live) == 3


# -- idle stop -------------------------------------------------------------------------
@pytest.mark.parametrize("workers_min", [0, 1])
def test_idle_workers_stop_after_the_idle_timeout_down_to_workers_min(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock, workers_min: int
) -> None:
    eid = endpoint(
        ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1, idle_timeout_s=5,
        workers_min=workers_min,
    )  # fmt: skip
    jobs = enqueue(ctx, alice, eid, 2)
    scale(ctx, rec)
    w1, w2 = all_ready(ctx, eid)
    take(ctx, w1, jobs[0])
    take(ctx, w2, jobs[1])
    clock.advance(1)
    finish(ctx, w1, jobs[0])
    finish(ctx, w2, jobs[1])
    clock.advance(4.5)
    scale(ctx, rec)
    assert len(workers(ctx, eid, "ready")) == 2  # idle 4.5 s < 5 s
    clock.advance(1)
    scale(ctx, rec)
    left = workers(ctx, eid, "ready", "starting")
    assert len(left) == workers_min
    gone = workers(ctx, eid, "gone")
    assert len(gone) == 2 - workers_min
    for w in gone:
        assert cluster(ctx, w.cluster_id).status == "terminated"
    # Steady: nothing more stops, nothing starts.
    clock.advance(60)
    scale(ctx, rec)
    assert len(workers(ctx, eid, "ready", "starting")) == workers_min


def test_a_busy_worker_is_never_stopped(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1, idle_timeout_s=1)
    [j] = enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    [w] = all_ready(ctx, eid)
    take(ctx, w, j)
    for _ in range(6):  # two minutes of a long job, the worker pinging as it runs
        clock.advance(20)
        set_worker(ctx, w, last_ping_at=clock.now())
        scale(ctx, rec)
    assert [x.status for x in workers(ctx, eid)] == ["ready"]


# -- flashboot -------------------------------------------------------------------------
def test_flashboot_keeps_stopped_workers_and_starts_them_again(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1, flashboot=True)
    [j] = enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    [w] = all_ready(ctx, eid)
    take(ctx, w, j)
    finish(ctx, w, j)
    clock.advance(6)
    scale(ctx, rec)  # asked to stop; the cluster stops
    scale(ctx, rec)  # the worker sees its cluster stopped
    [kept] = workers(ctx, eid)
    assert kept.id == w and kept.status == "stopped"
    cid = kept.cluster_id
    assert cluster(ctx, cid).status == "stopped"
    # New work: the kept worker's cluster starts again; no new cluster is made.
    enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    [again] = workers(ctx, eid)
    assert again.id == w and again.status == "starting" and again.cluster_id == cid
    assert cluster(ctx, cid).status == "running"
    with ctx.read() as session:
        assert session.scalars(
            select(Cluster.id).where(Cluster.serverless_endpoint_id == eid)
        ).all() == [cid]


def test_flashboot_kept_worker_of_an_older_version_is_terminated_not_reused(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1, flashboot=True)
    [j] = enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    [w] = all_ready(ctx, eid)
    take(ctx, w, j)
    finish(ctx, w, j)
    clock.advance(6)
    scale(ctx, rec)
    scale(ctx, rec)
    assert workers(ctx, eid)[0].status == "stopped"
    with ctx.transaction() as session:  # a PATCH: new workers get the new image
        session.execute(
            update(ServerlessEndpoint)
            .where(ServerlessEndpoint.id == eid)
            .values(version=2, image="img2")
        )
    enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    old, new = workers(ctx, eid)
    assert old.id == w and old.status == "gone"
    assert cluster(ctx, old.cluster_id).status == "terminated"
    assert new.endpoint_version == 2 and cluster(ctx, new.cluster_id).image == "img2"


# -- a dead worker ---------------------------------------------------------------------
def test_a_dead_worker_container_gives_its_job_back_and_is_replaced(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1)
    [j] = enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    [w] = all_ready(ctx, eid)
    take(ctx, w, j)
    dead = workers(ctx, eid)[0].cluster_id
    assert dead is not None
    clock.advance(2)
    runtime.crash(dead, exit_code=137)  # podman kill
    rec.driver.recover(dead)  # what observation does when it sees the exit
    scale(ctx, rec)
    back = job(ctx, j)
    assert back.status == JobStatus.IN_QUEUE and back.worker_id is None and back.retried == 1
    old, new = workers(ctx, eid)
    assert old.id == w and old.status == "gone" and old.jobs_in_progress == 0
    assert cluster(ctx, dead).status == "terminated"
    assert new.status == "starting" and new.cluster_id != dead


def test_a_job_given_back_too_often_fails_with_the_reason(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1)
    [j] = enqueue(ctx, alice, eid, 1)
    for attempt in range(4):
        scale(ctx, rec)
        [w] = all_ready(ctx, eid)
        take(ctx, w, j)
        cid = workers(ctx, eid, "ready")[0].cluster_id
        assert cid is not None
        clock.advance(1)
        runtime.crash(cid, exit_code=137)
        rec.driver.recover(cid)
        rec.serverless.run()
        assert job(ctx, j).retried == min(attempt + 1, 3)
    failed = job(ctx, j)
    assert failed.status == JobStatus.FAILED and "container exited" in (failed.error or "")


# -- capacity problems -----------------------------------------------------------------
def test_a_quota_refusal_shows_on_the_endpoint_and_clears_when_lifted(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    operator = new_operator(ctx)
    quotas.set_quotas(ctx, operator, alice.account_id, LimitChange(gpus=0))
    eid = endpoint(ctx, alice)
    enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    assert workers(ctx, eid) == []
    problem = endpoint_row(ctx, eid).capacity_problem
    assert problem is not None and "quota" in problem.lower()
    quotas.set_quotas(ctx, operator, alice.account_id, LimitChange(gpus=None))
    scale(ctx, rec)
    assert len(workers(ctx, eid)) == 1
    assert endpoint_row(ctx, eid).capacity_problem is None


def test_each_gpu_type_is_tried_and_no_capacity_shows(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    # 8 GPUs of a type no host has that many of, then one that fits.
    eid = endpoint(ctx, alice, gpu_type_ids=["NVIDIA GeForce RTX 4090", A], gpu_count=4)
    enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    [w] = workers(ctx, eid)
    assert cluster(ctx, w.cluster_id).gpu_type == "NVIDIA GeForce RTX 4090"
    too_big = endpoint(ctx, alice, name="big", gpu_count=8)
    enqueue(ctx, alice, too_big, 1)
    scale(ctx, rec)
    assert workers(ctx, too_big) == []
    problem = endpoint_row(ctx, too_big).capacity_problem
    assert problem is not None and "not enough" in problem.lower()


def test_a_spent_budget_stops_workers_gives_jobs_back_and_starts_none(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    op = dataclasses.replace(alice, operator=True)
    budgets.update_budget(
        ctx,
        op,
        alice.account_id,
        BudgetChange(fields=frozenset({"billing_mode"}), billing_mode="prepaid"),
    )
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1)
    [j1, j2] = enqueue(ctx, alice, eid, 2)
    with ctx.read() as session:
        assert budgets.spend_rate_micro(session, alice.account_id) == 0
    # No credit at all: the account is spent already, nothing may start.
    rec.budget.run()
    scale(ctx, rec)
    assert workers(ctx, eid) == []
    problem = endpoint_row(ctx, eid).capacity_problem
    assert problem is not None and "spent" in problem
    # Credit for a while: workers start; one takes a job.
    budgets.add_credit(ctx, op, alice.account_id, 10_000_000, "top-up")
    rec.budget.run()
    scale(ctx, rec)
    assert endpoint_row(ctx, eid).capacity_problem is None
    w1, _w2 = all_ready(ctx, eid)
    take(ctx, w1, j1)
    # The balance runs out: the budget watch stops every worker cluster.
    rec.budget.run()  # sees the workers' spend: the crossing is its next deadline
    wait = rec.budget.seconds_until_next()
    assert wait is not None
    clock.advance(wait + 1)
    checks = rec.budget.run()
    assert any(c.stopped for c in checks)
    settle(ctx, rec)
    scale(ctx, rec)
    assert job(ctx, j1).status == JobStatus.IN_QUEUE and job(ctx, j1).retried == 1
    assert job(ctx, j2).status == JobStatus.IN_QUEUE
    assert workers(ctx, eid, "starting", "ready") == []
    problem = endpoint_row(ctx, eid).capacity_problem
    assert problem is not None and "spent" in problem
    with ctx.read() as session:
        running = session.scalars(
            select(Cluster.id).where(
                Cluster.serverless_endpoint_id == eid, Cluster.status == "running"
            )
        ).all()
    assert running == []


# -- delete ----------------------------------------------------------------------------
def test_a_deleted_endpoint_drains_then_every_worker_is_terminated(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    eid = endpoint(
        ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1, flashboot=True, idle_timeout_s=1
    )
    jobs = enqueue(ctx, alice, eid, 2)
    scale(ctx, rec)
    w1, w2 = all_ready(ctx, eid)
    take(ctx, w1, jobs[0])
    take(ctx, w2, jobs[1])
    finish(ctx, w2, jobs[1])
    clock.advance(2)
    scale(ctx, rec)
    scale(ctx, rec)
    assert {w.id: w.status for w in workers(ctx, eid)} == {w1: "ready", w2: "stopped"}
    with ctx.transaction() as session:
        session.execute(
            update(ServerlessEndpoint).where(ServerlessEndpoint.id == eid).values(status="deleting")
        )
    scale(ctx, rec)
    assert endpoint_row(ctx, eid).status == "deleting"  # a job still runs
    assert workers(ctx, eid, "ready")[0].id == w1
    finish(ctx, w1, jobs[0])
    scale(ctx, rec)
    assert endpoint_row(ctx, eid).status == "deleted"
    assert {w.status for w in workers(ctx, eid)} == {"gone"}
    for w in workers(ctx, eid):
        assert cluster(ctx, w.cluster_id).status == "terminated"
    scale(ctx, rec)  # a deleted endpoint is left alone
    assert endpoint_row(ctx, eid).status == "deleted"


# -- worker clusters are the endpoint's ------------------------------------------------
def test_worker_clusters_are_not_the_users_and_another_account_sees_none(
    ctx: Context, alice: Principal, bob: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    own = uc.create_cluster(
        ctx, alice, CreateCluster.model_validate({"docker_image": "img", "name": "mine"})
    )
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1)
    enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    [w] = workers(ctx, eid)
    cid = w.cluster_id
    assert cid is not None
    listed = [c.id for c in uc.list_clusters(ctx, alice).clusters]
    assert listed == [own.id]
    view = uc.get_cluster(ctx, alice, cid)
    assert view.serverless_endpoint_id == eid
    for act in (uc.stop_cluster, uc.restart_cluster, uc.terminate_cluster):
        with pytest.raises(WorkerCluster) as refused:
            act(ctx, alice, cid)
        assert refused.value.http_status == 409
        assert f"worker of endpoint {eid}" in refused.value.message
    with pytest.raises(WorkerCluster):
        uc.rename_cluster(ctx, alice, cid, "renamed")
    with pytest.raises(WorkerCluster):
        uc.start_cluster(ctx, alice, cid, StartCluster())
    assert cluster(ctx, cid).status == "running"
    # Another account: not found, whatever it tries.
    assert uc.list_clusters(ctx, bob).clusters == []
    with pytest.raises(ClusterNotFound):
        uc.get_cluster(ctx, bob, cid)
    for act in (uc.stop_cluster, uc.terminate_cluster, uc.restart_cluster):
        with pytest.raises(ClusterNotFound):
            act(ctx, bob, cid)
    assert cluster(ctx, cid).status == "running"


def test_workers_are_billed_under_the_endpoints_name(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    eid = endpoint(ctx, alice, name="echo", scaler_type="REQUEST_COUNT", scaler_value=1)
    enqueue(ctx, alice, eid, 2)
    start = clock.now()
    scale(ctx, rec)
    assert len(workers(ctx, eid)) == 2
    clock.advance(3600)
    with ctx.read() as session:
        bill = metering.bill(
            session,
            alice.account_id,
            None,
            start - timedelta(seconds=1),
            clock.now(),
            metering.GroupBy.CLUSTER,
            clock.now(),
        )
    [line] = bill.lines
    assert line.key == eid and line.label == "echo"
    assert line.gpu_seconds == 2 * 3600 and line.micro > 0


# -- the queue's side is injected ------------------------------------------------------
class LostPings(ServiceQueue):
    """The queue's sweep as the scaler sees it: workers named in ``lost`` are to be
    replaced (their pings stopped)."""

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.lost: set[str] = set()
        self.sweeps = 0

    def sweep(self, ctx: Context, now: Any) -> None:
        self.sweeps += 1
        with ctx.transaction() as session:
            for wid in self.lost:
                session.execute(
                    update(ServerlessWorker)
                    .where(ServerlessWorker.id == wid, ServerlessWorker.status == "ready")
                    .values(status="recycle")
                )


def test_a_worker_the_sweep_recycles_gives_its_job_back_and_is_replaced(
    ctx: Context, alice: Principal, runtime: FakeRuntime, clock: FakeClock
) -> None:
    queue = LostPings(ctx.settings)
    rec = build_reconciler(ctx, runtime, serverless_queue=queue)
    eid = endpoint(ctx, alice, scaler_type="REQUEST_COUNT", scaler_value=1)
    [j] = enqueue(ctx, alice, eid, 1)
    scale(ctx, rec)
    [w] = all_ready(ctx, eid)
    take(ctx, w, j)
    queue.lost.add(w)
    clock.advance(30)
    scale(ctx, rec)
    assert queue.sweeps == 2
    assert job(ctx, j).status == JobStatus.IN_QUEUE and job(ctx, j).retried == 1
    old, new = workers(ctx, eid)
    assert old.id == w and old.status == "gone"
    assert cluster(ctx, old.cluster_id).status == "terminated"
    assert new.status == "starting"
