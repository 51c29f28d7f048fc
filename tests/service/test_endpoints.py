"""Serverless endpoints on a real store (SQLite and PostgreSQL): create from an image
or a template, list (cursor pages, counts in one statement), update (version bump),
delete (gone from reads, name free); names unique per account; secret env sealed and
masked; GPU types and RunPod pool names resolved; limits; another account can neither
read, change, delete nor use an endpoint, and cannot lend its template or volume."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event, select

from gpuyard.core.errors import Forbidden, NetworkVolumeNotFound, ValidationFailed
from gpuyard.core.ids import is_endpoint_id, new_worker_id
from gpuyard.core.secret_env import MASK, is_sealed
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import templates as tpl
from gpuyard.services.clusters.template_inputs import CreateTemplate
from gpuyard.services.context import Context
from gpuyard.services.serverless import endpoints as eps
from gpuyard.services.serverless.endpoint_inputs import CreateEndpoint, UpdateEndpoint
from gpuyard.services.serverless.endpoint_views import endpoint_view
from gpuyard.services.tenancy.audit import AuditQuery, list_audit
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.services.tenancy.projects import ProjectRef
from gpuyard.services.volumes import network_volumes as nvs
from gpuyard.store.schema.serverless import ServerlessEndpoint, ServerlessJob, ServerlessWorker
from tests.conftest import new_principal

HERE = ProjectRef()
A6000 = "NVIDIA RTX A6000"


def body(**fields: object) -> CreateEndpoint:
    return CreateEndpoint.model_validate(
        {"name": "echo", "image": "img:1", "gpu_type_ids": [A6000], **fields}
    )


def test_create_show_update_delete(ctx: Context, alice: Principal) -> None:
    made = eps.create_endpoint(
        ctx,
        alice,
        HERE,
        body(
            env={"MODE": "x", "HF_TOKEN": "hf_secret", "P": {"value": "p", "secret": True}},
            workers_max=5,
            scaler_type="REQUEST_COUNT",
            scaler_value=2,
            flashboot=True,
        ),
    )
    row = made.row
    assert is_endpoint_id(row.id)
    assert row.status == "active" and row.version == 1
    assert row.gpu_type_ids == [A6000] and row.gpu_count == 1
    assert (row.idle_timeout_s, row.scaler_type, row.scaler_value) == (5, "REQUEST_COUNT", 2)
    assert row.volume_mount_path == "/runpod-volume" and row.container_disk_gb == 10
    assert is_sealed(row.env["HF_TOKEN"]) and is_sealed(row.env["P"]) and row.env["MODE"] == "x"
    view = endpoint_view(row, made.counts)
    assert view["env"] == {"MODE": "x", "HF_TOKEN": MASK, "P": MASK}
    assert view["workers"] == {"running": 0, "idle": 0, "starting": 0}
    assert view["jobs"] == {"inQueue": 0, "inProgress": 0}

    shown = eps.show_endpoint(ctx, alice, HERE, row.id).row
    assert shown.name == "echo"

    changed = eps.update_endpoint(
        ctx,
        alice,
        HERE,
        row.id,
        UpdateEndpoint.model_validate(
            {"workers_min": 1, "idle_timeout_s": 30, "env": {"MODE": "y", "HF_TOKEN": MASK}}
        ),
    ).row
    assert changed.version == 2 and changed.workers_min == 1 and changed.idle_timeout_s == 30
    # The mask sent back keeps the secret; a variable left out is removed.
    with ctx.read() as s:
        stored = s.get(ServerlessEndpoint, row.id)
        assert stored is not None
        assert stored.env["HF_TOKEN"] == row.env["HF_TOKEN"] and "P" not in stored.env

    assert eps.delete_endpoint(ctx, alice, HERE, row.id) == row.id
    with pytest.raises(eps.EndpointNotFound):
        eps.show_endpoint(ctx, alice, HERE, row.id)
    assert eps.endpoint_page(ctx, alice, HERE).endpoints == []
    with pytest.raises(eps.EndpointNotFound):
        eps.delete_endpoint(ctx, alice, HERE, row.id)
    with ctx.read() as s:
        gone = s.get(ServerlessEndpoint, row.id)
        assert gone is not None and gone.status == "deleting" and gone.version == 3
    # The name is free again.
    again = eps.create_endpoint(ctx, alice, HERE, body()).row
    assert again.id != row.id and again.name == "echo"
    with ctx.read() as s:
        actions = [e.action for e in list_audit(s, alice.account_id, AuditQuery())]
    assert {"endpoint.create", "endpoint.update", "endpoint.delete"} <= set(actions)


def test_names_are_unique_per_account(ctx: Context, alice: Principal, bob: Principal) -> None:
    first = eps.create_endpoint(ctx, alice, HERE, body()).row
    with pytest.raises(eps.EndpointExists) as exc:
        eps.create_endpoint(ctx, alice, HERE, body())
    assert exc.value.details["endpoint_id"] == first.id
    eps.create_endpoint(ctx, bob, HERE, body())  # another account's name space
    other = eps.create_endpoint(ctx, alice, HERE, body(name="other")).row
    with pytest.raises(eps.EndpointExists):
        eps.update_endpoint(ctx, alice, HERE, other.id, UpdateEndpoint(name="echo"))


def test_from_a_template(ctx: Context, alice: Principal, bob: Principal) -> None:
    template = tpl.create_template(
        ctx,
        alice,
        HERE,
        CreateTemplate.model_validate(
            {
                "name": "worker",
                "docker_image": "worker:2",
                "env": {"A": "1", "API_KEY": "k"},
                "container_disk_gb": 25,
                "volume_gb": 3,
                "volume_mount_path": "/data",
                "is_serverless": True,
            }
        ),
    )
    row = eps.create_endpoint(
        ctx,
        alice,
        HERE,
        CreateEndpoint.model_validate(
            {
                "name": "t",
                "template_id": template.id,
                "gpu_type_ids": [A6000],
                "env": {"B": "2"},
                "volume_gb": 0,
            }
        ),
    ).row
    assert row.template_id == template.id and row.image == "worker:2"
    assert (row.container_disk_gb, row.volume_gb, row.volume_mount_path) == (25, 0, "/data")
    assert row.env["A"] == "1" and row.env["B"] == "2" and is_sealed(row.env["API_KEY"])
    # Another account's template reads as unknown, at create and at update.
    lent = CreateEndpoint.model_validate(
        {"name": "t", "template_id": template.id, "gpu_type_ids": [A6000]}
    )
    with pytest.raises(tpl.TemplateNotFound):
        eps.create_endpoint(ctx, bob, HERE, lent)
    own = eps.create_endpoint(ctx, bob, HERE, body()).row
    with pytest.raises(tpl.TemplateNotFound):
        eps.update_endpoint(ctx, bob, HERE, own.id, UpdateEndpoint(template_id=template.id))


def test_input_rules(ctx: Context, alice: Principal) -> None:
    with pytest.raises(ValidationFailed) as exc:
        eps.create_endpoint(ctx, alice, HERE, body(image=None))
    assert exc.value.field == "image"
    with pytest.raises(ValidationFailed) as exc:
        eps.create_endpoint(ctx, alice, HERE, body(workers_min=3, workers_max=2))
    assert exc.value.field == "workers_max"
    with pytest.raises(ValidationFailed) as exc:
        eps.create_endpoint(ctx, alice, HERE, body(workers_max=101))
    assert exc.value.field == "workers_max"
    with pytest.raises(ValidationFailed) as exc:
        eps.create_endpoint(ctx, alice, HERE, body(gpu_type_ids=["NVIDIA B9000"]))
    assert exc.value.field == "gpu_type_ids"
    with pytest.raises(ValidationFailed) as exc:
        eps.create_endpoint(ctx, alice, HERE, body(gpu_type_ids=[]))
    assert exc.value.field == "gpu_type_ids"
    with pytest.raises(ValidationFailed) as exc:
        eps.create_endpoint(ctx, alice, HERE, body(locations=["mars"]))
    assert exc.value.field == "locations"
    cpu = eps.create_endpoint(ctx, alice, HERE, body(name="cpu", gpu_type_ids=[], gpu_count=0))
    assert cpu.row.gpu_count == 0
    made = eps.create_endpoint(ctx, alice, HERE, body(name="placed", locations=["local"])).row
    assert made.locations == ["local"]
    # An update is checked against the whole endpoint after it.
    with pytest.raises(ValidationFailed):
        eps.update_endpoint(ctx, alice, HERE, made.id, UpdateEndpoint(workers_min=9))
    with pytest.raises(ValidationFailed):
        eps.update_endpoint(ctx, alice, HERE, made.id, UpdateEndpoint(gpu_type_ids=[]))
    for bad in ({"workers_min": -1}, {"idle_timeout_s": 0}, {"scaler_value": 0}):
        with pytest.raises(ValueError):
            body(**bad)
    with pytest.raises(ValueError):
        body(scaler_type="REQUESTS")


def test_runpod_pool_names(ctx: Context, alice: Principal) -> None:
    row = eps.create_endpoint(
        ctx, alice, HERE, body(gpu_type_ids=["AMPERE_48", "RTX 4090", A6000])
    ).row
    # Every catalog type with 48 GB, then the 4090 by its display name, each once.
    assert row.gpu_type_ids[-1] == "NVIDIA GeForce RTX 4090"
    assert set(row.gpu_type_ids[:-1]) == {
        "NVIDIA A40",
        "NVIDIA L40S",
        "NVIDIA RTX 6000 Ada Generation",
        A6000,
    }


def test_network_volume_must_be_the_accounts(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    volume = nvs.create_network_volume(
        ctx,
        alice,
        nvs.CreateNetworkVolume.model_validate({"name": "v", "size": 5, "dataCenterId": "local"}),
    )
    row = eps.create_endpoint(ctx, alice, HERE, body(network_volume_id=volume.id)).row
    assert row.network_volume_id == volume.id
    with pytest.raises(NetworkVolumeNotFound):
        eps.create_endpoint(ctx, bob, HERE, body(network_volume_id=volume.id))
    own = eps.create_endpoint(ctx, bob, HERE, body()).row
    with pytest.raises(NetworkVolumeNotFound):
        eps.update_endpoint(ctx, bob, HERE, own.id, UpdateEndpoint(network_volume_id=volume.id))
    detached = eps.update_endpoint(
        ctx, alice, HERE, row.id, UpdateEndpoint.model_validate({"network_volume_id": None})
    ).row
    assert detached.network_volume_id is None


def test_another_account_sees_nothing(ctx: Context, alice: Principal, bob: Principal) -> None:
    row = eps.create_endpoint(ctx, alice, HERE, body()).row
    with pytest.raises(eps.EndpointNotFound):
        eps.show_endpoint(ctx, bob, HERE, row.id)
    with pytest.raises(eps.EndpointNotFound):
        eps.update_endpoint(ctx, bob, HERE, row.id, UpdateEndpoint(workers_max=1))
    with pytest.raises(eps.EndpointNotFound):
        eps.delete_endpoint(ctx, bob, HERE, row.id)
    assert eps.endpoint_page(ctx, bob, HERE).endpoints == []
    assert eps.all_endpoints(ctx, bob) == []
    with ctx.read() as s, pytest.raises(eps.EndpointNotFound):
        eps.live_endpoint(s, bob, row.id)
    assert eps.show_endpoint(ctx, alice, HERE, row.id).row.version == 1


def test_read_key_may_not_change(ctx: Context, alice: Principal) -> None:
    reader = new_principal(ctx, "reader@example.com", Scope.READ)
    with pytest.raises(Forbidden):
        eps.create_endpoint(ctx, reader, HERE, body())
    row = eps.create_endpoint(ctx, alice, HERE, body()).row
    with pytest.raises(Forbidden):
        eps.delete_endpoint(ctx, reader, HERE, row.id)


def test_pages_and_counts_in_one_statement(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    ids = []
    for i in range(5):
        ids.append(eps.create_endpoint(ctx, alice, HERE, body(name=f"e{i}")).row.id)
        clock.advance(1)
    now = ctx.clock.now()
    with ctx.transaction() as s:
        for status, busy in (
            ("starting", 0),
            ("ready", 1),
            ("ready", 0),
            ("ready", 0),
            ("gone", 0),
        ):
            s.add(
                ServerlessWorker(
                    id=new_worker_id(),
                    endpoint_id=ids[0],
                    key_hash=new_worker_id(),
                    status=status,
                    jobs_in_progress=busy,
                )
            )
        for n, status in enumerate(("IN_QUEUE", "IN_QUEUE", "IN_PROGRESS", "COMPLETED")):
            s.add(
                ServerlessJob(
                    id=f"job-{n}",
                    endpoint_id=ids[0],
                    account_id=alice.account_id,
                    status=status,
                    input_json="{}",
                    queued_at=now,
                )
            )
    statements: list[str] = []

    def count(_c: object, _cur: object, sql: str, *_a: object) -> None:
        statements.append(sql)

    engine = ctx.sessions.kw["bind"]
    event.listen(engine, "before_cursor_execute", count)
    try:
        first = eps.endpoint_page(ctx, alice, HERE, per_page=3)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    counted = [s for s in statements if "serverless_workers" in s]
    assert len(counted) == 1, statements
    assert [e.row.id for e in first.endpoints] == ids[:3] and first.total == 5
    counts = first.endpoints[0].counts
    assert counts.workers == {"running": 1, "idle": 2, "starting": 1}
    assert counts.jobs == {"inQueue": 2, "inProgress": 1}
    assert first.next_cursor is not None
    second = eps.endpoint_page(ctx, alice, HERE, per_page=3, cursor=first.next_cursor)
    assert [e.row.id for e in second.endpoints] == ids[3:] and second.next_cursor is None
    with pytest.raises(ValidationFailed):
        eps.endpoint_page(ctx, alice, HERE, cursor="garbage")
    assert [e.row.id for e in eps.all_endpoints(ctx, alice)] == ids
    with ctx.read() as s:
        assert s.scalar(select(ServerlessEndpoint.id).where(ServerlessEndpoint.id == ids[0]))


def test_concurrent_creates_of_one_name(ctx: Context, alice: Principal) -> None:
    """Creates of one name at once: exactly one endpoint, every other create a clean
    ENDPOINT_EXISTS (the unique key decides; no aborted transaction, no 500)."""
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def create() -> None:
        barrier.wait()
        try:
            eps.create_endpoint(ctx, alice, HERE, body(name="race"))
            outcomes.append("made")
        except eps.EndpointExists:
            outcomes.append("exists")

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["exists"] * 7 + ["made"]
    assert [e.row.name for e in eps.all_endpoints(ctx, alice)] == ["race"]
