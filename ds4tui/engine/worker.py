"""Chat generation off the UI thread: a chat session over the engine, and the events it posts.

``ChatEngine`` owns one :class:`~ds4tui.engine.session.Engine`, its tokenizer and one
:class:`~ds4tui.engine.session.Session`.  ``run_turn`` is meant to run in a worker thread: it
renders the conversation with the DS4 chat template (spec ds4.md §4.3), keeps the KV cache of the
previous turns where the new prompt starts with the same tokens, prefills the rest in chunks
(``PrefillProgress``), decodes one engine cycle at a time (``TokensEmitted``: the accepted drafts
and the token sampled after them, split into the reasoning and the answer channel), posts a
``StatsSnapshot`` about every ``snapshot_s`` seconds, and ends with ``Finished`` or ``Failed``.

The events are small frozen dataclasses put into an :class:`EventQueue` (a ``deque``: appends and
pops are thread-safe); the UI drains it on a timer (~10 Hz), so the engine never waits for the UI
(ux.md §0 items 1–2).  A ``threading.Event`` is checked at every cycle and ``cancel()`` stops a
running prefill or step inside the engine, so a stop request takes effect within one cycle.

No UI import here (tests/test_architecture.py): the same class serves the app, tests and benches.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ds4tui.engine import session as S
from ds4tui.engine.backend import knob_fields
from ds4tui.engine.decode import DecodeLoop
from ds4tui.engine.stats import DSparkStats
from ds4tui.engine.tokenizer import Tokenizer, render_chat

#: Default context size of a chat (tokens), clipped to the model's own context length.
DEFAULT_CTX = 4096


# ---- events (engine thread → UI) ------------------------------------------------------------------

@dataclass(frozen=True)
class LoadProgress:
    """Opening the model: ``done`` of ``total`` ``unit`` s ("step" or "byte": weights uploaded to
    the GPU) in the phase ``phase`` says runs now."""

    phase: str
    done: int
    total: int
    unit: str = "step"


@dataclass(frozen=True)
class TokenPiece:
    """One emitted token: its id, the text it completed (may be "" while a UTF-8 character is
    split across tokens), whether it was an accepted draft, and its channel ("think" | "answer")."""

    id: int
    text: str
    from_draft: bool
    channel: str


@dataclass(frozen=True)
class TokensEmitted:
    """The tokens of one engine cycle (accepted drafts first, then the sampled token)."""

    turn: int
    pieces: tuple[TokenPiece, ...]


@dataclass(frozen=True)
class PrefillProgress:
    """Prompt tokens run so far in this turn's prefill (``reused`` came from the KV cache)."""

    turn: int
    done: int
    total: int
    reused: int


@dataclass(frozen=True)
class StatsSnapshot:
    """A consistent copy of the engine's counters, taken between two cycles.

    ``t``: ``time.monotonic()`` seconds; ``stats``: the session's decode counters; ``dspark``:
    the DSpark counters (None without a support model); ``knobs``: the knobs in force; ``events``:
    the knob changes so far; ``generating``: a turn is running; ``turn_tokens`` /
    ``turn_draft_tokens``: tokens emitted in the running (or last) turn and how many of them were
    accepted drafts; ``turn_decode_s``: wall seconds since that turn's first decoded token."""

    t: float
    stats: S.Stats
    dspark: DSparkStats | None
    knobs: S.DSparkKnobs | None
    events: tuple[S.KnobEvent, ...]
    n_tokens: int
    n_ctx: int
    generating: bool
    turn: int
    turn_tokens: int
    turn_draft_tokens: int
    turn_decode_s: float

    @classmethod
    def from_export(cls, d: Mapping[str, Any]) -> "StatsSnapshot":
        """The snapshot a stats export holds (the JSON the app's F6 writes, or a transcript's
        ``session`` block, or the output of ``generate --json``, whose knobs are its ``dspark`` and
        whose tokens are its prompt's and generated ids), to show it again; ValueError naming what
        is missing or wrong."""
        if not isinstance(d, Mapping) or "stats" not in d or "n_ctx" not in d:
            raise ValueError("not a ds4tui stats export (F6 writes one): no 'stats' or 'n_ctx'")
        fields = S.Stats.__dataclass_fields__
        stats = S.Stats(**{k: v for k, v in dict(d["stats"]).items() if k in fields})
        dspark = DSparkStats.from_dict(d["dspark_stats"]) if d.get("dspark_stats") else None
        recorded = d.get("knobs") or d.get("dspark")
        knobs = S.DSparkKnobs(**knob_fields(recorded)) if recorded else None
        if "n_tokens" not in d and isinstance(d.get("prompt_ids"), list) and isinstance(d.get("generated_ids"), list):
            d = {**d, "n_tokens": len(d["prompt_ids"]) + len(d["generated_ids"])}
        events = tuple(S.KnobEvent(int(e["cycle"]), S.DSparkKnobs(**knob_fields(e)))
                       for e in d.get("knob_events") or ())
        return cls(t=0.0, stats=stats, dspark=dspark, knobs=knobs, events=events, n_tokens=int(d.get("n_tokens", 0)),
                   n_ctx=int(d["n_ctx"]), generating=False, turn=0, turn_tokens=stats.n_decode_tokens,
                   turn_draft_tokens=dspark.accepted_draft if dspark is not None else 0,
                   turn_decode_s=stats.decode_ms / 1000.0)


