"""tools/train_demo.py's SeenHead: the cross-entropy over the whole vocabulary from the seen ids' rows.

Oracle: ``torch.nn.functional.cross_entropy`` over every row of the same head (float32), its
gradients and its clipping norm.  Needs torch (not a ds4tui dependency): skipped without it.
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

V, H, N = 50, 8, 12


def _case(seed: int = 0, unseen_target: bool = False):
    g = torch.Generator().manual_seed(seed)
    seen = np.zeros(V, np.uint8)
    seen[[0, 3, 4, 9, 10, 11, 20, 33, 47]] = 1
    w = torch.randn(V, H, generator=g)
    w[torch.from_numpy(seen == 0)] = torch.randn(H, generator=g)  # equal unseen rows, as build_target keeps them
    h = torch.randn(N, H, generator=g)
    targets = torch.from_numpy(np.flatnonzero(seen)[torch.randint(0, int(seen.sum()), (N,), generator=g).numpy()])
    if unseen_target:
        targets[-1] = 5  # held-out text: an id training never saw
    return seen, w, h, targets


def test_a_held_out_target_never_seen_in_training_has_the_full_loss():
    seen, w, h, targets = _case(unseen_target=True)
    with torch.no_grad():
        full = torch.nn.functional.cross_entropy(h @ w.t(), targets)
        assert float(T.SeenHead(w, seen).loss(h, targets)) == pytest.approx(float(full), rel=1e-6)


def test_the_loss_and_its_gradients_equal_the_full_vocabulary_ones():
    seen, w0, h0, targets = _case()
    w_full, h_full = w0.clone().requires_grad_(), h0.clone().requires_grad_()
    full = torch.nn.functional.cross_entropy(h_full @ w_full.t(), targets)
    full.backward()
    w_seen, h_seen = w0.clone().requires_grad_(), h0.clone().requires_grad_()
    head = T.SeenHead(w_seen, seen)
    loss = head.loss(h_seen, targets)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(full.detach()), rel=1e-6)
    assert torch.allclose(h_seen.grad, h_full.grad, atol=1e-6)
    ids, unseen = np.flatnonzero(seen), np.flatnonzero(seen == 0)
    assert torch.allclose(w_seen.grad[ids], w_full.grad[ids], atol=1e-6)
    # the representative row gets one unseen row's gradient; the full loss gives each unseen row that one
    assert torch.allclose(w_seen.grad[head.rep], w_full.grad[unseen[0]], atol=1e-6)
    assert torch.allclose(w_full.grad[unseen], w_full.grad[unseen[0]].expand(len(unseen), H), atol=1e-6)
    assert float(w_seen.grad[unseen[1:]].abs().max()) == 0.0
    # the clipping norm counts the other unseen rows
    total_full = torch.cat([w_full.grad.reshape(-1), h_full.grad.reshape(-1)]).norm()
    sq = w_seen.grad.pow(2).sum() + h_seen.grad.pow(2).sum() + head.extra_sq()
    assert float(sq.sqrt()) == pytest.approx(float(total_full), rel=1e-6)


def test_a_clipped_adamw_step_equals_the_full_vocabulary_step():
    seen, w0, h0, targets = _case(1)
    results = []
    for use_seen in (False, True):
        w, h = torch.nn.Parameter(w0.clone() * 40), torch.nn.Parameter(h0.clone())  # large logits: clipping acts
        opt = torch.optim.AdamW([w, h], lr=1e-2, weight_decay=0.1)
        head = T.SeenHead(w, seen) if use_seen else None
        for _ in range(3):
            opt.zero_grad()
            loss = head.loss(h, targets) if use_seen else torch.nn.functional.cross_entropy(h @ w.t(), targets)
            loss.backward()
            norm = T.clip_with_unseen_rows([w, h], head) if use_seen else torch.nn.utils.clip_grad_norm_([w, h], 1.0)
            assert float(norm) > 1.0  # the case clips
            opt.step()
            if use_seen:
                head.tie()
        results.append((w.detach().clone(), h.detach().clone()))
    (wf, hf), (ws, hs) = results
    assert torch.allclose(ws, wf, atol=1e-5) and torch.allclose(hs, hf, atol=1e-5)


def test_unequal_unseen_rows_are_refused_by_name():
    seen, w, _, _ = _case()
    w[5, 0] += 0.5
    with pytest.raises(ValueError, match="unseen rows differ by up to 0.5"):
        T.SeenHead(w, seen)


def test_rows_a_gguf_trained_elsewhere_keeps_count_as_seen():
    """A target trained on a corpus that showed ids 1 and 2 (own rows) and never 9 (the shared row),
    continued on one that shows 9 and not 1, 2: 1 and 2 join the seen ids, 9 stays seen, and the
    SeenHead over the result equals the full cross-entropy (it would refuse the corpus's own set)."""
    seen, w, h, targets = _case()
    old_seen = seen.copy()
    old_seen[[1, 2]], old_seen[9] = 1, 0
    w[[1, 2]] = torch.randn(2, H, generator=torch.Generator().manual_seed(7))  # trained on the first corpus
    w[torch.from_numpy(old_seen == 0)] = w[5].clone()  # the shared row of the first corpus's unseen ids
    with pytest.raises(ValueError, match="unseen rows differ"):
        T.SeenHead(w, seen)
    out, added = T.seen_with_distinct_rows(seen, w)
    assert added == 2 and sorted(np.flatnonzero(out != seen)) == [1, 2] and seen[1] == 0  # seen untouched
    with torch.no_grad():
        full = torch.nn.functional.cross_entropy(h @ w.t(), targets)
        assert float(T.SeenHead(w, out).loss(h, targets)) == pytest.approx(float(full), rel=1e-6)
