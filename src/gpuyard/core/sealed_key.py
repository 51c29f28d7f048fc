"""Sealing an API key with a console session's secret.

A console session keeps the key it was opened with server-side, but never readable
from the database alone: the key is XORed with a pad drawn from the session's secret
(the cookie's value, which the server does not store). Each secret is random and
seals one key once, so the pad is a one-time pad; the row is found by the secret's
SHA-256, which does not reveal the pad.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

_PAD_LABEL = b"gpuyard-console-key\x00"
# 32 random bytes: as hard to guess as an API key.
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh session secret (url-safe, fits a cookie value)."""
    return secrets.token_urlsafe(SECRET_BYTES)


def secret_id(secret: str) -> str:
    """The database's name for the session of ``secret`` (hex SHA-256)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _pad(secret: str, length: int) -> bytes:
    return hashlib.shake_256(_PAD_LABEL + secret.encode()).digest(length)


def seal(key: str, secret: str) -> str:
    """``key`` XOR the pad of ``secret``, as hex."""
    raw = key.encode()
    return bytes(a ^ b for a, b in zip(raw, _pad(secret, len(raw)), strict=True)).hex()


def unseal(sealed: str, secret: str) -> str | None:
    """The key sealed by :func:`seal` with ``secret``; None for a malformed seal."""
    try:
        raw = bytes.fromhex(sealed)
        return bytes(a ^ b for a, b in zip(raw, _pad(secret, len(raw)), strict=True)).decode()
    except ValueError:  # not hex, or not UTF-8 (UnicodeDecodeError is a ValueError)
        return None


def same_token(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented CSRF token with the session's."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
