"""The decode loop that the chat worker, ``generate``, ``bench`` and ``Session.generate`` share.

The case that used to go wrong: a stop token (EOS) that arrives as an accepted draft with more
accepted drafts after it in the same cycle.  Every caller must then emit the tokens up to and
including the stop, leave the session as if decoding had stopped there (the stop token pending,
nothing after it in the KV cache) and report DSpark counters that do not count the drafts
accepted after the stop."""

from __future__ import annotations

import json

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.engine import session as S
from ds4tui.engine import worker as W
from ds4tui.engine.decode import DecodeLoop
from ds4tui.engine.stats import DSparkStats, format_line
from ds4tui.engine.tokenizer import Tokenizer

PROMPT = [(i * 7919 + 13) % 120000 + 100 for i in range(30)]
TEXT = "Write a Python function that reverses a linked list."


def _first_stop_inside_drafts(ids: list[int], from_draft: list[bool]) -> int | None:
    """The index of the first token that was emitted as an accepted draft, was followed by another
    accepted draft of the same cycle, and had not been emitted before (so a stop set to it stops
    there), or None."""
    for i in range(len(ids) - 1):
        if from_draft[i] and from_draft[i + 1] and ids[i] not in ids[:i]:
            return i
    return None


def _steps(engine: S.Engine, prompt: list[int], n: int) -> tuple[list[int], list[bool]]:
    """Greedy DSpark decoding with the scheduler off, step by step: the ids and their draft flags
    (each step returns its accepted drafts, then the sampled token)."""
    s = engine.session(len(prompt) + n + 8)
    s.set_dspark(scheduler=False)
    s.prefill(prompt)
    ids: list[int] = []
    flags: list[bool] = []
    while len(ids) < n:
        r = s.step(min(S.STEP_MAX, n - len(ids)))
        ids += r
        flags += [k < len(r) - 1 for k in range(len(r))]
    s.close()
    return ids, flags


def _assert_counted_once(st: DSparkStats, n_drafts: int) -> None:
    assert st.accepted_draft == n_drafts, (st.accepted_draft, n_drafts)
    assert st.check_invariants() == []


@pytest.fixture(scope="module")
def engine(tiny_q2, fitted_support):
    e = S.Engine(tiny_q2["model"], support=fitted_support)
    assert e.support_status == "attached", e.support_message
    yield e
    e.close()


def test_session_generate_stops_inside_accepted_drafts_once(engine):
    ids, flags = _steps(engine, PROMPT, 120)
    i = _first_stop_inside_drafts(ids, flags)
    assert i is not None, "no stop candidate inside accepted drafts in 120 tokens"
    s = engine.session(256)
    s.set_dspark(scheduler=False)
    got = list(s.generate(PROMPT, max_tokens=120, stop=[ids[i]]))
    assert got == ids[:i + 1]
    # the session is as if decoding had stopped at the stop token: it is pending, nothing after it is kept
    assert s.pending == ids[i] and s.tokens == PROMPT + got[:-1] and s.n_tokens == len(PROMPT) + i
    _assert_counted_once(s.dspark_stats(), sum(flags[:i + 1]))
    assert s.stats().n_decode_tokens == i + 1
    # decoding goes on from the stop token exactly as a session that never drafted past it
    more = list(s.generate(PROMPT[:3], max_tokens=10))
    p = engine.session(256)
    p.set_dspark(enabled=False)
    assert list(p.generate(PROMPT, max_tokens=120, stop=[ids[i]])) == got
    assert list(p.generate(PROMPT[:3], max_tokens=10)) == more


