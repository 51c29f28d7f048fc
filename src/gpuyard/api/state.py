"""What the HTTP layer holds: the use-case context, the runtime and a key cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from gpuyard.runtimes.base import Runtime
from gpuyard.services.auth import Principal, hash_key, resolve_key
from gpuyard.services.context import Context

# Revocation through another process (the CLI) takes effect within this many seconds.
KEY_CACHE_TTL_S = 5.0


@dataclass
class PrincipalCache:
    ttl_s: float = KEY_CACHE_TTL_S
    _entries: dict[str, tuple[float, Principal]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key_hash: str) -> Principal | None:
        with self._lock:
            hit = self._entries.get(key_hash)
            if hit and hit[0] > time.monotonic():
                return hit[1]
            return None

    def put(self, key_hash: str, principal: Principal) -> None:
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[key_hash] = (time.monotonic() + self.ttl_s, principal)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


@dataclass
class AppState:
    ctx: Context
    runtime: Runtime
    keys: PrincipalCache = field(default_factory=PrincipalCache)

    def principal(self, key: str | None) -> Principal:
        if key:
            cached = self.keys.get(hash_key(key))
            if cached is not None:
                return cached
        with self.ctx.read() as session:
            principal = resolve_key(session, key)
        assert key is not None
        self.keys.put(hash_key(key), principal)
        return principal


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.gpuyard
    return state


def key_from(authorization: str | None, query: Callable[[str], str | None]) -> str | None:
    """``Authorization: Bearer KEY``, a bare ``Authorization: KEY``, ``?api_key=`` or
    ``?apikey=`` (the training API's spelling)."""
    if authorization:
        scheme, _, rest = authorization.strip().partition(" ")
        return rest.strip() if scheme.lower() == "bearer" and rest else authorization.strip()
    return query("api_key") or query("apikey")


def key_from_request(request: Request) -> str | None:
    return key_from(request.headers.get("authorization"), request.query_params.get)


async def current_principal(request: Request) -> Principal:
    """The caller. A cached key is answered on the event loop; only a cache miss
    takes a worker thread for its database read."""
    state = app_state(request)
    key = key_from_request(request)
    if key:
        cached = state.keys.get(hash_key(key))
        if cached is not None:
            return cached
    return await run_in_threadpool(state.principal, key)
