"""Whether a test group ran any test, from its pytest JUnit XML report.

    python3 scripts/group_ran.py NAME REPORT.xml

Prints one line, ``NAME: R ran, S skipped`` (R counts every test that was not skipped:
passed, failed or errored), and exits 0 when R > 0. A group whose tests were all skipped,
that collected none, or that left no readable report exits 1 with a line that names the
group: a run in which a whole group tested nothing is not a passing run
(scripts/run-tests.sh).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def count(report: Path) -> tuple[int, int]:
    """(ran, skipped) test cases in a JUnit XML report; raises OSError or
    ET.ParseError when it cannot be read."""
    root = ET.parse(report).getroot()
    ran = skipped = 0
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            skipped += 1
        else:
            ran += 1
    return ran, skipped


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: group_ran.py NAME REPORT.xml", file=sys.stderr)
        return 2
    name, report = argv[0], Path(argv[1])
    try:
        ran, skipped = count(report)
    except (OSError, ET.ParseError) as e:
        print(f"{name}: FAILED, no test report ({e})")
        return 1
    if ran == 0:
        print(f"{name}: FAILED, no test ran ({skipped} skipped)")
        return 1
    print(f"{name}: {ran} ran, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
