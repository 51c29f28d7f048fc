"""Database URLs as operators write them, turned into what SQLAlchemy accepts.

A highly available PostgreSQL is reached through libpq's multi-host URL, hosts separated
by commas: ``postgresql+psycopg://user:pw@db1:5432,db2:5432/gpuyard?target_session_attrs=read-write``
(libpq tries the hosts in order and keeps the first that takes writes). SQLAlchemy's URL
parser takes one host only, and spells several as repeated ``host`` query parameters
(``...@/gpuyard?host=db1:5432&host=db2:5432``), which psycopg passes on to libpq as the
same list. :func:`sqlalchemy_url` rewrites the first form into the second; any other
URL is returned as it is.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlsplit

from sqlalchemy.engine import URL


def sqlalchemy_url(url: str) -> str | URL:
    """``url`` unchanged, or, for a URL naming several hosts in its authority, the
    same URL with them as ``host`` query parameters (order kept, ahead of any
    ``host`` the query names already). Raises ValueError for a multi-host URL with an
    empty host in its list."""
    parts = urlsplit(url)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    if "," not in hostlist:
        return url
    hosts = hostlist.split(",")
    if any(not h for h in hosts):
        raise ValueError("a database URL's host list has an empty entry")
    user, has_password, password = userinfo.partition(":")
    query: dict[str, list[str]] = {"host": hosts}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        query.setdefault(key, []).append(value)
    return URL.create(
        parts.scheme,
        username=unquote(user) or None,
        password=unquote(password) if has_password else None,
        database=unquote(parts.path.lstrip("/")) or None,
        query={k: v[0] if len(v) == 1 else tuple(v) for k, v in query.items()},
    )
