"""RunPod's REST API v2, served under ``/runpod/v2`` (api/http/problems.py).

RunPod's paths and JSON after the prefix, so clients written against
``https://api.runpod.io/v2`` work with the base URL changed. Errors are RFC 9457
problem details (the app's exception handlers choose them by path); keys are the
account's API keys as ``Authorization: Bearer``, scoped as everywhere else
(api/http/permissions.py). Each resource is one module here; :func:`build_router`
mounts them all.
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


def build_router() -> APIRouter:
    """Every v2 route; each module's router carries ``RUNPOD_V2_PREFIX`` itself
    (common.py ``v2_router``). Serverless workers' routes come first and the job
    routes (``/{endpoint_id}/...``) last, after every collection's: an endpoint id is
    never a collection's name."""
    router = APIRouter()
    router.include_router(serverless_workers_router)
    router.include_router(pods_router)
    router.include_router(templates_router)
    router.include_router(registries_router)
    router.include_router(network_volumes_router)
    router.include_router(ssh_keys_router)
    router.include_router(catalog_router)
    router.include_router(clusters_router)
    router.include_router(serverless_jobs_router)
    return router
