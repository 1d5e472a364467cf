"""The drafter's confidences as a signal before the verify (issue 24): how well a proposal's c_1 .. c_B
predict what the target accepts, and what a scheduler that cuts each proposal by them would give, on
the traces ``tools/scheduler_replay.py record`` writes (their ``confidence`` arrays: every draft's raw
c_k, spec dspark.md §2.4, at each anchor position).

    python tools/confidence_study.py TRACES.json [--tokens 255] [--json]

Prints the calibration of c_1 (bins of 0.1: anchors, the share whose first draft the target accepted,
the mean accepted drafts), the AUC of c_1 for "the first draft is accepted", and per policy the rate
over target-only decoding of each trace at the file's costs (min, mean, traces below 0.99).  The
policies are simulated here in Python; neither is the engine's scheduler (``scheduler_replay.py
replay`` replays that one on the same file):

- no scheduler: every cycle proposes and verifies the block, cut to the tokens the answer has left
  (``replay``'s arm of that name: at most left - 1 drafts, a plain decode without a proposal for the
  last token);
- confidence cut: a cycle proposes, then verifies the n drafts (0..the block, cut as above) whose
  expected tokens 1 + sum_{k<=n} prod_{j<=k} c_j per ms of a verify of n + 1 rows is best, if that
  beats a plain decode's 1 per t_decode (the proposal is spent either way; n = 0: the cycle ends in a
  plain decode).  A cycle that verified nothing or had no draft accepted skips the proposals of the
  next b positions (b = 2 at the start, doubling to 128 at each such cycle, back to 2 after a cycle
  that accepted a draft).  It prices with the file's costs from its first cycle, where the engine's
  fresh scheduler measures them first (``replay``'s "after" arms start from kept prices).

Not a test: CI runs only its unit tests (tests/test_confidence_study.py); tools/cpu_notes.md records
what it printed.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scheduler_replay beside this file

from scheduler_replay import (DEFAULT_REPLAY_TOKENS, TraceError, _count, check_confidence, load_traces,  # noqa: E402
                              quiet_broken_pipe)

from ds4tui.engine.replay import Costs  # noqa: E402

POLICIES = ("no scheduler", "confidence cut")
"""The simulated policies (module docstring), besides target-only decoding."""

#: Back-off of the confidence cut: positions skipped after the first fruitless cycle, and at most.
BACKOFF_START, BACKOFF_MAX = 2, 128


def expected_tokens(conf, n: int) -> float:
    """Tokens a verify of the first ``n`` drafts emits in expectation when c_k is the chance that
    draft k is accepted once the drafts before it were: 1 + sum_{k<=n} prod_{j<=k} c_j."""
    e, p = 1.0, 1.0
    for c in conf[:n]:
        p *= c
        e += p
    return e


def best_cut(conf, costs: Costs) -> int:
    """The drafts to verify (0: none, a plain decode) for the most expected tokens per ms."""
    best_n, best_rate = 0, 1.0 / costs.t_decode
    for n in range(1, len(conf) + 1):
        rate = expected_tokens(conf, n) / costs.t_verify[n + 1]
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n


def simulate(accepted, confidence, n_tokens: int, costs: Costs, block: int, policy: str) -> float:
    """Milliseconds to emit ``n_tokens`` tokens of one trace under ``policy`` ("target", "no
    scheduler" or "confidence cut", module docstring); a cycle at position p reads the trace at p.
    ValueError for another policy or a trace shorter than ``n_tokens``."""
    if policy not in ("target",) + POLICIES:
        raise ValueError(f"policy {policy!r}: expected one of target, {', '.join(POLICIES)}")
    if not 1 <= n_tokens <= min(len(accepted), len(confidence)):
        raise ValueError(f"n_tokens {n_tokens}: expected 1..{min(len(accepted), len(confidence))} (the trace's "
                         f"positions)")
    t, pos, skip, backoff = 0.0, 0, 0, BACKOFF_START
    while pos < n_tokens:
        acc, conf = accepted[pos], confidence[pos]
        room = min(block, n_tokens - pos - 1)  # drafts the answer has tokens left for
        if policy == "target" or skip > 0 or room < 1:
            skip = max(0, skip - 1)
            t, pos = t + costs.t_decode, pos + 1
            continue
        t += costs.t_propose
        n = room if policy == "no scheduler" else best_cut(conf[:room], costs)
        got = min(acc, n)
        if n == 0:
            t, pos = t + costs.t_decode, pos + 1
        else:
            t, pos = t + costs.t_verify[n + 1], pos + 1 + got
        if policy == "confidence cut":
            if n > 0 and got > 0:
                backoff = BACKOFF_START
            else:
                skip, backoff = backoff, min(2 * backoff, BACKOFF_MAX)
    return t


def auc(pos_scores, neg_scores) -> float:
    """The chance that a random positive scores above a random negative (ties half); NaN without both."""
    if not pos_scores or not neg_scores:
        return math.nan
    neg = sorted(neg_scores)
    won = 0.0
    for s in pos_scores:
        lo, hi = bisect.bisect_left(neg, s), bisect.bisect_right(neg, s)
        won += lo + 0.5 * (hi - lo)
    return won / (len(pos_scores) * len(neg))


def calibration(traces: list[dict], n_tokens: int) -> dict:
    """Bins of c_1 over the first ``n_tokens`` positions of every trace: anchors, the share whose first
    draft was accepted and the mean accepted drafts; and the AUC of c_1 for a first draft accepted."""
    rows = [(c[0], a) for t in traces for a, c in zip(t["accepted"][:n_tokens], t["confidence"][:n_tokens]) if c]
    bins = []
    for b in range(10):
        sel = [a for c, a in rows if b / 10 <= c < (b + 1) / 10 or (b == 9 and c == 1.0)]
        if sel:
            bins.append({"c1_from": b / 10, "c1_to": (b + 1) / 10, "anchors": len(sel),
                         "first_accepted": sum(1 for a in sel if a >= 1) / len(sel), "mean_accepted": sum(sel) / len(sel)})
    a = auc([c for c, a in rows if a >= 1], [c for c, a in rows if a == 0])
    return {"anchors": len(rows), "bins": bins, "auc_c1": None if math.isnan(a) else a}


def study(costs: Costs, block: int, traces: list[dict], n_tokens: int) -> dict:
    """The calibration and each policy's rate over target-only per trace, with min, mean and count below 0.99."""
    out = {"tokens": n_tokens, "calibration": calibration(traces, n_tokens), "policies": {}}
    base = [simulate(t["accepted"], t["confidence"], n_tokens, costs, block, "target") for t in traces]
    for pol in POLICIES:
        rates = [b / simulate(t["accepted"], t["confidence"], n_tokens, costs, block, pol)
                 for b, t in zip(base, traces)]
        out["policies"][pol] = {"rates": rates, "min": min(rates), "mean": sum(rates) / len(rates),
                                "below_0_99": sum(1 for r in rates if r < 0.99)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The drafter's confidences against what the target accepted (calibration "
                                 "of c_1, its AUC) and a scheduler that verifies only the drafts they pay for, "
                                 "simulated on traces `tools/scheduler_replay.py record` wrote.")
    ap.add_argument("traces", type=Path, help="a file `tools/scheduler_replay.py record` wrote")
    ap.add_argument("--tokens", type=_count(1, 1 << 24), default=None,
                    help=f"tokens each simulated answer emits (default {DEFAULT_REPLAY_TOKENS}, or the shortest "
                    f"trace's positions when fewer)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the calibration and every "
                    "trace's rate per policy) instead of the tables")
    a = ap.parse_args(argv)
    try:
        costs, block, traces = load_traces(a.traces)
        check_confidence(a.traces, block, traces)
    except TraceError as exc:
        print(f"confidence_study: error: {exc}", file=sys.stderr)
        return 1
    shortest = min(len(t["accepted"]) for t in traces)
    n = a.tokens if a.tokens is not None else min(DEFAULT_REPLAY_TOKENS, shortest)
    if n > shortest:
        print(f"confidence_study: error: --tokens {n}: expected 1..{shortest} (the shortest trace's positions)",
              file=sys.stderr)
        return 2
    r = study(costs, block, traces, n)
    if a.json:
        print(json.dumps(r))
        return 0
    cal = r["calibration"]
    shown = "n/a (needs first drafts both accepted and rejected)" if cal["auc_c1"] is None else f"{cal['auc_c1']:.3f}"
    print(f"{len(traces)} traces, {n} tokens each; {cal['anchors']} anchors; AUC of c_1 for the first draft "
          f"accepted: {shown}")
    print("c_1 bin      anchors  first accepted  mean accepted")
    for b in cal["bins"]:
        close = "]" if b["c1_to"] == 1.0 else ")"
        print(f"[{b['c1_from']:.1f}, {b['c1_to']:.1f}{close}  {b['anchors']:7d}  {b['first_accepted']:14.3f}  "
              f"{b['mean_accepted']:13.2f}")
    for pol, p in r["policies"].items():
        print(f"{pol:15s} over target-only: min {p['min']:.3f}, mean {p['mean']:.3f}, below 0.99: "
              f"{p['below_0_99']} of {len(traces)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader went away (| head)
        quiet_broken_pipe()
