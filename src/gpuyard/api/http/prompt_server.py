"""uvicorn's server, ending as soon as it is asked to and its connections are gone.

uvicorn notices an exit request on a 0.1 s tick of its main loop, and its shutdown
sleeps 0.1 s after asking each connection to close before it waits for them (in 0.1 s
steps): a server with nothing in flight takes about 0.2 s to stop. A test run starts
and stops hundreds of servers, and a rolling restart waits on each stop, so
:class:`PromptServer` is woken by the request itself (:meth:`request_exit`, or the
signal uvicorn handles) and waits for its connections and tasks in short steps instead.
What a shutdown does is unchanged: stop accepting, ask every connection to close, wait
for them and for background tasks (up to ``timeout_graceful_shutdown``), then the
application's lifespan shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from types import FrameType

import uvicorn

log = logging.getLogger("uvicorn.error")

# How often the main loop refreshes the Date header when nothing wakes it (uvicorn
# refreshes it once a second), and how often a shutdown looks at what is in flight.
_TICK_S = 1.0
_SETTLE_POLL_S = 0.005


class PromptServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose exit request wakes its main loop at once (see module)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_asked: asyncio.Event | None = None

    def request_exit(self) -> None:
        """Ask the server to shut down; from any thread."""
        self.should_exit = True
        self._wake()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._wake()

    def _wake(self) -> None:
        loop, event = self._loop, self._exit_asked
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed already
                loop.call_soon_threadsafe(event.set)

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._exit_asked = asyncio.Event()
        # on_tick refreshes the Date header on every tenth count and answers whether
        # to exit; each wait here stands for ten of uvicorn's 0.1 s ticks.
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_asked.wait(), _TICK_S)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        log.info("Shutting down")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                await self._settle()
        except TimeoutError:
            log.error(
                "Cancel %s running task(s), timeout graceful shutdown exceeded",
                len(self.server_state.tasks),
            )
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _settle(self) -> None:
        """Wait until no connection is open and no background task runs (or a second
        signal forces the exit), then until the listeners have closed."""
        state = self.server_state
        while (state.connections or state.tasks) and not self.force_exit:
            await asyncio.sleep(_SETTLE_POLL_S)
        for server in self.servers:
            await server.wait_closed()
