"""Account networks: their names and labels, and the fake runtime's network model."""

from __future__ import annotations

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_ACCOUNT, LABEL_INSTALLATION, Ownership
from gpuyard.runtimes.base import ContainerSpec
from gpuyard.testing.fake_runtime import FakeNetwork, FakeRuntime

OWNER = Ownership("0123abcd-0000-4000-8000-000000000000")
IMAGE = "localhost/gpuyard/busybox:latest"


def spec(cluster_id: str, account_id: int | None) -> ContainerSpec:
    return ContainerSpec(
        cluster_id=cluster_id,
        image=IMAGE,
        command=None,
        env={},
        ports=(),
        volume_name=None,
        volume_mount_path="/workspace",
        cpu_cores=1,
        memory_gb=1,
        gpu_indices=(),
        account_id=account_id,
    )


def test_account_network_name_is_per_installation_and_account() -> None:
    assert OWNER.account_network(7) == "gy0123abcd-net-a7"
    assert OWNER.account_network(7) != OWNER.account_network(8)
    other = Ownership("89abcdef-0000-4000-8000-000000000000")
    assert other.account_network(7) == "gy89abcdef-net-a7"
    # Never one of the other names this installation chooses.
    assert OWNER.account_network(7) not in {OWNER.container("a7"), OWNER.volume("a7")}


@pytest.mark.parametrize("bad", [-1, True, "7", 7.0, None])
def test_account_network_refuses_what_is_not_an_account_id(bad: object) -> None:
    with pytest.raises(ValueError):
        OWNER.account_network(bad)  # type: ignore[arg-type]


def test_account_network_labels_are_ours_plus_the_account() -> None:
    labels = OWNER.account_network_labels(7)
    assert labels[LABEL_INSTALLATION] == OWNER.installation_id
    assert labels[LABEL_ACCOUNT] == "7"
    assert OWNER.owns(labels)


@pytest.fixture
def rt() -> FakeRuntime:
    runtime = FakeRuntime(images={IMAGE})
    runtime.bind(OWNER)
    return runtime


def run(rt: FakeRuntime, cluster_id: str, account_id: int | None) -> None:
    rt.create(spec(cluster_id, account_id))
    rt.start(cluster_id)


def test_fake_clusters_reach_their_own_account_only(rt: FakeRuntime) -> None:
    run(rt, "a1", 1)
    run(rt, "a2", 1)
    run(rt, "b1", 2)
    assert rt.network_of("a1") == rt.network_of("a2") == OWNER.account_network(1)
    assert rt.network_of("b1") == OWNER.account_network(2)
    assert rt.can_reach("a1", "a2") and rt.can_reach("a2", "a1")
    assert not rt.can_reach("b1", "a1") and not rt.can_reach("a1", "b1")
    assert rt.networks == {
        OWNER.account_network(1): FakeNetwork(OWNER.account_network(1), OWNER.installation_id, 1),
        OWNER.account_network(2): FakeNetwork(OWNER.account_network(2), OWNER.installation_id, 2),
    }


def test_fake_network_made_once_and_kept_across_recreates(rt: FakeRuntime) -> None:
    run(rt, "a1", 1)
    rt.stop("a1")
    run(rt, "a1", 1)
    assert list(rt.networks) == [OWNER.account_network(1)]
    assert rt.can_reach("a1", "a1")


def test_fake_stopped_container_is_unreachable(rt: FakeRuntime) -> None:
    run(rt, "a1", 1)
    rt.create(spec("a2", 1))  # created, not started
    assert not rt.can_reach("a1", "a2")


def test_fake_without_account_stays_on_the_default_network(rt: FakeRuntime) -> None:
    run(rt, "x1", None)
    run(rt, "a1", 1)
    assert rt.network_of("x1") is None
    assert not rt.can_reach("x1", "a1")


def test_fake_refuses_a_network_of_that_name_not_ours(rt: FakeRuntime) -> None:
    name = OWNER.account_network(1)
    rt.networks[name] = FakeNetwork(name, "somebody-else", 1)
    with pytest.raises(RuntimeFailure, match="does not belong"):
        rt.create(spec("a1", 1))
    assert "a1" not in rt.containers
