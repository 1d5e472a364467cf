"""ChatEngine (the app's engine thread side) and SpecTimeline (rates derived for the panes)."""

from __future__ import annotations

import pytest
from fake_chat import _stats

from ds4tui.engine import session as S
from ds4tui.engine import worker as W
from ds4tui.engine.timeline import SpecTimeline


def _events(sink: W.EventQueue, kind) -> list:
    return [e for e in sink.drain() if isinstance(e, kind)]


@pytest.fixture(scope="module")
def chat(tiny_q2):
    eng = W.ChatEngine(tiny_q2["model"], backend="cpu", n_ctx=512)
    yield eng
    eng.close()


def test_turn_events_and_kv_reuse_match_a_fresh_engine(chat, tiny_q2):
    sink = W.EventQueue()
    first = [{"role": "user", "content": "Write a linked list in Python."}]
    queued = []  # before_decode: called once, after the prefill's events and before any token
    r1 = chat.run_turn(first, sink, think=False, max_tokens=10, before_decode=lambda: queued.append(len(sink)))
    events = sink.drain()
    assert isinstance(events[-1], W.Finished) and events[-1].result is r1
    assert len(queued) == 1 and any(isinstance(e, W.PrefillProgress) for e in events[:queued[0]])
    assert not any(isinstance(e, W.TokensEmitted) for e in events[:queued[0]])
    prefill = [e for e in events if isinstance(e, W.PrefillProgress)]
    assert prefill[-1].done == prefill[-1].total == r1.prompt_tokens and r1.reused_tokens == 0
    pieces = [p for e in events if isinstance(e, W.TokensEmitted) for p in e.pieces]
    assert "".join(p.text for p in pieces) == r1.answer and [p.id for p in pieces if p.id >= 0] == list(r1.ids)
    snaps = [e for e in events if isinstance(e, W.StatsSnapshot)]
    assert snaps and snaps[-1].generating is False and snaps[-1].turn_tokens == len(r1.ids)
    assert snaps[-1].n_tokens == chat.session.n_tokens and snaps[-1].dspark is None  # no support model

    # second turn: the conversation's KV cache is kept up to where the new prompt differs
    second = first + [{"role": "assistant", "content": r1.answer}, {"role": "user", "content": "Now in C."}]
    r2 = chat.run_turn(second, sink, think=False, max_tokens=10)
    assert r2.reused_tokens > r1.prompt_tokens // 2 and r2.prompt_tokens > r1.prompt_tokens
    fresh = W.ChatEngine(tiny_q2["model"], backend="cpu", n_ctx=512)
    try:
        r2_fresh = fresh.run_turn(second, W.EventQueue(), think=False, max_tokens=10)
    finally:
        fresh.close()
    assert r2_fresh.reused_tokens == 0 and r2.ids == r2_fresh.ids and r2.answer == r2_fresh.answer


def test_think_mode_splits_reasoning_from_the_answer(chat):
    sink = W.EventQueue()
    r = chat.run_turn([{"role": "user", "content": "Hi"}], sink, think=True, max_tokens=24)
    tok = chat.tokenizer
    ids = [i for i in r.ids if i != tok.eos_id]
    cut = ids.index(tok.think_end_id) if tok.think_end_id in ids else len(ids)
    assert r.reasoning == tok.decode(ids[:cut]) and r.answer == tok.decode(ids[cut + 1:])
    pieces = [p for e in _events(sink, W.TokensEmitted) for p in e.pieces]
    assert all(p.channel == "think" for p in pieces[:cut])


