"""The Strawberry schema: built once per process (it holds no settings)."""

from __future__ import annotations

import strawberry
from strawberry.schema.config import StrawberryConfig

from gpuyard.api.graphql.mutations import Mutation
from gpuyard.api.graphql.queries import Query

SCHEMA = strawberry.Schema(
    query=Query, mutation=Mutation, config=StrawberryConfig(auto_camel_case=True)
)
