"""core/token_bucket.py: the arithmetic of the rate limits, on a number line of seconds
(no clock, no sleeping)."""

from __future__ import annotations

import pytest

from gpuyard.core.token_bucket import BucketTable, Rate


def test_a_bucket_lets_a_burst_through_then_refuses_and_says_when_to_retry() -> None:
    table = BucketTable(Rate(per_second=2.0, burst=3), max_entries=10)
    answers = [table.take("k", 100.0) for _ in range(4)]
    assert [a.allowed for a in answers] == [True, True, True, False]
    assert [a.remaining for a in answers] == [2, 1, 0, 0]
    assert all(a.limit == 3 for a in answers)
    refused = answers[-1]
    assert refused.retry_after_s == pytest.approx(0.5)  # one token at 2 a second
    assert refused.reset_s == pytest.approx(1.5)  # three tokens to full


def test_tokens_come_back_at_the_rate_and_never_past_the_burst() -> None:
    table = BucketTable(Rate(per_second=1.0, burst=2), max_entries=10)
    assert table.take("k", 0.0).allowed and table.take("k", 0.0).allowed
    assert not table.take("k", 0.5).allowed
    assert table.take("k", 1.0).allowed  # one token back after a second
    assert not table.take("k", 1.0).allowed
    # A long pause fills the bucket to its burst, no more.
    assert [table.take("k", 1000.0).allowed for _ in range(3)] == [True, True, False]


def test_a_refused_request_takes_nothing() -> None:
    table = BucketTable(Rate(per_second=1.0, burst=1), max_entries=10)
    assert table.take("k", 0.0).allowed
    for _ in range(100):  # hammering while empty does not push the next token away
        assert not table.take("k", 0.5).allowed
    assert table.take("k", 1.0).allowed


def test_buckets_are_independent_per_identity() -> None:
    table = BucketTable(Rate(per_second=1.0, burst=1), max_entries=10)
    assert table.take("a", 0.0).allowed
    assert not table.take("a", 0.0).allowed
    assert table.take("b", 0.0).allowed


def test_charge_goes_into_bounded_debt_that_is_paid_back_at_the_rate() -> None:
    table = BucketTable(Rate(per_second=1.0, burst=2), max_entries=10)
    for _ in range(50):  # far past the allowance: the debt stops at -burst
        table.charge("src", 0.0)
    assert not table.peek("src", 0.0).allowed
    assert table.peek("src", 0.0).retry_after_s == pytest.approx(3.0)  # from -2 to 1
    assert not table.peek("src", 2.9).allowed
    assert table.peek("src", 3.0).allowed


def test_peek_takes_nothing_and_adds_no_identity() -> None:
    table = BucketTable(Rate(per_second=1.0, burst=1), max_entries=10)
    assert table.peek("new", 0.0).allowed
    assert len(table) == 0
    table.take("k", 0.0)
    assert not table.peek("k", 0.0).allowed
    assert not table.peek("k", 0.0).allowed
    assert len(table) == 1


def test_a_clock_going_backwards_gives_no_tokens() -> None:
    table = BucketTable(Rate(per_second=1.0, burst=1), max_entries=10)
    assert table.take("k", 50.0).allowed
    assert not table.take("k", 10.0).allowed
    assert not table.take("k", 50.5).allowed
    assert table.take("k", 51.0).allowed


def test_a_flood_of_new_identities_never_grows_the_table_past_its_cap() -> None:
    table = BucketTable(Rate(per_second=1.0, burst=10), max_entries=100)
    for i in range(10_000):
        table.take(f"random-key-{i}", 0.0)
        assert len(table) <= 100
    assert len(table) == 100


def test_idle_buckets_are_dropped_once_full_again() -> None:
    table = BucketTable(Rate(per_second=1.0, burst=2), max_entries=1000)
    for i in range(50):
        table.take(i, 0.0)
    assert len(table) == 50
    # Two seconds on, all of them are full: each new identity sweeps two old ones away.
    for i in range(50, 75):
        table.take(i, 2.0)
    assert len(table) == 25
    # Buckets still short of full are kept, with what they have used.
    table.take("late", 2.5)
    assert len(table) == 26
    assert table.peek(50, 2.5).remaining == 1


@pytest.mark.parametrize(
    ("per_second", "burst"), [(0.0, 1), (-1.0, 1), (float("inf"), 1), (1.0, 0)]
)
def test_a_rate_must_be_positive_and_finite(per_second: float, burst: int) -> None:
    with pytest.raises(ValueError):
        Rate(per_second, burst)


def test_ipv6_sources_count_by_their_64() -> None:
    from gpuyard.api.http.rate_limit import source_of

    assert source_of("2001:db8:1:2::1") == source_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("203.0.113.7") == "203.0.113.7"
    assert source_of("::ffff:203.0.113.7") == "203.0.113.7"
    assert source_of("testclient") == "testclient"
