"""Who may pass the HTTP proxy to a private port: open links, their sessions, API keys.

- :func:`issue_link` (the owner, with a write key) makes a one-time link on the
  port's proxy host; its token is stored only as a SHA-256.
- :func:`redeem_link` swaps the token, once and before it expires, for a session: a
  random cookie of its own (stored only as a SHA-256), set on that host alone.
- :func:`session_allows` answers the proxy's per-request check of such a cookie: the
  session is unexpired and unrevoked, names this port, and the API key that asked for
  the link is still live and its user may still change the cluster (a revoked key, a
  removed member or a downgraded role closes the session at its next request).
  :class:`SessionChecks` keeps answers for a few seconds.
- :func:`revoke_sessions` ends every session of a port (the owner, a write key).
- :func:`authorize` answers the proxy's per-request check of an API key: the key's
  account must own the cluster (another account's cluster is "not found");
  :func:`port_visibility` tells a public port (anybody passes) from none.
- :func:`unavailable_page` says why a request reached no container (404, 502).

Issuing and redeeming a link, and revoking sessions, are events on the cluster naming
the API key.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpuyard.core.errors import ClusterNotFound, Forbidden, NotFound, ProxyUnavailable, Unauthorized
from gpuyard.core.network.proxy import ProxyBase, Visibility, parse_host
from gpuyard.core.roles import Permission
from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters.cluster_rows import load_cluster, owner_principal
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import AccountSelection, Principal, resolve_key_id
from gpuyard.store.schema import ApiKey, Cluster, Project, ProxySession

ACCESS_EVENT = "access"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class OpenLink:
    url: str
    expires_at: datetime
    session_expires_at: datetime


@dataclass(frozen=True)
class Grant:
    """What a redeemed link gives: the cookie value and until when it works."""

    secret: str
    expires_at: datetime


def _http_port(cluster: Cluster, port: int) -> None:
    for p in cluster.ports or []:
        if p.get("protocol") == "http" and int(p["internal_port"]) == port:
            return
    raise NotFound(
        f"cluster {cluster.id} declares no http port {port}",
        {"cluster_id": cluster.id, "port": port},
    )


def key_name(db: Session, key_id: int) -> str:
    """The API key's name (its id when it has none)."""
    name = db.scalar(select(ApiKey.name).where(ApiKey.id == key_id))
    return name or f"key {key_id}"


def issue_link(
    ctx: Context,
    principal: Principal,
    base: ProxyBase,
    cluster_id: str,
    port: int,
    proxy_problem: str | None,
) -> OpenLink:
    """A one-time link that opens ``port`` of the caller's cluster in a browser.
    Raises ClusterNotFound (unknown or another account's), NotFound (no such http
    port), ProxyUnavailable (``proxy_problem`` says why) or Forbidden (read key)."""
    principal.require_write()
    now = ctx.clock.now()
    token = secrets.token_urlsafe(32)
    link_expires = now + timedelta(seconds=ctx.settings.proxy_link_ttl_s)
    session_expires = link_expires + timedelta(hours=ctx.settings.proxy_session_hours)
    with ctx.transaction() as session:
        cluster = load_cluster(session, principal, cluster_id)
        _http_port(cluster, port)
        if cluster.status == ClusterStatus.TERMINATED:
            raise ClusterNotFound(f"cluster {cluster_id!r} not found", {"cluster_id": cluster_id})
        if proxy_problem is not None:
            raise ProxyUnavailable(proxy_problem)
        name = key_name(session, principal.key_id)
        session.execute(delete(ProxySession).where(ProxySession.expires_at <= now))
        session.add(
            ProxySession(
                token_hash=_hash(token),
                cluster_id=cluster_id,
                internal_port=port,
                account_id=principal.account_id,
                key_name=name,
                api_key_id=principal.key_id,
                user_id=principal.user_id,
                created_at=now,
                link_expires_at=link_expires,
                expires_at=session_expires,
            )
        )
        record_event(
            session,
            cluster_id,
            now,
            ACCESS_EVENT,
            f"proxy open link for port {port} issued to API key {name!r}",
        )
    return OpenLink(base.open_link(cluster_id, port, token), link_expires, session_expires)


