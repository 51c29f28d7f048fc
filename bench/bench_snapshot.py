"""Snapshots: gpuyard's snapshot and restore of a volume vs ``tar c | zstd`` and
``zstd -d | tar x`` of the same tree on the same disk, in the same run.

Set-up: a private ``podman system service`` (PodmanService) on this machine, a volume of
ours holding a ~1 GiB tree (three quarters in four random files, a quarter in 16 KiB
random files in 128 directories; written through the volume's directory, untimed), and
a fresh restic repository per round on the same disk as the baseline's output.

gpuyard keeps a volume one way (the storage worker's own functions, timed from the call
to its end): a helper that mounts only the volume, read-only, runs ``tar c``; this
process reads the attach stream, counts it and pipes it to ``restic backup --stdin``;
restore pipes ``restic dump`` into the engine's archive upload into a new volume.
(restic no longer runs beside the volume: there, what a tenant writes could steer it.)

Baselines: ``tar c -C <volume dir> . | zstd -1 -T0 > file`` and ``zstd -d -c file |
tar x -C <empty dir>``. The incremental snapshot follows a 1 % change (10 MiB
overwritten in the middle of one large file, 64 small files rewritten) and is compared
with the first snapshot of the same path. Each figure is the median of ``--rounds``.
Goals: snapshot >= 0.7x baseline, incremental >= 10x faster than the first, restore
>= 0.7x baseline. Needs root, podman, restic, zstd.

    .venv/bin/python bench/bench_snapshot.py [--rounds 3] [--mib 1024]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import median

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.engines.url import PodmanService
from gpuyard.runtimes.volumes.copy import fill_volume, volume_labels, volume_tar_stream
from gpuyard.storage.restic import ResticRepository
from gpuyard.storage.tar_stats import TarCounter, counted

MIB = 1 << 20
VOLUME = "bench-snap"


def write_tree(root: Path, total_mib: int) -> int:
    large = total_mib * 3 // 4 // 4
    small_count = total_mib * MIB // 4 // (16 * 1024)
    written = 0
    for i in range(4):
        with open(root / f"large-{i}.bin", "wb") as f:
            for _ in range(large):
                f.write(os.urandom(MIB))
        written += large * MIB
    for i in range(small_count):
        d = root / f"dir-{i % 128:03d}"
        d.mkdir(exist_ok=True)
        (d / f"file-{i:05d}").write_bytes(os.urandom(16 * 1024))
        written += 16 * 1024
    return written


def change_one_percent(root: Path, round_no: int) -> None:
    with open(root / "large-1.bin", "r+b") as f:
        f.seek((100 + round_no * 20) * MIB)
        f.write(os.urandom(10 * MIB))
    for i in range(64):
        path = root / f"dir-{i % 128:03d}" / f"file-{i:05d}"
        path.write_bytes(os.urandom(16 * 1024))


def volume_dir(engine: Engine, name: str) -> Path:
    return Path(engine.api.inspect_volume(name)["Mountpoint"])


def snapshot(engine: Engine, repo: ResticRepository, round_no: int) -> tuple[float, str, int]:
    t0 = time.perf_counter()
    counter = TarCounter()
    with volume_tar_stream(engine, VOLUME) as chunks:
        result = repo.backup_stream(
            counted(chunks, counter),
            filename="volume.tar",
            tags=[f"bench-{round_no}"],
            host="bench",
        )
    return time.perf_counter() - t0, result.restic_id, result.data_added


def restore(engine: Engine, repo: ResticRepository, restic_id: str) -> float:
    labels = volume_labels(engine, VOLUME)
    t0 = time.perf_counter()
    with repo.dump_stream(restic_id, "volume.tar") as chunks:
        fill_volume(engine, "bench-restored", labels, chunks)
    return time.perf_counter() - t0


def baseline_snapshot(src: Path, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(f"tar c -C {src} . | zstd -q -1 -T0 -f -o {out}", shell=True, check=True)
    return time.perf_counter() - t0


def baseline_restore(archive: Path, dst: Path) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    t0 = time.perf_counter()
    subprocess.run(f"zstd -q -d -c {archive} | tar x -C {dst}", shell=True, check=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=1024, help="size of the tree")
    args = parser.parse_args()
    for tool in ("podman", "restic", "zstd"):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} is not installed")
            return 0
    work = Path(tempfile.mkdtemp(prefix="gy-bench-snap-"))
    service = PodmanService(work / "podman.sock")
    engine: Engine | None = None
    try:
        engine = Engine(service.start(), owner=Ownership.new())
        engine.ensure_volume(VOLUME)
        src = volume_dir(engine, VOLUME)
        tree = write_tree(src, args.mib)
        os.sync()
        figures: dict[str, list[float]] = {}
        stored: dict[str, list[int]] = {}

        def note(name: str, seconds: float, added: int | None = None) -> None:
            figures.setdefault(name, []).append(seconds)
            if added is not None:
                stored.setdefault(name, []).append(added)

        def fresh_repo() -> ResticRepository:
            # A fresh repository: the first snapshot stores everything.
            shutil.rmtree(work / "repo", ignore_errors=True)
            shutil.rmtree(work / "cache", ignore_errors=True)
            fresh = ResticRepository(
                str(work / "repo"), work / "repo.password", cache_dir=work / "cache"
            )
            fresh.ensure()
            return fresh

        for r in range(args.rounds):
            note("baseline snapshot", baseline_snapshot(src, work / "tree.tar.zst"))
            note("baseline restore", baseline_restore(work / "tree.tar.zst", work / "restored"))
            repo = fresh_repo()
            seconds, _first, added = snapshot(engine, repo, r)
            note("stream first", seconds, added)
            change_one_percent(src, r * 2 + 1)
            os.sync()
            seconds, last_id, added = snapshot(engine, repo, r)
            note("stream incremental", seconds, added)
            note("stream restore", restore(engine, repo, last_id))
            print(
                "round "
                + str(r + 1)
                + ": "
                + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in figures.items()),
                flush=True,
            )
        mb = tree / 1e6
        med = {k: median(v) for k, v in figures.items()}
        labels = {
            "baseline snapshot": "snapshot, tar c | zstd -1 -T0",
            "stream first": "snapshot, gpuyard (tar stream)",
            "stream incremental": "  after 1 % changed",
            "baseline restore": "restore, zstd -d | tar x",
            "stream restore": "restore, gpuyard (tar stream)",
        }
        print(f"\ntree: {tree / MIB:.0f} MiB; rounds: {args.rounds}")
        print(f"{'what':40} {'seconds':>8} {'MB/s':>8} {'stored MiB':>11}")
        for key, label in labels.items():
            kept = f"{median([float(x) for x in stored[key]]) / MIB:11.1f}" if key in stored else ""
            print(f"{label:40} {med[key]:8.2f} {mb / med[key]:8.1f} {kept}")
        for path in ("stream",):
            snap_ratio = med["baseline snapshot"] / med[f"{path} first"]
            speedup = med[f"{path} first"] / med[f"{path} incremental"]
            restore_ratio = med["baseline restore"] / med[f"{path} restore"]
            print(
                f"RATIO {path}: snapshot {snap_ratio:.2f}x baseline (goal >= 0.7: "
                f"{'met' if snap_ratio >= 0.7 else 'NOT met'}); incremental {speedup:.1f}x "
                f"faster than the first (goal >= 10: {'met' if speedup >= 10 else 'NOT met'}); "
                f"restore {restore_ratio:.2f}x baseline (goal >= 0.7: "
                f"{'met' if restore_ratio >= 0.7 else 'NOT met'})"
            )
        return 0
    finally:
        if engine is not None:
            # Only the volumes this run made (labelled with its own installation id).
            for name in (VOLUME, "bench-restored"):
                engine.remove_volume(name)
        service.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
