"""The reference DSpark drafter and greedy verification (spec dspark.md §2–§3)."""

from __future__ import annotations

import numpy as np
import pytest

from ds4tui.devtools import make_test_model as mtm
from ds4tui.engine import reference as R
from ds4tui.engine.convert import write_support_gguf

N_NEW = 40


@pytest.fixture(scope="module")
def target(tiny_q2):
    return R.ReferenceModel(tiny_q2["model"])


@pytest.fixture(scope="module")
def prompt():
    return np.random.default_rng(11).integers(0, 129280, 60).tolist()


@pytest.fixture(scope="module")
def greedy(target, prompt):
    return R.greedy_generate(target, prompt, N_NEW)


def prefilled(target, drafter, prompt):
    st = target.new_state()
    r = target.forward(st, prompt, capture=drafter.capture_layers)
    ds = drafter.new_state()
    drafter.add_context(ds, np.arange(len(prompt)), r.hidden)
    return st, ds, int(r.logits[0].argmax())


def test_accept_greedy_is_the_longest_matching_prefix():
    assert R.accept_greedy([5, 6, 7], [5, 6, 7, 9]) == 3
    assert R.accept_greedy([5, 6, 7], [5, 6, 8, 9]) == 2
    assert R.accept_greedy([5, 6, 7], [4, 6, 7, 9]) == 0  # a later match does not count
    assert R.accept_greedy([], [3]) == 0
    assert R.accept_greedy([5, 1, 7, 8], [5, 2, 7, 8, 0]) == 1


def test_drafter_is_deterministic(target, tiny_q2, prompt):
    a = R.ReferenceDrafter(target, tiny_q2["support"])
    b = R.ReferenceDrafter(R.ReferenceModel(tiny_q2["model"]), tiny_q2["support"])
    _, ds_a, anchor = prefilled(target, a, prompt)
    _, ds_b, anchor_b = prefilled(b.target, b, prompt)
    assert anchor == anchor_b
    p1, p2, p3 = a.propose(ds_a, anchor), a.propose(ds_a, anchor), b.propose(ds_b, anchor)
    for p in (p2, p3):
        assert p.greedy == p1.greedy
        assert np.array_equal(p.confidence, p1.confidence)
        assert np.array_equal(p.base_logits, p1.base_logits)
    assert len(p1.greedy) == a.block_size == 5
    assert p1.positions.tolist() == list(range(len(prompt), len(prompt) + 5))
    assert np.all((p1.confidence > 0) & (p1.confidence < 1))
    assert p1.base_logits.shape == (5, 129280) and p1.hidden.shape == (5, 256)


def test_confidence_threshold_cuts_at_the_first_low_position(target, tiny_q2, prompt):
    dr = R.ReferenceDrafter(target, tiny_q2["support"])
    _, ds, anchor = prefilled(target, dr, prompt)
    full = dr.propose(ds, anchor)
    conf = full.confidence
    for thr in sorted(set(conf.tolist())) + [0.0, 1.0]:
        cut = next((k for k in range(5) if conf[k] < thr), 5)
        p = dr.propose(ds, anchor, threshold=thr)
        assert p.tokens == full.greedy[:cut]
    assert dr.propose(ds, anchor, threshold=1.0).tokens == []
    short = dr.propose(ds, anchor, block=2)  # a shorter block is a different (non-causal) pass
    assert len(short.greedy) == 2 and short.positions.tolist() == [len(prompt), len(prompt) + 1]
    with pytest.raises(ValueError, match="block must be 1..5"):
        dr.propose(ds, anchor, block=6)


def test_speculative_output_equals_greedy_and_accepts_the_longest_prefix(target, tiny_q2, prompt, greedy):
    dr = R.ReferenceDrafter(target, tiny_q2["support"])
    res = R.speculative_generate(target, dr, prompt, N_NEW)
    assert res.tokens == greedy
    # replay the cycles against the greedy sequence: each cycle's anchor sits at some index i of
    # the output; its accepted drafts must be exactly the longest prefix of the proposal that
    # matches greedy[i+1:], and its bonus the greedy token right after them.
    i = 0
    for cyc in res.cycles:
        assert greedy[i] == cyc.anchor
        want = R.accept_greedy(cyc.proposed, greedy[i + 1:] + [-1] * 10)
        room = N_NEW - i - 1
        assert cyc.accepted == min(want, room)
        i += 1 + cyc.accepted
        if i < N_NEW:
            assert cyc.bonus == greedy[i]
    assert i >= N_NEW - 1
    assert sum(1 + c.accepted for c in res.cycles) >= N_NEW - 1


