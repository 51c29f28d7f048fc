"""storage/json_stream.py: the items of a named array, parsed as the bytes come in."""

from __future__ import annotations

import pytest

from gpuyard.storage.json_stream import StreamError, json_array_items

DOC = b'[{"hits":1,"matches":[{"path":"/a"}, {"path":"/b\xc3\xa9"},{"path":"/c"}],"x":2}]'


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 3, 7, len(DOC)])
def test_items_come_whole_whatever_the_chunks(size: int) -> None:
    items = list(json_array_items(chunks(DOC, size), "matches"))
    assert items == [{"path": "/a"}, {"path": "/bé"}, {"path": "/c"}]


def test_a_document_without_the_array_has_no_items() -> None:
    assert list(json_array_items([b'[{"hits":0}]'], "matches")) == []


def test_a_document_ending_inside_the_array_is_an_error() -> None:
    with pytest.raises(StreamError, match="truncated matches"):
        list(json_array_items([b'[{"matches":[{"path":"/a"},'], "matches"))


def test_what_is_not_json_inside_the_array_is_an_error() -> None:
    with pytest.raises(StreamError, match="garbled matches") as caught:
        list(json_array_items([b'[{"matches":[{"path":"/a"}, nonsense'], "matches"))
    assert caught.value.details["key"] == "matches"
