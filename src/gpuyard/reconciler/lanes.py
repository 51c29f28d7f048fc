"""The reconciler's lanes on its one work queue, and how work reaches them.

Each engine has its own lanes (made on first use), so a slow or dead host holds up
only its own work. Slow work (starts, restarts) and urgent work (stops, terminates,
collection) run in separate lanes; heartbeats, storage work and webhook deliveries
have lanes of their own (reconciler/workqueue.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuyard.core.errors import GpuyardError
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.runtimes.fleet import SHARED_ENGINE
from gpuyard.services.signals import WorkSignal

log = logging.getLogger(__name__)

URGENT = "urgent"
SLOW = "slow"
# Heartbeats: a lane of their own per engine, so a host's long engine operations (an
# observation waiting out its timeout on a hung engine) never delay its next heartbeat.
HEARTBEAT = "heartbeat"
# Snapshots and network volume restores: long reads and writes of whole volumes, on
# lanes of their own so they never hold up a start or a stop.
STORAGE = "storage"
STORAGE_WORKERS = 4
# Webhook deliveries: outbound POSTs that may take their timeout, off the other lanes.
WEBHOOKS = "webhooks"
WEBHOOK_WORKERS = 4


# A finished job wakes the loop this much later (see Wakeup.wake_soon).
JOB_DONE_WAKE_S = 0.02


class Wakeup:
    """When the loop should look again (``wake``, ``wake_soon``, or its context's use
    cases ringing the shared :class:`WorkSignal`) and whether it is stopping."""

    def __init__(self, signal: WorkSignal | None = None, soon_s: float = JOB_DONE_WAKE_S) -> None:
        self.signal = signal or WorkSignal()
        self.stopping = threading.Event()
        self.soon_s = soon_s
        self._soon = threading.Event()
        self._soon_lock = threading.Lock()
        self._soon_thread: threading.Thread | None = None

    def wake(self) -> None:
        self.signal.wake()

    def wake_soon(self) -> None:
        """Wake the loop ``soon_s`` from now; the wakes asked for meanwhile are that one.

        For the end of each job (the world moved: work a job held up may go now). Not
        at once: the job's last write has just woken whoever waits on it (an API
        answer that a cluster runs), and the pass took the CPU and the interpreter
        from that answer on a small host; a pass of its own per job was also more
        passes than a burst of finished jobs needs. One thread serves every wake."""
        self._soon.set()
        with self._soon_lock:
            if self._soon_thread is None:
                self._soon_thread = threading.Thread(
                    target=self._wake_soon_loop, name="reconciler-wake-soon", daemon=True
                )
                self._soon_thread.start()

    def _wake_soon_loop(self) -> None:
        while True:
            self._soon.wait()
            if self.stopping.wait(self.soon_s):
                return
            # Cleared before the wake: a job ending after this asks for the next one.
            self._soon.clear()
            self.signal.wake()

    def stop(self) -> None:
        self.stopping.set()
        self._soon.set()  # the wake-soon thread ends
        self.signal.wake()

    def wait(self, timeout_s: float) -> float | None:
        """Sleep until woken or ``timeout_s`` passed; when the first wake came (None:
        not woken)."""
        return self.signal.wait(timeout_s)


class Dispatcher:
    """Submits work to the lanes of each engine (``key_of``: the engine key of a host,
    the fleet's). Nothing is submitted once ``wakeup`` is stopping."""

    def __init__(
        self,
        queue: WorkQueue,
        key_of: Callable[[int], str],
        workers: int,
        wakeup: Wakeup,
    ) -> None:
        self.queue = queue
        self._key_of = key_of
        self._workers = workers
        self.wakeup = wakeup

    @classmethod
    def create(
        cls, workers: int, key_of: Callable[[int], str], signal: WorkSignal | None = None
    ) -> Dispatcher:
        """A dispatcher on a new queue (``workers`` threads per engine lane, at least
        two) whose finished jobs wake the loop; ``signal``: what else wakes it (a
        context's use cases; None: only the loop's own)."""
        wakeup = Wakeup(signal)
        workers = max(2, workers)
        queue = WorkQueue(
            {
                URGENT: workers,
                SLOW: workers,
                HEARTBEAT: workers,
                STORAGE: STORAGE_WORKERS,
                WEBHOOKS: WEBHOOK_WORKERS,
            },
            on_done=wakeup.wake_soon,
        )
        return cls(queue, key_of, workers, wakeup)

    @property
    def stopping(self) -> bool:
        return self.wakeup.stopping.is_set()

    def engine_key(self, host_id: int | None) -> str:
        return SHARED_ENGINE if host_id is None else self._key_of(host_id)

    def lane_of(self, lane: str, host_id: int | None) -> str:
        """The queue lane ``lane`` of ``host_id``'s engine (made on first use), for work
        others run on this queue (the training operator)."""
        return self.lane(lane, self.engine_key(host_id))

    def lane(self, lane: str, key: str) -> str:
        """The lane ``lane`` of the engine ``key`` (made on first use)."""
        if key == SHARED_ENGINE:
            return lane
        name = f"{lane}:{key}"
        self.queue.ensure_lane(name, self._workers)
        return name

    def submit(self, key: object, lane: str, job: Callable[[], None]) -> bool:
        """Queue ``job`` under ``key`` on the lane named ``lane`` (WorkQueue.submit)."""
        return self.queue.submit(key, lane, job)

    def submit_cluster(
        self,
        cluster_id: str,
        job: Callable[[str], None],
        lane: str,
        host_id: int | None,
        *,
        job_key: object = None,
    ) -> None:
        """Queue ``job(cluster_id)`` on lane ``lane`` of ``host_id``'s engine; at most one
        job per key (the cluster id unless ``job_key``) runs at a time."""
        if self.stopping:
            return
        self.queue.submit(
            job_key if job_key is not None else cluster_id,
            self.lane(lane, self.engine_key(host_id)),
            lambda: _run_job(cluster_id, job),
        )


def _run_job(cluster_id: str, job: Callable[[str], None]) -> None:
    try:
        job(cluster_id)
    except GpuyardError as exc:
        # Engine trouble: the queue retries this cluster after a back-off.
        log.warning("reconcile job for cluster %s failed: %s", cluster_id, exc.message)
        raise
