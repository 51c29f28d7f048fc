"""Per-cluster steps: each reads the cluster, calls the runtime outside any
transaction, then records the result with a guarded update (DESIGN.md rule 2).

Every step is safe to repeat: after a crash the reconciler simply runs it again.
A Conflict while recording means the user changed the cluster meanwhile (stop,
terminate); the step gives up and the next pass acts on the new status.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from gpuyard.core.errors import Conflict, GpuyardError, RuntimeFailure
from gpuyard.core.image_refs import check_image
from gpuyard.core.progress import STEP_CREATED, STEP_READY
from gpuyard.core.restarts import RestartPolicy, judge_failure
from gpuyard.core.side_by_side import SideBySide
from gpuyard.core.states import ClusterStatus
from gpuyard.observability.crash_points import crash_point
from gpuyard.reconciler.clusters.container_spec import ContainerSpecs
from gpuyard.reconciler.clusters.early_ports import EarlyPortsAsk
from gpuyard.reconciler.clusters.log_archive import forget_logs, keep_logs, stop_keeping_logs
from gpuyard.reconciler.clusters.port_moves import MOVES_PER_START, move_off, port_in_use
from gpuyard.reconciler.clusters.records import Abandon, ClusterRecords, volume_of
from gpuyard.reconciler.clusters.restore import RestoreStorage, VolumeRestores
from gpuyard.reconciler.clusters.start_checks import StartChecks, read_start_checks
from gpuyard.reconciler.clusters.start_retries import StartRetries, host_refusal
from gpuyard.runtimes.base import ContainerSpec, ContainerState, Runtime
from gpuyard.runtimes.volumes.moves import copy_volume_between
from gpuyard.services.capacity.placement import release_all, release_compute
from gpuyard.services.clusters.config import ports_of
from gpuyard.services.clusters.lifecycle import guarded_update, record_event
from gpuyard.services.clusters.moves import (
    DONE,
    IN_FLIGHT,
    copies_to_delete,
    fail_move,
    finish_copy,
    old_copy_deleted,
    pending_move,
    record_progress,
)
from gpuyard.services.context import Context
from gpuyard.services.tenancy.registry_auths import is_private_image, pull_credentials
from gpuyard.store.schema import (
    Cluster,
    StartupSample,
    VolumeMove,
)

log = logging.getLogger(__name__)

# Lines of a dead container's output kept in error_message and events.
ERROR_LOG_LINES = 50


def _parse_times(values: list[Any]) -> list[datetime]:
    out = []
    for v in values:
        try:
            t = datetime.fromisoformat(str(v))
        except ValueError:
            continue
        out.append(t if t.tzinfo else t.replace(tzinfo=UTC))
    return out


RuntimeOf = Callable[[int | None], Runtime]


class ClusterDriver:
    """Carries out each cluster's steps on the engine of the cluster's host
    (``runtime_of(host_id)``: a fleet's lookup, or one runtime for every host)."""

    def __init__(
        self,
        ctx: Context,
        runtime_of: RuntimeOf | Runtime,
        *,
        storage: RestoreStorage | None = None,
        on_restart_due: Callable[[str, datetime], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        """``storage``: restores snapshots into volumes (None: no repository).
        ``on_restart_due``: told when a cluster's next restart attempt is due (the
        reconciler looks then)."""
        self.ctx = ctx
        if callable(runtime_of):
            self.runtime_of: RuntimeOf = runtime_of
        else:
            single = runtime_of
            self.runtime_of = lambda _host_id: single
        self.records = ClusterRecords(ctx)
        self.specs = ContainerSpecs(ctx, self.runtime_of)
        self.restores = VolumeRestores(ctx, self.records, self.runtime_of, storage)
        self.sleep = sleep
        s = ctx.settings
        self.restart_policy = RestartPolicy(
            initial_s=s.restart_backoff_initial_s,
            max_s=s.restart_backoff_max_s,
            limit=s.restart_limit,
            window_s=s.restart_window_s,
        )
        self.on_restart_due = on_restart_due or (lambda _cid, _at: None)
        # Starts whose engine steps failed, and when each may try again.
        self.start_retries = StartRetries(ctx.clock.now)

    def volume_of(self, c: Cluster) -> str:
        """The cluster's engine volume (records.volume_of)."""
        return volume_of(self.ctx, c)

    def _fail(
        self,
        cluster: Cluster,
        message: str,
        *,
        container: bool = True,
        summary: str | None = None,
    ) -> None:
        """To ``error``. The container is stopped but kept, so its logs can be read
        until the cluster is started again or terminated; its GPUs are released only
        once the engine has confirmed it is stopped. ``container`` False: this attempt
        made none (the create itself failed), so there is nothing to stop."""
        # ``message`` may hold the container's last output or the engine's words about
        # the user's image and command (secrets, possibly): it goes to the cluster's
        # error_message and events only. The server log gets ``summary``, which names
        # the kind of failure and the exit code, never what the container printed.
        log.warning("cluster %s failed: %s", cluster.id, summary or "see its error_message")
        try:
            if container:
                self.runtime_of(cluster.host_id).halt(
                    cluster.id, timeout_s=self.ctx.settings.stop_timeout_s
                )
        except GpuyardError as exc:
            # It may still run on its GPUs: keep them, retry on the next pass.
            log.warning("cannot stop failed cluster %s, will retry: %s", cluster.id, exc.message)
            raise Abandon() from exc
        self.records.transition(
            cluster,
            ClusterStatus.ERROR,
            f"error: {message}",
            also=release_compute,
            error_message=message,
        )

    # -- entry point -----------------------------------------------------------
    def drive(self, cluster_id: str) -> None:
        """Advance one cluster as far as it goes now. Never raises for a cluster-level
        failure: those end in status ``error`` with a message."""
        cluster = self.records.load(cluster_id)
        if cluster is None:
            return
        status = ClusterStatus(cluster.status)
        try:
            if status in (ClusterStatus.PENDING, ClusterStatus.STARTING):
                self._start(cluster)
                return
            self.start_retries.forget(cluster_id)  # stopped or terminated meanwhile
            if status == ClusterStatus.STOPPING:
                self._stop(cluster)
            elif status == ClusterStatus.TERMINATING:
                self._terminate(cluster)
        except Abandon:
            log.debug(
                "cluster %s changed during %s; leaving it to the next pass", cluster_id, status
            )

    # -- phases --------------------------------------------------------------
    def _start(self, c: Cluster) -> None:
        if c.status == ClusterStatus.PENDING:
            self.records.transition(c, ClusterStatus.STARTING, "starting")
        if not self.start_retries.due(c.id):
            return  # an engine step failed a moment ago: a later pass tries again
        checks = read_start_checks(self.ctx, c)
        if checks.gpus_held:
            # A preempted cluster is still stopping on our GPUs: start once it has
            # stopped (its job wakes the reconciler), so no GPU is ever shared.
            return
        if checks.snapshot_reading:
            # A move or a restore would remove the volume under the snapshot's reader,
            # and a "stopped" snapshot must not see a running container; the
            # snapshot's end wakes the reconciler.
            return
        # (A move or a restore comes first and takes a while: the create asks then.)
        quick = checks.move is None and checks.restore is None
        early = self._ask_ports_early(c) if quick else None
        try:
            self._start_checked(c, checks, early)
        finally:
            if early is not None:
                early.settle()

    def _ask_ports_early(self, c: Cluster) -> EarlyPortsAsk | None:
        """The host's taken ports, asked from now when the create would ask them side
        by side (every port gpuyard's choice; reconciler/clusters/early_ports.py)."""
        if not c.ports or any(p.external_port for p in ports_of(c)):
            return None
        host_id, cluster_id = c.host_id, c.id
        return EarlyPortsAsk(lambda: self._ports_taken(host_id, cluster_id))

    def _start_checked(self, c: Cluster, checks: StartChecks, early: EarlyPortsAsk | None) -> None:
        move = checks.move
        if move is not None and not self._move_volume(c, move, starting=True):
            return
        # After a move its restore is read again (the move's own steps came between).
        if move is None:
            restored = self.restores.finish_restore(c, checks.restore)
        else:
            restored = self.restores.finish_pending_restore(c)
        if not restored:
            return
        engine_steps = False
        try:
            # Progress is recorded at the points that take time, not at every step:
            # each record is a write transaction on the start path.
            self._ensure_image(c)
            crash_point("start.after_image")
            engine_steps = True
            met: set[tuple[int, str]] = set()  # ports the engine found taken, this pass
            asked = False  # whether the host was just asked (no need to ask again)
            for moves_left in range(MOVES_PER_START, -1, -1):
                try:
                    self._create_and_start(c, check_ports=not asked, early=early)
                    break
                except RuntimeFailure as exc:
                    taken = port_in_use(exc.message)
                    if taken is None or not moves_left:
                        raise
                    # Something bound the port since the host was asked: ask again.
                    met.add(taken)
                    if not self._move_off_taken_ports(c, also=frozenset(met)):
                        raise
                    asked = True
            self._await_running(c)
            self.start_retries.forget(c.id)
            crash_point("start.after_running")
            if move is not None and c.status == ClusterStatus.RUNNING.value:
                # The volume moved here for this start: its old copy goes now.
                self.delete_old_copies(None, cluster_id=c.id)
        except GpuyardError as exc:
            if engine_steps and isinstance(exc, RuntimeFailure) and self._try_again(c, exc):
                return
            # A restart's previous container may still run even if no new one was made
            # (a new one's id is recorded as soon as it is made).
            had = bool((c.runtime_handle or {}).get("container_id"))
            self._fail(c, exc.message, container=had, summary=f"start failed ({exc.code})")

    def _create_and_start(
        self, c: Cluster, *, check_ports: bool, early: EarlyPortsAsk | None = None
    ) -> None:
        """Create the cluster's container from its current spec and start it
        (``check_ports``: ask the host which ports are taken, see :meth:`_create`;
        ``early``: that question, asked as the start began)."""
        spec = self.specs.build(c)
        # Container creation always repeats: it replaces any container left over
        # from an interrupted attempt or the previous run (restart).
        if (c.runtime_handle or {}).get("container_id"):
            keep_logs(self.ctx, self.runtime_of(c.host_id), c.id)
        container_id = self._create(c, spec, check_ports=check_ports, early=early)
        crash_point("start.after_container_create")
        # The container's id is recorded while the engine starts it: the write needs
        # nothing of the start, and the start nothing of the write. Either way round
        # a crash leaves a cluster still ``starting``, which the next pass starts
        # again (its create replaces whatever container the name has).
        recorded = SideBySide(lambda: self._record_created(c, container_id), name="record")
        runtime = self.runtime_of(c.host_id)
        try:
            runtime.start(c.id)
        except BaseException:
            # The record's own failure (Abandon: the cluster moved on) comes first;
            # a failed start is then handled with the container's id recorded.
            recorded.result()
            raise
        try:
            recorded.result()
        except Abandon:
            # The cluster moved on (stopped, terminated) while its container started:
            # that container is this attempt's, and nothing may run for a cluster no
            # longer starting. Whatever the cluster moved to is the next pass's; if it
            # is still to start, that pass makes the container again anyway.
            with contextlib.suppress(GpuyardError):
                runtime.stop(c.id, timeout_s=self.ctx.settings.stop_timeout_s)
            raise
        crash_point("start.after_container_start")

    def _record_created(self, c: Cluster, container_id: str) -> None:
        self.records.record(
            c, startup_step=STEP_CREATED, runtime_handle={"container_id": container_id}
        )
        crash_point("start.after_create_recorded")

    def _create(
        self,
        c: Cluster,
        spec: ContainerSpec,
        *,
        check_ports: bool,
        early: EarlyPortsAsk | None = None,
    ) -> str:
        """Create the container of ``spec``; with ``check_ports``, after asking the host
        which ports of the range something holds and moving the cluster's off them.

        When every port is gpuyard's choice, the host is asked while the container is
        created (a command on the host and an engine listing: neither needs the
        other, and only the start binds the ports), or since the start began
        (``early``, while fresh); a port that then moves means the container is made
        again with the new ones. A port the user chose is asked about first: if it is
        taken the start fails (PortInUse), with no container made for it. Returns
        the container id."""
        runtime = self.runtime_of(c.host_id)
        if not check_ports or not c.ports:
            return runtime.create(spec)
        if any(p.external_port for p in ports_of(c)):
            if self._move_off_taken_ports(c):
                spec = self.specs.build(c)
            return runtime.create(spec)
        host_id, cluster_id = c.host_id, c.id
        asked = (early.take() if early is not None else None) or SideBySide(
            lambda: self._ports_taken(host_id, cluster_id), name="host-ports"
        )
        try:
            container_id = runtime.create(spec)
        except BaseException:
            asked.settle()
            raise
        try:
            moved = self._move_off(c, asked.result())
        except GpuyardError:
            # No free port left in the range: the start fails; the container made
            # for it goes (best effort: the next start replaces it anyway).
            with contextlib.suppress(GpuyardError):
                runtime.stop(c.id, timeout_s=self.ctx.settings.stop_timeout_s)
            raise
        if moved:
            # Made with a port something else holds: made again with the new ones.
            container_id = runtime.create(self.specs.build(c))
        return container_id

    def _ports_taken(self, host_id: int | None, cluster_id: str) -> frozenset[tuple[int, str]]:
        """The ports of the range something on the host holds (Runtime.host_ports_in_use)."""
        settings = self.ctx.settings
        return self.runtime_of(host_id).host_ports_in_use(
            settings.port_range_start, settings.port_range_end, cluster_id
        )

    def _move_off_taken_ports(
        self, c: Cluster, also: frozenset[tuple[int, str]] = frozenset()
    ) -> bool:
        """Ask the host which ports of the range something holds (plus ``also``, those
        the engine found taken) and move the cluster's off them
        (reconciler/clusters/port_moves.py). Returns whether any moved; PortInUse for a port
        the user chose."""
        if not c.ports:
            return False
        return self._move_off(c, self._ports_taken(c.host_id, c.id) | also)

    def _move_off(self, c: Cluster, busy: frozenset[tuple[int, str]]) -> bool:
        """Move the cluster's ports off ``busy`` (see :meth:`_move_off_taken_ports`)."""
        if not c.ports:
            return False
        try:
            moved = move_off(self.ctx, c, busy, self.ctx.clock.now())
        except Conflict as exc:
            raise Abandon() from exc
        if moved:
            log.info("cluster %s: host ports moved off ports in use on the host", c.id)
        return moved

    def _try_again(self, c: Cluster, exc: RuntimeFailure) -> bool:
        """Whether the start gets another attempt after this engine failure
        (reconciler/clusters/start_retries.py); if so, the cluster's events say so (with the
        engine's words: the user's to read, never the server log's)."""
        if host_refusal(exc):
            return False  # the host's own limits: the same create fails the same way
        attempt = self.start_retries.failed(c.id)
        if attempt is None:
            return False
        log.warning(
            "cluster %s: start attempt %d failed (%s); trying again", c.id, attempt, exc.code
        )
        now = self.ctx.clock.now()
        with self.ctx.transaction() as session:
            record_event(
                session,
                c.id,
                now,
                "start_retry",
                f"start attempt {attempt} of {self.start_retries.attempts} failed: "
                f"{exc.message}; trying again",
            )
        self.ctx.notifier.notify()
        return True

    # -- moving between hosts ----------------------------------------------------------

    def _move_volume(self, c: Cluster, move: VolumeMove, *, starting: bool) -> bool:
        """Copy the cluster's volume from its old host to its new one (services/clusters/moves.py)
        and record it. On failure the cluster goes back to its old host, where its data
        still is: a start ends in ``error`` saying why, a resting cluster stays as it
        was. Returns whether the data is on the new host."""
        target_volume = self.ctx.ownership.volume(c.id)
        began = time.monotonic()
        last = [began]

        def progress(copied: int) -> None:
            # At most one write a second: the copy is the slow part, not the store.
            if time.monotonic() - last[0] >= 1.0:
                last[0] = time.monotonic()
                record_progress(self.ctx, c.id, copied)

        try:
            copied = copy_volume_between(
                self.runtime_of(move.from_host_id),
                move.source_volume,
                self.runtime_of(move.to_host_id),
                target_volume,
                c.id,
                progress,
            )
        except GpuyardError as exc:
            self._move_failed(c, move, exc, starting=starting)
            return False
        crash_point("start.move.after_copy")
        seconds = time.monotonic() - began
        now = self.ctx.clock.now()
        try:
            with self.ctx.transaction() as session:
                # From now on the cluster's volume is the installation's name for it.
                c.version = guarded_update(session, c.id, c.version, now, volume_name=None)
                finish_copy(session, c.id, copied, seconds, now)
        except Conflict as exc:
            raise Abandon() from exc
        c.volume_name = None
        self.ctx.notifier.notify()
        crash_point("start.move.after_recorded" if starting else "drain.after_resting_move")
        return True

    def _move_failed(
        self, c: Cluster, move: VolumeMove, exc: GpuyardError, *, starting: bool
    ) -> None:
        message = (
            f"moving the volume from host #{move.from_host_id} to host #{move.to_host_id} "
            f"failed: {exc.message}; the data is still on host #{move.from_host_id}"
        )
        log.warning("cluster %s: volume move failed (%s)", c.id, exc.code)
        now = self.ctx.clock.now()
        # The partial copy is not needed; the next move empties its target anyway.
        with contextlib.suppress(GpuyardError):
            self.runtime_of(move.to_host_id).remove_volume(self.ctx.ownership.volume(c.id))

        def back(session: Session, cluster_id: str) -> None:
            fail_move(session, cluster_id, exc.message, now)
            release_compute(session, cluster_id)

        if starting:
            self.records.transition(
                c,
                ClusterStatus.ERROR,
                f"error: {message}",
                also=back,
                error_message=message,
                host_id=move.from_host_id,
                gpu_indices=[],
            )
            return
        try:
            with self.ctx.transaction() as session:
                back(session, c.id)
                c.version = guarded_update(session, c.id, c.version, now, host_id=move.from_host_id)
                record_event(session, c.id, now, "moved", message)
        except Conflict as exc2:
            raise Abandon() from exc2

    def move_resting(self, cluster_id: str) -> None:
        """Carry out the volume move of a stopped cluster (a drain), then delete the old
        copy: nothing runs on either copy."""
        c = self.records.load(cluster_id)
        move = pending_move(self.ctx, cluster_id)
        if c is None or move is None:
            return
        if c.status not in (ClusterStatus.STOPPED.value, ClusterStatus.ERROR.value):
            return  # started meanwhile: the start carries out the move
        try:
            if self._move_volume(c, move, starting=False):
                self.delete_old_copies([move.from_host_id])
        except Abandon:
            pass

    def delete_old_copies(self, host_ids: list[int] | None, cluster_id: str | None = None) -> None:
        """Delete the old copies of moved volumes on ``host_ids`` (None: any) whose
        cluster has settled on its new host; a copy that cannot be deleted now (its
        host does not answer) is tried again on the next pass."""
        found = copies_to_delete(self.ctx, tuple(host_ids) if host_ids else None, cluster_id)
        for move in found:
            target_volume = self.ctx.ownership.volume(move.cluster_id)
            legacy = move.source_volume != target_volume
            source = self.runtime_of(move.from_host_id)
            try:
                if source is not self.runtime_of(move.to_host_id) or legacy:
                    # (One engine for both hosts: the "old copy" is the volume itself.)
                    source.remove_volume(move.source_volume, legacy=legacy)
            except GpuyardError as exc:
                log.warning("old copy of %s's volume stays for now: %s", move.cluster_id, exc)
                continue
            old_copy_deleted(self.ctx, move.cluster_id)

    def _await_running(self, c: Cluster) -> None:
        deadline = time.monotonic() + self.ctx.settings.readiness_timeout_s
        delay = 0.02
        while True:
            seen = self.runtime_of(c.host_id).observe(c.id)
            if seen.state == ContainerState.RUNNING:
                break
            if seen.state == ContainerState.MISSING:
                # Removed under us, not exited: the container this step made was replaced
                # (another replica took the host's lease while this one waited on a
                # slow engine and re-made it) or removed by hand. Neither is the
                # image's failure; the next pass, by whoever holds the host, starts
                # the cluster again from its row.
                log.warning("cluster %s: container vanished while starting", c.id)
                raise Abandon()
            if seen.state == ContainerState.EXITED:
                tail = self.runtime_of(c.host_id).logs(c.id, tail=5).strip()
                detail = f"; last output: {tail[-300:]}" if tail else ""
                exited = f"container exited with code {seen.exit_code} during startup"
                self._fail(c, f"{exited}{detail}", summary=exited)
                return
            if time.monotonic() > deadline:
                late = "container did not reach running before the readiness timeout"
                self._fail(c, late, summary=late)
                return
            self.sleep(delay)
            delay = min(delay * 2, 0.5)
        now = self.ctx.clock.now()
        started = c.start_initiated_at

        def record_sample(session: Session, _cluster_id: str) -> None:
            if started is not None:
                seconds = max(0.0, (now - started).total_seconds())
                session.add(StartupSample(seconds=seconds, created_at=now))

        # Where containers of its network reach it (RunPod's internal port address).
        handle = {**(c.runtime_handle or {}), "address": seen.address}
        self.records.transition(
            c,
            ClusterStatus.RUNNING,
            "running",
            also=record_sample,
            startup_step=STEP_READY,
            started_at=now,
            runtime_handle=handle,
        )

    def _stop(self, c: Cluster) -> None:
        try:
            stop_keeping_logs(
                self.ctx, self.runtime_of(c.host_id), c.id, self.ctx.settings.stop_timeout_s
            )
        except GpuyardError as exc:
            # The container may still run on its GPUs: they are not released until the
            # engine confirms, so the stop is retried on the next pass.
            log.warning("stop of %s failed, will retry: %s", c.id, exc.message)
            raise Abandon() from exc
        crash_point("stop.after_container_stop")
        self.records.transition(
            c,
            ClusterStatus.STOPPED,
            # Keep why it stopped ("stop requested", "preempted by ...") visible.
            f"stopped ({c.status_reason})",
            also=release_compute,
            stopped_at=self.ctx.clock.now(),
            runtime_handle={},
        )
        if c.pending_start is not None:
            # A start was requested while it stopped: the next pass makes it.
            self.ctx.wake()

    def _terminate(self, c: Cluster) -> None:
        try:
            self.runtime_of(c.host_id).stop(c.id, timeout_s=self.ctx.settings.stop_timeout_s)
            crash_point("terminate.after_container_stop")
            if c.network_volume_id is None:  # a network volume outlives its clusters
                self.runtime_of(c.host_id).remove_volume(
                    self.volume_of(c), legacy=c.volume_name is not None
                )
            # A volume on its way here still has its old copy on the old host.
            self._remove_moving_copy(c)
        except GpuyardError as exc:
            # Terminate must not leave a running container billed to nobody: retry.
            log.warning("terminate of %s failed, will retry: %s", c.id, exc.message)
            raise Abandon() from exc
        crash_point("terminate.after_volume_remove")
        forget_logs(self.ctx, c.id)
        self.records.transition(
            c,
            ClusterStatus.TERMINATED,
            "terminated",
            also=release_all,
            terminated_at=self.ctx.clock.now(),
            runtime_handle={},
        )

    def _remove_moving_copy(self, c: Cluster) -> None:
        with self.ctx.read() as session:
            move = session.get(VolumeMove, c.id)
            if move is None or move.status not in IN_FLIGHT:
                return
            session.expunge(move)
        legacy = move.source_volume != self.ctx.ownership.volume(c.id)
        self.runtime_of(move.from_host_id).remove_volume(move.source_volume, legacy=legacy)
        now = self.ctx.clock.now()
        with self.ctx.transaction() as session:
            row = session.get(VolumeMove, c.id)
            if row is not None:
                row.status, row.finished_at = DONE, now

    # -- desired state wins -------------------------------------------------------

    def recover(self, cluster_id: str) -> None:
        """A cluster that should run whose container is gone or exited is brought back:
        recreated with the same GPUs, ports, env and volume after an exponential
        back-off, counting restarts; after the policy's limit of failures within its
        window it goes to ``error`` (exit code and last log lines kept). Its GPUs stay
        claimed throughout: the status stays ``running``."""
        c = self.records.load(cluster_id)
        if c is None or c.status != ClusterStatus.RUNNING:
            return
        seen = self.runtime_of(c.host_id).observe(cluster_id)
        if seen.state == ContainerState.RUNNING:
            return
        now = self.ctx.clock.now()
        try:
            if c.next_restart_at is None:
                self._count_failure(c, seen.state, seen.exit_code, seen.error, now)
            elif now >= c.next_restart_at:
                self._restart(c, now)
            else:
                self.on_restart_due(c.id, c.next_restart_at)
        except Abandon:
            pass

    def _count_failure(
        self,
        c: Cluster,
        state: ContainerState,
        exit_code: int | None,
        error: str | None,
        now: datetime,
    ) -> None:
        what = (
            "container disappeared"
            if state == ContainerState.MISSING
            else f"container exited with code {exit_code}"
        )
        if error:
            what += f" ({error})"
        verdict = judge_failure(self.restart_policy, _parse_times(c.recent_failures), now)
        if verdict.give_up:
            tail = self._log_tail(c, state)
            message = (
                f"{what}; gave up after {len(verdict.failures)} failures within "
                f"{self.restart_policy.window_s:g} s"
            )
            kind = (
                "container disappeared" if state == ContainerState.MISSING else "container exited"
            )
            summary = f"{kind} (code {exit_code}); gave up after {len(verdict.failures)} failures"
            self._fail(c, f"{message}{tail}", summary=summary)
            return
        delay = (verdict.retry_at - now).total_seconds()
        self.records.record(
            c,
            restart_event=f"{what}; restarting in {delay:g} s",
            recent_failures=[t.isoformat() for t in verdict.failures],
            last_exit_code=exit_code,
            next_restart_at=verdict.retry_at,
        )
        self.on_restart_due(c.id, verdict.retry_at)

    def _log_tail(self, c: Cluster, state: ContainerState) -> str:
        if state == ContainerState.MISSING:
            return ""
        try:
            tail = self.runtime_of(c.host_id).logs(c.id, tail=ERROR_LOG_LINES).rstrip()
        except GpuyardError:
            return ""
        return f"; last output:\n{tail}" if tail else ""

    def _ensure_image(self, c: Cluster) -> None:
        """Pull the cluster's image if needed, once its registry is allowed: a cluster
        stored before the allow-list (or before the operator narrowed it) must not make
        the engine connect where the API would now refuse. Raises ValidationFailed
        naming the registry, RuntimeFailure from the pull, SecretUnreadable (the
        credentials' password cannot be opened)."""
        check_image(c.image, self.ctx.settings.registry_policy, "docker_image")
        began: list[float] = []

        def pulling() -> None:
            began.append(time.monotonic())
            self.records.event(c.id, "pull", f"pulling image {c.image}")

        # Opened here, outside any transaction, and handed to the engine only.
        credentials = pull_credentials(self.ctx, c.project_id, c.registry_auth_id)
        # A private image (one any cluster pulls with credentials) is asked of its
        # registry at every start, with this cluster's credentials or none: being on
        # the host from another account's pull gives it to nobody.
        fresh = credentials is not None or is_private_image(self.ctx, c.image)
        self.runtime_of(c.host_id).ensure_image(
            c.image, on_pull=pulling, credentials=credentials, fresh=fresh
        )
        if began:
            self.records.event(
                c.id, "pull", f"pulled image {c.image} in {time.monotonic() - began[0]:.1f} s"
            )

    def _restart(self, c: Cluster, now: datetime) -> None:
        number = c.restarts + 1
        try:
            self._ensure_image(c)
            keep_logs(self.ctx, self.runtime_of(c.host_id), c.id)
            # A port gpuyard chose may have been taken while the container was down.
            container_id = self._create(c, self.specs.build(c), check_ports=True)
            self.runtime_of(c.host_id).start(c.id)
            # A new container: a new address on its network.
            address = self.runtime_of(c.host_id).observe(c.id).address
        except GpuyardError as exc:
            # Counted as one more failure on the next look. The engine's words stay with
            # the cluster (its events), out of the server log.
            self.records.record(
                c, next_restart_at=None, restart_event=f"restart {number} failed: {exc.message}"
            )
            log.warning("restart %d of cluster %s failed (%s)", number, c.id, exc.code)
            return
        self.records.record(
            c,
            restart_event=f"restarted (restart {number}; last exit code {c.last_exit_code})",
            restarts=number,
            last_restart_at=now,
            next_restart_at=None,
            runtime_handle={"container_id": container_id, "address": address},
        )
