"""The plan view renders in a real headless Chromium: chart elements present, no console errors."""

from __future__ import annotations

import shutil
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from service.app import create_app
from tests.conftest import make_settings
from tests.service.graphs import diamond_graph, plan_request

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def live_server(database_url):
    """The app under a real uvicorn on a loopback port, authentication off (a browser sends no key)."""
    port = _free_port()
    app = create_app(make_settings(database_url, auth="disabled"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    yield base
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("chromium and chromedriver are not installed (make browser-deps)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_the_plan_view_draws_the_gantt_memory_links_and_candidates(live_server, browser):
    from selenium.webdriver.common.by import By

    plan = httpx.post(
        f"{live_server}/v1/plans", json=plan_request(diamond_graph("browser"), nodes=2, micro_batches=2), timeout=120
    ).json()
    browser.get(f"{live_server}/v1/plans/{plan['id']}/view")
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-rendered") == "true"
    bars = browser.find_elements(By.CSS_SELECTOR, "#gantt rect.op")
    assert len(bars) == len(plan["ops"])
    assert browser.find_elements(By.CSS_SELECTOR, "#memory rect.mem-bar")
    candidate_rows = browser.find_elements(By.CSS_SELECTOR, "#candidates tbody tr")
    assert len(candidate_rows) == len(plan["candidates"])
    assert browser.find_elements(By.CSS_SELECTOR, "#links tbody tr")
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []


def test_names_that_hold_markup_are_shown_as_text_and_run_nothing(live_server, browser):
    from selenium.webdriver.common.by import By

    markup = "</script><script>window.pwned = 1</script><!--<script>"
    graph = diamond_graph("markup")
    graph["name"] = markup
    graph["nodes"][0]["name"] = markup
    plan = httpx.post(f"{live_server}/v1/plans", json=plan_request(graph), timeout=120).json()
    browser.get(f"{live_server}/v1/plans/{plan['id']}/view")
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-rendered") == "true"
    assert browser.execute_script("return window.pwned === undefined")
    shown = browser.execute_script("return JSON.parse(document.getElementById('plan-data').textContent)")
    assert any(bar[3] == markup for bar in shown["gantt"])
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_the_plan_view_lists_the_plans_notes_and_the_graphs_warnings(live_server, browser):
    from selenium.webdriver.common.by import By

    graph = diamond_graph("caveats")
    del graph["nodes"][3]["flops"]  # the join has neither FLOPs nor shapes: the importer warns
    plan = httpx.post(f"{live_server}/v1/plans", json=plan_request(graph), timeout=120).json()
    assert plan["notes"] and plan["warnings"]
    browser.get(f"{live_server}/v1/plans/{plan['id']}/view")
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-rendered") == "true"
    assert browser.find_element(By.ID, "caveats").is_displayed()
    shown_notes = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#notes li")]
    shown_warnings = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#warnings li")]
    assert shown_notes == plan["notes"]
    assert shown_warnings == [f"graph warning: {warning}" for warning in plan["warnings"]]


def test_the_plan_view_hides_the_caveats_section_of_a_plan_without_any(live_server, browser):
    from selenium.webdriver.common.by import By

    graph = diamond_graph("no-caveats")
    for tensor in graph["tensors"]:
        tensor.pop("dtype", None)  # nothing declared in another dtype than the one timing the plan
    plan = httpx.post(f"{live_server}/v1/plans", json=plan_request(graph), timeout=120).json()
    assert plan["notes"] == [] and plan["warnings"] == []
    browser.get(f"{live_server}/v1/plans/{plan['id']}/view")
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-rendered") == "true"
    assert not browser.find_element(By.ID, "caveats").is_displayed()