def test_context_overflow_and_a_stop_while_idle(tiny_q2):
    eng = W.ChatEngine(tiny_q2["model"], backend="cpu", n_ctx=40)
    try:
        sink = W.EventQueue()
        assert eng.run_turn([{"role": "user", "content": "word " * 60}], sink, think=False) is None
        events = sink.drain()
        failed = [e for e in events if isinstance(e, W.Failed)]
        assert failed and "does not fit a context of 40" in failed[0].message
        alone = len(eng.prompt_ids([{"role": "user", "content": "word " * 60}], think=False))
        limit = eng.engine.config.context_length
        assert 40 < alone + 1 <= limit
        # the remedy is Ctrl+G (a new context size), not a restart
        assert failed[0].message.endswith(
            f"the prompt alone has {alone} tokens, which does not fit a context of 40: Ctrl+G sets a larger context "
            f"(at least {alone + 1} tokens, the model allows {limit}; the conversation starts afresh), or shorten "
            f"the prompt")
        assert "restart" not in failed[0].message
        assert isinstance(events[-1], W.Finished) and events[-1].result.reason == "error"
        eng.stop()  # nothing runs: must not cancel the next turn
        r = eng.run_turn([{"role": "user", "content": "Hi"}], sink, think=False)
        assert r.reason in ("ctx", "eos") and len(r.ids) > 0
        assert r.reason == "eos" or r.prompt_tokens + len(r.ids) == 40  # ran until the context was full
        with pytest.raises(S.StateError, match="no support model"):
            eng.set_dspark(enabled=True)
        # a conversation that no longer fits while its last prompt alone does: a new chat (Ctrl+N) helps
        talk = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "word " * 30},
                {"role": "user", "content": "Hi"}]
        n = len(eng.prompt_ids(talk, think=False))
        alone = len(eng.prompt_ids(talk[-1:], think=False))
        assert alone + 1 <= 40 < n + 1
        assert eng.run_turn(talk, sink, think=False) is None
        failed = [e for e in sink.drain() if isinstance(e, W.Failed)]
        assert failed[0].message.endswith(
            f"the conversation has {n} tokens, which does not fit a context of 40: Ctrl+N starts a new chat (this "
            f"prompt alone has {alone} tokens and fits), or Ctrl+G sets a larger context (at least 41 tokens, the "
            f"model allows {limit}; the conversation starts afresh)")
    finally:
        eng.close()


def test_timeline_rates_windows_and_marks():
    def snap(t, cycles, events=0, turn_tokens=None):
        st = _stats(cycles)
        tokens = st.first_tokens + st.accepted_draft
        return W.StatsSnapshot(t=t, stats=S.Stats(n_decode_tokens=tokens, decode_ms=10.0 * cycles), dspark=st,
                               knobs=None, events=tuple(range(events)), n_tokens=tokens, n_ctx=4096, generating=True,
                               turn=1, turn_tokens=tokens if turn_tokens is None else turn_tokens, turn_draft_tokens=0,
                               turn_decode_s=0.02 * cycles)

    tl = SpecTimeline(recent_s=10.0)
    assert tl.add(snap(0.0, 12))
    assert not tl.add(snap(0.5, 12))  # nothing moved: no point
    assert tl.add(snap(1.0, 24, events=1))
    assert tl.add(snap(20.0, 48, events=1))
    v = tl.view()
    a, b, c = _stats(12), _stats(24), _stats(48)
    assert v.session_accept == pytest.approx(100 * c.accepted_draft / c.proposed)
    # the point at t=20 s has only the point before it within 10 s (the previous one is 19 s old)
    assert v.recent_accept == pytest.approx(100 * (c.accepted_draft - b.accepted_draft) / (c.proposed - b.proposed))
    tok = lambda s: s.first_tokens + s.accepted_draft  # noqa: E731
    assert v.decode_tps == pytest.approx(1000 * (tok(c) - tok(b)) / (10.0 * 24))
    assert v.effective_tps == pytest.approx((tok(c) - tok(b)) / (0.02 * 24))
    assert v.decode_series[0] is None and len(v.accept_series) == 3
    assert v.marks == frozenset({1})  # the knob change showed up at the second point
    assert tl.add(snap(21.0, 6))  # counters went back (reset_stats): the history starts over
    assert len(tl.view().accept_series) == 1


