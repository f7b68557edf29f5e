"""Debian's Chromium driven by Playwright, for the workbench's browser tests and screenshots."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps dialling Google's hosts, which this
# machine's closed network refuses; the sandbox needs a non-root user.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SIZES = {"wide": {"width": 1280, "height": 800}, "narrow": {"width": 420, "height": 860}}


def chromium_path() -> str:
    """Debian's chromium (scripts/setup.sh installs it), or a clear failure naming the fix."""
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if path is None:
        raise RuntimeError(
            "chromium is not installed: run ./scripts/setup.sh (it installs Debian's chromium)"
        )
    return path


@contextmanager
def browser():
    """A headless Chromium for the duration of the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=FLAGS
        )
        try:
            yield instance
        finally:
            instance.close()


class PageErrors(list):
    """Uncaught exceptions and console errors a page reported (a test asserts it stays empty).

    Chromium logs every 4xx/5xx answer to fetch as a console error ("Failed to load resource"):
    those are API refusals the page shows as messages, which tests check on the page itself."""

    def watch(self, page) -> PageErrors:
        """Collect `page`'s errors into this list."""
        page.on("pageerror", lambda error: self.append(f"pageerror: {error}"))
        page.on("console", self._console)
        return self

    def _console(self, message) -> None:
        if message.type == "error" and "Failed to load resource" not in message.text:
            self.append(f"console.error: {message.text}")
