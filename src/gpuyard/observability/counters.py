"""Event counters that code outside the API increments, found through the Context.

Each server has its own registry (several servers may share a test process), so a
counter is looked up from the server's :class:`~gpuyard.services.context.Context`
instead of being a module global. The context is only a key (its identity, never
read), so this module needs nothing of the services. Where no server bound counters
to the context (unit tests of a service alone), recording is a no-op.

    from gpuyard.observability.counters import record_auto_termination
    record_auto_termination(ctx, "cost_limit")   # gpuyard_auto_terminations_total{rule=}
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry, Counter

from gpuyard.core.autoterm import Rule

AUTO_TERMINATIONS = "gpuyard_auto_terminations_total"


class EventCounters:
    """The event counters of one server, registered in its registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.auto_terminations = Counter(
            AUTO_TERMINATIONS,
            "Clusters stopped or terminated by an auto-termination rule, by rule.",
            ["rule"],
            registry=registry,
        )
        for rule in Rule:  # every rule's series exists from the start, at 0
            self.auto_terminations.labels(rule=rule.value)

    def auto_termination(self, rule: str) -> None:
        self.auto_terminations.labels(rule=rule).inc()


_lock = threading.Lock()
_bound: dict[int, EventCounters] = {}


def bind(ctx: object, counters: EventCounters) -> None:
    """Make ``counters`` the ones recorded through ``ctx`` (for as long as it lives)."""
    key = id(ctx)
    with _lock:
        _bound[key] = counters
    weakref.finalize(ctx, _unbind, key)


def _unbind(key: int) -> None:
    with _lock:
        _bound.pop(key, None)


def counters_for(ctx: object | None) -> EventCounters | None:
    if ctx is None:
        return None
    return _bound.get(id(ctx))


def record_auto_termination(ctx: object | None, rule: str) -> None:
    """Count one cluster stopped/terminated by auto-termination ``rule`` (a
    :class:`~gpuyard.core.autoterm.Rule` or its value: ``max_runtime``, ``cost_limit``,
    ``idle``). Safe from any thread; a no-op when ``ctx`` has no metrics."""
    counters = counters_for(ctx)
    if counters is not None:
        counters.auto_termination(str(rule))
