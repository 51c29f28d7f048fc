"""Build an offline development image from Debian's ``busybox-static``.

Development and CI machines reach no container registry, so tests and demos run an image
built here: a rootfs holding ``/bin/busybox`` plus applet symlinks, imported with
``podman import`` (or ``docker import``). Its default command,
``/usr/local/bin/gpuyard-serve``, serves ``/www`` over HTTP on port 8888 and exits
promptly on SIGTERM, so stopping a cluster running it takes well under a second.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from gpuyard.core.errors import RuntimeFailure

DEFAULT_IMAGE = "localhost/gpuyard/busybox:latest"
BUSYBOX_PATH = "/bin/busybox"
SERVE_PORT = 8888
# The label that records which rootfs an image was imported from (its hash).
RECIPE_LABEL = "gpuyard.dev-recipe"

APPLETS = (
    "sh", "ash", "httpd", "sleep", "cat", "ls", "mkdir", "echo", "env", "rm", "touch",
    "wget", "nc", "ps", "kill", "id", "hostname", "df", "du", "head", "tail", "grep",
    "sed", "true", "false", "test", "[", "printf", "date", "seq", "yes", "dd", "cp", "mv",
    "ln", "chmod", "chown", "pwd", "uname", "wc", "sort", "uniq", "cut", "tr", "awk",
    "find", "xargs", "tee", "mount", "umount", "free", "top", "uptime", "whoami", "which",
    "basename", "dirname", "stat", "sync", "nproc", "md5sum", "sha256sum", "tar", "gzip",
    "gunzip", "vi", "less", "more", "ping", "ifconfig", "ip", "netstat", "timeout",
    "readlink", "realpath", "expr", "usleep", "watch", "clear", "reset", "sh", "killall",
    "pidof", "rmdir", "mktemp", "base64", "od", "hexdump", "diff", "cmp",
)  # fmt: skip

# busybox sh as PID 1 has no default SIGTERM disposition (the kernel drops signals to
# PID 1 without a handler), so without the trap every stop would wait for SIGKILL.
# ``wait`` is interruptible by trapped signals, unlike a foreground ``sleep``.
SERVE_SCRIPT = f"""#!/bin/sh
mkdir -p /www
echo "<html><body><h1>gpuyard dev image</h1><p>host: $(hostname)</p></body></html>" \\
  > /www/index.html
httpd -f -p {SERVE_PORT} -h /www &
HTTPD_PID=$!
trap 'kill $HTTPD_PID 2>/dev/null; exit 0' TERM INT
wait $HTTPD_PID
"""

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


# The directories every busybox rootfs built here has (besides /tmp, which is 1777).
BASE_DIRS = ("bin", "usr", "usr/bin", "usr/local", "usr/local/bin", "etc", "root", "proc",
             "sys", "dev", "var", "var/run")  # fmt: skip


def busybox_rootfs(
    files: Mapping[str, tuple[bytes, int]],
    *,
    dirs: Sequence[str] = (),
    applets: Iterable[str] = APPLETS,
    mtime: int | None = None,
) -> bytes:
    """A minimal rootfs as an uncompressed tar, built in memory (about 2 MB): the base
    directories plus ``dirs``, ``/bin/busybox`` with a symlink per applet, ``/etc/passwd``,
    ``/etc/group`` and ``/etc/hostname``, and ``files`` (path without a leading slash ->
    (content, mode)). ``mtime`` fixed (e.g. 0) makes the tar a pure function of its
    inputs, so its hash can name an image. Raises :class:`RuntimeFailure` when
    busybox-static is not installed."""
    if not os.path.exists(BUSYBOX_PATH):
        raise RuntimeFailure(
            f"{BUSYBOX_PATH} not found: install it with `apt-get install busybox-static` "
            "to build the offline images"
        )
    buf = io.BytesIO()
    now = int(time.time()) if mtime is None else mtime

    def add_dir(tar: tarfile.TarFile, path: str, mode: int = 0o755) -> None:
        info = tarfile.TarInfo(path)
        info.type = tarfile.DIRTYPE
        info.mode = mode
        info.mtime = now
        tar.addfile(info)

    def add_file(tar: tarfile.TarFile, path: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(path)
        info.size = len(data)
        info.mode = mode
        info.mtime = now
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in dict.fromkeys((*BASE_DIRS, *dirs)):
            add_dir(tar, d)
        add_dir(tar, "tmp", 0o1777)
        with open(BUSYBOX_PATH, "rb") as f:
            add_file(tar, "bin/busybox", f.read(), 0o755)
        for applet in sorted(set(applets)):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            link.mtime = now
            tar.addfile(link)
        add_file(tar, "etc/passwd", PASSWD.encode())
        add_file(tar, "etc/group", GROUP.encode())
        add_file(tar, "etc/hostname", b"gpuyard\n")
        for path, (data, mode) in sorted(files.items()):
            add_file(tar, path, data, mode)
    return buf.getvalue()


def _rootfs_tar() -> bytes:
    """The development image's rootfs (fixed mtimes, so its hash names the recipe)."""
    return busybox_rootfs(
        {"usr/local/bin/gpuyard-serve": (SERVE_SCRIPT.encode(), 0o755)},
        dirs=("www", "workspace"),
        mtime=0,
    )


