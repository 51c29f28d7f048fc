"""The training edge's data path: a container's port reached straight at its address,
through the host's DNAT rules (runtimes/hosts/edge.py, what ``gpuyard serve`` sets up
for a cluster's SSH port and reserved IPs), and, when the module is still there,
through the userspace forwarder the API process used to run (net/forwarder.py).

Set-up (root, podman, iptables): a podman network and one container of the offline web
image (devtools/web_image.py, ``gpuyard-web`` on port 8888) named
``gy-bench-edge-<pid>``; the DNAT rules of an installation ``be<pid>`` on 127.0.0.1;
the forwarder in this process on 127.0.0.1, as it ran in the API.

Measured, paths rotated:

1. connect -> answer: a new connection per request, ``GET /bytes/1`` until EOF
   (``--requests`` per path);
2. bulk: ``GET /bytes/1 GiB`` read to EOF (``--bulk`` per path): MB/s, and the CPU
   seconds this process spent per GiB (the forwarder's thread runs here; the client's
   reads are the same on every path, the kernel's DNAT work is not in it);
3. a rule change: ``IptablesEdge.apply`` with a new security group (what a sync does
   when a group is added), and ``remove``.

Everything it made is removed on exit (its own names only).

    .venv/bin/python bench/bench_edge.py [--requests 300] [--bulk 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuyard.devtools.web_image import WEB_IMAGE, WEB_PORT, build_web_image
from gpuyard.runtimes.hosts.edge import ClusterEdge, IptablesEdge

GIB = 1 << 30


def fetch(address: tuple[str, int], size: int) -> int:
    """``GET /bytes/size`` on a new connection, read to EOF; the bytes received."""
    with socket.create_connection(address, timeout=30) as s:
        s.sendall(f"GET /bytes/{size} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n".encode())
        got = 0
        while chunk := s.recv(1 << 20):
            got += len(chunk)
        return got


def podman(*args: str) -> str:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--bulk", type=int, default=3)
    args = parser.parse_args()

    name = f"gy-bench-edge-{os.getpid()}"
    build_web_image()
    podman("network", "create", name)
    cleanup: list[Callable[[], Any]] = [lambda: podman("network", "rm", "-f", name)]
    try:
        podman("run", "-d", "--name", name, "--network", name, WEB_IMAGE)
        cleanup.append(lambda: podman("rm", "-f", "-t", "0", name))
        ip = podman(
            "inspect", name, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        )
        bridge = podman("network", "inspect", name, "--format", "{{.NetworkInterface}}")
        paths: dict[str, tuple[str, int]] = {"direct": (ip, WEB_PORT)}

        edge = IptablesEdge(f"be{os.getpid() % 1000000}")
        cleanup.append(edge.uninstall)
        dnat_port = _free_port()
        spec = ClusterEdge(
            cluster_id=1,
            target=ip,
            target_port=WEB_PORT,
            listeners=frozenset({("127.0.0.1", dnat_port)}),
            sources=None,
            bridge=bridge,
        )
        edge.apply(spec)
        paths["dnat"] = ("127.0.0.1", dnat_port)
        try:
            from gpuyard.net.forwarder import TcpForwarder  # type: ignore[import-not-found,unused-ignore]

            forwarder = TcpForwarder()
            cleanup.append(forwarder.close)
            fwd_port = _free_port()
            forwarder.ensure("127.0.0.1", fwd_port, ip, WEB_PORT, lambda _s, _p: True)
            paths["forwarder"] = ("127.0.0.1", fwd_port)
        except ImportError:
            pass

        deadline = time.monotonic() + 30
        while True:
            try:
                fetch(paths["direct"], 1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for address in paths.values():  # warm up every path
            assert fetch(address, 1000) > 1000

        latency: dict[str, list[float]] = {p: [] for p in paths}
        for i in range(args.requests):
            order = list(paths) if i % 2 == 0 else list(reversed(paths))
            for p in order:
                t0 = time.perf_counter()
                fetch(paths[p], 1)
                latency[p].append((time.perf_counter() - t0) * 1000)

        rate: dict[str, list[float]] = {p: [] for p in paths}
        cpu: dict[str, list[float]] = {p: [] for p in paths}
        for i in range(args.bulk):
            order = list(paths) if i % 2 == 0 else list(reversed(paths))
            for p in order:
                c0, t0 = time.process_time(), time.perf_counter()
                got = fetch(paths[p], GIB)
                wall, used = time.perf_counter() - t0, time.process_time() - c0
                assert got > GIB, got
                rate[p].append(GIB / wall / 1e6)
                cpu[p].append(used)

        change: list[float] = []
        for i in range(20):
            sources = ("127.0.0.2/32",) if i % 2 == 0 else None
            t0 = time.perf_counter()
            edge.apply(ClusterEdge(**{**spec.__dict__, "sources": sources}))
            change.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        edge.remove(1)
        removed = (time.perf_counter() - t0) * 1000

        print(
            f"Training edge data path, {os.cpu_count()} CPUs, podman "
            f"{podman('version', '--format', '{{.Client.Version}}')}, "
            f"{args.requests} requests and {args.bulk} x 1 GiB per path"
        )
        print(f"{'':<44} {'median':>9} {'min':>9} {'max':>9}")
        for p in paths:
            print(_row(f"{p}: new connection + GET /bytes/1", latency[p], "ms"))
        for p in paths:
            print(_row(f"{p}: GET 1 GiB", rate[p], "MB/s"))
        for p in paths:
            print(_row(f"{p}: CPU of this process per GiB", cpu[p], "s"))
        print(_row("rule change (IptablesEdge.apply)", change, "ms"))
        print(f"{'remove (IptablesEdge.remove)':<44} {removed:>9.1f} ms")
        return 0
    finally:
        for step in reversed(cleanup):
            try:
                step()
            except Exception as exc:  # best effort, say what was left
                print(f"cleanup: {exc}", file=sys.stderr)


def _row(label: str, xs: list[float], unit: str) -> str:
    return (
        f"{label:<44} {statistics.median(xs):>9.2f} {min(xs):>9.2f} {max(xs):>9.2f}  {unit}"
        f" (n={len(xs)})"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


if __name__ == "__main__":
    sys.exit(main())
