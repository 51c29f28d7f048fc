"""Builds the reconciler and its whole graph of collaborators, in one place: each is
handed what it needs at construction, nothing is wired afterwards."""

from __future__ import annotations

from collections.abc import Callable

from gpuyard.reconciler.clusters.collection import ContainerCollector
from gpuyard.reconciler.clusters.driver import ClusterDriver
from gpuyard.reconciler.clusters.snapshots import SnapshotWorker, repositories_for
from gpuyard.reconciler.duties.autoterminate import AutoTerminator, Fired
from gpuyard.reconciler.duties.budgets import BudgetWatch
from gpuyard.reconciler.duties.drains import DrainMoves
from gpuyard.reconciler.duties.engine_checks import EngineChecks
from gpuyard.reconciler.duties.heartbeats import Heartbeats, HostAnswered
from gpuyard.reconciler.duties.observation import Observation
from gpuyard.reconciler.duties.resting_gpus import RestingGpus
from gpuyard.reconciler.duties.utilization import UtilizationRecorder
from gpuyard.reconciler.duties.volume_scans import VolumeScans
from gpuyard.reconciler.duties.volume_usage import VolumeUsage
from gpuyard.reconciler.duties.webhooks import WebhookSender
from gpuyard.reconciler.hosts import HostDirectory
from gpuyard.reconciler.lanes import Dispatcher
from gpuyard.reconciler.leases import AllMine, Leases
from gpuyard.reconciler.loop import Duties, Reconciler
from gpuyard.reconciler.restarts import RestartSchedule
from gpuyard.reconciler.serverless.ports import QueuePort
from gpuyard.reconciler.serverless.queue_port import ServiceQueue
from gpuyard.reconciler.serverless.scaler import ServerlessScaler
from gpuyard.reconciler.training.autoterm import TrainingAutoTerminator
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.fleet import Fleet
from gpuyard.services.context import Context
from gpuyard.services.installation.replica import replica_id
from gpuyard.services.serverless.callback import callback_base_url


def fleet_of(runtime: Runtime | Fleet) -> Fleet:
    """``runtime`` as a fleet (one runtime serving every host)."""
    return runtime if isinstance(runtime, Fleet) else Fleet(runtime)


def lanes_for(ctx: Context, fleet: Fleet) -> Dispatcher:
    """The reconciler's work queue and lanes on ``fleet``'s engines, for a server that
    runs other work on them (the training operator) before the reconciler is built. The
    context's use cases wake it (``ctx.wake``)."""
    return Dispatcher.create(ctx.settings.reconcile_workers, fleet.key_of, ctx.work)


def build_reconciler(
    ctx: Context,
    runtime: Runtime | Fleet,
    *,
    observe_every_s: float = 5.0,
    volume_scan_every_s: float = 30.0,
    host_id: int | None = None,
    leases: Leases | None = None,
    dispatcher: Dispatcher | None = None,
    training: TrainingAutoTerminator | None = None,
    on_fire: Callable[[Fired], None] | None = None,
    on_pass: Callable[[float, float], None] | None = None,
    on_full_pass: Callable[[], None] | None = None,
    on_host_answered: HostAnswered | None = None,
    serverless_queue: QueuePort | None = None,
) -> Reconciler:
    """The reconciler of every host of ``runtime`` (a Fleet, or one runtime serving
    every host), bound to this installation.

    ``host_id``: the host this server runs on (None: the first host). ``leases``: the
    duties this replica owns (None: all). ``dispatcher``: the lanes made by
    :func:`lanes_for` (None: new ones). ``training``: training clusters'
    auto-termination. Hooks: ``on_fire`` (a rule fired), ``on_pass`` (lag and duration
    of each loop pass), ``on_full_pass`` (every engine observed), ``on_host_answered``
    (a host answers for the first time or again). ``serverless_queue``: the job queue
    the serverless scaler reads and gives lost workers' jobs back to (None: the queue's
    own use cases, reconciler/serverless/queue_port.py)."""
    fleet = fleet_of(runtime)
    hosts = HostDirectory(ctx, fleet, host_id)
    fleet.set_hosts(hosts.host_engine)
    fleet.bind(ctx.ownership)
    leases = leases or AllMine()
    dispatcher = dispatcher or lanes_for(ctx, fleet)
    restarts = RestartSchedule(ctx.clock.now, dispatcher.wakeup.wake)
    snapshots = SnapshotWorker(ctx, fleet.for_host, repositories_for(ctx.settings), replica_id())
    driver = ClusterDriver(ctx, fleet.for_host, storage=snapshots, on_restart_due=restarts.due_at)
    autoterm = AutoTerminator(ctx, fleet.for_host, on_fire=on_fire, training=training)
    volume_usage = VolumeUsage(ctx)
    volume_scans = VolumeScans(ctx, hosts, volume_scan_every_s)
    resting_gpus = RestingGpus(ctx, volume_scan_every_s)
    observation = Observation(
        ctx,
        hosts,
        dispatcher,
        leases,
        recover=driver.recover,
        collector=ContainerCollector(ctx, driver.records, fleet.for_host),
        volume_usage=volume_usage,
        volume_scans=volume_scans,
        forget_snapshots=snapshots.forget_unwanted,
    )
    checks = EngineChecks(
        hosts,
        dispatcher,
        leases,
        heartbeats=Heartbeats(ctx, hosts, on_host_answered),
        observation=observation,
        drains=DrainMoves(ctx, driver.delete_old_copies),
        resting_gpus=resting_gpus,
        observe_every_s=observe_every_s,
        on_full_pass=on_full_pass,
    )
    duties = Duties(
        autoterm=autoterm,
        utilization=UtilizationRecorder(ctx, fleet.for_host, autoterm.gpu_uuids),
        budget=BudgetWatch(ctx, dispatch=WebhookSender(ctx, dispatcher).send),
        volume_usage=volume_usage,
        volume_scans=volume_scans,
        resting_gpus=resting_gpus,
        observation=observation,
        checks=checks,
        serverless=ServerlessScaler(
            ctx,
            serverless_queue or ServiceQueue(ctx.settings),
            base_url=callback_base_url(ctx.settings),
        ),
    )
    return Reconciler(
        ctx,
        fleet,
        hosts=hosts,
        dispatcher=dispatcher,
        leases=leases,
        driver=driver,
        snapshots=snapshots,
        restarts=restarts,
        duties=duties,
        on_pass=on_pass,
    )
