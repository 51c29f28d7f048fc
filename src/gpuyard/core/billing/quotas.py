"""Quotas of accounts and projects: their limits, what is in use, and the check.

Pure: the store reads usage and limits (services/billing/quotas.py); this module says what
they mean. A limit is set per account (every project together) or per project, on

- ``gpus``: GPUs held, of every type together, or of one type (``gpus_by_type``);
- ``vcpus``: vCPUs held;
- ``volume_gb``: clusters' volumes and network volumes, in GB;
- ``snapshot_gb``: snapshots' stored data, in GB (rounded up);
- ``running_clusters``: clusters holding capacity.

A missing limit is no limit. A request breaches a limit when, counting what it asks,
the usage passes the limit *and* it asks some of that resource: a request that asks
no vCPUs is never refused because vCPUs are over a lowered limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# The largest limit anybody may set (a larger one is a mistake, not a policy).
MAX_LIMIT = 1_000_000_000
GIB = 1024**3


class Resource(StrEnum):
    GPUS = "gpus"
    VCPUS = "vcpus"
    VOLUME_GB = "volume_gb"
    SNAPSHOT_GB = "snapshot_gb"
    RUNNING_CLUSTERS = "running_clusters"


# The resources with a single limit each (gpus also has one per type).
SCALAR = (Resource.VCPUS, Resource.VOLUME_GB, Resource.SNAPSHOT_GB, Resource.RUNNING_CLUSTERS)


def gb_of(nbytes: int) -> int:
    """``nbytes`` in whole GB, rounded up (1 byte holds a GB)."""
    return -(-max(0, nbytes) // GIB)


@dataclass(frozen=True)
class Usage:
    """What an account or project holds (or what a request asks)."""

    gpus_by_type: Mapping[str, int] = field(default_factory=dict)
    vcpus: int = 0
    volume_gb: int = 0
    snapshot_gb: int = 0
    running_clusters: int = 0

    @property
    def gpus(self) -> int:
        return sum(self.gpus_by_type.values())

    def amount(self, resource: Resource, gpu_type: str = "") -> int:
        if resource is Resource.GPUS:
            return self.gpus_by_type.get(gpu_type, 0) if gpu_type else self.gpus
        value: int = getattr(self, resource.value)
        return value

    def plus(self, other: Usage) -> Usage:
        return self._combine(other, 1)

    def minus(self, other: Usage) -> Usage:
        return self._combine(other, -1)

    def _combine(self, other: Usage, sign: int) -> Usage:
        types = dict(self.gpus_by_type)
        for gpu_type, n in other.gpus_by_type.items():
            types[gpu_type] = types.get(gpu_type, 0) + sign * n
        return Usage(
            gpus_by_type={t: n for t, n in types.items() if n},
            vcpus=self.vcpus + sign * other.vcpus,
            volume_gb=self.volume_gb + sign * other.volume_gb,
            snapshot_gb=self.snapshot_gb + sign * other.snapshot_gb,
            running_clusters=self.running_clusters + sign * other.running_clusters,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "gpus_by_type": dict(sorted(self.gpus_by_type.items())),
            "vcpus": self.vcpus,
            "volume_gb": self.volume_gb,
            "snapshot_gb": self.snapshot_gb,
            "running_clusters": self.running_clusters,
        }


def total(usages: Iterable[Usage]) -> Usage:
    out = Usage()
    for u in usages:
        out = out.plus(u)
    return out


@dataclass(frozen=True)
class Limits:
    """The limits of an account or project (None: no limit)."""

    gpus: int | None = None
    gpus_by_type: Mapping[str, int] = field(default_factory=dict)
    vcpus: int | None = None
    volume_gb: int | None = None
    snapshot_gb: int | None = None
    running_clusters: int | None = None

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, str, int]]) -> Limits:
        """From ``(resource, gpu_type, limit)`` rows (store/schema/tenancy.py Quota); rows of
        resources this version does not know are ignored."""
        values: dict[str, Any] = {}
        by_type: dict[str, int] = {}
        known = {r.value for r in Resource}
        for resource, gpu_type, limit in rows:
            if resource not in known:
                continue
            if resource == Resource.GPUS and gpu_type:
                by_type[gpu_type] = limit
            else:
                values[resource] = limit
        return cls(gpus_by_type=by_type, **values)

    def rows(self) -> list[tuple[str, str, int]]:
        """The ``(resource, gpu_type, limit)`` rows that store these limits."""
        out: list[tuple[str, str, int]] = []
        if self.gpus is not None:
            out.append((Resource.GPUS.value, "", self.gpus))
        out += [(Resource.GPUS.value, t, n) for t, n in sorted(self.gpus_by_type.items())]
        for r in SCALAR:
            value = self.limit(r)
            if value is not None:
                out.append((r.value, "", value))
        return out

    def limit(self, resource: Resource, gpu_type: str = "") -> int | None:
        if resource is Resource.GPUS and gpu_type:
            return self.gpus_by_type.get(gpu_type)
        value: int | None = getattr(self, resource.value)
        return value

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "gpus_by_type": dict(sorted(self.gpus_by_type.items())),
            "vcpus": self.vcpus,
            "volume_gb": self.volume_gb,
            "snapshot_gb": self.snapshot_gb,
            "running_clusters": self.running_clusters,
        }


# What a change leaves as it is (a field absent from the request body).
class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()


@dataclass(frozen=True)
class LimitChange:
    """A change of limits: each value is a new limit, None (remove it) or KEEP."""

    gpus: int | None = KEEP
    gpus_by_type: Mapping[str, int | None] = field(default_factory=dict)
    vcpus: int | None = KEEP
    volume_gb: int | None = KEEP
    snapshot_gb: int | None = KEEP
    running_clusters: int | None = KEEP

    def fields(self) -> list[tuple[str, int | None]]:
        """``(field name, value)`` of everything the change sets or removes; a type's
        GPUs are named ``gpus_by_type.TYPE``."""
        out: list[tuple[str, int | None]] = []
        if self.gpus is not KEEP:
            out.append(("gpus", self.gpus))
        out += [(f"gpus_by_type.{t}", n) for t, n in sorted(self.gpus_by_type.items())]
        for r in SCALAR:
            value = getattr(self, r.value)
            if value is not KEEP:
                out.append((r.value, value))
        return out


def check_value(value: object) -> str | None:
    """Why ``value`` cannot be a limit (None: it can). A limit is a whole
    number from 0 (nothing allowed) to MAX_LIMIT, or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be a whole number or null"
    if value < 0:
        return "must be 0 or more"
    if value > MAX_LIMIT:
        return f"must be at most {MAX_LIMIT}"
    return None


