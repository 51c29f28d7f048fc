"""Build the offline "serverless" test image: Python plus the unmodified runpod-python
package, running the handlers of ``serverless_handler.py`` (``python -u handler.py``).

No registry is reachable from a development or CI machine, so the image is assembled
here: the busybox rootfs of runtimes/engines/devimage.py, the interpreter gpuyard itself
runs on (its executable, standard library, extension modules and the shared libraries
``ldd`` names, each at its host path, so nothing has to be relocated), and runpod
installed by pip with ``--target`` from a local wheel directory. The wheels are fetched
once (``pip wheel``, the only step that needs the package index) into
``.cache/serverless-wheels`` of the source tree; every later build is offline.

runpod is installed unchanged, with every requirement it imports when a worker runs.
Left out (:data:`OMITTED_REQUIREMENTS`) are the requirements only its command-line tool,
its local FastAPI test server (``--rp_serve_api``) and its S3 upload helpers import,
each lazily: they are three quarters of the installed size.

The image carries a label with the hash of what it is built from (the handler's source,
the wheels, the interpreter, busybox and :data:`RECIPE_REVISION`); a build that finds an
image of that name with the same hash does nothing, so calling it in every test session
costs a wheel-directory hash and one ``image inspect``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines.devimage import BUSYBOX_PATH, busybox_rootfs

SERVERLESS_IMAGE = "localhost/gpuyard/serverless:latest"
RUNPOD_REQUIREMENT = "runpod==1.12.0"
RUNPOD_WHEEL_GLOB = "runpod-1.12.0-*.whl"
HANDLER_SOURCE = "serverless_handler.py"
APP_DIR = "/app"
SITE_DIR = "/opt/runpod/site"
# The port the image serves its handler on over plain HTTP when DIRECT_HTTP_PORT asks
# for one (the conventional value; any port works).
DIRECT_HTTP_PORT = 8080
# Bump when the rootfs layout, the exclusions or the import's --change lines change.
RECIPE_REVISION = 2
RECIPE_LABEL = "gpuyard.serverless-recipe"
# Written into the wheel directory once ``pip wheel`` has fetched the whole set.
COMPLETE_MARKER = ".complete"

# runpod's requirements that a worker never imports, and who does.
OMITTED_REQUIREMENTS = {
    "boto3": "S3 uploads (runpod.serverless.utils.rp_upload, imported lazily)",
    "fastapi": "the local test API server (--rp_serve_api, imported lazily)",
    "inquirerpy": "the runpod command-line tool's prompts",
    "prettytable": "the runpod command-line tool's tables",
    "watchdog": "the runpod command-line tool's project sync",
}

# Parts of the standard library no worker needs (tests, GUIs, the static libpython).
_STDLIB_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo",
     "ensurepip", "lib2to3", "__phello__"}
)  # fmt: skip
_DYNLOAD_SKIP = re.compile(r"^(_tkinter|_test|_ctypes_test|_xxtest|xx)")


@dataclass(frozen=True)
class HostPython:
    """The interpreter copied into the image, as found on this host."""

    executable: Path  # the real file (symlinks resolved)
    stdlib: Path
    dynload: Path
    version: str  # sys.version

    @staticmethod
    def current() -> HostPython:
        """The interpreter running this process (a virtual environment's base)."""
        executable = Path(os.path.realpath(sys.executable))
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        dynload = stdlib / "lib-dynload"
        if not dynload.is_dir():
            found = [Path(p) for p in sys.path if p.endswith("lib-dynload")]
            if not found:
                raise RuntimeFailure("this Python has no lib-dynload directory to copy")
            dynload = found[0]
        return HostPython(executable, stdlib, dynload, sys.version)


def handler_source() -> bytes:
    """The worker script (``/app/handler.py`` in the image), as shipped in the package."""
    return resources.files("gpuyard.devtools").joinpath(HANDLER_SOURCE).read_bytes()


def default_wheel_dir() -> Path:
    """``.cache/serverless-wheels`` of the source tree gpuyard runs from, or of
    ``~/.cache/gpuyard`` for an installed package."""
    root = Path(__file__).resolve().parents[3]
    if (root / "pyproject.toml").is_file():
        return root / ".cache" / "serverless-wheels"
    return Path.home() / ".cache" / "gpuyard" / "serverless-wheels"


def _name(requirement: str) -> str:
    """A requirement's project name, normalised (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def worker_requirements(metadata: str) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA that a worker needs: those of
    no extra, less :data:`OMITTED_REQUIREMENTS`."""
    kept = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        if "extra ==" in requirement.replace('"', "'").replace("extra==", "extra =="):
            continue
        if _name(requirement) in OMITTED_REQUIREMENTS:
            continue
        kept.append(requirement)
    return kept


def parse_ldd(output: str) -> list[Path]:
    """The absolute paths of the shared libraries ``ldd`` printed (the vDSO and
    libraries it did not find are left out)."""
    paths = []
    for line in output.splitlines():
        line = line.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" (", 1)[0].strip()
        else:
            target = line.split(" (", 1)[0].strip()
        if target.startswith("/"):
            paths.append(Path(target))
    return paths