def test_threshold_one_never_drafts_and_still_decodes_greedy(target, tiny_q2, prompt, greedy):
    dr = R.ReferenceDrafter(target, tiny_q2["support"])
    res = R.speculative_generate(target, dr, prompt, 12, threshold=1.0)
    assert res.tokens == greedy[:12]
    assert all(c.proposed == [] and c.accepted == 0 for c in res.cycles)


def bigram_support(path, c, greedy_seq, rank=64):
    """A support GGUF whose drafts follow the bigram table of ``greedy_seq``.

    ``norm.weight`` = 0 makes the base logits U exactly 0, so each draft token is
    ``argmax(W2 · W1[prev])``: W1 maps each token of the sequence to a scaled one-hot code and W2
    maps that code to the token that follows it.
    """
    succ: dict[int, int] = {}
    for a, b in zip(greedy_seq, greedy_seq[1:]):
        assert succ.setdefault(a, b) == b, "the greedy sequence is not a function of the previous token"
    codes = {tok: i for i, tok in enumerate(succ)}
    assert len(codes) <= rank
    rng = np.random.default_rng(3)
    params = mtm.support_params(c, rank)

    def weights(spec):
        w = mtm.random_weight(spec, rng, c)
        if spec.name.endswith(".norm.weight") and spec.name.startswith("mtp.2."):
            return np.zeros_like(w)
        if spec.name.endswith("markov_w1.weight"):
            w = np.zeros(spec.shape, np.float32)
            for tok, i in codes.items():
                w[tok, i] = 50.0
        if spec.name.endswith("markov_w2.weight"):
            w = np.zeros(spec.shape, np.float32)
            for tok, i in codes.items():
                w[succ[tok], i] = 1.0
        return w

    return write_support_gguf(path, c, params, weights, types="f32", name="bigram-forced")


def test_forced_drafts_are_fully_accepted_every_cycle(target, prompt, greedy, tmp_path):
    # the greedy continuation must be predictable from the previous token alone for the bigram
    # table to force it; use the longest such prefix (the test model's greedy text qualifies).
    succ, n = {}, len(greedy)
    for i, (a, b) in enumerate(zip(greedy, greedy[1:])):
        if succ.setdefault(a, b) != b:
            n = i + 1
            break
    assert n >= 16, f"greedy text becomes non-bigram after {n} tokens; choose another prompt"
    path = bigram_support(tmp_path / "forced.gguf", target.config, greedy[:n])
    dr = R.ReferenceDrafter(target, path)
    res = R.speculative_generate(target, dr, prompt, n)
    assert res.tokens == greedy[:n]
    assert len(res.cycles) >= 3
    for cyc in res.cycles:
        assert cyc.proposed, "no draft"
        assert cyc.accepted == len(cyc.proposed) or cyc is res.cycles[-1], cyc
    assert all(len(c.proposed) == 5 and c.accepted == 5 for c in res.cycles[:-1])


def test_drafter_refuses_an_incompatible_support(target, tmp_path):
    from ds4tui.engine.gguf_model import SupportInvalidError

    bad = mtm.write_support(tmp_path / "bad.gguf", target.config, 0, types="f32", n_expert=8)
    with pytest.raises(SupportInvalidError, match="expert"):
        R.ReferenceDrafter(target, bad)


def test_add_context_must_continue_the_window(target, tiny_q2, prompt):
    dr = R.ReferenceDrafter(target, tiny_q2["support"])
    st, ds, anchor = prefilled(target, dr, prompt)
    assert ds.last_pos == len(prompt) - 1 and ds.rows[0].shape == (16, 128)  # window = sliding_window
    assert ds.pos.tolist() == list(range(len(prompt) - 16, len(prompt)))
    h = {L: np.zeros((2, 256), np.float32) for L in dr.capture_layers}
    with pytest.raises(ValueError, match="continue at position 60"):
        dr.add_context(ds, np.array([61, 62]), h)
    with pytest.raises(ValueError, match="no context yet"):
        dr.propose(dr.new_state(), anchor)
    with pytest.raises(ValueError, match="capture layer\\(s\\) \\[3, 5\\] missing"):
        dr.add_context(ds, np.array([60, 61]), {4: h[4]})
    with pytest.raises(ValueError, match="must be \\[3, 256\\]"):
        dr.add_context(ds, np.array([60, 61, 62]), h)
    with pytest.raises(R.TokenRangeError):
        dr.propose(ds, -1)
    with pytest.raises(ValueError, match="finite"):
        dr.propose(ds, anchor, threshold=float("nan"))
    assert ds.last_pos == len(prompt) - 1  # refused calls changed nothing
