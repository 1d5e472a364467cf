"""The DSpark scheduler's prices kept across sessions and runs (spec dspark.md §7.4).

Oracles: the scheduler's own state as the C engine reports it (``Session.scheduler_prices``), the
DSpark counters (a pricing draft is a proposal in a fresh session's sixth cycle, after five plain
decodes), and the saved file's JSON.  No timing is asserted: the kept prices given here are made so
far from any real pass (a verify of a second) that the decisions they lead to do not depend on the
machine.  The sessions here run the acceptance policy (spec dspark.md §7.4), whose probes, back-offs and
hopeless test these prices drive; the confidence policy's decisions are tested in test_dspark_engine.py.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.commands.environment import scheduler_prices_dir as real_prices_dir
from ds4tui.engine import prices as P
from ds4tui.engine import session as S
from ds4tui.engine.errors import SchedulerPricesError

#: What a load problem's note says after the file's problem: no promise about the write.
IGNORED = ("; ignored: the scheduler starts fresh. Nothing to do: a session that closes writes its prices over the "
           "file if it can, and says so if it cannot")
#: The end of every note about a prices folder that cannot be written.
ADVICE = ("point XDG_CACHE_HOME at a writable folder (the command line keeps them in "
          "$XDG_CACHE_HOME/ds4tui/scheduler-prices); or run with --scheduler-prices engine (prices kept within the "
          "run) or fresh, which write no file")

PROMPT = [101, 2024, 777, 31337, 4242, 9000, 123, 456, 789, 1011, 1213, 1415]

#: Drafting cannot pay with these, whatever the machine: a proposal and a verify of a second each
#: against a plain decode of a millisecond, and no first draft accepted in 8 verifies (as many as a
#: session starts with: P.PRIOR_VERIFIES).
HOPELESS = P.SchedulerPrices(t_ver={1: 1.0, 6: 1000.0}, t_prop=1000.0,
                             reached=(P.PRIOR_VERIFIES, 0, 0, 0, 0) + (0,) * 11, hit=(0,) * 16)


@pytest.fixture(autouse=True)
def _quiet_machine(request, monkeypatch):
    """The other work an engine measures (the whole machine's busy time, /proc/stat) pinned at none, so
    that what a test keeps and loads does not hang on what else runs on the machine between its sessions:
    a change of P.RETIME_OTHER_CORES or more re-times kept prices by design (spec dspark.md §7.4), and a
    test beside another job's start failed that way. The tests of that measurement say
    ``@pytest.mark.real_other_work``."""
    if request.node.get_closest_marker("real_other_work") is None:
        monkeypatch.setattr(P, "other_work", lambda a, b: 0.0)


def _decode(session: S.Session, n: int) -> None:
    session.prefill(PROMPT)
    got = 0
    while got < n:  # the whole budget each step: never a tail skip
        got += len(session.step())


def test_a_fresh_session_pays_a_pricing_draft_and_a_priced_one_does_not(tiny_q2):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="engine")
    assert e.scheduler_prices == "engine" and e.kept_prices is None
    first = e.session(128, policy="acceptance")
    assert first.scheduler_prices_at_start == "fresh" and not first.scheduler_prices().learnt
    first.set_scheduler_prices(HOPELESS)
    _decode(first, 30)
    st = first.dspark_stats()
    assert st.proposed == 0 and st.scheduler_skips == st.cycles > 8  # priced: it never drafts
    end = first.scheduler_prices()
    assert end.t_prop == 1000.0 and end.t_ver[6] == 1000.0 and end.reached == HOPELESS.reached
    first.close()

    kept = e.kept_prices  # the plain decode's price is the first session's mean plain decode
    assert kept.t_ver[1] == pytest.approx(st.t_decode_ms) and kept.t_ver[6] == 1000.0 and kept.t_prop == 1000.0
    assert kept.reached == HOPELESS.reached and kept.hit == HOPELESS.hit
    second = e.session(128, policy="acceptance")
    assert second.scheduler_prices_at_start == "engine" and second.scheduler_prices() == kept
    _decode(second, 30)
    st2 = second.dspark_stats()
    assert st2.proposed == 0 and st2.propose == 0.0 and st2.no_draft_reasons["scheduler_skip"] == st2.cycles
    second.close()

    fresh = S.Engine(tiny_q2["model"], support=tiny_q2["support"])  # the engine's default: fresh
    s = fresh.session(128, policy="acceptance")
    _decode(s, 30)
    assert s.scheduler_prices_at_start == "fresh" and s.dspark_stats().proposed > 0  # its pricing draft
    s.close()
    assert fresh.kept_prices is None


def _priced(tiny_q2, prices: P.SchedulerPrices, support=None, n_ctx: int = 128) -> S.Session:
    """A session started from ``prices``, its prompt prefilled and the prefill's logits sampled."""
    s = S.Engine(tiny_q2["model"], support=support or tiny_q2["support"]).session(n_ctx, policy="acceptance")
    s.set_scheduler_prices(prices)
    s.prefill(PROMPT)
    s.step()  # samples the prefill's logits
    return s


def test_a_priced_session_still_times_a_plain_decode_first(tiny_q2):
    s = _priced(tiny_q2, P.SchedulerPrices(t_ver={1: 1000.0, 6: 0.001}, t_prop=0.001,
                                           reached=(32,) * 5 + (0,) * 11, hit=(32,) * 5 + (0,) * 11))
    s.step()  # the first cycle: a plain decode, however cheap drafting looks
    st = s.dspark_stats()
    assert (st.cycles, st.proposed, st.no_draft_reasons["scheduler_skip"]) == (1, 0, 1)
    assert s.scheduler_prices().t_ver[1] < 1000.0  # re-timed (clamped: at most halved)
    s.close()


def test_a_fresh_session_decodes_five_times_before_its_pricing_draft(tiny_q2):
    """With no kept t_ver(1) the first five cycles are plain decodes (the first one after a prefill
    runs slow); the sixth, with no proposal priced yet, drafts."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(128, policy="acceptance")
    s.prefill(PROMPT)
    s.step()  # samples the prefill's logits
    for i in range(1, 6):
        s.step()
        st = s.dspark_stats()
        assert (st.cycles, st.proposed, st.no_draft_reasons["scheduler_skip"]) == (i, 0, i)
    assert 1 in s.scheduler_prices().t_ver and s.scheduler_prices().t_prop is None
    s.step()
    st = s.dspark_stats()
    assert st.cycles == 6 and st.proposed > 0 and st.no_draft_reasons["scheduler_skip"] == 5
    assert s.scheduler_prices().t_prop is not None
    s.close()


def test_a_best_case_under_a_quarter_better_backs_off_the_longest_at_once(tiny_q2):
    """Drafting that does not pay at the mean acceptance and would beat plain decoding by only ~8 %
    with every draft accepted is not probed again within a 30-token answer (spec dspark.md §7.4).
    The kept prices are so far from a real pass that the machine cannot change the decision: the
    plain decode's re-timing brings t_ver(1) from 400 ms to 360 ms (the real decode, clamped to
    half the price, enters the moving average at weight 0.2); then 5 drafts all accepted give 6
    tokens in 2000 ms, 1.08x of one token in 360 ms, and the means (13 of 14 at each position) 5.02.
    Twelve verifies reached every position (prices set directly: their counts are used as given):
    fewer never make drafting hopeless (a cold first proposal, a code answer's hard first lines)."""
    s = _priced(tiny_q2, P.SchedulerPrices(t_ver={1: 400.0, 6: 1000.0}, t_prop=1000.0,
                                           reached=(12,) * 5 + (0,) * 11, hit=(12,) * 5 + (0,) * 11))
    s.step()  # the re-timing plain decode
    assert s.scheduler_prices().t_ver[1] == pytest.approx(360.0, rel=1e-3)
    for _ in range(28):  # without the margin: a back-off of 2 and a 5-draft probe in the 4th cycle
        s.step()
    st = s.dspark_stats()
    assert st.proposed == 0 and st.no_draft_reasons["scheduler_skip"] == st.cycles == 29
    s.close()


def test_fewer_than_twelve_verifies_never_make_drafting_hopeless(tiny_q2):
    """The prices of the test above with eleven verifies per position: drafting does not pay at the
    means and its best case is under a quarter better, but eleven verifies (a fresh session's pricing
    cycle, its proposal timed cold, and a code answer's first lines, hard to draft) are too few to
    stop probing for 256 cycles (spec dspark.md §7.4, Back-off): a back-off of 2 and a probe of the
    optimistic length in the fourth cycle.  Every draft accepted would beat plain decoding (1.08x),
    so the times alone do not make it hopeless either."""
    s = _priced(tiny_q2, P.SchedulerPrices(t_ver={1: 400.0, 6: 1000.0}, t_prop=1000.0,
                                           reached=(11,) * 5 + (0,) * 11, hit=(11,) * 5 + (0,) * 11))
    for _ in range(4):  # the re-timing plain decode, the back-off's 2 cycles, the probe
        s.step()
    st = s.dspark_stats()
    assert st.cycles == 4 and st.no_draft_reasons["scheduler_skip"] == 3 and st.proposed > 0
    s.close()


def test_kept_acceptance_of_another_text_does_not_make_drafting_hopeless_before_the_sessions_own(tiny_q2, tmp_path):
    """Kept prices whose acceptance is another text's (every kept draft rejected: prose, say, before
    a code answer) with times at which drafting could pay: the session does not give up drafting for
    256 cycles on them, as it did while the kept verifies counted towards the minimum (spec dspark.md
    §7.4, Back-off); it backs off and probes, and so measures acceptance of its own."""
    kw = dict(support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    e = S.Engine(tiny_q2["model"], **kw)
    s = e.session(128, policy="acceptance")
    s.set_scheduler_prices(HOPELESS)  # a session that never drafts: this machine's plain decode
    _decode(s, 20)
    d = s.dspark_stats().t_decode_ms
    s.close()
    # a cycle of 2 decodes: five drafts all accepted would be 3x plain decoding, and the kept 0 of 8 at
    # the first position (its optimistic bound 0.28: 1.38 tokens a cycle) 0.69x, under the 1.25x margin
    now = time.time()
    P.save(e.scheduler_prices_file, P.identity(e), P.SchedulerPrices(
        {1: d, 6: 1.5 * d}, 0.5 * d, (P.KEPT_VERIFIES,) + (0,) * 15, (0,) * 16, {6: now}, now))
    e.close()
    e = S.Engine(tiny_q2["model"], **kw)
    s = e.session(128, policy="acceptance")
    assert s.scheduler_prices_at_start == "saved" and s.scheduler_prices().reached[0] == P.PRIOR_VERIFIES
    _decode(s, 30)
    st = s.dspark_stats()
    assert st.proposed > 0 and st.scheduler_skips < st.cycles
    s.close()


def test_a_budget_that_clips_the_draft_to_a_loss_is_a_tail_skip_and_no_back_off(tiny_q2):
    """Tail (spec dspark.md §7.4): the cost model decides with the draft length the caller's budget
    leaves.  With these prices (a plain decode re-timed to 360 ms, a proposal 400 ms, verify(2)
    520 ms, verify(6) 1000 ms, 32 of 32 drafts accepted at every position) one draft gives 1.97
    tokens in 920 ms (2.1 tokens/s, under plain decoding's 2.8) and five give 5.57 in 1400 ms (4.0):
    a budget of 2 tokens (one draft at most) is a tail skip, and with no back-off the next cycle, with
    9 tokens left and so room for all five, drafts."""
    s = _priced(tiny_q2, P.SchedulerPrices(t_ver={1: 400.0, 6: 1000.0}, t_prop=400.0,
                                           reached=(32,) * 5 + (0,) * 11, hit=(32,) * 5 + (0,) * 11))
    s.step()  # the re-timing plain decode
    assert s.scheduler_prices().t_ver[1] == pytest.approx(360.0, rel=1e-3)
    s.step(2)
    st = s.dspark_stats()
    assert (st.cycles, st.proposed, st.tail_skips, st.no_draft_reasons["tail_skip"]) == (2, 0, 1, 1)
    s.step(9)
    st = s.dspark_stats()
    assert st.cycles == 3 and st.tail_skips == 1 and st.no_draft_reasons["scheduler_skip"] == 1
    assert st.proposed == 5  # the whole block: the budget clips nothing
    s.close()


@pytest.mark.parametrize("scheduler", [True, False])
def test_a_proposal_the_budget_cut_short_is_no_sample_of_t_prop(tiny_q2, scheduler):
    """t_prop prices the whole proposal (spec dspark.md §7.4): one that the caller's budget cut short
    (fewer LM-head rows and Markov steps) is no sample of it, with the scheduler on (the tail now
    drafts a cut length that pays) or off; a whole one is.  Prices: a proposal 100 ms, far above
    what the tiny model's drafter takes, so that a sample moves it by the EMA's most, to 0.8 x 100 +
    0.2 x 50 = 90 ms; a plain decode re-timed to 360 ms, verify(2) 410 ms, every draft accepted: one
    draft gives 1.97 tokens in 510 ms, more than plain decoding's 1.42, so a budget of 2 drafts one."""
    s = _priced(tiny_q2, P.SchedulerPrices(t_ver={1: 400.0, 6: 450.0}, t_prop=100.0,
                                           reached=(32,) * 5 + (0,) * 11, hit=(32,) * 5 + (0,) * 11))
    if scheduler:
        s.step()  # the re-timing plain decode
    else:
        s.set_dspark(scheduler=False)
    s.step(2)  # room for one draft of the five
    st = s.dspark_stats()
    assert (st.proposed, st.draft_len_hist[1], st.tail_skips) == (1, 1, 0)
    assert s.scheduler_prices().t_prop == 100.0
    s.step()  # room for the whole block: the proposal is a sample (whatever length the scheduler then verifies)
    assert s.dspark_stats().cycles == st.cycles + 1 and s.dspark_stats().proposed > 1
    assert s.scheduler_prices().t_prop == pytest.approx(90.0)
    s.close()


def test_a_budget_cut_never_makes_drafting_hopeless(tiny_q2):
    """Whether drafting is hopeless (a back-off of 256 cycles, spec dspark.md §7.4) is judged at the
    length the budget does not cut.  Prices: a plain decode re-timed to 360 ms, a proposal 150 ms,
    verify(2) 388 ms, verify(6) 500 ms, 1 of 4 drafts accepted at every position (mean 1/3, optimistic
    bound 0.69): drafting pays at no length at the means; at the bounds one draft gives 1.69 tokens in
    538 ms (3.1 tokens/s, under the 3.5 that a quarter over plain decoding needs) but five give 2.88 in
    650 ms (4.4).  A cycle whose budget leaves room for one draft backs off for 2 cycles, and the
    next cycle, with room for five, probes."""
    s = _priced(tiny_q2, P.SchedulerPrices(t_ver={1: 400.0, 6: 500.0}, t_prop=150.0,
                                           reached=(4,) * 5 + (0,) * 11, hit=(1,) * 5 + (0,) * 11))
    s.step()  # the re-timing plain decode
    assert s.scheduler_prices().t_ver[1] == pytest.approx(360.0, rel=1e-3)
    s.step(2)  # the back-off's first cycle
    s.step()  # its second
    st = s.dspark_stats()
    assert (st.cycles, st.proposed, st.no_draft_reasons["scheduler_skip"], st.tail_skips) == (3, 0, 3, 0)
    s.step()  # the probe
    st = s.dspark_stats()
    assert st.cycles == 4 and st.proposed > 0
    s.close()


def test_a_cycle_with_no_room_leaves_a_due_probe_for_the_next(tiny_q2):
    """A back-off ends with a probe (spec dspark.md §7.4).  When the cycle it falls on has no room for
    a draft (a budget of one token: the last of an answer), the probe used to be spent there, and the
    next cycle, finding drafting still unprofitable at the means, backed off twice as long without
    having measured anything.  The prices of test_a_budget_cut_never_makes_drafting_hopeless: not
    hopeless, so the probe is a long one."""
    s = _priced(tiny_q2, P.SchedulerPrices(t_ver={1: 400.0, 6: 500.0}, t_prop=150.0,
                                           reached=(4,) * 5 + (0,) * 11, hit=(1,) * 5 + (0,) * 11))
    s.step()  # the re-timing plain decode
    s.step()  # does not pay: a back-off of 2 cycles, this one included
    s.step()  # its second
    s.step(1)  # the probe is due: no room for it
    st = s.dspark_stats()
    assert (st.cycles, st.proposed, st.no_draft_reasons["scheduler_skip"], st.no_room) == (4, 0, 3, 1)
    s.step()  # the probe
    st = s.dspark_stats()
    assert st.cycles == 5 and st.proposed > 0 and st.no_draft_reasons["scheduler_skip"] == 3
    s.close()


#: The prices of test_a_budget_cut_never_makes_drafting_hopeless.  Each plain decode after the first
#: pulls the decode's price down by a tenth (the tiny model's decode, far under it, enters clamped at
#: half): 360, 324, 292, 262 ms.  From 292 ms on, the optimistic bounds' best length is four drafts
#: (2.72 tokens in 608 ms, 4.47 tokens/s, against five's 2.88 in 650 ms, 4.42; at 262 ms 4.51 and 4.42).
NOT_HOPELESS = P.SchedulerPrices(t_ver={1: 400.0, 6: 500.0}, t_prop=150.0,
                                 reached=(4,) * 5 + (0,) * 11, hit=(1,) * 5 + (0,) * 11)


def test_a_cycle_whose_budget_cuts_a_due_probe_short_leaves_it_for_the_next(tiny_q2):
    """A back-off's probe (spec dspark.md §7.4) that falls on a cycle whose budget leaves room for
    fewer drafts than the probe makes waits, as it does on a cycle with no room: it used to draft the
    cut length (here one draft of four), and a miss there started the next back-off twice as long as
    if a whole probe had failed.  The cycle is a tail_skip; the next, with room for the whole block,
    probes with the four drafts of :data:`NOT_HOPELESS` and verifies all of them."""
    s = _priced(tiny_q2, NOT_HOPELESS)
    s.step()  # the re-timing plain decode
    s.step()  # does not pay: a back-off of 2 cycles, this one included
    s.step()  # its second
    s.step(2)  # the probe is due: the budget leaves room for one draft of its four
    st = s.dspark_stats()
    assert (st.cycles, st.proposed, st.no_draft_reasons["scheduler_skip"], st.tail_skips) == (4, 0, 3, 1)
    assert s.scheduler_prices().t_ver[1] == pytest.approx(262.44, rel=1e-3)  # four plain decodes
    s.step()  # the probe
    st = s.dspark_stats()
    assert (st.cycles, st.proposed, st.draft_len_hist[4], st.no_draft_reasons["scheduler_skip"]) == (5, 4, 1, 3)
    s.close()


def test_a_budget_cut_that_leaves_room_for_the_whole_probe_does_not_delay_it(tiny_q2):
    """Only a probe that the budget cuts short waits: the four drafts of :data:`NOT_HOPELESS`'s probe
    run in a cycle whose budget leaves room for four of the block's five."""
    s = _priced(tiny_q2, NOT_HOPELESS)
    s.step()  # the re-timing plain decode
    s.step()  # does not pay: a back-off of 2 cycles, this one included
    s.step()  # its second
    assert s.scheduler_prices().t_ver[1] == pytest.approx(291.6, rel=1e-3)
    s.step(5)  # the probe is due: room for four drafts, all it makes
    st = s.dspark_stats()
    assert (st.cycles, st.proposed, st.draft_len_hist[4], st.tail_skips) == (4, 4, 1, 0)
    assert st.no_draft_reasons["scheduler_skip"] == 3
    s.close()


def test_the_engine_refuses_prices_out_of_range_by_name(tiny_q2):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(64, policy="acceptance")
    with pytest.raises(ValueError, match=r"hit\[1\] = 3 is more than reached\[1\] = 2"):
        s.set_scheduler_prices(P.SchedulerPrices(reached=(4, 2) + (0,) * 14, hit=(2, 3) + (0,) * 14))
    with pytest.raises(ValueError, match=r"t_ver\[6\] must be a finite time > 0 ms"):
        s.set_scheduler_prices(P.SchedulerPrices(t_ver={6: float("nan")}))
    s.close()
    plain = S.Engine(tiny_q2["model"]).session(64, policy="acceptance")
    with pytest.raises(S.StateError, match="scheduler prices need an attached DSpark support model"):
        plain.set_scheduler_prices(HOPELESS)
    with pytest.raises(ValueError, match="scheduler_prices must be one of fresh, engine, saved"):
        S.Engine(tiny_q2["model"], scheduler_prices="always")
    with pytest.raises(ValueError, match="needs prices_dir"):
        S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="saved")


def test_carried_counts_are_scaled_and_merged():
    many = P.SchedulerPrices(t_ver={1: 2.0}, reached=(320, 100, 10) + (0,) * 13, hit=(100, 10, 1) + (0,) * 13)
    c = many.capped()
    assert c.reached[:3] == (8, 2, 0) and c.hit[:3] == (2, 0, 0) and c.t_ver == {1: 2.0}  # x 8/320, rounded
    assert HOPELESS.capped() is HOPELESS
    start = P.SchedulerPrices(t_ver={1: 2.0, 6: 7.0}, t_prop=5.0, reached=(10,) + (0,) * 15, hit=(4,) + (0,) * 15)
    end = P.SchedulerPrices(t_ver={1: 2.5, 6: 7.0, 3: 4.0}, t_prop=5.0, reached=(13, 2) + (0,) * 14,
                            hit=(6, 1) + (0,) * 14)
    kept = P.SchedulerPrices(t_ver={1: 2.0, 6: 7.0, 2: 3.0}, t_prop=5.0, reached=(20,) + (0,) * 15,
                             hit=(8,) + (0,) * 15)
    m = kept.merged(start, end)  # the session added 3 verifies at position 0 (2 accepted), 2 at position 1
    # it never re-timed the 6-row verify nor the proposal: they follow its plain decode, 2.0 -> 2.5 ms
    assert m.t_ver == {1: 2.5, 2: 3.0, 3: 4.0, 6: pytest.approx(8.75)} and m.t_prop == pytest.approx(6.25)
    assert m.reached[:2] == (23, 2) and m.hit[:2] == (10, 1)
    assert P.SchedulerPrices().merged(None, end) == end
    retimed = P.SchedulerPrices(t_ver={1: 8.0, 6: 7.5}, t_prop=5.5, reached=start.reached, hit=start.hit)
    m = kept.merged(start, retimed)  # re-timed: kept as measured; the decode's change is capped at 2x
    assert m.t_ver[6] == 7.5 and m.t_prop == 5.5 and m.t_ver[1] == 8.0
    stalled = P.SchedulerPrices(t_ver={1: 8.0, 6: 7.0}, t_prop=5.0, reached=start.reached, hit=start.hit)
    m = kept.merged(start, stalled)
    assert m.t_ver[6] == pytest.approx(14.0) and m.t_prop == pytest.approx(10.0)


def test_saved_prices_round_trip_through_the_file(tiny_q2, tmp_path):
    kw = dict(support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    e = S.Engine(tiny_q2["model"], **kw)
    path = e.scheduler_prices_file
    assert path.parent == tmp_path and not path.exists() and "no prices yet" in e.scheduler_prices_note
    s = e.session(128, policy="acceptance")
    assert s.scheduler_prices_at_start == "fresh"
    s.set_scheduler_prices(HOPELESS)
    _decode(s, 20)
    s.close()
    doc = json.loads(path.read_text())
    assert doc["format"] == P.FORMAT and doc["identity"] == P.identity(e)
    assert doc["identity"]["n_threads"] == e.n_threads and doc["identity"]["backend"] == "cpu"
    assert doc["prices"]["t_ver_ms"]["6"] == 1000.0 and doc["prices"]["reached"] == list(HOPELESS.reached)
    saved = P.SchedulerPrices.from_dict(doc["prices"])
    e.close()

    again = S.Engine(tiny_q2["model"], **kw)
    assert again.scheduler_prices_file == path and again.scheduler_prices_problem == ""
    assert again.scheduler_prices_note.startswith(f"saved: from {path}")
    s = again.session(128, policy="acceptance")
    assert s.scheduler_prices_at_start == "saved" and s.scheduler_prices() == saved
    _decode(s, 20)
    assert s.dspark_stats().proposed == 0
    s.close()
    other = S.Engine(tiny_q2["model"], n_threads=3, **kw)  # other threads: another file
    assert other.scheduler_prices_file != path and other.kept_prices is None


def test_merging_stamps_each_time_a_session_measured_and_the_stamps_round_trip():
    start = P.SchedulerPrices(t_ver={1: 2.0, 3: 4.0, 6: 7.0}, t_prop=5.0, reached=(10,) + (0,) * 15,
                              hit=(4,) + (0,) * 15, verify_timed_at={3: 100.0, 6: 100.0}, proposal_timed_at=100.0)
    kept = start.capped()
    assert kept.verify_timed_at == {3: 100.0, 6: 100.0} and kept.proposal_timed_at == 100.0
    plain = P.SchedulerPrices(t_ver={1: 2.5, 3: 4.0, 6: 7.0}, t_prop=5.0, reached=start.reached, hit=start.hit)
    m = kept.merged(start, plain, now=5000.0)  # no verify timed: the stamps stay
    assert m.verify_timed_at == {3: 100.0, 6: 100.0} and m.proposal_timed_at == 100.0
    short = P.SchedulerPrices(t_ver={1: 2.5, 3: 3.5, 6: 7.0}, t_prop=5.0, reached=(11,) + (0,) * 15, hit=start.hit)
    m = kept.merged(start, short, now=5000.0)  # a 2-draft cycle re-timed verify(3) only (--max-draft 2)
    assert m.verify_timed_at == {3: 5000.0, 6: 100.0} and m.proposal_timed_at == 100.0
    proposed = P.SchedulerPrices(t_ver={1: 2.5, 3: 4.0, 6: 7.0}, t_prop=4.0, reached=start.reached, hit=start.hit)
    assert kept.merged(start, proposed, now=6000.0).proposal_timed_at == 6000.0
    assert P.SchedulerPrices().merged(None, short, now=7.0).verify_timed_at == {3: 7.0, 6: 7.0}
    assert P.SchedulerPrices.from_dict(m.to_dict()).verify_timed_at == {3: 5000.0, 6: 100.0}
    old = m.to_dict()
    del old["verify_timed_at"], old["proposal_timed_at"]  # files written before they were recorded
    unknown = P.SchedulerPrices.from_dict(old)
    assert unknown.verify_timed_at == {} and unknown.proposal_timed_at is None
    for field, value, expected in (
            ("verify_timed_at", {"6": "yesterday"}, "verify_timed_at.6: expected a time in Unix seconds >= 0, or "
                                                     "null, found 'yesterday'"),
            ("verify_timed_at", {"1": 5.0}, "verify_timed_at: expected widths 2..17, found '1'"),
            ("verify_timed_at", 5.0, "verify_timed_at: expected an object of width → Unix seconds, found 5.0"),
            ("proposal_timed_at", -1, "proposal_timed_at: expected a time in Unix seconds >= 0, or null, found -1")):
        with pytest.raises(SchedulerPricesError, match=re.escape(f"prices.{expected}")):
            P.SchedulerPrices.from_dict({**old, field: value})
    # which times are too old to start from, and what a session does about it
    hour = P.RETIME_AFTER_S
    assert kept.stale(100.0 + hour) == ([], False, 0.0) and P.retime_reason(kept, 100.0 + hour) == ""
    assert m.stale(5000.0) == ([6], True, 4900.0)  # verify(3) was re-timed at 5000
    assert P.retime_reason(m, 5000.0) == ("the kept times of verify(6) and the proposal were measured 82 min ago "
                                          "(over 1 h): drafting re-times them")
    assert P.retime_reason(m, 100.0 + 3 * 3600) == ("the kept times of verify(3), verify(6) and the proposal were "
                                                    "measured 3.0 h ago (over 1 h): drafting re-times them")
    assert P.retime_reason(unknown, 0.0) == ("the kept times of verify(3), verify(6) and the proposal were measured "
                                             "at a time they do not record (or one later than this machine's "
                                             "clock) (over 1 h): drafting re-times them")
    future = P.SchedulerPrices(dict(m.t_ver), m.t_prop, m.reached, m.hit, {3: 1e12, 6: 1e12}, 1e12)
    assert future.stale(5000.0)[:2] == ([3, 6], True)  # a clock set back: not believed
    assert future.stale(1e12 - 30)[:2] == ([], False)  # within the slack
    bare = m.without_stale(5000.0)
    assert bare.t_ver == {1: 2.5, 3: 3.5} and bare.t_prop is None and bare.reached == m.reached
    assert bare.verify_timed_at == {3: 5000.0} and bare.proposal_timed_at is None
    assert P.SchedulerPrices(t_ver={1: 2.0}).stale(1e9) == ([], False, 0.0)


def _saved_hopeless(tiny_q2, tmp_path, timed_at: float) -> S.Engine:
    """An engine whose saved prices file holds :data:`HOPELESS` (a verify of a second), its verify
    and proposal timed at ``timed_at``, as a run on a busy machine would have left them."""
    kw = dict(support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    e = S.Engine(tiny_q2["model"], **kw)
    P.save(e.scheduler_prices_file, P.identity(e), P.SchedulerPrices(
        dict(HOPELESS.t_ver), HOPELESS.t_prop, HOPELESS.reached, HOPELESS.hit, {6: timed_at}, timed_at))
    e.close()
    return S.Engine(tiny_q2["model"], **kw)


def test_saved_verify_times_an_hour_old_are_re_timed_by_a_drafted_cycle(tiny_q2, tmp_path):
    """A verify priced while other work held the cores prices drafting out, and a scheduler that never
    drafts never measures it again: past RETIME_AFTER_S the session leaves the kept verify and
    proposal times out, drafts once to price them, and the file then holds what it measured."""
    e = _saved_hopeless(tiny_q2, tmp_path, time.time() - 2 * 3600)
    path = e.scheduler_prices_file
    assert e.scheduler_prices_note.endswith("the kept times of verify(6) and the proposal were measured 2.0 h ago "
                                            "(over 1 h): drafting re-times them")
    s = e.session(128, policy="acceptance")
    assert s.scheduler_prices_at_start == "saved" and "2.0 h ago" in s.scheduler_prices_retime
    start = s.scheduler_prices()
    assert start.t_ver == {1: 1.0} and start.t_prop is None and start.reached == HOPELESS.reached
    _decode(s, 20)
    assert s.dspark_stats().proposed > 0  # the pricing draft
    s.close()
    doc = json.loads(path.read_text())["prices"]
    assert doc["t_prop_ms"] < 1000.0 and all(ms < 1000.0 for ms in doc["t_ver_ms"].values())
    stamps = [*doc["verify_timed_at"].values(), doc["proposal_timed_at"]]
    assert all(time.time() - 60 < t <= time.time() for t in stamps)
    again = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    assert "re-times" not in again.scheduler_prices_note and again.session(128, policy="acceptance").scheduler_prices_retime == ""


def test_stale_kept_times_a_session_does_not_re_time_are_dropped_not_kept_stale(tiny_q2, tmp_path):
    """Kept verify times left out of a session's start as stale, of widths its drafting never ran
    (it drafts the whole block, 6 rows), go from the file when it closes: kept, they stayed stale
    and every later run said again that it re-times them.  The width it ran is kept, re-timed."""
    kw = dict(support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    e = S.Engine(tiny_q2["model"], **kw)
    old = time.time() - 2 * 3600
    P.save(e.scheduler_prices_file, P.identity(e), P.SchedulerPrices(
        {1: 1.0, 2: 1000.0, 3: 1000.0, 6: 1000.0}, 1000.0, HOPELESS.reached, HOPELESS.hit,
        {2: old, 3: old, 6: old}, old))
    e.close()
    e = S.Engine(tiny_q2["model"], **kw)
    assert "the kept times of verify(2), verify(3), verify(6) and the proposal were measured 2.0 h ago" in (
        e.scheduler_prices_note)
    s = e.session(128, policy="acceptance")
    _decode(s, 20)
    st = s.dspark_stats()
    assert st.proposed > 0 and st.draft_len_hist[5] == st.drafted_cycles  # 6-row verifies only
    s.close()
    doc = json.loads(e.scheduler_prices_file.read_text())["prices"]
    assert set(doc["t_ver_ms"]) == {"1", "6"} and set(doc["verify_timed_at"]) == {"6"}
    assert doc["t_ver_ms"]["6"] < 1000.0 and doc["t_prop_ms"] < 1000.0
    e.close()
    again = S.Engine(tiny_q2["model"], **kw)
    assert "re-times" not in again.scheduler_prices_note and again.session(128, policy="acceptance").scheduler_prices_retime == ""
    again.close()


def test_merging_drops_left_out_times_the_session_did_not_measure():
    kept = P.SchedulerPrices({1: 1.0, 2: 5.0, 6: 9.0}, 4.0, (4,) + (0,) * 15, (2,) + (0,) * 15,
                             {2: 10.0, 6: 10.0}, 10.0)
    start = P.SchedulerPrices({1: 1.0}, None, kept.reached, kept.hit)  # verify(2), verify(6), proposal left out
    end = P.SchedulerPrices({1: 1.0, 6: 3.0}, None, (5,) + (0,) * 15, (2,) + (0,) * 15)
    m = kept.merged(start, end, now=20.0, left_out=((2, 6), True))
    assert m.t_ver == {1: 1.0, 6: 3.0} and m.verify_timed_at == {6: 20.0}
    assert m.t_prop is None and m.proposal_timed_at is None and m.reached[0] == 5
    same = kept.merged(start, end, now=20.0)  # nothing said left out: the others stay as kept
    assert same.t_ver == {1: 1.0, 2: 5.0, 6: 3.0} and same.t_prop == 4.0


def test_generate_says_which_kept_times_it_re_times(tiny_q2, capsys):
    argv = ["generate", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "-p", "hi", "-n", "16",
            "--threads", "1", "--backend", "cpu"]
    assert cli_main(argv + ["--json"]) == 0  # writes the prices file (a folder of the test's own: conftest)
    path = Path(json.loads(capsys.readouterr().out)["scheduler_prices_file"])
    doc = json.loads(path.read_text())
    assert doc["prices"]["verify_timed_at"] and doc["prices"]["proposal_timed_at"]
    doc["prices"]["verify_timed_at"] = {n: 1.0 for n in doc["prices"]["verify_timed_at"]}
    doc["prices"]["proposal_timed_at"] = 1.0
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert cli_main(argv) == 0
    err = capsys.readouterr().err
    assert "ds4tui generate: note: scheduler prices: the kept times of verify(" in err and "drafting re-times them" in err
    # and, the run over, what its drafting measured in their place, against the kept times
    assert "ds4tui generate: note: scheduler prices: drafting re-timed the kept verify(" in err, err
    assert cli_main(argv + ["--no-dspark"]) == 0 and "re-times" not in capsys.readouterr().err  # nothing drafts


def test_generate_lists_the_kept_times_its_drafting_timed_again(tiny_q2, capsys):
    """In-session (spec dspark.md §7.4): kept verify and proposal times far too cheap make the run draft
    at once, and its first real samples move them (the clamped average); the JSON's
    ``scheduler_prices_retimed`` lists each with its kept and its current ms, and a note on stderr
    says them in words.  A run that starts fresh lists none."""
    argv = ["generate", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "-p", "hi", "-n", "16",
            "--threads", "1", "--backend", "cpu"]
    assert cli_main(argv + ["--json"]) == 0  # writes the prices file (a folder of the test's own: conftest)
    first = json.loads(capsys.readouterr().out)
    assert first["scheduler_prices_at_start"] == "fresh" and first["scheduler_prices_retimed"] == []
    path = Path(first["scheduler_prices_file"])
    doc = json.loads(path.read_text())
    widths = [n for n in doc["prices"]["t_ver_ms"] if n != "1"]
    assert widths and doc["prices"]["t_prop_ms"]
    doc["prices"]["t_ver_ms"].update({n: 1e-6 for n in widths})
    doc["prices"]["t_prop_ms"] = 1e-6
    path.write_text(json.dumps(doc))
    assert cli_main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["scheduler_prices_at_start"] == "saved" and r["scheduler_prices_retime"] is None
    retimed = r["scheduler_prices_retimed"]
    assert retimed and retimed[-1]["time"] == "proposal"
    assert {e["time"] for e in retimed[:-1]} <= {f"verify({n})" for n in widths}
    assert all(e["kept_ms"] == 1e-6 and e["now_ms"] > 1e-6 for e in retimed)
    path.write_text(json.dumps(doc))
    assert cli_main(argv) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "drafting re-timed the kept" in x)
    assert line.startswith("ds4tui generate: note: scheduler prices: drafting re-timed the kept verify(")
    assert " proposal 0.00 → " in line and line.endswith(" ms")


def test_generate_says_where_the_scheduler_started(tiny_q2, capsys, monkeypatch):
    argv = ["generate", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "-p", "hi", "-n", "16",
            "--threads", "1", "--backend", "cpu"]
    note = "ds4tui generate: note: scheduler prices: "
    assert cli_main(argv + ["--json"]) == 0  # no such line with --json: its scheduler_prices_at_start says it
    out, err = capsys.readouterr()
    result = json.loads(out)
    path = Path(result["scheduler_prices_file"])
    assert result["scheduler_prices_at_start"] == "fresh" and note not in err and path.exists()
    text = result["text"]
    path.unlink()  # a first run: nothing kept yet
    assert cli_main(argv) == 0
    out, err = capsys.readouterr()
    assert f"{note}started fresh: no prices kept yet in {path} (this run keeps its own there)\n" in err
    assert out == text + "\n"  # stdout is the answer alone
    assert cli_main(argv) == 0  # the same command again starts from what the first kept
    out, err = capsys.readouterr()
    assert (f"{note}started from the prices kept in {path}, last timed under a minute ago (--scheduler-prices fresh "
            f"starts without them)\n") in err and out == text + "\n"
    doc = json.loads(path.read_text())
    doc["prices"]["verify_timed_at"] = {n: time.time() - 7200 for n in doc["prices"]["verify_timed_at"]}
    doc["prices"]["proposal_timed_at"] = time.time() - 9000
    path.write_text(json.dumps(doc))
    assert cli_main(argv) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(note)]
    assert lines[0] == f"{note}started from the prices kept in {path}, last timed 2.0 h ago (--scheduler-prices fresh starts without them)"
    assert len(lines) == 3 and "drafting re-times them" in lines[1]  # then which kept times it re-times
    assert lines[2].startswith(f"{note}drafting re-timed the kept verify(")  # and, at the end, what it measured
    assert cli_main(argv + ["--scheduler-prices", "fresh"]) == 0
    assert f"{note}started fresh (--scheduler-prices fresh: the run measures its own)\n" in capsys.readouterr().err
    for off in ("--no-scheduler", "--no-dspark"):  # no scheduler decides: nothing to say
        assert cli_main(argv + [off]) == 0 and note not in capsys.readouterr().err
    monkeypatch.setenv("DS4_DSPARK_SCHEDULER", "0")  # the scheduler off as ds4 turns it off: nothing either
    assert cli_main(argv) == 0 and note not in capsys.readouterr().err


def test_saved_verify_times_of_the_last_hour_are_used_and_a_session_that_does_not_draft_keeps_their_stamp(
        tiny_q2, tmp_path):
    stamp = time.time() - 600
    e = _saved_hopeless(tiny_q2, tmp_path, stamp)
    assert "re-times" not in e.scheduler_prices_note
    s = e.session(128, policy="acceptance")
    assert s.scheduler_prices_retime == "" and s.scheduler_prices() == HOPELESS
    _decode(s, 20)
    assert s.dspark_stats().proposed == 0  # priced out, as measured ten minutes ago
    s.close()
    doc = json.loads(e.scheduler_prices_file.read_text())["prices"]
    # not re-timed: scaled by how the decode changed (1 ms kept; the session's mean decode kept in its
    # place; the factor held to 0.5-2x), and still stamped when measured
    scale = min(2.0, max(0.5, doc["t_ver_ms"]["1"] / HOPELESS.t_ver[1]))
    assert doc["t_ver_ms"]["1"] != HOPELESS.t_ver[1]  # the session's own decode was kept
    assert doc["t_ver_ms"]["6"] == pytest.approx(HOPELESS.t_ver[6] * scale) and doc["verify_timed_at"] == {"6": stamp}
    assert doc["proposal_timed_at"] == stamp


@pytest.mark.real_other_work
def test_the_times_a_session_measured_are_kept_with_the_load_it_ran_under(tiny_q2, monkeypatch):
    """The other work kept beside the times a session measured is the load over the session's life
    (spec dspark.md §7.4), not the time before it: that is under OTHER_WORK_MIN_S when a session
    follows the engine's open or another session at once (every session of generate, bench --ab and
    the chat on the demo pair), and the stamps were then never known.  A machine whose other processes
    start to keep 2 cores busy as the session starts: its start sees none, its verify and proposal
    times are kept with 2 cores, and the engine's last measurement is 2 cores from then on."""
    busy_from = [None]

    def mark(stat=P.PROC_STAT):
        now, own = time.monotonic(), time.process_time()
        other = 0.0 if busy_from[0] is None else 2.0 * (now - busy_from[0])
        return now, 1000.0 + own + other, own

    monkeypatch.setattr(P, "cpu_mark", mark)
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="engine")
    time.sleep(P.OTHER_WORK_MIN_S + 0.05)  # the engine's open, long enough to tell: nothing else runs
    busy_from[0] = time.monotonic()
    s = e.session(128, policy="acceptance")
    assert s.scheduler_other_work == pytest.approx(0.0, abs=0.05)  # as it starts
    _decode(s, 30)
    time.sleep(P.OTHER_WORK_MIN_S)
    assert s.dspark_stats().proposed > 0  # its pricing draft timed a verify and the proposal
    s.close()
    kept = e.kept_prices
    assert kept.verify_other_work and all(v == pytest.approx(2.0, abs=0.05) for v in kept.verify_other_work.values())
    assert kept.proposal_other_work == pytest.approx(2.0, abs=0.05)
    assert e._measure_other_work() == pytest.approx(2.0, abs=0.05)  # a session that follows at once compares with it
    e.close()


@pytest.mark.real_other_work
def test_an_engine_that_opens_soon_after_the_command_started_measures_the_load_from_there(tiny_q2, tmp_path,
                                                                                          monkeypatch):
    """The demo pair opens in milliseconds, so from the engine's open alone a command's first session
    could never tell the other work (under OTHER_WORK_MIN_S): the command line marks its start
    (prices.mark_start) and an engine that opens within START_MARK_MAX_S measures from that mark
    (spec dspark.md §7.4).  A start mark 5 s old over which the machine was busy for 10 CPU seconds
    beyond this process's own: the first session sees 2 cores of other work."""
    m, busy, own = P.cpu_mark()
    if busy is None:
        pytest.skip("the machine's CPU time cannot be read here (/proc/stat)")
    monkeypatch.setattr(P, "_start_mark", None)
    assert P.open_mark((100.0, 1.0, 1.0)) == (100.0, 1.0, 1.0)  # no start marked: from the open
    P.mark_start()
    mark = P._start_mark
    assert P.open_mark((mark[0] + 30.0, 2.0, 2.0)) == mark  # within a minute of it: from the start
    assert P.open_mark((mark[0] + P.START_MARK_MAX_S + 1, 2.0, 2.0)) == (mark[0] + P.START_MARK_MAX_S + 1, 2.0, 2.0)
    P.mark_start()
    assert P._start_mark is mark  # once a process
    monkeypatch.setattr(P, "_start_mark", (m - 5.0, busy - 10.0, own))
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    s = e.session(128, policy="acceptance")
    assert s.scheduler_other_work == pytest.approx(2.0, abs=0.5)
    s.close()
    e.close()


@pytest.mark.real_other_work
def test_other_work_is_the_machines_busy_time_less_this_processs_and_is_kept_with_the_verify_times(tmp_path):
    stat = tmp_path / "stat"
    hz = os.sysconf("SC_CLK_TCK")
    #           user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {3 * hz} {hz} {hz} 900 7 0 {hz} 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert P.cpu_mark(stat)[1] == 6.0  # user + nice + system + irq + softirq + steal, in seconds
    assert P.cpu_mark(tmp_path / "absent")[1] is None and P.cpu_mark(tmp_path)[1] is None
    # 2 s apart: the machine was busy for 5 CPU seconds, this process for 1 of them
    assert P.other_work((10.0, 100.0, 3.0), (12.0, 105.0, 4.0)) == 2.0
    assert P.other_work((10.0, 100.0, 3.0), (12.0, 101.0, 4.0)) == 0.0  # never below 0 (tick rounding)
    assert P.other_work((10.0, 100.0, 3.0), (10.05, 101.0, 3.0)) is None  # too short to tell
    assert P.other_work((10.0, None, 3.0), (12.0, 105.0, 4.0)) is None
    if os.path.exists(P.PROC_STAT):  # the real machine's: a number of cores, whatever else runs
        a = P.cpu_mark()
        time.sleep(P.OTHER_WORK_MIN_S + 0.05)
        got = P.other_work(a, P.cpu_mark())
        assert got is not None and 0.0 <= got <= os.cpu_count() + 0.5
    # kept with the times a session measured, in the file too
    start = P.SchedulerPrices(t_ver={1: 2.0, 3: 4.0, 6: 7.0}, t_prop=5.0, reached=(10,) + (0,) * 15,
                              hit=(4,) + (0,) * 15, verify_timed_at={3: 100.0, 6: 100.0}, proposal_timed_at=100.0,
                              verify_other_work={3: 2.0, 6: 2.0}, proposal_other_work=2.0)
    plain = P.SchedulerPrices(t_ver={1: 2.5, 3: 4.0, 6: 7.0}, t_prop=5.0, reached=start.reached, hit=start.hit)
    m = start.merged(start, plain, now=200.0, other=0.0)  # nothing re-timed: the loads stay
    assert m.verify_other_work == {3: 2.0, 6: 2.0} and m.proposal_other_work == 2.0
    short = P.SchedulerPrices(t_ver={1: 2.5, 3: 3.0, 6: 7.0}, t_prop=5.0, reached=(11,) + (0,) * 15, hit=start.hit)
    m = start.merged(start, short, now=200.0, other=0.25)  # verify(3) only (a short draft)
    assert m.verify_other_work == {3: 0.25, 6: 2.0} and m.proposal_other_work == 2.0
    assert start.merged(start, short, now=200.0).verify_other_work == {6: 2.0}  # not measured: not known
    drafted = P.SchedulerPrices(t_ver={1: 2.5, 3: 4.0, 6: 6.0}, t_prop=4.0, reached=(11,) + (0,) * 15, hit=start.hit)
    m = start.merged(start, drafted, now=200.0, other=0.25)
    assert m.verify_other_work == {3: 2.0, 6: 0.25} and m.proposal_other_work == 0.25
    back = P.SchedulerPrices.from_dict(start.to_dict())
    assert back.verify_other_work == {3: 2.0, 6: 2.0} and back.proposal_other_work == 2.0
    assert start.capped(5).verify_other_work == {3: 2.0, 6: 2.0} and start.capped(5).proposal_other_work == 2.0
    old = start.to_dict()
    del old["verify_other_work_cores"], old["proposal_other_work_cores"]  # files written before they were recorded
    assert P.SchedulerPrices.from_dict(old).verify_other_work == {} and P.retime_reason(
        P.SchedulerPrices.from_dict(old), 160.0, 0.0) == ""
    with pytest.raises(SchedulerPricesError, match=r"prices.verify_other_work_cores.6: expected a number of cores "
                                                   r">= 0, or null, found -1"):
        P.SchedulerPrices.from_dict({**start.to_dict(), "verify_other_work_cores": {"6": -1}})
    with pytest.raises(SchedulerPricesError, match=r"prices.proposal_other_work_cores: expected a number of cores "
                                                   r">= 0, or null, found 'busy'"):
        P.SchedulerPrices.from_dict({**start.to_dict(), "proposal_other_work_cores": "busy"})
    # the rule: a change of RETIME_OTHER_CORES or more, either way, within the hour
    assert P.retime_reason(start, 160.0, 0.2) == (
        "the kept times of verify(3), verify(6) and the proposal were measured while other work kept 2.0 cores "
        "busy, and it keeps 0.2 busy now (a change of 1 or more): drafting re-times them")
    assert "keeps 3.0 busy now" in P.retime_reason(start, 160.0, 3.0)
    assert P.retime_reason(start, 160.0, 1.2) == "" and P.retime_reason(start, 160.0, None) == ""
    bare = start.without_stale(160.0, 0.2)
    assert bare.t_ver == {1: 2.0} and bare.t_prop is None and bare.verify_other_work == {}
    assert start.without_stale(160.0, 1.2) == start
    mixed = m  # verify(6) and the proposal measured under 0.25 cores, verify(3) under 2.0
    assert P.retime_reason(mixed, 160.0, 0.0) == (
        "the kept times of verify(3) were measured while other work kept 2.0 cores busy, and it keeps 0.0 busy "
        "now (a change of 1 or more): drafting re-times them")
    assert mixed.without_stale(160.0, 0.0).t_ver == {1: 2.5, 6: 6.0}
    # an old time is named for its age, not twice
    assert P.retime_reason(start, 100.0 + 2 * 3600, 0.2) == (
        "the kept times of verify(3), verify(6) and the proposal were measured 2.0 h ago (over 1 h): drafting "
        "re-times them")


def _save_busy(tiny_q2, tmp_path, timed_at: float, other: float) -> None:
    """A saved prices file holding :data:`HOPELESS`, its verify and proposal timed at ``timed_at``
    while other work kept ``other`` cores busy (as a run during a busy spell leaves them)."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    P.save(e.scheduler_prices_file, P.identity(e), P.SchedulerPrices(
        dict(HOPELESS.t_ver), HOPELESS.t_prop, HOPELESS.reached, HOPELESS.hit, {6: timed_at}, timed_at))
    doc = json.loads(e.scheduler_prices_file.read_text())
    doc["prices"]["verify_other_work_cores"] = {"6": other}
    doc["prices"]["proposal_other_work_cores"] = other
    e.scheduler_prices_file.write_text(json.dumps(doc))
    e.close()


def test_saved_verify_times_measured_under_other_work_are_re_timed_when_the_load_changed(tiny_q2, tmp_path,
                                                                                       monkeypatch):
    """The fresh clone's failure: prices saved while another job kept both cores busy (a verify
    priced at 3.5 decodes, a decode barely slower) kept a quiet run of the same hour from drafting,
    as its decode could not tell.  With the other work on the machine kept beside them, the quiet run
    sees the load changed, drafts once to re-time them, and keeps what it measured."""
    stamp = time.time() - 600
    kw = dict(support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    _save_busy(tiny_q2, tmp_path, stamp, 2.0)
    monkeypatch.setattr(P, "other_work", lambda a, b: 0.1, raising=False)  # what it measures now: quiet
    e = S.Engine(tiny_q2["model"], **kw)
    path = e.scheduler_prices_file
    s = e.session(128, policy="acceptance")
    _decode(s, 20)
    assert s.dspark_stats().proposed > 0  # the pricing draft
    assert e.scheduler_prices_note.endswith("the kept times of verify(6) and the proposal were measured while other "
                                            "work kept 2.0 cores busy, and it keeps 0.1 busy now (a change of 1 or "
                                            "more): drafting re-times them")
    assert "other work kept 2.0 cores busy" in s.scheduler_prices_retime and s.scheduler_other_work == 0.1
    s.close()
    doc = json.loads(path.read_text())["prices"]
    assert doc["t_prop_ms"] < 1000.0 and all(ms < 1000.0 for ms in doc["t_ver_ms"].values())
    assert doc["proposal_other_work_cores"] == 0.1 and doc["verify_other_work_cores"]["6"] == 0.1
    assert time.time() - 60 < doc["verify_timed_at"]["6"] <= time.time()
    # the same load again: the prices it measured are used as they are
    again = S.Engine(tiny_q2["model"], **kw)
    assert "re-times" not in again.scheduler_prices_note and again.session(128, policy="acceptance").scheduler_prices_retime == ""


def test_saved_verify_times_measured_under_the_same_load_are_used(tiny_q2, tmp_path, monkeypatch):
    stamp = time.time() - 600
    kw = dict(support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    _save_busy(tiny_q2, tmp_path, stamp, 2.0)
    monkeypatch.setattr(P, "other_work", lambda a, b: 1.2)  # busy still, within RETIME_OTHER_CORES
    e = S.Engine(tiny_q2["model"], **kw)
    s = e.session(128, policy="acceptance")
    assert s.scheduler_prices_retime == "" and s.scheduler_prices() == HOPELESS
    _decode(s, 20)
    assert s.dspark_stats().proposed == 0
    s.close()
    doc = json.loads(e.scheduler_prices_file.read_text())["prices"]
    assert doc["verify_other_work_cores"] == {"6": 2.0} and doc["proposal_other_work_cores"] == 2.0
    assert doc["verify_timed_at"] == {"6": stamp}  # not re-timed: as they were


@pytest.mark.parametrize("text, message", [
    ("{not json", "not a scheduler prices file (invalid JSON"),
    (json.dumps({"format": 99}), "expected a scheduler prices file of format 1, found format 99"),
    ("STALE", "stale scheduler prices, measured for another setup: threads: expected {threads} (this run's), found "
              "{threads_plus_1} (the prices file's)"),
    ("OLD_VERSION", "stale scheduler prices, measured for another setup: ds4tui version: expected {version} (this "
                    "run's), found 0.0.1 (the prices file's)"),
    ("BAD_TIME", "prices.t_ver_ms.6: expected a time > 0 and <= 60000 ms, found -1"),
    ("HUGE_TIME", "prices.t_ver_ms.6: expected a time > 0 and <= 60000 ms, found 1e+308"),
    ("CHANGED", "stale scheduler prices, measured for another setup: the model file {model} changed since they "
                "were measured: expected modified {mtime} (as it is now), found modified {mtime_minus_1} (as the "
                "prices file records it)"),
    ("OTHER_SUPPORT", "stale scheduler prices, measured for another setup: support file: expected at {support} (this "
                      "run's), found at /elsewhere/support.gguf (the prices file's)"),
    ("NO_BLOCK", "stale scheduler prices, measured for another setup: block size: expected {block} (this run's), "
                 "found none recorded in the file"),
    ("NOT_UTF8", "not a scheduler prices file: expected JSON text, found a byte that is not UTF-8 at offset 1"),
    ("[]", "expected a scheduler prices file (a JSON object of format 1), found a JSON list"),
])
def test_an_unusable_saved_file_is_named_and_ignored(tiny_q2, tmp_path, text, message):
    kw = dict(support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    e = S.Engine(tiny_q2["model"], **kw)
    path, ident = e.scheduler_prices_file, P.identity(e)
    e.close()
    ns = ident["model"]["mtime_ns"]

    def when(t):
        return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t // 10**9))}.{t % 10**9:09d} UTC"

    message = message.format(threads=ident["n_threads"], threads_plus_1=ident["n_threads"] + 1,
                             version=ident["ds4tui"], model=ident["model"]["path"], mtime=when(ns),
                             mtime_minus_1=when(ns - 1), support=ident["support"]["path"],
                             block=ident["block_size"])
    if text == "STALE":
        P.save(path, {**ident, "n_threads": ident["n_threads"] + 1}, HOPELESS)
    elif text == "OLD_VERSION":
        P.save(path, {**ident, "ds4tui": "0.0.1"}, HOPELESS)
    elif text == "NOT_UTF8":
        path.write_bytes(b"{\xff}")
    elif text in ("BAD_TIME", "HUGE_TIME"):
        P.save(path, ident, HOPELESS)
        doc = json.loads(path.read_text())
        doc["prices"]["t_ver_ms"]["6"] = -1 if text == "BAD_TIME" else 1e308
        path.write_text(json.dumps(doc))
    elif text == "OTHER_SUPPORT":  # the file holds another support file's path (a copied or edited file)
        P.save(path, {**ident, "support": {**ident["support"], "path": "/elsewhere/support.gguf"}}, HOPELESS)
    elif text == "NO_BLOCK":  # written before the block size was recorded
        P.save(path, {k: v for k, v in ident.items() if k != "block_size"}, HOPELESS)
    elif text == "CHANGED":  # the same model file, touched: its modification time moved
        P.save(path, {**ident, "model": {**ident["model"], "mtime_ns": ident["model"]["mtime_ns"] - 1}}, HOPELESS)
    else:
        path.write_text(text)
    with pytest.raises(SchedulerPricesError, match=re.escape(message)):
        P.load(path, ident)
    e = S.Engine(tiny_q2["model"], **kw)  # opens: the file is ignored, and said why
    problem = e.scheduler_prices_problem
    assert problem.startswith(f"{path}: {message}") and problem.endswith(IGNORED)
    # the note at open promises nothing about the write, whose outcome is not known yet
    assert e.scheduler_prices_note == f"saved: {e.scheduler_prices_problem}"
    assert e.kept_prices is None
    s = e.session(128, policy="acceptance")
    assert s.scheduler_prices_at_start == "fresh"
    _decode(s, 20)
    s.close()  # nothing lost: the file now holds this session's prices
    assert P.load(path, ident).learnt
    # the file was replaced: no problem left to report, and the note says what happened to it
    assert e.scheduler_prices_problem == ""
    assert e.scheduler_prices_note.startswith(f"saved: in {path} (") and e.scheduler_prices_note.endswith(
        "; it replaced the file that could not be used at the start")
    e.close()


def test_fresh_keeps_no_prices_even_when_told_to(tiny_q2):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="fresh")
    try:
        note = e.scheduler_prices_note
        e._keep_prices(None, HOPELESS)
        assert e.kept_prices is None and e._prices is None and e.scheduler_prices_note == note
    finally:
        e.close()


def test_bench_ab_says_a_prices_write_that_failed_on_stderr(tiny_q2, tmp_path, monkeypatch, capsys):
    from ds4tui.commands import environment

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(environment, "scheduler_prices_dir", lambda: blocker / "scheduler-prices")
    rc = cli_main(["bench", tiny_q2["model"], "--mtp", tiny_q2["support"], "--ab", "--threads", "2", "--tokens", "16",
                   "--json", "--backend", "cpu"])
    out = capsys.readouterr()
    r = json.loads(out.out)
    problem = r["scheduler_prices_problem"]
    assert rc == 0 and problem.startswith(f"cannot write the scheduler prices to {blocker / 'scheduler-prices'}/")
    assert r["scheduler_prices_note"] == f"saved: {problem}"
    at_start = r["scheduler_prices_note_at_start"].removeprefix("saved: ")  # the read failed too, said first
    folder = blocker / "scheduler-prices"
    path = problem.removeprefix("cannot write the scheduler prices to ").split(":")[0]
    # the same remedy as the write's: a file above the folder stops both
    assert at_start == (f"{path}: cannot read the saved scheduler prices: expected a readable file, found a file "
                        f"where a folder above it should be; ignored: the scheduler starts fresh. A session that "
                        f"closes cannot write them there either: expected a writable folder {folder}, found a file "
                        f"at {blocker}, where a folder above it should be. To keep them between runs, move {blocker} "
                        f"away, or " + ADVICE)
    assert problem == (f"cannot write the scheduler prices to {path}: expected a writable folder {folder}, found a "
                       f"file at {blocker}, where a folder above it should be; this run keeps them in memory only. "
                       f"To keep them between runs, move {blocker} away, or " + ADVICE)
    notes = [line for line in out.err.splitlines() if "scheduler prices" in line]
    assert notes == [f"ds4tui bench: note: {at_start}", f"ds4tui bench: note: {problem}"]


def test_the_option_shows_in_generate_bench_and_doctor(tiny_q2, capsys):
    from ds4tui.commands import environment

    rc = cli_main(["generate", tiny_q2["model"], "--mtp", tiny_q2["support"], "-p", "hi", "-n", "16", "--json",
                   "--backend", "cpu"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["scheduler_prices"] == "saved" and r["scheduler_prices_at_start"] == "fresh"
    path = r["scheduler_prices_file"]
    assert path.startswith(str(environment.scheduler_prices_dir())) and r["scheduler_prices_problem"] is None
    rc = cli_main(["generate", tiny_q2["model"], "--mtp", tiny_q2["support"], "-p", "hi", "-n", "16", "--json",
                   "--backend", "cpu"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["scheduler_prices_at_start"] == "saved" and r["scheduler_prices_file"] == path
    assert r["scheduler_prices_note"].startswith(f"saved: from {path}")
    rc = cli_main(["generate", tiny_q2["model"], "--mtp", tiny_q2["support"], "-p", "hi", "-n", "16", "--json",
                   "--backend", "cpu", "--scheduler-prices", "fresh"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["scheduler_prices"] == "fresh" and r["scheduler_prices_file"] is None

    from ds4tui.commands.bench import render_ab_text

    rc = cli_main(["bench", tiny_q2["model"], "--mtp", tiny_q2["support"], "--ab", "--threads", "2", "--tokens",
                   "16", "--json", "--backend", "cpu", "--scheduler-prices", "engine"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["scheduler_prices"] == "engine" and r["scheduler_prices_file"] is None
    # engine: nothing read or written; the note after the run says where the sessions left the prices
    start, end = r["scheduler_prices_note_at_start"], r["scheduler_prices_note"]
    assert start == "engine: a new session starts from the prices of this engine's earlier ones"
    runs = [run for arm in r["arms"] for run in arm["runs"]]
    assert all(run["scheduler_prices_retimed"] == [] for run in runs if run["scheduler_prices_at_start"] == "fresh")
    assert all(e["kept_ms"] != e["now_ms"] for run in runs for e in run["scheduler_prices_retimed"])
    assert re.fullmatch(r"engine: the sessions so far left decode \d+\.\d\d ms, .* for the later ones "
                        r"\(kept in memory, no file written\)", end), end
    line = next(x for x in render_ab_text(r).splitlines() if x.startswith("prices   "))
    assert line == f"prices   at the start {start}; after the run {end}"
    names = ["target-only", "dspark-no-scheduler", "dspark-scheduler"]
    assert r["arm_order"] == [{"kind": "code", "order": names}, {"kind": "prose", "order": names[::-1]}]
    pos = {(a["name"], run["kind"]): (run["position"], run["scheduler_prices_at_start"])
           for a in r["arms"] for run in a["runs"]}
    # code: the scheduler arm runs last, after two sessions of the engine; prose: first, after three
    assert pos[("dspark-scheduler", "code")] == (2, "engine") and pos[("dspark-scheduler", "prose")] == (0, "engine")
    assert pos[("target-only", "code")] == (0, "fresh") and pos[("target-only", "prose")] == (2, "engine")
    # saved: the text's prices line says where the prices started (the file generate wrote) and where
    # the run left them (the file rewritten as each session closed)
    rc = cli_main(["bench", tiny_q2["model"], "--mtp", tiny_q2["support"], "--ab", "--threads", "2", "--tokens",
                   "16", "--backend", "cpu"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("prices   "))
    assert rc == 0 and line.startswith(f"prices   at the start saved: from {path} (") and (
        f"; after the run saved: in {path} (") in line

    rc = cli_main(["doctor", "--json"])
    d = json.loads(capsys.readouterr().out)["scheduler_prices"]
    assert d["default"] == "saved" and d["choices"] == ["fresh", "engine", "saved"]
    assert d["folder"] == str(environment.scheduler_prices_dir()) and d["saved_files"] == 1


def test_generate_names_a_prices_file_it_could_not_write(tiny_q2, tmp_path, monkeypatch, capsys):
    """The prices are written when the session closes, after the answer (and its JSON) went out:
    a file that cannot be written is a note on stderr then, and the exit status stays 0."""
    from ds4tui.commands import environment

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(environment, "scheduler_prices_dir", lambda: blocker / "scheduler-prices")
    rc = cli_main(["generate", tiny_q2["model"], "--mtp", tiny_q2["support"], "-p", "hi", "-n", "16", "--json",
                   "--backend", "cpu", "--no-scheduler"])
    out = capsys.readouterr()
    assert rc == 0 and json.loads(out.out)["scheduler_prices"] == "saved"
    notes = [line for line in out.err.splitlines() if "cannot write the scheduler prices" in line]
    assert len(notes) == 1 and notes[0].startswith("ds4tui generate: note: ") and str(blocker) in notes[0]
    folder = blocker / "scheduler-prices"
    assert notes[0].startswith(f"ds4tui generate: note: cannot write the scheduler prices to {folder}/")
    assert notes[0].endswith(f".json: expected a writable folder {folder}, found a file at {blocker}, where a folder "
                             f"above it should be; this run keeps them in memory only. To keep them between runs, "
                             f"move {blocker} away, or " + ADVICE)


def test_generate_does_not_promise_to_keep_prices_where_it_cannot(tmp_path):
    """The note on where the scheduler started says a run keeps its prices in the file, unless the file
    cannot be written there (a file in the folder's way, a read-only folder): then it says so, and the
    note at the end why, where it promised to keep them and then said it could not."""
    from types import SimpleNamespace

    from ds4tui.commands.generate import prices_start_words

    session = SimpleNamespace(scheduler_prices_at_start="fresh")
    free = tmp_path / "prices" / "x.json"
    engine = SimpleNamespace(scheduler_prices="saved", scheduler_prices_file=free, scheduler_prices_problem="")
    assert prices_start_words(engine, session) == f"started fresh: no prices kept yet in {free} (this run keeps its own there)"
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    stuck = blocker / "prices" / "x.json"
    engine.scheduler_prices_file = stuck
    assert prices_start_words(engine, session) == (f"started fresh: no prices kept yet in {stuck}, and this run cannot "
                                                   f"keep its own there (see below)")


def test_chat_names_a_prices_file_it_could_not_write(tiny_q2, tmp_path, monkeypatch, capsys):
    """The chat's session writes the prices as it closes, after the app has left the terminal: the
    engine's close returns the file it could not write and the chat command says so on stderr."""
    import ds4tui.app as app_module
    from ds4tui.engine import worker as W

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    eng = W.ChatEngine(tiny_q2["model"], support=tiny_q2["support"], backend="cpu", n_ctx=128,
                       scheduler_prices="saved", prices_dir=blocker / "scheduler-prices")
    r = eng.run_turn([{"role": "user", "content": "Hi"}], W.EventQueue(), think=False, max_tokens=8)
    assert r is not None and len(r.ids) == 8
    # a new context size (Ctrl+G) closes the first session, which fails to write the same file the
    # same way: the last close still says so
    eng.set_context(96)
    assert eng.engine.scheduler_prices_problem.startswith("cannot write the scheduler prices")
    r = eng.run_turn([{"role": "user", "content": "Hi"}], W.EventQueue(), think=False, max_tokens=8)
    note = eng.close()
    assert note.startswith(f"cannot write the scheduler prices to {blocker / 'scheduler-prices'}")

    class App:  # the app, as the chat command drives it: run, then close the engine
        def __init__(self, options):
            self.return_code = 0

        def run(self):
            pass

        def close_engine(self):
            return note

    monkeypatch.setattr(app_module, "DS4App", App)
    monkeypatch.setattr("ds4tui.commands.chat.terminal_problem", lambda: "")  # as in a terminal
    rc = cli_main(["chat", tiny_q2["model"], "--mtp", tiny_q2["support"], "--backend", "cpu"])
    err = capsys.readouterr().err
    assert rc == 0 and err.splitlines()[-1] == f"ds4tui chat: note: {note}"


def test_xdg_cache_home_at_a_file_is_named_with_what_to_do(tiny_q2, tmp_path, monkeypatch, capsys):
    """XDG_CACHE_HOME pointing at a file: generate's note at the close names the prices file, the
    folder expected and the file found in its way, and what to do, without the OS error's text."""
    from ds4tui.commands import environment

    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("")
    monkeypatch.setattr(environment, "scheduler_prices_dir", real_prices_dir)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    rc = cli_main(["generate", tiny_q2["model"], "--mtp", tiny_q2["support"], "-p", "hi", "-n", "16", "--json",
                   "--backend", "cpu", "--no-scheduler"])
    out = capsys.readouterr()
    folder = blocker / "ds4tui" / "scheduler-prices"
    file = json.loads(out.out)["scheduler_prices_file"]
    assert rc == 0 and file.startswith(f"{folder}/") and file.endswith(".json")
    note = (f"ds4tui generate: note: cannot write the scheduler prices to {file}: expected a writable folder "
            f"{folder}, found a file at {blocker}, where a folder above it should be; this run keeps them in memory "
            f"only. To keep them between runs, move {blocker} away, or " + ADVICE)
    assert note in out.err.splitlines() and "Errno" not in out.err


def _refuse_writes(folder, monkeypatch):
    """``folder`` read-only: by its mode, and where the mode does not stop this user (root) by the
    file system's refusal as a read-only folder gives it (a PermissionError naming the temporary file)."""
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied", os.path.join(kwargs["dir"], kwargs["prefix"] + "x1y2.tmp"))

        monkeypatch.setattr(P.tempfile, "mkstemp", refuse)


def test_a_read_only_file_system_or_full_disk_is_not_called_a_permission(tmp_path, monkeypatch):
    """folder_problem tells a read-only file system and a full disk from a folder this user may not
    write into, each with its own remedy (statvfs answers as such a file system would)."""
    folder, parent = tmp_path / "prices", tmp_path
    folder.mkdir()
    real = os.statvfs

    def statvfs_as(target, flag, bavail):
        def statvfs(p):
            r = real(p)
            if str(p) != str(target):
                return r
            return os.statvfs_result((r.f_bsize, r.f_frsize, r.f_blocks, r.f_bfree,
                                      r.f_bavail if bavail is None else bavail, r.f_files, r.f_ffree, r.f_favail,
                                      r.f_flag | flag, r.f_namemax))
        return statvfs

    monkeypatch.setattr(os, "statvfs", statvfs_as(folder, os.ST_RDONLY, None))
    assert P.folder_problem(folder) == (
        "it on a read-only file system",
        f"remount the file system of {folder} read-write")
    monkeypatch.setattr(os, "statvfs", statvfs_as(folder, 0, 0))
    assert P.folder_problem(folder) == ("no space left on its disk", f"free some space on the disk of {folder}")
    monkeypatch.setattr(os, "statvfs", statvfs_as(parent, os.ST_RDONLY, None))
    assert P.folder_problem(parent / "not-yet") == (
        f"no such folder, and {parent} on a read-only file system",
        f"remount the file system of {parent} read-write")
    monkeypatch.setattr(os, "statvfs", real)
    assert P.folder_problem(folder) is None
    e = OSError(30, "Read-only file system")
    assert P.write_problem(folder / "p.json", e) == (
        f"cannot write the scheduler prices to {folder / 'p.json'}: expected a writable folder {folder}, found it on "
        f"a read-only file system; this run keeps them in memory only. To keep them between runs, remount the file "
        f"system of {folder} read-write, or " + ADVICE)


def test_a_read_only_prices_folder_is_said_in_words(tiny_q2, tmp_path, monkeypatch):
    folder = tmp_path / "read-only"
    folder.mkdir()
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="saved", prices_dir=folder)
    path = e.scheduler_prices_file
    assert e.scheduler_prices_note == f"saved: no prices yet in {path} (a session that closes writes them, if it can)"
    _refuse_writes(folder, monkeypatch)
    try:
        s = e.session(128, policy="acceptance")
        _decode(s, 20)
        s.close()
    finally:
        folder.chmod(0o755)
    problem = e.scheduler_prices_problem
    assert problem == (f"cannot write the scheduler prices to {path}: expected a writable folder {folder}, found no "
                       f"permission to write in it; this run keeps them in memory only. To keep them between runs, "
                       f"make {folder} writable for this user, or " + ADVICE)
    assert e.scheduler_prices_note == f"saved: {problem}" and "Errno" not in problem and ".tmp" not in problem
    assert e.kept_prices is not None and not path.exists()  # kept for the engine's later sessions only
    e.close()


