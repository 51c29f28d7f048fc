"""The console's secrets page in a real browser (Playwright driving Debian's
chromium) against ``gpuyard serve``: a secret added through the form is listed with
its reference, the value shows nowhere on the page (nor in any answer the page got),
a new value and a delete work; every request is a public API route."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console import test_console_e2e as base
from tests.console.conftest import watch
from tests.e2e.test_server_e2e import ServerProcess, running_server
from tests.required_parts import need_module, needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools(str(base.CHROMIUM), "podman", how="apt-get install chromium podman"),
]
sync_api = need_module("playwright.sync_api", how="pip install playwright (make venv)")

VALUE = "console-secret-Hq82nd-value"


@pytest.fixture(scope="module")
def server(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("console-secrets") / "home", engine_url) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(base.CHROMIUM), args=base.CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


def test_secrets_page(browser: Any, server: ServerProcess) -> None:
    recorder = base.Recorder(server.url)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    recorder.attach(page)
    watch(page)
    bodies: list[str] = []

    def keep(response: Any) -> None:
        if "/v1/" in response.url:
            with contextlib.suppress(sync_api.Error):  # no body (a redirect)
                bodies.append(response.text())

    page.on("response", keep)
    base.open_app(page, server.url + "/")
    base.sign_in(page, server.key)
    page.goto(f"{server.url}/#/secrets")
    page.wait_for_selector("[data-testid=secrets]")
    page.fill("[data-field=name]", "hf_token")
    page.fill("[data-field=value]", VALUE)
    page.fill("[data-field=description]", "the hub")
    page.click("form button[type=submit]")
    row = page.wait_for_selector("[data-testid=secrets] tr[data-secret-id]")
    assert row is not None
    text = row.inner_text()
    assert "hf_token" in text and "{{ RUNPOD_SECRET_hf_token }}" in text
    assert page.locator("[data-field=value]").input_value() == ""
    assert VALUE not in page.content()
    with server.client() as c:
        listed = c.get("/v1/secrets").json()["data"]["secrets"]
        assert [(s["name"], s["description"]) for s in listed] == [("hf_token", "the hub")]

    # A new value (the prompt), then the delete (the confirmation).
    page.once("dialog", lambda d: d.accept("rotated-value"))
    page.click("[data-testid=secrets] tr[data-secret-id] button:has-text('New value')")
    page.wait_for_selector("#flash:has-text('updated')")
    page.once("dialog", lambda d: d.accept())
    page.click("[data-testid=secrets] tr[data-secret-id] button:has-text('Delete')")
    page.wait_for_selector("[data-testid=secrets] td:has-text('no secrets yet')")
    with server.client() as c:
        assert c.get("/v1/secrets").json()["data"]["secrets"] == []
    assert not [b[:200] for b in bodies if VALUE in b]
    templates = base.route_templates(server)
    unknown = [
        (m, p)
        for m, p in recorder.calls
        if p.startswith("/v1/") and not any(m == tm and pat.match(p) for tm, pat, _ in templates)
    ]
    assert not unknown, unknown
    context.close()
