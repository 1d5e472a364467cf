"""DSpark statistics of a session: a frozen dataclass, ds4's stats line, JSON.

:class:`DSparkStats` mirrors ``ds4_dspark_stats`` of ``ds4tui/native/ds4_engine.h`` with the stat
names of spec dspark.md §6, so the numbers read the same as ds4's ``DS4_DSPARK_STATS`` output.
The counters are monotonic per session; rates and per-cycle values are derived here, never
stored.  A cycle ends in exactly one of full, partial, miss_first, no_draft, invalid,
verifier_unavailable and errors; both length histograms have one entry per cycle (bin 0 for
cycles that verified no draft); :meth:`DSparkStats.check_invariants` says which of these rules a
snapshot breaks.

:func:`format_line` writes ds4's line (``ds4_session_print_dspark_stats``): its keys in its order,
counters as integers, ``accept_rate`` with two decimals and ``%``, ``avg_accept`` with three, the
word ``time_ms`` and then every time in milliseconds with three decimals and no unit, histograms
as ``len:count`` pairs.  Our keys (``chain_fail``, ``chain_fail_op``, ``no_draft_reasons``) come
after ds4's (and ``stop_cut`` once a stop token cut a cycle), so a parser written for ds4's line
still reads ours.  :func:`parse_line` reads either line back into a dict.

Nothing here needs the native module: :meth:`DSparkStats.from_native` takes the ``ffi`` and the
cdata it is given.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

#: ds4_engine.h's DS4_ND_* indices, in order.
NO_DRAFT_REASONS = (
    "disabled",
    "support_invalid",
    "capture_invalid",
    "chain_fail",
    "confidence_gate",
    "scheduler_skip",
    "tail_skip",
    "no_room",
    "confidence_cut",
)
#: Why a cycle made no draft and what to do about it, one entry per name of
#: :data:`NO_DRAFT_REASONS` (spec dspark.md §3.4): the app's no-draft pane and help screen show
#: these, and the README's table of reasons is this table (a test holds them equal).
NO_DRAFT_HELP: dict[str, tuple[str, str]] = {
    "disabled": ("DSpark is switched off, or no support model is attached.",
                 "F2 turns DSpark on; start with --mtp SUPPORT.gguf to attach a support model."),
    "support_invalid": ("The support model was refused when it loaded (it does not match the model, or a "
                        "tensor is missing or damaged); the support pane says why.",
                        "Use a support file made for this model: `ds4tui inspect MODEL --mtp SUPPORT` "
                        "lists every problem."),
    "capture_invalid": ("The target's hidden rows that the drafter reads do not cover the current position, "
                        "so nothing can be drafted from them.",
                        "Nothing to set: an engine fault. Export the stats (F6) and report it."),
    "chain_fail": ("An operation of the drafter failed while proposing; `chain_fail_op` names it.",
                   "Decoding goes on target-only. Report it with the stats export (F6); --backend cpu "
                   "shows whether the GPU backend is at fault."),
    "confidence_gate": ("The drafter's confidence in its first token was below the threshold, so no draft "
                        "was worth verifying.",
                        "Lower the confidence threshold (F7, or type it in the knobs pane); 0 always drafts."),
    "scheduler_skip": ("The adaptive scheduler skipped drafting: it times plain decodes first (five in a session "
                       "with no kept prices, one with them, and one after every 64 drafted cycles), and then backs "
                       "off for 2, 4, ... 128 cycles where drafting did not pay. Under the confidence policy (the "
                       "default) a back-off follows cycles that gained no time; under the acceptance policy it "
                       "follows a cost model that expects no gain, and ends in a probe (a draft of the length that "
                       "could still pay; a one-draft probe after 256 cycles when drafting could not beat plain "
                       "decoding by 25 % even at an optimistic acceptance).",
                       "Nothing is wrong: drafting does not pay here (stage timings: one verify in plain "
                       "decodes; what the tries cost is in `net_saved`). F3 turns the scheduler off to draft "
                       "every cycle anyway."),
    "tail_skip": ("The answer's budget (-n) left room for so few draft tokens that drafting them could not pay, "
                  "where a full draft would have, or for fewer than the probe that ends a back-off drafts (the "
                  "probe waits for the next cycle with room): the scheduler decoded the token plainly.",
                  "Nothing to do: only the last tokens of a budget (-n) are affected."),
    "no_room": ("The budget, the context or the batch left no room for even one draft token.",
                "Raise the token budget (-n) or the context (--ctx; Ctrl+G in the app)."),
    "confidence_cut": ("The scheduler's confidence policy found no draft of the proposal likely enough to be "
                       "accepted to pay for its verify, so the cycle decoded plainly. It skips the proposals of "
                       "the next 2, 4, ... 128 cycles while cycles do not gain time, and starts again at 2 after "
                       "one that does.",
                       "Nothing is wrong: the drafter was unsure here (`conf_hist` in the stats JSON shows how sure). "
                       "The acceptance policy (Ctrl+R or the knobs pane; --scheduler-policy acceptance on the "
                       "command line) decides from the acceptance measured at each draft position instead; F3 "
                       "turns the scheduler off to verify every proposal."),
}

#: Fields of :class:`DSparkStats` that the session counts, not ``ds4_dspark_stats`` (0 from the C struct).
SESSION_FIELDS = ("stop_cut",)
#: DS4_DSPARK_MAX_BLOCK: the largest drafter block.
MAX_BLOCK = 16
#: DS4_DSPARK_CONF_BINS: bin i counts confidences in [i/20, (i+1)/20).
CONF_BINS = 20

# ds4's line order (spec dspark.md §6).
_LINE_COUNTS_A = ("cycles", "first_tokens", "proposed", "accepted_draft")
_LINE_COUNTS_B = (
    "full",
    "partial",
    "miss_first",
    "no_draft",
    "no_room",
    "invalid",
    "scheduler_skips",
    "tail_skips",
    "verifier_unavailable",
    "errors",
)
_COUNTS = _LINE_COUNTS_A + _LINE_COUNTS_B + ("chain_fail", "verify_head_rows")
# Milliseconds; the C field is the name with "_ms" appended.
_TIMES = (
    "propose",
    "prop_stage0",
    "prop_setup",
    "prop_cache",
    "prop_chain",
    "prop_hidden",
    "prop_conf0",
    "prop_logits",
    "prop_markov",
    "prop_confidence",
    "snapshot",
    "verify",
    "spec_total",
    "target",
    "saved",
    "net_saved",
)
#: ds4's stat times, in milliseconds (the stats line's ``time_ms`` part; the C fields end in ``_ms``).
TIMES = _TIMES
#: The drafter's steps (spec dspark.md §5), timed per drafter pass.
PROP_STAGES = tuple(t for t in _TIMES if t.startswith("prop_"))


def timed_stages(backend: str) -> tuple[str, ...]:
    """The drafter's steps (:data:`PROP_STAGES`) the engine times on ``backend`` (native/dspark.c's
    ``propose``): never ``prop_stage0`` (ds4's readiness check of stage 0, whose main_proj runs here
    in the context projection, ``prop_cache``), and on the GPU (``"hip"``) neither ``prop_setup`` nor
    ``prop_hidden`` (the embedding, the stages and the HC head run as one queued sequence, timed as
    ``prop_chain``).  The others stay 0 too, but for a pass cut short (a confidence gate).  The stats
    line and the JSON keep every name."""
    untimed = ("prop_stage0", "prop_setup", "prop_hidden") if backend == "hip" else ("prop_stage0",)
    return tuple(name for name in PROP_STAGES if name not in untimed)
_LEN_HISTS = ("draft_len_hist", "accepted_len_hist")
_POS = ("pos_proposed", "pos_accepted")
_DERIVED = (
    "accept_rate",
    "avg_accept",
    "tokens_per_cycle",
    "per_position_accept",
    "dominant_no_draft_reason",
    "dominant_no_draft_reasons",
    "stage_timing",
    "stage_ms_per_cycle",  # written by earlier versions (every stage over all cycles); read, not written
    "invariant_violations",
)


def _counts(values, least: int, what: str) -> tuple[int, ...]:
    """Non-negative ints, padded with zeros to ``least`` entries; trailing zeros past it dropped
    (a non-zero entry past it is kept, so check_invariants can name it)."""
    out = [int(v) for v in values]
    if any(v < 0 for v in out):
        raise ValueError(f"{what}: negative count in {out}")
    while len(out) > least and out[-1] == 0:
        out.pop()
    return tuple(out + [0] * (least - len(out)))


@dataclass(frozen=True)
class DSparkStats:
    """One snapshot of a session's DSpark counters (``ds4_dspark_stats``).

    Counts are integers; every time (``propose`` … ``net_saved``, ``t_decode_ms``) is in
    milliseconds.  ``draft_len_hist[k]`` / ``accepted_len_hist[k]`` count cycles that verified /
    accepted k draft tokens (block_size + 1 bins); ``pos_proposed[k]`` / ``pos_accepted[k]`` count
    cycles that verified / accepted a draft at block row k (block_size entries); ``conf_hist``
    bins every computed confidence c_k into 20 bins of width 0.05; ``no_draft_reasons`` maps each
    name of :data:`NO_DRAFT_REASONS` to the no_draft cycles it ended.
    """

    cycles: int = 0
    first_tokens: int = 0
    proposed: int = 0
    accepted_draft: int = 0
    full: int = 0
    partial: int = 0
    miss_first: int = 0
    no_draft: int = 0
    no_room: int = 0
    invalid: int = 0
    scheduler_skips: int = 0
    tail_skips: int = 0
    verifier_unavailable: int = 0
    errors: int = 0
    chain_fail: int = 0
    propose: float = 0.0
    prop_stage0: float = 0.0
    prop_setup: float = 0.0
    prop_cache: float = 0.0
    prop_chain: float = 0.0
    prop_hidden: float = 0.0
    prop_conf0: float = 0.0
    prop_logits: float = 0.0
    prop_markov: float = 0.0
    prop_confidence: float = 0.0
    snapshot: float = 0.0
    verify: float = 0.0
    spec_total: float = 0.0
    target: float = 0.0
    saved: float = 0.0
    net_saved: float = 0.0
    #: Single-token target pass time that ``saved`` is priced at.
    t_decode_ms: float = 0.0
    #: False until a plain decode was measured: ``saved`` and ``net_saved`` are then unknown (0).
    t_decode_measured: bool = False
    block_size: int = 0
    draft_len_hist: tuple[int, ...] = ()
    accepted_len_hist: tuple[int, ...] = ()
    pos_proposed: tuple[int, ...] = ()
    pos_accepted: tuple[int, ...] = ()
    conf_hist: tuple[int, ...] = ()
    # Left out of the hash (a dict is not hashable); still compared.
    no_draft_reasons: dict[str, int] = field(default_factory=dict, hash=False)
    #: The drafter op of the last chain failure ("" if none).
    chain_fail_op: str = ""
    #: Knob changes applied so far.
    n_events: int = 0
    #: LM-head rows the verify passes computed (ours; spec dspark.md §3.4): 1 + drafts per drafted
    #: cycle under verify_head all; under lazy the first 3 rows (fewer with fewer drafts), and the
    #: others only in cycles that accepted the drafts of those 3 rows.  Rows a verify did not need:
    #: ``proposed + drafted_cycles - verify_head_rows``.
    verify_head_rows: int = 0
    #: Cycles whose accepted drafts a stop token cut after the verifier had decided (ours, counted
    #: by ``Session.rewind``): the drafts after the stop were never emitted, so ``accepted_draft``,
    #: ``accepted_len_hist`` and ``pos_accepted`` count the cycle with fewer accepted drafts, while
    #: its outcome (``full`` or ``partial``) and ``proposed`` stay as the verifier decided.  A full
    #: cycle cut this way has no accepted length equal to its draft length, hence the invariant
    #: ``full <= sum_k min(draft_len_hist[k], accepted_len_hist[k]) + stop_cut``.
    stop_cut: int = 0

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name in _COUNTS + ("block_size", "n_events", "stop_cut"):
            v = int(getattr(self, name))
            if v < 0:
                raise ValueError(f"{name} = {v} < 0")
            put(self, name, v)
        for name in _TIMES + ("t_decode_ms",):
            put(self, name, float(getattr(self, name)))
        put(self, "t_decode_measured", bool(self.t_decode_measured))
        put(self, "chain_fail_op", str(self.chain_fail_op))
        for name in _LEN_HISTS:
            put(self, name, _counts(getattr(self, name), self.block_size + 1, name))
        for name in _POS:
            put(self, name, _counts(getattr(self, name), self.block_size, name))
        put(self, "conf_hist", _counts(self.conf_hist, CONF_BINS, "conf_hist"))
        reasons = dict(self.no_draft_reasons)
        unknown = sorted(set(reasons) - set(NO_DRAFT_REASONS))
        if unknown:
            raise ValueError(f"no_draft_reasons: unknown names {unknown}; known: {list(NO_DRAFT_REASONS)}")
        counts = _counts([reasons.get(n, 0) for n in NO_DRAFT_REASONS], len(NO_DRAFT_REASONS), "no_draft_reasons")
        put(self, "no_draft_reasons", dict(zip(NO_DRAFT_REASONS, counts)))

    # ---- reading -----------------------------------------------------------------------------

    @classmethod
    def from_native(cls, ffi, struct_ptr) -> "DSparkStats":
        """Read a ``ds4_dspark_stats *`` (or the struct itself) filled by the engine."""
        p = struct_ptr
        block = int(p.block_size)
        kw: dict[str, Any] = {name: int(getattr(p, name)) for name in _COUNTS}
        kw.update({name: float(getattr(p, name + "_ms")) for name in _TIMES})
        kw.update(
            t_decode_ms=float(p.t_decode_ms),
            t_decode_measured=bool(p.t_decode_measured),
            block_size=block,
            n_events=int(p.n_events),
            conf_hist=list(p.conf_hist),
            no_draft_reasons=dict(zip(NO_DRAFT_REASONS, list(p.no_draft_reasons))),
            chain_fail_op=ffi.string(p.chain_fail_op).decode("utf-8", "replace"),
        )
        # Trimming happens in __post_init__ (non-zero bins past the block are kept).
        for name in _LEN_HISTS + _POS:
            kw[name] = list(getattr(p, name))
        return cls(**kw)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DSparkStats":
        """Inverse of :meth:`to_dict` (derived values are ignored; missing fields are 0)."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known - set(_DERIVED))
        if unknown:
            raise ValueError(f"DSparkStats.from_dict: unknown keys {unknown}")
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        """Every field plus the derived values, ready for ``json.dumps`` (``accept_rate`` None where nothing was
        proposed)."""
        d: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            d[name] = list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v
        d.update(
            # none where nothing was proposed (as the panes and bench's arms say), where the stats line keeps
            # ds4's 0.00%: 0.0 compared against a run that drafted read as every draft rejected
            accept_rate=self.accept_rate if self.proposed else None,
            avg_accept=self.avg_accept,
            tokens_per_cycle=self.tokens_per_cycle,
            per_position_accept=list(self.per_position_accept),
            dominant_no_draft_reason=self.dominant_no_draft_reason,
            dominant_no_draft_reasons=list(self.dominant_no_draft_reasons),
            stage_timing=self.stage_timing(),
            invariant_violations=self.check_invariants(),
        )
        return d

    # ---- derived values ----------------------------------------------------------------------

    @property
    def accept_rate(self) -> float:
        """Percent of proposed draft tokens accepted: 100·accepted_draft/proposed (0 if none proposed)."""
        return 100.0 * self.accepted_draft / self.proposed if self.proposed else 0.0

    @property
    def avg_accept(self) -> float:
        """Accepted draft tokens per cycle (tokens per cycle = 1 + avg_accept)."""
        return self.accepted_draft / self.cycles if self.cycles else 0.0

    @property
    def tokens_per_cycle(self) -> float:
        """(first_tokens + accepted_draft) / cycles."""
        return (self.first_tokens + self.accepted_draft) / self.cycles if self.cycles else 0.0

    @property
    def per_position_accept(self) -> tuple[float | None, ...]:
        """Per block row k: accepted / verified drafts at row k (None where none was verified)."""
        return tuple(a / p if p else None for p, a in zip(self.pos_proposed, self.pos_accepted))

    @property
    def dominant_no_draft_reason(self) -> str | None:
        """The reason that ended most no_draft cycles, None when none did; on a tie the first in
        index order, and :attr:`dominant_no_draft_reasons` names every tied one."""
        tied = self.dominant_no_draft_reasons
        return tied[0] if tied else None

    @property
    def dominant_no_draft_reasons(self) -> tuple[str, ...]:
        """Every reason that ended the most no_draft cycles, in index order: one name, or several
        that tie at that count; empty when no cycle went without a draft."""
        top = max((self.no_draft_reasons[n] for n in NO_DRAFT_REASONS), default=0) if self.no_draft else 0
        return tuple(n for n in NO_DRAFT_REASONS if self.no_draft_reasons[n] == top) if top else ()

    @property
    def drafted_cycles(self) -> int:
        """Cycles that verified a draft (full + partial + miss_first): what ``verify`` is spent on."""
        return self.full + self.partial + self.miss_first

    @property
    def drafter_passes(self) -> int:
        """Cycles in which the drafter ran (what ``propose`` and the ``prop_*`` steps are spent on):
        the drafted cycles plus those whose proposal came to nothing (``confidence_gate``,
        ``chain_fail``, ``confidence_cut``) or held an invalid token.  Skipped and switched-off cycles
        run no drafter."""
        r = self.no_draft_reasons
        return self.drafted_cycles + r["confidence_gate"] + r["chain_fail"] + r["confidence_cut"] + self.invalid

    @property
    def plain_decodes(self) -> int:
        """Cycles that ran their anchor as a plain one-token decode (no_draft + invalid): what
        ``target`` is spent on, so ``target / plain_decodes`` is the plain decode time."""
        return self.no_draft + self.invalid

    def stage_timing(self) -> dict[str, Any]:
        """Stage times in the unit each is spent in (spec dspark.md §6.2), with the counts they are
        divided by: every drafter step (``prop_*``) and ``propose`` per drafter pass, ``verify``
        and ``spec_total`` per drafted cycle, ``target`` per plain decode (ms; None where the count
        is 0), the rows a verify ran and those it computed the LM head of (verify_head, spec dspark.md
        §3.4) per drafted cycle, and ``verify_over_decode``, what one verify costs in plain decodes.  ds4's line keeps
        ds4's totals; dividing a stage by all cycles, drafted or not, would hide its real cost when
        the scheduler skips most cycles."""
        def per(total: float, n: int) -> float | None:
            return total / n if n else None

        p, v, d = self.drafter_passes, self.drafted_cycles, self.plain_decodes
        verify, decode = per(self.verify, v), per(self.target, d)
        return {
            "drafter_passes": p,
            "ms_per_drafter_pass": {s: per(getattr(self, s), p) for s in PROP_STAGES + ("propose",)},
            "drafted_cycles": v,
            "verify_ms_per_drafted_cycle": verify,
            "verify_rows_per_drafted_cycle": per(self.proposed + v, v),
            "verify_head_rows_per_drafted_cycle": per(self.verify_head_rows, v),
            "spec_total_ms_per_drafted_cycle": per(self.spec_total, v),
            "plain_decodes": d,
            "decode_ms_per_plain_decode": decode,
            "verify_over_decode": verify / decode if verify is not None and decode else None,
        }

    def check_invariants(self) -> list[str]:
        """The rules of ds4_engine.h that this snapshot breaks (empty when consistent)."""
        bad: list[str] = []

        def need(ok: bool, text: str) -> None:
            if not ok:
                bad.append(text)

        def same(lhs: str, a: int, rhs: str, b: int) -> None:
            need(a == b, f"{lhs} {a} != {rhs} {b}")

        r = self.no_draft_reasons
        need(self.accepted_draft <= self.proposed, f"accepted_draft {self.accepted_draft} > proposed {self.proposed}")
        ends = ("full", "partial", "miss_first", "no_draft", "invalid", "verifier_unavailable", "errors")
        same("+".join(ends), sum(getattr(self, e) for e in ends), "cycles", self.cycles)
        for name in _LEN_HISTS:
            h = getattr(self, name)
            same(f"sum({name})", sum(h), "cycles", self.cycles)
            need(len(h) <= self.block_size + 1, f"{name} has counts past block_size {self.block_size}: {list(h)}")
        weighted = sum(k * c for k, c in enumerate(self.accepted_len_hist))
        same("sum(k*accepted_len_hist[k])", weighted, "accepted_draft", self.accepted_draft)
        same("sum(no_draft_reasons)", sum(r.values()), "no_draft", self.no_draft)
        for stat, reason in (
            ("no_room", "no_room"),
            ("scheduler_skips", "scheduler_skip"),
            ("tail_skips", "tail_skip"),
            ("chain_fail", "chain_fail"),
        ):
            same(stat, getattr(self, stat), f"no_draft_reasons[{reason}]", r[reason])
        rows = self.proposed + self.drafted_cycles  # a drafted cycle verifies its anchor and its drafts
        need(self.verify_head_rows <= rows, f"verify_head_rows {self.verify_head_rows} > proposed + drafted cycles {rows}")
        sp, sa = sum(self.pos_proposed), sum(self.pos_accepted)
        need(sa <= sp, f"sum(pos_accepted) {sa} > sum(pos_proposed) {sp}")
        for k, (p, a) in enumerate(zip(self.pos_proposed, self.pos_accepted)):
            need(a <= p, f"pos_accepted[{k}] {a} > pos_proposed[{k}] {p}")
        for name in _POS:
            need(len(getattr(self, name)) <= self.block_size, f"{name} has counts past block_size {self.block_size}")
        # Both count verified / accepted draft tokens, by row and by cycle.
        same("sum(pos_proposed)", sp, "sum(k*draft_len_hist[k])", sum(k * c for k, c in enumerate(self.draft_len_hist)))
        same("sum(pos_accepted)", sa, "accepted_draft", self.accepted_draft)
        # full and partial cycles accepted at least one draft, every other outcome none; a rewind
        # may leave a cut cycle none (the decode loop keeps the stop token, so it leaves one)
        fp, ge1 = self.full + self.partial, sum(self.accepted_len_hist[1:])
        need(self.stop_cut <= fp, f"stop_cut {self.stop_cut} > full+partial {fp}")
        need(ge1 <= fp <= ge1 + self.stop_cut,
             f"full+partial {fp} is not within sum(accepted_len_hist[k>=1]) {ge1} .. that + stop_cut {self.stop_cut}")
        # a full cycle of k drafts is counted at k in both histograms, unless a stop token cut it
        both = sum(min(d, a) for d, a in zip(self.draft_len_hist[1:], self.accepted_len_hist[1:]))
        need(self.full <= both + self.stop_cut,
             f"full {self.full} > sum(min(draft_len_hist[k], accepted_len_hist[k]), k>=1) {both} + stop_cut "
             f"{self.stop_cut}: a full cycle must accept as many drafts as it verified, or be cut by a stop token")
        return bad