def test_a_folder_where_the_prices_file_should_be(tiny_q2, tmp_path):
    """The load note says the file is ignored and that no write can replace it, with the remedy; the
    close then says that the write failed, with the same remedy."""
    kw = dict(support=tiny_q2["support"], scheduler_prices="saved", prices_dir=tmp_path)
    e = S.Engine(tiny_q2["model"], **kw)
    path = e.scheduler_prices_file
    e.close()
    path.mkdir()
    e = S.Engine(tiny_q2["model"], **kw)
    loaded = (f"{path}: cannot read the saved scheduler prices: expected a readable file, found a folder; ignored: "
              f"the scheduler starts fresh. A session that closes cannot write them there either: expected a file "
              f"there or none, found a folder. To keep them between runs, remove the folder {path}, or " + ADVICE)
    assert e.scheduler_prices_problem == loaded and e.scheduler_prices_note == f"saved: {loaded}"
    s = e.session(128, policy="acceptance")
    _decode(s, 20)
    s.close()
    written = (f"cannot write the scheduler prices to {path}: expected a file there or none, found a folder; this "
               f"run keeps them in memory only. To keep them between runs, remove the folder {path}, or " + ADVICE)
    assert e.scheduler_prices_problem == written and e.scheduler_prices_note == f"saved: {written}"
    e.close()


