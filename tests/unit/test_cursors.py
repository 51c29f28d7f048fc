"""Keyset cursors: what they carry round-trips, and anything else is refused naming
``cursor``."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from gpuyard.core import cursors
from gpuyard.core.errors import ValidationFailed

FILTERS: dict[str, cursors.FilterValue] = {"account": 7, "status": None, "search": "gpu"}
SHAPE: cursors.KeyShape = ("time", "str")
AT = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def token(payload: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


def refused(value: str, filters: dict[str, cursors.FilterValue] = FILTERS) -> str:
    with pytest.raises(ValidationFailed) as err:
        cursors.decode(value, "clusters", filters, SHAPE)
    assert err.value.field == "cursor" and err.value.code == "VALIDATION_ERROR"
    return err.value.message


def test_round_trip_of_time_and_id() -> None:
    c = cursors.encode("clusters", FILTERS, (AT, "abc123"))
    assert set(c) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert cursors.decode(c, "clusters", FILTERS, SHAPE) == (AT, "abc123")


def test_integer_keys_round_trip() -> None:
    c = cursors.encode("events", {"cluster": "x"}, (42,))
    assert cursors.decode(c, "events", {"cluster": "x"}, ("int",)) == (42,)


def test_filter_order_does_not_matter_but_values_do() -> None:
    c = cursors.encode("clusters", FILTERS, (AT, "a"))
    reordered = dict(reversed(list(FILTERS.items())))
    assert cursors.decode(c, "clusters", reordered, SHAPE) == (AT, "a")
    assert "other filters" in refused(c, {**FILTERS, "search": "cpu"})
    assert "other filters" in refused(c, {**FILTERS, "account": 8})


def test_another_list_or_version_is_refused() -> None:
    assert "another list" in refused(cursors.encode("snapshots", FILTERS, (AT, "a")))
    digest = cursors.filter_digest(FILTERS)
    old = token({"v": 0, "l": "clusters", "f": digest, "k": [AT.isoformat(), "a"]})
    assert "version" in refused(old)


@pytest.mark.parametrize(
    "key",
    [
        [AT.isoformat()],  # too short
        [AT.isoformat(), "a", "b"],  # too long
        [123, "a"],  # a number where a time goes
        ["yesterday", "a"],  # not a time
        [AT.replace(tzinfo=None).isoformat(), "a"],  # a time without its zone
        [AT.isoformat(), 5],  # a number where an id goes
        [AT.isoformat(), "a\x00b"],  # a NUL no id has (PostgreSQL refuses it)
        [AT.isoformat(), "x" * 65],  # longer than any id
        "not-a-list",
    ],
)
def test_a_key_of_the_wrong_shape_is_refused(key: object) -> None:
    digest = cursors.filter_digest(FILTERS)
    refused(token({"v": 1, "l": "clusters", "f": digest, "k": key}))


@pytest.mark.parametrize("value", [10**30, 2**63, 0, -1])
def test_integer_keys_outside_a_row_id_are_refused(value: int) -> None:
    forged = token({"v": 1, "l": "events", "f": cursors.filter_digest({}), "k": [value]})
    with pytest.raises(ValidationFailed):
        cursors.decode(forged, "events", {}, ("int",))


def test_booleans_are_not_integer_keys() -> None:
    forged = token({"v": 1, "l": "events", "f": cursors.filter_digest({}), "k": [True]})
    with pytest.raises(ValidationFailed):
        cursors.decode(forged, "events", {}, ("int",))


@pytest.mark.parametrize(
    "value",
    [
        "",
        "!!!",
        "a",
        "x" * (cursors.MAX_CURSOR_CHARS + 1),
        token([1, 2]),
        token("s"),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_garbage_is_refused(value: str) -> None:
    refused(value)


def test_a_cursor_with_a_page_beyond_the_first_is_refused() -> None:
    cursors.check_page(1, "c")
    cursors.check_page(3, None)
    with pytest.raises(ValidationFailed) as err:
        cursors.check_page(2, "c")
    assert err.value.field == "cursor"
