"""Engine URLs of hosts added through the API: what they may say, and how two URLs
that name the same engine are recognised. Pure; no I/O.

Three forms (docs: README "Hosts"):

- ``unix:///path/to/engine.sock`` — an engine on the server's own machine;
- ``ssh://user@host[:port][/socket/path]`` — the normal case: the engine's unix socket
  (Docker's or Podman's; the path, when given, says which) is forwarded over SSH with
  the installation's key. No password: keys only;
- ``tcp://host:port`` — Docker's TCP API. Anything but loopback needs TLS client
  certificates (``engine_tls_dir``): an open engine port is root on the host.

Every check raises ValidationFailed naming the field (``engine_url``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpuyard.core.errors import ValidationFailed

SCHEMES = ("unix", "ssh", "tcp")
MAX_ENGINE_URL_CHARS = 500
DEFAULT_SSH_PORT = 22
# For OpenAPI: the scheme and no white space or control character; the rest is parsed.
ENGINE_URL_PATTERN = r"^(unix|ssh|tcp)://[^\s\x00-\x1f\x7f]+$"

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
# A login name as useradd takes it (no '%', ':' or '@': nothing to decode or split).
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_SEGMENT = re.compile(r"[A-Za-z0-9._@+=~-]+")
_FIELD = "engine_url"


@dataclass(frozen=True)
class EngineAddress:
    """A parsed engine URL. ``host`` is None for ``unix://``; ``path`` is the socket
    path (``""`` for ssh: the remote engine's default socket; always ``""`` for tcp)."""

    scheme: str
    user: str | None
    host: str | None
    port: int | None
    path: str

    @property
    def key(self) -> str:
        """The same string for every URL naming this engine (host names folded to
        lower case, the default SSH port written out): what duplicates are judged by."""
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        return f"{self.scheme}://{user}{host}:{self.port}{self.path}"

    @property
    def loopback(self) -> bool:
        """Whether the engine is on this machine (a unix socket or a loopback host)."""
        return self.host is None or is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP address (127.0.0.0/8, ::1)."""
    if host.rstrip(".").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host_name(value: str, field: str) -> str:
    """``value`` when it is a DNS name or an IP address (IPv6 without brackets), else
    ValidationFailed(field)."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if len(value) > 253 or not _HOSTNAME.fullmatch(value):
        raise ValidationFailed(field, f"{value[:60]!r} is not a host name or IP address")
    return value


def _socket_path(path: str) -> str:
    """An absolute, normalised path of plain segments (no '.', '..' or empty one)."""
    segments = path[1:].split("/")
    if any(s in ("", ".", "..") or not _SEGMENT.fullmatch(s) for s in segments):
        raise ValidationFailed(
            _FIELD,
            f"the socket path {path[:80]!r} must be absolute and normalised, of plain "
            "segments (letters, digits and '._@+=~-')",
        )
    return path


_BRACKETED = re.compile(r"\[([0-9A-Fa-f:.]+)\](?::([0-9]*))?")
_PLAIN = re.compile(r"([^:\[\]]*)(?::([0-9]*))?")
_BAD_PORT = "the port must be a number from 1 to 65535"


def _host_and_port(hostport: str, scheme: str) -> tuple[str, int | None]:
    """``host[:port]`` or ``[ipv6][:port]``, checked: a host name or IP address and a
    port of 1..65535 (None when absent). Host names are folded to lower case."""
    bracketed = hostport.startswith("[")
    found = (_BRACKETED if bracketed else _PLAIN).fullmatch(hostport)
    if found is None:
        if not bracketed and hostport.count(":") > 1:
            raise ValidationFailed(_FIELD, "an IPv6 address goes in brackets: [2001:db8::1]")
        raise ValidationFailed(_FIELD, f"{hostport[:80]!r} is not host[:port]")
    host, port_text = found.group(1).lower(), found.group(2)
    if not host:
        raise ValidationFailed(_FIELD, f"{scheme}:// needs a host")
    if bracketed:
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError(host)
        except ValueError:
            raise ValidationFailed(_FIELD, f"[{host[:60]}] is not an IPv6 address") from None
    else:
        check_host_name(host, _FIELD)
    if port_text is None:
        return host, None
    if not port_text or len(port_text) > 5 or not 1 <= int(port_text) <= 65535:
        raise ValidationFailed(_FIELD, _BAD_PORT)
    return host, int(port_text)


def parse_engine_url(url: str) -> EngineAddress:
    """Parse and check an engine URL (see the module's docstring). Raises
    ValidationFailed(``engine_url``) saying which rule it breaks."""
    if len(url) > MAX_ENGINE_URL_CHARS:
        raise ValidationFailed(_FIELD, f"must be at most {MAX_ENGINE_URL_CHARS} characters")
    if re.search(r"[\s\x00-\x1f\x7f-\x9f]", url):
        raise ValidationFailed(_FIELD, "must not contain white space or control characters")
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValidationFailed(
            _FIELD,
            "must start with unix://, ssh:// or tcp:// (e.g. ssh://gpuyard@gpu-1.example.com "
            "or unix:///run/podman/podman.sock)",
        )
    if "?" in url or "#" in url or ";" in url:
        raise ValidationFailed(_FIELD, "must not carry a query, fragment or parameters")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise ValidationFailed(_FIELD, f"is not a valid URL ({exc})") from None
    if scheme == "unix":
        if parts.netloc:
            raise ValidationFailed(
                _FIELD, "unix:// takes an absolute socket path: unix:///path/to/engine.sock"
            )
        if not parts.path.startswith("/"):
            raise ValidationFailed(_FIELD, "unix:// needs the engine's socket path")
        return EngineAddress("unix", None, None, None, _socket_path(parts.path))
    if "%" in parts.netloc:
        raise ValidationFailed(_FIELD, "must not hold percent-encoded characters in its host")
    if parts.password is not None or ":" in (parts.netloc.rpartition("@")[0]):
        raise ValidationFailed(
            _FIELD, "must not carry a password: gpuyard reaches hosts with its SSH key"
        )
    host, port = _host_and_port(parts.netloc.rpartition("@")[2], scheme)
    user = parts.username
    if scheme == "ssh":
        if not user or not _USER.fullmatch(user):
            raise ValidationFailed(
                _FIELD,
                "ssh:// needs the login name, e.g. ssh://gpuyard@gpu-1.example.com "
                "(letters, digits, '_', '.', '-'; starting with a letter or '_')",
            )
        path = _socket_path(parts.path) if parts.path not in ("", "/") else ""
        return EngineAddress("ssh", user, host, port or DEFAULT_SSH_PORT, path)
    # tcp
    if user is not None:
        raise ValidationFailed(_FIELD, "tcp:// takes no user name (TLS certificates identify)")
    if port is None:
        raise ValidationFailed(_FIELD, "tcp:// needs a port, e.g. tcp://gpu-1:2376")
    if parts.path not in ("", "/"):
        raise ValidationFailed(_FIELD, "tcp:// takes no path")
    return EngineAddress("tcp", None, host, port, "")


def redacted(url: str | None) -> str | None:
    """``url`` as it may be shown: without a password, query or fragment (the server's
    own engine URL comes from its settings, which these rules did not check)."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        if parts.password is None and not parts.query and not parts.fragment:
            return url
        netloc = parts.netloc.rpartition("@")[2]
        if parts.username:
            netloc = f"{parts.username}@{netloc}"
        return f"{parts.scheme}://{netloc}{parts.path}"
    except ValueError:
        return f"{url.partition('://')[0]}://(hidden: not a valid URL)"
