"""DSpark in the native engine (spec dspark.md §2.5 reference layout, §3, §6, §7.3).

Oracles: DSpark off (greedy output must be identical token for token — the verify pass uses the
same batch-invariant kernels as one-token decoding, so this is exact, not approximate) and the
numpy reference drafter (``reference.speculative_generate``: same proposals, same per-cycle
acceptance, same confidences).  Random support files mostly miss; the fitted support
(``fitted_support`` fixture, ``ds4tui.devtools.fit_support``) really drafts.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4tui.devtools import make_test_model as mtm
from ds4tui.engine import reference as R
from ds4tui.engine import session as S
from ds4tui.engine.backend import SamplingParams
from ds4tui.engine.stats import NO_DRAFT_REASONS
from gguf_edit import rewrite, to_dflash

N_TOKENS = 200
N_PROMPTS = 5


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(2024)
    return [rng.integers(100, 128000, int(n)).tolist() for n in rng.integers(20, 60, N_PROMPTS)]


PROMPTS = _prompts()


def _run(engine: S.Engine, prompt, n: int, **knobs):
    """Greedy generation of n tokens; returns (tokens, DSparkStats, tokens that came from drafts)."""
    s = engine.session(len(prompt) + n + 8)
    if knobs:
        s.set_dspark(**knobs)
    s.prefill(prompt)
    out, drafted = [], 0
    while len(out) < n:
        r = s.step(min(S.STEP_MAX, n - len(out)))
        drafted += len(r) - 1
        out += r
    st = s.dspark_stats()
    s.close()
    return out[:n], st, drafted


@pytest.fixture(scope="module", params=["ds4", "transformers"])
def numerics(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def plain(tiny_q2, numerics):
    """Target-only greedy continuations (no support model loaded)."""
    e = S.Engine(tiny_q2["model"], numerics=numerics)
    return [_run(e, p, N_TOKENS)[0] for p in PROMPTS]


def _assert_clean(st, *, what: str) -> None:
    assert st.check_invariants() == [], what
    assert sum(st.draft_len_hist) == st.cycles and sum(st.accepted_len_hist) == st.cycles
    assert sum(st.no_draft_reasons.values()) == st.no_draft
    assert st.accepted_draft <= st.proposed


def test_greedy_identical_with_random_support(tiny_q2, numerics, plain):
    """A random drafter mostly misses: every miss and partial accept must leave the output unchanged."""
    e = S.Engine(tiny_q2["model"], numerics=numerics, support=tiny_q2["support"])
    assert e.support_status == "attached", e.support_message
    total_cycles = total_miss = 0
    for p, want in zip(PROMPTS, plain):
        got, st, drafted = _run(e, p, N_TOKENS, scheduler=False, max_draft=2)
        assert got == want
        _assert_clean(st, what=f"prompt of {len(p)}")
        assert st.proposed > 0 and drafted == st.accepted_draft
        total_cycles += st.cycles
        total_miss += st.miss_first
    assert total_miss > 0.3 * total_cycles  # mostly misses, as a random drafter should


def test_greedy_identical_with_fitted_support(tiny_q2, fitted_support, numerics, plain):
    """A fitted drafter drafts for real: full, partial and miss_first cycles all occur."""
    e = S.Engine(tiny_q2["model"], numerics=numerics, support=fitted_support)
    assert e.support_status == "attached", e.support_message
    agg = {"full": 0, "partial": 0, "miss_first": 0, "proposed": 0, "accepted_draft": 0}
    for p, want in zip(PROMPTS, plain):
        got, st, drafted = _run(e, p, N_TOKENS, scheduler=False)
        assert got == want
        _assert_clean(st, what=f"prompt of {len(p)}")
        assert drafted == st.accepted_draft
        for k in agg:
            agg[k] += getattr(st, k)
    assert agg["full"] > 0 and agg["partial"] > 0 and agg["miss_first"] > 0, agg
    assert agg["accepted_draft"] > 0.2 * agg["proposed"], agg


@pytest.mark.parametrize("policy", ["confidence", "acceptance"])
def test_greedy_identical_under_either_scheduler_policy(tiny_q2, fitted_support, numerics, plain, policy):
    """The scheduler's policy (spec dspark.md §7.6) decides only what is verified, never what is emitted:
    with the scheduler on under either one the output is the target's own, and every cycle is counted
    once (a proposal the confidence policy cuts to nothing is a plain cycle, ``confidence_cut``)."""
    e = S.Engine(tiny_q2["model"], numerics=numerics, support=fitted_support)
    total = {"drafted": 0, "cut": 0}
    for p, want in zip(PROMPTS, plain):
        got, st, drafted = _run(e, p, N_TOKENS, scheduler=True, policy=policy)
        assert got == want
        _assert_clean(st, what=f"prompt of {len(p)}")
        assert drafted == st.accepted_draft
        total["drafted"] += st.cycles - st.no_draft
        total["cut"] += st.no_draft_reasons["confidence_cut"]
    assert total["drafted"] > 0, total
    if policy == "acceptance":
        assert total["cut"] == 0  # only the confidence policy cuts a proposal to nothing


def test_the_policy_is_a_live_knob_logged_with_the_others(tiny_q2):
    """Sessions start with the confidence policy (or the one asked for); a change applies at the next
    cycle and the knob log holds it; a policy the engine does not have is refused by name."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    assert e.session(64).dspark.policy == "confidence" == S.DEFAULT_SCHEDULER_POLICY
    s = e.session(256, policy="acceptance")
    assert s.dspark == S.DSparkKnobs(True, True, 0.0, 5, "acceptance")
    s.prefill(PROMPTS[1])
    s.step()
    s.step(6)
    assert s.set_dspark(policy="confidence").policy == "confidence"
    s.step(6)
    ev = s.dspark_events()
    assert [(x.cycle, x.knobs.policy) for x in ev] == [(1, "confidence")]
    with pytest.raises(ValueError, match="scheduler policy must be one of acceptance, confidence, got 'greedy'"):
        s.set_dspark(policy="greedy")
    with pytest.raises(ValueError, match="scheduler policy must be one of acceptance, confidence, got 'x'"):
        e.session(64, policy="x")
    assert s.dspark.policy == "confidence"
    s.close()


