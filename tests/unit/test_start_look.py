"""A container start looks at the container once, beside putting the host firewall's
isolation jump back first (runtimes/engines/runtime.py ``start``): the readiness
wait's first observe is answered from that look, not from a second inspect, and only
once; the isolation is back in place before the start returns."""

from __future__ import annotations

import threading
from typing import Any

from gpuyard.runtimes.base import ContainerState
from gpuyard.runtimes.engines.runtime import JUST_STARTED_S
from tests.unit.test_network_gone_at_start import StandInEngine, runtime_on, spec


class LookedAt(StandInEngine):
    """The stand-in engine, counting inspects and answering a running state."""

    def __init__(self) -> None:
        super().__init__()
        self.inspects = 0

    def inspect_container(self, name: str) -> dict[str, Any]:
        self.inspects += 1
        info = super().inspect_container(name)
        running = name in self.started
        return {**info, "Id": "id-1", "State": {"Status": "running" if running else "created"}}

    def stop(self, name: str, **_: Any) -> None:
        if name in self.started:
            self.started.remove(name)


def test_the_first_observe_after_a_start_is_its_look_and_isolation_comes_first() -> None:
    stand_in = LookedAt()
    now = [100.0]
    rt = runtime_on(stand_in)
    rt._clock = lambda: now[0]
    kept = threading.Event()

    def keep_first() -> None:
        threading.Event().wait(0.05)  # slower than the look: the start still waits
        kept.set()

    rt.engine.keep_isolation_first = keep_first  # type: ignore[method-assign]
    rt.create(spec(7))
    rt.start("c1")
    assert kept.is_set()
    looked = stand_in.inspects
    assert rt.observe("c1").state is ContainerState.RUNNING
    assert stand_in.inspects == looked  # the start's look
    assert rt.observe("c1").state is ContainerState.RUNNING
    assert stand_in.inspects == looked + 1  # only once


def test_a_stale_or_stopped_look_is_not_answered() -> None:
    stand_in = LookedAt()
    now = [100.0]
    rt = runtime_on(stand_in)
    rt._clock = lambda: now[0]
    rt.create(spec(7))
    rt.start("c1")
    now[0] += JUST_STARTED_S + 0.1
    looked = stand_in.inspects
    rt.observe("c1")
    assert stand_in.inspects == looked + 1  # too old: asked again
    rt.start("c1")
    rt.stop("c1")
    assert rt.observe("c1").state is ContainerState.MISSING  # not what start saw


def test_a_create_after_a_start_forgets_the_look() -> None:
    stand_in = LookedAt()
    rt = runtime_on(stand_in)
    rt.create(spec(7))
    rt.start("c1")
    stand_in.started.clear()  # the engine's answer once the container is made again
    rt.create(spec(7))
    looked = stand_in.inspects
    assert rt.observe("c1").state is ContainerState.CREATED  # not what start saw
    assert stand_in.inspects == looked + 1
