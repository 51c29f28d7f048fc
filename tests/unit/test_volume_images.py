"""Sized volumes' image files (runtimes/volumes/images.py), made with this machine's own
tools in a temporary folder: made at their size, grown, never shrunk, measured by the
blocks they hold, removed; and a host without the tools says what is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.hosts.firewall import CommandResult, subprocess_runner
from gpuyard.runtimes.volumes.images import (
    MOUNT_OPTIONS,
    VolumeImages,
    driver_options,
    parse_usage,
)
from tests.required_parts import as_root, first_problem, needs, on_path

MIB = 1024**2

needs_tools = needs(
    "root and e2fsprogs",
    first_problem(as_root(), on_path("mkfs.ext4", "resize2fs")),
    how="run the tests as root; apt-get install e2fsprogs",
)


@needs_tools
def test_image_made_at_its_size_grown_never_shrunk_and_removed(tmp_path: Path) -> None:
    images = VolumeImages(subprocess_runner, str(tmp_path / "images"))
    assert images.problem() is None
    path = images.ensure("gyabc-vol1", 64 * MIB)
    assert path == str(tmp_path / "images" / "gyabc-vol1.img")
    assert os.path.getsize(path) == 64 * MIB
    # Sparse: a fresh image holds a few MiB of file system metadata, not its size.
    used = images.usage(["gyabc-vol1", "gyabc-missing"])
    assert set(used) == {"gyabc-vol1"}
    assert 0 < used["gyabc-vol1"] < 16 * MIB
    images.ensure("gyabc-vol1", 96 * MIB)
    assert os.path.getsize(path) == 96 * MIB
    images.ensure("gyabc-vol1", 32 * MIB)  # a smaller size never shrinks it
    assert os.path.getsize(path) == 96 * MIB
    dumpe2fs = shutil.which("dumpe2fs")
    if dumpe2fs is not None:  # the file system grew with the file
        header = subprocess_runner([dumpe2fs, "-h", path]).output.splitlines()
        fields = {k.strip(): v.strip() for k, _, v in (x.partition(":") for x in header)}
        assert int(fields["Block count"]) * int(fields["Block size"]) == 96 * MIB
    # Empty like an engine's plain volume (no lost+found), also after an offline grow
    # (whose e2fsck makes one).
    listing = subprocess_runner(["debugfs", "-R", "ls /", path]).output
    assert "lost+found" not in listing and ".." in listing, listing
    assert images.owns(path) and not images.owns("/elsewhere/gyabc-vol1.img")
    assert driver_options(path) == {"type": "ext4", "device": path, "o": MOUNT_OPTIONS}
    images.remove("gyabc-vol1")
    images.remove("gyabc-vol1")  # idempotent
    assert not os.path.exists(path)
    assert os.listdir(tmp_path / "images") == []  # no temporary file left behind


def test_a_host_without_the_tools_says_what_is_missing() -> None:
    seen: list[Sequence[str]] = []

    def runner(argv: Sequence[str]) -> CommandResult:
        seen.append(argv)
        return CommandResult(3, "resize2fs is not installed")

    images = VolumeImages(runner, "/srv/images")
    assert images.problem() == "resize2fs is not installed"
    assert images.problem() == "resize2fs is not installed"
    assert len(seen) == 1  # the answer is kept


def test_an_unreachable_host_is_asked_again() -> None:
    answers = [CommandResult(255, "ssh: connect to host: timed out"), CommandResult(0, "")]

    def runner(argv: Sequence[str]) -> CommandResult:
        return answers.pop(0)

    images = VolumeImages(runner, "/srv/images")
    assert images.problem() is not None
    assert images.problem() is None


def test_a_failed_command_raises_with_the_hosts_words() -> None:
    images = VolumeImages(lambda argv: CommandResult(1, "mkfs.ext4: No space left"), "/srv")
    with pytest.raises(RuntimeFailure) as failed:
        images.ensure("gyabc-vol1", MIB)
    assert "No space left" in failed.value.message
    with pytest.raises(RuntimeFailure):
        images.path("../etc/passwd")


def test_usage_counts_allocated_blocks() -> None:
    by_path = {"/srv/a.img": "a", "/srv/b.img": "b"}
    out = "2048 512 /srv/a.img\n0 512 /srv/b.img\ngarbage\n8 512 /srv/other.img\n"
    assert parse_usage(out, by_path) == {"a": 2048 * 512, "b": 0}


@needs_tools
def test_only_root_reads_the_images(tmp_path: Path) -> None:
    """A tenant's raw file system is nobody else's to read on the host: the folder is
    0700 and each image 0600, also an image left readable by an older version."""
    images = VolumeImages(subprocess_runner, str(tmp_path / "images"))
    assert images.problem() is None
    assert (tmp_path / "images").stat().st_mode & 0o777 == 0o700
    path = Path(images.ensure("gyabc-vol2", 64 * MIB))
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    images.ensure("gyabc-vol2", 64 * MIB)
    assert path.stat().st_mode & 0o777 == 0o600
    assert "nodev" in MOUNT_OPTIONS.split(",") and "nosuid" in MOUNT_OPTIONS.split(",")
    images.remove("gyabc-vol2")


def _inode_and_uuid(path: str) -> tuple[int, str]:
    header = subprocess_runner(["dumpe2fs", "-h", path]).output.splitlines()
    fields = {k.strip(): v.strip() for k, _, v in (x.partition(":") for x in header)}
    return os.stat(path).st_ino, fields["Filesystem UUID"]


@needs_tools
def test_a_new_volume_takes_a_spare_image_and_one_is_made_again(tmp_path: Path) -> None:
    """A spare of the exact size is taken (renamed: no mkfs on the start's path), is an
    empty file system like a made one, and its refill is asked for off that path."""
    refills: list[Callable[[], None]] = []
    images = VolumeImages(
        subprocess_runner, str(tmp_path / "images"), spares=1, later=refills.append
    )
    spares = tmp_path / "images" / ".spares"
    first = images.ensure("gyabc-vol1", 64 * MIB)  # no spare yet: made, a refill asked
    assert len(refills) == 1 and not spares.exists()
    refills.pop()()
    waiting = sorted(spares.iterdir())
    assert [p.name.split(".")[0] for p in waiting] == [str(64 * MIB)]
    assert spares.stat().st_mode & 0o777 == 0o700
    images.refill(64 * MIB)  # one of a size is enough
    assert sorted(spares.iterdir()) == waiting
    images.ensure("gyabc-vol1", 64 * MIB)  # an existing image takes nothing
    assert sorted(spares.iterdir()) == waiting and not refills
    spare_fs = _inode_and_uuid(str(waiting[0]))
    second = images.ensure("gyabc-vol2", 64 * MIB)
    assert list(spares.iterdir()) == []  # taken
    assert _inode_and_uuid(second) == spare_fs != _inode_and_uuid(first)
    assert os.path.getsize(second) == 64 * MIB
    assert Path(second).stat().st_mode & 0o777 == 0o600
    listing = subprocess_runner(["debugfs", "-R", "ls /", second]).output
    assert "lost+found" not in listing and ".." in listing, listing
    assert len(refills) == 1  # and made again for the next one
    # A spare of another size is not taken: a file system is made at the size asked.
    refills.pop()()
    third = images.ensure("gyabc-vol3", 96 * MIB)
    assert os.path.getsize(third) == 96 * MIB and len(list(spares.iterdir())) == 1


@needs_tools
def test_concurrent_new_volumes_never_share_a_spare(tmp_path: Path) -> None:
    """Eight volumes of one size made at once with one spare waiting: one of them
    takes it, the others make their own; no two images are one file system."""
    images = VolumeImages(
        subprocess_runner, str(tmp_path / "images"), spares=1, later=lambda call: None
    )
    assert images.problem() is None  # makes the images' folder
    images.refill(32 * MIB)
    assert len(list((tmp_path / "images" / ".spares").iterdir())) == 1
    with ThreadPoolExecutor(max_workers=8) as pool:
        paths = list(pool.map(lambda i: images.ensure(f"gyabc-c{i}", 32 * MIB), range(8)))
    seen = [_inode_and_uuid(p) for p in paths]
    assert len({inode for inode, _ in seen}) == 8
    assert len({uuid for _, uuid in seen}) == 8
    assert list((tmp_path / "images" / ".spares").iterdir()) == []


def test_spares_are_not_refilled_for_a_removed_images_folder(tmp_path: Path) -> None:
    """A refill that fires after its images' folder is gone (a test's, an uninstall)
    makes nothing there."""
    images = VolumeImages(subprocess_runner, str(tmp_path / "gone"), spares=1)
    images.refill(32 * MIB)
    assert not (tmp_path / "gone").exists()
