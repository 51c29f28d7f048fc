"""Test helpers: settings in a temp home and a real HTTP server in a thread."""

from __future__ import annotations

import atexit
import fcntl
import os
import random
import shutil
import socket
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastapi.dependencies.models
import httpx
import uvicorn

from gpuyard.api.app import Server, TrainingOperatorFactory, build_server
from gpuyard.api.http.prompt_server import PromptServer
from gpuyard.core.billing.ledger import accrue_totals
from gpuyard.core.fleet import HostStatus
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.fleet import RuntimeFactory
from gpuyard.services.billing.ledger_totals import totals
from gpuyard.services.billing.metering import accrued
from gpuyard.services.context import Context
from gpuyard.settings import Settings
from gpuyard.store.db import make_engine
from gpuyard.store.migrate import upgrade
from gpuyard.store.schema import Cluster, Host, HostGpu

# Ports for test servers (their own listeners, and the host ports their clusters
# publish) come in blocks below the kernel's ephemeral range (32768+ by default), where
# a client socket of any process could be holding a port, or a port 0 bind of another
# test process could land; each block is held by one test process (flock).
_PORT_BLOCK_FIRST, _PORT_BLOCK_LAST, PORT_BLOCK_SIZE = 20000, 32600, 100
_held_blocks: list[int] = []  # lock files kept open for the process's lifetime
_listen_ports: list[int] = []  # what is left of this process's block of listening ports
_listen_lock = threading.Lock()


def free_port() -> int:
    """A port for a test server to listen on (or a container to publish on): one of a
    block this process holds, so no other test process (the other test group) is given
    it, and below the ephemeral range, so no client socket holds it. Checked free by
    binding it."""
    with _listen_lock:
        while True:
            if not _listen_ports:
                start = port_block()
                _listen_ports.extend(range(start, start + PORT_BLOCK_SIZE))
            port = _listen_ports.pop(0)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue  # held by something outside the tests: the next one
            return port


