"""The DSpark scheduler replayed on acceptance traces (spec dspark.md §7.5, ``ds4_dspark_replay``):
the engine's own decisions with given costs, so each case below is exact and needs no model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ds4tui.engine.prices import SchedulerPrices
from ds4tui.engine.replay import Costs, replay_scheduler

pytest.importorskip("ds4tui._native")

FLAT = Costs(t_decode=1.0, t_propose=0.5, t_verify={n: 1.0 for n in range(2, 7)})
"""A verify costs a decode at every width: drafting more never costs more."""
DEMO_LIKE = Costs(t_decode=1.0, t_propose=0.85, t_verify={n: 1.35 + 0.24 * (n - 2) for n in range(2, 7)})
"""The demo pair's CPU costs in decodes (tools/cpu_notes.md, 2026-12-05): five drafts pay from ~3.2 tokens a cycle."""


def test_a_text_that_accepts_everything_is_drafted_whole_after_five_pricing_decodes():
    # 5 plain decodes price t_ver(1) (spec §7.4, First cycles); then every cycle drafts 5 and keeps 6
    # tokens: 5 + 10 x 6 = 65 tokens in 5 x 1.0 + 10 x (0.5 + 1.0) = 20 ms
    r = replay_scheduler([5] * 80, 65, FLAT, policy="acceptance")
    assert (r.tokens, r.cycles, r.drafted_cycles, r.proposed, r.accepted) == (65, 15, 10, 50, 50)
    assert r.ms == pytest.approx(20.0)
    assert r.no_draft == {"scheduler_skip": 5}
    assert r.ratio_to_target(1.0) == pytest.approx(65 / 20)
    assert r.end.t_ver == {1: 1.0, 6: 1.0} and r.end.t_prop == 0.5
    assert r.end.reached[:5] == (10,) * 5 and r.end.hit[:5] == (10,) * 5


def test_without_the_scheduler_every_cycle_drafts_and_the_budget_cuts_the_last():
    # accepted 2 of 5 everywhere: cycles of 3 tokens; 10 tokens = 3 + 3 + 3 + 1, the third cycle's
    # draft cut to the 3 that leave room for its bonus token, the last cycle with room for none (no_room)
    r = replay_scheduler([2] * 20, 10, FLAT, policy="acceptance", scheduler=False)
    assert (r.cycles, r.drafted_cycles, r.proposed, r.accepted) == (4, 3, 5 + 5 + 3, 6)
    assert r.no_draft == {"no_room": 1}
    assert r.ms == pytest.approx(3 * 1.5 + 1.0)


def test_a_text_that_accepts_nothing_costs_a_few_percent_at_most():
    # probes at doubling back-offs, then (12 verifies of the session's own) a hopeless back-off of
    # 256 cycles: over 2000 tokens the drafted cycles lose what their proposals and verifies cost
    # above a decode, and nothing else
    r = replay_scheduler([0] * 2000, 2000, DEMO_LIKE, policy="acceptance")
    assert r.accepted == 0 and r.tokens == 2000
    assert r.drafted_cycles <= 20
    # each drafted cycle emits one token for a proposal and a verify of at most 6 rows
    assert 0 < r.ms - 2000 * 1.0 <= r.drafted_cycles * (0.85 + DEMO_LIKE.t_verify[6] - 1.0) + 1e-9
    assert r.ratio_to_target(1.0) >= 0.98


def test_kept_counts_of_another_text_fade_within_two_verifies():
    # kept prices of a text the drafter predicted (8 of 8 at four positions, 7 of 8 at the fifth),
    # then a text it cannot draft: the kept counts weigh half after the session's first verify and
    # nothing after its second (spec §7.4, kept prices), so the session drafts as often as one that
    # kept the times alone (2 drafted cycles after the first plain decode, then probes at doubling
    # back-offs); weighed whole, the counts kept it drafting (13 of 16 cycles, 0.71x)
    counts = dict(reached=(8, 8, 8, 8, 8) + (0,) * 11, hit=(8, 8, 8, 8, 7) + (0,) * 11)
    kept = SchedulerPrices(t_ver={1: 1.0, 6: 1.5}, t_prop=0.5, **counts)
    times_only = SchedulerPrices(t_ver={1: 1.0, 6: 1.5}, t_prop=0.5)
    for n, drafted in ((8, 2), (16, 4), (64, 6)):
        r = replay_scheduler([0] * 64, n, FLAT, policy="acceptance", start=kept, kept=True)
        assert r.drafted_cycles == drafted == replay_scheduler([0] * 64, n, FLAT, policy="acceptance", start=times_only,
                                                               kept=True).drafted_cycles
    assert r.end.reached[:5] == (14, 8, 8, 8, 8) and r.end.hit[:5] == (8, 8, 8, 8, 7)  # the whole counts go on
    # given directly (kept=False) the same counts are the session's own and are not faded
    given = replay_scheduler([0] * 64, 16, FLAT, policy="acceptance", start=kept, kept=False)
    assert given.drafted_cycles > 4


