"""The web console in a real browser (Playwright driving Debian's chromium) against
``gpuyard serve`` on real Podman containers, with the HTTP proxy (Caddy) on.

One user's day: a wrong key is refused; sign in; create a cluster from the form and
watch it reach running; open its private port through the proxy button; ``echo hi``
in the web terminal; stop; start with more memory and see the cost delta; terminate.
A read-only key sees the same cluster with no action button. Every request the pages
made is a route of the public API (the OpenAPI document, plus the terminal WebSocket
it documents apart). Screenshots go to $GPUYARD_TEST_ARTIFACTS (or tests/artifacts).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools.web_image import WEB_IMAGE, build_web_image
from tests.console.conftest import watch
from tests.e2e.test_server_e2e import ServerProcess, running_server
from tests.helpers import free_port
from tests.required_parts import need_module, needs_tools

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.e2e,
    # Debian's chromium, which Playwright drives (its own browser download is not used).
    needs_tools(str(CHROMIUM), "podman", "caddy", how="apt-get install chromium podman caddy"),
]
sync_api = need_module("playwright.sync_api", how="pip install playwright (make venv)")
# Assertions wait as long as actions do: a 2-core CI machine also runs the server, the
# engine and the browser (Playwright's default for expect() is 5 s).
sync_api.expect.set_options(timeout=30_000)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Public endpoints the OpenAPI document cannot list: the terminal is a WebSocket
# (documented in api/console/terminal.py and the README).
NON_OPENAPI_ROUTES = {("GET", "/v1/clusters/{cluster_id}/terminal")}
MEMORY_PRICE = 0.01  # USD per GB-hour: a memory change shows in the rate
START_TIMEOUT_MS = 120_000


def artifacts_dir() -> Path:
    where = os.environ.get("GPUYARD_TEST_ARTIFACTS")
    path = Path(where) if where else Path(__file__).resolve().parents[1] / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    if not where:
        (path / ".gitignore").write_text("*\n")  # screenshots are never committed here
    return path


@pytest.fixture(scope="module")
def server(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    build_web_image("podman")
    env = {
        "GPUYARD_PROXY_ENABLED": "true",
        "GPUYARD_PROXY_PORT": str(free_port()),
        "GPUYARD_PROXY_SYNC_INTERVAL_S": "0.5",
        "GPUYARD_PRICE_MEMORY_GB_HOUR": str(MEMORY_PRICE),
    }
    home = tmp_path_factory.mktemp("console") / "home"
    with running_server(home, engine_url, env) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


class Recorder:
    """Every request a page made to the server, as (method, path)."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.calls: set[tuple[str, str]] = set()

    def attach(self, page: Any) -> None:
        page.on("request", lambda r: self.add(r.method, r.url))
        page.on("websocket", lambda ws: self.add("GET", ws.url))

    def add(self, method: str, url: str) -> None:
        parts = urlsplit(url.replace("ws://", "http://", 1))
        if f"{parts.scheme}://{parts.netloc}" == self.origin:
            self.calls.add((method, parts.path))


def route_templates(server: ServerProcess) -> list[tuple[str, re.Pattern[str], str]]:
    doc = httpx.get(f"{server.url}/openapi.json", timeout=30, verify=trusted_tls()).json()
    found = [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops]
    out = []
    for method, path in [*found, *NON_OPENAPI_ROUTES]:
        pattern = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")
        out.append((method, pattern, path))
    return out


def new_page(browser: Any, server: ServerProcess, recorder: Recorder) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.on("dialog", lambda d: d.accept())  # confirmations
    recorder.attach(page)
    watch(page)  # for the evidence a failed test leaves (conftest.py)
    open_app(page, server.url + "/")
    return page


# True once the console's scripts have run (the page's placeholder is replaced).
BOOTED = "() => document.getElementById('view').textContent.trim() !== 'Loading…'"


def open_app(page: Any, url: str | None = None) -> None:
    """Load the console at ``url`` (None: reload the page) until its scripts have run.
    Chromium aborts every request in flight with ERR_NETWORK_CHANGED when a network
    interface comes or goes, which the engine's containers make happen on this machine
    at any time; a page whose modules were cut off never leaves "Loading…". It is
    loaded again, three times at most."""
    for attempt in range(3):
        if url is None:
            page.reload()
        else:
            page.goto(url)
        try:
            page.wait_for_function(BOOTED, timeout=15_000)
            return
        except sync_api.TimeoutError:
            if attempt == 2:
                raise


