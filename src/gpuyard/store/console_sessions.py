"""The ``console_sessions`` table (migration 0013): signed-in web console sessions.

Kept out of the store/schema package on purpose: only the console's session code
reads or writes it. It shares the schema's declarative base, so it is one metadata.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from gpuyard.store.schema import Base, utcnow


class ConsoleSession(Base):
    """One browser's sign-in. ``id`` is the SHA-256 of the cookie's secret;
    ``sealed_key`` the API key sealed with that secret (core/sealed_key.py), so the
    row alone cannot act; ``csrf_token`` what unsafe requests must echo in
    ``X-CSRF-Token``. A session ends at sign-out (``revoked_at``), after
    ``last_seen_at`` + the idle limit, or at ``expires_at`` whatever its use."""

    __tablename__ = "console_sessions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    api_key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id"), index=True)
    sealed_key: Mapped[str] = mapped_column(String(512))
    csrf_token: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    user_agent: Mapped[str] = mapped_column(String(200), default="")
