"""Keeps the HTTP proxy (Caddy) serving exactly the routes the store describes.

Level-based like the rest of the reconciler: each pass computes the whole desired
configuration from the store, reads Caddy's running configuration and loads the
desired one when they differ. So a route appears or goes within one pass of a status
change (the pass is woken by every recorded status change), and a Caddy that was
restarted (empty) or edited by hand converges on the next pass. A Caddy started by
gpuyard that died is started again. Nothing here sits in the path of user traffic.

Each API process configures the Caddy of its own machine with every route (replicas
each serve the whole proxy domain).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from gpuyard.core.network.proxy import ProxyBase
from gpuyard.edge.caddy import CaddyAdmin, CaddyError, CaddyProcess
from gpuyard.edge.caddy_config import ProxyListen, caddy_config
from gpuyard.runtimes.hosts.ssh_forwards import SshPortForwards
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.services.access.proxy_routes import load_routes, proxy_api_secret, proxy_base
from gpuyard.services.context import Context
from gpuyard.settings import Settings

log = logging.getLogger(__name__)

# Passes woken by status changes are at least this far apart.
_MIN_GAP_S = 0.2


class ProxySync:
    """One Caddy, kept in step with the store. ``process`` is None for a Caddy the
    operator runs (``GPUYARD_CADDY_ADMIN``): it is configured, never started or stopped."""

    def __init__(
        self,
        ctx: Context,
        admin: CaddyAdmin,
        listen: ProxyListen,
        base: ProxyBase,
        process: CaddyProcess | None = None,
        forwards: SshPortForwards | None = None,
    ) -> None:
        self.ctx = ctx
        self.admin = admin
        self.listen = listen
        self.base = base
        self.process = process
        # How private ports of ssh:// hosts are reached (None: at the host's address).
        self.forwards = forwards
        # Views of this process read it: proxy URLs show while the proxy serves.
        self.status = ctx.proxy
        self.status.enable()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loaded: dict[str, Any] | None = None

    @classmethod
    def from_settings(cls, ctx: Context, settings: Settings) -> ProxySync:
        own = settings.caddy_admin is None
        process = CaddyProcess(settings.home / "caddy", settings.caddy_binary) if own else None
        address = process.admin_address if process is not None else str(settings.caddy_admin)
        api_host = settings.host if settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        listen = ProxyListen(
            bind=settings.proxy_bind,
            port=settings.proxy_port,
            api_upstream=settings.proxy_api_upstream or f"{api_host}:{settings.port}",
            admin=address,
            tls_cert=settings.proxy_tls_cert_file,
            tls_key=settings.proxy_tls_key_file,
            api_secret=proxy_api_secret(settings),
        )
        forwards = SshPortForwards(SshKeys(settings.home), settings.home / "ssh" / "fwd")
        return cls(ctx, CaddyAdmin(address), listen, proxy_base(settings), process, forwards)

    def desired(self) -> dict[str, Any]:
        return caddy_config(load_routes(self.ctx, self.forwards), self.base, self.listen)

    def sync(self, *, check_caddy: bool = True) -> bool:
        """One pass; True when the proxy serves the desired configuration afterwards.
        ``check_caddy`` False (a pass woken by a status change): Caddy is asked nothing
        when the desired configuration is the one last loaded into it, so the many
        changes that alter no route cost one query and no admin call; the periodic
        pass always reads Caddy's configuration (a restarted Caddy is empty).
        Never raises: a failure is recorded in ``status`` (and logged when it changes)."""
        with self._lock:
            try:
                desired = self.desired()
                if not check_caddy and desired == self._loaded and self.status.ready:
                    return True
                if self.process is not None:
                    self.process.ensure(self.admin)
                if self.admin.config() != desired:
                    self.admin.load(desired)
                self._loaded = desired
            except CaddyError as e:
                if self.status.problem() != str(e):
                    log.warning("HTTP proxy unavailable: %s", e)
                self.status.set(False, str(e))
                return False
            except Exception as e:  # a store hiccup: keep the last state, try again
                log.warning("proxy sync failed: %s", e)
                return False
            if self.status.problem() is not None:
                log.info(
                    "HTTP proxy serving %s on %s:%s",
                    self.base.domain,
                    self.listen.bind,
                    self.listen.port,
                )
            self.status.set(True, None)
            return True

    def _run(self) -> None:
        notifier = self.ctx.notifier
        seen = notifier.generation()
        interval = self.ctx.settings.proxy_sync_interval_s
        next_check = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            self.sync(check_caddy=now >= next_check)
            if now >= next_check:
                next_check = now + interval
            # A burst of status changes makes one pass, not one each.
            if self._stop.wait(_MIN_GAP_S):
                break
            seen = notifier.wait_change(seen, max(next_check - time.monotonic(), 0.0))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuyard-proxy-sync", daemon=True)
        self._thread.start()

    def stop(self, *, stop_caddy: bool = True) -> None:
        """End the loop; stop the Caddy gpuyard started unless ``stop_caddy`` is False."""
        self._stop.set()
        self.ctx.notifier.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if stop_caddy and self.process is not None:
            self.process.stop()
        if self.forwards is not None:
            self.forwards.close()
        self.admin.close()
