"""Capacity is claimed by the database: concurrent creates never over-allocate."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import func, select

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.use_cases import create_cluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, GpuAllocation


def test_32_concurrent_creates_for_8_gpus(ctx: Context, alice: Principal) -> None:
    # The declared host has 4 A6000s; ask for 1 each from 32 threads, twice the type
    # count via two types so 8 GPUs are contended in all.
    def create(i: int) -> str:
        gpu = "NVIDIA RTX A6000" if i % 2 else "NVIDIA GeForce RTX 4090"
        body = CreateCluster(name=f"c{i}", gpu_type=gpu, gpu_count=1, docker_image="img")
        try:
            return create_cluster(ctx, alice, body).id
        except InsufficientCapacity:
            return "INSUFFICIENT_CAPACITY"

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(create, range(32)))

    placed = [r for r in results if r != "INSUFFICIENT_CAPACITY"]
    assert len(placed) == 8
    assert results.count("INSUFFICIENT_CAPACITY") == 24
    with ctx.read() as session:
        rows = list(session.execute(select(GpuAllocation.host_id, GpuAllocation.gpu_index)))
        assert len(rows) == 8 and len(set(rows)) == 8
        assert session.scalar(select(func.count()).select_from(Cluster)) == 8
