"""Integer ids in REST paths (``/v1/ssh-keys/{ssh_key_id}``, ...), declared as what
they are: OpenAPI says ``integer, 1..MAX_ID``, and anything else (``abc``, ``1.5``,
``0``, twenty digits) is a 400 VALIDATION_ERROR naming the parameter before the
handler runs, so no out-of-range number ever reaches a query."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from gpuyard.services.clusters.requests import MAX_ID

IdPath = Annotated[int, Path(ge=1, le=MAX_ID, description=f"an integer id, 1..{MAX_ID}")]