def test_engine_drafter_matches_reference(tiny_q2):
    """Same proposals, same per-cycle acceptance and confidences as the numpy reference drafter."""
    prompt, n = PROMPTS[0], 24
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(len(prompt) + n + 24)
    s.set_dspark(scheduler=False)
    s.prefill(prompt)
    out = s.step()
    cycles = []
    while len(out) < n + 12:  # past n, so that no compared cycle is clipped by the budget
        r = s.step()
        cycles.append((len(r) - 1, *s.last_proposal()))
        out += r
    ref = R.ReferenceModel(tiny_q2["model"])
    res = R.speculative_generate(ref, R.ReferenceDrafter(ref, tiny_q2["support"]), prompt, n)
    assert out[:n] == res.tokens
    # the reference clips its last cycles' drafts to the n tokens it was asked for
    compared, emitted = [], 1
    for i, c in enumerate(res.cycles):
        if n - emitted >= 5:
            compared.append(i)
        emitted += 1 + c.accepted
    assert len(compared) >= len(res.cycles) - 2 and len(compared) > 10
    for i, ((acc, drafts, conf), rc) in enumerate(zip(cycles, res.cycles)):
        if i not in compared:
            continue
        assert acc == rc.accepted, i
        assert drafts == rc.proposed[:len(drafts)] and len(drafts) >= 1, i
        np.testing.assert_allclose(conf, rc.confidence[:len(conf)], atol=1e-3, err_msg=f"cycle {i}")


def test_threshold_one_gates_every_cycle(tiny_q2):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(128)
    s.set_dspark(scheduler=False, threshold=1.0)
    s.prefill(PROMPTS[1])
    drafted = sum(len(s.step()) - 1 for _ in range(30))
    st = s.dspark_stats()
    assert st.proposed == 0 and drafted == 0
    assert st.no_draft == st.cycles == 29
    assert st.no_draft_reasons == {**{r: 0 for r in NO_DRAFT_REASONS}, "confidence_gate": 29}
    assert st.dominant_no_draft_reason == "confidence_gate"
    assert sum(st.conf_hist) == 29  # c_1 is still computed and recorded every cycle
    # every cycle was a plain decode: nothing saved, and the drafter passes are the whole loss
    assert st.t_decode_measured and st.t_decode_ms == pytest.approx(st.target / 29)
    assert st.saved == 0 and st.net_saved == pytest.approx(-st.propose, abs=1e-6)


