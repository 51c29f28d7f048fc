"""Hanging up a shell's processes in a container, as closing a terminal window does.

Engines leave an exec's processes running when its stream is dropped (Docker and Podman
alike: the PTY does not hang up), so the web terminal (edge/terminal_bridge.py) and the
SSH gateway's exec sessions (edge/ssh_exec.py) send SIGHUP, then SIGCONT, to them through
a second exec, whose script each of them writes (which processes are the session's).
A loaded engine may fail or be slow to start that exec: it is tried again, within a
bound, because a shell left running would outlive its terminal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpuyard.edge.exec_pty import ContainerNotRunning, ExecError, ExecSession

log = logging.getLogger(__name__)

# How long a hang-up may take, its retries included, and the pause between tries.
HANGUP_TIMEOUT_S = 30.0
HANGUP_RETRY_S = 0.5


async def hang_up(
    open_exec: Callable[[], ExecSession],
    container: str,
    script: str,
    *,
    what: str,
    retry_s: float = HANGUP_RETRY_S,
    timeout_s: float = HANGUP_TIMEOUT_S,
) -> bool:
    """Run the sh ``script`` in ``container`` to its end through an exec from
    ``open_exec``, trying again while the engine fails it, for up to ``timeout_s``.
    True when it ran, or the container no longer runs (its processes went with it);
    False, logged with ``what``, when it could not be done. Never raises an
    Exception."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    async with open_exec() as killer:
                        await killer.start(container, ("/bin/sh", "-c", script), tty=False)
                        while await killer.read():
                            pass
                    return True
                except ContainerNotRunning:
                    return True
                except (ExecError, OSError) as exc:
                    log.info("hang-up of %s failed, trying again: %r", what, exc)
                    await asyncio.sleep(retry_s)
    except Exception as exc:  # the bound passed, or an engine surprise
        log.warning("could not hang up %s in %s: %r", what, container, exc)
        return False
