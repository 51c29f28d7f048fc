"""Write the part of RunPod's published REST v2 document that gpuyard's v2 surface is
checked against: tests/contract/runpod_v2_schema.json.

    python scripts/runpod_v2_schema.py PATH/TO/openapi.json

Keeps, for the operations gpuyard serves (``SERVED`` below), the JSON Schemas of their
request and response bodies and everything those refer to, with names, types, enums,
required members and formats only (descriptions and examples dropped), so the test
fixture states the contract and nothing else. Re-run it when RunPod publishes a new
version and review the diff of the fixture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "tests" / "contract" / "runpod_v2_schema.json"
# The path prefixes of the v2 operations gpuyard serves (serverless endpoints and
# billing are answered elsewhere or not at all; see the README).
SERVED = (
    "/v2/pods",
    "/v2/clusters",
    "/v2/templates",
    "/v2/network-volumes",
    "/v2/registries",
    "/v2/account/ssh-keys",
    "/v2/catalog/gpus",
    "/v2/catalog/datacenters",
)
_DROP = {"description", "example", "examples", "title", "summary", "externalDocs"}


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k not in _DROP}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for v in node.values():
            found |= _refs(v)
    elif isinstance(node, list):
        for v in node:
            found |= _refs(v)
    return found


def _body_schema(content: dict[str, Any]) -> Any:
    for media in ("application/json", "application/problem+json", "text/event-stream"):
        if media in content:
            return content[media].get("schema")
    return None


def extract(document: dict[str, Any]) -> dict[str, Any]:
    schemas = document["components"]["schemas"]
    operations: dict[str, dict[str, Any]] = {}
    for path, item in document["paths"].items():
        if path.startswith("/v2/registries/delegations"):
            continue
        if not any(path == p or path.startswith(p + "/") for p in SERVED):
            continue
        for method, op in item.items():
            if method == "parameters":
                continue
            entry: dict[str, Any] = {"responses": {}}
            body = op.get("requestBody")
            if body:
                entry["request"] = _body_schema(body.get("content", {}))
            for status, answer in op.get("responses", {}).items():
                content = answer.get("content") if isinstance(answer, dict) else None
                if content:
                    entry["responses"][status] = _body_schema(content)
            operations[f"{method.upper()} {path}"] = _strip(entry)
    wanted = _refs(operations) | {"ErrorResponse"}
    kept: dict[str, Any] = {}
    while wanted:
        name = wanted.pop()
        if name in kept:
            continue
        kept[name] = _strip(schemas[name])
        wanted |= _refs(kept[name]) - set(kept)
    info = document.get("info", {})
    return {
        "source": f"{info.get('title')} {info.get('version')}",
        "operations": dict(sorted(operations.items())),
        "components": {"schemas": dict(sorted(kept.items()))},
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    document = json.loads(Path(argv[1]).read_text())
    OUT.write_text(json.dumps(extract(document), indent=1, sort_keys=False) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
