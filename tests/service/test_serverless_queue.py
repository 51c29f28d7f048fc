"""The durable job queue on SQLite and PostgreSQL: hand-out exactly once under 32
concurrent takers, give-back and its retry limit, timeouts and ttl on an injected
clock, and a restart on the same database leaving every job finished or queued."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuyard.core.errors import Forbidden, InvalidState, NotFound, Unauthorized
from gpuyard.core.serverless.jobs import FINAL_STATUSES, JobStatus
from gpuyard.services.billing import budgets
from gpuyard.services.billing.budgets import BudgetChange
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import open_store
from gpuyard.services.serverless import jobs, worker_calls
from gpuyard.services.serverless.queue import give_back_jobs, queue_state, take_jobs
from gpuyard.services.serverless.sweep import sweep
from gpuyard.services.tenancy import webhooks
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Account
from gpuyard.store.schema.serverless import ServerlessJob, ServerlessWorker
from tests.serverless_rows import make_endpoint, make_worker


def _endpoint(ctx: Context, who: Principal, **fields: object) -> str:
    return make_endpoint(ctx, who.account_id, who.default_project_id, **fields)


def _worker(ctx: Context, endpoint_id: str, clock: FakeClock, **fields: object) -> str:
    worker_id, _ = make_worker(ctx, endpoint_id, created_at=clock.now(), **fields)
    return worker_id


def _submit(ctx: Context, who: Principal, endpoint_id: str, n: int, **policy: object) -> list[str]:
    request = jobs.JobRequest(input_json='{"n": 1}', **policy)  # type: ignore[arg-type]
    return [jobs.submit_job(ctx, who, endpoint_id, request, False).id for _ in range(n)]


def _status(ctx: Context, job_id: str) -> ServerlessJob:
    with ctx.read() as session:
        job = session.get(ServerlessJob, job_id)
        assert job is not None
        return job


def test_32_concurrent_takers_never_take_a_job_twice(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    endpoint_id = _endpoint(ctx, alice)
    submitted = _submit(ctx, alice, endpoint_id, 200)
    workers = [_worker(ctx, endpoint_id, clock, status="ready") for _ in range(32)]
    taken: list[tuple[str, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def taker(worker_id: str) -> None:
        try:
            start.wait()
            while True:
                with ctx.transaction() as session:
                    worker = session.get(ServerlessWorker, worker_id)
                    assert worker is not None
                    got = take_jobs(session, worker, 2, clock.now())
                    ids = [job.id for job in got]
                if not ids:
                    return
                with lock:
                    taken.extend((job_id, worker_id) for job_id in ids)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=taker, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    counts = Counter(job_id for job_id, _ in taken)
    assert sorted(counts) == sorted(submitted)
    assert set(counts.values()) == {1}
    with ctx.read() as session:
        held = {w.id: w.jobs_in_progress for w in session.query(ServerlessWorker)}
        owners = {j.id: j.worker_id for j in session.query(ServerlessJob)}
        assert all(j.status == JobStatus.IN_PROGRESS for j in session.query(ServerlessJob))
        assert all(j.attempt == 1 for j in session.query(ServerlessJob))
    assert dict(taken) == owners
    assert held == dict(Counter(worker for _, worker in taken)) | {
        w: 0 for w in workers if w not in {x for _, x in taken}
    }
    with ctx.read() as session:
        state = queue_state(session, endpoint_id, clock.now())
    assert (state.in_queue, state.in_progress, state.oldest_queued_at) == (0, 200, None)


def test_queue_order_low_priority_last_then_oldest(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    endpoint_id = _endpoint(ctx, alice)
    (low,) = _submit(ctx, alice, endpoint_id, 1, low_priority=True)
    clock.advance(1)
    (first,) = _submit(ctx, alice, endpoint_id, 1)
    clock.advance(1)
    (second,) = _submit(ctx, alice, endpoint_id, 1)
    worker_id = _worker(ctx, endpoint_id, clock, status="ready")
    order = []
    for _ in range(3):
        with ctx.transaction() as session:
            worker = session.get(ServerlessWorker, worker_id)
            assert worker is not None
            order += [j.id for j in take_jobs(session, worker, 1, clock.now())]
    assert order == [first, second, low]


def test_give_back_requeues_until_the_limit_then_fails(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    endpoint_id = _endpoint(ctx, alice)
    (job_id,) = _submit(ctx, alice, endpoint_id, 1)
    queued_at = _status(ctx, job_id).queued_at
    for attempt in range(1, 5):
        worker_id = _worker(ctx, endpoint_id, clock, status="ready")
        with ctx.transaction() as session:
            worker = session.get(ServerlessWorker, worker_id)
            assert worker is not None
            assert [j.id for j in take_jobs(session, worker, 1, clock.now())] == [job_id]
        clock.advance(5)
        with ctx.transaction() as session:
            assert give_back_jobs(session, worker_id, "container died", clock.now(), 3) == 1
        job = _status(ctx, job_id)
        assert job.attempt == attempt
        if attempt <= 3:
            assert (job.status, job.retried, job.worker_id) == ("IN_QUEUE", attempt, None)
            assert job.queued_at == queued_at  # delayTime counts every wait
        else:
            assert (job.status, job.error, job.retried) == ("FAILED", "container died", 3)
        with ctx.read() as session:
            row = session.get(ServerlessWorker, worker_id)
            assert row is not None and row.jobs_in_progress == 0
    health = jobs.endpoint_health(ctx, alice, endpoint_id)
    assert (health.failed, health.retried, health.in_queue) == (1, 1, 0)


def test_silent_worker_gives_its_jobs_back_and_is_recycled(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    endpoint_id = _endpoint(ctx, alice)
    (job_id,) = _submit(ctx, alice, endpoint_id, 1)
    worker_id, key = make_worker(ctx, endpoint_id, created_at=clock.now())
    ref = worker_calls.authenticate_worker(ctx, key, endpoint_id, worker_id)
    worker_calls.ping(ctx, ref)
    assert [j["id"] for j in worker_calls.take(ctx, ref, 1)] == [job_id]
    clock.advance(ctx.settings.serverless_worker_ping_timeout_s - 1)
    assert not sweep(ctx, clock.now()).silent_workers
    clock.advance(2)
    result = sweep(ctx, clock.now())
    assert result.silent_workers == (worker_id,)
    assert (_status(ctx, job_id).status, _status(ctx, job_id).retried) == ("IN_QUEUE", 1)
    with ctx.read() as session:
        worker = session.get(ServerlessWorker, worker_id)
        assert worker is not None and worker.status == "recycle"
    # The lost worker's late answer is refused and changes nothing.
    with pytest.raises(InvalidState):
        worker_calls.job_done(ctx, ref, job_id, {"output": "late"})
    assert _status(ctx, job_id).output_json is None


def test_a_job_the_worker_no_longer_reports_goes_back(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    """A job handed out on a long poll whose connection died never reached the worker:
    its next pings (which list the jobs it runs) leave it out, and past the grace the
    job is queued again while the worker keeps the job it does report."""
    endpoint_id = _endpoint(ctx, alice)
    lost, kept = _submit(ctx, alice, endpoint_id, 2)
    worker_id, key = make_worker(ctx, endpoint_id, created_at=clock.now(), status="ready")
    ref = worker_calls.authenticate_worker(ctx, key, endpoint_id, worker_id)
    assert {j["id"] for j in worker_calls.take(ctx, ref, 2)} == {lost, kept}
    # Within the grace a ping may not list a job yet; one saying nothing about its
    # jobs (no report) never gives any back.
    assert worker_calls.ping(ctx, ref, frozenset({kept})) == 0
    clock.advance(worker_calls.REPORT_GRACE_S + 1)
    assert worker_calls.ping(ctx, ref, None) == 0
    assert _status(ctx, lost).status == "IN_PROGRESS"
    assert worker_calls.ping(ctx, ref, frozenset({kept})) == 1
    assert (_status(ctx, lost).status, _status(ctx, lost).retried) == ("IN_QUEUE", 1)
    assert (_status(ctx, kept).status, _status(ctx, kept).worker_id) == ("IN_PROGRESS", worker_id)
    with ctx.read() as session:
        worker = session.get(ServerlessWorker, worker_id)
        assert worker is not None and (worker.status, worker.jobs_in_progress) == ("ready", 1)
    # Another worker takes it; the first one's report cannot drop it.
    other_id, other_key = make_worker(ctx, endpoint_id, created_at=clock.now(), status="ready")
    other = worker_calls.authenticate_worker(ctx, other_key, endpoint_id, other_id)
    assert [j["id"] for j in worker_calls.take(ctx, other, 1)] == [lost]
    clock.advance(worker_calls.REPORT_GRACE_S + 1)
    # A ping naming no job gives nothing back (some SDK versions never name any).
    assert worker_calls.ping(ctx, ref, frozenset()) == 0
    assert (_status(ctx, kept).status, _status(ctx, kept).worker_id) == ("IN_PROGRESS", worker_id)
    assert worker_calls.ping(ctx, other, frozenset({"another-job"})) == 1
    assert _status(ctx, lost).status == "IN_QUEUE"
    with pytest.raises(InvalidState):
        worker_calls.job_done(ctx, other, lost, {"output": "late"})


def test_a_starting_worker_has_the_start_grace(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    endpoint_id = _endpoint(ctx, alice)
    worker_id = _worker(ctx, endpoint_id, clock)
    clock.advance(ctx.settings.serverless_worker_start_grace_s - 1)
    assert not sweep(ctx, clock.now()).silent_workers
    clock.advance(2)
    assert sweep(ctx, clock.now()).silent_workers == (worker_id,)


def test_execution_timeout_and_ttl(ctx: Context, alice: Principal, clock: FakeClock) -> None:
    endpoint_id = _endpoint(ctx, alice, execution_timeout_ms=10_000)
    (slow,) = _submit(ctx, alice, endpoint_id, 1)
    (own,) = _submit(ctx, alice, endpoint_id, 1, execution_timeout_ms=3_000)
    worker_id, key = make_worker(ctx, endpoint_id, created_at=clock.now(), status="ready")
    ref = worker_calls.authenticate_worker(ctx, key, endpoint_id, worker_id)
    assert {j["id"] for j in worker_calls.take(ctx, ref, 2)} == {slow, own}
    (expiring,) = _submit(ctx, alice, endpoint_id, 1, ttl_ms=5_000)
    for t in (0, 2):
        clock.advance(t)
        worker_calls.ping(ctx, ref)
    clock.advance(2)  # 4 s: the 3 s job is past its timeout
    worker_calls.ping(ctx, ref)
    assert sweep(ctx, clock.now()).timed_out == 1
    assert _status(ctx, own).status == "TIMED_OUT"
    assert worker_calls.stop_signals(ctx, ref) == [own]
    assert worker_calls.stop_signals(ctx, ref) == []  # answered once
    clock.advance(2)  # 6 s: past the ttl of the queued job
    worker_calls.ping(ctx, ref)
    result = sweep(ctx, clock.now())
    assert result.ttl_expired == 1
    assert (_status(ctx, expiring).status, _status(ctx, expiring).error) == (
        "TIMED_OUT",
        "ttl expired",
    )
    clock.advance(5)  # 11 s: the endpoint's 10 s default
    worker_calls.ping(ctx, ref)
    assert sweep(ctx, clock.now()).timed_out == 1
    assert _status(ctx, slow).status == "TIMED_OUT"
    with ctx.read() as session:
        worker = session.get(ServerlessWorker, worker_id)
        assert worker is not None and worker.status == "recycle"
        assert worker.jobs_in_progress == 0
    clock.advance(ctx.settings.serverless_result_ttl_s + 1)
    assert sweep(ctx, clock.now()).deleted == 3
    with pytest.raises(NotFound):
        jobs.job_status(ctx, alice, endpoint_id, slow)


def test_worker_keys_serve_their_own_endpoint_only(
    ctx: Context, alice: Principal, bob: Principal, clock: FakeClock
) -> None:
    a = _endpoint(ctx, alice)
    b = _endpoint(ctx, bob)
    (job_b,) = _submit(ctx, bob, b, 1)
    wa, key_a = make_worker(ctx, a, created_at=clock.now(), status="ready")
    wb, key_b = make_worker(ctx, b, created_at=clock.now(), status="ready")
    with pytest.raises(Forbidden):
        worker_calls.authenticate_worker(ctx, key_a, b, wa)
    with pytest.raises(Forbidden):
        worker_calls.authenticate_worker(ctx, key_a, a, wb)
    with pytest.raises(Unauthorized):
        worker_calls.authenticate_worker(ctx, "gyw_nothing", a, wa)
    ref_a = worker_calls.authenticate_worker(ctx, key_a, a, wa)
    assert worker_calls.take(ctx, ref_a, 5) == []
    ref_b = worker_calls.authenticate_worker(ctx, key_b, b, wb)
    assert [j["id"] for j in worker_calls.take(ctx, ref_b, 5)] == [job_b]
    with pytest.raises(InvalidState):
        worker_calls.job_done(ctx, ref_a, job_b, {"output": "stolen"})
    worker_calls.job_done(ctx, ref_b, job_b, {"output": "mine"})
    assert jobs.job_status(ctx, bob, b, job_b).output == "mine"
    # Another account's endpoint and job read as absent.
    for call in (jobs.job_status, jobs.cancel_job, jobs.retry_job, jobs.read_stream):
        with pytest.raises(NotFound):
            call(ctx, alice, b, job_b)
    with pytest.raises(NotFound):
        jobs.job_status(ctx, alice, a, job_b)
    with pytest.raises(NotFound):
        _submit(ctx, alice, b, 1)
    with pytest.raises(NotFound):
        jobs.purge_queue(ctx, alice, b)
    with pytest.raises(NotFound):
        jobs.endpoint_health(ctx, alice, b)


def test_cancel_retry_purge_and_budget(ctx: Context, alice: Principal, clock: FakeClock) -> None:
    endpoint_id = _endpoint(ctx, alice)
    submitted = _submit(ctx, alice, endpoint_id, 5)
    worker_id, key = make_worker(ctx, endpoint_id, created_at=clock.now(), status="ready")
    ref = worker_calls.authenticate_worker(ctx, key, endpoint_id, worker_id)
    (running,) = [j["id"] for j in worker_calls.take(ctx, ref, 1)]
    queued, *rest = [j for j in submitted if j != running]
    assert jobs.cancel_job(ctx, alice, endpoint_id, running).status == "CANCELLED"
    assert jobs.cancel_job(ctx, alice, endpoint_id, queued).status == "CANCELLED"
    with ctx.read() as session:
        worker = session.get(ServerlessWorker, worker_id)
        assert worker is not None and (worker.status, worker.jobs_in_progress) == ("recycle", 0)
    assert worker_calls.stop_signals(ctx, ref) == [running]
    assert jobs.purge_queue(ctx, alice, endpoint_id).runpod() == {
        "removed": 3,
        "status": "completed",
    }
    assert {_status(ctx, j).status for j in rest} == {"CANCELLED"}
    with pytest.raises(InvalidState):
        jobs.retry_job(ctx, alice, endpoint_id, _submit(ctx, alice, endpoint_id, 1)[0])
    again = jobs.retry_job(ctx, alice, endpoint_id, running)
    assert (again.status, _status(ctx, running).retried) == ("IN_QUEUE", 1)
    with ctx.transaction() as session:
        account = session.get(Account, alice.account_id)
        assert account is not None
        account.exhausted_at = clock.now()
    with pytest.raises(Exception) as refused:
        _submit(ctx, alice, endpoint_id, 1)
    assert getattr(refused.value, "http_status", None) == 402


def test_a_restart_on_the_same_database_loses_no_job(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    """Like kill -9 of the server: whatever was committed is there for a new store on
    the same database; a job whose worker vanished goes back to the queue."""
    endpoint_id = _endpoint(ctx, alice)
    submitted = _submit(ctx, alice, endpoint_id, 10)
    worker_id, key = make_worker(ctx, endpoint_id, created_at=clock.now())
    ref = worker_calls.authenticate_worker(ctx, key, endpoint_id, worker_id)
    worker_calls.ping(ctx, ref)
    taken = [j["id"] for j in worker_calls.take(ctx, ref, 3)]
    worker_calls.job_done(ctx, ref, taken[0], {"output": 1})
    engine, sessions = open_store(ctx.settings)
    try:
        again = Context(sessions=sessions, settings=ctx.settings, clock=clock)
        clock.advance(ctx.settings.serverless_worker_ping_timeout_s + 1)
        sweep(again, clock.now())
        with again.read() as session:
            statuses = {j.id: j.status for j in session.query(ServerlessJob)}
        assert sorted(statuses) == sorted(submitted)
        assert all(s in FINAL_STATUSES or s == JobStatus.IN_QUEUE for s in statuses.values())
        assert statuses[taken[0]] == "COMPLETED"
        assert [statuses[j] for j in taken[1:]] == ["IN_QUEUE", "IN_QUEUE"]
    finally:
        engine.dispose()


def test_completion_webhook_is_signed_and_retried(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    received: list[tuple[dict[str, str], bytes]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(500 if len(received) == 1 else 204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/done"
    try:
        ctx.settings = ctx.settings.model_copy(update={"webhook_allow_private": True})
        view = budgets.update_budget(
            ctx,
            dataclasses.replace(alice, operator=True),
            alice.account_id,
            BudgetChange(fields=frozenset({"webhook_url"}), webhook_url=url + "/account"),
        )
        secret = view.webhook_secret
        assert secret is not None
        endpoint_id = _endpoint(ctx, alice)
        request = jobs.JobRequest(input_json="1", webhook=url)
        job_id = jobs.submit_job(ctx, alice, endpoint_id, request, False).id
        worker_id, key = make_worker(ctx, endpoint_id, created_at=clock.now(), status="ready")
        ref = worker_calls.authenticate_worker(ctx, key, endpoint_id, worker_id)
        worker_calls.take(ctx, ref, 1)
        worker_calls.job_done(ctx, ref, job_id, {"output": {"ok": True}})
        assert webhooks.deliver_due(ctx) == 0  # the receiver failed the first attempt
        clock.advance(webhooks.BACKOFF_S[0] + 1)
        assert webhooks.deliver_due(ctx) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert len(received) == 2
    headers, raw = received[-1]
    assert headers["x-gpuyard-event"] == "serverless.job"
    assert webhooks.verify(secret, raw, headers["x-gpuyard-signature"])
    body = json.loads(raw)
    assert (body["id"], body["status"], body["output"]) == (job_id, "COMPLETED", {"ok": True})