def test_the_recent_accept_rate_counts_the_drafts_before_the_first_snapshot_while_its_window_reaches_them():
    """The first snapshot comes once a turn's first token is decoded, with drafts already counted: a
    10 s window that reaches back to the counters' start holds them too (after one short answer the
    recent rate read 0.0 % beside a session rate of 33 %); once the window has moved past the start,
    or the bounded history dropped its first points, the rate is of what the window holds."""
    def snap(t, cycles):
        st = _stats(cycles)
        tokens = st.first_tokens + st.accepted_draft
        return W.StatsSnapshot(t=t, stats=S.Stats(n_decode_tokens=tokens, decode_ms=10.0 * cycles), dspark=st,
                               knobs=None, events=(), n_tokens=tokens, n_ctx=4096, generating=True, turn=1,
                               turn_tokens=tokens, turn_draft_tokens=0, turn_decode_s=0.02 * cycles)

    a, b, c = _stats(12), _stats(24), _stats(48)
    tl = SpecTimeline(recent_s=10.0)
    tl.add(snap(0.0, 12))
    tl.add(snap(1.0, 24))
    assert tl.view().recent_accept == pytest.approx(100 * b.accepted_draft / b.proposed) == tl.view().session_accept
    tl.add(snap(12.0, 48))  # the window (2 .. 12 s) holds the point at 1 s, not the start
    assert tl.view().recent_accept == pytest.approx(100 * (c.accepted_draft - b.accepted_draft) / (c.proposed - b.proposed))
    short = SpecTimeline(maxlen=2, recent_s=10.0)
    for t, cycles in ((0.0, 12), (1.0, 24), (2.0, 48)):
        short.add(snap(t, cycles))  # the third point drops the first: the start is no longer held
    assert short.view().recent_accept == pytest.approx(
        100 * (c.accepted_draft - b.accepted_draft) / (c.proposed - b.proposed))


def test_timeline_rates_average_over_two_seconds():
    def snap(t, tokens, ms):
        return W.StatsSnapshot(t=t, stats=S.Stats(n_decode_tokens=tokens, decode_ms=ms), dspark=None, knobs=None,
                               events=(), n_tokens=tokens, n_ctx=4096, generating=True, turn=1, turn_tokens=tokens,
                               turn_draft_tokens=0, turn_decode_s=t)

    tl = SpecTimeline()
    for t, tokens, ms in ((0.0, 0, 0.0), (0.5, 30, 100.0), (1.0, 31, 150.0), (1.5, 60, 300.0)):
        tl.add(snap(t, tokens, ms))
    v = tl.view()
    # over the whole 1.5 s (all within 2 s): 60 tokens in 300 engine-ms and 1.5 wall-s
    assert v.decode_tps == pytest.approx(200.0) and v.effective_tps == pytest.approx(40.0)
    tl.add(snap(3.0, 90, 450.0))  # now the base is the point at t=1.0
    assert tl.view().decode_tps == pytest.approx(1000 * 59 / 300.0)


def test_effective_rate_never_exceeds_the_decode_rate_when_snapshots_lag_the_counters():
    """The worker takes a snapshot while it hands out the cycles of a batch the engine has already
    run: the counters hold the whole batch, the turn's shown tokens only its first cycle, and the
    last snapshot of the turn has caught up.  Counting the shown tokens over the wall time then
    gives more than the engine's own rate; both rates must count the engine's tokens."""
    batch, cycle, engine_s, wall_s = 30, 3, 0.30, 0.33  # per batch: tokens, first cycle's, engine and wall s

    def snap(t, decoded, shown):
        return W.StatsSnapshot(t=t, stats=S.Stats(n_decode_tokens=decoded, decode_ms=1000.0 * engine_s * decoded / batch),
                               dspark=None, knobs=None, events=(), n_tokens=decoded, n_ctx=4096, generating=True,
                               turn=2, turn_tokens=shown, turn_draft_tokens=0, turn_decode_s=t - 1.0)

    tl = SpecTimeline()
    # the turn's first cycle (a batch of one token) at t = 1 s, then ten batches: the snapshot at each
    # one's first cycle, and the last one when the turn ends with every token shown
    snaps = [snap(1.0, 1, 1)] + [snap(1.0 + wall_s * b, 1 + batch * b, 1 + batch * (b - 1) + cycle)
                                 for b in range(1, 11)]
    snaps.append(snap(snaps[-1].t + 0.01, snaps[-1].stats.n_decode_tokens, snaps[-1].stats.n_decode_tokens))
    for s in snaps:
        assert tl.add(s)
    v = tl.view()
    last = snaps[-1]
    base = next(s for s in snaps if last.t - s.t <= tl.rate_s)  # the window: the oldest point within 2 s
    assert base.turn_tokens < base.stats.n_decode_tokens  # it lags the counters by the rest of its batch
    n = last.stats.n_decode_tokens - base.stats.n_decode_tokens
    decode = 1000.0 * n / (last.stats.decode_ms - base.stats.decode_ms)
    wall = last.turn_decode_s - base.turn_decode_s
    shown_rate = (last.turn_tokens - base.turn_tokens) / wall
    assert shown_rate > decode  # what the pane showed before: effective above decode
    assert v.decode_tps == pytest.approx(decode) and v.effective_tps == pytest.approx(n / wall)
    assert v.effective_tps <= v.decode_tps
    assert v.effective_tps / v.decode_tps == pytest.approx(engine_s / wall_s, rel=0.05)
    assert all(e <= d for d, e in zip(v.decode_series, v.effective_series) if d is not None and e is not None)


