"""Where the HTTP commands find the server and the API key.

Order, per value: the ``--url`` / ``--api-key`` flags, then ``GPUYARD_URL`` /
``GPUYARD_API_KEY``, then the credentials file the server wrote on its first start
(``$GPUYARD_HOME/credentials``, JSON ``{"url", "api_key"}``), then (URL only) the
default local address.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Target:
    """A resolved server: ``url`` (no trailing slash), ``api_key`` (None when none was
    found anywhere) and where each came from, for error messages."""

    url: str
    api_key: str | None
    url_source: str
    key_source: str


def credentials_path(env: Mapping[str, str] | None = None) -> Path:
    """``$GPUYARD_HOME/credentials`` (default ``~/.gpuyard/credentials``), as Settings."""
    env = os.environ if env is None else env
    home = env.get("GPUYARD_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".gpuyard") / "credentials"


def read_credentials(path: Path) -> dict[str, str]:
    """The file's string values; an empty dict when it is missing or unreadable."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str) and v}


def resolve_target(
    url: str | None, api_key: str | None, env: Mapping[str, str] | None = None
) -> Target:
    """Resolve the server URL and key by the order in the module docstring. Never raises."""
    env = os.environ if env is None else env
    path = credentials_path(env)
    creds = read_credentials(path)

    if url:
        u, us = url, "--url"
    elif env.get("GPUYARD_URL"):
        u, us = env["GPUYARD_URL"], "GPUYARD_URL"
    elif "url" in creds:
        u, us = creds["url"], str(path)
    else:
        u, us = DEFAULT_URL, "default"

    k: str | None
    if api_key:
        k, ks = api_key, "--api-key"
    elif env.get("GPUYARD_API_KEY"):
        k, ks = env["GPUYARD_API_KEY"], "GPUYARD_API_KEY"
    elif "api_key" in creds:
        k, ks = creds["api_key"], str(path)
    else:
        k, ks = None, "none"
    return Target(url=_connectable(u).rstrip("/"), api_key=k, url_source=us, key_source=ks)


def _connectable(url: str) -> str:
    """A server bound to all interfaces writes ``http://0.0.0.0:PORT`` to the credentials
    file; connect to loopback instead, which works everywhere 0.0.0.0 does not."""
    if "://" not in url:
        url = "http://" + url
    return url.replace("://0.0.0.0:", "://127.0.0.1:").replace("://[::]:", "://[::1]:")
