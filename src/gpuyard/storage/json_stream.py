"""Items of a JSON array read as a stream (restic's ``find --json`` answer can be
larger than one wants to hold: each match is handed on as soon as it is parsed)."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from typing import Any


class StreamError(ValueError):
    """The document ended inside the array, or holds what is not JSON there."""

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.message, self.details = message, details


def json_array_items(chunks: Iterable[bytes], key: str) -> Iterator[dict[str, Any]]:
    """The objects of the first array named ``key`` in the JSON document ``chunks``
    (``[{"key": [{...}, {...}], ...}]``), one at a time, parsed as the bytes come in.
    Raises StreamError when the document ends inside the array or cannot be read."""
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")("replace")
    it = iter(chunks)
    buf, pos = "", 0

    def more() -> bool:
        nonlocal buf, pos
        for chunk in it:
            if pos > (1 << 20):  # drop what was parsed, now and then
                buf, pos = buf[pos:], 0
            buf += text.decode(chunk)
            return True
        return False

    opening = f'"{key}":['
    while (start := buf.find(opening)) < 0:
        if not more():
            return  # no such array: nothing matched
    pos = start + len(opening)
    while True:
        while pos >= len(buf) or buf[pos] in " \t\r\n,":
            if pos < len(buf):
                pos += 1
            elif not more():
                raise StreamError(f"restic printed a truncated {key} list", {"key": key})
        if buf[pos] == "]":
            return
        try:
            item, end = decoder.raw_decode(buf, pos)
        except ValueError:
            if not more():
                raise StreamError(
                    f"restic printed a garbled {key} list", {"key": key, "at": buf[pos:][:200]}
                ) from None
            continue
        pos = end
        if isinstance(item, dict):
            yield item