def apply_change(limits: Limits, change: LimitChange) -> Limits:
    """``limits`` with ``change`` applied (values assumed checked)."""
    by_type = dict(limits.gpus_by_type)
    for gpu_type, n in change.gpus_by_type.items():
        if n is None:
            by_type.pop(gpu_type, None)
        else:
            by_type[gpu_type] = n

    def pick(name: str) -> int | None:
        new = getattr(change, name)
        current: int | None = getattr(limits, name)
        return current if new is KEEP else new

    return Limits(
        gpus=pick("gpus"),
        gpus_by_type=by_type,
        vcpus=pick("vcpus"),
        volume_gb=pick("volume_gb"),
        snapshot_gb=pick("snapshot_gb"),
        running_clusters=pick("running_clusters"),
    )


def above_account(project: Limits, account: Limits) -> tuple[str, int, int] | None:
    """The first project limit above the account's limit of the same resource, as
    ``(field, project limit, account limit)``; None when every one is within. A type's
    GPU limit is held to the account's limit of that type and of all GPUs."""
    for gpu_type, n in sorted(project.gpus_by_type.items()):
        for cap in (account.gpus_by_type.get(gpu_type), account.gpus):
            if cap is not None and n > cap:
                return f"gpus_by_type.{gpu_type}", n, cap
    for r in (Resource.GPUS, *SCALAR):
        mine, cap = project.limit(r), account.limit(r)
        if mine is not None and cap is not None and mine > cap:
            return r.value, mine, cap
    return None


@dataclass(frozen=True)
class Breach:
    """A limit a request would pass: ``in_use`` without the request, ``asked`` by it."""

    resource: Resource
    gpu_type: str
    limit: int
    in_use: int
    asked: int

    def describe(self, scope: str) -> str:
        what = f"{self.gpu_type} GPUs" if self.gpu_type else self.resource.value.replace("_", " ")
        return (
            f"{scope} quota exceeded for {what}: limit {self.limit}, "
            f"{self.in_use} in use, {self.asked} asked"
        )


def first_breach(limits: Limits, in_use: Usage, asked: Usage) -> Breach | None:
    """The first limit that ``in_use`` plus ``asked`` passes where ``asked`` takes some
    of it; None when the request fits. GPUs of a type are checked first (the more
    precise message), then all GPUs, vCPUs, running clusters and storage."""
    checks: list[tuple[Resource, str]] = [
        (Resource.GPUS, t) for t in sorted(limits.gpus_by_type) if asked.amount(Resource.GPUS, t)
    ]
    checks += [
        (Resource.GPUS, ""),
        (Resource.VCPUS, ""),
        (Resource.RUNNING_CLUSTERS, ""),
        (Resource.VOLUME_GB, ""),
        (Resource.SNAPSHOT_GB, ""),
    ]
    for resource, gpu_type in checks:
        limit = limits.limit(resource, gpu_type)
        want = asked.amount(resource, gpu_type)
        if limit is None or want <= 0:
            continue
        have = in_use.amount(resource, gpu_type)
        if have + want > limit:
            return Breach(resource, gpu_type, limit, have, want)
    return None
