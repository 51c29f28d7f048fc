"""A ``tree`` snapshot (the volume's files under ``/data``, taken by restic beside the
volume in earlier versions) read back as the tar stream a volume's helper makes
(runtimes/volumes/copy.py ``volume_tar_stream``), restored through the engine's archive
upload: restic runs here, on the control plane, and never where a volume is mounted.

``restic dump ID /data`` (restic 0.14) names entries ``data/...`` with no entry for the
root, writes every hard link as a full copy, FIFOs and device nodes as empty regular
files, and rounds mtimes to the nearest second; the rewriter here mends all of that
from the snapshot's own records, entry by entry, holding no file whole.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import re
import tarfile
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.volumes.copy import MOUNT
from gpuyard.storage.restic import ResticRepository, check_id

_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d)")
# Tar header fields that pax records may override: set afresh when an entry is renamed.
_PAX_FIELDS = frozenset(
    ("path", "linkpath", "size", "uid", "gid", "uname", "gname", "mtime", "atime", "ctime")
)
# Go's os.FileMode bits for set-uid, set-gid and sticky.
_GO_SETUID, _GO_SETGID, _GO_STICKY = 1 << 23, 1 << 22, 1 << 20
# The dump's re-written stream comes in chunks of about this size.
DEFAULT_CHUNK_SIZE = 1 << 20


@contextlib.contextmanager
def dump_as_volume_tar(
    repository: ResticRepository, restic_id: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Iterator[Iterator[bytes]]:
    """Snapshot ``restic_id`` (a ``tree``: the volume's files under ``/data``) as the tar stream
    :func:`~gpuyard.runtimes.volumes.copy.volume_tar_stream` makes of a volume: entries
    named ``./...``, the root first as ``.`` with the volume root's owner, mode and
    mtime, hard links as links, FIFOs and device nodes as such; for
    :func:`~gpuyard.runtimes.volumes.copy.fill_volume` on an engine where no helper can
    run. Chunks of about ``chunk_size`` bytes; no file is held whole.

    ``restic dump`` gives the entries and contents; ``restic find --long``, run beside
    it, gives each entry's own record (both walk the snapshot in the same order: by
    name, each directory before what it holds), which mends what the dump gets wrong
    (see the module docstring; its mtimes are also rounded to the nearest second, where
    ``tar`` truncates). The inode or device number of a file with several links or of a
    device node is read from its directory's tree (one more restic run per such
    directory, about half a second each). After the last chunk the iterator raises
    ResticError if restic failed, RuntimeFailure for a snapshot without ``/data`` or a
    dump that does not match the snapshot's records."""
    check_id(restic_id)
    with (
        repository.find_nodes(restic_id) as nodes,
        repository.dump_stream(restic_id, MOUNT, chunk_size=chunk_size) as chunks,
    ):
        yield _volume_tar(chunks, nodes, _Trees(repository, restic_id), chunk_size)


class _Trees:
    """The snapshot's tree records by path, read (``restic cat blob``) a directory at a
    time, only for the directories asked about and those above them."""

    def __init__(self, repository: ResticRepository, restic_id: str) -> None:
        self._repository = repository
        self._restic_id = restic_id
        self._dirs: dict[str, dict[str, dict[str, Any]]] = {}

    def node(self, path: str) -> dict[str, Any] | None:
        """The record of ``path`` (as ``restic find`` prints it), None when not found."""
        children = self._children(posixpath.dirname(path))
        return None if children is None else children.get(posixpath.basename(path))

    def _children(self, directory: str) -> dict[str, dict[str, Any]] | None:
        if directory not in self._dirs:
            if directory == "/":
                tree_id = self._repository.cat_json("snapshot", self._restic_id).get("tree")
            else:
                parent = self.node(directory)
                tree_id = parent.get("subtree") if parent is not None else None
            if not isinstance(tree_id, str):
                return None
            tree = self._repository.cat_json("blob", tree_id)
            nodes = tree.get("nodes") if isinstance(tree, dict) else None
            self._dirs[directory] = {
                str(n["name"]): n for n in nodes or [] if isinstance(n, dict) and "name" in n
            }
        return self._dirs[directory]


