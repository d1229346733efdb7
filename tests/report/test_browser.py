"""The report page in a real headless Chromium: loads without console errors, every chart renders,
the screenshot is not blank, and hostile names from the store are shown as text, never run."""
from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from wkvlab.report import load_profile, write_report
from tests.report.helpers import demo_like_grid, profile_payload

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
HOSTILE_MODEL = "<script>alert(1)</script>"
HOSTILE_DATA = "<img src=x onerror=alert(2)>"
# Without the networking flags Chromium tries to reach Google's services; on a closed machine those
# connections are refused and logged, which would read as console errors of the page.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1280,2000")

# Skipped on a machine without Chromium, but never in CI (CI=true), where 'make install' has put it there.
pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()) and not os.environ.get("CI"),
                                reason="Chromium missing: make test installs chromium and chromium-driver when run as root on Debian/Ubuntu; otherwise: sudo apt-get install chromium chromium-driver")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("browser")
    results = demo_like_grid(HOSTILE_MODEL)
    for r in results:
        r.data = HOSTILE_DATA
    profile = tmp / "profile.json"
    profile.write_text(json.dumps(profile_payload(HOSTILE_MODEL)))
    return write_report(results, tmp / "report", source="synthetic", profiles=[load_profile(profile)]).page


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_rendered(driver, expected: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.execute_script("return document.body && document.body.getAttribute('data-charts-rendered')") == str(expected):
            return
        time.sleep(0.1)
    pytest.fail(f"charts did not render within {timeout} s")


def test_page_renders_charts_without_errors_and_escapes_names(report, browser):
    from PIL import Image
    from selenium.common.exceptions import NoAlertPresentException

    browser.get(report.as_uri())
    _wait_rendered(browser, 4)
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # an executed <script>/onerror from the store would have raised an alert

    # Every chart drew its SVG with the data points: markers per config, a line per position curve, heatmap cells.
    count = browser.execute_script
    assert count("return document.querySelectorAll('#g0-memory .main-svg').length") >= 1
    assert count("return document.querySelectorAll('#g0-memory .scatterlayer .point').length") >= 12  # 12 configs (+ the front's points)
    assert count("return document.querySelectorAll('#g0-penalty .scatterlayer .point').length") == 9  # 3 weights × 3 quantized KV
    assert count("return document.querySelectorAll('#g0-position .scatterlayer .trace').length") == 12
    assert count("return document.querySelectorAll('#profile0-sensitivity .heatmaplayer image, #profile0-sensitivity .hm image').length") >= 1

    # Hostile names are text: in the heading, the table, and plotly's own title markup.
    assert HOSTILE_MODEL in count("return document.querySelector('h2').textContent")
    assert HOSTILE_DATA in count("return document.querySelector('h2').textContent")
    assert HOSTILE_MODEL in count("return document.querySelector('#profile0-sensitivity .gtitle').textContent")
    assert count("return document.querySelectorAll('img').length") == 0
    assert count("return document.scripts.length") == 5  # plotly, three JSON blocks, the boot script: nothing injected

    # The screenshot is a page with charts, not a blank one: many colours, and the 4-bit/8-bit marker colours.
    shot = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
    pixels = np.asarray(shot).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 200
    assert (pixels.min(axis=1) < 200).mean() > 0.03  # well over a blank page's share of non-white pixels
    chart = np.asarray(Image.open(io.BytesIO(browser.find_element("id", "g0-memory").screenshot_as_png)).convert("RGB")).astype(int)
    for hex_color in ("#d62728", "#1f77b4"):  # 4-bit triangles and 8-bit diamonds are drawn
        rgb = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(chart - rgb).sum(axis=2) < 30).sum() > 20, hex_color


def test_page_has_no_network_references(report):
    text = report.read_text(encoding="utf-8")
    body = text.split("</head>", 1)[1]  # plotly.min.js mentions URLs in its code; the page itself must load none
    assert "http://" not in body and "https://" not in body
    assert "Content-Security-Policy" in text  # and the CSP forbids every request
