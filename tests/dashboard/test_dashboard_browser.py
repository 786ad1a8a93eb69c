"""Every dashboard page in headless Chromium (Debian's chromium and chromium-driver, Selenium).

The repository is filled by real job runs (tests/dashboard/conftest.py) and the app is served on
a free loopback port in a thread. The DOM is checked for names, statuses, counts and the progress
chart's points; planted HTML must come out as text with no script element created, and the
stylesheet must apply under the Content-Security-Policy. Screenshots go to the test's tmp_path;
with PYBATCH_UPDATE_SCREENSHOT=1 the execution page's replaces docs/images/dashboard.png.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from tests.dashboard.conftest import (
    EXTRACT_ROWS,
    FAILING_PARTITION,
    HOSTILE_MESSAGE,
    HOSTILE_NAME,
    HOSTILE_PARAMETER,
    HOSTILE_VALUE,
    PARTITIONS,
    SECRET,
    Seeded,
    Served,
)

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard.png"


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        if os.environ.get("CI"):
            pytest.fail("CI installs chromium and chromium-driver (.ci/run)")
        pytest.skip("needs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    # An explicit driver path: Selenium Manager downloads nothing.
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


class Pages:
    """Loads dashboard pages and keeps a screenshot of each."""

    def __init__(self, driver: webdriver.Chrome, served: Served, shots: Path) -> None:
        self.driver = driver
        self.url = served.url
        self.shots = shots
        shots.mkdir(exist_ok=True)

    def open(self, path: str, shot: str) -> webdriver.Chrome:
        self.driver.get(self.url + path)
        assert "Error" not in self.driver.title, self.driver.find_element(By.TAG_NAME, "main").text
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1280, max(int(height) + 40, 600))
        self.driver.save_screenshot(str(self.shots / f"{shot}.png"))
        assert not self.driver.find_elements(By.TAG_NAME, "script")
        return self.driver

    def texts(self, selector: str) -> list[str]:
        return [e.text for e in self.driver.find_elements(By.CSS_SELECTOR, selector)]


def _cells(row: WebElement) -> list[str]:
    return [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]


def test_every_page_renders_the_recorded_runs(
    seeded: Seeded, served: Served, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    pages = Pages(browser, served, tmp_path / "screenshots")

    # Jobs: names in byte order, the latest status, the run-history strip newest first.
    pages.open("/", "jobs")
    assert pages.texts("#jobs tr.job td.job-name") == sorted(
        [HOSTILE_NAME, "nightly_orders", "orphaned_export", "partitioned_load", "stuck_export"]
    )
    rows = {
        row.find_element(By.CSS_SELECTOR, "td.job-name").text: row
        for row in browser.find_elements(By.CSS_SELECTOR, "#jobs tr.job")
    }
    assert _cells(rows["nightly_orders"])[2] == "COMPLETED"
    assert _cells(rows["partitioned_load"])[2] == "FAILED"
    assert _cells(rows["stuck_export"])[2] == "STARTED"
    strip = rows["nightly_orders"].find_elements(By.CSS_SELECTOR, ".history .run")
    assert [run.get_attribute("data-status") for run in strip] == [
        "COMPLETED",
        "FAILED",
        "COMPLETED",
    ]
    # The orphan's strip shows both attempts: the recovered one FAILED.
    orphan_strip = rows["orphaned_export"].find_elements(By.CSS_SELECTOR, ".history .run")
    assert [run.get_attribute("data-status") for run in orphan_strip] == ["COMPLETED", "FAILED"]
    # The stylesheet applied (the CSP allows 'self'): a FAILED run is drawn red.
    assert strip[1].value_of_css_property("background-color") == "rgba(207, 34, 46, 1)"

    # A job's instances with their identifying parameter values, newest first.
    rows["nightly_orders"].find_element(By.CSS_SELECTOR, "td.job-name a").click()
    pages.open(browser.current_url.removeprefix(served.url), "instances")
    instances = browser.find_elements(By.CSS_SELECTOR, "#instances tr.instance")
    assert len(instances) == 3
    assert pages.texts("#instances tr.instance td.parameters")[0] == (
        "business_date=2026-12-01, run.id=3"
    )
    pages.open("/job?name=nightly_orders&param=region=eu", "instances-filtered")
    assert not browser.find_elements(By.CSS_SELECTOR, "#instances tr.instance")

    # An instance's executions: the newest instance holds the third run.
    pages.open("/job?name=nightly_orders", "instances-again")
    browser.find_element(By.CSS_SELECTOR, "#instances tr.instance td a").click()
    assert pages.texts("table.executions tbody td:nth-child(1)") == [str(seeded.nightly[2])]
    assert pages.texts("table.executions tbody td:nth-child(5)") == ["COMPLETED"]

    # The failed attempt: status, failure reason, timeline, progress chart points.
    pages.open(f"/executions/{seeded.nightly[1]}", "execution-failed")
    assert browser.find_element(By.ID, "execution-status").text == "FAILED (exit FAILED)"
    assert pages.texts("#steps td.step-name") == ["extract", "transform"]
    assert pages.texts("#steps td.count.read") == [str(EXTRACT_ROWS), "10"]
    reasons = pages.texts("#failure-reasons .reason")
    assert any("disk full while loading" in reason for reason in reasons)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#timeline g.timeline-step")) == 2
    points = browser.find_elements(By.CSS_SELECTOR, "#progress circle.point.read")
    assert [(p.get_attribute("data-step"), p.get_attribute("data-count")) for p in points] == [
        ("extract", str(EXTRACT_ROWS)),
        ("transform", "10"),
    ]
    # 100 is the chart's top (y 40), 10 a tenth of the way up from its bottom (y 160).
    assert [float(p.get_attribute("cy") or "nan") for p in points] == [40.0, 148.0]
    line = browser.find_element(By.CSS_SELECTOR, "#progress polyline.read")
    assert line.get_attribute("points") == "40.0,40.0 600.0,148.0"

    # A completed attempt: the docs' screenshot.
    pages.open(f"/executions/{seeded.nightly[0]}", "execution")
    assert pages.texts("#steps td.count.written") == [str(EXTRACT_ROWS), "45"]
    assert browser.find_element(By.ID, "no-decisions").text == "No recovery decisions."
    if os.environ.get("PYBATCH_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(pages.shots / "execution.png", DOCS_SCREENSHOT)

    # The orphan: recorded FAILED by the next launch, with its recovery decision.
    pages.open(f"/executions/{seeded.orphan}", "execution-recovered")
    decisions = browser.find_elements(By.CSS_SELECTOR, "#decisions tr.decision")
    assert [_cells(row)[1:4] for row in decisions] == [["STARTED", "FAILED", "OWNER_LOST"]]

    # The partitioned step as a grid coloured by status.
    pages.open(f"/executions/{seeded.partitioned}", "execution-partitioned")
    browser.find_element(By.CSS_SELECTOR, "a.partitions-link").click()
    pages.open(browser.current_url.removeprefix(served.url), "partitions")
    cells = browser.find_elements(By.CSS_SELECTOR, "#partitions .partition")
    assert len(cells) == PARTITIONS
    statuses = {c.get_attribute("data-key"): c.get_attribute("data-status") for c in cells}
    assert statuses.pop(FAILING_PARTITION) == "FAILED"
    assert set(statuses.values()) == {"COMPLETED"}
    failed = browser.find_element(By.CSS_SELECTOR, f'.partition[data-key="{FAILING_PARTITION}"]')
    assert failed.value_of_css_property("background-color") == "rgba(207, 34, 46, 1)"
    assert browser.find_element(By.ID, "partition-counts").text == "COMPLETED 5, FAILED 1"

    # Unresolved: the run left STARTED two hours ago, not the recovered orphan.
    pages.open("/unresolved", "unresolved")
    listed = pages.texts("table.executions tbody td:nth-child(1)")
    assert listed == [str(seeded.stuck)]

    # The audit chain, as `pybatch audit verify` reports it.
    pages.open("/audit", "audit")
    assert browser.find_element(By.ID, "audit-state").text.startswith("audit chain intact: ")
    assert int(browser.find_element(By.ID, "audit-links").text) >= 1

    # Auto-refresh only when asked.
    pages.open("/?refresh=30", "jobs-refresh")
    meta = browser.find_elements(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')
    assert [m.get_attribute("content") for m in meta] == ["30"]


def test_planted_html_is_shown_as_text_and_never_runs(
    seeded: Seeded, served: Served, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    pages = Pages(browser, served, tmp_path / "screenshots")
    pages.open("/", "jobs")
    assert HOSTILE_NAME in pages.texts("#jobs td.job-name")
    assert browser.title == "Jobs - pybatch"

    link = browser.find_element(By.LINK_TEXT, HOSTILE_NAME)
    link.click()
    pages.open(browser.current_url.removeprefix(served.url), "hostile-instances")
    assert pages.texts("#instances .parameter-name") == [HOSTILE_PARAMETER]
    assert browser.title == f"Instances of {HOSTILE_NAME} - pybatch"
    # The planted <script> and <img onerror> value is text: no element, nothing ran.
    assert pages.texts("#instances .parameter-value") == [HOSTILE_VALUE]
    assert not browser.find_elements(By.TAG_NAME, "img")
    assert not browser.find_elements(By.CSS_SELECTOR, "#instances script")
    assert SECRET not in browser.page_source

    pages.open(f"/executions/{seeded.hostile}", "hostile-execution")
    reasons = pages.texts("#failure-reasons .reason")
    assert any(HOSTILE_MESSAGE in reason for reason in reasons), reasons
    assert browser.title == f"Execution {seeded.hostile} - pybatch"
    assert not browser.find_elements(By.TAG_NAME, "img")
