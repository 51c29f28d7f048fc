"""Cluster templates on a real store (SQLite and PostgreSQL): create, list (cursor
pages), update, delete; names unique per account; secret env sealed and masked;
another account can neither read, change, delete nor use a template; a cluster
create with ``template_id`` takes what it leaves out from the template."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError
from sqlalchemy import select

from gpuyard.core.errors import Forbidden, ValidationFailed
from gpuyard.core.secret_env import MASK, is_sealed
from gpuyard.services.clusters import templates as tpl
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.template_inputs import CreateTemplate, UpdateTemplate
from gpuyard.services.clusters.use_cases import create_cluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.services.tenancy.projects import (
    ProjectNotEmpty,
    ProjectRef,
    create_project,
    delete_project,
)
from gpuyard.services.tenancy.secrets import holds_sealed_secrets
from gpuyard.store.schema import Cluster, ClusterTemplate
from tests.conftest import new_principal

HERE = ProjectRef()


def body(**fields: object) -> CreateTemplate:
    return CreateTemplate.model_validate({"name": "web", "docker_image": "img:1", **fields})


def test_create_show_list_update_delete(ctx: Context, alice: Principal) -> None:
    row = tpl.create_template(
        ctx,
        alice,
        HERE,
        body(
            env={"MODE": "dev", "HF_TOKEN": "hf_x", "PLAIN": {"value": "p", "secret": True}},
            ports=[{"internal_port": 8888, "protocol": "http"}],
            container_disk_gb=20,
            volume_gb=5,
            readme="# hello",
        ),
    )
    view = tpl.template_view(tpl.show_template(ctx, alice, HERE, row.id))
    assert view["env"] == {"MODE": "dev", "HF_TOKEN": MASK, "PLAIN": MASK}
    assert view["ports"][0]["internal_port"] == 8888 and view["is_public"] is False
    with ctx.read() as s:
        stored = s.get_one(ClusterTemplate, row.id).env
    assert is_sealed(stored["HF_TOKEN"]) and is_sealed(stored["PLAIN"])
    assert stored["MODE"] == "dev"

    # The mask sent back keeps a secret; a variable left out is removed.
    changed = tpl.update_template(
        ctx,
        alice,
        HERE,
        row.id,
        UpdateTemplate.model_validate(
            {"env": {"HF_TOKEN": MASK, "MODE": "prod"}, "volume_gb": 9, "name": "web2"}
        ),
    )
    with ctx.read() as s:
        after = s.get_one(ClusterTemplate, row.id)
        assert after.env["HF_TOKEN"] == stored["HF_TOKEN"]
        assert after.env["MODE"] == "prod" and "PLAIN" not in after.env
        assert (after.volume_gb, after.name, after.container_disk_gb) == (9, "web2", 20)
    assert changed.readme == "# hello"

    page = tpl.template_page(ctx, alice, HERE)
    assert [t.id for t in page.templates] == [row.id] and page.total == 1
    tpl.delete_template(ctx, alice, HERE, row.id)
    with pytest.raises(tpl.TemplateNotFound):
        tpl.show_template(ctx, alice, HERE, row.id)


def test_names_are_unique_per_account(ctx: Context, alice: Principal, bob: Principal) -> None:
    first = tpl.create_template(ctx, alice, HERE, body())
    with pytest.raises(tpl.TemplateExists):
        tpl.create_template(ctx, alice, HERE, body())
    other = tpl.create_template(ctx, alice, HERE, body(name="other"))
    with pytest.raises(tpl.TemplateExists):
        tpl.update_template(ctx, alice, HERE, other.id, UpdateTemplate(name="web"))
    # Another account may use the same name.
    assert tpl.create_template(ctx, bob, HERE, body()).id != first.id


def test_pages_by_cursor(ctx: Context, alice: Principal) -> None:
    ids = [tpl.create_template(ctx, alice, HERE, body(name=f"t{i}")).id for i in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        page = tpl.template_page(ctx, alice, HERE, per_page=2, cursor=cursor)
        seen += [t.id for t in page.templates]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == sorted(ids) and len(seen) == 5
    with pytest.raises(ValidationFailed, match="cursor"):
        tpl.template_page(ctx, alice, HERE, cursor="garbage")


def test_another_account_cannot_read_change_delete_or_use(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    row = tpl.create_template(ctx, alice, HERE, body())
    with pytest.raises(tpl.TemplateNotFound):
        tpl.show_template(ctx, bob, HERE, row.id)
    with pytest.raises(tpl.TemplateNotFound):
        tpl.update_template(ctx, bob, HERE, row.id, UpdateTemplate(name="mine"))
    with pytest.raises(tpl.TemplateNotFound):
        tpl.delete_template(ctx, bob, HERE, row.id)
    with pytest.raises(tpl.TemplateNotFound):
        tpl.delete_template_named(ctx, bob, "web")
    assert tpl.template_page(ctx, bob, HERE).templates == []
    assert tpl.all_templates(ctx, bob) == []
    with pytest.raises(ValidationFailed, match="template_id"):
        create_cluster(ctx, bob, CreateCluster(template_id=row.id))
    with ctx.read() as s:
        assert s.get_one(ClusterTemplate, row.id).name == "web"


def test_a_read_only_key_cannot_change_templates(ctx: Context, alice: Principal) -> None:
    row = tpl.create_template(ctx, alice, HERE, body())
    reader = new_principal(ctx, "reader@example.com", Scope.READ)
    with pytest.raises(Forbidden):
        tpl.create_template(ctx, reader, HERE, body(name="r"))
    with pytest.raises(Forbidden):
        tpl.delete_template(ctx, reader, HERE, row.id)


@pytest.mark.parametrize(
    "fields",
    [
        {"name": ""},
        {"name": "   "},
        {"name": "a\x07b"},
        {"docker_image": ""},
        {"is_public": True},
        {"container_disk_gb": 0},
        {"volume_gb": -1},
        {"volume_mount_path": "/etc"},
        {"env": {"1BAD": "x"}},
        {"ports": [{"internal_port": 70000}]},
        {"unknown": 1},
    ],
)
def test_bad_input_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        body(**fields)


def test_a_cluster_takes_what_it_leaves_out_from_its_template(
    ctx: Context, alice: Principal
) -> None:
    row = tpl.create_template(
        ctx,
        alice,
        HERE,
        body(
            env={"MODE": "dev", "API_KEY": "k"},
            ports=[{"internal_port": 8888, "protocol": "http"}],
            container_disk_gb=12,
            volume_gb=3,
            volume_mount_path="/data",
            docker_args="sleep infinity",
        ),
    )
    made = create_cluster(
        ctx,
        alice,
        CreateCluster.model_validate(
            {"template_id": row.id, "volume_gb": 1, "env": {"MODE": "prod", "EXTRA": "1"}}
        ),
    )
    with ctx.read() as s:
        cluster = s.scalars(select(Cluster).where(Cluster.id == made.id)).one()
        stored = s.get_one(ClusterTemplate, row.id).env
    assert cluster.template_id == row.id
    assert (cluster.image, cluster.docker_args) == ("img:1", "sleep infinity")
    assert (cluster.volume_gb, cluster.container_disk_gb) == (1, 12)  # the request wins
    assert cluster.volume_mount_path == "/data"
    assert [p["internal_port"] for p in cluster.ports] == [8888]
    assert cluster.env["MODE"] == "prod" and cluster.env["EXTRA"] == "1"
    assert cluster.env["API_KEY"] == stored["API_KEY"]  # sealed once, copied as stored


def test_a_cluster_without_image_or_template_is_refused(ctx: Context, alice: Principal) -> None:
    with pytest.raises(ValidationFailed, match="docker_image"):
        create_cluster(ctx, alice, CreateCluster())
    with pytest.raises(ValidationFailed, match="template_id"):
        create_cluster(ctx, alice, CreateCluster(template_id="nothing"))


def test_a_key_restricted_to_a_project_sees_only_its_templates(
    ctx: Context, alice: Principal
) -> None:
    shared = tpl.create_template(ctx, alice, HERE, body(name="default-project"))
    other = create_project(ctx, alice, None, "other")
    theirs = tpl.create_template(ctx, alice, ProjectRef(other.id), body(name="other-project"))
    pinned = dataclasses.replace(
        alice, project_ids=frozenset({other.id}), default_project_id=other.id
    )
    assert [t.id for t in tpl.all_templates(ctx, pinned)] == [theirs.id]
    assert [t.id for t in tpl.template_page(ctx, pinned, HERE).templates] == [theirs.id]
    with pytest.raises(tpl.TemplateNotFound):
        tpl.show_template(ctx, pinned, HERE, shared.id)
    with pytest.raises(tpl.TemplateNotFound):
        tpl.delete_template_named(ctx, pinned, "default-project")
    with pytest.raises(ValidationFailed, match="template_id"):
        create_cluster(ctx, pinned, CreateCluster(template_id=shared.id))
    # The owner's list names a project: only that project's.
    only = tpl.template_page(ctx, alice, ProjectRef(other.id)).templates
    assert [t.id for t in only] == [theirs.id]
    assert tpl.template_page(ctx, alice, HERE).total == 2


def test_a_templates_sealed_secret_counts_as_a_stored_secret(
    ctx: Context, alice: Principal
) -> None:
    """A missing key file is then a lost key (start-up refuses), not a first start."""
    with ctx.read() as s:
        assert not holds_sealed_secrets(s)
    tpl.create_template(ctx, alice, HERE, body(env={"HF_TOKEN": "hf_x"}))
    with ctx.read() as s:
        assert holds_sealed_secrets(s)


def test_a_project_holding_a_template_is_not_deleted(ctx: Context, alice: Principal) -> None:
    other = create_project(ctx, alice, None, "holds-one")
    row = tpl.create_template(ctx, alice, ProjectRef(other.id), body())
    with pytest.raises(ProjectNotEmpty) as refused:
        delete_project(ctx, alice, other.id)
    assert refused.value.details["left"] == {"templates": [row.id]}
    tpl.delete_template(ctx, alice, HERE, row.id)
    delete_project(ctx, alice, other.id)
