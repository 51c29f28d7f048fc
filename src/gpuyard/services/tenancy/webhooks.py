"""Account webhooks: where they may point, how they are signed, how they are sent.

A webhook is a ``POST`` of an account event (budget alerts, spending stopped) to the
URL the account set. It must never be a way into the operator's network, so a target
is checked when it is set and again before every attempt (DNS may have changed): the
scheme is http or https, and every address the host resolves to must be public —
loopback, link-local, private (RFC 1918, ULA), shared (CGNAT), unspecified, multicast
and reserved addresses, and IPv6 addresses that embed one (6to4, Teredo, NAT64,
IPv4-mapped and -compatible), are refused unless the operator sets
``GPUYARD_WEBHOOK_ALLOW_PRIVATE=true``. The request goes to the address that was
checked (the name is kept for the Host header and TLS), so a second lookup cannot
point it elsewhere, and redirects are not followed.

Signature: ``X-Gpuyard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret,
"<t>.<body>")>`` with the secret answered once when the URL was set (stored sealed).

Deliveries are rows (``webhook_deliveries``) sent by the reconciler (never the API's
event loop), retried with back-off until delivered or ``webhook_max_attempts`` is
reached (then ``failed``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.network.embedded_ipv4 import embedded_ipv4
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.context import Context
from gpuyard.services.tenancy.secrets import SecretUnreadable, secret_box
from gpuyard.store.schema import Account, AccountEvent, WebhookDelivery

log = logging.getLogger(__name__)

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"

# Waits after the 1st, 2nd, ... failed attempt; the last repeats.
BACKOFF_S = (10, 30, 120, 600, 3600, 3 * 3600, 6 * 3600)
MAX_URL_LENGTH = 2000
SIGNATURE_HEADER = "X-Gpuyard-Signature"
# The event id of a serverless job's completion delivery (services/serverless/webhooks.py):
# it goes to the URL the job named (the row's), not the account's webhook.
JOB_EVENT_ID = 0
JOB_EVENT_KIND = "serverless.job"

Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (a literal address: itself)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _refused_kind(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address may not be a webhook target, as "a <kind> address" (None: it is
    public). An IPv6 address that embeds IPv4 addresses (6to4, Teredo, NAT64,
    IPv4-mapped, -translated and -compatible: core/network/embedded_ipv4.py) is judged by
    them: packets to it reach them."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.is_loopback or addr.is_unspecified:
            return "a loopback address" if addr.is_loopback else "an unspecified address"
        embedded = embedded_ipv4(addr)
        for inner in embedded:
            kind = _refused_kind(inner)
            if kind is not None:
                return f"an address embedding {inner}, {kind}"
        if embedded:
            return None
    checks = (
        ("loopback", addr.is_loopback),
        ("link-local", addr.is_link_local),
        ("unspecified", addr.is_unspecified),
        ("multicast", addr.is_multicast),
        ("private", addr.is_private),
        ("reserved", addr.is_reserved),
        ("not globally routable", not addr.is_global),
    )
    name = next((name for name, hit in checks if hit), None)
    if name is None:
        return None
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} address"


@dataclass(frozen=True)
class Target:
    """A checked webhook target: the URL as set, and the address to connect to."""

    url: str
    host: str
    address: str

    def connect_url(self) -> str:
        """The URL with the checked address in place of the name."""
        parts = urlsplit(self.url)
        literal = f"[{self.address}]" if ":" in self.address else self.address
        netloc = literal if parts.port is None else f"{literal}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))

    def host_header(self) -> str:
        parts = urlsplit(self.url)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if parts.port is None else f"{host}:{parts.port}"


def check_target(url: str, *, allow_private: bool, resolver: Resolver = resolve) -> Target:
    """``url`` as a webhook target, resolved and checked (see the module docstring).
    Raises ValidationFailed on field ``webhook_url`` saying what is wrong."""
    field = "webhook_url"
    if not url or len(url) > MAX_URL_LENGTH:
        raise ValidationFailed(field, f"must be 1 to {MAX_URL_LENGTH} characters")
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise ValidationFailed(field, "must not hold spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValidationFailed(field, f"is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValidationFailed(field, "must be an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ValidationFailed(field, "must not carry a user name or password")
    if parts.fragment:
        raise ValidationFailed(field, "must not have a #fragment")
    host = parts.hostname
    if not host:
        raise ValidationFailed(field, "must name a host")
    try:
        addresses = resolver(host, port or (443 if parts.scheme == "https" else 80))
    except (OSError, UnicodeError) as exc:
        raise ValidationFailed(field, f"the host {host!r} does not resolve: {exc}") from None
    if not addresses:
        raise ValidationFailed(field, f"the host {host!r} does not resolve")
    if not allow_private:
        for raw in addresses:
            kind = _refused_kind(ipaddress.ip_address(raw.split("%", 1)[0]))
            if kind is not None:
                raise ValidationFailed(
                    field,
                    f"the host {host!r} resolves to {raw}, {kind}: webhooks go "
                    "to public addresses only (the operator may allow private ones with "
                    "GPUYARD_WEBHOOK_ALLOW_PRIVATE)",
                    {"address": raw},
                )
    return Target(url=url, host=host, address=addresses[0])


def new_secret() -> str:
    """A webhook signing secret (shown once, stored sealed)."""
    return "whsec_" + secrets.token_urlsafe(32)


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The ``X-Gpuyard-Signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, body: bytes, header: str) -> bool:
    """Whether ``header`` is a valid signature of ``body`` (receivers, tests)."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields.get("t", ""))
    except ValueError:
        return False
    return hmac.compare_digest(sign(secret, body, timestamp), header)


