"""The user's and operator's guide at ``/guide``: the MkDocs site that ``make docs``
builds into the package's ``guide_site`` folder, served by gpuyard itself so it reads
offline (the theme is configured with no web fonts and no outside scripts).

When the site has not been built, ``/guide`` answers a short page that says how to
build it, never a 404 with no explanation.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

import gpuyard

SITE = Path(gpuyard.__file__).parent / "guide_site"

NOT_BUILT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuyard guide</title></head>
<body><h1>The guide is not built</h1>
<p>Run <code>make docs</code> in the gpuyard checkout (or <code>make run</code>, which
builds it first), then reload this page. The same pages are in <code>docs/guide/</code>.</p>
<p>The API reference is at <a href="/docs">/docs</a>.</p></body></html>
"""


def install(app: FastAPI, site: Path = SITE) -> None:
    """Serve ``site`` under ``/guide/``; ``/guide`` redirects there. Without a built
    site (no ``index.html``) every ``/guide`` path answers the not-built page
    (404: the page is not there)."""

    @app.get("/guide", include_in_schema=False)
    def guide_root() -> RedirectResponse:
        return RedirectResponse("/guide/", status_code=307)

    if (site / "index.html").is_file():
        app.mount("/guide", StaticFiles(directory=site, html=True), name="guide")
        return

    @app.get("/guide/{path:path}", include_in_schema=False)
    def not_built(path: str) -> HTMLResponse:
        return HTMLResponse(NOT_BUILT, status_code=404)
