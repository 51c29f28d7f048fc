"""Which env values are secret, how they are shown, and how a marked value is read."""

from __future__ import annotations

import pytest

from gpuyard.core.secret_env import (
    MASK,
    SEALED_PREFIX,
    is_secret_name,
    masked_env,
    split_marks,
)


@pytest.mark.parametrize(
    "name",
    [
        "DB_PASSWORD",
        "hf_token",
        "AWS_SECRET_ACCESS_KEY",
        "api_key",
        "MYSQL_PASSWD",
        "SSH_PRIVATE",
        "GIT_CREDENTIALS",
        "GPG_PASSPHRASE",
        "Jupyter_Password",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "BATCH_SIZE", "HF_HUB", "LEARNING_RATE", "MODE"])
def test_plain_names(name: str) -> None:
    assert not is_secret_name(name)


def test_masked_env_hides_secret_names_and_sealed_values() -> None:
    env = {"DB_PASSWORD": "x", "HF_HUB": SEALED_PREFIX + "abc", "MODE": "dev"}
    assert masked_env(env) == {"DB_PASSWORD": MASK, "HF_HUB": MASK, "MODE": "dev"}


def test_split_marks() -> None:
    env, marked = split_marks({"A": "1", "B": {"value": "2", "secret": True}, "C": {"value": "3"}})
    assert env == {"A": "1", "B": "2", "C": "3"} and marked == frozenset({"B"})
    assert split_marks({"R": {"value": None, "secret": True}}, nullable=True)[0] == {"R": None}
    assert split_marks("not a map") == ("not a map", frozenset())


@pytest.mark.parametrize(
    "bad",
    [{"secret": True}, {"value": 1}, {"value": "v", "secret": "yes"}, {"value": "v", "x": 1}],
)
def test_split_marks_refuses_other_shapes(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="env 'X'"):
        split_marks({"X": bad})
    with pytest.raises(ValueError):
        split_marks({"X": {"value": None}})  # null only where a removal is meant
