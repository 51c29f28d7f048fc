"""The gateway's sshd path: a cluster that publishes port 22 runs an sshd, and every
session, subsystem (sftp) and direct TCP/IP forward of a user's connection goes to it
over one SSH connection of the gateway's own.

Before connecting, the gateway writes a managed block into the container's
``/root/.ssh/authorized_keys`` through the engine's exec API: the account's keys (so
direct ``ssh root@HOST -p N`` works with them too) and the gateway's client key (so
the gateway can log in). Lines outside the block are the user's and are kept, except
a line holding a key gpuyard registered that no longer opens the cluster (an image
appends ``$PUBLIC_KEY``, the keys of the cluster's creation, outside the block).

Channels are bridged callback to callback: data, EOF, exit status or signal, window
changes and signals pass straight through, and each side's flow control pauses the
other side's reading, so a slow reader never makes the gateway buffer a whole
transfer in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Iterable, Mapping, Sequence

import asyncssh

from gpuyard.edge.exec_pty import ExecError, ExecSession

BEGIN = "# gpuyard-managed keys begin"
END = "# gpuyard-managed keys end"
# Replaces the managed block and keeps every other line, except the lines that hold one
# of the key bodies to drop (anywhere in the file: an image's start script appends
# ``$PUBLIC_KEY`` outside the block). Stdin is data, never code: one ``-BODY`` line per
# body to drop (base64 only, checked by :func:`sync_input`), then the block. POSIX sh,
# awk and sed (busybox has them; without awk only the block is replaced); the file is
# 0600 in a 0700 directory, as sshd's StrictModes wants.
AUTHORIZED_KEYS_SCRIPT = f"""set -e
umask 077
mkdir -p /root/.ssh
chmod 700 /root/.ssh
f=/root/.ssh/authorized_keys
touch "$f"
t="$f.gpuyard.$$"
i="$f.gpuyard-in.$$"
trap 'rm -f "$i"' EXIT
cat > "$i"
if command -v awk >/dev/null 2>&1; then
awk 'FNR == NR {{ if (substr($0, 1, 1) == "-") drop[substr($0, 2)] = 1; next }}
$0 == "{BEGIN}" {{ skip = 1 }}
!skip {{ keep = 1; for (j = 1; j <= NF; j++) if ($j in drop) keep = 0; if (keep) print }}
$0 == "{END}" {{ skip = 0 }}' "$i" "$f" > "$t"
else
sed '/^{BEGIN}$/,/^{END}$/d' "$f" > "$t"
fi
grep -v '^-' "$i" >> "$t" || true
chmod 600 "$t"
mv -f "$t" "$f"
"""
# A key body as it may be dropped: base64 characters only (no blank, no newline).
KEY_BODY = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# Client-side SSH windows and packet sizes for the upstream connection: large windows
# keep a fast transfer from stalling on window adjustments.
WINDOW = 8 * 1024 * 1024
MAX_PKTSIZE = 256 * 1024


def managed_block(lines: Sequence[str]) -> bytes:
    keys = [line.strip() for line in lines if line.strip() and "\n" not in line]
    return ("\n".join([BEGIN, *keys, END]) + "\n").encode()


def key_body(line: str) -> str | None:
    """The base64 body of an ``authorized_keys`` key line without options (None when
    it has none that looks like one)."""
    parts = line.split()
    if len(parts) < 2 or not KEY_BODY.fullmatch(parts[1]):
        return None
    return parts[1]


def sync_input(lines: Sequence[str], drop: Iterable[str] = ()) -> bytes:
    """The script's stdin: the bodies to drop (those of ``lines`` never are; anything
    but base64 is left out), then the managed block holding ``lines``."""
    keep = {key_body(line) for line in lines}
    bodies = sorted({b for b in drop if KEY_BODY.fullmatch(b) and b not in keep})
    return "".join(f"-{b}\n" for b in bodies).encode() + managed_block(lines)


async def install_authorized_keys(
    engine_url: str,
    ssl_context: ssl.SSLContext | None,
    container: str,
    lines: Sequence[str],
    timeout_s: float = 20.0,
    drop: Iterable[str] = (),
) -> None:
    """Make the managed block of root's ``authorized_keys`` in ``container`` hold
    exactly ``lines``, and delete every line elsewhere in the file that holds one of
    the key bodies ``drop`` (gpuyard-registered keys that no longer open it; a body of
    ``lines`` is never dropped). Idempotent. Raises ExecError when the engine refuses
    or the script fails (no shell, read-only root)."""
    async with asyncio.timeout(timeout_s), ExecSession(engine_url, ssl=ssl_context) as s:
        await s.start(container, ["/bin/sh", "-c", AUTHORIZED_KEYS_SCRIPT], tty=False, user="0")
        await s.write(sync_input(lines, drop))
        await s.close_stdin()
        output = b""
        while chunk := await s.read():
            output += chunk[:4096]
        code = await s.wait()
    if code != 0:
        text = output.decode("utf-8", "replace").strip()[:300]
        raise ExecError(f"writing /root/.ssh/authorized_keys failed ({code}): {text}")


async def connect_upstream(
    host: str, port: int, client_key: asyncssh.SSHKey, timeout_s: float = 15.0
) -> asyncssh.SSHClientConnection:
    """An SSH connection to a cluster's sshd as root with the gateway's key. The
    container's host key is not checked: it is made inside a container the gateway
    just wrote its key into, and the address is the host's own published port."""
    return await asyncssh.connect(
        host,
        port,
        username="root",
        client_keys=[client_key],
        known_hosts=None,
        agent_path=None,
        preferred_auth="publickey",
        connect_timeout=timeout_s,
        login_timeout=timeout_s,
        config=None,
        # Plain AES-GCM: the fastest cipher the cryptography package offers.
        encryption_algs=["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr"],
        compression_algs=None,
    )


