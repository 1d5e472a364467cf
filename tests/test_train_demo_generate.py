"""tools/train_demo.py's greedy continuations with the target's KV cache (``--distill-kv-cache on``).

Oracle: the same function without the cache, which runs the whole sequence again for every new token
(float32, so that both pick from logits equal up to rounding).  The continuations cross the demo
shape's 64-token sliding window and its compressors' windows.  Needs torch and transformers (not
ds4tui dependencies): skipped without them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import train_demo as T  # noqa: E402


def test_cached_continuations_equal_the_recomputed_ones(tmp_path):
    c = T.demo_config()
    seen = np.zeros(c.n_vocab, np.uint8)
    seen[:2000] = 1
    model = T.build_target(c, seen, tmp_path, 3, "cpu")
    g = torch.Generator().manual_seed(5)
    prompts = torch.randint(0, 2000, (3, 40), generator=g)
    plain = T.generate_greedy(model, prompts, 60, chunk=2, kv_cache=False, bf16=False)
    cached = T.generate_greedy(model, prompts, 60, chunk=2, kv_cache=True, bf16=False)
    assert plain.shape == cached.shape == (3, 100)
    assert torch.equal(plain[:, :40], prompts)
    assert torch.equal(cached, plain)
    assert len(set(plain[:, 40:].flatten().tolist())) > 3  # the continuations are not one repeated token


def test_a_budget_stops_between_chunks(tmp_path):
    c = T.demo_config()
    model = T.build_target(c, np.ones(c.n_vocab, np.uint8), tmp_path, 3, "cpu")
    prompts = torch.randint(0, 1000, (4, 8), generator=torch.Generator().manual_seed(1))
    out = T.generate_greedy(model, prompts, 3, chunk=2, seconds=0.0, bf16=False)
    assert out.shape == (2, 11)  # one chunk always runs; no second one starts after the budget
