"""Build the offline Slurm node image from Debian bookworm with ``debootstrap``.

No container registry is reachable on development and CI machines, but Debian's apt
mirror is, so the image is a ``debootstrap --variant=minbase`` rootfs with Slurm 22.05,
munge and OpenSSH, plus the node entrypoint from
:func:`gpuyard.runtimes.slurm.config.entrypoint_script`, imported with ``podman import``
(or ``docker import``). Building takes about a minute and needs root (debootstrap
chroots); the image is about 160 MB.

The image ships no secrets: the munge key and the SSH host keys debootstrap generates
are deleted, so every cluster gets its own key from the control plane and every node
container makes its own host keys on first start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.slurm.config import CONFIG_DIR, IMAGE_VERSION_FILE, entrypoint_script

SLURM_IMAGE = "localhost/gpuyard/slurm-node:latest"
ENTRYPOINT_PATH = "/usr/local/bin/gpuyard-node"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "slurmd", "slurmctld", "slurm-client", "munge", "openssh-server", "openssh-client",
    "procps", "iproute2", "iputils-ping", "less", "ca-certificates",
    # Slurm's mpi/pmix plugins need it (srun --mpi=pmix); without it every daemon start
    # logs plugin load errors.
    "libpmix2",
)  # fmt: skip
DEBOOTSTRAP_TIMEOUT_S = 900.0

# Drop-ins win over the main sshd_config (first value wins, and Debian includes
# sshd_config.d/ at its top). PAM is off: pam_loginuid cannot write loginuid in a
# container and would refuse every session.
SSHD_DROPIN = """# Written by gpuyard: root by key only.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
"""

# Cut from the rootfs: downloaded .debs, apt lists, docs and translations (~90 MB), and
# the secrets debootstrap's package scripts generated.
_PRUNE = (
    "var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
    "usr/share/locale", "usr/share/info",
)  # fmt: skip
_SECRETS_GLOBS = ("etc/ssh/ssh_host_*", "etc/munge/munge.key")


def _engine_cli(runtime_cli: str | None) -> str:
    """The engine CLI's path: ``runtime_cli``, else podman when installed, else docker."""
    names = [runtime_cli] if runtime_cli else ["podman", "docker"]
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeFailure(
        f"{' or '.join(names)} not found on PATH: install podman (apt-get install podman) "
        "or Docker to build the Slurm node image"
    )


def _run(cmd: list[str], what: str, timeout_s: float, data: bytes | None = None) -> str:
    """Run ``cmd``; its stdout, or RuntimeFailure naming ``what`` with stderr's tail."""
    try:
        proc = subprocess.run(cmd, input=data, capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeFailure(f"{what} failed: {e}") from e
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).decode(errors="replace").strip()
        raise RuntimeFailure(f"{what} failed (exit {proc.returncode}): {err[-800:]}")
    return proc.stdout.decode(errors="replace")


# Bump when _customize changes what goes into the image; the entrypoint, sshd drop-in
# and package list are hashed in directly.
RECIPE_REVISION = 1
RECIPE_LABEL = "gpuyard.node-recipe"