def test_savings_unknown_until_a_plain_decode_is_measured(tiny_q2, fitted_support):
    e = S.Engine(tiny_q2["model"], support=fitted_support)
    s = e.session(256)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPTS[0])
    s.step()
    for _ in range(3):
        s.step()
    st = s.dspark_stats()
    assert st.no_draft == 0 and not st.t_decode_measured and st.saved == 0 and st.net_saved == 0
    s.set_dspark(enabled=False)
    s.step()
    st = s.dspark_stats()
    assert st.t_decode_measured and st.t_decode_ms == pytest.approx(st.target)
    assert st.saved == pytest.approx(st.accepted_draft * st.t_decode_ms)
    want = (st.cycles + st.accepted_draft) * st.t_decode_ms - (st.target + st.propose + st.spec_total)
    assert st.net_saved == pytest.approx(want)


def test_disabled_counts_every_cycle(tiny_q2):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    _, st, _ = _run(e, PROMPTS[1], 20, enabled=False)
    assert st.cycles == st.no_draft == st.no_draft_reasons["disabled"] == 19
    assert st.propose == 0 and st.proposed == 0


def test_knobs_apply_at_the_next_cycle(tiny_q2):
    """Changes take effect at the next cycle boundary and are logged with that cycle's number."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(256)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPTS[2])
    s.step()
    for _ in range(4):
        s.step(1 + 5)
    st = s.dspark_stats()
    assert st.cycles == 4 and st.no_draft == 0 and st.proposed == 20
    s.set_dspark(threshold=1.0)
    assert s.dspark.threshold == 1.0 and s.dspark_stats().n_events == 1  # not applied until a cycle runs
    for _ in range(3):
        s.step(6)
    st = s.dspark_stats()
    assert st.no_draft_reasons["confidence_gate"] == 3 and st.proposed == 20
    s.set_dspark(enabled=False)
    s.step(6)
    s.set_dspark(enabled=True, threshold=0.0, max_draft=2)
    s.step(6)
    st = s.dspark_stats()
    assert st.no_draft_reasons["disabled"] == 1 and st.proposed == 22 and st.cycles == 9
    ev = s.dspark_events()
    assert [x.cycle for x in ev] == [0, 4, 7, 8]
    assert ev[1].knobs == S.DSparkKnobs(True, False, 1.0, 5)
    assert ev[2].knobs.enabled is False and ev[3].knobs == S.DSparkKnobs(True, False, 0.0, 2)
    s.close()


@pytest.mark.parametrize("op", ["attention", "moe", "main_proj", "markov", "confidence"])
def test_forced_op_failure_is_counted_with_its_name(tiny_q2, op):
    e0 = S.Engine(tiny_q2["model"])
    want = _run(e0, PROMPTS[3], 25)[0]
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(256)
    s.set_dspark(scheduler=False)
    s.dspark_fail_op(op)
    got = list(s.generate(PROMPTS[3], max_tokens=25))
    st = s.dspark_stats()
    assert got == want
    # every cycle but the last (one token of budget left: no room for a draft) fails at the op
    assert st.no_room == 1 and st.cycles == 24
    assert st.chain_fail == st.no_draft_reasons["chain_fail"] == 23
    assert st.chain_fail_op == op and st.proposed == 0
    assert st.check_invariants() == []


def test_capture_invalid_is_a_named_reason(tiny_q2):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(256)
    s.dspark_fail_op("capture")
    list(s.generate(PROMPTS[0], max_tokens=8))
    st = s.dspark_stats()
    assert st.no_draft_reasons["capture_invalid"] == st.cycles == 7 and st.propose == 0


def test_no_room(tiny_q2):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(256)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPTS[0])
    s.step()
    s.step(1)  # a budget of one token leaves no room for a draft
    st = s.dspark_stats()
    assert st.no_room == st.no_draft_reasons["no_room"] == st.cycles == 1
    s.close()


def test_context_end_clips_drafts(tiny_q2):
    """Drafts never run past the context: the verify pass is clipped to the room that is left."""
    prompt = PROMPTS[0]
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(len(prompt) + 4)
    s.set_dspark(scheduler=False)
    s.prefill(prompt)
    out = s.step()
    with pytest.raises(S.ContextOverflowError):
        while True:
            out += s.step()
    assert len(s.tokens) == len(prompt) + 4
    st = s.dspark_stats()
    assert max(i for i, c in enumerate(st.draft_len_hist) if c) <= 3
    assert st.check_invariants() == []


def test_scheduler_backs_off_from_an_unprofitable_drafter(tiny_q2):
    """A random drafter accepts almost nothing: the scheduler (the default policy) skips most cycles, but
    proposes again after each back-off."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    got, st, _ = _run(e, PROMPTS[4], 150)
    e0 = S.Engine(tiny_q2["model"])
    assert got == _run(e0, PROMPTS[4], 150)[0]
    assert st.scheduler_skips > st.cycles // 2
    assert st.proposed > 0  # back-offs end with a proposal
    assert st.t_decode_measured and st.t_decode_ms > 0
    assert st.check_invariants() == []
    # Stage times in the unit each is spent in: verify over the cycles that verified a draft, not
    # over every cycle (which, with most cycles skipped, hid what one verify costs).
    t = st.stage_timing()
    drafted = st.full + st.partial + st.miss_first
    assert t["drafted_cycles"] == drafted == sum(st.draft_len_hist[1:]) > 0
    assert t["verify_ms_per_drafted_cycle"] == pytest.approx(st.verify / drafted)
    assert t["verify_ms_per_drafted_cycle"] > 2 * st.verify / st.cycles  # fewer than half the cycles drafted
    assert t["plain_decodes"] == st.no_draft == st.cycles - drafted
    assert t["decode_ms_per_plain_decode"] == pytest.approx(st.target / st.no_draft) == pytest.approx(st.t_decode_ms)
    assert t["verify_over_decode"] == pytest.approx(t["verify_ms_per_drafted_cycle"] / st.t_decode_ms)
    # threshold 0 and no chain failure: the drafter ran exactly in the drafted cycles and in those whose
    # proposal the confidence policy cut to nothing
    assert t["drafter_passes"] == drafted + st.no_draft_reasons["confidence_cut"]
    assert t["ms_per_drafter_pass"]["propose"] == pytest.approx(st.propose / t["drafter_passes"])
    assert t["ms_per_drafter_pass"]["prop_chain"] == pytest.approx(st.prop_chain / t["drafter_passes"])


