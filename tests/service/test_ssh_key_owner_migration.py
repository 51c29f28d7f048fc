"""Migration 0017 on each backend: SSH keys stored before owners were recorded are
given to their account's oldest owner (never to a member, never to another account's
user)."""

from __future__ import annotations

from sqlalchemy import text

from gpuyard.store.db import make_engine
from gpuyard.store.migrate import upgrade

ROWS = """
INSERT INTO users (id, email, name, is_admin, created_at) VALUES
  (1, 'm@x', 'm', false, '2026-01-01'), (2, 'o1@x', 'o1', false, '2026-01-01'),
  (3, 'o2@x', 'o2', false, '2026-01-01'), (4, 'b@x', 'b', false, '2026-01-01');
INSERT INTO accounts (id, name, created_at) VALUES
  (1, 'a', '2026-01-01'), (2, 'b', '2026-01-01'), (3, 'ownerless', '2026-01-01');
INSERT INTO members (id, account_id, user_id, role) VALUES
  (1, 1, 1, 'member'), (2, 1, 3, 'owner'), (3, 1, 2, 'owner'), (4, 2, 4, 'owner');
INSERT INTO ssh_keys (id, account_id, name, public_key, fingerprint, created_at) VALUES
  (1, 1, 'a', 'ssh-ed25519 AAAA a', 'SHA256:a', '2026-01-01'),
  (2, 2, 'b', 'ssh-ed25519 AAAA b', 'SHA256:b', '2026-01-01'),
  (3, 3, 'c', 'ssh-ed25519 AAAA c', 'SHA256:c', '2026-01-01');
"""


def test_old_keys_go_to_the_accounts_oldest_owner(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        upgrade(engine, "0015")
        with engine.begin() as conn:
            for statement in ROWS.split(";"):
                if statement.strip():
                    conn.execute(text(statement))
        upgrade(engine, "0017")
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, user_id FROM ssh_keys ORDER BY id")).all()
            owners = {key_id: user_id for key_id, user_id in rows}
    finally:
        engine.dispose()
    # Account 1: member 2 (user 3) is its oldest owner; account 3 has none.
    assert owners == {1: 3, 2: 4, 3: None}
