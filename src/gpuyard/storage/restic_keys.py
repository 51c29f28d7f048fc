"""A restic key whose KDF costs a millisecond, for passwords that need no stretching.

restic derives the key that opens a repository from its password with scrypt, whose
parameters it calibrates at ``init`` and ``key add`` to take about half a second on
the machine (measured with restic 0.14 here: N=16384, r=8, p=3, 0.7-0.9 s per command).
It offers no option to choose them. Stretching protects a password a person chose;
gpuyard's repository passwords are 32 random bytes (or HMAC-SHA256 outputs of such a
secret), which no guessing reaches however cheap one guess is, so every restic command
paid that half second for nothing.

This module writes a second key file into a local repository, in restic's own format
(``keys/<sha256 of the file>``: scrypt parameters, a 64-byte salt, and the repository's
master key sealed with the key scrypt derives: AES-256-CTR and Poly1305-AES, as
restic's ``internal/crypto`` does), with parameters of :data:`FAST_PARAMS`. restic is
then told to try that key first (``--key-hint``). restic's own key stays, so the
repository opens as before with any restic that is not given the hint.

Only for passwords :func:`needs_no_stretching` accepts (long and made of a random
token's alphabet), and only for local repositories (an S3 repository keeps restic's
key: its key files are written through restic's backend only).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.poly1305 import Poly1305

# scrypt N=1024, r=8, p=1: 1 MiB and about a millisecond.
FAST_PARAMS: Final = (1024, 8, 1)
_SALT_BYTES: Final = 64
_NONCE_BYTES: Final = 16
_MAC_BYTES: Final = 16
# Passwords of at least this many characters of [A-Za-z0-9_-] (6 bits each: >= 192 bits
# when random, as every password gpuyard writes is).
_MIN_TOKEN_CHARS: Final = 32
_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]+")
_KEY_NAME: Final = re.compile(r"[0-9a-f]{64}")
_FAST_USER: Final = "gpuyard-fast-kdf"


class KeyFileError(ValueError):
    """A key file that is not restic's, or that ``password`` does not open."""


@dataclass(frozen=True)
class _UserKey:
    encrypt: bytes  # 32 bytes, AES-256
    mac_k: bytes  # 16 bytes, AES-128 key of Poly1305-AES
    mac_r: bytes  # 16 bytes, Poly1305's r


def needs_no_stretching(password: str) -> bool:
    """Whether ``password`` looks like a random token long enough that a cheap KDF
    loses nothing: at least 32 characters, all of the URL-safe base64 alphabet."""
    return len(password) >= _MIN_TOKEN_CHARS and _TOKEN.fullmatch(password) is not None


def _derive(password: str, salt: bytes, n: int, r: int, p: int) -> _UserKey:
    if n < 2 or n & (n - 1) or r < 1 or p < 1 or r * p >= 1 << 30:
        raise KeyFileError(f"invalid scrypt parameters N={n} r={r} p={p}")
    raw = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=64, maxmem=256 * n * r + (64 << 20)
    )
    return _UserKey(encrypt=raw[:32], mac_k=raw[32:48], mac_r=raw[48:64])


def _mac(key: _UserKey, nonce: bytes, message: bytes) -> bytes:
    # Poly1305-AES: the one-time key is r || AES_k(nonce) (Poly1305 clamps r itself).
    encryptor = Cipher(algorithms.AES(key.mac_k), modes.ECB()).encryptor()
    s = encryptor.update(nonce) + encryptor.finalize()
    return Poly1305.generate_tag(key.mac_r + s, message)


def _ctr(key: _UserKey, nonce: bytes, data: bytes) -> bytes:
    cipher = Cipher(algorithms.AES(key.encrypt), modes.CTR(nonce)).encryptor()
    return cipher.update(data) + cipher.finalize()


def seal(key: _UserKey, plaintext: bytes) -> bytes:
    """nonce || AES-256-CTR(plaintext) || Poly1305-AES(ciphertext): restic's format."""
    nonce = secrets.token_bytes(_NONCE_BYTES)
    body = _ctr(key, nonce, plaintext)
    return nonce + body + _mac(key, nonce, body)


def open_sealed(key: _UserKey, sealed: bytes) -> bytes:
    """The plaintext of ``sealed``; KeyFileError when its MAC does not match."""
    if len(sealed) < _NONCE_BYTES + _MAC_BYTES:
        raise KeyFileError("sealed data too short")
    nonce, body, tag = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:-_MAC_BYTES], sealed[-_MAC_BYTES:]
    if not secrets.compare_digest(_mac(key, nonce, body), tag):
        raise KeyFileError("wrong password or not a restic key")
    return _ctr(key, nonce, body)


