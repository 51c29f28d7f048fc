"""What a user is told when an image pull fails: one of a few fixed messages.

The engine's own pull error names the address it dialled and how the connection
ended (``dial tcp 127.0.0.1:8765: connect: connection refused``, ``server gave HTTP
response to HTTPS client``, ``tls: first record does not look like a TLS handshake``).
Shown to the user, that text turns image names into a port scanner: closed, open and
HTTP ports read differently. So a pull failure becomes one of :data:`USER_MESSAGES`,
and every failure before a registry answered as a registry (connection, DNS, TLS,
timeouts, non-registry HTTP answers) reads the same. The engine's text goes to the
server log at debug level only.
"""

from __future__ import annotations

import re

import docker.errors

NOT_FOUND = "image not found or access denied"
CREDENTIALS_NEEDED = (
    "the registry denied the pull: this image needs registry credentials "
    "(registry_auth_id) or the ones given were not accepted"
)
UNREACHABLE = "registry unreachable"
FAILED = "image pull failed"
USER_MESSAGES = (NOT_FOUND, CREDENTIALS_NEEDED, UNREACHABLE, FAILED)

# Checked first: the engine never got a registry's answer about the image. Podman says
# "pinging container registry HOST: ..." for anything that fails at the /v2/ probe,
# including an HTTP server that is not a registry ("invalid status code from registry").
_UNREACHABLE = re.compile(
    r"pinging (?:container|docker) registry|connection refused|connection reset|"
    r"dial (?:tcp|udp)|no such host|lookup |name resolution|i/o timeout|timeout|"
    r"timed out|deadline exceeded|tls:|tls handshake|x509|certificate|"
    r"server gave http response|\beof\b|network is unreachable|no route to host|"
    r"invalid status code from registry|proxyconnect|bad gateway|service unavailable|"
    r"gateway timeout|too many redirects|broken pipe|error parsing http",
    re.IGNORECASE,
)
# A registry answered and asked for credentials (or refused the ones given).
_CREDENTIALS = re.compile(
    r"unauthorized|authentication required|incorrect username or password|"
    r"invalid username/password|\b401\b",
    re.IGNORECASE,
)
# A registry answered: the image is not there, or not for these credentials.
_NOT_FOUND = re.compile(
    r"manifest unknown|name unknown|not found|repository does not exist|"
    r"pull access denied|access to the resource is denied|\bdenied\b|unauthorized|"
    r"authentication required|no such image|does not exist|short-name|"
    r"\b40[134]\b",
    re.IGNORECASE,
)


def user_message(engine_text: str, status_code: int | None = None) -> str:
    """The fixed message for an engine's pull error text (and HTTP status of the
    engine's API answer, when there was one). Always one of :data:`USER_MESSAGES`."""
    if _UNREACHABLE.search(engine_text):
        return UNREACHABLE
    if status_code == 401 or _CREDENTIALS.search(engine_text):
        return CREDENTIALS_NEEDED
    if status_code in (403, 404) or _NOT_FOUND.search(engine_text):
        return NOT_FOUND
    return FAILED


def from_exception(error: BaseException) -> str:
    """:func:`user_message` for an exception the docker SDK raised during a pull (or
    that an engine-error wrapper raised from one: its cause is looked at too)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, docker.errors.APIError):
            text = f"{cause.explanation or ''} {cause}"
            return user_message(text, cause.status_code)
        cause = cause.__cause__
    return user_message(str(error))