def recipe_digest(python: HostPython, wheel_dir: Path) -> str:
    """The content hash an image built now would carry (16 hex digits): the handler's
    source, every wheel in ``wheel_dir``, the interpreter, busybox and the recipe's
    revision. Raises :class:`RuntimeFailure` when busybox-static is not installed."""
    h = hashlib.sha256()
    h.update(f"{RECIPE_REVISION}\0{RUNPOD_REQUIREMENT}\0{python.version}\0".encode())
    h.update(f"{sorted(OMITTED_REQUIREMENTS)}\0{python.executable}\0".encode())
    h.update(handler_source())
    for path in (Path(BUSYBOX_PATH), python.executable):
        try:
            h.update(_file_sha256(path))
        except OSError as e:
            how = "apt-get install busybox-static" if str(path) == BUSYBOX_PATH else "a Python"
            raise RuntimeFailure(f"{path} not found: install it ({how})") from e
    for wheel in sorted(wheel_dir.glob("*.whl")):
        h.update(wheel.name.encode() + b"\0" + _file_sha256(wheel))
    return h.hexdigest()[:16]


def _file_sha256(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()


def _run(cmd: list[str], what: str, timeout: float = 600) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeFailure(f"{what} failed: {e}") from e
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).decode(errors="replace").strip()
        raise RuntimeFailure(f"{what} failed (exit {proc.returncode}): {err[-800:]}")
    return proc.stdout.decode(errors="replace")


def runpod_wheel(wheel_dir: Path) -> Path | None:
    """The runpod wheel in ``wheel_dir``, or None."""
    found = sorted(wheel_dir.glob(RUNPOD_WHEEL_GLOB))
    return found[0] if found else None


def ensure_wheels(wheel_dir: Path, pip_python: str = sys.executable) -> Path:
    """The runpod wheel in ``wheel_dir``, fetching it and its requirements' wheels
    (``pip wheel``, which needs the package index) when the directory does not hold a
    complete set yet. Raises :class:`RuntimeFailure` when the fetch fails."""
    found = runpod_wheel(wheel_dir)
    if found is not None and (wheel_dir / COMPLETE_MARKER).exists():
        return found
    wheel_dir.mkdir(parents=True, exist_ok=True)
    _run(
        [pip_python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
         RUNPOD_REQUIREMENT, "-w", str(wheel_dir)],
        f"fetching the wheels of {RUNPOD_REQUIREMENT} into {wheel_dir} (needs the package index"
        " once; later builds are offline)",
    )  # fmt: skip
    (wheel_dir / COMPLETE_MARKER).write_text(RUNPOD_REQUIREMENT + "\n")
    found = runpod_wheel(wheel_dir)
    if found is None:
        raise RuntimeFailure(f"pip wheel left no {RUNPOD_WHEEL_GLOB} in {wheel_dir}")
    return found


