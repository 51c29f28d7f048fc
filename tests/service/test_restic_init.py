"""A repository gpuyard makes itself (storage/restic_init.py) is restic's: unmodified
restic opens it with the password, backs up into it, restores from it and checks every
byte; a wrong password opens nothing (ResticRepository.ensure's choice between this and
``restic init``: tests/e2e/test_restic_repository.py)."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

from gpuyard.storage.restic_init import init_repository
from tests.required_parts import needs_tools

pytestmark = needs_tools("restic", how="apt-get install restic")


def restic(root: Path, password_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["restic", "--repo", str(root), "--password-file", str(password_file), "--no-cache",
         "-q", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_restic_backs_up_restores_and_checks_a_repository_made_here(tmp_path: Path) -> None:
    password = tmp_path / "pw"
    password.write_text(secrets.token_urlsafe(32))
    root = tmp_path / "repo"
    assert init_repository(root, password.read_text())
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "big").write_bytes(secrets.token_bytes(3 << 20))
    (tree / "small").write_text("hello")
    assert restic(root, password, "backup", str(tree)).returncode == 0
    assert restic(root, password, "check", "--read-data").returncode == 0
    out = tmp_path / "out"
    assert restic(root, password, "restore", "latest", "--target", str(out)).returncode == 0
    restored = out / tree.relative_to("/")
    assert (restored / "sub" / "big").read_bytes() == (tree / "sub" / "big").read_bytes()
    assert (restored / "small").read_text() == "hello"
    wrong = tmp_path / "wrong"
    wrong.write_text(secrets.token_urlsafe(32))
    refused = restic(root, wrong, "cat", "config")
    assert refused.returncode != 0 and "wrong password" in refused.stderr