def _doctor(capsys) -> tuple[dict, list[str]]:
    assert cli_main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert cli_main(["doctor"]) == 0
    return d, capsys.readouterr().out.splitlines()


def test_doctor_flags_an_unusable_prices_folder(tmp_path, monkeypatch, capsys):
    from ds4tui.commands import environment

    monkeypatch.setattr(environment, "scheduler_prices_dir", real_prices_dir)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a writable cache: no warning
    d, lines = _doctor(capsys)
    assert d["scheduler_prices"]["problem"] is None and not any("prices folder" in w for w in d["warnings"])
    assert not any(x.startswith("warning: the scheduler prices folder") for x in lines)

    blocker = tmp_path / "cache-is-a-file"  # a file where the cache folder should be
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    folder = blocker / "ds4tui" / "scheduler-prices"
    d, lines = _doctor(capsys)
    warning = (f"the scheduler prices folder {folder} cannot be used: expected a writable folder, found a file at "
               f"{blocker}, where a folder above it should be, so --scheduler-prices saved (the default) keeps no "
               f"prices between runs. To fix it, move {blocker} away, or " + ADVICE)
    assert d["scheduler_prices"]["problem"] == warning and warning in d["warnings"]
    assert f"warning: {warning}" in lines
    line = next(x for x in lines if x.startswith("scheduler prices"))
    assert line.endswith(f"0 saved file(s) in {folder} (the folder cannot be used: see the warning below)")

    read_only = tmp_path / "read-only-cache"  # a cache folder this user may not write into
    read_only.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(read_only))
    read_only.chmod(0o555)
    try:
        if os.access(read_only, os.W_OK):  # root: the mode does not stop it; as a user it would
            real_access = os.access
            monkeypatch.setattr(P.os, "access", lambda p, mode: False if str(p) == str(read_only)
                                else real_access(p, mode))
        d, lines = _doctor(capsys)
    finally:
        read_only.chmod(0o755)
    folder = read_only / "ds4tui" / "scheduler-prices"
    warning = (f"the scheduler prices folder {folder} cannot be used: expected a writable folder, found no such "
               f"folder, and no permission to make it in {read_only}, so --scheduler-prices saved (the default) "
               f"keeps no prices between runs. To fix it, make {read_only} writable for this user, or " + ADVICE)
    assert d["scheduler_prices"]["problem"] == warning and f"warning: {warning}" in lines


