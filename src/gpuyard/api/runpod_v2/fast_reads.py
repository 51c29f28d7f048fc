"""RunPod v2's polled reads on the cluster read fast path (api/fast/fastpath.py):
``GET /runpod/v2/pods/{id}`` answered without routing, and ``GET /runpod/v2/pods``
from a page its route kept. The body is RunPod's ``Pod`` (pod_views.py), errors RFC
9457 problems, exactly as the routes answer them."""

from __future__ import annotations

import re

from gpuyard.api.fast.fastpath import Surface, dumps
from gpuyard.api.http.problems import (
    PROBLEM_MEDIA_TYPE,
    RUNPOD_V2_PREFIX,
    detail_errors,
    problem_body,
)
from gpuyard.api.runpod_v2.pod_views import pod_json
from gpuyard.core.errors import GpuyardError


def _problem(exc: GpuyardError) -> bytes:
    return dumps(problem_body(exc.http_status, exc.code, exc.message, detail_errors(exc.details)))


def _as_is(data: bytes) -> bytes:
    return data


POD_READS = Surface("v2:", pod_json, _as_is, _problem, PROBLEM_MEDIA_TYPE.encode())
POD_LIST_PATH = RUNPOD_V2_PREFIX + "/pods"
# What the app gives the fast path (ClusterReadFastPath's ``more``).
FAST_READS = ((re.compile(re.escape(POD_LIST_PATH) + r"/([^/]+)"), POD_LIST_PATH, POD_READS),)
