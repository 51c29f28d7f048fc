"""The use cases the projects, security-group, catalog and training routes call, on a
real store (SQLite and PostgreSQL): each opens its own transactions, the security
group and training services re-sync the network edge after their commit, and the
training services take typed inputs."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from gpuyard.core.errors import InvalidState, ValidationFailed
from gpuyard.services.access import security_groups as sg
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.catalog import gpu_types as catalog
from gpuyard.services.context import Context
from gpuyard.services.tenancy import projects
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import ProjectNotFound, ProjectRef
from gpuyard.services.training import use_cases as training
from gpuyard.services.training.inputs import (
    AddSecurityGroups,
    ClusterSpec,
    CustomPlan,
    RemoveSecurityGroup,
)
from gpuyard.store.schema import GpuAllocation, ImageVersion, SecurityGroup

A = "NVIDIA RTX A6000"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGe4tciPtcKsqalQ5MYQNCKBAGbS1rO94qvBwyD7hpHy k1"
SSH = [{"protocol": "tcp", "port_range": "22", "source_cidr": "10.0.0.0/8"}]


class EdgeRecorder:
    """Stands in for ctx.training_edge: notes each re-sync with the rules of every
    group as a fresh session reads them then (so only committed rules are seen)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.calls: list[tuple[int, dict[int, list[Any]]]] = []

    def __call__(self, cluster_id: int) -> None:
        with self.ctx.read() as s:
            rules = {g.id: list(g.rules) for g in s.scalars(select(SecurityGroup))}
        self.calls.append((cluster_id, rules))


@pytest.fixture
def edge(ctx: Context) -> EdgeRecorder:
    recorder = EdgeRecorder(ctx)
    ctx.training_edge.answer(recorder)
    return recorder


def spec(ctx: Context, alice: Principal) -> ClusterSpec:
    with ctx.transaction() as s:
        key = add_key(s, alice.account_id, "k1", KEY)
        image = s.scalar(select(ImageVersion.id).order_by(ImageVersion.id))
        assert image is not None
        return ClusterSpec(
            name="t",
            image_version_id=image,
            ssh_key_ids=(key.id,),
            no_of_nodes=1,
            plan=CustomPlan(A, 1, 2, 4),
        )


def scope(alice: Principal) -> training.Scope:
    return training.Scope(project_id=alice.default_project_id, location="local")


def gpus_held(ctx: Context) -> int:
    with ctx.read() as s:
        return int(s.scalar(select(func.count()).select_from(GpuAllocation)) or 0)


def test_replacing_a_group_resyncs_the_edge_of_its_clusters_after_the_commit(
    ctx: Context, alice: Principal, edge: EdgeRecorder
) -> None:
    here = ProjectRef()
    group = sg.create_project_group(ctx, alice, here, "ssh", None, SSH)
    other = sg.create_project_group(ctx, alice, here, "other", "", [])
    attached = training.create_cluster(ctx, alice, scope(alice), spec(ctx, alice))
    training.create_cluster(ctx, alice, scope(alice), spec(ctx, alice))  # attaches none
    with ctx.transaction() as s:  # the operator would have brought them up
        for c in training.list_clusters(s, alice, scope(alice)):
            c.status = "running"
    edge.calls.clear()

    training.perform_action(ctx, alice, scope(alice), attached, AddSecurityGroups((group.id,)))
    assert [cid for cid, _ in edge.calls] == [attached]  # an edge action re-syncs at once

    edge.calls.clear()
    wider = [{"protocol": "tcp", "port_range": "22", "source_cidr": "0.0.0.0/0"}]
    row = sg.update_group(ctx, alice, group.id, here, "ssh-any", "open", wider)
    assert (row.name, row.description, row.rules) == ("ssh-any", "open", wider)
    assert edge.calls == [(attached, {group.id: wider, other.id: []})]

    edge.calls.clear()
    sg.update_group(ctx, alice, other.id, here, "other", None, [])
    assert edge.calls == []  # no cluster attaches it


def test_group_use_cases_keep_their_errors(ctx: Context, alice: Principal, bob: Principal) -> None:
    here = ProjectRef()
    group = sg.create_project_group(ctx, alice, here, "ssh", None, SSH)
    cid = training.create_cluster(ctx, alice, scope(alice), spec(ctx, alice))
    with ctx.transaction() as s:
        training.load_cluster(s, alice, scope(alice), cid).status = "running"
    training.perform_action(ctx, alice, scope(alice), cid, AddSecurityGroups((group.id,)))

    with pytest.raises(InvalidState):
        sg.remove_group(ctx, alice, group.id, here)
    with pytest.raises(sg.SecurityGroupNotFound):
        sg.show_group(ctx, bob, group.id, here)  # another account's reads as missing
    with pytest.raises(ProjectNotFound):
        sg.list_project_groups(ctx, bob, ProjectRef(project_id=alice.default_project_id))
    with pytest.raises(ValidationFailed) as bad:
        sg.update_group(ctx, alice, group.id, here, " ", None, [])
    assert bad.value.field == "name"
    assert sg.show_group(ctx, alice, group.id, here).name == "ssh"  # nothing changed

    training.perform_action(ctx, alice, scope(alice), cid, RemoveSecurityGroup(group.id))
    sg.remove_group(ctx, alice, group.id, here)
    assert sg.list_project_groups(ctx, alice, here) == []


def test_projects_of_the_acting_account(ctx: Context, alice: Principal) -> None:
    made = projects.create_project(ctx, alice, None, "  research ")
    assert made.name == "research" and not made.is_default
    listed = projects.list_projects(ctx, alice, None)
    assert [p.id for p in listed] == [alice.default_project_id, made.id]
    with pytest.raises(ValidationFailed):
        projects.create_project(ctx, alice, None, "   ")


def test_gpu_offers_count_what_is_held(ctx: Context, alice: Principal) -> None:
    def offer() -> catalog.GpuTypeOffer:
        return next(o for o in catalog.gpu_type_offers(ctx) if o.info.id == A)

    before = offer()
    assert before.total_gpus == 4 and before.available_gpus == 4
    cid = training.create_cluster(ctx, alice, scope(alice), spec(ctx, alice))
    assert offer().available_gpus == 3 and offer().total_gpus == 4
    # Without an operator the delete finishes at once and gives the GPU back.
    training.delete_cluster(ctx, alice, scope(alice), cid, finish_now=True)
    assert gpus_held(ctx) == 0 and offer().available_gpus == 4
