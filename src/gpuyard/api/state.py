"""What the HTTP layer holds: the use-case context, the runtime and a key cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import Request
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from gpuyard.api.fast.read_lane import ReadLane
from gpuyard.api.fast.view_cache import DEFAULT_MAX_AGE_S, ViewCache
from gpuyard.api.http.permissions import route_permission
from gpuyard.core.errors import Forbidden, NotFound, ValidationFailed
from gpuyard.core.roles import Permission
from gpuyard.runtimes.base import Runtime
from gpuyard.services.access.proxy_access import SessionChecks
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import AccountSelection, Principal, hash_key, resolve_key

# Revocation through another process (the CLI) takes effect within this many seconds.
KEY_CACHE_TTL_S = 5.0


@dataclass
class PrincipalCache:
    """Principals by key hash. An entry is fresh for ``ttl_s``; after that one caller
    re-reads the key while the others keep using the old entry, so an expiry does not
    send every concurrent request to the database at once."""

    ttl_s: float = KEY_CACHE_TTL_S
    _entries: dict[str, tuple[float, Principal]] = field(default_factory=dict)
    _refreshing: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def lookup(self, key_hash: str) -> Principal | None:
        """The cached principal if fresh, or if stale while another caller refreshes
        it; None when this caller must read the key (it then owns the refresh)."""
        with self._lock:
            hit = self._entries.get(key_hash)
            if hit is None:
                return None
            if hit[0] > time.monotonic() or key_hash in self._refreshing:
                return hit[1]
            self._refreshing.add(key_hash)
            return None

    def put(self, key_hash: str, principal: Principal | None) -> None:
        """Record a fresh read (None: the key is no longer valid) and end a refresh."""
        with self._lock:
            self._refreshing.discard(key_hash)
            if principal is None:
                self._entries.pop(key_hash, None)
                return
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[key_hash] = (time.monotonic() + self.ttl_s, principal)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class PartitionReader(Protocol):
    """Slurm's view of a training cluster's nodes (reconciler/training/operator.py)."""

    def partition_state(
        self, cluster_id: int, max_age_s: float = 2.0
    ) -> list[tuple[str, str]] | None: ...


@dataclass
class AppState:
    ctx: Context
    runtime: Runtime
    keys: PrincipalCache = field(default_factory=PrincipalCache)
    # The proxy's session checks, kept a few seconds (services/access/proxy_access.py).
    proxy_sessions: SessionChecks = field(default_factory=SessionChecks)
    # The training operator, when training clusters are served by real nodes.
    training: PartitionReader | None = None
    # Where async handlers run their database reads, off the event loop.
    reads: ReadLane = field(default_factory=ReadLane)
    # The engine of a host (None: this machine's): the reconciler's fleet when set.
    host_runtime: Callable[[int | None], Runtime] | None = None
    # Recently rendered GET /v1/clusters/{id} and list answers, and GraphQL query
    # answers (api/fast/view_cache.py), on the context's clock, forgotten at every commit on
    # the store's engine.
    views: ViewCache = field(init=False)
    queries: ViewCache = field(init=False)

    def __post_init__(self) -> None:
        self.views = self._view_cache(DEFAULT_MAX_AGE_S)
        self.queries = self._view_cache(self.ctx.settings.graphql_answer_max_age_s)

    def _view_cache(self, max_age_s: float) -> ViewCache:
        engine = self.ctx.sessions.kw.get("bind")
        if not isinstance(engine, Engine):  # no commits to watch: keep nothing
            return ViewCache(self.ctx.clock.now, max_age_s=0.0)
        cache = ViewCache(self.ctx.clock.now, max_age_s=max_age_s)
        cache.watch(engine, self.ctx.sessions)
        return cache

    def runtime_of(self, host_id: int | None) -> Runtime:
        """The runtime driving host ``host_id``'s engine (RuntimeFailure if unknown)."""
        if self.host_runtime is None:
            return self.runtime
        return self.host_runtime(host_id)

    def _read_principal(
        self, key: str | None, cache_key: str | None, selection: AccountSelection | None
    ) -> Principal:
        try:
            with self.ctx.read() as session:
                principal = resolve_key(session, key, selection)
        except BaseException:
            if cache_key is not None:
                self.keys.put(cache_key, None)
            raise
        if cache_key is not None:
            self.keys.put(cache_key, principal)
        return principal

    async def principal(
        self, key: str | None, selection: AccountSelection | None = None
    ) -> Principal:
        """The caller of ``key`` acting for the selected account. A cached answer is
        given on the event loop; only a miss (or the one refresh of a stale entry)
        takes a worker thread. Raises Unauthorized / Forbidden."""
        cache_key = None
        if key:
            cache_key = hash_key(key)
            if selection is not None and selection != AccountSelection():
                cache_key += f"|{selection.account_id}|{selection.active_iam}"
            cached = self.keys.lookup(cache_key)
            if cached is not None:
                return cached
        return await run_in_threadpool(self._read_principal, key, cache_key, selection)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.gpuyard
    return state


