"""Length histogram pane (draft lengths, accepted lengths): one row per length 0..block."""

from __future__ import annotations

from typing import Sequence

from textual.content import Content

from ds4tui.widgets.pane import Pane
from ds4tui.widgets.series import bar, rows

BAR_WIDTH = 6


class Histogram(Pane):
    """Bars with counts for lengths ``0..len(counts)-1``; the largest bin is drawn in bold.

    ``counts``: one count per length (the engine's ``draft_len_hist`` / ``accepted_len_hist``;
    bin 0 = cycles with no draft, or with no accepted draft).  Before the first cycle every bin
    is drawn at 0 (the pane is as tall from the start as it will be: its first counts, while an
    answer streams, then cost no layout of the screen); no bins: "no cycles yet"."""

    DEFAULT_CSS = """
    Histogram { width: 1fr; }
    """

    def __init__(self, title: str, *, id: str | None = None):
        super().__init__(title, id=id)
        self.counts: tuple[int, ...] = ()

    def show(self, counts: Sequence[int]) -> None:
        counts = tuple(int(c) for c in counts)
        self.counts = counts
        if not counts:
            self.put(Content.styled("no cycles yet", "$text-muted"))
            return
        total, top = sum(counts), max(counts)
        lines = [Content.assemble(f"{n:>2} ", (bar(c, top, BAR_WIDTH).ljust(BAR_WIDTH),
                                                "bold $accent" if c == top and top else "$accent"),
                                  f"{c:>5}{100.0 * c / total if total else 0.0:4.0f}%")
                 for n, c in enumerate(counts)]
        self.put(rows(lines))
