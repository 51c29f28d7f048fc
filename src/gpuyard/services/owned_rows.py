"""One account's row by id, or the not-found answer: the check that keeps every
account's rows from every other account.

A row that does not exist and a row of another account answer the same error, so no
caller can learn that an id exists elsewhere. Ids outside the store's range (32-bit)
never reach a query (PostgreSQL rejects them, SQLite overflows): they read as missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from sqlalchemy.orm import Session

from gpuyard.core.errors import GpuyardError
from gpuyard.core.input_rules import MAX_DB_ID


class AccountRow(Protocol):
    """A mapped row that belongs to one account."""

    @property
    def account_id(self) -> int: ...


R = TypeVar("R", bound=AccountRow)


def _anything(_row: object) -> bool:
    return True


def owned_row(
    session: Session,
    model: type[R],
    row_id: int,
    account_id: int,
    missing: Callable[[], GpuyardError],
    *,
    visible: Callable[[R], bool] = _anything,
    lock: bool = False,
) -> R:
    """Row ``row_id`` of ``model`` when it belongs to ``account_id`` and ``visible``
    holds for it; otherwise raises ``missing()``, the same for an unknown id, an id
    out of range and another account's row. ``lock`` reads it fresh and locked until
    the transaction ends (``SELECT ... FOR UPDATE`` on PostgreSQL), so writes to one
    row apply one after the other. Runs inside the caller's session."""
    row = (
        session.get(model, row_id, with_for_update=lock, populate_existing=lock)
        if 1 <= row_id <= MAX_DB_ID
        else None
    )
    if row is None or row.account_id != account_id or not visible(row):
        raise missing()
    return row