class Batcher:
    """Writes to a channel gathered per event-loop turn: the packets one read of the
    other leg delivered (say, a burst of small SFTP status replies) leave as one SSH
    packet, not one each. Order is kept; nothing waits past the current turn."""

    def __init__(
        self, chan: asyncssh.SSHServerChannel[bytes] | asyncssh.SSHClientChannel[bytes]
    ) -> None:
        self.chan = chan
        self._buf: list[bytes] = []
        self._kind: asyncssh.DataType = None
        self._scheduled = False

    def write(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self._buf and datatype != self._kind:
            self.flush()
        self._kind = datatype
        self._buf.append(data)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if self._buf:
            data = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
            self._buf.clear()
            with contextlib.suppress(asyncssh.Error, BrokenPipeError, OSError):
                self.chan.write(data, self._kind)


class UpstreamSession(asyncssh.SSHClientSession[bytes]):
    """The upstream half of one bridged session channel: what the container's sshd
    sends goes to the user's channel ``down``."""

    def __init__(self, down: asyncssh.SSHServerChannel[bytes]) -> None:
        self.down = down
        self.out = Batcher(down)
        self.chan: asyncssh.SSHClientChannel[bytes] | None = None
        self.exit_status: int | None = None
        self.exit_signal: tuple[str, bool, str, str] | None = None

    def connection_made(self, chan: asyncssh.SSHClientChannel[bytes]) -> None:
        self.chan = chan

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.out.write(data, datatype)

    def eof_received(self) -> bool:
        self.out.flush()
        with contextlib.suppress(asyncssh.Error, BrokenPipeError, OSError):
            self.down.write_eof()
        return True

    def exit_status_received(self, status: int) -> None:
        self.exit_status = status

    def exit_signal_received(self, signal: str, core_dumped: bool, msg: str, lang: str) -> None:
        self.exit_signal = (signal, core_dumped, msg, lang)

    def pause_writing(self) -> None:
        self.down.pause_reading()

    def resume_writing(self) -> None:
        self.down.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.out.flush()
        with contextlib.suppress(asyncssh.Error, BrokenPipeError, OSError):
            if self.exit_signal is not None:
                self.down.exit_with_signal(*self.exit_signal)
            else:
                self.down.exit(self.exit_status if self.exit_status is not None else 255)


class UpstreamBackend:
    """One user session channel bridged to a session channel on the upstream sshd."""

    def __init__(self, down: asyncssh.SSHServerChannel[bytes]) -> None:
        self.down = down
        self.up: asyncssh.SSHClientChannel[bytes] | None = None
        self.session: UpstreamSession | None = None
        self._out: Batcher | None = None

    async def start(
        self,
        upstream: asyncssh.SSHClientConnection,
        *,
        command: str | None,
        subsystem: str | None,
        env: Mapping[str, str],
        term_type: str | None,
        term_size: tuple[int, int, int, int],
        term_modes: Mapping[int, int],
    ) -> None:
        """Open the upstream channel. Raises asyncssh.ChannelOpenError when the sshd
        refuses it."""
        session = UpstreamSession(self.down)
        kwargs: dict[str, object] = {
            "env": dict(env),
            "encoding": None,
            "window": WINDOW,
            "max_pktsize": MAX_PKTSIZE,
        }
        if term_type:
            kwargs.update(term_type=term_type, term_size=term_size, term_modes=dict(term_modes))
        if subsystem:
            kwargs["subsystem"] = subsystem
        elif command is not None:
            kwargs["command"] = command
        chan, _ = await upstream.create_session(lambda: session, **kwargs)  # type: ignore[arg-type]
        self.up, self.session, self._out = chan, session, Batcher(chan)

    def write(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self._out is not None:
            self._out.write(data, datatype)

    def eof(self) -> None:
        if self.up is not None and self._out is not None:
            self._out.flush()
            with contextlib.suppress(asyncssh.Error, BrokenPipeError, OSError):
                self.up.write_eof()

    def resize(self, cols: int, rows: int, pixwidth: int, pixheight: int) -> None:
        if self.up is not None:
            with contextlib.suppress(asyncssh.Error, OSError):
                self.up.change_terminal_size(cols, rows, pixwidth, pixheight)

    def signal(self, name: str) -> None:
        if self.up is not None:
            with contextlib.suppress(asyncssh.Error, OSError):
                self.up.send_signal(name)

    def pause_output(self) -> None:
        if self.up is not None:
            self.up.pause_reading()

    def resume_output(self) -> None:
        if self.up is not None:
            self.up.resume_reading()

    def close(self) -> None:
        if self.up is not None:
            self.up.close()
