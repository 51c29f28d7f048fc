"""The SSH gateway as a process (``gpuyard ssh-gateway``) and its supervisor in
``gpuyard serve``.

The gateway process opens the same database as the server, reads the installation's
identity, listens on ``GPUYARD_SSH_BIND``:``GPUYARD_SSH_PORT`` and, beside the
logins, keeps the keys that open each running cluster with an sshd (port 22
published) in root's ``authorized_keys`` (edge/ssh_upstream.py), so that direct
``ssh root@HOST -p N`` takes them too — and stops taking a key within one pass
(:data:`KEY_SYNC_INTERVAL_S`) of its user losing write access. SIGTERM or SIGINT
stops it.

:class:`GatewaySupervisor` runs that process as a child of ``serve``: started after
the server's database is migrated, restarted with back-off when it dies, stopped
(SIGTERM, then SIGKILL) when ``serve`` stops. A gateway whose server died without
stopping it (SIGKILL, the OOM killer) notices within :data:`PARENT_CHECK_S` and stops
itself, freeing the port for the next server's gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpuyard.core.ownership import Ownership
from gpuyard.edge.auth_limiter import FailureLimiter
from gpuyard.edge.engines import EngineLocator
from gpuyard.edge.gateway_keys import host_key, upstream_key
from gpuyard.edge.ssh_directory import SshDirectory
from gpuyard.edge.ssh_gateway import Gateway, keys_digest
from gpuyard.runtimes.engines.url import detect_engine_url, terminate_process
from gpuyard.settings import Settings
from gpuyard.store.db import make_engine, make_sessionmaker
from gpuyard.store.schema import Installation

log = logging.getLogger("gpuyard.ssh_gateway")

KEY_SYNC_INTERVAL_S = 3.0
# Set by the supervisor in ``serve``: the pid of the server the gateway belongs to.
PARENT_ENV = "GPUYARD_GATEWAY_PARENT_PID"
PARENT_CHECK_S = 0.5
# A container whose keys could not be written is tried again after this long.
KEY_SYNC_RETRY_S = 30.0


def read_ownership(sessions: sessionmaker[Session]) -> Ownership:
    """The installation's identity as the server stored it (the server migrates and
    creates it before it starts the gateway)."""
    with sessions() as session:
        uuid = session.scalar(select(Installation.uuid).order_by(Installation.id).limit(1))
    if uuid is None:
        raise SystemExit("gpuyard ssh-gateway: the database has no installation id; run serve")
    return Ownership(uuid)


class KeySync:
    """Keeps the managed block of ``authorized_keys`` right in every running cluster
    that publishes port 22 (level-based: each pass compares what was last written)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self._failed_at: dict[str, float] = {}

    async def pass_once(self) -> int:
        """One pass; returns how many containers were written."""
        targets = await asyncio.to_thread(self.gw.directory.sshd_keys)
        written = self.gw.keys_written
        wrote = 0
        alive = set()
        for target, lines, drop in targets:
            alive.add(target.container)
            wanted = [*lines, self.gw.upstream_public_line]
            if written.get(target.container) == keys_digest(wanted):
                continue
            failed = self._failed_at.get(target.container)
            if failed is not None and time.monotonic() - failed < KEY_SYNC_RETRY_S:
                continue
            try:
                await self.gw.write_keys(target, wanted, drop)
            except Exception as exc:  # no shell, read-only root, engine down: later
                self._failed_at[target.container] = time.monotonic()
                log.debug("keys not written into %s: %s", target.cluster_id, exc)
                continue
            self._failed_at.pop(target.container, None)
            wrote += 1
        for gone in set(written) - alive:
            del written[gone]
        for gone in set(self.gw.bodies_written) - alive:
            del self.gw.bodies_written[gone]
        for gone in set(self._failed_at) - alive:
            del self._failed_at[gone]
        return wrote

    async def run_forever(self, interval_s: float = KEY_SYNC_INTERVAL_S) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception:
                log.exception("authorized_keys sync pass failed")
            await asyncio.sleep(interval_s)


def build_gateway(
    settings: Settings, sessions: sessionmaker[Session], engine_url: str | None
) -> Gateway:
    ownership = read_ownership(sessions)
    return Gateway(
        directory=SshDirectory(sessions, ownership),
        locator=EngineLocator(settings.home, engine_url, settings.remote_engine_timeout_s),
        limiter=FailureLimiter(settings.ssh_auth_failures_per_minute, 60.0),
        host_key=host_key(settings.home),
        upstream_key=upstream_key(settings.home),
        max_auth_tries=settings.ssh_max_auth_tries,
        login_timeout_s=settings.ssh_login_timeout_s,
    )


