"""Image references and the registry allow-list (pure: no engine, no DNS).

An image name makes the container engine open a connection to the registry it names,
so a user who may name any registry may make the engine connect to any host and port
(``127.0.0.1:8765/x``, ``169.254.169.254/x``). Every image a user gives is therefore
parsed here and its registry checked against the operator's list
(``GPUYARD_ALLOWED_REGISTRIES``) before anything is stored.

Parsing follows the engines' reference grammar (distribution/reference): the first path
component is the registry when it contains ``.`` or ``:``, is ``localhost`` or has an
upper-case letter; otherwise the image is on Docker Hub (``ubuntu``,
``pytorch/pytorch:2.2``). A tag follows the last ``:`` after the last ``/``; a digest
follows ``@``.

The allow-list is comma-separated. An entry is

- a registry name, optionally with a port (``ghcr.io``, ``registry.example.com:5000``);
  an entry without a port matches only references without one;
- a wildcard ``*.example.com`` (any name under it) or ``*`` (any name); wildcards match
  names only, never an address and never ``localhost`` names;
- an address, optionally with a port (``10.0.0.5:5000``, ``[fd00::5]:5000``): only then
  may images come from an address, and only from exactly that address and port;
- ``localhost``: images already present in the engine under ``localhost/...`` (they are
  never pulled);
- ``public``: the public registries of :data:`PUBLIC_REGISTRIES`.

A registry given as an address (IPv4 in any form a resolver accepts, such as ``127.1``
or ``0x7f.0.0.1``; IPv6 in brackets) or as a ``localhost`` name is refused unless an
entry names exactly that address (or name) and port.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from gpuyard.core.errors import ValidationFailed

DOCKER_HUB = "docker.io"
# Names Docker itself treats as Docker Hub.
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io"})
LOCALHOST = "localhost"

PUBLIC_REGISTRIES = (
    "docker.io",
    "ghcr.io",
    "quay.io",
    "nvcr.io",
    "registry.k8s.io",
    "gcr.io",
    "public.ecr.aws",
    "mcr.microsoft.com",
)
# The default GPUYARD_ALLOWED_REGISTRIES: public registries by name, and local images.
DEFAULT_ALLOWED_REGISTRIES = ",".join((*PUBLIC_REGISTRIES, LOCALHOST))

MAX_REFERENCE = 512
MAX_NAME = 255
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{1,5}")
# An inet_aton part: decimal, octal (leading 0) or hexadecimal (0x).
_ATON_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class RegistryHost:
    """A registry's host and port. ``address`` is set when the host is an address
    literal (in any form a resolver would accept); ``host`` is lower case."""

    host: str
    port: int | None
    address: Address | None

    @property
    def loopback_name(self) -> bool:
        """``localhost`` and names under it resolve to loopback without DNS (RFC 6761)."""
        return self.host == LOCALHOST or self.host.endswith("." + LOCALHOST)

    @property
    def text(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference. ``registry`` is ``docker.io`` for names without one."""

    registry: RegistryHost
    path: str
    tag: str | None
    digest: str | None
    explicit_registry: bool

    @property
    def local_only(self) -> bool:
        """A ``localhost/...`` image (no port): one built or loaded on the engine, never
        pulled."""
        return self.registry.host == LOCALHOST and self.registry.port is None


