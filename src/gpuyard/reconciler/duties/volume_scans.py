"""Volume scans: on every engine, volumes of ours the database does not know are
quarantined and those past their retention deleted (duties/orphans.py), at most every
``every_s`` per engine and one scan at a time."""

from __future__ import annotations

import threading
import time

from gpuyard.reconciler.duties.orphans import VolumeCollector
from gpuyard.reconciler.hosts import HostDirectory
from gpuyard.runtimes.base import Runtime
from gpuyard.services.context import Context


class VolumeScans:
    """When each engine's volumes are scanned next, and the scan itself."""

    def __init__(self, ctx: Context, hosts: HostDirectory, every_s: float = 30.0) -> None:
        self.ctx = ctx
        self.hosts = hosts
        self.every_s = every_s
        self._last: dict[str, float] = {}
        # One volume scan at a time: a scan that listed the engine before a volume
        # appeared must not record its view after a later scan quarantined it.
        self._lock = threading.Lock()

    def due(self, key: str) -> bool:
        """Whether engine ``key`` is due a scan (if so, it counts as scanned now)."""
        if time.monotonic() - self._last.get(key, 0.0) < self.every_s:
            return False
        self._last[key] = time.monotonic()
        return True

    def scan_engine(self, runtime: Runtime, host_ids: tuple[int, ...]) -> None:
        """Scan the volumes of one engine (serving ``host_ids``), in this thread."""
        # One engine shared by several host rows keeps its quarantine under the local
        # host, as before there were fleets.
        host_id = host_ids[0] if len(host_ids) == 1 else self.hosts.host_id
        if host_id is not None:
            with self._lock:
                VolumeCollector(self.ctx, runtime, host_id).scan()
