"""What the SSH gateway reads and writes in the store: a cluster's owner, status,
host and published SSH port; the public keys that open it now; login events.

A registered key opens a cluster only while the user who registered it may write to
the cluster's project (services/tenancy/cluster_access.py: membership, role, project rows, a
live API key), and only that project's clusters when the key was registered through
an API key restricted to one. Nothing is cached: every login, every check of an open
session and every pass of the ``authorized_keys`` sync reads the store afresh.

Every method is synchronous and quick (one or two indexed reads, or one insert); the
gateway calls them in a worker thread. A key matches when its wire-format blob equals
a stored key's blob: comments and options play no part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncssh
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpuyard.core.ownership import Ownership
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.tenancy.cluster_access import AccessIndex, Need
from gpuyard.store.db import WRITE_OPTIONS
from gpuyard.store.schema import Cluster, Host, Project, SshKey

# Cluster ids are 14 lowercase letters and digits (core/ids.py); anything else is
# refused without a database read.
CLUSTER_ID = re.compile(r"[a-z0-9]{14}")
EVENT_SSH_LOGIN = "ssh_login"


@dataclass(frozen=True)
class AccountKey:
    """One registered public key of an account: ``user_id`` registered it; it opens
    only ``project_id``'s clusters when that is set."""

    id: int
    name: str
    fingerprint: str
    blob: bytes
    user_id: int | None = None
    project_id: int | None = None


@dataclass(frozen=True)
class ClusterTarget:
    """Where a login for ``cluster_id`` goes. ``ssh_port``: the host port that
    publishes the container's 22/tcp (None: not published, so the exec path)."""

    cluster_id: str
    account_id: int
    status: str
    container: str
    host_id: int | None
    host_is_local: bool
    host_address: str | None
    engine_url: str | None
    engine_tls_dir: str | None
    ssh_port: int | None
    project_id: int = 0


def key_blob(public_key: str) -> bytes | None:
    """The wire-format blob of an OpenSSH public key line, as asyncssh reads it (the
    key the client's offer is compared with); None when it is not one."""
    try:
        return asyncssh.import_public_key(public_key).public_data
    # asyncssh raises KeyImportError, and ValueError or OverflowError from the
    # cryptography checks of numbers and points.
    except (asyncssh.KeyImportError, ValueError, OverflowError):
        return None


def match_key(blob: bytes, keys: Iterable[AccountKey]) -> AccountKey | None:
    """The registered key whose blob is ``blob`` (the first, when stored twice)."""
    for key in keys:
        if key.blob == blob:
            return key
    return None


def published_ssh_port(ports: Sequence[object]) -> int | None:
    """The host port a cluster's ``ports`` publish its 22/tcp on (None: not published)."""
    for p in ports:
        if not isinstance(p, dict):
            continue
        if p.get("internal_port") == 22 and p.get("protocol") != "udp" and p.get("host_port"):
            return int(p["host_port"])
    return None


