"""Build the offline "web" test image: the busybox rootfs of runtimes/engines/devimage.py plus
``gpuyard-web``, a small static HTTP/1.1 + WebSocket server compiled here from
``web_server.c`` (shipped in this package) with ``gcc -O2 -static``.

Its default command serves on port 8888: ``GET /`` (a page naming the host),
``GET /bytes/N``, ``GET /stream?seconds=S&interval=I`` (chunked, one line every I
seconds), ``POST /echo`` (the body streamed back) and ``GET /ws`` (WebSocket echo), each
connection in its own process; SIGTERM ends it at once. The HTTP proxy's tests and
benchmark run it as a cluster's image.

The image carries a label with the hash of what it is built from (the C source, the
compiler flags, the busybox binary and :data:`RECIPE_REVISION`); a build that finds an
image of that name with the same hash does nothing, so calling it in every test session
costs one ``image inspect``. Registries are never contacted.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines.devimage import BUSYBOX_PATH, busybox_rootfs, import_rootfs

WEB_IMAGE = "localhost/gpuyard/web:latest"
WEB_PORT = 8888
WEB_BINARY = "/usr/local/bin/gpuyard-web"
SOURCE_NAME = "web_server.c"
CFLAGS = ("-O2", "-static", "-Wall", "-Wextra")
# Bump when the rootfs layout or the import's --change lines change.
RECIPE_REVISION = 1
RECIPE_LABEL = "gpuyard.web-recipe"


def web_server_source() -> bytes:
    """The C source of ``gpuyard-web``, as shipped in the package."""
    return resources.files("gpuyard.devtools").joinpath(SOURCE_NAME).read_bytes()


def recipe_digest() -> str:
    """The content hash an image built now would carry (16 hex digits). Raises
    :class:`RuntimeFailure` when busybox-static is not installed."""
    h = hashlib.sha256()
    h.update(f"{RECIPE_REVISION}\0{' '.join(CFLAGS)}\0".encode())
    h.update(web_server_source())
    try:
        with open(BUSYBOX_PATH, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    except OSError as e:
        raise RuntimeFailure(
            f"{BUSYBOX_PATH} not found: install it with `apt-get install busybox-static` "
            "to build the offline images"
        ) from e
    return h.hexdigest()[:16]


def compile_web_server(out: Path, cc: str = "gcc") -> Path:
    """Compile ``gpuyard-web`` to ``out`` (a static binary) and return ``out``. Raises
    :class:`RuntimeFailure` when the compiler is missing or the build fails."""
    compiler = shutil.which(cc)
    if compiler is None:
        raise RuntimeFailure(
            f"{cc!r} not found on PATH: the web test image compiles its server; install a C "
            "compiler and static libc (apt-get install gcc libc6-dev)"
        )
    with tempfile.TemporaryDirectory(prefix="gpuyard-web-") as tmp:
        src = Path(tmp) / SOURCE_NAME
        src.write_bytes(web_server_source())
        cmd = [compiler, *CFLAGS, "-o", str(out), str(src)]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeFailure(f"compiling {SOURCE_NAME} failed: {e}") from e
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise RuntimeFailure(
            f"compiling {SOURCE_NAME} failed (exit {proc.returncode}; a static build needs "
            f"libc6-dev): {err[-800:]}"
        )
    return out


def _engine_cli(runtime_cli: str | None) -> str:
    names = [runtime_cli] if runtime_cli else ["podman", "docker"]
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeFailure(
        f"{' or '.join(names)} not found on PATH: install podman (apt-get install podman) "
        "or Docker to build the web test image"
    )


def _inspect(cli: str, name: str, template: str) -> str | None:
    try:
        proc = subprocess.run(
            [cli, "image", "inspect", "--format", template, name],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.decode().strip() or None


def image_recipe(name: str = WEB_IMAGE, runtime_cli: str | None = None) -> str | None:
    """The recipe hash on the engine's image ``name``; None when there is no such image
    (or it carries no hash)."""
    return _recipe(_engine_cli(runtime_cli), name)


def _recipe(cli: str, name: str) -> str | None:
    value = _inspect(cli, name, f'{{{{index .Labels "{RECIPE_LABEL}"}}}}')
    return None if value in (None, "<no value>") else value


def web_image_current(name: str = WEB_IMAGE, runtime_cli: str | None = None) -> bool:
    """True when the engine already has ``name`` built from this recipe, so
    :func:`build_web_image` would reuse it (no compile, no import)."""
    return _recipe(_engine_cli(runtime_cli), name) == recipe_digest()


def build_web_image(
    runtime_cli: str | None = None, name: str = WEB_IMAGE, *, force: bool = False
) -> str:
    """Build the web test image as ``name`` (default :data:`WEB_IMAGE`) and return the
    name.

    Idempotent and cached: when the engine already has ``name`` with this recipe's hash
    (:func:`recipe_digest`) nothing is compiled or imported, unless ``force``. A rebuild
    retags ``name`` and deletes the image it replaced when no container uses it. Raises
    :class:`RuntimeFailure` when busybox-static, gcc (with a static libc) or the engine
    CLI is missing, or a step fails.
    """
    cli = _engine_cli(runtime_cli)
    digest = recipe_digest()
    if not force and _recipe(cli, name) == digest:
        return name
    old_id = _inspect(cli, name, "{{.Id}}")
    with tempfile.TemporaryDirectory(prefix="gpuyard-web-") as tmp:
        binary = compile_web_server(Path(tmp) / "gpuyard-web").read_bytes()
    rootfs = busybox_rootfs(
        {WEB_BINARY.lstrip("/"): (binary, 0o755)}, dirs=("www", "workspace"), mtime=0
    )
    import_rootfs(
        cli, name, rootfs, command=WEB_BINARY, port=WEB_PORT, label=(RECIPE_LABEL, digest)
    )
    if old_id and old_id != _inspect(cli, name, "{{.Id}}"):
        subprocess.run([cli, "rmi", old_id], capture_output=True, timeout=60, check=False)
    return name