def recipe_digest() -> str:
    """What the image is built from: an image labelled with another digest is stale
    (built by an older gpuyard) and is rebuilt."""
    parts = [str(RECIPE_REVISION), entrypoint_script(), SSHD_DROPIN, " ".join(PACKAGES)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _image_recipe(cli: str, name: str) -> str | None:
    proc = subprocess.run(
        [cli, "image", "inspect", "--format", f'{{{{index .Labels "{RECIPE_LABEL}"}}}}', name],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.decode().strip() or None


def _image_id(cli: str, name: str) -> str | None:
    proc = subprocess.run(
        [cli, "image", "inspect", "--format", "{{.Id}}", name],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.decode().strip() or None


def image_exists(name: str, runtime_cli: str | None = None) -> bool:
    """True when the engine has an image called ``name``."""
    return _image_id(_engine_cli(runtime_cli), name) is not None


def _drop_replaced(cli: str, old_id: str | None, name: str) -> None:
    """Delete the image ``name`` pointed to before a rebuild, now untagged, unless a
    container still uses it (the engine refuses; that is fine)."""
    if old_id and old_id != _image_id(cli, name):
        subprocess.run([cli, "rmi", old_id], capture_output=True, timeout=60, check=False)


def _debootstrap(root: Path) -> None:
    exe = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if os.path.exists("/usr/sbin/debootstrap") else None
    )
    if exe is None:
        raise RuntimeFailure(
            "debootstrap not found: install it (apt-get install debootstrap, or run "
            "scripts/setup-system.sh) to build the Slurm node image"
        )
    if os.geteuid() != 0:
        raise RuntimeFailure("building the Slurm node image needs root (debootstrap chroots)")
    cmd = [
        exe,
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        SUITE,
        str(root),
        MIRROR,
    ]
    try:
        _run(cmd, f"debootstrap {SUITE} from {MIRROR}", DEBOOTSTRAP_TIMEOUT_S)
    except RuntimeFailure as e:
        log = root / "debootstrap" / "debootstrap.log"
        tail = ""
        if log.exists():
            tail = log.read_text(errors="replace")[-800:]
        raise RuntimeFailure(
            f"{e.message}. Check that {MIRROR} is reachable (proxy settings, DNS). "
            f"debootstrap log tail: {tail}"
        ) from e


def _customize(root: Path) -> None:
    """Prune the rootfs, delete generated secrets and add gpuyard's files."""
    for rel in _PRUNE:
        path = root / rel
        if path.is_dir():
            shutil.rmtree(path)
            path.mkdir(mode=0o755)
    for pattern in _SECRETS_GLOBS:
        for path in root.glob(pattern):
            path.unlink()
    # The host's resolv.conf leaks in through debootstrap; the engine mounts its own.
    (root / "etc/resolv.conf").write_text("")
    (root / "etc/hostname").write_text("gpuyard-node\n")
    entry = root / ENTRYPOINT_PATH.lstrip("/")
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(entrypoint_script())
    entry.chmod(0o755)
    dropin = root / "etc/ssh/sshd_config.d/gpuyard.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(SSHD_DROPIN)
    (root / CONFIG_DIR.lstrip("/")).mkdir(mode=0o755, exist_ok=True)
    (root / IMAGE_VERSION_FILE.lstrip("/")).write_text("base\n")


def _import(root: Path, cli: str, name: str) -> None:
    # tar streams straight into the engine; --numeric-owner keeps the image's uids
    # (slurm, munge) independent of the building host's /etc/passwd.
    cmd = [
        cli,
        "import",
        "--change",
        f'CMD ["{ENTRYPOINT_PATH}"]',
        "--change",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change",
        "ENV LANG=C.UTF-8",
        "--change",
        "WORKDIR /root",
        "--change",
        "EXPOSE 22",
        "--change",
        f"LABEL {RECIPE_LABEL}={recipe_digest()}",
        "-",
        name,
    ]
    try:
        with subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", "-", "."],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        ) as tar:
            proc = subprocess.run(
                cmd, stdin=tar.stdout, capture_output=True, timeout=600, check=False
            )
            tar_rc = tar.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeFailure(f"importing {name} failed: {e}") from e
    if proc.returncode != 0 or tar_rc != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise RuntimeFailure(
            f"importing {name} failed (import exit {proc.returncode}, tar exit {tar_rc}): "
            f"{err[-500:]}"
        )


def slurm_image_current(name: str = SLURM_IMAGE, runtime_cli: str | None = None) -> bool:
    """True when the engine already has ``name`` built from this recipe, so
    :func:`build_slurm_image` would reuse it (no debootstrap)."""
    cli = _engine_cli(runtime_cli)
    return _image_id(cli, name) is not None and _image_recipe(cli, name) == recipe_digest()


def build_slurm_image(
    runtime_cli: str | None = None, name: str = SLURM_IMAGE, force: bool = False
) -> str:
    """Build the Slurm node image as ``name`` and return ``name``.

    A no-op when the engine already has ``name`` built from this gpuyard's recipe
    (:func:`recipe_digest`) unless ``force``; an image from another recipe is rebuilt.
    Needs root, the engine CLI (``runtime_cli``, default podman if installed, else
    docker), debootstrap and Debian's mirror. Raises :class:`RuntimeFailure` saying
    what to install or fix when any is missing or a step fails. Takes about a minute;
    the temporary rootfs is always removed.
    """
    cli = _engine_cli(runtime_cli)
    old_id = _image_id(cli, name)
    if old_id and not force and _image_recipe(cli, name) == recipe_digest():
        return name
    # Not under /tmp when that is a small tmpfs: the rootfs is ~350 MB before pruning.
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    workdir = Path(tempfile.mkdtemp(prefix="gpuyard-slurm-", dir=base))
    try:
        root = workdir / "rootfs"
        _debootstrap(root)
        _customize(root)
        _import(root, cli, name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _drop_replaced(cli, old_id, name)
    return name


def derive_image(base: str, name: str, marker: str, runtime_cli: str | None = None) -> str:
    """Make image ``name`` from ``base`` with ``/etc/gpuyard-image-version`` set to
    ``marker``, in a few seconds and offline (create, copy one file, commit). Returns
    ``name``. Everything else, the default command included, is ``base``'s. Raises
    :class:`RuntimeFailure` when ``base`` is missing or a step fails."""
    cli = _engine_cli(runtime_cli)
    if not image_exists(base, cli):
        raise RuntimeFailure(f"image {base} not found: build it first (gpuyard dev-image --slurm)")
    old_id = _image_id(cli, name)
    tmp_name = f"gpuyard-derive-{os.getpid()}-{abs(hash((base, name, marker))) % 10**8}"
    with tempfile.TemporaryDirectory(prefix="gpuyard-derive-") as tmp:
        version = Path(tmp) / "gpuyard-image-version"
        version.write_text(marker.strip() + "\n")
        version.chmod(0o644)
        try:
            _run([cli, "create", "--name", tmp_name, base], f"creating a container of {base}", 60)
            _run(
                [cli, "cp", str(version), f"{tmp_name}:{IMAGE_VERSION_FILE}"],
                f"copying the version marker into {tmp_name}",
                60,
            )
            _run([cli, "commit", tmp_name, name], f"committing {name}", 300)
        finally:
            subprocess.run(
                [cli, "rm", "-f", tmp_name], capture_output=True, timeout=60, check=False
            )
    _drop_replaced(cli, old_id, name)
    return name
