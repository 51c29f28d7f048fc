"""The v2 contract checker (tests/contract/runpod_v2.py) fails what RunPod's document
forbids: a missing required member, a wrong type, a value outside an enum."""

from __future__ import annotations

import pytest

from tests.contract.runpod_v2 import check_answer, check_component

PROBLEM = {"title": "Not Found", "status": 404, "detail": "pod x not found", "errors": []}


def test_a_problem_document_passes_and_a_v1_envelope_fails() -> None:
    check_answer("GET", "/v2/pods/{id}", 404, {**PROBLEM, "type": "urn:x", "code": "NOT_FOUND"})
    with pytest.raises(AssertionError, match="required"):
        check_answer("GET", "/v2/pods/{id}", 404, {"success": False, "error": {}})


def test_types_and_enums_are_checked() -> None:
    check_component("PodStatus", "RUNNING")
    with pytest.raises(AssertionError, match="is not one of"):
        check_component("PodStatus", "running")
    with pytest.raises(AssertionError, match="is not of type"):
        check_component(
            "PodSshEndpoint", {"host": "h", "port": "22", "username": "root", "command": "ssh"}
        )


def test_an_operation_the_document_lacks_is_refused() -> None:
    with pytest.raises(AssertionError, match="not an operation"):
        check_answer("GET", "/v2/no-such", 200, {})