@dataclass(frozen=True)
class TurnResult:
    """What one assistant turn produced.  Times in seconds; ``reason``: "eos", "stopped",
    "max_tokens" or "ctx" (the context filled up).  ``scheduler_prices_retime``: why kept DSpark
    scheduler prices were left out of the start of the session this answer ran in, so that drafting
    re-timed them (``Session.scheduler_prices_retime``, spec dspark.md §7.4), on the answer whose
    drafting did it (the session's first that proposed drafts); "" on every other answer.
    ``scheduler_prices_retimed``: the kept times the session started from that this answer's drafting
    timed again (``Session.scheduler_prices_retimed``'s entries, each on the answer that first did)."""

    turn: int
    prompt_tokens: int
    reused_tokens: int
    ids: tuple[int, ...]
    from_draft: tuple[bool, ...]
    reasoning: str
    answer: str
    reason: str
    prefill_s: float
    first_token_s: float | None
    decode_s: float
    dspark_delta: dict[str, Any] = field(default_factory=dict)
    scheduler_prices_retime: str = ""
    scheduler_prices_retimed: tuple = ()

    @property
    def n_draft(self) -> int:
        return sum(self.from_draft)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens per second after the first one (the first only samples the prefill's logits)."""
        n = len(self.ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ids"] = list(self.ids)
        d["from_draft"] = list(self.from_draft)
        d["n_tokens"] = len(self.ids)
        d["n_draft"] = self.n_draft
        d["decode_tokens_per_s"] = self.decode_tokens_per_s
        return d


@dataclass(frozen=True)
class Finished:
    """A turn ended (its text is kept whatever the reason)."""

    turn: int
    result: TurnResult


@dataclass(frozen=True)
class Failed:
    """Something failed; ``title`` says what was being done, ``message`` names file, tensor,
    expected and found values where the engine gave them.  ``turn`` is None outside a turn."""

    title: str
    message: str
    turn: int | None = None


class EventQueue:
    """Thread-safe FIFO of events: the engine thread ``put``s, the UI ``drain``s on a timer."""

    def __init__(self) -> None:
        self._q: collections.deque = collections.deque()

    def put(self, event: Any) -> None:
        self._q.append(event)

    def drain(self) -> list[Any]:
        """Every event queued so far, oldest first."""
        out = []
        for _ in range(len(self._q)):
            out.append(self._q.popleft())
        return out

    def __len__(self) -> int:
        return len(self._q)


# ---- the chat engine --------------------------------------------------------------------------------

def new_counters_id() -> str:
    """An id for one run of the chat's counters, from zero (a session opened, or its counters
    reset): two stats exports with the same id count from the same start, so the later one's
    counters include the earlier one's (``ds4tui compare`` warns).  The local start time
    (``YYYYmmddTHHMMSS``) and 8 random hex digits."""
    import uuid

    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class ChatInfo:
    """What the panes show about the loaded model (sizes in bytes)."""

    model_path: str
    model_name: str
    backend: str
    backend_note: str
    n_threads: int
    n_ctx: int
    n_layer: int
    n_vocab: int
    model_bytes: int
    support_path: str | None
    support_status: str  # "attached" | "refused" | "none"
    support_message: str
    support_summary: str
    block_size: int
    sampling: S.SamplingParams
    #: the prefill_gemm numerics option in force ("off", "bf16", "f16") and what it means here
    prefill_gemm: str = "off"
    prefill_gemm_note: str = ""
    #: the matmul activations numerics option ("f32", or "q8": spec ds4.md §2.9.5) and why (auto's choice)
    activations: str = "f32"
    activations_note: str = ""
    #: the gpu_graphs option in force ("off", "on"; spec platform.md §8) and what it means here
    gpu_graphs: str = "off"
    gpu_graphs_note: str = ""
    #: "" unless the engine's threads outnumber the usable cores; else what it says (S.threads_note)
    threads_note: str = ""
    prefill_chunk: int = 0  # tokens per prefill pass (the session's n_batch; spec ds4.md §2.8)
    #: where the DSpark scheduler's prices start (spec dspark.md §7.4): the mode and what it did
    scheduler_prices: str = "fresh"
    scheduler_prices_note: str = ""
    #: the tokens DSpark's drafter proposes from (spec dspark.md §2.6): their number (0: the whole
    #: vocabulary) and which and why
    draft_vocab: int = 0
    draft_vocab_note: str = ""
    #: which rows of a DSpark verify get the LM head (spec dspark.md §3.4): "all" or "lazy", and why
    verify_head: str = "all"
    verify_head_note: str = ""
    #: the amx option in force ("on" or "off") and why (spec ds4.md §2.9.6)
    amx: str = "off"
    amx_note: str = ""


def _diff(after: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """Field-wise ``after - before`` of two ``DSparkStats.to_dict()`` (counts, times, histograms,
    no-draft reasons); derived values are recomputed from the differences.  What is no count is
    ``after``'s: the plain decode's price at the turn's end (``t_decode_ms``, ``t_decode_measured``: a
    turn's delta said "not measured", 0 ms, beside its own timed plain decodes), the block size, and
    the failed drafter op where the turn had a chain failure."""
    out: dict[str, Any] = {}
    for k, v in after.items():
        b = before.get(k)
        if k not in DSparkStats.__dataclass_fields__:  # a derived value: recomputed below
            continue
        if isinstance(v, bool) or k in ("block_size", "chain_fail_op", "t_decode_ms"):
            continue
        if isinstance(v, (int, float)) and isinstance(b, (int, float)):
            out[k] = v - b
        elif isinstance(v, list) and isinstance(b, list) and len(v) == len(b) and all(
                isinstance(x, (int, float)) for x in v + b):
            out[k] = [x - y for x, y in zip(v, b)]
        elif isinstance(v, dict) and isinstance(b, dict):
            out[k] = {n: v[n] - b.get(n, 0) for n in v}
    keep = {k: out[k] for k in DSparkStats.__dataclass_fields__ if k in out}
    for k in ("t_decode_ms", "t_decode_measured"):
        if k in after:
            keep[k] = after[k]
    if out.get("chain_fail", 0) > 0 and "chain_fail_op" in after:
        keep["chain_fail_op"] = after["chain_fail_op"]
    try:
        return DSparkStats(block_size=after["block_size"], **keep).to_dict()
    except (TypeError, ValueError):
        return out


def _display_name(general_name: str, path: Path) -> str:
    """The file name, preceded by the GGUF's ``general.name`` where that says more (e.g. the demo)."""
    if general_name and general_name not in (path.stem, path.name):
        return f"{general_name} ({path.name})"
    return path.name


class ChatEngine:
    """A multi-turn chat over one DS4 model (and optionally a DSpark support model).

    ``model``/``support``: GGUF paths.  ``backend``: "cpu" | "hip" | "auto" (auto = the HIP
    backend when this build has one and a device answers, else cpu; the chosen one is in
    ``info.backend`` and the reason in ``info.backend_note``).  ``n_ctx``: context tokens (default 4096, at most the model's context
    length).  ``dspark``: start with DSpark on (True) or off (False) when a support model is
    attached; ``scheduler``, ``max_draft`` (0: the block size) and ``policy`` (the scheduler's) are the
    other knobs the session starts with, ``print_stats`` prints ds4's stats line when it closes (``Engine.session``);
    ``gpu_layout``, ``gpu_library``, ``prefill_gemm``, ``activations``, ``gpu_graphs``, ``draft_vocab``, ``scheduler_prices``,
    ``prices_dir`` and ``verify_head`` are ``Engine``'s.  ``progress(LoadProgress)`` is called
    during opening.

    Raises the engine's errors (``ModelFileError`` subclasses, ``EngineError``,
    ``BackendUnavailableError``) unchanged: they name the file, tensor, expected and found values.
    A support model that fails validation does not raise: it is *refused* (``info.support_status``)
    and the chat decodes target-only, every cycle counted as no_draft reason ``support_invalid``.
    """

    def __init__(self, model: str | os.PathLike, *, support: str | os.PathLike | None = None,
                 backend: str = "cpu", n_ctx: int | None = None, n_threads: int = 0,
                 sampling: S.SamplingParams | None = None, dspark: bool = True,
                 progress: Callable[[LoadProgress], None] | None = None, gpu_layout: str = "planar",
                 gpu_library: str | os.PathLike | None = None, scheduler: bool = True, max_draft: int = 0,
                 policy: str = S.DEFAULT_SCHEDULER_POLICY, print_stats: bool = False, prefill_gemm: str = "auto", activations: str = "auto",
                 numerics: str = "ds4", threshold: float = 0.0, gpu_graphs: str = "off",
                 scheduler_prices: str = "fresh", prices_dir: str | os.PathLike | None = None,
                 draft_vocab: str | int = "auto", verify_head: str = "auto", amx: str = "auto"):
        from ds4tui.engine.gguf_model import DS4Model

        if backend not in ("auto", "cpu", "hip"):
            raise ValueError(f"backend must be auto, cpu or hip, got {backend!r}")
        say = progress or (lambda p: None)
        say(LoadProgress(f"reading and checking {Path(model).name}", 0, 3))
        dm = DS4Model(model)
        say(LoadProgress(f"opening the engine ({backend})" + (f", checking {Path(support).name}" if support else ""),
                         1, 3))
        self.engine = S.Engine(dm, backend=backend, n_threads=n_threads, support=support, numerics=numerics,
                               progress=lambda done, total: say(LoadProgress("uploading weights", done, total, "byte")),
                               gpu_layout=gpu_layout, gpu_library=gpu_library, prefill_gemm=prefill_gemm,
                               activations=activations, gpu_graphs=gpu_graphs, scheduler_prices=scheduler_prices,
                               prices_dir=prices_dir, draft_vocab=draft_vocab, verify_head=verify_head, amx=amx)
        try:
            say(LoadProgress("loading the tokenizer", 2, 3))
            self.tokenizer = Tokenizer.from_gguf(dm.reader)
            limit = self.engine.config.context_length
            n_ctx = int(n_ctx or min(DEFAULT_CTX, limit))
            if not 2 <= n_ctx <= limit:
                raise ValueError(f"--ctx {n_ctx}: the context size must be 2..{limit} (the model's context length)")
            self.counters_id = new_counters_id()
            self.session = self.engine.session(n_ctx, scheduler=scheduler, max_draft=max_draft, policy=policy,
                                               print_stats=print_stats)
            self.session.set_sampling((sampling or S.SamplingParams()).validate())
            if self.has_dspark:
                self.session.set_dspark(enabled=bool(dspark), **({"threshold": float(threshold)} if threshold else {}))
        except BaseException:
            self.engine.close()
            raise
        #: the knobs the session's counters started with (with the knob changes the engine logged since,
        #: what its cycles ran with: :meth:`knobs_in_force`)
        self.knobs_at_start = self.knobs
        self._stop = threading.Event()
        self._busy = threading.Lock()
        self._turn = 0
        #: the session's re-time reason until an answer drafts (that answer's result carries it)
        self._retime = self.session.scheduler_prices_retime
        #: the kept times the session's drafting re-timed that an answer's result has listed
        self._retimed: set[str] = set()
        self._progress: tuple = (0, 0, 0, None)  # turn, tokens, accepted drafts, first-token time
        self.info = self._info(model, support)

    def _info(self, model, support) -> ChatInfo:
        e = self.engine
        summary = e.support.summary_line() if e.support is not None else ""
        return ChatInfo(
            model_path=str(model), model_name=_display_name(e.model.name, Path(model)), backend=e.backend,
            backend_note=getattr(e, "backend_note", ""), n_threads=e.n_threads,
            threads_note=getattr(e, "threads_note", ""),
            n_ctx=self.session.n_ctx, n_layer=e.config.n_layer, n_vocab=e.config.n_vocab,
            model_bytes=os.path.getsize(model), support_path=None if support is None else str(support),
            support_status=e.support_status, support_message=e.support_message, support_summary=summary,
            block_size=e.block_size if self.has_dspark else 0, sampling=self.session.sampling,
            prefill_gemm=getattr(e, "prefill_gemm", "off"), prefill_gemm_note=getattr(e, "prefill_gemm_note", ""),
            activations=getattr(e, "activations", "f32"), activations_note=getattr(e, "activations_note", ""),
            gpu_graphs=getattr(e, "gpu_graphs", "off"), gpu_graphs_note=getattr(e, "gpu_graphs_note", ""),
            scheduler_prices=getattr(e, "scheduler_prices", "fresh"),
            scheduler_prices_note=getattr(e, "scheduler_prices_note", ""),
            draft_vocab=getattr(e, "draft_vocab", 0), draft_vocab_note=getattr(e, "draft_vocab_note", ""),
            verify_head=getattr(e, "verify_head", "all"), verify_head_note=getattr(e, "verify_head_note", ""),
            amx=getattr(e, "amx", "off"), amx_note=getattr(e, "amx_note", ""),
            prefill_chunk=self.session.n_batch)

    # ---- knobs (any thread; never wait for a running step) ----------------------------------------

    @property
    def has_dspark(self) -> bool:
        """A support model is attached (DSpark can draft)."""
        return self.engine.support_status == "attached"

    @property
    def knobs(self) -> S.DSparkKnobs | None:
        return self.session.dspark if self.has_dspark else None

    def knobs_in_force(self, events: Sequence[S.KnobEvent] = ()) -> S.DSparkKnobs | None:
        """The knobs the counted cycles ran with: the last of ``events`` (the changes the engine applied,
        :attr:`StatsSnapshot.events`), else those the counters started with.  They differ from
        :attr:`knobs` while a change waits for a cycle (F2 after the answer: no cycle has run with it)."""
        return events[-1].knobs if events else self.knobs_at_start

    def set_dspark(self, **knobs) -> S.DSparkKnobs:
        """``Session.set_dspark``: applied at the next cycle.  Raises ``StateError`` when no support
        model is attached (naming why: none given, or refused and the reason)."""
        if not self.has_dspark:
            why = (f"the support model was refused: {self.engine.support_message}"
                   if self.engine.support_status == "refused" else "no support model (start with --mtp SUPPORT.gguf)")
            raise S.StateError(f"DSpark knobs cannot change: {why}")
        return self.session.set_dspark(**knobs)

    # ---- turns ----------------------------------------------------------------------------------------

    @property
    def generating(self) -> bool:
        return self._busy.locked()

    def stop(self) -> None:
        """Stop the running turn at the next cycle boundary (or inside the running pass); does
        nothing when no turn runs."""
        if self.generating:
            self._stop.set()
            self.session.cancel()

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], *, think: bool, system: str | None = None) -> list[int]:
        return render_chat(self.tokenizer, messages, think=think, system=system)

    def _reuse(self, ids: list[int]) -> int:
        """Make the session a prefix of ``ids`` and return how many of its tokens are kept."""
        s = self.session
        ctx = list(s.tokens) + ([s.pending] if s.pending is not None else [])
        common = 0
        for a, b in zip(ctx, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # at least one token left to run
        if common == len(ctx):
            return common  # the pending token is part of the prompt and runs first
        keep = min(common, len(s.tokens))
        if keep == len(s.tokens) and s.pending is not None:
            keep -= 1  # truncating to the full length would keep the wrong pending token
        if keep <= 0 or len(s.tokens) - keep > s.n_batch:
            keep = 0
        s.truncate(keep)
        return keep

    def run_turn(self, messages: Sequence[Mapping[str, Any]], sink: EventQueue, *, think: bool = True,
                 system: str | None = None, max_tokens: int | None = None, snapshot_s: float = 0.1,
                 before_decode: Callable[[], Any] | None = None) -> TurnResult | None:
        """Generate the assistant's answer to ``messages`` (the last one a user message), posting
        events to ``sink``; the last event is always ``Finished``.  Returns the result, or None when
        the turn could not run (then ``Failed`` says why and ``Finished`` has reason "error" and no
        tokens).  ``Finished`` is posted once the turn has let go of the engine, so that whoever
        sees it may start the next turn at once.  ``before_decode``: called in this thread after
        the prefill, before the first decode cycle (the chat app waits there until its interface
        has laid the new turn out, ux.md §2.4; ``stop`` still ends the turn).  Call from one thread
        at a time (a second call raises ``StateError``)."""
        if not self._busy.acquire(blocking=False):
            raise S.StateError("a turn is already running")
        finished = None
        try:
            self._stop.clear()
            self.session.clear_cancel()
            self._turn += 1
            result, finished = self._run(self._turn, messages, sink, think, system, max_tokens, snapshot_s,
                                         before_decode)
            return result
        finally:
            self._stop.clear()
            self.session.clear_cancel()
            self._busy.release()
            if finished is not None:
                sink.put(finished)

    def _overflow(self, messages, n: int, think, system) -> str:
        """Why a prompt of ``n`` tokens with the conversation before it cannot run (it and the answer's
        first token need ``n + 1`` rows), and what helps: a new chat (Ctrl+N) when the prompt alone
        fits; a larger context (Ctrl+G, a new session: the conversation starts afresh) up to the model's
        context length; else a shorter prompt."""
        ctx, limit = self.session.n_ctx, self.engine.config.context_length
        alone = len(self.prompt_ids(list(messages)[-1:], think=think, system=system))

        def larger(least: int) -> str:
            return (f"Ctrl+G sets a larger context (at least {least} tokens, the model allows {limit}; the "
                    f"conversation starts afresh)")

        if alone + 1 > ctx:
            if alone + 1 > limit:
                return (f"the prompt alone has {alone} tokens, which does not fit a context of {ctx}, nor the "
                        f"model's context length {limit}: shorten the prompt")
            return (f"the prompt alone has {alone} tokens, which does not fit a context of {ctx}: {larger(alone + 1)}, "
                    f"or shorten the prompt")
        return (f"the conversation has {n} tokens, which does not fit a context of {ctx}: Ctrl+N starts a new chat "
                f"(this prompt alone has {alone} tokens and fits)" + (f", or {larger(ctx + 1)}" if ctx < limit else ""))

    def _run(self, turn, messages, sink, think, system, max_tokens, snapshot_s, before_decode=None):
        s, tok = self.session, self.tokenizer
        try:
            ids = self.prompt_ids(messages, think=think, system=system)
            if len(ids) + 1 > s.n_ctx:
                raise S.ContextOverflowError(self._overflow(messages, len(ids), think, system))
            before = self._dspark_dict()
            reused = self._reuse(ids)
            budget = s.n_ctx - len(ids)
            # without a limit, the answer may fill the context: then the stop reason is "ctx"
            limited = max_tokens is not None and int(max_tokens) < budget
            max_tokens = max(1, min(int(max_tokens), budget)) if limited else budget
        except (S.EngineError, ValueError) as exc:
            return self._failed(sink, turn, "cannot start the turn", exc)
        t0 = time.perf_counter()
        sink.put(PrefillProgress(turn, 0, len(ids) - reused, reused))
        stopped = False
        try:
            s.prefill(ids[reused:], logits="last",
                      progress=lambda done, total: sink.put(PrefillProgress(turn, done, total, reused)))
        except S.CancelledError:
            stopped = True
        except S.EngineError as exc:
            return self._failed(sink, turn, "prefill failed", exc)
        t_prefill = time.perf_counter()
        if before_decode is not None and not stopped:
            before_decode()
        eos, think_end = tok.eos_id, tok.think_end_id
        channel = "think" if think else "answer"
        decoder = tok.stream_decoder()
        text = {"think": [], "answer": []}
        reason = "stopped" if stopped else "max_tokens" if limited else "ctx"
        t_first = None
        t_snap = 0.0
        self._progress = (turn, 0, 0, None)
        # the decode loop rewinds the session when EOS arrives among accepted drafts
        loop = DecodeLoop(s, max_tokens, stop=(eos,), cancelled=self._stop.is_set)
        out, drafts = loop.ids, loop.from_draft
        n_draft = 0  # accepted drafts so far (counted as they come: a sum per cycle would grow with the answer)
        try:
            for cycle in ([] if stopped else loop):
                if t_first is None:
                    t_first = time.perf_counter()
                pieces = []
                for t, d in zip(cycle.tokens, cycle.from_draft):
                    if t == eos:
                        break
                    if channel == "think" and t == think_end:
                        piece = decoder.flush()
                        text["think"].append(piece)
                        pieces.append(TokenPiece(t, piece, d, "think"))
                        channel = "answer"
                        continue
                    piece = decoder.push(t)
                    text[channel].append(piece)
                    pieces.append(TokenPiece(t, piece, d, channel))
                sink.put(TokensEmitted(turn, tuple(pieces)))
                n_draft += cycle.n_draft
                self._progress = (turn, len(out), n_draft, t_first)
                if cycle.stopped:
                    break
                now = time.monotonic()
                if now - t_snap >= snapshot_s:
                    t_snap = now
                    sink.put(self.snapshot(generating=True))
            if not stopped:
                reason = {"stop": "eos", "cancelled": "stopped", "ctx": "ctx"}.get(loop.reason, reason)
        except S.EngineError as exc:
            sink.put(Failed("decoding failed", str(exc), turn))
            reason = "error"
        tail = decoder.flush()
        if tail:
            text[channel].append(tail)
            sink.put(TokensEmitted(turn, (TokenPiece(-1, tail, False, channel),)))
        t_end = time.perf_counter()
        self._progress = (turn, len(out), sum(drafts), t_first)
        after = self._dspark_dict()
        retime = ""
        if self._retime and after and before and after["proposed"] > before["proposed"]:
            retime, self._retime = self._retime, ""  # this answer's drafting re-timed them
        retimed = [r for r in self.session.scheduler_prices_retimed() if r["time"] not in self._retimed]
        self._retimed.update(r["time"] for r in retimed)  # each kept time once a session: when re-timed
        result = TurnResult(
            turn=turn, prompt_tokens=len(ids), reused_tokens=reused, ids=tuple(out), from_draft=tuple(drafts),
            reasoning="".join(text["think"]), answer="".join(text["answer"]), reason=reason,
            prefill_s=t_prefill - t0, first_token_s=None if t_first is None else t_first - t0,
            decode_s=0.0 if t_first is None else t_end - t_first,
            dspark_delta=_diff(after, before) if after and before else {}, scheduler_prices_retime=retime,
            scheduler_prices_retimed=tuple(retimed))
        sink.put(self.snapshot(generating=False))
        return result, Finished(turn, result)

    def _failed(self, sink: EventQueue, turn: int, title: str, exc: BaseException) -> tuple[None, Finished]:
        """A turn that produced nothing: ``Failed`` with the reason (posted), then the ``Finished``
        to post (reason "error")."""
        sink.put(Failed(title, str(exc), turn))
        sink.put(self.snapshot(generating=False))
        return None, Finished(turn, TurnResult(turn, 0, 0, (), (), "", "", "error", 0.0, None, 0.0))

    @property
    def counts_dspark(self) -> bool:
        """The engine keeps DSpark counters: a support model is attached, or was refused (then every
        cycle is a no_draft cycle with reason support_invalid)."""
        return self.engine.support_status in ("attached", "refused")

    def _dspark_dict(self) -> dict[str, Any] | None:
        return self.session.dspark_stats().to_dict() if self.counts_dspark else None

    # ---- snapshots ------------------------------------------------------------------------------------

    def snapshot(self, *, generating: bool | None = None) -> StatsSnapshot:
        """The counters now.  From the worker thread between cycles; from another thread it waits
        for the running cycle to end (``Session.dspark_stats``)."""
        s = self.session
        turn, n, nd, t_first = self._progress
        snap = StatsSnapshot(
            t=time.monotonic(), stats=s.stats(), dspark=s.dspark_stats() if self.counts_dspark else None,
            knobs=self.knobs, events=tuple(s.dspark_events()) if self.has_dspark else (),
            n_tokens=s.n_tokens, n_ctx=s.n_ctx, generating=self.generating if generating is None else generating,
            turn=turn, turn_tokens=n, turn_draft_tokens=nd,
            # read after the counters: the wall time between two snapshots holds the engine time
            # counted between them (timeline.py's effective rate relies on it)
            turn_decode_s=0.0 if t_first is None else time.perf_counter() - t_first)
        return snap

    def memory(self) -> S.Memory:
        """Bytes the engine holds (weights, KV, compressor state, scratch, device)."""
        return self.session.memory()

    def new_chat(self) -> None:
        """Forget the conversation's KV cache (counters keep running; ``reset_stats`` clears them)."""
        if self.generating:
            raise S.StateError("stop the running turn first")
        self.session.truncate(0)

    def session_plan(self, n_ctx: int) -> dict[str, int]:
        """Bytes a session of ``n_ctx`` tokens would hold on this engine's backend
        (:func:`ds4tui.engine.memplan.session_bytes`: ``kv``, ``compressor``, ``scratch``, ``host``)
        beside the weights, which do not change with the context, and ``engine``, what the engine
        expanded at open (its float32 vector copies, the draft vocabulary's tables: ``Engine.memory()``'s
        scratch), which the session's ``memory().scratch`` counts with ``scratch`` and ``host``, and
        ``amx_copies``, the weights' copies under the amx option (which no context size changes)."""
        from ds4tui.engine import memplan

        e, shape = self.engine, None
        if self.has_dspark and e.support is not None:
            m = e.support.meta
            shape = memplan.SupportShape(m.n_stages, int(m.block_size), int(m.markov_rank), len(m.target_layer_ids))
        held = e.memory()
        return {**memplan.session_bytes(e.config, int(n_ctx), support=shape, host=e.backend == "cpu",
                                        n_threads=e.n_threads), "engine": held.scratch,
                "amx_copies": getattr(held, "amx_copies", 0)}

    @property
    def scheduler_start(self) -> dict:
        """Where the current session's DSpark scheduler started (spec dspark.md §7.4), under the names
        ``generate --json`` gives them, for the stats export and compare: ``scheduler_prices`` (the
        mode), ``scheduler_prices_at_start`` ("fresh", "saved" or "engine") and
        ``scheduler_prices_retime`` (why kept times were left for drafting to re-time, or None)."""
        s = self.session
        return {"scheduler_prices": getattr(self.engine, "scheduler_prices", "fresh"),
                "scheduler_prices_at_start": s.scheduler_prices_at_start,
                "scheduler_prices_retime": s.scheduler_prices_retime or None}  # null when none, as generate's

    def set_context(self, n_ctx: int) -> ChatInfo:
        """A session of ``n_ctx`` tokens in place of the current one: the conversation's KV cache and
        the DSpark counters start afresh, the sampling settings and the knobs carry over.  The new
        session is made before the old one is freed, so a size that does not fit leaves the chat as
        it was.  StateError while a turn runs; ValueError outside 2..the model's context length."""
        if not self._busy.acquire(blocking=False):
            raise S.StateError("stop the running turn first")
        try:
            limit = self.engine.config.context_length
            if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not 2 <= n_ctx <= limit:
                raise ValueError(f"context size: expected 2..{limit} tokens (the model's context length), "
                                 f"found {n_ctx!r}")
            old = self.session
            knobs = old.dspark if self.has_dspark else None
            new = self.engine.session(n_ctx, scheduler=knobs.scheduler if knobs else True,
                                      max_draft=knobs.max_draft if knobs else 0,
                                      policy=knobs.policy if knobs else S.DEFAULT_SCHEDULER_POLICY,
                                      print_stats=old.print_stats)
            try:
                new.set_sampling(old.sampling)
                if knobs is not None:
                    new.set_dspark(**knobs.to_dict())
            except BaseException:
                new.close()
                raise
            self.session = new
            self.counters_id = new_counters_id()  # a new session: its counters start from zero
            self.knobs_at_start = self.knobs
            old.close()
            new.restart_scheduler_prices()  # from what the old session measured, kept as it closed
            self._retime = new.scheduler_prices_retime
            self._retimed = set()
            self.info = replace(self.info, n_ctx=new.n_ctx)
            return self.info
        finally:
            self._busy.release()

    def reset_stats(self) -> None:
        if self.generating:
            raise S.StateError("stop the running turn first")
        self.session.reset_stats()
        self.counters_id = new_counters_id()
        self.knobs_at_start = self.knobs

    def close(self) -> str:
        """Stop a running turn, then free the session and the engine (waits for the running cycle).
        Returns what closing could not do, for the caller to say ('' when nothing): with
        ``--scheduler-prices saved`` the session's close writes the prices file (spec dspark.md
        §7.4), and a file it cannot write is named here."""
        self.stop()
        # what this close reports, also when an earlier session's close failed the same way (a
        # load problem was said in the welcome line; the engine closes right after)
        self.engine.scheduler_prices_problem = ""
        self.session.close()
        after = self.engine.scheduler_prices_problem
        self.engine.close()
        return after