# ---- the ds4 stats line --------------------------------------------------------------------------


def _hist(pairs: list[tuple[Any, int]]) -> str:
    text = ",".join(f"{k}:{c}" for k, c in pairs if c)
    return text or "none"


def format_line(stats: DSparkStats) -> str:
    """ds4's ``DSpark stats`` line for ``stats``, then our keys.

    ``draft_len_hist`` leaves out bin 0 (cycles that verified nothing): ds4 records a draft
    length only when a block is proposed, so its line shows ``draft_len_hist=none`` for a session
    that never drafted; the count is cycles minus the listed bins.  ``accepted_len_hist`` keeps
    bin 0, as ds4's does.
    """
    s = stats
    parts = ["DSpark stats"]
    parts += [f"{k}={getattr(s, k)}" for k in _LINE_COUNTS_A]
    parts += [f"accept_rate={s.accept_rate:.2f}%", f"avg_accept={s.avg_accept:.3f}"]
    parts += [f"{k}={getattr(s, k)}" for k in _LINE_COUNTS_B]
    parts.append("time_ms")
    parts += [f"{k}={round(getattr(s, k), 3) + 0.0:.3f}" for k in _TIMES]  # + 0.0: no "-0.000"
    parts.append("draft_len_hist=" + _hist(list(enumerate(s.draft_len_hist))[1:]))
    parts.append("accepted_len_hist=" + _hist(list(enumerate(s.accepted_len_hist))))
    parts.append(f"chain_fail={s.chain_fail}")
    if s.chain_fail_op:
        parts.append("chain_fail_op=" + re.sub(r"[\s=]", "_", s.chain_fail_op))
    parts.append("no_draft_reasons=" + _hist(list(s.no_draft_reasons.items())))
    if s.stop_cut:
        parts.append(f"stop_cut={s.stop_cut}")
    return " ".join(parts)


