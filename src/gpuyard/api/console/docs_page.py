"""The API reference page at ``/docs``: Swagger UI from the bundled copy
(``swagger-ui-bundle-v2``), served by gpuyard itself, so the page works on a machine
with no internet (FastAPI's own page loads it from a CDN). ReDoc, CDN-only, is off.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from swagger_ui_bundle import swagger_ui_path

from gpuyard.api.console.page import PageAssets

# Under the console's asset prefix: the console-session middleware passes it unread.
ASSETS = "/console/swagger-ui"


def install(app: FastAPI) -> None:
    """Serve ``/docs`` and its assets (the app is made with ``docs_url=None``)."""
    # With the console's headers (nosniff, no caching without revalidation).
    app.mount(ASSETS, PageAssets(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )
