"""Cluster creates recorded in batches: decided in memory, written per table at once.

services/clusters/use_cases.py ``create_cluster`` hands the placer
(services/capacity/placement_batch.py) its recording step and, for the plain create
(no template, registry credentials, network volume, snapshot clone, spot bid, CUDA
constraint, location, auto-termination policy, port the user names, serverless
worker), this module's fast form of it. The placer gives all the fast forms waiting
in a batch to :data:`CREATES`, which, inside the batch's locked transaction:

- decides each create as the step would, in memory: its project, the checks of its
  image, ports and env, its GPU type, its claim and host ports
  (services/capacity/batch_claims.py: a host read once a batch, not once a create),
  the host's checks (limits, disk, private ports), admission (the account read once a
  batch; quotas from its usage read once a batch, plus what the batch's earlier
  creates of the account ask), the idempotency key (the batch's keys read at once);
- writes the rows of the creates it took with one multi-row INSERT per table:
  idempotency keys, clusters (their ledger totals as the meter leaves a new
  cluster's), GPU allocations, reservations, ports, events, usage intervals. A new
  cluster has no intervals to close, reservation or ports to free: none is looked for;
- declines (placement_batch.DECLINED) a create it cannot decide exactly so: any
  refusal (capacity, quota, budget, a bad GPU type, a key used before or twice in the
  batch) and any check that would read more. A declined create then runs its own
  step, after these rows and under the same lock, which answers it as always (its
  error, or a replay of an idempotent create), so refusals keep their words.

The rows are those the step writes, column for column (tests/service/test_create_batch.py
compares the two). What a create of the batch returns is its cluster as stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import and_, delete, select, tuple_
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import instance_dict, instance_state

from gpuyard.core.billing.ledger import boundary, micro_rates
from gpuyard.core.billing.quotas import Limits, Usage, first_breach
from gpuyard.core.errors import GpuyardError, ValidationFailed
from gpuyard.core.ids import new_cluster_id
from gpuyard.core.image_refs import check_image
from gpuyard.core.models import GpuTypeInfo
from gpuyard.core.progress import STEP_ALLOCATED
from gpuyard.core.states import ClusterStatus
from gpuyard.services.access.port_rules import check_external_ports, server_ports
from gpuyard.services.billing.quotas import ACCOUNT_WIDE, usage_of
from gpuyard.services.capacity.batch_claims import BatchClaims, Choice, HostFacts
from gpuyard.services.capacity.placement_batch import DECLINED, BatchWriter
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.clusters.cluster_rows import request_of
from gpuyard.services.clusters.config import ports_json, with_host_ports
from gpuyard.services.clusters.host_checks import refuse_host_of_new
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.views import cluster_rate
from gpuyard.services.context import Context
from gpuyard.services.idempotency import Claim
from gpuyard.services.tenancy.account_secrets import check_references
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import project_for_create
from gpuyard.services.tenancy.secrets import seal_env, secret_box
from gpuyard.store.bulk import insert_rows, table_of, with_defaults
from gpuyard.store.schema import Account, Cluster, Event, IdempotencyKey, Quota, UsageInterval


def cluster_values(
    *,
    cluster_id: str,
    project_id: int,
    body: CreateCluster,
    env: dict[str, str],
    gpu: GpuTypeInfo | None,
    gpu_count: int,
    volume_gb: int,
    now: datetime,
    template_id: str | None = None,
    network_volume_id: str | None = None,
    registry_auth_id: int | None = None,
    serverless_endpoint_id: str | None = None,
    bid: float | None = None,
) -> dict[str, Any]:
    """A new cluster's columns as a create records them, before placement."""
    return {
        "id": cluster_id,
        "project_id": project_id,
        "name": body.name or f"cluster-{cluster_id[:6]}",
        "image": body.docker_image,
        "docker_args": body.docker_args,
        "docker_entrypoint": body.docker_entrypoint,
        "min_cuda_version": body.min_cuda_version,
        "allowed_cuda_versions": body.allowed_cuda_versions,
        "env": env,
        "template_id": template_id,
        "ports": ports_json(body.ports),
        "gpu_type": gpu.id if gpu else None,
        "gpu_count": gpu_count,
        "cpu_cores": body.cpu_cores,
        "memory_gb": body.memory_gb,
        "container_disk_gb": body.container_disk_gb,
        "volume_gb": volume_gb,
        "volume_mount_path": body.volume_mount_path,
        "network_volume_id": network_volume_id,
        "registry_auth_id": registry_auth_id,
        "serverless_endpoint_id": serverless_endpoint_id,
        "cloud_type": body.cloud_type.value,
        "interruptible": bid is not None,
        "bid_per_gpu": bid,
        "auto_terminate": body.auto_terminate.model_dump() if body.auto_terminate else {},
        "desired_status": ClusterStatus.RUNNING.value,
        "status": ClusterStatus.STARTING.value,
        "status_reason": "created",
        "startup_step": STEP_ALLOCATED,
        "start_initiated_at": now,
        "created_at": now,
        "updated_at": now,
        "version": 1,
    }


