"""RunPod v2 pods: the status mapping over every cluster status, and the mapping of
``CreatePodRequest`` onto gpuyard's cluster input (api/runpod_v2/pod_views.py,
pod_requests.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.api.runpod_v2.pod_requests import (
    command_text,
    cpu_memory_gb,
    create_cluster_input,
    create_inputs,
    pod_field,
    port_specs,
)
from gpuyard.api.runpod_v2.pod_schemas import CreatePodRequest
from gpuyard.api.runpod_v2.pod_views import (
    POD_STATUSES,
    cluster_statuses,
    pod_actions,
    pod_status,
)
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.states import ClusterStatus
from tests.contract.runpod_v2 import document

S = ClusterStatus
EXPECTED_STATUS = {
    S.PENDING: "PROVISIONING",
    S.STARTING: "STARTING",
    S.RUNNING: "RUNNING",
    S.STOPPING: "EXITED",
    S.STOPPED: "EXITED",
    S.ERROR: "ERROR",
    S.TERMINATING: "TERMINATED",
    S.TERMINATED: "TERMINATED",
}


@pytest.mark.parametrize("status", list(ClusterStatus))
def test_every_cluster_status_has_a_pod_status(status: ClusterStatus) -> None:
    assert pod_status(status) == EXPECTED_STATUS[status]
    assert status in cluster_statuses(pod_status(status))


def test_the_pod_statuses_are_the_documents() -> None:
    enum = document()["components"]["schemas"]["PodStatus"]["enum"]
    assert list(POD_STATUSES) == enum
    assert {pod_status(s) for s in ClusterStatus} == set(enum)
    assert cluster_statuses("TERMINATED") == (S.TERMINATING, S.TERMINATED)
    assert cluster_statuses("EXITED") == (S.STOPPING, S.STOPPED)


def test_actions_are_the_documents_actions() -> None:
    allowed = set(document()["components"]["schemas"]["PodAction"]["enum"])
    for status in ClusterStatus:
        assert set(pod_actions(status)) <= allowed
    assert pod_actions(S.RUNNING) == ["stop", "restart", "terminate"]
    assert pod_actions(S.STOPPED) == ["start", "terminate"]
    assert pod_actions(S.STARTING) == ["stop", "terminate"]
    assert pod_actions(S.TERMINATED) == []


def body(**fields: Any) -> CreatePodRequest:
    base: dict[str, Any] = {"name": "p", "image": "img", "gpu": {"id": "NVIDIA RTX A6000"}}
    return CreatePodRequest.model_validate({**base, **fields})


def test_a_gpu_pod_maps_onto_the_cluster_input() -> None:
    inputs = create_inputs(
        body(
            gpu={"id": "NVIDIA RTX A6000", "count": 2},
            ports=["22/tcp", "8888/http", "53/udp"],
            env={"A": "1"},
            disk=30,
            mounts={"persistent": {"size": 50, "path": "/data"}},
            cloud="COMMUNITY",
            registry="7",
            dataCenterIds=["lab", "", "lab", "edge"],
            templateId="tpl123",
            cmd=["python", "train.py", "--name", "a b"],
        )
    )
    cc = create_cluster_input(inputs)
    assert (cc.gpu_type, cc.gpu_count) == ("NVIDIA RTX A6000", 2)
    assert [(p.internal_port, p.protocol) for p in cc.ports] == [
        (22, "tcp"),
        (8888, "http"),
        (53, "udp"),
    ]
    assert cc.env == {"A": "1"} and cc.container_disk_gb == 30
    assert (cc.volume_gb, cc.volume_mount_path) == (50, "/data")
    assert cc.cloud_type.value == "COMMUNITY" and cc.registry_auth_id == 7
    assert cc.template_id == "tpl123"
    assert cc.docker_args == "python train.py --name 'a b'"
    assert inputs.locations == ("lab", "edge")


def test_a_cpu_pod_has_no_gpu_and_memory_by_flavor() -> None:
    cc = create_cluster_input(create_inputs(body(gpu=None, cpu={"id": "cpu3m", "vcpuCount": 4})))
    assert cc.gpu_count == 0 and cc.gpu_type is None
    assert (cc.cpu_cores, cc.memory_gb) == (4, 32)
    assert cpu_memory_gb("cpu3c", 2) == 4 and cpu_memory_gb("cpu5g", 2) == 8
    assert cpu_memory_gb("weird", 2) == 8


def test_network_volume_spot_and_args() -> None:
    cc = create_cluster_input(
        create_inputs(
            body(
                mounts={"network": [{"volumeId": "nv1", "path": "/shared"}]},
                interruptible=True,
                bid=0.5,
                args="sleep infinity",
            )
        )
    )
    assert cc.network_volume_id == "nv1" and cc.volume_mount_path == "/shared"
    assert cc.interruptible and cc.bid_per_gpu == 0.5 and cc.spot
    assert cc.docker_args == "sleep infinity"
    assert command_text("echo 'a b'", "cmd") == "echo 'a b'"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"gpu": None}, "gpu"),
        ({"cpu": {"id": "cpu3c", "vcpuCount": 2}}, "gpu"),
        ({"image": None}, "image"),
        ({"args": "a", "cmd": ["b"]}, "cmd"),
        ({"cmd": "echo 'unterminated"}, "cmd"),
        ({"globalNetworking": True}, "globalNetworking"),
        ({"bid": 1.0, "bidPerGpu": 2.0}, "bidPerGpu"),
        ({"registry": "x1"}, "registry"),
        (
            {
                "mounts": {
                    "persistent": {"size": 10, "path": "/a"},
                    "network": [{"volumeId": "nv", "path": "/b"}],
                }
            },
            "mounts",
        ),
        (
            {
                "gpu": None,
                "cpu": {"id": "cpu3c", "vcpuCount": 2},
                "mounts": {"persistent": {"size": 10, "path": "/a"}},
            },
            "mounts.persistent",
        ),
    ],
)
def test_rules_across_fields_name_the_pods_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        create_inputs(body(**fields))
    assert caught.value.field == field


def test_the_cluster_inputs_refusals_name_the_pods_fields() -> None:
    with pytest.raises(ValidationFailed) as caught:
        create_cluster_input(create_inputs(body(env={"1BAD": "x"})))
    assert caught.value.field == "env"
    with pytest.raises(ValidationFailed) as caught:
        port_specs(["22/tcp", "70000/tcp"])
    assert caught.value.field == "ports[1]"
    with pytest.raises(ValidationFailed) as caught:
        port_specs(["22/tcp", "22/http"])
    assert caught.value.field == "ports[1]"
    assert pod_field("docker_image") == "image"
    assert pod_field("gpu_type") == "gpu.id"
    assert pod_field("ports.0.internal_port") == "ports.0.internal_port"
    assert pod_field("update_configuration.storage_gb") == "mounts.persistent.size"
    assert pod_field("location") == "dataCenterIds"
    assert pod_field("something_else") == "something_else"


def test_start_jupyter_sets_a_password_unless_given() -> None:
    made = create_inputs(body(startJupyter=True)).values["env"]["JUPYTER_PASSWORD"]
    assert len(made) >= 16
    kept = create_inputs(body(startJupyter=True, env={"JUPYTER_PASSWORD": "mine"}))
    assert kept.values["env"] == {"JUPYTER_PASSWORD": "mine"}


def test_entrypoint_and_cuda_versions_reach_the_cluster_input() -> None:
    inputs = create_inputs(
        body(entrypoint="/bin/sh -c", gpu={"id": "G", "allowedCudaVersions": ["12.4", "11.8"]})
    )
    made = create_cluster_input(inputs)
    assert made.docker_entrypoint == ["/bin/sh", "-c"]
    assert made.allowed_cuda_versions == ["12.4", "11.8"]
    assert made.min_cuda_version is None
    minimum = create_inputs(body(gpu={"id": "G", "minCudaVersion": "12.1"}))
    assert create_cluster_input(minimum).min_cuda_version == "12.1"
