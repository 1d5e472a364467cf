"""A one-line time series with marks under it (knob changes), and bar helpers shared by panes."""

from __future__ import annotations

from typing import Sequence

from textual.content import Content

_BLOCKS = " ▁▂▃▄▅▆▇█"
_EIGHTHS = " ▏▎▍▌▋▊▉"


def spark(values: Sequence[float | None], width: int, *, lo: float = 0.0, hi: float | None = None,
          marks: frozenset[int] = frozenset()) -> tuple[str, str]:
    """The last ``width`` values as block glyphs (a gap for None), and a line with ``▲`` under
    every index in ``marks``.  ``hi`` defaults to the largest value shown."""
    start = max(0, len(values) - width)
    shown = list(values[start:])
    finite = [v for v in shown if v is not None]
    top = hi if hi is not None else (max(finite) if finite else 1.0)
    span = top - lo if top > lo else 1.0
    line = []
    for v in shown:
        if v is None:
            line.append(" ")
        else:
            k = round(8 * (min(max(v, lo), top) - lo) / span)
            line.append(_BLOCKS[max(1, k)])
    under = "".join("▲" if (start + i) in marks else " " for i in range(len(shown)))
    return "".join(line), under


def bar(value: float, top: float, width: int) -> str:
    """A horizontal bar of ``value / top`` of ``width`` cells, in eighths of a cell."""
    if top <= 0 or value <= 0:
        return ""
    cells = min(1.0, value / top) * width
    full = int(cells)
    frac = int((cells - full) * 8)
    return "█" * full + (_EIGHTHS[frac] if frac and full < width else "")


def rows(lines: Sequence[Content | str]) -> Content:
    """Join lines into one Content."""
    return Content("\n").join(line if isinstance(line, Content) else Content(line) for line in lines)
