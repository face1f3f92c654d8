"""Headless Chromium for the tests that look at a page as a person would (selenium + Debian's
chromedriver), and why a test must skip when it is missing.  Pages load from ``file://`` with the
network-silencing flags, so any fetch they tried would fail and show as a console error."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("MLCKPT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MLCKPT_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


def missing() -> str | None:
    """Why there is no headless Chromium here, or None."""
    if not Path(CHROMIUM).is_file():
        return f"{CHROMIUM} not installed (apt-get install chromium chromium-driver)"
    if not Path(CHROMEDRIVER).is_file():
        return f"{CHROMEDRIVER} not installed (apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install '.[test]')"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A selenium driver of headless Chromium, with the browser console kept, quit afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="mlckpt-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    d.set_page_load_timeout(60)
    try:
        yield d
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)