def install_site(wheel_dir: Path, target: Path, pip_python: str = sys.executable) -> None:
    """Install runpod and the requirements a worker needs into ``target`` from
    ``wheel_dir`` alone (no index), byte-compiled. Raises :class:`RuntimeFailure`."""
    wheel = runpod_wheel(wheel_dir)
    if wheel is None:
        raise RuntimeFailure(f"no {RUNPOD_WHEEL_GLOB} in {wheel_dir}")
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requirements = worker_requirements(zf.read(meta).decode())
    base = [pip_python, "-m", "pip", "install", "-q", "--isolated", "--no-index",
            "--disable-pip-version-check", "--find-links", str(wheel_dir),
            "--target", str(target)]  # fmt: skip
    _run([*base, *requirements], "installing runpod's requirements from the wheel cache")
    _run([*base, "--no-deps", str(wheel)], "installing runpod from the wheel cache")
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts name the host's Python


def shared_libraries(binaries: Iterable[Path], inside: Path | None = None) -> list[Path]:
    """The shared libraries the ``binaries`` load (``ldd``), outside ``inside`` (a tree
    copied whole anyway), sorted."""
    found: set[Path] = set()
    for binary in binaries:
        try:
            proc = subprocess.run(["ldd", str(binary)], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeFailure(f"ldd {binary} failed: {e}") from e
        for lib in parse_ldd(proc.stdout.decode(errors="replace")):
            if inside is None or not lib.is_relative_to(inside):
                found.add(lib)
    return sorted(found)


def stdlib_files(python: HostPython) -> Iterator[Path]:
    """The standard library's files to copy (directories skipped as the walk goes)."""
    for root, dirs, files in os.walk(python.stdlib):
        here = Path(root)
        if here == python.stdlib:
            dirs[:] = [
                d for d in dirs if d not in _STDLIB_SKIP_DIRS and not d.startswith("config-")
            ]
        dirs.sort()
        for name in sorted(files):
            if ".opt-1." in name or ".opt-2." in name:
                continue
            if here == python.dynload and _DYNLOAD_SKIP.match(name):
                continue
            yield here / name


def _tree(root: Path) -> Iterator[Path]:
    for here, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            yield Path(here) / name


def _add_parents(tar: tarfile.TarFile, path: str, seen: set[str]) -> None:
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d in seen:
            continue
        seen.add(d)
        info = tarfile.TarInfo(d)
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)


def _add_file(tar: tarfile.TarFile, source: Path, arcname: str, seen: set[str]) -> None:
    """``source`` (a symlink followed) as the regular file ``arcname``, its mtime kept
    (byte-compiled files check their source's)."""
    arcname = arcname.lstrip("/")
    _add_parents(tar, arcname, seen)
    st = os.stat(source)
    info = tarfile.TarInfo(arcname)
    info.size = st.st_size
    info.mode = st.st_mode & 0o7777 | 0o444
    info.mtime = int(st.st_mtime)
    with open(source, "rb") as f:
        tar.addfile(info, f)


def write_rootfs(out: Path, python: HostPython, site: Path) -> None:
    """Write the image's rootfs as the tar ``out``: busybox, the interpreter at its host
    paths (``python``/``python3`` on PATH link to it), the libraries it and every
    extension module load, runpod's ``site`` at :data:`SITE_DIR` and the handler."""
    out.write_bytes(
        busybox_rootfs(
            {f"{APP_DIR.lstrip('/')}/handler.py": (handler_source(), 0o644)},
            dirs=("app", "opt"),
            mtime=0,
        )
    )
    extensions = [p for p in _tree(site) if ".so" in p.name]
    extensions += [
        p for p in _tree(python.dynload) if p.suffix == ".so" and not _DYNLOAD_SKIP.match(p.name)
    ]
    libraries = shared_libraries([python.executable, *extensions], inside=site)
    with tarfile.open(out, "a") as tar:
        seen = {m.name for m in tar.getmembers()}
        _add_file(tar, python.executable, str(python.executable), seen)
        for lib in libraries:
            _add_file(tar, lib, str(lib), seen)
        for path in stdlib_files(python):
            _add_file(tar, path, str(path), seen)
        for path in _tree(site):
            _add_file(tar, path, f"{SITE_DIR}/{path.relative_to(site)}", seen)
        for name in ("python", "python3"):
            link = tarfile.TarInfo(f"usr/local/bin/{name}")
            link.type = tarfile.SYMTYPE
            link.linkname = str(python.executable)
            tar.addfile(link)


