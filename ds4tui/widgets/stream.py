"""StreamText: text that grows at its end, drawn row by row (Textual's line API).

An answer streams in a few tokens at a time.  Parsing and laying out the whole message again at
every write costs the interface time that grows with the answer (and the engine shares the
interpreter and the cores with the interface).  Here an append wraps only the last line of the
text again, repaints only the rows that changed, and asks for a screen layout only when the
number of rows changes.  Styled text (``Content``) keeps its styles.
"""

from __future__ import annotations

import re

from textual.content import Content
from textual.geometry import Region, Size
from textual.reactive import Reactive
from textual.strip import Strip
from textual.widget import Widget

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def no_second_layout(virtual_size: Size = Size(0, 0)) -> Reactive:
    """A ``virtual_size`` reactive for a widget whose size follows its content (``height: auto``).

    Textual sets a widget's virtual size after each layout that changed it, and by default that
    asks for one more layout of the whole screen and one more frame.  For a widget that does not
    scroll its own content the layout that set it has already placed everything, so a text that
    grows by a row costs one layout instead of two."""
    return Reactive(virtual_size, layout=False, repaint=False)


def clean(text: str) -> str:
    """Carriage returns dropped, the other control characters but newline and tab as U+FFFD: a
    terminal would act on them."""
    return _CONTROL.sub("\ufffd", text.replace("\r", ""))


