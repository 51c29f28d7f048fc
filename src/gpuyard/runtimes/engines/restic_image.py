"""The restic helper image: the helper's busybox rootfs (runtimes/engines/helper_image.py)
plus this machine's restic binary and the shared libraries it links, copied in (never
bind-mounted from the host), at the same paths. Built offline here, imported into an
engine on first use, and named by the hash of its rootfs, so a new restic or a new
libc makes a new image and nothing is rebuilt while they stay the same.

Why an image rather than bind mounts of the host's restic and library directories: the
helper then sees exactly the files it runs (a whole ``/lib/x86_64-linux-gnu`` of the
host is not in it), the image works the same on Docker and Podman, and it is a few tens
of MB imported once per engine (Debian's restic 0.14 is 18 MB and links only libc).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import threading
import weakref

import docker.errors

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines.devimage import busybox_rootfs
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.engines.helper_image import HELPER_CMD, imported_id

RESTIC_HELPER_REPOSITORY = "localhost/gpuyard/restic-helper"
# Where restic is in the image.
RESTIC_IN_IMAGE = "/usr/bin/restic"
# Directories the helper's command needs: the volume, the operation's work directory.
IMAGE_DIRS = ("data", "gy")

_LDD_LIB = re.compile(r"\S+\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)")
_LDD_INTERP = re.compile(r"(/\S+)\s+\(0x[0-9a-f]+\)")
_lock = threading.Lock()
_present: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


def linked_files(binary: str) -> list[str]:
    """The shared libraries and ELF interpreter ``binary`` needs (``ldd``), as paths
    of this machine; [] for a static binary. Raises RuntimeFailure when ldd cannot
    resolve them."""
    try:
        done = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeFailure(f"cannot list the libraries of {binary}: {exc}") from exc
    said = done.stdout + done.stderr
    if "not a dynamic executable" in said or "statically linked" in said:
        return []
    if done.returncode != 0 or "not found" in said:
        raise RuntimeFailure(f"cannot list the libraries of {binary}: {said.strip()[-300:]}")
    found: list[str] = []
    for line in done.stdout.splitlines():
        line = line.strip()
        if lib := _LDD_LIB.fullmatch(line):
            found.append(lib.group(1))
        elif interpreter := _LDD_INTERP.fullmatch(line):
            found.append(interpreter.group(1))
    return list(dict.fromkeys(found))


def restic_rootfs(binary: str) -> bytes:
    """The image's rootfs tar for ``binary`` (fixed mtimes: a pure function of the
    files). Raises RuntimeFailure without busybox-static or when ldd fails."""
    files: dict[str, tuple[bytes, int]] = {}
    dirs: list[str] = list(IMAGE_DIRS)
    for path in linked_files(binary):
        with open(os.path.realpath(path), "rb") as f:
            files[path.lstrip("/")] = (f.read(), 0o755)
        parent = os.path.dirname(path.lstrip("/"))
        while parent and parent not in dirs:
            dirs.append(parent)
            parent = os.path.dirname(parent)
    with open(binary, "rb") as f:
        files[RESTIC_IN_IMAGE.lstrip("/")] = (f.read(), 0o755)
    return busybox_rootfs(files, dirs=sorted(dirs, key=len), mtime=0)


@functools.lru_cache(maxsize=4)
def _image_name(binary: str, _stamp: tuple[int, int]) -> str:
    return f"{RESTIC_HELPER_REPOSITORY}:{hashlib.sha256(restic_rootfs(binary)).hexdigest()[:12]}"


def restic_image_name(binary: str) -> str:
    """``localhost/gpuyard/restic-helper:<hash>`` for ``binary`` as it is now."""
    st = os.stat(binary)
    return _image_name(os.path.realpath(binary), (st.st_mtime_ns, st.st_size))


def ensure_restic_image(engine: Engine, binary: str) -> str:
    """Make sure ``engine`` holds the restic helper image for ``binary`` and return
    its name (cached per engine object). Raises RuntimeFailure."""
    name = restic_image_name(binary)
    with _lock:
        if _present.get(engine) == name:
            return name
    with engine.errors("preparing the restic helper image"):
        try:
            engine.api.inspect_image(name)
        except docker.errors.ImageNotFound:
            repository, tag = name.rsplit(":", 1)
            answer = engine.api.import_image_from_data(
                restic_rootfs(binary), repository=name, changes=[f"CMD {HELPER_CMD}"]
            )
            try:
                engine.api.inspect_image(name)
            except docker.errors.ImageNotFound:
                image_id = imported_id(answer)
                if image_id is None:
                    raise RuntimeFailure(
                        f"importing the restic helper image into {engine.where} gave no id"
                    ) from None
                engine.api.tag(image_id, repository, tag)
    with _lock:
        _present[engine] = name
    return name


def forget_restic_image(engine: Engine) -> None:
    """Drop the belief that ``engine`` holds the image (somebody removed it)."""
    with _lock:
        _present.pop(engine, None)
