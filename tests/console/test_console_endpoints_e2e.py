"""The console's endpoints pages in a real browser (Playwright driving Debian's
chromium) against ``gpuyard serve``: an endpoint created through the form is listed
with its workers and queue, its page shows its settings and sends the request box's
JSON to RunPod's ``runsync`` (checked for the request it makes: no worker runs here),
and delete removes it; every /v1 request is a public API route."""

from __future__ import annotations

import json
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

SECRET = "console-endpoint-secret-77Qx"


@pytest.fixture(scope="module")
def server(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("console-endpoints") / "home", engine_url) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(base.CHROMIUM), args=base.CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


def test_endpoints_pages(browser: Any, server: ServerProcess) -> None:
    recorder = base.Recorder(server.url)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    recorder.attach(page)
    watch(page)
    sent: list[tuple[str, str, str | None]] = []
    page.on("request", lambda r: sent.append((r.method, r.url, r.post_data)))
    base.open_app(page, server.url + "/")
    base.sign_in(page, server.key)
    page.goto(f"{server.url}/#/endpoints")
    page.wait_for_selector("[data-testid=endpoints] td:has-text('no endpoints yet')")
    form = "[data-testid=endpoint-form]"
    page.fill(f"{form} [data-field=name]", "echo")
    page.fill(f"{form} [data-field=image]", "localhost/worker:1")
    page.select_option(f"{form} [data-field=gpu_type_ids]", ["NVIDIA RTX A6000"])
    page.fill(f"{form} [data-field=workers_max]", "2")
    page.fill(f"{form} [data-field=secret_env]", f"HF_TOKEN={SECRET}")
    page.click(f"{form} button[type=submit]")
    row = page.wait_for_selector("[data-testid=endpoints] tr[data-endpoint-id]")
    assert row is not None
    eid = row.get_attribute("data-endpoint-id")
    text = row.inner_text()
    assert "echo" in text and "0..2" in text and "0 queued" in text
    with server.client() as c:
        made = c.get(f"/v1/endpoints/{eid}").json()["data"]
        assert made["gpu_type_ids"] == ["NVIDIA RTX A6000"] and made["env"]["HF_TOKEN"] != SECRET

    # Its page: the settings, and the request box sends runsync what was typed.
    page.click("[data-testid=endpoints] tr[data-endpoint-id] a")
    page.wait_for_selector("[data-testid=endpoint-facts]:has-text('localhost/worker:1')")
    assert SECRET not in page.content()
    page.fill("[data-testid=send-box] [data-field=input]", '{"prompt": "hi"}')
    # No worker answers here: what is checked is the request the box sends.
    runsync = f"/runpod/v2/{eid}/runsync"
    with page.expect_request(lambda r: r.method == "POST" and runsync in r.url) as made_request:
        page.click("[data-testid=send-box] button[type=submit]")
    assert json.loads(made_request.value.post_data or "") == {"input": {"prompt": "hi"}}

    page.once("dialog", lambda d: d.accept())
    page.click("[data-testid=delete-endpoint]")
    page.wait_for_selector("[data-testid=endpoints] td:has-text('no endpoints yet')")
    with server.client() as c:
        assert c.get("/v1/endpoints").json()["data"]["endpoints"] == []
    templates = base.route_templates(server)
    unknown = [
        (m, p)
        for m, p in recorder.calls
        if p.startswith("/v1/") and not any(m == tm and pat.match(p) for tm, pat, _ in templates)
    ]
    assert not unknown, unknown
    context.close()