def test_throughput_rates_come_from_the_same_window():
    """A turn's first point has neither rate (its window would start in the turn before, and hold the
    turn's first token, sampled from the prefill's logits in ~0 ms: 20 000 t/s beside 300, which flattened
    the series): the pane keeps the rates of the newest window that has both; the turn's later points
    average over its own points only."""
    def snap(t, turn, decoded, shown, wall):
        return W.StatsSnapshot(t=t, stats=S.Stats(n_decode_tokens=decoded, decode_ms=10.0 * decoded), dspark=None,
                               knobs=None, events=(), n_tokens=decoded, n_ctx=4096, generating=True, turn=turn,
                               turn_tokens=shown, turn_draft_tokens=0, turn_decode_s=wall)

    tl = SpecTimeline()
    tl.add(snap(0.0, 1, 1, 1, 0.0))
    tl.add(snap(1.0, 1, 51, 51, 1.0))
    assert tl.view().effective_tps == pytest.approx(50.0) and tl.view().decode_tps == pytest.approx(100.0)
    tl.add(snap(30.0, 2, 52, 1, 0.0))  # the next turn's first cycle
    v = tl.view()
    assert v.decode_series[-1] is None and v.effective_series[-1] is None
    assert (v.decode_tps, v.effective_tps) == (pytest.approx(100.0), pytest.approx(50.0))  # the window before
    first = S.Stats(n_decode_tokens=53, decode_ms=510.02)  # the next turn's first token: sampled, ~0 ms
    tl.add(W.StatsSnapshot(t=40.0, stats=first, dspark=None, knobs=None, events=(), n_tokens=53, n_ctx=4096,
                           generating=True, turn=3, turn_tokens=1, turn_decode_s=0.0, turn_draft_tokens=0))
    assert tl.view().decode_series[-1] is None  # not 1 token / 0.02 ms = 50 000 t/s
    tl.add(snap(41.0, 3, 103, 51, 1.0))  # a second later: over the turn's own points
    assert tl.view().decode_tps == pytest.approx(1000 * 50 / (1030.0 - 510.02))
    assert tl.view().effective_tps == pytest.approx(50.0)


def test_finished_is_posted_once_the_turn_has_let_go_of_the_engine(chat):
    """Whoever sees ``Finished`` may start the next turn at once (the app does, when a prompt is
    waiting): the engine is no longer busy by then."""

    class Sink(W.EventQueue):
        def put(self, event):
            if isinstance(event, W.Finished):
                self.busy_at_finish = chat.generating
            super().put(event)

    sink = Sink()
    r = chat.run_turn([{"role": "user", "content": "Hi"}], sink, think=False, max_tokens=3)
    assert sink.busy_at_finish is False and isinstance(sink.drain()[-1], W.Finished)
    # a turn that cannot start posts its Finished the same way
    long = [{"role": "user", "content": "word " * 2000}]
    assert chat.run_turn(long, sink, think=False, max_tokens=3) is None and sink.busy_at_finish is False
    events = sink.drain()
    assert isinstance(events[-1], W.Finished) and events[-1].result.reason == "error" and r.ids


