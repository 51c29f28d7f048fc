"""A highly available PostgreSQL on this machine: one etcd and two Patroni nodes (a
primary and a synchronous replica) on 127.0.0.1, Debian's ``patroni``, ``etcd-server``
and ``postgresql`` packages (shared/notes/ha-postgresql-on-one-machine.md).

Everything runs as ``postgres`` when the test runs as root (initdb refuses root), in a
folder of its own under /tmp, on ports from the test process's own block; the cluster's
name is unique, so two of them on one machine never meet. :meth:`PatroniCluster.crash`
kills the leader's Patroni and its postmaster with SIGKILL (a node crash: Patroni
promotes the replica); :meth:`PatroniCluster.close` stops and removes everything.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import free_port

SUPERUSER_PASSWORD = "ha-super"
DATABASE = "gpuyard"
# Failover follows the leader key's time to live (ttl): ten seconds keeps the test short.
CONFIG = """scope: {scope}
name: {name}
restapi: {{listen: "127.0.0.1:{api}", connect_address: "127.0.0.1:{api}"}}
etcd3: {{hosts: "127.0.0.1:{etcd}"}}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 5
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      parameters: {{wal_log_hints: "on", max_connections: 300}}
  initdb: [{{encoding: UTF8}}, {{auth: scram-sha-256}}]
  pg_hba:
    - host replication replicator 127.0.0.1/32 scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
postgresql:
  listen: "127.0.0.1:{port}"
  connect_address: "127.0.0.1:{port}"
  data_dir: {root}/{name}
  pgpass: {root}/pgpass-{name}
  bin_dir: {bin_dir}
  parameters: {{unix_socket_directories: "{root}"}}
  authentication:
    superuser: {{username: postgres, password: {password}}}
    replication: {{username: replicator, password: ha-repl}}
    rewind: {{username: rewinder, password: ha-rewind}}
"""


def postgres_bin_dir() -> Path | None:
    """The newest installed PostgreSQL's server programs (Debian layout), if any."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return found[-1].parent if found else None


def unavailable_reason() -> str | None:
    """Why a Patroni cluster cannot run here, or None when it can."""
    missing = [p for p in ("patroni", "etcd") if shutil.which(p) is None]
    if postgres_bin_dir() is None:
        missing.append("postgresql")
    if missing:
        return f"{', '.join(missing)} not installed (WITH_POSTGRES=1 bash scripts/setup-system.sh)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "no postgres user to run PostgreSQL as (initdb refuses root)"
    return None


@dataclass
class Node:
    name: str
    port: int
    api_port: int
    config: Path
    proc: subprocess.Popen[bytes] | None = None


