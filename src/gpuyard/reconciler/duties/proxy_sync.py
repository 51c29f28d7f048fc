"""Keeps the HTTP proxy (Caddy and its resolver) serving exactly the routes the store
describes.

Level-based like the rest of the reconciler: each pass computes every route from the
store and publishes the route table when it changed (``edge/route_table.py``: the file
the resolver reads, and the marker files Caddy's matcher looks for; Caddy looks each
request's cluster port up there, see ``edge/caddy_config.py``), makes sure the
resolver answers, then reads Caddy's running configuration and loads the desired one
when they differ. That configuration names no cluster, so it changes only with the
proxy's own settings (or the resolver's port): creating, terminating, moving a cluster
or changing its ports writes the table and loads nothing (a load would cut every
WebSocket Caddy carries). A port's visibility follows within one pass of a change (the
pass is woken by every recorded status change); its upstream within that and Caddy's
lookup refresh (``caddy_config.REFRESH``). A Caddy restarted (empty) or edited by hand
converges on the next periodic pass; a Caddy or resolver started by gpuyard that died
is started again. Nothing here sits in the path of user traffic.

Each API process configures the Caddy of its own machine with every route (replicas
each serve the whole proxy domain).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from gpuyard.core.network.proxy import ProxyBase
from gpuyard.edge.caddy import CaddyAdmin, CaddyError, CaddyProcess
from gpuyard.edge.caddy_config import ProxyListen, caddy_config
from gpuyard.edge.proxy_resolver import ResolverProcess
from gpuyard.edge.route_table import publish, table_routes
from gpuyard.runtimes.hosts.ssh_forwards import SshPortForwards
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.services.access.proxy_routes import load_routes, proxy_api_secret, proxy_base
from gpuyard.services.context import Context
from gpuyard.settings import Settings

log = logging.getLogger(__name__)

# Passes woken by status changes are at least this far apart.
_MIN_GAP_S = 0.2


class Resolver(Protocol):
    """The proxy's resolver (edge/proxy_resolver.py ResolverProcess): the table it
    reads, the marker files' folder beside it, and its port once it answers."""

    table: Path
    markers: Path

    def ensure(self) -> int: ...

    def stop(self) -> None: ...


class ProxySync:
    """One Caddy and its resolver, kept in step with the store. ``process`` is None
    for a Caddy the operator runs (``GPUYARD_CADDY_ADMIN``, on this machine): it is
    configured, never started or stopped."""

    def __init__(
        self,
        ctx: Context,
        admin: CaddyAdmin,
        listen: ProxyListen,
        base: ProxyBase,
        process: CaddyProcess | None = None,
        forwards: SshPortForwards | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.ctx = ctx
        self.resolver: Resolver = resolver or ResolverProcess(ctx.settings.home / "caddy")
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

    def desired(self, resolver_port: int) -> dict[str, Any]:
        listen = replace(
            self.listen,
            resolver=f"127.0.0.1:{resolver_port}",
            markers=str(self.resolver.markers),
        )
        return caddy_config(self.base, listen)

    def write_routes(self) -> bool:
        """The route table from the store, published when it changed (True then)."""
        routes = table_routes(load_routes(self.ctx, self.forwards))
        return publish(self.resolver.table, self.resolver.markers, routes)

    def sync(self, *, check_caddy: bool = True) -> bool:
        """One pass; True when the proxy serves the desired routes afterwards.
        ``check_caddy`` False (a pass woken by a status change): Caddy is asked nothing
        when the desired configuration is the one last loaded into it, so a change
        costs one query, a table write when it alters a route, and no admin call; the
        periodic pass always reads Caddy's configuration (a restarted Caddy is empty).
        Never raises: a failure is recorded in ``status`` (and logged when it changes)."""
        with self._lock:
            try:
                self.write_routes()
                try:
                    port = self.resolver.ensure()
                except RuntimeError as e:
                    raise CaddyError(str(e)) from e
                desired = self.desired(port)
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
            self.resolver.stop()  # an operator's Caddy keeps its resolver, and serves
        if self.forwards is not None:
            self.forwards.close()
        self.admin.close()
