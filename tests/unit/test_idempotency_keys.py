"""The Idempotency-Key header's format and the request hash (services/idempotency.py)."""

from __future__ import annotations

from enum import Enum

import pytest

from gpuyard.core.errors import ValidationFailed
from gpuyard.services.idempotency import HEADER, MAX_KEY_LENGTH, parse_key, request_hash


@pytest.mark.parametrize(
    "key", ["a", "0b9f2c1e-8d7a-4c3b-9e1f-123456789abc", "x" * MAX_KEY_LENGTH, "a b~!"]
)
def test_printable_ascii_keys_of_1_to_255_characters_are_accepted(key: str) -> None:
    assert parse_key(key) == key


def test_no_header_means_no_key() -> None:
    assert parse_key(None) is None


@pytest.mark.parametrize(
    "key", ["", "x" * (MAX_KEY_LENGTH + 1), "caf\u00e9", "tab\there", "nl\n", "del\x7f"]
)
def test_other_keys_are_refused_naming_the_header(key: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_key(key)
    assert err.value.field == HEADER == "Idempotency-Key"
    assert err.value.code == "VALIDATION_ERROR"


class Color(Enum):
    RED = "red"


def test_the_hash_is_canonical() -> None:
    one = request_hash({"a": 1, "b": [1, {"y": 2, "x": "\u00e9"}], "c": Color.RED})
    same = request_hash({"c": "red", "b": [1, {"x": "\u00e9", "y": 2}], "a": 1})
    assert one == same
    assert len(one) == 64 and int(one, 16) >= 0
    assert request_hash({"a": 1}) != request_hash({"a": 2})
    assert request_hash({"a": [1, 2]}) != request_hash({"a": [2, 1]})
