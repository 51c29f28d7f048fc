"""api/fast/fastpath.py: requests for the same cluster and account that miss the view cache
at once share one read on the lane."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from gpuyard.api.fast.fastpath import _shared_read
from gpuyard.api.fast.view_cache import Rendered
from gpuyard.api.state import AppState
from gpuyard.core.errors import ClusterNotFound

ANSWER = Rendered(project_id=1, data=b"{}")


class HeldLane:
    """A read lane whose reads wait until released; it counts them."""

    def __init__(self, result: Rendered | Exception = ANSWER) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.result = result

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.calls.append(args)
        self.started.set()
        await self.release.wait()
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class State:
    def __init__(self, lane: HeldLane) -> None:
        self.reads = lane
        self.ctx = object()
        self.views = object()


def _state(lane: HeldLane) -> AppState:
    return cast(AppState, State(lane))


def test_concurrent_misses_share_one_read() -> None:
    async def main() -> None:
        lane = HeldLane()
        state = _state(lane)
        waiting = [asyncio.ensure_future(_shared_read(state, 7, "c1")) for _ in range(5)]
        other = asyncio.ensure_future(_shared_read(state, 8, "c1"))  # another account
        await lane.started.wait()
        await asyncio.sleep(0)
        lane.release.set()
        assert await asyncio.gather(*waiting) == [ANSWER] * 5
        assert await other == ANSWER
        assert sorted(args[2] for args in lane.calls) == [7, 8]
        # Landed: the next miss reads again.
        lane.release.set()
        assert await _shared_read(state, 7, "c1") == ANSWER
        assert len(lane.calls) == 3

    asyncio.run(main())


def test_a_request_that_goes_away_leaves_the_read_to_the_others() -> None:
    async def main() -> None:
        lane = HeldLane()
        state = _state(lane)
        first = asyncio.ensure_future(_shared_read(state, 7, "c1"))
        second = asyncio.ensure_future(_shared_read(state, 7, "c1"))
        await lane.started.wait()
        first.cancel()
        lane.release.set()
        assert await second == ANSWER
        assert first.cancelled()
        assert len(lane.calls) == 1

    asyncio.run(main())


def test_a_failed_read_fails_every_waiter() -> None:
    async def main() -> None:
        lane = HeldLane(ClusterNotFound("cluster 'c1' not found", {"cluster_id": "c1"}))
        state = _state(lane)
        waiting = [asyncio.ensure_future(_shared_read(state, 7, "c1")) for _ in range(3)]
        await lane.started.wait()
        lane.release.set()
        for w in waiting:
            with pytest.raises(ClusterNotFound):
                await w
        assert len(lane.calls) == 1

    asyncio.run(main())
