"""Which host ports something on the engine's host holds, asked of the host itself.

A port gpuyard hands out must be free on the host, not only free among its own
clusters: another installation's containers, any process, a port published outside
gpuyard may hold it. Two answers are joined:

- the engine's published ports: every container's (any owner's, running or not: a
  created container claims its port when it starts);
- the host's listening sockets (``ss``), run over the host's SSH connection for a
  remote host, in this machine's shell for a local engine. A ``tcp://`` engine has no
  way to run a command there: only the engine's answer counts.

The answer is a snapshot, never a promise: a program may bind a port a moment later.
The start path therefore also moves on when the engine still meets "address already
in use" (reconciler/clusters/port_moves.py). Failures to ask give an empty answer, never an
error: the start's own collision handling is the backstop.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable

from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.hosts.firewall import Runner, subprocess_runner

log = logging.getLogger(__name__)

HostPort = tuple[int, str]  # (port, "tcp" | "udp")

# The port at the end of an ``ss`` local address: 0.0.0.0:22, [::]:22, *:22, 127.0.0.1%lo:53.
_SS_PORT = re.compile(r":(\d+)$")


def listening_ports(output: str, transport: str | None = None) -> set[HostPort]:
    """The ports in ``ss -H -l -n`` output (one socket a line). With ``transport`` the
    output is of one transport (``-t`` or ``-u``: the local address in the fourth
    column); without, of both (``-t -u``: a first column names each line's transport,
    ``tcp`` or ``udp``, and the local address is the fifth)."""
    found: set[HostPort] = set()
    for line in output.splitlines():
        fields = line.split()
        if transport is None:
            if len(fields) < 5 or fields[0] not in ("tcp", "udp"):
                continue
            kind, local = fields[0], fields[4]
        else:
            if len(fields) < 4:
                continue
            kind, local = transport, fields[3]
        match = _SS_PORT.search(local)
        if match:
            found.add((int(match.group(1)), kind))
    return found


def published_ports(containers: Iterable[dict[str, object]], skip_name: str) -> set[HostPort]:
    """The host ports the engine's containers publish (the list-containers answer),
    except those of the container named ``skip_name`` (the one being started: its old
    self holds its own ports)."""
    found: set[HostPort] = set()
    for item in containers:
        names = [str(n).lstrip("/") for n in item.get("Names") or []]  # type: ignore[attr-defined]
        if skip_name in names:
            continue
        for port in item.get("Ports") or []:  # type: ignore[attr-defined]
            public = port.get("PublicPort")
            if public:
                found.add((int(public), str(port.get("Type") or "tcp")))
    return found


def host_runner_of(engine: Engine) -> Runner | None:
    """How to run a command on the engine's host: its own runner (SSH for a remote
    host), else this machine's shell for a local (unix socket) engine, else None."""
    runner = engine.host_runner
    if runner is not None:
        return runner
    url = engine.base_url or ""
    return subprocess_runner if not url or url.startswith("unix:") else None


def ports_in_use(engine: Engine, low: int, high: int, skip_container: str) -> frozenset[HostPort]:
    """The ports in ``low..high`` that something on the engine's host holds now.

    This runs on every start, so its two questions are asked at once: the host's
    listening sockets (one ``ss`` for both transports, in a thread) while the engine
    lists its containers."""
    found: set[HostPort] = set()
    runner = host_runner_of(engine)
    listed: list[set[HostPort]] = []

    def ask_host() -> None:
        assert runner is not None
        result = runner(["ss", "-H", "-l", "-n", "-t", "-u"])
        if result.returncode == 0:
            listed.append(listening_ports(result.output))
        else:
            log.debug("cannot list the host's listening ports: %s", result.output[:200])

    asker = threading.Thread(target=ask_host, name="host-ports", daemon=True)
    if runner is not None:
        asker.start()
    try:
        found |= published_ports(engine.api.containers(all=True), skip_container)
    except Exception as exc:  # any transport or engine error: the start is the backstop
        log.debug("cannot list the engine's published ports: %s", exc)
    if runner is not None:
        asker.join()
    for ports in listed:
        found |= ports
    return frozenset(p for p in found if low <= p[0] <= high)
