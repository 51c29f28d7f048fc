"""The shared runtime-stats cache: one fetch per key per ttl, single-flight for
concurrent misses, concurrent fetches for many keys, errors kept only briefly."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.services.fleet.runtime_stats import SharedTtlCache, StatsKey

WAIT_S = 10.0


class Clock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class InlinePool(Executor):
    """Runs each fetch at once on the caller's thread: no timing in the test."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args, **kwargs))
        return done


class Fetcher:
    """Counts its calls per key; answers ``value`` (or raises ``error``)."""

    def __init__(self, value: str = "v1") -> None:
        self.value = value
        self.error: Exception | None = None
        self.calls: dict[str, int] = {}
        self.gate: threading.Event | None = None
        self.entered = threading.Semaphore(0)
        self._lock = threading.Lock()

    def __call__(self, key: str) -> str:
        with self._lock:
            self.calls[key] = self.calls.get(key, 0) + 1
        self.entered.release()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        if self.error is not None:
            raise self.error
        return f"{self.value}:{key}"

    def total(self) -> int:
        return sum(self.calls.values())


def inline_cache(
    clock: Clock, ttl_s: float = 3.0, error_ttl_s: float = 0.5
) -> SharedTtlCache[str, str]:
    return SharedTtlCache(ttl_s=ttl_s, error_ttl_s=error_ttl_s, clock=clock, pool=InlinePool())


def test_a_value_is_served_for_the_ttl_then_fetched_again() -> None:
    clock, fetch = Clock(), Fetcher()
    cache = inline_cache(clock, ttl_s=3.0)
    assert cache.get("a", fetch) == "v1:a"
    fetch.value = "v2"
    clock.now += 2.9
    assert cache.get("a", fetch) == "v1:a"
    assert fetch.calls == {"a": 1}
    clock.now += 0.1
    assert cache.get("a", fetch) == "v2:a"
    assert fetch.calls == {"a": 2}


def test_each_key_is_fetched_once_however_often_it_is_asked() -> None:
    clock, fetch = Clock(), Fetcher()
    cache = inline_cache(clock)
    for _ in range(5):
        got = [f.result() for f in cache.get_many(["a", "b", "a"], fetch)]
        assert got == ["v1:a", "v1:b", "v1:a"]
    assert fetch.calls == {"a": 1, "b": 1}


def test_the_ttl_counts_from_the_answer() -> None:
    clock = Clock()
    cache: SharedTtlCache[str, str] = SharedTtlCache(ttl_s=3.0, clock=clock, pool=InlinePool())
    calls = 0

    def slow(key: str) -> str:
        nonlocal calls
        calls += 1
        clock.now += 2.0  # the engine took 2 s to answer
        return key

    cache.get("a", slow)
    clock.now += 2.9  # 4.9 s after the ask, 2.9 s after the answer
    cache.get("a", slow)
    assert calls == 1


def test_concurrent_misses_share_one_in_flight_fetch() -> None:
    fetch = Fetcher()
    fetch.gate = threading.Event()
    with ThreadPoolExecutor(max_workers=4) as pool:
        cache: SharedTtlCache[str, str] = SharedTtlCache(pool=pool)
        first = cache.get_many(["a"], fetch)[0]
        assert fetch.entered.acquire(timeout=WAIT_S)
        # Asked again while the fetch runs, from this thread and from others.
        again = cache.get_many(["a"], fetch)[0]
        assert again is first
        answers: list[str] = []
        waiters = [
            threading.Thread(target=lambda: answers.append(cache.get("a", fetch))) for _ in range(8)
        ]
        for t in waiters:
            t.start()
        assert not first.done()
        fetch.gate.set()
        for t in waiters:
            t.join(WAIT_S)
        assert first.result(WAIT_S) == "v1:a"
    assert answers == ["v1:a"] * 8
    assert fetch.calls == {"a": 1}


def test_many_keys_are_fetched_concurrently() -> None:
    keys = [f"c{i}" for i in range(6)]
    # Each fetch returns only once all of them have started: a cache that fetched
    # one key after another would never get past the first.
    barrier = threading.Barrier(len(keys), timeout=WAIT_S)

    def fetch(key: str) -> str:
        barrier.wait()
        return key.upper()

    with ThreadPoolExecutor(max_workers=len(keys)) as pool:
        cache: SharedTtlCache[str, str] = SharedTtlCache(pool=pool)
        futures = cache.get_many(keys, fetch)
        assert [f.result(WAIT_S) for f in futures] == [k.upper() for k in keys]


def test_fetches_never_run_on_the_callers_thread() -> None:
    seen: list[threading.Thread] = []

    def fetch(key: str) -> str:
        seen.append(threading.current_thread())
        return key

    with ThreadPoolExecutor(max_workers=1) as pool:
        cache: SharedTtlCache[str, str] = SharedTtlCache(pool=pool)
        assert cache.get("a", fetch) == "a"
    assert seen and seen[0] is not threading.current_thread()


def test_an_error_is_kept_only_briefly() -> None:
    clock, fetch = Clock(), Fetcher()
    cache = inline_cache(clock, ttl_s=3.0, error_ttl_s=0.5)
    fetch.error = RuntimeFailure("engine down")
    with pytest.raises(RuntimeFailure, match="engine down"):
        cache.get("a", fetch)
    clock.now += 0.4
    # A poll right after: the same error, the engine is not asked again.
    with pytest.raises(RuntimeFailure):
        cache.get("a", fetch)
    assert fetch.calls == {"a": 1}
    clock.now += 0.1
    fetch.error = None
    assert cache.get("a", fetch) == "v1:a"
    assert fetch.calls == {"a": 2}
    # A success is then kept for the whole ttl.
    clock.now += 2.9
    assert cache.get("a", fetch) == "v1:a"
    assert fetch.calls == {"a": 2}


def test_the_error_ttl_is_never_longer_than_the_ttl() -> None:
    cache: SharedTtlCache[str, str] = SharedTtlCache(ttl_s=1.0, error_ttl_s=5.0)
    assert cache.error_ttl_s == 1.0


def test_a_zero_ttl_still_shares_the_fetch_in_flight_only() -> None:
    clock, fetch = Clock(), Fetcher()
    cache = inline_cache(clock, ttl_s=0.0)
    cache.get("a", fetch)
    cache.get("a", fetch)
    assert fetch.calls == {"a": 2}


def test_negative_ttls_are_refused() -> None:
    with pytest.raises(ValueError, match="ttl"):
        SharedTtlCache(ttl_s=-1.0)


def test_expired_entries_are_dropped() -> None:
    clock, fetch = Clock(), Fetcher()
    cache = inline_cache(clock, ttl_s=1.0)
    cache.get_many([f"c{i}" for i in range(50)], fetch)
    assert len(cache) == 50
    clock.now += 11.0  # past the prune period (10 ttls): only what is asked stays
    cache.get("new", fetch)
    assert len(cache) == 1


def test_a_closed_pool_fails_the_ask_and_keeps_nothing() -> None:
    pool = ThreadPoolExecutor(max_workers=1)
    pool.shutdown()
    cache: SharedTtlCache[StatsKey, str] = SharedTtlCache(pool=pool)
    key = StatsKey("c1", 1)
    with pytest.raises(RuntimeError):
        cache.get(key, lambda k: k.cluster_id)
    assert len(cache) == 0
