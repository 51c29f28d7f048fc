"""Copy a volume from one host's container engine to another's, byte for byte, through
the Engine API alone (no agent on either host, never through the user's container).

Two helper containers of ours (the helper image, runtimes/engines/helper_image.py) do it: one
on the source host mounts the source volume read-only and runs ``tar c`` of it; one on
the target host mounts the emptied target volume and is only created, never started.
gpuyard reads the tar stream from the source helper's attach stream and sends it,
chunk by chunk and never whole in memory, as the body of the target's archive upload
(``PUT /containers/{id}/archive``), which unpacks it into the volume.

Why not the source engine's archive download (``GET /containers/{id}/archive``): on
Podman 4.3 it rewrites every entry's owner to the container's user (``podman cp``
semantics), so files owned by uid 1234 would arrive owned by root. The upload keeps the
tar's owners on Podman and Docker alike (``copyUIDGID`` is left off). Both engines
accept a chunked upload, so the stream needs no length known in advance.

What survives the trip: contents, owners (numeric), modes including setuid/setgid/
sticky, mtimes (directories too), symlinks, hard links, empty directories, device
nodes and FIFOs, long names, and the volume root's own owner, mode and mtime. What
does not: extended attributes and ACLs (busybox tar writes none), and holes in sparse
files (they arrive filled with zeros).

The receiver is started once after the upload, running a script that sets the root's
owner, mode and mtime from the stream's ``.`` entry. That start is the target volume's
first mount, where the engine gives the root the mountpoint's owner and mode and copies
the image's files there into an empty volume: done by our helper, it is undone at once;
left to the user's container, it would change the root and merge that image's files
into the copied volume. (The same first-mount rule is why a volume is always mounted by
its cluster before anything reads it.)

The target volume is removed and made again first (with the source volume's labels,
ours replacing its ownership labels), so a copy retried after a failure converges on
the source's content instead of merging with stale files. Helpers are removed when the
copy ends, failed or not; a helper left by a process that died mid-copy is removed by
the next copy of the same volume. A failure raises :class:`VolumeCopyFailed`, which says
which side failed; :class:`SourceUnreachable` when the source engine cannot be reached
(the volume cannot be read at all; callers answer 409 HOST_UNREACHABLE).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import secrets
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import docker.errors
import requests

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_INSTALLATION, LABEL_MANAGED
from gpuyard.runtimes.engines.engine import Engine, reason
from gpuyard.runtimes.engines.helper_image import ensure_helper_image, forget_helper_image

# Marks our helper containers, and which volume each one holds.
LABEL_ROLE = "gpuyard.role"
ROLE_VOLUME_COPY = "volume-copy"
LABEL_HELPER_VOLUME = "gpuyard.helper_volume"
# Where a helper mounts its volume.
MOUNT = "/data"
# The receiving helper's command: a script uploaded once the volume is in.
FIX_ROOT_SCRIPT = "gy-fix-root"
# How much of the stream is gathered before it is handed on: large enough that the
# per-chunk Python work is negligible, small enough to bound memory (one chunk in
# flight, plus the socket buffers).
DEFAULT_CHUNK_SIZE = 1 << 20
# How often the progress callback is called at most (it usually writes to a database).
PROGRESS_INTERVAL_S = 0.5

Side = Literal["source", "target"]
# A piece of a tar stream (the reader hands on its own buffers, no copy).
Chunk = bytes | bytearray
Progress = Callable[[int], None]


class VolumeCopyFailed(RuntimeFailure):
    """A volume copy failed; ``side`` says whose engine failed, ``unreachable`` whether
    that engine could not be reached at all. Nothing on the source was changed."""

    def __init__(
        self,
        message: str,
        *,
        side: Side,
        unreachable: bool = False,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, {"side": side, "unreachable": unreachable, **(details or {})})
        self.side: Side = side
        self.unreachable = unreachable


class SourceUnreachable(VolumeCopyFailed):
    """The source host's engine did not answer: its volume cannot be read."""

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, side="source", unreachable=True, details=details)


