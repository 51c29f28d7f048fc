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

from gpuyard.api.http.problems import RUNPOD_V2_PREFIX
from gpuyard.api.runpod_v2 import pods


def build_router() -> APIRouter:
    """Every v2 route, under ``RUNPOD_V2_PREFIX``."""
    router = APIRouter(prefix=RUNPOD_V2_PREFIX)
    router.include_router(pods.router)
    return router
