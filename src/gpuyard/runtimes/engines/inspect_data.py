"""What an engine's inspect and list answers say of a container: its state, when
it started, where its network reaches it (Docker and Podman answer alike)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuyard.runtimes.base import ContainerState, Observed

_ZERO_TIME_PREFIX = "0001-01-01"
_RUNNING_STATES = {"running", "paused", "restarting"}
_CREATED_STATES = {"created", "configured", "initialized"}


def parse_engine_time(value: str | None) -> int | None:
    """Engine timestamps (RFC 3339 with up to 9 fractional digits) as epoch ns."""
    if not value or value.startswith(_ZERO_TIME_PREFIX):
        return None
    text = value.strip().replace("Z", "+00:00")
    frac = ""
    if "." in text:
        head, rest = text.split(".", 1)
        digits = ""
        i = 0
        while i < len(rest) and rest[i].isdigit():
            digits += rest[i]
            i += 1
        tz = rest[i:]
        frac = digits[:9].ljust(9, "0")
        text = head + tz
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return int(dt.timestamp()) * 1_000_000_000 + (int(frac) if frac else 0)


def state_of(status: str) -> ContainerState:
    """The state an engine's status word (inspect ``State.Status``, list ``State``) means."""
    status = status.lower()
    if status in _RUNNING_STATES:
        return ContainerState.RUNNING
    if status in _CREATED_STATES:
        return ContainerState.CREATED
    return ContainerState.EXITED


def observed_of(info: dict[str, Any] | None) -> Observed:
    """The container an inspect answer ``info`` describes; MISSING for None (no such
    container)."""
    if info is None:
        return Observed(state=ContainerState.MISSING)
    state = info.get("State") or {}
    cstate = state_of(str(state.get("Status", "")))
    error = state.get("Error") or None
    if state.get("OOMKilled"):
        error = "out of memory: the container was OOM-killed"
    started = state.get("StartedAt")
    started_at = str(started) if started and not str(started).startswith("0001") else None
    exit_code = state.get("ExitCode") if cstate is ContainerState.EXITED else None
    return Observed(
        state=cstate,
        container_id=info.get("Id"),
        exit_code=int(exit_code) if exit_code is not None else None,
        error=str(error) if error else None,
        started_at=started_at,
        address=network_address(info),
    )


def network_address(info: dict[str, Any]) -> str | None:
    """The container's IP address on its (first) network, from an inspect answer."""
    settings = info.get("NetworkSettings") or {}
    for network in (settings.get("Networks") or {}).values():
        address = (network or {}).get("IPAddress")
        if address:
            return str(address)
    address = settings.get("IPAddress")
    return str(address) if address else None