@dataclass(frozen=True)
class CopyResult:
    """What a copy moved: ``bytes_copied`` counts the tar stream (file contents plus a
    512-byte header per entry and padding to 512 bytes), ``seconds`` the whole copy
    including the helpers' set-up."""

    bytes_copied: int
    seconds: float
    source: str
    target: str
    source_volume: str
    target_volume: str

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_copied / self.seconds if self.seconds > 0 else 0.0


# -- pure parts ------------------------------------------------------------------------


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a transport failure: the engine did not
    answer, as opposed to answering with a refusal."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
            return True
        if isinstance(seen, ConnectionError | TimeoutError):
            return True
        if isinstance(seen, docker.errors.DockerException) and (
            "Error while fetching server API version" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class ProgressMeter:
    """Counts bytes and tells ``callback`` the running total at most every
    ``interval_s`` (by ``clock``), and always at :meth:`finish`."""

    def __init__(
        self,
        callback: Progress | None,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = 0
        self._callback = callback
        self._interval_s = interval_s
        self._clock = clock
        self._next_at = clock() + interval_s
        self._told = -1

    def add(self, n: int) -> None:
        self.total += n
        if self._callback is not None and self._clock() >= self._next_at:
            self._tell()

    def finish(self) -> None:
        if self._callback is not None and self._told != self.total:
            self._tell()

    def _tell(self) -> None:
        assert self._callback is not None
        self._told = self.total
        self._next_at = self._clock() + self._interval_s
        self._callback(self.total)


class TruncatedStream(Exception):
    """The attach stream ended inside a frame."""


def demux_stdout(
    readinto: Callable[[memoryview], int],
    chunk_size: int,
    stderr: bytearray,
    stderr_limit: int = 4096,
) -> Iterator[bytearray]:
    """The stdout bytes of a multiplexed attach stream (8-byte frame headers: stream
    type, 3 zero bytes, big-endian length) in chunks of at least ``chunk_size`` bytes
    (the last may be shorter; each chunk a new object the consumer may keep). The first
    ``stderr_limit`` bytes of stderr go to ``stderr``. ``readinto`` fills the view it
    is given and returns the count, 0 at the end of the stream.

    Reads in blocks of ``chunk_size`` rather than frame by frame: engines send frames
    of a few KiB (conmon's buffer is 8 KiB), and a Python call per frame was most of
    the copy's CPU. Raises :class:`TruncatedStream` when the stream ends mid-frame."""
    block = bytearray(max(chunk_size, 1 << 16))
    view = memoryview(block)
    out = bytearray()
    header = bytearray()
    kind, remaining = 0, 0
    while n := readinto(view):
        i = 0
        while i < n:
            if remaining == 0:
                take = min(8 - len(header), n - i)
                header += view[i : i + take]
                i += take
                if len(header) == 8:
                    kind, remaining = header[0], int.from_bytes(header[4:8], "big")
                    header.clear()
                continue
            take = min(remaining, n - i)
            if kind == 1:
                out += view[i : i + take]
            elif kind == 2 and len(stderr) < stderr_limit:
                stderr += view[i : i + min(take, stderr_limit - len(stderr))]
            i += take
            remaining -= take
        if len(out) >= chunk_size:
            yield out
            out = bytearray()
    if header or remaining:
        raise TruncatedStream(f"the stream ended inside a frame ({remaining} bytes missing)")
    if out:
        yield out


def socket_reader(sock: Any) -> Callable[[memoryview], int]:
    """A ``readinto`` for the SDK's raw attach socket, whichever kind the transport
    gives (a socket, a socket file, an SSH channel)."""
    if hasattr(sock, "recv_into"):
        return cast(Callable[[memoryview], int], sock.recv_into)
    if hasattr(sock, "readinto"):

        def readinto(view: memoryview) -> int:
            return int(sock.readinto(view) or 0)

        return readinto

    def recv(view: memoryview) -> int:
        data = sock.recv(len(view))
        view[: len(data)] = data
        return len(data)

    return recv


@dataclass(frozen=True)
class RootMeta:
    """The volume root's own metadata, from the stream's first entry (``.``)."""

    mode: int
    uid: int
    gid: int
    mtime: int


def root_meta(first_chunk: Chunk) -> RootMeta | None:
    """The metadata of the tar stream's first entry when it is the root directory
    (``.``), else None. ``first_chunk`` holds at least its 512-byte header."""
    try:
        info = tarfile.TarInfo.frombuf(bytes(first_chunk[:512]), "utf-8", "surrogateescape")
    except tarfile.TarError:
        return None
    if info.name.rstrip("/") not in (".", "") or not info.isdir():
        return None
    return RootMeta(mode=info.mode, uid=info.uid, gid=info.gid, mtime=int(info.mtime))


def fix_root_script(meta: RootMeta) -> bytes:
    """A shell script giving the mounted target volume's root the source root's owner,
    mode and mtime, after the engine's first-mount handling changed them (see the
    module docstring). Owner first: chown clears set-id bits."""
    return (
        f"set -e\nchown {meta.uid}:{meta.gid} {MOUNT}\nchmod {meta.mode & 0o7777:o} {MOUNT}\n"
        f"touch -c -d @{meta.mtime} {MOUNT}\n"
    ).encode()


def script_tar(name: str, script: bytes) -> bytes:
    """A one-file tar holding ``script`` as ``name`` (mode 0755)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(script)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(script))
    return buf.getvalue()


class _ChunkReader:
    """A read-only file over an iterator of byte chunks (for tarfile's stream mode)."""

    def __init__(self, chunks: Iterable[Chunk]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._chunks)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


def _entry_name(name: str) -> str:
    """An entry's path inside the volume: the leading ``data/`` (or ``./``) dropped."""
    head, _, rest = name.strip("/").partition("/")
    return rest if head in (MOUNT.strip("/"), ".") else name.strip("/")


def tree_manifest(chunks: Iterable[Chunk]) -> list[str]:
    """One sorted line per entry of the tar stream ``chunks``: name, type, mode, owner,
    mtime, content SHA-256 (regular files), link target (symlinks), device numbers, the
    hard-link group (the smallest name sharing the inode) and extended attributes.
    Independent of entry order, so two volumes with the same tree list the same even
    when ``tar`` walked their directories in a different order."""
    records: dict[str, dict[str, Any]] = {}
    links: dict[str, str] = {}  # hard link name -> the name it links to
    with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            name = _entry_name(member.name)
            record: dict[str, Any] = {
                "name": name,
                "type": member.type.decode(),
                "mode": oct(member.mode),
                "uid": member.uid,
                "gid": member.gid,
                "mtime": int(member.mtime),
            }
            if member.isreg():
                digest = hashlib.sha256()
                reader = tar.extractfile(member)
                assert reader is not None
                while block := reader.read(1 << 20):
                    digest.update(block)
                record["sha256"] = digest.hexdigest()
                record["size"] = member.size
            elif member.issym():
                record["link"] = member.linkname
            elif member.islnk():
                links[name] = _entry_name(member.linkname)
            elif member.ischr() or member.isblk():
                record["dev"] = [member.devmajor, member.devminor]
            xattrs = {k: v for k, v in member.pax_headers.items() if k.startswith("SCHILY.xattr.")}
            if xattrs:
                record["xattrs"] = dict(sorted(xattrs.items()))
            records[name] = record
    groups: dict[str, set[str]] = {}
    for name, target in links.items():
        while target in links:  # a link to a link: resolve to the first name
            target = links[target]
        groups.setdefault(target, {target}).add(name)
    for target, names in groups.items():
        first = records.get(target, {})
        for name in names:
            # The link's own header describes the same inode: take the first entry's.
            records[name] = {**first, "name": name, "hardlinks": min(names)}
    return sorted(json.dumps(r, sort_keys=True) for r in records.values())


# -- engine parts ----------------------------------------------------------------------


def _side_error(engine: Engine, side: Side, action: str, exc: BaseException) -> VolumeCopyFailed:
    text = exc.message if isinstance(exc, RuntimeFailure) else reason(exc)
    details = {"engine": engine.where, "action": action}
    if is_unreachable(exc):
        if side == "source":
            return SourceUnreachable(
                f"the source host's engine at {engine.where} is unreachable, so the volume "
                f"cannot be read ({action}): {text}",
                details,
            )
        return VolumeCopyFailed(
            f"the target host's engine at {engine.where} is unreachable ({action}): {text}",
            side=side,
            unreachable=True,
            details=details,
        )
    return VolumeCopyFailed(
        f"{action} on the {side} host failed: {text}", side=side, details=details
    )


@contextlib.contextmanager
def _on(engine: Engine, side: Side, action: str) -> Iterator[None]:
    """Every failure inside is a :class:`VolumeCopyFailed` for ``side``."""
    try:
        with engine.errors(action):
            yield
    except VolumeCopyFailed:
        raise
    except Exception as exc:
        raise _side_error(engine, side, action, exc) from exc


def _helper_labels(engine: Engine, volume: str) -> dict[str, str]:
    return engine.labels({LABEL_ROLE: ROLE_VOLUME_COPY, LABEL_HELPER_VOLUME: volume})


def _helper_name(engine: Engine, role: str) -> str:
    return f"{engine.owner.prefix}-mv-{secrets.token_hex(4)}-{role}"


def remove_helpers(
    engine: Engine, volume: str | None = None, *, role: str = ROLE_VOLUME_COPY
) -> list[str]:
    """Remove our helpers of ``role`` (those holding ``volume`` only, when given),
    running or not. Returns their names. Only containers labelled as ours are touched."""
    filters = [f"{LABEL_ROLE}={role}"]
    if volume is not None:
        filters.append(f"{LABEL_HELPER_VOLUME}={volume}")
    removed = []
    for row in engine.list_containers(*filters):
        names = row.get("Names") or [row.get("Id")]
        name = str(names[0]).lstrip("/")
        engine.remove_container(name)
        removed.append(name)
    return removed


def _create_helper(
    engine: Engine, volume: str, role: str, command: list[str], *, read_only: bool
) -> str:
    """Create (not start) a helper with ``volume`` at MOUNT. The source's output (the
    stream) is kept out of the engine's log (disk, time); the receiver's is logged."""
    image = ensure_helper_image(engine)
    name = _helper_name(engine, role)
    kwargs: dict[str, Any] = {
        "command": command,
        "name": name,
        "labels": _helper_labels(engine, volume),
        "network_disabled": True,
        "host_config": engine.api.create_host_config(
            binds={volume: {"bind": MOUNT, "mode": "ro" if read_only else "rw"}},
            network_mode="none",
            **({"log_config": {"Type": "none", "Config": {}}} if read_only else {}),
        ),
    }
    try:
        engine.api.create_container(image, **kwargs)
    except docker.errors.ImageNotFound:
        forget_helper_image(engine)  # removed behind our back: import it again
        engine.api.create_container(ensure_helper_image(engine), **kwargs)
    return name


def _volume_labels(engine: Engine, volume: str) -> dict[str, str]:
    """The labels of our volume ``volume`` (legacy ones included: see Engine.claims).
    Raises VolumeCopyFailed (source side) when it is missing or not ours."""
    try:
        info = engine.api.inspect_volume(volume)
    except docker.errors.NotFound as exc:
        raise VolumeCopyFailed(
            f"volume {volume} does not exist on {engine.where}",
            side="source",
            details={"volume": volume, "reason": "volume_not_found"},
        ) from exc
    labels = dict(info.get("Labels") or {})
    if not engine.claims(labels, legacy=True):
        raise VolumeCopyFailed(
            f"volume {volume} on {engine.where} does not belong to this installation",
            side="source",
            details={"volume": volume, "reason": "not_ours"},
        )
    return labels


def _reset_volume(engine: Engine, volume: str, labels: Mapping[str, str]) -> None:
    """Make ``volume`` exist, ours and empty: a leftover from an earlier attempt is
    removed (with any helper of ours still holding it) and made again."""
    remove_helpers(engine, volume)
    engine.remove_volume(volume)
    carried = {k: v for k, v in labels.items() if k not in (LABEL_INSTALLATION, LABEL_MANAGED)}
    engine.ensure_volume(volume, carried)


@contextlib.contextmanager
def volume_tar_stream(
    engine: Engine, volume: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Iterator[Iterator[Chunk]]:
    """The tar of our volume ``volume`` on ``engine`` as an iterator of chunks (entries
    named ``./...``, the volume root as ``.``), read from a helper running ``tar c`` on
    the volume mounted read-only. The iterator raises VolumeCopyFailed (source side) if
    the stream breaks or tar fails, after the last chunk, so a consumer never takes a
    truncated stream for a whole one. The helper is removed on exit."""
    with _on(engine, "source", f"reading volume {volume}"):
        _volume_labels(engine, volume)
        remove_helpers(engine, volume)  # left by a copy that died mid-way
        name = _create_helper(engine, volume, "src", ["tar", "c", "-C", MOUNT, "."], read_only=True)
    try:
        with _on(engine, "source", f"reading volume {volume}"):
            # Attached before the start, so not a byte is missed.
            sock = engine.api.attach_socket(name, params={"stdout": 1, "stderr": 1, "stream": 1})
            engine.api.start(name)
        yield _drain(engine, volume, name, sock, chunk_size)
    finally:
        with contextlib.suppress(RuntimeFailure):
            engine.remove_container(name)


def _drain(engine: Engine, volume: str, name: str, sock: Any, chunk_size: int) -> Iterator[Chunk]:
    stderr = bytearray()
    truncated = ""
    try:
        with _on(engine, "source", f"reading volume {volume}"):
            try:
                yield from demux_stdout(socket_reader(sock), chunk_size, stderr)
            except TruncatedStream as exc:
                truncated = str(exc)
            status = engine.api.wait(name, timeout=engine.timeout_s)
            code = status.get("StatusCode") if isinstance(status, dict) else status
    finally:
        with contextlib.suppress(OSError):
            sock.close()
    if code != 0 or truncated:
        text = (truncated or stderr.decode(errors="replace")).strip()
        raise VolumeCopyFailed(
            f"tar of volume {volume} on {engine.where} failed (exit {code}): {text[-500:]}",
            side="source",
            details={"volume": volume, "exit_code": code},
        )


def copy_volume(
    source: Engine,
    source_volume: str,
    target: Engine,
    target_volume: str,
    *,
    on_progress: Progress | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
) -> CopyResult:
    """Copy our volume ``source_volume`` on ``source`` to ``target_volume`` on
    ``target`` (made there with the source volume's labels; emptied first, so a retried
    copy converges). ``on_progress`` gets the running byte count at most every
    ``progress_interval_s`` and once at the end. The same engine may be both sides,
    with two different volume names.

    Raises :class:`SourceUnreachable` when the source engine does not answer,
    :class:`VolumeCopyFailed` (``side`` says which) for any other failure; the source
    is never changed, and a failed copy may leave a partial target volume that the next
    copy replaces. ValueError when source and target are the same volume."""
    if source is target and source_volume == target_volume:
        raise ValueError("cannot copy a volume onto itself")
    if chunk_size < 512:
        raise ValueError("chunk_size must be at least one tar block (512 bytes)")
    started = time.monotonic()
    # The source first: an unreachable source must not cost the target its volume.
    with _on(source, "source", f"reading volume {source_volume}"):
        labels = _volume_labels(source, source_volume)
        ensure_helper_image(source)
    with volume_tar_stream(source, source_volume, chunk_size=chunk_size) as chunks:
        copied = fill_volume(
            target,
            target_volume,
            labels,
            chunks,
            on_progress=on_progress,
            progress_interval_s=progress_interval_s,
        )
    return CopyResult(
        bytes_copied=copied,
        seconds=time.monotonic() - started,
        source=source.where,
        target=target.where,
        source_volume=source_volume,
        target_volume=target_volume,
    )


def fill_volume(
    target: Engine,
    target_volume: str,
    labels: Mapping[str, str],
    chunks: Iterable[Chunk],
    *,
    on_progress: Progress | None = None,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
) -> int:
    """Make ``target_volume`` on ``target`` anew (ours, with ``labels`` but ours for
    ownership; an existing one is removed first) and unpack the tar stream ``chunks``
    into it through the engine's archive upload, then give its root the stream's root
    metadata. Returns the stream's length in bytes.

    An exception raised by ``chunks`` aborts the upload and is raised again as it was
    (a VolumeCopyFailed of the source side, a restic error...); a failure of the target
    raises VolumeCopyFailed (target side). Either way the target volume may be left
    partial: callers unpack into a volume nobody uses yet and swap it in on success."""
    meter = ProgressMeter(on_progress, progress_interval_s)
    with _on(target, "target", f"preparing volume {target_volume}"):
        _reset_volume(target, target_volume, labels)
        receiver = _create_helper(
            target, target_volume, "dst", ["sh", f"/{FIX_ROOT_SCRIPT}"], read_only=False
        )
        holder = _hold_mounted(target, target_volume)
    try:
        source_failure: list[BaseException] = []
        roots: list[RootMeta | None] = []

        def body() -> Iterator[Chunk]:
            try:
                for chunk in chunks:
                    if not roots:
                        roots.append(root_meta(chunk))
                    meter.add(len(chunk))
                    yield chunk
            except BaseException as exc:
                # Raised into the upload, which aborts it; re-raised below as it was
                # (the HTTP library may wrap or swallow it).
                source_failure.append(exc)
                raise

        try:
            with _on(target, "target", f"writing volume {target_volume}"):
                target.api.put_archive(receiver, MOUNT, body())
        except VolumeCopyFailed:
            if source_failure:
                raise source_failure[0] from None
            raise
        if source_failure:
            raise source_failure[0]
        if roots and roots[0] is not None:
            _fix_root(target, receiver, target_volume, roots[0])
    finally:
        for helper in (receiver, holder):
            if helper is not None:
                with contextlib.suppress(RuntimeFailure):
                    target.remove_container(helper)
    meter.finish()
    return meter.total


def _hold_mounted(engine: Engine, volume: str) -> str | None:
    """For a volume the engine mounts from a device (a sized one, runtimes/
    volumes/images.py): a running helper that keeps it mounted, so an archive upload to
    a stopped container lands in its file system (Podman 4.3 does not mount such a
    volume for the upload: the files would go to the empty mount point on the host's
    disk, unlimited and hidden once mounted). Returns its name; None: not needed."""
    if not (engine.api.inspect_volume(volume).get("Options") or {}).get("device"):
        return None
    holder = _create_helper(engine, volume, "hold", ["sleep", "infinity"], read_only=True)
    engine.api.start(holder)
    return holder


def volume_labels(engine: Engine, volume: str) -> dict[str, str]:
    """The labels of our volume ``volume`` (VolumeCopyFailed, source side, when it is
    missing or not ours)."""
    with _on(engine, "source", f"reading volume {volume}"):
        return _volume_labels(engine, volume)


def _fix_root(engine: Engine, receiver: str, volume: str, meta: RootMeta) -> None:
    """Run the receiver once with the script that sets the volume root's metadata."""
    script = script_tar(FIX_ROOT_SCRIPT, fix_root_script(meta))
    # Podman 4.3 now and then answers a small upload with "broken pipe" (its tar
    # subprocess): the upload is idempotent, so it is tried again.
    for attempt in range(3):
        try:
            with _on(engine, "target", f"setting the root of volume {volume}"):
                engine.api.put_archive(receiver, "/", script)
            break
        except VolumeCopyFailed:
            if attempt == 2:
                raise
            time.sleep(0.2 * (attempt + 1))
    with _on(engine, "target", f"setting the root of volume {volume}"):
        engine.api.start(receiver)
        status = engine.api.wait(receiver, timeout=engine.timeout_s)
        code = status.get("StatusCode") if isinstance(status, dict) else status
        if code != 0:
            logs = engine.api.logs(receiver, tail=20).decode(errors="replace").strip()
            raise VolumeCopyFailed(
                f"setting the root of volume {volume} failed (exit {code}): {logs[-500:]}",
                side="target",
                details={"volume": volume, "exit_code": code},
            )


def volume_manifest(engine: Engine, volume: str) -> list[str]:
    """:func:`tree_manifest` of our volume ``volume`` (for verification and tests).
    Raises VolumeCopyFailed like a copy's source side."""
    with volume_tar_stream(engine, volume) as chunks:
        manifest = tree_manifest(chunks)
        for _ in chunks:  # the end-of-archive padding, then tar's exit status is checked
            pass
    return manifest


def volume_checksum(engine: Engine, volume: str) -> str:
    """A SHA-256 over the volume's whole tree: contents and metadata (see
    :func:`tree_manifest`); equal for a volume and its copy."""
    return hashlib.sha256("\n".join(volume_manifest(engine, volume)).encode()).hexdigest()