def test_multi_turn_truncate_keeps_drafting_exact(tiny_q2):
    """Truncating (editing a turn) and continuing keeps the capture ring consistent."""
    def turns(engine, knobs):
        s = engine.session(512)
        if knobs:
            s.set_dspark(**knobs)
        a = list(s.generate(PROMPTS[0], max_tokens=30))
        s.truncate(len(s.tokens) - 12)
        b = list(s.generate(PROMPTS[1][:10], max_tokens=30))
        return a, b, s

    want = turns(S.Engine(tiny_q2["model"]), None)[:2]
    a, b, s = turns(S.Engine(tiny_q2["model"], support=tiny_q2["support"]), {"scheduler": False})
    assert (a, b) == want
    st = s.dspark_stats()
    assert st.proposed > 0 and st.no_draft_reasons["capture_invalid"] == 0


def test_dflash_support_drafts_the_same(tiny_q2, tmp_path):
    """llama.cpp's dflash layout of the same weights gives the same drafts (spec dspark.md §12)."""
    p = to_dflash(tiny_q2["support"], tmp_path / "dflash.gguf")
    runs = []
    for sup in (tiny_q2["support"], p):
        e = S.Engine(tiny_q2["model"], support=sup)
        assert e.support_status == "attached", e.support_message
        runs.append(_run(e, PROMPTS[2], 20, scheduler=False))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1].accepted_len_hist == runs[1][1].accepted_len_hist
    assert runs[0][1].conf_hist == runs[1][1].conf_hist


def test_expert_count_mismatch_refused_at_load(tiny_q2, tmp_path):
    p = mtm.write_support(tmp_path / "experts8.gguf", mtm.tiny_config(), 0, types="f16", n_expert=8)
    e = S.Engine(tiny_q2["model"], support=p)
    assert e.support_status == "refused"
    assert str(p) in e.support_message
    assert "support has 8 experts (mtp.0.ffn_gate_inp.weight), target deepseek4.expert_count = 16" in e.support_message
    want = _run(S.Engine(tiny_q2["model"]), PROMPTS[1], 12)[0]
    got, st, _ = _run(e, PROMPTS[1], 12)
    assert got == want
    assert st.no_draft_reasons["support_invalid"] == st.cycles == 11 and st.propose == 0
    s = e.session(64)
    assert s.dspark.enabled is False
    with pytest.raises(S.StateError, match="refused"):
        s.set_dspark(enabled=True)


