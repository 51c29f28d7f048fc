"""Snapshots: gpuyard's snapshot and restore of a volume vs bare ``restic backup`` and
``restic restore`` (and ``tar c | zstd``, ``zstd -d | tar x``) of the same tree on the
same disk, in the same run.

Set-up: a private ``podman system service`` (PodmanService) on this machine, a volume of
ours holding a ~1 GiB tree (three quarters in four random files, a quarter in 16 KiB
random files in 128 directories; written through the volume's directory, untimed), and
a fresh restic repository per round on the same disk as the baseline's output.

gpuyard's path is timed through the entries its storage worker calls
(reconciler/clusters/snapshots.py): ``backup_in_helper`` (restic in a helper that
mounts only the volume, read-only, and restic, reaching the repository through the
operation's REST backend server; the incremental gets the first snapshot as its
parent) and ``SnapshotWorker._restore`` (for a ``tree`` snapshot: ``restic restore`` in
a helper holding only the new volume). ``--with-stream`` also times the fallback for
engines elsewhere: the tar stream into ``restic backup --stdin`` and ``restic dump``
into the engine's archive upload.

Baselines, in the same round: a bare ``restic backup <volume dir>`` into a fresh local
repository (restic's own key and cache; init untimed) and a bare ``restic restore`` of
gpuyard's snapshot into an empty directory; ``tar c -C <volume dir> . | zstd -1 -T0 >
file`` and ``zstd -d -c file | tar x -C <empty dir>`` are printed too. The incremental
snapshot follows a 1 % change (10 MiB overwritten in the middle of one large file, 64
small files rewritten) and is compared with the first snapshot of the same path; a
second one follows 1 % changed as whole files (655 of the 16 KiB files per GiB
rewritten). Both are also timed for bare restic (``restic backup <dir>`` again into
its repository, where it takes its previous snapshot as the parent). One
restic command's fixed cost (``restic cat config``, median of 5) is printed with
restic's own stretched key (the bare repository's) and with gpuyard's fast key, and
the time to make a new repository, by ``restic init`` and by gpuyard
(storage/restic_init.py).
Each figure is the median of ``--rounds``. Goals: snapshot >= 0.9x bare restic backup,
incremental >= 10x faster than the first, restore >= 0.9x bare restic restore. Needs
root, podman, restic, zstd.

    .venv/bin/python bench/bench_snapshot.py [--rounds 3] [--mib 1024]
"""

from __future__ import annotations

