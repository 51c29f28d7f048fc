"""The host's taken ports asked as a start begins (reconciler/clusters/early_ports.py):
the create takes the running ask once, while fresh; later, or a second time, it asks
again."""

from __future__ import annotations

import threading

from gpuyard.reconciler.clusters.early_ports import EarlyPortsAsk


def test_the_create_takes_the_running_ask_once() -> None:
    release = threading.Event()

    def ask() -> frozenset[tuple[int, str]]:
        release.wait(5)
        return frozenset({(30001, "tcp")})

    early = EarlyPortsAsk(ask, clock=lambda: 0.0, fresh_s=1.0)
    taken = early.take()
    assert taken is not None
    assert early.take() is None  # once only: a second create asks anew
    release.set()
    assert taken.result() == frozenset({(30001, "tcp")})
    early.settle()


def test_a_stale_answer_is_not_taken() -> None:
    now = [0.0]
    early = EarlyPortsAsk(lambda: frozenset(), clock=lambda: now[0], fresh_s=1.0)
    now[0] = 1.0  # a move or a restore came between
    assert early.take() is None
    early.settle()
