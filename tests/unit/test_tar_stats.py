"""TarCounter agrees with tarfile on archives of every format, however the stream is cut."""

from __future__ import annotations

import io
import os
import random
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.storage.tar_stats import TarCounter, counted
from tests.required_parts import needs_tools


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.isreg() else None)


def make_tar(fmt: int, *, big: int = 150_007) -> bytes:
    """An archive with a root ``.``, long names, an empty directory, links, an empty
    file and a big file, in the given tarfile format."""
    rng = random.Random(fmt)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        _add(tar, ".", type=tarfile.DIRTYPE, mode=0o755)
        _add(tar, "./empty-dir", type=tarfile.DIRTYPE)
        _add(tar, "./a.txt", b"hello\n")
        _add(tar, "./zero", b"")
        long_dir = "./" + "d" * 120
        _add(tar, long_dir, type=tarfile.DIRTYPE)
        _add(tar, long_dir + "/" + "f" * 130, rng.randbytes(1000))
        _add(tar, "./link", type=tarfile.SYMTYPE, linkname="a.txt")
        _add(tar, "./hard", type=tarfile.LNKTYPE, linkname="./a.txt")
        _add(tar, "./long-link", type=tarfile.SYMTYPE, linkname="x" * 150)
        _add(tar, "./exact-block", rng.randbytes(512))
        _add(tar, "./big.bin", rng.randbytes(big))
        _add(tar, "./fifo", type=tarfile.FIFOTYPE)
        # A pax header with a record tarfile writes for non-ASCII names.
        _add(tar, "./ünïcode.txt", b"x" * 513)
    return buf.getvalue()


def expected(archive: bytes) -> tuple[int, int]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        members = tar.getmembers()
    files = [m for m in members if m.isreg() or m.islnk()]
    return len(files), sum(m.size for m in members if m.isreg())


def cut(data: bytes, sizes: list[int]) -> Iterator[bytes]:
    pos, i = 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        yield data[pos : pos + size]
        pos += size
        i += 1


def count(chunks: Iterator[bytes]) -> TarCounter:
    counter = TarCounter()
    for chunk in chunks:
        counter.feed(chunk)
    return counter


ARCHIVES = {
    tarfile.GNU_FORMAT: make_tar(tarfile.GNU_FORMAT),
    tarfile.PAX_FORMAT: make_tar(tarfile.PAX_FORMAT),
}
EXPECTED = {fmt: expected(archive) for fmt, archive in ARCHIVES.items()}


@pytest.mark.parametrize("fmt", sorted(ARCHIVES), ids=["gnu", "pax"])
@pytest.mark.parametrize("size", [1, 511, 512, 513, 64 * 1024, 10**9])
def test_counts_match_tarfile_for_fixed_chunk_sizes(fmt: int, size: int) -> None:
    archive = ARCHIVES[fmt]
    counter = count(cut(archive, [size]))
    assert counter.malformed is None
    assert counter.finished
    assert (counter.file_count, counter.content_bytes) == expected(archive)
    assert counter.file_count == 7  # the files and the hard link


@given(
    fmt=st.sampled_from(sorted(ARCHIVES)),
    sizes=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=20),
)
@settings(max_examples=60, deadline=None)
def test_counts_match_tarfile_for_random_cuts(fmt: int, sizes: list[int]) -> None:
    archive = ARCHIVES[fmt]
    counter = count(cut(archive, sizes))
    assert (counter.file_count, counter.content_bytes) == EXPECTED[fmt]
    assert counter.finished


def test_ustar_prefix_names_and_memoryview_chunks() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, "./" + "p" * 90 + "/" + "n" * 90, b"abc")  # split into prefix + name
        _add(tar, "./dir", type=tarfile.DIRTYPE)
    archive = buf.getvalue()
    counter = TarCounter()
    view = memoryview(bytearray(archive))
    for pos in range(0, len(view), 700):
        counter.feed(view[pos : pos + 700])
    assert (counter.file_count, counter.content_bytes) == expected(archive) == (1, 3)


