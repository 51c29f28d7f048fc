"""The slowest tests of a run, from its groups' pytest JUnit XML reports together.

    python3 scripts/slowest_tests.py [--top N] [--files OUT.json] REPORT.xml...

Prints the ``N`` (10) slowest test cases of all the reports, one a line (seconds, the
test's id, its group: the report's file name without ``.xml``); a report that cannot be
read is named on stderr and left out (scripts/group_ran.py fails its group). A test's
time is pytest's: its setup, call and teardown, so a module's or session's fixture
counts with the first test that used it.

With ``--files`` it also writes, for each test file, the seconds its cases took (JSON,
path to seconds, sorted): what scripts/suite_groups.py balances the groups by
(tests/durations.json is such a file, from a run of the whole suite).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    seconds: float
    test_id: str  # path::name, as pytest names it (a class's name between)
    path: str  # the test file, relative to the repository ("" when the case has none)
    group: str


def test_file(classname: str, root: Path = ROOT) -> tuple[str, str]:
    """The test file of a JUnit ``classname`` (``tests.e2e.test_x`` or, for a test in a
    class, ``tests.e2e.test_x.TestY``) and what follows it (the class, or ''): the
    longest dotted prefix that is a file under ``root``."""
    if not classname:  # a collection error, or a case pytest was interrupted in
        return "", ""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (root / candidate).is_file():
            return candidate, "::".join(parts[end:])
    return "/".join(parts) + ".py", ""  # a file gone since: named as the report names it


def cases(report: Path, root: Path = ROOT) -> list[Case]:
    """Every test case of ``report``; raises OSError or ET.ParseError when it cannot be
    read."""
    group = report.name.removesuffix(".xml")
    found = []
    for case in ET.parse(report).getroot().iter("testcase"):
        path, inner = test_file(case.get("classname", ""), root)
        name = case.get("name", "")
        test_id = "::".join(p for p in (path, inner, name) if p)
        found.append(Case(float(case.get("time") or 0.0), test_id, path, group))
    return found


def per_file(all_cases: list[Case], root: Path = ROOT) -> dict[str, float]:
    """Seconds per test file under ``root`` (rounded to a tenth), sorted by path; a
    case of no file there (a collection error) weighs nothing."""
    totals: dict[str, float] = {}
    for case in all_cases:
        if not (root / case.path).is_file():
            continue
        totals[case.path] = totals.get(case.path, 0.0) + case.seconds
    return {path: round(totals[path], 1) for path in sorted(totals)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--files", type=Path, help="write seconds per test file (JSON) here")
    args = parser.parse_args(argv)
    everything: list[Case] = []
    for report in args.reports:
        try:
            everything.extend(cases(report))
        except (OSError, ET.ParseError) as e:
            print(f"slowest_tests: {report}: cannot read it ({e})", file=sys.stderr)
    slowest = sorted(everything, key=lambda c: c.seconds, reverse=True)[: args.top]
    print(f"=== the {len(slowest)} slowest tests of {len(everything)} (all groups) ===")
    for case in slowest:
        print(f"{case.seconds:8.2f}s  {case.test_id}  [{case.group}]")
    if args.files:
        args.files.write_text(json.dumps(per_file(everything), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
