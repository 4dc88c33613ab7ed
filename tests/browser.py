"""A real headless Chromium driven by Selenium, for the inspector's tests.

Debian's `chromium` with its version-matched `chromium-driver`. On a developer's machine
without them the browser tests skip; in CI (`CI` or `MEMPROXY_REQUIRE_BROWSER` set, as
.ci/run does) a missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,1000")
DRIVER_PATHS = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


def _found(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name) or (name if os.path.isabs(name) and os.access(name, os.X_OK) else None)
        if path:
            return path
    return None


def _missing(what: str) -> None:
    message = f"{what} is not installed (apt-get install chromium chromium-driver)"
    if os.environ.get("CI") or os.environ.get("MEMPROXY_REQUIRE_BROWSER"):
        pytest.fail(message + "; CI requires the browser tests to run")
    pytest.skip(message)


@contextlib.contextmanager
def chromium(*flags: str) -> Iterator[webdriver.Chrome]:
    """A fresh Chromium profile, its network log kept (to prove the page asks no other origin);
    `flags`: more command-line flags (a host resolver rule, say)."""
    binary = _found(("chromium", "chromium-browser"))
    driver_path = _found(("chromedriver", *DRIVER_PATHS))
    if binary is None:
        _missing("Chromium")
    if driver_path is None:
        _missing("chromium-driver")
    profile = tempfile.mkdtemp(prefix="memproxy-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, *flags, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    # An explicit driver path: Selenium would otherwise try to download one.
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """One Chromium for a module's tests."""
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """Where screenshots go: $MEMPROXY_ARTIFACTS, else a temporary directory."""
    path = Path(os.environ.get("MEMPROXY_ARTIFACTS") or tempfile.mkdtemp(prefix="memproxy-artifacts-"))
    path.mkdir(parents=True, exist_ok=True)
    return path