def test_a_stop_token_in_a_full_cycle_keeps_it_full_and_counts_a_stop_cut(engine):
    """The report: after a stop token among the drafts of a cycle whose drafts all matched, the
    stats said full=1 while no histogram had a cycle accepting as many drafts as it verified.  The
    cycle stays full (the verifier accepted every draft), is counted at the drafts it kept, and
    stop_cut says so; the invariants hold and state the relation."""
    n = 120
    s = engine.session(len(PROMPT) + n + 8)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPT)
    ids: list[int] = []
    found = None
    while len(ids) < n and found is None:
        before = s.dspark_stats()
        r = s.step(min(S.STEP_MAX, n - len(ids)))
        after = s.dspark_stats()
        if after.full == before.full + 1 and len(r) >= 3 and r[0] not in ids:
            found = (len(ids), len(r) - 1, after)  # where the cycle starts, its drafts, the counters after it
        ids += r
    s.close()
    assert found is not None, "no full cycle of 2 or more drafts with a new first draft in 120 tokens"
    at, drafts, oracle = found
    assert oracle.stop_cut == 0 and oracle.check_invariants() == []
    # stop at the cycle's first draft: the drafts after it are never emitted
    g = engine.session(len(PROMPT) + n + 8)
    g.set_dspark(scheduler=False)
    got = list(g.generate(PROMPT, max_tokens=n, stop=[ids[at]]))
    assert got == ids[:at + 1]
    st = g.dspark_stats()
    g.close()
    hist = list(oracle.accepted_len_hist)
    hist[drafts] -= 1
    hist[1] += 1
    pos = list(oracle.pos_accepted)
    for row in range(1, drafts):
        pos[row] -= 1
    assert (st.cycles, st.full, st.partial, st.miss_first, st.no_draft) == (
        oracle.cycles, oracle.full, oracle.partial, oracle.miss_first, oracle.no_draft)
    assert st.proposed == oracle.proposed and st.draft_len_hist == oracle.draft_len_hist
    assert st.accepted_draft == oracle.accepted_draft - (drafts - 1) == sum(pos)
    assert list(st.accepted_len_hist) == hist and list(st.pos_accepted) == pos
    assert st.stop_cut == 1 and st.check_invariants() == []
    assert "stop_cut=1" in format_line(st).split()
    # the relations the export checks, on these counts
    both = sum(min(d, a) for d, a in zip(st.draft_len_hist[1:], st.accepted_len_hist[1:]))
    assert st.full <= both + st.stop_cut and st.full + st.partial == sum(st.accepted_len_hist[1:])


def _gen_json(capsys, *argv: str) -> dict:
    rc = cli_main(["generate", *argv])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_generate_command_stops_inside_accepted_drafts_once(tiny_q2, fitted_support, capsys, monkeypatch):
    args = [tiny_q2["model"], "-p", TEXT, "-n", "64", "--threads", "2", "--mtp", str(fitted_support),
            "--no-scheduler", "--json"]
    first = _gen_json(capsys, *args)
    ids, flags = first["generated_ids"], first["from_draft"]
    i = _first_stop_inside_drafts(ids, flags)
    assert i is not None, "no stop candidate inside accepted drafts in 64 tokens"
    monkeypatch.setattr(Tokenizer, "eos_id", property(lambda self: ids[i]))
    r = _gen_json(capsys, *args)
    assert r["prompt_ids"] == first["prompt_ids"]
    assert r["stop"] == "eos" and r["generated_ids"] == ids[:i + 1] and r["from_draft"] == flags[:i + 1]
    _assert_counted_once(DSparkStats.from_dict(r["dspark_stats"]), sum(flags[:i + 1]))
    assert r["stats"]["n_decode_tokens"] == i + 1


def test_chat_worker_stops_inside_accepted_drafts_once(tiny_q2, fitted_support, monkeypatch):
    messages = [{"role": "user", "content": TEXT}]

    def turn() -> tuple[W.TurnResult, W.ChatEngine]:
        chat = W.ChatEngine(tiny_q2["model"], support=fitted_support, backend="cpu", n_ctx=512)
        chat.set_dspark(scheduler=False)
        return chat.run_turn(messages, W.EventQueue(), think=False, max_tokens=64), chat

    first, chat = turn()
    chat.close()
    i = _first_stop_inside_drafts(list(first.ids), list(first.from_draft))
    assert i is not None, "no stop candidate inside accepted drafts in 64 tokens"
    monkeypatch.setattr(Tokenizer, "eos_id", property(lambda self: first.ids[i]))
    r, chat = turn()
    try:
        assert r.reason == "eos" and r.ids == first.ids[:i + 1] and r.from_draft == first.from_draft[:i + 1]
        assert chat.session.pending == first.ids[i] and chat.session.n_tokens == r.prompt_tokens + i
        assert r.dspark_delta["accepted_draft"] == r.n_draft == sum(first.from_draft[:i + 1])
        _assert_counted_once(chat.session.dspark_stats(), r.n_draft)
        snap = chat.snapshot()
        assert snap.turn_draft_tokens == r.n_draft and snap.dspark.accepted_draft == r.n_draft
    finally:
        chat.close()


