"""The SSH gateway: ``ssh CLUSTER_ID@HOST -p 2222`` reaches any running cluster.

The user name is the cluster id; a public key registered (``/v1/ssh-keys``) by a user
who may write to the cluster's project now logs in (edge/ssh_directory.py), every
other key is refused, and nothing else (passwords, keyboard-interactive, host-based)
is offered. An open connection whose key stops opening its cluster (the user removed
from the account, demoted, moved off the project, their last API key revoked, the
key deleted) is disconnected at the next check, every ``session_check_s``. Then:

- the cluster publishes 22/tcp (an sshd runs): sessions, subsystems (sftp) and
  direct TCP/IP forwards go to that sshd over the gateway's own SSH connection
  (edge/ssh_upstream.py): full SSH, scp, sftp, ``-L``, VS Code Remote;
- otherwise each session is a process started through the engine's exec API
  (edge/ssh_exec.py): a shell on a pty, or the command given.

Refusals: an unknown cluster and a key that is not the owner's look the same (a
banner naming the key's fingerprint; nothing says whether the cluster exists). The
owner's key on a cluster that is not running gets a banner saying its status. A
source address that has spent its allowance of failed logins is refused whatever it
offers (edge/auth_limiter.py). Every login is an ``ssh_login`` event on the
cluster naming the key (name, fingerprint) and the source; keys never reach logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncssh

from gpuyard.core.errors import GpuyardError, RuntimeFailure
from gpuyard.edge.auth_limiter import FailureLimiter
from gpuyard.edge.engines import EngineLocator
from gpuyard.edge.exec_pty import ContainerNotRunning, ExecError
from gpuyard.edge.gateway_keys import public_line
from gpuyard.edge.ssh_directory import CLUSTER_ID, AccountKey, ClusterTarget, SshDirectory
from gpuyard.edge.ssh_exec import ExecBackend
from gpuyard.edge.ssh_upstream import (
    MAX_PKTSIZE,
    WINDOW,
    UpstreamBackend,
    connect_upstream,
    install_authorized_keys,
    key_body,
)

log = logging.getLogger("gpuyard.ssh_gateway")

RUNNING = "running"
# Environment a client may send (SendEnv) that reaches the process: locale only.
_PASSED_ENV_PREFIXES = ("LC_",)
_PASSED_ENV = frozenset({"LANG", "LANGUAGE"})
# An sftp server inside an image that has one but runs no sshd (exec path).
SFTP_SERVER = (
    "for p in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server "
    "/usr/lib/ssh/sftp-server /usr/libexec/sftp-server /usr/lib/sftp-server; do "
    '[ -x "$p" ] && exec "$p"; done; '
    "echo 'gpuyard: this image has no sftp-server; use ssh or scp -O' >&2; exit 127"
)
# The client picks the first of its own list that the server offers, and OpenSSH's
# list starts with chacha20-poly1305: in Python that costs about twice AES-CTR with
# umac and four times AES-GCM per byte, so it is not offered. Every client speaks
# AES-CTR (paramiko included); OpenSSH takes aes128-ctr with umac-64-etm.
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)
_STATUS_HINTS = {
    "stopped": "start it first",
    "stopping": "it is stopping",
    "pending": "it is not started yet; try again in a moment",
    "starting": "it is starting; try again in a moment",
    "terminating": "it is being terminated",
    "terminated": "it was terminated",
    "error": "it failed; see its events",
}


def keys_digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Gateway:
    """Everything the connections share. One per process."""

    directory: SshDirectory
    locator: EngineLocator
    limiter: FailureLimiter
    host_key: asyncssh.SSHKey
    upstream_key: asyncssh.SSHKey
    max_auth_tries: int = 6
    login_timeout_s: float = 30.0
    # How often open connections are checked against the store (their key must
    # still open their cluster).
    session_check_s: float = 2.0
    clock: Callable[[], datetime] = _now
    # Container -> digest of the authorized_keys lines this process last wrote there.
    keys_written: dict[str, str] = field(default_factory=dict)
    # Container -> the key bodies this process wrote into its managed block: gpuyard's
    # keys, dropped everywhere in the file once they no longer open it.
    bodies_written: dict[str, set[str]] = field(default_factory=dict)
    # Logged-in connections, for the session check.
    connections: set[GatewayConnection] = field(default_factory=set)
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    _watcher: asyncio.Task[None] | None = None

    @property
    def upstream_public_line(self) -> str:
        return public_line(self.upstream_key)

    def spawn(self, coro: object) -> None:
        """Run ``coro`` in the background, keeping a reference until it is done."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def write_keys(
        self, target: ClusterTarget, lines: list[str], drop: Iterable[str] = ()
    ) -> None:
        """Make the managed block of root's authorized_keys in ``target``'s container
        hold ``lines`` (edge/ssh_upstream.py), and remember that it does. Lines
        holding a key body of ``drop``, or of a key this process wrote there before
        that ``lines`` no longer hold (a key deleted since), are deleted anywhere in
        the file."""
        url, ssl_context = await self.locator.engine_of(target)
        known = self.bodies_written.setdefault(target.container, set())
        await install_authorized_keys(
            url, ssl_context, target.container, lines, drop={*drop, *known}
        )
        self.keys_written[target.container] = keys_digest(lines)
        known.update(b for b in map(key_body, lines) if b is not None)

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Wait (up to ``timeout_s``) for the background work started so far, such as
        login events still being written."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout_s)

    async def check_sessions(self) -> int:
        """Disconnect every logged-in connection whose key no longer opens its
        cluster; returns how many were disconnected."""
        live: list[GatewayConnection] = []
        logins: list[tuple[str, int]] = []
        for conn in list(self.connections):
            if conn.target is not None and conn.key is not None:
                live.append(conn)
                logins.append((conn.target.cluster_id, conn.key.id))
        if not live:
            return 0
        verdicts = await asyncio.to_thread(self.directory.still_open, logins)
        ended = 0
        for conn, still in zip(live, verdicts, strict=True):
            if not still:
                ended += 1
                conn.revoke()
        return ended

    async def watch_sessions(self) -> None:
        """:meth:`check_sessions` every ``session_check_s``, until cancelled."""
        while True:
            await asyncio.sleep(self.session_check_s)
            try:
                await self.check_sessions()
            except Exception:  # the store is down: the next check tries again
                log.exception("checking open SSH sessions failed")

    def stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def listen(self, host: str, port: int) -> asyncssh.SSHAcceptor:
        """Accept connections on ``host:port`` (port 0: any free port; the acceptor's
        ``get_port()`` tells which), and start checking open sessions."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self.watch_sessions())
        return await asyncssh.create_server(
            lambda: GatewayConnection(self),
            host,
            port,
            server_host_keys=[self.host_key],
            encoding=None,
            line_editor=False,
            login_timeout=self.login_timeout_s,
            # Dead clients (a closed laptop behind NAT) are noticed within minutes, so
            # their sessions and upstream connections do not linger for hours.
            keepalive_interval=30,
            keepalive_count_max=4,
            x11_forwarding=False,
            agent_forwarding=False,
            allow_scp=False,
            window=WINDOW,
            max_pktsize=MAX_PKTSIZE,
            encryption_algs=list(CIPHERS),
            compression_algs=["none"],
            config=None,
        )

    async def engine_of(self, target: ClusterTarget) -> tuple[str, object]:
        return await self.locator.engine_of(target)


class GatewayConnection(asyncssh.SSHServer):
    """One user's connection: authentication, then its sessions and forwards."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.conn: asyncssh.SSHServerConnection | None = None
        self.source = "unknown"
        self.source_port = 0
        self.username = ""
        self.target: ClusterTarget | None = None
        self.keys: list[AccountKey] | None = None
        self.key: AccountKey | None = None
        self.authenticated = False
        self.known = False  # the owner's key was shown (not a failure)
        self.refused = 0  # keys refused on this connection
        self.looked_up: str | None = None
        self.blocked = False
        self.bannered = False
        self._upstream: asyncssh.SSHClientConnection | None = None
        self._upstream_lock = asyncio.Lock()
        self.upstream_failed = False

    # -- connection and authentication ---------------------------------------------

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("unknown", 0)
        self.source, self.source_port = str(peer[0]), int(peer[1])

    def connection_lost(self, exc: Exception | None) -> None:
        self.gw.connections.discard(self)
        if not self.authenticated and not self.known:
            self.gw.limiter.failed(self.source)
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            upstream.close()

    def _banner(self, text: str) -> None:
        if self.conn is not None and not self.bannered:
            self.bannered = True
            with contextlib.suppress(Exception):
                self.conn.send_auth_banner(f"gpuyard: {text}\r\n")

    def begin_auth(self, username: str) -> bool:
        self.username = username
        wait = self.gw.limiter.blocked_for(self.source)
        if wait > 0:
            self.blocked = True
            self._banner(
                f"too many failed logins from {self.source}; try again in {int(wait) + 1} s"
            )
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        if self.blocked:
            return False
        if self.refused >= self.gw.max_auth_tries:
            if self.conn is not None:
                self.conn.disconnect(
                    asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE,
                    "too many authentication failures",
                )
            return False
        if self.keys is None or username != self.looked_up:
            # A client may change user names between tries: look up the one asked for.
            # asyncssh cancels a check in flight when the next request comes, so the
            # user name, its cluster and its keys change together, after both reads:
            # a cancelled lookup leaves none of them half-updated (else one account's
            # keys could stand beside another account's cluster).
            self.key = None
            target = await asyncio.to_thread(self.gw.directory.target, username)
            keys = (
                await asyncio.to_thread(self.gw.directory.login_keys, target)
                if target is not None
                else []
            )
            self.looked_up, self.target, self.keys = username, target, keys
        found = next((k for k in self.keys if k.blob == key.public_data), None)
        fingerprint = key.get_fingerprint("sha256")
        if found is None or self.target is None:
            shown = f"cluster {username!r}" if CLUSTER_ID.fullmatch(username) else "that user"
            self._banner(
                f"key {fingerprint} may not log in to {shown}: there is no such cluster, "
                "or the key is not registered to the account that owns it by a user who "
                "may write to it (add it with POST /v1/ssh-keys or `gpuyard ssh-keys add`)"
            )
            log.info("ssh refused %s for %r from %s", fingerprint, username[:40], self.source)
            self.refused += 1
            return False
        self.known = True
        if self.target.status != RUNNING:
            hint = _STATUS_HINTS.get(self.target.status, "it is not running")
            self._banner(f"cluster {self.target.cluster_id} is {self.target.status}: {hint}")
            return False
        self.key = found
        return True

    def auth_completed(self) -> None:
        target, key = self.target, self.key
        user = self.conn.get_extra_info("username") if self.conn is not None else None
        if target is None or key is None or target.cluster_id != user:
            # Never a session for a cluster other than the one the client logged in as.
            log.warning("ssh login state does not match user %r; closing", str(user)[:40])
            if self.conn is not None:
                self.conn.disconnect(asyncssh.DISC_BY_APPLICATION, "login state mismatch")
            return
        self.authenticated = True
        self.gw.connections.add(self)
        source = f"{self.source}:{self.source_port}"
        path = "sshd" if target.ssh_port else "exec"
        log.info(
            "ssh login to %s with key %r (%s) from %s via %s",
            target.cluster_id, key.name, key.fingerprint, source, path,
        )  # fmt: skip
        self.gw.spawn(self._record_login(target, key, source, path))

    def revoke(self) -> None:
        """The key no longer opens the cluster: end the connection, its sessions and
        its upstream connection (connection_lost follows)."""
        self.gw.connections.discard(self)
        target = self.target.cluster_id if self.target else "?"
        log.info("ssh access to %s ended for key %r", target, self.key.name if self.key else "?")
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.disconnect(
                    asyncssh.DISC_BY_APPLICATION,
                    f"gpuyard: access to cluster {target} ended (the key's user may no longer "
                    "write to it, or the key was deleted)",
                )

    async def _record_login(
        self, target: ClusterTarget, key: AccountKey, source: str, path: str
    ) -> None:
        try:
            await asyncio.to_thread(
                self.gw.directory.record_login,
                target.cluster_id, key, source, path, self.gw.clock(),
            )  # fmt: skip
        except Exception:  # the login stands; the event is best effort
            log.exception("could not record the SSH login event of %s", target.cluster_id)

    # -- sessions and forwards -----------------------------------------------------

    def session_requested(self) -> GatewaySession | bool:
        if not self.authenticated:
            return False
        return GatewaySession(self)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Awaitable[asyncssh.SSHTCPSession[bytes]]:
        target = self.target
        if not self.authenticated:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "not logged in"
            )
        if target is None or not target.ssh_port or self.upstream_failed:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                "port forwarding needs an sshd in the cluster (publish port 22)",
            )
        return self._forward(dest_host, dest_port)

    async def _forward(self, dest_host: str, dest_port: int) -> asyncssh.SSHTCPSession[bytes]:
        try:
            upstream = await self.upstream()
        except (OSError, asyncssh.Error, GpuyardError, ExecError) as exc:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED, f"the cluster's sshd cannot be reached: {exc}"
            ) from exc
        assert self.conn is not None
        forwarder: asyncssh.SSHTCPSession[bytes] = await self.conn.forward_tunneled_connection(  # type: ignore[assignment]
            upstream, dest_host, dest_port
        )
        return forwarder

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # remote forwarding (-R) is not offered

    async def upstream(self) -> asyncssh.SSHClientConnection:
        """The gateway's connection to the cluster's sshd, made on first use: the
        keys are written into the container (unless this process already wrote the
        same ones there), then the gateway logs in."""
        async with self._upstream_lock:
            if self._upstream is not None and self._upstream.is_closed():
                self._upstream = None  # the sshd restarted: a new connection
            if self._upstream is None:
                target = self.target
                assert target is not None and target.ssh_port
                # The gateway's key opens every sshd it wrote it into: connect only
                # while the port is still this cluster's, running the container seen
                # at login (a terminated cluster's port may be another's by now).
                now = await asyncio.to_thread(self.gw.directory.target, target.cluster_id)
                if (
                    now is None
                    or now.status != RUNNING
                    or (now.container, now.ssh_port, now.account_id)
                    != (target.container, target.ssh_port, target.account_id)
                ):
                    raise RuntimeFailure(
                        f"cluster {target.cluster_id} changed since this login "
                        f"({now.status if now else 'gone'}); log in again"
                    )
                lines = await asyncio.to_thread(self.gw.directory.login_key_lines, target)
                wanted = [*lines, self.gw.upstream_public_line]
                host = "127.0.0.1" if target.host_is_local else (target.host_address or "")
                if self.gw.keys_written.get(target.container) == keys_digest(wanted):
                    with contextlib.suppress(asyncssh.PermissionDenied):
                        self._upstream = await connect_upstream(
                            host, target.ssh_port, self.gw.upstream_key
                        )
                        return self._upstream
                await self.gw.write_keys(target, wanted)
                self._upstream = await connect_upstream(host, target.ssh_port, self.gw.upstream_key)
            return self._upstream