async def serve_gateway(settings: Settings, engine_url: str | None) -> None:
    """Run the gateway until SIGTERM/SIGINT."""
    db = make_engine(settings.effective_database_url)
    gateway = build_gateway(settings, make_sessionmaker(db), engine_url)
    bind = settings.ssh_bind or settings.host
    acceptor = await gateway.listen(bind, settings.ssh_port)
    log.info("ssh gateway listening on %s:%d", bind, acceptor.get_port())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sync = asyncio.create_task(KeySync(gateway).run_forever())
    orphan_watch = asyncio.create_task(_stop_when_orphaned(stop, os.environ.get(PARENT_ENV)))
    try:
        await stop.wait()
    finally:
        sync.cancel()
        orphan_watch.cancel()
        gateway.stop_watching()
        acceptor.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(acceptor.wait_closed(), 5)
        await gateway.settle()
        gateway.locator.close()
        db.dispose()
        log.info("ssh gateway stopped")


async def _stop_when_orphaned(stop: asyncio.Event, parent: str | None) -> None:
    """Stop the gateway once the server that started it is gone, however it went (a
    SIGKILL or the OOM killer gives it no chance to stop its children): a gateway left
    behind would hold the port the next server's gateway needs. The gateway runs in a
    session of its own, so it is re-parented, never signalled, when the server dies.
    ``parent``: the server's pid (None: a gateway started by hand, which watches
    nothing)."""
    if not parent or not parent.isdigit():
        return
    while os.getppid() == int(parent):
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("the server that started this gateway (pid %s) is gone: stopping", parent)
    stop.set()


def run_gateway(settings: Settings) -> None:
    """The ``gpuyard ssh-gateway`` command's body."""
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    engine_url = detect_engine_url(settings.engine_url)
    asyncio.run(serve_gateway(settings, engine_url))


class GatewaySupervisor:
    """``gpuyard ssh-gateway`` as a supervised child process of ``serve``."""

    def __init__(
        self,
        engine_url: str | None,
        *,
        argv: list[str] | None = None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        log_path: Path | None = None,
    ) -> None:
        self.engine_url = engine_url
        self.argv = argv or [sys.executable, "-m", "gpuyard", "ssh-gateway"]
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.log_path = log_path
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env[PARENT_ENV] = str(os.getpid())
        if self.engine_url:
            # The engine serve found or started (a Podman service of its own included).
            env["GPUYARD_ENGINE_URL"] = self.engine_url
        out = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            # Its own session: a Ctrl-C at the terminal reaches serve, which stops it.
            return subprocess.Popen(
                self.argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )  # fmt: skip
        finally:
            if out is not None:
                out.close()

    def start(self) -> None:
        """Start the child and the thread that restarts it. Idempotent."""
        with self._lock:
            if self._thread is not None:
                return
            self._proc = self._spawn()
            self._thread = threading.Thread(
                target=self._watch, name="ssh-gateway-supervisor", daemon=True
            )
            self._thread.start()

    def _watch(self) -> None:
        delay = self.backoff_initial_s
        while not self._stop.is_set():
            proc = self._proc
            if proc is None:
                return
            started = time.monotonic()
            code = proc.wait()
            if self._stop.is_set():
                return
            # A child that ran a while before dying starts over with a short delay.
            if time.monotonic() - started > 60:
                delay = self.backoff_initial_s
            log.warning("ssh gateway exited with %s; restarting in %.0f s", code, delay)
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self.backoff_max_s)
            with self._lock:
                if self._stop.is_set():
                    return
                self._proc = self._spawn()
                self.restarts += 1

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the child (SIGTERM, SIGKILL after ``timeout_s``) and the watcher."""
        self._stop.set()
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            terminate_process(proc, timeout_s)
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)


def start_ssh_gateway(settings: Settings, engine_url: str | None) -> GatewaySupervisor | None:
    """Start the gateway child unless it is turned off (``GPUYARD_SSH_ENABLED=false``
    or ``GPUYARD_SSH_PORT=0``)."""
    if settings.ssh_gateway_endpoint is None:
        log.info("ssh gateway off (GPUYARD_SSH_ENABLED / GPUYARD_SSH_PORT)")
        return None
    supervisor = GatewaySupervisor(engine_url)
    supervisor.start()
    return supervisor
