"""RunPod's REST API v2, served under ``/runpod/v2`` (api/http/problems.py).

RunPod's paths and JSON after the prefix, so clients written against
``https://api.runpod.io/v2`` work with the base URL changed. Errors are RFC 9457
problem details (the app's exception handlers choose them by path); keys are the
account's API keys as ``Authorization: Bearer``, scoped as everywhere else
(api/http/permissions.py). Each resource is one module here; :func:`routers`
lists them all.
"""

from __future__ import annotations

from fastapi import APIRouter

from gpuyard.api.runpod_v2.catalog import router as catalog_router
from gpuyard.api.runpod_v2.clusters import router as clusters_router
from gpuyard.api.runpod_v2.network_volumes import router as network_volumes_router
from gpuyard.api.runpod_v2.pods import router as pods_router
from gpuyard.api.runpod_v2.registries import router as registries_router
from gpuyard.api.runpod_v2.serverless_jobs import router as serverless_jobs_router
from gpuyard.api.runpod_v2.serverless_workers import router as serverless_workers_router
from gpuyard.api.runpod_v2.ssh_keys import router as ssh_keys_router
from gpuyard.api.runpod_v2.templates import router as templates_router


def routers() -> tuple[APIRouter, ...]:
    """Every v2 router, in the order the app includes them; each module's router
    carries ``RUNPOD_V2_PREFIX`` itself (common.py ``v2_router``). Serverless workers'
    routes come first and the job routes (``/{endpoint_id}/...``) last, after every
    collection's: an endpoint id is never a collection's name.

    The app includes each one itself rather than one router holding them all: FastAPI
    analyses a nested router's every route again at each inclusion (its check of
    empty paths), ~40 ms of CPU per app built, while a router of plain routes is
    looked through at no cost."""
    return (
        serverless_workers_router,
        pods_router,
        templates_router,
        registries_router,
        network_volumes_router,
        ssh_keys_router,
        catalog_router,
        clusters_router,
        serverless_jobs_router,
    )
