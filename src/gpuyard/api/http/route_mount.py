"""Routers' routes added to the app as they are, analysed once per process.

``FastAPI.include_router`` (0.165) keeps a reference to the router and, for each app,
builds its own copy of every route the first time a request walks past it: the
dependency analysis again (pydantic adapters for every parameter), 100-400 ms of CPU
on the first requests of each app built here, and a look at every included router's
version on each request after. A router made with ``APIRouter(prefix=..., tags=...)``
has done all of that already when its decorators ran: each of its routes is complete
(the prefix, tags and responses in it). :func:`mount_routes` puts those same route
objects in the app's route list, as ``@app.get`` would, so nothing is analysed twice
and matching walks plain routes. Only for an inclusion with nothing of its own (no
prefix, tags, dependencies or responses given at the inclusion), which is every
inclusion of the app's routers (none has start-up handlers or a lifespan of its own).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI


def mount_routes(app: FastAPI, router: APIRouter) -> None:
    """Add ``router``'s routes (in its order, after the app's) to ``app``, as
    ``app.include_router(router)`` would route them."""
    app.router.routes.extend(router.routes)
