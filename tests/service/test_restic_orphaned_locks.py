"""A lock that restic took through one of our REST backend servers outlives that
server when it is killed with SIGKILL, and ``restic unlock`` keeps it while the restic
that took it lives (in a helper, its PID and host name tell restic nothing). The
server's journal (storage/lock_journal.py) lets ResticRepository remove it: a check
that restic alone would refuse runs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from gpuyard.storage.rest_objects import Mode
from gpuyard.storage.rest_process import RestServer
from gpuyard.storage.restic import ResticRepository
from tests.required_parts import needs_tools

pytestmark = needs_tools("restic", how="apt-get install restic")


def test_a_killed_servers_lock_no_longer_refuses_a_check(tmp_path: Path) -> None:
    repository = ResticRepository(str(tmp_path / "repo"), tmp_path / "pw", tmp_path / "cache")
    access = repository.helper_access()
    assert access is not None
    root, key = access
    server = RestServer(root, Mode.BACKUP, {key.name: key.content})
    server.start()
    server.listen(None)
    backup = subprocess.Popen(
        ["restic", "--repo", server.url(), "--no-cache", "-q", "backup", "--stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", os.defpath), "RESTIC_PASSWORD": key.password},
    )
    try:
        # restic takes its lock before it reads stdin, and waits there for more.
        deadline = time.monotonic() + 60
        while not any((root / "locks").iterdir()):
            assert backup.poll() is None, backup.stderr.read() if backup.stderr else ""
            assert time.monotonic() < deadline, "restic took no lock"
            time.sleep(0.05)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        server.close()
        assert any((root / "locks").iterdir())  # left behind; its restic still runs
        result = repository.check()
        assert result.ok, result.output
        assert not any((root / "locks").iterdir())
    finally:
        backup.send_signal(signal.SIGKILL)
        backup.wait()
        server.close()