def redeem_link(ctx: Context, cluster_id: str, port: int, token: str) -> Grant | None:
    """The session an unused, unexpired, unrevoked link of this cluster port opens (the
    link is used up): a new random cookie value, of this one session; None for anything
    else (wrong, used, expired, revoked, another port's)."""
    now = ctx.clock.now()
    cookie = secrets.token_urlsafe(32)
    with ctx.transaction() as session:
        row = session.scalar(select(ProxySession).where(ProxySession.token_hash == _hash(token)))
        if (
            row is None
            or row.used_at is not None
            or row.revoked_at is not None
            or row.link_expires_at <= now
            or row.cluster_id != cluster_id
            or row.internal_port != port
        ):
            return None
        done = session.execute(
            update(ProxySession)
            .where(ProxySession.id == row.id, ProxySession.used_at.is_(None))
            .values(used_at=now, cookie_hash=_hash(cookie))
        )
        if done.rowcount != 1:  # type: ignore[attr-defined]
            return None
        record_event(
            session,
            cluster_id,
            now,
            ACCESS_EVENT,
            f"proxy open link for port {port} used (API key {row.key_name!r})",
        )
        return Grant(cookie, row.expires_at)


# A request may carry a few cookies of this name (one set for a parent domain by a
# neighbour's page, say): each is tried, up to this many.
_MAX_COOKIES = 4


def session_allows(ctx: Context, host: str, cookies: Iterable[str]) -> bool:
    """Whether one of ``cookies`` (values of the session cookie, matched by exact name
    by the caller) is a live session of the cluster port ``host`` names: unexpired,
    unrevoked, of this port, of a cluster not terminated, its API key live, and that
    key's user still a member allowed to change the cluster (WRITE_RESOURCES in its
    project, as the link needed). Reads only."""
    target = parse_host(host, ctx.settings.proxy_domain)
    hashes = [_hash(c) for c in list(cookies)[:_MAX_COOKIES] if c]
    if target is None or not hashes:
        return False
    cluster_id, port = target
    now = ctx.clock.now()
    with ctx.read() as session:
        rows = session.scalars(
            select(ProxySession).where(ProxySession.cookie_hash.in_(hashes))
        ).all()
        live = [
            r.api_key_id
            for r in rows
            if r.cluster_id == cluster_id
            and r.internal_port == port
            and r.revoked_at is None
            and r.expires_at > now
            and r.api_key_id is not None
        ]
        if not live:
            return False
        owner = session.execute(
            select(Cluster.project_id, Project.account_id)
            .join(Project, Project.id == Cluster.project_id)
            .where(Cluster.id == cluster_id, Cluster.status != ClusterStatus.TERMINATED)
        ).first()
        if owner is None:
            return False
        for key_id in live:
            try:
                principal = resolve_key_id(
                    session, key_id, AccountSelection(account_id=owner.account_id)
                )
            except (Unauthorized, Forbidden):
                continue
            if principal.may_use_project(owner.project_id) and principal.allows(
                Permission.WRITE_RESOURCES
            ):
                return True
    return False


def revoke_sessions(ctx: Context, principal: Principal, cluster_id: str, port: int) -> int:
    """End every session (and unused link) of ``port`` of the caller's cluster; how
    many were live. Raises ClusterNotFound, NotFound (no such http port), Forbidden
    (read key). The proxy refuses their cookies within :class:`SessionChecks`' ttl."""
    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        cluster = load_cluster(session, principal, cluster_id)
        _http_port(cluster, port)
        done = session.execute(
            update(ProxySession)
            .where(
                ProxySession.cluster_id == cluster_id,
                ProxySession.internal_port == port,
                ProxySession.revoked_at.is_(None),
                ProxySession.expires_at > now,
            )
            .values(revoked_at=now)
        )
        count = int(done.rowcount or 0)  # type: ignore[attr-defined]
        record_event(
            session,
            cluster_id,
            now,
            ACCESS_EVENT,
            f"proxy sessions of port {port} revoked ({count}) by API key "
            f"{key_name(session, principal.key_id)!r}",
        )
    return count


