"""Fit the Markov and confidence heads of a DSpark support GGUF to its target, so that it drafts.

``ds4tui-fit-support MODEL.gguf SUPPORT_IN.gguf OUT.gguf [--prompts N] [--tokens N] [--rank R] [--scan N]
[--seed S] [--force] [--quiet]`` (also ``python -m ds4tui.devtools.fit_support``)

An existing OUT is replaced only with ``--force``: without it the command refuses it before anything
loads (exit status 2, one line naming the path), as ``ds4tui draft-vocab`` refuses an existing
``--out``.  OUT is never a folder, a device, MODEL or SUPPORT_IN, whatever the flag.

A random support model (``make_test_model``) proposes tokens the target almost never emits.  This
tool rewrites the two small heads at the end of the drafter (spec dspark.md §1, §2.4) and copies
every other tensor byte for byte, so greedy speculative decoding sees full, partial and
miss_first cycles at a realistic accept rate.

**Markov head: the target's zero-layer bigram.**  The vanilla head adds ``W2·W1[prev]`` to the
base logits U of each block row.  The fitted head puts ``α·x(v)`` in the first ``n_embd`` columns
of ``W1[v]``, with ``x(v) = output_norm ⊙ RMSNorm(token_embd[v])``, and the target's
``output.weight`` in the same columns of W2, so the bias after ``prev`` is ``α·L0(prev)``: the
logits the target would give if its layers added nothing to the embedding of its last token.
On the random test models the final hidden state is that embedding plus a ~10 % context part,
so ``argmax L0(v)`` is the target's greedy next token after ``v`` about 77 % of the time on text it
never saw.  Bigram counts from observed continuations reach only ~10 % on new prompts (a random
129280-token model seldom repeats a token), which is why the head is not fitted from counts.
``α`` is chosen so that the spread of U (random drafter stages through the target's LM head) is
1/:data:`BIAS_FACTOR` of the bias's spread: the draft is then ``argmax L0(prev)`` except at near ties.

**Confidence head: calibrated reliability of the bigram.**  Column ``n_embd`` of W1 holds
``ρ(v)``, W2 is zero there (no effect on the logits), and the confidence weight is 1 on that
column and 0 elsewhere (the h part is zero), so ``c_k = σ(ρ(x_{k-1}))``.  ``ρ(v)`` is the logit
of a logistic fit ``P(target's next token = argmax L0(v)) = σ(a + b·margin(v))`` where margin is
the gap between the two largest zero-layer logits; hits are counted on greedy continuations of
the target (native engine, random prompts of ordinary tokens).  Margins cost one ``[V, n_embd]``
product per token, so they are computed for the ``--scan`` tokens most likely to be emitted
(largest ``output.weight ⊙ output_norm`` rows) and the fitting tokens; other tokens get the mean
hit rate.  A threshold of 0.5 then cuts drafts after tokens with a small margin.

Measured on the tiny q2 test model with the defaults (two cores): bigram hit 75 % and predicted
accept_rate 44 % on the held-out continuations, margins for 62 % of held-out tokens; greedy
DSpark on new prompts accepts 44–52 % of the drafts (reference and native engine) with full,
partial and miss_first cycles, 50–57 % at threshold 0.5; the fit takes 1.5–2 minutes, half of it
the greedy continuations and half the margins.

The remaining columns of the rank are zero (the default rank ``n_embd + 32`` keeps W1/W2 in
Q8_0, whose blocks are 32 wide; another rank writes them as F16).  Metadata is the ds4 support
layout of spec dspark.md §4.1 with the new rank.  The fit is deterministic given ``--seed``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, GGUFWriter

from ds4tui.engine import layout as L
from ds4tui.engine.convert import (ConversionError, PlannedTensor, Progress, check_output_path, stderr_progress,
                                   write_gguf)
from ds4tui.engine.gguf_model import DS4Model, ModelFileError, SupportModel, field_value
from ds4tui.engine.quants import quantize
from ds4tui.engine.reference import Weights, rms_norm

BIAS_FACTOR = 100.0
"""Spread of the Markov bias over the (bound on the) spread of the drafter's base logits U."""

