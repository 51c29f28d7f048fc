"""Duty leases (services/installation/leases.py) on SQLite and PostgreSQL: one holder at a time,
races for a free lease have one winner, expiry by the database's clock on PostgreSQL,
fences that grow with every change of holder, hand-back at shutdown."""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select, text

from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.installation.leases import LeaseKeeper
from gpuyard.store.db import make_engine, make_sessionmaker
from gpuyard.store.schema import Lease
from tests.helpers import make_settings

TTL = 15.0


class Tick:
    """A local monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def keeper(ctx: Context, name: str, clock: Callable[[], float]) -> LeaseKeeper:
    return LeaseKeeper(ctx, holder=name, ttl_s=TTL, clock=clock)


def is_postgres(ctx: Context) -> bool:
    return str(ctx.sessions.kw["bind"].dialect.name) == "postgresql"


def row(ctx: Context, name: str) -> Lease | None:
    with ctx.read() as session:
        return session.scalar(select(Lease).where(Lease.name == name))


def test_one_holds_the_other_waits_until_release(ctx: Context) -> None:
    tick = Tick()
    a, b = keeper(ctx, "replica-a", tick), keeper(ctx, "replica-b", tick)
    assert a.holds("host:1") and a.fence("host:1") == 1
    assert not b.holds("host:1") and b.fence("host:1") is None
    assert a.held() == {"host:1"} and b.held() == set()
    # Renewed by the holder as time passes; still not the other's.
    for _ in range(5):
        tick.advance(TTL / 3)
        assert a.holds("host:1") and not b.holds("host:1")
    assert a.fence("host:1") == 1
    lease = row(ctx, "host:1")
    assert lease is not None and lease.holder == "replica-a"
    a.release("host:1")
    assert a.held() == set()
    # The other asks again within a third of the lease time and gets it at once.
    tick.advance(TTL / 3)
    assert b.holds("host:1") and b.fence("host:1") == 2
    tick.advance(TTL / 3)
    assert not a.holds("host:1")


def test_cached_hold_needs_no_database(ctx: Context) -> None:
    tick = Tick()
    a = keeper(ctx, "replica-a", tick)
    assert a.holds("autoterm")
    with ctx.transaction() as session:
        session.execute(text("UPDATE leases SET holder = 'someone-else'"))
    # Within a third of the lease time the keeper answers from memory ...
    tick.advance(TTL / 3 - 0.1)
    assert a.holds("autoterm")
    # ... then confirms with the database, which says it is someone else's now.
    tick.advance(0.2)
    assert not a.holds("autoterm") and a.held() == set()


def test_sqlite_judges_expiry_by_the_context_clock(ctx: Context, clock: FakeClock) -> None:
    if is_postgres(ctx):
        pytest.skip("PostgreSQL judges expiry by its own clock (the next test)")
    tick = Tick()
    a, b = keeper(ctx, "replica-a", tick), keeper(ctx, "replica-b", tick)
    assert a.holds("training")
    clock.advance(TTL - 1)
    tick.advance(TTL / 3)
    assert not b.holds("training")
    clock.advance(2)  # past the lease time: a died without renewing
    tick.advance(TTL / 3)
    assert b.holds("training") and b.fence("training") == 2
    assert not a.holds("training")


def test_postgres_judges_expiry_by_the_database_clock(ctx: Context, clock: FakeClock) -> None:
    if not is_postgres(ctx):
        pytest.skip("SQLite judges expiry by the context's clock (the previous test)")
    tick = Tick()
    a, b = keeper(ctx, "replica-a", tick), keeper(ctx, "replica-b", tick)
    assert a.holds("training")
    # A replica whose clock runs a day ahead does not think the lease expired.
    clock.advance(86400)
    tick.advance(TTL)
    assert not b.holds("training")
    lease = row(ctx, "training")
    assert lease is not None
    with ctx.read() as session:
        db_now = session.scalar(text("SELECT now() AT TIME ZONE 'UTC'"))
    # Written from the database's clock, not from either replica's.
    left = (lease.expires_at.replace(tzinfo=None) - db_now).total_seconds()
    # (A replica clock a day off would put it far outside.)
    assert 0 < left <= TTL
    # The database's time passes the expiry (a's last renewal is a lease time ago).
    with ctx.transaction() as session:
        session.execute(
            text("UPDATE leases SET expires_at = now() AT TIME ZONE 'UTC' - interval '1 second'")
        )
    tick.advance(TTL)
    assert b.holds("training") and b.fence("training") == 2
    assert not a.holds("training")


def _race(k: LeaseKeeper, barrier: threading.Barrier, won: list[LeaseKeeper]) -> None:
    barrier.wait()
    if k.holds("maintenance"):
        won.append(k)


def test_n_keepers_racing_for_a_free_lease_have_one_winner(ctx: Context) -> None:
    tick = Tick()
    keepers = [keeper(ctx, f"replica-{i}", tick) for i in range(8)]
    last_winner: LeaseKeeper | None = None
    last_fence = 0
    for _round in range(6):
        barrier = threading.Barrier(len(keepers))
        won: list[LeaseKeeper] = []

        threads = [threading.Thread(target=_race, args=(k, barrier, won)) for k in keepers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, [k.holder for k in won]
        fence = won[0].fence("maintenance")
        # The fence grows by one exactly when the holder changes.
        assert fence == last_fence + (won[0] is not last_winner)
        last_winner, last_fence = won[0], fence
        won[0].release("maintenance")
        tick.advance(TTL / 3)
    # Whoever won the races, a handover to another keeper grows the fence.
    assert last_winner is not None
    other = next(k for k in keepers if k is not last_winner)
    assert other.holds("maintenance") and other.fence("maintenance") == last_fence + 1


def test_threads_of_two_keepers_agree_on_one_holder(ctx: Context) -> None:
    tick = Tick()
    keepers = [keeper(ctx, "replica-a", tick), keeper(ctx, "replica-b", tick)]
    barrier = threading.Barrier(16)
    answers: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def ask(k: LeaseKeeper) -> None:
        barrier.wait()
        got = k.holds("host:7")
        with lock:
            answers.append((k.holder, got))

    threads = [threading.Thread(target=ask, args=(k,)) for k in keepers for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = {holder for holder, got in answers if got}
    assert len(winners) == 1 and len(answers) == 16
    # Every thread of the winner says so; every thread of the other says no.
    assert all(got == (holder in winners) for holder, got in answers)


def test_handovers_under_load_keep_one_holder_and_a_growing_fence(ctx: Context) -> None:
    # Each call to the clock moves it one step: caches expire as calls go by.
    steps = itertools.count()

    def clock() -> float:
        return float(next(steps))

    keepers = [LeaseKeeper(ctx, f"replica-{i}", ttl_s=30, clock=clock) for i in range(2)]
    log: list[tuple[str, int]] = []
    log_lock = threading.Lock()

    start = threading.Barrier(8)

    def work(k: LeaseKeeper, seed: int) -> None:
        rng = random.Random(seed)
        start.wait()  # all at once: the keepers' asks interleave from the first
        for _ in range(40):
            # The log's order is the order of the holds() calls that gave its entries.
            with log_lock:
                fence = k.fence("autoterm")
                if fence is not None:
                    log.append((k.holder, fence))
            if fence is not None and rng.random() < 0.3:
                k.release("autoterm")  # outside the log's lock: races the others' asks

    threads = [
        threading.Thread(target=work, args=(k, i * 10 + j))
        for i, k in enumerate(keepers)
        for j in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fences = [f for _, f in log]
    assert fences == sorted(fences), "the fence never goes back"
    holder_of: dict[int, set[str]] = {}
    for holder, fence in log:
        holder_of.setdefault(fence, set()).add(holder)
    assert all(len(h) == 1 for h in holder_of.values()), holder_of
    for (h1, f1), (h2, f2) in itertools.pairwise(log):
        assert h1 == h2 or f2 > f1
    # How many handovers the threads made depends on the scheduler (a loaded machine
    # may run one keeper's threads before the other's). One more is made here, so the
    # fence is seen to grow with a change of holder whatever the schedule was.
    last_holder, last_fence = log[-1]
    assert last_fence == max(fences)
    next(k for k in keepers if k.holder == last_holder).release("autoterm")
    other = next(k for k in keepers if k.holder != last_holder)
    handed = None
    for _ in range(100):  # its note that the lease is busy lasts a few clock steps
        handed = other.fence("autoterm")
        if handed is not None:
            break
    assert handed == last_fence + 1


def test_release_all_hands_every_lease_back(ctx: Context) -> None:
    tick = Tick()
    a, b = keeper(ctx, "replica-a", tick), keeper(ctx, "replica-b", tick)
    names = {"host:1", "host:2", "autoterm"}
    assert all(a.holds(n) for n in names) and a.held() == names
    a.release_all()
    assert a.held() == set()
    assert all(b.holds(n) and b.fence(n) == 2 for n in names)
    a.release_all()  # nothing held: nothing to do
    assert all(b.holds(n) for n in names)


def test_a_database_error_answers_not_held(tmp_path: Path) -> None:
    engine = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2")
    ctx = Context(sessions=make_sessionmaker(engine), settings=make_settings(tmp_path))
    k = LeaseKeeper(ctx, "replica-a", ttl_s=TTL, clock=Tick())
    assert not k.holds("autoterm") and k.fence("autoterm") is None and k.held() == set()
    k.release_all()
    engine.dispose()


def test_keeper_refuses_bad_arguments(ctx: Context) -> None:
    with pytest.raises(ValueError):
        LeaseKeeper(ctx, "x" * 101)
    with pytest.raises(ValueError):
        LeaseKeeper(ctx, "")
    with pytest.raises(ValueError):
        LeaseKeeper(ctx, "replica-a", ttl_s=0)
    assert LeaseKeeper.for_replica(ctx).ttl_s == ctx.settings.lease_ttl_s == 15.0