def test_a_narrower_verify_is_never_priced_above_a_wider_one():
    # kept prices that timed verify(5) once in a busy spell (20 ms beside verify(6) at 1.5): priced
    # at 20, four drafts looked dear, the scan for the best length stopped below them and the session
    # skipped and cut (24 drafted cycles, 104 ms for 200 tokens); priced at most verify(6), every
    # cycle drafts the whole block: 1 plain decode (the kept prices' check), 33 cycles of 6 tokens at
    # 0.5 + 1.5 ms, and a last plain decode with no room for a draft (spec §7.4, Times)
    costs = Costs(t_decode=1.0, t_propose=0.5, t_verify={n: 1.0 + 0.1 * (n - 1) for n in range(2, 7)})
    kept = SchedulerPrices(t_ver={1: 1.0, 5: 20.0, 6: 1.5}, t_prop=0.5, reached=(8,) * 5 + (0,) * 11,
                           hit=(8,) * 5 + (0,) * 11)
    r = replay_scheduler([5] * 300, 200, costs, policy="acceptance", start=kept, kept=True)
    assert (r.drafted_cycles, r.proposed, r.accepted) == (33, 165, 165)
    assert r.ms == pytest.approx(1.0 + 33 * 2.0 + 1.0)
    assert r.end.t_ver[5] == 20.0  # never re-timed: the bound is on the price, not the record


def test_only_widths_the_knobs_can_draft_bound_a_verify_price():
    # a cheap kept verify(6) (1.05 ms against 2.5 real at every width) with drafts of at most 2: width
    # 6 is never verified to re-time it, so it must not price verify(2) and verify(3) below their
    # cost; it does not, and the session drafts once (a probe, rejected) and otherwise decodes plainly:
    # 299 plain decodes and a cycle of 1 token at 0.5 + 2.5 ms.  Bounded by every wider width, it
    # drafted 176 cycles at 0.56x target-only
    costs = Costs(t_decode=1.0, t_propose=0.5, t_verify={n: 2.5 for n in range(2, 7)})
    kept = SchedulerPrices(t_ver={1: 1.0, 2: 2.5, 3: 2.5, 6: 1.05}, t_prop=0.5, reached=(8,) * 5 + (0,) * 11,
                           hit=(6,) + (0,) * 15)
    r = replay_scheduler(([1] * 7 + [0] * 3) * 40, 300, costs, policy="acceptance", max_draft=2, start=kept, kept=True)
    assert (r.drafted_cycles, r.accepted) == (1, 0)
    assert r.ms == pytest.approx(299 * 1.0 + 0.5 + 2.5)


