"""Heartbeats: each engine is pinged with a short timeout and what it said is recorded
for its hosts (services/fleet/health.py counts the misses). A host that answers for the
first time here, or again after it did not, is described (its inventory read) on the
engine's urgent lane, never on the heartbeat's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuyard.reconciler.hosts import HostDirectory
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.fleet import HostEngine
from gpuyard.services.context import Context
from gpuyard.services.fleet.health import record_heartbeat

log = logging.getLogger(__name__)

# Told (outside any transaction) when a host first answers or comes back, e.g. to
# discover its inventory.
HostAnswered = Callable[[HostEngine, Runtime], None]


class Heartbeats:
    """The heartbeats of the engines of ``hosts``; ``on_host_answered`` describes a host
    that answers (None: nothing to do)."""

    def __init__(
        self, ctx: Context, hosts: HostDirectory, on_host_answered: HostAnswered | None = None
    ) -> None:
        self.ctx = ctx
        self.hosts = hosts
        self.on_host_answered = on_host_answered
        self._lock = threading.Lock()
        # Hosts whose inventory this process has read, and those a heartbeat found
        # answering for the first time or again, to be described.
        self._described: set[int] = set()
        self._to_describe: set[int] = set()

    def beat(self, key: str, host_ids: tuple[int, ...]) -> Runtime | None:
        """Ping one engine with the heartbeat's own short timeout and record what it
        said for its hosts: the runtime when it answered, None when it did not."""
        runtime = self.hosts.runtime_of(host_ids)
        problem = runtime.heartbeat(self.ctx.settings.heartbeat_timeout_s)
        if host_ids:
            changed = record_heartbeat(
                self.ctx, host_ids, problem, misses_allowed=self.ctx.settings.heartbeat_misses
            )
            if problem is None:
                # Described when it first answers here, and again when it comes back.
                with self._lock:
                    fresh = [h for h in host_ids if h not in self._described]
                    self._described.update(host_ids)
                    self._to_describe.update(changed, fresh)
        if problem is not None:
            # An engine that does not answer is not evidence that anything died:
            # nothing on it is recovered or collected until it answers.
            log.warning("engine %s does not answer: %s", key, problem)
            return None
        return runtime

    def describe(self, host_ids: tuple[int, ...], runtime: Runtime) -> None:
        """Describe the hosts of ``host_ids`` a heartbeat found answering anew."""
        hook = self.on_host_answered
        with self._lock:
            due = sorted(self._to_describe.intersection(host_ids))
            self._to_describe.difference_update(due)
        if hook is None:
            return
        for host_id in due:
            host = self.hosts.hosts.get(host_id)
            if host is not None:
                try:
                    hook(host, runtime)
                except Exception:  # inventory is retried on the next change
                    log.exception("host %s: after-answer hook failed", host_id)
