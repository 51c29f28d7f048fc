"""The crash-point registry matches the source: every ``crash_point("...")`` call names
a registered point, and every registered point is called somewhere (a point listed but
never reached would make its crash test prove nothing)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import gpuyard
from gpuyard.observability.crash_points import CRASH_POINTS, ENV_VAR

SRC = Path(gpuyard.__file__).parent


def _called_names() -> dict[str, list[str]]:
    """Every string literal in a ``crash_point(...)`` argument, with where it is."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "crash_point"
            ):
                assert node.args, f"{path}:{node.lineno}: crash_point without a name"
                literals = [
                    n.value
                    for n in ast.walk(node.args[0])
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                ]
                assert literals, f"{path}:{node.lineno}: crash_point name is not a literal"
                for name in literals:
                    found.setdefault(name, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_every_call_names_a_registered_point() -> None:
    unknown = {n: w for n, w in _called_names().items() if n not in CRASH_POINTS}
    assert unknown == {}


def test_every_registered_point_is_called_once() -> None:
    called = _called_names()
    assert sorted(set(CRASH_POINTS) - set(called)) == []
    assert {n: w for n, w in called.items() if len(w) > 1} == {}


def test_at_least_thirty_points() -> None:
    assert len(CRASH_POINTS) >= 30


def _run_with(env_value: str | None, point: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if env_value is not None:
        env[ENV_VAR] = env_value
    code = f"from gpuyard.observability.crash_points import crash_point\ncrash_point({point!r})\n"
    return subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode


def test_the_named_point_kills_the_process_with_sigkill() -> None:
    assert _run_with("start.after_image", "start.after_image") == -9


def test_other_points_and_no_variable_do_nothing() -> None:
    assert _run_with("start.after_image", "stop.after_request") == 0
    assert _run_with(None, "start.after_image") == 0
