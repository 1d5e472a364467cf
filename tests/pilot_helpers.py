"""Waiting on the chat app in Textual's test pilot: a condition, or the model loaded in its worker thread."""

from __future__ import annotations

import time


async def until(pilot, cond, timeout: float = 90.0, what: str = "condition") -> None:
    """Pause the pilot until ``cond()`` is true; AssertionError naming ``what`` after ``timeout`` s."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.05)


async def loaded(pilot, app) -> None:
    """Until the app's engine is open (the model loads in a worker thread), and no error came."""
    await until(pilot, lambda: app.engine is not None or app.errors, what="the model to load")
    assert not app.errors, app.errors