def _cycles_one_by_one(engine: S.Engine, n_cycles: int, *, dspark: bool = True) -> tuple[list[list[int]], dict]:
    s = engine.session(len(PROMPT) + 400)
    s.set_dspark(enabled=dspark, scheduler=False)
    s.prefill(PROMPT)
    cycles = [s.step() for _ in range(n_cycles)]
    st = _counts(s.dspark_stats()) if dspark else {}
    s.close()
    return cycles, st


def _counts(st: DSparkStats) -> dict:
    """The statistics that count (the stage timings are wall times, different in every run)."""
    def drop_times(d: dict) -> dict:
        return {k: drop_times(v) if isinstance(v, dict) else v for k, v in d.items() if not isinstance(v, float)}

    return drop_times(st.to_dict())


@pytest.mark.parametrize("dspark", [True, False])
def test_step_many_runs_exactly_the_cycles_of_single_steps(engine, dspark):
    """One engine call for many cycles (spec ux.md §2.4) emits the same cycles, leaves the same
    session and counts the same DSpark statistics as one step per call."""
    want, want_st = _cycles_one_by_one(engine, 40, dspark=dspark)
    s = engine.session(len(PROMPT) + 400)
    s.set_dspark(enabled=dspark, scheduler=False)
    s.prefill(PROMPT)
    got = []
    while len(got) < 40:
        cycles, error = s.step_many(256, max_cycles=min(7, 40 - len(got)))
        assert error is None and 1 <= len(cycles) <= 7
        got += cycles
    assert got == want
    flat = [t for c in want for t in c]
    assert s.tokens == PROMPT + flat[:-1] and s.pending == flat[-1] and s.last_accepted == len(want[-1]) - 1
    assert s.stats().n_steps == 40 and s.stats().n_decode_tokens == len(flat)
    if dspark:
        assert any(len(c) > 1 for c in want), "no draft accepted: the comparison would not cover DSpark"
        assert _counts(s.dspark_stats()) == want_st and len(want_st) > 10
    s.close()


def test_step_many_ends_a_batch_at_a_stop_id_the_budget_and_a_full_context(engine):
    want, _ = _cycles_one_by_one(engine, 30)
    k = 5 + next(i for i, c in enumerate(want[5:]) if c[-1] not in [t for d in want[:5 + i] for t in d])
    s = engine.session(len(PROMPT) + 400)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPT)
    cycles, error = s.step_many(256, stop=[want[k][-1]])
    assert error is None and cycles == want[:k + 1]  # the batch ends with the cycle that emitted the stop id
    emitted = sum(len(c) for c in cycles)
    # the id budget: the cycle that reaches it is clipped as step(max_out) clips it, and the batch ends
    cycles, error = s.step_many(3)
    assert error is None and sum(len(c) for c in cycles) <= 3 and cycles[0] == want[k + 1][:3]
    # a time budget ends a batch after its first cycle at the latest once it has passed
    cycles, error = s.step_many(256, budget_s=1e-9)
    assert error is None and len(cycles) == 1
    s.close()
    # the context: the batch ends when the next token has no position left, with no error
    s = engine.session(len(PROMPT) + 12)
    s.set_dspark(enabled=False)
    s.prefill(PROMPT)
    cycles, error = s.step_many(256)
    assert error is None and len(cycles) == 13 and s.n_tokens == len(PROMPT) + 12
    with pytest.raises(S.ContextOverflowError):
        s.step_many(256)
    assert emitted > 0
    s.close()


def test_step_many_after_a_cancel_stops_at_once_and_changes_nothing(engine):
    s = engine.session(len(PROMPT) + 64)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPT)
    first = s.step()  # sampled from the prompt's logits: the next cycle runs a pass
    s.cancel()
    with pytest.raises(S.CancelledError):
        s.step_many(256)
    assert s.tokens == PROMPT and s.pending == first[-1] and s.stats().n_cancelled == 1
    cycles, error = s.step_many(256, max_cycles=2)  # the cancel was consumed
    assert error is None and len(cycles) == 2
    s.close()
    # a cancel is also read before each later cycle of a batch: it ends the batch and stays for the next call
    s = engine.session(len(PROMPT) + 64)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPT)
    s.cancel()
    cycles, error = s.step_many(256)  # the first cycle samples from the prompt's logits (no pass to stop)
    assert error is None and len(cycles) == 1 and s.pending == cycles[0][-1]
    with pytest.raises(S.CancelledError):
        s.step_many(256)
    s.close()


