"""How the engine's answers to racing callers are read (runtimes/engines/engine.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest
import requests

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import Engine, lost_creation_race, vanished_mid_removal


def api_error(status: int, explanation: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    error_class = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return error_class("engine answer", response=response, explanation=explanation)


def test_a_container_removed_while_inspected_counts_as_gone() -> None:
    podman = "container 1133c9 does not exist in database: no such container"
    assert vanished_mid_removal(api_error(500, podman))
    assert vanished_mid_removal(api_error(404, "No such container: x"))


def test_other_engine_failures_are_not_taken_for_a_removal() -> None:
    assert not vanished_mid_removal(api_error(500, "database is locked"))
    assert not vanished_mid_removal(api_error(409, "container is running"))


def test_a_create_lost_to_a_concurrent_one_is_told_apart() -> None:
    assert lost_creation_race(api_error(409, "Conflict"))
    assert lost_creation_race(api_error(500, "volume with name v already exists"))
    assert lost_creation_race(api_error(500, "name v is in use"))
    assert not lost_creation_race(api_error(500, "no space left on device"))


class RacingApi:
    """The SDK's low-level client, answering each inspect with the next of ``answers``
    (an exception is raised; the last answer repeats)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.inspects = 0
        self.stopped: list[str] = []

    def inspect_container(self, name: str) -> dict[str, Any]:
        self.inspects += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        result: dict[str, Any] = answer
        return result

    def stop(self, name: str, timeout: int) -> None:
        self.stopped.append(name)
        raise api_error(500, f"container {name} does not exist in database: no such container")


def engine_with(api: RacingApi) -> Engine:
    engine = Engine(None, owner=Ownership.new(), client=SimpleNamespace(api=api))
    engine.vanish_confirm_s = 0.3
    return engine


REMOVING = "container 1133c9 does not exist in database: no such container"


def test_a_container_being_removed_is_gone_once_a_404_confirms_it() -> None:
    api = RacingApi(api_error(500, REMOVING), api_error(500, REMOVING), api_error(404, "gone"))
    assert engine_with(api).inspect_container("gy-x") is None
    assert api.inspects == 3


def test_a_name_that_keeps_answering_no_such_container_is_an_error() -> None:
    """Podman's leftover name after an unclean shutdown: not taken for a missing one."""
    engine = engine_with(RacingApi(api_error(500, REMOVING)))
    with pytest.raises(RuntimeFailure):
        engine.inspect_container("gy-x")


def test_stopping_a_container_that_is_being_removed_is_done() -> None:
    api = RacingApi({})
    engine_with(api).stop_container("gy-x", 5)  # no error: it is gone, as asked
    assert api.stopped == ["gy-x"]


class RemovingApi:
    """The SDK's low-level client, answering each removal with the next of ``answers``
    (None: removed; an exception is raised; the last answer repeats)."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)
        self.removals = 0

    def remove_container(self, name: str, v: bool, force: bool) -> None:
        self.removals += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is not None:
            raise answer


IN_PROGRESS = "container 1133c9 is being removed: removal already in progress"


def test_a_removal_another_caller_began_is_waited_for_until_the_container_is_gone() -> None:
    # The other removal ends; ours is then told the container is gone.
    api = RemovingApi(api_error(500, IN_PROGRESS), api_error(500, IN_PROGRESS), api_error(404, "x"))
    engine = Engine(None, owner=Ownership.new(), client=SimpleNamespace(api=api))
    engine.remove_container("gy-x", checked=True)
    assert api.removals == 3


def test_a_removal_another_caller_began_and_failed_is_done_again() -> None:
    api = RemovingApi(api_error(500, IN_PROGRESS), None)
    engine = Engine(None, owner=Ownership.new(), client=SimpleNamespace(api=api))
    engine.remove_container("gy-x", checked=True)
    assert api.removals == 2


def test_a_removal_that_stays_in_progress_is_a_failure() -> None:
    api = RemovingApi(api_error(500, IN_PROGRESS))
    engine = Engine(None, owner=Ownership.new(), client=SimpleNamespace(api=api))
    engine.removal_wait_s = 0.3
    with pytest.raises(RuntimeFailure):
        engine.remove_container("gy-x", checked=True)
