"""Who may pass the HTTP proxy to a private port: open links, their cookies, API keys.

- :func:`issue_link` (the owner, with a write key) makes a one-time link on the
  port's proxy host; its token is stored only as a SHA-256.
- :func:`redeem_link` swaps the token, once and before it expires, for the port's
  cookie (services/proxy_routes.py port_secret), set on that host alone.
- :func:`authorize` answers the proxy's per-request check of an API key: the key's
  account must own the cluster (another account's cluster is "not found").

Issuing and redeeming a link are events on the cluster naming the API key.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpuyard.core.errors import ClusterNotFound, NotFound, ProxyUnavailable
from gpuyard.core.proxy import ProxyBase, parse_host
from gpuyard.core.states import ClusterStatus
from gpuyard.services.auth import Principal
from gpuyard.services.clusters import load_cluster
from gpuyard.services.context import Context
from gpuyard.services.lifecycle import record_event
from gpuyard.services.proxy_routes import port_secret
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
    """The session an unused, unexpired link of this cluster port opens (the link is
    used up); None for anything else (wrong, used, expired, another port's)."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        row = session.scalar(select(ProxySession).where(ProxySession.token_hash == _hash(token)))
        if (
            row is None
            or row.used_at is not None
            or row.link_expires_at <= now
            or row.cluster_id != cluster_id
            or row.internal_port != port
        ):
            return None
        done = session.execute(
            update(ProxySession)
            .where(ProxySession.id == row.id, ProxySession.used_at.is_(None))
            .values(used_at=now)
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
        return Grant(port_secret(ctx.settings, cluster_id, port), row.expires_at)


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


def unavailable_reason(ctx: Context, host: str) -> str | None:
    """Why the container behind proxy host ``host`` did not answer, for the page the
    proxy shows: the cluster's status when it is not running; None when the address
    names no live cluster."""
    target = parse_host(host, ctx.settings.proxy_domain)
    if target is None:
        return None
    cluster_id, port = target
    with ctx.connect() as conn:
        status = conn.scalar(select(Cluster.status).where(Cluster.id == cluster_id))
    if status is None or status in (ClusterStatus.TERMINATED, ClusterStatus.TERMINATING):
        return None
    if status == ClusterStatus.RUNNING:
        return f"Cluster {cluster_id} is running, but nothing answers on port {port} yet."
    return f"Cluster {cluster_id} is {status}: port {port} answers once it runs again."
