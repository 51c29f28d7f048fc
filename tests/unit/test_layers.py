"""Core imports nothing from the server, store or runtimes; runtimes import only core."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuyard"


def imports_of(package: str) -> set[tuple[str, str]]:
    found = set()
    for path in (SRC / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add((path.name, node.module))
            elif isinstance(node, ast.Import):
                found.update((path.name, a.name) for a in node.names)
    return found


def test_core_is_pure() -> None:
    bad = {
        (f, m)
        for f, m in imports_of("core")
        if m.startswith("gpuyard.") and not m.startswith("gpuyard.core")
    }
    assert not bad
    assert not {
        (f, m)
        for f, m in imports_of("core")
        if m.split(".")[0] in ("sqlalchemy", "fastapi", "docker")
    }


def test_runtimes_import_only_core() -> None:
    bad = {
        (f, m)
        for f, m in imports_of("runtimes")
        if m.startswith("gpuyard.") and not m.startswith(("gpuyard.core", "gpuyard.runtimes"))
    }
    assert not bad


def test_production_code_never_imports_the_test_stand_ins() -> None:
    """gpuyard.testing (the fakes) serves tests and benchmarks only; the development
    tools (gpuyard.devtools) only the CLI's development command."""
    for package in (p.name for p in SRC.iterdir() if p.is_dir() and p.name != "testing"):
        assert not {(f, m) for f, m in imports_of(package) if m.startswith("gpuyard.testing")}
    for package in (p.name for p in SRC.iterdir() if p.is_dir()):
        if package in ("devtools", "cli"):
            continue
        assert not {(f, m) for f, m in imports_of(package) if m.startswith("gpuyard.devtools")}


def test_the_stand_ins_import_only_core_and_runtimes() -> None:
    bad = {
        (f, m)
        for f, m in imports_of("testing")
        if m.startswith("gpuyard.")
        and not m.startswith(("gpuyard.core", "gpuyard.runtimes", "gpuyard.testing"))
    }
    assert not bad
