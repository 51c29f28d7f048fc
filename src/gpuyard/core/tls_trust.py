"""The TLS verification of gpuyard's HTTP clients, made once per process.

httpx builds a new ``ssl.SSLContext`` for every client and loads the CA bundle into it:
about 50 ms of CPU each time, measured here, paid by every webhook delivery, every CLI
client and every client a test opens, though the certificates never change while the
process runs. :func:`trusted_tls` is the context httpx would have made (the same
sources in the same order: ``SSL_CERT_FILE``, then ``SSL_CERT_DIR`` when the client
trusts the environment, else certifi's bundle), made once for each source and shared.
An ``SSLContext`` may be shared between clients and threads; each connection takes
its own settings from it.
"""

from __future__ import annotations

import functools
import os
import ssl

import certifi


def trusted_tls(*, trust_env: bool = True) -> ssl.SSLContext:
    """The shared context that verifies servers as httpx's ``verify=True`` does
    (``trust_env``: as a client made with ``trust_env=True``)."""
    if trust_env and os.environ.get("SSL_CERT_FILE"):
        return _context(cafile=os.environ["SSL_CERT_FILE"], capath=None)
    if trust_env and os.environ.get("SSL_CERT_DIR"):
        return _context(cafile=None, capath=os.environ["SSL_CERT_DIR"])
    return _context(cafile=certifi.where(), capath=None)


@functools.cache
def _context(*, cafile: str | None, capath: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile, capath=capath)