EXTRA_COLUMNS = 32
"""Default rank = n_embd + this: one reliability column, the rest zero, Q8_0-sized blocks."""

DEFAULT_SCAN = 32768
"""Tokens (most likely to be emitted first) whose zero-layer margin is computed."""

NORMAL_TOKEN = 1
"""``tokenizer.ggml.token_type`` of ordinary tokens: prompts are drawn from these."""

PROMPT_LENGTHS = (8, 32)
"""Prompt lengths are drawn uniformly from this closed range."""

_SCAN_CHUNK = 512  # rows per [chunk, V] float32 product: 265 MB at V = 129280


# ---- the target's zero-layer bigram --------------------------------------------------------


class ZeroLayerBigram:
    """``L0(v) = output.weight · (output_norm ⊙ RMSNorm(token_embd[v]))``: ``[V]`` logits per token.

    Holds the dequantised embedding and LM head of ``model`` (float32, ``2·V·n_embd·4`` bytes).
    """

    def __init__(self, model: DS4Model):
        c = model.config
        w = Weights(model.path, model.tensors)
        self.eps = c.rms_eps
        self.out = w.get("output.weight")          # [V, H]
        self.norm = w.get("output_norm.weight")    # [H]
        self.embd = w.get("token_embd.weight")     # [V, H]
        self.n_vocab, self.n_embd = self.out.shape
        self._next: dict[int, int] = {}

    def x(self, ids: np.ndarray) -> np.ndarray:
        """``output_norm ⊙ RMSNorm(token_embd[ids])``: ``[n, H]`` float32."""
        return rms_norm(self.embd[np.asarray(ids, dtype=np.int64)], self.eps, self.norm)

    def top2(self, ids: np.ndarray,
             progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """For each token in ``ids``: ``argmax L0`` (lowest id on ties) and the margin (top-1 − top-2 logit)."""
        ids = np.asarray(ids, dtype=np.int64)
        best = np.zeros(len(ids), np.int64)
        margin = np.zeros(len(ids), np.float32)
        n_chunks = -(-len(ids) // _SCAN_CHUNK)
        for k, s in enumerate(range(0, len(ids), _SCAN_CHUNK), 1):
            part = ids[s:s + _SCAN_CHUNK]
            scores = self.x(part) @ self.out.T
            rows = np.arange(len(part))
            top = scores.argmax(axis=1)
            first = scores[rows, top].copy()
            scores[rows, top] = -np.inf
            best[s:s + len(part)] = top
            margin[s:s + len(part)] = first - scores.max(axis=1)
            self._next.update(zip(part.tolist(), top.tolist()))
            if progress is not None:
                progress(k, n_chunks)
        return best, margin

    def prefetch(self, ids: Sequence[int]) -> None:
        """Compute ``argmax L0`` of every id in ``ids`` not yet known, in chunks (for :meth:`next`)."""
        todo = np.array(sorted(set(int(i) for i in ids) - set(self._next)), np.int64)
        for s in range(0, len(todo), _SCAN_CHUNK):
            part = todo[s:s + _SCAN_CHUNK]
            self._next.update(zip(part.tolist(), (self.x(part) @ self.out.T).argmax(axis=1).tolist()))

    def next(self, v: int) -> int:
        """``argmax L0(v)``, memoised."""
        v = int(v)
        if v not in self._next:
            self._next[v] = int(np.argmax(self.x([v])[0] @ self.out.T))
        return self._next[v]

    def emission_order(self) -> np.ndarray:
        """Token ids, most likely argmax of the target first (largest ``output.weight ⊙ output_norm`` row)."""
        score = np.linalg.norm(self.out * self.norm, axis=1)
        return np.argsort(-score, kind="stable")


# ---- data -------------------------------------------------------------------------------------


@dataclass
class Continuation:
    """A prompt and the target's greedy continuation of it (``tokens[0]`` follows the prompt)."""

    prompt: list[int]
    tokens: list[int]


def random_prompts(model: DS4Model, n: int, rng: np.random.Generator) -> list[list[int]]:
    """``n`` prompts of ordinary tokens (``token_type`` NORMAL), lengths uniform in :data:`PROMPT_LENGTHS`."""
    f = model.reader.fields.get("tokenizer.ggml.token_type")
    types = np.asarray(field_value(f)) if f is not None else np.full(model.config.n_vocab, NORMAL_TOKEN)
    pool = np.flatnonzero(types == NORMAL_TOKEN)
    if pool.size == 0:
        raise ValueError(f"{model.path}: no ordinary tokens (tokenizer.ggml.token_type == {NORMAL_TOKEN}) "
                         f"to draw prompts from")
    lo, hi = PROMPT_LENGTHS
    return [rng.choice(pool, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def greedy_continuations(model: DS4Model, prompts: Sequence[Sequence[int]], n_tokens: int,
                         progress: Progress | None = None) -> list[Continuation]:
    """The target's greedy continuations (``n_tokens`` each) from the native CPU engine."""
    from ds4tui.engine.session import Engine

    out: list[Continuation] = []
    with Engine(model) as eng:
        for i, p in enumerate(prompts, 1):
            s = eng.session(len(p) + n_tokens + 1)
            s.prefill(list(p))
            toks: list[int] = []
            while len(toks) < n_tokens:
                toks.extend(s.step())
            s.close()
            out.append(Continuation(list(p), toks[:n_tokens]))
            if progress is not None:
                progress(i, len(prompts), f"greedy continuation {i}/{len(prompts)} ({len(p)}-token prompt)")
    return out


# ---- calibration ------------------------------------------------------------------------------


def fit_logistic(x: np.ndarray, y: np.ndarray, *, ridge: float = 1e-3, iters: int = 50) -> tuple[float, float]:
    """``(a, b)`` of ``P(y) = σ(a + b·x)`` by Newton's method with a small ridge (finite for any data)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    X = np.stack([np.ones_like(x), x], axis=1)
    w = np.zeros(2)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        g = X.T @ (p - y) + ridge * w
        Hm = (X * (p * (1 - p))[:, None]).T @ X + ridge * np.eye(2)
        step = np.linalg.solve(Hm, g)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    return float(w[0]), float(w[1])


def _logit(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return math.log(p / (1 - p))


# ---- prediction ------------------------------------------------------------------------------


def simulate(conts: Sequence[Continuation], bigram: ZeroLayerBigram, rho: np.ndarray, block: int,
             threshold: float = 0.0) -> dict:
    """Greedy speculative cycles over the target's own continuations, drafts = the zero-layer chain.

    Mirrors :func:`ds4tui.engine.reference.speculative_generate` (anchor, proposal cut at the first
    ``σ(ρ(prev)) < threshold``, longest matching prefix, bonus), assuming the drafter's U never
    flips the bigram.  Returns the DSpark stat names of spec dspark.md §6: ``cycles``,
    ``proposed``, ``accepted_draft``, ``accept_rate`` (%), ``full``, ``partial``, ``miss_first``,
    ``no_draft``, plus ``cut`` (draft rows removed by the threshold).
    """
    st = dict(cycles=0, proposed=0, accepted_draft=0, full=0, partial=0, miss_first=0, no_draft=0, cut=0)
    for c in conts:
        toks, i = c.tokens, 0
        while i < len(toks) - 1:
            prev, prop = toks[i], []
            for _ in range(block):
                if 1.0 / (1.0 + math.exp(-float(rho[prev]))) < threshold:
                    break
                prev = bigram.next(prev)
                prop.append(prev)
            st["cut"] += block - len(prop)
            drafts = prop[:len(toks) - 1 - i]
            a = 0
            while a < len(drafts) and drafts[a] == toks[i + 1 + a]:
                a += 1
            st["cycles"] += 1
            st["proposed"] += len(prop)
            st["accepted_draft"] += a
            if not prop:
                st["no_draft"] += 1
            elif a == len(prop):
                st["full"] += 1
            elif a == 0:
                st["miss_first"] += 1
            else:
                st["partial"] += 1
            i += a + 1
    st["accept_rate"] = round(100.0 * st["accepted_draft"] / st["proposed"], 2) if st["proposed"] else 0.0
    return st


def bigram_hits(conts: Sequence[Continuation], bigram: ZeroLayerBigram) -> tuple[list[int], list[bool]]:
    """Every (prev, hit) of the continuations: ``hit`` = the next token is ``argmax L0(prev)``."""
    prevs, hits = [], []
    for c in conts:
        for a, b in zip(c.tokens, c.tokens[1:]):
            prevs.append(a)
            hits.append(bigram.next(a) == b)
    return prevs, hits


# ---- writing ----------------------------------------------------------------------------------


def _write_support(out: Path, target: L.DS4Config, sm: SupportModel, rank: int, fitted: dict[str, tuple[T, np.ndarray]],
                   description: str, progress: Progress | None, *, overwrite: bool = True) -> None:
    """The ds4 support layout (spec dspark.md §4.1 keys, ``rank`` as the Markov rank) with the ``fitted``
    tensors (type, encoded bytes) replaced; every other tensor is copied from ``sm`` as raw bytes
    (re-encoding from float32 would re-quantise the kept IQ2_XXS/Q2_K tensors).  Written by
    ``convert.write_gguf``: temporary file then rename, same errors (without ``overwrite``, a file
    that appeared at ``out`` meanwhile is not replaced).
    """
    m = sm.meta
    specs = L.support_tensor_specs(target, m.n_stages, len(m.target_layer_ids), rank)
    name_f = sm.reader.fields.get("general.name")
    name = (str(field_value(name_f)) if name_f is not None else sm.path.stem) + "-fitted"
    plan: list[PlannedTensor] = []
    for spec in specs:
        if spec.name in fitted:
            qt, data = fitted[spec.name]
            plan.append(PlannedTensor(spec, qt, lambda d=data: d, encoded=True))
        else:
            info = sm.tensors[spec.name]
            plan.append(PlannedTensor(replace(spec, shape=tuple(info.shape)), info.type, info.raw_bytes, encoded=True))

    def metadata(w: GGUFWriter) -> None:
        w.add_key_value("general.name", name, GGUFValueType.STRING)
        w.add_key_value("general.description", description, GGUFValueType.STRING)
        w.add_key_value("general.alignment", 32, GGUFValueType.UINT32)
        for key, v in (("dspark.block_size", m.block_size), ("dspark.markov_rank", rank),
                       ("dspark.noise_token_id", m.noise_token_id)):
            w.add_key_value(key, int(v), GGUFValueType.UINT32)
        w.add_key_value("dspark.target_layer_ids", [int(i) for i in m.target_layer_ids], GGUFValueType.ARRAY,
                        GGUFValueType.UINT32)
        for key, v in (("dspark.stage_count", m.n_stages), ("dspark.n_layers", m.n_stages),
                       ("dspark.expert_count", target.n_expert), ("dspark.expert_used_count", target.n_expert_used),
                       ("dspark.embedding_length", target.n_embd)):
            w.add_key_value(key, int(v), GGUFValueType.UINT32)

    write_gguf(out, L.SUPPORT_ARCH, metadata, plan, progress, overwrite=overwrite)


# ---- the fit ----------------------------------------------------------------------------------


def _int_at_least(name: str, v, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def fit_support(model: str | os.PathLike | DS4Model, support_in: str | os.PathLike, out: str | os.PathLike, *,
                prompts: int = 30, tokens: int = 64, rank: int | None = None, scan: int = DEFAULT_SCAN,
                seed: int = 0, progress: Progress | None = None, overwrite: bool = False) -> dict:
    """Write ``out``: ``support_in`` with its Markov and confidence heads fitted to ``model``.

    ``prompts`` random prompts (≥ 2; the last ``max(1, prompts // 5)`` are held out of the
    calibration and only predicted) are continued greedily for ``tokens`` (≥ 8) tokens each by
    the native engine.  ``rank`` (default ``n_embd + 32``, at least ``n_embd + 1``) is the Markov
    rank written; W1/W2 are Q8_0 when it is a multiple of 32, else F16; the confidence head is F32.
    ``scan`` (0 … n_vocab) tokens get their zero-layer margin computed besides the fitting tokens
    (~1 s per 1000 tokens at n_embd 256 on two cores).  ``progress(i, n, what)`` reports each phase.
    ``overwrite``: replace an existing ``out`` (else it is refused before the fit, and a file that
    appears at ``out`` while fitting is not replaced).

    Returns a dict: ``out``, ``alpha`` (bias scale), ``rank``, ``calibration`` (``a``, ``b``,
    ``mean_hit``), ``bigram_hit`` (fit / held_out: fraction of next tokens equal to the bigram),
    ``margin_coverage`` (held-out prevs whose margin was computed), ``predicted`` (threshold 0)
    and ``predicted_t05`` (threshold 0.5): :func:`simulate` on the held-out continuations, and
    ``seconds`` per phase.  The output is validated with ``SupportModel.require_compatible``.

    Raises ``ValueError`` for bad arguments (name and value), the ``ModelFileError`` subclasses
    for a bad target or support file (``SupportInvalidError`` lists every problem of an
    incompatible support), :class:`~ds4tui.engine.convert.ConversionError` for an output path
    that is a folder, in a missing folder, or one of the inputs, that exists (without
    ``overwrite``), or that cannot be written.
    Spec dspark.md §1 (vanilla Markov head, confidence head), §2.4 (draft pass), §4 (file).
    """
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    prompts = _int_at_least("prompts", prompts, 2)
    tokens = _int_at_least("tokens", tokens, 8)
    seed = _int_at_least("seed", seed, 0)
    tm = model if isinstance(model, DS4Model) else DS4Model(model)
    c = tm.config
    H, V = c.n_embd, c.n_vocab
    rank = H + EXTRA_COLUMNS if rank is None else _int_at_least("rank", rank, 1)
    if rank < H + 1:
        raise ValueError(f"rank must be at least n_embd + 1 = {H + 1} (the Markov head holds the target's "
                         f"{H}-wide normalised embedding and one reliability column), got {rank}")
    if isinstance(scan, bool) or not isinstance(scan, (int, np.integer)) or not 0 <= scan <= V:
        raise ValueError(f"scan must be an integer 0..{V} (the target's vocabulary), got {scan!r}")
    sm = SupportModel(support_in, c).require_compatible()
    out = check_output_path(out, overwrite=overwrite, inputs=[tm.path, sm.path])
    block = int(sm.meta.block_size)
    rng = np.random.default_rng(seed)

    # 1. the target's greedy continuations
    conts = greedy_continuations(tm, random_prompts(tm, prompts, rng), tokens, progress)
    n_held = max(1, prompts // 5)
    fit_c, held_c = conts[:-n_held], conts[-n_held:]
    times["continuations"] = time.perf_counter() - t0

    # 2. zero-layer margins: the fitting tokens, then the likeliest emitted tokens
    t1 = time.perf_counter()
    bigram = ZeroLayerBigram(tm)
    fit_prevs = np.array(sorted({t for cc in fit_c for t in cc.tokens}), np.int64)
    order = bigram.emission_order()[:scan]
    scanned = np.union1d(order, fit_prevs)
    scan_progress = (lambda i, n: progress(i, n, f"zero-layer margins ({len(scanned)} tokens)")) if progress else None
    _, margin = bigram.top2(scanned, scan_progress)
    times["margins"] = time.perf_counter() - t1

    # 3. calibration of the reliability on the fitting continuations
    t2 = time.perf_counter()
    prevs, hits = bigram_hits(fit_c, bigram)
    where = np.searchsorted(scanned, prevs)
    scale = float(np.median(margin)) or 1.0
    a, b = fit_logistic(margin[where] / scale, np.asarray(hits, float))
    mean_hit = float(np.mean(hits))
    rho = np.full(V, _logit(mean_hit), np.float32)
    rho[scanned] = np.clip(a + b * margin / scale, -8.0, 8.0)

    # 4. the bias scale: U = out·(norm ⊙ RMSNorm(h)) has spread ≤ max|norm|·√H·σ(out) over the vocabulary
    last = f"mtp.{sm.meta.n_stages - 1}."
    sw = Weights(sm.path, sm.tensors)
    u_spread = float(np.abs(sw.get(last + "norm.weight")).max()) * math.sqrt(H) * float(bigram.out.std())
    sample = fit_prevs[:: max(1, len(fit_prevs) // 256)]
    l0_spread = float(np.mean((bigram.x(sample) @ bigram.out.T).std(axis=1)))
    alpha = BIAS_FACTOR * u_spread / l0_spread

    # 5. the heads
    w_type = T.Q8_0 if rank % 32 == 0 else T.F16

    def encoded(rows: Callable[[np.ndarray], np.ndarray], col: np.ndarray | None) -> np.ndarray:
        parts = []
        for s in range(0, V, 8192):
            ids = np.arange(s, min(V, s + 8192))
            m = np.zeros((len(ids), rank), np.float32)
            m[:, :H] = rows(ids)
            if col is not None:
                m[:, H] = col[ids]
            parts.append(quantize(m, w_type).reshape(-1))
        return np.concatenate(parts)

    conf = np.zeros((1, H + rank), np.float32)
    conf[0, H + H] = 1.0  # weight 1 on W1's reliability column, 0 on h and on the embedding columns
    fitted = {
        last + "markov_head.markov_w1.weight": (w_type, encoded(lambda ids: alpha * bigram.x(ids), rho)),
        last + "markov_head.markov_w2.weight": (w_type, encoded(lambda ids: bigram.out[ids], None)),
        last + "confidence_head.proj.weight": (T.F32, conf),
    }
    bigram.prefetch([t for cc in held_c for t in cc.tokens])
    held = simulate(held_c, bigram, rho, block)
    held05 = simulate(held_c, bigram, rho, block, threshold=0.5)
    h_prevs, h_hits = bigram_hits(held_c, bigram)
    times["fit"] = time.perf_counter() - t2

    # 6. the file
    t3 = time.perf_counter()
    description = (f"DSpark support {sm.path.name} with Markov/confidence heads fitted to {tm.path.name} by "
                   f"ds4tui.devtools.fit_support (zero-layer bigram, alpha {alpha:.4g}; seed {seed}, "
                   f"{prompts} prompts x {tokens} tokens, {len(scanned)} margins)")
    _write_support(out, c, sm, rank, fitted, description, progress, overwrite=overwrite)
    SupportModel(out, c).require_compatible()
    times["write"] = time.perf_counter() - t3
    times["total"] = time.perf_counter() - t0
    return {
        "out": str(out),
        "alpha": round(alpha, 3),
        "rank": rank,
        "markov_type": w_type.name,
        "prompts": {"fit": len(fit_c), "held_out": len(held_c)},
        "tokens": tokens,
        "calibration": {"a": round(a, 4), "b_per_margin": round(b / scale, 4), "mean_hit": round(mean_hit, 4)},
        "bigram_hit": {"fit": round(mean_hit, 4), "held_out": round(float(np.mean(h_hits)), 4)},
        "margins": int(len(scanned)),
        "margin_coverage": round(float(np.isin(h_prevs, scanned).mean()), 4),
        "predicted": held,
        "predicted_t05": held05,
        "seconds": {k: round(v, 2) for k, v in times.items()},
    }


def summary_line(r: dict) -> str:
    """One line: bigram hit rate, margin coverage and predicted accept rates on held-out continuations."""
    p, q = r["predicted"], r["predicted_t05"]
    return (f"{r['out']}: held-out bigram hit {100 * r['bigram_hit']['held_out']:.1f}% "
            f"(fit {100 * r['bigram_hit']['fit']:.1f}%), margins for {100 * r['margin_coverage']:.0f}% of held-out "
            f"tokens; predicted accept_rate {p['accept_rate']:.1f}% (cycles={p['cycles']} full={p['full']} "
            f"partial={p['partial']} miss_first={p['miss_first']}); threshold 0.5: accept_rate "
            f"{q['accept_rate']:.1f}%, {q['cut']} draft rows cut, no_draft={q['no_draft']}; "
            f"alpha {r['alpha']:.4g}, rank {r['rank']} {r['markov_type']}, {r['seconds']['total']:.1f} s")


PROG = "ds4tui-fit-support"


def _count(minimum: int, what: str):
    """argparse type: an integer >= minimum (``what`` says what it counts)."""
    from ds4tui.cli import _int_at_least

    def parse(text: str) -> int:
        return _int_at_least(text, minimum, what)

    return parse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="target DS4 GGUF")
    ap.add_argument("support_in", help="DSpark support GGUF to start from (all tensors but the two heads are kept)")
    ap.add_argument("out", help="support GGUF to write (an existing file is replaced only with --force)")
    ap.add_argument("--prompts", type=_count(2, "an integer >= 2"), default=30,
                    help="random prompts continued by the target (>= 2; a fifth are held out for the prediction; "
                         "default 30)")
    ap.add_argument("--tokens", type=_count(8, "an integer >= 8"), default=64,
                    help="greedy tokens per prompt (>= 8; default 64)")
    ap.add_argument("--rank", type=_count(1, "an integer >= 1"),
                    help="Markov rank written (>= n_embd + 1; default n_embd + 32, Q8_0)")
    ap.add_argument("--scan", type=_count(0, "an integer >= 0"), default=DEFAULT_SCAN,
                    help=f"tokens whose zero-layer margin sets their confidence (0..n_vocab; default {DEFAULT_SCAN})")
    ap.add_argument("--seed", type=_count(0, "an integer >= 0"), default=0,
                    help="random seed (>= 0; the same seed gives the same file)")
    ap.add_argument("--force", action="store_true",
                    help="replace OUT if it exists (MODEL, SUPPORT_IN and anything but a regular file are refused "
                         "as OUT whatever the flag)")
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    a = ap.parse_args(argv)
    if not a.out:
        ap.error("argument out: empty: give the path of the support .gguf file to write")
    try:  # an output path that cannot be written is the command line's fault: said before anything loads
        check_output_path(a.out, overwrite=True, inputs=[a.model, a.support_in])
    except ConversionError as exc:
        ap.error(f"argument out: {exc}")
    if Path(a.out).exists() and not a.force:  # a regular file (the check above refused anything else)
        print(f"{PROG}: error: argument out: {a.out} exists: pass --force to replace it, or choose another path "
              f"(nothing was written)", file=sys.stderr)
        return 2
    from ds4tui.cli import interrupt_on_signals
    from ds4tui.engine.session import EngineError

    try:
        with interrupt_on_signals():
            # the files in the wrong order: this tool has no --mtp, the support file is its second argument
            model = DS4Model(a.model, support_hint=" (this is a DSpark support file: give the target model first: "
                             "ds4tui-fit-support MODEL.gguf SUPPORT_IN.gguf OUT.gguf)")
            r = fit_support(model, a.support_in, a.out, prompts=a.prompts, tokens=a.tokens, rank=a.rank,
                            scan=a.scan, seed=a.seed, progress=None if a.quiet else stderr_progress,
                            overwrite=a.force)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, ModelFileError, ConversionError, EngineError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(summary_line(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
