"""The native sampler (``ds4_kernel_sample``: the engine's ``ds4_sample``) against the numpy
sampler of the reference backend (``ds4tui.engine.backend.sample_reference``): the same
candidates in the same order (decreasing logit, ties to the lower id, -0.0 equal to +0.0), the
same top-k / top-p / min-p cuts and the same draws from the same splitmix64 stream, on logits
full of ties, on the vocabulary's full width and with -inf rows (a draft vocabulary's)."""

from __future__ import annotations

import numpy as np
import pytest

from ds4tui.engine.backend import SamplingParams, sample_reference

native = pytest.importorskip("ds4tui._native")
ffi, lib = native.ffi, native.lib

VOCAB = 129280


def c_sample(logits: np.ndarray, p: SamplingParams, state: list[int]) -> int:
    """One draw of the native sampler; advances state[0] as the engine's stream does."""
    x = np.ascontiguousarray(logits, np.float32)
    sp = ffi.new("ds4_sampling *", {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
                                    "min_p": p.min_p, "seed": 0})
    rng = ffi.new("uint64_t *", state[0])
    tok = lib.ds4_kernel_sample(ffi.cast("float *", ffi.from_buffer(x)), x.size, sp, rng)
    state[0] = int(rng[0])
    return int(tok)


def draws_agree(logits: np.ndarray, p: SamplingParams, n: int, seed: int) -> list[int]:
    a, b = [seed], [seed]
    picks = []
    for _ in range(n):
        got, want = c_sample(logits, p, a), sample_reference(logits, p, b)
        assert got == want, (p, got, want)
        assert a == b
        picks.append(got)
    return picks


def tied_logits(n: int, rng: np.random.Generator) -> np.ndarray:
    """Few distinct values, so most candidates tie with others: the order's ties decide the draws."""
    x = np.round(rng.normal(0.0, 2.0, n) * 2.0) / 2.0
    return x.astype(np.float32)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 1.0, 0.0), (40, 1.0, 0.0), (1, 1.0, 0.0), (0, 0.9, 0.0),
                                              (0, 1.0, 0.05), (300, 0.5, 0.02), (4999, 1.0, 0.0),
                                              (5000, 0.95, 0.0), (7000, 1.0, 0.0)])
def test_draws_equal_the_reference_on_tied_logits(temperature, top_k, top_p, min_p):
    logits = tied_logits(5000, np.random.default_rng(11))
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    picks = draws_agree(logits, p, 40, seed=12345 + top_k)
    if top_k == 1:  # the first of the tied maxima
        assert set(picks) == {int(np.flatnonzero(logits == logits.max())[0])}


def test_negative_zero_ties_positive_zero_and_the_lower_id_comes_first():
    logits = np.full(64, -3.0, np.float32)
    logits[[5, 9, 40]] = [np.float32(-0.0), np.float32(0.0), np.float32(-0.0)]
    p = SamplingParams(temperature=1.0, top_k=3)
    picks = draws_agree(logits, p, 200, seed=7)
    assert set(picks) == {5, 9, 40}  # three equal candidates, each drawn
    assert draws_agree(logits, SamplingParams(temperature=1.0, top_k=1), 5, seed=7) == [5] * 5


def test_full_vocabulary_with_minus_infinity_rows():
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 3.0, VOCAB).astype(np.float32)
    logits[rng.choice(VOCAB, VOCAB - 16384, replace=False)] = -np.inf  # outside a draft vocabulary
    for p in (SamplingParams(temperature=0.8), SamplingParams(temperature=0.7, top_k=40),
              SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=1.2, min_p=0.1)):
        picks = draws_agree(logits, p, 12, seed=99)
        assert all(np.isfinite(logits[t]) for t in picks)


def test_greedy_is_the_argmax_and_draws_nothing():
    logits = tied_logits(1000, np.random.default_rng(5))
    state = [42]
    assert c_sample(logits, SamplingParams(temperature=0.0), state) == int(np.argmax(logits))
    assert state == [42]


def test_bad_arguments_are_refused():
    x = np.zeros(8, np.float32)
    px = ffi.cast("float *", ffi.from_buffer(x))
    rng = ffi.new("uint64_t *", 1)
    good = ffi.new("ds4_sampling *", {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0})
    assert lib.ds4_kernel_sample(px, 0, good, rng) < 0
    assert lib.ds4_kernel_sample(ffi.NULL, 8, good, rng) < 0
    for bad in ({"top_p": 0.0}, {"min_p": 1.5}, {"top_k": -1}, {"temperature": float("nan")}):
        sp = ffi.new("ds4_sampling *", {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0, **bad})
        assert lib.ds4_kernel_sample(px, 8, sp, rng) < 0, bad
    assert rng[0] == 1  # nothing was drawn
