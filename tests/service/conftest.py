"""Service-test fixtures: the fake runtime and a reconciler over the ``ctx`` store."""

from __future__ import annotations

import pytest

from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.context import Context
from gpuyard.testing.fake_runtime import FakeRuntime


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def rec(ctx: Context, runtime: FakeRuntime) -> Reconciler:
    return build_reconciler(ctx, runtime)
