"""The heartbeat arithmetic (settings.py): a host that stops answering is unreachable
within misses x max(interval, timeout) + timeout of its last answered heartbeat; the
shipped settings keep that within 20 s and the way back within 10 s."""

from __future__ import annotations

from pathlib import Path

from gpuyard.settings import Settings


def test_the_shipped_settings_notice_a_silent_host_within_20_s(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    assert s.heartbeat_timeout_s < s.remote_engine_timeout_s
    assert s.unreachable_within_s == 3 * 5.0 + 3.0 <= 20
    assert s.heartbeat_interval_s + s.heartbeat_timeout_s <= 10


def test_a_timeout_longer_than_the_interval_makes_heartbeats_back_to_back(
    tmp_path: Path,
) -> None:
    s = Settings(home=tmp_path, heartbeat_interval_s=1, heartbeat_timeout_s=4, heartbeat_misses=2)
    assert s.unreachable_within_s == 2 * 4 + 4
