"""Headless Chromium for the memory browser's tests and screenshots (selenium + Debian's chromedriver).

`browser_problem()` says why no browser can run here (None when one can); `start_browser()` opens a fresh
profile each time, so no state (sessionStorage, cache) leaks between tests.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,900",
]


def browser_problem() -> str | None:
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found (apt-get install chromium chromium-driver; scripts/test.sh does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


def start_browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="amfs-ui-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=options)
    driver.set_page_load_timeout(60)
    driver.implicitly_wait(0)
    original_quit = driver.quit

    def quit_and_clean() -> None:
        try:
            original_quit()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    driver.quit = quit_and_clean
    return driver


def wait_for(driver: Any, css: str, timeout: float = 15, visible: bool = True) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    condition = ec.visibility_of_element_located if visible else ec.presence_of_element_located
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition((By.CSS_SELECTOR, css)))


def wait_until(driver: Any, predicate: Any, timeout: float = 15) -> Any:
    """Poll `predicate(driver)`; elements it looks up may be replaced meanwhile (the page re-renders on
    navigation), which counts as not yet."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=ignored).until(lambda d: predicate(d))


def log_in(driver: Any, base_url: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(base_url + "/ui/")
    wait_for(driver, "#login-key").send_keys(key)
    driver.find_element(By.ID, "login-submit").click()
    wait_for(driver, "#nav")
    wait_for(driver, "#tree-total")
