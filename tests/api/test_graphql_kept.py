"""A GraphQL query polled by many clients runs once: its answer is kept in the view
cache (api/fast/view_cache.py) per key and document, forgotten at any write of the
process, and never given to another key or for a mutation. Real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_accounts import invite_and_accept, new_account
from tests.helpers import LiveServer, live_server, make_settings

NAMES = "{ myself { id clusters { id name desiredStatus } } }"
CLUSTER = {
    "gpu_type": "NVIDIA RTX A6000",
    "gpu_count": 1,
    "docker_image": "localhost/gpuyard/busybox:latest",
    "volume_gb": 1,
}


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path / "home"), FakeRuntime()) as srv:
        # Kept for as long as nothing changes, whatever the machine's speed.
        srv.server.app.state.gpuyard.queries.max_age_s = 600.0
        yield srv


def names(body: dict[str, Any]) -> list[str]:
    assert "errors" not in body, body
    return sorted(c["name"] for c in body["data"]["myself"]["clusters"])


def test_a_kept_answer_shows_a_write_at_once(kept: LiveServer) -> None:
    with kept.client() as c:
        assert c.post("/v1/clusters", json={"name": "a", **CLUSTER}).status_code == 201
        assert names(kept.graphql(NAMES)) == ["a"]
        assert names(kept.graphql(NAMES)) == ["a"]  # kept
        assert c.post("/v1/clusters", json={"name": "b", **CLUSTER}).status_code == 201
        assert names(kept.graphql(NAMES)) == ["a", "b"]
    # A mutation runs every time, kept or not, and its write shows in the next query.
    mutation = (
        'mutation { podRentInterruptable(input: {gpuTypeId: "NVIDIA RTX A6000", '
        'gpuCount: 1, bidPerGpu: 5, imageName: "localhost/gpuyard/busybox:latest", '
        'name: "spot", volumeInGb: 1}) { id } }'
    )
    first, second = kept.graphql(mutation), kept.graphql(mutation)
    assert "errors" not in first and "errors" not in second, (first, second)
    assert (
        first["data"]["podRentInterruptable"]["id"] != second["data"]["podRentInterruptable"]["id"]
    )
    assert names(kept.graphql(NAMES)) == ["a", "b", "spot", "spot"]


def test_a_kept_answer_is_the_callers_own(kept: LiveServer) -> None:
    acme = new_account(kept, "acme", "owner@acme.test")
    owner = acme["api_key"]["key"]
    teammate = invite_and_accept(kept, owner, acme["account"]["id"], "dev@acme.test", "member")
    with kept.client(owner) as c:
        assert c.post("/v1/clusters", json={"name": "ours", **CLUSTER}).status_code == 201
    # One account, two users: the same document answers each user's own ``myself``.
    mine = kept.graphql(NAMES, key=owner)
    theirs = kept.graphql(NAMES, key=teammate["api_key"]["key"])
    assert names(mine) == names(theirs) == ["ours"]
    assert theirs["data"]["myself"]["id"] != mine["data"]["myself"]["id"]
    # Another account: its own clusters.
    assert names(kept.graphql(NAMES)) == []
