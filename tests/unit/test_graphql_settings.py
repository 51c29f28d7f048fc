"""The GraphQL knobs are Settings' ``graphql_*`` fields: the same defaults, and the
``GPUYARD_GRAPHQL_*`` variables they have always been read from."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuyard.api.graphql.settings import GraphQLSettings
from tests.helpers import make_settings


def test_the_defaults_are_the_settings_defaults(tmp_path: Path) -> None:
    assert GraphQLSettings.of(make_settings(tmp_path)) == GraphQLSettings()


def test_the_variables_keep_their_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUYARD_GRAPHQL_INTROSPECTION", "false")
    monkeypatch.setenv("GPUYARD_GRAPHQL_MAX_DEPTH", "7")
    monkeypatch.setenv("GPUYARD_GRAPHQL_RUNTIME_STATS_ERROR_TTL_S", "0.25")
    knobs = GraphQLSettings.of(make_settings(tmp_path))
    assert knobs.introspection is False and knobs.max_depth == 7
    assert knobs.runtime_stats_error_ttl_s == 0.25


def test_out_of_range_values_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUYARD_GRAPHQL_MAX_DEPTH", "0")
    with pytest.raises(ValueError, match="graphql_max_depth"):
        make_settings(tmp_path)