@dataclass(frozen=True)
class NewCluster:
    """A plain create, as :data:`CREATES` takes it."""

    ctx: Context
    principal: Principal
    body: CreateCluster
    gpu_count: int
    now: datetime
    idempotency: Claim | None


def fast_form(
    ctx: Context,
    principal: Principal,
    body: CreateCluster,
    gpu_count: int,
    now: datetime,
    idempotency: Claim | None,
    *,
    plain: bool,
) -> tuple[BatchWriter, NewCluster] | None:
    """The fast form of a create (placement_batch.Placer.run ``fast``), or None when
    only its step can record it: ``plain`` False (the caller's own options: a
    location, a serverless worker's), or a body with an option the writer leaves to
    the step (see the module docstring)."""
    if not plain or (
        body.template_id is not None
        or body.registry_auth_id is not None
        or body.network_volume_id is not None
        or body.snapshot_id is not None
        or body.spot
        or body.min_cuda_version is not None
        or body.allowed_cuda_versions is not None
        or body.auto_terminate is not None
        or any(p.external_port for p in body.ports)
    ):
        return None
    return CREATES, NewCluster(ctx, principal, body, gpu_count, now, idempotency)


# ---------------------------------------------------------------- one batch


def _full_row(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every other column of ``clusters`` at its default, as an ORM
    insert would store it (every column default here is Python-side)."""
    return {**_NULLS, **with_defaults(_TABLE, values)}


_TABLE = table_of(Cluster)
# Every column of clusters, None: what one without a default stores when not given.
_NULLS: dict[str, Any] = dict.fromkeys(_TABLE.columns.keys())
_MAPPER = Cluster.__mapper__
_CLUSTERS = _MAPPER.class_manager


def _as_loaded(row: Mapping[str, Any]) -> Cluster:
    """A Cluster holding ``row``'s values as if loaded from the row written: detached,
    its identity set, nothing pending (no attribute set one by one, none flushed).
    What make_transient_to_detached does, less its walk over the attributes: every
    column is in the object's dict and none has a pending change."""
    cluster: Cluster = _CLUSTERS.new_instance()
    instance_dict(cluster).update(row)
    instance_state(cluster).key = _MAPPER.identity_key_from_primary_key((row["id"],))
    return cluster


# An idempotency key: account, route, key.
_Key = tuple[int, str, str]


@dataclass
class _Admission:
    """An account's admission for the batch: read once, counted in memory."""

    # Suspended or out of budget: every create of it is the step's to refuse.
    closed: bool
    limits: dict[int, Limits] = field(default_factory=dict)
    usage: dict[int, Usage] = field(default_factory=dict)
    # What the batch's creates taken so far ask, per scope (ACCOUNT_WIDE, project id).
    added: dict[int, Usage] = field(default_factory=dict)


class _Batch:
    """The state of one :meth:`CreateWriter.write` call."""

    def __init__(self, session: Session, items: list[NewCluster]) -> None:
        self.session = session
        self.claims = BatchClaims(session)
        self._gpu_types: dict[str, GpuTypeInfo | None] = {}
        self._admissions: dict[int, _Admission] = {}
        # The stored rows of the batch's keys: their expiry.
        self._keys_stored: dict[_Key, datetime] = {}
        self._keys_taken: set[_Key] = set()
        self.keys: list[dict[str, Any]] = []
        self.clusters: list[dict[str, Any]] = []
        self._images: dict[tuple[int, str], GpuyardError | None] = {}
        self.events: list[dict[str, Any]] = []
        self.intervals: list[dict[str, Any]] = []
        self._read_keys(items)

    def _read_keys(self, items: list[NewCluster]) -> None:
        """The expiry of each stored row of the batch's keys; whether one is live is
        judged against each create's own time (:meth:`_key_of`)."""
        wanted = {
            (c.account_id, c.route, c.key) for c in (i.idempotency for i in items) if c is not None
        }
        if not wanted:
            return
        rows = self.session.execute(
            select(
                IdempotencyKey.account_id,
                IdempotencyKey.route,
                IdempotencyKey.key,
                IdempotencyKey.expires_at,
            ).where(
                tuple_(IdempotencyKey.account_id, IdempotencyKey.route, IdempotencyKey.key).in_(
                    list(wanted)
                )
            )
        )
        for account_id, route, key, expires_at in rows:
            self._keys_stored[(account_id, route, key)] = expires_at

    def _key_of(self, item: NewCluster) -> _Key | None:
        """``item``'s idempotency key, unless the step must answer it: a row of it live
        at the item's own time (Claim.record replaces only a row expired by then; a
        live one is a replay or a reuse), or the batch's earlier create's key."""
        claim = item.idempotency
        if claim is None:
            return None
        key = (claim.account_id, claim.route, claim.key)
        expires_at = self._keys_stored.get(key)
        if key in self._keys_taken or (expires_at is not None and expires_at > item.now):
            raise ValidationFailed("Idempotency-Key", "decided one by one")
        return key

    # ------------------------------------------------------------ reads, once a batch

    def gpu_type(self, name: str | None) -> GpuTypeInfo:
        """use_cases.resolve_gpu_type, read once a batch per name."""
        if not name:
            raise ValidationFailed("gpu_type", "a GPU type is required when gpu_count > 0")
        if name not in self._gpu_types:
            self._gpu_types[name] = find_gpu_type(self.session, name)
        info = self._gpu_types[name]
        if info is None or info.id != name:
            # Unknown, or found by another spelling: the step says which.
            raise ValidationFailed("gpu_type", f"unknown GPU type {name!r}")
        return info

    def admit(self, account_id: int, project_id: int, want: Usage) -> None:
        """services/billing/admission.py ``admit`` for a cluster asking ``want``:
        raises (the step words the refusal) when the account is suspended or out of
        budget (refuse_closed_account) or a quota would be passed."""
        adm = self._admissions.get(account_id)
        if adm is None or project_id not in adm.limits:
            adm = self._read_admission(account_id, project_id)
        if adm.closed:
            raise ValidationFailed("account", "decided one by one")
        for scope in (ACCOUNT_WIDE, project_id):
            limits = adm.limits[scope]
            if not limits.rows():
                continue
            held = adm.usage.get(scope)
            if held is None:
                pid = None if scope == ACCOUNT_WIDE else scope
                held = adm.usage[scope] = usage_of(self.session, account_id, pid)
            held = held.plus(adm.added.get(scope, Usage()))
            if first_breach(limits, held, want) is not None:
                raise ValidationFailed("quota", "decided one by one")

    def _read_admission(self, account_id: int, project_id: int) -> _Admission:
        """The account's status (read afresh, as refuse_closed_account reads it) and
        quotas.limits_of of the account and of the project, in one statement; only the
        project's quotas once the account is known."""
        known = self._admissions.get(account_id)
        rows: dict[int, list[tuple[str, str, int]]] = {ACCOUNT_WIDE: [], project_id: []}
        closed = False
        quota = and_(
            Quota.account_id == account_id, Quota.project_id.in_([ACCOUNT_WIDE, project_id])
        )
        quotas = select(Quota.project_id, Quota.resource, Quota.gpu_type, Quota.limit_value)
        if known is None:
            stmt = (
                select(Account.status, Account.exhausted_at, *quotas.selected_columns)
                .outerjoin(Quota, quota)
                .where(Account.id == account_id)
            )
            for status, exhausted_at, scope, resource, gpu_type, value in self.session.execute(
                stmt
            ):
                closed = status == "suspended" or exhausted_at is not None
                if scope is not None:
                    rows[scope].append((resource, gpu_type, int(value)))
            known = self._admissions[account_id] = _Admission(closed)
        else:
            for scope, resource, gpu_type, value in self.session.execute(quotas.where(quota)):
                rows[scope].append((resource, gpu_type, int(value)))
        for scope, found in rows.items():
            known.limits.setdefault(scope, Limits.from_rows(found))
        return known

    def count(self, account_id: int, project_id: int, want: Usage) -> None:
        adm = self._admissions[account_id]
        for scope in (ACCOUNT_WIDE, project_id):
            adm.added[scope] = adm.added.get(scope, Usage()).plus(want)

    # ------------------------------------------------------------ one create

    def checked_image(self, ctx: Context, image: str) -> None:
        """core/image_refs.py ``check_image`` under ``ctx``'s registry policy, once a
        batch per image and settings."""
        key = (id(ctx.settings), image)
        if key not in self._images:
            try:
                check_image(image, ctx.settings.registry_policy, "docker_image")
                self._images[key] = None
            except GpuyardError as exc:
                self._images[key] = exc
        refusal = self._images[key]
        if refusal is not None:
            raise refusal

    def take(self, item: NewCluster) -> None:
        """Decide ``item`` and add its rows to the batch; raises GpuyardError (having
        added nothing) when the step must decide it."""
        project_id, gpu, key = self._checked(item)
        row = self._new_row(item, project_id, gpu)
        # The row as the step's helpers read a cluster (attributes).
        cluster = SimpleNamespace(**row)
        choice, assigned, ports, host = self._placed(item, cluster)
        want = Usage(
            gpus_by_type={row["gpu_type"]: item.gpu_count}
            if row["gpu_type"] and item.gpu_count
            else {},
            vcpus=item.body.cpu_cores,
            volume_gb=item.body.volume_gb,
            running_clusters=1,
        )
        self.admit(item.principal.account_id, project_id, want)
        rates = self._rates(item, cluster, gpu, host)
        # Decided: from here on nothing refuses it.
        self.claims.take(choice, assigned)
        self.count(item.principal.account_id, project_id, want)
        self._record(item, key, row, choice, ports, rates)

    def _checked(self, item: NewCluster) -> tuple[int, GpuTypeInfo | None, _Key | None]:
        """The step's checks before placement: the project, the image, ports and env,
        the GPU type, the idempotency key."""
        body, settings = item.body, item.ctx.settings
        project_id = project_for_create(self.session, item.principal, body.project_id)
        self.checked_image(item.ctx, body.docker_image)
        if body.ports:
            check_external_ports(body.ports, settings, "ports")
        check_references(self.session, item.principal.account_id, body.env.values(), "env")
        gpu = self.gpu_type(body.gpu_type) if item.gpu_count > 0 or body.gpu_type else None
        return project_id, gpu, self._key_of(item)

    def _new_row(
        self, item: NewCluster, project_id: int, gpu: GpuTypeInfo | None
    ) -> dict[str, Any]:
        """Every column of the new cluster as the step records it before placement."""
        body, settings = item.body, item.ctx.settings
        return _full_row(
            cluster_values(
                cluster_id=new_cluster_id(),
                project_id=project_id,
                body=body,
                env=seal_env(secret_box(settings), body.env, body.secret_env) if body.env else {},
                gpu=gpu,
                gpu_count=item.gpu_count,
                volume_gb=body.volume_gb,
                now=item.now,
            )
        )

    def _placed(
        self, item: NewCluster, cluster: Any
    ) -> tuple[Choice, dict[tuple[int, str], int], list[dict[str, Any]], HostFacts | None]:
        """Its claim (not taken yet), host ports and the host's own checks."""
        body, settings = item.body, item.ctx.settings
        choice = self.claims.choose(
            cluster_id=cluster.id,
            request=request_of(cluster, body.cloud_type),
            volume_gb=body.volume_gb,
            ratios=settings.allocation_ratios,
            policy=settings.placement_policy,
            now=item.now,
        )
        host_id = choice.placement.host_id
        assigned = self.claims.ports(
            host_id,
            tuple(body.ports),
            (settings.port_range_start, settings.port_range_end),
            server_ports(settings) if body.ports else frozenset(),
        )
        ports = with_host_ports(tuple(body.ports), assigned)
        host = self.claims.host(host_id)
        refuse_host_of_new(host, host_id, item.ctx, ports)
        return choice, assigned, ports, host

    @staticmethod
    def _rates(
        item: NewCluster, cluster: Any, gpu: GpuTypeInfo | None, host: HostFacts | None
    ) -> dict[str, int]:
        """Metering a new cluster (lifecycle.meter_status): nothing to close; a rate per
        billed meter from this second, unless its host is paused
        (lifecycle.billing_paused)."""
        if host is not None and host.unreachable_since is not None:
            return {}
        prices = item.ctx.settings.prices
        return micro_rates(cluster_rate(cluster, gpu, prices, status=ClusterStatus.STARTING))

    def _record(
        self,
        item: NewCluster,
        key: _Key | None,
        row: dict[str, Any],
        choice: Choice,
        ports: list[dict[str, Any]],
        rates: dict[str, int],
    ) -> None:
        """The taken create's rows: cluster, key, event, usage intervals."""
        now, cluster_id, at = item.now, row["id"], boundary(item.now)
        open_rate = sum(rates.values())
        row.update(
            host_id=choice.placement.host_id,
            gpu_indices=list(choice.placement.gpu_indices),
            ports=ports,
            billed_closed=0,
            billed_run_closed=0,
            billed_run_from=at,
            open_rate_micro=open_rate,
            open_since=at if open_rate else None,
        )
        self.clusters.append(row)
        if key is not None and item.idempotency is not None:
            self._keys_taken.add(key)
            self.keys.append(
                {
                    "account_id": key[0],
                    "route": key[1],
                    "key": key[2],
                    "request_hash": item.idempotency.request_hash,
                    "resource_id": cluster_id,
                    "created_at": now,
                    "expires_at": now + item.idempotency.ttl,
                }
            )
        self.events.append(
            {
                "cluster_id": cluster_id,
                "created_at": now,
                "type": "status",
                "from_status": None,
                "to_status": ClusterStatus.STARTING.value,
                "message": "created",
            }
        )
        self.intervals.extend(
            {
                "cluster_id": cluster_id,
                "project_id": row["project_id"],
                "meter": meter,
                "gpu_type": row["gpu_type"],
                "rate_micro": rate,
                "started_at": at,
                "ended_at": None,
            }
            for meter, rate in rates.items()
        )

    # ------------------------------------------------------------ the rows

    def write(self) -> dict[str, Cluster]:
        """The taken creates' rows, one INSERT per table, in the order the step
        writes them (keys before anything is placed; clusters before their claims).
        Returns the clusters as stored (detached ORM objects, as if loaded), by id.
        Core statements on the session's connection: no ORM bulk work per row."""
        session = self.session
        conn = session.connection()
        # A stored row of a key taken was expired at its create's time: replaced.
        expired = [k for k in self._keys_taken if k in self._keys_stored]
        if expired:
            session.execute(
                delete(IdempotencyKey).where(
                    tuple_(IdempotencyKey.account_id, IdempotencyKey.route, IdempotencyKey.key).in_(
                        expired
                    )
                )
            )
        if self.keys:
            insert_rows(conn, IdempotencyKey, self.keys)
        stored: dict[str, Cluster] = {}
        if self.clusters:
            # Core rows, no RETURNING: the answers are built from the values written
            # (every column's, defaults included: _full_row), as if loaded.
            insert_rows(conn, Cluster, self.clusters)
            stored = {row["id"]: _as_loaded(row) for row in self.clusters}
        self.claims.write()
        if self.events:
            insert_rows(conn, Event, self.events)
        if self.intervals:
            insert_rows(conn, UsageInterval, self.intervals)
        return stored


class CreateWriter:
    """The batch writer of plain creates (see the module docstring)."""

    def write(self, session: Session, items: list[NewCluster]) -> list[Any]:
        batch = _Batch(session, items)
        taken: list[str | None] = []
        for item in items:
            try:
                batch.take(item)
                taken.append(batch.clusters[-1]["id"])
            except GpuyardError:
                taken.append(None)
        stored = batch.write()
        return [DECLINED if cid is None else stored[cid] for cid in taken]


CREATES = CreateWriter()