@pytest.mark.parametrize("kw,needle", [
    (dict(accepted=[0] * 10, n_tokens=11), "n_tokens must be 1..10"),
    (dict(accepted=[6] * 10, n_tokens=5), "accepted[0] must be 0..5, got 6"),
    (dict(accepted=[0, -1], n_tokens=1), "accepted[1] must be 0..5, got -1"),
    (dict(accepted=[0, 2.9], n_tokens=1), "accepted[1] must be a whole number 0..5, got 2.9"),
    (dict(accepted=[True], n_tokens=1), "accepted[0] must be a whole number 0..5, got True"),
    (dict(accepted=[], n_tokens=1), "accepted is empty"),
    (dict(accepted=[0] * 10, n_tokens=5.0), "n_tokens must be a whole number 1..10, got 5.0"),
    (dict(accepted=[0] * 10, n_tokens=5, max_draft=6), "max_draft must be 1..5"),
    (dict(accepted=[0] * 10, n_tokens=5, max_draft=0), "max_draft must be 1..5, got 0"),
    (dict(accepted=[0] * 10, n_tokens=5, block=17), "block must be 1..16"),
    (dict(accepted=[0] * 10, n_tokens=5, costs=Costs(0.0, 1.0, FLAT.t_verify)), "costs.t_decode must be a finite time 1e-06..60000 ms, got 0.0"),
    (dict(accepted=[0] * 10, n_tokens=5, costs=Costs(1.0, float("nan"), FLAT.t_verify)), "t_propose must be"),
    (dict(accepted=[0] * 10, n_tokens=5, costs=Costs(1.0, 1.0, {2: 1.0})),
     "costs.t_verify must price exactly the verify widths 2..6 (block 5), got widths [2]"),
    (dict(accepted=[0] * 10, n_tokens=5, costs=Costs(1.0, 1.0, {**FLAT.t_verify, 7: -5.0})), "got widths [2, 3, 4, 5, 6, 7]"),
    (dict(accepted=[0] * 10, n_tokens=5, costs=Costs(1.0, 1.0, {**FLAT.t_verify, 4: -1.0})),
     "costs.t_verify[4] must be a finite time 1e-06..60000 ms, got -1.0"),
    (dict(accepted=[0] * 10, n_tokens=5, costs=Costs(True, 1.0, FLAT.t_verify)), "costs.t_decode must be a number of ms, got True"),
    (dict(accepted=[0] * 10, n_tokens=5, costs=Costs(1e308, 1.0, FLAT.t_verify)), "costs.t_decode must be a finite time"),
    (dict(accepted=[0] * 10, n_tokens=5, scheduler="no"), "scheduler must be True or False, got 'no'"),
    (dict(accepted=[0] * 10, n_tokens=5, start=SchedulerPrices(t_ver={99: 1.0})), "start prices: widths 1..17"),
    (dict(accepted=[0] * 10, n_tokens=5, costs=Costs(1.0, "x", FLAT.t_verify)), "costs.t_propose must be a number of ms, got 'x'"),
    (dict(accepted=[0] * 10, n_tokens=5, start=SchedulerPrices(reached=(1,) + (0,) * 15, hit=(2,) + (0,) * 15)),
     "replay: start prices: hit[0] = 2 is more than reached[0] = 1"),
])
def test_bad_arguments_name_what_is_wrong(kw, needle):
    args = dict(costs=FLAT)
    args.update(kw)
    acc, n, costs = args.pop("accepted"), args.pop("n_tokens"), args.pop("costs")
    with pytest.raises(ValueError) as e:
        replay_scheduler(acc, n, costs, policy="acceptance", **args)
    assert needle in str(e.value)


TOOL = Path(__file__).resolve().parent.parent / "tools" / "scheduler_replay.py"


