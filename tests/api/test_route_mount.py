"""The app routes its routers' own route objects (api/http/route_mount.py): nothing is
copied or analysed again per app, every router's paths answer, and the OpenAPI
document describes the same operations the routers declare."""

from __future__ import annotations

from fastapi.routing import APIRoute

from gpuyard.api import runpod_v2
from gpuyard.api.rest import clusters
from tests.helpers import LiveServer


def test_the_app_routes_the_routers_own_routes(srv: LiveServer) -> None:
    app = srv.server.app
    ours = {id(route) for route in app.router.routes}
    for router in (clusters.router, *runpod_v2.routers()):
        assert router.routes
        assert all(id(route) in ours for route in router.routes)
    with srv.client() as c:
        assert c.get("/v1/clusters").status_code == 200
        assert c.get("/runpod/v2/pods").status_code == 200
        assert c.get("/healthz").status_code == 200
        assert c.get("/v1/no-such-thing").status_code == 404


def test_the_openapi_document_has_every_declared_operation(srv: LiveServer) -> None:
    with srv.client() as c:
        doc = c.get("/openapi.json").json()
    documented = {(path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
    declared = {
        (route.path, method)
        for router in (clusters.router, *runpod_v2.routers())
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods
    }
    assert declared and declared <= documented, declared - documented