class PatroniCluster:
    """etcd plus two Patroni nodes; :meth:`start` returns once there is a leader and a
    streaming synchronous standby."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gy-ha-"))
        self.scope = "gy-" + uuid.uuid4().hex[:8]
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.root.chmod(0o700)
        bin_dir = postgres_bin_dir()
        assert bin_dir is not None
        self.nodes: list[Node] = []
        for name in ("pg1", "pg2"):
            node = Node(name, free_port(), free_port(), self.root / f"{name}.yml")
            text = CONFIG.format(
                scope=self.scope,
                name=name,
                api=node.api_port,
                etcd=self.etcd_port,
                port=node.port,
                root=self.root,
                bin_dir=bin_dir,
                password=SUPERUSER_PASSWORD,
            )
            self._write(node.config, text)
            self.nodes.append(node)
        self.etcd: subprocess.Popen[bytes] | None = None

    # -- processes ---------------------------------------------------------------------
    def _write(self, path: Path, text: str) -> None:
        path.write_text(text)
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(path, user.pw_uid, user.pw_gid)

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        extra: dict[str, Any] = {}
        if self._as_postgres:
            extra = {"user": "postgres", "group": "postgres"}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        with (self.root / log_name).open("ab") as log:
            return subprocess.Popen(
                argv,
                cwd=self.root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **extra,
            )

    def start(self, timeout_s: float = 90) -> None:
        etcd_url, peer_url = (
            f"http://127.0.0.1:{self.etcd_port}",
            f"http://127.0.0.1:{self.etcd_peer_port}",
        )
        self.etcd = self._spawn(
            [
                "etcd",
                "--name=e1",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e1={peer_url}",
            ],
            "etcd.log",
        )
        self._until(lambda: self._etcd_healthy(), 30, "etcd to answer")
        for node in self.nodes:
            self.start_node(node)
        self._until(self._sync_pair, timeout_s, "a leader and a synchronous standby")
        self._create_database()

    def start_node(self, node: Node) -> None:
        node.proc = self._spawn(["patroni", str(node.config)], f"{node.name}.log")

    def _etcd_healthy(self) -> bool:
        try:
            return httpx.get(
                f"http://127.0.0.1:{self.etcd_port}/health", timeout=1, verify=trusted_tls()
            ).is_success
        except httpx.HTTPError:
            return False

    # -- state -------------------------------------------------------------------------
    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (GET /cluster on any node that answers)."""
        for node in self.nodes:
            try:
                r = httpx.get(
                    f"http://127.0.0.1:{node.api_port}/cluster", timeout=2, verify=trusted_tls()
                )
            except httpx.HTTPError:
                continue
            if r.is_success:
                members: list[dict[str, Any]] = r.json().get("members", [])
                return members
        return []

    def leader(self) -> Node | None:
        """The node Patroni names leader, once its PostgreSQL runs."""
        for m in self.members():
            if m.get("role") == "leader" and m.get("state") == "running":
                return next(n for n in self.nodes if n.name == m.get("name"))
        return None

    def _sync_pair(self) -> bool:
        roles = {(m.get("role"), m.get("state")) for m in self.members()}
        return ("leader", "running") in roles and any(
            r == "sync_standby" and s in ("running", "streaming") for r, s in roles
        )

    def _until(self, check: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.logs()}")
            for proc in [self.etcd, *(n.proc for n in self.nodes)]:
                if proc is not None and proc.poll() is not None:
                    raise AssertionError(f"a process of the cluster exited:\n{self.logs()}")
            time.sleep(0.3)

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.libpq_url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')

    # -- URLs --------------------------------------------------------------------------
    def libpq_url(self, database: str = DATABASE) -> str:
        """libpq's multi-host URL of the read-write node."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return (
            f"postgresql://postgres:{SUPERUSER_PASSWORD}@{hosts}/{database}"
            "?target_session_attrs=read-write&connect_timeout=5"
        )

    def url(self) -> str:
        """gpuyard's URL: the multi-host URL of the operator's guide."""
        return "postgresql+psycopg" + self.libpq_url().removeprefix("postgresql")

    # -- faults ------------------------------------------------------------------------
    def crash(self, node: Node) -> None:
        """A node crash: SIGKILL to its Patroni (so it cannot restart PostgreSQL in
        place), then to its postmaster (not a child of Patroni). The other node's
        Patroni promotes itself once the leader key expires (ttl)."""
        if node.proc is not None:
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(timeout=10)
        pid = self._postmaster_pid(node)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _postmaster_pid(self, node: Node) -> int | None:
        """The pid in the node's postmaster.pid while that process is still its
        postmaster (a stale file's pid may belong to another process by now)."""
        data_dir = str(self.root / node.name)
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if data_dir.encode() in argv:
                return pid
        return None

    # -- teardown ----------------------------------------------------------------------
    def logs(self, chars: int = 3000) -> str:
        parts = []
        for name in ("etcd.log", "pg1.log", "pg2.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Stop the replica's Patroni, then the leader's (each stops its PostgreSQL),
        then etcd; kill what is left of ours; remove the folder."""
        leader = self.leader()
        for node in sorted(self.nodes, key=lambda n: n is leader):
            proc = node.proc
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            proc = node.proc
            if proc is not None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            pid = self._postmaster_pid(node)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait()
        shutil.rmtree(self.root, ignore_errors=True)
