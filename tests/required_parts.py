"""What a test needs from the machine (a tool, a service, root), and what happens when it
is missing: one place for every such check, so that a run can never look green by
skipping what it was meant to test.

Locally a missing part skips the test with a reason that names the part and how to get
it. Under ``CI=true``, or ``GPUYARD_REQUIRE_REAL=1``, it fails the test instead, with the
same words: a CI machine is meant to have every part, so a missing one is a broken
install step, not a reason to pass. ``GPUYARD_REQUIRE_REAL=0`` turns that off again.

Hardware no CI machine has (a GPU that NVML finds) is not a part: such tests keep
skipping with ``pytest.skip`` and say so.

Two forms, one rule:

- :func:`need` in a test or fixture body:
  ``need("restic", on_path("restic"), how="apt-get install restic")`` (and
  :func:`need_module` at module level for a Python package the module imports: under CI
  a missing one is that module's collection error);
- :func:`needs`, a mark for a test, a class or a module's ``pytestmark``, applied before
  the test's fixtures are set up (this module is a pytest plugin, whose hooks
  ``tests/conftest.py`` takes in).

Each takes the part's problem: ``None`` when the part is there, else why it is not
(``on_path`` and ``as_root`` return such problems).
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Mapping
from types import ModuleType
from typing import NoReturn

import pytest

MARK = "needs_part"


def required(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a missing part fails the test (True) or skips it: ``GPUYARD_REQUIRE_REAL``
    decides when set (``1`` fails, ``0`` skips), else ``CI=true`` fails."""
    env = os.environ if environ is None else environ
    explicit = env.get("GPUYARD_REQUIRE_REAL", "").strip()
    if explicit:
        return explicit == "1"
    return env.get("CI", "").strip().lower() == "true"


def describe(part: str, problem: str, how: str) -> str:
    """The words a skip or failure carries: the part, what is wrong, how to get it."""
    return f"missing system part {part}: {problem} (to get it: {how})"


def missing(part: str, problem: str, how: str) -> NoReturn:
    """Stop the current test (or module) for a missing ``part``: a skip, or under
    ``CI=true`` / ``GPUYARD_REQUIRE_REAL=1`` a failure. At module level a failure is a
    collection error of that module."""
    __tracebackhide__ = True  # reported at the caller's line
    words = describe(part, problem, how)
    if required():
        pytest.fail(f"{words}; CI=true or GPUYARD_REQUIRE_REAL=1 requires it", pytrace=False)
    pytest.skip(words, allow_module_level=True)


def need(part: str, problem: str | None, *, how: str) -> None:
    """Go on when ``problem`` is None (the part is there); else :func:`missing`."""
    __tracebackhide__ = True  # reported at the caller's line
    if problem is not None:
        missing(part, problem, how)


def needs(part: str, problem: str | None, *, how: str) -> pytest.MarkDecorator:
    """A mark with :func:`need`'s rule, checked when the test is set up (before its
    fixtures: a module-scoped fixture that starts the part never runs without it)."""
    mark: pytest.MarkDecorator = getattr(pytest.mark, MARK)
    return mark(part=part, problem=problem, how=how)


def need_tools(*tools: str, how: str) -> None:
    """:func:`need` for programs on PATH; the part is named by the programs."""
    __tracebackhide__ = True  # reported at the caller's line
    need(", ".join(tools), on_path(*tools), how=how)


def needs_tools(*tools: str, how: str) -> pytest.MarkDecorator:
    """:func:`needs` for programs on PATH; the part is named by the programs."""
    return needs(", ".join(tools), on_path(*tools), how=how)


def need_module(name: str, *, how: str) -> ModuleType:
    """The imported module ``name`` (a Python package a test drives); a missing one is
    :func:`missing` (at module level: the module's tests skip, or under CI fail to
    collect)."""
    __tracebackhide__ = True  # reported at the caller's line
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(name, f"cannot import it ({e})", how)


def on_path(*tools: str) -> str | None:
    """The problem of the first of ``tools`` not found (a name on PATH or an absolute
    path), or None when all are there."""
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def as_root() -> str | None:
    """The problem when these tests do not run as root (None when they do)."""
    return None if os.geteuid() == 0 else "the tests do not run as root"


def first_problem(*problems: str | None) -> str | None:
    """The first of ``problems`` that is not None: several checks for one part."""
    return next((p for p in problems if p is not None), None)


# -- the plugin ------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}(part, problem, how): the test needs a system part (tests/required_parts.py)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Locally a missing part's mark becomes a skip mark, so the skip is reported at the
    # test's own line (a skip raised in a set-up hook would name the hook's).
    if required():
        return
    for item in items:
        for mark in item.iter_markers(name=MARK):  # the closest first
            part, problem, how = mark.kwargs["part"], mark.kwargs["problem"], mark.kwargs["how"]
            if problem is not None:
                item.add_marker(pytest.mark.skip(reason=describe(part, problem, how)))
                break


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Under CI a missing part's mark fails the test, before its fixtures are set up.
    if not required():
        return
    for mark in item.iter_markers(name=MARK):
        need(mark.kwargs["part"], mark.kwargs["problem"], how=mark.kwargs["how"])
