"""Schemathesis checks the fuzz run (tests/api/test_fuzz.py) adds to its built-in ones,
loaded as its hooks module (``SCHEMATHESIS_HOOKS=tests.api.fuzz_checks``).

Why each exists:

- ``rejection_names_a_semantic_field``. Some rules of a REST body cannot be written in
  JSON Schema: they depend on the installation's data (a GPU type of the catalog, an
  existing image, key, plan or location) or settings (the host port range, the registry
  allow-list), or they parse text (an OpenSSH key, a CIDR). For the operations listed in
  ``SEMANTIC_FIELDS`` the fuzz config lets ``positive_data_acceptance`` take a 400 (see
  tests/api/fuzz/schemathesis.toml); this check then holds that 400 to naming one of the
  fields listed for that operation, so any other schema-valid value refused is still a
  failure. The creates taking an Idempotency-Key may answer 422, only as
  IDEMPOTENCY_KEY_REUSED (the fuzzer reuses keys with other bodies).
- ``graphql_errors_are_typed``. Schemathesis counts any resolver error without an
  Apollo-style marker as a server error, but "cluster not found" is an answer, not a
  failure. The GraphQL run replaces ``not_a_server_error`` and
  ``positive_data_acceptance`` with this: no 5xx, no ``INTERNAL_ERROR`` (what the server
  answers for a bug), and every error carries a code of the domain's typed errors.
"""

from __future__ import annotations

import re
from typing import Any

import schemathesis
from schemathesis.core.transport import Response
from schemathesis.generation.case import Case

# (method, path template) -> field names (a prefix up to "." or "[") whose rules need
# the store, the settings or a parser. Keep in step with the toml's operations.
SEMANTIC_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    # gpu_type: the catalog; docker_image: the registry allow-list setting; ports: the
    # host port range setting; bid_per_gpu/interruptible: a bid needs a GPU type and
    # must reach its spot floor (catalog prices); project_id: must exist;
    # volume_mount_path: its pattern says "absolute, plain segments", but which system
    # directories are refused (/sys, /lib*, ...) and "no . or .. segment" would need
    # look-ahead, which the fuzzer's regex generation does not take.
    ("POST", "/v1/clusters"): frozenset(
        {
            "gpu_type",
            "docker_image",
            "ports",
            "bid_per_gpu",
            "interruptible",
            "project_id",
            "volume_mount_path",
            # A clone (snapshot_id) cannot also mount a network volume: a rule across
            # two fields that the schema does not state.
            "snapshot_id",
        }
    ),
    # A start may change ports (host port range setting) and the GPU type (catalog).
    ("POST", "/v1/clusters/{cluster_id}/start"): frozenset(
        {"port_mapping_updates", "update_configuration", "gpu_type"}
    ),
    ("POST", "/v2/clusters/{cluster_id}/start"): frozenset(
        {"port_mapping_updates", "update_configuration", "gpu_type"}
    ),
    # The text of an OpenSSH public key is parsed and checked.
    ("POST", "/v1/ssh-keys"): frozenset({"public_key"}),
    # CIDRs and port ranges are parsed ("22", "8000-9000").
    ("POST", "/v1/security-groups"): frozenset({"rules"}),
    ("PUT", "/v1/security-groups/{security_group_id}"): frozenset({"rules"}),
    # An image reference is parsed and held to the registry allow-list.
    ("POST", "/v1/images"): frozenset({"image"}),
    # A host's engine URL is parsed (scheme, user, host, port, socket path) and judged
    # with its TLS directory (which must hold the certificates on the server); GPU types
    # must be in the catalog; the address must be a host name or IP address.
    ("POST", "/v1/hosts"): frozenset({"engine_url", "engine_tls_dir", "gpus", "address"}),
    # A network volume lives in a data centre of the installation (a host location) and
    # in a project of the account; it only grows (its current size is stored).
    ("POST", "/v1/networkvolumes"): frozenset({"dataCenterId", "project_id"}),
    ("PATCH", "/v1/networkvolumes/{network_volume_id}"): frozenset({"size"}),
    # since is a time (a pattern cannot rule out 2026-02-30), cursors are parsed.
    ("GET", "/v1/clusters/{cluster_id}/logs"): frozenset({"since", "after", "Last-Event-ID"}),
    # RunPod v2 (/runpod/v2) answers such refusals as problems, 400 or, where RunPod's
    # document says so, 422: an OpenSSH key's text is parsed (each ``keys[i]``).
    ("PUT", "/runpod/v2/account/ssh-keys"): frozenset({"keys"}),
    # The account's quota and the host's disk decide a size; an empty PATCH changes nothing.
    ("POST", "/runpod/v2/network-volumes"): frozenset({"dataCenter", "name", "size"}),
    ("PATCH", "/runpod/v2/network-volumes/{id}"): frozenset({"size", "body"}),
    ("POST", "/runpod/v2/clusters"): frozenset(
        {"keys", "compute", "dataCenterIds", "image", "name"}
    ),
    # ``registry`` must be one of the account's registry credentials; ``disk`` is checked
    # again with the stored template's volume when the change is applied.
    ("POST", "/runpod/v2/templates"): frozenset(
        {"image", "ports", "env", "mounts", "name", "registry", "disk"}
    ),
    ("PATCH", "/runpod/v2/templates/{id}"): frozenset(
        {"image", "ports", "env", "mounts", "name", "registry", "disk"}
    ),
    # RunPod v2's create (api/runpod_v2/pod_requests.py): the catalog's GPU types, the
    # installation's locations, network volumes, templates and registry credentials;
    # the host port range and registry allow-list settings; env names and commands
    # parsed; rules across fields (gpu or cpu, one volume, args or cmd, one bid); and
    # INSUFFICIENT_CAPACITY, which RunPod answers with a 400 naming gpu/dataCenterIds.
    ("POST", "/runpod/v2/pods"): frozenset(
        {
            "gpu",
            "cpu",
            "image",
            "ports",
            "env",
            "dataCenterIds",
            "mounts",
            "templateId",
            "registry",
            "interruptible",
            "bid",
            "bidPerGpu",
            "cmd",
            "args",
            "entrypoint",
            "globalNetworking",
        }
    ),
    # A cursor is parsed and bound to its filters (and needs a limit).
    ("GET", "/runpod/v2/pods"): frozenset({"cursor"}),
    # Serverless endpoints: an image or a template (the account's), GPU types of the
    # catalog, known locations, the account's network volume, the workers cap setting
    # and workers_max >= workers_min (a rule across fields); mount paths as clusters'.
    ("POST", "/v1/endpoints"): frozenset(
        {
            "image",
            "template_id",
            "gpu_type_ids",
            "workers_max",
            "locations",
            "network_volume_id",
            "volume_mount_path",
        }
    ),
    ("PATCH", "/v1/endpoints/{endpoint_id}"): frozenset(
        {
            "image",
            "template_id",
            "gpu_type_ids",
            "workers_max",
            "locations",
            "network_volume_id",
            "volume_mount_path",
        }
    ),
    # since is a time; Last-Event-ID a cursor or a time.
    ("GET", "/runpod/v2/pods/{pod_id}/logs"): frozenset({"since", "Last-Event-ID"}),
    # Location, image, keys, plan, GPU type and group must exist in the installation.
    ("POST", "/distributed_jobs_v2/cluster/"): frozenset(
        {
            "location",
            "image_version_id",
            "ssh_key_ids",
            "sku_id",
            "gpu_type",
            "security_group_id",
        }
    ),
}
_ROOT = re.compile(r"[^.\[]+")


