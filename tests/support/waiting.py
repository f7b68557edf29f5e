"""Waiting for something another process does (a replica applying a change, a server becoming
ready)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(
    check: Callable[[], T], timeout: float = 5.0, interval: float = 0.02, what: str = ""
) -> T:
    """`check()`'s first truthy value within `timeout` seconds, else AssertionError with its last
    value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what or 'the condition'}: not within {timeout} s (last {value!r})"
            )
        time.sleep(interval)
