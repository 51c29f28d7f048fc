"""OpenAPI models of the quota routes: the body that sets limits and the answers.

Like api/rest/schemas/responses.py, responses forbid unknown fields and the API tests validate real
answers against them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, create_model, model_validator

from gpuyard.api.rest.schemas.responses import Meta, StrictOut
from gpuyard.core.billing.quotas import KEEP, MAX_LIMIT, LimitChange
from gpuyard.core.text import refuse_nul

# A limit: a whole number from 0 (nothing allowed) to MAX_LIMIT; null removes it.
LimitValue = Annotated[StrictInt, Field(ge=0, le=MAX_LIMIT)] | None
GpuTypeName = Annotated[str, Field(min_length=1, max_length=100, pattern="^[^\\u0000]+$")]


class SetQuotas(BaseModel):
    """New limits: a field sent as a number sets that limit, as null removes it, left
    out keeps it. ``gpus_by_type`` maps GPU types (id or display name, ``GET
    /v1/gpu-types``) to their own limits the same way."""

    model_config = ConfigDict(extra="forbid")

    gpus: LimitValue = None
    gpus_by_type: Annotated[dict[GpuTypeName, LimitValue], Field(max_length=64)] | None = None
    vcpus: LimitValue = None
    volume_gb: LimitValue = None
    snapshot_gb: LimitValue = None
    running_clusters: LimitValue = None

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return refuse_nul(data)

    def change(self) -> LimitChange:
        """The change this body asks (fields left out are kept)."""
        sent = self.model_fields_set

        def pick(name: str) -> Any:
            return getattr(self, name) if name in sent else KEEP

        return LimitChange(
            gpus=pick("gpus"),
            gpus_by_type=dict(self.gpus_by_type or {}),
            vcpus=pick("vcpus"),
            volume_gb=pick("volume_gb"),
            snapshot_gb=pick("snapshot_gb"),
            running_clusters=pick("running_clusters"),
        )


class QuotaLimits(StrictOut):
    """Limits (null: none)."""

    gpus: int | None
    gpus_by_type: dict[str, int]
    vcpus: int | None
    volume_gb: int | None
    snapshot_gb: int | None
    running_clusters: int | None


class QuotaUsage(StrictOut):
    """What is held now: GPUs and vCPUs of clusters holding capacity (and training
    nodes), volumes and network volumes in GB, snapshots' stored data in GB (rounded
    up), clusters holding capacity."""

    gpus: int
    gpus_by_type: dict[str, int]
    vcpus: int
    volume_gb: int
    snapshot_gb: int
    running_clusters: int


class ScopeQuotas(StrictOut):
    limits: QuotaLimits
    usage: QuotaUsage


class ProjectQuotas(ScopeQuotas):
    project_id: int
    name: str


class AccountQuotas(StrictOut):
    account_id: int
    account: ScopeQuotas
    projects: list[ProjectQuotas]


class QuotasSet(ScopeQuotas):
    """The limits and usage after a change, of the account (``project_id`` null) or
    of one project."""

    account_id: int
    project_id: int | None


def _envelope(name: str, data: Any) -> type[BaseModel]:
    return create_model(
        name,
        __base__=StrictOut,
        success=(Literal[True], ...),
        data=(data, ...),
        meta=(Meta, ...),
    )


AccountQuotasEnvelope = _envelope("AccountQuotasEnvelope", AccountQuotas)
QuotasSetEnvelope = _envelope("QuotasSetEnvelope", QuotasSet)
