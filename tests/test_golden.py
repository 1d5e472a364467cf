"""The reference in ``transformers`` numerics reproduces transformers' DeepSeek V4.

Golden vectors come from ``tools/golden.py`` (transformers 5.23 ``DeepseekV4ForCausalLM``, fp32, eager
attention) on the tiny seed-0 checkpoint; the reference reads the ``--types f32`` GGUF converted from
the same checkpoint, so both sides hold identical weights.

Tolerance 1e-4 on logits.  Both sides compute in float32 with the same formulas; what differs is
summation order (BLAS blocking, einsum vs bmm, softmax sums), which measured ≤ 7e-6 over the three
prompts, against a logit std of 2.4 and max |logit| 13.1.  1e-4 leaves >10× headroom for other BLAS
builds while any genuine error — a RoPE pair off by one, an eps in the wrong place, a misordered
Sinkhorn pass, a wrong compressor window — moves logits by 1e-2 or more.  Greedy tokens must agree at
every position whose top-1/top-2 gap exceeds twice the tolerance (the smallest recorded gap is 6.5e-4,
so in practice everywhere).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from ds4tui.engine import reference as R

GOLDEN = Path(__file__).parent / "golden"
TOL = 1e-4
N_PROMPTS = 3


@pytest.fixture(scope="module")
def golden():
    meta = json.loads((GOLDEN / "tiny_seed0.json").read_text())
    with np.load(GOLDEN / "tiny_seed0.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


@pytest.fixture(scope="module")
def model(tiny_f32, golden):
    meta, _ = golden
    digest = hashlib.sha256(Path(tiny_f32["hf"], "model.safetensors").read_bytes()).hexdigest()
    assert digest == meta["sha256"]["model.safetensors"], (
        "the tiny test model is no longer the one the golden vectors were made from; "
        "regenerate them with `python tools/golden.py` (needs torch and transformers)")
    return R.ReferenceModel(tiny_f32["model"], numerics="transformers")


def test_golden_files_are_small_and_complete(golden):
    meta, a = golden
    assert sum(p.stat().st_size for p in GOLDEN.iterdir()) < 5 * 2**20
    assert meta["versions"]["transformers"] >= "5.17"
    for i in range(N_PROMPTS):
        assert 200 <= a[f"p{i}_ids"].size <= 300
        assert a[f"p{i}_top_ids"].shape == (a[f"p{i}_ids"].size, 32)
        assert a[f"p{i}_gen_ids"].size == meta["n_gen"]


def test_prompts_render_to_the_golden_ids(golden, tokenizer_json):
    """Our chat template still produces the token ids transformers was given."""
    from ds4tui.engine.tokenizer import Tokenizer, render_chat

    meta, a = golden
    tok = Tokenizer.from_tokenizer_json(tokenizer_json)
    for i, p in enumerate(meta["prompts"]):
        kw = {k: v for k, v in meta["render"].items() if k in ("think", "add_generation_prompt")}
        ids = render_chat(tok, p["messages"], **kw)
        assert list(ids) == a[f"p{i}_ids"].tolist()


def _check_rows(logits: np.ndarray, top_ids: np.ndarray, top_logits: np.ndarray, where: str) -> float:
    got = np.take_along_axis(logits, top_ids.astype(np.int64), axis=1)
    err = np.abs(got - top_logits)
    assert err.max() < TOL, f"{where}: worst row {err.max(axis=1).argmax()} off by {err.max()}"
    gap = top_logits[:, 0] - top_logits[:, 1]
    decided = gap > 2 * TOL
    assert np.array_equal(logits.argmax(1)[decided], top_ids[decided, 0]), f"{where}: greedy token differs"
    return float(err.max())


@pytest.mark.parametrize("i", range(N_PROMPTS))
def test_prefill_logits_match_transformers(model, golden, i):
    _, a = golden
    ids = a[f"p{i}_ids"].tolist()
    r = model.forward(model.new_state(), ids, logits="all")
    _check_rows(r.logits, a[f"p{i}_top_ids"], a[f"p{i}_top_logits"], f"prompt {i} prefill")
    for k, p in enumerate(a[f"p{i}_full_pos"].tolist()):  # complete 129280-wide rows
        assert np.abs(r.logits[p] - a[f"p{i}_full"][k]).max() < TOL


@pytest.mark.parametrize("i", range(N_PROMPTS))
def test_cached_decode_matches_transformers(model, golden, i):
    """Chunked prefill, then one-token decode steps; windows slide and compressors close mid-decode."""
    _, a = golden
    ids, gen = a[f"p{i}_ids"].tolist(), a[f"p{i}_gen_ids"].tolist()
    st = model.new_state()
    rows = [model.prefill(st, ids, chunk=100).logits[0]]
    for t in gen[:-1]:
        rows.append(model.forward(st, [t]).logits[0])
    logits = np.stack(rows)
    _check_rows(logits, a[f"p{i}_gen_top_ids"], a[f"p{i}_gen_top_logits"], f"prompt {i} decode")
    assert logits.argmax(1).tolist() == gen
    if i == 0:
        assert np.abs(logits[-1] - a["p0_gen_full"][0]).max() < TOL