_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(nan|inf)", re.I)


def _number(text: str) -> int | float | None:
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return None


def parse_line(text: str) -> dict[str, Any]:
    """Read a ``DSpark stats`` line (ours or any ds4 build's) into a dict.

    Reading starts after the last ``DSpark stats`` in ``text`` (or at its start) and the line may
    be wrapped.  Integers become int and times float (a trailing ``ms`` is accepted);
    ``accept_rate`` is the percent as a float; ``*_hist`` keys become ``{len: count}`` and
    ``no_draft_reasons`` ``{name: count}`` (``none`` is empty); any other value stays a string.
    Words without ``=`` (``time_ms``, a ``ds4:`` prefix) are skipped; unknown keys are kept.
    """
    at = text.rfind("DSpark stats")
    body = text[at + len("DSpark stats") :] if at >= 0 else text
    out: dict[str, Any] = {}
    for word in body.split():
        key, eq, value = word.partition("=")
        if not eq or not key:
            continue
        if key.endswith("_hist") or key == "no_draft_reasons":
            pairs: dict[Any, int] = {}
            if value != "none":
                for item in value.split(","):
                    k, _, c = item.rpartition(":")
                    pairs[int(k) if key.endswith("_hist") else k] = int(c)
            out[key] = pairs
            continue
        if value.endswith("%"):
            value = value[:-1]
        elif value.endswith("ms") and _number(value[:-2]) is not None:
            value = value[:-2]
        n = _number(value)
        out[key] = value if n is None else n
    return out


def to_json(stats: DSparkStats) -> str:
    """:meth:`DSparkStats.to_dict` as JSON (indent 1)."""
    return json.dumps(stats.to_dict(), indent=1)
