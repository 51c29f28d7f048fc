"""scripts/run-tests.sh runs every group scripts/suite_groups.py deals, fails a group in
which no test ran (all skipped, or none collected), naming it, and ends with the ten
slowest tests of all groups; scripts/group_ran.py, which decides that, on JUnit reports.
The script runs for real, with a stand-in for pytest that writes the report it is told."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_TESTS = ROOT / "scripts" / "run-tests.sh"
GROUP_RAN = ROOT / "scripts" / "group_ran.py"

RAN = (
    '<testcase classname="t" name="a" time="1.5"/>'
    '<testcase classname="t" name="b" time="0.1"><skipped/></testcase>'
)
ALL_SKIPPED = '<testcase classname="t" name="a"><skipped message="missing system part"/></testcase>'

# A stand-in for pytest: the group is its --basetemp's name; FAKE_<group> says what its
# report holds ("ran", "skipped", or "none": nothing collected, pytest's exit 5).
FAKE_PYTEST = f"""#!/usr/bin/env bash
for a in "$@"; do
  case "$a" in
    --basetemp=*) group="$(basename "${{a#--basetemp=}}")" ;;
    --junitxml=*) report="${{a#--junitxml=}}" ;;
  esac
done
var="FAKE_$group"
rc=0
case "${{!var:-ran}}" in
  ran) cases='{RAN}' ;;
  skipped) cases='{ALL_SKIPPED}' ;;
  none) cases='' rc=5 ;;
esac
printf '<?xml version="1.0"?><testsuites><testsuite name="pytest">%s</testsuite></testsuites>' \\
  "$cases" >"$report"
echo "$group: ${{!var:-ran}}"
# The test files it was given, one a line after the group's name, in a file of the
# group's own: groups run at once, and appends from several would interleave mid-line.
if [ -n "${{FAKE_FILES_LOG:-}}" ]; then
  printf '%s\\n' "$@" | grep '^tests/' | sed "s/^/$group /" >"$FAKE_FILES_LOG.$group"
fi
exit "$rc"
"""


def report(tmp_path: Path, cases: str) -> Path:
    path = tmp_path / "report.xml"
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite>{cases}</testsuite></testsuites>')
    return path


def group_ran(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GROUP_RAN), *args], capture_output=True, text=True, timeout=60
    )


def test_a_group_with_a_test_run_passes(tmp_path: Path) -> None:
    proc = group_ran("fast", str(report(tmp_path, RAN)))
    assert proc.returncode == 0 and proc.stdout.strip() == "fast: 1 ran, 1 skipped"


@pytest.mark.parametrize("cases", [ALL_SKIPPED, ""], ids=["all-skipped", "none-collected"])
def test_a_group_where_no_test_ran_fails_naming_it(tmp_path: Path, cases: str) -> None:
    proc = group_ran("e2e", str(report(tmp_path, cases)))
    assert proc.returncode == 1
    assert proc.stdout.startswith("e2e: FAILED, no test ran"), proc.stdout


def test_a_group_without_a_report_fails(tmp_path: Path) -> None:
    proc = group_ran("e2e", str(tmp_path / "never-written.xml"))
    assert proc.returncode == 1 and proc.stdout.startswith("e2e: FAILED, no test report")


def run_tests(
    tmp_path: Path,
    groups: str = "fast=1 e2e=1",
    env_extra: dict[str, str] | None = None,
    **fake: str,
) -> subprocess.CompletedProcess[str]:
    pytest_path = tmp_path / "pytest"
    pytest_path.write_text(FAKE_PYTEST)
    pytest_path.chmod(0o755)
    env = {
        **os.environ, "PYTEST": str(pytest_path), "PYTHON": sys.executable,
        "SUITE_GROUPS": groups, **(env_extra or {}),
    }  # fmt: skip
    env.update({f"FAKE_{group}": mode for group, mode in fake.items()})
    proc = subprocess.run(
        ["bash", str(RUN_TESTS)],
        env={**env, "PROGRESS_EVERY_S": "0.05"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # A failed run keeps its work directory for a look: this one is ours to remove.
    kept = re.search(r"kept for a look: (/tmp/gyt-\w+)", proc.stdout)
    if kept:
        shutil.rmtree(kept.group(1), ignore_errors=True)
    return proc


def test_run_tests_passes_when_both_groups_ran_tests(tmp_path: Path) -> None:
    proc = run_tests(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fast: 1 ran, 1 skipped" in proc.stdout and "e2e: 1 ran, 1 skipped" in proc.stdout


@pytest.mark.parametrize(
    ("fake", "line"),
    [
        ({"e2e": "skipped"}, "e2e: FAILED, no test ran (1 skipped)"),
        ({"fast": "none"}, "fast: FAILED, pytest collected no test (exit 5)"),
    ],
    ids=["e2e-all-skipped", "fast-none-collected"],
)
def test_run_tests_fails_a_group_that_ran_no_test(
    tmp_path: Path, fake: dict[str, str], line: str
) -> None:
    proc = run_tests(tmp_path, **fake)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert line in proc.stdout, proc.stdout


def test_every_test_file_runs_in_exactly_one_group_and_the_slowest_come_last(
    tmp_path: Path,
) -> None:
    given = tmp_path / "files.log"
    proc = run_tests(tmp_path, "fast=2 e2e=3", {"FAKE_FILES_LOG": str(given)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = ["fast1", "fast2", "e2e1", "e2e2", "e2e3"]
    for name in names:
        assert f"{name}: 1 ran, 1 skipped" in proc.stdout, proc.stdout
    lines = [
        line.split(" ", 1)
        for name in names
        for line in given.with_name(f"{given.name}.{name}").read_text().splitlines()
    ]
    files = [f for _, f in lines]
    assert {g for g, _ in lines} == set(names)
    assert len(files) == len(set(files))  # none twice
    on_disk = {
        p.relative_to(ROOT).as_posix()
        for folder in ("unit", "service", "api", "e2e", "contract", "console")
        for p in (ROOT / "tests" / folder).rglob("test_*.py")
    }
    assert set(files) == on_disk  # none left out
    # The slowest of all groups together, after every group's summary.
    tail = proc.stdout[proc.stdout.rindex("=== e2e3: exit 0 ===") :]
    assert "=== the 10 slowest tests of 10 (all groups) ===" in tail
    assert tail.count("1.50s  t.py::a") == 5
