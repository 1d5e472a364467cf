"""Rates and time series derived from the engine's monotonic counters (for the live panes).

The engine only counts (``Stats``, ``DSparkStats``); windows and rates are derived here from
successive :class:`~ds4tui.engine.worker.StatsSnapshot` s, so a number is never counted twice
(STYLE.md "monotonic counters in the engine, rates in the UI").  A point is kept only when a
counter moved, so idle time does not flatten the series.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

#: Seconds of the "recent" acceptance window.
RECENT_S = 10.0
#: Seconds over which the tokens/s rates are averaged.
RATE_S = 2.0


@dataclass(frozen=True)
class _Point:
    t: float
    cycles: int
    proposed: int
    accepted: int
    decode_tokens: int
    decode_ms: float
    n_events: int
    turn: int
    turn_tokens: int
    turn_decode_s: float


@dataclass(frozen=True)
class SpecView:
    """What the acceptance and throughput panes draw.

    Rates in percent (accept) and tokens per second (averaged over the last ``RATE_S`` seconds);
    ``None`` where nothing was measured yet.  ``decode_tps`` and ``effective_tps`` come from the
    same point and cover the same tokens, those the engine decoded over the window: decode over
    the engine's time, effective over the wall time of the turn, so effective <= decode (None
    while the window reaches back into the turn before).
    ``accept_series`` / ``decode_series`` / ``effective_series``: one value per kept snapshot
    (oldest first); ``marks``: indexes into those series where a knob change took effect."""

    session_accept: float | None
    recent_accept: float | None
    accept_series: tuple[float | None, ...]
    decode_tps: float | None
    effective_tps: float | None
    decode_series: tuple[float | None, ...]
    effective_series: tuple[float | None, ...]
    marks: frozenset[int]


class SpecTimeline:
    """A bounded history of snapshots (``maxlen`` points) and the rates between them."""

    def __init__(self, maxlen: int = 240, recent_s: float = RECENT_S, rate_s: float = RATE_S):
        self._pts: collections.deque[_Point] = collections.deque(maxlen=maxlen)
        self._accept: collections.deque[float | None] = collections.deque(maxlen=maxlen)
        self._decode: collections.deque[float | None] = collections.deque(maxlen=maxlen)
        self._effective: collections.deque[float | None] = collections.deque(maxlen=maxlen)
        self._marked: collections.deque[bool] = collections.deque(maxlen=maxlen)
        self.recent_s = recent_s
        self.rate_s = rate_s
        self._session: tuple[int, int] = (0, 0)
        self._from_zero = True  # the oldest kept point is the first since the counters started

    def add(self, snap: Any) -> bool:
        """Fold in a ``StatsSnapshot``; returns True if it added a point (a counter moved)."""
        d = snap.dspark
        p = _Point(snap.t, d.cycles if d else 0, d.proposed if d else 0, d.accepted_draft if d else 0,
                   snap.stats.n_decode_tokens, snap.stats.decode_ms, len(snap.events), snap.turn,
                   snap.turn_tokens, snap.turn_decode_s)
        if d is not None:
            self._session = (d.proposed, d.accepted_draft)
        prev = self._pts[-1] if self._pts else None
        if prev is not None and (p.cycles, p.decode_tokens, p.n_events, p.turn_tokens) == (
                prev.cycles, prev.decode_tokens, prev.n_events, prev.turn_tokens):
            return False
        if prev is not None and (p.decode_tokens < prev.decode_tokens or p.cycles < prev.cycles):
            self.clear()  # the counters were reset
            prev = None
        base = self._base(p) if prev is not None else None
        if len(self._pts) == self._pts.maxlen:
            self._from_zero = False  # the append drops the oldest point
        self._pts.append(p)
        self._accept.append(self._window_accept())
        if base is None or base.turn != p.turn:  # a turn's first point: no window of its own yet (over the
            # point before, its tokens would hold the turn's first, sampled from the prefill's logits with no
            # forward pass: ~1 token in ~0 ms, a rate of 20 000 t/s that flattened the series)
            self._decode.append(None)
            self._effective.append(None)
        else:
            # Both rates count the same tokens (what the engine decoded between the two snapshots)
            # over the same span: decode divides by the engine's time, effective by the wall time
            # between the two snapshots, which holds all of that engine time (a snapshot reads the
            # wall clock after the counters), so effective <= decode.  The tokens the turn had shown
            # would not do: a snapshot is taken while the cycles of a batch the engine has already
            # run are handed out, so they lag the counters by the rest of the batch.
            n = p.decode_tokens - base.decode_tokens
            dms = p.decode_ms - base.decode_ms
            self._decode.append(1000.0 * n / dms if dms > 0 else None)
            # wall time only within one turn (not the pause and prefill before it); the worker takes
            # a turn's snapshots once its first token is decoded, when the turn's clock has started
            ds = p.turn_decode_s - base.turn_decode_s
            self._effective.append(n / ds if ds > 0 else None)
        self._marked.append(prev is not None and p.n_events > prev.n_events)
        return True

    def _base(self, p: _Point) -> _Point:
        """The oldest kept point of ``p``'s turn at most ``rate_s`` before ``p`` (else the newest point):
        rates are averaged over that span, so one short interval does not make the numbers jump."""
        base = self._pts[-1]
        for q in reversed(self._pts):
            if p.t - q.t > self.rate_s or q.turn != p.turn:
                break
            base = q
        return base

    def clear(self) -> None:
        for q in (self._pts, self._accept, self._decode, self._effective, self._marked):
            q.clear()
        self._from_zero = True

    def _window_accept(self) -> float | None:
        last = self._pts[-1]
        first = last
        for q in reversed(self._pts):
            if last.t - q.t > self.recent_s:
                break
            first = q
        if first is last and len(self._pts) > 1:
            first = self._pts[-2]
        if self._from_zero and last.t - self._pts[0].t <= self.recent_s:
            # the window reaches back to the counters' start: the drafts counted before the first
            # snapshot (taken once a turn's first token is decoded) are in it too
            dp, da = last.proposed, last.accepted
        else:
            dp, da = last.proposed - first.proposed, last.accepted - first.accepted
        return 100.0 * da / dp if dp > 0 else None

    def view(self) -> SpecView:
        proposed, accepted = self._session
        # the newest point with a decode rate, and the effective rate of that same window
        at = next((i for i in reversed(range(len(self._decode))) if self._decode[i] is not None), None)
        return SpecView(
            session_accept=100.0 * accepted / proposed if proposed else None,
            recent_accept=self._accept[-1] if self._accept else None,
            accept_series=tuple(self._accept),
            decode_tps=self._decode[at] if at is not None else None,
            effective_tps=self._effective[at] if at is not None else None,
            decode_series=tuple(self._decode),
            effective_series=tuple(self._effective),
            marks=frozenset(i for i, m in enumerate(self._marked) if m))