class SshDirectory:
    """Reads and writes of the gateway, on one store."""

    def __init__(self, sessions: sessionmaker[Session], ownership: Ownership) -> None:
        self.sessions = sessions
        self.ownership = ownership

    def target(self, cluster_id: str) -> ClusterTarget | None:
        """The cluster named ``cluster_id`` (any status), or None when there is none."""
        if not CLUSTER_ID.fullmatch(cluster_id):
            return None
        with self.sessions() as session:
            row = session.execute(
                select(Cluster, Project.account_id)
                .join(Project, Project.id == Cluster.project_id)
                .where(Cluster.id == cluster_id)
            ).first()
            if row is None:
                return None
            cluster, account_id = row
            host = session.get(Host, cluster.host_id) if cluster.host_id is not None else None
            return self._target(cluster, int(account_id), host)

    def running_with_sshd(self) -> list[tuple[ClusterTarget, list[str]]]:
        """Every running cluster that publishes 22/tcp, with the keys that open it now
        (module docstring) as ``authorized_keys`` lines."""
        return [(target, lines) for target, lines, _ in self.sshd_keys()]

    def sshd_keys(self) -> list[tuple[ClusterTarget, list[str], set[str]]]:
        """:meth:`running_with_sshd`, each with the base64 bodies of the account's
        registered keys that do NOT open that cluster now: lines holding them are
        deleted wherever they stand in its ``authorized_keys``."""
        with self.sessions() as session:
            rows = session.execute(
                select(Cluster, Project.account_id, Host)
                .join(Project, Project.id == Cluster.project_id)
                .join(Host, Host.id == Cluster.host_id)
                .where(Cluster.status == "running")
            ).all()
            wanted = [
                (c, int(a), h) for c, a, h in rows if published_ssh_port(c.ports or []) is not None
            ]
            accounts = {a for _, a, _ in wanted}
            keys: dict[int, list[SshKey]] = {a: [] for a in accounts}
            if accounts:
                for row in session.scalars(
                    select(SshKey).where(SshKey.account_id.in_(accounts)).order_by(SshKey.id)
                ):
                    keys[row.account_id].append(row)
            access = AccessIndex.load(
                session, [k.user_id for ks in keys.values() for k in ks if k.user_id is not None]
            )
            out = []
            for cluster, account_id, host in wanted:
                lines, drop = [], set()
                for k in keys[account_id]:
                    if access.user_may(
                        k.user_id,
                        account_id,
                        cluster.project_id,
                        Need.WRITE,
                        within_project=k.project_id,
                    ):
                        lines.append(k.public_key)
                    elif (parts := k.public_key.split())[1:]:
                        drop.add(parts[1])
                out.append((self._target(cluster, account_id, host), lines, drop))
            return out

    def _target(self, cluster: Cluster, account_id: int, host: Host | None) -> ClusterTarget:
        container = (cluster.runtime_handle or {}).get("container_id")
        return ClusterTarget(
            cluster_id=cluster.id,
            account_id=account_id,
            status=cluster.status,
            container=str(container) if container else self.ownership.container(cluster.id),
            host_id=cluster.host_id,
            host_is_local=bool(host.is_local) if host else False,
            host_address=host.address if host else None,
            engine_url=host.engine_url if host else None,
            engine_tls_dir=host.engine_tls_dir if host else None,
            ssh_port=published_ssh_port(cluster.ports or []),
            project_id=cluster.project_id,
        )

    def _opening(self, session: Session, target: ClusterTarget) -> list[SshKey]:
        rows = list(
            session.scalars(
                select(SshKey).where(SshKey.account_id == target.account_id).order_by(SshKey.id)
            )
        )
        access = AccessIndex.load(session, [r.user_id for r in rows if r.user_id is not None])
        return [
            r
            for r in rows
            if access.user_may(
                r.user_id,
                target.account_id,
                target.project_id,
                Need.WRITE,
                within_project=r.project_id,
            )
        ]

    def login_keys(self, target: ClusterTarget) -> list[AccountKey]:
        """The keys that open ``target`` now (module docstring), oldest first."""
        with self.sessions() as session:
            rows = self._opening(session, target)
        out = []
        for row in rows:
            blob = key_blob(row.public_key)
            if blob is not None:
                out.append(
                    AccountKey(row.id, row.name, row.fingerprint, blob, row.user_id, row.project_id)
                )
        return out

    def login_key_lines(self, target: ClusterTarget) -> list[str]:
        """:meth:`login_keys` as ``authorized_keys`` lines."""
        with self.sessions() as session:
            return [r.public_key for r in self._opening(session, target)]

    def still_open(self, logins: Sequence[tuple[str, int]]) -> list[bool]:
        """For each ``(cluster_id, ssh_key_id)`` of a logged-in connection: whether
        that key still opens that cluster (the key is still registered, the cluster
        still exists in the key's account, and the key's user may still write to its
        project). One pass over the store for all of them."""
        if not logins:
            return []
        with self.sessions() as session:
            keys = {
                k.id: k
                for k in session.scalars(
                    select(SshKey).where(SshKey.id.in_({key_id for _, key_id in logins}))
                )
            }
            clusters = {
                cid: (int(pid), int(aid))
                for cid, pid, aid in session.execute(
                    select(Cluster.id, Cluster.project_id, Project.account_id)
                    .join(Project, Project.id == Cluster.project_id)
                    .where(Cluster.id.in_({cid for cid, _ in logins}))
                )
            }
            access = AccessIndex.load(
                session, [k.user_id for k in keys.values() if k.user_id is not None]
            )
        out = []
        for cluster_id, key_id in logins:
            key, where = keys.get(key_id), clusters.get(cluster_id)
            out.append(
                key is not None
                and where is not None
                and key.account_id == where[1]
                and access.user_may(
                    key.user_id, where[1], where[0], Need.WRITE, within_project=key.project_id
                )
            )
        return out

    def record_login(
        self, cluster_id: str, key: AccountKey, source: str, path: str, now: datetime
    ) -> None:
        """Append an ``ssh_login`` event to the cluster: which key (by name and
        fingerprint, never the key), from where, by which path (exec or sshd)."""
        message = f"SSH login with key {key.name!r} ({key.fingerprint}) from {source} via {path}"
        with self.sessions() as session, session.begin():
            session.connection(execution_options=WRITE_OPTIONS)
            record_event(session, cluster_id, now, EVENT_SSH_LOGIN, message)
