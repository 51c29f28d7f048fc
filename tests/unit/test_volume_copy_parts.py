"""The pure parts of the volume copy: frame demultiplexing, progress, the root's
metadata, the tree manifest, error classification, and the helper image's naming."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

import docker.errors
import pytest
import requests

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.engines.helper_image import helper_tag, imported_id
from gpuyard.runtimes.volumes.copy import (
    ProgressMeter,
    RootMeta,
    SourceUnreachable,
    TruncatedStream,
    VolumeCopyFailed,
    copy_volume,
    demux_stdout,
    fix_root_script,
    is_unreachable,
    root_meta,
    tree_manifest,
)


def frame(kind: int, data: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def reader(data: bytes, step: int) -> object:
    """A readinto over ``data`` that gives at most ``step`` bytes a call."""
    pos = 0

    def readinto(view: memoryview) -> int:
        nonlocal pos
        n = min(step, len(view), len(data) - pos)
        view[:n] = data[pos : pos + n]
        pos += n
        return n

    return readinto


@pytest.mark.parametrize("step", [1, 3, 7, 8, 9, 4096, 1 << 20])
def test_demux_keeps_stdout_whatever_the_read_sizes(step: int) -> None:
    out = b"".join(bytes([i % 251]) * (i * 37) for i in range(1, 60))
    stream = b"".join(
        frame(1, out[i : i + 1000]) + (frame(2, b"warn\n") if i % 5000 == 0 else b"")
        for i in range(0, len(out), 1000)
    )
    stderr = bytearray()
    chunks = list(demux_stdout(reader(stream, step), 4096, stderr))  # type: ignore[arg-type]
    assert b"".join(chunks) == out
    assert all(len(c) >= 4096 for c in chunks[:-1])
    assert stderr.startswith(b"warn\nwarn\n")


def test_demux_bounds_stderr_and_chunks_are_fresh_objects() -> None:
    stream = frame(2, b"x" * 10_000) + frame(1, b"a" * 5000) + frame(1, b"b" * 5000)
    stderr = bytearray()
    chunks = list(demux_stdout(reader(stream, 3000), 4096, stderr, stderr_limit=100))  # type: ignore[arg-type]
    assert len(stderr) == 100
    assert b"".join(chunks) == b"a" * 5000 + b"b" * 5000
    assert len({id(c) for c in chunks}) == len(chunks)


@pytest.mark.parametrize("cut", [3, 8 + 10])
def test_demux_refuses_a_stream_cut_inside_a_frame(cut: int) -> None:
    stream = frame(1, b"z" * 100)[:cut]
    with pytest.raises(TruncatedStream):
        list(demux_stdout(reader(stream, 64), 4096, bytearray()))  # type: ignore[arg-type]


def test_progress_is_throttled_monotonic_and_always_ends_with_the_total() -> None:
    now = [0.0]
    told: list[int] = []
    meter = ProgressMeter(told.append, interval_s=1.0, clock=lambda: now[0])
    for _ in range(10):
        meter.add(100)
        now[0] += 0.25
    meter.finish()
    assert told == sorted(told) and told[-1] == 1000
    assert len(told) == 3  # at t=1.0, t=2.0, then the end
    meter.finish()
    assert len(told) == 3  # nothing new to tell


def tar_bytes(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def entry(name: str, kind: bytes = tarfile.REGTYPE, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mtime = 1_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def test_root_meta_reads_the_first_entry_only_when_it_is_the_root() -> None:
    root = entry(".", tarfile.DIRTYPE, mode=0o700, uid=1000, gid=1001)
    stream = tar_bytes([(root, b""), (entry("./f"), b"x")])
    assert root_meta(stream[:512]) == RootMeta(mode=0o700, uid=1000, gid=1001, mtime=1_000_000)
    assert root_meta(tar_bytes([(entry("./f"), b"x")])) is None
    assert root_meta(b"\0" * 512) is None


def test_fix_root_script_sets_owner_before_mode_and_time() -> None:
    script = fix_root_script(RootMeta(mode=0o2770, uid=1000, gid=5, mtime=42)).decode()
    lines = script.splitlines()
    assert lines == [
        "set -e",
        "chown 1000:5 /data",
        "chmod 2770 /data",
        "touch -c -d @42 /data",
    ]


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_manifest_ignores_entry_order_and_the_name_prefix_but_sees_metadata() -> None:
    def tree(order: list[str], prefix: str, uid: int = 1234) -> bytes:
        entries = {
            "": (entry(prefix or ".", tarfile.DIRTYPE, mode=0o755), b""),
            "f": (entry(f"{prefix}f", mode=0o4755), b"hello"),
            "h": (entry(f"{prefix}h", tarfile.LNKTYPE, linkname=f"{prefix}f"), b""),
            "s": (entry(f"{prefix}s", tarfile.SYMTYPE, linkname="f"), b""),
            "d": (entry(f"{prefix}d", tarfile.DIRTYPE, uid=uid), b""),
        }
        return tar_bytes([entries[k] for k in order])

    a = tree(["", "f", "h", "s", "d"], "./")
    b = tree(["", "d", "s", "f", "h"], "./")
    assert tree_manifest(chunked(a, 100)) == tree_manifest(chunked(b, 333))
    assert tree_manifest([a]) != tree_manifest([tree(["", "f", "h", "s", "d"], "./", uid=0)])
    lines = "\n".join(tree_manifest([a]))
    assert '"hardlinks": "f"' in lines and '"mode": "0o4755"' in lines


def test_manifest_hard_links_are_one_group_whichever_name_came_first() -> None:
    def tree(first: str, second: str) -> bytes:
        return tar_bytes(
            [(entry(f"./{first}"), b"data"),
             (entry(f"./{second}", tarfile.LNKTYPE, linkname=f"./{first}"), b"")]
        )  # fmt: skip

    assert tree_manifest([tree("a", "b")]) == tree_manifest([tree("b", "a")])


def test_unreachable_is_told_apart_from_a_refusal() -> None:
    try:
        try:
            raise requests.exceptions.ConnectionError("refused")
        except requests.exceptions.ConnectionError as inner:
            raise RuntimeFailure("no container engine reachable") from inner
    except RuntimeFailure as outer:
        assert is_unreachable(outer)
    assert is_unreachable(requests.exceptions.ReadTimeout("slow"))
    assert not is_unreachable(docker.errors.APIError("volume in use"))
    assert not is_unreachable(RuntimeFailure("creating container failed: no space"))


def test_source_unreachable_is_a_volume_copy_failure_of_the_source() -> None:
    err = SourceUnreachable("down", {"engine": "tcp://x"})
    assert isinstance(err, VolumeCopyFailed) and isinstance(err, RuntimeFailure)
    assert err.side == "source" and err.unreachable
    assert err.details["side"] == "source" and err.details["engine"] == "tcp://x"


def test_copy_refuses_a_volume_onto_itself_and_tiny_chunks() -> None:
    engine = Engine("unix:///nonexistent/engine.sock", owner=Ownership.new())
    with pytest.raises(ValueError, match="onto itself"):
        copy_volume(engine, "v", engine, "v")
    with pytest.raises(ValueError, match="512"):
        copy_volume(engine, "v", engine, "w", chunk_size=100)


def test_copy_from_a_dead_engine_raises_source_unreachable_before_touching_the_target() -> None:
    owner = Ownership.new()
    dead = Engine("unix:///nonexistent/engine.sock", owner=owner, timeout_s=2)
    also_dead = Engine("unix:///nonexistent/other.sock", owner=owner, timeout_s=2)
    with pytest.raises(SourceUnreachable) as info:
        copy_volume(dead, "v", also_dead, "w")
    assert info.value.code == "RUNTIME_ERROR" and info.value.details["side"] == "source"


def test_helper_tag_and_import_answer() -> None:
    assert helper_tag(b"abc") == helper_tag(b"abc") != helper_tag(b"abd")
    assert len(helper_tag(b"abc")) == 12
    answer = '{"status":"sha256:aa11","progress":""}\n{"status":"done"}\n'
    assert imported_id(answer) == "sha256:aa11"
    assert imported_id(b'{"id":"sha256:bb22"}') == "sha256:bb22"
    assert imported_id("not json") is None
