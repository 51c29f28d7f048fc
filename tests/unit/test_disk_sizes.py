"""Disk sizes never silently disappear: a sized volume is made as a loop-mounted image,
a container disk gets the engine's size option, and where either cannot be enforced
the runtime refuses with a clear error unless the operator allowed it (runtimes/
engine.py, runtimes/engines/runtime.py; a stand-in engine and host)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import docker.errors
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_SIZE, Ownership
from gpuyard.runtimes.base import GIB, ContainerSpec
from gpuyard.runtimes.engines.disk import storage_problem
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.hosts.firewall import CommandResult
from gpuyard.runtimes.volumes.images import MOUNT_OPTIONS, VolumeImages

IMAGES = "/srv/gy-images"
XFS_ONLY = "storage option overlay.size and overlay.inodes only supported for backingFS XFS"


class _Host:
    """The engine's host: records commands, answers what ``answer`` says."""

    def __init__(self) -> None:
        self.commands: list[Sequence[str]] = []
        self.answer = CommandResult(0, "")

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        self.commands.append(list(argv))
        if argv[:2] == ["sh", "-c"] and "stat -c" in argv[2]:
            return CommandResult(0, "".join(f"8 512 {p}\n" for p in argv[4:]))
        return self.answer

    def ensured(self) -> list[tuple[str, str]]:
        """(image, size) of every ensure script run."""
        return [(c[4], c[5]) for c in self.commands if len(c) == 6 and "mkfs.ext4" in c[2]]


class _Api:
    """The SDK's low-level client: volumes in a dict, and what the runtime's create
    sends (runtimes/engines/container_create.py), a disk size refused as on ext4."""

    api_version = "1.41"

    def __init__(self, owner: Ownership) -> None:
        self.owner = owner
        self.created: list[dict[str, Any]] = []
        self.volumes_made: dict[str, dict[str, Any]] = {}
        self.removed: list[str] = []
        self.refuse_storage_opt = True
        self.rootless = False
        self.storage: list[list[str]] = []  # /info's DriverStatus ([] : none told)
        self.info_asked = 0

    def inspect_volume(self, name: str) -> dict[str, Any]:
        if name not in self.volumes_made:
            raise docker.errors.NotFound(f"no volume {name}")
        return self.volumes_made[name]

    def create_volume(
        self, name: str, labels: dict[str, str], driver_opts: dict[str, str] | None = None
    ) -> dict[str, Any]:
        self.volumes_made[name] = {
            "Name": name,
            "Labels": labels,
            "Options": dict(driver_opts or {}),
        }
        return self.volumes_made[name]

    def remove_volume(self, name: str) -> None:
        self.removed.append(name)
        self.volumes_made.pop(name, None)

    def volumes(self, filters: Any = None) -> dict[str, Any]:
        return {"Volumes": list(self.volumes_made.values())}

    def df(self) -> dict[str, Any]:
        return {
            "Volumes": [
                {"Name": n, "UsageData": {"Size": 1_000_000_000}} for n in self.volumes_made
            ]
        }

    def create_container(self, **kwargs: Any) -> dict[str, Any]:
        if "StorageOpt" in (kwargs.get("host_config") or {}) and self.refuse_storage_opt:
            raise docker.errors.APIError("refused", explanation=XFS_ONLY)
        self.created.append(kwargs)
        return {"Id": "c0ffee"}

    def inspect_container(self, name: str) -> dict[str, Any]:
        raise docker.errors.NotFound(f"no container {name}")

    def info(self) -> dict[str, Any]:
        self.info_asked += 1
        return {
            "SecurityOptions": ["name=rootless"] if self.rootless else ["name=seccomp"],
            "Driver": "overlay",
            "DriverStatus": self.storage,
        }


class _Client:
    def __init__(self, owner: Ownership, podman: bool = True) -> None:
        self.api = _Api(owner)
        self.podman = podman

    def version(self) -> dict[str, Any]:
        return {"Components": [{"Name": "Podman Engine" if self.podman else "Engine"}]}


def _runtime(
    *, allowed: bool = False, host: _Host | None = None, podman: bool = True
) -> tuple[DockerEngineRuntime, _Client]:
    owner = Ownership.new()
    client = _Client(owner, podman)
    rt = DockerEngineRuntime(
        "unix:///nowhere.sock",
        owner=owner,
        policy=EnginePolicy(allow_unenforced_disk=allowed),
        client=client,
        volume_images=VolumeImages(host, IMAGES) if host is not None else None,
    )
    return rt, client


