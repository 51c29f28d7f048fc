"""Serverless rows for tests: an endpoint of an account, workers with their keys,
written straight to the store (the endpoints' and workers' own use cases are tested
where they live)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker

from gpuyard.core.ids import new_endpoint_id, new_worker_id, new_worker_key, worker_key_hash
from gpuyard.services.context import Context
from gpuyard.store.schema.serverless import ServerlessEndpoint, ServerlessWorker

Target = Context | str


@contextmanager
def _session(target: Target) -> Iterator[Session]:
    if isinstance(target, Context):
        with target.transaction() as session:
            yield session
        return
    engine = create_engine(target)
    try:
        with sessionmaker(bind=engine)() as session, session.begin():
            yield session
    finally:
        engine.dispose()


def make_endpoint(target: Target, account_id: int, project_id: int, **fields: Any) -> str:
    """A new endpoint of ``account_id`` in ``project_id`` (``fields`` override the
    defaults); its id."""
    endpoint_id = str(fields.pop("id", new_endpoint_id()))
    values: dict[str, Any] = {
        "name": f"ep-{endpoint_id}",
        "image": "localhost/worker:latest",
        "status": "active",
        "execution_timeout_ms": 600_000,
        **fields,
    }
    with _session(target) as session:
        session.add(
            ServerlessEndpoint(
                id=endpoint_id, account_id=account_id, project_id=project_id, **values
            )
        )
    return endpoint_id


def make_worker(target: Target, endpoint_id: str, **fields: Any) -> tuple[str, str]:
    """A new worker of ``endpoint_id`` (status ``starting`` unless ``fields`` say);
    ``(worker_id, key)``."""
    worker_id = str(fields.pop("id", new_worker_id()))
    key = new_worker_key()
    values: dict[str, Any] = {"status": "starting", "jobs_in_progress": 0, **fields}
    with _session(target) as session:
        session.add(
            ServerlessWorker(
                id=worker_id, endpoint_id=endpoint_id, key_hash=worker_key_hash(key), **values
            )
        )
    return worker_id, key
