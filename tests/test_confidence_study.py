"""tools/confidence_study.py: the drafter's confidences against what the target accepted, and a
scheduler that cuts each proposal by them, simulated on recorded traces (its pure parts, exact
figures worked out by hand below; no model)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ds4tui.engine.replay import Costs

TOOL = Path(__file__).resolve().parent.parent / "tools" / "confidence_study.py"
_spec = importlib.util.spec_from_file_location("confidence_study", TOOL)
cs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cs)

COSTS = Costs(t_decode=1.0, t_propose=0.5, t_verify={n: 1.0 + 0.1 * (n - 1) for n in range(2, 7)})
"""A verify of n rows costs 1 + 0.1 (n - 1) decodes; a proposal half a decode."""


def test_a_sure_drafter_verifies_the_whole_block_and_a_hopeless_one_backs_off():
    """Every draft accepted with c = 1: each cycle verifies all five (6 tokens for 0.5 + 1.5 ms), 12
    tokens in 4 ms, 3x target-only.  None accepted with c = 0.05 (1.05 expected tokens for 1.1 ms
    loses to a decode's 1 for 1): each proposal ends in a plain decode, and the proposals back off
    2, 4, 8 positions: 1.5 + 2 + 1.5 + 4 + 1.5 + 3 = 13.5 ms for 12 tokens.  Without the scheduler
    every cycle verifies what the answer has room for and accepts nothing: seven cycles of five drafts
    (2.0 ms), then 4, 3, 2, 1 (1.9, 1.8, 1.7, 1.6) and a last plain decode: 22 ms."""
    assert cs.simulate([5] * 12, [[1.0] * 5] * 12, 12, COSTS, 5, "confidence cut") == pytest.approx(4.0)
    assert cs.simulate([5] * 12, [[1.0] * 5] * 12, 12, COSTS, 5, "target") == pytest.approx(12.0)
    assert cs.simulate([0] * 12, [[0.05] * 5] * 12, 12, COSTS, 5, "confidence cut") == pytest.approx(13.5)
    assert cs.simulate([0] * 12, [[0.05] * 5] * 12, 12, COSTS, 5, "no scheduler") == pytest.approx(22.0)


def test_the_back_off_doubles_to_its_cap():
    """A hopeless answer of 400 tokens proposes at positions 0, 3, 8, 17, 34, 67, 132, 261 and 390
    (back-offs 2, 4, ..., 128, 128): 400 decodes and 9 proposals, 404.5 ms."""
    assert cs.simulate([0] * 400, [[0.05] * 5] * 400, 400, COSTS, 5, "confidence cut") == pytest.approx(404.5)


def test_the_cut_stops_where_the_next_draft_costs_more_than_it_brings():
    """c = (0.9, 0.9, 0.2, ...): two drafts bring 1 + 0.9 + 0.81 = 2.71 tokens for 1.2 ms (2.26 a ms);
    a third adds 0.162 for 0.1 ms more (2.21 a ms): the cut is 2.  At position 0 the target would
    accept 4 drafts; 2 are verified: 3 tokens for 0.5 + 1.2 ms.  At position 3 the drafter is unsure
    (c = 0.05) where the target would accept all five: a plain decode after the proposal (1.5 ms), then
    two positions backed off (2 ms): 5.2 ms for 6 tokens."""
    sure = [0.9, 0.9, 0.2, 0.2, 0.2]
    assert cs.expected_tokens(sure, 2) == pytest.approx(2.71)
    assert cs.best_cut(sure, COSTS) == 2
    conf = [sure, sure, sure, [0.05] * 5, sure, sure]
    assert cs.simulate([4, 0, 0, 5, 0, 0], conf, 6, COSTS, 5, "confidence cut") == pytest.approx(5.2)


def test_a_cycle_that_accepts_a_draft_resets_the_back_off():
    """Fails at 0 (back-off 2), a draft accepted at 3 (2 verified, 1 accepted: back to 2), fails at 5
    (skips 2) and at 8 (skips 4, up to the end): 1.5 + 2 + 1.7 + 1.5 + 2 + 1.5 + 3 = 13.2 ms.  Had the
    back-off not been reset, the proposal at 10 would have taken the draft there."""
    low, sure = [0.05] * 5, [0.9, 0.9, 0.2, 0.2, 0.2]
    conf = [low] * 12
    conf[3] = conf[10] = sure
    acc = [0] * 12
    acc[3] = acc[10] = 1
    assert cs.simulate(acc, conf, 12, COSTS, 5, "confidence cut") == pytest.approx(13.2)
    with pytest.raises(ValueError, match="policy 'no_scheduler'"):
        cs.simulate(acc, conf, 12, COSTS, 5, "no_scheduler")
    with pytest.raises(ValueError, match="n_tokens 13: expected 1..12"):
        cs.simulate(acc, conf, 13, COSTS, 5, "confidence cut")


def test_calibration_bins_and_auc():
    """c_1 of accepted first drafts 0.9 and 0.8 against rejected 0.1 and 0.85: three of the four pairs
    ordered right (AUC 0.75); the bins count the anchors and their accepted drafts, c_1 = 1 in the
    last; a tie counts half; one outcome only has no AUC."""
    traces = [{"accepted": [3, 1, 0, 0, 2], "confidence": [[0.9], [0.8], [0.1], [0.85], [1.0, 1.0]]}]
    cal = cs.calibration(traces, 4)
    assert cal["anchors"] == 4 and cal["auc_c1"] == pytest.approx(0.75)
    assert {(b["c1_from"], b["anchors"], b["first_accepted"], b["mean_accepted"]) for b in cal["bins"]} == {
        (0.1, 1, 0.0, 0.0), (0.8, 2, 0.5, 0.5), (0.9, 1, 1.0, 3.0)}
    cal = cs.calibration(traces, 5)
    assert [b for b in cal["bins"] if b["c1_from"] == 0.9][0]["anchors"] == 2
    assert cs.auc([0.5], [0.5]) == pytest.approx(0.5)
    assert math.isnan(cs.auc([0.5], []))
    assert cs.calibration([{"accepted": [1], "confidence": [[0.7]]}], 1)["auc_c1"] is None


def _file(tmp_path, traces):
    costs = {"t_decode": 1.0, "t_propose": 0.5, "t_verify": {str(n): 1.0 + 0.1 * (n - 1) for n in range(2, 7)}}
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"block": 5, "costs": costs, "traces": traces}))
    return f


def test_the_tool_prints_the_study_and_names_a_file_without_confidences(tmp_path):
    """On a file of two traces it prints the rates per policy (the sure trace at 3x with the cut);
    a trace recorded before the confidences were kept is one line naming it and how to record again."""
    f = _file(tmp_path, [{"kind": "code", "text": "a", "accepted": [5] * 12, "confidence": [[1.0] * 5] * 12},
                         {"kind": "prose", "text": "b", "accepted": [0] * 12, "confidence": [[0.05] * 5] * 12}])
    r = subprocess.run([sys.executable, str(TOOL), str(f), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens"] == 12
    assert out["policies"]["confidence cut"]["rates"] == pytest.approx([3.0, 12 / 13.5])
    assert out["policies"]["confidence cut"]["below_0_99"] == 1
    f = _file(tmp_path, [{"kind": "code", "text": "a", "accepted": [5] * 12}])
    r = subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "traces[0] has no confidence array (a file recorded before 2026-12-05)" in r.stderr
    assert "scheduler_replay.py record" in r.stderr


@pytest.mark.parametrize("accepted, confidence, needle", [
    ([-1, 0], [[0.5], [0.5]], "traces[0].accepted[0]: expected a whole number 0..5, found -1"),
    ([9, 0], [[0.5] * 5, [0.5]], "traces[0].accepted[0]: expected a whole number 0..5, found 9"),
    ([True, 0], [[0.5], [0.5]], "traces[0].accepted[0]: expected a whole number 0..5, found true"),
    ([2.5, 0], [[0.5] * 3, [0.5]], "traces[0].accepted[0]: expected a whole number 0..5, found 2.5"),
    (["2", 0], [[0.5] * 3, [0.5]], 'traces[0].accepted[0]: expected a whole number 0..5, found "2"'),
    ([0, None], [[0.5], [0.5]], "traces[0].accepted[1]: expected a whole number 0..5, found null"),
    ([1, 0], [[1.0] * 5, [1.5]], "traces[0].confidence[1][0]: expected a number in [0, 1], found 1.5"),
    ([1, 0], [[1.0] * 5, [-0.1]], "traces[0].confidence[1][0]: expected a number in [0, 1], found -0.1"),
    ([1, 0], [[1.0] * 5, [True]], "traces[0].confidence[1][0]: expected a number in [0, 1], found true"),
    ([1, 0], [[1.0] * 6, [0.5]], "traces[0].confidence[0]: expected at most 5 numbers in [0, 1], found 6"),
    ([1, 0], [[1.0] * 5, {"c": 1}], "traces[0].confidence[1]: expected an array of at most 5 numbers in [0, 1], found "
                                   "object"),
    ([3, 0], [[0.9], [0.5]], "traces[0].confidence[0]: 1 confidences where traces[0].accepted[0] says 3 drafts"),
    ([0, 0], [[], []], "no position holds a confidence: nothing to study"),
    ([], [], "traces[0].accepted holds no positions"),
    ([1, 0], [[0.5]], "traces[0].confidence: expected one array of confidences per position (2), found 1 entries"),
])
def test_bad_traces_are_one_line_naming_the_field(accepted, confidence, needle, tmp_path):
    """A value out of range, of another type, an array too long, more drafts accepted than confidences,
    a file with nothing to study or an empty trace: one line naming the field, exit 1, no traceback."""
    f = _file(tmp_path, [{"kind": "code", "text": "a", "accepted": accepted, "confidence": confidence}])
    r = subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout
    assert needle in r.stderr and "Traceback" not in r.stderr
