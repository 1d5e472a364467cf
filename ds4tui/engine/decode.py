"""The decode loop: step a session until a stop token, the token budget, a full context or a cancel.

The chat worker (:mod:`ds4tui.engine.worker`), ``ds4tui generate``, ``ds4tui bench`` and
:meth:`Session.generate <ds4tui.engine.session.Session.generate>` all decode through
:class:`DecodeLoop`, so they agree on what a cycle emits and on how decoding ends:

* each cycle is one :meth:`Session.step` with the budget left (``min(STEP_MAX, max_tokens -
  emitted)``), so drafts never overshoot the budget and DSpark decides exactly as a hand-written
  loop would.  The cycles run back to back in batches of one engine call each
  (:meth:`Session.step_many`, at most ``batch_s`` seconds a batch, :data:`BATCH_S` by default):
  the interpreter is needed once per batch rather than once per cycle, so a thread that draws an
  interface beside the loop does not slow it (spec ux.md §2.4).  The first cycle is a batch of
  its own, so the first token is seen (and timed) as soon as it exists.  A batch holds at most
  :data:`STEP_MANY_OUT` ids: while more of the budget is left, it runs at most as many cycles as
  leave each one room for the anchor and a whole block of drafts, so that the batch's end never
  clips a draft.  The batches change when the caller sees the cycles, never which cycles run;
* a stop token ends decoding after it is emitted.  When it arrives as an accepted draft with more
  tokens after it in the same cycle, the loop rewinds the session (:meth:`Session.rewind`) to the
  stop token before it hands the cycle out: the stop token is the pending token, nothing after it
  stays in the KV cache, and the session's counters no longer count what came after it — the C
  engine's counters cannot be lowered, so the session records what it took back and its
  :meth:`~ds4tui.engine.session.Session.stats` and
  :meth:`~ds4tui.engine.session.Session.dspark_stats` report the corrected figures
  (``n_decode_tokens``, ``accepted_draft``, ``accepted_len_hist``, ``pos_accepted``, ``saved``,
  ``net_saved``);
* before each batch: the budget (reason ``"max_tokens"``), the caller's ``cancelled()`` (reason
  ``"cancelled"``) and the context (reason ``"ctx"``: the pending token has no position left to
  run at) are checked, in that order (within a batch the engine checks the budget, the context
  and :meth:`Session.cancel` before each cycle); a step stopped by :meth:`Session.cancel` also
  ends the loop with ``"cancelled"`` (the exception is kept in :attr:`DecodeLoop.error`).

Other engine errors propagate to the caller; what was emitted until then stays in
:attr:`DecodeLoop.ids`.  A KeyboardInterrupt (a signal) that comes during a batch is raised once the
batch is booked: its cycles ran and are counted, and :meth:`DecodeLoop.computed_rest` hands them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from ds4tui.engine.backend import STEP_MANY_OUT
from ds4tui.engine.errors import CancelledError

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ds4tui.engine.session import Session

#: Why a loop ended (:attr:`DecodeLoop.reason`).
REASONS = ("stop", "max_tokens", "ctx", "cancelled")
#: Longest batch of cycles in one engine call, seconds (a batch ends after the cycle that passes it).
BATCH_S = 0.05


@dataclass(frozen=True)
class Cycle:
    """What one engine cycle emitted, as the caller should see it: the accepted drafts, then the
    token sampled after them — or, when a stop token came among the drafts, the tokens up to and
    including it (``stopped``: the last token is a stop token)."""

    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]
    stopped: bool = False

    @property
    def n_draft(self) -> int:
        return sum(self.from_draft)


class DecodeLoop:
    """Iterate over the :class:`Cycle` s of decoding ``session`` (whose prompt is prefilled) for at
    most ``max_tokens`` tokens, ending after a token of ``stop``.  ``cancelled()``, when given, is
    asked before every cycle.  See the module docstring for the rules.

    After (or during) the iteration: ``ids`` and ``from_draft`` hold every token emitted so far and
    whether it was an accepted draft, ``reason`` why the loop ended (one of :data:`REASONS`; None
    while it runs, or when an engine error ended it) and ``error`` the :class:`CancelledError` of a
    cancelled step."""

    def __init__(self, session: "Session", max_tokens: int, *, stop: Iterable[int] = (),
                 cancelled: Callable[[], bool] | None = None, batch_s: float = BATCH_S):
        if isinstance(max_tokens, bool) or int(max_tokens) != max_tokens or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.session = session
        self.max_tokens = int(max_tokens)
        self.stop = frozenset(int(t) for t in stop)
        self.cancelled = cancelled
        self.batch_s = float(batch_s)
        self.ids: list[int] = []
        self.from_draft: list[bool] = []
        self.reason: str | None = None
        self.error: CancelledError | None = None
        self._batch: list[list[int]] = []  # cycles run by the engine, not yet handed out

    @property
    def n_draft(self) -> int:
        """Emitted tokens that were accepted drafts."""
        return sum(self.from_draft)

    def _take(self) -> Cycle:
        """The next cycle of the batch the engine ran, cut after a stop token (the session rewound to
        it), added to ``ids``."""
        got = self._batch.pop(0)
        last = len(got) - 1
        at = next((j for j, t in enumerate(got) if t in self.stop), None) if self.stop else None
        if at is not None:
            if at < last:  # a stop among the accepted drafts: the session goes back to it
                self.session.rewind(last - at)  # (a batch ends with the cycle that emitted a stop)
            got = got[:at + 1]
            self._batch = []
        cycle = Cycle(tuple(got), tuple(j < last for j in range(len(got))), at is not None)
        self.ids += cycle.tokens
        self.from_draft += cycle.from_draft
        if cycle.stopped:
            self.reason = "stop"  # set before the caller sees the cycle, so it may break here
        return cycle

    def computed_rest(self) -> list[Cycle]:
        """The cycles the engine has already run that the iteration has not handed out yet: the rest
        of the current batch (:meth:`Session.step_many` runs up to 256 tokens at once).  A caller that
        stops iterating mid-batch (an interrupt while it shows a cycle) takes them, so that ``ids``,
        the session's KV cache and its DSpark statistics cover the same tokens; taking them adds them
        to ``ids``, and a stop token among them ends them as in the iteration.  Runs nothing."""
        out = []
        while self._batch:
            out.append(self._take())
        return out

    def __iter__(self) -> Iterator[Cycle]:
        s, stop = self.session, self.stop
        while True:
            if len(self.ids) >= self.max_tokens:
                self.reason = "max_tokens"
                return
            if self.cancelled is not None and self.cancelled():
                self.reason = "cancelled"
                return
            if s.pending is not None and s.n_tokens + 1 > s.n_ctx:
                self.reason = "ctx"
                return
            try:
                # the first cycle is a batch of its own: its token is shown (and timed) as soon as it exists
                left = self.max_tokens - len(self.ids)
                max_cycles = STEP_MANY_OUT if self.ids else 1
                if left > STEP_MANY_OUT:
                    # the batch's ids, not the budget, end it: only as many cycles as leave each
                    # one room for the anchor and a whole draft, so that no draft is cut to the
                    # batch's end (nor counted as a budget's tail or no_room)
                    max_cycles = min(max_cycles, STEP_MANY_OUT // (1 + s.engine.block_size))
                cycles, error = s.step_many(min(STEP_MANY_OUT, left), max_cycles=max_cycles,
                                            budget_s=self.batch_s, stop=stop)
            except CancelledError as exc:
                self.reason, self.error = "cancelled", exc
                return
            self._batch = list(cycles)
            if isinstance(error, KeyboardInterrupt):  # a signal during the batch: its cycles are
                raise error  # computed_rest(), for the caller that stops on it
            while self._batch:
                cycle = self._take()
                yield cycle
                if cycle.stopped:
                    return
            if isinstance(error, CancelledError):
                self.reason, self.error = "cancelled", error
                return
            if error is not None:
                raise error
