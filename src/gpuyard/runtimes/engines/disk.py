"""How one engine holds volumes and container disks to their sizes, and what it does
where it cannot (docs/decisions.md "Disk sizes").

- A volume whose labels carry a size (``LABEL_SIZE``) is made as a loop-mounted image of
  that size on the engine's host (runtimes/volumes/images.py); a larger size asked of
  an existing one grows it. This needs a rootful Podman and commands on its host.
- A container disk size (``storage_opt``: overlay on XFS with project quotas) the
  engine refuses, or its storage shows it cannot take (overlay on another file
  system, :func:`storage_problem`), is remembered (:attr:`DiskSizes.container_problem`).

Either, where it cannot be enforced, fails with a clear error unless the operator
allowed unenforced disk sizes (then the size is left out). :class:`Engine` owns one
:class:`DiskSizes`; this module is its disk half, kept apart so the engine stays small.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_SIZE
from gpuyard.core.side_by_side import SideBySide
from gpuyard.runtimes.volumes.images import VolumeImages, driver_options


class EngineAccess(Protocol):
    """What the disk sizes need of their engine (runtimes/engines/engine.py's ``Engine``)."""

    @property
    def api(self) -> Any: ...

    def is_podman(self) -> bool: ...

    def errors(self, action: str) -> AbstractContextManager[None]: ...


log = logging.getLogger(__name__)

# Engine error texts that mean "this host cannot limit a container's writable layer"
# (Podman: "storage option overlay.size ... only supported for backingFS XFS", or
# "--storage-opt is supported only for overlay over xfs with 'pquota' mount option",
# Docker's words too).
DISK_ERROR_MARKERS = (
    "storage-opt",
    "storage option",
    "storage opt",
    "overlay.size",
    "pquota",
    "project quota",
    "backingfs",
)


def storage_problem(info: Mapping[str, Any]) -> str | None:
    """Why the engine of ``info`` (its ``/info`` answer: Docker's and Podman's compat
    API alike) cannot limit a container's writable layer, when its storage says so
    for certain: overlay on anything but XFS never can. None: it may (XFS still needs
    ``pquota``, which only a create shows), or nothing is known."""
    driver = str(info.get("Driver") or "")
    status = {
        str(pair[0]): str(pair[1])
        for pair in info.get("DriverStatus") or []
        if isinstance(pair, list | tuple) and len(pair) == 2
    }
    backing = status.get("Backing Filesystem")
    if not driver.startswith("overlay") or not backing or backing == "xfs":
        return None
    return (
        f"the engine's storage is {driver} on {backing}: container disk sizes need "
        "overlay on XFS mounted with pquota"
    )


def size_label(labels: Mapping[str, str] | None) -> int | None:
    """The size in bytes a volume's labels ask for (``LABEL_SIZE``); None: unsized."""
    text = (labels or {}).get(LABEL_SIZE)
    if text is None or not str(text).isdigit() or int(text) <= 0:
        return None
    return int(text)


def with_size(labels: Mapping[str, str], size_gb: int) -> dict[str, str]:
    """``labels`` asking for at least ``size_gb`` GiB (a larger size they ask for is
    kept; 0: unchanged)."""
    wanted = max(size_label(labels) or 0, size_gb * 1024**3)
    return {**labels, LABEL_SIZE: str(wanted)} if wanted else dict(labels)


class VolumeReady:
    """What a container that mounts a volume waits for before it is started: nothing
    (READY), or the image of a new sized volume, made on a thread of its own while the
    engine records the volume and creates the container (Engine.prepare_volume): the
    engine mounts the image only when a container using it starts."""

    def __init__(
        self,
        making: SideBySide[str] | None = None,
        *,
        made: Callable[[], None] = lambda: None,
        undo: Callable[[], None] = lambda: None,
    ) -> None:
        """``made``: told once the image is whole; ``undo``: removes what was made for
        the volume (its engine volume, its image)."""
        self._making = making
        self._made = made
        self._undo = undo

    def wait(self) -> None:
        """Return once the volume can be mounted. Raises RuntimeFailure (the host's own
        words) when its image could not be made: the volume is then not usable, and
        the caller removes what uses it, then calls :meth:`undo`."""
        if self._making is None:
            return
        self._making.result()
        self._made()

    def settle(self) -> None:
        """Wait for the image's making to end, however it ends (the caller is failing
        for another reason)."""
        if self._making is not None:
            self._making.settle()

    def undo(self) -> None:
        """After :meth:`wait` failed: remove the volume made for it and its image, so
        the next start makes both again. Best effort: what cannot be removed now is
        found again by the next start (a volume whose image is missing gets it made
        when that start grows it)."""
        with contextlib.suppress(RuntimeFailure):
            self._undo()


READY = VolumeReady()


class DiskSizes:
    """The disk sizes of ``engine``: volume images made through ``images`` (None: no
    commands can be run on the engine's host), and what the engine refused.
    ``allow``: the operator allows unenforced sizes. Thread-safe."""

    def __init__(self, engine: EngineAccess, images: VolumeImages | None, allow: bool) -> None:
        self.engine = engine
        self.images = images
        self.allow = allow
        self._lock = threading.Lock()
        # Why the engine cannot limit a container's writable layer (None: it can, as
        # far as known); learnt from its refusal and kept for the life of the process,
        # like Engine.limits_problem: a host's storage does not change under it.
        self.container_problem: str | None = None
        self._info: dict[str, Any] | None = None  # the engine's /info, once asked
        self._warned: set[str] = set()
        # (volume, its creation time) -> the size its image is known to have (grow).
        self._sized: dict[tuple[str, str], int] = {}

    # -- container disks ------------------------------------------------------------

    def refused(self, e: RuntimeFailure, asked: bool) -> bool:
        """Whether ``e`` is the engine refusing a container disk size this create
        ``asked`` for. If so, remember why; True means: retry without a size
        (allowed). Otherwise the caller raises :meth:`error`."""
        text = e.message.lower()
        if not asked or not any(m in text for m in DISK_ERROR_MARKERS):
            return False
        with self._lock:
            self.container_problem = e.message[:500]
        return True

    def refuse_known(self, asked: bool) -> None:
        """Raise :meth:`error` before any create when this create ``asked`` for a
        container disk size the engine is known to refuse and the operator has not
        allowed going without: the engine would only refuse it again."""
        if asked and self.container_problem is not None and not self.allow:
            raise self.error()

    @property
    def apply_container_size(self) -> bool:
        """False only when the engine refused container disk sizes and the operator
        allowed that."""
        return self.container_problem is None or not self.allow

    def error(self, problem: str | None = None) -> RuntimeFailure:
        return RuntimeFailure(
            "this host cannot enforce disk sizes "
            f"({problem or self.container_problem}); see docs/decisions.md "
            '"Disk sizes" for what the host needs, or allow unenforced sizes with '
            "GPUYARD_ALLOW_UNENFORCED_DISK=true",
            {"enforces_disk": False},
        )

    # -- what is enforced -----------------------------------------------------------

    def volumes_problem(self) -> str | None:
        """Why sized volumes cannot be made on this engine (None: they can): they need
        a rootful Podman and commands on its host (runtimes/volumes/images.py).
        Raises RuntimeFailure when the engine does not answer."""
        if self.images is None:
            return (
                "gpuyard cannot run commands on this engine's host (use ssh:// or a local engine)"
            )
        if not self.engine.is_podman():
            return "Docker's local volume driver cannot mount volume image files"
        if self._is_rootless():
            return "a rootless Podman cannot mount volume image files"
        return self.images.problem()

    def problem(self) -> str | None:
        """Why some disk size is not enforced here (None: all are, as far as known)."""
        try:
            volumes = self.volumes_problem()
        except RuntimeFailure:
            volumes = None  # unreachable: nothing is known
        if self.container_problem is None:
            # Learnt from the engine's storage before any create is refused for it,
            # so the host shows it (and creates there answer 409) from the start.
            with contextlib.suppress(RuntimeFailure):
                known = storage_problem(self._engine_info())
                with self._lock:
                    self.container_problem = self.container_problem or known
        parts = []
        if self.container_problem:
            parts.append(f"container disk: {self.container_problem}")
        if volumes:
            parts.append(f"volumes: {volumes}")
        return "; ".join(parts) or None

    def _engine_info(self) -> dict[str, Any]:
        """The engine's ``/info``, asked once (what it tells does not change under a
        running engine). Raises RuntimeFailure when the engine does not answer."""
        if self._info is None:
            with self.engine.errors("querying the engine"):
                self._info = dict(self.engine.api.info() or {})
        return self._info

    def _is_rootless(self) -> bool:
        options = [str(o) for o in self._engine_info().get("SecurityOptions") or []]
        return any("rootless" in o for o in options)

    # -- volumes --------------------------------------------------------------------

    def owns(self, info: Mapping[str, Any]) -> bool:
        """Whether the volume of inspect or list data ``info`` is one of our images."""
        device = (info.get("Options") or {}).get("device")
        return self.images is not None and self.images.owns(device)

    def volume_options(self, name: str, size: int) -> dict[str, str] | None:
        """The driver options of a new volume ``name`` of ``size`` bytes (its image made
        first), or None where sizes are not enforced and that is allowed. Raises
        RuntimeFailure where they are not and it is not."""
        problem = self.volumes_problem()
        if problem is None:
            assert self.images is not None
            return driver_options(self.images.ensure(name, size))
        if not self.allow:
            raise self.error(problem)
        with self._lock:
            warn = name not in self._warned
            self._warned.add(name)
        if warn:
            log.warning("volume %s is made without a size limit: %s", name, problem)
        return None

    def begin_volume(
        self, name: str, size: int
    ) -> tuple[dict[str, str] | None, SideBySide[str] | None]:
        """Like :meth:`volume_options`, with the image made on a thread of its own: the
        new volume's driver options at once, and the making to wait for before a
        container mounts it (None: no image is made, sizes are not enforced here).
        The volume's creation need not wait: the engine stores the options and mounts
        the image at the first start of a container that uses it."""
        if self.volumes_problem() is not None:
            return self.volume_options(name, size), None
        images = self.images
        assert images is not None
        path = images.path(name)  # an unusable name fails here, before anything is made
        making = SideBySide(lambda: images.ensure(name, size), name="volume-image")
        return driver_options(path), making

    def drop_image(self, name: str) -> None:
        """Remove volume ``name``'s image, made for a volume the engine then did not
        create. Best effort."""
        if self.images is not None:
            with contextlib.suppress(RuntimeFailure):
                self.images.remove(name)

    def grow(self, name: str, info: Mapping[str, Any], size: int) -> None:
        """Grow our existing volume ``name`` (inspect data ``info``) to ``size`` bytes
        when it is one of our images (a volume made unsized stays so until it is made
        again). Never raises for a grow the host could not do now: the volume keeps
        its size, still enforced, until a later call grows it (one made while it is
        not mounted grows it offline), so a start never fails for a grow."""
        if self.images is None or not self.owns(info):
            return
        # Every start asks; a command on the host each time is a round trip (SSH for a
        # remote host) for nothing once the image has the size. Only this process
        # grows its volumes' images, so a size it saw reached stays reached; the key
        # holds the volume's creation time, so a volume made again is asked again.
        key = (name, str(info.get("CreatedAt") or ""))
        with self._lock:
            if self._sized.get(key, 0) >= size:
                return
        try:
            self.images.ensure(name, size)
        except RuntimeFailure as exc:
            log.warning("volume %s not grown yet: %s", name, exc.message)
            return
        with self._lock:
            self._sized[key] = size

    def made(self, name: str, info: Mapping[str, Any], size: int) -> None:
        """Our volume ``name`` (the engine's answer to its create, ``info``) was just
        made with an image of ``size`` bytes: the next start need not grow it."""
        if self.owns(info):
            with self._lock:
                self._sized[(name, str(info.get("CreatedAt") or ""))] = size

    def removed(self, name: str, info: Mapping[str, Any]) -> None:
        """After our volume ``name`` (inspect data ``info``) was removed: its image."""
        if self.images is not None and self.owns(info):
            with self._lock:
                for key in [k for k in self._sized if k[0] == name]:
                    del self._sized[key]
            self.images.remove(name)

    def usage(self, rows: list[dict[str, Any]]) -> tuple[dict[str, int], set[str]]:
        """Bytes used by the volumes of ``rows`` (volume list rows) that are our images
        (the blocks each image holds), and the names of the others."""
        imaged = {str(v.get("Name")) for v in rows if self.owns(v)}
        others = {str(v.get("Name")) for v in rows} - imaged
        if not imaged or self.images is None:
            return {}, others
        return self.images.usage(sorted(imaged)), others
