"""One typed error hierarchy, rendered by each API surface in its own envelope.

Every error carries a stable machine ``code`` (used verbatim by REST, GraphQL
``extensions.code`` and the training API), a human ``message`` and structured
``details``. ``http_status`` is the status REST answers with.
"""

from __future__ import annotations

from typing import Any


class GpuyardError(Exception):
    """Base of every error the API may show a user."""

    code = "INTERNAL_ERROR"
    http_status = 500

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}


class ValidationFailed(GpuyardError):
    code = "VALIDATION_ERROR"
    http_status = 400

    def __init__(self, field: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{field}: {message}", {"field": field, **(details or {})})
        self.field = field


class PayloadTooLarge(GpuyardError):
    code = "PAYLOAD_TOO_LARGE"
    http_status = 413


class Unauthorized(GpuyardError):
    code = "UNAUTHORIZED"
    http_status = 401


class Forbidden(GpuyardError):
    code = "FORBIDDEN"
    http_status = 403


class NotFound(GpuyardError):
    code = "NOT_FOUND"
    http_status = 404


class ClusterNotFound(NotFound):
    code = "CLUSTER_NOT_FOUND"


class SnapshotNotFound(NotFound):
    code = "SNAPSHOT_NOT_FOUND"


class NetworkVolumeNotFound(NotFound):
    code = "NETWORK_VOLUME_NOT_FOUND"


class NetworkVolumeInUse(GpuyardError):
    """A network volume cannot be deleted while clusters mount it or snapshots of it
    exist; ``details`` names them."""

    code = "NETWORK_VOLUME_IN_USE"
    http_status = 409


class SnapshotNotReady(GpuyardError):
    """A snapshot that is still being taken, or failed, cannot be restored."""

    code = "SNAPSHOT_NOT_READY"
    http_status = 409


class InvalidState(GpuyardError):
    code = "INVALID_STATE"
    http_status = 409


class WorkerCluster(GpuyardError):
    """The cluster is a worker of a serverless endpoint: its scaler starts and stops
    it, the user does not (the endpoint's own settings and DELETE do)."""

    code = "SERVERLESS_WORKER"
    http_status = 409


class InsufficientCapacity(GpuyardError):
    code = "INSUFFICIENT_CAPACITY"
    http_status = 409


class PortInUse(GpuyardError):
    """A host port the user chose (``external_port``) is held on the host: by another
    cluster, another installation, or any program. Never retried: only the user can
    choose another port."""

    code = "PORT_IN_USE"
    http_status = 409


class HostUnreachable(GpuyardError):
    """The cluster's host does not answer, so its volume cannot be read (a move would
    lose the data); nothing changed."""

    code = "HOST_UNREACHABLE"
    http_status = 409


class HostNotFound(NotFound):
    code = "HOST_NOT_FOUND"


class HostExists(GpuyardError):
    """A host with that name or engine URL is already registered (``details.field``
    names which, ``details.host_id`` the holder)."""

    code = "HOST_EXISTS"
    http_status = 409


class HostNotEmpty(GpuyardError):
    """The host still holds clusters, capacity claims or data; ``details.left`` lists
    them. Terminate or move them first."""

    code = "HOST_NOT_EMPTY"
    http_status = 409


class LocalHostProtected(GpuyardError):
    """The host the server runs on is registered at every start; it cannot be removed."""

    code = "LOCAL_HOST"
    http_status = 409


class IdempotencyKeyReused(GpuyardError):
    """An ``Idempotency-Key`` already answered a create with a different body."""

    code = "IDEMPOTENCY_KEY_REUSED"
    http_status = 422


class Conflict(GpuyardError):
    """A concurrent change won; the caller may retry."""

    code = "CONFLICT"
    http_status = 409


class RuntimeFailure(GpuyardError):
    """The container engine refused or failed an operation."""

    code = "RUNTIME_ERROR"
    http_status = 502


class LimitsNotEnforced(GpuyardError):
    """The chosen host's engine cannot apply CPU/memory limits and the operator has not
    allowed running without them."""

    code = "LIMITS_NOT_ENFORCED"
    http_status = 409


class DiskNotEnforced(GpuyardError):
    """The chosen host cannot enforce volume or container disk sizes and the operator
    has not allowed running without them."""

    code = "DISK_NOT_ENFORCED"
    http_status = 409


class PrivatePortsExposed(GpuyardError):
    """The chosen host's engine offers the proxy no private way to a cluster's private
    http ports (a ``tcp://`` engine publishes them on the host's addresses) and the
    operator has not allowed that."""

    code = "PRIVATE_PORTS_EXPOSED"
    http_status = 409


class ProxyUnavailable(GpuyardError):
    """The HTTP proxy is not serving (Caddy missing, not started, or refusing its
    configuration): proxy URLs and open links cannot work until it is."""

    code = "PROXY_UNAVAILABLE"
    http_status = 503


class DatabaseUnavailable(GpuyardError):
    """The database cannot be reached or takes no writes right now (a failover in
    progress, a restart). A request that wrote may or may not have been committed:
    retry it (a create with the same Idempotency-Key answers what the first made)."""

    code = "DATABASE_UNAVAILABLE"
    http_status = 503


class AccountSuspended(Forbidden):
    """The acting account is suspended by the operator: reads work, new work does not."""

    code = "ACCOUNT_SUSPENDED"


class QuotaExceeded(Forbidden):
    """A create, start or scale would pass a quota; ``details``: resource, scope
    (account or project id), gpu_type, limit, in_use, asked."""

    code = "QUOTA_EXCEEDED"


class BudgetExhausted(GpuyardError):
    """The account's budget or prepaid balance is spent: no new work until credit is
    added (or the budget raised)."""

    code = "BUDGET_EXHAUSTED"
    http_status = 402