def _spec(volume: str | None = None, volume_gb: int = 0, disk_gb: int = 0) -> ContainerSpec:
    return ContainerSpec(
        cluster_id="c1",
        image="img",
        command=None,
        env={},
        ports=(),
        volume_name=volume,
        volume_mount_path="/workspace",
        cpu_cores=0,
        memory_gb=0,
        gpu_indices=(),
        volume_gb=volume_gb,
        container_disk_gb=disk_gb,
    )


def test_sized_volume_is_a_loop_mounted_image_of_its_size() -> None:
    host = _Host()
    rt, client = _runtime(host=host)
    rt.ensure_volume("gyvol1", "c1", size_gb=5)
    image = f"{IMAGES}/gyvol1.img"
    assert host.ensured() == [(image, str(5 * GIB))]
    made = client.api.volumes_made["gyvol1"]
    assert made["Options"] == {"type": "ext4", "device": image, "o": MOUNT_OPTIONS}
    assert made["Labels"][LABEL_SIZE] == str(5 * GIB)
    assert rt.capabilities().disk_problem is None
    # Grown (never a second volume) when asked for more; the image script decides.
    rt.ensure_volume("gyvol1", "c1", size_gb=8)
    assert host.ensured()[-1] == (image, str(8 * GIB))
    # A grow the host cannot do now (an online resize without CAP_SYS_RESOURCE)
    # fails no start: the volume keeps its enforced size until a later call.
    host.answer = CommandResult(1, "resize2fs: Permission denied to resize filesystem")
    rt.ensure_volume("gyvol1", "c1", size_gb=9)
    host.answer = CommandResult(0, "")
    # Usage by the image's blocks, not the engine's sum of apparent sizes.
    assert rt.volume_usage() == {"gyvol1": 8 * 512}
    rt.remove_volume("gyvol1")
    assert client.api.removed == ["gyvol1"]
    assert host.commands[-1] == ["rm", "-f", "--", image, f"{image}.grow"]


def test_a_size_reached_is_not_asked_of_the_host_again_until_the_volume_is_made_again() -> None:
    host = _Host()
    rt, client = _runtime(host=host)
    rt.ensure_volume("gyvol1", "c1", size_gb=5)  # made: its image asked for once
    asked = len(host.ensured())
    assert asked == 1
    rt.ensure_volume("gyvol1", "c1", size_gb=5)  # later starts: nothing on the host
    rt.ensure_volume("gyvol1", "c1", size_gb=4)
    assert len(host.ensured()) == asked
    rt.ensure_volume("gyvol1", "c1", size_gb=6)  # more: asked
    assert len(host.ensured()) == asked + 1
    # Removed and made again: its new image, then nothing more.
    rt.remove_volume("gyvol1")
    rt.ensure_volume("gyvol1", "c1", size_gb=6)
    rt.ensure_volume("gyvol1", "c1", size_gb=6)
    assert len(host.ensured()) == asked + 2
    # Made again elsewhere (another replica: another creation time): asked.
    client.api.volumes_made["gyvol1"]["CreatedAt"] = "2026-12-02T00:00:00Z"
    rt.ensure_volume("gyvol1", "c1", size_gb=6)
    assert len(host.ensured()) == asked + 3


def test_an_unsized_volume_stays_a_plain_one() -> None:
    host = _Host()
    rt, client = _runtime(host=host)
    rt.ensure_volume("gyvol2", "c1")
    assert client.api.volumes_made["gyvol2"]["Options"] == {}
    rt.ensure_volume("gyvol2", "c1", size_gb=5)  # made unsized before: left so
    assert host.ensured() == []
    assert rt.volume_usage() == {"gyvol2": 1_000_000_000}
    rt.remove_volume("gyvol2")
    assert not [c for c in host.commands if c[0] == "rm"]