def _client_env(chan: asyncssh.SSHServerChannel[bytes]) -> dict[str, str]:
    env = {}
    for k, v in chan.get_environment().items():
        if k in _PASSED_ENV or k.startswith(_PASSED_ENV_PREFIXES):
            env[k] = v
    return env


class GatewaySession(asyncssh.SSHServerSession[bytes]):
    """One session channel of a user: a shell, a command or a subsystem, handed to
    the sshd path or the exec path once the session starts."""

    def __init__(self, conn: GatewayConnection) -> None:
        self.conn = conn
        self.chan: asyncssh.SSHServerChannel[bytes] | None = None
        self.term_type: str | None = None
        self.term_size: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.term_modes: dict[int, int] = {}
        self.command: str | None = None
        self.subsystem: str | None = None
        self.backend: UpstreamBackend | ExecBackend | None = None
        self._pending: list[tuple[bytes, asyncssh.DataType]] = []
        self._pending_eof = False
        self._size_changed = False
        self._closed = False

    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self.chan = chan

    def pty_requested(
        self, term_type: str, term_size: tuple[int, int, int, int], term_modes: Mapping[int, int]
    ) -> bool:
        self.term_type = term_type or "xterm"
        self.term_size = term_size
        self.term_modes = dict(term_modes)
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        self.command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem != "sftp":
            return False
        self.subsystem = subsystem
        return True

    def session_started(self) -> None:
        assert self.chan is not None
        self.chan.pause_reading()
        self.conn.gw.spawn(self._open())

    async def _open(self) -> None:
        chan = self.chan
        assert chan is not None
        try:
            backend = await self._start_backend(chan)
        except (OSError, asyncssh.Error, GpuyardError, ExecError) as exc:
            if isinstance(exc, ContainerNotRunning):
                text = "the cluster's container is not running"
            else:
                text = getattr(exc, "message", None) or getattr(exc, "reason", None) or str(exc)
            log.info("ssh session to %s failed: %s", self._cluster_id, text)
            with contextlib.suppress(asyncssh.Error, BrokenPipeError, OSError):
                chan.write_stderr(f"gpuyard: {text}\r\n".encode())
                chan.exit(1)
            return
        if self._closed:
            backend.close()
            return
        self.backend = backend
        for data, datatype in self._pending:
            backend.write(data, datatype)
        self._pending.clear()
        if self._pending_eof:
            backend.eof()
        if self._size_changed:
            backend.resize(*self.term_size)
        chan.resume_reading()

    @property
    def _cluster_id(self) -> str:
        return self.conn.target.cluster_id if self.conn.target else "?"

    async def _start_backend(
        self, chan: asyncssh.SSHServerChannel[bytes]
    ) -> UpstreamBackend | ExecBackend:
        target = self.conn.target
        assert target is not None
        env = _client_env(chan)
        if target.ssh_port and not self.conn.upstream_failed:
            try:
                upstream = await self.conn.upstream()
            except (OSError, asyncssh.Error, ExecError) as exc:
                # The port is published but nothing answers as an sshd there yet (or
                # the image's sshd refuses our key): the exec path still works.
                log.info("sshd of %s unusable, using exec: %s", target.cluster_id, exc)
                self.conn.upstream_failed = True
            else:
                up = UpstreamBackend(chan)
                await up.start(
                    upstream,
                    command=self.command,
                    subsystem=self.subsystem,
                    env=env,
                    term_type=self.term_type,
                    term_size=self.term_size,
                    term_modes=self.term_modes,
                )
                return up
        url, ssl_context = await self.conn.gw.locator.engine_of(target)
        backend = ExecBackend(chan)
        command = SFTP_SERVER if self.subsystem == "sftp" else self.command
        await backend.start(
            url,
            ssl_context,
            target.container,
            command=command,
            env=env,
            term_type=None if self.subsystem else self.term_type,
            term_size=self.term_size,
        )
        return backend

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self.backend is not None:
            self.backend.write(data, datatype)
        else:
            self._pending.append((data, datatype))

    def eof_received(self) -> bool:
        if self.backend is not None:
            self.backend.eof()
        else:
            self._pending_eof = True
        return True  # half-close: output may still come

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        self.term_size = (width, height, pixwidth, pixheight)
        if self.backend is not None:
            self.backend.resize(width, height, pixwidth, pixheight)
        else:
            self._size_changed = True

    def signal_received(self, signal: str) -> None:
        if self.backend is not None:
            self.backend.signal(signal)

    def break_received(self, msec: int) -> bool:
        return False

    def pause_writing(self) -> None:
        if self.backend is not None:
            self.backend.pause_output()

    def resume_writing(self) -> None:
        if self.backend is not None:
            self.backend.resume_output()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self.backend is not None:
            self.backend.close()
