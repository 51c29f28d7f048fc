"""OpenAPI for seed 002's routes (api/training/routes.py), which parse their requests by hand
so that every failure leaves in that surface's own envelope.

FastAPI cannot see what a hand parser accepts, so each route declares it here
(``openapi_extra``): the required ``project_id`` and ``location`` query parameters,
the integer ``Cluster_Id``, the JSON bodies (services/training/inputs.py is the parser
these schemas describe) and every status the route answers, all in the
``{code, data, errors, message}`` envelope. The fuzz test (tests/api/test_fuzz.py)
holds the server to these declarations.
"""

from __future__ import annotations

from typing import Any, get_args

from gpuyard.api.http.openapi_responses import training_error_responses
from gpuyard.core.cursors import MAX_CURSOR_CHARS
from gpuyard.core.input_rules import REQUIRED_NAME_PATTERN
from gpuyard.core.models import (
    COST_LIMIT_USD_MAX,
    IDLE_MINUTES_MAX,
    MAX_RUNTIME_HOURS_MAX,
    TrainingAutoTerminateAction,
)
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import REQUIRED_FIELDS, Action
from gpuyard.services.access.resource_util import MAX_IDS
from gpuyard.services.clusters.requests import MAX_ID
from gpuyard.services.training.inputs import MAX_NAME_CHARS, MAX_SCRIPT_BYTES

Schema = dict[str, Any]

ID: Schema = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
# What core/input_rules.py ``check_name`` refuses, with at least one character that is
# not white space (the name is stored stripped).
NAME_PATTERN = REQUIRED_NAME_PATTERN
ENVELOPE: Schema = {
    "type": "object",
    "title": "TrainingEnvelope",
    "description": "Every answer of this surface, success or failure; `code` is the HTTP status.",
    "required": ["code", "data", "errors", "message"],
    "properties": {
        "code": {"type": "integer"},
        "data": {},
        "errors": {"type": "object"},
        "message": {"type": "string"},
    },
}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _ids(what: str) -> Schema:
    return {
        "type": "array",
        "items": ID,
        "minItems": 1,
        "maxItems": MAX_IDS,
        "description": f"{what} ids (duplicates count once)",
    }


def _count(maximum: int | None) -> Schema:
    schema: Schema = {"type": "integer", "minimum": 1}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


_PLAN_FIELDS: dict[str, Schema] = {
    "gpu_type": {"type": "string", "description": "an id or display name (GET /v1/gpu-types)"},
    "gpus_per_node": _count(16),
    "cpus_per_node": _count(512),
    "memory_gb_per_node": _count(4096),
}
_NULL: Schema = {"type": "null"}


def _bounded(maximum: float, unit: str) -> Schema:
    return _nullable(
        {"type": "number", "exclusiveMinimum": 0, "maximum": maximum, "description": unit}
    )


# An auto-termination policy (or the changes to one): the clusters' rules and bounds;
# a rule sent as null is removed; enabled unless sent false; action stop unless sent.
POLICY: Schema = {
    "type": "object",
    "title": "TrainingAutoTerminate",
    "additionalProperties": False,
    "properties": {
        "enabled": {"type": "boolean"},
        "idle_minutes": _bounded(IDLE_MINUTES_MAX, "minutes without a running or pending job"),
        "cost_limit_usd": _bounded(COST_LIMIT_USD_MAX, "USD billed in the current run"),
        "max_runtime_hours": _bounded(MAX_RUNTIME_HOURS_MAX, "hours of the current run"),
        "action": {"type": "string", "enum": list(get_args(TrainingAutoTerminateAction))},
    },
}

CREATE_BODY: Schema = {
    "type": "object",
    "title": "TrainingClusterCreate",
    "description": "A plan is `sku_id` (GET /v1/plans) or all four custom-plan fields, not both.",
    "additionalProperties": False,
    "required": ["name", "image_version_id", "ssh_key_ids", "no_of_nodes"],
    "properties": {
        "name": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_NAME_CHARS,
            "pattern": NAME_PATTERN,
        },
        "image_version_id": ID,
        "ssh_key_ids": _ids("SSH key"),
        "no_of_nodes": _count(domain.MAX_WORKERS),
        "sku_id": _nullable({"type": "integer"}),
        **{name: _nullable(schema) for name, schema in _PLAN_FIELDS.items()},
        "security_group_id": _nullable(ID),
        "lifecycle_script": _nullable(
            {
                "type": "string",
                "maxLength": MAX_SCRIPT_BYTES,
                "description": f"a shell script, at most {MAX_SCRIPT_BYTES} bytes of UTF-8",
            }
        ),
        "auto_terminate": _nullable(POLICY),
    },
    "oneOf": [
        {
            "required": ["sku_id"],
            "properties": {"sku_id": {"type": "integer"}, **dict.fromkeys(_PLAN_FIELDS, _NULL)},
        },
        {
            "required": list(_PLAN_FIELDS),
            "properties": {"sku_id": _NULL, **_PLAN_FIELDS},
        },
    ],
}

_ACTION_FIELDS: dict[str, Schema] = {
    "ssh_key_ids": _ids("SSH key"),
    "image_version_id": ID,
    "additional_nodes": _count(None),
    "reserved_ip_id": ID,
    "ip_type": {"type": "string", "enum": list(domain.IP_TYPES)},
    "security_groups_ids": _ids("security group"),
    "security_group_id": ID,
    "auto_terminate": POLICY,
}


def _action(action: Action) -> Schema:
    fields = REQUIRED_FIELDS[action]
    return {
        "type": "object",
        "title": f"TrainingAction_{action.value}",
        "additionalProperties": False,
        "required": ["action", *fields],
        "properties": {
            "action": {"type": "string", "enum": [action.value]},
            **{f: _ACTION_FIELDS[f] for f in fields},
        },
    }


ACTION_BODY: Schema = {"oneOf": [_action(a) for a in Action], "title": "TrainingAction"}

_SCOPE: list[Schema] = [
    {"name": "project_id", "in": "query", "required": True, "schema": ID},
    {
        "name": "location",
        "in": "query",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
        "description": "a location with hosts (GET /v1/locations)",
    },
    {
        "name": "active_iam",
        "in": "query",
        "required": False,
        "schema": ID,
        "description": "an account the caller is a member of, to act for",
    },
]
_CLUSTER_ID: Schema = {"name": "Cluster_Id", "in": "path", "required": True, "schema": ID}


# The list's keyset pagination (api/training/routes.py): the answer's envelope carries a
# ``pagination`` object whose ``next_cursor`` is the next page's ``cursor``.
_PAGED: list[Schema] = [
    {
        "name": "per_page",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
    },
    {
        "name": "page",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 1_000_000, "default": 1},
        "description": "offset paging; not together with cursor (except page 1)",
    },
    {
        "name": "cursor",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "maxLength": MAX_CURSOR_CHARS},
        "description": "the previous answer's pagination.next_cursor, same scope",
    },
]


def operation(
    *, with_id: bool, body: Schema | None = None, created: bool = False, paged: bool = False
) -> Schema:
    """``openapi_extra`` of one route: its parameters, body and answers (``paged``:
    the list's pagination parameters too)."""
    ok = {"description": "Success", "content": {"application/json": {"schema": ENVELOPE}}}
    extra: Schema = {
        "parameters": ([_CLUSTER_ID] if with_id else []) + _SCOPE + (_PAGED if paged else []),
        "responses": {"201" if created else "200": ok, **training_error_responses(ENVELOPE)},
    }
    if body is not None:
        extra["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return extra
