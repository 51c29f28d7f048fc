"""The ``Idempotency-Key`` request header, declared once for every create route that
accepts it (so OpenAPI documents it the same way everywhere)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header

from gpuyard.services.idempotency import HEADER, MAX_KEY_LENGTH

DESCRIPTION = (
    f"Makes the create safe to retry: 1..{MAX_KEY_LENGTH} printable ASCII characters, "
    "chosen by the client (a UUID is a good choice). A retry with the same key and the "
    "same body answers the resource the first request made (header "
    "`Idempotent-Replayed: true` on REST and training answers) and never places twice; "
    "the same key with another body answers 422 IDEMPOTENCY_KEY_REUSED. Keys are "
    "per account and route, and expire after GPUYARD_IDEMPOTENCY_TTL_HOURS (24 h)."
)

# Declared as a plain optional string: the service validates it (services/idempotency.py)
# so a bad key is answered in each surface's own envelope. OpenAPI still states the rule
# (json_schema_extra documents without validating); HTTP strips a value's outer blanks,
# so the pattern keeps them out.
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias=HEADER,
        description=DESCRIPTION,
        json_schema_extra={
            "minLength": 1,
            "maxLength": MAX_KEY_LENGTH,
            "pattern": f"^[!-~]([ -~]{{0,{MAX_KEY_LENGTH - 2}}}[!-~])?$",
        },
    ),
]

# Set on an answer that replays an earlier request's resource.
REPLAYED_HEADER = "Idempotent-Replayed"