def event_body(event: AccountEvent) -> str:
    """The JSON a webhook of ``event`` sends."""
    return json.dumps(
        {
            "id": event.id,
            "type": event.kind,
            "account_id": event.account_id,
            "message": event.message,
            "detail": event.detail or {},
            "created_at": event.created_at.isoformat().replace("+00:00", "Z"),
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def enqueue(session: Session, account: Account, event: AccountEvent, now: datetime) -> None:
    """A delivery of ``event`` (flushed, with its id) when the account has a webhook."""
    if not account.webhook_url:
        return
    session.add(
        WebhookDelivery(
            account_id=account.id,
            event_id=event.id,
            url=account.webhook_url,
            body=event_body(event),
            status=PENDING,
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
    )


def backoff(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed attempt."""
    return timedelta(seconds=BACKOFF_S[min(max(attempts, 1), len(BACKOFF_S)) - 1])


def due_deliveries(ctx: Context, limit: int = 100) -> list[int]:
    """Ids of pending deliveries whose next attempt is due."""
    with ctx.read() as session:
        return list(
            session.scalars(
                select(WebhookDelivery.id)
                .where(
                    WebhookDelivery.status == PENDING,
                    WebhookDelivery.next_attempt_at <= ctx.clock.now(),
                )
                .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
                .limit(limit)
            )
        )


def next_due(ctx: Context) -> datetime | None:
    """When the earliest pending delivery is due."""
    with ctx.read() as session:
        return session.scalar(
            select(WebhookDelivery.next_attempt_at)
            .where(WebhookDelivery.status == PENDING)
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(1)
        )


@dataclass(frozen=True)
class _Attempt:
    delivery_id: int
    account_id: int
    url: str | None
    secret: str | None
    body: str
    event_kind: str
    attempts: int


def _prepare(ctx: Context, delivery_id: int) -> _Attempt | None:
    """What the attempt sends, or None when the delivery is not due (sent meanwhile)."""
    with ctx.read() as session:
        row = session.get(WebhookDelivery, delivery_id)
        if row is None or row.status != PENDING or row.next_attempt_at > ctx.clock.now():
            return None
        account = session.get(Account, row.account_id)
        job = row.event_id == JOB_EVENT_ID
        kind = JOB_EVENT_KIND if job else json.loads(row.body).get("type", "")
        url = row.url if job else (account.webhook_url if account is not None else None)
        stored = account.webhook_secret if account is not None else None
        secret = None
        if stored:
            try:
                secret = secret_box(ctx.settings).open(stored)
            except SecretUnreadable:
                secret = None
        return _Attempt(row.id, row.account_id, url, secret, row.body, str(kind), row.attempts)


def _post(ctx: Context, attempt: _Attempt, url: str, secret: str) -> str | None:
    """One POST; None when the receiver answered 2xx, else what went wrong."""
    try:
        target = check_target(url, allow_private=ctx.settings.webhook_allow_private)
    except ValidationFailed as exc:
        return f"target refused: {exc.message}"
    body = attempt.body.encode()
    timestamp = int(ctx.clock.now().timestamp())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpuyard-webhook/1",
        "Host": target.host_header(),
        "X-Gpuyard-Event": attempt.event_kind,
        "X-Gpuyard-Delivery": str(attempt.delivery_id),
        SIGNATURE_HEADER: sign(secret, body, timestamp),
    }
    extensions: dict[str, Any] = {}
    if urlsplit(url).scheme == "https":
        extensions["sni_hostname"] = target.host
    timeout = ctx.settings.webhook_timeout_s
    try:
        with httpx.Client(
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
            verify=trusted_tls(trust_env=False),
        ) as client:
            request = client.build_request(
                "POST", target.connect_url(), content=body, headers=headers, extensions=extensions
            )
            response = client.send(request)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:1000]
    if 200 <= response.status_code < 300:
        return None
    if 300 <= response.status_code < 400:
        return f"HTTP {response.status_code}: redirects are not followed"
    return f"HTTP {response.status_code}"


def deliver(ctx: Context, delivery_id: int) -> bool:
    """Make one attempt of a due delivery and record its outcome. True when it was
    delivered now. A delivery not due (or done) is left alone."""
    attempt = _prepare(ctx, delivery_id)
    if attempt is None:
        return False
    if not attempt.url:
        error: str | None = "the account's webhook was removed"
        final = True
    elif attempt.secret is None:
        error, final = "the webhook secret cannot be read; set the webhook again", True
    else:
        error = _post(ctx, attempt, attempt.url, attempt.secret)
        final = False
    now = ctx.clock.now()
    with ctx.transaction() as session:
        row = session.get(WebhookDelivery, delivery_id)
        if row is None or row.status != PENDING:
            return False
        row.attempts += 1
        if attempt.url:
            row.url = attempt.url
        if error is None:
            row.status, row.delivered_at, row.last_error = DELIVERED, now, None
            return True
        row.last_error = error[:1000]
        if final or row.attempts >= ctx.settings.webhook_max_attempts:
            row.status = FAILED
        else:
            row.next_attempt_at = now + backoff(row.attempts)
    log.info(
        "webhook delivery %s failed (attempt %s): %s", delivery_id, attempt.attempts + 1, error
    )
    return False


def deliver_due(ctx: Context) -> int:
    """One attempt of every due delivery, in this thread (tests, tools); the number
    delivered."""
    return sum(1 for delivery_id in due_deliveries(ctx) if deliver(ctx, delivery_id))
