"""Sized volumes: one ext4 file system in a sparse image file per volume, on the
engine's host, loop-mounted by the engine.

Why: an engine's plain named volume is a directory on the host's shared disk with no
size, so one tenant could fill the disk for everybody. Here each sized volume is an
image file of exactly its size; the engine's ``local`` volume driver mounts it (Podman
runs ``mount -t ext4 -o loop,... IMAGE`` at each container start that needs it, so a
reboot or an engine restart changes nothing), and a write past the size fails inside
the container with ENOSPC. Sparse files in it cost only the blocks they use, and
``discard`` gives deleted files' blocks back to the host.

The image files are made, grown, measured and removed by commands run on the engine's
host (this machine's shell for a local engine, SSH for a remote one: runtimes/
ssh_tunnel.py ``SshRunner``), through an injected runner, so the logic is tested
without a host. Docker's ``local`` driver mounts with mount(2), which cannot attach a
loop device: sized volumes are a Podman feature (see :func:`driver_options`).

What the host needs: e2fsprogs (``mkfs.ext4``, ``e2fsck``, ``resize2fs``, ``debugfs``), util-linux
(``losetup``), coreutils, a rootful Podman, and root for the commands (loop devices).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.hosts.firewall import Runner

log = logging.getLogger(__name__)

DEFAULT_DIRECTORY = "/var/lib/gpuyard/volume-images"
FS_TYPE = "ext4"
# discard: deleted files' blocks go back to the host (the image stays sparse);
# noinit_itable: the image is a fresh sparse file whose unwritten parts read as zeros
# already, so the kernel's background zeroing of inode tables would only allocate
# host blocks for nothing. nodev, nosuid: a tenant's file system holds no device node
# or set-id program the host honours (as the engine mounts its own volumes).
MOUNT_OPTIONS = "loop,discard,noinit_itable,nodev,nosuid"

# Spare images: a new volume's image (mkfs of a fresh file system, the slowest part
# of its first start, and CPU the start's own engine work then lacks) is taken ready
# made from this folder of the images' folder when one of its exact size waits there;
# one is made again, off the start's path, for the next volume of that size. A spare
# is an empty file system nobody ever mounted; any installation sharing the folder
# may take it (a rename: only one taker gets each). Names start with a dot, which no
# volume's name does.
SPARES_FOLDER = ".spares"
MAX_SPARES = 16  # of all sizes together: each holds only its file system's metadata
REFILL_DELAY_S = 1.0  # after the image it replaces: the start that took it is done

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")

# Checks the host can make and mount images. Prints what is missing, exits non-zero.
_PROBE = r"""
umask 077
dir=$1
for tool in mkfs.ext4 e2fsck resize2fs debugfs losetup truncate stat; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool is not installed"; exit 3; }
done
[ "$(id -u)" = 0 ] || { echo "host commands do not run as root (loop devices need it)"; exit 3; }
mkdir -p "$dir" && chmod 700 "$dir" && [ -w "$dir" ] || { echo "cannot write $dir"; exit 3; }
"""

# Makes an empty file system in the sparse file $tmp of $size bytes. It has no
# lost+found: a volume starts empty, as an engine's plain volume does (a copy or
# restore then matches its source entry for entry).
_MKFS = r"""
  truncate -s "$size" "$tmp"
  mkfs.ext4 -q -F -b 4096 -m 0 -E lazy_itable_init=1,lazy_journal_init=1,nodiscard "$tmp" \
    && debugfs -w -R "rmdir lost+found" "$tmp" >/dev/null 2>&1 \
    || { rm -f "$tmp"; exit 1; }
"""

# Makes image $1 of $2 bytes if it is missing, else grows it to $2 bytes if smaller
# (never shrinks); prints "image taken" or "image made" when the image is new. A new
# image is a spare of its size from folder $3 when one waits there (see
# SPARES_FOLDER), else made now; either way under a temporary name first and renamed,
# so a half-made one is never used. A grow marks the image ($1.grow) until its file
# system has grown too: online when its loop device is attached (the volume is
# mounted), else checked and resized offline; a grow that failed (an online resize
# needs CAP_SYS_RESOURCE) is tried again by the next call.
_ENSURE = (
    r"""
set -e
umask 077
img=$1; size=$2; spares=${3:-}
if [ ! -e "$img" ]; then
  [ -d "${img%/*}" ] || mkdir -p "${img%/*}"
  tmp="$img.new.$$"
  how=made
  if [ -n "$spares" ]; then
    for spare in "$spares/$size".*.img; do
      [ -e "$spare" ] || continue
      # rename(2) is atomic: of two takers of one spare, only one gets it.
      if mv -T "$spare" "$tmp" 2>/dev/null; then how=taken; break; fi
    done
  fi
  if [ "$how" = made ]; then
