"""A deterministic stand-in for ``ChatEngine`` (layout and snapshot tests only).

It speaks the same interface and posts the same events; its counters come from a script, its
clock is synthetic, so a screenshot of the app is the same on every run.  Every test that claims
a number uses the real engine instead (tests/test_app.py)."""

from __future__ import annotations

import dataclasses
import threading

from ds4tui.engine import session as S
from ds4tui.engine import worker as W
from ds4tui.engine.stats import DSparkStats

ANSWER = """Here is a linked list:

```python
class Node:
    def __init__(self, value, next=None):
        self.value = value
        self.next = next
```

Each node points to the next one."""

REASONING = "The user wants a linked list. A Node class is enough."


def _stats(cycles: int) -> DSparkStats:
    """A consistent DSparkStats for ``cycles`` cycles of a block-5 drafter."""
    full, partial, miss, no_draft = cycles // 3, cycles // 4, cycles // 6, 0
    no_draft = cycles - full - partial - miss
    accepted_hist = [miss + no_draft, partial // 2, partial - partial // 2, 0, 0, full]
    accepted = sum(k * n for k, n in enumerate(accepted_hist))
    drafted = cycles - no_draft
    return DSparkStats(
        cycles=cycles, first_tokens=cycles, proposed=5 * drafted, accepted_draft=accepted, full=full,
        partial=partial, miss_first=miss, no_draft=no_draft, scheduler_skips=no_draft,
        propose=1.5 * drafted, prop_setup=0.1 * drafted, prop_cache=0.2 * drafted, prop_chain=0.6 * drafted,
        prop_logits=0.3 * drafted, prop_markov=0.3 * drafted, verify=4.0 * drafted, spec_total=5.5 * drafted,
        target=3.0 * no_draft,
        saved=3.0 * accepted, net_saved=3.0 * accepted - 1.5 * drafted, t_decode_ms=3.0, t_decode_measured=True,
        block_size=5, draft_len_hist=[no_draft, 0, 0, 0, 0, drafted], accepted_len_hist=accepted_hist,
        pos_proposed=[drafted] * 5, pos_accepted=[full + partial, full + partial // 2 + (partial - partial // 2), full, full, full],
        no_draft_reasons={"scheduler_skip": no_draft})


class FakeChatEngine:
    """Scripted answers: ``REASONING`` then ``ANSWER`` in 4-character pieces, every third piece an
    accepted draft.  ``gate``: if given, the turn stops after ``hold_after`` tokens until the gate
    is set (tests hold the engine mid-turn, deterministically)."""

    def __init__(self, options, progress=None, *, gate: threading.Event | None = None, hold_after: int = 5):
        self.options = options
        self.gate = gate
        self.hold_after = hold_after
        self.has_dspark = options.support is not None
        self._knobs = S.DSparkKnobs(enabled=options.dspark, scheduler=True, threshold=0.0, max_draft=5)
        self._events: list[S.KnobEvent] = []
        self._cycles = 0
        self._t = 100.0
        self._tokens = 0
        self._stop = threading.Event()
        self._busy = threading.Lock()
        self.calls: list[tuple] = []
        self.info = W.ChatInfo(
            model_path=str(options.model), model_name="demo.gguf", backend="cpu", backend_note="", n_threads=2, n_ctx=4096,
            n_layer=6, n_vocab=129280, model_bytes=100 << 20, support_path=options.support,
            support_status="attached" if self.has_dspark else "none",
            support_message="", support_summary="stages=3 block=5 markov_rank=288 tensors=81 missing=0 invalid=0 "
            "metadata_errors=0 nonfinite=0" if self.has_dspark else "", block_size=5 if self.has_dspark else 0,
            sampling=S.SamplingParams(), activations=S.auto_activations("cpu")[0] if getattr(options, "activations", "f32") == "auto"
            else getattr(options, "activations", "f32"),
            scheduler_prices=getattr(options, "scheduler_prices", "fresh"),
            scheduler_prices_note="" if getattr(options, "scheduler_prices", "fresh") == "fresh"
            else f"{options.scheduler_prices}: from /cache/scheduler-prices/0123.json (decode 2.20 ms)")

    @property
    def knobs(self):
        return self._knobs if self.has_dspark else None

    @property
    def generating(self) -> bool:
        return self._busy.locked()

    def set_dspark(self, **kw):
        self.calls.append(("set_dspark", kw))
        if not self.has_dspark:
            raise S.StateError("DSpark knobs cannot change: no support model")
        self._knobs = S.DSparkKnobs(**{**self._knobs.to_dict(), **kw})
        self._events.append(S.KnobEvent(self._cycles, self._knobs))
        return self._knobs

    def stop(self) -> None:
        self._stop.set()
        if self.gate is not None:
            self.gate.set()

    def snapshot(self, *, generating=None) -> W.StatsSnapshot:
        self._t += 0.1
        st = _stats(self._cycles) if self.has_dspark else None
        snap = W.StatsSnapshot(
            t=self._t, stats=S.Stats(n_decode_tokens=self._tokens, n_steps=self._cycles, decode_ms=8.0 * self._cycles),
            dspark=st, knobs=self.knobs, events=tuple(self._events), n_tokens=40 + self._tokens, n_ctx=self.info.n_ctx,
            generating=bool(generating), turn=1, turn_tokens=self._tokens, turn_draft_tokens=self._tokens // 3,
            turn_decode_s=0.01 * self._cycles)
        return snap

    def memory(self) -> S.Memory:
        return S.Memory(weights=196 << 20, kv=200 * self.info.n_ctx, compressor=3 << 20, scratch=24 << 20)

    def session_plan(self, n_ctx: int) -> dict:
        """What a session of ``n_ctx`` tokens holds (bytes), as ``memory`` counts it."""
        return {"kv": 200 * n_ctx, "compressor": 3 << 20, "scratch": 14 << 20, "host": 9 << 20, "engine": 1 << 20}

    def set_context(self, n_ctx: int) -> W.ChatInfo:
        """A new session of ``n_ctx`` tokens: the counters start afresh, the knobs stay."""
        self.info = dataclasses.replace(self.info, n_ctx=n_ctx)
        self.reset_stats()
        self._events.clear()
        return self.info

    def run_turn(self, messages, sink, *, think=True, system=None, max_tokens=None, snapshot_s=0.1,
                 before_decode=None):
        with self._busy:
            self._stop.clear()
            text = ([(REASONING, "think")] if think else []) + [(ANSWER, "answer")]
            sink.put(W.PrefillProgress(1, 40, 40, 0))
            if before_decode is not None:
                before_decode()
            ids, drafts, out = [], [], {"think": "", "answer": ""}
            n = 0
            reason = "eos"
            for body, channel in text:
                for i in range(0, len(body), 4):
                    if self.gate is not None and n >= self.hold_after:
                        self.gate.wait()
                    if self._stop.is_set():
                        reason = "stopped"
                        break
                    piece = body[i:i + 4]
                    d = n % 3 == 1
                    sink.put(W.TokensEmitted(1, (W.TokenPiece(n, piece, d, channel),)))
                    ids.append(n)
                    drafts.append(d)
                    out[channel] += piece
                    n += 1
                    self._cycles += 1
                    self._tokens += 1
                    if n % 8 == 0:
                        sink.put(self.snapshot(generating=True))
                if reason == "stopped":
                    break
            result = W.TurnResult(turn=1, prompt_tokens=40, reused_tokens=0, ids=tuple(ids), from_draft=tuple(drafts),
                                  reasoning=out["think"], answer=out["answer"], reason=reason, prefill_s=0.05,
                                  first_token_s=0.06, decode_s=0.01 * n)
            sink.put(self.snapshot(generating=False))
        sink.put(W.Finished(1, result))  # as ChatEngine: once the turn has let go of the engine
        return result

    def new_chat(self) -> None:
        pass

    def reset_stats(self) -> None:
        self._cycles = self._tokens = 0

    def close(self) -> None:
        pass