@pytest.mark.parametrize("args,code,needle", [
    (["--model", "m.gguf"], 2, "--model and --mtp go together: give a target GGUF and its DSpark support GGUF, or "
                               "neither for the demo pair (found only --model)"),
    (["--mtp", "s.gguf"], 2, "(found only --mtp)"),
    (["--model", "absent.gguf", "--mtp", "s.gguf"], 2, "--model absent.gguf: no such file"),
    (["--model", "m.gguf", "--mtp", "absent.gguf"], 2, "--mtp absent.gguf: no such file"),
    (["--model", "m.gguf", "--mtp", "s.gguf"], 1, "scheduler_replay: error: m.gguf: wrong magic: expected b'GGUF'"),
    (["--model", ".", "--mtp", "s.gguf"], 2, "--model .: a folder; give the path of a GGUF file"),
    (["--model", "m.gguf", "--mtp", "s.gguf", "--out-is", "s.gguf"], 2,
     "s.gguf is the --mtp file: the recording would replace it; give another OUT"),
    (["--out-is", ""], 2, "OUT is empty; give the file to write"),
    (["--out-is", "/proc/traces.json"], 1, "/proc/traces.json: cannot be written (a file cannot be created in /proc"),
    (["--out-is", "/dev/null"], 1, "/dev/null: cannot be written (it is not a regular file (a device, a pipe, ...)"),
    (["--model", "", "--mtp", "s.gguf"], 2, "--model is empty; give the path of a GGUF file"),
    (["--model", "/dev/null", "--mtp", "s.gguf"], 2, "--model /dev/null: not a regular file"),
    (["--amx", "maybe"], 2, "argument --amx: invalid choice: 'maybe' (choose from 'auto', 'on', 'off')"),
])
def test_record_takes_a_pair_as_two_files_and_names_a_bad_one(args, code, needle, tmp_path):
    """``record --model --mtp`` records another pair than the demo's; half a pair, a missing file, a
    folder, a file that is no GGUF, an OUT that is one of the pair's files, an empty OUT or one that
    cannot be created is one line naming it, before any recording, and nothing is written."""
    (tmp_path / "m.gguf").write_bytes(b"not a model file")
    (tmp_path / "s.gguf").write_bytes(b"not a support file")
    out = "out.json"
    if "--out-is" in args:
        i = args.index("--out-is")
        out, args = args[i + 1], args[:i] + args[i + 2:]
    r = subprocess.run([sys.executable, str(TOOL), "record", out, *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == code, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "s.gguf"]


def test_replay_defaults_to_the_recorded_length_when_traces_are_short(tmp_path):
    """``replay`` without --tokens replays 255 tokens, or the shortest trace's positions when a
    recording holds fewer (a ``record --tokens 8`` file replays as it is); an explicit --tokens past
    them is refused naming the trace."""
    costs = {"t_decode": 1.0, "t_propose": 0.5, "t_verify": {str(n): 1.0 for n in range(2, 7)}}
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"block": 5, "costs": costs, "traces": [{"kind": "code", "text": "a", "accepted": [5] * 8},
                                                                      {"kind": "prose", "text": "b", "accepted": [0] * 9}]}))
    r = subprocess.run([sys.executable, str(TOOL), "replay", str(f), "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == 8
    assert "note: 8 tokens each, the positions of the shortest trace (0)" in r.stderr
    r = subprocess.run([sys.executable, str(TOOL), "replay", str(f), "--tokens", "9"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--tokens 9: trace 0 of" in r.stderr and "holds 8 positions" in r.stderr


def test_replay_of_one_trace_needs_no_after(tmp_path):
    """The kept arms start after the bench's two prompts (0 and 1) by default, those the file holds: a
    file of one trace replays without --after, and its control characters are shown escaped."""
    costs = {"t_decode": 1.0, "t_propose": 0.5, "t_verify": {str(n): 1.0 for n in range(2, 7)}}
    f = tmp_path / "one.json"
    f.write_text(json.dumps({"block": 5, "costs": costs,
                             "traces": [{"kind": "co\x1bde", "text": "a\x07b", "accepted": [5] * 300,
                                         "confidence": [[0.9] * 5] * 300}]}))
    r = subprocess.run([sys.executable, str(TOOL), "replay", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "co\\x1bde" in r.stdout
    assert "1 traces, 255 tokens each" in r.stdout and "note:" not in r.stderr
    assert "acceptance, after 0" in r.stdout and "confidence, fresh" in r.stdout


# ---- the confidence policy (spec dspark.md §7.6) ---------------------------------------------------

def test_the_confidence_policy_verifies_a_sure_drafter_whole():
    # c = 1 everywhere: every draft's calibrated chance is 1, so each cycle after the five pricing
    # decodes verifies all five drafts (the flat costs make no length dearer): as the acceptance
    # policy, 5 + 10 x 6 = 65 tokens in 5 x 1.0 + 10 x (0.5 + 1.0) = 20 ms
    r = replay_scheduler([5] * 80, 65, FLAT, policy="confidence", confidence=[[1.0] * 5] * 80)
    assert (r.tokens, r.cycles, r.drafted_cycles, r.proposed, r.accepted) == (65, 15, 10, 50, 50)
    assert r.ms == pytest.approx(20.0) and r.no_draft == {"scheduler_skip": 5}


def test_the_confidence_policy_cuts_where_the_confidences_stop_paying():
    # costs: a verify of n rows 0.5 + 0.5 n ms, a decode 1 ms.  Drafts of confidence 1, 1, then 0.01,
    # of which the target accepts the first two.  The first proposal after the five pricing decodes
    # is verified whole (only t_ver(1) is timed: a wider verify is priced as flat as it, the optimistic
    # bound) and keeps 3 tokens for 0.25 + 3.5 ms: no gain, so two cycles skip.  Then each cycle's
    # best rate is 3 tokens per 2.0 ms at two drafts (3.01 per 2.5 at three), a gain: 18 cycles of
    # 3 tokens reach position 64, where the last token has no room for a draft (no_room)
    costs = Costs(t_decode=1.0, t_propose=0.25, t_verify={n: 0.5 + 0.5 * n for n in range(2, 7)})
    conf = [[1.0, 1.0, 0.01, 0.01, 0.01]] * 100
    r = replay_scheduler([2] * 100, 65, costs, policy="confidence", confidence=conf)
    assert (r.drafted_cycles, r.proposed, r.accepted) == (19, 5 + 18 * 2, 2 + 18 * 2)
    assert r.no_draft == {"scheduler_skip": 7, "no_room": 1}
    assert r.ms == pytest.approx(8 * 1.0 + 19 * 0.25 + 3.5 + 18 * 2.0)


def test_an_unsure_proposal_is_cut_to_nothing_and_backs_off_doubling():
    # c = 0.01 and nothing accepted.  The first proposal is verified whole (the wider verifies are not
    # timed yet: priced as flat as a decode, any chance pays) and gains nothing: two cycles skip.
    # After it no length pays (a verify of two rows is priced 1.262 ms, between the decode and the
    # six rows it timed), each proposal ends in a plain decode (confidence_cut) and the back-off
    # doubles to 128: proposals at positions 5, 8, 13, 22, 39, 72, 137 and 266 of 300
    r = replay_scheduler([0] * 300, 300, DEMO_LIKE, policy="confidence", confidence=[[0.01] * 5] * 300)
    assert (r.drafted_cycles, r.proposed, r.tokens, r.cycles) == (1, 5, 300, 300)
    assert r.no_draft == {"confidence_cut": 7, "scheduler_skip": 300 - 8}
    assert r.ms == pytest.approx(300 * 1.0 + 8 * 0.85 + (DEMO_LIKE.t_verify[6] - 1.0))


def test_a_drafter_sure_of_drafts_the_target_rejects_learns_its_calibration():
    # c = 0.95 everywhere and nothing accepted: the bin's chance falls from 0.95 as verifies reach
    # its drafts (3.8 / (4 + m) after m), so the policy soon cuts to nothing and backs off; over
    # 2000 tokens it loses little, where verifying what the raw confidences say would lose a third
    sure = [[0.95] * 5] * 2000
    r = replay_scheduler([0] * 2000, 2000, DEMO_LIKE, policy="confidence", confidence=sure)
    assert r.accepted == 0 and r.drafted_cycles <= 12
    assert r.ratio_to_target(1.0) >= 0.98
    off = replay_scheduler([0] * 2000, 2000, DEMO_LIKE, policy="confidence", confidence=sure, scheduler=False)
    assert off.ratio_to_target(1.0) < 0.5


def test_the_threshold_cuts_a_replayed_proposal_as_the_drafter_does():
    # threshold 0.5 and c = 0.9, 0.9, 0.4, ...: the drafter stops at the third draft, so with the
    # scheduler off every cycle verifies 2 (accepted 5: 3 tokens a cycle); c_1 below it: confidence_gate
    conf = [[0.9, 0.9, 0.4, 0.9, 0.9]] * 40
    r = replay_scheduler([5] * 40, 30, FLAT, policy="acceptance", scheduler=False, confidence=conf, threshold=0.5)
    assert (r.drafted_cycles, r.proposed, r.accepted) == (10, 20, 20)
    gated = replay_scheduler([5] * 40, 30, FLAT, policy="acceptance", scheduler=False,
                             confidence=[[0.3] * 5] * 40, threshold=0.5)
    assert gated.drafted_cycles == 0 and gated.no_draft == {"confidence_gate": 29, "no_room": 1}
    assert gated.ms == pytest.approx(29 * (0.5 + 1.0) + 1.0)  # each proposal spent, then a plain decode


def _policy_model(accepted, conf, n_tokens, costs, block=5):
    """The confidence policy of spec dspark.md §7.6 written again from the spec, for a fresh session at
    constant costs (its moving averages then hold the given times): (ms, drafted cycles, proposed,
    accepted, no-draft reasons)."""
    t_ver = {}  # widths timed so far (1: the plain decode, from the five first ones)
    t_prop = None
    cal_n, cal_h = [0.0] * 10, [0.0] * 10
    first, since_plain, skip, backoff, gain = 0, 0, 0, 2, 0.0
    ms, pos, drafted, proposed, acc_total, reasons = 0.0, 0, 0, 0, 0, {}

    def price(n):
        if n in t_ver:
            t = t_ver[n]
        else:
            lo = max(m for m in t_ver if m < n)
            his = [m for m in t_ver if m > n]
            t = t_ver[lo] + (t_ver[min(his)] - t_ver[lo]) * (n - lo) / (min(his) - lo) if his else t_ver[lo]
        if n >= 2:
            t = min([t] + [t_ver[m] for m in t_ver if n < m <= block + 1])
        return t

    def chance(c):
        b = min(9, max(0, int(c * 10)))
        return (cal_h[b] + 4.0 * c) / (cal_n[b] + 4.0)

    def learn(c, hit):
        b = min(9, max(0, int(c * 10)))
        cal_n[b] += 1
        cal_h[b] += hit
        if cal_n[b] >= 64:
            cal_n[b] *= 0.5
            cal_h[b] *= 0.5

    def plain(reason):
        nonlocal ms, pos, since_plain, first
        ms += costs.t_decode
        pos += 1
        since_plain = 0
        reasons[reason] = reasons.get(reason, 0) + 1
        if first < 5:
            first += 1
            t_ver[1] = costs.t_decode

    def done(nd, a):
        nonlocal skip, backoff, gain
        spent = (t_prop or 0.0) + (price(nd + 1) if nd else price(1))
        gain = 0.5 * gain + 0.5 * ((a + 1) - spent / price(1))
        if gain > 0:
            backoff = 2
        else:
            skip, backoff = backoff, min(2 * backoff, 128)

    while pos < n_tokens:
        lmax = min(block, n_tokens - pos - 1)
        if skip > 0:
            skip -= 1
            plain("scheduler_skip")
            continue
        if first < 5 or since_plain >= 64:
            plain("scheduler_skip")
            continue
        if lmax < 1:
            plain("no_room")
            continue
        ms += costs.t_propose
        if lmax == block:
            t_prop = costs.t_propose
        c = conf[pos]
        best, rate, surv, tokens = 0, 1.0 / price(1), 1.0, 1.0
        for n in range(1, lmax + 1):
            surv *= chance(c[n - 1])
            tokens += surv
            if tokens / price(n + 1) > rate:
                best, rate = n, tokens / price(n + 1)
        if best == 0:
            done(0, 0)
            plain("confidence_cut")
            continue
        a = min(accepted[pos], best)
        for i in range(min(a + 1, best)):
            learn(c[i], i < a)
        if a == best < lmax:
            learn(c[best], accepted[pos] > best)
        t_ver[best + 1] = costs.t_verify[best + 1]
        ms += costs.t_verify[best + 1]
        done(best, a)
        since_plain += 1
        drafted, proposed, acc_total = drafted + 1, proposed + best, acc_total + a
        pos += a + 1
    return ms, drafted, proposed, acc_total, reasons


@pytest.mark.parametrize("seed", range(6))
def test_the_confidence_policy_replays_as_the_spec_describes_it(seed):
    """Random texts and confidences (the chance of each draft rising with its c, as a calibrated
    drafter's), the demo-like costs: the engine's replay and the policy written again from the spec
    agree on every cycle's outcome."""
    import random

    rng = random.Random(seed)
    n = 600
    conf, accepted = [], []
    easy = 0.0
    for p in range(n):
        if p % 50 == 0:
            easy = rng.random()  # stretches of text the drafter finds easy or hard
        c = [min(1.0, max(0.0, easy + rng.uniform(-0.3, 0.3))) for _ in range(5)]
        a = 0
        while a < 5 and rng.random() < c[a]:
            a += 1
        conf.append(c)
        accepted.append(a)
    r = replay_scheduler(accepted, 500, DEMO_LIKE, policy="confidence", confidence=conf)
    ms, drafted, proposed, acc, reasons = _policy_model(accepted, conf, 500, DEMO_LIKE)
    assert (r.drafted_cycles, r.proposed, r.accepted, r.no_draft) == (drafted, proposed, acc, reasons)
    assert r.ms == pytest.approx(ms)
    assert drafted > 0 and reasons.get("confidence_cut", 0) > 0  # both of the policy's outcomes were taken


@pytest.mark.parametrize("kw,needle", [
    (dict(policy="confidence"), "the confidence policy needs the recorded confidences"),
    (dict(policy="greedy"), "policy must be one of acceptance, confidence, got 'greedy'"),
    (dict(policy="acceptance", threshold=0.5), "threshold must be 0 without recorded confidences, got 0.5"),
    (dict(policy="acceptance", threshold=1.5, confidence=[[0.5]] * 10), "threshold must be a number in [0, 1], got 1.5"),
    (dict(policy="confidence", confidence=[[0.5]] * 9), "one sequence per position of accepted (10), got 9"),
    (dict(policy="confidence", confidence=[[0.5] * 6] * 10), "confidence[0] holds 6 numbers, more than the block (5)"),
    (dict(policy="confidence", confidence=[[0.5]] * 3 + [[float("nan")]] + [[0.5]] * 6),
     "confidence[15] (position 3, draft 1) must be in [0, 1], got nan"),
    (dict(policy="confidence", confidence=[[0.5]] * 3 + [[1.5]] + [[0.5]] * 6),
     "confidence[15] (position 3, draft 1) must be in [0, 1], got 1.5"),
])
def test_bad_confidence_arguments_name_what_is_wrong(kw, needle):
    with pytest.raises(ValueError) as e:
        replay_scheduler([0] * 10, 5, FLAT, **kw)
    assert needle in str(e.value)


def test_replay_refuses_a_file_where_only_some_traces_hold_confidences(tmp_path):
    """record writes confidences in every trace or (before 2026-12-05) in none: a file with some is damaged
    and named so; one with none replays the acceptance policy and says why in the JSON too."""
    costs = {"t_decode": 1.0, "t_propose": 0.5, "t_verify": {str(n): 1.0 for n in range(2, 7)}}
    traces = [{"kind": "code", "text": "x", "accepted": [2] * 40, "confidence": [[0.5] * 5] * 40} for _ in range(3)]
    del traces[1]["confidence"]
    f = tmp_path / "some.json"
    f.write_text(json.dumps({"block": 5, "costs": costs, "traces": traces}))
    r = subprocess.run([sys.executable, str(TOOL), "replay", str(f), "--tokens", "30"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and (f"{f}: traces[1] has no confidence array where 2 of the 3 traces hold one; the file "
                                  f"is damaged: record it again") in r.stderr
    for t in traces:
        t.pop("confidence", None)
    f.write_text(json.dumps({"block": 5, "costs": costs, "traces": traces}))
    r = subprocess.run([sys.executable, str(TOOL), "replay", str(f), "--tokens", "30", "--json"], capture_output=True,
                       text=True, timeout=120)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["policies"] == ["acceptance"] and "the confidence policy is left out" in out["notes"][0]
    assert out["arms"] == ["no scheduler", "acceptance, fresh", "acceptance, after 0", "acceptance, after 1"]


def test_a_proposal_the_threshold_gates_backs_the_confidence_policy_off():
    # threshold 0.5 and c_1 = 0.3 everywhere: every proposal is gated (confidence_gate), a proposal spent
    # for nothing, so the policy backs off as after a cut to nothing: proposals at positions 5, 8, 13, 22,
    # 39, 72, 137 and 266 of 300
    conf = [[0.3] * 5] * 300
    r = replay_scheduler([0] * 300, 300, DEMO_LIKE, policy="confidence", confidence=conf, threshold=0.5)
    assert r.no_draft == {"confidence_gate": 8, "scheduler_skip": 292} and r.drafted_cycles == 0
    assert r.ms == pytest.approx(300 * 1.0 + 8 * 0.85)