def master_seal(master: dict[str, Any], plaintext: bytes) -> bytes:
    """``plaintext`` sealed with the repository's master key ``master`` (restic's JSON
    of it), as restic seals the files of a repository."""
    try:
        key = _UserKey(
            encrypt=base64.b64decode(master["encrypt"]),
            mac_k=base64.b64decode(master["mac"]["k"]),
            mac_r=base64.b64decode(master["mac"]["r"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise KeyFileError("not a restic master key") from exc
    return seal(key, plaintext)


def master_key(key_file: bytes, password: str) -> dict[str, Any]:
    """The repository's master key (restic's JSON: ``mac.k``, ``mac.r``, ``encrypt``)
    that the key file ``key_file`` seals, opened with ``password``."""
    try:
        doc = json.loads(key_file)
        salt = base64.b64decode(doc["salt"])
        sealed = base64.b64decode(doc["data"])
        n, r, p = int(doc["N"]), int(doc["r"]), int(doc["p"])
    except (ValueError, KeyError, TypeError) as exc:
        raise KeyFileError("not a restic key file") from exc
    if doc.get("kdf") != "scrypt":
        raise KeyFileError(f"unknown KDF {doc.get('kdf')!r}")
    opened = json.loads(open_sealed(_derive(password, salt, n, r, p), sealed))
    if not isinstance(opened, dict) or "encrypt" not in opened or "mac" not in opened:
        raise KeyFileError("the key file seals no master key")
    return opened


def fast_key_file(master: dict[str, Any], password: str) -> bytes:
    """A key file sealing ``master`` under ``password`` with :data:`FAST_PARAMS`."""
    n, r, p = FAST_PARAMS
    salt = secrets.token_bytes(_SALT_BYTES)
    sealed = seal(_derive(password, salt, n, r, p), json.dumps(master).encode())
    doc = {
        "created": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "username": _FAST_USER,
        "hostname": socket.gethostname(),
        "kdf": "scrypt",
        "N": n,
        "r": r,
        "p": p,
        "salt": base64.b64encode(salt).decode(),
        "data": base64.b64encode(sealed).decode(),
    }
    return json.dumps(doc).encode()


def _is_fast(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kdf") == "scrypt"
        and (doc.get("N"), doc.get("r"), doc.get("p")) == FAST_PARAMS
    )


def ensure_fast_key(repository: Path, password: str) -> str | None:
    """The id of a fast key of the local repository at ``repository`` that
    ``password`` opens, written first when it has none. None when the password needs
    stretching (:func:`needs_no_stretching`), or when no key of the repository opens
    with ``password`` (restic then reports the wrong password itself).

    Safe beside another process doing the same: each writes a complete file under its
    own content's name (a temporary file renamed into place), and either key works.
    """
    if not needs_no_stretching(password):
        return None
    keys = repository / "keys"
    slow: list[bytes] = []
    for name in sorted(os.listdir(keys)):
        if not _KEY_NAME.fullmatch(name):
            continue
        data = (keys / name).read_bytes()
        try:
            doc = json.loads(data)
        except ValueError:
            continue
        if _is_fast(doc):
            try:
                master_key(data, password)
            except KeyFileError:
                continue
            return name
        slow.append(data)
    for data in slow:
        try:
            master = master_key(data, password)
        except KeyFileError:
            continue
        content = fast_key_file(master, password)
        name = hashlib.sha256(content).hexdigest()
        tmp = repository / f".{name}.tmp"  # never listed as a key
        with open(tmp, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o400)  # restic writes its key files read-only too
        os.replace(tmp, keys / name)
        return name
    return None


@dataclass(frozen=True)
class OperationKey:
    """A key file made for one operation (never written to the repository): restic in
    a helper opens the repository with ``password`` and the key ``content``, served
    under ``name`` by the operation's REST server (storage/rest_server.py)."""

    name: str
    content: bytes
    password: str


def operation_key(repository: Path, password: str) -> OperationKey | None:
    """A new key sealing the master key of the local repository at ``repository``
    under a new random password, with :data:`FAST_PARAMS`. None when no key of the
    repository opens with ``password``. The repository's own password never leaves
    this process: a helper that leaks the new one leaks a key that exists only while
    its operation's server runs."""
    keys = repository / "keys"
    names = [n for n in sorted(os.listdir(keys)) if _KEY_NAME.fullmatch(n)]
    files = [(keys / n).read_bytes() for n in names]
    # Cheap keys first: the stretched one costs half a second.
    files.sort(key=lambda data: not _is_fast(_loads(data)))
    for data in files:
        try:
            master = master_key(data, password)
        except KeyFileError:
            continue
        fresh = secrets.token_urlsafe(32)
        content = fast_key_file(master, fresh)
        return OperationKey(hashlib.sha256(content).hexdigest(), content, fresh)
    return None


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None
