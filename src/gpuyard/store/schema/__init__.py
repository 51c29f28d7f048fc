"""The tables. Capacity claims are rows with unique keys so the database, not Python,
decides who gets the last GPU or port (DESIGN.md rule 3).

One module per bounded context; every table (and ``Base``, ``UtcDateTime``,
``utcnow``) is re-exported here, so ``from gpuyard.store.schema import X`` names
them all and importing the package registers every table on ``Base.metadata``.
"""

from __future__ import annotations

from gpuyard.store.schema.base import Base, UtcDateTime, utcnow
from gpuyard.store.schema.billing import (
    AccountCredit,
    AccountEvent,
    Plan,
    UsageInterval,
    WebhookDelivery,
)
from gpuyard.store.schema.clusters import (
    Cluster,
    ClusterLogArchive,
    ClusterTemplate,
    Event,
    GpuAllocation,
    PortAllocation,
    ProxySession,
    Reservation,
    StartupSample,
    UtilizationSample,
)
from gpuyard.store.schema.fleet import (
    GpuType,
    Host,
    HostGpu,
    ImageVersion,
    Installation,
    Lease,
    PlacementLock,
)
from gpuyard.store.schema.networking import ReservedIp, SecurityGroup
from gpuyard.store.schema.serverless import (
    ServerlessEndpoint,
    ServerlessJob,
    ServerlessJobChunk,
    ServerlessWorker,
)
from gpuyard.store.schema.tenancy import (
    Account,
    AccountSecret,
    ApiKey,
    AuditEvent,
    IdempotencyKey,
    Invitation,
    Member,
    Project,
    ProjectMember,
    Quota,
    RegistryAuth,
    SshKey,
    User,
)
from gpuyard.store.schema.training import TrainingCluster, TrainingNode
from gpuyard.store.schema.volumes import (
    NetworkVolume,
    OrphanVolume,
    Snapshot,
    VolumeMove,
    VolumeRestore,
)

__all__ = [
    "Account",
    "AccountCredit",
    "AccountEvent",
    "AccountSecret",
    "ApiKey",
    "AuditEvent",
    "Base",
    "Cluster",
    "ClusterLogArchive",
    "ClusterTemplate",
    "Event",
    "GpuAllocation",
    "GpuType",
    "Host",
    "HostGpu",
    "IdempotencyKey",
    "ImageVersion",
    "Installation",
    "Invitation",
    "Lease",
    "Member",
    "NetworkVolume",
    "OrphanVolume",
    "PlacementLock",
    "Plan",
    "PortAllocation",
    "Project",
    "ProjectMember",
    "ProxySession",
    "Quota",
    "RegistryAuth",
    "Reservation",
    "ReservedIp",
    "SecurityGroup",
    "ServerlessEndpoint",
    "ServerlessJob",
    "ServerlessJobChunk",
    "ServerlessWorker",
    "Snapshot",
    "SshKey",
    "StartupSample",
    "TrainingCluster",
    "TrainingNode",
    "UsageInterval",
    "User",
    "UtcDateTime",
    "UtilizationSample",
    "VolumeMove",
    "VolumeRestore",
    "WebhookDelivery",
    "utcnow",
]