@pytest.mark.parametrize(
    ("podman", "host", "rootless", "why"),
    [
        (True, False, False, "cannot run commands on this engine's host"),
        (False, True, False, "Docker's local volume driver"),
        (True, True, True, "rootless Podman"),
    ],
)
def test_a_host_that_cannot_size_volumes_refuses_unless_allowed(
    podman: bool, host: bool, rootless: bool, why: str
) -> None:
    rt, client = _runtime(host=_Host() if host else None, podman=podman)
    client.api.rootless = rootless
    with pytest.raises(RuntimeFailure) as refused:
        rt.ensure_volume("gyvol3", "c1", size_gb=5)
    assert why in refused.value.message
    assert "GPUYARD_ALLOW_UNENFORCED_DISK" in refused.value.message
    assert client.api.volumes_made == {}  # nothing made
    assert why in (rt.capabilities().disk_problem or "")
    allowed, client = _runtime(allowed=True, host=_Host() if host else None, podman=podman)
    client.api.rootless = rootless
    allowed.ensure_volume("gyvol3", "c1", size_gb=5)
    assert client.api.volumes_made["gyvol3"]["Options"] == {}


def test_a_host_missing_tools_refuses_sized_volumes() -> None:
    host = _Host()
    host.answer = CommandResult(3, "resize2fs is not installed")
    rt, _client = _runtime(host=host)
    with pytest.raises(RuntimeFailure) as refused:
        rt.ensure_volume("gyvol4", "c1", size_gb=1)
    assert "resize2fs is not installed" in refused.value.message


def test_container_disk_size_is_asked_for_and_a_refusal_is_not_dropped() -> None:
    host = _Host()
    rt, client = _runtime(host=host)
    client.api.refuse_storage_opt = False
    rt.create(_spec("gyvol5", volume_gb=2, disk_gb=20))
    (kwargs,) = client.api.created
    assert kwargs["host_config"]["StorageOpt"] == {"size": "20G"}
    assert host.ensured() == [(f"{IMAGES}/gyvol5.img", str(2 * GIB))]

    rt, client = _runtime(host=_Host())
    with pytest.raises(RuntimeFailure) as refused:
        rt.create(_spec(disk_gb=20))
    assert "cannot enforce disk sizes" in refused.value.message
    assert "backingFS XFS" in refused.value.message
    assert client.api.created == []
    with pytest.raises(RuntimeFailure):  # refused again: never switched off for all
        rt.create(_spec(disk_gb=20))
    assert "container disk" in (rt.capabilities().disk_problem or "")


def test_container_disk_size_dropped_only_where_allowed() -> None:
    rt, client = _runtime(allowed=True, host=_Host())
    assert rt.create(_spec(disk_gb=20)) == "c0ffee"
    (kwargs,) = client.api.created
    assert "StorageOpt" not in kwargs["host_config"]
    assert "backingFS XFS" in (rt.capabilities().disk_problem or "")
    rt.create(_spec(disk_gb=20))  # the next create asks no more
    assert "StorageOpt" not in client.api.created[-1]["host_config"]


EXTFS = [["Backing Filesystem", "extfs"], ["Supports d_type", "true"]]


def test_storage_that_can_never_size_a_container_disk_is_told_by_the_engines_info() -> None:
    # Podman 4.3's and Docker's /info on ext4, as this machine's engine answers.
    assert "overlay on extfs" in (
        storage_problem({"Driver": "overlay", "DriverStatus": EXTFS}) or ""
    )
    assert storage_problem({"Driver": "overlay2", "DriverStatus": EXTFS}) is not None
    xfs = [["Backing Filesystem", "xfs"]]
    assert storage_problem({"Driver": "overlay", "DriverStatus": xfs}) is None  # pquota: at create
    assert storage_problem({"Driver": "btrfs", "DriverStatus": []}) is None
    assert storage_problem({"Driver": "overlay", "DriverStatus": None}) is None
    assert storage_problem({}) is None


def test_a_host_shows_its_storage_problem_before_any_create_and_creates_skip_the_size() -> None:
    rt, client = _runtime(allowed=True, host=_Host())
    client.api.storage = EXTFS
    assert "overlay on extfs" in (rt.capabilities().disk_problem or "")
    assert rt.create(_spec(disk_gb=20)) == "c0ffee"  # no refused create first
    (kwargs,) = client.api.created
    assert "StorageOpt" not in kwargs["host_config"]
    rt.capabilities()
    assert client.api.info_asked == 1  # asked once, kept

    rt, client = _runtime(host=_Host())
    client.api.storage = EXTFS
    rt.capabilities()
    with pytest.raises(RuntimeFailure) as refused:
        rt.create(_spec(disk_gb=20))
    assert "overlay on extfs" in refused.value.message