import argparse
import json
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
from gpuyard.core.snapshots import SnapshotFormat
from gpuyard.reconciler.clusters.snapshots import SnapshotWorker
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.engines.restic_image import ensure_restic_image
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.engines.url import PodmanService
from gpuyard.runtimes.volumes.copy import fill_volume, volume_labels, volume_tar_stream
from gpuyard.storage.restic import ResticRepository
from gpuyard.storage.restic_keys import FAST_PARAMS
from gpuyard.storage.tar_stats import TarCounter, counted
from gpuyard.storage.volume_restic import backup_in_helper

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
    size = (root / "large-1.bin").stat().st_size
    with open(root / "large-1.bin", "r+b") as f:
        f.seek(((size // MIB // 2) + round_no * 20) * MIB % max(size - 10 * MIB, MIB))
        f.write(os.urandom(10 * MIB))
    for i in range(64):
        path = root / f"dir-{i % 128:03d}" / f"file-{i:05d}"
        path.write_bytes(os.urandom(16 * 1024))


def change_small_files(root: Path, total_mib: int, round_no: int) -> None:
    """1 % of the tree changed as whole files: that many 16 KiB files rewritten."""
    count = max(1, total_mib * MIB // 100 // (16 * 1024))
    small_count = total_mib * MIB // 4 // (16 * 1024)
    for n in range(count):
        i = (round_no * 7919 + n * 13) % small_count
        (root / f"dir-{i % 128:03d}" / f"file-{i:05d}").write_bytes(os.urandom(16 * 1024))


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


def helper_snapshot(
    engine: Engine, repo: ResticRepository, tag: str, parent: str | None
) -> tuple[float, str, int, int]:
    """The worker's snapshot on an engine here: (seconds, id, bytes added, files
    restic found unchanged)."""
    t0 = time.perf_counter()
    result = backup_in_helper(engine, VOLUME, repo, tags=[tag], host="bench", parent=parent)
    return time.perf_counter() - t0, result.restic_id, result.data_added, result.files_unmodified


def worker_restore(runtime: DockerEngineRuntime, repo: ResticRepository, restic_id: str) -> float:
    """The worker's restore of a ``tree`` snapshot into a new volume."""
    t0 = time.perf_counter()
    SnapshotWorker._restore(
        runtime,
        repo,
        SnapshotFormat.TREE,
        restic_id,
        "bench-restored",
        VOLUME,
        None,
        lambda n: None,
    )
    return time.perf_counter() - t0


def restore(engine: Engine, repo: ResticRepository, restic_id: str) -> float:
    labels = volume_labels(engine, VOLUME)
    t0 = time.perf_counter()
    with repo.dump_stream(restic_id, "volume.tar") as chunks:
        fill_volume(engine, "bench-restored", labels, chunks)
    return time.perf_counter() - t0


def restic_cli(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Bare restic, as an operator runs it: its own key (no hint), its own cache."""
    argv = ["restic", "-r", str(repo), "--password-file", str(repo) + ".password"]
    argv += ["--cache-dir", str(repo) + ".cache", *args]
    return subprocess.run(argv, check=True, capture_output=True)


def bare_restic_backup(
    src: Path, repo: Path, *, fresh: bool = True, inits: list[float] | None = None
) -> float:
    """``restic backup <dir>``; ``fresh``: into a new repository (its ``restic init``
    untimed here, its seconds appended to ``inits``), else into the same one, where
    restic takes the last snapshot of the path as parent."""
    if fresh:
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(str(repo) + ".cache", ignore_errors=True)
        Path(str(repo) + ".password").write_text(os.urandom(24).hex() + "\n")
        t0 = time.perf_counter()
        restic_cli(repo, "init", "--repository-version", "2")
        if inits is not None:
            inits.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    restic_cli(repo, "backup", "-q", "--host", "bench", str(src))
    return time.perf_counter() - t0


def bare_restic_restore(repo: ResticRepository, restic_id: str, dst: Path) -> float:
    """``restic restore`` of gpuyard's snapshot (the volume's tar file) into a directory,
    opened as an operator's restic would (no key hint: restic tries each key)."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    location = Path(repo.location)
    argv = ["restic", "-r", str(location), "--password-file", str(location) + ".password"]
    argv += ["--cache-dir", str(location.parent / "cache")]
    argv += ["restore", restic_id]
    t0 = time.perf_counter()
    subprocess.run([*argv, "--target", str(dst)], check=True, capture_output=True)
    return time.perf_counter() - t0


def key_of(location: Path, *, fast: bool) -> str:
    """The id of the repository's fast key (gpuyard's) or of restic's own."""
    for path in (location / "keys").iterdir():
        if (json.loads(path.read_bytes()).get("N") == FAST_PARAMS[0]) == fast:
            return path.name
    raise LookupError(f"no {'fast' if fast else 'stretched'} key in {location}")


def command_cost(location: Path, *, fast: bool, times: int = 5) -> float:
    """The median wall time of ``restic cat config`` (opening the repository and
    nothing else), with restic's own stretched key (of a repository ``restic init``
    made) or with gpuyard's fast key."""
    argv = ["restic", "-r", str(location), "--password-file", str(location) + ".password"]
    argv += ["--cache-dir", str(location.parent / "cache")]
    argv += ["--key-hint", key_of(location, fast=fast), "cat", "config"]
    seconds = []
    for _ in range(times):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        seconds.append(time.perf_counter() - t0)
    return median(seconds)


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
    parser.add_argument("--with-stream", action="store_true", help="time the tar stream too")
    args = parser.parse_args()
    for tool in ("podman", "restic", "zstd"):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} is not installed")
            return 0
    work = Path(tempfile.mkdtemp(prefix="gy-bench-snap-"))
    service = PodmanService(work / "podman.sock")
    engine: Engine | None = None
    try:
        runtime = DockerEngineRuntime(service.start(), owner=Ownership.new())
        engine = runtime.engine
        engine.ensure_volume(VOLUME)
        src = volume_dir(engine, VOLUME)
        tree = write_tree(src, args.mib)
        os.sync()
        # The restic helper's image is imported once per engine, on first use: untimed.
        t0 = time.perf_counter()
        ensure_restic_image(engine, shutil.which("restic") or "restic")
        print(f"restic helper image ready in {time.perf_counter() - t0:.1f} s (once)")
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
            t0 = time.perf_counter()
            fresh.ensure()
            note("make repository, gpuyard", time.perf_counter() - t0)
            return fresh

        inits: list[float] = []
        for r in range(args.rounds):
            note("baseline snapshot", baseline_snapshot(src, work / "tree.tar.zst"))
            note("baseline restore", baseline_restore(work / "tree.tar.zst", work / "restored"))
            if args.with_stream:
                repo = fresh_repo()
                seconds, _first, added = snapshot(engine, repo, r)
                note("stream first", seconds, added)
                change_one_percent(src, r * 2 + 1)
                os.sync()
                seconds, last_id, added = snapshot(engine, repo, r)
                note("stream incremental", seconds, added)
                note("stream restore", restore(engine, repo, last_id))
                engine.remove_volume("bench-restored")
            repo = fresh_repo()
            # Which reads the tree first alternates: the second finds it in the page cache.
            if r % 2:
                note("restic backup", bare_restic_backup(src, work / "bare", inits=inits))
            seconds, first_id, added, _same = helper_snapshot(engine, repo, f"h{r}", None)
            note("helper first", seconds, added)
            if not r % 2:
                note("restic backup", bare_restic_backup(src, work / "bare", inits=inits))
            note("make repository, restic init", inits[-1])
            # 1 %: 10 MiB inside one large file (restic reads that whole file again:
            # it skips unchanged files, not unchanged parts) and 64 small files.
            change_one_percent(src, r * 2 + 2)
            os.sync()
            seconds, mid_id, added, unchanged = helper_snapshot(engine, repo, f"i{r}", first_id)
            note("helper incremental", seconds, added)
            note("restic incremental", bare_restic_backup(src, work / "bare", fresh=False))
            print(f"  incremental: {unchanged} files unchanged", flush=True)
            # 1 % as whole files: 16 KiB files rewritten.
            change_small_files(src, args.mib, r)
            os.sync()
            seconds, last_id, added, unchanged = helper_snapshot(engine, repo, f"j{r}", mid_id)
            note("helper files", seconds, added)
            note("restic files", bare_restic_backup(src, work / "bare", fresh=False))
            print(f"  incremental (whole files): {unchanged} files unchanged", flush=True)
            if r % 2:
                note("restic restore", bare_restic_restore(repo, last_id, work / "restored"))
            note("helper restore", worker_restore(runtime, repo, last_id))
            engine.remove_volume("bench-restored")
            if not r % 2:
                note("restic restore", bare_restic_restore(repo, last_id, work / "restored"))
            note("command, stretched key", command_cost(work / "bare", fast=False))
            note("command, fast key", command_cost(work / "repo", fast=True))
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
            "restic backup": "snapshot, bare restic backup <dir>",
            "helper first": "snapshot, gpuyard (restic beside)",
            "helper incremental": "  after 1 % changed (in a large file)",
            "restic incremental": "  bare restic, same change",
            "helper files": "  after 1 % changed (whole files)",
            "restic files": "  bare restic, same change",
            "stream first": "snapshot, gpuyard (tar stream)",
            "stream incremental": "  after 1 % changed",
            "baseline restore": "restore, zstd -d | tar x",
            "restic restore": "restore, bare restic restore",
            "helper restore": "restore, gpuyard (restic beside)",
            "stream restore": "restore, gpuyard (tar stream)",
            "command, stretched key": "one restic command, restic's own key",
            "command, fast key": "one restic command, gpuyard's fast key",
            "make repository, restic init": "new repository, restic init",
            "make repository, gpuyard": "new repository, gpuyard's (restic_init)",
        }
        print(f"\ntree: {tree / MIB:.0f} MiB; rounds: {args.rounds}")
        print(f"{'what':40} {'seconds':>8} {'MB/s':>8} {'stored MiB':>11}")
        for key, label in labels.items():
            if key not in med:
                continue
            kept = f"{median([float(x) for x in stored[key]]) / MIB:11.1f}" if key in stored else ""
            rate = "" if key.startswith(("command", "make")) else f"{mb / med[key]:8.1f}"
            print(f"{label:40} {med[key]:8.2f} {rate:>8} {kept}")
        snap_ratio = med["restic backup"] / med["helper first"]
        snap_tar = med["baseline snapshot"] / med["helper first"]
        speedup = med["helper first"] / med["helper incremental"]
        speedup_files = med["helper first"] / med["helper files"]
        print(
            f"incremental vs bare restic's incremental: "
            f"{med['restic incremental'] / med['helper incremental']:.2f}x (in a large file), "
            f"{med['restic files'] / med['helper files']:.2f}x (whole files); bare restic's own "
            f"first/incremental: {med['restic backup'] / med['restic incremental']:.1f}x, "
            f"{med['restic backup'] / med['restic files']:.1f}x"
        )
        restore_ratio = med["restic restore"] / med["helper restore"]
        restore_tar = med["baseline restore"] / med["helper restore"]
        if args.with_stream:
            print(
                f"tar stream: snapshot {med['restic backup'] / med['stream first']:.2f}x, "
                f"incremental {med['stream first'] / med['stream incremental']:.1f}x faster, "
                f"restore {med['restic restore'] / med['stream restore']:.2f}x"
            )

        def verdict(ok: bool) -> str:
            return "met" if ok else "NOT met"

        print(
            f"RATIO snapshot {snap_ratio:.2f}x bare restic backup (goal >= 0.9: "
            f"{verdict(snap_ratio >= 0.9)}), {snap_tar:.2f}x tar | zstd; "
            f"incremental {speedup:.1f}x faster than the first (goal >= 10: "
            f"{verdict(speedup >= 10)}; {speedup_files:.1f}x for whole files); restore {restore_ratio:.2f}x bare restic restore "
            f"(goal >= 0.9: {verdict(restore_ratio >= 0.9)}), {restore_tar:.2f}x zstd -d | tar x"
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
