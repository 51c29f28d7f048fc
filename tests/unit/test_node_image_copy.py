"""Copying the node image to a host (runtimes/slurm/node_image_copy.py) against stand-in
engines: once per host and image version, a stale version replaced, a clear error when
no engine has the image, progress told. The real save and load run in
tests/e2e/test_node_image_copy.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.slurm.node_image_copy import ensure_node_image, forget_node_image

IMAGE = "localhost/gpuyard/slurm-node:latest"


class Api:
    """The Engine API calls the copy makes: images by name -> (id, archive bytes)."""

    def __init__(self, images: dict[str, tuple[str, bytes]] | None = None) -> None:
        self.images = dict(images or {})
        self.saves = 0
        self.loads: list[bytes] = []

    def inspect_image(self, name: str) -> dict[str, Any]:
        if name not in self.images:
            raise docker.errors.ImageNotFound(f"no such image: {name}")
        return {"Id": self.images[name][0]}

    def get_image(self, name: str, chunk_size: int) -> Iterator[bytes]:
        self.saves += 1
        data = self.images[name][1]
        for i in range(0, len(data), 3):
            yield data[i : i + 3]

    def load_image(self, data: Any) -> Iterator[dict[str, str]]:
        body = b"".join(iter(data))
        assert len(data) == len(body)  # the request's Content-Length
        self.loads.append(body)
        image_id, name = body.decode().split(" ", 1)
        self.images[name] = (image_id, body)
        yield {"stream": f"Loaded image: {name}"}


class Client:
    def __init__(self, api: Api) -> None:
        self.api = api


def engine(api: Api) -> Engine:
    return Engine("unix:///run/gpuyard-test/none.sock", 30, client=Client(api))


def archive(image_id: str) -> bytes:
    return f"{image_id} {IMAGE}".encode()


def test_a_host_without_the_image_gets_it_once() -> None:
    here = Api({IMAGE: ("sha256:v1", archive("sha256:v1"))})
    there = Api()
    source, target = engine(here), engine(there)
    said: list[str] = []
    assert ensure_node_image(target, source, IMAGE, said.append)
    assert there.images[IMAGE][0] == "sha256:v1" and there.loads == [archive("sha256:v1")]
    assert said[0] == f"copying image {IMAGE} to the host: saving it here"
    assert said[-1] == f"copying image {IMAGE} to the host: 0 of 1 MB"
    assert not ensure_node_image(target, source, IMAGE, said.append)
    assert here.saves == 1
    # Another engine object for the same host finds the same version there.
    assert not ensure_node_image(engine(there), source, IMAGE)
    assert here.saves == 1


def test_a_new_version_here_is_copied_again() -> None:
    here = Api({IMAGE: ("sha256:v1", archive("sha256:v1"))})
    there = Api({IMAGE: ("sha256:v0", archive("sha256:v0"))})  # an older build
    source, target = engine(here), engine(there)
    assert ensure_node_image(target, source, IMAGE)
    assert there.images[IMAGE][0] == "sha256:v1"
    here.images[IMAGE] = ("sha256:v2", archive("sha256:v2"))  # rebuilt here
    assert ensure_node_image(target, source, IMAGE)
    assert there.images[IMAGE][0] == "sha256:v2" and here.saves == 2


def test_an_image_removed_from_the_host_is_copied_after_forgetting() -> None:
    here = Api({IMAGE: ("sha256:v1", archive("sha256:v1"))})
    there = Api()
    source, target = engine(here), engine(there)
    assert ensure_node_image(target, source, IMAGE)
    del there.images[IMAGE]
    assert not ensure_node_image(target, source, IMAGE)  # remembered: no engine call
    forget_node_image(target, IMAGE)
    assert ensure_node_image(target, source, IMAGE) and IMAGE in there.images


def test_an_image_only_the_host_has_is_used_and_one_nobody_has_is_an_error() -> None:
    there = Api({IMAGE: ("sha256:theirs", b"")})
    assert not ensure_node_image(engine(there), engine(Api()), IMAGE)
    with pytest.raises(RuntimeFailure, match="neither on the host nor on this machine"):
        ensure_node_image(engine(Api()), engine(Api()), IMAGE)
