"""CPU% is sampled per consumer: however often an API client polls a cluster's stats,
the window idle detection measures is its own (injected engine answers)."""

from __future__ import annotations

from typing import Any

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime

SECOND = 1_000_000_000


class EngineApi:
    """Answers inspect and stats like the engine, for a container whose CPU time and
    the wall clock are set by the test."""

    def __init__(self, owner: Ownership) -> None:
        self.labels = owner.labels()
        self.cpu_ns = 0
        self.wall_s = 100

    def inspect_container(self, name: str) -> dict[str, Any]:
        return {
            "Id": "c0ffee",
            "Config": {"Labels": self.labels},
            "State": {"Status": "running", "StartedAt": "1970-01-01T00:01:40Z"},
        }

    def stats(self, cid: str, stream: bool, one_shot: bool) -> dict[str, Any]:
        return {
            "read": f"1970-01-01T00:{self.wall_s // 60:02d}:{self.wall_s % 60:02d}Z",
            "cpu_stats": {"cpu_usage": {"total_usage": self.cpu_ns}},
            "memory_stats": {"usage": 1, "limit": 100},
        }


class Client:
    def __init__(self, api: EngineApi) -> None:
        self.api = api


def test_view_polling_does_not_shorten_the_idle_window() -> None:
    owner = Ownership.new()
    rt = DockerEngineRuntime("unix:///nowhere.sock", owner=owner)
    api = EngineApi(owner)
    rt.engine._client_obj = Client(api)  # the engine client, injected
    assert rt.stats("c1", "idle") is not None  # idle detection's first sample, at 100 s
    api.wall_s, api.cpu_ns = 110, 10 * SECOND  # one core busy for 10 s
    for second in range(111, 131):  # then idle, while a console polls every second
        api.wall_s = second
        view = rt.stats("c1", "view")
        assert view is not None
    assert view.cpu_percent == 0.0
    idle = rt.stats("c1", "idle")
    assert idle is not None and idle.cpu_percent == 33.33  # 10 s of CPU in its 30 s window
