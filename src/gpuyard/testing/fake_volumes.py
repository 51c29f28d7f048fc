"""Volume I/O of the in-memory runtime (the :class:`~gpuyard.runtimes.capabilities.VolumeIO`
of fake_runtime.py): its volumes' files turned into a real tar stream and back, so
snapshot logic runs against the real repository without engines, and copied file by
file to another in-memory runtime, so move logic does too."""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.capabilities import Progress, VolumeIO
from gpuyard.runtimes.records import Chunk

if TYPE_CHECKING:
    from gpuyard.runtimes.engines.engine import Engine


class VolumeStore(Protocol):
    """What of the in-memory runtime (fake_runtime.py) its volume I/O uses."""

    name: str
    # Why its engine does not answer; None: it does.
    unavailable: str | None

    def volume_files(self, name: str) -> dict[str, str]: ...

    def replace_volume_files(self, name: str, files: dict[str, str]) -> None: ...

    def ensure_volume(
        self, name: str, cluster_id: str | None = None, size_gb: int | None = None
    ) -> None: ...

    def remove_volume(self, name: str, *, legacy: bool = False) -> None: ...


class FakeVolumeIO:
    """The volumes of ``runtime`` as tar streams; every call fails as the runtime's
    engine does while ``runtime.unavailable`` is set."""

    def __init__(self, runtime: VolumeStore) -> None:
        self.runtime = runtime
        self.name = runtime.name

    def _reachable(self, side: str = "") -> None:
        if self.runtime.unavailable:
            where = f"{side} engine" if side else "engine"
            raise RuntimeFailure(f"{where} unreachable: {self.runtime.unavailable}")

    @contextlib.contextmanager
    def read(self, volume: str) -> Iterator[Iterator[Chunk]]:
        self._reachable()
        try:
            files = self.runtime.volume_files(volume)
        except KeyError as exc:
            raise RuntimeFailure(f"volume {volume} not found", {"volume": volume}) from exc
        yield iter([tar_of(files)])

    def write(
        self,
        volume: str,
        cluster_id: str | None,
        chunks: Iterable[Chunk],
        *,
        like: str | None = None,
        on_progress: Progress | None = None,
        size_gb: int = 0,
    ) -> int:
        self._reachable()
        data = b"".join(bytes(c) for c in chunks)
        self.runtime.remove_volume(volume)
        self.runtime.ensure_volume(volume, cluster_id, size_gb or None)
        self.runtime.replace_volume_files(volume, files_of(data))
        if on_progress is not None:
            on_progress(len(data))
        return len(data)

    def remove_readers(self, volume: str) -> None:
        """Nothing to remove: a read here leaves nothing behind."""

    def copy_to(
        self,
        volume: str,
        target: VolumeIO,
        target_volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        self._reachable("source")
        try:
            files = self.runtime.volume_files(volume)
        except KeyError as exc:
            raise RuntimeFailure(f"volume {volume} not found on the source host") from exc
        return target.accept_file_copy(self.name, files, target_volume, cluster_id, on_progress)

    def accept_engine_copy(
        self,
        source_name: str,
        source: Engine,
        source_volume: str,
        volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        raise RuntimeFailure(
            f"cannot copy a volume from a {source_name} engine to a {self.name} engine"
        )

    def accept_file_copy(
        self,
        source_name: str,
        files: Mapping[str, str],
        volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        self._reachable("target")
        self.runtime.ensure_volume(volume, cluster_id)
        self.runtime.replace_volume_files(volume, dict(files))
        copied = sum(len(v.encode()) for v in files.values())
        if on_progress is not None:
            on_progress(copied)
        return copied


def tar_of(files: Mapping[str, str]) -> bytes:
    """A tar of ``files`` (path to text) as a real engine's reader writes it: the root
    as ``.``, entries named ``./...``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        root = tarfile.TarInfo(".")
        root.type = tarfile.DIRTYPE
        root.mode = 0o755
        tar.addfile(root)
        for name in sorted(files):
            content = files[name].encode()
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def files_of(data: bytes) -> dict[str, str]:
    """The regular files of the tar ``data``, by path (``./`` dropped), as text."""
    files: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            if member.isreg():
                reader = tar.extractfile(member)
                assert reader is not None
                name = member.name[2:] if member.name.startswith("./") else member.name
                files[name] = reader.read().decode()
    return files