def test_the_context_size_changes_between_turns_and_the_plan_is_what_the_session_holds(tiny_q2):
    from ds4tui.engine import layout as L
    from ds4tui.engine import memplan

    eng = W.ChatEngine(tiny_q2["model"], support=tiny_q2["support"], backend="cpu", n_ctx=512, n_threads=2,
                       sampling=S.SamplingParams(temperature=0.5, top_k=7, seed=3))
    try:
        eng.set_dspark(scheduler=False, max_draft=3)
        info = eng.set_context(2048)
        assert info.n_ctx == eng.session.n_ctx == 2048 == eng.info.n_ctx
        assert eng.session.sampling == S.SamplingParams(temperature=0.5, top_k=7, seed=3)  # carried over
        assert eng.knobs.scheduler is False and eng.knobs.max_draft == 3
        plan, mem = eng.session_plan(2048), eng.session.memory()
        vec = memplan.vector_bytes(L.model_tensor_specs(eng.engine.config)) + memplan.vector_bytes(eng.engine.support.specs)
        assert (mem.kv, mem.compressor) == (plan["kv"], plan["compressor"])
        assert mem.scratch == plan["scratch"] + plan["host"] + vec and plan["engine"] == vec
        assert plan["amx_copies"] == mem.amx_copies == eng.engine.memory().amx_copies  # 0 unless amx is on
        # with a draft vocabulary the engine's tables of it count too (the Ctrl+G dialog left them out)
        dv = W.ChatEngine(tiny_q2["model"], support=tiny_q2["support"], backend="cpu", n_ctx=512, n_threads=1,
                          draft_vocab=list(range(0, 129280, 97)))
        try:
            plan_dv, mem_dv = dv.session_plan(512), dv.session.memory()
            assert plan_dv["engine"] > vec
            assert mem_dv.scratch == plan_dv["scratch"] + plan_dv["host"] + plan_dv["engine"]
        finally:
            dv.close()
        sink = W.EventQueue()
        r = eng.run_turn([{"role": "user", "content": "Hi"}], sink, think=False, max_tokens=6)
        assert r is not None and len(r.ids) == 6
        with pytest.raises(ValueError, match="expected 2..1048576 tokens"):
            eng.set_context(1)
        assert eng.session.n_ctx == 2048  # a refused size changes nothing
    finally:
        eng.close()


def test_a_generate_json_shows_its_own_dspark_knobs_and_tokens():
    """``generate --json`` keeps the knobs under ``dspark`` and no token count: shown again (Ctrl+O),
    its knobs are those and its context holds its prompt's and generated ids."""
    d = {"stats": {"n_decode_tokens": 3, "decode_ms": 6.0}, "n_ctx": 37, "prompt_ids": [5, 6, 7, 8],
         "generated_ids": [1, 2, 3], "dspark": {"enabled": True, "scheduler": False, "threshold": 0.25, "max_draft": 3},
         "dspark_stats": None}
    snap = W.StatsSnapshot.from_export(d)
    # written before the scheduler had policies: it ran the only one, acceptance
    assert snap.knobs == S.DSparkKnobs(enabled=True, scheduler=False, threshold=0.25, max_draft=3, policy="acceptance")
    d2 = {**d, "dspark": {**d["dspark"], "policy": "confidence"}}
    assert W.StatsSnapshot.from_export(d2).knobs.policy == "confidence"
    assert (snap.n_tokens, snap.n_ctx, snap.stats.n_decode_tokens) == (7, 37, 3)
    assert W.StatsSnapshot.from_export({**d, "dspark": None}).knobs is None


def test_the_knobs_in_force_are_those_the_counted_cycles_ran_with(tiny_q2):
    """A knob set after the last cycle waits for the next one: until a cycle runs, the counters are of the
    knobs before (what an export records as ``knobs_in_force``; F2 after an answer, then F6, read as a session
    with DSpark off)."""
    eng = W.ChatEngine(tiny_q2["model"], support=tiny_q2["support"], backend="cpu", n_ctx=256, n_threads=1)
    try:
        start = eng.knobs
        assert eng.knobs_at_start == start and eng.knobs_in_force(eng.snapshot().events) == start
        sink = W.EventQueue()
        eng.run_turn([{"role": "user", "content": "Hi"}], sink, think=False, max_tokens=4)
        eng.set_dspark(enabled=False)
        snap = eng.snapshot()
        assert snap.knobs.enabled is False and eng.knobs_in_force(snap.events) == start  # no cycle ran with it
        eng.run_turn([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                      {"role": "user", "content": "Again"}], sink, think=False, max_tokens=4)
        snap = eng.snapshot()
        assert eng.knobs_in_force(snap.events) == snap.knobs and snap.knobs.enabled is False
        eng.reset_stats()  # counters from zero: they start with the knobs now set
        assert eng.knobs_at_start == snap.knobs
    finally:
        eng.close()
