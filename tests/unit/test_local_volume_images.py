"""Who makes sized volumes' images for this machine's engine: the server and
``gpuyard uninstall`` ask the same function, so a volume the uninstall deletes takes
its image file with it."""

from __future__ import annotations

from pathlib import Path

from gpuyard.runtimes.hosts.runtimes import local_volume_images
from gpuyard.runtimes.volumes.images import VolumeImages


def test_a_local_engine_with_a_directory_has_volume_images(tmp_path: Path) -> None:
    images = local_volume_images(f"unix://{tmp_path}/podman.sock", str(tmp_path / "images"))
    assert isinstance(images, VolumeImages)


def test_no_images_for_a_remote_engine_or_without_a_directory(tmp_path: Path) -> None:
    assert local_volume_images("tcp://10.0.0.5:2375", str(tmp_path)) is None
    assert local_volume_images("ssh://gpu@host-1", str(tmp_path)) is None
    assert local_volume_images(f"unix://{tmp_path}/podman.sock", "") is None
    assert local_volume_images(f"unix://{tmp_path}/podman.sock", None) is None
