"""The seam between a :class:`~ds4tui.engine.session.Session` and the code that runs it.

A ``Session`` keeps everything that is the same on every backend — the token bookkeeping, the
locks, chunked prefill, rollback after a cancel, rewinding after a stop token, the checks of
sampling settings and knobs — and hands the per-backend work to an object that implements
:class:`SessionBackend`: evaluate tokens, run one decode cycle, truncate, set the pending token,
raise or clear the cancel flag, and report counters, memory and the DSpark state.  Two implement
it:

* :class:`NativeBackend` — a session of the C engine (``ds4tui._native``, C API in
  ``ds4tui/native/ds4_engine.h``) through cffi, on the CPU or the GPU;
* :class:`ReferenceBackend` — the numpy reference (:mod:`ds4tui.engine.reference`), target-only,
  with the native sampler written in numpy (:func:`sample_reference`).

The small value types both sides speak (:class:`SamplingParams`, :class:`Stats`, :class:`Memory`,
:class:`DSparkKnobs`, :class:`KnobEvent`) live here too; :mod:`ds4tui.engine.session` re-exports
them.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields
from typing import Protocol

import numpy as np

from ds4tui.engine.errors import StateError, native_error
from ds4tui.engine.prices import SchedulerPrices
from ds4tui.engine.stats import DSparkStats

#: Most tokens one step() returns (accepted drafts + the next token; the DSpark block is at most 16).
STEP_MAX = 64
#: Most ids (and cycles) one ``step_many`` call hands back.
STEP_MANY_OUT = 256
#: Logit outputs of an evaluation (ds4_engine.h's DS4_LOGITS_*).
LOGITS_MODES = ("none", "last", "all")


# ---- values ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings: ``temperature`` 0 = greedy (ties to the lowest id); otherwise
    logits/temperature → top-k (0 = off) → top-p (1 = off) → min-p (0 = off) → a draw from a
    splitmix64 stream seeded with ``seed``."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0

    def validate(self) -> "SamplingParams":
        """Return self; ``ValueError`` naming the first bad field.

        The engine holds the knobs as float32: a temperature must be 0 or a normal float32
        (1.2e-38 … 3.4e38), so that what runs is what was asked for."""
        t = self.temperature
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if t and not 1.1754944e-38 <= t <= 3.4028235e38:
            raise ValueError(f"temperature {t!r} is outside the float32 range the engine uses (0, or 1.2e-38 .. 3.4e38)")
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or not 0 <= self.top_k <= 2**31 - 1:
            raise ValueError(f"top_k must be an integer 0 .. 2^31-1 (0 = off), got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if int(self.seed) != self.seed or not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be an integer in 0..2^64-1, got {self.seed}")
        return self


@dataclass(frozen=True)
class Stats:
    """Monotonic counters of a session (ds4_stats); times in milliseconds."""

    n_prefill_tokens: int = 0
    n_decode_tokens: int = 0
    n_steps: int = 0
    n_target_evals: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    sample_ms: float = 0.0
    n_cancelled: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Memory:
    """Bytes held (ds4_memory): weights read by the engine (mapped from the GGUF on the CPU),
    raw KV rows, compressor/indexer state and compressed rows, scratch buffers and small tensors
    expanded to float, GPU allocations (0 on the CPU), and (``amx_copies``) the weight matrices' copies repacked for
    the AMX tiles (the amx option, spec ds4.md §2.9.6; 0 without it)."""

    weights: int = 0
    kv: int = 0
    compressor: int = 0
    scratch: int = 0
    device: int = 0
    amx_copies: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compressor + self.scratch + self.device + self.amx_copies

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


#: The DSpark scheduler's policies, in the order of ds4_engine.h's DS4_SCHED_* values (spec dspark.md
#: §7.4, §7.6): "acceptance" drafts when the acceptance measured at each draft position pays for a
#: verify; "confidence" proposes unless it is backing off and verifies the drafts whose calibrated
#: confidences pay for their verify.
SCHEDULER_POLICIES = ("acceptance", "confidence")
#: The policy a session starts with (the engine's own default, ds4_dspark_session_init).
DEFAULT_SCHEDULER_POLICY = "confidence"


@dataclass(frozen=True)
class DSparkKnobs:
    """DSpark's live knobs (ds4_dspark_knobs): ``enabled`` (draft and verify, or target-only),
    ``scheduler`` (the adaptive cost model of spec dspark.md §7.3), ``threshold`` (cut the proposal
    at the first confidence below it, 0..1), ``max_draft`` (drafts per cycle, 1..block size) and
    ``policy`` (the scheduler's, one of :data:`SCHEDULER_POLICIES`)."""

    enabled: bool = True
    scheduler: bool = True
    threshold: float = 0.0
    max_draft: int = 5
    policy: str = DEFAULT_SCHEDULER_POLICY

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class KnobEvent:
    """A knob change the engine applied: the knobs in force from cycle ``cycle`` on."""

    cycle: int
    knobs: DSparkKnobs


# ---- the protocol ----------------------------------------------------------------------------------

class SessionBackend(Protocol):
    """What a :class:`~ds4tui.engine.session.Session` asks of its backend.

    The session calls these under its own lock, after its own checks (token ids in range, room in
    the context, knob values in range), and keeps ``tokens`` and ``pending`` itself; ``pending``
    is passed where a backend needs it.  Errors are the :mod:`ds4tui.engine.errors` classes."""

    def eval(self, ids: list[int], mode: str, pending: int | None) -> np.ndarray | None:
        """Run ``pending`` (if not None) and then ``ids`` at the next positions; logits per ``mode``
        (``"none"`` → None, ``"last"`` → ``[1, V]``, ``"all"`` → ``[len(ids), V]``).  On any error
        (cancel included) the backend is left as before the call."""

    def step(self, max_out: int, pending: int | None) -> list[int]:
        """One decode cycle (run ``pending``, maybe draft and verify, sample): the emitted ids, the
        last of them the new pending token; at most ``max_out``."""

    def step_many(self, max_out: int, max_cycles: int, budget_s: float, stop: frozenset[int],
                  pending: int | None) -> tuple[list[list[int]], BaseException | None]:
        """Up to ``max_cycles`` cycles of :meth:`step` back to back (optional: a backend without it
        is stepped one cycle at a time by the session), stopping early as ``ds4_session_step_many``
        does (spec ux.md §2.4).  Returns the cycles that completed, each its emitted ids, and the
        error that stopped a later cycle (None if none); an error in the first cycle is raised.  A
        KeyboardInterrupt that comes once cycles have completed (a signal during the call) is that
        error too, so that the cycles it ran are booked before it is raised."""

    def truncate(self, n: int) -> None:
        """Forget every position >= ``n``; no pending token and no logits afterwards."""

    def set_pending(self, token: int) -> None:
        """Make ``token`` the pending token of a backend that has none."""

    def bench_fill(self, n: int) -> None:
        """Benchmarks only: advance to ``n`` positions without running them, the compressed rows
        of the skipped windows repeating those written (``ds4_session_bench_fill``);
        :class:`StateError` where a backend cannot."""

    def cancel(self, on: bool) -> None:
        """Raise (True) or clear (False) the flag that stops a running eval or step."""

    def set_sampling(self, params: SamplingParams) -> None: ...

    def stats(self) -> Stats: ...

    def reset_stats(self) -> None:
        """Zero the counters, the DSpark ones included."""

    def memory(self) -> Memory: ...

    def knobs(self) -> DSparkKnobs:
        """The DSpark knobs as last set; :class:`StateError` without a support model."""

    def set_knobs(self, knobs: DSparkKnobs) -> None:
        """Apply ``knobs`` from the next cycle on; ``ValueError`` for an out-of-range value,
        :class:`StateError` without a support model (or with a refused one)."""

    def dspark_stats(self) -> DSparkStats: ...

    def dspark_events(self, last: int) -> list[KnobEvent]: ...

    def last_proposal(self) -> tuple[list[int], list[float]]: ...

    def fail_op(self, op: str | None) -> None:
        """Test hook: make the named drafter op fail (None: none); :class:`StateError` without a
        support model."""

    def prices(self) -> "SchedulerPrices | None":
        """The DSpark scheduler's prices and acceptance counts (spec dspark.md §7.4); None without
        a scheduler."""

    def set_prices(self, prices: "SchedulerPrices", kept: bool = False) -> None:
        """Start the scheduler from ``prices`` (``kept``: kept from other sessions, checked against
        this session's first decode; spec dspark.md §7.4); :class:`StateError` without a support
        model, ValueError for a value out of range."""

    def close(self) -> None:
        """Free what the backend holds; no call follows."""


# ---- the C engine ----------------------------------------------------------------------------------

def knob_fields(d) -> dict:
    """The :class:`DSparkKnobs` fields of a knob dict a JSON file holds (a stats export, ``generate
    --json``; a newer file's other fields left out); a file written before the scheduler had policies
    (2026-12-06) ran the only one there was, "acceptance"."""
    return {"policy": "acceptance", **{k: d[k] for k in DSparkKnobs.__dataclass_fields__ if k in d}}


def knobs_from_native(k) -> DSparkKnobs:
    """A ``ds4_dspark_knobs`` as :class:`DSparkKnobs`."""
    return DSparkKnobs(bool(k.enabled), bool(k.scheduler), _threshold(k.threshold), int(k.max_draft),
                       SCHEDULER_POLICIES[k.policy])


def check_policy(policy, name: str = "scheduler policy") -> str:
    """``policy`` when it is one of :data:`SCHEDULER_POLICIES`, else ValueError naming ``name``, the
    choices and the value found."""
    if policy not in SCHEDULER_POLICIES:
        raise ValueError(f"{name} must be one of {', '.join(SCHEDULER_POLICIES)}, got {policy!r}")
    return policy


def knobs_to_native(ffi, knobs: DSparkKnobs):
    """``knobs`` as a new ``ds4_dspark_knobs *``; ValueError for a policy not in :data:`SCHEDULER_POLICIES`."""
    check_policy(knobs.policy)
    return ffi.new("ds4_dspark_knobs *", {"enabled": int(knobs.enabled), "scheduler": int(knobs.scheduler),
                                          "threshold": float(knobs.threshold), "max_draft": int(knobs.max_draft),
                                          "policy": SCHEDULER_POLICIES.index(knobs.policy)})


def _threshold(c_float: float) -> float:
    """The confidence threshold the C engine holds (a float32) as the shortest decimal that is that
    float32: 0.3, not 0.30000001192092896, in the knobs, the JSON and compare."""
    return float(str(np.float32(c_float)))


def _cycles_of(out, lens, n: int) -> list[list[int]]:
    """The ids of ``n`` cycles that ``ds4_session_step_many`` wrote back to back into ``out``, each
    ``lens[k]`` long."""
    cycles, at = [], 0
    for k in range(n):
        cycles.append([int(out[i]) for i in range(at, at + lens[k])])
        at += lens[k]
    return cycles


class NativeBackend:
    """A session of the C engine: ``ds4_session_*`` through cffi.

    ``handle`` is the ``ds4_session *`` (freed by :meth:`close`, or when this object is collected).
    ``knobs``: the DSpark knobs the session starts with (None: the engine's defaults; a
    ``max_draft`` of 0 means the block size)."""

    def __init__(self, ffi, lib, engine_handle, n_ctx: int, n_batch: int, n_vocab: int,
                 knobs: DSparkKnobs | None = None):
        self._ffi, self._lib = ffi, lib
        self._vocab = n_vocab
        self._err = ffi.new("char[1024]")
        out = ffi.new("ds4_session **")
        start = ffi.NULL if knobs is None else knobs_to_native(ffi, knobs)
        self._check(lib.ds4_session_create(engine_handle, n_ctx, n_batch, start, out, self._err, 1024))
        self.handle = ffi.gc(out[0], lib.ds4_session_free)
        self._out = ffi.new("int32_t[%d]" % STEP_MAX)  # reused by every step (no allocation per token)
        self._n_out = ffi.new("int32_t *")
        self._many = None  # the buffers of step_many, made at its first call
        self._stop_ids: frozenset[int] | None = None
        self._stop_arr = None

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise native_error(rc, self._ffi.string(self._err).decode("utf-8", "replace"))

    def eval(self, ids: list[int], mode: str, pending: int | None) -> np.ndarray | None:
        ffi = self._ffi
        n = len(ids)
        arr = np.asarray(ids, dtype=np.int32)
        out = None if mode == "none" else np.empty((n if mode == "all" else 1, self._vocab), np.float32)
        ptr = ffi.NULL if out is None else ffi.cast("float *", ffi.from_buffer(out))
        self._check(self._lib.ds4_session_eval(self.handle, ffi.cast("int32_t *", ffi.from_buffer(arr)), n,
                                               LOGITS_MODES.index(mode), ptr, self._err, 1024))
        return out

    def step(self, max_out: int, pending: int | None) -> list[int]:
        out, n = self._out, self._n_out
        self._check(self._lib.ds4_session_step(self.handle, out, max_out, n, self._err, 1024))
        return [int(out[i]) for i in range(n[0])]

    def step_many(self, max_out: int, max_cycles: int, budget_s: float, stop: frozenset[int],
                  pending: int | None) -> tuple[list[list[int]], BaseException | None]:
        ffi, lib = self._ffi, self._lib
        if self._many is None:
            self._many = (ffi.new("int32_t[%d]" % STEP_MANY_OUT), ffi.new("int32_t[%d]" % STEP_MANY_OUT),
                          ffi.new("int32_t *"))
        out, lens, n = self._many
        if stop != self._stop_ids:
            self._stop_ids, self._stop_arr = stop, ffi.new("int32_t[]", sorted(stop) or [0])
        n[0] = 0  # the cycles this call completes (the engine counts them as they complete)
        try:
            rc = lib.ds4_session_step_many(self.handle, out, min(max_out, STEP_MANY_OUT),
                                           min(max_cycles, STEP_MANY_OUT), budget_s * 1e3, self._stop_arr, len(stop),
                                           lens, n, self._err, 1024)
            cycles = _cycles_of(out, lens, n[0])
        except KeyboardInterrupt as exc:
            # a signal during the call is raised as it returns (or as its ids are read): the cycles it
            # completed ran all the same and are in the counters, so they come back, read whole from
            # the buffers, with the interrupt for the caller to raise once it has booked them
            cycles = _cycles_of(out, lens, n[0])
            if not cycles:
                raise
            return cycles, exc
        if rc == 0:
            return cycles, None
        exc = native_error(rc, ffi.string(self._err).decode("utf-8", "replace"))
        if not cycles:
            raise exc
        return cycles, exc

    def truncate(self, n: int) -> None:
        self._check(self._lib.ds4_session_truncate(self.handle, n, self._err, 1024))

    def set_pending(self, token: int) -> None:
        self._check(self._lib.ds4_session_set_pending(self.handle, token, self._err, 1024))

    def bench_fill(self, n: int) -> None:
        self._check(self._lib.ds4_session_bench_fill(self.handle, n, self._err, 1024))

    def cancel(self, on: bool) -> None:
        (self._lib.ds4_session_cancel if on else self._lib.ds4_session_clear_cancel)(self.handle)

    def set_sampling(self, params: SamplingParams) -> None:
        p = self._ffi.new("ds4_sampling *", {"temperature": params.temperature, "top_k": int(params.top_k),
                                             "top_p": params.top_p, "min_p": params.min_p, "seed": int(params.seed)})
        self._check(self._lib.ds4_session_set_sampling(self.handle, p, self._err, 1024))

    def stats(self) -> Stats:
        st = self._ffi.new("ds4_stats *")
        self._lib.ds4_session_stats(self.handle, st)
        return Stats(**{f.name: getattr(st, f.name) for f in fields(Stats)})

    def reset_stats(self) -> None:
        self._lib.ds4_session_reset_stats(self.handle)

    def memory(self) -> Memory:
        m = self._ffi.new("ds4_memory *")
        self._lib.ds4_session_memory(self.handle, m)
        return Memory(m.weights, m.kv, m.compressor, m.scratch, m.device, m.amx)

    def knobs(self) -> DSparkKnobs:
        k = self._ffi.new("ds4_dspark_knobs *")
        if self._lib.ds4_session_get_dspark(self.handle, k) != 0:
            raise StateError("no DSpark support model is attached to this engine (pass support= / --mtp)")
        return knobs_from_native(k)

    def set_knobs(self, knobs: DSparkKnobs) -> None:
        k = knobs_to_native(self._ffi, knobs)
        err = self._ffi.new("char[512]")
        rc = self._lib.ds4_session_set_dspark(self.handle, k, err, 512)
        if rc == -1:  # DS4_E_INVALID: a value out of range
            raise ValueError(self._ffi.string(err).decode())
        if rc != 0:
            raise native_error(rc, self._ffi.string(err).decode("utf-8", "replace"))

    def dspark_stats(self) -> DSparkStats:
        st = self._ffi.new("ds4_dspark_stats *")
        self._lib.ds4_session_dspark_stats(self.handle, st)
        return DSparkStats.from_native(self._ffi, st)

    def dspark_events(self, last: int) -> list[KnobEvent]:
        buf = self._ffi.new("ds4_dspark_event[]", max(1, int(last)))
        n = self._ffi.new("int32_t *")
        self._lib.ds4_session_dspark_events(self.handle, buf, int(last), n)
        return [KnobEvent(int(e.cycle), knobs_from_native(e.knobs)) for e in (buf[i] for i in range(n[0]))]

    def last_proposal(self) -> tuple[list[int], list[float]]:
        toks, conf = self._ffi.new("int32_t[16]"), self._ffi.new("float[16]")
        nt, nc = self._ffi.new("int32_t *"), self._ffi.new("int32_t *")
        self._lib.ds4_session_dspark_last_proposal(self.handle, toks, conf, 16, nt, nc)
        return [int(toks[i]) for i in range(nt[0])], [float(conf[i]) for i in range(nc[0])]

    def fail_op(self, op: str | None) -> None:
        if self._lib.ds4_session_dspark_fail_op(self.handle, (op or "").encode()) != 0:
            raise StateError("no DSpark support model is attached to this engine")

    def prices(self) -> SchedulerPrices | None:
        p = self._ffi.new("ds4_dspark_prices *")
        self._lib.ds4_session_dspark_prices(self.handle, p)
        return SchedulerPrices.from_native(p)

    def set_prices(self, prices: SchedulerPrices, kept: bool = False) -> None:
        """``kept``: prices kept from other sessions, checked against this session's first decode
        (``ds4_session_set_dspark_prices``, spec dspark.md §7.4)."""
        err = self._ffi.new("char[512]")
        rc = self._lib.ds4_session_set_dspark_prices(self.handle, prices.to_native(self._ffi), int(kept), err, 512)
        if rc == -1:  # DS4_E_INVALID: a value out of range
            raise ValueError(self._ffi.string(err).decode())
        if rc != 0:
            raise native_error(rc, self._ffi.string(err).decode("utf-8", "replace"))

    def close(self) -> None:
        self._ffi.release(self.handle)


# ---- the numpy reference -----------------------------------------------------------------------

class ReferenceBackend:
    """The numpy reference model behind the same interface (target-only: no drafter, so every
    DSpark call says there is no support model, and the DSpark counters stay zero).

    ``model``: a :class:`~ds4tui.engine.reference.ReferenceModel`; ``weights``: the bytes its
    tensors take (reported by :meth:`memory`)."""

    _NO_DSPARK = "no DSpark support model is attached (the reference backend decodes target-only)"

    def __init__(self, model, n_ctx: int, weights: int):
        self._ref = model
        self._st = model.new_state(n_ctx)
        self._weights = weights
        self._logits: np.ndarray | None = None
        self._sampling = SamplingParams()
        self._rng = [0]
        self._counters = dict(Stats().to_dict())

    def eval(self, ids: list[int], mode: str, pending: int | None) -> np.ndarray | None:
        t0 = time.perf_counter()
        seq = ([pending] if pending is not None else []) + list(ids)
        r = self._ref.forward(self._st, seq, logits={"none": None, "last": "last", "all": "all"}[mode])
        if mode == "all" and pending is not None:
            r.logits = r.logits[1:]
        self._counters["prefill_ms"] += (time.perf_counter() - t0) * 1e3
        self._counters["n_prefill_tokens"] += len(seq)
        self._counters["n_target_evals"] += 1
        if r.logits is None:
            self._logits = None
            return None
        self._logits = r.logits[-1].copy()
        return r.logits if mode == "all" else r.logits[-1:]

    def step(self, max_out: int, pending: int | None) -> list[int]:
        t0 = time.perf_counter()
        if pending is not None:
            self._logits = self._ref.forward(self._st, [pending], logits="last").logits[-1].copy()
            self._counters["n_target_evals"] += 1
        if self._logits is None:
            raise StateError("no logits to sample from: evaluate a prompt first")
        ts = time.perf_counter()
        tok = sample_reference(self._logits, self._sampling, self._rng)
        te = time.perf_counter()
        self._counters["sample_ms"] += (te - ts) * 1e3
        self._counters["decode_ms"] += (te - t0) * 1e3
        self._counters["n_decode_tokens"] += 1
        self._counters["n_steps"] += 1
        return [tok]

    def truncate(self, n: int) -> None:
        self._ref.truncate(self._st, n)
        self._logits = None

    def set_pending(self, token: int) -> None:
        pass  # the session passes its pending token to the next eval or step, which runs it first

    def bench_fill(self, n: int) -> None:
        raise StateError("bench fill: the reference backend runs every position (use the cpu or hip backend)")

    def cancel(self, on: bool) -> None:
        pass  # a numpy pass is not interruptible; the session checks its flag between chunks

    def set_sampling(self, params: SamplingParams) -> None:
        self._sampling = params
        self._rng = [int(params.seed)]

    def stats(self) -> Stats:
        return Stats(**self._counters)

    def reset_stats(self) -> None:
        self._counters = dict(Stats().to_dict())

    def memory(self) -> Memory:
        layers = self._st.layers
        kv = sum(ls.kv.nbytes for ls in layers)
        comp = sum(a.nbytes for ls in layers for a in (ls.comp_c, ls.comp_z, ls.comp, ls.idx_c, ls.idx_z,
                                                        ls.idx_keys) if a is not None)
        return Memory(weights=self._weights, kv=kv, compressor=comp)

    def knobs(self) -> DSparkKnobs:
        raise StateError(self._NO_DSPARK)

    def set_knobs(self, knobs: DSparkKnobs) -> None:
        raise StateError(self._NO_DSPARK)

    def dspark_stats(self) -> DSparkStats:
        return DSparkStats()

    def dspark_events(self, last: int) -> list[KnobEvent]:
        return []

    def last_proposal(self) -> tuple[list[int], list[float]]:
        return [], []

    def fail_op(self, op: str | None) -> None:
        raise StateError(self._NO_DSPARK)

    def prices(self) -> SchedulerPrices | None:
        return None

    def set_prices(self, prices: SchedulerPrices, kept: bool = False) -> None:
        raise StateError(self._NO_DSPARK)

    def close(self) -> None:
        self._st = None


def sample_reference(logits: np.ndarray, p: SamplingParams, rng_state: list[int]) -> int:
    """The native sampler in numpy (same order, same splitmix64 stream): used by the reference backend."""
    if not p.temperature > 0:
        return int(np.argmax(logits))
    v = logits.astype(np.float64) / float(np.float32(p.temperature))  # validate() keeps it a normal float32
    ids = np.flatnonzero(v != -np.inf)  # probability 0: no candidate (unless every logit is -inf)
    if ids.size == 0:
        ids = np.arange(v.size)
    order = ids[np.lexsort((ids, -v[ids]))]
    vals = v[order]
    n = order.size if not 0 < p.top_k < order.size else p.top_k
    pr = np.exp(vals[:n] - vals[0])
    pr = pr / pr.sum()
    if p.top_p < 1:
        cum = np.cumsum(pr)
        hit = np.nonzero(cum >= float(np.float32(p.top_p)))[0]
        n = int(hit[0]) + 1 if hit.size else n
    if p.min_p > 0:
        floor_p = float(np.float32(p.min_p)) * pr[0]
        keep = 1
        while keep < n and pr[keep] >= floor_p:
            keep += 1
        n = keep
    pr = pr[:n]
    M = (1 << 64) - 1
    rng_state[0] = (rng_state[0] + 0x9E3779B97F4A7C15) & M
    z = rng_state[0]
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    z ^= z >> 31
    u = (z >> 11) * (1.0 / 9007199254740992.0) * pr.sum()
    cum = 0.0
    for i in range(n):
        cum += pr[i]
        if u < cum:
            return int(order[i])
    return int(order[n - 1])
