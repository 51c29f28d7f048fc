"""What the SkyPilot end-to-end test needs on this machine, built offline and kept
between runs: SkyPilot's client in a virtual environment of its own (it is no
dependency of gpuyard), the wheels its remote runtime needs, and the image the
launched pod runs.

The image is a ``debootstrap bookworm`` rootfs (Debian's mirror is reachable where no
container registry is) with what SkyPilot's pod set-up script installs with apt
(sshd, rsync, curl, patch) already there, empty apt sources so its ``apt update``
returns at once, ``uv`` at ``/root/.local/bin/uv`` and a ready
``/root/skypilot-runtime`` virtual environment holding the client's SkyPilot and
``ray[default]==2.9.3`` (SkyPilot only checks that the environment exists, then finds
every package it asks for installed). ``UV_OFFLINE`` keeps uv from looking for a
network. The image is tagged by the digest of its recipe and wheels, so a later run
reuses it.

Everything is kept in the machine's cache (``$XDG_CACHE_HOME/gpuyard/skypilot``, by
default ``~/.cache/gpuyard/skypilot``: its ``venv`` and ``wheels``), so every checkout
on the machine, a fresh clone's CI run included, builds them once; the image in the
machine's Podman storage. A lock file there keeps two test runs from building at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

SKYPILOT_VERSION = "0.14.1"
RAY_VERSION = "2.9.3"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuyard" / "skypilot"
VENV = CACHE / "venv"
WHEELS = CACHE / "wheels"
IMAGE_REPO = "localhost/gpuyard/skypilot-runtime"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "openssh-server", "rsync", "curl", "patch", "ca-certificates", "python3", "python3-venv",
    "procps", "iproute2", "init-system-helpers", "less",
)  # fmt: skip
# What the pod's runtime environment holds (pip download'ed here, installed offline).
REMOTE_REQUIREMENTS = (
    f"skypilot[runpod]=={SKYPILOT_VERSION}",
    f"ray[default]=={RAY_VERSION}",
    "click<8.3",
    "setuptools<70",
    "pip",
    "uv",
)
RECIPE_REVISION = 1
ENV = (
    "PATH=/root/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "UV_OFFLINE=1",
    "UV_PYTHON_DOWNLOADS=never",
)
PIP_TIMEOUT_S = 1500
DEBOOTSTRAP_TIMEOUT_S = 1200


class BuildFailed(Exception):
    """A step of the build failed; the message says which and why."""


def _run(cmd: list[str], what: str, timeout_s: float, stdin: IO[bytes] | None = None) -> str:
    try:
        proc = subprocess.run(cmd, stdin=stdin, capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildFailed(f"{what} failed: {e}") from e
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).decode(errors="replace").strip()
        raise BuildFailed(f"{what} failed (exit {proc.returncode}): {err[-1500:]}")
    return str(proc.stdout.decode(errors="replace"))


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One builder at a time (two test runs of this checkout share the cache)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def sky_bin() -> Path:
    """SkyPilot's ``sky``, installed into :data:`VENV` on first use."""
    with _locked():
        return _sky_bin()


def _sky_bin() -> Path:
    sky = VENV / "bin" / "sky"
    stamp = VENV / f".skypilot-{SKYPILOT_VERSION}"
    if sky.exists() and stamp.exists():
        return sky
    _run(["python3", "-m", "venv", str(VENV)], "creating SkyPilot's virtual environment", 300)
    _run(
        [str(VENV / "bin" / "pip"), "install", "-q", f"skypilot[runpod]=={SKYPILOT_VERSION}"],
        f"pip install skypilot[runpod]=={SKYPILOT_VERSION}",
        PIP_TIMEOUT_S,
    )
    stamp.touch()
    return sky


