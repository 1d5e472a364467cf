"""The DSpark scheduler replayed on a recorded text (spec dspark.md §7.5).

A session's scheduler decides from times it measures; on a shared machine those swing by a third,
so two versions of a policy cannot be told apart on a few runs of ``bench --ab``.  The replay runs
the engine's own decisions (``ds4_dspark_replay`` in ``native/scheduler.c``, the code a session's
cycles call) on an acceptance trace — for each anchor position, how many of the block's drafts the
target accepts there — with each pass's cost given, so that a policy is measured on many texts in
milliseconds and without noise.  ``tools/scheduler_replay.py`` records traces of the demo pair and
prints the replayed rates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ds4tui.engine.errors import native_error
from ds4tui.engine.prices import SchedulerPrices
from ds4tui.engine.stats import NO_DRAFT_REASONS


@dataclass(frozen=True)
class Costs:
    """What each pass costs in a replay, in ms: a plain decode, a proposal of the whole block, and a
    verify of ``n`` rows (``t_verify[n]`` for n = 2 .. block + 1)."""

    t_decode: float
    t_propose: float
    t_verify: Mapping[int, float]


@dataclass(frozen=True)
class ReplayResult:
    """A replayed decode: its time ``ms`` for ``tokens`` tokens in ``cycles`` cycles, of which
    ``drafted_cycles`` verified ``proposed`` drafts and accepted ``accepted``; ``no_draft``: the
    plain cycles by reason (:data:`~ds4tui.engine.stats.NO_DRAFT_REASONS` names); ``end``: the
    scheduler's prices after it (what a session would hand on)."""

    ms: float
    tokens: int
    cycles: int
    drafted_cycles: int
    proposed: int
    accepted: int
    no_draft: dict[str, int]
    end: SchedulerPrices

    def ratio_to_target(self, t_decode: float) -> float:
        """Tokens per ms over what target-only decoding gives (one token per ``t_decode`` ms)."""
        return self.tokens * t_decode / self.ms


def replay_scheduler(accepted: Sequence[int], n_tokens: int, costs: Costs, *, block: int = 5,
                     max_draft: int | None = None, scheduler: bool = True, start: SchedulerPrices | None = None,
                     kept: bool = False) -> ReplayResult:
    """Replay ``n_tokens`` greedy tokens (1 .. ``len(accepted)``) of a text whose drafts the target
    accepts ``accepted[p]`` of ``block`` at anchor position ``p``, with DSpark on, the scheduler on
    or off (``scheduler``), drafts of at most ``max_draft`` (default the block) and no confidence
    cut, from ``start`` prices (None: a fresh session; ``kept``: kept from other sessions, as the
    engine starts a session, else used as given).

    Raises ValueError naming the argument out of range (the engine's message)."""
    from ds4tui import _native

    ffi, lib = _native.ffi, _native.lib
    acc = bytes(int(a) if 0 <= int(a) <= 255 else 255 for a in accepted)
    knobs = ffi.new("ds4_dspark_knobs *", {"enabled": 1, "scheduler": int(bool(scheduler)), "threshold": 0.0,
                                           "max_draft": int(block if max_draft is None else max_draft)})
    c = ffi.new("ds4_dspark_costs *")
    c.t_decode, c.t_propose = float(costs.t_decode), float(costs.t_propose)
    for n, ms in costs.t_verify.items():
        if not 0 <= int(n) < len(c.t_verify):
            raise ValueError(f"costs.t_verify: width {n} is outside 2..{len(c.t_verify) - 1}")
        c.t_verify[int(n)] = float(ms)
    end = ffi.new("ds4_dspark_prices *")
    out = ffi.new("ds4_dspark_replay_result *")
    err = ffi.new("char[512]")
    rc = lib.ds4_dspark_replay(start.to_native(ffi) if start is not None else ffi.NULL, int(kept), knobs, int(block),
                               ffi.from_buffer(acc) if acc else ffi.NULL, len(acc), int(n_tokens), c, end, out, err,
                               512)
    if rc != 0:
        msg = ffi.string(err).decode(errors="replace")
        if rc == -1:  # DS4_E_INVALID: the caller's argument
            raise ValueError(msg)
        raise native_error(rc, msg)
    return ReplayResult(ms=float(out.ms), tokens=int(out.tokens), cycles=int(out.cycles),
                        drafted_cycles=int(out.drafted_cycles), proposed=int(out.proposed),
                        accepted=int(out.accepted),
                        no_draft={name: int(out.no_draft_reasons[i]) for i, name in enumerate(NO_DRAFT_REASONS)
                                  if out.no_draft_reasons[i]},
                        end=SchedulerPrices.from_native(end))
