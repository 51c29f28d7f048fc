"""Web console sessions: open one for a checked API key, find it by the cookie's
secret, end it (sign-out).

Contract: the database holds only the secret's hash and the key sealed with the
secret (core/sealed_key.py); :func:`find_session` hands back the key only to a caller
presenting the secret. A session is live until it is revoked, idle for longer than
``idle`` (its ``last_seen_at`` is moved at most once per :data:`TOUCH_EVERY`), or
past its absolute ``expires_at``. The API key's own revocation ends what the session
can do (every request re-resolves the key), not the row.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update

from gpuyard.core.sealed_key import new_secret, seal, secret_id, unseal
from gpuyard.services.context import Context
from gpuyard.store.console_sessions import ConsoleSession

IDLE_LIMIT = timedelta(hours=12)
MAX_AGE = timedelta(days=7)
# Recording every request's time would make each read a write; a minute is precise
# enough for a 12 h idle limit.
TOUCH_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class Opened:
    """A new session: ``secret`` goes into the cookie, ``csrf_token`` to the page."""

    secret: str
    csrf_token: str
    expires_at: datetime


@dataclass(frozen=True)
class LiveSession:
    """A live session found by its secret, with the API key it acts as."""

    id: str
    key: str
    api_key_id: int
    csrf_token: str
    last_seen_at: datetime
    expires_at: datetime

    def ends_at(self, idle: timedelta) -> datetime:
        """When it ends if not used again."""
        return min(self.expires_at, self.last_seen_at + idle)


def open_session(
    ctx: Context, *, api_key_id: int, key: str, user_agent: str = "", max_age: timedelta = MAX_AGE
) -> Opened:
    """Record a session acting as ``key`` (already checked by the caller)."""
    secret = new_secret()
    csrf = secrets.token_urlsafe(32)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        session.add(
            ConsoleSession(
                id=secret_id(secret),
                api_key_id=api_key_id,
                sealed_key=seal(key, secret),
                csrf_token=csrf,
                created_at=now,
                last_seen_at=now,
                expires_at=now + max_age,
                user_agent=user_agent[:200],
            )
        )
        # Housekeeping where it costs nothing extra: ended sessions of this key go.
        session.execute(
            delete(ConsoleSession).where(
                ConsoleSession.api_key_id == api_key_id,
                (ConsoleSession.expires_at < now) | (ConsoleSession.revoked_at.is_not(None)),
            )
        )
    return Opened(secret=secret, csrf_token=csrf, expires_at=now + max_age)


def find_session(ctx: Context, secret: str, idle: timedelta = IDLE_LIMIT) -> LiveSession | None:
    """The live session of ``secret``; None when there is none, or it ended."""
    if not secret or len(secret) > 200:
        return None
    now = ctx.clock.now()
    with ctx.read() as session:
        row = session.get(ConsoleSession, secret_id(secret))
        if row is None or row.revoked_at is not None:
            return None
        found = LiveSession(
            id=row.id,
            key=unseal(row.sealed_key, secret) or "",
            api_key_id=row.api_key_id,
            csrf_token=row.csrf_token,
            last_seen_at=row.last_seen_at,
            expires_at=row.expires_at,
        )
    if not found.key or found.ends_at(idle) <= now:
        return None
    if now - found.last_seen_at >= TOUCH_EVERY:
        with ctx.transaction() as session:
            session.execute(
                update(ConsoleSession)
                .where(ConsoleSession.id == found.id, ConsoleSession.revoked_at.is_(None))
                .values(last_seen_at=now)
            )
        found = LiveSession(**{**found.__dict__, "last_seen_at": now})
    return found


def revoke_session(ctx: Context, secret: str) -> bool:
    """End the session of ``secret`` (sign-out). True when a live one was ended."""
    if not secret or len(secret) > 200:
        return False
    with ctx.transaction() as session:
        done = session.execute(
            update(ConsoleSession)
            .where(ConsoleSession.id == secret_id(secret), ConsoleSession.revoked_at.is_(None))
            .values(revoked_at=ctx.clock.now())
        )
    return bool(getattr(done, "rowcount", 0))


def session_count(ctx: Context, api_key_id: int) -> int:
    """How many session rows ``api_key_id`` has, ended ones not yet cleared included
    (tests, diagnostics)."""
    with ctx.read() as session:
        rows = session.scalars(
            select(ConsoleSession.id).where(ConsoleSession.api_key_id == api_key_id)
        )
        return len(list(rows))
