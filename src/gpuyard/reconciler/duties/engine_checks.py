"""The engine checks of a pass: one heartbeat per engine this replica owns, on the
engine's heartbeat lane; when it answers, on its urgent lane, the hosts it found
answering anew are described and, when due, the engine is observed and what drains
move off its hosts is moved. A pass is full once every engine was observed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from gpuyard.reconciler.duties.drains import DrainMoves
from gpuyard.reconciler.duties.heartbeats import Heartbeats
from gpuyard.reconciler.duties.observation import Observation
from gpuyard.reconciler.duties.resting_gpus import RestingGpus
from gpuyard.reconciler.hosts import HostDirectory
from gpuyard.reconciler.lanes import HEARTBEAT, URGENT, Dispatcher
from gpuyard.reconciler.leases import MAINTENANCE_DUTY, Leases
from gpuyard.runtimes.base import Runtime

log = logging.getLogger(__name__)


class _FullPass:
    """Counts down the engine checks one pass queued: complete (``done`` called once)
    when the last has finished and every one of them observed its engine. A check
    replaced by a later pass's never reports, so that pass is simply not full."""

    def __init__(self, engines: int, done: Callable[[], None]) -> None:
        self._left = engines
        self._all_observed = engines > 0
        self._done = done
        self._lock = threading.Lock()

    def engine_done(self, observed: bool) -> None:
        with self._lock:
            self._left -= 1
            self._all_observed = self._all_observed and observed
            finished = self._left == 0 and self._all_observed
        if finished:
            self._done()


class EngineChecks:
    """Heartbeats and observations of every engine this replica owns. ``on_full_pass``
    (metrics) is called after each full pass; ``full_passes`` counts them (the first
    one after ``started_at`` is logged with its delay)."""

    def __init__(
        self,
        hosts: HostDirectory,
        dispatcher: Dispatcher,
        leases: Leases,
        *,
        heartbeats: Heartbeats,
        observation: Observation,
        drains: DrainMoves,
        resting_gpus: RestingGpus,
        observe_every_s: float = 5.0,
        on_full_pass: Callable[[], None] | None = None,
    ) -> None:
        self.hosts = hosts
        self.dispatcher = dispatcher
        self.leases = leases
        self.heartbeats = heartbeats
        self.observation = observation
        self.drains = drains
        self.resting_gpus = resting_gpus
        self.observe_every_s = observe_every_s
        self.on_full_pass = on_full_pass
        self._last_observe: dict[str, float] = {}
        self.full_passes = 0
        self.started_at: float | None = None

    def owned(self) -> list[tuple[str, tuple[int, ...]]]:
        """The engines this replica owns now: (engine key, the host ids it serves)."""
        return [(key, ids) for key, ids in self.hosts.engines() if self.leases.holds(key)]

    def queue_all(self, *, force_observe: bool = False) -> None:
        """Queue one heartbeat (and observation, when due) per engine this replica
        owns, each on its engine's own lane. The pass is full once every one of them
        has observed its engine (``_FullPass``)."""
        if self.leases.holds(MAINTENANCE_DUTY) and self.resting_gpus.due():
            # A safety net (a crash between a status change and the release): as often
            # as the volume scan, not at every heartbeat.
            self.resting_gpus.free()
        owned = self.owned()
        tracker = _FullPass(len(owned), self._full_pass_done)
        for key, host_ids in owned:
            self.dispatcher.submit(
                ("heartbeat", key),
                self.dispatcher.lane(HEARTBEAT, key),
                partial(self._heartbeat_tracked, tracker, key, host_ids, force_observe),
            )

    def check(self, key: str, host_ids: tuple[int, ...], force_observe: bool) -> bool:
        """Heartbeat one engine and observe it when due, in this thread; whether it
        was observed."""
        runtime = self.heartbeats.beat(key, host_ids)
        if runtime is None:
            return False
        return self.after_answer(key, host_ids, runtime, force_observe)

    def after_answer(
        self, key: str, host_ids: tuple[int, ...], runtime: Runtime, force_observe: bool
    ) -> bool:
        """What follows an answered heartbeat, on the engine's urgent lane: describe
        hosts that answer for the first time or again, and observe the engine when due
        (whether it was observed)."""
        self.heartbeats.describe(host_ids, runtime)
        last = self._last_observe.get(key, 0.0)
        if force_observe or time.monotonic() - last >= self.observe_every_s:
            self._last_observe[key] = time.monotonic()
            observed = self.observation.observe_engine(key, host_ids)
            # Moves away from these hosts: drained clusters go, old copies are deleted.
            self.drains.run(host_ids)
            return observed
        return False

    def _heartbeat_tracked(
        self, tracker: _FullPass, key: str, host_ids: tuple[int, ...], force_observe: bool
    ) -> None:
        """Heartbeat one engine; if it answered, hand its observation to the engine's
        urgent lane (the pass is told there)."""
        handed_on = False
        try:
            runtime = self.heartbeats.beat(key, host_ids)
            if runtime is not None:
                handed_on = self.dispatcher.submit(
                    ("engine", key),
                    self.dispatcher.lane(URGENT, key),
                    partial(self._observe_tracked, tracker, key, host_ids, runtime, force_observe),
                )
        finally:
            if not handed_on:
                tracker.engine_done(False)

    def _observe_tracked(
        self,
        tracker: _FullPass,
        key: str,
        host_ids: tuple[int, ...],
        runtime: Runtime,
        force_observe: bool,
    ) -> None:
        observed = False
        try:
            observed = self.after_answer(key, host_ids, runtime, force_observe)
        finally:
            tracker.engine_done(observed)

    def _full_pass_done(self) -> None:
        self.full_passes += 1
        if self.full_passes == 1 and self.started_at is not None:
            log.info(
                "first full reconcile pass completed %.3f s after the reconciler started",
                time.monotonic() - self.started_at,
            )
        hook = self.on_full_pass
        if hook is not None:
            try:
                hook()
            except Exception:  # metrics never stop the loop
                log.exception("reconciler full-pass hook failed")
