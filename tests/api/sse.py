"""A small Server-Sent Events reader over an httpx streaming response, for tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Event:
    id: str | None
    event: str
    data: str

    @property
    def json(self) -> Any:
        return json.loads(self.data)


def events(response: httpx.Response) -> Iterator[Event]:
    """The events of ``response`` as they arrive (comments skipped)."""
    fields: dict[str, list[str]] = {}
    for line in response.iter_lines():
        if not line:
            if "data" in fields:
                ids = fields.get("id")
                yield Event(
                    ids[-1] if ids else None,
                    (fields.get("event") or ["message"])[-1],
                    "\n".join(fields["data"]),
                )
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name, []).append(value[1:] if value.startswith(" ") else value)
