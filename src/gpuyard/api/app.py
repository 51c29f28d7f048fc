"""``create_app(settings)``: the whole HTTP server, its store and its reconciler."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from gpuyard import __version__
from gpuyard.api.console import docs_page, guide_page
from gpuyard.api.console import page as console_api
from gpuyard.api.console import terminal as terminal_api
from gpuyard.api.fast.fastpath import ClusterReadFastPath
from gpuyard.api.graphql import build_router as graphql_router
from gpuyard.api.http import errors, method_not_allowed
from gpuyard.api.http import metrics as metrics_api
from gpuyard.api.http.body_limit import BodyLimit
from gpuyard.api.http.database_outage import DatabaseOutage
from gpuyard.api.http.nul_guard import NulGuard
from gpuyard.api.http.rate_limit import RateLimit, RateLimiter, RateLimits, seconds_of
from gpuyard.api.http.request_ids import RequestIds
from gpuyard.api.http.route_mount import mount_routes
from gpuyard.api.rest import catalog, clusters
from gpuyard.api.rest import cluster_logs as cluster_logs_api
from gpuyard.api.rest import cluster_metrics as cluster_metrics_api
from gpuyard.api.rest import endpoints as endpoints_api
from gpuyard.api.rest import host_images as host_images_api
from gpuyard.api.rest import hosts as hosts_api
from gpuyard.api.rest import images as images_api
from gpuyard.api.rest import network_volumes as network_volumes_api
from gpuyard.api.rest import orphans as orphans_api
from gpuyard.api.rest import plans as plans_api
from gpuyard.api.rest import proxy as proxy_api
from gpuyard.api.rest import reserved_ips as reserved_ips_api
from gpuyard.api.rest import security_groups as security_groups_api
from gpuyard.api.rest import snapshots as snapshots_api
from gpuyard.api.rest import ssh_keys as ssh_keys_api
from gpuyard.api.rest import templates as templates_api
from gpuyard.api.rest.tenancy import accounts as accounts_api
from gpuyard.api.rest.tenancy import audit as audit_api
from gpuyard.api.rest.tenancy import billing
from gpuyard.api.rest.tenancy import budgets as budgets_api
from gpuyard.api.rest.tenancy import me as me_api
from gpuyard.api.rest.tenancy import projects as projects_api
from gpuyard.api.rest.tenancy import quotas as quotas_api
from gpuyard.api.rest.tenancy import registry_auths as registry_auths_api
from gpuyard.api.rest.tenancy import secrets as secrets_api
from gpuyard.api.runpod_v2 import routers as runpod_v2_routers
from gpuyard.api.runpod_v2.fast_reads import FAST_READS
from gpuyard.api.runpod_v2.serverless_jobs import body_limit as job_body_limit
from gpuyard.api.runpod_v2.serverless_workers import body_limit as worker_body_limit
from gpuyard.api.state import AppState
from gpuyard.api.training import routes as training
from gpuyard.core.errors import GpuyardError
from gpuyard.observability.counters import record_auto_termination
from gpuyard.observability.metrics import Metrics
from gpuyard.reconciler.duties.autoterminate import Fired
from gpuyard.reconciler.duties.proxy_sync import ProxySync
from gpuyard.reconciler.lanes import SLOW
from gpuyard.reconciler.leases import TRAINING_DUTY
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.training.autoterm import TrainingAutoTerminator
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.reconciler.training.slurm_jobs import SqueueJobs
from gpuyard.reconciler.wiring import build_reconciler, lanes_for
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.fleet import Fleet, HostEngine, RuntimeFactory
from gpuyard.services.access.proxy_routes import proxy_api_secret
from gpuyard.services.clock import Clock, SystemClock
from gpuyard.services.context import Context
from gpuyard.services.fleet.health import record_inventory
from gpuyard.services.installation.bootstrap import first_start, open_store, register_local_host
from gpuyard.services.installation.identity import ensure_installation
from gpuyard.services.installation.leases import LeaseKeeper
from gpuyard.services.tenancy.auth import IssuedKey
from gpuyard.settings import Settings
from gpuyard.store.sqlite_reader import reader_for

# Makes the training operator of a server: (context, the reconciler's work queue, the
# fleet whose hosts' engines run the nodes, the queue lane of a host's jobs, whether
# this replica owns the training duty now).
TrainingOperatorFactory = Callable[
    [Context, WorkQueue, Fleet, Callable[[int | None], str], Callable[[], bool]],
    TrainingOperator,
]


@dataclass
class Server:
    app: FastAPI
    ctx: Context
    reconciler: Reconciler
    admin_key: IssuedKey | None


def serverless_body_limit(method: str, path: str) -> int | None:
    """The larger body limits of serverless jobs' inputs and workers' results."""
    return job_body_limit(method, path) or worker_body_limit(method, path)


def build_server(
    settings: Settings,
    runtime: Runtime,
    *,
    clock: Clock | None = None,
    engine_url: str | None = None,
    run_reconciler: bool = True,
    training_operator: TrainingOperatorFactory | None = None,
    rate_limit_clock: Clock | None = None,
    host_runtimes: RuntimeFactory | None = None,
    proxy: Callable[[Context], ProxySync] | None = None,
    freeze_gc: bool = True,
) -> Server:
    """Migrate the store, seed it, register the local host and assemble the app.

    The reconciler thread starts with the app (lifespan) when ``run_reconciler``;
    it also runs one pass at start so work left by a crash resumes at once.
    ``rate_limit_clock`` (tests): the rate limiter's time instead of monotonic time.
    ``host_runtimes``: makes the runtime of each host added through the API (None:
    ``runtime`` drives every host, as in tests on one engine).
    ``proxy``: makes the HTTP proxy's sync loop (None: no proxy, proxy URLs null).
    ``freeze_gc``: at start, move everything built so far out of the collector's sight
    (a server's process; False where one process builds many apps, as tests do: what
    is frozen is never freed, so each app would stay in memory for good).
    """
    engine, sessions = open_store(settings)
    with sessions.begin() as session:
        ownership = ensure_installation(session)
    # Every host added through the API gets its own runtime; this machine's is
    # ``runtime``. Binding ties them to this installation: they see only our objects.
    fleet = Fleet(runtime, host_runtimes)
    ctx = Context(
        sessions=sessions,
        settings=settings,
        ownership=ownership,
        clock=clock or SystemClock(),
        cluster_reader=reader_for(settings.effective_database_url),
        ports_held=partial(_ports_held, fleet, settings),
    )
    admin_key = first_start(ctx)
    host_id = register_local_host(ctx, engine_url)
    # Several replicas share a PostgreSQL database: each duty has one owner at a time.
    # SQLite serves one process, which owns everything.
    leases = LeaseKeeper.for_replica(ctx) if _shared_database(ctx) else None
    # Training operations and node recoveries run on the reconciler's one work queue,
    # each cluster's on the lanes of its host's engine, its nodes on that engine.
    lanes = lanes_for(ctx, fleet)
    operator = (
        training_operator(
            ctx,
            lanes.queue,
            fleet,
            partial(lanes.lane_of, SLOW),
            partial(leases.holds, TRAINING_DUTY) if leases is not None else _owned,
        )
        if training_operator is not None
        else None
    )
    metrics = Metrics(ctx)

    def count_fired(fired: Fired) -> None:
        record_auto_termination(ctx, fired.rule)

    reconciler = build_reconciler(
        ctx,
        fleet,
        observe_every_s=ctx.settings.observe_interval_s,
        host_id=host_id,
        leases=leases,
        dispatcher=lanes,
        # Training clusters' auto-termination: the clusters' watcher, Slurm's queue
        # read on each controller's host.
        training=TrainingAutoTerminator(ctx, SqueueJobs(operator.on_host))
        if operator is not None
        else None,
        on_fire=count_fired,
        on_pass=metrics.observe_pass,
        on_full_pass=metrics.count_full_pass,
        on_host_answered=partial(_describe_host, ctx),
    )
    if operator is not None:
        ctx.training_wake.answer(operator.wake)
        ctx.training_edge.answer(operator.sync_edge)

    proxy_sync = proxy(ctx) if proxy is not None else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Everything imported and built so far lives as long as the process: move it out
        # of the collector's sight, so full collections stay short under load (they
        # otherwise walk SQLAlchemy's and FastAPI's large object graphs every time).
        if freeze_gc:
            gc.collect()
            gc.freeze()
        if run_reconciler:
            reconciler.start()
            reconciler.wake()
        if operator is not None:
            operator.start()
        if proxy_sync is not None:
            proxy_sync.start()
        try:
            yield
        finally:
            if proxy_sync is not None:
                proxy_sync.stop()
            if operator is not None:
                operator.stop()
            if run_reconciler:
                reconciler.stop()
            if leases is not None:
                # Hand our duties to the other replicas now, not after the lease time.
                leases.release_all()
            engine.dispose()

    app = FastAPI(
        title="gpuyard",
        version=__version__,
        description="Self-hostable GPU cloud: clusters on real containers (REST v1/v2, GraphQL).",
        lifespan=lifespan,
        docs_url=None,  # served from the bundled Swagger UI (api/console/docs_page.py)
        redoc_url=None,
    )
    docs_page.install(app)
    guide_page.install(app)
    app.state.gpuyard = AppState(
        ctx=ctx,
        runtime=runtime,
        training=operator,
        host_runtime=fleet.for_host,
    )
    errors.install(app)
    method_not_allowed.install(app)
    # Inside the fast path (which records nothing): one id per routed request.
    app.add_middleware(RequestIds)
    app.add_middleware(ClusterReadFastPath, more=FAST_READS)
    # Ahead of the fast path and routing: no NUL in a path or query reaches a query.
    app.add_middleware(NulGuard)
    # Ahead of routing and every body read: an oversize body is refused unread (413).
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, path_limits=serverless_body_limit
    )
    # Ahead of everything that does work (the fast path, body reads, routing); its
    # buckets' clock is monotonic time unless a test injects one.
    limits = RateLimits.from_settings(settings)
    if limits.enabled:
        limiter = RateLimiter(limits, seconds_of(rate_limit_clock) if rate_limit_clock else None)
        app.state.rate_limiter = limiter
        app.add_middleware(
            RateLimit,
            limiter=limiter,
            proxy_secret=proxy_api_secret(settings) if proxy_sync is not None else None,
        )
    # Metrics: added last, so its latency middleware is outermost and times the fast path.
    metrics_api.install(app, metrics, settings)
    console_api.install(app)  # the web console, its sign-in and session cookie
    # Outermost: a database outage (a failover) raised ahead of routing is a 503 too.
    app.add_middleware(DatabaseOutage)
    for router in (
        clusters.router,
        cluster_logs_api.router,
        cluster_metrics_api.router,
        catalog.router,
        hosts_api.router,
        billing.router,
        projects_api.router,
        plans_api.router,
        ssh_keys_api.router,
        secrets_api.router,
        registry_auths_api.router,
        images_api.router,
        host_images_api.router,
        reserved_ips_api.router,
        security_groups_api.router,
        templates_api.router,
        endpoints_api.router,
        orphans_api.router,
        snapshots_api.router,
        network_volumes_api.router,
        terminal_api.router,
        proxy_api.router,
        accounts_api.router,
        quotas_api.router,
        budgets_api.router,
        audit_api.router,
        me_api.router,
    ):
        mount_routes(app, router)
    # GraphQL's contract is its own schema (introspection), fuzzed as such; a JSON
    # schema cannot say which query strings are valid, so OpenAPI leaves it out.
    app.include_router(graphql_router(settings), include_in_schema=False)
    for router in (training.router, *runpod_v2_routers()):
        mount_routes(app, router)

    @app.get("/healthz", tags=["meta"])
    async def healthz() -> JSONResponse:
        # The engine ping runs on asyncio's own executor, not the worker pool that
        # sync routes share: requests waiting on a database lock never stall it.
        problem = await asyncio.to_thread(runtime.available)
        return JSONResponse({"ok": True, "engine": problem or "ok"})

    return Server(app=app, ctx=ctx, reconciler=reconciler, admin_key=admin_key)


def _describe_host(ctx: Context, host: HostEngine, runtime: Runtime) -> None:
    """A host that answers (first, or again): keep what its engine says it has."""
    inventory = runtime.inventory()
    if inventory is not None:
        record_inventory(ctx, host.host_id, inventory)


def _owned() -> bool:
    """A lone server owns the training duty."""
    return True


def _shared_database(ctx: Context) -> bool:
    """Whether other replicas may share this database (PostgreSQL)."""
    return ctx.settings.effective_database_url.startswith("postgresql")


def _ports_held(
    fleet: Fleet, settings: Settings, host_id: int, cluster_id: str
) -> frozenset[tuple[int, str]]:
    """Context.ports_held: the host's answer, empty where its runtime is not known."""
    try:
        runtime = fleet.for_host(host_id)
    except GpuyardError:
        return frozenset()
    return runtime.host_ports_in_use(settings.port_range_start, settings.port_range_end, cluster_id)