def _cut_at_two() -> P.SchedulerPrices:
    """Prices under which the scheduler verifies exactly 2 drafts of every full proposal, whatever the
    machine: 1 draft costs a second and 3 drafts a second each (t_ver(2), t_ver(4..6): widths never
    verified, so never re-timed), 2 drafts 1 ms (re-timed towards the real pass, far below 1 s); the
    first two positions' acceptance known high, the third never reached."""
    return P.SchedulerPrices(t_ver={1: 100.0, 2: 1000.0, 3: 1.0, 4: 1000.0, 5: 1000.0, 6: 1000.0}, t_prop=1.0,
                             reached=(50, 50) + (0,) * 14, hit=(50, 50) + (0,) * 14)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_cut_proposal_measures_the_next_position_from_the_bonus_when_greedy(tiny_q2, fitted_support, temperature):
    """Spec dspark.md §7.4 (Survival): when the scheduler cuts a greedy proposal and every verified
    draft is accepted, the bonus token is the target's pick at the first cut position, so that
    position counts as reached, and as accepted exactly when the bonus equals the cut draft.  The
    oracle is each cycle's own output against the proposal it cut (``last_proposal``, before the
    cut); the cycle statistics count only what was verified.  Sampled decoding observes nothing."""
    e = S.Engine(tiny_q2["model"], support=fitted_support)
    s = e.session(256, policy="acceptance")
    if temperature:
        s.set_sampling(S.SamplingParams(temperature=temperature, top_k=8, seed=5))
    s.set_scheduler_prices(_cut_at_two())
    s.prefill(PROMPT)
    s.step()  # samples the prefill's logits
    observed = accepted_third = drafted = 0
    for _ in range(60):
        before = s.dspark_stats().proposed
        out = s.step()
        if s.dspark_stats().proposed == before:
            continue  # a plain decode (the re-timing one, or a back-off)
        drafted += 1
        assert s.dspark_stats().proposed - before == 2  # the cut
        proposal, _ = s.last_proposal()
        if len(out) == 3 and len(proposal) > 2:
            observed += 1
            accepted_third += out[2] == proposal[2]
    end = s.scheduler_prices()
    st = s.dspark_stats()
    s.close()
    assert drafted > 40 and st.pos_proposed[2] == 0 and st.pos_accepted[2] == 0  # never verified there
    assert end.reached[3:] == (0,) * 13 and end.hit[3:] == (0,) * 13
    if temperature:
        assert (end.reached[2], end.hit[2]) == (0, 0)
    else:
        assert observed > 5 and 0 < accepted_third  # the fitted drafter gets some right
        assert (end.reached[2], end.hit[2]) == (observed, accepted_third)


