"""A new sized volume's image (mkfs on the engine's host) is made while the engine
records the volume and creates the container: only the container's start mounts it.
The create still returns only once the image is whole; an image that cannot be made
leaves no container and no volume behind (the next start makes both again); a name
that cannot name an image file makes nothing at all. Stand-in engine and host
(tests/unit/test_disk_sizes.py); events, never a clock, make the two meet."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import docker.errors
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.hosts.firewall import CommandResult
from tests.unit.test_disk_sizes import IMAGES, _Host, _runtime, _spec

MEET_S = 10.0  # a guard against a hang only: side by side, the two meet at once


class _SlowHost(_Host):
    """A host whose image script waits until the engine has been asked to create the
    container (it only returns if both run at once)."""

    def __init__(self, created: threading.Event) -> None:
        super().__init__()
        self.created = created
        self.met: list[bool] = []

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        if len(argv) == 6 and "mkfs.ext4" in argv[2]:
            self.met.append(self.created.wait(MEET_S))
        return super().__call__(argv)


class _FullHost(_Host):
    """A host whose disk is full: it passes the probe, its image script fails."""

    def __init__(self) -> None:
        super().__init__()
        self.full = True

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        if self.full and len(argv) == 6 and "mkfs.ext4" in argv[2]:
            self.commands.append(list(argv))
            return CommandResult(1, "mkfs.ext4: No space left on device")
        return super().__call__(argv)


def _containers_kept(api: Any, created: threading.Event | None = None) -> dict[str, Any]:
    """Make the stand-in engine keep the containers it creates (inspect, remove)."""
    kept: dict[str, Any] = {}
    create = api.create_container
    owner_labels = api.owner.labels()

    def create_container(**kwargs: Any) -> dict[str, Any]:
        made = create(**kwargs)
        kept[kwargs["name"]] = {"Id": made["Id"], "Config": {"Labels": owner_labels}}
        if created is not None:
            created.set()
        return made

    def inspect_container(name: str) -> dict[str, Any]:
        if name not in kept:
            raise docker.errors.NotFound(f"no container {name}")
        return dict(kept[name])

    def remove_container(name: str, **_: Any) -> None:
        kept.pop(name, None)

    api.create_container = create_container
    api.inspect_container = inspect_container
    api.remove_container = remove_container
    return kept


def test_the_image_is_made_while_the_container_is_created() -> None:
    created = threading.Event()
    host = _SlowHost(created)
    rt, client = _runtime(host=host)
    client.api.refuse_storage_opt = False
    kept = _containers_kept(client.api, created)
    assert rt.create(_spec("gyvol1", volume_gb=2)) == "c0ffee"
    assert host.met == [True]
    assert host.ensured() == [(f"{IMAGES}/gyvol1.img", str(2 * 1024**3))]
    assert "gyvol1" in client.api.volumes_made and len(kept) == 1
    # Its size is known once the create returned: the next start asks the host nothing.
    rt.create(_spec("gyvol1", volume_gb=2))
    assert len(host.ensured()) == 1


def test_an_image_that_cannot_be_made_leaves_no_container_and_no_volume() -> None:
    host = _FullHost()
    rt, client = _runtime(host=host)
    client.api.refuse_storage_opt = False
    kept = _containers_kept(client.api)
    with pytest.raises(RuntimeFailure) as failed:
        rt.create(_spec("gyvol1", volume_gb=2))
    assert "No space left on device" in failed.value.message
    assert kept == {}
    assert client.api.removed == ["gyvol1"] and client.api.volumes_made == {}
    assert host.commands[-1][:3] == ["rm", "-f", "--"]
    # The next start makes both again.
    host.full = False
    assert rt.create(_spec("gyvol1", volume_gb=2)) == "c0ffee"
    assert "gyvol1" in client.api.volumes_made and len(kept) == 1


def test_a_volume_name_that_cannot_name_an_image_makes_nothing() -> None:
    host = _Host()
    rt, client = _runtime(host=host)
    client.api.refuse_storage_opt = False
    kept = _containers_kept(client.api)
    with pytest.raises(RuntimeFailure) as refused:
        rt.create(_spec("../../etc/passwd", volume_gb=2))
    assert "cannot name an image file" in refused.value.message
    assert client.api.volumes_made == {} and kept == {}
    assert host.ensured() == []
