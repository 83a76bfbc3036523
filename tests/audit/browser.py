"""Headless Chromium for console tests: Debian's chromium package driven by Playwright.

Playwright never downloads a browser here; it launches `/usr/lib/chromium/chromium` with a fresh
temporary profile per launch. Tests skip when the package is missing. Screenshots go to
$SANDGATE_SCREENSHOTS (default: a temp dir of the test session) for a human to look at.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/lib/chromium/chromium")
HAVE_CHROMIUM = bool(shutil.which("chromium")) and CHROMIUM.exists()
needs_chromium = pytest.mark.skipif(not HAVE_CHROMIUM, reason="Debian chromium not installed")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A launched browser (Playwright's sync API); closed on exit."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as driver:
        instance = driver.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        try:
            yield instance
        finally:
            instance.close()


@contextlib.contextmanager
def new_page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    try:
        yield tab
    finally:
        context.close()


def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = Path(os.environ.get("SANDGATE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    target.mkdir(parents=True, exist_ok=True)
    return target


def log_in(page: Any, url: str, key: str) -> None:
    page.goto(url + "/console")
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")
