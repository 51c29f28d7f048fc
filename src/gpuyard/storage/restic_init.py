"""A new local restic repository, made the way ``restic init`` makes one, without its
scrypt calibration.

``restic init`` spends about two seconds of CPU here: it calibrates scrypt's parameters
to take half a second, then derives its key with them. gpuyard's repository passwords
are random (storage/restic_keys.py says why that makes stretching pointless) and every
command it runs uses the cheap key anyway, so for such a password the repository is
written here instead, in restic's repository format version 2 (what ``restic init
--repository-version 2`` writes, checked against restic 0.14's own output):

- a random master key (AES-256 and Poly1305-AES keys, ``r`` clamped as Poly1305 wants);
- ``config``: ``{"version": 2, "id": <32 random bytes, hex>, "chunker_polynomial":
  <hex>}`` sealed with the master key (not compressed: restic writes it so);
- one key file, ``keys/<sha256 of the file>``, sealing the master key under the
  password with the cheap scrypt parameters (restic_keys.fast_key_file);
- the empty ``data/00`` .. ``data/ff``, ``index``, ``locks`` and ``snapshots``.

The chunker polynomial is a random irreducible polynomial of degree 53 over GF(2), as
restic draws one per repository (content-defined chunk boundaries then depend on a
secret of the repository). Irreducibility is Ben-Or's test: ``p`` of degree ``n`` is
irreducible when ``gcd(x^(2^i) - x mod p, p) = 1`` for every ``i`` up to ``n / 2``.

The repository is built in a temporary directory beside its place and renamed into
it, so a reader sees a whole repository or none.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Final

from gpuyard.storage.restic_keys import fast_key_file, master_seal, needs_no_stretching

POLYNOMIAL_DEGREE: Final = 53
_SUBDIRECTORIES: Final = ("index", "keys", "locks", "snapshots")


def _degree(p: int) -> int:
    return p.bit_length() - 1


def _mod(a: int, p: int) -> int:
    """``a`` modulo ``p``, both polynomials over GF(2) (bit i: the coefficient of x^i)."""
    dp = _degree(p)
    while a and _degree(a) >= dp:
        a ^= p << (_degree(a) - dp)
    return a


def _mulmod(a: int, b: int, p: int) -> int:
    """``a * b`` modulo ``p`` over GF(2) (carry-less product, reduced as it grows)."""
    product = 0
    while b:
        if b & 1:
            product ^= a
        b >>= 1
        a = _mod(a << 1, p)
    return _mod(product, p)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, _mod(a, b)
    return a


def is_irreducible(p: int) -> bool:
    """Whether the GF(2) polynomial ``p`` (degree >= 1) has no factor but 1 and itself."""
    n = _degree(p)
    if n < 1:
        return False
    x = 0b10
    power = x  # x^(2^i) mod p
    for _ in range(n // 2):
        power = _mulmod(power, power, p)
        if _gcd(power ^ x, p) != 1:
            return False
    return True


def random_chunker_polynomial() -> int:
    """A random irreducible polynomial of degree 53 (about one draw in 27 is)."""
    while True:
        # Degree 53 (the top bit) with a constant term (else x divides it).
        p = secrets.randbits(POLYNOMIAL_DEGREE) | (1 << POLYNOMIAL_DEGREE) | 1
        if is_irreducible(p):
            return p


def _random_master_key() -> dict[str, Any]:
    r = bytearray(secrets.token_bytes(16))
    # Poly1305's clamp (restic stores r clamped).
    for i in (3, 7, 11, 15):
        r[i] &= 15
    for i in (4, 8, 12):
        r[i] &= 252
    return {
        "mac": {"k": _b64(secrets.token_bytes(16)), "r": _b64(bytes(r))},
        "encrypt": _b64(secrets.token_bytes(32)),
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _write(path: Path, content: bytes) -> None:
    with open(path, "xb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o400)  # as restic leaves its files


def init_repository(root: Path, password: str) -> bool:
    """Make a version 2 restic repository at ``root`` opened by ``password`` (see the
    module). Returns False, changing nothing, when ``root`` exists and is not an empty
    directory (someone else's repository, or one made meanwhile), and for a password
    restic_keys.needs_no_stretching refuses (a person's: restic's stretched key is
    theirs to keep, so ``restic init`` makes theirs)."""
    if not needs_no_stretching(password):
        return False
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        return False
    root.parent.mkdir(parents=True, exist_ok=True)
    building = root.parent / f".{root.name}.init-{secrets.token_hex(6)}"
    building.mkdir(mode=0o700)
    try:
        master = _random_master_key()
        config = {
            "version": 2,
            "id": secrets.token_hex(32),
            "chunker_polynomial": format(random_chunker_polynomial(), "x"),
        }
        _write(building / "config", master_seal(master, json.dumps(config).encode()))
        for name in _SUBDIRECTORIES:
            (building / name).mkdir(mode=0o700)
        data = building / "data"
        data.mkdir(mode=0o700)
        for i in range(256):
            (data / f"{i:02x}").mkdir(mode=0o700)
        key = fast_key_file(master, password)
        _write(building / "keys" / hashlib.sha256(key).hexdigest(), key)
        try:
            # Replaces an empty directory at root, never a repository made meanwhile.
            os.rename(building, root)
        except OSError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(building)
