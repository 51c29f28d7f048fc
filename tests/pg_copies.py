"""Copies of a migrated PostgreSQL template database, made one ahead of the tests.

``CREATE DATABASE ... TEMPLATE`` took 75-230 ms here (40-185 ms of the server's CPU)
with PostgreSQL 15's default strategy, which writes the whole copy to the WAL; with
``STRATEGY FILE_COPY`` (a checkpoint and a copy of the files, cheap on the tests'
server, which runs without fsync) 50 ms (25 ms of CPU). Hundreds of tests each take a
fresh copy, so :class:`PgCopies` copies files, and makes the next copy in a thread
while the current test runs: a test waits only when it asks before the copy is done.
Each copy is made exactly as a test's own copy would be (the template, then
``prepare`` on it), and is used by one test only. Only the thread connects to the
template, one copy at a time, as ``TEMPLATE`` requires (no other connection to it).
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable

from sqlalchemy import Engine, create_engine, text

# How many copies wait ready at most: one is enough to hide a copy behind a test that
# runs longer than it; more would only hold databases the run may never use.
_AHEAD = 1


class PgCopies:
    """Fresh copies of ``template`` on the server ``admin_url`` names, one ahead."""

    def __init__(
        self, admin_url: str, template: str, prepare: Callable[[str], None] | None = None
    ) -> None:
        self._admin: Engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self._base = admin_url.rsplit("/", 1)[0]
        self._template = template
        with self._admin.connect() as conn:
            version = int(conn.execute(text("SHOW server_version_num")).scalar_one())
        self._strategy = " STRATEGY FILE_COPY" if version >= 150000 else ""  # (15's option)
        self._prepare = prepare
        self._ready: queue.Queue[str | BaseException] = queue.Queue(maxsize=_AHEAD)
        self._closing = threading.Event()
        self._failure: BaseException | None = None
        self.made: list[str] = []  # every copy's name, taken or not
        self._thread = threading.Thread(target=self._fill, name="pg-copies", daemon=True)
        self._thread.start()

    def url(self, name: str) -> str:
        return f"{self._base}/{name}"

    def take(self) -> str:
        """The URL of a fresh copy, the caller's alone (drop it with :meth:`drop`). A
        copy that failed raises its error here."""
        if self._failure is not None:
            raise self._failure
        got = self._ready.get()
        if isinstance(got, BaseException):
            self._failure = got
            raise got
        return self.url(got)

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with self._admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        """Stop making copies and drop those nobody took."""
        self._closing.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=0.05)
        self._drain()
        self._admin.dispose()

    def _drain(self) -> None:
        while True:
            try:
                got = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(got, str):
                self.drop(self.url(got))

    def _fill(self) -> None:
        while not self._closing.is_set():
            name = "gy_" + uuid.uuid4().hex[:12]
            self.made.append(name)
            try:
                with self._admin.connect() as conn:
                    conn.execute(
                        text(
                            f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"{self._strategy}'
                        )
                    )
                if self._prepare is not None:
                    self._prepare(self.url(name))
            except BaseException as exc:  # handed to the test that asks next
                self._ready.put(exc)
                return
            self._ready.put(name)
