"""Database URLs as operators write them (store/database_url.py)."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import URL, make_url

from gpuyard.store.database_url import sqlalchemy_url


def test_a_multi_host_url_becomes_host_parameters() -> None:
    url = sqlalchemy_url(
        "postgresql+psycopg://gy%40ops:p%3Aw@db1:5432,db2:5433/gpuyard"
        "?target_session_attrs=read-write&connect_timeout=5"
    )
    assert isinstance(url, URL)
    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.password, url.database) == ("gy@ops", "p:w", "gpuyard")
    assert url.host is None and url.port is None
    assert url.query["host"] == ("db1:5432", "db2:5433")  # in the order given
    assert url.query["target_session_attrs"] == "read-write"
    assert url.query["connect_timeout"] == "5"
    # What SQLAlchemy's psycopg dialect hands libpq: the hosts and ports as lists.
    _, params = url.get_dialect()().create_connect_args(url)
    assert params["host"] == "db1,db2" and params["port"] == "5432,5433"


def test_hosts_without_credentials_or_ports() -> None:
    url = sqlalchemy_url("postgresql+psycopg://a,b/gy")
    assert isinstance(url, URL)
    assert url.username is None and url.password is None
    assert url.query["host"] == ("a", "b")


@pytest.mark.parametrize(
    "plain",
    [
        "postgresql+psycopg://gy:pw@db1:5432/gpuyard",
        "postgresql+psycopg://gy@/gpuyard?host=db1:5432&host=db2:5432",
        "sqlite:////var/lib/gpuyard/gpuyard.db",
        "sqlite:///:memory:",
    ],
)
def test_other_urls_are_left_alone(plain: str) -> None:
    assert sqlalchemy_url(plain) == plain
    make_url(plain)  # (and SQLAlchemy takes them)


def test_an_empty_host_in_the_list_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        sqlalchemy_url("postgresql+psycopg://db1:5432,,db2/gpuyard")
