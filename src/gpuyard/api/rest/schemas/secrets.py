"""OpenAPI models of ``/v1/secrets``: request bodies and answers. An answer never holds
a secret's value; the API tests validate real answers against these models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictStr, create_model

from gpuyard.api.rest.schemas.responses import Meta, StrictIn, StrictOut
from gpuyard.core.input_rules import TEXT_PATTERN
from gpuyard.core.models import MAX_ENV_VALUE
from gpuyard.core.secret_refs import MAX_DESCRIPTION, NAME_PATTERN

SecretName = Annotated[
    StrictStr,
    Field(
        json_schema_extra={"pattern": NAME_PATTERN},
        description="letters, digits, '-' and '_'; unique in the account",
    ),
]
SecretValue = Annotated[
    StrictStr,
    Field(
        json_schema_extra={"minLength": 1, "maxLength": MAX_ENV_VALUE},
        description="the secret's value: stored encrypted, never answered",
    ),
]
Description = Annotated[
    StrictStr,
    Field(json_schema_extra={"pattern": TEXT_PATTERN, "maxLength": MAX_DESCRIPTION}),
]


class CreateSecret(StrictIn):
    # Lengths and patterns are checked by the use case, so its errors name the field.
    name: SecretName
    value: SecretValue
    description: Description = ""


class UpdateSecret(StrictIn):
    value: SecretValue | None = None
    description: Description | None = None


class Secret(StrictOut):
    id: int
    name: str
    description: str
    reference: str = Field(description="what a cluster's env writes to use it")
    created_at: str | None
    updated_at: str | None


class SecretList(StrictOut):
    secrets: list[Secret]


def _envelope(name: str, data: Any) -> type[BaseModel]:
    return create_model(
        name,
        __base__=StrictOut,
        success=(Literal[True], ...),
        data=(data, ...),
        meta=(Meta, ...),
    )


SecretEnvelope = _envelope("SecretEnvelope", Secret)
SecretListEnvelope = _envelope("SecretListEnvelope", SecretList)
