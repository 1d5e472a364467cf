"""The numpy reference: cache paths agree with one-shot prefill, the indexer agrees across paths,
rollback is exact, and bad input is refused (spec ds4.md §6 tests 1–3).

Tolerances.  In ``transformers`` mode the only difference between a 200-token prefill and 200
one-token decodes is float32 summation order (batched vs single-row matmuls, softmax sums);
measured ≤ 1.1e-5 on logits with std ≈ 2.4, so 1e-4 is the bound.  In ``ds4`` mode the KV rows
additionally go through E4M3 (3 mantissa bits): when summation order moves a lane across a rounding
boundary the stored value changes by one E4M3 step, which moved logits by ≤ 2e-3 in measurement;
the bound is 1e-2, still two orders below the logit spread, and the greedy tokens must agree exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4tui.engine import reference as R
from ds4tui.engine.gguf_model import NonFiniteError

N_PROMPT = 200
TOL = {"transformers": 1e-4, "ds4": 1e-2}


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return np.random.default_rng(5).integers(0, 129280, N_PROMPT).tolist()


@pytest.fixture(scope="module", params=["transformers", "ds4"])
def runs(request, tiny_q2, prompt):
    """One-shot prefill and token-by-token decode of the same prompt, with indexer logs."""
    model = R.ReferenceModel(tiny_q2["model"], numerics=request.param)
    one = model.new_state(log_indexer=True)
    full = model.forward(one, prompt, logits="all", capture=range(model.config.n_layer))
    dec = model.new_state(log_indexer=True)
    rows, hid = [], []
    for t in prompt:
        r = model.forward(dec, [t], capture=[model.config.n_layer - 1])
        rows.append(r.logits[0])
        hid.append(r.hidden[model.config.n_layer - 1][0])
    return {"mode": request.param, "model": model, "full": full, "one": one, "dec_logits": np.stack(rows),
            "dec_hidden": np.stack(hid), "dec": dec}


def test_decode_matches_one_shot_prefill(runs):
    tol = TOL[runs["mode"]]
    full = runs["full"].logits
    assert full.shape == (N_PROMPT, 129280)
    err = np.abs(runs["dec_logits"] - full).max(axis=1)
    assert err.max() < tol, f"worst position {err.argmax()}: {err.max()}"
    assert np.array_equal(runs["dec_logits"].argmax(1), full.argmax(1))
    last = runs["model"].config.n_layer - 1
    assert np.abs(runs["dec_hidden"] - runs["full"].hidden[last]).max() < tol


@pytest.mark.parametrize("chunks", [
    [37, 37, 37, 37, 52],  # aligned with nothing (window 16, ratios 4 and 16)
    [64, 64, 64, 8],  # aligned with the window and both ratios except the tail
    [16] * 12 + [8],  # exactly one window per chunk
    [3, 1, 5, 191],  # tiny chunks at the start: windows close across chunk boundaries
])
def test_chunked_prefill_matches_one_shot(runs, prompt, chunks):
    model = runs["model"]
    st = model.new_state(log_indexer=True)
    parts, i = [], 0
    for n in chunks:
        parts.append(model.forward(st, prompt[i:i + n], logits="all").logits)
        i += n
    assert i == N_PROMPT
    err = np.abs(np.concatenate(parts) - runs["full"].logits).max()
    assert err < TOL[runs["mode"]], err
    # compressed rows and index keys are the same rows, whatever the chunking
    for a, b in zip(st.layers, runs["one"].layers):
        if a.comp is not None:
            assert a.comp.shape == b.comp.shape
            assert np.abs(a.comp - b.comp).max() < TOL[runs["mode"]]
    assert st.indexer_log.keys() == runs["one"].indexer_log.keys()


def test_prefill_helper_chunks_and_reports_progress(runs, prompt):
    model = runs["model"]
    seen = []
    r = model.prefill(model.new_state(), prompt, chunk=64, logits="all", progress=lambda d, t: seen.append((d, t)))
    assert seen == [(64, 200), (128, 200), (192, 200), (200, 200)]
    assert np.abs(r.logits - runs["full"].logits).max() < TOL[runs["mode"]]
    last = model.prefill(model.new_state(), prompt, chunk=50).logits
    assert last.shape == (1, 129280)
    assert np.abs(last[0] - runs["full"].logits[-1]).max() < TOL[runs["mode"]]


def test_indexer_selection_same_in_prefill_and_decode(runs):
    c = runs["model"].config
    one, dec = runs["one"].indexer_log, runs["dec"].indexer_log
    csa = [L for L in range(c.n_layer) if c.layer_kind(L).value == "CSA"]
    assert set(one) == set(dec) == {(L, p) for L in csa for p in range(N_PROMPT)}
    differ = [k for k in one if one[k][0] != dec[k][0]]
    assert all(one[k][1] for k in differ), f"selections differ without a near-tie at {differ[:5]}"
    assert len(differ) == 0, differ
    # the indexer really discarded rows: at the last position 50 rows are visible, 8 kept
    for L in csa:
        chosen, _ = one[(L, N_PROMPT - 1)]
        assert len(chosen) == c.indexer_top_k
        assert max(chosen) < N_PROMPT // 4
    # and before 36 tokens every visible row is kept (the "all visible" branch)
    assert one[(csa[0], 20)][0] == tuple(range(21 // 4))


def test_truncate_is_exact_rollback(runs, prompt):
    model = runs["model"]
    st = model.new_state()
    model.forward(st, prompt[:150])
    model.forward(st, np.random.default_rng(9).integers(0, 129280, 23).tolist())  # rejected tokens
    model.truncate(st, 150)
    assert st.n_tokens == 150
    r = model.forward(st, prompt[150:], logits="all")
    assert np.abs(r.logits - runs["full"].logits[150:]).max() < TOL[runs["mode"]]
    with pytest.raises(ValueError, match="truncate"):
        model.truncate(st, 500)


def test_errors_leave_the_state_unchanged(tiny_q2):
    model = R.ReferenceModel(tiny_q2["model"])
    st = model.new_state(n_ctx=10)
    model.forward(st, [1, 2, 3])
    with pytest.raises(R.ContextOverflowError, match="3 tokens in the cache \\+ 8 new > context size 10"):
        model.forward(st, list(range(8)))
    with pytest.raises(R.TokenRangeError, match="token id 129280 is outside the vocabulary 0..129279"):
        model.forward(st, [5, 129280])
    with pytest.raises(R.TokenRangeError, match="-1"):
        model.forward(st, [-1])
    with pytest.raises(ValueError, match="capture layer 6"):
        model.forward(st, [5], capture=[6])
    with pytest.raises(ValueError, match="numerics must be one of"):
        R.ReferenceModel(tiny_q2["model"], numerics="fast")
    with pytest.raises(TypeError, match="integers"):
        model.forward(st, [1.5])
    with pytest.raises(TypeError, match="not a string"):
        model.forward(st, "12")
    with pytest.raises(ValueError, match="non-empty"):
        model.prefill(st, [])
    with pytest.raises(R.TokenRangeError):  # checked before the first chunk runs
        model.prefill(st, [1, 2, 129280], chunk=2)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        model.prefill(st, [1, 2], chunk=0)
    with pytest.raises(TypeError, match="capture layer must be an integer"):
        model.forward(st, [5], capture=[2.5])
    with pytest.raises(TypeError, match="truncate length"):
        model.truncate(st, True)
    with pytest.raises(ValueError, match="context size must be >= 1"):
        model.new_state(0)
    assert st.n_tokens == 3 and st.layers[0].kv.shape[0] == 3
    model.forward(st, list(range(7)))  # exactly fills the context
    assert st.n_tokens == 10


def test_nonfinite_weight_is_named(tiny_q2, tmp_path):
    from gguf import GGMLQuantizationType as T

    from tests.gguf_edit import rewrite

    norm = np.ones(256, np.float32)
    norm[17] = np.nan
    bad = rewrite(tiny_q2["model"], tmp_path / "nan.gguf",
                  replace_tensors={"blk.1.attn_norm.weight": (norm, T.F32)})
    model = R.ReferenceModel(bad)
    with pytest.raises(NonFiniteError) as e:
        model.forward(model.new_state(), [1, 2])
    assert "blk.1.attn_norm.weight" in str(e.value) and "nan.gguf" in str(e.value)
    assert "1 non-finite" in str(e.value)


def test_rope_yarn_table_matches_spec(tiny_q2):
    """Spec ds4.md §2.3: with 64 rope dims, base 160000, factor 16, orig 65536: pairs 0–15 keep the
    base frequency, 16–24 blend with t = (k − 15)/10, 25–31 are divided by 16."""
    c = R.ReferenceModel(tiny_q2["model"]).config
    rope = R.Rope(c, compressed=True)
    base = 160000.0 ** (-2 * np.arange(32) / 64)
    np.testing.assert_allclose(rope.freq[:16], base[:16], rtol=1e-12)
    np.testing.assert_allclose(rope.freq[25:], base[25:] / 16, rtol=1e-12)
    t = (np.arange(16, 25) - 15) / 10
    np.testing.assert_allclose(rope.freq[16:25], base[16:25] * (1 - t) + base[16:25] / 16 * t, rtol=1e-12)
    plain = R.Rope(c, compressed=False)
    np.testing.assert_allclose(plain.freq, 10000.0 ** (-2 * np.arange(32) / 64), rtol=1e-12)
    x = np.random.default_rng(0).standard_normal((3, 2, 128)).astype(np.float32)
    pos = np.array([0, 7, 190])
    y = rope.apply(x, pos)
    assert np.array_equal(y[..., :64], x[..., :64])  # only the tail rotates
    np.testing.assert_allclose(rope.apply(y, pos, inverse=True), x, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(y[..., 64:], axis=-1), np.linalg.norm(x[..., 64:], axis=-1), rtol=1e-5)


def test_other_shapes_come_from_the_config(tmp_path_factory):
    """Nothing is tied to the tiny shapes: head 256 (three FP8 blocks), HCA ratio 128, 8 experts.

    Windows of 128 close at positions 127 and 255; the last 10 tokens are decoded one at a time
    across the second closing and must match the one-shot prefill.
    """
    from ds4tui.devtools import make_test_model as mtm

    r = mtm.make(tmp_path_factory.mktemp("tiny128"), config="tiny128", seed=4, layers=4, experts=8, types="q2")
    model = R.ReferenceModel(r["model"])
    c = model.config
    assert (c.head_dim, c.compress_ratios, c.n_expert) == (256, (0, 0, 4, 128), 8)
    ids = np.random.default_rng(6).integers(0, 129280, 260).tolist()
    one = model.new_state()
    full = model.forward(one, ids, logits="all").logits
    st = model.new_state()
    rows = [model.forward(st, ids[:250], logits="all").logits]
    rows += [model.forward(st, [t]).logits for t in ids[250:]]
    assert np.abs(np.concatenate(rows) - full).max() < TOL["ds4"]
    assert one.layers[3].comp.shape == st.layers[3].comp.shape == (2, 256)
    assert one.layers[2].comp.shape == (65, 256) and one.layers[2].idx_keys.shape == (65, 128)
