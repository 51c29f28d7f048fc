"""Snapshots: gpuyard's snapshot and restore of a volume vs ``tar c | zstd`` and
``zstd -d | tar x`` of the same tree on the same disk, in the same run.

Set-up: a private ``podman system service`` (PodmanService) on this machine, a volume of
ours holding a ~1 GiB tree (three quarters in four random files, a quarter in 16 KiB
files in 128 directories; written through the volume's directory, untimed), and a
fresh restic repository on the same disk as the baseline's output.

- **snapshot (gpuyard):** what the storage worker does: a helper container runs
  ``tar c`` of the volume mounted read-only, this process reads the attach stream,
  counts its entries and pipes it to ``restic backup --stdin`` (content-defined chunks,
  de-duplicated, compressed, encrypted). Timed from the call to its end.
- **snapshot (baseline):** ``tar c -C <volume dir> . | zstd -1 -T0 > file`` on the host.
- **incremental:** 1 % of the tree changed (10 MiB overwritten in the middle of one
  large file and 64 small files rewritten), then snapshot again; compared with the
  first snapshot's time.
- **restore (gpuyard):** ``restic dump`` of the snapshot streamed into the engine's
  archive upload into a new volume (made anew, root metadata restored).
- **restore (baseline):** ``zstd -d -c file | tar x -C <dir>`` into an empty directory.

Rates are the tree's content bytes over wall time; each figure is the median of
``--rounds`` runs. Goals: snapshot >= 0.7x baseline, incremental >= 10x faster than
the first, restore >= 0.7x baseline. Needs root, podman, restic, zstd.

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
from gpuyard.runtimes.engine import Engine
from gpuyard.runtimes.engine_url import PodmanService
from gpuyard.runtimes.volume_copy import fill_volume, volume_labels, volume_tar_stream
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
        repo = ResticRepository(
            str(work / "repo"), work / "repo.password", cache_dir=work / "cache"
        )
        repo.ensure()
        ours, base, incr, ours_r, base_r = [], [], [], [], []
        stored_first, stored_incr = [], []
        last_id = ""
        for r in range(args.rounds):
            # A fresh repository each round: the first snapshot stores everything.
            shutil.rmtree(work / "repo", ignore_errors=True)
            shutil.rmtree(work / "cache", ignore_errors=True)
            repo = ResticRepository(
                str(work / "repo"), work / "repo.password", cache_dir=work / "cache"
            )
            repo.ensure()
            base.append(baseline_snapshot(src, work / "tree.tar.zst"))
            seconds, _first_id, added = snapshot(engine, repo, r)
            ours.append(seconds)
            stored_first.append(added)
            change_one_percent(src, r)
            os.sync()
            seconds, last_id, added = snapshot(engine, repo, r)
            incr.append(seconds)
            stored_incr.append(added)
            base_r.append(baseline_restore(work / "tree.tar.zst", work / "restored"))
            ours_r.append(restore(engine, repo, last_id))
            print(
                f"round {r + 1}: snapshot {ours[-1]:.2f}s (baseline {base[-1]:.2f}s), "
                f"incremental {incr[-1]:.2f}s, restore {ours_r[-1]:.2f}s "
                f"(baseline {base_r[-1]:.2f}s)",
                flush=True,
            )
        mb = tree / 1e6
        rows = [
            ("snapshot, gpuyard", median(ours)),
            ("snapshot, tar c | zstd", median(base)),
            ("incremental snapshot (1 % changed)", median(incr)),
            ("restore, gpuyard", median(ours_r)),
            ("restore, zstd -d | tar x", median(base_r)),
        ]
        print(f"\ntree: {tree / MIB:.0f} MiB; rounds: {args.rounds}")
        print(f"{'what':40} {'seconds':>8} {'MB/s':>8}")
        for name, s in rows:
            print(f"{name:40} {s:8.2f} {mb / s:8.1f}")
        print(
            f"stored: first {median(stored_first) / MIB:.1f} MiB, "
            f"incremental {median(stored_incr) / MIB:.1f} MiB"
        )
        snap_ratio = median(base) / median(ours)
        incr_speedup = median(ours) / median(incr)
        restore_ratio = median(base_r) / median(ours_r)
        print(
            f"RATIO snapshot {snap_ratio:.2f}x baseline (goal >= 0.7: "
            f"{'met' if snap_ratio >= 0.7 else 'NOT met'}); incremental {incr_speedup:.1f}x "
            f"faster than the first (goal >= 10: {'met' if incr_speedup >= 10 else 'NOT met'}); "
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
