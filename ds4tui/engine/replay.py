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
import math
from dataclasses import dataclass

import numpy as np

from ds4tui.engine.backend import DSparkKnobs, check_policy, knobs_to_native
from ds4tui.engine.errors import native_error
from ds4tui.engine.prices import MAX_MS, SchedulerPrices
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


#: The shortest time a replay takes as a pass's cost: below it the rates lose their digits.
MIN_MS = 1e-6


def time_ms(name: str, value) -> float:
    """``value`` as a time in ms: a real number (not a bool or a string), finite, MIN_MS..MAX_MS,
    else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number of ms, got {value!r}")
    try:
        ms = float(value)
    except OverflowError:
        ms = math.inf
    if not (math.isfinite(ms) and MIN_MS <= ms <= MAX_MS):
        raise ValueError(f"{name} must be a finite time {MIN_MS:g}..{MAX_MS:g} ms, got {value!r}")
    return ms


def _whole(name: str, value, lo: int, hi: int) -> int:
    """``value`` as an int in lo..hi, else ValueError naming ``name`` (bools and floats are no counts)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a whole number {lo}..{hi}, got {value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name} must be {lo}..{hi}, got {int(value)}")
    return int(value)


def replay_scheduler(accepted: Sequence[int], n_tokens: int, costs: Costs, *, policy: str, block: int = 5,
                     max_draft: int | None = None, scheduler: bool = True, start: SchedulerPrices | None = None,
                     kept: bool = False, confidence: Sequence[Sequence[float]] | None = None,
                     threshold: float = 0.0) -> ReplayResult:
    """Replay ``n_tokens`` greedy tokens (1 .. ``len(accepted)``) of a text whose drafts the target
    accepts ``accepted[p]`` (a whole number 0 .. ``block``) of ``block`` at anchor position ``p``, with
    DSpark on, the scheduler on or off (``scheduler``) with ``policy`` (one of
    :data:`~ds4tui.engine.backend.SCHEDULER_POLICIES`), drafts of at most ``max_draft`` (default the
    block), from ``start`` prices (None: a fresh session; ``kept``: kept from other sessions, as the
    engine starts a session, else used as given).  ``confidence`` (None: not recorded): one sequence
    per position of the raw confidences c_1 .. of the proposal there (at most ``block`` numbers in
    [0, 1]; a shorter one is a proposal that ended there), which the "confidence" policy needs and
    ``threshold`` (in [0, 1], 0 without confidences) cuts.  ``costs.t_verify`` must price every
    width 2 .. block + 1 and no other; every time is a number of ms in [MIN_MS, MAX_MS].

    Raises ValueError naming the argument out of range and the range (the engine's message for the
    checks it makes itself), and :class:`~ds4tui.engine.errors.NativeNotBuiltError` when the native
    engine is not built."""
    from ds4tui.engine.session import require_native

    require_native("cpu")  # NativeNotBuiltError saying what to run, rather than an ImportError
    from ds4tui import _native

    ffi, lib = _native.ffi, _native.lib
    max_block = len(ffi.new("ds4_dspark_prices *").reached)
    for name, flag in (("scheduler", scheduler), ("kept", kept)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    block = _whole("block", block, 1, max_block)
    max_draft = _whole("max_draft", block if max_draft is None else max_draft, 1, block)
    if (not isinstance(accepted, (Sequence, np.ndarray)) or isinstance(accepted, (str, bytes))
            or getattr(accepted, "ndim", 1) != 1):
        raise ValueError(f"accepted must be a sequence of whole numbers 0..{block}, got {accepted!r:.60}")
    acc = bytes(_whole(f"accepted[{p}]", a, 0, block) for p, a in enumerate(accepted))
    if not acc:
        raise ValueError("accepted is empty: a replay needs a recorded position for each token it emits")
    n_tokens = _whole("n_tokens", n_tokens, 1, len(acc))
    if not isinstance(costs, Costs):
        raise ValueError(f"costs must be a ds4tui.engine.replay.Costs, got {type(costs).__name__}")
    if start is not None and not isinstance(start, SchedulerPrices):
        raise ValueError(f"start must be SchedulerPrices or None, got {type(start).__name__}")
    if not isinstance(costs.t_verify, Mapping):
        raise ValueError(f"costs.t_verify must map verify widths 2..{block + 1} to ms, got "
                         f"{type(costs.t_verify).__name__}")
    widths = [_whole("costs.t_verify's width", n, 0, 1 << 30) for n in costs.t_verify]
    widths.sort()
    if widths != list(range(2, block + 2)):
        raise ValueError(f"costs.t_verify must price exactly the verify widths 2..{block + 1} (block {block}), got "
                         f"widths {widths}")
    check_policy(policy, "policy")
    if (isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, (int, float, np.integer, np.floating))
            or not 0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold must be a number in [0, 1], got {threshold!r}")
    conf = ffi.NULL
    if confidence is not None:
        if len(confidence) != len(acc):
            raise ValueError(f"confidence must hold one sequence per position of accepted ({len(acc)}), got "
                             f"{len(confidence)}")
        arr = np.zeros((len(acc), block), dtype=np.float32)
        for p, row in enumerate(confidence):
            if len(row) > block:
                raise ValueError(f"confidence[{p}] holds {len(row)} numbers, more than the block ({block})")
            arr[p, :len(row)] = np.asarray(row, dtype=np.float32)
        conf = ffi.from_buffer("float[]", arr)
    knobs = knobs_to_native(ffi, DSparkKnobs(True, bool(scheduler), float(threshold), max_draft, policy))
    c = ffi.new("ds4_dspark_costs *")
    c.t_decode, c.t_propose = time_ms("costs.t_decode", costs.t_decode), time_ms("costs.t_propose", costs.t_propose)
    for n in widths:
        c.t_verify[n] = time_ms(f"costs.t_verify[{n}]", costs.t_verify[n])
    native_start = ffi.NULL
    if start is not None:
        try:
            native_start = start.to_native(ffi)
        except (IndexError, TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"start prices: widths 1..{max_block + 1}, counts of positions 0..{max_block - 1}, "
                             f"times in ms expected ({type(exc).__name__}: {exc})") from None
    end = ffi.new("ds4_dspark_prices *")
    out = ffi.new("ds4_dspark_replay_result *")
    err = ffi.new("char[512]")
    rc = lib.ds4_dspark_replay(native_start, int(bool(kept)), knobs, block,
                               ffi.from_buffer(acc), conf, len(acc), n_tokens, c, end, out, err, 512)
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
