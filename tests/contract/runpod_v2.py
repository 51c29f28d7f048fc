"""Check gpuyard's RunPod v2 answers against RunPod's published v2 document.

tests/contract/runpod_v2_schema.json holds the document's schemas for the operations
gpuyard serves (written by scripts/runpod_v2_schema.py). ``check_answer`` validates
one answer's JSON against the schema the document gives for that operation and
status, with JSON Schema 2020-12 (the document is OpenAPI 3.1): every required member
present, every member of the type and enum the document says. Members the document
does not name are allowed where it allows them (gpuyard's extensions such as
``nextCursor``); where a schema closes itself (``additionalProperties: false``), they
fail.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

FIXTURE = Path(__file__).with_name("runpod_v2_schema.json")
_ROOT = "urn:runpod-v2"


@cache
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(FIXTURE.read_text())
    return loaded


@cache
def _registry() -> Registry[Any]:
    resource = Resource.from_contents(
        {"components": document()["components"]},
        default_specification=DRAFT202012,
    )
    registry: Registry[Any] = Registry().with_resource(_ROOT, resource)
    return registry


def _rooted(schema: Any) -> Any:
    """``schema`` with its ``#/components/...`` refs pointed into the registry."""
    if isinstance(schema, dict):
        out = {k: _rooted(v) for k, v in schema.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            out["$ref"] = _ROOT + ref
        return out
    if isinstance(schema, list):
        return [_rooted(v) for v in schema]
    return schema


def operation(method: str, path: str) -> dict[str, Any]:
    """The document's entry for ``METHOD /v2/...`` (RunPod's path template)."""
    key = f"{method.upper()} {path}"
    ops: dict[str, Any] = document()["operations"]
    assert key in ops, f"{key} is not an operation of RunPod's v2 document"
    entry: dict[str, Any] = ops[key]
    return entry


def schema_errors(schema: Any, value: Any) -> list[str]:
    """Every way ``value`` breaks ``schema`` (a schema of the document), as text."""
    validator = Draft202012Validator(_rooted(schema), registry=_registry())
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    ]


def check_answer(method: str, path: str, status: int, value: Any) -> None:
    """Assert that ``value``, the JSON of a ``status`` answer to ``METHOD path``, is
    what RunPod's document says that answer is."""
    responses = operation(method, path)["responses"]
    schema = responses.get(str(status)) or responses.get("default")
    assert schema is not None, f"the document gives no body for {status} of {method} {path}"
    errors = schema_errors(schema, value)
    assert not errors, f"{method} {path} {status}: " + "; ".join(errors)


def check_component(name: str, value: Any) -> None:
    """Assert that ``value`` is a valid ``#/components/schemas/<name>``."""
    errors = schema_errors({"$ref": f"#/components/schemas/{name}"}, value)
    assert not errors, f"{name}: " + "; ".join(errors)