def wheels() -> Path:
    """The remote runtime's wheels (for this machine's Python, which is bookworm's
    minor version too; a package published as source only is built here), fetched
    once."""
    stamp = WHEELS / ".complete"
    if stamp.exists():
        return WHEELS
    WHEELS.mkdir(parents=True, exist_ok=True)
    _run(
        [
            str(VENV / "bin" / "pip"),
            "wheel",
            "-q",
            "-w",
            str(WHEELS),
            *REMOTE_REQUIREMENTS,
        ],
        "pip wheel of the remote runtime's packages",
        PIP_TIMEOUT_S,
    )
    stamp.touch()
    return WHEELS


def image_tag(wheel_dir: Path) -> str:
    """The image's name: its recipe's and wheels' digest as the tag."""
    h = hashlib.sha256()
    for part in (str(RECIPE_REVISION), SUITE, *PACKAGES, *REMOTE_REQUIREMENTS, *ENV):
        h.update(part.encode() + b"\0")
    for name in sorted(p.name for p in wheel_dir.glob("*.whl")):
        h.update(name.encode() + b"\0")
    return f"{IMAGE_REPO}:{h.hexdigest()[:16]}"


def _exists(name: str) -> bool:
    proc = subprocess.run(
        ["podman", "image", "exists", name], capture_output=True, timeout=60, check=False
    )
    return proc.returncode == 0


def _customize(root: Path, wheel_dir: Path) -> None:
    for rel in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
        path = root / rel
        if path.is_dir():
            shutil.rmtree(path)
            path.mkdir(mode=0o755)
    (root / "etc/apt/sources.list").write_text("")
    shutil.rmtree(root / "etc/apt/sources.list.d", ignore_errors=True)
    (root / "etc/apt/sources.list.d").mkdir()
    for key in root.glob("etc/ssh/ssh_host_*"):
        key.unlink()  # each container makes its own (the set-up script's ssh-keygen -A)
    (root / "etc/resolv.conf").write_text("")
    # uv from its wheel.
    uv_wheel = next(wheel_dir.glob("uv-*.whl"))
    with zipfile.ZipFile(uv_wheel) as z:
        member = next(n for n in z.namelist() if n.endswith("/scripts/uv"))
        target = root / "root/.local/bin/uv"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(member))
        target.chmod(0o755)
    staged = root / "tmp/wheels"
    shutil.copytree(wheel_dir, staged)
    try:
        _run(
            ["chroot", str(root), "python3", "-m", "venv", "/root/skypilot-runtime"],
            "creating /root/skypilot-runtime",
            300,
        )
        _run(
            [
                "chroot",
                str(root),
                "/root/skypilot-runtime/bin/pip",
                "install",
                "-q",
                "--no-index",
                "--find-links",
                "/tmp/wheels",
                *REMOTE_REQUIREMENTS[:-2],
            ],
            "installing the runtime's wheels into /root/skypilot-runtime",
            PIP_TIMEOUT_S,
        )
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def build_image() -> str:
    """The pod image's name, built when the engine does not have it yet (about three
    minutes: the wheels, debootstrap, then the wheels installed into the rootfs). Needs
    root, debootstrap, podman, PyPI and Debian's mirror. Raises BuildFailed."""
    with _locked():
        return _build_image()


def _build_image() -> str:
    wheel_dir = wheels()
    name = image_tag(wheel_dir)
    if _exists(name):
        return name
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    workdir = Path(tempfile.mkdtemp(prefix="gpuyard-skypilot-", dir=base))
    try:
        root = workdir / "rootfs"
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
                MIRROR,
            ],
            f"debootstrap {SUITE} from {MIRROR}",
            DEBOOTSTRAP_TIMEOUT_S,
        )
        _customize(root, wheel_dir)
        changes: list[str] = []
        for env in ENV:
            changes += ["--change", f"ENV {env}"]
        changes += ["--change", "WORKDIR /root", "--change", 'CMD ["sleep", "infinity"]']
        with subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", "-", "."],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        ) as tar:
            _run(
                ["podman", "import", *changes, "-", name],
                f"importing {name}",
                900,
                stdin=tar.stdout,
            )
            tar.wait(timeout=60)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return name


if __name__ == "__main__":
    sky_bin()
    print(build_image())
