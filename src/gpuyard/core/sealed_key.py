"""Sealing an API key with a console session's secret.

A console session keeps the key it was opened with server-side, but never readable
from the database alone: the key is encrypted with AES-256-GCM under a key derived
(HKDF-SHA256) from the session's secret, the cookie's value, which the server does
not store. The row is found by the secret's SHA-256, which reveals neither the secret
nor the derived key; the GCM tag makes a seal opened with another secret, or altered,
open to nothing instead of to a wrong key.

A seal is ``v2.`` and the URL-safe base64 of nonce + ciphertext. Anything else (a seal
of the former scheme, hex digits, a truncated value) opens to None: its session is
over and the browser signs in again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_KEY_LABEL = b"gpuyard-console-key-v2"
_PREFIX = "v2."
_NONCE_BYTES = 12
# 32 random bytes: as hard to guess as an API key.
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh session secret (url-safe, fits a cookie value)."""
    return secrets.token_urlsafe(SECRET_BYTES)


def secret_id(secret: str) -> str:
    """The database's name for the session of ``secret`` (hex SHA-256)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _aead(secret: str) -> AESGCM:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_LABEL)
    return AESGCM(hkdf.derive(secret.encode()))


def seal(key: str, secret: str) -> str:
    """``key`` encrypted and authenticated under ``secret`` (see the module's docstring).
    A 200-character key seals to 307 characters."""
    nonce = os.urandom(_NONCE_BYTES)
    sealed = nonce + _aead(secret).encrypt(nonce, key.encode(), _KEY_LABEL)
    return _PREFIX + base64.urlsafe_b64encode(sealed).decode("ascii")


def unseal(sealed: str, secret: str) -> str | None:
    """The key sealed by :func:`seal` with ``secret``; None for a seal made with
    another secret, altered, malformed or of the former scheme."""
    if not sealed.startswith(_PREFIX):
        return None
    try:
        raw = base64.urlsafe_b64decode(sealed[len(_PREFIX) :].encode("ascii"))
        if len(raw) <= _NONCE_BYTES:
            return None
        nonce, body = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        return _aead(secret).decrypt(nonce, body, _KEY_LABEL).decode()
    # Not ASCII, not base64 (binascii.Error), not UTF-8 (all ValueErrors), or the
    # tag does not match.
    except (ValueError, InvalidTag):
        return None


def same_token(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented CSRF token with the session's."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
