"""The in-process gate between backups/restores and forget/prune of a repository."""

from __future__ import annotations

import threading

from gpuyard.storage.repository_gate import RepositoryGate


def test_a_forget_does_not_go_while_a_backup_uses_the_repository() -> None:
    gate = RepositoryGate()
    with gate.shared("local:/a"):
        with gate.exclusive("local:/a") as alone:
            assert alone is False
        with gate.exclusive("local:/b") as alone:  # another repository is free
            assert alone is True
    with gate.exclusive("local:/a") as alone:
        assert alone is True


def test_a_backup_waits_for_a_forget_to_end() -> None:
    gate = RepositoryGate()
    order: list[str] = []
    entered = threading.Event()

    def backup() -> None:
        entered.set()
        with gate.shared("local:/a"):
            order.append("backup")

    with gate.exclusive("local:/a") as alone:
        assert alone
        worker = threading.Thread(target=backup)
        worker.start()
        entered.wait(5)
        worker.join(0.2)
        assert worker.is_alive()  # held back while the forget runs
        order.append("forget")
    worker.join(5)
    assert order == ["forget", "backup"]


def test_backups_share_and_the_last_one_out_frees_it() -> None:
    gate = RepositoryGate()
    with gate.shared("local:/a"), gate.shared("local:/a"), gate.exclusive("local:/a") as alone:
        assert not alone
    with gate.exclusive("local:/a") as alone:
        assert alone


def test_a_refused_forget_holds_nothing() -> None:
    gate = RepositoryGate()
    with gate.shared("local:/a"), gate.exclusive("local:/a") as alone:
        assert not alone
    # Had the refused forget held the repository, this would wait forever.
    done = threading.Event()

    def backup() -> None:
        with gate.shared("local:/a"):
            done.set()

    threading.Thread(target=backup, daemon=True).start()
    assert done.wait(5)
