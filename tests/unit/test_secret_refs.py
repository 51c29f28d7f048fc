"""Account-secret references in env values: RunPod's ``{{ RUNPOD_SECRET_name }}``,
spaces inside the braces optional, references among other text, names' rules, and
what masking does to a value that holds a reference."""

from __future__ import annotations

import pytest

from gpuyard.core.secret_env import MASK, is_secret, masked_env
from gpuyard.core.secret_refs import (
    check_secret_name,
    holds_reference,
    reference,
    referenced,
    referenced_names,
    resolve_env,
)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("{{ RUNPOD_SECRET_token }}", ["token"]),
        ("{{RUNPOD_SECRET_token}}", ["token"]),
        ("{{   RUNPOD_SECRET_my-key_2\t}}", ["my-key_2"]),
        ("Bearer {{ RUNPOD_SECRET_a }} and {{ RUNPOD_SECRET_b }}", ["a", "b"]),
        ("{{ RUNPOD_SECRET_a }}{{ RUNPOD_SECRET_a }}", ["a", "a"]),
        # Not the syntax: left as text.
        ("{ RUNPOD_SECRET_a }", []),
        ("{{ runpod_secret_a }}", []),
        ("{{ RUNPOD_SECRET_ }}", []),
        ("{{ RUNPOD_SECRET_a.b }}", []),
        ("{{ RUNPOD_SECRET_a b }}", []),
        ("RUNPOD_SECRET_a", []),
        ("{{\nRUNPOD_SECRET_a }}", []),
        ("", []),
    ],
)
def test_references_are_found_as_runpod_writes_them(value: str, names: list[str]) -> None:
    assert referenced(value) == names
    assert holds_reference(value) is bool(names)


def test_resolve_replaces_each_reference_and_keeps_the_text_around() -> None:
    env = {
        "X": "{{ RUNPOD_SECRET_token }}",
        "AUTH": "Bearer {{RUNPOD_SECRET_token}}; user={{ RUNPOD_SECRET_user }}",
        "PLAIN": "no reference {{ here }}",
    }
    secrets = {"token": "t0k3n", "user": "u$er\\1"}
    assert resolve_env(env, secrets) == {
        "X": "t0k3n",
        "AUTH": "Bearer t0k3n; user=u$er\\1",
        "PLAIN": "no reference {{ here }}",
    }
    assert referenced_names(env.values()) == {"token", "user"}


def test_a_value_that_looks_like_a_reference_is_not_resolved_again() -> None:
    # A secret's own value is put in as is, never read as another reference.
    assert resolve_env({"X": "{{ RUNPOD_SECRET_a }}"}, {"a": "{{ RUNPOD_SECRET_b }}"}) == {
        "X": "{{ RUNPOD_SECRET_b }}"
    }


def test_a_missing_secret_is_named() -> None:
    with pytest.raises(KeyError) as err:
        resolve_env({"X": "{{ RUNPOD_SECRET_gone }}"}, {})
    assert err.value.args[0] == "gone"


@pytest.mark.parametrize("name", ["a", "Token_1", "my-key", "A" * 100, "0"])
def test_valid_names(name: str) -> None:
    assert check_secret_name(name) == name
    assert referenced(reference(name)) == [name]


@pytest.mark.parametrize("name", ["", "a b", "a.b", "ü", "A" * 101, "a\n", "a/b", "{{"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        check_secret_name(name)


def test_masking_shows_a_reference_even_under_a_secret_looking_name() -> None:
    env = {
        "HF_TOKEN": "{{ RUNPOD_SECRET_hf }}",
        "API_KEY": "Bearer {{ RUNPOD_SECRET_k }}",
        "DB_PASSWORD": "plain-password",
    }
    assert masked_env(env) == {
        "HF_TOKEN": "{{ RUNPOD_SECRET_hf }}",
        "API_KEY": "Bearer {{ RUNPOD_SECRET_k }}",
        "DB_PASSWORD": MASK,
    }
    assert not is_secret("HF_TOKEN", env["HF_TOKEN"])
    # A sealed value stays secret whatever it holds.
    assert is_secret("X", "gysec:v1:abc")
