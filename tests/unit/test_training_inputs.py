"""Seed 002 bodies parsed into the training use cases' typed inputs: what a good body
becomes, and for each bad one the field and message the API has always answered."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.core.errors import ValidationFailed
from gpuyard.services.training.inputs import (
    CREATE_FIELDS,
    AddSecurityGroups,
    AttachIp,
    ClusterSpec,
    CustomPlan,
    DetachIp,
    PlanById,
    RemoveSecurityGroup,
    RestartCluster,
    RestartWorkers,
    ScaleCluster,
    UpdateImage,
    UpdateSshKeys,
    parse_action_request,
    parse_cluster_spec,
)

A = "NVIDIA RTX A6000"


def body(**change: Any) -> dict[str, Any]:
    """A valid custom-plan create body with ``change`` applied (None removes a field)."""
    out: dict[str, Any] = {
        "name": "  trainer ",
        "image_version_id": 3,
        "ssh_key_ids": [5, 4, 5],
        "no_of_nodes": 2,
        "gpu_type": A,
        "gpus_per_node": 1,
        "cpus_per_node": 4,
        "memory_gb_per_node": 8,
    }
    out.update(change)
    return {k: v for k, v in out.items() if v is not None}


def refused(parse: Any, raw: dict[str, Any]) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as info:
        parse(raw)
    return info.value


def test_a_custom_plan_body_becomes_a_spec() -> None:
    spec = parse_cluster_spec(body(security_group_id=7, lifecycle_script="echo hi"))
    assert spec == ClusterSpec(
        name="trainer",
        image_version_id=3,
        ssh_key_ids=(5, 4),  # duplicates dropped, order kept
        no_of_nodes=2,
        plan=CustomPlan(A, 1, 4, 8),
        security_group_id=7,
        lifecycle_script="echo hi",
    )


def test_a_plan_id_body_and_empty_optionals() -> None:
    raw = body(gpu_type=None, gpus_per_node=None, cpus_per_node=None, memory_gb_per_node=None)
    spec = parse_cluster_spec(
        {**raw, "sku_id": 12, "lifecycle_script": "", "security_group_id": None}
    )
    assert spec.plan == PlanById(12)
    assert spec.lifecycle_script is None and spec.security_group_id is None


NO_PLAN = {"gpu_type": None, "gpus_per_node": None, "cpus_per_node": None}

CREATE_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"colour": "blue"}, "colour", "unknown field"),
    ({"name": None}, "name", "is required and must be a non-empty string"),
    ({"name": "   "}, "name", "is required and must be a non-empty string"),
    ({"name": 5}, "name", "is required and must be a non-empty string"),
    ({"name": "x" * 101}, "name", "must be at most 100 characters"),
    ({"image_version_id": None}, "image_version_id", "is required"),
    ({"image_version_id": "x"}, "image_version_id", "must be an integer image version id"),
    ({"image_version_id": True}, "image_version_id", "must be an integer image version id"),
    ({"ssh_key_ids": None}, "ssh_key_ids", "is required (a list of SSH key ids)"),
    ({"ssh_key_ids": "1"}, "ssh_key_ids", "must be a list of SSH key ids"),
    ({"ssh_key_ids": []}, "ssh_key_ids", "must name at least one SSH key"),
    ({"ssh_key_ids": list(range(101))}, "ssh_key_ids", "names 101 SSH keys; at most 100 at once"),
    ({"ssh_key_ids": [1, "2"]}, "ssh_key_ids", "item 1 ('2') is not an integer id"),
    ({"no_of_nodes": None}, "no_of_nodes", "must be an integer, got None"),
    ({"no_of_nodes": "two"}, "no_of_nodes", "must be an integer, got 'two'"),
    ({"no_of_nodes": 0}, "no_of_nodes", "must be at least 1"),
    ({"no_of_nodes": 65}, "no_of_nodes", "must be at most 64"),
    ({"sku_id": 1}, "gpu_type", "give either sku_id or a custom plan, not both"),
    (
        {**NO_PLAN, "memory_gb_per_node": None, "sku_id": "1"},
        "sku_id",
        "must be an integer plan id (GET /v1/plans)",
    ),
    (
        {**NO_PLAN, "memory_gb_per_node": None},
        "sku_id",
        "a plan is required: sku_id, or gpu_type with gpus/cpus/memory per node",
    ),
    ({"cpus_per_node": None}, "cpus_per_node", "is required for a custom plan"),
    ({"gpu_type": 5}, "gpu_type", "unknown GPU type 5 (GET /v1/gpu-types)"),
    ({"gpus_per_node": 0}, "gpus_per_node", "must be at least 1"),
    ({"gpus_per_node": 17}, "gpus_per_node", "must be at most 16"),
    ({"cpus_per_node": 513}, "cpus_per_node", "must be at most 512"),
    ({"memory_gb_per_node": 4.5}, "memory_gb_per_node", "must be an integer, got 4.5"),
    ({"security_group_id": "7"}, "security_group_id", "item 0 ('7') is not an integer id"),
    ({"lifecycle_script": 5}, "lifecycle_script", "must be a string (a shell script)"),
    (
        {"lifecycle_script": "é" * (32 * 1024 + 1)},  # 2 bytes each: over 64 KiB
        "lifecycle_script",
        "must be at most 65536 bytes",
    ),
]


@pytest.mark.parametrize(("change", "field", "message"), CREATE_CASES)
def test_bad_create_bodies_name_the_field(change: dict[str, Any], field: str, message: str) -> None:
    err = refused(parse_cluster_spec, body(**change))
    assert (err.field, err.message) == (field, f"{field}: {message}")


def test_unknown_fields_come_first_and_list_the_allowed() -> None:
    err = refused(parse_cluster_spec, {"colour": "blue", "name": ""})
    assert err.details == {"field": "colour", "allowed": sorted(CREATE_FIELDS)}


def test_fields_are_judged_in_a_fixed_order() -> None:
    # Both bad: the name is named, as it always was.
    err = refused(parse_cluster_spec, body(name="", no_of_nodes=0))
    assert err.field == "name"
    err = refused(parse_cluster_spec, body(no_of_nodes=0, gpus_per_node=0))
    assert err.field == "no_of_nodes"


def test_good_action_bodies() -> None:
    cases: list[tuple[dict[str, Any], object]] = [
        ({"action": "update_ssh_keys", "ssh_key_ids": [2, 2, 1]}, UpdateSshKeys((2, 1))),
        ({"action": "update_image", "image_version_id": 4}, UpdateImage(4)),
        ({"action": "restart_workers"}, RestartWorkers()),
        ({"action": "restart_cluster"}, RestartCluster()),
        ({"action": "scale_cluster", "additional_nodes": 3}, ScaleCluster(3)),
        ({"action": "attach_ip", "reserved_ip_id": 9}, AttachIp(9)),
        (
            {"action": "detach_ip", "reserved_ip_id": 9, "ip_type": "public"},
            DetachIp(9, "public"),
        ),
        ({"action": "add_security_group", "security_groups_ids": [1]}, AddSecurityGroups((1,))),
        ({"action": "remove_security_group", "security_group_id": 1}, RemoveSecurityGroup(1)),
    ]
    for raw, want in cases:
        got = parse_action_request(raw)
        assert got == want and got.action.value == raw["action"]


ACTION_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({}, "action", "is required"),
    ({"action": ""}, "action", "is required"),
    ({"action": "explode"}, "action", "unknown action 'explode'"),
    ({"action": "scale_cluster"}, "additional_nodes", "is required for action scale_cluster"),
    (
        {"action": "restart_workers", "force": True},
        "force",
        "is not a field of action restart_workers",
    ),
    (
        {"action": "detach_ip", "reserved_ip_id": 1},
        "ip_type",
        "is required for action detach_ip",
    ),
    (
        {"action": "detach_ip", "reserved_ip_id": "1", "ip_type": "x"},
        "ip_type",
        "must be one of public, reserved",
    ),
    (
        {"action": "detach_ip", "reserved_ip_id": "1", "ip_type": "reserved"},
        "reserved_ip_id",
        "must be an integer reserved IP id",
    ),
    (
        {"action": "attach_ip", "reserved_ip_id": False},
        "reserved_ip_id",
        "must be an integer reserved IP id",
    ),
    (
        {"action": "update_ssh_keys", "ssh_key_ids": []},
        "ssh_key_ids",
        "must name at least one SSH key",
    ),
    (
        {"action": "update_image", "image_version_id": 1.0},
        "image_version_id",
        "must be an integer image version id",
    ),
    (
        {"action": "scale_cluster", "additional_nodes": "x"},
        "additional_nodes",
        "must be an integer, got 'x'",
    ),
    ({"action": "scale_cluster", "additional_nodes": 0}, "additional_nodes", "must be at least 1"),
    (
        {"action": "add_security_group", "security_groups_ids": 3},
        "security_groups_ids",
        "must be a list of security group ids",
    ),
    (
        {"action": "remove_security_group", "security_group_id": "3"},
        "security_group_id",
        "must be an integer id, got '3'",
    ),
]


@pytest.mark.parametrize(("raw", "field", "message"), ACTION_CASES)
def test_bad_action_bodies_name_the_field(raw: dict[str, Any], field: str, message: str) -> None:
    err = refused(parse_action_request, raw)
    assert (err.field, err.message) == (field, f"{field}: {message}")


def test_a_scale_has_no_cap_before_the_cluster_is_known() -> None:
    # The cap is what the cluster has room for; the service checks it.
    assert parse_action_request({"action": "scale_cluster", "additional_nodes": 500}) == (
        ScaleCluster(500)
    )
