"""Persistence: SQLAlchemy 2 tables, engine set-up and Alembic migrations."""
