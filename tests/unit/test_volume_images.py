"""Sized volumes' image files (runtimes/volumes/images.py), made with this machine's own
tools in a temporary folder: made at their size, grown, never shrunk, measured by the
blocks they hold, removed; and a host without the tools says what is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
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
