"""Debian's headless Chromium driven through its chromedriver (Selenium), for the console's
browser tests and its benchmark. Never a downloaded browser: ``tools/services.sh`` installs
``chromium`` and ``chromium-driver``."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

__all__ = ["CHROMEDRIVER", "CHROMIUM", "BrowserMissing", "chromium"]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Chromium as root, headless, talking to nothing but the page it is sent to.
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1360,900",
)


class BrowserMissing(RuntimeError):
    """Chromium or its driver is not installed; the message says how to install them."""


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A Selenium ``WebDriver`` of a fresh headless Chromium (its own profile), quit after."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        raise BrowserMissing(
            f"{CHROMIUM} and {CHROMEDRIVER} are needed: tools/services.sh --install "
            "(apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="od-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
