"""Per-account snapshot repositories: where each is and what its password is."""

from __future__ import annotations

from pathlib import Path

from gpuyard.storage.account_repositories import SnapshotRepositories, account_password


def test_each_account_has_its_own_password_derived_from_the_secret() -> None:
    a, b = account_password("secret", 1), account_password("secret", 2)
    assert a == account_password("secret", 1)  # a pure function
    assert a != b
    assert account_password("other", 1) != a
    assert "secret" not in a and len(a) >= 40


def test_locations_and_password_files(tmp_path: Path) -> None:
    repos = SnapshotRepositories(
        str(tmp_path / "snapshots") + "/", tmp_path / "snapshot.password", tmp_path / "cache",
        tmp_path / "keys",
    )  # fmt: skip
    assert repos.location_of(7) == f"{tmp_path}/snapshots/accounts/7"
    s3 = SnapshotRepositories(
        "s3:http://127.0.0.1:9/bucket", tmp_path / "pw", tmp_path / "c", tmp_path / "k"
    )
    assert s3.location_of(7) == "s3:http://127.0.0.1:9/bucket/accounts/7"
    repo = repos.for_account(7)
    assert repos.for_account(7) is repo
    key = repos.password_file_of(7)
    secret = (tmp_path / "snapshot.password").read_text().strip()
    assert key.read_text().strip() == account_password(secret, 7)
    assert key.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "snapshot.password").stat().st_mode & 0o777 == 0o600
    # A key file that does not match the secret is written again.
    key.write_text("tampered\n")
    fresh = SnapshotRepositories(
        str(tmp_path / "snapshots"), tmp_path / "snapshot.password", tmp_path / "cache",
        tmp_path / "keys",
    )  # fmt: skip
    fresh.for_account(7)
    assert key.read_text().strip() == account_password(secret, 7)
    assert not (tmp_path / "snapshots").exists()  # nothing made before first use


def test_no_helper_reaches_the_installation_wide_repository(tmp_path: Path) -> None:
    # A helper's one-time key opens the whole repository it is made for: the shared
    # one holds every account's snapshots of earlier versions, so its restores stream.
    repos = SnapshotRepositories(
        str(tmp_path / "snapshots"), tmp_path / "snapshot.password", tmp_path / "cache",
        tmp_path / "keys",
    )  # fmt: skip
    assert repos.shared.helper_access() is None
    assert not (tmp_path / "snapshots" / "keys").exists()  # no key made for one either
    access = repos.for_account(3).helper_access()
    assert access is not None
    root, _key = access
    assert root == tmp_path / "snapshots" / "accounts" / "3"
