"""restic's key format as storage/restic_keys.py writes and reads it: sealing round-trips,
a wrong password or a changed byte is refused, only random-looking passwords get the
cheap KDF, and a fast key seals the same master key under the same password."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from pathlib import Path

import pytest

from gpuyard.storage import restic_keys
from gpuyard.storage.restic_keys import (
    FAST_PARAMS,
    KeyFileError,
    ensure_fast_key,
    fast_key_file,
    master_key,
    needs_no_stretching,
)

PASSWORD = secrets.token_urlsafe(32)
MASTER = {
    "mac": {
        "k": base64.b64encode(secrets.token_bytes(16)).decode(),
        "r": base64.b64encode(secrets.token_bytes(16)).decode(),
    },
    "encrypt": base64.b64encode(secrets.token_bytes(32)).decode(),
}


def test_a_fast_key_opens_with_its_password_to_the_same_master_key() -> None:
    data = fast_key_file(MASTER, PASSWORD)
    doc = json.loads(data)
    assert (doc["kdf"], doc["N"], doc["r"], doc["p"]) == ("scrypt", *FAST_PARAMS)
    assert len(base64.b64decode(doc["salt"])) == 64
    assert master_key(data, PASSWORD) == MASTER


def test_a_wrong_password_or_a_changed_byte_is_refused() -> None:
    data = fast_key_file(MASTER, PASSWORD)
    with pytest.raises(KeyFileError, match="wrong password"):
        master_key(data, PASSWORD + "x")
    doc = json.loads(data)
    sealed = bytearray(base64.b64decode(doc["data"]))
    sealed[20] ^= 1
    doc["data"] = base64.b64encode(bytes(sealed)).decode()
    with pytest.raises(KeyFileError, match="wrong password"):
        master_key(json.dumps(doc).encode(), PASSWORD)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (b"not json", "not a restic key"),
        (b'{"kdf": "scrypt"}', "not a restic key"),
        (b'{"kdf": "argon2", "N": 2, "r": 1, "p": 1, "salt": "", "data": ""}', "unknown KDF"),
        (b'{"kdf": "scrypt", "N": 1000, "r": 8, "p": 1, "salt": "", "data": ""}', "scrypt"),
    ],
)
def test_what_is_no_restic_key_is_refused(doc: bytes, message: str) -> None:
    with pytest.raises(KeyFileError, match=message):
        master_key(doc, PASSWORD)


@pytest.mark.parametrize(
    ("password", "cheap"),
    [
        (secrets.token_urlsafe(32), True),
        (base64.urlsafe_b64encode(hashlib.sha256(b"x").digest()).decode().rstrip("="), True),
        ("correct horse battery staple, a person's password", False),
        ("short-token", False),
        ("a" * 31, False),
    ],
)
def test_only_long_random_looking_passwords_skip_the_stretching(password: str, cheap: bool) -> None:
    assert needs_no_stretching(password) is cheap


def _repository_with_key(tmp_path: Path, password: str) -> Path:
    root = tmp_path / "repo"
    (root / "keys").mkdir(parents=True)
    (root / "config").write_bytes(b"sealed config")
    # A stand-in for restic's own key: the same format with other parameters.
    doc = json.loads(fast_key_file(MASTER, password))
    salt = secrets.token_bytes(64)
    user = restic_keys._derive(password, salt, 2048, 8, 1)
    doc.update(N=2048, salt=base64.b64encode(salt).decode())
    doc["data"] = base64.b64encode(restic_keys.seal(user, json.dumps(MASTER).encode())).decode()
    data = json.dumps(doc).encode()
    (root / "keys" / hashlib.sha256(data).hexdigest()).write_bytes(data)
    return root


def test_ensure_fast_key_adds_one_key_once_and_keeps_restics_own(tmp_path: Path) -> None:
    root = _repository_with_key(tmp_path, PASSWORD)
    before = set((root / "keys").iterdir())
    name = ensure_fast_key(root, PASSWORD)
    assert name is not None
    added = root / "keys" / name
    assert set((root / "keys").iterdir()) == before | {added}
    assert hashlib.sha256(added.read_bytes()).hexdigest() == name
    assert master_key(added.read_bytes(), PASSWORD) == MASTER
    assert ensure_fast_key(root, PASSWORD) == name  # found, not made again
    assert len(list((root / "keys").iterdir())) == 2
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []


def test_no_fast_key_for_a_persons_password_or_a_wrong_one(tmp_path: Path) -> None:
    human = "correct horse battery staple"
    root = _repository_with_key(tmp_path, human)
    assert ensure_fast_key(root, human) is None
    assert ensure_fast_key(root, PASSWORD) is None  # opens no key: restic will say so
    assert len(list((root / "keys").iterdir())) == 1