def _problem(body: Any) -> bool:
    """Whether ``body`` is RFC 9457 problem details (RunPod v2's errors)."""
    return isinstance(body, dict) and "type" in body and isinstance(body.get("errors"), list)


def _field(body: Any) -> str | None:
    """The field a 400 names, in the v1 envelope, seed 002's or a problem (its first
    ``errors`` entry, ``"field: message"`` or the bare field)."""
    if _problem(body):
        first = body["errors"][0] if body["errors"] else None
        return first.split(":", 1)[0] if isinstance(first, str) else None
    if not isinstance(body, dict):
        return None
    error = body.get("error") if "error" in body else body.get("errors")
    if not isinstance(error, dict):
        return None
    field = error.get("field")
    if field is None and isinstance(error.get("details"), dict):
        field = error["details"].get("field")
    return field if isinstance(field, str) else None


def _code(body: Any) -> str | None:
    """The error code of a v1, seed 002 or problem error body."""
    if _problem(body):
        return body["code"] if isinstance(body.get("code"), str) else None
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("code"), str):
        return str(body["code"])
    error = body.get("error") if "error" in body else body.get("errors")
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


_NUL_REFUSAL = "must not contain NUL"


@schemathesis.check
def rejection_names_a_semantic_field(ctx: Any, response: Response, case: Case) -> None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    v2_refusal = response.status_code == 422 and case.path.startswith("/runpod/v2/")
    if response.status_code == 422 and not v2_refusal:
        code = _code(response.json())
        if code != "IDEMPOTENCY_KEY_REUSED":
            raise AssertionError(f"schema-valid request answered 422 {code}")
        return
    if response.status_code != 400 and not v2_refusal:
        return
    allowed = SEMANTIC_FIELDS.get((case.method.upper(), case.path))
    if allowed is None:
        return  # positive_data_acceptance judges it, with 400 not allowed
    body = response.json()
    if _NUL_REFUSAL in str(body):
        # No text anywhere takes a NUL (docs/decisions.md): one rule for every string,
        # which the document would otherwise have to repeat as a pattern on each.
        return
    field = _field(body)
    root = _ROOT.match(field or "")
    if root is None or root.group(0) not in allowed:
        raise AssertionError(
            f"schema-valid request refused for {field!r}, whose rule the schema could state "
            f"(only {sorted(allowed)} may be refused for reasons outside it)"
        )


@schemathesis.check
def graphql_errors_are_typed(ctx: Any, response: Response, case: Case) -> None:
    if not case.operation.label.startswith(("Query.", "Mutation.")):
        return  # a REST operation
    if response.status_code >= 500:
        raise AssertionError(f"server error {response.status_code}")
    body = response.json()
    errors = body.get("errors") if isinstance(body, dict) else None
    for error in errors or []:
        extensions = error.get("extensions") if isinstance(error, dict) else None
        code = extensions.get("code") if isinstance(extensions, dict) else None
        if code == "INTERNAL_ERROR":
            raise AssertionError(f"internal error: {error}")
        if not isinstance(code, str) or not code.isupper():
            raise AssertionError(f"an error without a typed code: {error}")