def _engine_cli(runtime_cli: str | None) -> str:
    names = [runtime_cli] if runtime_cli else ["podman", "docker"]
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeFailure(
        f"{' or '.join(names)} not found on PATH: install podman (apt-get install podman) "
        "or Docker to build the serverless test image"
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
    value = proc.stdout.decode().strip() if proc.returncode == 0 else ""
    return None if value in ("", "<no value>") else value


def image_recipe(name: str = SERVERLESS_IMAGE, runtime_cli: str | None = None) -> str | None:
    """The recipe hash on the engine's image ``name``; None when there is no such image
    (or it carries no hash)."""
    return _inspect(_engine_cli(runtime_cli), name, f'{{{{index .Labels "{RECIPE_LABEL}"}}}}')


def import_changes(digest: str) -> list[str]:
    """The ``--change`` lines of the import: the command, environment and label."""
    return [
        'CMD ["python", "-u", "handler.py"]',
        f"WORKDIR {APP_DIR}",
        f"EXPOSE {DIRECT_HTTP_PORT}",
        "ENV PATH=/usr/local/bin:/usr/bin:/bin",
        f"ENV PYTHONPATH={SITE_DIR}",
        "ENV HANDLER=echo",
        f"LABEL {RECIPE_LABEL}={digest}",
    ]


def serverless_image_current(
    name: str = SERVERLESS_IMAGE, runtime_cli: str | None = None, wheel_dir: Path | None = None
) -> bool:
    """True when the engine already has ``name`` built from this recipe with the wheels
    already cached, so :func:`build_serverless_image` would reuse it."""
    wheels = wheel_dir or default_wheel_dir()
    if runpod_wheel(wheels) is None or not (wheels / COMPLETE_MARKER).exists():
        return False
    return image_recipe(name, runtime_cli) == recipe_digest(HostPython.current(), wheels)


def build_serverless_image(
    runtime_cli: str | None = None,
    name: str = SERVERLESS_IMAGE,
    *,
    force: bool = False,
    wheel_dir: Path | None = None,
) -> str:
    """Build the serverless test image as ``name`` (default :data:`SERVERLESS_IMAGE`)
    and return the name.

    Idempotent and cached: when the engine already has ``name`` with this recipe's hash
    (:func:`recipe_digest`) nothing is installed or imported, unless ``force``. The
    wheels come from ``wheel_dir`` (default :func:`default_wheel_dir`), fetched there
    first if it has none. A rebuild retags ``name`` and deletes the image it replaced
    when no container uses it. Raises :class:`RuntimeFailure` when busybox-static,
    ``ldd``, pip or the engine CLI is missing, or a step fails.
    """
    cli = _engine_cli(runtime_cli)
    wheels = wheel_dir or default_wheel_dir()
    ensure_wheels(wheels)
    python = HostPython.current()
    digest = recipe_digest(python, wheels)
    if not force and _inspect(cli, name, f'{{{{index .Labels "{RECIPE_LABEL}"}}}}') == digest:
        return name
    old_id = _inspect(cli, name, "{{.Id}}")
    with tempfile.TemporaryDirectory(prefix="gpuyard-serverless-") as tmp:
        site = Path(tmp) / "site"
        install_site(wheels, site)
        rootfs = Path(tmp) / "rootfs.tar"
        write_rootfs(rootfs, python, site)
        changes = [arg for change in import_changes(digest) for arg in ("--change", change)]
        _run([cli, "import", *changes, str(rootfs), name], f"{Path(cli).name} import of {name}")
    if old_id and old_id != _inspect(cli, name, "{{.Id}}"):
        subprocess.run([cli, "rmi", old_id], capture_output=True, timeout=60, check=False)
    return name
