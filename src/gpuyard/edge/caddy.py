"""Caddy, the HTTP proxy's data plane: its admin API, and the process gpuyard starts.

User traffic to clusters' http ports flows through Caddy only, never through the API
process; gpuyard tells Caddy what to do through its admin API (``POST /load`` of the
whole configuration, see ``edge/caddy_config.py``).

The Caddy gpuyard starts runs in its own session, so restarting gpuyard does not cut
the proxy's connections: the next gpuyard finds it by its admin socket and re-syncs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from gpuyard.core.tls_trust import trusted_tls

log = logging.getLogger(__name__)

_ADMIN_TIMEOUT_S = 5.0


class CaddyError(Exception):
    """Caddy is missing, did not start, or refused a configuration (message says which)."""


class CaddyAdmin:
    """A client of one Caddy admin endpoint: ``unix//path/to.sock`` or ``host:port``."""

    def __init__(self, address: str) -> None:
        self.address = address
        if address.startswith("unix//"):
            transport = httpx.HTTPTransport(
                uds=address[len("unix/") :], verify=trusted_tls(trust_env=False)
            )
            base = "http://localhost"
        else:
            transport = httpx.HTTPTransport(verify=trusted_tls(trust_env=False))
            base = f"http://{address}"
        # Caddy's admin checks Host (and Origin) against its listen address; over a unix
        # socket it accepts an empty host.
        self._client = httpx.Client(
            transport=transport, base_url=base, timeout=_ADMIN_TIMEOUT_S, trust_env=False
        )
        self._host = "" if address.startswith("unix//") else address

    def close(self) -> None:
        self._client.close()

    def _headers(self) -> dict[str, str]:
        return {"Host": self._host}

    def config(self) -> dict[str, Any] | None:
        """The running configuration (None when empty). Raises CaddyError when the
        admin endpoint does not answer."""
        try:
            r = self._client.get("/config/", headers=self._headers())
        except httpx.HTTPError as e:
            raise CaddyError(f"Caddy's admin endpoint {self.address} does not answer: {e}") from e
        if r.status_code != 200:
            raise CaddyError(f"Caddy's admin answered {r.status_code}: {r.text[:300]}")
        value = r.json()
        return value if isinstance(value, dict) else None

    def load(self, config: dict[str, Any]) -> None:
        """Replace the whole configuration. Raises CaddyError with Caddy's reason when
        it refuses (a port in use, say) or does not answer."""
        try:
            r = self._client.post(
                "/load",
                content=json.dumps(config).encode(),
                headers={**self._headers(), "Content-Type": "application/json"},
            )
        except httpx.HTTPError as e:
            raise CaddyError(f"Caddy's admin endpoint {self.address} does not answer: {e}") from e
        if r.status_code != 200:
            try:
                reason = str(r.json().get("error", r.text))
            except ValueError:
                reason = r.text
            raise CaddyError(f"Caddy refused the proxy configuration: {reason[:500]}")

    def alive(self) -> bool:
        try:
            self.config()
        except CaddyError:
            return False
        return True


class CaddyProcess:
    """The Caddy that gpuyard runs itself, admin on a unix socket in ``directory``.

    :meth:`ensure` starts it unless one already answers there (a previous gpuyard's,
    kept across restarts). Its data and config directories are ``directory`` (no
    autosave), its output goes to ``directory/caddy.log``.
    """

    def __init__(self, directory: Path, binary: str = "caddy") -> None:
        self.directory = directory
        self.binary = binary
        self.admin_address = f"unix/{directory / 'admin.sock'}"
        self.pidfile = directory / "caddy.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    def missing(self) -> str | None:
        """None when the binary is there, else what to install."""
        if shutil.which(self.binary) is None:
            return (
                f"Caddy is not installed ({self.binary!r} not found): install it "
                "(apt-get install caddy) for proxy URLs; the API works without it"
            )
        return None

    def ensure(self, admin: CaddyAdmin, wait_s: float = 10.0) -> bool:
        """Make sure a Caddy answers on the admin socket; True when this call started
        it (its configuration is then empty). Raises CaddyError when it cannot."""
        if self._proc is not None:
            self._proc.poll()  # reap a Caddy of ours that died
        if admin.alive():
            return False
        problem = self.missing()
        if problem is not None:
            raise CaddyError(problem)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        sock = self.directory / "admin.sock"
        sock.unlink(missing_ok=True)
        bootstrap = self.directory / "bootstrap.json"
        bootstrap.write_text(
            json.dumps({"admin": {"listen": self.admin_address, "config": {"persist": False}}})
        )
        env = {
            **os.environ,
            "XDG_DATA_HOME": str(self.directory / "data"),
            "XDG_CONFIG_HOME": str(self.directory / "config"),
            "HOME": str(self.directory),
        }
        with open(self.directory / "caddy.log", "ab") as out:
            proc = subprocess.Popen(
                [self.binary, "run", "--config", str(bootstrap), "--pidfile", str(self.pidfile)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                cwd=self.directory,
                start_new_session=True,
            )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise CaddyError(
                    f"Caddy exited at start (code {proc.returncode}); see "
                    f"{self.directory / 'caddy.log'}"
                )
            if admin.alive():
                self._proc = proc
                log.info("started caddy (pid %s), admin %s", proc.pid, self.admin_address)
                return True
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        raise CaddyError(f"Caddy did not answer on {self.admin_address} within {wait_s:.0f} s")

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the Caddy this directory's pidfile names (if it runs)."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if self._proc is not None and self._proc.pid == pid:
            # Our own child: wait() reaps it (kill(pid, 0) would see the zombie).
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self.pidfile.unlink(missing_ok=True)
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)
