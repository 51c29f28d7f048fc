"""The rule for missing system parts (tests/required_parts.py): a skip that names the
part here, a failure that names it and how to get it under ``CI=true`` or
``GPUYARD_REQUIRE_REAL=1``. Checked on a small test file run by a separate pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.required_parts import describe, first_problem, on_path, required

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """
from tests.required_parts import need, needs


@needs("frobnicator", "frobnicator is not installed", how="apt-get install frobnicator")
def test_marked():
    raise AssertionError("a test whose part is missing must not run")


def test_called():
    need("widget", "no widget here", how="make widget")
    raise AssertionError("a test whose part is missing must not go on")


@needs("present", None, how="nothing to do")
def test_present():
    need("also present", None, how="nothing to do")
"""


def run_sample(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The sample's pytest run, with only ``env`` deciding strictness (not this run's)."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "GPUYARD_REQUIRE_REAL")}
    plugins = ["-p", "no:cacheprovider", "-p", "tests.required_parts"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", *plugins, "test_sample.py"],
        cwd=tmp_path,
        # Without the installed plugins (hypothesis, schemathesis...): a quicker start.
        env={**base, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_part_skips_here_and_names_itself(tmp_path: Path) -> None:
    proc = run_sample(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 2 skipped" in proc.stdout, proc.stdout
    # Each reported at the test's own line, not the helper's.
    assert "test_sample.py:5: missing system part frobnicator: frobnicator is not" in proc.stdout
    assert "test_sample.py:11: missing system part widget: no widget here (to get it: make" in (
        proc.stdout
    )


@pytest.mark.parametrize("env", [{"GPUYARD_REQUIRE_REAL": "1"}, {"CI": "true"}])
def test_a_missing_part_fails_under_ci_naming_it_and_how_to_get_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    proc = run_sample(tmp_path, **env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "skipped" not in proc.stdout, proc.stdout
    # The mark fails the test's set-up; need() in its body fails the test itself.
    assert "1 failed, 1 passed, 1 error" in proc.stdout, proc.stdout
    assert "missing system part frobnicator" in proc.stdout
    assert "apt-get install frobnicator" in proc.stdout
    assert "missing system part widget: no widget here (to get it: make widget)" in proc.stdout
    assert "must not" not in proc.stdout  # neither test body went on


def test_strictness_comes_from_ci_or_gpuyard_require_real() -> None:
    assert not required({})
    assert not required({"CI": "false"})
    assert required({"CI": "true"}) and required({"CI": "TRUE"})
    assert required({"GPUYARD_REQUIRE_REAL": "1"})
    # An explicit choice wins over CI's.
    assert not required({"CI": "true", "GPUYARD_REQUIRE_REAL": "0"})
    assert required({"CI": "false", "GPUYARD_REQUIRE_REAL": "1"})


def test_problems_name_what_is_missing() -> None:
    assert on_path("sh") is None
    assert on_path("sh", "gy-no-such-tool") == "gy-no-such-tool is not installed"
    assert first_problem(None, "b", "c") == "b" and first_problem(None, None) is None
    assert describe("restic", "restic is not installed", "apt-get install restic") == (
        "missing system part restic: restic is not installed (to get it: apt-get install restic)"
    )