def _aton(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``host`` denotes under inet_aton rules (``127.1``, ``0x7f.1``,
    ``2130706433``, ``0177.0.0.1``), which the C resolver applies to names that are
    not dotted quads; None when it is not such a literal."""
    parts = host.split(".")
    if host.endswith("."):
        parts = parts[:-1]
    if not 1 <= len(parts) <= 4 or not all(_ATON_PART.fullmatch(p) for p in parts):
        return None
    values = []
    for p in parts:
        if p[:2].lower() == "0x":
            values.append(int(p[2:] or "0", 16))
        elif len(p) > 1 and p.startswith("0"):
            values.append(int(p, 8))
        else:
            values.append(int(p))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def parse_registry_host(text: str) -> RegistryHost:
    """``host[:port]`` or ``[ipv6]:port`` as a :class:`RegistryHost`. Raises ValueError
    with a reason."""
    port: int | None = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("an IPv6 address needs its closing ']'")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]):
                raise ValueError("the port after an IPv6 address must be ':' and digits")
            port = int(rest[1:])
        try:
            v6 = ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise ValueError(f"{host!r} is not an IPv6 address") from exc
        mapped = v6.ipv4_mapped
        address: Address = mapped if mapped is not None else v6
        return _with_port(RegistryHost(v6.compressed, port, address))
    host, sep, port_text = text.partition(":")
    if sep:
        if not _PORT.fullmatch(port_text):
            raise ValueError("the registry port must be digits")
        port = int(port_text)
    if not _DOMAIN_NAME.fullmatch(host.removesuffix(".")) or len(host) > 253:
        raise ValueError(f"{host!r} is not a registry host name")
    host = host.lower().removesuffix(".")
    return _with_port(RegistryHost(host, port, _aton(host)))


def _with_port(host: RegistryHost) -> RegistryHost:
    if host.port is not None and not 1 <= host.port <= 65535:
        raise ValueError("the registry port must be 1-65535")
    return host


def parse_image_ref(reference: str) -> ImageRef:
    """Parse ``[registry/]path[:tag][@digest]``. Raises ValueError with a reason."""
    if not reference or len(reference) > MAX_REFERENCE:
        raise ValueError(f"must be 1 to {MAX_REFERENCE} characters")
    name, at, digest = reference.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise ValueError("the digest must be ALGORITHM:HEX (sha256:...)")
    tag: str | None = None
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ValueError(f"{tag!r} is not a valid tag")
    if len(name) > MAX_NAME:
        raise ValueError(f"the name must be at most {MAX_NAME} characters")
    first, sep, rest = name.partition("/")
    explicit = bool(sep) and (
        any(c in first for c in ".:[") or first == LOCALHOST or first.lower() != first
    )
    if explicit:
        registry = parse_registry_host(first)
        path = rest
        if registry.host in _HUB_ALIASES and registry.port is None:
            registry = RegistryHost(DOCKER_HUB, None, None)
    else:
        registry = RegistryHost(DOCKER_HUB, None, None)
        path = name
    if not _PATH.fullmatch(path):
        raise ValueError(
            "the repository must be lower-case letters, digits and separators (. _ -), "
            "components separated by '/'"
        )
    return ImageRef(registry, path, tag, digest or None, explicit)


@dataclass(frozen=True)
class RegistryPolicy:
    """The parsed allow-list (see the module docstring)."""

    names: frozenset[tuple[str, int | None]]
    wildcards: tuple[tuple[str, int | None], ...]
    addresses: frozenset[tuple[Address, int | None]]
    any_name: bool

    @classmethod
    def parse(cls, setting: str) -> RegistryPolicy:
        """Parse the comma-separated setting. Raises ValueError naming a bad entry."""
        names: set[tuple[str, int | None]] = set()
        wildcards: list[tuple[str, int | None]] = []
        addresses: set[tuple[Address, int | None]] = set()
        any_name = False
        entries = [e.strip() for e in setting.split(",") if e.strip()]
        expanded = [p for e in entries for p in (PUBLIC_REGISTRIES if e == "public" else (e,))]
        for entry in expanded:
            text = entry.removesuffix("/")
            if text == "*":
                any_name = True
                continue
            wildcard = text.startswith("*.")
            try:
                host = parse_registry_host(text[2:] if wildcard else text)
            except ValueError as exc:
                raise ValueError(f"allowed registry {entry!r}: {exc}") from exc
            if wildcard:
                if host.address is not None:
                    raise ValueError(f"allowed registry {entry!r}: a wildcard needs a name")
                wildcards.append((host.host, host.port))
            elif host.address is not None:
                addresses.add((host.address, host.port))
            else:
                hub = host.host in _HUB_ALIASES and host.port is None
                names.add((DOCKER_HUB if hub else host.host, host.port))
        return cls(frozenset(names), tuple(wildcards), frozenset(addresses), any_name)

    def listed_names(self) -> list[str]:
        """The names and wildcards allowed, for error details (addresses an operator
        lists for a private registry are not shown)."""
        out = [RegistryHost(h, p, None).text for h, p in sorted(self.names, key=str)]
        out += ["*." + RegistryHost(h, p, None).text for h, p in self.wildcards]
        return out + (["*"] if self.any_name else [])

    def allows(self, registry: RegistryHost) -> bool:
        """Whether images may come from ``registry``. Addresses and ``localhost`` names
        only by an exact entry; other names by an entry or a wildcard."""
        if registry.address is not None:
            return (registry.address, registry.port) in self.addresses
        key = (registry.host, registry.port)
        if key in self.names:
            return True
        if registry.loopback_name:
            return False
        if self.any_name:
            return True
        return any(
            port == registry.port and registry.host.endswith("." + suffix)
            for suffix, port in self.wildcards
        )


def check_image(reference: str, policy: RegistryPolicy, field: str) -> ImageRef:
    """The parsed reference when its registry is allowed. Raises ValidationFailed
    naming ``field`` for a malformed reference or a registry the policy refuses
    (``details.registry`` says which)."""
    try:
        ref = parse_image_ref(reference)
    except ValueError as exc:
        raise ValidationFailed(
            field, f"not a valid image reference ([REGISTRY/]NAME[:TAG][@DIGEST]): {exc}"
        ) from exc
    if not policy.allows(ref.registry):
        registry = ref.registry
        if registry.address is not None or registry.loopback_name:
            why = "is an address or a localhost name, which this installation does not pull from"
        else:
            why = "is not on this installation's list of allowed registries"
        raise ValidationFailed(
            field,
            f"registry {registry.text!r} {why}",
            {"registry": registry.text, "allowed_registries": policy.listed_names()},
        )
    return ref
