"""DockerEngineRuntime's timestamped logs against real Podman (runtimes/engines/logs.py):
tails widened to a whole stamp, heads read without the rest, ``since``, and a follow
that yields new lines and ends at once when closed from another thread.

Each test acts for an installation of its own and removes only what carries its id."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from gpuyard.core.log_lines import LogLine
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import ContainerSpec
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from tests.e2e.conftest import DEV_IMAGE, purge_installation
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

S = 1_000_000_000


@pytest.fixture
def rt(engine_url: str) -> Iterator[DockerEngineRuntime]:
    owner = Ownership.new()
    yield DockerEngineRuntime(engine_url, owner=owner)
    purge_installation(engine_url, owner.installation_id)


def run(rt: DockerEngineRuntime, script: str) -> str:
    cid = "lg" + uuid.uuid4().hex[:12]
    spec = ContainerSpec(
        cluster_id=cid,
        image=DEV_IMAGE,
        command=("sh", "-c", script),
        env={},
        ports=(),
        volume_name=None,
        volume_mount_path="/workspace",
        cpu_cores=0,
        memory_gb=0,
        gpu_indices=(),
    )
    rt.create(spec)
    rt.start(cid)
    return cid


def wait_lines(rt: DockerEngineRuntime, cid: str, count: int) -> list[LogLine]:
    deadline = time.monotonic() + 15
    while True:
        lines = rt.log_lines(cid)
        if len(lines) >= count:
            return lines
        assert time.monotonic() < deadline, lines
        time.sleep(0.1)


def test_tails_heads_and_since(rt: DockerEngineRuntime) -> None:
    # 30 lines within a second or so: many share a stamp.
    cid = run(rt, "i=0; while [ $i -lt 30 ]; do echo line $i; i=$((i+1)); done; sleep 60")
    lines = wait_lines(rt, cid, 30)
    assert [line.text for line in lines] == [f"line {i}" for i in range(30)]
    assert all(a.ts_ns <= b.ts_ns for a, b in itertools.pairwise(lines))
    tail = rt.log_lines(cid, tail=3)
    assert [line.text for line in tail[-3:]] == ["line 27", "line 28", "line 29"]
    # Widened to the first line of its first stamp.
    first = lines.index(tail[0])
    assert first == 0 or lines[first - 1].ts_ns < tail[0].ts_ns
    assert rt.log_lines(cid, head=5) == lines[:5]
    last = lines[-1].ts_ns
    since = rt.log_lines(cid, since_ns=last)
    assert since == [line for line in lines if line.ts_ns >= last]
    assert rt.log_lines(cid, since_ns=last + 10 * S) == []
    assert rt.log_lines("lgnosuchcontainer") == []


def test_follow_yields_new_lines_and_closes_from_another_thread(rt: DockerEngineRuntime) -> None:
    cid = run(rt, "echo start; sleep 1; echo later; sleep 60")
    wait_lines(rt, cid, 1)
    follow = rt.follow_log(cid)
    got: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in follow:
            got.append(line.text)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 10
    while got != ["start", "later"]:
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    # Quiet now (sleep 60): closing ends the read at once.
    began = time.monotonic()
    follow.close()
    assert done.wait(5), "the follow did not end when closed"
    assert time.monotonic() - began < 5
    follow.close()  # idempotent


def test_follow_ends_when_the_container_stops(rt: DockerEngineRuntime) -> None:
    cid = run(rt, "echo one; echo two; sleep 0.5; echo three")
    lines = [line.text for line in rt.follow_log(cid)]
    assert lines == ["one", "two", "three"]
    assert list(rt.follow_log("lgnosuchcontainer")) == []
