"""A container made with one engine request.

The SDK's high-level ``containers.create`` translates its keyword arguments, asks the
engine to create the container, then asks again for the container it made (to hand
back a model object). The start path needs only the new container's id, which the
create's own answer carries, so the second request (2 to 10 ms on the start path,
measured) is not made: the same translation (the SDK's own, so every argument means
what it means to ``containers.create``), then the low-level create.
"""

from __future__ import annotations

from typing import Any

# The SDK's translation of containers.create's keyword arguments into the low-level
# call's (unchanged in docker-py since 3.x; tests/unit/test_container_create.py pins
# what it makes of the arguments gpuyard passes).
from docker.models.containers import _create_container_args


def create_container(api: Any, **kwargs: Any) -> str:
    """Create a container as ``containers.create(**kwargs)`` would, through the
    SDK's low-level client ``api``; returns its id. Raises what the SDK raises
    (``docker.errors.APIError``, ``ImageNotFound``)."""
    arguments = _create_container_args({"version": api.api_version, **kwargs})
    made = api.create_container(**arguments)
    return str(made["Id"])
