"""RunPod's job API and worker protocol over real HTTP, with the unmodified runpod SDK
on both sides: ``runpod.Endpoint`` as the client, and workers that are
``runpod.serverless.start({"handler": f})`` in their own processes, given
worker_environment(...) pointing at the test server. Then the attacker's view: another
account's key, a worker key of another endpoint, a worker key on account routes and an
account key on worker routes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import runpod

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.serverless.worker_env import worker_environment
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.store.schema.serverless import ServerlessWorker
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings
from tests.serverless_rows import make_endpoint, make_worker

HANDLERS = {
    "plain": """
        def handler(job):
            return {"echo": job["input"]}
        runpod.serverless.start({"handler": handler})
    """,
    "stream": """
        def handler(job):
            for i in range(job["input"]["n"]):
                yield {"chunk": i}
        runpod.serverless.start({"handler": handler, "return_aggregate_stream": True})
    """,
    "async": """
        import asyncio
        async def handler(job):
            await asyncio.sleep(job["input"].get("sleep", 0))
            return job["input"]
        runpod.serverless.start({"handler": handler})
    """,
    "concurrent": """
        import asyncio
        async def handler(job):
            await asyncio.sleep(0.5)
            return job["input"]["i"]
        runpod.serverless.start(
            {"handler": handler, "concurrency_modifier": lambda current: 4}
        )
    """,
}


@dataclass
class Tenant:
    account_id: int
    project_id: int
    key: str


@dataclass
class World:
    srv: LiveServer
    a: Tenant
    b: Tenant
    endpoints: dict[str, str]
    workers: dict[str, tuple[str, str]]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


def _tenant(srv: LiveServer, name: str) -> Tenant:
    with srv.server.ctx.transaction() as s:
        user, account, project = create_account(s, email=f"{name}@sls.test", name=name)
        key = issue_key(s, user_id=user.id, account_id=account.id, name=name, scope=Scope.WRITE)
        return Tenant(account.id, project.id, key.key)


def _start_worker(
    srv: LiveServer, tmp: Path, kind: str, handler: str, endpoint_id: str, worker_id: str, key: str
) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp / f"home-{kind}"),
        "PYTHONUNBUFFERED": "1",
        **worker_environment(srv.url, endpoint_id, worker_id, key, ping_interval_ms=1000),
    }
    (tmp / f"home-{kind}").mkdir(exist_ok=True)
    code = "import runpod\n" + textwrap.dedent(HANDLERS[handler])
    log = open(tmp / f"worker-{kind}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=log)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("sls")
    settings = make_settings(
        tmp / "home",
        serverless_job_take_wait_s=2,
        rate_limit_per_key=0,
        rate_limit_per_source=0,
        rate_limit_auth_failures_per_minute=0,
    )
    # The job API and the worker protocol on their own: the workers are processes this
    # test starts and registers, so no scaler runs to replace them with clusters (the
    # scaler is tested in tests/service/test_serverless_workers.py and end to end).
    with live_server(settings, FakeRuntime(), run_reconciler=False) as srv:
        a, b = _tenant(srv, "a"), _tenant(srv, "b")
        ctx = srv.server.ctx
        endpoints = {kind: make_endpoint(ctx, a.account_id, a.project_id) for kind in HANDLERS}
        endpoints["slow"] = make_endpoint(ctx, a.account_id, a.project_id)
        endpoints["idle"] = make_endpoint(ctx, a.account_id, a.project_id)
        endpoints["b"] = make_endpoint(ctx, b.account_id, b.project_id)
        workers = {kind: make_worker(ctx, endpoints[kind]) for kind in (*HANDLERS, "slow")}
        w = World(srv, a, b, endpoints, workers)
        try:
            for kind in (*HANDLERS, "slow"):
                worker_id, key = workers[kind]
                handler = "async" if kind == "slow" else kind
                w.procs.append(
                    _start_worker(srv, tmp, kind, handler, endpoints[kind], worker_id, key)
                )
            yield w
        finally:
            for proc in w.procs:
                proc.terminate()
            for proc in w.procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _sdk(world: World, key: str | None = None) -> None:
    runpod.api_key = key or world.a.key
    runpod.endpoint_url_base = f"{world.srv.url}/runpod/v2"


def _wait_ready(world: World, kind: str, timeout: float = 60) -> None:
    worker_id, _ = world.workers[kind]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with world.srv.server.ctx.read() as s:
            row = s.get(ServerlessWorker, worker_id)
            if row is not None and row.status == "ready":
                return
        time.sleep(0.2)
    raise AssertionError(f"worker {kind} never pinged")


def test_run_sync_returns_the_echo(world: World) -> None:
    _sdk(world)
    endpoint = runpod.Endpoint(world.endpoints["plain"])
    assert endpoint.run_sync({"input": {"x": 1}}, timeout=60) == {"echo": {"x": 1}}


def test_run_status_output(world: World) -> None:
    _sdk(world)
    job = runpod.Endpoint(world.endpoints["async"]).run({"input": {"v": "hi"}})
    assert job.output(timeout=60) == {"v": "hi"}
    assert job.status() == "COMPLETED"
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.a.key}"}, verify=trusted_tls()
    ) as c:
        r = c.get(f"{world.srv.url}/runpod/v2/{world.endpoints['async']}/status/{job.job_id}")
    body = r.json()
    assert r.status_code == 200 and body["status"] == "COMPLETED"
    assert body["workerId"] == world.workers["async"][0]
    assert isinstance(body["delayTime"], int) and isinstance(body["executionTime"], int)


def test_stream_yields_every_chunk_in_order(world: World) -> None:
    _sdk(world)
    job = runpod.Endpoint(world.endpoints["stream"]).run({"input": {"n": 5}})
    assert list(job.stream()) == [{"chunk": i} for i in range(5)]
    assert job.output(timeout=30) == [{"chunk": i} for i in range(5)]


def test_concurrency_modifier_takes_several_at_once(world: World) -> None:
    _sdk(world)
    _wait_ready(world, "concurrent")
    endpoint = runpod.Endpoint(world.endpoints["concurrent"])
    started = time.monotonic()
    jobs = [endpoint.run({"input": {"i": i}}) for i in range(8)]
    assert [j.output(timeout=60) for j in jobs] == list(range(8))
    # 8 jobs of 0.5 s, 4 at a time: well under 8 x 0.5 s one after the other.
    assert time.monotonic() - started < 3.9


def test_cancel_of_a_slow_job(world: World) -> None:
    _sdk(world)
    _wait_ready(world, "slow")
    endpoint = runpod.Endpoint(world.endpoints["slow"])
    job = endpoint.run({"input": {"sleep": 30}})
    deadline = time.monotonic() + 30
    while job.status() != "IN_PROGRESS" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.cancel()["status"] == "CANCELLED"
    assert job.status() == "CANCELLED"
    with world.srv.server.ctx.read() as s:
        row = s.get(ServerlessWorker, world.workers["slow"][0])
        assert row is not None and row.status == "recycle"


def test_health_and_purge(world: World) -> None:
    _sdk(world)
    idle = runpod.Endpoint(world.endpoints["idle"])
    for i in range(3):
        idle.run({"input": {"i": i}})
    assert idle.health()["jobs"]["inQueue"] == 3
    assert idle.purge_queue() == {"removed": 3, "status": "completed"}
    health = idle.health()
    assert health["jobs"] == {
        "completed": 0,
        "failed": 0,
        "inProgress": 0,
        "inQueue": 0,
        "retried": 0,
    }
    assert health["workers"] == {"idle": 0, "running": 0}
    _wait_ready(world, "plain")
    plain = runpod.Endpoint(world.endpoints["plain"])
    plain.run_sync({"input": {"x": 2}}, timeout=60)
    health = plain.health()
    assert health["jobs"]["completed"] >= 1
    assert health["workers"]["idle"] + health["workers"]["running"] == 1


def test_runsync_answers_in_queue_when_not_done_in_time(world: World) -> None:
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.a.key}"}, timeout=30, verify=trusted_tls()
    ) as c:
        r = c.post(
            f"{world.srv.url}/runpod/v2/{world.endpoints['idle']}/runsync",
            params={"wait": 200},
            json={"input": {}},
        )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "IN_QUEUE"


def test_bad_bodies_are_problems_not_500s(world: World) -> None:
    url = f"{world.srv.url}/runpod/v2/{world.endpoints['idle']}"
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.a.key}"}, timeout=30, verify=trusted_tls()
    ) as c:
        assert c.post(f"{url}/run", json={}).status_code == 422
        bad = {"input": {}, "policy": {"ttl": -1}}
        r = c.post(f"{url}/run", json=bad)
        assert r.status_code == 422
        assert r.headers["content-type"].startswith("application/problem+json")
        assert c.post(f"{url}/run", json={"input": 1, "webhook": "ftp://x"}).status_code == 422
        assert c.get(f"{world.srv.url}/runpod/v2/notanendpoint/health").status_code == 404
        # Collections under the same prefix still route.
        assert c.get(f"{world.srv.url}/runpod/v2/pods").status_code == 200
        assert c.get(f"{world.srv.url}/runpod/v2/templates").status_code == 200


JOB_ROUTES: list[tuple[str, str, dict[str, object] | None]] = [
    ("POST", "run", {"input": {}}),
    ("POST", "runsync", {"input": {}}),
    ("GET", "status/{job}", None),
    ("GET", "stream/{job}", None),
    ("POST", "cancel/{job}", None),
    ("POST", "retry/{job}", None),
    ("POST", "purge-queue", None),
    ("GET", "health", None),
]


def _job_of_a(world: World) -> str:
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.a.key}"}, verify=trusted_tls()
    ) as c:
        r = c.post(f"{world.srv.url}/runpod/v2/{world.endpoints['idle']}/run", json={"input": 1})
        job_id: str = r.json()["id"]
        return job_id


def test_another_accounts_key_reads_every_job_route_as_absent(world: World) -> None:
    job = _job_of_a(world)
    wrong = []
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.b.key}"}, timeout=30, verify=trusted_tls()
    ) as c:
        for method, tail, body in JOB_ROUTES:
            url = f"{world.srv.url}/runpod/v2/{world.endpoints['idle']}/" + tail.format(job=job)
            r = c.request(method, url, json=body)
            if r.status_code != 404:
                wrong.append(f"{method} {tail}: {r.status_code}")
            # B's own endpoint does not open A's job either.
            url = f"{world.srv.url}/runpod/v2/{world.endpoints['b']}/" + tail.format(job=job)
            if "{job}" in tail and c.request(method, url, json=body).status_code != 404:
                wrong.append(f"{method} {tail} via B's endpoint")
    assert not wrong, wrong
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.a.key}"}, verify=trusted_tls()
    ) as c:
        r = c.get(f"{world.srv.url}/runpod/v2/{world.endpoints['idle']}/status/{job}")
        assert r.json()["status"] == "IN_QUEUE"


def test_worker_keys_are_refused_outside_their_own_routes(world: World) -> None:
    worker_id, key = world.workers["plain"]
    ep = world.endpoints["plain"]
    base = f"{world.srv.url}/runpod/v2/workers"
    with httpx.Client(headers={"Authorization": key}, timeout=30, verify=trusted_tls()) as c:
        assert c.get(f"{world.srv.url}/v1/clusters").status_code == 401
        for method, tail, body in JOB_ROUTES:
            url = f"{world.srv.url}/runpod/v2/{ep}/" + tail.format(job="x")
            assert c.request(method, url, json=body).status_code == 401, tail
        # Another endpoint's or worker's paths.
        assert c.get(f"{base}/{world.endpoints['b']}/job-take/{worker_id}").status_code == 403
        other = world.workers["async"][0]
        assert c.get(f"{base}/{ep}/ping/{other}").status_code == 403
    # An account's key is no worker key.
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.a.key}"}, timeout=30, verify=trusted_tls()
    ) as c:
        for path in (
            f"{base}/{ep}/job-take/{worker_id}?protocol=1",
            f"{base}/{ep}/ping/{worker_id}",
            f"{base}/{ep}/job-stop/{worker_id}",
        ):
            assert c.get(path).status_code == 401, path
        r = c.post(f"{base}/{ep}/job-done/{worker_id}/x", content=b'{"output": 1}')
        assert r.status_code == 401


def test_a_worker_cannot_answer_another_endpoints_job(world: World) -> None:
    ctx = world.srv.server.ctx
    job = _job_of_a(world)  # on the "idle" endpoint, which has no worker
    thief_id, thief_key = make_worker(ctx, world.endpoints["b"], status="ready")
    base = f"{world.srv.url}/runpod/v2/workers/{world.endpoints['b']}"
    with httpx.Client(headers={"Authorization": thief_key}, timeout=30, verify=trusted_tls()) as c:
        r = c.get(f"{base}/job-take/{thief_id}?protocol=1")
        assert r.status_code == 204
        r = c.post(f"{base}/job-done/{thief_id}/{job}?protocol=1", content=b'{"output": "x"}')
        assert r.status_code == 409
        r = c.post(f"{base}/job-stream/{thief_id}/{job}", content=b'{"output": "x"}')
        assert r.status_code == 409
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.a.key}"}, verify=trusted_tls()
    ) as c:
        r = c.get(f"{world.srv.url}/runpod/v2/{world.endpoints['idle']}/status/{job}")
        assert r.json()["status"] == "IN_QUEUE" and "output" not in r.json()


def test_body_limits_per_route(world: World) -> None:
    url = f"{world.srv.url}/runpod/v2/{world.endpoints['idle']}"
    big = b'{"input": "' + b"x" * (11 * 1024 * 1024) + b'"}'
    with httpx.Client(
        headers={"Authorization": f"Bearer {world.a.key}", "Content-Type": "application/json"},
        timeout=60,
        verify=trusted_tls(),
    ) as c:
        assert c.post(f"{url}/run", content=big).status_code == 413
        r = c.post(f"{url}/runsync", params={"wait": 0}, content=big)
        assert r.status_code == 200, r.text[:200]
        assert c.post(f"{url}/purge-queue", content=b"x" * 300_000).status_code == 413
