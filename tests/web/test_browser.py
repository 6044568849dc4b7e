"""The dashboard in a real headless Chromium (Debian's `chromium`, driven by
Playwright): an operator logs in, finds a task in error, retries it with a reason
and watches it reach processed without reloading; an anonymous visitor is sent
to the login page; a task id or input holding ``<script>`` shows as text.

With SASFLOW_SCREENSHOTS=DIR the main pages are saved there as PNG files (`make
screenshots` writes docs/images/).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from sasflow import App, TaskState
from sasflow.web.app import create_app
from support.web import OPERATOR_TOKEN, USERS, serving

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HOSTILE = "<script>window.pwned = 1</script>"
WAIT_MS = 120_000  # a hang guard for a loaded 2-core machine, not a claim about speed


@pytest.fixture
def server(shop: App) -> Iterator[str]:
    """The dashboard on a real loopback port."""
    with serving(create_app(shop, USERS)) as url:
        yield url


@pytest.fixture
def browser() -> Iterator[Callable[[], Browser]]:
    """Starts Chromium when called: Playwright's sync API runs an event loop in this
    thread, so the test makes its tasks (through the App's blocking methods) first."""
    if not os.path.exists(CHROMIUM):
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ": .ci/run installs it")
        pytest.skip(message)
    started: list[Playwright] = []

    def launch() -> Browser:
        started.append(sync_playwright().start())
        return started[-1].chromium.launch(executable_path=CHROMIUM, headless=True,
                                           args=["--no-sandbox"])

    yield launch
    for playwright in started:
        playwright.stop()


def _screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("SASFLOW_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def _log_in(page: Page, server: str) -> None:
    page.goto(f"{server}/")
    assert "/login" in page.url  # an anonymous visitor is sent to the login page
    page.fill("input[name=name]", "otto")
    page.fill("input[name=token]", OPERATOR_TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server}/", timeout=WAIT_MS)


@pytest.mark.parametrize("shop", ["sqlite"], indirect=True)
def test_an_operator_retries_a_task_in_error_and_watches_it_finish(
        shop: App, server: str, browser: Callable[[], Browser],
        tmp_path: Path) -> None:
    fixed = tmp_path / "card-replaced"
    for n in range(3):
        shop.submit("order", {"order": n}, task_id=f"fine-{n}")
    failing = shop.submit("order", {"decline_until": str(fixed)}, task_id="order-declined")
    assert shop.wait(failing, timeout=120).state is TaskState.ERROR
    page = browser().new_page(viewport={"width": 1280, "height": 800})
    _log_in(page, server)
    _screenshot(page, "overview")
    page.click("a.count.state-error")  # the overview's count of tasks in error
    page.wait_for_selector("text=order-declined", timeout=WAIT_MS)
    _screenshot(page, "tasks")
    page.click("text=order-declined")
    assert page.inner_text("#task-state") == "error"
    assert "card declined" in page.inner_text("main")
    _screenshot(page, "task-in-error")
    fixed.touch()  # the cause is fixed; now the operator retries
    page.fill(".actions .reason", "the customer replaced the card")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button[data-action=retry]")
    # no reload: the page's own refresh shows it moving to the end
    page.wait_for_function("document.getElementById('task-state')?.textContent === 'processed'",
                           timeout=WAIT_MS)
    history = page.inner_text("table.history")
    assert "operator:otto" in history and "the customer replaced the card" in history
    _screenshot(page, "task-retried")
    page.goto(f"{server}/instances")
    page.wait_for_selector("text=live", timeout=WAIT_MS)
    _screenshot(page, "instances")


@pytest.mark.parametrize("shop", ["sqlite"], indirect=True)
def test_script_in_a_task_id_or_input_is_shown_as_text(
        shop: App, server: str, browser: Callable[[], Browser]) -> None:
    shop.submit("restock", {"note": HOSTILE}, task_id=HOSTILE)
    assert shop.wait(HOSTILE, timeout=120).state is TaskState.PROCESSED
    page = browser().new_page()
    _log_in(page, server)
    page.goto(f"{server}/tasks?workflow=restock")
    link = page.get_by_text(HOSTILE, exact=True)
    link.wait_for(timeout=WAIT_MS)
    link.click()
    page.wait_for_selector("code.task-id", timeout=WAIT_MS)
    assert page.inner_text("code.task-id") == HOSTILE
    assert HOSTILE in page.inner_text("pre.input")
    page.wait_for_timeout(0)  # let any script that got in run before asking
    assert page.evaluate("window.pwned") is None
