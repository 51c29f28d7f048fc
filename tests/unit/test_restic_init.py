"""The repository storage/restic_init.py writes: its chunker polynomial is a random
irreducible one of degree 53 (Ben-Or's test, checked against polynomials restic 0.14
drew itself and against products), its config opens with its master key, its one key
with the password, and it never replaces what is already there."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path

from gpuyard.storage.restic_init import (
    POLYNOMIAL_DEGREE,
    init_repository,
    is_irreducible,
    random_chunker_polynomial,
)
from gpuyard.storage.restic_keys import _UserKey, master_key, open_sealed

PASSWORD = secrets.token_urlsafe(32)
# Chunker polynomials of repositories restic 0.14's own `init` made on this machine.
RESTIC_DRAWN = (0x3FE3539910246D, 0x33B945059818BD, 0x3ECD63500DA43B, 0x3ADC5BEC12B9AB)


def clmul(a: int, b: int) -> int:
    """The product of two GF(2) polynomials."""
    product = 0
    while b:
        if b & 1:
            product ^= a
        a, b = a << 1, b >> 1
    return product


def test_restics_own_polynomials_are_irreducible_and_products_are_not() -> None:
    assert all(is_irreducible(p) for p in RESTIC_DRAWN)
    x2x1, x3x1 = 0b111, 0b1011  # x^2 + x + 1 and x^3 + x + 1, both irreducible
    assert is_irreducible(x2x1) and is_irreducible(x3x1)
    assert not is_irreducible(clmul(x2x1, x3x1))
    assert not is_irreducible(clmul(RESTIC_DRAWN[0], x2x1))
    assert not is_irreducible(clmul(x3x1, x3x1))
    assert not is_irreducible(0b110)  # x^2 + x = x (x + 1)
    assert not is_irreducible(1)


def test_a_drawn_polynomial_has_degree_53_and_is_irreducible() -> None:
    drawn = {random_chunker_polynomial() for _ in range(5)}
    assert len(drawn) == 5
    for p in drawn:
        assert p.bit_length() - 1 == POLYNOMIAL_DEGREE
        assert p & 1 and is_irreducible(p)


def _config(root: Path) -> dict[str, object]:
    keys = list((root / "keys").iterdir())
    assert len(keys) == 1
    master = master_key(keys[0].read_bytes(), PASSWORD)
    key = _UserKey(
        encrypt=base64.b64decode(master["encrypt"]),
        mac_k=base64.b64decode(master["mac"]["k"]),
        mac_r=base64.b64decode(master["mac"]["r"]),
    )
    r = base64.b64decode(master["mac"]["r"])
    assert all(r[i] & 0xF0 == 0 for i in (3, 7, 11, 15)) and all(r[i] & 3 == 0 for i in (4, 8, 12))
    config: dict[str, object] = json.loads(open_sealed(key, (root / "config").read_bytes()))
    return config


def test_a_new_repository_has_restics_layout_config_and_one_cheap_key(tmp_path: Path) -> None:
    root = tmp_path / "accounts" / "7"
    assert init_repository(root, PASSWORD)
    assert sorted(p.name for p in root.iterdir()) == [
        "config", "data", "index", "keys", "locks", "snapshots"
    ]  # fmt: skip
    assert sorted(p.name for p in (root / "data").iterdir()) == [f"{i:02x}" for i in range(256)]
    config = _config(root)
    assert config["version"] == 2
    assert isinstance(config["id"], str) and len(bytes.fromhex(config["id"])) == 32
    assert is_irreducible(int(str(config["chunker_polynomial"]), 16))
    assert (root / "config").stat().st_mode & 0o777 == 0o400
    assert root.stat().st_mode & 0o777 == 0o700
    # Nothing of the build is left beside it.
    assert sorted(p.name for p in root.parent.iterdir()) == ["7"]


def test_an_empty_directory_becomes_the_repository(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    assert init_repository(root, PASSWORD)
    assert _config(root)["version"] == 2


def test_what_is_there_already_is_never_replaced(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    assert init_repository(root, PASSWORD)
    before = (root / "config").read_bytes()
    assert not init_repository(root, secrets.token_urlsafe(32))
    assert (root / "config").read_bytes() == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "somebodys").write_text("file")
    assert not init_repository(other, PASSWORD)
    assert sorted(p.name for p in other.iterdir()) == ["somebodys"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "repo"]


def test_a_persons_password_is_left_to_restic_init(tmp_path: Path) -> None:
    assert not init_repository(tmp_path / "repo", "correct horse battery staple")
    assert not (tmp_path / "repo").exists()
