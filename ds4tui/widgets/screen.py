"""The chat's screen: frames drawn when something changed, with no timer running in between.

Textual draws a screen's changes from a timer of ``1 / TEXTUAL_FPS`` seconds (60 a second by
default) that is paused while nothing changes: a change resumes it and the frame is drawn at
once, but the timer's task then sleeps until its next period before it sees that it is paused —
one more wake-up of the UI thread, doing nothing, after every frame.  While an answer streams
the app draws about seven frames a second (the text ~5.3 times, the panes once, a typed key), and
those empty wake-ups were close to half of the UI thread's wake-ups (ux.md §2.4).  On a CPU
engine each wake-up takes a core from one of the engine's threads for a moment, and its partner
then waits for it at the end of the pool's run.

:class:`ChatScreen` keeps Textual's rule — a frame at once when something changed, at most one
per period — but schedules each frame on the event loop only when a change asks for one, so
nothing wakes the UI thread between frames.
"""

from __future__ import annotations

import asyncio

from textual import screen as _screen
from textual.screen import Screen


class FrameTrigger:
    """Stands in for a screen's update timer (the ``pause``/``resume`` Textual calls on it):
    ``resume()`` schedules one call of the screen's ``_on_timer_update`` — at once, or at the end
    of the period that began with the frame before (at most ``1 / TEXTUAL_FPS`` frames a second,
    as Textual's timer) — and ``pause()`` cancels a scheduled one (the screen calls it when it
    draws, and after a layout, which has drawn everything)."""

    def __init__(self, screen: Screen, period: float | None = None):
        self.screen = screen
        self.period = _screen.UPDATE_PERIOD if period is None else float(period)
        self._handle: asyncio.Handle | None = None
        self._next = 0.0  # (event loop time) the earliest time of the next frame

    @property
    def scheduled(self) -> bool:
        return self._handle is not None

    def resume(self) -> None:
        if self._handle is not None:
            return
        loop = asyncio.get_running_loop()
        delay = self._next - loop.time()
        self._handle = loop.call_later(delay, self._fire) if delay > 0 else loop.call_soon(self._fire)

    def pause(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._next = asyncio.get_running_loop().time() + self.period
        app = self.screen.app
        if app._exit or not self.screen.is_attached:
            return
        try:
            self.screen._on_timer_update()
        except Exception as error:  # (as Textual's timer: the app shows it and exits)
            app._handle_exception(error)


class ChatScreen(Screen):
    """The app's default screen: Textual's, with its frames scheduled by a :class:`FrameTrigger`
    instead of a timer that wakes the UI thread after every frame."""

    @property
    def _update_timer(self) -> FrameTrigger:  # (Textual's name: the screen pauses and resumes it)
        trigger = self.__dict__.get("_frame_trigger")
        if trigger is None:
            trigger = self.__dict__["_frame_trigger"] = FrameTrigger(self)
        return trigger