def sign_in(page: Any, key: str) -> None:
    page.fill("#api-key", key)
    page.click("form button[type=submit]")
    page.wait_for_selector("[data-testid=cluster-table]")


def wait_status(page: Any, status: str, timeout: int = START_TIMEOUT_MS) -> None:
    page.wait_for_selector(f".page-head [data-status={status}]", timeout=timeout)


def read_key(server: ServerProcess) -> str:
    with server.client() as c:
        r = c.post("/v1/api-keys", json={"name": "viewer", "scope": "read"})
        assert r.status_code == 201, r.text
        key: str = r.json()["data"]["key"]
        return key


def test_a_users_day_in_the_console(browser: Any, server: ServerProcess) -> None:
    shots = artifacts_dir()
    recorder = Recorder(server.url)
    page = new_page(browser, server, recorder)

    # A wrong key is refused, on the key's field; the page stays signed out.
    page.fill("#api-key", "gy_" + "x" * 40)
    page.click("form button[type=submit]")
    error = page.wait_for_selector(".field-error")
    assert "invalid or revoked API key" in error.inner_text()
    assert page.locator("#api-key").get_attribute("aria-invalid") == "true"
    assert not page.context.cookies()
    page.screenshot(path=str(shots / "console-signin.png"))

    sign_in(page, server.key)
    cookie = next(c for c in page.context.cookies() if c["name"] == "gpuyard_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert server.key not in page.content()
    assert server.key not in str(page.evaluate("JSON.stringify(localStorage)"))

    # Create from the form: an error from the API lands on the field it names.
    page.click("[data-testid=new-cluster]")
    page.wait_for_selector("#f-docker_image")
    page.select_option("#f-gpu_type", "NVIDIA RTX A6000")
    page.fill("#f-gpu_count", "1")
    assert "$0.760/h" in page.inner_text("[data-testid=estimate]")
    page.fill("#f-gpu_count", "2")
    assert "$1.52/h" in page.inner_text("[data-testid=estimate]")
    # Then the whole rate, quoted by the API (compute, disks and volume included).
    sync_api.expect(page.locator("[data-testid=estimate]")).to_contain_text(
        "running (GPUs $1.52/h)"
    )
    quoted = page.inner_text("[data-testid=estimate]")
    assert "(GPUs $1.52/h)" in quoted and "stopped" in quoted, quoted
    page.fill("#f-gpu_count", "1")
    page.fill("#f-docker_image", WEB_IMAGE)
    page.fill("#f-volume_gb", "1")
    page.fill("#f-memory_gb", "99999")
    page.click("[data-testid=add-port]")
    page.fill(".port-num", "8888")
    page.click("[data-testid=create-submit]")
    refused = page.wait_for_selector(".field-error")
    assert refused.inner_text() == "Memory (GB): at most 16384"  # in words, from the reason
    assert page.locator("#f-memory_gb").get_attribute("aria-invalid") == "true"
    page.fill("#f-memory_gb", "4")
    page.screenshot(path=str(shots / "console-create.png"), full_page=True)
    page.click("[data-testid=create-submit]")
    page.wait_for_url(re.compile(r"#/clusters/(?!new$)[a-z0-9]+$"))
    cluster_id = page.url.rsplit("/", 1)[1]
    wait_status(page, "running")
    page.wait_for_selector("[data-port='8888']")
    page.screenshot(path=str(shots / "console-detail.png"), full_page=True)

    # The list shows it, live.
    page.goto(server.url + "/#/clusters")
    row = page.wait_for_selector(f"tr[data-cluster='{cluster_id}']")
    assert "RTX A6000 \u00d7 1" in row.inner_text() and "running" in row.inner_text()
    page.screenshot(path=str(shots / "console-clusters.png"), full_page=True)
    page.click(f"tr[data-cluster='{cluster_id}'] a")
    wait_status(page, "running")

    # A read-only key sees the same cluster with no button that would fail.
    viewer = new_page(browser, server, recorder)
    sign_in(viewer, read_key(server))
    assert viewer.locator("[data-testid=new-cluster]").count() == 0
    viewer.goto(f"{server.url}/#/clusters/{cluster_id}")
    wait_status(viewer, "running")
    viewer.wait_for_selector("[data-port='8888']", state="attached")
    assert viewer.locator("[data-action]").count() == 0
    assert viewer.locator("[data-testid=open-terminal]").count() == 0
    assert viewer.locator("[data-port='8888']").is_disabled()
    assert page.locator("[data-action=stop]").count() == 1
    viewer.context.close()

    # The proxy button opens the private port in a new tab through a one-time link.
    with page.context.expect_page() as opened:
        page.click("[data-port='8888']")
    tab = opened.value
    tab.wait_for_load_state()
    tab.wait_for_selector("text=gpuyard web test server", timeout=30_000)
    assert urlsplit(tab.url).hostname == f"{cluster_id}-8888.proxy.localhost"
    tab.close()

    # The web terminal (xterm.js): a command, the size the shell sees and how it
    # follows the window, and a full-screen program drawn on it.
    page.click("[data-testid=open-terminal]")
    # Locator assertions, not wait_for_function: the page's CSP forbids eval.
    sync_api.expect(page.locator("[data-testid=terminal-state]")).to_have_text("connected")
    rows = page.locator("[data-testid=terminal-output] .xterm-rows")
    page.click("[data-testid=terminal-output]")
    page.keyboard.type("echo hi\n")
    sync_api.expect(rows).to_have_text(re.compile(r"(^|\n)hi\s*\n"), use_inner_text=True)
    page.keyboard.type("clear; stty size\n")
    size = re.compile(r"(?:^|\n)\s*(\d+) (\d+)\s*\n")
    sync_api.expect(rows).to_have_text(size, use_inner_text=True)
    found = size.search(rows.inner_text())
    assert found is not None
    wide = int(found.group(2))
    page.set_viewport_size({"width": 760, "height": 900})
    page.keyboard.type("clear; stty size\n")
    narrower = re.compile(rf"(?:^|\n)\s*{found.group(1)} (?!{wide}\b)(\d+)\s*\n")
    sync_api.expect(rows).to_have_text(narrower, use_inner_text=True)
    page.keyboard.type("top\n")
    sync_api.expect(rows).to_have_text(re.compile(r"PID\s+PPID|PID\s+USER"), use_inner_text=True)
    page.set_viewport_size({"width": 1280, "height": 900})  # top redraws at the new size
    sync_api.expect(rows).to_have_text(re.compile(r"PID\s+PPID|PID\s+USER"), use_inner_text=True)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(shots / "console-terminal.png"), full_page=True)
    page.keyboard.press("q")

    # Stop, then start with more memory: the answer's changes and rate delta show.
    page.click("[data-action=stop]")
    wait_status(page, "stopped")
    page.click("[data-action=start-with-changes]")
    page.fill("#s-memory_gb", "8")
    page.click("[data-testid=start-changes] button[type=submit]")
    delta = page.wait_for_selector("[data-testid=cost-delta]").inner_text()
    assert f"(+${4 * MEMORY_PRICE:.3f}/h)" in delta, delta
    assert "memory_gb" in page.inner_text("[data-testid=start-result]")
    wait_status(page, "running")
    page.screenshot(path=str(shots / "console-started-with-changes.png"), full_page=True)

    page.click("[data-action=terminate]")
    wait_status(page, "terminated")

    page.click("[data-testid=sign-out]")
    page.wait_for_selector("#api-key")
    assert not [c for c in page.context.cookies() if c["name"] == "gpuyard_console"]

    # Every call the pages made is a public API route.
    templates = route_templates(server)
    called = {
        (method, path)
        for method, path in recorder.calls
        if path != "/" and not path.startswith("/console/")
    }
    strays = [
        f"{method} {path}"
        for method, path in sorted(called)
        if not any(m == method and p.match(path) for m, p, _ in templates)
    ]
    assert not strays, f"the console called routes outside the public API: {strays}"
    used = {t for m, p, t in templates for method, path in called if m == method and p.match(path)}
    assert "/v1/clusters/{cluster_id}/start" in used and "/v1/console/session" in used