def test_pax_size_record_overrides_the_size_field() -> None:
    # tarfile writes sizes of 8 GiB and more as a pax record with 0 in the header; a
    # stream of that size is too big for a unit test, so force the record instead.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("./f")
        info.size = 4000
        info.pax_headers = {"size": "4000"}
        tar.addfile(info, io.BytesIO(b"z" * 4000))
        _add(tar, "./g", b"q" * 10)
    archive = bytearray(buf.getvalue())
    # Find f's own header (after the pax header and its data) and zero its size field.
    header = archive.index(b"./f", 512)
    archive[header + 124 : header + 136] = b"00000000000\0"
    archive[header + 148 : header + 156] = b" " * 8
    checksum = sum(archive[header : header + 512])
    archive[header + 148 : header + 156] = b"%06o\0 " % checksum
    counter = count(cut(bytes(archive), [100]))
    assert (counter.file_count, counter.content_bytes) == expected(bytes(archive)) == (2, 4010)


def test_gnu_base256_size_is_read() -> None:
    archive = bytearray(ARCHIVES[tarfile.GNU_FORMAT])
    header = archive.index(b"./big.bin")
    size = int(archive[header + 124 : header + 135], 8)
    archive[header + 124 : header + 136] = b"\x80" + size.to_bytes(11, "big")
    archive[header + 148 : header + 156] = b" " * 8
    checksum = sum(archive[header : header + 512])
    archive[header + 148 : header + 156] = b"%06o\0 " % checksum
    counter = count(cut(bytes(archive), [4096]))
    assert (counter.file_count, counter.content_bytes) == expected(bytes(archive))


def test_stops_at_end_of_archive_and_ignores_trailing_bytes() -> None:
    archive = ARCHIVES[tarfile.GNU_FORMAT] + b"garbage after the end" * 100
    counter = count(cut(archive, [777]))
    assert counter.finished and counter.malformed is None
    assert counter.file_count == 7  # the files and the hard link


def test_truncated_stream_is_not_finished() -> None:
    archive = ARCHIVES[tarfile.PAX_FORMAT]
    counter = count(cut(archive[: len(archive) // 2], [1000]))
    assert not counter.finished
    assert counter.malformed is None


def test_non_tar_stream_is_reported_malformed_without_raising() -> None:
    counter = count(cut(os.urandom(10_000), [300]))
    assert counter.malformed is not None and "offset 0" in counter.malformed
    assert counter.file_count == 0 and not counter.finished


def test_counted_yields_the_same_chunks() -> None:
    archive = ARCHIVES[tarfile.GNU_FORMAT]
    counter = TarCounter()
    chunks = list(cut(archive, [333]))
    assert list(counted(iter(chunks), counter)) == chunks
    assert counter.file_count == 7  # the files and the hard link


@needs_tools("tar", how="apt-get install tar (GNU tar)")
def test_gnu_tar_sparse_and_real_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub" / "empty").mkdir(parents=True)
    (src / "sub" / "f").write_bytes(b"data" * 1000)
    with (src / "sparse").open("wb") as f:
        # Many holes, so the sparse map needs extension blocks.
        for i in range(40):
            f.seek(i * 65536)
            f.write(b"s" * 10)
        f.truncate(40 * 65536 + 5)
    (src / "sym").symlink_to("sub/f")
    os.link(src / "sub" / "f", src / "hard")
    for fmt in ("gnu", "posix", "oldgnu"):
        archive = subprocess.run(
            ["tar", "--sparse", f"--format={fmt}", "-C", str(src), "-cf", "-", "."],
            check=True,
            capture_output=True,
        ).stdout
        counter = count(cut(archive, [1000]))
        assert counter.malformed is None and counter.finished, fmt
        # sub/f, sparse and the hard link: directories and the symlink are no files.
        assert (counter.file_count, counter.content_bytes) == expected(archive), fmt
        assert expected(archive) == (3, 4000 + 40 * 65536 + 5), fmt


def test_large_file_contents_cost_nothing_per_byte() -> None:
    # 1 GiB of one file's data in 1 MiB chunks: the counter must only subtract.
    info = tarfile.TarInfo("./huge")
    info.size = 1 << 30
    chunk = bytes(1 << 20)
    counter = TarCounter()
    counter.feed(info.tobuf(format=tarfile.GNU_FORMAT))
    # The fastest of 16 runs of 64 chunks: one preemption of a loaded machine must not
    # count, a cost per byte (~1 ms per MiB chunk) shows in every run.
    fastest = float("inf")
    for _ in range(16):
        start = time.perf_counter()
        for _ in range(64):
            counter.feed(chunk)
        fastest = min(fastest, time.perf_counter() - start)
    counter.feed(bytes(1024))
    assert counter.finished and counter.content_bytes == 1 << 30
    assert fastest / 64 < 50e-6, f"{fastest / 64 * 1e6:.1f} µs per chunk"