def _kept_by_the_engine(tiny_q2, prices: P.SchedulerPrices, n_ctx: int = 128) -> S.Session:
    """A second session of an engine that keeps prices, its first having ended holding ``prices``
    (set and closed before any cycle: the engine keeps them as they are)."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="engine")
    first = e.session(128, policy="acceptance")
    first.set_scheduler_prices(prices)
    first.close()
    assert e.kept_prices == prices.capped()
    s = e.session(n_ctx, policy="acceptance")
    assert s.scheduler_prices_at_start == "engine"
    s.prefill(PROMPT)
    s.step()  # samples the prefill's logits
    return s


def test_kept_prices_from_a_dearer_decode_are_dropped_and_the_session_prices_itself(tiny_q2):
    """Kept times measured where a decode cost over twice this session's (a long context) would
    never be drafted to re-time them: the first plain decode drops them, the counts stay, and the
    session prices itself as a fresh one does (five plain decodes, then a pricing draft)."""
    slow = P.SchedulerPrices(t_ver={1: 1000.0, 6: 2500.0}, t_prop=2500.0,
                             reached=(32,) * 5 + (0,) * 11, hit=(16,) * 5 + (0,) * 11)
    s = _kept_by_the_engine(tiny_q2, slow)
    s.step()  # the re-timing decode: far under 500 ms on any machine
    now = s.scheduler_prices()
    assert set(now.t_ver) == {1} and now.t_ver[1] < 500.0 and now.t_prop is None
    assert now.reached == slow.capped().reached and now.hit == slow.capped().hit  # as a session starts with them
    for i in range(2, 6):
        s.step()
        st = s.dspark_stats()
        assert (st.cycles, st.proposed) == (i, 0)
    s.step()
    st = s.dspark_stats()
    assert st.cycles == 6 and st.proposed > 0 and s.scheduler_prices().t_prop is not None  # its pricing draft
    s.close()


def test_kept_prices_from_a_cheaper_decode_stay_and_prices_set_directly_are_used_as_given(tiny_q2):
    """A decode dearer than the kept one (a longer context now) keeps the kept times: drafting looks
    cheap, so the scheduler drafts and re-times them.  Prices set on a session directly are used as
    given, however far from its decode."""
    fast = P.SchedulerPrices(t_ver={1: 1e-6, 6: 1000.0}, t_prop=1000.0,
                             reached=(32,) * 5 + (0,) * 11, hit=(0,) * 16)
    s = _kept_by_the_engine(tiny_q2, fast)
    s.step()
    now = s.scheduler_prices()
    assert now.t_ver[6] == 1000.0 and now.t_prop == 1000.0
    s.close()
    slow = P.SchedulerPrices(t_ver={1: 1000.0, 6: 2500.0}, t_prop=2500.0,
                             reached=(32,) * 5 + (0,) * 11, hit=(16,) * 5 + (0,) * 11)
    d = _priced(tiny_q2, slow)
    d.step()
    now = d.scheduler_prices()
    # re-timed through the clamped average only: 0.8 * 1000 + 0.2 * 500 (a sample at most halves it)
    assert now.t_ver[6] == 2500.0 and now.t_prop == 2500.0 and now.t_ver[1] == pytest.approx(900.0, rel=1e-6)
    d.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self") or os.statvfs("/proc").f_blocks != 0, reason="Linux's /proc")
def test_a_prices_folder_under_proc_is_one_that_cannot_be_written_not_a_full_disk():
    from ds4tui.engine import prices as P

    assert P.folder_problem("/proc/x") == (f"no such folder, and /proc, which cannot be written: "
                                           f"{os.strerror(errno.ENOENT)}", "choose a folder outside /proc")


def test_a_hopeless_back_off_ends_in_a_whole_probe_while_kept_times_are_not_re_timed(tiny_q2):
    """In-session (spec dspark.md §7.4): kept verify and proposal times a thousand times too dear make
    drafting hopeless, so the scheduler skips 256 cycles; its probe then drafts the whole proposal
    (not one draft, which re-times neither), and that first real verify of 6 rows and that first real
    proposal replace the kept times, being cheaper, instead of moving them 20 % (to 900 ms) through
    the clamped average.  The kept decode, 1e-6 ms, stays below the real one, so the kept check keeps
    the times."""
    dear = P.SchedulerPrices(t_ver={1: 1e-6, 6: 1000.0}, t_prop=1000.0,
                             reached=(32,) + (0,) * 15, hit=(0,) * 16)
    s = _kept_by_the_engine(tiny_q2, dear, n_ctx=512)
    assert s.dspark_stats().block_size == 5
    for i in range(1, 258):  # the re-timing decode, then a back-off of 256 cycles
        s.step()
        assert s.dspark_stats().proposed == 0, i
    now = s.scheduler_prices()
    assert now.t_ver[6] == 1000.0 and now.t_prop == 1000.0 and 2 not in now.t_ver
    assert s.scheduler_prices_retimed() == []  # nothing re-timed yet
    s.step()  # the probe
    st = s.dspark_stats()
    assert st.cycles == 258 and st.no_draft_reasons["scheduler_skip"] == 257
    assert st.proposed == 5 and st.draft_len_hist[5] == 1  # the whole proposal, verified uncut
    now = s.scheduler_prices()
    assert 0.0 < now.t_ver[6] < 100.0 and 0.0 < now.t_prop < 100.0 and 2 not in now.t_ver
    assert s.scheduler_prices_retimed() == [{"time": "verify(6)", "kept_ms": 1000.0, "now_ms": now.t_ver[6]},
                                            {"time": "proposal", "kept_ms": 1000.0, "now_ms": now.t_prop}]
    assert P.retimed_words(s.scheduler_prices_retimed()) == (
        f"drafting re-timed the kept verify(6) 1000.00 → {now.t_ver[6]:.2f} ms and proposal 1000.00 → "
        f"{now.t_prop:.2f} ms")
    s.close()


def test_a_first_sample_dearer_than_a_kept_time_enters_the_clamped_average(tiny_q2):
    """Kept times far too cheap: the session drafts at once and its first real verify and proposal
    move them by the clamped average (a sample counts at most twice the price, weight 0.2: 1.2e-6
    ms), as every later sample does; only a cheaper first sample replaces a kept time."""
    cheap = P.SchedulerPrices(t_ver={1: 1e-6, 6: 1e-6}, t_prop=1e-6,
                              reached=(32,) * 5 + (0,) * 11, hit=(32,) * 5 + (0,) * 11)
    s = _kept_by_the_engine(tiny_q2, cheap)
    s.step()  # the re-timing plain decode
    s.step()  # drafts the whole proposal
    st = s.dspark_stats()
    assert st.cycles == 2 and st.proposed == 5
    now = s.scheduler_prices()
    assert now.t_ver[6] == pytest.approx(1.2e-6, rel=1e-9) and now.t_prop == pytest.approx(1.2e-6, rel=1e-9)
    assert [(r["time"], r["kept_ms"], r["now_ms"]) for r in s.scheduler_prices_retimed()] == [
        ("verify(6)", 1e-6, now.t_ver[6]), ("proposal", 1e-6, now.t_prop)]
    s.close()


def test_a_session_that_started_fresh_or_from_prices_set_directly_lists_nothing_re_timed(tiny_q2):
    """``scheduler_prices_retimed`` lists kept times only: a fresh session's own first samples and
    prices set on the session directly (used as given, spec dspark.md §7.4) are not kept times."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="fresh")
    s = e.session(128, policy="acceptance")
    s.prefill(PROMPT)
    for _ in range(12):
        s.step()
    assert s.dspark_stats().proposed > 0 and s.scheduler_prices().t_prop is not None
    assert s.scheduler_prices_retimed() == []
    s.close()
    s = e.session(128, policy="acceptance")
    s.set_scheduler_prices(P.SchedulerPrices(t_ver={1: 1e-6, 6: 1e-6}, t_prop=1e-6,
                                             reached=(32,) * 5 + (0,) * 11, hit=(32,) * 5 + (0,) * 11))
    s.prefill(PROMPT)
    for _ in range(3):
        s.step()
    assert s.dspark_stats().proposed > 0 and s.scheduler_prices().t_ver[6] != 1e-6
    assert s.scheduler_prices_retimed() == []
    s.close()
    e.close()


