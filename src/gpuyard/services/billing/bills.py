"""The caller's bill (``GET /v1/billing``): what its account, or one project of it, was
billed in a window; a key or member restricted to some projects sees only theirs."""

from __future__ import annotations

from datetime import datetime

from gpuyard.services.billing.metering import Bill, GroupBy, bill
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal


def caller_bill(
    ctx: Context,
    principal: Principal,
    project_id: int | None,
    from_: datetime,
    to: datetime,
    group_by: GroupBy,
    now: datetime,
) -> Bill:
    """The acting account's bill in ``[from_, to)`` (open intervals clipped to
    ``now``), of ``project_id`` when given, within the projects the caller may use.
    Raises as metering.bill (NotFound for a project of another account)."""
    with ctx.read() as session:
        return bill(
            session,
            principal.account_id,
            project_id,
            from_,
            to,
            group_by,
            now,
            projects=principal.project_ids,
        )
