"""Volume move between two hosts: ``copy_volume`` vs ``tar c | tar x`` on the same path.

Set-up: two simulated hosts (tests/e2e/podman_host.py): each its own network namespace
behind a veth pair, its own Podman service with its own storage, reached over TCP on
its namespace address, as gpuyard reaches a remote host. A ~1 GiB tree (4 x 192 MiB
random files and 16,384 files of 16 KiB in 128 directories) is written into a volume
on host A.

- **gpuyard:** ``copy_volume(A, vol, B, vol2)``: host A's helper runs ``tar c`` of the
  volume, gpuyard (this process, in the main namespace, like the control plane) reads
  its attach stream and sends it as host B's archive upload, which unpacks it into the
  volume. Timed from the call to its return: helpers made and removed, the target's
  root fixed, all included. The target volume is removed before each run (untimed).
- **baseline:** the same tree, the same hops: ``tar c`` in A's namespace on the source
  volume's directory, piped to ``socat`` that sends it to the main namespace, where a
  ``socat`` relays it to B's namespace (the control plane's hop), where ``socat`` hands
  it to ``tar x`` into a directory on B's storage. No engine, no container, no Python:
  the floor for moving these bytes along this path. The target is emptied before each
  run (untimed).

Both rates divide the tree's content bytes by the wall time; runs alternate, the order
flips each round, and the median of each is compared. Goal: gpuyard >= 0.7x baseline.
Needs root, podman, socat, GNU tar; cleans up its namespaces, services and storage.

    .venv/bin/python bench/bench_volume_move.py [--rounds 3] [--mib 1024]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import median
from tests.e2e.podman_host import PodmanHost, available

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.volumes.copy import copy_volume, volume_checksum

MIB = 1 << 20


def write_tree(root: Path, total_mib: int) -> int:
    """Three quarters in four large files, a quarter in 16 KiB files; returns bytes."""
    large = total_mib * 3 // 4 // 4
    small_count = total_mib * MIB // 4 // (16 * 1024)
    written = 0
    for i in range(4):
        with open(root / f"large-{i}.bin", "wb") as f:
            for _ in range(large):
                f.write(os.urandom(MIB))
        written += large * MIB
    block = os.urandom(MIB)
    for i in range(small_count):
        d = root / f"dir-{i % 128:03d}"
        d.mkdir(exist_ok=True)
        offset = (i * 16 * 1024) % (MIB - 16 * 1024)
        (d / f"file-{i:05d}").write_bytes(block[offset : offset + 16 * 1024])
        written += 16 * 1024
    return written


def baseline(a: PodmanHost, b: PodmanHost, src: Path, dst: Path) -> float:
    """Seconds for tar c (A) | socat -> main namespace -> socat (B) | tar x."""
    relay_in = f"10.231.{a.index}.1"
    port_a, port_b = 19000 + a.index, 19000 + b.index
    t0 = time.perf_counter()
    receiver = subprocess.Popen(
        [*b.nsenter(), "sh", "-c",
         f"socat -u TCP-LISTEN:{port_b},bind={b.address},reuseaddr - | tar x -C {dst}"]
    )  # fmt: skip
    relay = subprocess.Popen(
        ["socat", "-u", f"TCP-LISTEN:{port_a},bind={relay_in},reuseaddr",
         f"TCP:{b.address}:{port_b},retry=200,interval=0.01"]
    )  # fmt: skip
    subprocess.run(
        [*a.nsenter(), "sh", "-c",
         f"tar c -C {src} . | socat -u - TCP:{relay_in}:{port_a},retry=200,interval=0.01"],
        check=True,
    )  # fmt: skip
    if relay.wait(60) != 0 or receiver.wait(60) != 0:
        raise RuntimeError("baseline pipeline failed")
    return time.perf_counter() - t0


def empty_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=1024, help="size of the tree")
    args = parser.parse_args()
    problem = available() or (None if shutil.which("socat") else "socat not installed")
    if problem:
        print(f"cannot run: {problem}")
        return 1
    owner = Ownership.new()
    with PodmanHost() as a, PodmanHost() as b:
        source, target = Engine(a.url, owner=owner), Engine(b.url, owner=owner)
        source.ensure_volume("bench-src")
        tree_bytes = write_tree(a.volume_dir("bench-src"), args.mib)
        os.sync()
        dst_dir = b.lib / "baseline"
        # Warm-up (unmeasured): helper images imported, page cache filled.
        copy_volume(source, "bench-src", target, "bench-dst")
        empty_dir(dst_dir)
        baseline(a, b, a.volume_dir("bench-src"), dst_dir)
        ours: list[float] = []
        bare: list[float] = []
        for r in range(args.rounds):
            for which in ("gpuyard", "baseline") if r % 2 == 0 else ("baseline", "gpuyard"):
                if which == "gpuyard":
                    target.remove_volume("bench-dst")
                    os.sync()
                    result = copy_volume(source, "bench-src", target, "bench-dst")
                    ours.append(result.seconds)
                else:
                    empty_dir(dst_dir)
                    os.sync()
                    bare.append(baseline(a, b, a.volume_dir("bench-src"), dst_dir))
                print(
                    f"  round {r + 1} {which:8s} {(ours if which == 'gpuyard' else bare)[-1]:6.2f} s"
                )
        same = volume_checksum(source, "bench-src") == volume_checksum(target, "bench-dst")
        gy_rate, bare_rate = tree_bytes / median(ours) / MIB, tree_bytes / median(bare) / MIB
        print(f"\ntree: {tree_bytes / MIB:.0f} MiB, {args.rounds} rounds, medians")
        print(f"{'path':40s} {'seconds':>8s} {'MiB/s':>8s}")
        print(f"{'gpuyard copy_volume (A -> B)':40s} {median(ours):8.2f} {gy_rate:8.1f}")
        print(f"{'tar c | socat | socat | tar x':40s} {median(bare):8.2f} {bare_rate:8.1f}")
        print(f"copy identical (tree checksum): {same}")
        ratio = gy_rate / bare_rate
        verdict = "met" if ratio >= 0.7 else "NOT met"
        print(f"RATIO gpuyard/baseline throughput = {ratio:.2f}x (goal >= 0.70x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
