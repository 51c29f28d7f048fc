"""What an installation owns on a container engine (DESIGN.md rule 8).

Every engine object gpuyard makes carries :data:`LABEL_INSTALLATION` with the
installation's UUID, and every name it chooses starts with ``gy`` and the UUID's first
eight hex digits, so two installations sharing an engine never collide on a name and
never list, stop or delete each other's objects. Objects without our label, or with
another installation's, are somebody else's.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

LABEL_MANAGED = "gpuyard.managed"
LABEL_INSTALLATION = "gpuyard.installation"
LABEL_CLUSTER = "gpuyard.cluster_id"
# On an account network: the account whose clusters it connects.
LABEL_ACCOUNT = "gpuyard.account_id"
# On a volume: its size in bytes when it was made, which the engine enforces
# (runtimes/volumes/images.py). A copy or restore that makes a volume again carries it.
LABEL_SIZE = "gpuyard.size_bytes"

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Ownership:
    """One installation's identity on an engine: its labels and its names."""

    installation_id: str

    def __post_init__(self) -> None:
        if not _UUID.match(self.installation_id):
            raise ValueError(f"installation id must be a lowercase UUID: {self.installation_id!r}")

    @classmethod
    def new(cls) -> Ownership:
        """A fresh installation (first start; tests that need an identity of their own)."""
        return cls(str(uuid.uuid4()))

    @property
    def short(self) -> str:
        """The first eight hex digits: enough to keep names apart, short enough for
        DNS labels (training node names are hostnames)."""
        return self.installation_id[:8]

    @property
    def prefix(self) -> str:
        """Every engine name this installation chooses begins with this."""
        return f"gy{self.short}"

    def labels(self) -> dict[str, str]:
        """The labels that mark an engine object as ours."""
        return {LABEL_MANAGED: "true", LABEL_INSTALLATION: self.installation_id}

    def label_filter(self) -> str:
        """The engine list filter (``label=...``) that selects only our objects."""
        return f"{LABEL_INSTALLATION}={self.installation_id}"

    def owns(self, labels: Mapping[str, str] | None) -> bool:
        """True only for an object labelled with our installation id."""
        return bool(labels) and (labels or {}).get(LABEL_INSTALLATION) == self.installation_id

    # -- names -------------------------------------------------------------------------

    def container(self, cluster_id: str) -> str:
        return f"{self.prefix}-{cluster_id}"

    def volume(self, cluster_id: str) -> str:
        return f"{self.prefix}-vol-{cluster_id}"

    def network_volume(self, volume_id: str) -> str:
        """A network volume's engine volume (mounted by every cluster that names it)."""
        return f"{self.prefix}-nv-{volume_id}"

    def training_prefix(self, training_cluster_id: int) -> str:
        return f"{self.prefix}-tc{training_cluster_id}"

    def account_network(self, account_id: int) -> str:
        """The private network every cluster of ``account_id`` joins: one per account
        and installation, with no route to any other account's network."""
        if isinstance(account_id, bool) or not isinstance(account_id, int) or account_id < 0:
            raise ValueError(f"account id must be a non-negative integer: {account_id!r}")
        return f"{self.prefix}-net-a{account_id}"

    def account_network_labels(self, account_id: int) -> dict[str, str]:
        """The labels of :meth:`account_network`: ours, plus the account's id."""
        return {**self.labels(), LABEL_ACCOUNT: str(account_id)}


def legacy_container_name(cluster_id: str) -> str:
    """The container name clusters had before installation ids."""
    return f"gpuyard-{cluster_id}"


def legacy_volume_name(cluster_id: str) -> str:
    """The volume name clusters had before installation ids (kept for their data)."""
    return f"gpuyard-vol-{cluster_id}"


def legacy_training_prefix(training_cluster_id: int) -> str:
    """The node-name prefix training clusters had before installation ids."""
    return f"gy-tc{training_cluster_id}"
