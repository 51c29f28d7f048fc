"""Replica ids (services/installation/replica.py): unique per call, readable, fit leases.holder."""

from __future__ import annotations

import os
import socket

from gpuyard.services.installation.replica import replica_id


def test_replica_ids_are_unique_and_name_the_host_and_process() -> None:
    ids = {replica_id() for _ in range(100)}
    assert len(ids) == 100
    host, pid, tail = next(iter(ids)).rsplit(":", 2)
    assert host == socket.gethostname()[:50] and pid == str(os.getpid()) and len(tail) == 32


def test_a_long_hostname_still_fits_the_holder_column() -> None:
    rid = replica_id(hostname="h" * 300, pid=4194304)
    assert len(rid) <= 100 and rid.startswith("h" * 50 + ":4194304:")
