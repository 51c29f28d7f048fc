"""The server ``gpuyard serve`` runs reaches each added host through that host's own
engine URL, never through this machine's engine."""

from __future__ import annotations

from pathlib import Path

from gpuyard.api.engine_server import engine_server
from gpuyard.runtimes.fleet import HostEngine
from gpuyard.runtimes.hosts.runtimes import HostEngineRuntime
from tests.helpers import make_settings


def test_added_hosts_get_their_own_runtime(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "home", training_enabled=False)
    server = engine_server(settings, f"unix://{tmp_path}/no-engine.sock")
    fleet = server.reconciler.fleet
    assert not fleet.shared
    remote = fleet.runtime(HostEngine(99, "gpu-1", "ssh://root@gpu-1.example.com"))
    assert isinstance(remote, HostEngineRuntime) and remote is not fleet.local
    assert remote.tunnel is not None and remote.runner is not None
    local_id = server.reconciler.host_id
    assert local_id is not None and fleet.for_host(local_id) is fleet.local
    fleet.close()
