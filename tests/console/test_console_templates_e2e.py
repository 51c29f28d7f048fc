"""The console's templates and registry credentials pages in a real browser
(Playwright driving Debian's chromium) against ``gpuyard serve``: credentials added
through a password input are listed by name and never shown (nor in any answer the
page got), their password changed, a delete refused while a template names them; a
template created, listed with its secret env value masked, edited (the secret kept),
picked on the create page, and deleted; every request is a public API route."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console import test_console_e2e as base
from tests.console.conftest import watch
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import ServerProcess, running_server
from tests.required_parts import need_module, needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools(str(base.CHROMIUM), "podman", how="apt-get install chromium podman"),
]
sync_api = need_module("playwright.sync_api", how="pip install playwright (make venv)")

PASSWORD = "console-registry-Zq71-token"
NEW_PASSWORD = "console-registry-rotated-9Kd2"
SECRET = "console-template-secret-Jd81"
MASK = "********"
IMAGE = DEV_IMAGE


@pytest.fixture(scope="module")
def server(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("console-templates") / "home", engine_url) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(base.CHROMIUM), args=base.CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


def test_registry_credentials_and_templates_pages(browser: Any, server: ServerProcess) -> None:
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

    # -- registry credentials --------------------------------------------------------
    page.click("nav a[href='#/registry-auths']")
    page.wait_for_selector("[data-testid=registry-auths]")
    form = "[data-testid=registry-auth-form]"
    assert page.get_attribute(f"{form} [data-field=password]", "type") == "password"
    page.fill(f"{form} [data-field=name]", "ghcr-team")
    page.fill(f"{form} [data-field=username]", "robot")
    page.fill(f"{form} [data-field=password]", PASSWORD)
    page.click(f"{form} button[type=submit]")
    row = page.wait_for_selector("[data-testid=registry-auths] tr[data-registry-auth-id]")
    assert row is not None and "ghcr-team" in row.inner_text()
    auth_id = row.get_attribute("data-registry-auth-id")
    assert page.locator(f"{form} [data-field=password]").input_value() == ""
    assert PASSWORD not in page.content()

    page.click("[data-testid=registry-auths] button:has-text('Update password')")
    change = "[data-testid=registry-auth-update]"
    assert page.get_attribute(f"{change} [data-field=password]", "type") == "password"
    page.fill(f"{change} [data-field=password]", NEW_PASSWORD)
    page.click(f"{change} button[type=submit]")
    page.wait_for_selector("#flash:has-text('updated')")
    assert NEW_PASSWORD not in page.content()

    # -- templates -------------------------------------------------------------------
    page.click("nav a[href='#/templates']")
    page.wait_for_selector("[data-testid=templates]")
    tform = "[data-testid=template-form]"
    page.fill(f"{tform} [data-field=name]", "jupyter")
    page.fill(f"{tform} [data-field=docker_image]", IMAGE)
    page.fill(f"{tform} [data-field=ports]", "8888/http")
    page.fill(f"{tform} [data-field=env]", "MODE=dev")
    page.fill(f"{tform} [data-field=secret_env]", f"HF_TOKEN={SECRET}")
    page.fill(f"{tform} [data-field=start_script]", "exec sleep 3600")
    page.select_option(f"{tform} [data-field=container_registry_auth_id]", auth_id)
    page.click(f"{tform} button[type=submit]")
    trow = page.wait_for_selector("[data-testid=templates] tr[data-template-id]")
    assert trow is not None
    text = trow.inner_text()
    assert "jupyter" in text and f"HF_TOKEN={MASK}" in text and "MODE=dev" in text
    assert SECRET not in page.content()
    tid = trow.get_attribute("data-template-id")
    with server.client() as c:
        got = c.get(f"/v1/templates/{tid}").json()["data"]
        assert got["env"] == {"MODE": "dev", "HF_TOKEN": MASK}
        assert got["container_registry_auth_id"] == auth_id
        assert got["ports"][0]["internal_port"] == 8888

    # Edit: the secret shows as the mask and is kept when saved back.
    page.click("[data-testid=templates] button:has-text('Edit')")
    assert page.locator(f"{tform} [data-field=secret_env]").input_value() == f"HF_TOKEN={MASK}"
    page.fill(f"{tform} [data-field=env]", "MODE=prod")
    page.click(f"{tform} button[type=submit]")
    page.wait_for_selector("[data-testid=templates] td:has-text('MODE=prod')")
    with server.client() as c:
        assert c.get(f"/v1/templates/{tid}").json()["data"]["env"] == {
            "MODE": "prod",
            "HF_TOKEN": MASK,
        }

    # The credentials are in use: their delete is refused, naming the template.
    page.click("nav a[href='#/registry-auths']")
    page.wait_for_selector("[data-testid=registry-auths] tr[data-registry-auth-id]")
    page.once("dialog", lambda d: d.accept())
    page.click("[data-testid=registry-auths] button:has-text('Delete')")
    page.wait_for_selector(f"#flash:has-text('{tid}')")

    # The create page offers the template and fills the form from it.
    page.goto(f"{server.url}/#/clusters/new?template={tid}")
    page.wait_for_selector("[data-field=template_id]")
    assert page.locator("[data-field=template_id]").input_value() == tid
    assert page.locator("[data-field=docker_image]").input_value() == IMAGE

    page.goto(f"{server.url}/#/templates")
    page.wait_for_selector("[data-testid=templates] tr[data-template-id]")
    page.once("dialog", lambda d: d.accept())
    page.click("[data-testid=templates] button:has-text('Delete')")
    page.wait_for_selector("[data-testid=templates] td:has-text('no templates yet')")
    page.click("nav a[href='#/registry-auths']")
    page.wait_for_selector("[data-testid=registry-auths] tr[data-registry-auth-id]")
    page.once("dialog", lambda d: d.accept())
    page.click("[data-testid=registry-auths] button:has-text('Delete')")
    page.wait_for_selector("[data-testid=registry-auths] td:has-text('no registry credentials')")
    with server.client() as c:
        assert c.get("/v1/templates").json()["data"]["templates"] == []
        assert c.get("/v1/registry-auths").json()["data"]["registry_auths"] == []

    for secret in (PASSWORD, NEW_PASSWORD, SECRET):
        assert not [b[:200] for b in bodies if secret in b], secret
    templates = base.route_templates(server)
    unknown = [
        (m, p)
        for m, p in recorder.calls
        if p.startswith("/v1/") and not any(m == tm and pat.match(p) for tm, pat, _ in templates)
    ]
    assert not unknown, unknown
    context.close()


def test_a_read_key_gets_the_lists_only(browser: Any, server: ServerProcess) -> None:
    with server.client() as c:
        auth = c.post("/v1/registry-auths", json={"name": "ro", "username": "u", "password": "p"})
        assert auth.status_code == 201, auth.text
        made = c.post("/v1/templates", json={"name": "ro-template", "docker_image": IMAGE})
        assert made.status_code == 201, made.text
    recorder = base.Recorder(server.url)
    viewer = base.new_page(browser, server, recorder)
    base.sign_in(viewer, base.read_key(server))
    viewer.goto(f"{server.url}/#/templates")
    viewer.wait_for_selector("[data-testid=templates] td:has-text('ro-template')")
    assert viewer.locator("[data-testid=template-form]").count() == 0
    assert viewer.locator("[data-testid=templates] button").count() == 0
    viewer.goto(f"{server.url}/#/registry-auths")
    viewer.wait_for_selector("[data-testid=registry-auths] td:has-text('ro')")
    assert viewer.locator("[data-testid=registry-auth-form]").count() == 0
    assert viewer.locator("[data-testid=registry-auths] button").count() == 0
    viewer.context.close()
    with server.client() as c:
        c.delete(f"/v1/templates/{made.json()['data']['id']}")
        c.delete(f"/v1/registry-auths/{auth.json()['data']['id']}")
