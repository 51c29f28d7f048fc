"""core/sealed_key.py: a sealed key opens only with its secret."""

from __future__ import annotations

from gpuyard.core.sealed_key import new_secret, same_token, seal, secret_id, unseal


def test_a_sealed_key_opens_with_its_secret_only() -> None:
    key = "gy_" + "A" * 40
    secret, other = new_secret(), new_secret()
    sealed = seal(key, secret)
    assert key not in sealed and key.encode().hex() != sealed
    assert unseal(sealed, secret) == key
    assert unseal(sealed, other) != key
    # The same key sealed by two sessions looks unrelated.
    assert seal(key, other) != sealed
    assert secret_id(secret) != secret_id(other) and secret not in secret_id(secret)


def test_a_malformed_seal_opens_to_nothing() -> None:
    assert unseal("not hex", new_secret()) is None
    assert unseal("", new_secret()) == ""


def test_tokens_compare_exactly() -> None:
    assert same_token("abc", "abc")
    assert not same_token("abd", "abc") and not same_token(None, "abc")
    assert not same_token("", "abc")