class _ChunkRaw(io.RawIOBase):
    """A raw binary reader over an iterator of byte chunks (no copy beyond the read)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        super().__init__()
        self._chunks = chunks
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            try:
                self._left = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def _volume_tar(
    chunks: Iterator[bytes], nodes: Iterator[dict[str, Any]], trees: _Trees, chunk_size: int
) -> Iterator[bytes]:
    """Re-write restic's dump of ``/data`` (entries ``data/...``), entry by entry beside
    the snapshot's records ``nodes`` (the first: ``/data`` itself), as a volume tar."""
    chunks = iter(chunks)
    root = next(nodes, None)
    if root is None or root.get("path") != MOUNT:
        raise RuntimeFailure(
            f"the snapshot holds no {MOUNT}: not a volume taken by a restic helper",
            {"first": None if root is None else root.get("path")},
        )
    out = bytearray(_root_entry(root))
    first_of: dict[tuple[int, int], str] = {}  # inode -> the name that carries its data
    source = io.BufferedReader(_ChunkRaw(chunks), chunk_size)
    with tarfile.open(fileobj=source, mode="r|", bufsize=chunk_size) as tar:
        for member in tar:
            name = _volume_name(member.name)
            node = next(nodes, None)
            if node is None or not _same_path(str(node.get("path")), MOUNT + name[1:]):
                raise RuntimeFailure(
                    f"restic's dump of {name!r} does not match the snapshot's records",
                    {"entry": name, "record": None if node is None else node.get("path")},
                )
            info, copy = _entry(member, name, node, trees, first_of)
            out += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            if copy:
                reader = tar.extractfile(member)
                assert reader is not None
                while block := reader.read(chunk_size):
                    out += block
                    if len(out) >= chunk_size:
                        yield bytes(out)
                        out.clear()
                out += bytes(-member.size % tarfile.BLOCKSIZE)
            if len(out) >= chunk_size:
                yield bytes(out)
                out.clear()
    # The ends of both outputs: restic's exit statuses are checked after them.
    for _ in nodes:
        pass
    for _ in chunks:
        pass
    out += bytes(2 * tarfile.BLOCKSIZE)
    yield bytes(out)


def _entry(
    member: tarfile.TarInfo,
    name: str,
    node: dict[str, Any],
    trees: _Trees,
    first_of: dict[tuple[int, int], str],
) -> tuple[tarfile.TarInfo, bool]:
    """The entry for the dump's ``member`` named ``name``, mended from its record
    ``node``; and whether its content follows."""
    info = tarfile.TarInfo(name)
    info.type = member.type
    info.mode, info.uid, info.gid = member.mode, member.uid, member.gid
    info.mtime = _seconds(str(node.get("mtime")))
    info.size = member.size if member.isreg() else 0
    info.linkname = member.linkname
    info.uname = info.gname = ""  # owners travel by number only
    info.pax_headers = {k: v for k, v in member.pax_headers.items() if k not in _PAX_FIELDS}
    kind, path = node.get("type"), str(node.get("path"))
    if kind == "fifo":
        info.type, info.size = tarfile.FIFOTYPE, 0
    elif kind in ("dev", "chardev"):
        found = trees.node(path)
        if found is None or "device" not in found:
            raise RuntimeFailure(f"no device number for {name!r} in the snapshot's records")
        info.type = tarfile.CHRTYPE if kind == "chardev" else tarfile.BLKTYPE
        info.size = 0
        device = int(found["device"])
        info.devmajor, info.devminor = os.major(device), os.minor(device)
    elif kind == "file" and int(node.get("links") or 1) > 1:
        found = trees.node(path)
        if found is not None and "inode" in found:  # else (an odd name): a plain copy
            inode = (int(found.get("device_id") or 0), int(found["inode"]))
            if inode in first_of:
                info.type, info.linkname, info.size = tarfile.LNKTYPE, first_of[inode], 0
            else:
                first_of[inode] = name
    elif member.islnk():
        info.linkname = _volume_name(member.linkname)
    return info, info.isreg() and info.size > 0


def _same_path(record: str, entry: str) -> bool:
    """Whether a record's path and a dump entry's name are the same path. A name that is
    not UTF-8 reads differently in each (U+FFFD in the record's JSON, surrogate escapes
    in the tar): the common walk order is trusted for those."""
    if record == entry:
        return True
    return "\ufffd" in record or any("\udc80" <= c <= "\udcff" for c in entry)


def _root_entry(root: dict[str, Any]) -> bytes:
    """The ``.`` entry from ``/data``'s record: a plain header (no pax record before
    it), as fill_volume reads the root's metadata from the stream's first 512 bytes."""
    info = tarfile.TarInfo(".")
    info.type = tarfile.DIRTYPE
    info.mode = _unix_mode(int(root.get("mode") or 0))
    info.uid, info.gid = int(root.get("uid") or 0), int(root.get("gid") or 0)
    info.mtime = _seconds(str(root.get("mtime")))
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _volume_name(name: str) -> str:
    """``data/x/y`` -> ``./x/y``; ``data`` -> ``.``."""
    head, _, rest = name.strip("/").partition("/")
    if head != MOUNT.strip("/"):
        raise RuntimeFailure(f"restic's dump holds {name!r}, outside {MOUNT}")
    return f"./{rest}" if rest else "."


def _unix_mode(go_mode: int) -> int:
    """Permission and set-id/sticky bits of a Go ``os.FileMode`` (restic's ``mode``)."""
    mode = go_mode & 0o777
    for go_bit, bit in ((_GO_SETUID, 0o4000), (_GO_SETGID, 0o2000), (_GO_STICKY, 0o1000)):
        if go_mode & go_bit:
            mode |= bit
    return mode


def _seconds(text: str) -> int:
    """Whole seconds since the epoch of restic's RFC 3339 time (nanoseconds dropped)."""
    found = _TIME.fullmatch(text)
    if found is None:
        raise RuntimeFailure(f"restic printed a time it should not: {text!r}")
    zone = "+00:00" if found.group(2) == "Z" else found.group(2)
    return int(datetime.fromisoformat(found.group(1) + zone).timestamp())
