"""The installation's identity: one UUID in the database (created by migration 0006,
or here if the row was lost), which labels every engine object gpuyard makes."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.ownership import Ownership
from gpuyard.store.locks import startup_xact_lock
from gpuyard.store.schema import Installation


def ensure_installation(session: Session) -> Ownership:
    """This installation's ownership; creates the id on a database that has none.
    Idempotent: every later call answers the same id, also across replicas starting
    together (the start-up lock makes the second wait for the first one's row)."""
    startup_xact_lock(session)
    row = session.scalar(select(Installation).order_by(Installation.id).limit(1))
    if row is None:
        fresh = Ownership.new()
        row = Installation(id=1, uuid=fresh.installation_id)
        session.add(row)
        session.flush()
    return Ownership(row.uuid)
