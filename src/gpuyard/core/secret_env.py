"""Which environment values are secret, and how they are shown.

A value is secret when its name contains one of :data:`SECRET_NAME_PARTS` (any case:
``DB_PASSWORD``, ``hf_token``, ``AWS_SECRET_ACCESS_KEY``, ``SSH_PRIVATE``), or when
the user marked it ``secret: true``. Secret values are stored encrypted, as
``gysec:v1:<token>`` (:data:`SEALED_PREFIX`; services/tenancy/secrets.py seals and opens
them), and every API answer shows them as :data:`MASK`. A stored value carries its
own secrecy: whatever its name, a sealed value stays secret, so an explicit
``secret: true`` needs no column of its own.

A value that refers to an account secret (``{{ RUNPOD_SECRET_name }}``,
core/secret_refs.py) is not secret by its name: the reference is stored and shown as
written (the secret's value is put in only when a container starts). Marked
``secret: true``, it is sealed and masked like any other value.

Pure: no I/O, no cryptography.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuyard.core.models import ENV_NAME, MAX_ENV_VALUE
from gpuyard.core.secret_refs import holds_reference

# Name fragments that make a value secret. Wider than the obvious four on purpose:
# masking a harmless value costs a user one look at their own config, showing a
# password costs more. ``KEY`` also catches API_KEY, ACCESS_KEY, PRIVATE_KEY.
SECRET_NAME_PARTS = (
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "TOKEN",
    "SECRET",
    "KEY",
    "CREDENTIAL",
    "PRIVATE",
)

# What API answers show in place of a secret value; sending it back in an update
# keeps the stored secret (a read-modify-write client does not clobber it).
MASK = "********"

# A stored value with this prefix is encrypted (Fernet token after it).
SEALED_PREFIX = "gysec:v1:"


def is_secret_name(name: str) -> bool:
    """True when ``name`` alone makes its value secret."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def is_sealed(value: str) -> bool:
    """True when ``value`` is a stored, encrypted value."""
    return value.startswith(SEALED_PREFIX)


def is_secret_by_name(name: str, value: str) -> bool:
    """True when ``name`` makes ``value`` secret: a secret-looking name, unless the
    value refers to an account secret (the reference is no secret)."""
    return is_secret_name(name) and not holds_reference(value)


def is_secret(name: str, stored: str) -> bool:
    """True when the stored value of ``name`` must never be shown."""
    return is_sealed(stored) or is_secret_by_name(name, stored)


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as API answers show it: secret values replaced by :data:`MASK`."""
    return {name: MASK if is_secret(name, value) else value for name, value in env.items()}


# How an env map in a request body may mark a value secret (REST ``env`` and
# ``environment_updates``): ``{"NAME": {"value": "...", "secret": true}}`` beside the
# plain ``{"NAME": "..."}``. The OpenAPI schema of such a map.
MARKED_VALUE_FIELDS = frozenset({"value", "secret"})


def env_map_json_schema(*, nullable: bool = False) -> dict[str, object]:
    """The OpenAPI schema of such a map (``nullable``: values may be null, and so may
    the map, as in ``environment_updates``)."""
    value: dict[str, object] = {"type": "string", "maxLength": MAX_ENV_VALUE}
    values: list[dict[str, object]] = [
        value,
        {
            "type": "object",
            "properties": {"value": value, "secret": {"type": "boolean"}},
            "required": ["value"],
            "additionalProperties": False,
        },
    ]
    if nullable:
        nullable_value = {"type": ["string", "null"], "maxLength": MAX_ENV_VALUE}
        values[1]["properties"] = {"value": nullable_value, "secret": {"type": "boolean"}}
        values.append({"type": "null"})
    schema: dict[str, object] = {
        "type": ["object", "null"] if nullable else "object",
        "description": (
            'Environment variables: "NAME": "value", or "NAME": {"value": "...", '
            '"secret": true} to store the value encrypted and show it masked. Names with '
            "PASSWORD, PASSWD, PASSPHRASE, TOKEN, SECRET, KEY, CREDENTIAL or PRIVATE are "
            f'secret without the flag. Sending back the mask "{MASK}" keeps a secret. A '
            "value may refer to an account secret (/v1/secrets) as "
            "{{ RUNPOD_SECRET_name }}: stored and shown as written, the secret's value "
            "put in when the container starts."
        ),
        "propertyNames": {"pattern": ENV_NAME.pattern},
        "additionalProperties": {"anyOf": values},
    }
    return schema


def split_marks(env: object, *, nullable: bool = False) -> tuple[object, frozenset[str]]:
    """A request's env map with ``{"value", "secret"}`` objects replaced by their value,
    and the names marked ``secret: true``. Anything that is not such a map or object
    is returned unchanged, for the body's own validation to refuse. Raises ValueError
    for an object of another shape (a missing or non-string ``value``, a ``secret``
    that is not a boolean, another field). With ``nullable``, an object's value may be
    null (``environment_updates``: remove the variable)."""
    if not isinstance(env, dict):
        return env, frozenset()
    plain: dict[object, object] = {}
    marked: set[str] = set()
    for name, value in env.items():
        if isinstance(value, dict):
            value, secret = _marked_value(str(name), value, nullable)
            if secret:
                marked.add(str(name))
        plain[name] = value
    return plain, frozenset(marked)


def _marked_value(name: str, obj: dict[object, object], nullable: bool) -> tuple[object, bool]:
    extra = set(obj) - MARKED_VALUE_FIELDS
    value, secret = obj.get("value"), obj.get("secret", False)
    if extra or "value" not in obj or not isinstance(secret, bool):
        raise ValueError(
            f"env {name!r}: an object value must be "
            '{"value": string, "secret": boolean} and nothing else'
        )
    if not (isinstance(value, str) or (nullable and value is None)):
        raise ValueError(f"env {name!r}: value must be a string")
    return value, secret