class SessionChecks:
    """Answers of :func:`session_allows` kept for ``ttl_s`` seconds, so a page's burst
    of requests costs one read, while a revoked session is refused within ``ttl_s``.
    At most ``max_entries`` kept (least recently stored dropped). Thread-safe."""

    def __init__(
        self,
        ttl_s: float = 2.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, tuple[str, ...]], tuple[float, bool]] = OrderedDict()

    def _key(self, host: str, cookies: list[str]) -> tuple[str, tuple[str, ...]]:
        return (host.lower(), tuple(_hash(c) for c in cookies))

    def cached(self, host: str, cookies: list[str]) -> bool | None:
        """The kept answer for ``(host, cookies)``; None when there is none (no I/O, so
        a hit is answered on the event loop)."""
        key = self._key(host, cookies)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] > self._clock():
                return hit[1]
        return None

    def store(self, host: str, cookies: list[str], answer: bool) -> None:
        key = self._key(host, cookies)
        with self._lock:
            self._entries[key] = (self._clock() + self.ttl_s, answer)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


def authorize(ctx: Context, principal: Principal, host: str) -> tuple[str, int]:
    """The cluster port ``host`` names, when the caller's account owns the cluster and
    declares that http port; raises NotFound otherwise (another account's cluster
    reads as none), Forbidden for a read key (a private port is often a notebook,
    which runs code: as much as the terminal, which needs write)."""
    target = parse_host(host, ctx.settings.proxy_domain)
    if target is None:
        raise NotFound("no cluster port at this address")
    cluster_id, port = target
    principal.require_write()
    with ctx.connect() as conn:
        ports = conn.scalar(
            select(Cluster.ports)
            .join(Project, Project.id == Cluster.project_id)
            .where(
                Cluster.id == cluster_id,
                Project.account_id == principal.account_id,
                Cluster.status != ClusterStatus.TERMINATED,
            )
        )
    if ports is None or not any(
        p.get("protocol") == "http" and int(p["internal_port"]) == port for p in ports
    ):
        raise NotFound(f"no cluster port {cluster_id}-{port} of yours")
    return cluster_id, port


@dataclass(frozen=True)
class Unavailable:
    """The page the proxy shows when a request found no container to go to."""

    status: int
    title: str
    text: str


_NO_PORT = Unavailable(404, "No such cluster port", "No live cluster port is at this address.")


def unavailable_page(ctx: Context, host: str) -> Unavailable:
    """Why the request to proxy host ``host`` reached no container, for the page the
    proxy shows: 404 when the address names no http port of a live cluster; else 502
    naming the cluster's status (a stopped or starting container, nothing listening
    yet). Reads only."""
    target = parse_host(host, ctx.settings.proxy_domain)
    if target is None:
        return _NO_PORT
    cluster_id, port = target
    with ctx.connect() as conn:
        row = conn.execute(
            select(Cluster.status, Cluster.ports).where(Cluster.id == cluster_id)
        ).first()
    if row is None or row.status in (ClusterStatus.TERMINATED, ClusterStatus.TERMINATING):
        return _NO_PORT
    declared = [
        p
        for p in row.ports or []
        if p.get("protocol") == "http" and int(p["internal_port"]) == port
    ]
    if not declared:
        return _NO_PORT
    if row.status == ClusterStatus.RUNNING:
        text = f"Cluster {cluster_id} is running, but nothing answers on port {port} yet."
    else:
        text = f"Cluster {cluster_id} is {row.status}: port {port} answers once it runs again."
    return Unavailable(502, "Cluster not answering", text)


def port_visibility(ctx: Context, host: str) -> Visibility | None:
    """The visibility of the http port proxy host ``host`` names, on a live cluster;
    None when it names none. Reads only."""
    target = parse_host(host, ctx.settings.proxy_domain)
    if target is None:
        return None
    cluster_id, port = target
    with ctx.connect() as conn:
        ports = conn.scalar(
            select(Cluster.ports).where(
                Cluster.id == cluster_id, Cluster.status != ClusterStatus.TERMINATED
            )
        )
    for p in ports or []:
        if p.get("protocol") == "http" and int(p["internal_port"]) == port:
            return Visibility(p.get("visibility", Visibility.PRIVATE))
    return None


def cluster_owner(ctx: Context, cluster_id: str) -> tuple[int, int] | None:
    """The account and project of cluster ``cluster_id`` (the account a key at the
    proxy acts for); None when there is none."""
    with ctx.read() as session:
        owner = owner_principal(session, cluster_id)
    return None if owner is None else (owner.account_id, owner.default_project_id)
