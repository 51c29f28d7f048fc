"""How the engine's answers to racing callers are read (runtimes/engine.py)."""

from __future__ import annotations

import docker.errors
import requests

from gpuyard.runtimes.engine import lost_creation_race, vanished_mid_removal


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
