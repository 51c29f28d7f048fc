"""api/fast/view_cache.py: when a kept cluster answer may be used again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.orm import sessionmaker

from gpuyard.api.fast.view_cache import Rendered, Stamp, ViewCache
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import IdleSince

ONE = Rendered(project_id=3, data=b'{"id":"c1"}')
MARKS = (None, None)


class Ticks:
    """An injected monotonic clock."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ticks() -> Ticks:
    return Ticks()


@pytest.fixture
def cache(clock: FakeClock, ticks: Ticks) -> ViewCache:
    return ViewCache(clock.now, max_age_s=0.1, monotonic=ticks)


def test_an_entry_answers_its_cluster_and_account_only(cache: ViewCache) -> None:
    assert cache.get("c1", 7, MARKS) is None
    cache.put("c1", 7, MARKS, ONE, cache.stamp())
    assert cache.get("c1", 7, MARKS) == ONE
    assert cache.get("c1", 8, MARKS) is None  # another account: its own read
    assert cache.get("c2", 7, MARKS) is None


def test_a_commit_makes_every_entry_stale(cache: ViewCache) -> None:
    cache.put("c1", 7, MARKS, ONE, cache.stamp())
    cache.invalidate()
    assert cache.get("c1", 7, MARKS) is None


def test_a_commit_during_the_read_keeps_its_result_out(cache: ViewCache) -> None:
    stamp = cache.stamp()  # the read begins
    cache.invalidate()  # a write commits before the read ends
    cache.put("c1", 7, MARKS, ONE, stamp)
    assert cache.get("c1", 7, MARKS) is None


def test_entries_age_on_monotonic_time(cache: ViewCache, ticks: Ticks) -> None:
    cache.put("c1", 7, MARKS, ONE, cache.stamp())
    ticks.t += 0.05
    assert cache.get("c1", 7, MARKS) == ONE
    ticks.t += 0.06
    assert cache.get("c1", 7, MARKS) is None


def test_entries_age_on_the_context_clock(cache: ViewCache, clock: FakeClock) -> None:
    cache.put("c1", 7, MARKS, ONE, cache.stamp())
    clock.advance(3600)  # a test's clock moved on: the cost accrued since must show
    assert cache.get("c1", 7, MARKS) is None


def test_a_clock_set_back_makes_entries_stale(cache: ViewCache, clock: FakeClock) -> None:
    cache.put("c1", 7, MARKS, ONE, cache.stamp())
    clock.advance(-1)
    assert cache.get("c1", 7, MARKS) is None


def test_changed_in_memory_inputs_make_the_entry_stale(cache: ViewCache) -> None:
    cache.put("c1", 7, MARKS, ONE, cache.stamp())
    assert cache.get("c1", 7, ("idle since 12:00", None)) is None
    assert cache.get("c1", 7, (None, "the proxy is down")) is None


def test_max_age_zero_keeps_nothing(clock: FakeClock, ticks: Ticks) -> None:
    cache = ViewCache(clock.now, max_age_s=0.0, monotonic=ticks)
    cache.put("c1", 7, MARKS, ONE, cache.stamp())
    assert cache.get("c1", 7, MARKS) is None


def test_the_size_bound_drops_entries(clock: FakeClock, ticks: Ticks) -> None:
    cache = ViewCache(clock.now, size=2, monotonic=ticks)
    for cid in ("a", "b", "c"):
        cache.put(cid, 7, MARKS, ONE, cache.stamp())
    assert cache.get("c", 7, MARKS) == ONE
    assert cache.get("a", 7, MARKS) is None


def test_watching_an_engine_counts_its_commits(cache: ViewCache, tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'w.db'}")
    cache.watch(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    cache.put("c1", 7, MARKS, ONE, cache.stamp())
    with engine.connect() as conn:  # a read, rolled back: nothing changed
        conn.execute(text("SELECT count(*) FROM t")).scalar_one()
    assert cache.get("c1", 7, MARKS) == ONE
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO t VALUES (1)"))
    assert cache.get("c1", 7, MARKS) is None
    engine.dispose()


def test_a_read_stamped_while_a_session_commits_is_not_kept(
    cache: ViewCache, tmp_path: Path
) -> None:
    """The engine's commit event comes before the database commits: a read stamped in
    between renders the state before the write, and must not be kept."""
    engine = create_engine(f"sqlite:///{tmp_path / 'w.db'}")
    sessions = sessionmaker(engine)
    cache.watch(engine, sessions)
    stamps: list[Stamp] = []
    # Registered after the cache's own listener: runs between its count and the commit.
    event.listen(engine, "commit", lambda _conn: stamps.append(cache.stamp()))
    with sessions.begin() as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
    assert len(stamps) == 1
    cache.put("c1", 7, MARKS, ONE, stamps[0])
    assert cache.get("c1", 7, MARKS) is None
    cache.put("c1", 7, MARKS, ONE, cache.stamp())  # stamped after: kept
    assert cache.get("c1", 7, MARKS) == ONE
    engine.dispose()


def test_idle_since_moves_its_version_on_every_change() -> None:
    idle = IdleSince()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    seen = [idle.version]
    changes: list[Callable[[], object]] = [
        lambda: idle.setdefault("a", at),
        lambda: idle.__setitem__("b", at),
        lambda: idle.pop("a"),
        lambda: idle.__delitem__("b"),
        lambda: idle.setdefault("c", at),
        lambda: idle.clear(),
    ]
    for change in changes:
        change()
        assert idle.version > seen[-1]
        seen.append(idle.version)
    idle.setdefault("d", at)
    before = idle.version
    idle.setdefault("d", at)  # already there: nothing changed
    idle.pop("missing")
    assert idle.version == before