def test_a_new_chat_context_starts_from_what_the_old_session_measured(tiny_q2):
    """The chat's new context (Ctrl+G) makes its session before it frees the old one, so the new one
    first starts from the engine's prices of before the old session closed; once the old one has
    closed and left its measurements, the new session starts again from them (its scheduler's prices
    and ``scheduler_prices_at_start`` say so).  The old session ends holding HOPELESS, set directly."""
    from ds4tui.engine import worker as W

    eng = W.ChatEngine(tiny_q2["model"], support=tiny_q2["support"], backend="cpu", n_ctx=128,
                       scheduler_prices="engine")
    try:
        assert eng.session.scheduler_prices_at_start == "fresh" and eng.engine.kept_prices is None
        eng.session.set_scheduler_prices(HOPELESS)
        eng.set_context(96)
        kept = eng.engine.kept_prices
        assert kept is not None and kept.t_ver[6] == 1000.0 and kept.t_prop == 1000.0
        new = eng.session
        assert new.n_ctx == 96 and new.scheduler_prices_at_start == "engine"
        assert new.scheduler_prices() == kept
        r = eng.run_turn([{"role": "user", "content": "Hi"}], W.EventQueue(), think=False, max_tokens=8)
        assert r is not None and r.dspark_delta.get("proposed", 0) == 0  # priced out, as the old session was
        with pytest.raises(S.StateError, match="before the session's first pass"):
            new.restart_scheduler_prices()
    finally:
        eng.close()


