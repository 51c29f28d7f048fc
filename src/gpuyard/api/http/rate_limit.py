"""Rate limits on every API surface: per API key, per source address, and on failed keys.

Pure ASGI middleware, outside the fast path and routing, so nothing answers before it
(``/healthz`` excepted: probes must never be refused). Per request, in this order:

1. the source address's bucket, then the key's bucket, each give a token or refuse;
2. a request whose key turns out wrong (the answer is a 401), from a source that has
   used up its failed-key allowance, is answered 429 instead. Only wrong keys are
   refused: a valid key from a locked-out source is answered as from anywhere else.
   Many people share one address (an office NAT, a bastion host), and a lockout of
   every key would let any of them lock out all the others. Keys are 256-bit random,
   so telling a valid key apart gives a guesser nothing it could use.

A refusal is a 429 with ``Retry-After`` (whole seconds) in the envelope of the surface
the request was for (REST v1, GraphQL ``errors``, the training API). Every answer that
was let through carries ``X-RateLimit-Limit`` (the bucket's size), ``-Remaining`` and
``-Reset`` (seconds until the bucket is full again) of whichever of its buckets has fewer
tokens left.

Failed keys are counted from the answer itself: every surface answers an unknown or
revoked key with HTTP 401 (api/state.py raises Unauthorized and each surface renders it),
so a 401 to a request that presented a key charges its source one failure. The auth code
needs no hook, and a surface added later is covered as long as it answers 401. The web
console's sign-in carries its key in the body (:data:`KEY_IN_BODY`), which this
middleware does not read: such a request counts as presenting a key all the same, so
guessing keys through the sign-in form is refused and charged like any other.

Buckets live in this process's memory (core/token_bucket.py): N replicas behind a
balancer let a client through up to N times the configured rates (README "Rate limits").
The key identity is a 16-byte BLAKE2 digest of the key: no key is kept in clear.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuyard.api.http.surface_errors import surface_error, surface_media_type
from gpuyard.api.state import key_from
from gpuyard.core.network.proxy import presented_key
from gpuyard.core.token_bucket import BucketTable, Decision, Rate
from gpuyard.edge.caddy_config import AUTHORIZE_PATH, PROXY_HEADER
from gpuyard.services.clock import Clock
from gpuyard.settings import Settings

log = logging.getLogger(__name__)

# Never limited: liveness probes and load balancers' health checks.
EXEMPT_PATHS = frozenset({"/healthz"})
CODE = "RATE_LIMITED"
# Routes whose body carries an API key, by (method, path): the console's sign-in
# (api/console/session.py). They present a key as far as the failed-key allowance goes.
KEY_IN_BODY = frozenset({("POST", "/v1/console/session")})


@dataclass(frozen=True)
class RateLimits:
    """The configured limits; None means that limit is off."""

    per_key: Rate | None
    per_source: Rate | None
    # At most ``burst`` failed keys at once from one source, refilled at ``per_second``.
    auth_failures: Rate | None
    max_tracked: int

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimits:
        failures = settings.rate_limit_auth_failures_per_minute
        return cls(
            per_key=_rate(settings.rate_limit_per_key, settings.rate_limit_key_burst),
            per_source=_rate(settings.rate_limit_per_source, settings.rate_limit_source_burst),
            auth_failures=Rate(failures / 60.0, failures) if failures > 0 else None,
            max_tracked=settings.rate_limit_max_tracked,
        )

    @property
    def enabled(self) -> bool:
        return any(r is not None for r in (self.per_key, self.per_source, self.auth_failures))


def _rate(per_second: float, burst: int) -> Rate | None:
    return Rate(per_second, burst) if per_second > 0 else None


def seconds_of(clock: Clock) -> Callable[[], float]:
    """A :class:`~gpuyard.services.clock.Clock` (e.g. a test's FakeClock) as seconds."""
    return lambda: clock.now().timestamp()


class Verdict(NamedTuple):
    """What the limiter says about one request: the deciding bucket's state and which
    limit it is (``key``, ``source`` or ``auth_failures``)."""

    decision: Decision
    limit: str


class RateLimiter:
    """The buckets of one process. Used from the event loop only (not thread-safe);
    every method is O(1) and memory is bounded by ``max_tracked`` buckets per limit."""

    def __init__(self, limits: RateLimits, clock: Callable[[], float] | None = None) -> None:
        self.limits = limits
        self._clock = clock or time.monotonic

        def table(rate: Rate | None) -> BucketTable | None:
            return None if rate is None else BucketTable(rate, limits.max_tracked)

        self.keys = table(limits.per_key)
        self.sources = table(limits.per_source)
        self.failures = table(limits.auth_failures)

    def admit(self, source: str, key_id: bytes | None) -> Verdict | None:
        """Take this request's tokens; the deciding verdict, or None when no limit applies.
        The failed-key allowance is not asked here: only a key found wrong meets it
        (:meth:`key_failed`)."""
        now = self._clock()
        best: Verdict | None = None
        if self.sources is not None:
            best = Verdict(self.sources.take(source, now), "source")
            if not best.decision.allowed:
                return best
        if key_id is not None and self.keys is not None:
            by_key = self.keys.take(key_id, now)
            if not by_key.allowed or best is None or by_key.remaining < best.decision.remaining:
                return Verdict(by_key, "key")
        return best

    def key_failed(self, source: str) -> Verdict | None:
        """A wrong key from ``source``. Returns the verdict to answer it with (429) when
        the source has used up its failed-key allowance; else charges the allowance and
        returns None (the request gets its 401). A refused guess is not charged: the
        lockout lasts as long as the allowance takes to refill, as it always did."""
        if self.failures is None:
            return None
        now = self._clock()
        locked = self.failures.peek(source, now)
        if not locked.allowed:
            return Verdict(locked, "auth_failures")
        if not self.failures.charge(source, now).allowed:
            log.warning("rate limit: %s used up its failed-key allowance", source)
        return None


def key_id(key: str | None) -> bytes | None:
    """The identity a key's bucket is kept under (never the key itself)."""
    if not key:
        return None
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


def _presented_key(scope: Scope) -> str | None:
    """The key exactly as api/state.py reads it for the routed surfaces: its
    ``key_from`` on the Authorization header, else on the query string parsed by
    Starlette's own ``QueryParams`` (so a repeated parameter resolves the same way).
    For the proxy's key check, the key as that route reads it (core/network/proxy.py
    ``presented_key``: ``X-Gpuyard-Api-Key`` too), so a wrong key sent through the
    proxy counts, and a locked-out source is refused there as everywhere."""
    authorization = None
    key_header = None
    for name, value in scope["headers"]:
        if name == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif name == b"x-gpuyard-api-key" and key_header is None:
            key_header = value.decode("latin-1")
    if scope["path"] == AUTHORIZE_PATH:
        return presented_key(key_header, authorization)
    raw: bytes = scope.get("query_string", b"")
    if authorization is None and not raw:
        return None
    params: QueryParams | None = None

    def query(name: str) -> str | None:
        nonlocal params
        if params is None:
            params = QueryParams(raw)
        return params.get(name)

    return key_from(authorization, query)


# Parsing an address costs more than the rest of the limiter's work per request, and
# clients come back from the same few addresses; bounded, so many addresses only churn.
@functools.lru_cache(maxsize=4096)
def source_of(address: str) -> str:
    """The bucket a peer address counts against: the address itself for IPv4, its /64
    for IPv6 (one host usually holds a whole /64, so per-address buckets would hand it
    billions of fresh allowances)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


# The header Caddy sets on every request it makes to the API (edge/caddy_config.py),
# as ASGI gives header names: lower case bytes.
_PROXY_HEADER = PROXY_HEADER.lower().encode()


def _source(scope: Scope, proxy_secret: bytes | None = None) -> str:
    # The peer address as the server gives it; uvicorn substitutes X-Forwarded-For only
    # for the proxies GPUYARD_TRUSTED_PROXIES lists (cli/serve.py). A request the HTTP
    # proxy makes for a client (key checks, open links, status pages) carries the
    # proxy's secret: its client is the last X-Forwarded-For address, so one
    # stranger's bad keys through the proxy do not lock out everybody behind it.
    if proxy_secret is not None:
        vouched = forwarded = None
        for name, value in scope["headers"]:
            if name == _PROXY_HEADER:
                vouched = value
            elif name == b"x-forwarded-for":
                forwarded = value
        if vouched is not None and forwarded and hmac.compare_digest(vouched, proxy_secret):
            last = forwarded.decode("latin-1").rsplit(",", 1)[-1].strip()
            if last:
                return source_of(last)
    client = scope.get("client")
    return source_of(str(client[0])) if client else "local"


_WHO = {
    "key": "for this API key",
    "source": "from this address",
    "auth_failures": "with invalid API keys from this address",
}


def headers_of(decision: Decision) -> list[tuple[bytes, bytes]]:
    """``X-RateLimit-Limit`` (the bucket's size), ``-Remaining`` (whole requests left)
    and ``-Reset`` (whole seconds until the bucket is full again)."""
    tokens, rate = decision.tokens, decision.rate
    reset = math.ceil((rate.burst - tokens) / rate.per_second) if tokens < rate.burst else 0
    return [
        (b"x-ratelimit-limit", str(rate.burst).encode()),
        (b"x-ratelimit-remaining", str(int(tokens) if tokens > 0 else 0).encode()),
        (b"x-ratelimit-reset", str(reset).encode()),
    ]


def refusal_body(path: str, verdict: Verdict, retry_after: int) -> dict[str, Any]:
    """The 429 body in the envelope of the surface ``path`` belongs to."""
    message = f"too many requests {_WHO[verdict.limit]}; retry after {retry_after} s"
    details = {"limit": verdict.limit, "retry_after_s": retry_after}
    return surface_error(path, 429, CODE, message, details)


class RateLimit:
    """The middleware; ``limiter`` holds the buckets."""

    def __init__(self, app: ASGIApp, limiter: RateLimiter, proxy_secret: str | None = None) -> None:
        self.app = app
        self.limiter = limiter
        # The HTTP proxy's secret (services/access/proxy_routes.py proxy_api_secret); None: no
        # proxy, X-Forwarded-For is never read here.
        self.proxy_secret = proxy_secret.encode() if proxy_secret else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        source = _source(scope, self.proxy_secret)
        key = _presented_key(scope)
        presents = bool(key) or (scope.get("method"), scope["path"]) in KEY_IN_BODY
        limiter = self.limiter
        verdict = limiter.admit(source, key_id(key))
        if verdict is not None and not verdict.decision.allowed:
            await self._refuse(scope["path"], verdict, send)
            return
        extra = headers_of(verdict.decision) if verdict is not None else []
        if not extra and not (presents and limiter.failures is not None):
            await self.app(scope, receive, send)
            return
        refused = False

        async def send_with_headers(message: Message) -> None:
            nonlocal refused
            if refused:
                return  # the 401's body: the 429 has been sent in its place
            if message["type"] == "http.response.start":
                if presents and message["status"] == 401:
                    locked = limiter.key_failed(source)
                    if locked is not None:
                        refused = True
                        await self._refuse(scope["path"], locked, send)
                        return
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    async def _refuse(path: str, verdict: Verdict, send: Send) -> None:
        retry_after = max(1, math.ceil(verdict.decision.retry_after_s))
        body = json.dumps(refusal_body(path, verdict, retry_after)).encode()
        headers = [
            (b"content-type", surface_media_type(path).encode()),
            (b"content-length", b"%d" % len(body)),
            (b"retry-after", b"%d" % retry_after),
            *headers_of(verdict.decision),
        ]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})
