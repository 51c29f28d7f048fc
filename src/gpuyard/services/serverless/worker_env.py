"""The environment of a serverless worker's container: RunPod's, pointing at gpuyard,
so an unmodified ``runpod.serverless.start({"handler": f})`` takes and answers jobs.

The SDK substitutes ``$ID`` (the worker's id in the job-take URL, the job's in the
others) and ``$RUNPOD_POD_ID`` (the worker's id), then appends ``&isStream=...``,
``&batch_size=...`` and ``&job_in_progress=...``; so every URL already holds a ``?``.
The job-stop channel the SDK derives from the job-take URL (``/job-take/`` ->
``/job-stop/``) is served too. The paths are the worker routes of
api/runpod_v2/serverless_workers.py.
"""

from __future__ import annotations

WORKER_ROUTES_PREFIX = "/runpod/v2/workers"


def worker_environment(
    base_url: str, endpoint_id: str, worker_id: str, key: str, ping_interval_ms: int = 10_000
) -> dict[str, str]:
    """RunPod's worker variables for worker ``worker_id`` of ``endpoint_id`` holding
    ``key``, with gpuyard at ``base_url`` (``http://10.88.0.1:8000``, as the container
    reaches it)."""
    root = f"{base_url.rstrip('/')}{WORKER_ROUTES_PREFIX}/{endpoint_id}"
    return {
        "RUNPOD_WEBHOOK_GET_JOB": f"{root}/job-take/$ID?protocol=1",
        "RUNPOD_WEBHOOK_POST_OUTPUT": f"{root}/job-done/$RUNPOD_POD_ID/$ID?protocol=1",
        "RUNPOD_WEBHOOK_POST_STREAM": f"{root}/job-stream/$RUNPOD_POD_ID/$ID?protocol=1",
        "RUNPOD_WEBHOOK_PING": f"{root}/ping/$RUNPOD_POD_ID?protocol=1",
        "RUNPOD_AI_API_KEY": key,
        "RUNPOD_POD_ID": worker_id,
        "RUNPOD_POD_HOSTNAME": worker_id,
        "RUNPOD_ENDPOINT_ID": endpoint_id,
        "RUNPOD_PING_INTERVAL": str(ping_interval_ms),
        # The SDK's start-up checks reach 8.8.8.8 and want 4 GB of memory: an offline
        # fleet or a small worker would exit before taking a job.
        "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true",
    }
