"""``/runpod/v2/catalog``: RunPod's GPU types and data centers over gpuyard's catalog,
prices and fleet (services/catalog/stock.py); anybody with a key.

GPU types: ``price`` is the catalog's on-demand price per GPU-hour on each cloud,
``secure``/``community`` whether a host of that cloud has the type, ``maxCount`` the
most GPUs of the type one host of each cloud has. With ``include=AVAILABILITY``
(which needs ``product``: POD, CLUSTER or SERVERLESS, all read alike here)
``availability`` and ``dataCenters`` say how many nodes of ``count`` GPUs (default 1)
on ``cloud`` (default SECURE) the hosts that take placements could take now
(services/catalog/stock.py ``availability``). Hosts do not report CUDA versions, so
``cudaVersions``/``minCudaVersion`` are checked for form and otherwise ignored, no
``cudaVersions`` array is answered, and ``countryCodes`` (locations have no country)
is checked for form and ignored.

Data centers are the locations that have a host: region UNKNOWN, no compliance
claims, no global network; every location serves network volumes of gpuyard's one
tier (STANDARD). ``include=GPU_AVAILABILITY`` adds each GPU type's availability
there for one GPU; CPU_AVAILABILITY an empty list (gpuyard has no CPU-only types).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Depends, Query, Request
from fastapi.responses import JSONResponse

from gpuyard.api.runpod_v2.common import (
    Unprocessable,
    answer,
    documented,
    enum_items,
    query_list,
    v2_router,
)
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.errors import NotFound, ValidationFailed
from gpuyard.core.models import GpuTypeInfo
from gpuyard.services.catalog.stock import FleetStock, HostStock, availability, placeable
from gpuyard.services.catalog.stock import fleet_stock as read_stock
from gpuyard.services.tenancy.auth import Principal

router = v2_router()
# Anybody with a key, whatever its role (as /v1/gpu-types): api/http/permissions.py
# lists ``/runpod/v2/catalog`` among the prefixes that need no role.

PRODUCTS = ("POD", "CLUSTER", "SERVERLESS")
CLOUDS = ("SECURE", "COMMUNITY")
REGIONS = (
    "NORTH_AMERICA",
    "SOUTH_AMERICA",
    "EUROPE",
    "ASIA",
    "MIDDLE_EAST",
    "AFRICA",
    "OCEANIA",
    "ANTARCTICA",
    "UNKNOWN",
)
VOLUME_TYPES = ("STANDARD", "HIGH_PERFORMANCE")
COMPLIANCE = (
    "GDPR",
    "ISO_IEC_27001",
    "ISO_14001",
    "PCI_DSS",
    "HITRUST",
    "SOC_1_TYPE_2",
    "SOC_2_TYPE_2",
    "SOC_3_TYPE_2",
    "ITAR",
    "FISMA_HIGH",
    "HIPAA",
    "RENEWABLE",
)
_CUDA = re.compile(r"\d+\.\d+")
_MIN_CUDA = re.compile(r"\d+(\.\d+)?")
_COUNTRY = re.compile(r"[A-Z]{2}")
MAX_COUNT = 1024


class GpuTypeNotFound(NotFound):
    code = "GPU_TYPE_NOT_FOUND"


class DataCenterNotFound(NotFound):
    code = "DATA_CENTER_NOT_FOUND"


def _manufacturer(name: str) -> str:
    upper = name.strip().upper()
    return upper if upper in ("NVIDIA", "AMD") else "UNKNOWN"


class GpuQuery:
    """The GPU routes' query: what it asks for, checked as the document says (misuse
    400, malformed values 422)."""

    def __init__(
        self,
        include: str | None = Query(default=None, description="AVAILABILITY"),
        product: str | None = Query(default=None, description="POD, CLUSTER, SERVERLESS"),
        count: str | None = Query(default=None, description="GPUs per node (default 1)"),
        cloud: str | None = Query(default=None, description="SECURE (default) or COMMUNITY"),
        countryCodes: str | None = Query(default=None, description="Accepted, ignored"),
        cudaVersions: str | None = Query(default=None, description="Accepted, ignored"),
        minCudaVersion: str | None = Query(default=None, description="Accepted, ignored"),
    ) -> None:
        self.available = bool(enum_items("include", include, ("AVAILABILITY",)))
        products = enum_items("product", product, PRODUCTS)
        if self.available and not products:
            raise ValidationFailed("product", "include=AVAILABILITY needs product")
        given = {
            "product": product,
            "count": count,
            "cloud": cloud,
            "countryCodes": countryCodes,
            "cudaVersions": cudaVersions,
            "minCudaVersion": minCudaVersion,
        }
        if not self.available:
            for name, value in given.items():
                if value is not None:
                    raise ValidationFailed(name, "is valid only with include=AVAILABILITY")
        self.count = 1
        if count is not None:
            if not count.isascii() or not count.isdigit() or not 1 <= int(count) <= MAX_COUNT:
                raise Unprocessable("count", f"must be an integer from 1 to {MAX_COUNT}")
            self.count = int(count)
        self.cloud = "SECURE"
        if cloud is not None:
            self.cloud = enum_items("cloud", cloud, CLOUDS)[0] if cloud else "SECURE"
        for code in query_list(countryCodes):
            if not _COUNTRY.fullmatch(code):
                raise Unprocessable("countryCodes", f"{code[:10]!r} is not an ISO 3166-1 code")
        for version in query_list(cudaVersions):
            if not _CUDA.fullmatch(version):
                raise Unprocessable("cudaVersions", f"{version[:20]!r} is not MAJOR.MINOR")
        if minCudaVersion is not None and not _MIN_CUDA.fullmatch(minCudaVersion):
            raise Unprocessable("minCudaVersion", f"{minCudaVersion[:20]!r} is not MAJOR[.MINOR]")
        if cudaVersions is not None and minCudaVersion is not None:
            raise ValidationFailed(
                "minCudaVersion", "give cudaVersions or minCudaVersion, not both"
            )


def gpu_type_view(gpu: GpuTypeInfo, stock: FleetStock, query: GpuQuery) -> dict[str, Any]:
    mine = [h for h in stock.hosts if h.gpu_type == gpu.id]
    by_cloud = {c: [h for h in mine if h.cloud_type.value == c] for c in CLOUDS}
    out: dict[str, Any] = {
        "id": gpu.id,
        "name": gpu.display_name,
        "pool": None,
        "manufacturer": _manufacturer(gpu.manufacturer),
        "memory": gpu.memory_gb,
        "secure": bool(by_cloud["SECURE"]),
        "community": bool(by_cloud["COMMUNITY"]),
        "price": {"secure": gpu.secure_price, "community": gpu.community_price},
        "maxCount": {c.lower(): max((h.total for h in by_cloud[c]), default=0) for c in CLOUDS},
    }
    if query.available:
        hosts = by_cloud[query.cloud]
        out["availability"] = availability(placeable(hosts, query.count))
        out["dataCenters"] = [
            {
                "id": location,
                "name": location,
                "availability": availability(
                    placeable([h for h in hosts if h.location == location], query.count)
                ),
            }
            for location in sorted({h.location for h in hosts})
        ]
    return out


def _find_gpu(stock: FleetStock, gpu_id: str) -> GpuTypeInfo:
    low = gpu_id.strip().lower()
    for gpu in stock.types:
        if gpu.id == gpu_id or low in (gpu.id.lower(), gpu.display_name.lower()):
            return gpu
    raise GpuTypeNotFound(f"GPU type {gpu_id[:100]!r} not found", {"gpu_type_id": gpu_id[:100]})


@router.get("/catalog/gpus", responses=documented("ListGpuTypesResponse: {gpus}"))
def list_gpus(
    request: Request,
    principal: Principal = Depends(current_principal),
    query: GpuQuery = Depends(),
) -> JSONResponse:
    """Every GPU type of the catalog, by id, with prices (and availability on ask)."""
    stock = read_stock(app_state(request).ctx)
    return answer({"gpus": [gpu_type_view(g, stock, query) for g in stock.types]})


@router.get("/catalog/gpus/{id}", responses=documented("GpuType"))
def get_gpu(
    id: str,
    request: Request,
    principal: Principal = Depends(current_principal),
    query: GpuQuery = Depends(),
) -> JSONResponse:
    """One GPU type, by id (or, case-insensitively, its display name)."""
    stock = read_stock(app_state(request).ctx)
    return answer(gpu_type_view(_find_gpu(stock, id), stock, query))


# ---------------------------------------------------------------- data centers


class DataCenterInclude:
    def __init__(
        self,
        include: str | None = Query(default=None, description="GPU_AVAILABILITY, CPU_AVAILABILITY"),
    ) -> None:
        items = enum_items("include", include, ("GPU_AVAILABILITY", "CPU_AVAILABILITY"))
        self.gpus = "GPU_AVAILABILITY" in items
        self.cpus = "CPU_AVAILABILITY" in items


def data_center_view(
    location: str, stock: FleetStock, include: DataCenterInclude
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": location,
        "name": location,
        "region": "UNKNOWN",
        "networkVolumeTypes": ["STANDARD"],
        "compliance": [],
        "globalNetwork": False,
    }
    if include.gpus:
        here: dict[str, list[HostStock]] = {}
        for h in stock.hosts:
            if h.location == location:
                here.setdefault(h.gpu_type, []).append(h)
        out["gpuAvailability"] = [
            {"id": g.id, "name": g.display_name, "availability": availability(placeable(hosts, 1))}
            for g in stock.types
            if (hosts := here.get(g.id))
        ]
    if include.cpus:
        out["cpuAvailability"] = []
    return out


@router.get("/catalog/datacenters", responses=documented("ListDataCentersResponse"))
def list_data_centers(
    request: Request,
    principal: Principal = Depends(current_principal),
    include: DataCenterInclude = Depends(),
    regions: str | None = Query(default=None, description="DataCenterRegion values (OR)"),
    networkVolumeTypes: str | None = Query(default=None, description="Volume types (AND)"),
    compliance: str | None = Query(default=None, description="Compliance values (AND)"),
    globalNetwork: bool | None = Query(default=None),
) -> JSONResponse:
    """The locations that have a host, by name; the filters combine with AND."""
    wanted_regions = enum_items("regions", regions, REGIONS)
    wanted_types = enum_items("networkVolumeTypes", networkVolumeTypes, VOLUME_TYPES)
    wanted_compliance = enum_items("compliance", compliance, COMPLIANCE)
    stock = read_stock(app_state(request).ctx)
    matches = (
        (not wanted_regions or "UNKNOWN" in wanted_regions)
        and set(wanted_types) <= {"STANDARD"}
        and not wanted_compliance
        and globalNetwork is not True
    )
    listed = stock.locations if matches else []
    return answer({"dataCenters": [data_center_view(loc, stock, include) for loc in listed]})


@router.get("/catalog/datacenters/{id}", responses=documented("DataCenter"))
def get_data_center(
    id: str,
    request: Request,
    principal: Principal = Depends(current_principal),
    include: DataCenterInclude = Depends(),
) -> JSONResponse:
    stock = read_stock(app_state(request).ctx)
    if id not in stock.locations:
        raise DataCenterNotFound(
            f"data center {id[:100]!r} not found", {"data_center_id": id[:100]}
        )
    return answer(data_center_view(id, stock, include))
