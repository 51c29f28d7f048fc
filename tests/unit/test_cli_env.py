"""``gpuyard env``: the export line for the current GPUYARD_HOME, or a clear failure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from click.testing import CliRunner

from gpuyard.cli.main import cli


def test_env_prints_url_and_key_that_a_shell_can_eval(tmp_path: Path) -> None:
    (tmp_path / "credentials").write_text(json.dumps({"url": "x", "api_key": "gy_k'ey"}))
    out = CliRunner().invoke(
        cli, ["env"], env={"GPUYARD_HOME": str(tmp_path), "GPUYARD_PORT": "8123"}
    )
    assert out.exit_code == 0, out.output
    shown = subprocess.run(
        ["bash", "-c", out.output + 'printf "%s|%s" "$GPUYARD_URL" "$GPUYARD_API_KEY"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown == "http://127.0.0.1:8123|gy_k'ey"


def test_env_without_credentials_fails_on_stderr(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["env"], env={"GPUYARD_HOME": str(tmp_path)})
    assert out.exit_code == 1
    assert "export" not in out.stdout
    assert "no API key" in out.stderr and str(tmp_path) in out.stderr
