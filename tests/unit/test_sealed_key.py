"""core/sealed_key.py: a sealed key opens only with its secret, and only unaltered."""

from __future__ import annotations

import hashlib

from gpuyard.core.sealed_key import new_secret, same_token, seal, secret_id, unseal


def former_seal(key: str, secret: str) -> str:
    """A seal of the former scheme: the key XOR a SHAKE-256 pad of the secret, in hex."""
    raw = key.encode()
    pad = hashlib.shake_256(b"gpuyard-console-key\x00" + secret.encode()).digest(len(raw))
    return bytes(a ^ b for a, b in zip(raw, pad, strict=True)).hex()


def test_a_sealed_key_opens_with_its_secret_only() -> None:
    key = "gy_" + "A" * 40
    secret, other = new_secret(), new_secret()
    sealed = seal(key, secret)
    assert key not in sealed and key.encode().hex() not in sealed
    assert unseal(sealed, secret) == key
    assert unseal(sealed, other) is None
    # The same key sealed twice, by one session or two, looks unrelated.
    assert seal(key, other) != sealed and seal(key, secret) != sealed
    assert secret_id(secret) != secret_id(other) and secret not in secret_id(secret)


def test_the_longest_key_fits_the_column() -> None:
    key = "gy_" + "A" * 197  # the sign-in body's limit is 200 characters
    sealed = seal(key, new_secret())
    assert len(sealed) <= 512


def test_an_altered_seal_opens_to_nothing() -> None:
    secret = new_secret()
    sealed = seal("gy_" + "B" * 40, secret)
    flipped = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    assert unseal(flipped, secret) is None
    assert unseal(sealed[:-4], secret) is None


def test_a_malformed_seal_opens_to_nothing() -> None:
    secret = new_secret()
    for junk in ("not hex", "", "v2.", "v2.!!!", "v2.AAAA", "v3." + seal("k", secret)[3:]):
        assert unseal(junk, secret) is None


def test_a_seal_of_the_former_scheme_opens_to_nothing() -> None:
    key, secret = "gy_" + "C" * 40, new_secret()
    assert unseal(former_seal(key, secret), secret) is None


def test_tokens_compare_exactly() -> None:
    assert same_token("abc", "abc")
    assert not same_token("abd", "abc") and not same_token(None, "abc")
    assert not same_token("", "abc")
