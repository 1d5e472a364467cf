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
    r = replay_scheduler([5] * 80, 65, FLAT)
    assert (r.tokens, r.cycles, r.drafted_cycles, r.proposed, r.accepted) == (65, 15, 10, 50, 50)
    assert r.ms == pytest.approx(20.0)
    assert r.no_draft == {"scheduler_skip": 5}
    assert r.ratio_to_target(1.0) == pytest.approx(65 / 20)
    assert r.end.t_ver == {1: 1.0, 6: 1.0} and r.end.t_prop == 0.5
    assert r.end.reached[:5] == (10,) * 5 and r.end.hit[:5] == (10,) * 5


def test_without_the_scheduler_every_cycle_drafts_and_the_budget_cuts_the_last():
    # accepted 2 of 5 everywhere: cycles of 3 tokens; 10 tokens = 3 + 3 + 3 + 1, the third cycle's
    # draft cut to the 3 that leave room for its bonus token, the last cycle with room for none (no_room)
    r = replay_scheduler([2] * 20, 10, FLAT, scheduler=False)
    assert (r.cycles, r.drafted_cycles, r.proposed, r.accepted) == (4, 3, 5 + 5 + 3, 6)
    assert r.no_draft == {"no_room": 1}
    assert r.ms == pytest.approx(3 * 1.5 + 1.0)


def test_a_text_that_accepts_nothing_costs_a_few_percent_at_most():
    # probes at doubling back-offs, then (12 verifies of the session's own) a hopeless back-off of
    # 256 cycles: over 2000 tokens the drafted cycles lose what their proposals and verifies cost
    # above a decode, and nothing else
    r = replay_scheduler([0] * 2000, 2000, DEMO_LIKE)
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
        r = replay_scheduler([0] * 64, n, FLAT, start=kept, kept=True)
        assert r.drafted_cycles == drafted == replay_scheduler([0] * 64, n, FLAT, start=times_only,
                                                               kept=True).drafted_cycles
    assert r.end.reached[:5] == (14, 8, 8, 8, 8) and r.end.hit[:5] == (8, 8, 8, 8, 7)  # the whole counts go on
    # given directly (kept=False) the same counts are the session's own and are not faded
    given = replay_scheduler([0] * 64, 16, FLAT, start=kept, kept=False)
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
    r = replay_scheduler([5] * 300, 200, costs, start=kept, kept=True)
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
    r = replay_scheduler(([1] * 7 + [0] * 3) * 40, 300, costs, max_draft=2, start=kept, kept=True)
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
        replay_scheduler(acc, n, costs, **args)
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
                             "traces": [{"kind": "co\x1bde", "text": "a\x07b", "accepted": [5] * 300}]}))
    r = subprocess.run([sys.executable, str(TOOL), "replay", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "co\\x1bde" in r.stdout
    assert "1 traces, 255 tokens each" in r.stdout and "note:" not in r.stderr
