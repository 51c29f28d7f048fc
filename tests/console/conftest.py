"""The console's browser tests use the e2e suite's real engine (a private Podman
service and the offline images). A failed browser test leaves what it saw behind: a
screenshot of each page it opened (in the artifacts folder), and each page's address,
what its scripts logged or threw, the requests that failed, and the end of the server's
log in the report. Every page a test opened is closed
after it, so its polling, log streams and terminals stop loading the shared server."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import engine_url

__all__ = ["engine_url"]

# Pages opened by the running test (watch() adds them), and what they went through.
OPEN_PAGES: list[Any] = []
PAGE_LOG: deque[str] = deque(maxlen=200)


def watch(page: Any) -> None:
    """Keep ``page`` for the evidence of a failure: it is screenshotted, and its
    console messages, uncaught errors and failed requests are reported."""
    n = len(OPEN_PAGES)
    OPEN_PAGES.append(page)
    page.on("console", lambda m: PAGE_LOG.append(f"page {n} console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: PAGE_LOG.append(f"page {n} error: {e}"))
    page.on(
        "requestfailed",
        lambda r: PAGE_LOG.append(f"page {n} failed {r.method} {r.url}: {r.failure}"),
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        # Right after the test, before fixtures close its pages.
        report.sections.append(("evidence", _evidence(item)))


def _evidence(item: pytest.Item) -> str:
    from tests.console.test_console_e2e import artifacts_dir

    lines = []
    shots = artifacts_dir()
    for n, page in enumerate(OPEN_PAGES):
        try:
            page.screenshot(path=str(shots / f"failed-{item.name}-{n}.png"))
            lines.append(f"page {n}: {page.url} (screenshot failed-{item.name}-{n}.png)")
        except Exception as exc:  # the page may be gone: say so, never mask the failure
            lines.append(f"page {n}: no screenshot ({exc})")
    lines.append("what the pages went through (last lines):")
    lines.extend(PAGE_LOG or ["(nothing)"])
    server = getattr(item, "funcargs", {}).get("server")
    if server is not None:
        lines.append("server log (end):\n" + server.log_tail(6000))
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def _pages_of_one_test() -> Iterator[None]:
    OPEN_PAGES.clear()
    PAGE_LOG.clear()
    yield
    for page in OPEN_PAGES:
        # Closed already, perhaps (by the test, or with its browser).
        with contextlib.suppress(Exception):
            page.context.close()
    OPEN_PAGES.clear()
    PAGE_LOG.clear()
