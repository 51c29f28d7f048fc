"""``gpuyard serve``: the API server with its reconciler, on a found (or started)
container engine, with logging that never shows an API key."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import TextIO
from urllib.parse import unquote_plus

import click

from gpuyard.api.engine_server import engine_server
from gpuyard.api.http.worker_listener import WorkerListenerGate
from gpuyard.api.state import KEY_QUERY_PARAMS
from gpuyard.core.errors import RuntimeFailure
from gpuyard.edge.ssh_service import GatewaySupervisor, start_ssh_gateway
from gpuyard.runtimes.engines.url import (
    ROOT_PODMAN_SOCKET,
    PodmanService,
    default_service_socket,
    detect_engine_url,
)
from gpuyard.services.serverless.callback import unreachable_warning, worker_port
from gpuyard.services.tenancy.auth import IssuedKey
from gpuyard.services.tenancy.secrets import SecretKeyError
from gpuyard.settings import Settings

log = logging.getLogger("gpuyard.serve")

# A unix socket path must fit sockaddr_un.sun_path (108 bytes on Linux, with the NUL).
_MAX_SOCKET_PATH = 100

# A ``name=value`` pair as it appears in a query string (raw, as uvicorn's access log
# shows it) or in any other text. The value runs to the next ``&`` or whitespace: a
# quote or ``;`` inside a raw query must not end it early and leave the rest in clear.
_PARAM = re.compile(r"(?P<name>[A-Za-z0-9_.~%+\[\]-]{1,256})=(?P<value>[^&\s]*)")
# Every accepted key parameter, as _normalized() spells it.
_KEY_NAMES = frozenset(re.sub(r"[^a-z0-9]", "", name.lower()) for name in KEY_QUERY_PARAMS)
# Other secrets that travel in query strings: the HTTP proxy's one-time open links.
_SECRET_NAMES = _KEY_NAMES | {"token"}
_AUTH_HEADER = re.compile(
    r"(authorization[\"']?\s*[:=,]\s*(?:b?[\"'])?)(bearer\s+|basic\s+)?[^\s\"',}]+", re.IGNORECASE
)
# A key as a field of structured text: ``"api_key": "..."``, ``'apikey': '...'``.
_KEY_FIELD = re.compile(r"(api[_-]?key[\"']?\s*:\s*(?:b?[\"'])?)[^\s\"',}]+", re.IGNORECASE)
_BARE_KEY = re.compile(r"\bgy_[A-Za-z0-9_-]{6,}")


def _normalized(name: str) -> str:
    """A parameter name as the server could read it, folded generously: percent-
    and plus-decoded until stable (``api%5Fkey``, ``api%255Fkey``), lower-cased, with
    everything but letters and digits dropped (``API-Key``, ``api_key[]``)."""
    for _ in range(4):
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _redact_param(match: re.Match[str]) -> str:
    if _normalized(match["name"]) in _SECRET_NAMES and match["value"]:
        return f"{match['name']}=***"
    return match[0]


def redact(text: str) -> str:
    """``text`` with API keys replaced by ``***``: the value of every query parameter
    the server would take as a key, in any spelling (percent-encoded, any case,
    repeated), ``Authorization`` header values and anything shaped like a gpuyard key.
    Errs on the side of hiding: a look-alike name is redacted too."""
    if "=" in text:
        text = _PARAM.sub(_redact_param, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}***", text)
    text = _KEY_FIELD.sub(r"\1***", text)
    return _BARE_KEY.sub("gy_***", text)


class RedactKeysFilter(logging.Filter):
    """Rewrites each record's message (and traceback text) through :func:`redact` and
    folds it onto one line. Attach it to a handler so it sees records of every logger,
    uvicorn's access log included. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record still gets logged, as its template
            message = str(record.msg)
        clean = redact(message).replace("\r", "\\r").replace("\n", " | ")
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def configure_logging(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Root logging to ``stream`` (default stderr), one line per record, keys redacted
    (replaces handlers)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RedactKeysFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # One line per request to Caddy's admin API (every proxy sync) is noise.
    logging.getLogger("httpx").setLevel(max(level, logging.WARNING))


def service_socket(settings: Settings) -> Path:
    """Where a Podman service started by gpuyard listens: the standard rootful path when
    running as root and ``/run/podman`` is usable, else ``<home>/podman.sock`` (or a short
    runtime-dir path when the home is too deep for a socket path)."""
    if os.geteuid() == 0:
        root_dir = Path(ROOT_PODMAN_SOCKET).parent
        try:
            root_dir.mkdir(parents=True, exist_ok=True)
            if os.access(root_dir, os.W_OK | os.X_OK):
                return Path(ROOT_PODMAN_SOCKET)
        except OSError:
            pass
    path = default_service_socket(settings.home)
    if len(str(path)) > _MAX_SOCKET_PATH:
        path = default_service_socket(None)
    return path


def connectable_url(settings: Settings) -> str:
    host = settings.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def announce_admin_key(key: IssuedKey, settings: Settings, *, tty: bool | None = None) -> None:
    """Say where the first-start admin key was saved, on stdout (never through logging).
    The key itself is printed only when stdout is a terminal (``tty``; default: asked
    of stdout): a pipe or a file is a journal or a CI log that keeps it for anyone
    who can read those."""
    if tty is None:
        tty = sys.stdout.isatty()
    if not tty:
        click.echo(
            "gpuyard first start: an admin API key was created; "
            f"key saved to {settings.credentials_path} (mode 0600; the gpuyard CLI reads it)"
        )
        return
    url = connectable_url(settings)
    bar = "=" * 72
    click.echo(
        f"\n{bar}\n"
        "gpuyard first start: an admin API key was created. It is shown only this once.\n\n"
        f"  API key:   {key.key}\n"
        f"  saved to:  {settings.credentials_path} (mode 0600; the gpuyard CLI reads it)\n\n"
        "Try it:\n"
        f'  curl -H "Authorization: Bearer {key.key}" {url}/v1/gpu-types\n'
        f"{bar}\n"
    )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def find_engine(settings: Settings) -> tuple[str | None, PodmanService | None]:
    """The engine URL and, when gpuyard had to start one, the Podman service to stop.
    Never raises: with no engine the URL is None and a warning says what to do."""
    url = detect_engine_url(settings.engine_url)
    if url is not None:
        log.info("container engine: %s", url)
        return url, None
    if settings.start_podman_service and PodmanService.podman_installed():
        service = PodmanService(service_socket(settings))
        try:
            url = service.start()
        except RuntimeFailure as e:
            log.warning("could not start the podman service: %s", e.message)
        else:
            log.info("started podman system service at %s", url)
            return url, service
    log.warning(
        "no container engine found: the server runs, but cluster starts will fail at the "
        "image step. Install podman (apt-get install podman) or Docker, or set "
        "GPUYARD_ENGINE_URL / DOCKER_HOST to a running engine"
    )
    return None, None


def _worker_socket(port: int) -> list[socket.socket]:
    """The serverless worker listener's socket on every address (its gate lets only
    workers' requests through, api/http/worker_listener.py). Raises ClickException
    when the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
    except OSError as exc:
        sock.close()
        raise click.ClickException(
            f"cannot listen for serverless workers on port {port} "
            f"(GPUYARD_SERVERLESS_WORKER_PORT): {exc}"
        ) from exc
    sock.set_inheritable(True)
    log.info("serverless workers reach this server on port %s (worker keys only)", port)
    return [sock]


def run_server(host: str | None, port: int | None) -> None:
    """Run until Ctrl-C or SIGTERM; a Podman service started here is always stopped."""
    import uvicorn  # heavy; only the server needs it

    from gpuyard.api.http.prompt_server import PromptServer  # (uvicorn's)

    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    settings = Settings(**overrides)  # type: ignore[arg-type]
    configure_logging()
    # uvicorn handles both signals while it runs and re-raises them after a graceful
    # shutdown; until then (and after) they unwind through the finally below.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    service: PodmanService | None = None
    gateway: GatewaySupervisor | None = None
    try:
        url, service = find_engine(settings)
        server = engine_server(settings, url)
        if server.admin_key is not None:
            announce_admin_key(server.admin_key, settings)
        # Its own process (edge/ssh_service.py); after the database is migrated.
        gateway = start_ssh_gateway(settings, url)
        log.info("gpuyard listening on %s (home %s)", connectable_url(settings), settings.home)
        # X-Forwarded-For names the client (rate limits, logs) only behind a listed proxy.
        proxies = settings.trusted_proxies.strip()
        listener = worker_port(settings)
        warning = unreachable_warning(settings)
        if warning is not None:
            log.warning("serverless endpoints: %s", warning)
        config = uvicorn.Config(
            WorkerListenerGate(server.app, listener) if listener else server.app,
            host=settings.host,
            port=settings.port,
            log_config=None,
            proxy_headers=bool(proxies),
            forwarded_allow_ips=proxies or None,
        )
        uv = PromptServer(config)
        if listener is None:
            uv.run()
        else:
            uv.run(sockets=[config.bind_socket(), *_worker_socket(listener)])
        if not uv.started:
            sys.exit(3)
    except KeyboardInterrupt:
        log.info("interrupted; shutting down")
    except SecretKeyError as e:
        raise click.ClickException(str(e)) from e
    finally:
        if gateway is not None:
            gateway.stop()
        if service is not None:
            log.info("stopping the podman service")
            service.stop()
        signal.signal(signal.SIGTERM, previous)