"""
    + _MKFS.strip("\n")
    + r"""
  fi
  mv -n "$tmp" "$img"
  echo "image $how"
  # Ours, new: of its size and 0600 already (the umask). The start path waits on
  # this script, so it ends here (each further command is a process on the host).
  [ -e "$tmp" ] || exit 0
  rm -f "$tmp"  # another call made the image meanwhile: checked below as any other
fi
# Only root reads a tenant's raw file system (images made before this were 0644).
chmod 600 "$img"
if [ "$(stat -c %s "$img")" -lt "$size" ]; then
  touch "$img.grow"
  truncate -s "$size" "$img"
fi
if [ -e "$img.grow" ]; then
  dev=$(losetup -n -O NAME -j "$img" | head -n 1)
  if [ -n "$dev" ]; then
    losetup -c "$dev"
    resize2fs "$dev" >/dev/null 2>&1 || resize2fs "$dev"
  else
    lost=$(debugfs -R "stat /lost+found" "$img" 2>/dev/null | grep -c Inode: || true)
    e2fsck -f -p "$img" >/dev/null 2>&1 || e2fsck -f -p "$img"
    resize2fs "$img" >/dev/null 2>&1 || resize2fs "$img"
    # e2fsck made it again; the volume had none (see the make above).
    [ "$lost" != 0 ] || debugfs -w -R "rmdir lost+found" "$img" >/dev/null 2>&1 || true
  fi
  rm -f "$img.grow"
fi
"""
)

# Makes one spare image of $2 bytes in folder $1 unless $3 of that size wait there
# already, or the folder holds MAX_SPARES of any size. Made under a temporary name and
# renamed, so a taker never sees a half-made one; what a refill cut off left behind
# (older than any refill takes) goes first.
_SPARE = (
    r"""
