"""Account secrets referenced from a cluster's environment, RunPod's way.

A secret has a name of letters, digits, ``-`` and ``_`` (1 to :data:`MAX_NAME`
characters; names are per account and case-sensitive). An environment value refers to
one as ``{{ RUNPOD_SECRET_name }}``; spaces inside the braces are optional
(``{{RUNPOD_SECRET_name}}`` is the same reference). A value may be the reference
alone or hold references among other text (``Bearer {{ RUNPOD_SECRET_token }}``):
each reference is replaced by the secret's value when the container starts, the text
around it is kept. Text that does not match the syntax exactly is left as it is.

The stored environment keeps the references, never the values. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

MAX_NAME = 100
MAX_DESCRIPTION = 1000
NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_NAME}}}")
NAME_PATTERN = f"^[A-Za-z0-9_-]{{1,{MAX_NAME}}}$"
# {{ RUNPOD_SECRET_name }}: spaces or tabs allowed just inside the braces.
REFERENCE = re.compile(r"\{\{[ \t]*RUNPOD_SECRET_([A-Za-z0-9_-]+)[ \t]*\}\}")
PREFIX = "RUNPOD_SECRET_"


def check_secret_name(value: str) -> str:
    """``value`` when it is a valid secret name. Raises ValueError saying the rule."""
    if not NAME.fullmatch(value):
        raise ValueError(
            f"a secret name is 1 to {MAX_NAME} letters, digits, '-' or '_'; got {value!r}"
        )
    return value


def reference(name: str) -> str:
    """The reference text of secret ``name`` as the guide writes it."""
    return "{{ " + PREFIX + name + " }}"


def referenced(value: str) -> list[str]:
    """The secret names ``value`` refers to, in order of appearance (repeats kept)."""
    return [m.group(1) for m in REFERENCE.finditer(value)]


def holds_reference(value: str) -> bool:
    """True when ``value`` refers to at least one secret."""
    return REFERENCE.search(value) is not None


def referenced_names(values: Iterable[str]) -> set[str]:
    """Every secret name the ``values`` refer to."""
    return {name for value in values for name in referenced(value)}


def resolve(value: str, lookup: Callable[[str], str]) -> str:
    """``value`` with each reference replaced by ``lookup(name)`` (which raises for a
    name it does not know); text around the references is kept."""
    return REFERENCE.sub(lambda m: lookup(m.group(1)), value)


def resolve_env(env: Mapping[str, str], secrets: Mapping[str, str]) -> dict[str, str]:
    """``env`` with its references replaced by the values of ``secrets`` (name ->
    plaintext). Raises KeyError naming the first secret that is not there."""

    def lookup(name: str) -> str:
        if name not in secrets:
            raise KeyError(name)
        return secrets[name]

    return {key: resolve(value, lookup) for key, value in env.items()}
