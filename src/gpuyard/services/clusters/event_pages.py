"""A page of one holder's events (a cluster, or a training cluster under ``tc-N``),
oldest first: after a cursor (an index range on ``events.cluster_id`` and the id) or,
for the seed's clients, at an offset. The callers check that the caller may see the
holder first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpuyard.core import cursors
from gpuyard.store.schema import Event

EVENT_KEY: cursors.KeyShape = ("int",)


@dataclass(frozen=True)
class EventPage:
    """One page of events, oldest first, with the total and the cursor of the next
    page (None on the last)."""

    events: list[Event]
    total: int
    page: int
    per_page: int
    next_cursor: str | None = None


def check_cursor(
    listing: str, bound: dict[str, cursors.FilterValue], page: int, cursor: str | None
) -> int | None:
    """The event id a ``cursor`` of ``listing`` bound to ``bound`` continues after
    (None without one). Raises ValidationFailed naming ``cursor`` (or ``page`` with
    both), before any read."""
    cursor = cursor or None
    cursors.check_page(page, cursor)
    if cursor is None:
        return None
    after = cursors.decode(cursor, listing, bound, EVENT_KEY)
    return cast(int, after[0])  # EVENT_KEY: one int


def read_page(
    session: Session,
    holder: str,
    listing: str,
    bound: dict[str, cursors.FilterValue],
    *,
    after_id: int | None,
    page: int,
    per_page: int,
) -> EventPage:
    """``holder``'s events after event ``after_id``, else at ``page``'s offset; the
    next page's cursor is of ``listing`` and ``bound``."""
    mine = Event.cluster_id == holder
    total = session.scalar(select(func.count()).select_from(Event).where(mine)) or 0
    q = select(Event).where(mine)
    q = q.where(Event.id > after_id) if after_id is not None else q.offset((page - 1) * per_page)
    rows = list(session.scalars(q.order_by(Event.id).limit(per_page + 1)))
    events = rows[:per_page]
    next_cursor = None
    if len(rows) > per_page:
        next_cursor = cursors.encode(listing, bound, (events[-1].id,))
    return EventPage(events, int(total), page, per_page, next_cursor)
