"""Timestamped lines, the log cursor and resuming after it (core/log_lines.py), and the
fake runtime's stamps (testing/fake_logs.py)."""

from __future__ import annotations

import pytest

from gpuyard.core.log_lines import (
    MAX_LINE_CHARS,
    Cursor,
    LivePositioner,
    LogLine,
    cap_to_boundary,
    clip,
    extend_to_boundary,
    format_timestamped,
    indexed,
    is_after,
    parse_rfc3339_ns,
    parse_since,
    parse_timestamped,
    rfc3339,
)
from gpuyard.testing.fake_logs import FakeLogFollow, LogStamps, select

S = 1_000_000_000
T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z


def lines(*spec: tuple[int, str]) -> list[LogLine]:
    return [LogLine(ts, text) for ts, text in spec]


def test_rfc3339_round_trips_to_the_nanosecond() -> None:
    assert rfc3339(T0) == "2026-01-01T00:00:00Z"
    assert rfc3339(T0 + 500_000_000) == "2026-01-01T00:00:00.5Z"
    assert rfc3339(T0 + 123_456_789) == "2026-01-01T00:00:00.123456789Z"
    for ts in (T0, T0 + 1, T0 + 999_999_999, 0):
        assert parse_rfc3339_ns(rfc3339(ts)) == ts


def test_rfc3339_parsing_takes_offsets_and_refuses_what_is_no_date() -> None:
    assert parse_rfc3339_ns("2026-01-01T02:00:00+02:00") == T0
    assert parse_rfc3339_ns("2025-12-31T23:30:00.25-00:30") == T0 + 250_000_000
    for bad in ("2026-13-01T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01", "x", ""):
        assert parse_rfc3339_ns(bad) is None, bad


def test_engine_text_parses_and_the_archive_format_round_trips() -> None:
    text = (
        "2026-01-01T00:00:00Z first\n"
        "2026-01-01T00:00:00Z  indented\n"
        "a continuation without stamp\n"
        "2026-01-01T00:00:01.000000001Z \n"
    )
    got = parse_timestamped(text)
    assert got == lines(
        (T0, "first"), (T0, " indented"), (T0, "a continuation without stamp"), (T0 + S + 1, "")
    )
    assert parse_timestamped(format_timestamped(got)) == got
    # A line break inside a text stays inside its line.
    assert parse_timestamped(format_timestamped(lines((T0, "a\nb")))) == lines((T0, "a b"))


def test_clip_cuts_long_lines() -> None:
    assert clip("x" * MAX_LINE_CHARS) == "x" * MAX_LINE_CHARS
    assert len(clip("x" * (MAX_LINE_CHARS + 10))) == MAX_LINE_CHARS + 1


def test_cursor_format_and_parse() -> None:
    c = Cursor(T0, 3, 42)
    assert str(c) == f"{T0}-3-42"
    assert Cursor.parse(str(c)) == c
    assert Cursor.parse("0-0-0") == Cursor()
    for bad in (
        "",
        "1-2",
        "a-b-c",
        "1-2-3-4",
        "-1-2-3",
        " 1-2-3",
        "1-2-3\n",
        "99999999999999999999-0-0",
    ):
        with pytest.raises(ValueError):
            Cursor.parse(bad)
    assert c.after_event(7) == c  # never goes back
    assert c.after_event(50) == Cursor(T0, 3, 50)
    assert c.after_line(T0 + S, 1) == Cursor(T0 + S, 1, 42)


def test_since_takes_rfc3339_unix_seconds_and_durations_ago() -> None:
    now = T0 + 3600 * S
    assert parse_since("2026-01-01T00:00:00Z", now) == T0
    assert parse_since("1767225600", now) == T0
    assert parse_since("1767225600.5", now) == T0 + S // 2
    assert parse_since("10m", now) == now - 600 * S
    assert parse_since("2h", now) == now - 7200 * S
    assert parse_since("1d", now) == now - 86_400 * S
    assert parse_since("999999999d", now) == 0  # never before the epoch
    for bad in ("yesterday", "-5", "10 m", "1767225600\n", "2026-02-30T00:00:00Z", ""):
        with pytest.raises(ValueError):
            parse_since(bad, now)


