"""scripts/suite_groups.py deals every test file into exactly one group, balanced by
measured seconds; scripts/slowest_tests.py reads JUnit reports back into test ids, the
slowest of all groups and seconds per file (what the dealing is balanced by)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """A script of scripts/ as a module (the folder is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


groups = load("suite_groups")
slowest = load("slowest_tests")


def tree(root: Path, files: list[str]) -> None:
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")


def test_every_file_of_each_kind_is_in_exactly_one_group(tmp_path: Path) -> None:
    files = [f"tests/unit/test_{i}.py" for i in range(7)] + [
        "tests/api/test_a.py",
        "tests/e2e/test_x.py",
        "tests/e2e/sub/test_y.py",
        "tests/console/test_z.py",
        "tests/e2e/helper.py",  # no test module: in no group
    ]
    tree(tmp_path, files)
    plan = groups.plan({"fast": 3, "e2e": 2}, {}, tmp_path)
    dealt = [f for g in plan for f in g.files]
    assert sorted(dealt) == sorted(f for f in files if "/test_" in f)
    assert len(dealt) == len(set(dealt))
    assert [g.name for g in plan] == ["fast1", "fast2", "fast3", "e2e1", "e2e2"]
    assert all(g.files[0].startswith(("tests/unit", "tests/api")) for g in plan[:3])


def test_the_groups_are_balanced_by_measured_seconds_longest_first() -> None:
    measured = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 30.0, "e": 20.0}
    dealt = groups.deal("e2e", sorted(measured), 2, measured)
    assert [(g.name, g.files, g.seconds) for g in dealt] == [
        ("e2e1", ["a", "d"], 130.0),
        ("e2e2", ["b", "c", "e"], 130.0),
    ]
    assert dealt == groups.deal("e2e", sorted(measured, reverse=True), 2, measured)


def test_a_file_not_measured_counts_as_the_median_and_one_group_keeps_the_kind_name() -> None:
    measured = {"a": 10.0, "b": 30.0, "c": 90.0}
    (one,) = groups.deal("fast", ["a", "b", "c", "new"], 1, measured)
    assert one.name == "fast" and one.seconds == 160.0  # new: 30, the median
    assert [g.files for g in groups.deal("fast", ["x", "y"], 5, {})] == [["x"], ["y"]]


@pytest.mark.parametrize("arg", ["e2e", "e2e=0", "e2e=x", "slow=2"])
def test_a_bad_group_count_is_refused_with_a_message(arg: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "suite_groups.py"), arg],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "is not KIND=COUNT" in proc.stderr


def test_the_measured_durations_name_only_test_files_that_exist() -> None:
    measured = json.loads((ROOT / "tests" / "durations.json").read_text())
    missing = [f for f in measured if not (ROOT / f).is_file()]
    assert not missing, f"gone from the suite, drop from tests/durations.json: {missing}"


def report(path: Path, cases: str) -> Path:
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite>{cases}</testsuite></testsuites>')
    return path


def test_slowest_of_all_reports_with_their_test_ids_and_seconds_per_file(tmp_path: Path) -> None:
    tree(tmp_path, ["tests/e2e/test_x.py", "tests/unit/test_u.py"])
    e2e = report(
        tmp_path / "e2e1.xml",
        '<testcase classname="tests.e2e.test_x" name="test_a[p1]" time="7.5"/>'
        '<testcase classname="tests.e2e.test_x.TestK" name="test_b" time="2.5"/>',
    )
    fast = report(
        tmp_path / "fast.xml",
        '<testcase classname="tests.unit.test_u" name="test_c" time="4"/>'
        '<testcase classname="tests.unit.test_u" name="test_d" time="0.25"><skipped/></testcase>',
    )
    cases = slowest.cases(e2e, tmp_path) + slowest.cases(fast, tmp_path)
    assert [(c.test_id, c.group) for c in cases[:2]] == [
        ("tests/e2e/test_x.py::test_a[p1]", "e2e1"),
        ("tests/e2e/test_x.py::TestK::test_b", "e2e1"),
    ]
    assert slowest.per_file(cases, tmp_path) == {
        "tests/e2e/test_x.py": 10.0,
        "tests/unit/test_u.py": 4.2,
    }


def test_slowest_tests_prints_the_top_and_names_an_unreadable_report(tmp_path: Path) -> None:
    good = report(
        tmp_path / "e2e2.xml",
        "".join(
            f'<testcase classname="tests.unit.test_suite_groups" name="t{i}" time="{i}"/>'
            for i in range(12)
        )
        + '<testcase classname="" name="tests/unit/test_gone.py" time="99"><error/></testcase>',
    )
    broken = tmp_path / "fast1.xml"
    broken.write_text("<testsuites>")
    out = tmp_path / "files.json"
    script = ROOT / "scripts" / "slowest_tests.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(good), str(broken), "--files", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "=== the 10 slowest tests of 13 (all groups) ==="
    assert lines[1].split() == ["99.00s", "tests/unit/test_gone.py", "[e2e2]"]
    assert lines[2].split() == ["11.00s", "tests/unit/test_suite_groups.py::t11", "[e2e2]"]
    assert len(lines) == 11 and lines[-1].split()[0] == "3.00s"
    assert "fast1.xml: cannot read it" in proc.stderr
    # Seconds per file: a case of no file (a collection error) weighs nothing.
    assert json.loads(out.read_text()) == {"tests/unit/test_suite_groups.py": 66.0}


def test_files_move_from_the_heaviest_group_to_the_lightest_across_kinds() -> None:
    measured = {"f1": 60.0, "f2": 40.0, "e1": 150.0, "e2": 100.0, "e3": 50.0}
    fast = groups.Group("fast", ["f1", "f2"], 100.0)
    e2e = groups.Group("e2e", ["e1", "e2", "e3"], 300.0)
    evened = groups.even_out([fast, e2e], measured)
    assert [(g.name, g.files, g.seconds) for g in evened] == [
        ("fast", ["e2", "f1", "f2"], 200.0),
        ("e2e", ["e1", "e3"], 200.0),
    ]


def test_a_move_that_would_not_shorten_the_longest_group_is_not_made() -> None:
    measured = {"a": 100.0, "b": 90.0, "c": 10.0}
    one = groups.Group("one", ["a"], 100.0)
    two = groups.Group("two", ["b", "c"], 100.0)
    evened = groups.even_out([one, two], {**measured, "unmeasured": 0.0})
    assert [(g.files, g.seconds) for g in evened] == [(["a"], 100.0), (["b", "c"], 100.0)]
