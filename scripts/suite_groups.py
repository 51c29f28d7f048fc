"""The suite's test files dealt into groups that scripts/run-tests.sh runs at the same time.

    python3 scripts/suite_groups.py [KIND=COUNT ...]      e.g. fast=2 e2e=4

Prints one line a group, ``NAME FILE...``: each kind's files (every ``test_*.py`` under
its folders, found on disk, so a new file is always in some group) dealt into ``COUNT``
groups named ``KIND1``, ``KIND2``... (just ``KIND`` for one), balanced by the seconds
each file took in a measured run (tests/durations.json, written by
``scripts/slowest_tests.py --files``): the longest file first, each to the group with
the least so far. A file not measured yet counts as the median of its kind. Each file is
in exactly one group; a group that would get no file is left out. Then files move from
the heaviest group to the lightest, across kinds, while that shortens the longest
(:func:`even_out`). On stderr: each group's measured seconds, for the run's log.

Files of one kind may share a process's session fixtures but nothing across processes:
what a test makes on the machine is named per process (ports: tests/helpers.port_block;
simulated hosts: tests/e2e/podman_host.py), so any file may go with any other.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"

# Each kind's folders: fast (unit, service and API tests: CPU) and e2e (real containers,
# browsers and the runtime contract suite: mostly waiting).
KINDS: dict[str, tuple[str, ...]] = {
    "fast": ("tests/unit", "tests/service", "tests/api"),
    "e2e": ("tests/e2e", "tests/contract", "tests/console"),
}
DEFAULT_COUNTS = {"fast": 1, "e2e": 1}
UNMEASURED_S = 10.0  # a kind with no measured file at all


@dataclass
class Group:
    name: str
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0


def modules_under(folders: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """Every test module pytest would collect under ``folders`` (relative paths, sorted)."""
    found: set[str] = set()
    for folder in folders:
        for pattern in ("test_*.py", "*_test.py"):
            found.update(p.relative_to(root).as_posix() for p in (root / folder).rglob(pattern))
    return sorted(found)


def deal(kind: str, files: list[str], count: int, measured: dict[str, float]) -> list[Group]:
    """``files`` in ``count`` groups of about equal measured seconds (longest first, each
    to the lightest group; ties by name, so the same input deals the same groups)."""
    if count < 1:
        raise ValueError(f"{kind}: a kind needs at least one group, not {count}")
    known = [measured[f] for f in files if f in measured]
    default = statistics.median(known) if known else UNMEASURED_S
    weight = {f: measured.get(f, default) for f in files}
    names = [kind] if count == 1 else [f"{kind}{i}" for i in range(1, count + 1)]
    groups = [Group(name) for name in names]
    for f in sorted(files, key=lambda f: (-weight[f], f)):
        lightest = min(groups, key=lambda g: g.seconds)
        lightest.files.append(f)
        lightest.seconds += weight[f]
    for group in groups:
        group.files.sort()
    return [g for g in groups if g.files]


def plan(counts: dict[str, int], measured: dict[str, float], root: Path = ROOT) -> list[Group]:
    """Every kind's groups, in :data:`KINDS` order, evened out across kinds
    (:func:`even_out`)."""
    groups: list[Group] = []
    for kind, folders in KINDS.items():
        groups.extend(deal(kind, modules_under(folders, root), counts[kind], measured))
    return even_out(groups, measured)


def even_out(groups: list[Group], measured: dict[str, float]) -> list[Group]:
    """Move files from the heaviest group to the lightest while that shortens the
    heavier of the two: the kinds' totals differ (on 2 cores the e2e kind took half as
    long again as the fast one), and the suite lasts as long as its longest group.
    Each move takes the file that leaves the two closest; an unmeasured file stays
    where it was dealt. A group's files stay sorted."""
    while len(groups) > 1:
        heavy = max(groups, key=lambda g: (g.seconds, g.name))
        light = min(groups, key=lambda g: (g.seconds, g.name))
        gap = heavy.seconds - light.seconds
        movable = [f for f in heavy.files if 0 < measured.get(f, 0) < gap]
        if not movable:
            break
        best = min(movable, key=lambda f: (abs(gap - 2 * measured[f]), f))
        heavy.files.remove(best)
        heavy.seconds -= measured[best]
        light.files.append(best)
        light.files.sort()
        light.seconds += measured[best]
    return groups


def parse_counts(argv: list[str]) -> dict[str, int]:
    counts = dict(DEFAULT_COUNTS)
    for arg in argv:
        kind, sep, value = arg.partition("=")
        if not sep or kind not in KINDS or not value.isdigit() or int(value) < 1:
            raise SystemExit(
                f"suite_groups.py: {arg!r} is not KIND=COUNT (kinds: {', '.join(KINDS)})"
            )
        counts[kind] = int(value)
    return counts


def main(argv: list[str]) -> int:
    counts = parse_counts(argv)
    measured: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    for group in plan(counts, measured):
        print(group.name, *group.files)
        print(
            f"{group.name}: {len(group.files)} files, {group.seconds:.0f} s measured",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
