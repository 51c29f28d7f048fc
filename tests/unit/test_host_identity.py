"""The local host's stable id: stored under GPUYARD_HOME, first derived from an
(injected) machine-id file, never changed afterwards."""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import pytest

from gpuyard.services.fleet.identity import (
    HOST_ID_FILE,
    HostIdentityError,
    derive_from_machine_id,
    local_host_id,
)


def machine_id_file(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "machine-id"
    path.write_text(content)
    return path


def test_first_call_creates_a_private_file_and_later_calls_reuse_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = local_host_id(home, None)
    path = home / HOST_ID_FILE
    assert str(uuid.UUID(first)) == first
    assert path.read_text().strip() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert local_host_id(home, None) == first
    # Nothing but the id file is left behind (no temporary files).
    assert [p.name for p in home.iterdir()] == [HOST_ID_FILE]


def test_two_homes_without_machine_id_get_different_ids(tmp_path: Path) -> None:
    assert local_host_id(tmp_path / "a", None) != local_host_id(tmp_path / "b", None)


def test_derived_from_machine_id_and_stored(tmp_path: Path) -> None:
    mid = machine_id_file(tmp_path, "0123456789abcdef0123456789abcdef\n")
    a = local_host_id(tmp_path / "a", mid)
    b = local_host_id(tmp_path / "b", mid)
    # Two homes on one machine agree (two replicas of one server register one host).
    assert a == b == derive_from_machine_id(mid)
    # The raw machine id is not what is stored.
    assert "0123456789abcdef" not in a.replace("-", "")
    assert (tmp_path / "a" / HOST_ID_FILE).read_text().strip() == a


def test_stored_id_survives_a_changed_machine_id(tmp_path: Path) -> None:
    home = tmp_path / "home"
    mid = machine_id_file(tmp_path, "first")
    first = local_host_id(home, mid)
    mid.write_text("second")
    assert local_host_id(home, mid) == first
    mid.unlink()
    assert local_host_id(home, mid) == first


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_missing_or_empty_machine_id_falls_back_to_random(
    tmp_path: Path, content: str | None
) -> None:
    mid = tmp_path / "machine-id"
    if content is not None:
        mid.write_text(content)
    assert derive_from_machine_id(mid) is None
    host_id = local_host_id(tmp_path / "home", mid)
    assert str(uuid.UUID(host_id)) == host_id


def test_unreadable_machine_id_falls_back_to_random(tmp_path: Path) -> None:
    # A directory cannot be read as a file: the same OSError as a permission problem.
    assert derive_from_machine_id(tmp_path) is None


def test_a_damaged_id_file_is_refused_not_replaced(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / HOST_ID_FILE).write_text("not a uuid")
    with pytest.raises(HostIdentityError, match="does not hold a UUID"):
        local_host_id(home, machine_id_file(tmp_path, "abc"))
    assert (home / HOST_ID_FILE).read_text() == "not a uuid"


def test_an_operator_written_id_is_normalised(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / HOST_ID_FILE).write_text("F7F4F571-80E7-4734-B5E3-087A35D8AD59\n")
    assert local_host_id(home, None) == "f7f4f571-80e7-4734-b5e3-087a35d8ad59"