def _engine(runtime_cli: str) -> str:
    cli = shutil.which(runtime_cli)
    if cli is None:
        raise RuntimeFailure(
            f"{runtime_cli!r} not found on PATH: install podman (apt-get install podman) "
            "or Docker to build the development image"
        )
    return cli


def _recipe_of(cli: str, name: str) -> str | None:
    """The recipe label on the engine's image ``name``; None without image or label."""
    try:
        proc = subprocess.run(
            [cli, "image", "inspect", "--format", f'{{{{index .Labels "{RECIPE_LABEL}"}}}}', name],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = proc.stdout.decode().strip() if proc.returncode == 0 else ""
    return None if value in ("", "<no value>") else value


def dev_image_current(runtime_cli: str = "podman", name: str = DEFAULT_IMAGE) -> bool:
    """True when the engine already has ``name`` built from this recipe, so
    :func:`build_dev_image` would reuse it instead of importing again."""
    return _recipe_of(_engine(runtime_cli), name) == _digest(_rootfs_tar())


def _digest(rootfs: bytes) -> str:
    return hashlib.sha256(rootfs).hexdigest()[:16]


def build_dev_image(
    runtime_cli: str = "podman", name: str = DEFAULT_IMAGE, *, force: bool = False
) -> str:
    """Build the offline busybox image as ``name`` and return its name.

    Idempotent and cached: an image ``name`` already built from this recipe (the rootfs
    hash in its :data:`RECIPE_LABEL` label) is reused unless ``force``; otherwise the
    import retags ``name`` to the new image. Raises :class:`RuntimeFailure` when
    busybox-static or the engine CLI is missing or the import fails.
    """
    cli = _engine(runtime_cli)
    data = _rootfs_tar()
    digest = _digest(data)
    if not force and _recipe_of(cli, name) == digest:
        return name
    return import_rootfs(
        cli,
        name,
        data,
        command="/usr/local/bin/gpuyard-serve",
        port=SERVE_PORT,
        label=(RECIPE_LABEL, digest),
    )


def import_rootfs(
    cli: str, name: str, rootfs: bytes, *, command: str, port: int, label: tuple[str, str]
) -> str:
    """Import the tar ``rootfs`` as image ``name`` through the engine CLI ``cli``: its
    command ``command``, port ``port`` exposed, and ``label`` (name, value: the
    recipe's digest, which a later build compares to reuse the image). Returns
    ``name``; raises :class:`RuntimeFailure` when the import fails."""
    cmd = [
        cli,
        "import",
        "--change",
        f'CMD ["{command}"]',
        "--change",
        f"EXPOSE {port}",
        "--change",
        "ENV PATH=/usr/local/bin:/usr/bin:/bin",
        "--change",
        "WORKDIR /",
        "--change",
        f"LABEL {label[0]}={label[1]}",
        "-",
        name,
    ]
    try:
        proc = subprocess.run(cmd, input=rootfs, capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeFailure(f"{Path(cli).name} import of {name} failed: {e}") from e
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise RuntimeFailure(f"{Path(cli).name} import of {name} failed: {err[-500:]}")
    return name