set -e
umask 077
spares=$1; size=$2; want=$3; most=$4
# The images' folder itself is made by a volume's first image, never by a refill.
[ -d "$(dirname "$spares")" ] || exit 0
mkdir -p "$spares"
chmod 700 "$spares"
find "$spares" -maxdepth 1 -name '*.new' -mmin +10 -delete 2>/dev/null || true
have=0; all=0
for spare in "$spares"/*.img; do
  [ -e "$spare" ] || continue
  all=$((all + 1))
  case "$spare" in "$spares/$size".*) have=$((have + 1));; esac
done
[ "$have" -lt "$want" ] && [ "$all" -lt "$most" ] || exit 0
tmp="$spares/$size.$$.new"
"""
    + _MKFS.strip("\n")
    + r"""
mv -T "$tmp" "$spares/$size.$$.img"
"""
)

# Prints "<allocated bytes> <path>" per existing image: blocks, not apparent length.
_USAGE = r"""
for img in "$@"; do
  [ -e "$img" ] && stat -c '%b %B %n' "$img"
done
exit 0
"""


def driver_options(image: str) -> dict[str, str]:
    """The ``local`` volume driver options that mount ``image`` (Podman)."""
    return {"type": FS_TYPE, "device": image, "o": MOUNT_OPTIONS}


class VolumeImages:
    """The image files of sized volumes in ``directory`` on one engine's host, made
    through ``runner``. Thread-safe; every method but :meth:`problem` may raise
    RuntimeFailure with the host's own words."""

    def __init__(
        self,
        runner: Runner,
        directory: str = DEFAULT_DIRECTORY,
        *,
        spares: int = 0,
        later: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """``spares``: how many spare images of each size in use to keep ready (0:
        none; see SPARES_FOLDER); ``later`` runs a refill off the caller's path (by
        default on a timer thread, REFILL_DELAY_S after the image it replaces)."""
        self.run = runner
        self.directory = directory.rstrip("/") or "/"
        self.spares = max(0, spares)
        self._later = later or _after(REFILL_DELAY_S)
        self._lock = threading.Lock()
        self._checked = False
        self._problem: str | None = None
        self._refilling: set[int] = set()

    def path(self, volume: str) -> str:
        """The image file of volume ``volume``."""
        if not _SAFE_NAME.match(volume):
            raise RuntimeFailure(f"volume name {volume!r} cannot name an image file")
        return f"{self.directory}/{volume}.img"

    def owns(self, device: str | None) -> bool:
        """Whether ``device`` (a volume's ``device`` option) is one of our images."""
        return bool(device) and str(device).startswith(self.directory + "/")

    def problem(self) -> str | None:
        """Why images cannot be made on this host (None: they can). Asked once; the
        answer is kept (a host's tools do not change under a running server), except
        that a host that did not answer is asked again next time."""
        with self._lock:
            if self._checked:
                return self._problem
        done = self.run(["sh", "-c", _PROBE, "sh", self.directory])
        problem = None if done.returncode == 0 else (done.output.strip() or "probe failed")
        with self._lock:
            # 255: ssh could not reach the host; that says nothing about the host.
            if done.returncode != 255:
                self._checked, self._problem = True, problem
        return problem

    def ensure(self, volume: str, size_bytes: int) -> str:
        """Make volume ``volume``'s image of ``size_bytes`` bytes, or grow it to that
        size (never shrink it). Idempotent. Returns the image's path."""
        if size_bytes <= 0:
            raise RuntimeFailure(f"volume {volume} needs a positive size, not {size_bytes}")
        image = self.path(volume)
        spares = [self.spare_folder] if self.spares else []
        done = self._check(
            ["sh", "-c", _ENSURE, "sh", image, str(size_bytes), *spares],
            f"preparing the image of volume {volume}",
        )
        if spares and "image " in done:
            # A new image (a spare taken, or none waited): the next one of this size
            # finds a spare.
            self._refill_later(size_bytes)
        return image

    @property
    def spare_folder(self) -> str:
        """Where spare images wait (see SPARES_FOLDER)."""
        return f"{self.directory}/{SPARES_FOLDER}"

    def refill(self, size_bytes: int) -> None:
        """Make spare images of ``size_bytes`` bytes until ``spares`` of them wait (at
        most MAX_SPARES of all sizes). Best effort: a spare that cannot be made now
        only means the next new volume of that size is made on its start's path."""
        if not self.spares or size_bytes <= 0:
            return
        # At the lowest CPU priority: a refill is never what anybody waits for, and
        # starts on the same host (engine, runtime, network set-up) go first.
        argv = ["nice", "-n", "19", "sh", "-c", _SPARE, "sh", self.spare_folder, str(size_bytes)]
        try:
            done = self.run([*argv, str(self.spares), str(MAX_SPARES)])
        except Exception as exc:  # the host's runner failed (SSH): nothing is lost
            log.info("no spare volume image made: %s", exc)
            return
        if done.returncode != 0:
            log.info("no spare volume image made: %s", done.output.strip()[-300:])

    def _refill_later(self, size_bytes: int) -> None:
        with self._lock:
            if size_bytes in self._refilling:
                return
            self._refilling.add(size_bytes)

        def refill() -> None:
            try:
                self.refill(size_bytes)
            finally:
                with self._lock:
                    self._refilling.discard(size_bytes)

        self._later(refill)

    def remove(self, volume: str) -> None:
        """Delete volume ``volume``'s image (the engine's volume is removed first, so
        nothing mounts it). Idempotent."""
        image = self.path(volume)
        self._check(["rm", "-f", "--", image, f"{image}.grow"], f"removing the image of {volume}")

    def usage(self, volumes: Iterable[str]) -> dict[str, int]:
        """Bytes of the host's disk each volume's image uses (its allocated blocks:
        sparse files and the unwritten rest of the image cost nothing), by volume name;
        a volume without an image is left out."""
        by_path = {self.path(v): v for v in volumes}
        if not by_path:
            return {}
        done = self._check(["sh", "-c", _USAGE, "sh", *by_path], "measuring volume images")
        return parse_usage(done, by_path)

    def _check(self, argv: list[str], action: str) -> str:
        done = self.run(argv)
        if done.returncode != 0:
            raise RuntimeFailure(
                f"{action} failed on the engine's host: {done.output.strip()[-500:]}",
                {"action": action},
            )
        return done.output


def _after(delay_s: float) -> Callable[[Callable[[], None]], None]:
    """Runs a call ``delay_s`` seconds from now on a daemon timer thread."""

    def later(call: Callable[[], None]) -> None:
        timer = threading.Timer(delay_s, call)
        timer.daemon = True
        timer.start()

    return later


def parse_usage(output: str, by_path: Mapping[str, str]) -> dict[str, int]:
    """``stat -c '%b %B %n'`` lines -> bytes by volume name (unknown paths ignored)."""
    out: dict[str, int] = {}
    for line in output.splitlines():
        parts = line.strip().split(" ", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        volume = by_path.get(parts[2])
        if volume is not None:
            out[volume] = int(parts[0]) * int(parts[1])
    return out