def test_positions_count_lines_sharing_a_stamp() -> None:
    seq = lines((T0, "a"), (T0, "b"), (T0 + S, "c"), (T0 + S, "d"), (T0 + S, "e"))
    assert [i for _, i in indexed(seq)] == [1, 2, 1, 2, 3]
    cursor = Cursor(T0 + S, 1)  # a, b and c were sent
    after = [line.text for line, i in indexed(seq) if is_after(line.ts_ns, i, cursor)]
    assert after == ["d", "e"]
    assert [line.text for line, i in indexed(seq) if is_after(line.ts_ns, i, Cursor())] == list(
        "abcde"
    )


def test_resuming_from_every_cursor_misses_and_repeats_nothing() -> None:
    seq = lines(*[(T0 + (i // 3) * S, f"l{i}") for i in range(10)])
    ids = []
    cursor = Cursor()
    for line, i in indexed(seq):
        cursor = cursor.after_line(line.ts_ns, i)
        ids.append(cursor)
    for k, c in enumerate(ids):
        rest = [line.text for line, i in indexed(seq) if is_after(line.ts_ns, i, c)]
        assert rest == [line.text for line in seq[k + 1 :]]


def test_live_positioner_skips_what_was_delivered_and_counts_archived_lines_first() -> None:
    # Sent: 2 archived lines and 1 live line at T0 (cursor T0, 3).
    p = LivePositioner(Cursor(T0, 3, 9), archived_at_ts=2)
    follow = lines((T0, "live1"), (T0, "live2"), (T0 + S, "live3"), (T0 + S, "live4"))
    assert [p.admit(line) for line in follow] == [None, 4, 1, 2]
    # A line stamped before the cursor is old.
    assert LivePositioner(Cursor(T0 + S, 0)).admit(LogLine(T0, "old")) is None
    # From nothing: everything is new.
    fresh = LivePositioner(Cursor())
    assert [fresh.admit(line) for line in follow] == [1, 2, 1, 2]


def test_boundaries_of_tails() -> None:
    seq = lines((T0, "a"), (T0, "b"), (T0 + S, "c"), (T0 + S, "d"), (T0 + 2 * S, "e"))
    # A tail that starts inside T0 + S is widened to its first line.
    assert extend_to_boundary(seq[3:], seq[2:]) == seq[2:]
    assert extend_to_boundary([], seq) == []
    # Capping drops whole leading stamps.
    assert cap_to_boundary(seq, 5) == seq
    assert cap_to_boundary(seq, 4) == seq[2:]
    assert cap_to_boundary(seq, 2) == seq[4:]
    assert cap_to_boundary(lines(*[(T0, str(i)) for i in range(5)]), 2) == lines(
        (T0, "3"), (T0, "4")
    )


def test_fake_stamps_are_per_second_and_never_go_back() -> None:
    stamps = LogStamps()
    texts, got = ["a", "b"], []  # type: ignore[var-annotated]
    first = stamps.stamp(texts, got)
    assert [line.ts_ns % S for line in first] == [0, 0]
    texts.append("c")
    again = stamps.stamp(texts, got)
    assert again[:2] == first and again[2].ts_ns >= first[1].ts_ns


def test_fake_select_widens_tails_and_filters_since() -> None:
    seq = lines((T0, "a"), (T0, "b"), (T0 + S, "c"))
    assert select(seq, 1, None) == seq[2:]
    assert select(seq, 2, None) == seq  # b shares a stamp with a
    assert select(seq, None, T0 + 1) == seq[2:]
    assert select(seq, 0, None) == []


def test_fake_follow_ends_when_the_container_stops() -> None:
    seq = lines((T0, "a"), (T0 + S, "b"))
    calls = iter([(seq, True), ([], False)])
    follow = FakeLogFollow(lambda start: next(calls), since_ns=T0 + S + 5)
    assert list(follow) == seq[1:]
    assert list(FakeLogFollow(None, None)) == []