class StreamText(Widget):
    """``append(text)`` adds text (a ``str`` or a styled ``Content``) at the end; ``content`` is
    everything appended so far, ``text`` its plain text.

    Rows are the lines of the text word-wrapped at the widget's width (a word longer than a row is
    folded).  Only the last line can still change, so an append wraps only that line again.
    ``reserve`` rows are taken from the start (the text is drawn from the top, blank rows below it)
    and ``max_rows`` (None: no limit) caps the height: beyond it the widget shows the end of the
    text.  A text growing within them costs a repaint of the rows that changed and no layout of
    the screen (set ``max_rows`` to the height of the view the text scrolls in: a view pinned to
    its bottom then shows what it would show without the cap).  A text that outgrows its reserve
    takes ``grow_step`` rows more at a time (each new height is a layout), and a capped text that
    outgrows its rows scrolls ``grow_step`` rows at a time: its last row is shown with
    ``grow_step - 1`` blank rows below it, which the next rows of text fill with repaints of
    those rows alone (each scroll repaints every row shown, so a text streaming past the cap
    costs one full repaint per ``grow_step`` rows, not one per write)."""

    DEFAULT_CSS = """
    StreamText { height: auto; }
    """
    virtual_size = no_second_layout()

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self._pieces: list[Content] = []  # what was appended, as it was appended
        self._lines: list[Content] = [Content("")]  # the last one is still open
        self._width = 0  # the width the rows were wrapped at; 0: wrap at the next layout
        self._rows: list[Content] = []  # rows of every line but the last
        self._tail: list[Content] = []  # rows of the last line
        self._strips: dict[int, Strip] = {}  # by row
        self._max_rows: int | None = None
        self._reserve = 0
        self._grow_step = 1
        self._top = 0  # the first row shown (see _settle)

    @property
    def content(self) -> Content:
        return Content("").join(self._pieces)

    @property
    def text(self) -> str:
        return "\n".join(line.plain for line in self._lines)

    @property
    def row_count(self) -> int:
        """Rows at the width of the last layout."""
        return len(self._rows) + len(self._tail)

    @property
    def max_rows(self) -> int | None:
        return self._max_rows

    @max_rows.setter
    def max_rows(self, n: int | None) -> None:
        n = None if n is None else max(1, int(n))
        if n != self._max_rows:
            before = self._height()
            self._max_rows = n
            top = self._top
            if self._width and (self._settle() != top or self._height() != before):
                self.refresh(layout=True)

    @property
    def reserve(self) -> int:
        return self._reserve

    @reserve.setter
    def reserve(self, n: int) -> None:
        n = max(0, int(n))
        if n != self._reserve:
            before = self._height()
            self._reserve = n
            top = self._top
            if self._settle() != top or self._height() != before:
                self.refresh(layout=True)

    @property
    def grow_step(self) -> int:
        return self._grow_step

    @grow_step.setter
    def grow_step(self, n: int) -> None:
        n = max(1, int(n))
        if n != self._grow_step:
            before = self._height()
            self._grow_step = n
            if self._width and self._height() != before:
                self._settle()
                self.refresh(layout=True)

    def _height(self) -> int:
        rows, reserve, step = self.row_count, self._reserve, self._grow_step
        if reserve and rows > reserve and step > 1:  # past the reserve: whole steps of rows
            rows = reserve + -(-(rows - reserve) // step) * step
        rows = max(rows, reserve)
        return rows if self._max_rows is None else min(rows, self._max_rows)

    def _offset(self) -> int:
        """The first row shown: 0 while the text fits its height; past it, where the last scroll
        put it as long as the last row is still shown, else (a scroll) ``grow_step - 1`` rows past
        the first row that shows the last row.  Never so far that fewer rows of text than the
        height minus ``grow_step - 1`` are shown (a larger cap shows more text at once)."""
        rows, height = self.row_count, self._height()
        if rows <= height:
            return 0
        pinned = rows - height  # the last row at the bottom
        ahead = min(pinned + max(0, min(self._grow_step, height) - 1), rows - 1)
        return ahead if self._top < pinned else min(self._top, ahead)

    def _settle(self) -> int:
        """Keep :meth:`_offset` as the first row shown; returns it."""
        self._top = self._offset()
        return self._top

    def _wrap(self, line: Content) -> list[Content]:
        if line.cell_length <= self._width and "\t" not in line.plain:
            return [line]  # (what wrapping gives a line that fits, without its cost: most lines of code)
        return line.wrap(self._width) or [Content("")]

    def _wrap_tail(self) -> None:
        """The last line's rows (none while the whole text is empty)."""
        last = self._lines[-1]
        self._tail = self._wrap(last) if last.plain or len(self._lines) > 1 else []

    def _wrap_all(self, width: int) -> None:
        self._width = width
        self._rows = [row for line in self._lines[:-1] for row in self._wrap(line)]
        self._wrap_tail()
        self._strips.clear()
        self._top = 0
        self._settle()

    def clear(self) -> None:
        self.set(Content(""))

    def set(self, text: str | Content) -> None:
        """Replace the whole text."""
        self._pieces, self._lines = [], [Content("")]
        self._width = 0
        self._strips.clear()
        self._rows, self._tail = [], []
        self._top = 0
        self.append(text, force_layout=True)

    def append(self, text: str | Content, *, force_layout: bool = False) -> None:
        """Add ``text`` at the end (``force_layout``: lay the screen out again even if the number of
        rows stays the same)."""
        content = Content(clean(text)) if isinstance(text, str) else text
        if not content.plain and not force_layout:
            return
        parts = content.split("\n", allow_blank=True) if "\n" in content.plain else [content]
        if content.plain:
            self._pieces.append(content)
            self._lines[-1] = self._lines[-1] + parts[0]
            self._lines.extend(parts[1:])
        shown = self._shown()
        if not self._width or not shown:
            # not laid out yet, or hidden: wrap at the next layout (a hidden widget needs no frame)
            self._width = 0
            if shown or force_layout:
                self.refresh(layout=True)
            return
        rows_before, height_before, offset_before = self.row_count, self._height(), self._top
        first = len(self._rows)  # the old last line's first row: the rows above it cannot change
        for line in self._lines[len(self._lines) - len(parts):-1]:  # the lines this text completed
            self._rows.extend(self._wrap(line))
        self._wrap_tail()
        for y in range(first, rows_before):
            self._strips.pop(y, None)
        if self._height() != height_before or force_layout:
            self._settle()
            self.refresh(layout=True)
        elif self._settle() != offset_before:
            for y in range(offset_before, self._top):  # rows scrolled out of sight: their strips go
                self._strips.pop(y, None)
            self.refresh()  # capped and scrolled: every row shown moved up
        else:  # the rows from the old last line's first to the last row of text (reserved blank rows stay)
            top = max(0, first - offset_before)
            bottom = min(self._height(), self.row_count - offset_before)
            if bottom > top:
                self.refresh(Region(0, top, self.size.width, bottom - top))

    def _shown(self) -> bool:
        """Mounted, and neither this widget nor a container of it is hidden (display: none)."""
        if not self.is_mounted:
            return False
        node = self
        while node is not None:
            if not node.display:
                return False
            node = node.parent
        return True

    def get_content_height(self, container, viewport, width: int) -> int:
        if width > 0 and width != self._width:
            self._wrap_all(width)
        return self._height()

    def render_line(self, y: int) -> Strip:
        width, style = self.size.width, self.visual_style
        k = y + self._top
        strip = self._strips.get(k)
        if strip is not None and strip.cell_length == width:
            return strip
        n = len(self._rows)
        row = self._rows[k] if k < n else self._tail[k - n] if 0 <= k - n < len(self._tail) else None
        if row is None:
            return Strip.blank(width, style.rich_style)
        strip = Strip(row.render_segments(style), row.cell_length).extend_cell_length(width, style.rich_style)
        self._strips[k] = strip
        return strip

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
