"""JSON bodies above OFF_LOOP_BYTES are parsed on a worker thread, smaller ones in
place; every API router that parses a pydantic body does it that way."""

from __future__ import annotations

import asyncio
import importlib
import json
import pkgutil
import threading
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import BaseModel

import gpuyard.api
from gpuyard.api.http.json_body import OFF_LOOP_BYTES, OffLoopJsonRequest, OffLoopJsonRoute, loads


class Recorder:
    """A parser that notes the thread it ran on."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def __call__(self, raw: bytes | str) -> Any:
        self.threads.append(threading.get_ident())
        return json.loads(raw)


def test_loads_moves_large_bodies_off_the_loop() -> None:
    parse = Recorder()

    async def main() -> int:
        small = b'{"a": 1}'
        large = json.dumps({"a": "x" * OFF_LOOP_BYTES}).encode()
        assert await loads(small, parse) == {"a": 1}
        assert (await loads(large, parse))["a"] == "x" * OFF_LOOP_BYTES
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert parse.threads[0] == loop_thread
    assert parse.threads[1] != loop_thread


def test_loads_raises_what_json_raises() -> None:
    async def main(raw: bytes) -> Any:
        return await loads(raw)

    for raw in (b"{", b"[" + b" " * OFF_LOOP_BYTES):
        try:
            asyncio.run(main(raw))
        except ValueError:
            continue
        raise AssertionError(f"{raw[:10]!r} parsed")


class Body(BaseModel):
    text: str


def test_route_class_parses_pydantic_bodies_by_size() -> None:
    parse = Recorder()

    class Recording(OffLoopJsonRequest):
        pass

    Recording.parse = staticmethod(parse)  # type: ignore[method-assign, assignment]

    class Route(OffLoopJsonRoute):
        request_class = Recording

    router = APIRouter(route_class=Route)
    handler_threads: list[int] = []

    @router.post("/echo")
    async def echo(body: Body) -> dict[str, int]:
        handler_threads.append(threading.get_ident())  # an async handler: the loop
        return {"length": len(body.text)}

    app = FastAPI()
    app.include_router(router)
    with TestClient(app) as client:
        assert client.post("/echo", json={"text": "hi"}).json() == {"length": 2}
        big = "y" * (2 * OFF_LOOP_BYTES)
        assert client.post("/echo", json={"text": big}).json() == {"length": len(big)}
        broken = client.post("/echo", content=b"{", headers={"content-type": "application/json"})
        assert broken.status_code == 422  # FastAPI's own answer to a JSON decode error
    assert parse.threads[0] == handler_threads[0]
    assert parse.threads[1] != handler_threads[1]


def test_every_api_router_with_a_body_parses_it_off_the_loop() -> None:
    checked = 0
    for info in pkgutil.walk_packages(gpuyard.api.__path__, "gpuyard.api."):
        module = importlib.import_module(info.name)
        router = getattr(module, "router", None)
        if not isinstance(router, APIRouter):
            continue
        for route in router.routes:
            if isinstance(route, APIRoute) and route.body_field is not None:
                assert isinstance(route, OffLoopJsonRoute), f"{info.name}: {route.path}"
                checked += 1
    assert checked >= 8  # clusters, projects, ssh keys, images, security groups
