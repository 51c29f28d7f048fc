"""What the keyset-paginated lists share: the ``cursor`` query parameter and the
``pagination`` object of their answers (api/rest/schemas/responses.py ``Pagination``)."""

from __future__ import annotations

from typing import Any

from fastapi import Query

from gpuyard.core import cursors

# The ``cursor`` query parameter of every keyset-paginated list. Its content is
# checked by core/cursors.py (400 VALIDATION_ERROR naming ``cursor``).
CURSOR_QUERY: Any = Query(
    default=None,
    max_length=cursors.MAX_CURSOR_CHARS,
    description=(
        "The previous answer's pagination.next_cursor, with the same filters; "
        "not together with page > 1."
    ),
)


def pagination(page: int, per_page: int, total: int, next_cursor: str | None) -> dict[str, Any]:
    """A list answer's ``pagination``: the offset view the seed's clients read
    (page, per_page, total, pages) and the cursor of the next page (None: last)."""
    return {
        "page": page,
        "per_page": per_page,
        "total": total,
        "pages": (total + per_page - 1) // per_page,
        "next_cursor": next_cursor,
    }


# Lists that answered everything before they were paged (cluster events, the training
# list) still do, up to this many, when asked with no paging parameter at all: clients
# that never page keep what they had.
UNPAGED_LIMIT = 5000
# The page size of those lists once a client pages (``page`` or ``cursor`` alone).
PAGED_DEFAULT = 50


def legacy_page_size(per_page: int | None, page: int | None, cursor: str | None) -> int:
    """``per_page`` when given; else everything (``UNPAGED_LIMIT``) for a request with
    no paging parameter, ``PAGED_DEFAULT`` for one with ``page`` or ``cursor``."""
    if per_page is not None:
        return per_page
    return UNPAGED_LIMIT if page is None and cursor is None else PAGED_DEFAULT
