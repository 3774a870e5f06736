"""The dashboard in a real browser: Debian's headless Chromium driven by
Selenium through the system chromedriver. Load the overview, open a queue,
open a dead job, requeue it, and see the counts change, with htmx's refresh
and without a reload; open the workers page and stop a worker. PYALK_SCREENSHOTS=<dir>
saves the overview, the job page and the workers page there (docs/img/ holds
the ones docs/dashboard.md shows)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from tests.dashboard.conftest import GONE, HOSTILE, Registered

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,860")

webdriver = pytest.importorskip("selenium.webdriver", reason="the browser tests need selenium (pyalk[test])")
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(f"no headless Chromium here ({CHROMIUM}, {CHROMEDRIVER}): apt-get install chromium chromium-driver",
                allow_module_level=True)

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


@pytest.fixture
def browser() -> Iterator[Any]:
    profile = tempfile.mkdtemp(prefix="pyalk-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def cell(driver: Any, queue: str, column: str) -> str:
    """One counter of the overview, read in one script call: htmx swaps the
    table every few seconds, so element handles held across calls go stale."""
    text = driver.execute_script(
        "for (const row of document.querySelectorAll('tr[data-queue]')) {"
        "  if (row.dataset.queue === arguments[0]) return row.querySelector('td.' + arguments[1]).textContent.trim();"
        "} return null;", queue, column)
    assert text is not None, f"no row for queue {queue!r}"
    return str(text)


def click(driver: Any, by: str, value: str) -> None:
    """Click an element, finding it again if an htmx swap replaced it meanwhile."""
    def attempt() -> bool:
        try:
            driver.find_element(by, value).click()
        except StaleElementReferenceException:
            return False
        return True
    wait_for(attempt, f"a click on {value!r}")


def shoot(driver: Any, name: str) -> None:
    target = os.environ.get("PYALK_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(target) / name))


def test_overview_queue_dead_job_requeue_and_the_counts_change(browser, live_server, db, seeded):
    browser.get(live_server + "/")
    assert browser.title == "overview · pyalk"
    # The hostile queue's name is text on the page, and no script came with it
    # (an alert() would also fail the next driver command).
    assert HOSTILE in browser.find_element(By.TAG_NAME, "main").text
    assert browser.find_elements(By.XPATH, "//script[not(@src)]") == []
    assert cell(browser, HOSTILE, "dead") == "1"
    wait_for(lambda: browser.execute_script("return typeof window.htmx === 'object'"), "htmx to load")
    shoot(browser, "dashboard-overview.png")

    # htmx refreshes the overview in place: a change in the database shows without a reload.
    marker = browser.execute_script("window.pyalkMarker = 42; return window.pyalkMarker")
    db.execute("SELECT alk.enqueue_batch('emails', array_agg('{}'::jsonb)) FROM generate_series(1, 5)")
    wait_for(lambda: cell(browser, "emails", "ready") == "33", "the refreshed ready count")
    assert browser.execute_script("return window.pyalkMarker") == marker

    click(browser, By.LINK_TEXT, HOSTILE)
    wait_for(lambda: "queue" in browser.title, "the queue page")
    click(browser, By.LINK_TEXT, "dead")
    wait_for(lambda: browser.find_elements(By.LINK_TEXT, str(seeded.dead_id)), "the dead job's row")
    click(browser, By.LINK_TEXT, str(seeded.dead_id))
    wait_for(lambda: browser.title.startswith("job "), "the job page")
    assert browser.find_element(By.ID, "job-state").text == "dead"
    assert "<img src=x onerror=alert(3)>" in browser.find_element(By.CSS_SELECTOR, "pre.err").text
    assert '"x": "<script>alert(2)</script>"' in browser.find_element(By.CSS_SELECTOR, "pre.json").text
    shoot(browser, "dashboard-job.png")

    browser.find_element(By.XPATH, "//button[normalize-space()='Requeue this job']").click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "p.flash"), "the confirmation")
    assert "requeued 1 dead job" in browser.find_element(By.CSS_SELECTOR, "p.flash").text
    assert browser.find_element(By.ID, "job-state").text == "pending"

    browser.get(live_server + "/")
    assert cell(browser, HOSTILE, "dead") == "0"
    assert cell(browser, HOSTILE, "ready") == "1"
    assert db.execute("SELECT dead FROM alk.queue_stats(%s)", [HOSTILE]).fetchone()[0] == 0


def test_the_job_browser_pages_forward_in_the_browser(browser, live_server, db):
    db.execute("SELECT alk.enqueue_batch('bulk', array_agg(jsonb_build_object('n', i))) FROM generate_series(1, 120) i")
    browser.get(live_server + "/queue?name=" + quote("bulk"))
    ids: list[str] = []
    while True:
        ids += [a.text for a in browser.find_elements(By.CSS_SELECTOR, "table.jobs td.n a")]
        more = browser.find_elements(By.CSS_SELECTOR, "a[rel=next]")
        if not more:
            break
        more[0].click()
        wait_for(lambda: browser.execute_script("return document.readyState") == "complete", "the next page")
    assert len(ids) == 120 and len(set(ids)) == 120
    assert [int(i) for i in ids] == sorted(int(i) for i in ids)  # equal priority and run_at: id order


def worker_state(driver: Any, worker_id: str) -> str | None:
    """A worker's state on the workers page, read in one script call (htmx swaps the table)."""
    state = driver.execute_script(
        "for (const row of document.querySelectorAll('tr[data-worker]')) {"
        "  if (row.dataset.worker === arguments[0]) return row.dataset.state;"
        "} return null;", worker_id)
    return None if state is None else str(state)


def test_the_workers_page_stops_a_worker_and_the_worker_hears_it(browser, live_server, dsn,
                                                                  registered: Registered):
    with psycopg.connect(dsn, autocommit=True) as listener:
        # What a worker does with the channel alk.worker_register returned.
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(registered.channels["emails-1"])))
        browser.get(live_server + "/")
        click(browser, By.LINK_TEXT, "workers")
        wait_for(lambda: browser.title == "workers · pyalk", "the workers page")
        assert HOSTILE in browser.find_element(By.TAG_NAME, "main").text  # an id shown as text, no script run
        assert browser.find_elements(By.XPATH, "//script[not(@src)]") == []
        assert [worker_state(browser, w) for w in ("emails-1", HOSTILE, GONE)] == ["running", "running", "gone"]

        click(browser, By.CSS_SELECTOR, 'tr[data-worker="emails-1"] button')
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "p.flash"), "the confirmation")
        assert browser.find_element(By.CSS_SELECTOR, "p.flash").text == "asked the worker to stop"
        assert worker_state(browser, "emails-1") == "stopping"
        assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-worker="emails-1"] button') == []
        assert worker_state(browser, "emails-2") == "running"
        wait_for(lambda: browser.execute_script("return typeof window.htmx === 'object'"), "htmx to load")
        shoot(browser, "dashboard-workers.png")

        heard = list(listener.notifies(timeout=10, stop_after=1))
    assert [(n.channel, n.payload) for n in heard] == [(registered.channels["emails-1"], "stop")]
