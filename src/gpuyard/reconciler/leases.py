"""Which duties a replica owns: the names of the duties that are not per host, and the
lone server's answer (it owns them all)."""

from __future__ import annotations

from typing import Protocol

# Duties that are not per host, each owned by one replica at a time.
AUTOTERM_DUTY = "autoterm"
MAINTENANCE_DUTY = "maintenance"
TRAINING_DUTY = "training"
# Budget alerts, stops at a spent budget, and webhook deliveries.
BUDGET_DUTY = "budget"
# Serverless endpoints' scalers: starting and stopping their workers.
SERVERLESS_DUTY = "serverless"


class Leases(Protocol):
    """Which duties this replica owns now (services/installation/leases.py LeaseKeeper)."""

    def holds(self, name: str) -> bool: ...

    def fence(self, name: str) -> int | None: ...


class AllMine:
    """A lone server owns every duty."""

    def holds(self, name: str) -> bool:
        return True

    def fence(self, name: str) -> int | None:
        return None
