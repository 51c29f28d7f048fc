"""`gpuyard dev-image` says whether it built the image or reused one from the same
recipe (real podman; the test's image has a name of its own and is removed after)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from gpuyard.cli.main import cli
from gpuyard.runtimes.engines.devimage import BUSYBOX_PATH
from tests.required_parts import need_tools


@pytest.fixture
def image_name() -> Iterator[str]:
    need_tools("podman", BUSYBOX_PATH, how="apt-get install podman runc busybox-static")
    name = f"localhost/gpuyard-test/reuse-{uuid.uuid4().hex[:8]}:latest"
    yield name
    subprocess.run(["podman", "rmi", "-f", name], capture_output=True, check=False)


def test_second_build_says_reused_and_force_builds_again(image_name: str) -> None:
    runner = CliRunner()
    args = ["dev-image", "--runtime", "podman", "--name", image_name]
    first = runner.invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert f"building {image_name}" in first.stderr
    assert first.stdout.strip().splitlines()[-1] == image_name

    second = runner.invoke(cli, args)
    assert second.exit_code == 0, second.output
    assert f"{image_name}: already present, reused" in second.stderr
    assert "building" not in second.stderr
    assert second.stdout.strip().splitlines()[-1] == image_name

    forced = runner.invoke(cli, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    assert f"building {image_name}" in forced.stderr
