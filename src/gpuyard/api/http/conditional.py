"""Conditional GETs for the reads clients poll: an ``ETag`` on each answer, and ``304``
to a poller whose copy is still current.

The tag is a digest of what the answer says (api/fast/fastpath.py ``etag_of``): for the v1
envelope the JSON of its ``data`` (the envelope's request id differs per answer), for
an envelope without a per-answer part (seed 002's) the whole body. A request whose
``If-None-Match`` names it (weak or strong, or ``*``: ``fastpath.not_modified``) is
answered ``304`` with the same ``ETag`` and no body. Only a ``200`` is ever tagged: an
error is answered as it is, never ``304``.

The console's pages poll through these (js/poll.js sends the tag back); the cluster
routes do the same inline, in api/fast/fastpath.py and api/rest/clusters.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gpuyard.api.fast import fastpath

JSON_MEDIA_TYPE = "application/json"


def unchanged(request: Request, etag: str) -> Response | None:
    """The ``304`` (``ETag: etag``, no body) when the request's ``If-None-Match`` names
    ``etag``, else None."""
    if fastpath.not_modified(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers={"ETag": etag})
    return None


def tagged(request: Request, etag: str, body: Callable[[], bytes]) -> Response:
    """The ``304`` (``unchanged``; ``body`` is then not called), otherwise ``200`` with
    ``body()`` as JSON and ``ETag: etag``."""
    not_modified = unchanged(request, etag)
    if not_modified is not None:
        return not_modified
    return Response(body(), media_type=JSON_MEDIA_TYPE, headers={"ETag": etag})


def ok_tagged(request: Request, data: Any) -> Response:
    """What ``envelope.ok(data)`` answers (the same bytes, but for the request id, which
    is new), with ``ETag`` the digest of ``data``'s JSON; or the ``304`` (``tagged``)."""
    rendered = fastpath.dumps(data)
    return tagged(request, fastpath.etag_of(rendered), lambda: fastpath.ok_bytes(rendered))


def revalidated(request: Request, answer: Response) -> Response:
    """``answer`` unchanged unless its status is ``200``; a ``200`` gets ``ETag``, the
    digest of its whole body, or becomes the ``304`` (``tagged``). For envelopes whose
    body is the same each time what it says is (no per-answer id in it)."""
    if answer.status_code != 200:
        return answer
    etag = fastpath.etag_of(bytes(answer.body))
    not_modified = unchanged(request, etag)
    if not_modified is not None:
        return not_modified
    answer.headers["ETag"] = etag
    return answer
