"""The web test image's recipe and failure messages (no engine, no compiler run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuyard.cli.main import cli
from gpuyard.core.errors import RuntimeFailure
from gpuyard.devtools import web_image
from gpuyard.runtimes.engines.devimage import SERVE_PORT
from tests.required_parts import need_tools


def test_source_ships_in_the_package() -> None:
    source = web_image.web_server_source()
    assert b"Sec-WebSocket-Accept" in source and b"int main(" in source
    assert web_image.WEB_PORT == SERVE_PORT == 8888


def test_recipe_digest_is_stable_and_covers_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    need_tools(web_image.BUSYBOX_PATH, how="apt-get install busybox-static")
    first = web_image.recipe_digest()
    assert first == web_image.recipe_digest() and len(first) == 16
    monkeypatch.setattr(web_image, "web_server_source", lambda: b"int main(void){return 0;}")
    assert web_image.recipe_digest() != first


def test_missing_compiler_is_a_clear_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure) as e:
        web_image.compile_web_server(tmp_path / "out", cc="gpuyard-no-such-cc")
    assert "not found on PATH" in e.value.message and "apt-get install gcc" in e.value.message


def test_missing_engine_cli_is_a_clear_failure() -> None:
    with pytest.raises(RuntimeFailure) as e:
        web_image.build_web_image("gpuyard-no-such-engine")
    assert "not found on PATH" in e.value.message


def test_cli_refuses_two_images_at_once() -> None:
    result = CliRunner().invoke(cli, ["dev-image", "--web", "--slurm"])
    assert result.exit_code == 2 and "pick one" in result.output