def test_the_decisions_weigh_the_recent_verifies_and_the_whole_counts_are_handed_on(tiny_q2):
    """Survival (spec dspark.md §7.4): the acceptance the decisions read is halved each time 64
    verifies reached the first position, so counts that say every draft is accepted (1000 of 1000 at
    every position, another kind of prompt's) stop a drafter that accepts next to nothing (this one's
    random heads) within a few dozen cycles.  With the whole counts the first position stayed
    estimated above 0.9 for hundreds of verifies and the session drafted 79 of its cycles 160-240
    (none with the window, after 38-48 of its first 80).  The counts the session hands on (``scheduler_prices``) stay the whole ones."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], scheduler_prices="fresh")
    s = e.session(512, policy="acceptance")
    s.prefill(PROMPT)
    for _ in range(40):  # five plain decodes, a pricing draft: this machine's times
        s.step()
    real = s.scheduler_prices()
    s.close()
    assert real.t_prop is not None and 6 in real.t_ver
    sure = (1000,) * 5 + (0,) * 11
    s = e.session(600, policy="acceptance")
    # a plain decode priced so that a cycle of five drafts costs 3.5 of them, whatever the machine:
    # drafting pays from 3.5 tokens a cycle, which the whole counts promise (~5.7) and these heads
    # never make
    t1 = (real.t_prop + real.t_ver[6]) / 3.5
    s.set_scheduler_prices(replace(real, t_ver={**real.t_ver, 1: t1}, reached=sure, hit=sure))
    s.prefill(PROMPT)
    drafted = []
    for _ in range(240):
        before = s.dspark_stats()
        s.step()
        after = s.dspark_stats()
        drafted.append(after.proposed > before.proposed)
    st = s.dspark_stats()
    assert any(drafted[:20])  # the counts made it draft at first
    assert sum(drafted[160:]) <= 8, drafted  # then only the back-off's probes (the whole counts: 79 of 80)
    end = s.scheduler_prices()
    assert end.reached[0] == 1000 + st.pos_proposed[0] and end.hit[0] == 1000 + st.pos_accepted[0]
    s.close()
    e.close()
