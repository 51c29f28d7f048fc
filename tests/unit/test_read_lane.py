"""ReadLane: blocking reads on their own threads, one hung read stalling no other."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gpuyard.api.fast.read_lane import ReadLane


def test_runs_off_the_loop_thread_and_returns_the_result() -> None:
    lane = ReadLane(threads=2)

    async def main() -> tuple[int, int]:
        return await lane.run(lambda a, b: (a + b, threading.get_ident()), 2, 3)

    total, thread = asyncio.run(main())
    assert total == 5
    assert thread != threading.get_ident()


def test_an_error_is_raised_to_the_awaiter() -> None:
    lane = ReadLane(threads=1)

    def boom() -> None:
        raise LookupError("no such row")

    async def main() -> None:
        await lane.run(boom)

    with pytest.raises(LookupError, match="no such row"):
        asyncio.run(main())


def test_a_hung_read_leaves_the_loop_and_the_other_threads_serving() -> None:
    lane = ReadLane(threads=2)
    release = threading.Event()
    entered = threading.Event()

    def hang() -> str:
        entered.set()
        assert release.wait(30)
        return "late"

    async def main() -> list[str]:
        held = asyncio.ensure_future(lane.run(hang))
        await asyncio.to_thread(entered.wait, 10)
        # The loop still runs tasks, and the lane's other thread takes new reads.
        quick = [await lane.run(str, n) for n in range(5)]
        assert not held.done()
        release.set()
        return [*quick, await held]

    try:
        assert asyncio.run(main()) == ["0", "1", "2", "3", "4", "late"]
    finally:
        release.set()


def test_never_more_threads_than_its_size() -> None:
    lane = ReadLane(threads=3)
    release = threading.Event()
    running = 0
    most = 0
    lock = threading.Lock()

    def read(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(30)
        with lock:
            running -= 1
        return n

    async def main() -> list[int]:
        reads = [asyncio.ensure_future(lane.run(read, n)) for n in range(10)]
        while lane.threads < 3:
            await asyncio.sleep(0.001)
        release.set()
        return list(await asyncio.gather(*reads))

    try:
        assert asyncio.run(main()) == list(range(10))
    finally:
        release.set()
    assert most <= 3
    assert lane.threads <= 3


def test_idle_threads_end() -> None:
    lane = ReadLane(threads=2, idle_s=0.01)

    async def main() -> None:
        await asyncio.gather(lane.run(str, 1), lane.run(str, 2))

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while lane.threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lane.threads == 0
    # A read after they ended starts a thread again.
    assert asyncio.run(_one(lane)) == "again"


async def _one(lane: ReadLane) -> str:
    return await lane.run(str, "again")


def test_a_lane_needs_a_thread() -> None:
    with pytest.raises(ValueError):
        ReadLane(threads=0)


def test_quick_reads_share_one_thread() -> None:
    """More threads only fight over the GIL: quick reads never start a second one."""
    lane = ReadLane(threads=4, stall_s=5.0)

    async def main() -> list[int]:
        return list(await asyncio.gather(*(lane.run(int, str(n)) for n in range(50))))

    assert asyncio.run(main()) == list(range(50))
    assert lane.threads == 1
