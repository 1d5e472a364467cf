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

Its frames also render only the rows they change (:class:`RowCropCompositor`): Textual's
compositor draws a partial update by rendering every widget that overlaps the bounding box of the
changed regions over the widget's whole visible height and then keeping the changed rows, so a
text frame of a few rows rendered the transcript's containers, the screen and the side column's
widgets beside the text at full height (~16 widgets a frame, most of the UI thread's time while
an answer streams, ux.md §2.4), and the panes' frame every widget of the screen.  Nor does it
render a widget in a row where the widgets in front of it fill every piece the update sends
there (the containers behind the streaming text and behind the panes).
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from typing import Iterable

from textual import screen as _screen
from textual._compositor import Compositor
from textual.geometry import Region
from textual.message import Message
from textual.screen import Screen
from textual.strip import Strip


class RowCropCompositor(Compositor):
    """Textual's compositor, whose partial updates render each widget only in the rows that the
    update sends within the widget's columns, instead of over the widget's whole visible height,
    and only where its strip would fill a piece of the row (between two cuts) that the update
    sends and that no widget in front of it filled (Textual keeps the front-most strip of each).
    Textual's renders every widget that overlaps the bounding box of the changed regions over its
    whole visible height and then keeps the changed rows.  The rows sent come from the same
    widgets, front to back, cut at the same columns, so they are the same strips; only rows that
    the update then dropped are no longer rendered (a widget's lines changed and not rendered stay
    marked as changed in its cache, so they are rendered when shown).  A full update is
    Textual's."""

    _update_spans: list[tuple[int, int, int]] | None = None

    def _regions_to_spans(self, regions: Iterable[Region]) -> list[tuple[int, int, int]]:
        """(Textual's, once per partial update, before its render: the spans are kept for it.)"""
        spans = list(super()._regions_to_spans(regions))
        self._update_spans = spans
        return spans

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        spans, self._update_spans = self._update_spans, None
        if crop is None:
            return super()._get_renders(crop)
        if spans is None:  # (a crop without the update's spans: all of its rows)
            spans = [(y, crop.x, crop.right) for y in range(crop.y, crop.bottom)]
        return self._span_renders(crop, spans)

    def _span_renders(self, crop: Region, spans: list[tuple[int, int, int]]
                      ) -> Iterable[tuple[Region, Region, list[Strip]]]:
        by_row: dict[int, list[tuple[int, int]]] = {}
        for y, x1, x2 in spans:
            by_row.setdefault(y, []).append((x1, x2))
        cuts = self.cuts
        # per row: the cuts whose chops the update sends (as ``ChopsUpdate`` picks them: a chop from
        # its cut to the next that starts at or before a span's end and ends after its start), and
        # the cuts a widget in front has filled (the front-most strip of a cut wins)
        needed: dict[int, set[int]] = {}
        for y, row_spans in by_row.items():
            row_cuts = cuts[y]
            needed[y] = {cut for cut, end in zip(row_cuts, row_cuts[1:])
                         if any(cut <= x2 and end > x1 for x1, x2 in row_spans)}
        filled: dict[int, set[int]] = {y: set() for y in by_row}
        open_rows = sorted(y for y, want in needed.items() if want)  # the rows with a sent chop not filled yet
        for widget, (region, clip) in list(self.visible_widgets.items()):
            if not open_rows:
                break  # every chop the update sends is filled: nothing behind shows
            if not crop.overlaps(clip):
                continue
            shown = region.intersection(clip)
            left, right = shown.x, shown.right
            rows = []
            for y in open_rows[bisect_left(open_rows, shown.y):bisect_left(open_rows, shown.bottom)]:
                # a row the update sends within the widget's columns (a span's end column too: Textual's
                # update moves the cursor to the chop that starts there) ...
                if not any(x1 < right and x2 >= left for x1, x2 in by_row[y]):
                    continue
                # ... and where the widget's strip would fill a sent chop that no widget in front filled
                # (a widget behind others, a container behind its children, is rendered only where it shows)
                final = [cut for cut in cuts[y] if left <= cut <= right][:-1]  # (the chops its strip fills)
                want, have = needed[y], filled[y]
                if any(cut in want and cut not in have for cut in final):
                    have.update(final)
                    rows.append(y)
            if rows:
                open_rows = [y for y in open_rows if not needed[y] <= filled[y]]
            # each run of consecutive rows: the clip's columns (where the screen's cuts are), the run's rows
            start = 0
            for i in range(1, len(rows) + 1):
                if i < len(rows) and rows[i] == rows[i - 1] + 1:
                    continue
                y0, y1 = rows[start], rows[i - 1] + 1
                start = i
                run = Region(clip.x, y0, clip.width, y1 - y0)
                x, y, width, height = region.intersection(run)
                if width and height:
                    yield region, run, widget.render_lines(Region(x - region.x, y - region.y, width, height))


#: The parts of Textual's compositor (textual 8.2) that :class:`RowCropCompositor` builds on.
ROW_CROP_NEEDS = ("_regions_to_spans", "_get_renders", "_render_chops", "visible_widgets", "cuts")


def row_crop_supported(compositor_class: type) -> bool:
    """Whether ``compositor_class`` (Textual's ``Compositor``) has every part that
    :class:`RowCropCompositor` overrides or reads; a Textual without them keeps its own compositor
    (the same frames, every widget rendered at its visible height)."""
    return all(hasattr(compositor_class, name) for name in ROW_CROP_NEEDS)


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
    instead of a timer that wakes the UI thread after every frame, and drawn by a
    :class:`RowCropCompositor`."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        if row_crop_supported(Compositor):  # else Textual's own compositor: every row rendered, as before
            self._compositor = RowCropCompositor()

    class Resized(Message):
        """The screen took a new size and the breakpoint classes of it (posted after Textual's own resize
        handler, so a handler of this message sees the new classes)."""

    def on_resize(self) -> None:
        self.post_message(self.Resized())

    @property
    def _update_timer(self) -> FrameTrigger:  # (Textual's name: the screen pauses and resumes it)
        trigger = self.__dict__.get("_frame_trigger")
        if trigger is None:
            trigger = self.__dict__["_frame_trigger"] = FrameTrigger(self)
        return trigger
