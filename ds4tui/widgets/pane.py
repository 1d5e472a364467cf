"""The bordered text pane every speculation and memory pane is built on."""

from __future__ import annotations

from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import Static
from rich.style import Style as RichStyle

from ds4tui.widgets.stream import no_second_layout


_NO_LINK = RichStyle()  # (what a strip without links is styled with: nothing)
#: Whether Textual has the parts a pane's render of one row builds on (Textual 8.2's formatted rows
#: of a Content and its link styling of a strip); without them every row is Textual's render.
ROWS_ALONE = hasattr(Content, "_wrap_and_format") and hasattr(Strip, "_apply_link_style")


class _Row:
    """A row where Textual has no formatted rows to keep: its text only."""

    def __init__(self, content: Content):
        self.content, self.y = content, 0


class Pane(Static):
    """A bordered text pane that re-renders only when its content changes, repaints only the
    rows whose text changed, renders only the rows that are repainted, and re-runs the screen's
    layout only when its height changes (a full layout of the screen costs far more than
    repainting one pane, and the panes update while text streams).

    :meth:`hold` keeps the pane at least as tall as it has been since (blank rows below a
    shorter text) until it is released: while an answer streams, a pane whose text loses a row
    (a line that no longer wraps, a reason that left) then costs a repaint, not a layout of the
    screen beside the decoding engine (and the row it would get back later costs none either)."""

    DEFAULT_CSS = """
    Pane { height: auto; border: round $primary-darken-2; padding: 0 1; }
    """
    virtual_size = no_second_layout()  # (a pane grows with its text; it does not scroll)

    def __init__(self, title: str, *, id: str | None = None):
        super().__init__(Content.styled("waiting for the engine", "$text-muted"), id=id)
        self.border_title = title
        self._shown: Content | None = None
        self._rows: tuple[int, int] | None = None  # (width, rows drawn at that width, blank rows included)
        self._drawn: Content | None = None  # what was drawn: the text and the blank rows that keep the height
        self._drawn_rows: tuple[int, list[Content]] | None = None  # (width, the rows of _drawn at that width)
        self._held: int | None = None  # while held: the fewest rows to draw
        self._lines: tuple[int, list] | None = None  # (width, the formatted rows of _drawn at that width)

    def put(self, content: Content) -> None:
        old = self._shown
        if old is not None and content.plain == old.plain and content.spans == old.spans:
            return
        self._shown = content
        self._draw()

    def _draw(self) -> None:
        content = self._shown
        width = self.content_size.width
        # its rows at this width as Textual formats them for a render (their texts are what
        # Content.wrap gives), kept so that a repainted row is rendered alone (render_line)
        lines = self._format(content, width) if width > 0 else None
        natural = len(lines) if lines is not None else None
        rows = natural
        if natural is not None and self._held is not None:
            rows = self._held = max(natural, self._held)
            if rows > natural:  # blank rows below: the rows Textual makes of the blank lines added
                content = content + Content("\n" * (rows - natural))
                blank = self._format(Content("\n" * (rows - natural - 1)), width)
                first = self._shown.plain.count("\n") + 1  # (the line each row comes from)
                for k, line in enumerate(blank):
                    line.y = first + k
                lines = lines + blank
        self._lines = (width, lines) if lines is not None else None
        after = [line.content for line in lines] if lines is not None else None
        old, old_rows = self._drawn, self._drawn_rows
        if old_rows is None or old_rows[0] != width:
            old_rows = None if old is None or natural is None else (width, old.wrap(width))
        if natural is not None and old_rows is not None and (self._rows is None or self._rows[0] != width):
            self._rows = (width, len(old_rows[1]))  # what the last layout made of the old content
        key = (width, rows) if natural is not None else None
        self._drawn = content
        self._drawn_rows = (width, after) if after is not None else None
        if key is not None and key == self._rows and old_rows is not None:
            # as tall as before: repaint the rows whose text changed, not the whole pane
            before = old_rows[1]
            changed = [y for y, row in enumerate(after)
                       if y >= len(before) or row.plain != before[y].plain or row.spans != before[y].spans]
            if changed:
                self.refresh(*(Region(0, y, width, 1) for y in changed))
            return
        self.update(content, layout=key is None or key != self._rows)
        self._rows = key

    def render(self) -> Content:
        """What was drawn last (:meth:`put` repaints only the rows of it that changed)."""
        return self._drawn if self._drawn is not None else super().render()

    def _format(self, content: Content, width: int) -> list:
        """``content``'s rows at ``width`` as Textual's render of a Content formats them
        (``Content.render_strips``: the widget's text rules, no selection)."""
        if not ROWS_ALONE:
            return [_Row(row) for row in content.wrap(width)]
        rule = self.styles.get_rule
        return content._wrap_and_format(width, align=rule("text_align", "left"), overflow=rule("text_overflow", "fold"),
                                        no_wrap=rule("text_wrap", "wrap") == "nowrap",
                                        line_pad=rule("line_pad", 0), tab_size=8, get_style=self._get_style)

    def render_line(self, y: int) -> Strip:
        """Row ``y`` of what was drawn, rendered alone: the strip Textual's render of the whole pane
        has in that row (``Visual.to_strips`` on the widget's Content: the row's segments in the
        widget's style, links styled), without rendering the rows that did not change.  Textual's
        render of every row where the rows are not the ones formatted (another width, a text
        selection, an alignment other than top left)."""
        lines, size = self._lines, self.size
        if (not ROWS_ALONE or lines is None or lines[0] != size.width or self._drawn is None
                or self.text_selection is not None or self.BLANK or self.styles.content_align != ("left", "top")):
            return super().render_line(y)
        rows = lines[1]
        if not 0 <= y < min(len(rows), size.height):
            return Strip.blank(size.width, self.visual_style.rich_style)
        strip = Strip(*rows[y].to_strip(self.visual_style))
        if self.auto_links and not self.is_container and not self.screen._selecting:
            # (the link style is worked out only for a row with a link: it costs more than the row)
            link = any(style is not None and style._meta is not None and "@click" in style.meta
                       for _, style, _ in strip)
            strip = strip._apply_link_style(self.link_style if link else _NO_LINK)
        return strip

    def hold(self, on: bool) -> None:
        """``on``: from now until released, never fewer rows than now; off: as tall as the text
        (a layout if that is fewer rows)."""
        if on:
            self._held = self._rows[1] if self._rows is not None else 0
        elif self._held is not None:
            self._held = None
            if self._shown is not None:
                self._draw()

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
    """A row of panes side by side, as :class:`PaneColumn`; one under the other (CSS class ``-stacked``)
    where the row is narrower than :attr:`min_pane_width` columns a pane (the two histograms in the panes of a
    40-column window: each of their lines wrapped, doubling the panes' height)."""

    DEFAULT_CSS = """
    PaneRow.-stacked { layout: vertical; }
    """
    virtual_size = no_second_layout()
    #: columns a pane of the row needs for its lines (a histogram's 19, its border and padding 4)
    min_pane_width = 23

    def on_resize(self) -> None:
        self.set_class(self.size.width < self.min_pane_width * max(1, len(self.children)), "-stacked")
