"""Shipping the Slurm node image to a host that lacks it, without any registry.

The node image is built on the machine the API runs on (runtimes/slurm/image.py:
debootstrap, then imported into this machine's engine). A host of the fleet gets it
the way it gets the volume-copy helper image (runtimes/engines/helper_image.py): through the
Engine API, which reaches a remote engine (ssh://, tcp://, unix://) as it does the
local one. Here the image is saved from the local engine (``GET /images/{name}/get``,
a docker-archive tarball, spooled to a temporary file) and loaded into the host's
(``POST /images/load``), which keeps its name and, on Podman and Docker alike, its id.

Once per host and image version: a host whose engine holds the name with the id the
local engine has is left alone, and that is remembered per engine object (one per
host, runtimes/fleet.py), so the check costs nothing after the first create. A copy
into one engine runs at a time; a second caller waits for it and finds the image.
"""

from __future__ import annotations

import os
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import IO, Any

import docker.errors

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines.engine import Engine

# Told what the copy is doing (e.g. "copying image x to the host: 40 of 160 MB").
Progress = Callable[[str], None]

_CHUNK = 1024 * 1024
# How often (in bytes moved) the copy says how far it is.
_REPORT_EVERY = 32 * 1024 * 1024

_lock = threading.Lock()
# Engine -> {image name: the (source's) image id it is known to hold}.
_present: weakref.WeakKeyDictionary[Engine, dict[str, str]] = weakref.WeakKeyDictionary()
# Engine -> the lock its copies take (one copy into one engine at a time).
_copying: weakref.WeakKeyDictionary[Engine, threading.Lock] = weakref.WeakKeyDictionary()


def _image_id(engine: Engine, image: str, action: str) -> str | None:
    with engine.errors(action):
        try:
            info = engine.api.inspect_image(image)
        except docker.errors.ImageNotFound:
            return None
    return str(info.get("Id") or "") or None


def _known(target: Engine, image: str, image_id: str) -> bool:
    with _lock:
        return (_present.get(target) or {}).get(image) == image_id


def _remember(target: Engine, image: str, image_id: str) -> None:
    with _lock:
        _present.setdefault(target, {})[image] = image_id


def forget_node_image(target: Engine, image: str) -> None:
    """Drop the belief that ``target`` holds ``image`` (a create found it gone)."""
    with _lock:
        (_present.get(target) or {}).pop(image, None)


def ensure_node_image(
    target: Engine, source: Engine, image: str, progress: Progress | None = None
) -> bool:
    """Make sure ``target`` holds ``image`` as ``source`` has it; True when it was
    copied now. ``progress`` is told when a copy starts and how far it is.

    An image ``source`` does not have is left to ``target`` (an operator may have put
    it there); when neither has it, RuntimeFailure says so. Raises RuntimeFailure when
    an engine does not answer or refuses the save or the load."""
    source_id = _image_id(source, image, f"inspecting image {image} on this machine")
    if source_id is None:
        if _image_id(target, image, f"inspecting image {image} on the host") is not None:
            return False
        raise RuntimeFailure(
            f"image {image} is neither on the host nor on this machine to copy from: "
            "build it here (gpuyard dev-image --slurm) or load it on the host",
            {"image": image},
        )
    if _known(target, image, source_id):
        return False
    with _lock:
        copy_lock = _copying.setdefault(target, threading.Lock())
    with copy_lock:
        if _known(target, image, source_id):
            return False  # another caller copied it while this one waited
        held = _image_id(target, image, f"inspecting image {image} on the host")
        if held == source_id:
            _remember(target, image, source_id)
            return False
        _copy(target, source, image, progress or (lambda _text: None))
        _remember(target, image, source_id)
    return True


def _copy(target: Engine, source: Engine, image: str, progress: Progress) -> None:
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    with tempfile.TemporaryFile(prefix="gpuyard-image-", dir=base) as spool:
        progress(f"copying image {image} to the host: saving it here")
        with source.errors(f"saving image {image} on this machine"):
            stream = source.api.get_image(image, chunk_size=_CHUNK)
            for chunk in stream:
                spool.write(chunk)
        total = spool.tell()
        spool.seek(0)
        reader = _CountingReader(spool, total, image, progress)
        progress(f"copying image {image} to the host: 0 of {_mb(total)} MB")
        with target.errors(f"loading image {image} on the host"):
            answer = target.api.load_image(reader)
            _drain(answer)
    if _image_id(target, image, f"inspecting image {image} on the host") is None:
        raise RuntimeFailure(
            f"the host's engine loaded image {image} but does not list it", {"image": image}
        )


def _drain(answer: Any) -> None:
    """Read the load's answer to its end; an error line in it fails the load."""
    if answer is None or isinstance(answer, (bytes, str)):
        return
    for item in answer:
        if isinstance(item, dict) and item.get("error"):
            raise RuntimeFailure(f"loading the image failed: {str(item['error'])[:300]}")


def _mb(size: int) -> int:
    return (size + 1024**2 - 1) // 1024**2


class _CountingReader:
    """The spooled archive as the request body, telling ``progress`` how far it is.
    ``__len__`` gives the request its Content-Length; ``read`` is how it is sent."""

    def __init__(self, file: IO[bytes], total: int, image: str, progress: Progress) -> None:
        self._file = file
        self._total = total
        self._image = image
        self._progress = progress
        self._sent = 0
        self._reported = 0

    def __len__(self) -> int:
        return self._total

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self._sent += len(data)
        if self._sent - self._reported >= _REPORT_EVERY:
            self._reported = self._sent
            self._progress(
                f"copying image {self._image} to the host: "
                f"{_mb(self._sent)} of {_mb(self._total)} MB"
            )
        return data

    def __iter__(self) -> Iterator[bytes]:
        while True:
            data = self.read(_CHUNK)
            if not data:
                return
            yield data
