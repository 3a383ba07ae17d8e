"""The memory browser in a real headless Chromium against a real `amfs-server serve --transport http` with
API keys: log in, browse, open an entry, its confidence chart, search with explain, forget; and the
refusals (no key, a read-only key, a prefix key outside its prefix, markup in values rendered as text).

Skipped, with a loud reason, only when chromium/chromedriver/selenium are missing (scripts/test.sh installs them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amfs_server.core.models import Actor
from amfs_server.core.service import WriteRequest
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings
from amfs_server.session_bench.mcp_latency import HttpServer

from .browser import browser_problem, log_in, start_browser, wait_for, wait_until

ADMIN = "admin-key-0000000000000001"
READER = "reader-key-000000000000002"
TEAM_A = "team-a-key-000000000000003"
XSS_IMG = '<img src=x onerror="window.__amfsXss = 1">'
XSS_SCRIPT = "<script>window.__amfsXss = 2</script>"

_problem = browser_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_problem is not None, reason=f"!!! BROWSER TESTS SKIPPED: {_problem} !!!"),
]


def seed(data_dir: Path) -> None:
    async def main() -> None:
        service = build_service(load_settings({}, data_dir=data_dir, embedder="none"))
        await service.open()
        try:
            writer = Actor("agent/seed", "seed-session")
            await service.write_many(writer, [
                WriteRequest("team-a/payments", "retry-policy", {"retries": 3, "backoff": "linear"}),
                WriteRequest("team-a/payments", "timeout", "30 seconds for the payments gateway"),
                WriteRequest("team-a/payments/eu", "provider", "adyen handles eu payments"),
                WriteRequest("scratch", "obsolete", "an old note nobody needs"),
                WriteRequest("team-b/search", "index", "the search index rebuilds nightly at 02:00"),
                WriteRequest("team-b/search", "xss-img", XSS_IMG),
                WriteRequest("team-b/search", "xss-script", {"note": XSS_SCRIPT}),
            ])
            await service.write(writer, WriteRequest("team-a/payments", "retry-policy", {"retries": 5, "backoff": "exponential"}))
            for ref, kind in [("deploy-1", "success"), ("deploy-2", "success"), ("incident-3", "failure")]:
                await service.commit_outcome(writer, ref, kind, ["team-a/payments/retry-policy"])
            await service.commit_outcome(writer, "xss-outcome", "minor_failure", ["team-b/search/xss-img"])
        finally:
            await service.close()

    asyncio.run(main())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, launch_server: Callable[..., HttpServer]) -> Iterator[HttpServer]:
    data_dir = tmp_path_factory.mktemp("ui-browser")
    seed(data_dir)
    running = launch_server("http", data_dir, AMFS_API_KEYS=f"{ADMIN},{READER}:ro,{TEAM_A}:rw@team-a")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = start_browser()
    try:
        yield driver
    finally:
        driver.quit()


def by_css(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def api_status(driver: Any, method: str, path: str, key: str, body: dict | None = None) -> int:
    """An API call from inside the page (same origin), with `key` as the bearer token."""
    return driver.execute_async_script(
        """const [method, path, key, body, done] = arguments;
        fetch(path, {method, headers: {Authorization: 'Bearer ' + key, 'Content-Type': 'application/json'},
                     body: body ? JSON.stringify(body) : undefined}).then(r => done(r.status), e => done(String(e)));""",
        method, path, key, body,
    )


def open_entry(driver: Any, base_url: str, path: str, key: str) -> None:
    driver.get(f"{base_url}/ui/#/entry?path={path}&key={key}")
    wait_until(driver, lambda d: d.find_element("id", "entry-title").text == f"{path}/{key}")


def test_without_a_key_only_the_login_form_shows_and_a_wrong_key_is_refused(server: HttpServer, browser: Any) -> None:
    browser.get(server.base_url + "/ui/")
    wait_for(browser, "#login-key")
    assert not by_css(browser, "#nav")[0].is_displayed()
    assert by_css(browser, "#main")[0].text == ""
    by_css(browser, "#login-key")[0].send_keys("wrong-key-00000000000000000")
    by_css(browser, "#login-submit")[0].click()
    wait_until(browser, lambda d: "not accepted" in d.find_element("id", "login-error").text)
    assert browser.execute_script("return sessionStorage.getItem('amfs-ui-key')") is None
    assert api_status(browser, "GET", "/ui/api/tree", "") == 401


def test_a_read_write_key_logs_in_browses_opens_an_entry_and_its_chart_searches_and_forgets(
    server: HttpServer, browser: Any
) -> None:
    log_in(browser, server.base_url, ADMIN)
    assert browser.execute_script("return sessionStorage.getItem('amfs-ui-key')") == ADMIN
    assert browser.get_cookies() == [] and ADMIN not in browser.current_url
    assert by_css(browser, "#tree-total")[0].text.startswith("7 entries")
    team_a = wait_for(browser, 'li[data-path="team-a"]')
    assert team_a.find_element("css selector", ".count").text == "3"
    team_a.find_element("css selector", "button.toggle").click()
    wait_for(browser, 'li[data-path="team-a/payments"] > a').click()
    wait_for(browser, 'tr[data-entry="team-a/payments/retry-policy"] a').click()

    wait_until(browser, lambda d: d.find_element("id", "entry-title").text == "team-a/payments/retry-policy")
    assert '"retries": 5' in by_css(browser, "#entry-value")[0].text
    assert "v2 of 2" in by_css(browser, 'dd[data-fact="version"]')[0].text
    assert "agent/seed" in by_css(browser, 'dd[data-fact="provenance"]')[0].text
    assert by_css(browser, 'dd[data-fact="tier"]')[0].text.split()[0] in {"hot", "warm", "archive"}
    # The chart: both versions as written, three outcomes, and now.
    assert len(by_css(browser, "#confidence-chart circle.write")) == 2
    assert len(by_css(browser, "#confidence-chart circle.success")) == 2
    failure = by_css(browser, "#confidence-chart circle.failure")
    assert len(failure) == 1 and len(by_css(browser, "#confidence-chart circle.now")) == 1
    failure[0].click()
    detail = wait_for(browser, "#outcome-detail")
    assert "incident-3" in detail.text and "failure" in detail.text
    wait_for(browser, "#diff .add")
    changed = [line.text.strip() for line in by_css(browser, "#diff .add, #diff .remove")]
    # A changed block as a unified diff shows it: the lines removed, then the lines added.
    assert changed == ['-   "backoff": "linear",', '-   "retries": 3', '+   "backoff": "exponential",', '+   "retries": 5']
    assert [row.text for row in by_css(browser, "#entry-outcomes tbody tr td:first-child")] == [
        "deploy-1", "deploy-2", "incident-3",
    ]

    by_css(browser, 'nav a[data-view="search"]')[0].click()
    wait_for(browser, "#search-input").send_keys("search index rebuilds nightly")
    by_css(browser, "#search-submit")[0].click()
    cell = wait_for(browser, 'tr[data-entry="team-b/search/index"] td[data-strategy="keyword"]')
    assert cell.text.startswith("#1 · ")
    assert by_css(browser, "#search-results tbody tr")[0].get_attribute("data-entry") == "team-b/search/index"

    open_entry(browser, server.base_url, "scratch", "obsolete")
    by_css(browser, "#forget-button")[0].click()
    wait_for(browser, "#forget-cancel").click()
    assert by_css(browser, "#forget-button")[0].is_displayed()
    by_css(browser, "#forget-button")[0].click()
    wait_for(browser, "#forget-confirm").click()
    assert "Forgot scratch/obsolete" in wait_for(browser, "#forget-done").text
    browser.refresh()
    wait_until(browser, lambda d: "No memory at 'scratch/obsolete'" in d.find_element("id", "error").text)


def test_a_read_only_key_sees_no_forget_button_and_the_api_refuses_it(server: HttpServer, browser: Any) -> None:
    log_in(browser, server.base_url, READER)
    assert "read-only key" in by_css(browser, "#who")[0].text
    open_entry(browser, server.base_url, "team-a/payments", "timeout")
    assert by_css(browser, "#forget-button") == [] and by_css(browser, "#forget") == []
    body = {"entity_path": "team-a/payments", "key": "timeout"}
    assert api_status(browser, "POST", "/ui/api/forget", READER, body) == 403
    browser.refresh()
    wait_until(browser, lambda d: d.find_element("id", "entry-title").text == "team-a/payments/timeout")


def test_a_prefix_key_sees_only_its_prefix_and_is_refused_outside_it(server: HttpServer, browser: Any) -> None:
    log_in(browser, server.base_url, TEAM_A)
    assert by_css(browser, "#tree-total")[0].text.startswith("3 entries in team-a")
    assert "team-b" not in by_css(browser, "#main")[0].text
    assert not by_css(browser, 'nav a[data-view="learning"]')[0].is_displayed()
    assert not by_css(browser, 'nav a[data-view="ml"]')[0].is_displayed()
    browser.get(f"{server.base_url}/ui/#/entry?path=team-b/search&key=index")
    wait_until(browser, lambda d: "outside this API key's scope" in d.find_element("id", "error").text)
    assert "nightly" not in by_css(browser, "body")[0].text
    browser.get(f"{server.base_url}/ui/#/search?q=search%20index%20rebuilds%20nightly%20payments")
    wait_for(browser, "#search-results tbody tr")
    rows = [row.get_attribute("data-entry") for row in by_css(browser, "#search-results tbody tr")]
    assert rows and all(row.startswith("team-a/") for row in rows)
    assert api_status(browser, "GET", "/ui/api/search?q=nightly&path=team-b", TEAM_A) == 403
    assert api_status(browser, "GET", "/ui/api/entry?path=team-b/search&key=index", TEAM_A) == 403
    body = {"entity_path": "team-b/search", "key": "index"}
    assert api_status(browser, "POST", "/ui/api/forget", TEAM_A, body) == 403


def test_markup_in_memory_values_is_shown_as_text_and_runs_nothing(server: HttpServer, browser: Any) -> None:
    log_in(browser, server.base_url, ADMIN)
    browser.get(f"{server.base_url}/ui/#/browse?path=team-b/search")
    wait_for(browser, 'tr[data-entry="team-b/search/xss-img"]')
    assert json.dumps(XSS_IMG) in by_css(browser, "#entries")[0].text
    open_entry(browser, server.base_url, "team-b/search", "xss-img")
    assert by_css(browser, "#entry-value")[0].text == json.dumps(XSS_IMG)
    open_entry(browser, server.base_url, "team-b/search", "xss-script")
    assert "<script>window.__amfsXss = 2</script>" in by_css(browser, "#entry-value")[0].text
    browser.get(f"{server.base_url}/ui/#/search?q=onerror%20amfsXss%20script")
    wait_for(browser, "#search-results tbody tr")
    browser.get(f"{server.base_url}/ui/#/outcomes")
    wait_for(browser, 'tr[data-outcome="xss-outcome"]')
    assert by_css(browser, "main img") == [] and by_css(browser, "main script") == []
    assert browser.execute_script("return window.__amfsXss === undefined")
