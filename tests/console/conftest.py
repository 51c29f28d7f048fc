"""The console's browser tests use the e2e suite's real engine (a private Podman
service and the offline images)."""

from tests.e2e.conftest import engine_url

__all__ = ["engine_url"]
