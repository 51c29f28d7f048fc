"""The server on real container engines: this machine's engine and every added host's,
training clusters on real Slurm nodes (``gpuyard serve``; ``create_app`` for uvicorn).

``api/app.py``'s ``build_server`` assembles a server on any runtime (tests give it the
fake); this module chooses the real ones from the settings.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fastapi import FastAPI

from gpuyard.api.app import Server, TrainingOperatorFactory, build_server
from gpuyard.reconciler.duties.proxy_sync import ProxySync
from gpuyard.reconciler.training.edge import HostEdge
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.engines.url import detect_engine_url, is_local_engine
from gpuyard.runtimes.fleet import Fleet
from gpuyard.runtimes.hosts.runtimes import host_runtime_factory, local_volume_images
from gpuyard.runtimes.slurm.host_nodes import HostNodes
from gpuyard.runtimes.slurm.nodes import SlurmNodeRuntime
from gpuyard.services.context import Context
from gpuyard.settings import Settings


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """The ASGI app for ``settings`` (uvicorn factory use)."""
    if runtime is None:
        return engine_server(settings, detect_engine_url(settings.engine_url)).app
    return build_server(settings, runtime).app


def engine_server(settings: Settings, url: str | None) -> Server:
    """The server on real engines: this machine's at ``url``, every added host's from
    its engine URL (ssh://, tcp://, unix://), training clusters on real Slurm nodes."""

    policy = engine_policy(settings, url)
    operator = training_operator_factory(settings, url) if settings.training_enabled else None
    images = local_volume_images(url, settings.volume_image_dir, settings.volume_spares)
    return build_server(
        settings,
        DockerEngineRuntime(url, policy=policy, volume_images=images),
        engine_url=url,
        training_operator=operator,
        host_runtimes=host_runtime_factory(
            settings.home,
            policy,
            settings.remote_engine_timeout_s,
            volume_image_dir=settings.volume_image_dir,
            volume_spares=settings.volume_spares,
        ),
        proxy=partial(ProxySync.from_settings, settings=settings)
        if settings.proxy_enabled
        else None,
    )


def engine_policy(settings: Settings, engine_url: str | None) -> EnginePolicy:
    """The engine policy of a server on ``engine_url``: the operator's settings, and the
    host firewall managed when the engine is on this machine."""

    return EnginePolicy(
        allow_unenforced_limits=settings.allow_unenforced_limits,
        manage_host_firewall=is_local_engine(engine_url),
        allow_unisolated_networks=settings.allow_unisolated_networks,
        allow_unenforced_disk=settings.allow_unenforced_disk,
    )


def training_operator_factory(
    settings: Settings, engine_url: str | None
) -> TrainingOperatorFactory:
    """Training clusters on real Slurm nodes, reached over SSH through DNAT rules on
    the host each controller runs on (runtimes/hosts/edge.py): no user traffic passes
    through this process. A cluster's nodes run on the engine of the host it was placed
    on: this machine's at ``engine_url``, or a fleet host's through that host's runtime
    (its SSH tunnel, TLS and firewall), with the node image copied there from this
    machine's engine when the host lacks it."""

    def make(
        ctx: Context,
        queue: WorkQueue,
        fleet: Fleet,
        lane_of: Callable[[int | None], str],
        owns: Callable[[], bool],
    ) -> TrainingOperator:
        local = SlurmNodeRuntime(engine_url, policy=engine_policy(settings, engine_url))

        def on_engine(runtime: Runtime) -> SlurmNodeRuntime:
            engine = runtime.docker_engine()
            if engine is None:
                raise TypeError(f"{type(runtime).__name__} has no container engine for nodes")
            return SlurmNodeRuntime(None, engine=engine, image_source=local.engine)

        hosts = HostNodes(fleet, local, on_engine)

        def edge_on(host_id: int | None) -> HostEdge | None:
            # The rules go where the controller's engine is, through the runner of that
            # host's isolation chain (this machine's shell, or the host's SSH).
            return hosts.on_host(host_id).engine.host_edge()

        operator = TrainingOperator(
            ctx,
            local,
            edge_on,
            hosts=hosts,
            lane_of=lane_of,
            ready_timeout_s=settings.training_ready_timeout_s,
            drain_timeout_s=settings.training_drain_timeout_s,
            lifecycle_timeout_s=settings.training_lifecycle_timeout_s,
            bind_address=settings.training_bind_address,
            queue=queue,
            owns=owns,
        )
        return operator

    return make