def test_nonfinite_support_weights_refused(tiny_q2, tmp_path):
    bad = np.ones(256, np.float32)
    bad[5] = np.nan
    p = rewrite(tiny_q2["support"], tmp_path / "nan.gguf", replace_tensors={"mtp.0.main_norm.weight": (bad, None)})
    e = S.Engine(tiny_q2["model"], support=p)
    assert e.support_status == "refused"
    assert "tensor 'mtp.0.main_norm.weight': 1 non-finite (NaN/Inf) values in F32 data" in e.support_message
    assert "nonfinite=1" in e.support_message


def test_knob_values_are_checked(tiny_q2):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(64)
    for bad in ({"threshold": 1.5}, {"threshold": float("nan")}, {"max_draft": 0}, {"max_draft": 6},
                {"max_draft": 2.5}):
        with pytest.raises(ValueError):
            s.set_dspark(**bad)
    assert s.dspark == S.DSparkKnobs(True, True, 0.0, 5)
    with pytest.raises(S.StateError, match="no DSpark support model"):
        S.Engine(tiny_q2["model"]).session(64).set_dspark(enabled=True)


def test_starting_knobs_and_stats_line(tiny_q2, capsys):
    """ds4's DS4_DSPARK_SCHEDULER=0, DS4_DSPARK_MAX_DRAFT_TOKENS=2 and DS4_DSPARK_STATS=1, as the
    command line passes them: the session starts with those knobs (not logged as a change) and
    prints ds4's line when it closes."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(128, scheduler=False, max_draft=2, print_stats=True)
    assert s.dspark == S.DSparkKnobs(True, False, 0.0, 2) and s.dspark_events() == []
    list(s.generate(PROMPTS[0], max_tokens=10))
    st = s.dspark_stats()
    s.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"DSpark stats cycles={st.cycles} first_tokens={st.cycles} ")
    assert max(i for i, c in enumerate(st.draft_len_hist) if c) == 2


def test_memory_accounts_for_the_drafter(tiny_q2):
    m0 = S.Engine(tiny_q2["model"]).session(256).memory()
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    m1 = e.session(256).memory()
    assert m1.weights > m0.weights  # the support tensors the engine reads
    assert m1.scratch > m0.scratch + 5 * 129280 * 4  # base/corrected logits and verify rows


def test_sampling_matches_target_only_distribution(tiny_q2, fitted_support):
    """Rejection sampling (spec dspark.md §3.2) keeps the target's distribution.

    Small controlled case: temperature 1 with top-k 3, so each position has at most 3 outcomes;
    the first two generated tokens (the second can come from an accepted draft) form at most 9
    categories.  A chi-square test of homogeneity between DSpark on and off must not reject at
    the 0.1% level (fixed seeds, so the verdict is reproducible); the DSpark arm must really have
    accepted sampled drafts, or the test would prove nothing.
    """
    from scipy.stats import chi2_contingency

    prompt = PROMPTS[2]
    n_runs = 300

    def pairs(engine, knobs):
        s = engine.session(len(prompt) + 16)
        if knobs:
            s.set_dspark(**knobs)
        s.prefill(prompt[:-1])
        counts: dict[tuple[int, int], int] = {}
        for seed in range(n_runs):
            s.truncate(len(prompt) - 1)
            s.set_sampling(S.SamplingParams(temperature=1.0, top_k=3, seed=seed))
            s.prefill(prompt[-1:])
            out = s.step()
            out += s.step(2)
            key = (out[0], out[1])
            counts[key] = counts.get(key, 0) + 1
        st = s.dspark_stats() if knobs else None
        return counts, st

    off, _ = pairs(S.Engine(tiny_q2["model"]), None)
    on, st = pairs(S.Engine(tiny_q2["model"], support=fitted_support), {"scheduler": False})
    assert st.accepted_draft > n_runs // 10 and st.proposed == n_runs
    keys = sorted(set(off) | set(on))
    table = np.array([[off.get(k, 0) for k in keys], [on.get(k, 0) for k in keys]])
    assert len(keys) >= 3
    _, p_value, _, _ = chi2_contingency(table)
    assert p_value > 1e-3, (keys, table.tolist())


def test_stop_token_inside_accepted_drafts(tiny_q2):
    """generate() stops at a stop token even when it arrives as an accepted draft; the session is
    left as if decoding had stopped there (that token pending, nothing after it kept)."""
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(256)
    s.set_dspark(scheduler=False)
    s.prefill(PROMPTS[0])
    out = s.step()
    stop = None
    while stop is None and len(out) < 120:
        r = s.step()
        if len(r) > 1 and r[0] not in out:
            stop = r[0]  # first emitted as an accepted draft, with more tokens after it in the step
        out += r
    assert stop is not None, "no accepted draft in 120 tokens"
    s.close()
    s = e.session(256)
    s.set_dspark(scheduler=False)
    got = list(s.generate(PROMPTS[0], max_tokens=200, stop=[stop]))
    assert got == out[:out.index(stop) + 1]
    assert s.pending == stop and s.tokens == PROMPTS[0] + got[:-1]
    more = list(s.generate(PROMPTS[1][:5], max_tokens=10))
    p = S.Engine(tiny_q2["model"]).session(256)
    want = list(p.generate(PROMPTS[0], max_tokens=200, stop=[stop]))
    assert want == got and list(p.generate(PROMPTS[1][:5], max_tokens=10)) == more


def test_bad_starting_knobs_are_errors_and_the_environment_is_not_read(tiny_q2, monkeypatch):
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    with pytest.raises(ValueError, match="max draft length 9 exceeds the support model's block size 5"):
        e.session(64, max_draft=9)
    for bad in ({"max_draft": -1}, {"max_draft": 2.0}, {"scheduler": "off"}):
        with pytest.raises(ValueError):
            e.session(64, **bad)
    # the engine layer reads no variable: the command line checks them (tests/test_environment.py)
    monkeypatch.setenv("DS4_DSPARK_SCHEDULER", "0")
    monkeypatch.setenv("DS4_DSPARK_MAX_DRAFT_TOKENS", "9")
    assert e.session(64).dspark == S.DSparkKnobs(True, True, 0.0, 5)


def test_reference_backend_reports_no_dspark(tiny_q2):
    s = S.Engine(tiny_q2["model"], backend="reference").session(64)
    assert s.dspark_stats() == S.DSparkStats() and s.dspark_events() == [] and s.last_proposal() == ([], [])
    with pytest.raises(S.StateError, match="reference backend decodes target-only"):
        s.set_dspark(enabled=True)
    with pytest.raises(S.BackendUnavailableError, match="--backend cpu"):
        S.Engine(tiny_q2["model"], backend="reference", support=tiny_q2["support"])


def test_knobs_change_while_a_step_runs(tiny_q2):
    """set_dspark does not wait for a running prefill (the C engine has its own lock)."""
    import threading
    import time

    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = e.session(2048, n_batch=2048)
    started = threading.Event()

    def long_prefill():
        started.set()
        s.prefill(np.random.default_rng(0).integers(100, 128000, 1500).tolist())

    t = threading.Thread(target=long_prefill)
    t.start()
    started.wait()
    time.sleep(0.2)
    t0 = time.perf_counter()
    s.set_dspark(threshold=0.5)
    waited = time.perf_counter() - t0
    still_running = t.is_alive()
    t.join()
    assert still_running and waited < 0.1, (still_running, waited)
    assert s.dspark.threshold == 0.5


_TIMES_AND_ROWS = {"propose", "snapshot", "verify", "spec_total", "target", "saved", "net_saved", "t_decode_ms",
                   "t_decode_measured", "verify_head_rows", "stage_timing"}


def _cycles(engine: S.Engine, prompt, n: int, temperature: float):
    """n tokens with the scheduler off (the drafted lengths then do not depend on timings), one step
    at a time; returns (tokens, the counters without times, [(drafts, accepted, head rows) per cycle])."""
    s = engine.session(len(prompt) + n + 8)
    s.set_dspark(scheduler=False)
    s.set_sampling(SamplingParams(temperature=temperature, top_k=8, seed=11))
    s.prefill(prompt)
    out, cycles, prev = [], [], s.dspark_stats()
    while len(out) < n:
        out += s.step(n - len(out))
        st = s.dspark_stats()
        cycles.append((st.proposed - prev.proposed, st.accepted_draft - prev.accepted_draft,
                       st.verify_head_rows - prev.verify_head_rows))
        prev = st
    s.close()
    assert st.check_invariants() == []
    counts = {k: v for k, v in st.to_dict().items() if k not in _TIMES_AND_ROWS and not k.startswith("prop_")}
    return out, counts, cycles


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_verify_head_lazy_is_all_and_computes_the_rows_acceptance_reaches(tiny_q2, fitted_support, temperature):
    """verify_head lazy (spec dspark.md §3.4) against all: the same tokens (greedy: also target-only's),
    the same sampled draws and every count the same; per cycle the LM-head rows computed are 1 + drafts
    under all, and under lazy min(3, 1 + drafts) unless the drafts of rows 0-2 were all accepted."""
    if temperature == 0.0:
        target = S.Engine(tiny_q2["model"])
        plain = [_run(target, p, 60)[0] for p in PROMPTS[:3]]
        target.close()
    runs = {}
    for mode in ("all", "lazy"):
        e = S.Engine(tiny_q2["model"], support=fitted_support, verify_head=mode)
        assert (e.verify_head, e.verify_head_note) == (mode, f"{mode}: chosen")
        runs[mode] = [_cycles(e, p, 60, temperature) for p in PROMPTS[:3]]
        e.close()
    seen = {"first_group_rejected": 0, "first_group_accepted": 0}
    for i, ((out_a, counts_a, cyc_a), (out_l, counts_l, cyc_l)) in enumerate(zip(runs["all"], runs["lazy"])):
        assert out_l == out_a
        if temperature == 0.0:
            assert out_l == plain[i]
        assert counts_l == counts_a
        assert [c[:2] for c in cyc_l] == [c[:2] for c in cyc_a]
        for (nd, a, rows_all), (_, _, rows_lazy) in zip(cyc_a, cyc_l):
            assert rows_all == (nd + 1 if nd else 0)
            if nd + 1 <= S.VERIFY_HEAD_FIRST or not nd:
                want = rows_all
            else:
                first_ok = a >= S.VERIFY_HEAD_FIRST
                seen["first_group_accepted" if first_ok else "first_group_rejected"] += 1
                want = nd + 1 if first_ok else S.VERIFY_HEAD_FIRST
            assert rows_lazy == want, (nd, a, rows_lazy)
    assert seen["first_group_rejected"] > 0 and seen["first_group_accepted"] > 0, seen


def test_verify_head_option_is_checked(tiny_q2):
    with pytest.raises(ValueError, match="verify_head must be auto or one of all, lazy, got 'some'"):
        S.Engine(tiny_q2["model"], verify_head="some")
    with pytest.raises(S.BackendUnavailableError, match="verify_head lazy runs on the cpu backend only"):
        S.Engine(tiny_q2["model"], backend="reference", verify_head="lazy")
    e = S.Engine(tiny_q2["model"], backend="cpu")  # f32 activations: the head is bound by its arithmetic
    assert e.verify_head == "lazy" and e.verify_head_note.startswith("auto: lazy on the cpu backend with f32 activations")
    q = S.Engine(tiny_q2["model"], backend="cpu", activations="auto")  # q8 on the cpu: bound by its weight read
    assert q.verify_head == "all" and q.verify_head_note.startswith("auto: all on the cpu backend with q8 activations")
    assert S.Engine(tiny_q2["model"], backend="cpu", activations="q8", verify_head="lazy").verify_head == "lazy"
    r = S.Engine(tiny_q2["model"], backend="reference")
    assert r.verify_head == "all" and r.verify_head_note == "auto: all on the reference backend (it does not draft)"


def test_the_confidence_threshold_reads_back_as_the_decimal_it_was_set_to(tiny_q2):
    """The C engine holds the threshold as a float32; the knobs and the knob log give it back as the
    shortest decimal of that float32 (what --json and compare print), not as its double expansion."""
    eng = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    s = eng.session(64)
    assert float(np.float32(0.3)) == 0.30000001192092896  # what a plain float() of the C field gives
    s.set_dspark(threshold=0.3)
    s.prefill([101, 2024, 777, 31337])
    s.step()
    s.step()  # a cycle: the change is applied and logged
    assert s.dspark.threshold == 0.3 and s.dspark_events()[-1].knobs.threshold == 0.3
    s.set_dspark(threshold=0.05)
    assert s.dspark.threshold == 0.05
    s.close()
    eng.close()
