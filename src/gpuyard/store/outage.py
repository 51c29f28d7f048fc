"""Which database errors mean "the database is away", not "this request is wrong".

During a PostgreSQL failover (Patroni promoting the synchronous replica) or a restart,
every statement fails for a few seconds: the statement in flight with "server closed
the connection unexpectedly" or "terminating connection due to unexpected postmaster
exit" (psycopg's AdminShutdown), each new connection with "Connection refused", "the
database system is starting up" or, from a node that is a replica now, "session is
read-only". None of these is the request's fault, and none outlives the failover: the
pool drops the broken connections (``pool_pre_ping`` and SQLAlchemy's invalidation) and
connects again through the multi-host URL to whichever node takes writes.
"""

from __future__ import annotations

import logging

import psycopg
import psycopg.errors
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from gpuyard.core.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

# How many links of ``__cause__`` / ``__context__`` to follow to the database error.
_CHAIN_LIMIT = 8


def is_database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` (or an error it was raised from) says the database cannot be
    reached or takes no writes right now: a lost or refused PostgreSQL connection, a
    server shutting down or starting up, a read-only node, an invalidated connection,
    or no pooled connection free in time. False for everything else (a constraint,
    bad SQL, SQLite's own errors) — those are not a failover's doing."""
    seen: BaseException | None = exc
    for _ in range(_CHAIN_LIMIT):
        if seen is None:
            return False
        if isinstance(seen, PoolTimeout):
            return True
        if isinstance(seen, DBAPIError):
            if seen.connection_invalidated:
                return True
            return isinstance(
                seen.orig, psycopg.OperationalError | psycopg.errors.ReadOnlySqlTransaction
            )
        if isinstance(seen, psycopg.OperationalError | psycopg.errors.ReadOnlySqlTransaction):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def unavailable(exc: BaseException) -> DatabaseUnavailable:
    """The user-facing error for outage ``exc``; its cause is logged in one line (a
    failover fails every request for a few seconds: no stack trace for each)."""
    cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    log.warning("database unavailable: %s", cause[0] if cause else type(exc).__name__)
    return DatabaseUnavailable(
        "the database is unavailable (a failover or a restart); retry shortly: a create "
        "retried with the same Idempotency-Key never places twice"
    )