def test_a_budget_longer_than_a_batch_never_clips_a_draft_at_the_batch_end(engine):
    """A batch holds at most STEP_MANY_OUT (256) ids.  With no time limit (a fast engine fills a
    batch within BATCH_S) the cycles at the end of a full batch used to get the room the batch had
    left as their budget: drafts clipped to it and a `no_room` cycle, which the step-by-step loop
    with the real budget left never has.  The loop runs exactly the cycles of single steps with
    min(STEP_MAX, budget left), as its docstring says."""
    from ds4tui.engine.decode import DecodeLoop

    n = 300
    one = engine.session(len(PROMPT) + n + 8)
    one.set_dspark(scheduler=False)
    one.prefill(PROMPT)
    want: list[list[int]] = []
    while sum(map(len, want)) < n:
        want.append(one.step(min(S.STEP_MAX, n - sum(map(len, want)))))
    want_st = _counts(one.dspark_stats())
    one.close()
    assert n > 1 + S.STEP_MANY_OUT  # with no time limit the second batch would run to its 256 ids
    s = engine.session(len(PROMPT) + n + 8)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPT)
    got = [list(c.tokens) for c in DecodeLoop(s, n, batch_s=0.0)]
    st = _counts(s.dspark_stats())
    s.close()
    assert got == want
    assert (st["no_room"], st["draft_len_hist"]) == (want_st["no_room"], want_st["draft_len_hist"])
    assert st == want_st


def test_a_loop_left_mid_batch_hands_out_the_rest_the_engine_ran(engine):
    """A caller interrupted while it shows a cycle (generate under Ctrl+C) leaves the rest of the
    engine's batch run but not handed out; ``computed_rest`` hands it out without running anything,
    so the ids equal the step-by-step oracle's and the session's KV cache holds exactly them."""
    n = 80
    want, _ = _steps(engine, PROMPT, n)

    def started():
        s = engine.session(len(PROMPT) + n + 8)
        s.set_dspark(scheduler=False)
        s.prefill(PROMPT)
        return s

    full = started()
    whole = DecodeLoop(full, n)
    list(whole)
    assert whole.ids == want[:len(whole.ids)]
    lag = len(whole.ids) - (full.n_tokens - len(PROMPT))  # ids not (yet) in the KV cache: the pending one
    full.close()

    s = started()
    loop = DecodeLoop(s, n, batch_s=60.0)  # the second batch runs every cycle left, on any machine
    for i, _cycle in enumerate(loop):
        if i == 2:  # the second batch's second cycle: the first cycle is a batch of its own
            break
    shown = len(loop.ids)
    rest = loop.computed_rest()
    assert rest, "the batch held more cycles than were shown"
    assert loop.ids == want[:len(loop.ids)]
    assert len(loop.ids) == shown + sum(len(c.tokens) for c in rest)
    assert len(loop.ids) - (s.n_tokens - len(PROMPT)) == lag == 1
    assert loop.computed_rest() == []
    s.close()


def test_an_interrupt_in_a_batch_of_single_steps_keeps_the_cycles_before_it(engine):
    """A backend stepped one cycle at a time (the numpy reference is): Ctrl-C during a batch's third
    cycle ends the batch there, and the two cycles before it, booked and counted, are handed out by
    ``computed_rest`` once the loop has raised the interrupt."""
    n = 40
    want, _ = _steps(engine, PROMPT, n)
    s = engine.session(len(PROMPT) + n + 8)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPT)
    native, steps = s.backend, []

    class OneStepAtATime:
        def __getattr__(self, name):
            if name == "step_many":
                raise AttributeError(name)
            return getattr(native, name)

        def step(self, max_out, pending):
            steps.append(max_out)
            if len(steps) == 4:
                raise KeyboardInterrupt  # the signal stops this cycle
            return native.step(max_out, pending)

    s.backend = OneStepAtATime()
    loop = DecodeLoop(s, n, batch_s=60.0)
    shown = []
    with pytest.raises(KeyboardInterrupt):
        for cycle in loop:
            shown.append(cycle)
    rest = loop.computed_rest()
    assert (len(steps), len(shown), len(rest)) == (4, 1, 2)  # the first cycle is a batch of its own
    assert loop.ids == want[:len(loop.ids)] and len(loop.ids) == s.stats().n_decode_tokens
    assert s.tokens == PROMPT + loop.ids[:-1] and s.pending == loop.ids[-1]
    s.backend = native
    s.close()
