"""Long-lived answers (the web terminal, log streams) re-check their caller while they
are open: :func:`access_ended` returns once the API key they were opened with may no
longer read or write the cluster (the key revoked, the membership removed, the role
or the projects narrowed; services/tenancy/cluster_access.py), and the stream then closes.
"""

from __future__ import annotations

import asyncio
import logging

from gpuyard.api.state import AppState
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.cluster_access import Need, key_still_may_access

log = logging.getLogger(__name__)

# How often an open stream asks; a removed member's stream ends within about this.
ACCESS_CHECK_S = 2.0
ACCESS_ENDED_REASON = "access ended: this API key may no longer use the cluster"


async def access_ended(
    state: AppState,
    principal: Principal,
    cluster_id: str,
    need: Need,
    interval_s: float = ACCESS_CHECK_S,
) -> str:
    """Check every ``interval_s`` and return (with the reason to show) once the
    caller's access is gone. A failed read (the store is down) is not an ending: the
    next check asks again. Cancel it when the stream ends for another reason."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            allowed = await state.reads.run(
                key_still_may_access, state.ctx, principal, cluster_id, need
            )
        except Exception:
            log.warning("checking the access of a stream on %s failed", cluster_id, exc_info=True)
            continue
        if not allowed:
            return ACCESS_ENDED_REASON
