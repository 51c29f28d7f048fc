"""The console's browser tests use the e2e suite's real engine (a private Podman
service and the offline images). A failed browser test leaves what it saw behind: a
screenshot of each page it opened (in the artifacts folder) and the end of the
server's log (in the report)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import engine_url

__all__ = ["engine_url"]

# Pages opened by the running test (test_console_e2e.new_page adds them).
OPEN_PAGES: list[Any] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _evidence_of_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    OPEN_PAGES.clear()
    yield
    if not request.node.stash.get(_FAILED, False):
        return
    from tests.console.test_console_e2e import artifacts_dir

    shots = artifacts_dir()
    for n, page in enumerate(OPEN_PAGES):
        try:
            page.screenshot(path=str(shots / f"failed-{request.node.name}-{n}.png"))
            print(f"page {n}: {page.url}\n{page.content()[:2000]}")
        except Exception as exc:  # the page may be gone: say so, do not mask the failure
            print(f"page {n}: no screenshot ({exc})")
    server = request.node.funcargs.get("server")
    if server is not None:
        print("server log (end):\n" + server.log_tail(6000))
