"""Checks on a machine with a real NVIDIA GPU what no CI machine can: gpuyard's NVML
discovery and the idle watcher's utilisation read, at rest and under load.

Run from the repository root with what those modules import (a lent GPU machine is
offline, and a whole virtualenv is too big to carry: take just these, built for its
Python, about 45 MB):

    pip install --target .tmp/gpucheck --python-version 3.12 --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        sqlalchemy pydantic pydantic-settings cryptography nvidia-ml-py
    PYTHONPATH=.tmp/gpucheck:src python3 scripts/gpu-check.py

The load is a spin kernel JIT-compiled from PTX through the driver API (libcuda ships
with the driver, no CUDA toolkit needed). Its loop stores a result, or ptxas removes it
and the GPU never gets busy.
"""

from __future__ import annotations

import ctypes
import pathlib
import sys
import threading
import time

from gpuyard.reconciler.duties.autoterminate import nvml_utilization
from gpuyard.services.fleet.discovery import discover, discover_nvml_gpus

PTX = b"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 n, .param .u64 out)
{
  .reg .u64 %r<6>;
  .reg .pred %p;
  ld.param.u64 %r1, [n];
  ld.param.u64 %r3, [out];
  mov.u64 %r2, 0;
  mov.u64 %r4, 1;
LOOP:
  add.u64 %r2, %r2, 1;
  mad.lo.u64 %r4, %r4, 6364136223846793005, %r2;
  setp.lt.u64 %p, %r2, %r1;
  @%p bra LOOP;
  st.global.u64 [%r3], %r4;
  ret;
}
"""


def busy_gpu(iterations: int) -> threading.Event:
    """Start the spin kernel on GPU 0; the event is set when it has finished."""
    cu = ctypes.CDLL("libcuda.so.1")

    def ck(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} -> {rc}")

    done = threading.Event()

    def run() -> None:
        ck(cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        ck(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
        mod = ctypes.c_void_p()
        ck(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX)), "cuModuleLoadData")
        fn = ctypes.c_void_p()
        ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin"), "cuModuleGetFunction")
        out = ctypes.c_uint64()
        ck(cu.cuMemAlloc_v2(ctypes.byref(out), 8), "cuMemAlloc")
        n = ctypes.c_uint64(iterations)
        params = (ctypes.c_void_p * 2)(
            ctypes.cast(ctypes.byref(n), ctypes.c_void_p),
            ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
        )
        ck(cu.cuLaunchKernel(fn, 132, 1, 1, 32, 1, 1, 0, None, params, None), "cuLaunchKernel")
        ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def main() -> int:
    gpus = discover_nvml_gpus()
    print("discover_nvml_gpus:", gpus)
    inv = discover(
        declared_gpus=None,
        vcpus=None,
        memory_gb=None,
        disk_gb=None,
        disk_path=pathlib.Path("/tmp/gy-gpu-check"),
    )
    print("inventory:", inv.vcpus, "vCPUs,", inv.memory_gb, "GB,", inv.gpu_source)
    uuids = tuple(g.uuid for g in gpus if g.uuid)
    if not uuids:
        print("no GPU visible")
        return 1
    print("utilisation at rest:", nvml_utilization(uuids[:1]))
    print("unknown UUID:", nvml_utilization(("GPU-00000000-0000-0000-0000-000000000000",)))
    done = busy_gpu(1_000_000_000)
    samples = []
    while not done.wait(0.7):
        samples.append(nvml_utilization(uuids[:1]))
    print("utilisation under load:", samples)
    time.sleep(2)
    print("utilisation after:", nvml_utilization(uuids[:1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
