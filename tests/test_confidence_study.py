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
    2, 4, 8 positions: 1.5 + 2 + 1.5 + 4 + 1.5 + 3 = 13.5 ms for 12 tokens."""
    assert cs.simulate([5] * 12, [[1.0] * 5] * 12, 12, COSTS, 5, "confidence cut") == pytest.approx(4.0)
    assert cs.simulate([5] * 12, [[1.0] * 5] * 12, 12, COSTS, 5, "target") == pytest.approx(12.0)
    assert cs.simulate([0] * 12, [[0.05] * 5] * 12, 12, COSTS, 5, "confidence cut") == pytest.approx(13.5)
    # without the scheduler every cycle verifies five drafts and accepts none: 12 x (0.5 + 1.5)
    assert cs.simulate([0] * 12, [[0.05] * 5] * 12, 12, COSTS, 5, "no scheduler") == pytest.approx(24.0)


def test_the_cut_stops_where_the_next_draft_costs_more_than_it_brings():
    """c = (0.9, 0.9, 0.2, ...): two drafts bring 1 + 0.9 + 0.81 = 2.71 tokens for 1.2 ms (2.26 a ms);
    a third adds 0.162 for 0.1 ms more (2.19 a ms): the cut is 2.  The first draft accepted, the
    second not: 2 tokens for 0.5 + 1.2 ms."""
    conf = [0.9, 0.9, 0.2, 0.2, 0.2]
    assert cs.expected_tokens(conf, 2) == pytest.approx(2.71)
    assert cs.best_cut(conf, COSTS) == 2
    assert cs.simulate([1, 0], [conf, conf], 2, COSTS, 5, "confidence cut") == pytest.approx(1.7)


def test_calibration_bins_and_auc():
    """c_1 of accepted first drafts 0.9 and 0.8 against rejected 0.1 and 0.85: three of the four pairs
    ordered right (AUC 0.75); the bins count the anchors and their accepted drafts."""
    traces = [{"accepted": [3, 1, 0, 0], "confidence": [[0.9], [0.8], [0.1], [0.85]]}]
    cal = cs.calibration(traces, 4)
    assert cal["anchors"] == 4 and cal["auc_c1"] == pytest.approx(0.75)
    assert {(b["c1_from"], b["anchors"], b["first_accepted"], b["mean_accepted"]) for b in cal["bins"]} == {
        (0.1, 1, 0.0, 0.0), (0.8, 2, 0.5, 0.5), (0.9, 1, 1.0, 3.0)}
    assert math.isnan(cs.auc([0.5], []))


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
    assert "traces[0].confidence: expected one array of confidences per position (12)" in r.stderr
    assert "scheduler_replay.py record" in r.stderr
    f = _file(tmp_path, [{"kind": "code", "text": "a", "accepted": [5] * 2, "confidence": [[1.0] * 5, [1.5]]}])
    r = subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "traces[0].confidence[1]: expected at most 5 numbers in [0, 1], found [1.5]" in r.stderr
