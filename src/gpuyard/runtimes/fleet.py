"""The runtimes of a fleet: one container engine driver per host.

A server drives the engine of its own machine (the *local* runtime it was built with)
and, for every host added through the API, a runtime the *factory* makes from the
host's engine URL (``ssh://``, ``tcp://``, ``unix://``) on first use. Without a factory
every host is driven by the local runtime: the single-engine mode of tests, benchmarks
and a one-machine install, where several host rows may share one engine.

The fleet knows hosts only through the ``hosts`` lookup it is given (the store's view,
read by the caller), so this module imports nothing from the services or the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostEngine:
    """What it takes to reach one host's engine."""

    host_id: int
    name: str
    engine_url: str | None
    tls_dir: str | None = None
    is_local: bool = False


RuntimeFactory = Callable[[HostEngine], Runtime]
HostLookup = Callable[[int], HostEngine | None]

# The key of the one engine every host shares when there is no factory.
SHARED_ENGINE = "engine:local"


def engine_key(host_id: int) -> str:
    """The name of a host's engine: its work lanes and its duty lease use it."""
    return f"host:{host_id}"


class Fleet:
    """Host id -> runtime. Thread-safe; runtimes are made once per host and engine URL
    (a host whose URL changed gets a fresh one)."""

    def __init__(
        self,
        local: Runtime,
        factory: RuntimeFactory | None = None,
        hosts: HostLookup | None = None,
    ) -> None:
        self.local = local
        self._factory = factory
        self._hosts = hosts
        self._owner: Ownership | None = None
        self._lock = threading.Lock()
        self._made: dict[int, tuple[HostEngine, Runtime]] = {}

    @property
    def shared(self) -> bool:
        """Whether every host is driven by the local runtime (no factory)."""
        return self._factory is None

    def set_hosts(self, hosts: HostLookup) -> None:
        self._hosts = hosts

    def bind(self, owner: Ownership) -> None:
        """Act for installation ``owner``: the local runtime now, every other when made."""
        self._owner = owner
        self.local.bind(owner)
        with self._lock:
            made = [rt for _, rt in self._made.values()]
        for rt in made:
            rt.bind(owner)

    def key_of(self, host_id: int) -> str:
        """The engine key of ``host_id`` (one shared key without a factory)."""
        return SHARED_ENGINE if self.shared else engine_key(host_id)

    def engines(self, hosts: Iterable[HostEngine]) -> list[tuple[str, tuple[int, ...]]]:
        """The distinct engines behind ``hosts``: (engine key, the host ids it serves)."""
        grouped: dict[str, list[int]] = {}
        for host in hosts:
            grouped.setdefault(self.key_of(host.host_id), []).append(host.host_id)
        return [(key, tuple(ids)) for key, ids in grouped.items()]

    def runtime(self, host: HostEngine) -> Runtime:
        """The runtime driving ``host``'s engine."""
        if self._factory is None or host.is_local:
            return self.local
        with self._lock:
            found = self._made.get(host.host_id)
            if found is not None and found[0] == host:
                return found[1]
        made = self._factory(host)
        if self._owner is not None:
            made.bind(self._owner)
        with self._lock:
            old = self._made.get(host.host_id)
            if old is not None and old[0] == host:
                return old[1]  # another thread made it first
            self._made[host.host_id] = (host, made)
        if old is not None:
            _close(old[1])
        return made

    def for_host(self, host_id: int | None) -> Runtime:
        """The runtime of the host ``host_id`` (looked up through ``hosts``). None or an
        unknown host in the shared mode: the local runtime. Raises RuntimeFailure for
        an unknown host when hosts have their own engines."""
        if self._factory is None or host_id is None:
            return self.local
        host = self._hosts(host_id) if self._hosts is not None else None
        if host is None:
            raise RuntimeFailure(f"host {host_id} is not known", {"host_id": host_id})
        return self.runtime(host)

    def forget(self, host_id: int) -> None:
        """Drop (and close) the runtime of a removed host."""
        with self._lock:
            old = self._made.pop(host_id, None)
        if old is not None:
            _close(old[1])

    def close(self) -> None:
        with self._lock:
            made, self._made = list(self._made.values()), {}
        for _, rt in made:
            _close(rt)


def _close(runtime: Runtime) -> None:
    """Release what a runtime holds (an SSH tunnel, a client)."""
    try:
        runtime.close()
    except Exception:  # closing is best effort; the process may be going anyway
        log.exception("closing a host runtime failed")
