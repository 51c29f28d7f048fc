"""edge/hang_up.py: a hang-up is tried again while the engine fails its exec, within a
bound, and never raises."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuyard.edge.exec_pty import ExecError
from gpuyard.edge.hang_up import hang_up


class FailingExec:
    """An exec whose start always fails, counting the tries."""

    tries = 0

    async def __aenter__(self) -> FailingExec:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def start(self, container: str, argv: tuple[str, ...], tty: bool) -> None:
        FailingExec.tries += 1
        raise ExecError("the engine is busy")


def test_an_engine_that_keeps_failing_is_given_up_on_within_the_bound() -> None:
    FailingExec.tries = 0

    def open_exec() -> Any:
        return FailingExec()

    done = asyncio.run(
        hang_up(open_exec, "c", "true", what="a test session", retry_s=0.01, timeout_s=2)
    )
    assert done is False
    assert FailingExec.tries > 1  # tried again before giving up
