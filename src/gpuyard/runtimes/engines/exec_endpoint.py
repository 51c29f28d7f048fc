"""The exec endpoint of a Docker-API engine (:class:`~gpuyard.runtimes.records.ExecEndpoint`):
the URL a client opens exec sessions on, and the TLS context its client material asks
for. What the console's terminal connects to (edge/terminal_bridge.py)."""

from __future__ import annotations

import os
import ssl

from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.records import ExecEndpoint


def engine_exec_endpoint(engine: Engine, tunnel_url: str | None = None) -> ExecEndpoint:
    """Where ``engine`` takes exec calls: ``tunnel_url`` when given (an SSH host's
    forwarded socket), else the engine's own URL, else the SDK's default (what the
    runtime's own client uses too). A ``tcp://`` URL with TLS material becomes
    ``https://`` with a context holding the CA and the client certificate (no
    verification when the material says so)."""
    url = tunnel_url or engine.base_url
    if not url:
        url = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    context: ssl.SSLContext | None = None
    tls = engine.tls
    if tls:
        # docker.tls.TLSConfig, or a stand-in with the same attributes.
        ca = getattr(tls, "ca_cert", None)
        context = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        cert = getattr(tls, "cert", None)
        if cert:
            context.load_cert_chain(cert[0], cert[1])
        if getattr(tls, "verify", True) is False:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    if url.startswith("tcp://") and context is not None:
        url = "https://" + url[len("tcp://") :]
    return ExecEndpoint(url, context)
