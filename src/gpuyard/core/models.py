"""Domain value objects shared by every layer.

These are validated pydantic models (API bodies reuse them) or frozen dataclasses;
loose dicts never cross a layer boundary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpuyard.core.input_rules import NAME_PATTERN

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_ENV_VALUE = 32 * 1024


class CloudType(StrEnum):
    SECURE = "SECURE"
    COMMUNITY = "COMMUNITY"
    ALL = "ALL"


class GpuSource(StrEnum):
    NVML = "nvml"
    DECLARED = "declared"


def _int_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(
        name for name, info in model.model_fields.items() if info.annotation in (int, int | None)
    )


def whole_floats_as_ints(model: type[BaseModel], data: Any) -> Any:
    """``data`` with a whole float (17.0) given for one of ``model``'s integer fields
    turned into the integer: JSON Schema counts it as one, and so do clients that write
    every number as a float. Strings and booleans stay for the strict check to refuse;
    the fields keep their plain integer schema."""
    if not isinstance(data, dict):
        return data
    ints = _int_fields(model)
    return {
        k: int(v) if k in ints and isinstance(v, float) and v.is_integer() else v
        for k, v in data.items()
    }


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PortSpec(StrictModel):
    """A port the cluster exposes. ``external_port`` 0 asks gpuyard to assign one."""

    # Strict: "8888" and true are not ports (core/input_rules.py: no coercion); 8888.0 is.
    @model_validator(mode="before")
    @classmethod
    def _whole_floats(cls, data: Any) -> Any:
        return whole_floats_as_ints(cls, data)

    internal_port: int = Field(ge=1, le=65535, strict=True)
    external_port: int = Field(default=0, ge=0, le=65535, strict=True)
    protocol: Literal["http", "tcp", "udp"] = "tcp"
    # Who may pass the HTTP proxy to an http port: the owner only, or anybody.
    visibility: Literal["private", "public"] = "private"
    # Input is held to NAME_PATTERN by the request models (services/clusters/requests.py), not
    # here: ports stored before that rule must still load.
    description: str = Field(
        default="", max_length=200, json_schema_extra={"pattern": NAME_PATTERN}
    )

    @property
    def transport(self) -> Literal["tcp", "udp"]:
        return "udp" if self.protocol == "udp" else "tcp"


# Bounds of every auto-termination value, shared by every surface. Each is a finite
# JSON number (not a boolean, not a string) greater than 0 and at most:
IDLE_MINUTES_MAX = 525_600.0  # a year
MAX_RUNTIME_HOURS_MAX = 8_760.0  # a year
COST_LIMIT_USD_MAX = 1_000_000.0


def _policy_bounds(maximum: float, unit: str) -> WrapValidator:
    """One message naming both bounds, whatever was wrong (type, NaN, range)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "policy_bounds",
                "must be a finite number greater than 0 and at most {maximum} ({unit})",
                {"maximum": f"{maximum:,.0f}", "unit": unit},
            ) from None

    return WrapValidator(check)


def _policy_number(maximum: float) -> Any:
    return Field(gt=0, le=maximum, strict=True, allow_inf_nan=False)


IdleMinutes = Annotated[
    float, _policy_number(IDLE_MINUTES_MAX), _policy_bounds(IDLE_MINUTES_MAX, "minutes")
]
MaxRuntimeHours = Annotated[
    float, _policy_number(MAX_RUNTIME_HOURS_MAX), _policy_bounds(MAX_RUNTIME_HOURS_MAX, "hours")
]
CostLimitUsd = Annotated[
    float, _policy_number(COST_LIMIT_USD_MAX), _policy_bounds(COST_LIMIT_USD_MAX, "USD")
]
AutoTerminateAction = Literal["stop", "terminate"]
# A training cluster is stopped (its Slurm state kept) or deleted.
TrainingAutoTerminateAction = Literal["stop", "delete"]


class PolicyRules(StrictModel):
    """The rules every auto-termination policy has, with their bounds: clusters' and
    training clusters' policies differ only in what ``action`` may be.

    Every value is bounded (the constants above) so no deadline can overflow and no
    stored policy can break a reader."""

    enabled: bool = Field(default=False, strict=True)
    idle_minutes: IdleMinutes | None = None
    cost_limit_usd: CostLimitUsd | None = None
    max_runtime_hours: MaxRuntimeHours | None = None


class AutoTerminatePolicy(PolicyRules):
    """When a cluster should stop itself (enforced by reconciler/duties/autoterminate.py);
    ``action`` is ``stop`` or ``terminate`` (null is refused, not read as the default)."""

    action: AutoTerminateAction = "stop"


class TrainingAutoTerminatePolicy(PolicyRules):
    """When a training cluster should stop itself (the same watcher,
    reconciler/training/autoterm.py); ``action`` is ``stop`` or ``delete``. Idle means
    no running or pending Slurm job."""

    action: TrainingAutoTerminateAction = "stop"


# Either kind of policy: what the deadline rules (core/autoterm.py) read.
AnyAutoTerminatePolicy = AutoTerminatePolicy | TrainingAutoTerminatePolicy


def validate_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}")
        if len(value) > MAX_ENV_VALUE:
            raise ValueError(f"environment variable {name!r} is longer than {MAX_ENV_VALUE}")
    return env


@dataclass(frozen=True)
class GpuTypeInfo:
    id: str
    display_name: str
    manufacturer: str
    memory_gb: int
    secure_price: float
    community_price: float
    secure_spot_price: float
    community_spot_price: float


@dataclass(frozen=True)
class HostGpu:
    index: int
    gpu_type: str
    uuid: str | None = None


@dataclass(frozen=True)
class HostCapacity:
    """What a host has and what is already taken, as placement sees it."""

    host_id: int
    cloud_type: CloudType
    vcpus: int
    memory_gb: int
    disk_gb: int
    gpus: tuple[HostGpu, ...]
    used_vcpus: float = 0
    used_memory_gb: float = 0
    used_disk_gb: float = 0
    used_gpu_indices: frozenset[int] = field(default_factory=frozenset)
    location: str = ""
    # Whether new clusters may land here (core/fleet.py takes_placements: active and
    # healthy). A host that does not is never chosen, whatever it has free.
    takes_placements: bool = True
    # Its CUDA driver version ("12.4"); None: unknown, which meets no CUDA minimum.
    cuda_version: str | None = None


@dataclass(frozen=True)
class ResourceRequest:
    gpu_type: str | None
    gpu_count: int
    vcpus: int
    memory_gb: int
    disk_gb: int
    cloud_type: CloudType = CloudType.ALL
    # The host's location (data centre) the request is pinned to; None: anywhere.
    location: str | None = None
    # The host's CUDA driver version must be at least this ("12.4"; None: any) and,
    # when given, one of these (core/placement.py ``cuda_satisfies``).
    min_cuda_version: str | None = None
    allowed_cuda_versions: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Placement:
    host_id: int
    gpu_indices: tuple[int, ...]
