"""The bordered text pane every speculation and memory pane is built on."""

from __future__ import annotations

from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import Static

from ds4tui.widgets.stream import no_second_layout


class Pane(Static):
    """A bordered text pane that re-renders only when its content changes, and re-runs the
    screen's layout only when its height changes (a full layout of the screen costs far more
    than repainting one pane, and the panes update while text streams)."""

    DEFAULT_CSS = """
    Pane { height: auto; border: round $primary-darken-2; padding: 0 1; }
    """
    virtual_size = no_second_layout()  # (a pane grows with its text; it does not scroll)

    def __init__(self, title: str, *, id: str | None = None):
        super().__init__(Content.styled("waiting for the engine", "$text-muted"), id=id)
        self.border_title = title
        self._shown: Content | None = None
        self._rows: tuple[int, int] | None = None  # (width, rows the shown content wraps to at that width)

    def put(self, content: Content) -> None:
        old = self._shown
        if old is not None and content.plain == old.plain and content.spans == old.spans:
            return
        width = self.content_size.width
        rows = (width, len(content.wrap(width))) if width > 0 else None
        if rows is not None and old is not None and (self._rows is None or self._rows[0] != width):
            self._rows = (width, len(old.wrap(width)))  # what the last layout made of the old content
        self._shown = content
        self.update(content, layout=rows is None or rows != self._rows)
        self._rows = rows

    @property
    def text(self) -> str:
        """The plain text shown (what tests read)."""
        return "" if self._shown is None else self._shown.plain


def set_line(widget: Static, text: str, style: str = "") -> None:
    """Show one line of text in ``widget``; skips the screen layout when the line still fits (the
    widget was laid out one row tall and the text is no wider than it)."""
    if getattr(widget, "_line", None) == (text, style):
        return
    size = widget.content_size
    fits = size.height == 1 and len(text) <= size.width
    widget._line = (text, style)
    widget.update(Content.styled(text, style) if style else Content(text), layout=not fits)


class PaneColumn(Vertical):
    """A column of panes: a ``Vertical`` whose new height costs one layout of the screen, not two
    (``no_second_layout``; it does not scroll)."""

    virtual_size = no_second_layout()


class PaneRow(Horizontal):
    """A row of panes side by side, as :class:`PaneColumn`."""

    virtual_size = no_second_layout()