# The query parameters that carry an API key: ``?api_key=`` (GraphQL seed) and
# ``?apikey=`` (the training API's spelling). Names are matched exactly (case counts)
# after percent-decoding, as every URL parser does: ``?api%5Fkey=`` is ``?api_key=``.
# The log redactor (cli/serve.py) hides every spelling that folds to one of these.
KEY_QUERY_PARAMS = ("api_key", "apikey")


def key_from(authorization: str | None, query: Callable[[str], str | None]) -> str | None:
    """``Authorization: Bearer KEY``, a bare ``Authorization: KEY``, else the first of
    :data:`KEY_QUERY_PARAMS` present (for a repeated parameter, ``query`` decides which
    value: Starlette's answers the last)."""
    if authorization:
        scheme, _, rest = authorization.strip().partition(" ")
        return rest.strip() if scheme.lower() == "bearer" and rest else authorization.strip()
    for name in KEY_QUERY_PARAMS:
        key = query(name)
        if key:
            return key
    return None


def key_from_request(request: Request) -> str | None:
    return key_from(request.headers.get("authorization"), request.query_params.get)


# The header that names the account a request acts for (its id).
ACCOUNT_HEADER = "x-gpuyard-account"


def _id_value(name: str, raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    value = raw.strip()
    if not value.isdigit() or not 0 < int(value) < 2**31:
        raise ValidationFailed(name, f"{raw!r} is not an id")
    return int(value)


def selection_from(request: HTTPConnection) -> AccountSelection:
    """The account a request selects: ``X-Gpuyard-Account`` and ``?active_iam=``.
    Raises ValidationFailed naming a malformed one."""
    return AccountSelection(
        _id_value("X-Gpuyard-Account", request.headers.get(ACCOUNT_HEADER)),
        _id_value("active_iam", request.query_params.get("active_iam")),
    )


async def request_principal(request: Request) -> Principal:
    """The caller of ``request`` acting for the account it selects, with no role
    check (routes that check for themselves)."""
    return await app_state(request).principal(key_from_request(request), selection_from(request))


async def current_principal(request: Request) -> Principal:
    """The caller, checked against what the matched route needs of its role
    (api/http/permissions.py). Raises Unauthorized / Forbidden / ValidationFailed."""
    principal = await request_principal(request)
    route = request.scope.get("route")
    path = getattr(route, "path_format", None) or request.url.path
    needed = route_permission(request.method, path)
    if needed is not None:
        principal.require_permission(needed)
    return principal


async def account_principal(
    request: Request, account_id: int, permission: Permission | None
) -> Principal:
    """The caller acting for account ``account_id`` (a path's ``{account_id}``) with
    ``permission`` in it (None: any role). An account the caller is no member of is
    404, never revealing that it exists; the operator acts in every account."""
    state = app_state(request)
    key = key_from_request(request)
    try:
        principal = await state.principal(key, AccountSelection(account_id=account_id))
    except Forbidden as exc:
        raise NotFound(f"account {account_id} not found", {"account_id": account_id}) from exc
    if permission is not None:
        principal.require_permission(permission)
    return principal
