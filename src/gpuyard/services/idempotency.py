"""Idempotent creates: the ``Idempotency-Key`` header of REST, training and GraphQL.

Contract, the same on every surface:

- a key is 1..255 printable ASCII characters; anything else is VALIDATION_ERROR
  naming ``Idempotency-Key`` (no key at all: the create is not idempotent);
- keys are scoped by the calling account and the route (one surface's create), and
  remembered for ``settings.idempotency_ttl_hours`` after the create;
- the same key and the same request (sha256 of a canonical JSON of its body) answers
  the resource the first request made, and never places anything a second time;
- the same key with another request is refused: IdempotencyKeyReused (422);
- a create that fails stores no key (its transaction rolls back), so a retry runs it
  again; an expired key counts as absent and its row is replaced.

Exactly once under concurrency: the key row is inserted by :meth:`Claim.record` in
the very transaction that creates the resource, before anything is placed. The unique
``(account_id, route, key)`` makes a concurrent duplicate fail there with an
IntegrityError (PostgreSQL makes it wait on the index until the first commits; SQLite
serialises write transactions), and :func:`create_once` then answers the first
request's resource. Nothing is ever committed without its key, nor a key without its
resource.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core.errors import IdempotencyKeyReused, ValidationFailed
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import IdempotencyKey

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255

# The routes keys are scoped by (stored in ``idempotency_keys.route``).
ROUTE_CLUSTERS = "POST /v1/clusters"
ROUTE_TRAINING = "POST /distributed_jobs_v2/cluster/"
ROUTE_GRAPHQL = "POST /graphql"


def parse_key(raw: str | None) -> str | None:
    """The header's key, or None when the request sent none. Raises ValidationFailed
    (field ``Idempotency-Key``) for an empty, too long or non-printable-ASCII key."""
    if raw is None:
        return None
    if not 1 <= len(raw) <= MAX_KEY_LENGTH:
        raise ValidationFailed(
            HEADER, f"must be 1 to {MAX_KEY_LENGTH} characters long", {"length": len(raw)}
        )
    if not all(" " <= ch <= "~" for ch in raw):
        raise ValidationFailed(HEADER, "must be printable ASCII characters only")
    return raw


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def request_hash(payload: Any) -> str:
    """sha256 (hex) of ``payload`` as canonical JSON: keys sorted, no spaces, UTF-8.
    Two payloads with the same meaning but another key order hash the same."""
    text = json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain
    )
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """One request's key: who sends it, on which route, for which body."""

    account_id: int
    route: str
    key: str
    request_hash: str
    ttl: timedelta

    def record(self, session: Session, resource_id: str | int, now: datetime) -> None:
        """Store the key for ``resource_id`` in the caller's transaction — the one that
        creates the resource — before that transaction places anything. Flushes at
        once: a concurrent request with the same key fails here with IntegrityError
        (after waiting for the first to commit, on PostgreSQL), so it never places.
        An expired row with the same key is replaced."""
        session.execute(
            delete(IdempotencyKey).where(*self._same_key(), IdempotencyKey.expires_at <= now)
        )
        session.add(
            IdempotencyKey(
                account_id=self.account_id,
                route=self.route,
                key=self.key,
                request_hash=self.request_hash,
                resource_id=str(resource_id),
                created_at=now,
                expires_at=now + self.ttl,
            )
        )
        session.flush()

    def _same_key(self) -> tuple[Any, ...]:
        return (
            IdempotencyKey.account_id == self.account_id,
            IdempotencyKey.route == self.route,
            IdempotencyKey.key == self.key,
        )

    def answered(self, ctx: Context) -> str | None:
        """The resource id a live (unexpired) row with this key answers, or None.
        Raises IdempotencyKeyReused when that row was made for another request."""
        now = ctx.clock.now()
        with ctx.read() as session:
            row = session.scalar(
                select(IdempotencyKey).where(*self._same_key(), IdempotencyKey.expires_at > now)
            )
        if row is None:
            return None
        if row.request_hash != self.request_hash:
            raise IdempotencyKeyReused(
                f"{HEADER} {self.key!r} was already used for a different request; "
                "use a new key for a new request",
                {"header": HEADER, "route": self.route},
            )
        return row.resource_id


def claim_for(
    ctx: Context, principal: Principal, route: str, raw_key: str | None, payload: Any
) -> Claim | None:
    """The claim of a request carrying header value ``raw_key`` (None: no key, no
    claim). ``payload`` is what makes two requests the same (the body, and anything
    else the create depends on, e.g. query parameters). Raises ValidationFailed for a
    malformed key, Forbidden for a key that may not write (a replay included)."""
    key = parse_key(raw_key)
    if key is None:
        return None
    principal.require_write()
    return Claim(
        account_id=principal.account_id,
        route=route,
        key=key,
        request_hash=request_hash(payload),
        ttl=timedelta(hours=ctx.settings.idempotency_ttl_hours),
    )


def create_once(
    ctx: Context, claim: Claim | None, create: Callable[[Claim | None], str]
) -> tuple[str, bool]:
    """Run ``create`` (which must call ``claim.record`` in its transaction when given
    a claim, and return the new resource's id) at most once per live key.

    Returns ``(resource_id, replayed)``: ``replayed`` is True when the id is that of
    an earlier request with the same key and body (``create`` did not place anything
    then). Raises IdempotencyKeyReused for the same key with another body, and
    whatever ``create`` raises otherwise.
    """
    if claim is None:
        return create(None), False
    earlier = claim.answered(ctx)
    if earlier is not None:
        return earlier, True
    try:
        return create(claim), False
    except IntegrityError:
        # A concurrent request with the same key committed first (or this failure is
        # not about the key at all: then there is no row and the error stands).
        earlier = claim.answered(ctx)
        if earlier is None:
            raise
        return earlier, True


def purge_expired(ctx: Context) -> int:
    """Delete every expired key (any account); returns how many. Optional upkeep: an
    expired key is already treated as absent and replaced when reused."""
    with ctx.transaction() as session:
        result = session.execute(
            delete(IdempotencyKey).where(IdempotencyKey.expires_at <= ctx.clock.now())
        )
        return int(getattr(result, "rowcount", 0) or 0)
