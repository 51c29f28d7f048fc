"""The helper image: a busybox rootfs gpuyard runs for its own chores on a host (copying
a volume between hosts, runtimes/volumes/copy.py), never the user's image.

Hosts need not reach a registry, so the image is built here from Debian's
``busybox-static`` (runtimes/engines/devimage.py's rootfs builder) and imported into each
engine through the Engine API (``POST /images/create?fromSrc=-``), which works on a
remote engine as on the local one and on Docker as on Podman. Its tag is a hash of the
rootfs, so a changed helper gets a new name and every host converges on the same one.

Checked on Podman 4.3's compat API: ``fromSrc`` ignores the ``tag`` query parameter
(the image becomes ``repo:latest``) but honours a tag inside ``repo``, which Docker
also parses; the import is tagged explicitly afterwards if the engine still did not.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from functools import lru_cache

import docker.errors

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines.devimage import busybox_rootfs
from gpuyard.runtimes.engines.engine import Engine

HELPER_REPOSITORY = "localhost/gpuyard/helper"
# The helper's default command: idle until removed (a helper is removed, never stopped).
HELPER_CMD = '["/bin/sleep", "infinity"]'

_cache_lock = threading.Lock()
# Engines known to hold the helper image (by object: one Engine per host).
_present: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


@lru_cache(maxsize=1)
def helper_rootfs() -> bytes:
    """The helper's rootfs tar: a pure function of the installed busybox binary (fixed
    mtimes), so its hash names the image. Raises RuntimeFailure without busybox-static."""
    return busybox_rootfs({}, dirs=("data",), mtime=0)


def helper_tag(rootfs: bytes) -> str:
    """The image tag for ``rootfs``: the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(rootfs).hexdigest()[:12]


def helper_image_name() -> str:
    """``localhost/gpuyard/helper:<hash>`` for this machine's busybox."""
    return f"{HELPER_REPOSITORY}:{helper_tag(helper_rootfs())}"


def imported_id(answer: object) -> str | None:
    """The image id in an import answer (one JSON object per line, the last naming the
    image: ``{"status": "sha256:..."}`` on Podman and Docker alike), or None."""
    text = answer.decode(errors="replace") if isinstance(answer, bytes) else str(answer)
    found: str | None = None
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        for key in ("id", "status"):
            value = doc.get(key)
            if isinstance(value, str) and value.startswith("sha256:"):
                found = value
    return found


def ensure_helper_image(engine: Engine) -> str:
    """Make sure ``engine`` holds the helper image and return its name. Idempotent and
    cached per engine object (see :func:`forget_helper_image` when a create finds it
    gone). Raises RuntimeFailure when the engine cannot be reached or refuses the
    import, or busybox-static is missing here."""
    name = helper_image_name()
    with _cache_lock:
        if _present.get(engine) == name:
            return name
    with engine.errors("preparing the helper image"):
        try:
            engine.api.inspect_image(name)
        except docker.errors.ImageNotFound:
            _import(engine, name)
    with _cache_lock:
        _present[engine] = name
    return name


def forget_helper_image(engine: Engine) -> None:
    """Drop the cached belief that ``engine`` holds the helper (somebody removed it)."""
    with _cache_lock:
        _present.pop(engine, None)


def _import(engine: Engine, name: str) -> None:
    repository, tag = name.rsplit(":", 1)
    answer = engine.api.import_image_from_data(
        helper_rootfs(), repository=name, changes=[f"CMD {HELPER_CMD}"]
    )
    try:
        engine.api.inspect_image(name)
        return
    except docker.errors.ImageNotFound:
        pass
    image_id = imported_id(answer)
    if image_id is None:
        raise RuntimeFailure(
            f"importing the helper image into {engine.where} gave no image id: {str(answer)[:300]}"
        )
    engine.api.tag(image_id, repository, tag)