def port_block() -> int:
    """The first port of a block of PORT_BLOCK_SIZE host ports no other test process
    on this machine holds: a lock file per block (flock, released when the process
    exits) keeps parallel test groups from publishing on the same ports."""
    lock_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "gpuyard-test-port-blocks"
    lock_dir.mkdir(exist_ok=True)
    starts = list(range(_PORT_BLOCK_FIRST, _PORT_BLOCK_LAST + 1, PORT_BLOCK_SIZE))
    random.shuffle(starts)
    for start in starts:
        fd = os.open(lock_dir / f"{start}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held_blocks.append(fd)
        return start
    raise RuntimeError("every test port block is held by another process")


def make_settings(home: Path, database_url: str | None = None, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "home": home,
        "database_url": database_url,
        "local_gpus": "NVIDIA RTX A6000:4,NVIDIA GeForce RTX 4090:4",
        "local_vcpus": 64,
        "local_memory_gb": 512,
        "local_disk_gb": 4000,
        "reconcile_interval_s": 0.2,
        "stop_timeout_s": 2,
        "port": free_port(),
        # The test machines' engine storage cannot enforce container disk sizes (ext4);
        # tests of the refusal set this to False.
        "allow_unenforced_disk": True,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


# A SQLite database migrated once per test process; tests get copies of it (copying a
# file takes well under a millisecond, running every migration 0.2-0.5 s).
_sqlite_template: list[Path] = []
_sqlite_template_lock = threading.Lock()

# What a fresh migration leaves in the installation table, set again on each copy: a
# copy of the template must not share its installation id (engine objects are labelled
# with it) with the template's other copies.
FRESH_INSTALLATION_ID = "UPDATE installation SET uuid = :uuid, created_at = CURRENT_TIMESTAMP"


def _migrated_sqlite_template() -> Path:
    """The process's migrated SQLite file (made on first use, removed at exit). Its
    write-ahead log is folded into the file, so the file alone is the database."""
    with _sqlite_template_lock:
        if not _sqlite_template:
            folder = Path(tempfile.mkdtemp(prefix="gy-tmpl-"))
            atexit.register(shutil.rmtree, folder, True)
            path = folder / "template.db"
            engine = make_engine(f"sqlite:///{path}")
            try:
                upgrade(engine)
            finally:
                engine.dispose()
            with sqlite3.connect(path) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
            _sqlite_template.append(path)
        return _sqlite_template[0]


def migrated_sqlite(path: Path) -> None:
    """Make ``path`` (which must not exist) a SQLite database at the latest migration,
    as a first migration leaves it, with its own installation id: a copy of a file
    migrated once per process. Opening it (open_store) finds the schema at head."""
    if path.exists():
        raise FileExistsError(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(_migrated_sqlite_template(), path)
    os.chmod(path, 0o600)
    with sqlite3.connect(path) as conn:
        conn.execute(FRESH_INSTALLATION_ID.replace(":uuid", "?"), (str(uuid.uuid4()),))
    conn.close()


def premigrate(settings: Settings) -> None:
    """Give a server about to start in a new home (its SQLite database in the home, not
    made yet) a migrated copy of the process's template database, so its start skips
    running the migrations. Anything else (a database URL, an existing file) is left
    for the start to migrate."""
    if settings.database_url is None:
        path = settings.home / "gpuyard.db"
        if not path.exists():
            migrated_sqlite(path)


class StatusRecorder:
    """ASGI wrapper that remembers every response status, so a test can assert that
    no request ever got a 5xx."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.statuses: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def record(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.statuses.append(message["status"])
            await send(message)

        await self.app(scope, receive, record)


@dataclass
class LiveServer:
    server: Server
    url: str
    key: str
    recorder: StatusRecorder

    def client(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key or self.key}"},
            timeout=60,
            verify=trusted_tls(),
        )

    def graphql(
        self, query: str, variables: dict[str, Any] | None = None, key: str | None = None
    ) -> dict[str, Any]:
        """POST ``query`` to /graphql (as ``key``, default the admin key); the body of
        its 200 answer (errors included)."""
        r = httpx.post(
            f"{self.url}/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {key or self.key}"},
            timeout=30,
            verify=trusted_tls(),
        )
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body


def v1_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The REST v1 envelope's error of ``status`` (and ``code``, when given): its
    ``error`` object."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is False, body
    if code is not None:
        assert body["error"]["code"] == code, body
    return dict(body["error"])


def account_with_members(
    srv: LiveServer, email: str, roles: tuple[str, ...]
) -> tuple[int, int, dict[str, str]]:
    """A new account owned by ``email``, with one member of each of ``roles`` (each a
    user of their own): its id, its default project's id and write keys by role
    (``owner`` too)."""
    from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
    from gpuyard.store.schema import Member

    keys: dict[str, str] = {}
    with srv.server.ctx.transaction() as s:
        user, account, project = create_account(s, email=email, name=email)
        keys["owner"] = issue_key(
            s, user_id=user.id, account_id=account.id, name="o", scope=Scope.WRITE
        ).key
        for role in roles:
            other, _, _ = create_account(s, email=f"{role}-{email}", name=role)
            s.add(Member(account_id=account.id, user_id=other.id, role=role))
            keys[role] = issue_key(
                s, user_id=other.id, account_id=account.id, name=role, scope=Scope.WRITE
            ).key
        s.flush()
        return account.id, project.id, keys


def refused(r: httpx.Response, field: str) -> dict[str, Any]:
    """The REST v1 envelope's 400 VALIDATION_ERROR naming ``field``: its ``error``."""
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["success"] is False and body["error"]["code"] == "VALIDATION_ERROR", body
    assert body["error"]["details"]["field"] == field, body
    return dict(body["error"])


def forget_app_callables() -> None:
    """Empty FastAPI's module-level caches of the callables it has classified (up to
    4,096 each, keyed by the callable): they hold every app's endpoint closures, and so
    each test's whole app (its context, database engine and pools), long after the
    test. Measured on 32 API test files: 1.56 GB RSS kept, 0.44 GB with this (and no
    gc.freeze), in the same time. Caches a later FastAPI renames are left alone."""
    for name in (
        "_is_gen_callable_cached",
        "_is_async_gen_callable_cached",
        "_is_coroutine_callable_cached",
    ):
        cached = getattr(fastapi.dependencies.models, name, None)
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


@contextmanager
def live_server(
    settings: Settings,
    runtime: Runtime,
    host_runtimes: RuntimeFactory | None = None,
    training_operator: TrainingOperatorFactory | None = None,
    allowed_5xx: frozenset[int] = frozenset(),
    run_reconciler: bool = True,
) -> Iterator[LiveServer]:
    """Run the real app under uvicorn on a free port in a background thread
    (``host_runtimes``: how hosts added through the API are reached;
    ``training_operator``: what builds training clusters, none without;
    ``run_reconciler``: False for a server with no background work, whose test makes
    the rows the background would). On exit, asserts it answered no 5xx but those in
    ``allowed_5xx``. A new home gets a migrated copy of a template database
    (``premigrate``)."""
    premigrate(settings)
    server = build_server(
        settings,
        runtime,
        host_runtimes=host_runtimes,
        training_operator=training_operator,
        run_reconciler=run_reconciler,
        freeze_gc=False,  # one process, many apps: each must be freed after its test
    )
    assert server.admin_key is not None
    recorder = StatusRecorder(server.app)
    config = uvicorn.Config(recorder, host="127.0.0.1", port=settings.port, log_level="warning")
    uv = PromptServer(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.005)
    try:
        yield LiveServer(
            server, f"http://127.0.0.1:{settings.port}", server.admin_key.key, recorder
        )
    finally:
        uv.request_exit()
        thread.join(timeout=15)
        forget_app_callables()
    errors = [s for s in recorder.statuses if s >= 500 and s not in allowed_5xx]
    assert not errors, f"server answered {errors}"


def add_host_row(
    ctx: Context,
    name: str,
    gpus: int = 4,
    *,
    location: str = "lab",
    status: str = HostStatus.ACTIVE.value,
    healthy: bool = True,
    disk_gb: int = 2000,
) -> int:
    """A host row (declared inventory, ``gpus`` A6000s) as if added through the API and
    answered; its id."""
    with ctx.transaction() as s:
        host = Host(
            name=name,
            location=location,
            cloud_type="SECURE",
            address=f"{name}.example",
            engine_url=f"ssh://root@{name}.example",
            vcpus=32,
            memory_gb=256,
            disk_gb=disk_gb,
            gpu_source="declared",
            declared=["vcpus", "memory_gb", "disk_gb"],
            healthy=healthy,
            status=status,
        )
        s.add(host)
        s.flush()
        for i in range(gpus):
            s.add(HostGpu(host_id=host.id, gpu_index=i, gpu_type="NVIDIA RTX A6000"))
        return host.id


def created(srv: LiveServer, c: httpx.Client, body: dict[str, Any]) -> str:
    """Create a cluster with ``body`` through ``c`` and let the reconciler settle (with
    the fake runtime it is then running); its id."""
    r = c.post("/v1/clusters", json=body)
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    assert srv.server.reconciler.wait_idle(10)
    return cid


def assert_totals_match_history(ctx: Context, cluster_id: str) -> None:
    """The ledger totals on the cluster row give the cost its whole interval history
    gives (services/billing/ledger_totals.py keeps them together)."""
    now = ctx.clock.now()
    with ctx.read() as session:
        row = session.get(Cluster, cluster_id)
        assert row is not None
        got = accrue_totals(totals(row), now, row.start_initiated_at, row.created_at)
        assert got == accrued(session, cluster_id, now)
