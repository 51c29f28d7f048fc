"""Which quarantined volumes a restored installation keeps until an admin deletes them
(reconciler/duties/orphans.py made_before): those that existed when it was restored."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuyard.reconciler.duties.orphans import engine_time, made_before
from gpuyard.runtimes.base import ManagedVolume

RESTORED = datetime(2026, 11, 27, 12, 0, 0)  # naive UTC, as SQLite hands it back


def volume(created_at: str | None) -> ManagedVolume:
    return ManagedVolume("gy-x-vol", "c1", None, created_at)


def test_engine_times_in_the_engines_spellings() -> None:
    want = datetime(2026, 11, 27, 11, 59, 59, 123456, tzinfo=UTC)
    assert engine_time("2026-11-27T11:59:59.123456789Z") == want  # Docker: nanoseconds
    assert engine_time("2026-11-27T12:59:59.123456789+01:00") == want  # Podman: an offset
    assert engine_time("2026-11-27T11:59:59Z") == want.replace(microsecond=0)
    assert engine_time("yesterday") is None and engine_time(None) is None


def test_kept_only_when_older_than_the_restore() -> None:
    assert made_before(volume("2026-11-27T11:59:59.5Z"), RESTORED)
    assert not made_before(volume("2026-11-27T12:00:01Z"), RESTORED)
    assert made_before(volume(None), RESTORED)  # unknown age: nothing deleted on a guess
    assert not made_before(volume("2026-11-27T11:00:00Z"), None)  # never restored
