"""Numpy reference forward pass of DeepSeek V4 ("DS4") and of the DSpark drafter.

This is the oracle every fast path is judged by: float32 numpy, written for clarity, driven
entirely by the configuration read from the GGUF (no Flash constants), with weights dequantised
by ``gguf.quants``.  It is not fast; it runs the test models (spec ds4.md §6) in seconds.

What it implements (spec ds4.md §2, dspark.md §2–§3):

* the target model: embedding → ``n_layer`` blocks (mHC with Sinkhorn, sliding-window / compressed
  sparse (CSA, lightning indexer + top-k) / heavily compressed (HCA) attention with sinks, partial
  interleaved RoPE with YaRN on compressed layers, grouped output projection, hash-routed or top-k
  MoE with sqrt-softplus scores and the shared expert) → HC head → final norm → LM head;
* a KV cache (:class:`RefState`) that supports chunked prefill, one-token decode and truncation
  (for speculative rollback), and exposes the hidden state (stream mean) of any layer;
* the DSpark drafter (:class:`ReferenceDrafter`): target-layer capture → ``main_proj``/``main_norm``
  → per-stage support KV window → stages with non-causal block attention → HC head → shared LM
  head → greedy Markov head → confidence head; and greedy verification (:func:`accept_greedy`,
  :func:`speculative_generate`).

Numerics (spec ds4.md §2.9): ``numerics="ds4"`` (default) adds the rounding antirez/ds4 applies on
top of the transformers math — FP8 E4M3 round trip of the non-RoPE KV lanes, f16 rounding of
stored rows, Hadamard + FP4 E2M1 on indexer queries and keys, and the router-sum floor;
``numerics="transformers"`` turns all of them off and reproduces Hugging Face transformers'
``DeepseekV4ForCausalLM`` (checked against golden logits in ``tests/golden``).

Cache design: every per-token quantity a layer needs later (stored KV rows, compressor
projections) is kept in append-only arrays indexed by position, and compressed rows are emitted
whenever a window closes.  The streaming compressor state of ds4 (spec ds4.md §2.4) is a ring view
of the same numbers; keeping whole arrays makes truncation exact and trivially correct.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from ds4tui.engine.errors import (  # re-exported: the names this module always had
    ContextOverflowError,
    EngineError,
    NonFiniteError,
    TokenRangeError,
)
from ds4tui.engine.gguf_model import DS4Model, SupportModel, TensorInfo
from ds4tui.engine.layout import DS4Config, LayerKind

F32 = np.float32


def _int(name: str, value, *, minimum: int | None = None) -> int:
    """``value`` as a Python int; ``TypeError`` for non-integers (bools and floats included)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def token_array(tokens, n_vocab: int) -> np.ndarray:
    """Validate token ids: a non-empty 1-D sequence of integers in ``0 … n_vocab−1`` → int64 ``[T]``.

    Raises ``TypeError`` for non-integer ids (floats, bools, strings), ``ValueError`` for an empty or
    nested sequence and :class:`TokenRangeError` for an id outside the vocabulary.
    """
    if isinstance(tokens, (str, bytes)):
        raise TypeError("token ids must be a sequence of integers, not a string")
    arr = np.asarray(list(tokens) if not isinstance(tokens, np.ndarray) else tokens)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"token ids must be a non-empty 1-D sequence, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
    bad = arr[(arr < 0) | (arr >= n_vocab)]
    if bad.size:
        raise TokenRangeError(f"token id {int(bad[0])} is outside the vocabulary 0..{n_vocab - 1}")
    return arr.astype(np.int64)


# ---- numerics switches (spec ds4.md §2.9) --------------------------------------------------


@dataclass(frozen=True)
class Numerics:
    """Which of ds4's extra roundings are simulated (spec ds4.md §2.9, dspark.md §2.3)."""

    name: str
    fp8_kv: bool  # E4M3 round trip of the non-RoPE lanes of every stored KV row (raw, compressed, drafter)
    f16_cache: bool  # f16 rounding of stored raw and compressed attention rows
    indexer_fp4: bool  # Hadamard + FP4 (E2M1) round trip of indexer queries and index keys
    router_floor: bool  # routed weights normalised by max(sum, 6.1035e-5) instead of sum + 1e-20


NUMERICS = {
    "ds4": Numerics("ds4", fp8_kv=True, f16_cache=True, indexer_fp4=True, router_floor=True),
    "transformers": Numerics("transformers", fp8_kv=False, f16_cache=False, indexer_fp4=False, router_floor=False),
}

#: ds4's floor on the sum of the selected router scores (spec ds4.md §2.7).
ROUTER_SUM_FLOOR = 6.1035e-5
#: transformers' additive guard on the same sum.
ROUTER_SUM_EPS = 1e-20


def _e4m3_table() -> np.ndarray:
    """The 127 non-negative finite E4M3FN values, by code (0 … 126 = 448)."""
    codes = np.arange(127)
    e, m = codes >> 3, codes & 7
    vals = np.where(e == 0, m * 2.0 ** -9, (1.0 + m / 8.0) * 2.0 ** (e - 7.0))
    return vals.astype(F32)


_E4M3 = _e4m3_table()
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)


def _round_to_grid(ax: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Nearest grid value to each non-negative ``ax`` (≤ grid[-1]); ties go to the even code."""
    lo = np.clip(np.searchsorted(grid, ax, side="right") - 1, 0, len(grid) - 1)
    hi = np.minimum(lo + 1, len(grid) - 1)
    d_lo = np.abs(ax - grid[lo])
    d_hi = np.abs(grid[hi] - ax)
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0) & (lo % 2 == 1))
    return np.where(take_hi, grid[hi], grid[lo])


def _block_round_trip(x: np.ndarray, block: int, qmax: float, grid: np.ndarray, amax_floor: float) -> np.ndarray:
    """Quantise-dequantise ``x[..., n]`` in blocks of ``block`` with power-of-two scales.

    ``scale = 2^ceil(log2(amax / qmax))`` with ``amax`` floored at ``amax_floor``; values are clamped to
    ±qmax and rounded to ``grid`` (ties to even code).  Float32 throughout, as ds4 does.
    """
    shape = x.shape
    xb = x.astype(F32).reshape(*shape[:-1], shape[-1] // block, block)
    amax = np.maximum(np.abs(xb).max(axis=-1, keepdims=True), F32(amax_floor))
    scale = np.ldexp(F32(1.0), np.ceil(np.log2(amax / F32(qmax))).astype(np.int32)).astype(F32)
    v = np.clip(xb / scale, -qmax, qmax)
    q = np.sign(v) * _round_to_grid(np.abs(v), grid)
    return (q * scale).astype(F32).reshape(shape)


def fp8_kv_round_trip(rows: np.ndarray, n_rot: int) -> np.ndarray:
    """ds4's E4M3 simulation of a KV row (spec ds4.md §2.9.1).

    ``rows[..., D]``: lanes ``0 … D−n_rot−1`` go through E4M3 in blocks of 64 (scale
    ``2^ceil(log2(amax/448))``, amax ≥ 1e-4); the RoPE lanes are returned unchanged.
    Raises ``ValueError`` if the non-RoPE width is not a multiple of 64.
    """
    nope = rows.shape[-1] - n_rot
    if nope % 64:
        raise ValueError(f"FP8 KV simulation needs a non-RoPE width that is a multiple of 64, got {nope}")
    out = rows.astype(F32, copy=True)
    if nope:
        out[..., :nope] = _block_round_trip(out[..., :nope], 64, 448.0, _E4M3, 1e-4)
    return out


def hadamard(x: np.ndarray) -> np.ndarray:
    """Orthonormal Sylvester-order Hadamard transform of the last axis (a power of two).

    Butterflies with stride 1, 2, 4, … then a scale of 1/√n, the order ds4 uses (spec ds4.md §2.9.3).
    """
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"Hadamard transform needs a power-of-two width, got {n}")
    y = x.astype(F32, copy=True)
    lead = y.shape[:-1]
    stride = 1
    while stride < n:
        v = y.reshape(*lead, n // (2 * stride), 2, stride)
        a, b = v[..., 0, :], v[..., 1, :]
        y = np.stack((a + b, a - b), axis=-2).reshape(*lead, n)
        stride *= 2
    return (y * F32(1.0 / math.sqrt(n))).astype(F32)


def fp4_round_trip(x: np.ndarray) -> np.ndarray:
    """FP4 (E2M1) round trip in blocks of 32 with scale ``2^ceil(log2(amax/6))`` (spec ds4.md §2.9.3)."""
    return _block_round_trip(x, 32, 6.0, _E2M1, 7.052966104933725e-38)


def indexer_qat(x: np.ndarray) -> np.ndarray:
    """ds4's indexer simulation: Hadamard then FP4, per row of ``x[..., index_head_dim]``."""
    return fp4_round_trip(hadamard(x))


def f16_round(x: np.ndarray) -> np.ndarray:
    """Round to the nearest IEEE half (ties to even) and back to float32."""
    return x.astype(np.float16).astype(F32)


# ---- small math ------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, eps: float, weight: np.ndarray | None = None) -> np.ndarray:
    """``x / sqrt(mean(x²) + eps)`` over the last axis, times ``weight`` if given."""
    x = x.astype(F32, copy=False)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps))
    return (y * weight).astype(F32) if weight is not None else y.astype(F32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function, float32."""
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(F32)


def silu(x: np.ndarray) -> np.ndarray:
    """``x · sigmoid(x)``, float32."""
    return (x * sigmoid(x)).astype(F32)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``, float32."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(F32)


def sqrt_softplus(x: np.ndarray) -> np.ndarray:
    """Router score ``sqrt(softplus(x))`` (spec ds4.md §2.7)."""
    return np.sqrt(np.logaddexp(F32(0.0), x.astype(F32))).astype(F32)


def top_k_lowest_index(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest entries per row, ties to the lowest index (spec ds4.md §2.5).

    ``scores[..., n]`` → ``[..., k]`` ordered by descending score.
    """
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[..., :k]


# ---- RoPE (spec ds4.md §2.3) ----------------------------------------------------------------


class Rope:
    """Partial interleaved RoPE on the last ``n_rot`` lanes of a row.

    ``compressed=True`` selects the compressed-layer table: base ``compress_rope_freq_base`` with
    YaRN frequency blending and no magnitude correction.  Raises :class:`EngineError` for a scaling
    type other than ``yarn`` or ``none``.
    """

    def __init__(self, c: DS4Config, compressed: bool):
        self.n_rot = c.n_rot
        half = c.n_rot // 2
        base = c.compress_rope_freq_base if compressed else c.rope_freq_base
        k = np.arange(half, dtype=np.float64)
        freq = base ** (-2.0 * k / c.n_rot)
        if compressed and c.rope_scaling_factor != 1.0 and c.rope_scaling_type != "none":
            if c.rope_scaling_type != "yarn":
                raise EngineError(f"rope.scaling.type '{c.rope_scaling_type}' is not supported (expected 'yarn')")

            def corr(rot: float) -> float:
                return c.n_rot * math.log(c.rope_orig_ctx / (rot * 2 * math.pi)) / (2 * math.log(base))

            lo = max(0.0, math.floor(corr(c.yarn_beta_fast)))
            hi = min(c.n_rot - 1.0, math.ceil(corr(c.yarn_beta_slow)))
            if hi == lo:
                hi += 0.001
            t = np.clip((k - lo) / (hi - lo), 0.0, 1.0)
            freq = freq * (1.0 - t) + (freq / c.rope_scaling_factor) * t
        self.freq = freq

    def cos_sin(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``cos``/``sin`` of ``pos[T] × freq[n_rot/2]`` (angles in float64, results float32)."""
        ang = np.asarray(pos, dtype=np.float64)[:, None] * self.freq[None, :]
        return np.cos(ang).astype(F32), np.sin(ang).astype(F32)

    def apply(self, x: np.ndarray, pos: np.ndarray, inverse: bool = False) -> np.ndarray:
        """Rotate ``x[T, ..., D]`` (row t at position ``pos[t]``); ``inverse`` rotates by −θ."""
        cos, sin = self.cos_sin(pos)
        if inverse:
            sin = -sin
        extra = x.ndim - 2
        cos = cos.reshape(cos.shape[0], *([1] * extra), cos.shape[1])
        sin = sin.reshape(sin.shape[0], *([1] * extra), sin.shape[1])
        out = x.astype(F32, copy=True)
        tail = out[..., x.shape[-1] - self.n_rot:]
        a, b = tail[..., 0::2].copy(), tail[..., 1::2].copy()
        tail[..., 0::2] = a * cos - b * sin
        tail[..., 1::2] = a * sin + b * cos
        return out


# ---- weights --------------------------------------------------------------------------------


class Weights:
    """Dequantised float32 views of a GGUF tensor table, made on first use and cached.

    Every tensor is checked for non-finite values when it is dequantised
    (:class:`~ds4tui.engine.gguf_model.NonFiniteError` names the file and tensor).
    """

    def __init__(self, path: str | Path, tensors: dict[str, TensorInfo]):
        self.path = Path(path)
        self.tensors = tensors
        self._cache: dict[tuple, np.ndarray] = {}

    def info(self, name: str) -> TensorInfo:
        """The tensor's table entry; ``MissingTensorError`` naming the file if absent."""
        try:
            return self.tensors[name]
        except KeyError:
            from ds4tui.engine.gguf_model import MissingTensorError

            raise MissingTensorError(self.path, name, "tensor not found") from None

    def _dequant(self, info: TensorInfo, data: np.ndarray, shape: tuple[int, ...], what: str) -> np.ndarray:
        if info.type == T.F32:
            arr = np.array(data, dtype=F32)
        elif info.type == T.F16:
            arr = np.asarray(data).astype(F32)
        else:
            arr = gq.dequantize(np.asarray(data).view(np.uint8), info.type).astype(F32, copy=False)
        arr = arr.reshape(shape)
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        if bad:
            raise NonFiniteError(self.path, info.name, f"{bad} non-finite value(s) in {what}")
        return arr

    def get(self, name: str) -> np.ndarray:
        """The whole tensor, float32, numpy shape (outermost first)."""
        key = (name,)
        if key not in self._cache:
            info = self.info(name)
            self._cache[key] = self._dequant(info, info.data, info.shape, "the tensor")
        return self._cache[key]

    def rows(self, name: str, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of a 2-D tensor (the embedding) without dequantising the whole table."""
        info = self.info(name)
        data = np.asarray(info.data)
        out = [self._dequant(info, data[i], info.shape[1:], f"row {i}") for i in np.asarray(idx).tolist()]
        return np.stack(out) if out else np.zeros((0, info.shape[1]), F32)

    def expert(self, name: str, e: int) -> np.ndarray:
        """Expert ``e`` of a routed ``[E, out, in]`` tensor."""
        key = (name, e)
        if key not in self._cache:
            info = self.info(name)
            self._cache[key] = self._dequant(info, np.asarray(info.data)[e], info.shape[1:], f"expert {e}")
        return self._cache[key]

    def ints(self, name: str) -> np.ndarray:
        """An integer tensor (``tid2eid``) as int64."""
        key = (name, "int")
        if key not in self._cache:
            self._cache[key] = np.asarray(self.info(name).data).astype(np.int64).reshape(self.info(name).shape)
        return self._cache[key]


# ---- building blocks shared by target layers and drafter stages ----------------------------


@dataclass
class HCMix:
    """Output of an HC pre-mix for T tokens (spec ds4.md §2.1)."""

    x: np.ndarray  # [T, H] collapsed sublayer input (before the learned norm)
    post: np.ndarray  # [T, HC]
    comb: np.ndarray  # [T, HC, HC], row = source stream, column = destination stream


def hc_pre(c: DS4Config, X: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray) -> HCMix:
    """mHC pre-mix of ``X[T, HC, H]`` with ``fn[2HC+HC², HC·H]``, ``base``, ``scale[3]``."""
    T_, HC, H = X.shape
    f = rms_norm(X.reshape(T_, HC * H), c.rms_eps)
    m = f @ fn.T
    eps = F32(c.hc_eps)
    pre = sigmoid(scale[0] * m[:, :HC] + base[:HC]) + eps
    post = F32(2.0) * sigmoid(scale[1] * m[:, HC:2 * HC] + base[HC:2 * HC])
    comb = (scale[2] * m[:, 2 * HC:] + base[2 * HC:]).reshape(T_, HC, HC)
    comb = softmax(comb, axis=-1) + eps
    comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    for _ in range(c.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    x = np.einsum("ta,tad->td", pre, X).astype(F32)
    return HCMix(x, post.astype(F32), comb.astype(F32))


def hc_post(X: np.ndarray, out: np.ndarray, mix: HCMix) -> np.ndarray:
    """``X'[b] = post_b · out + Σ_a comb[a, b] · X[a]`` for every token."""
    return (mix.post[:, :, None] * out[:, None, :] + np.einsum("tab,tad->tbd", mix.comb, X)).astype(F32)


def hc_head(c: DS4Config, X: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Final HC collapse ``X[T, HC, H] → [T, H]`` (spec ds4.md §2.1, last paragraph)."""
    T_, HC, H = X.shape
    f = rms_norm(X.reshape(T_, HC * H), c.rms_eps)
    w = sigmoid(scale[0] * (f @ fn.T) + base) + F32(c.hc_eps)
    return np.einsum("ta,tad->td", w, X).astype(F32)


def attend(q: np.ndarray, keys: np.ndarray, visible: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """Sink softmax attention with V = K (spec ds4.md §2.2).

    ``q[T, NH, D]``, ``keys[R, D]``, ``visible[T, R]`` (bool) or ``[T, NH, R]``, ``sinks[NH]`` →
    ``[T, NH, D]``.  Scale ``1/sqrt(D)``; the sink logit adds probability mass but no value.
    """
    D = q.shape[-1]
    s = np.einsum("thd,rd->thr", q, keys) * F32(1.0 / math.sqrt(D))
    mask = visible[:, None, :] if visible.ndim == 2 else visible
    s = np.where(mask, s, -np.inf).astype(F32)
    m = np.maximum(s.max(axis=-1), sinks[None, :])  # [T, NH]
    p = np.exp(s - m[..., None])
    denom = p.sum(axis=-1) + np.exp(sinks[None, :] - m)
    p = p / denom[..., None]
    return np.einsum("thr,rd->thd", p.astype(F32), keys).astype(F32)


class BlockWeights:
    """The weights of one block (target layer ``blk.L.`` or drafter stage ``mtp.S.``)."""

    def __init__(self, w: Weights, prefix: str):
        self.w, self.p = w, prefix

    def __call__(self, suffix: str) -> np.ndarray:
        return self.w.get(self.p + suffix)

    def has(self, suffix: str) -> bool:
        return (self.p + suffix) in self.w.tensors


def attn_project(c: DS4Config, bw: BlockWeights, x: np.ndarray, pos: np.ndarray, rope: Rope):
    """Q and KV of the attention sub-block (spec ds4.md §2.2).

    ``x[T, H]`` is the normed attention input.  Returns ``qr[T, q_lora]`` (kept for the indexer),
    ``q[T, NH, D]`` (head-normed, RoPE'd) and ``kv[T, D]`` (normed, RoPE'd, no rounding yet).
    """
    qr = rms_norm(x @ bw("attn_q_a.weight").T, c.rms_eps, bw("attn_q_a_norm.weight"))
    q = (qr @ bw("attn_q_b.weight").T).reshape(x.shape[0], c.n_head, c.head_dim)
    q = rope.apply(rms_norm(q, c.rms_eps), pos)
    kv = rms_norm(x @ bw("attn_kv.weight").T, c.rms_eps, bw("attn_kv_a_norm.weight"))
    kv = rope.apply(kv, pos)
    return qr, q, kv


def attn_output(c: DS4Config, bw: BlockWeights, o: np.ndarray, pos: np.ndarray, rope: Rope) -> np.ndarray:
    """Inverse RoPE at the query position, then the grouped low-rank output projection.

    ``o[T, NH, D]`` → ``[T, H]``.
    """
    o = rope.apply(o, pos, inverse=True)
    G, R = c.o_groups, c.o_lora_rank
    og = o.reshape(o.shape[0], G, (c.n_head // G) * c.head_dim)
    wa = bw("attn_output_a.weight").reshape(G, R, -1)
    u = np.einsum("tgi,gri->tgr", og, wa).reshape(o.shape[0], G * R)
    return (u @ bw("attn_output_b.weight").T).astype(F32)


def swiglu(a: np.ndarray, b: np.ndarray, clamp: float) -> np.ndarray:
    """``silu(min(a, clamp)) · clip(b, ±clamp)``; ``clamp <= 0`` disables the clamp."""
    if clamp > 0:
        a = np.minimum(a, F32(clamp))
        b = np.clip(b, -clamp, clamp)
    return (silu(a) * b).astype(F32)


def moe(c: DS4Config, bw: BlockWeights, x: np.ndarray, tokens: np.ndarray | None, *, hashed: bool,
        clamp: float, clamp_shexp: float, numerics: Numerics) -> np.ndarray:
    """Routed MoE plus the shared expert (spec ds4.md §2.7). ``x[T, H]`` normed FFN input → ``[T, H]``."""
    K = c.n_expert_used
    scores = sqrt_softplus(x @ bw("ffn_gate_inp.weight").T)  # [T, E]
    if hashed:
        idx = bw.w.ints(bw.p + "ffn_gate_tid2eid.weight")[np.asarray(tokens)]
    else:
        idx = top_k_lowest_index(scores + bw("exp_probs_b.bias"), K)
    wsel = np.take_along_axis(scores, idx, axis=1)
    if c.expert_weights_norm:
        total = wsel.sum(axis=1, keepdims=True)
        total = np.maximum(total, F32(ROUTER_SUM_FLOOR)) if numerics.router_floor else total + F32(ROUTER_SUM_EPS)
        wsel = wsel / total
    wsel = (wsel * F32(c.expert_weights_scale)).astype(F32)
    y = np.zeros_like(x)
    for e in np.unique(idx).tolist():
        rows, slot = np.nonzero(idx == e)
        xe = x[rows]
        h = swiglu(xe @ bw.w.expert(bw.p + "ffn_gate_exps.weight", e).T,
                   xe @ bw.w.expert(bw.p + "ffn_up_exps.weight", e).T, clamp)
        out = h @ bw.w.expert(bw.p + "ffn_down_exps.weight", e).T
        y[rows] += wsel[rows, slot][:, None] * out
    hs = swiglu(x @ bw("ffn_gate_shexp.weight").T, x @ bw("ffn_up_shexp.weight").T, clamp_shexp)
    return (y + hs @ bw("ffn_down_shexp.weight").T).astype(F32)


def store_kv(rows: np.ndarray, n_rot: int, numerics: Numerics) -> np.ndarray:
    """What a KV row looks like in the cache: FP8 on non-RoPE lanes, then f16 (each if enabled)."""
    if numerics.fp8_kv:
        rows = fp8_kv_round_trip(rows, n_rot)
    if numerics.f16_cache:
        rows = f16_round(rows)
    return rows.astype(F32, copy=False)


# ---- target model state ---------------------------------------------------------------------


def _empty(width: int) -> np.ndarray:
    return np.zeros((0, width), F32)


@dataclass
class LayerState:
    """Cache of one target layer; every array is indexed by position (or window).

    ``kv[n, D]`` stored raw rows; ``comp_c``/``comp_z`` ``[n, coff·D]`` compressor projections (``z``
    includes the position bias); ``comp[n // ratio, D]`` compressed rows; ``idx_c``/``idx_z``
    ``[n, 2·ID]`` and ``idx_keys[n // 4, ID]`` for the lightning indexer (CSA only).
    """

    kv: np.ndarray
    comp_c: np.ndarray | None = None
    comp_z: np.ndarray | None = None
    comp: np.ndarray | None = None
    idx_c: np.ndarray | None = None
    idx_z: np.ndarray | None = None
    idx_keys: np.ndarray | None = None

    def truncate(self, n: int, ratio: int) -> None:
        """Keep positions ``< n`` and the ``n // ratio`` windows they complete."""
        self.kv = self.kv[:n]
        if self.comp is not None:
            self.comp_c, self.comp_z, self.comp = self.comp_c[:n], self.comp_z[:n], self.comp[: n // ratio]
        if self.idx_keys is not None:
            self.idx_c, self.idx_z, self.idx_keys = self.idx_c[:n], self.idx_z[:n], self.idx_keys[: n // ratio]


@dataclass
class RefState:
    """The target's KV cache and token history for one sequence.

    ``n_ctx`` is the context size in tokens; ``tokens`` the ids processed so far (position = index).
    ``indexer_log``, when not ``None``, records ``(layer, position) → (selected compressed rows,
    near_tie)`` for every CSA query, where ``near_tie`` flags a k-th/(k+1)-th score gap below 1e-5.
    """

    n_ctx: int
    layers: list[LayerState]
    tokens: list[int] = field(default_factory=list)
    indexer_log: dict | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def copy(self) -> "RefState":
        """An independent deep copy (snapshot)."""
        return copy.deepcopy(self)


@dataclass
class ForwardResult:
    """Logits ``[T or 1, n_vocab]`` (None if not requested) and captured hidden states.

    ``hidden[L]`` is the mean over the HC streams of layer ``L``'s output, ``[T, H]`` (the row
    DSpark captures; spec dspark.md §2.2).
    """

    logits: np.ndarray | None
    hidden: dict[int, np.ndarray]


class ReferenceModel:
    """The numpy reference of a DS4 target model.

    ``model`` is a GGUF path or an opened :class:`DS4Model`.  ``numerics`` is ``"ds4"`` (default) or
    ``"transformers"`` (spec ds4.md §2.9).  Raises the ``ModelFileError`` subclasses of
    :mod:`ds4tui.engine.gguf_model` for bad files and ``NonFiniteError`` for a weight that
    dequantises to NaN/Inf.
    """

    def __init__(self, model: str | Path | DS4Model, *, numerics: str | Numerics = "ds4"):
        self.model = model if isinstance(model, DS4Model) else DS4Model(model)
        self.config: DS4Config = self.model.config
        if isinstance(numerics, str):
            if numerics not in NUMERICS:
                raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}, got '{numerics}'")
            numerics = NUMERICS[numerics]
        if not isinstance(numerics, Numerics):
            raise TypeError(f"numerics must be one of {', '.join(NUMERICS)} or a Numerics, got {numerics!r}")
        self.numerics = numerics
        self.w = Weights(self.model.path, self.model.tensors)
        c = self.config
        self.rope_main = Rope(c, compressed=False)
        self.rope_comp = Rope(c, compressed=True)
        self.blocks = [BlockWeights(self.w, f"blk.{i}.") for i in range(c.n_layer)]

    # -- state ---------------------------------------------------------------------------------
    def new_state(self, n_ctx: int | None = None, *, log_indexer: bool = False) -> RefState:
        """An empty cache for up to ``n_ctx`` tokens (``None``: 4096), capped at the model's context length.

        Raises ``TypeError``/``ValueError`` unless ``n_ctx`` is a positive integer.
        """
        c = self.config
        n_ctx = min(4096 if n_ctx is None else _int("context size", n_ctx, minimum=1), c.context_length)
        layers = []
        for i in range(c.n_layer):
            kind = c.layer_kind(i)
            st = LayerState(kv=_empty(c.head_dim))
            if kind is not LayerKind.SWA:
                coff = 2 if kind is LayerKind.CSA else 1
                st.comp_c, st.comp_z, st.comp = _empty(coff * c.head_dim), _empty(coff * c.head_dim), _empty(c.head_dim)
            if kind is LayerKind.CSA:
                w2 = 2 * c.indexer_head_dim
                st.idx_c, st.idx_z, st.idx_keys = _empty(w2), _empty(w2), _empty(c.indexer_head_dim)
            layers.append(st)
        return RefState(n_ctx=n_ctx, layers=layers, indexer_log={} if log_indexer else None)

    def truncate(self, state: RefState, n: int) -> None:
        """Forget every token at position ≥ ``n`` (speculative rollback).

        Raises ``ValueError`` unless ``0 ≤ n ≤ state.n_tokens`` (``TypeError`` for a non-integer).
        """
        n = _int("truncate length", n)
        if not 0 <= n <= state.n_tokens:
            raise ValueError(f"cannot truncate a state of {state.n_tokens} tokens to {n}")
        for i, ls in enumerate(state.layers):
            ls.truncate(n, max(1, self.config.compress_ratios[i]))
        del state.tokens[n:]
        if state.indexer_log is not None:
            for key in [k for k in state.indexer_log if k[1] >= n]:
                del state.indexer_log[key]

    # -- forward -------------------------------------------------------------------------------
    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """``[T]`` ids → ``[T, HC, H]`` initial streams (all streams equal the embedding row)."""
        e = self.w.rows("token_embd.weight", tokens)
        return np.repeat(e[:, None, :], self.config.hc_count, axis=1)

    def forward(self, state: RefState, tokens: Sequence[int], *, logits: str | None = "last",
                capture: Iterable[int] = ()) -> ForwardResult:
        """Run ``tokens`` (one chunk) at positions ``state.n_tokens …`` and extend the cache.

        ``logits``: ``"last"`` → ``[1, V]``, ``"all"`` → ``[T, V]``, ``None`` → no LM head.
        ``capture``: layer indices whose stream-mean output to return in ``hidden``.
        Raises :class:`ContextOverflowError` past ``state.n_ctx``, the errors of :func:`token_array`
        for bad ids, ``ValueError`` for bad ``logits``/``capture``; the state is unchanged when it raises.
        """
        c = self.config
        toks = token_array(tokens, c.n_vocab)
        if state.n_tokens + toks.size > state.n_ctx:
            raise ContextOverflowError(f"context overflow: {state.n_tokens} tokens in the cache + {toks.size} new "
                                       f"> context size {state.n_ctx}")
        if logits not in ("last", "all", None):
            raise ValueError(f"logits must be 'last', 'all' or None, got {logits!r}")
        capture = sorted({_int("capture layer", L) for L in capture})
        for L in capture:
            if not 0 <= L < c.n_layer:
                raise ValueError(f"capture layer {L} outside 0..{c.n_layer - 1}")
        pos = np.arange(state.n_tokens, state.n_tokens + toks.size)
        X = self.embed(toks)
        hidden = {}
        for L in range(c.n_layer):
            X = self._layer(state, L, X, toks, pos)
            if L in capture:
                hidden[L] = X.mean(axis=1).astype(F32)
        state.tokens.extend(toks.tolist())
        out = None
        if logits is not None:
            Xl = X if logits == "all" else X[-1:]
            out = self.lm_head(Xl)
        return ForwardResult(out, hidden)

    def lm_head(self, X: np.ndarray) -> np.ndarray:
        """Final HC head, norm and output projection: ``[T, HC, H]`` → logits ``[T, V]``."""
        c = self.config
        y = hc_head(c, X, self.w.get("output_hc_fn.weight"), self.w.get("output_hc_base.weight"),
                    self.w.get("output_hc_scale.weight"))
        y = rms_norm(y, c.rms_eps, self.w.get("output_norm.weight"))
        return (y @ self.w.get("output.weight").T).astype(F32)

    def prefill(self, state: RefState, tokens: Sequence[int], *, chunk: int | None = None, logits: str | None = "last",
                capture: Iterable[int] = (), progress: Callable[[int, int], None] | None = None) -> ForwardResult:
        """:meth:`forward` in chunks of ``chunk`` tokens (``None``: one chunk); results concatenated.

        ``progress(done, total)`` is called after every chunk.  Token ids, ``chunk`` (a positive
        integer) and the context size are checked before the first chunk runs, so a bad request
        leaves the state unchanged; see :meth:`forward` for the errors.
        """
        toks = token_array(tokens, self.config.n_vocab).tolist()
        chunk = len(toks) if chunk is None else _int("chunk", chunk, minimum=1)
        if state.n_tokens + len(toks) > state.n_ctx:
            raise ContextOverflowError(f"context overflow: {state.n_tokens} tokens in the cache + {len(toks)} new "
                                       f"> context size {state.n_ctx}")
        parts, hid = [], {}
        for i in range(0, len(toks), chunk):
            last = i + chunk >= len(toks)
            want = logits if (logits == "all" or last) else None
            r = self.forward(state, toks[i:i + chunk], logits=want, capture=capture)
            if r.logits is not None:
                parts.append(r.logits)
            for L, h in r.hidden.items():
                hid.setdefault(L, []).append(h)
            if progress is not None:
                progress(min(i + chunk, len(toks)), len(toks))
        return ForwardResult(np.concatenate(parts) if parts else None,
                             {L: np.concatenate(v) for L, v in hid.items()})

    # -- one layer -----------------------------------------------------------------------------
    def _layer(self, state: RefState, L: int, X: np.ndarray, toks: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, bw = self.config, self.blocks[L]
        mix = hc_pre(c, X, bw("hc_attn_fn.weight"), bw("hc_attn_base.weight"), bw("hc_attn_scale.weight"))
        x = rms_norm(mix.x, c.rms_eps, bw("attn_norm.weight"))
        X = hc_post(X, self._attention(state, L, x, pos), mix)
        mix = hc_pre(c, X, bw("hc_ffn_fn.weight"), bw("hc_ffn_base.weight"), bw("hc_ffn_scale.weight"))
        x = rms_norm(mix.x, c.rms_eps, bw("ffn_norm.weight"))
        clamp = c.swiglu_clamp[L]
        clamp_sh = c.swiglu_clamp_shexp[L] if c.swiglu_clamp_shexp else clamp
        y = moe(c, bw, x, toks, hashed=c.is_hash_layer(L), clamp=clamp, clamp_shexp=clamp_sh, numerics=self.numerics)
        return hc_post(X, y, mix)

    def _attention(self, state: RefState, L: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, bw, ls, num = self.config, self.blocks[L], state.layers[L], self.numerics
        kind = c.layer_kind(L)
        rope = self.rope_main if kind is LayerKind.SWA else self.rope_comp
        qr, q, kv = attn_project(c, bw, x, pos, rope)
        ls.kv = np.concatenate([ls.kv, store_kv(kv, c.n_rot, num)])
        n = ls.kv.shape[0]
        key_pos = np.arange(n)
        visible = (key_pos[None, :] <= pos[:, None]) & (key_pos[None, :] > pos[:, None] - c.sliding_window)
        keys = ls.kv
        if kind is not LayerKind.SWA:
            ratio = c.compress_ratios[L]
            ls.comp_c, ls.comp_z, ls.comp = self._compress(
                x, pos, ls.comp_c, ls.comp_z, ls.comp, ratio, overlap=(kind is LayerKind.CSA), width=c.head_dim,
                kv_w=bw("attn_compressor_kv.weight"), gate_w=bw("attn_compressor_gate.weight"),
                ape=bw("attn_compressor_ape.weight"), norm_w=bw("attn_compressor_norm.weight"),
                finish=lambda rows: store_kv(rows, c.n_rot, num))
            n_comp = ls.comp.shape[0]
            comp_vis = np.arange(n_comp)[None, :] < ((pos + 1) // ratio)[:, None]
            if kind is LayerKind.CSA:
                comp_vis = self._indexer(state, L, x, qr, pos, comp_vis)
            keys = np.concatenate([ls.kv, ls.comp])
            visible = np.concatenate([visible, comp_vis], axis=1)
        o = attend(q, keys, visible, bw("attn_sinks.weight"))
        return attn_output(c, bw, o, pos, rope)

    def _compress(self, x, pos, cs, zs, rows, ratio, *, overlap, width, kv_w, gate_w, ape, norm_w, finish):
        """Append this chunk's compressor projections and emit every window that closes.

        Window ``w`` covers positions ``ratio·w … ratio·w + ratio − 1`` and is emitted when its last
        token arrives (spec ds4.md §2.4).  ``overlap`` (CSA/indexer): the row pools lane B
        (``[width:2·width]``) of window ``w`` with lane A (``[:width]``) of window ``w − 1``.
        """
        c = self.config
        cs = np.concatenate([cs, (x @ kv_w.T).astype(F32)])
        zs = np.concatenate([zs, (x @ gate_w.T + ape[pos % ratio]).astype(F32)])
        n = cs.shape[0]
        new = []
        for w in range(rows.shape[0], n // ratio):
            a, b = ratio * w, ratio * (w + 1)
            if overlap:
                cand_c, cand_z = cs[a:b, width:], zs[a:b, width:]
                if w > 0:
                    cand_c = np.concatenate([cs[a - ratio:a, :width], cand_c])
                    cand_z = np.concatenate([zs[a - ratio:a, :width], cand_z])
            else:
                cand_c, cand_z = cs[a:b], zs[a:b]
            pooled = (softmax(cand_z, axis=0) * cand_c).sum(axis=0)
            row = rms_norm(pooled[None, :], c.rms_eps, norm_w)
            row = self.rope_comp.apply(row, np.array([a]))
            new.append(finish(row))
        if new:
            rows = np.concatenate([rows] + new)
        return cs, zs, rows

    def _indexer(self, state: RefState, L: int, x, qr, pos, comp_vis: np.ndarray) -> np.ndarray:
        """Lightning indexer: which compressed rows each query keeps (spec ds4.md §2.5).

        Every visible row when at most ``indexer_top_k`` are visible; otherwise the top-k scores
        ``Σ_h w_h · relu(q_h · K_c)``, ties to the lowest row index.
        """
        c, bw, ls, num = self.config, self.blocks[L], state.layers[L], self.numerics
        ID, IH = c.indexer_head_dim, c.indexer_n_head
        finish = indexer_qat if num.indexer_fp4 else (lambda r: r)
        ls.idx_c, ls.idx_z, ls.idx_keys = self._compress(
            x, pos, ls.idx_c, ls.idx_z, ls.idx_keys, c.compress_ratios[L], overlap=True, width=ID,
            kv_w=bw("indexer_compressor_kv.weight"), gate_w=bw("indexer_compressor_gate.weight"),
            ape=bw("indexer_compressor_ape.weight"), norm_w=bw("indexer_compressor_norm.weight"), finish=finish)
        k = c.indexer_top_k
        n_vis = comp_vis.sum(axis=1)
        sel = comp_vis.copy()
        need = n_vis > k
        scores = None
        if need.any():
            qi = (qr @ bw("indexer.attn_q_b.weight").T).reshape(x.shape[0], IH, ID)
            qi = self.rope_comp.apply(qi, pos)
            if num.indexer_fp4:
                qi = indexer_qat(qi)
            wts = (x @ bw("indexer.proj.weight").T) * F32(IH ** -0.5)
            dots = np.maximum(np.einsum("thd,cd->thc", qi, ls.idx_keys), F32(0.0)) * F32(ID ** -0.5)
            scores = np.einsum("th,thc->tc", wts, dots).astype(F32)
            scores = np.where(comp_vis, scores, -np.inf)
            for t in np.nonzero(need)[0]:
                top = top_k_lowest_index(scores[t], k)
                sel[t] = False
                sel[t, top] = True
        if state.indexer_log is not None:
            for t in range(x.shape[0]):
                chosen = tuple(np.nonzero(sel[t])[0].tolist())
                near_tie = False
                if need[t]:
                    srt = np.sort(scores[t][comp_vis[t]])[::-1]
                    near_tie = bool(abs(srt[k - 1] - srt[k]) <= 1e-5 * max(1.0, abs(srt[k - 1])))
                state.indexer_log[(L, int(pos[t]))] = (chosen, near_tie)
        return sel


# ---- greedy helpers ---------------------------------------------------------------------------


def argmax_lowest(logits: np.ndarray) -> np.ndarray:
    """Greedy token per row, ties to the lowest id (``np.argmax`` returns the first maximum)."""
    return np.argmax(logits, axis=-1)


def greedy_generate(model: ReferenceModel, prompt: Sequence[int], n_new: int, *, n_ctx: int | None = None,
                    chunk: int | None = None, eos: int | None = None) -> list[int]:
    """Plain greedy decoding: ``n_new`` ≥ 1 tokens after ``prompt`` (stops after ``eos`` if given).

    ``n_ctx`` defaults to ``len(prompt) + n_new + 1``; errors as :meth:`ReferenceModel.prefill`.
    """
    n_new = _int("n_new", n_new, minimum=1)
    st = model.new_state(n_ctx or len(prompt) + n_new + 1)
    logits = model.prefill(st, prompt, chunk=chunk).logits
    out: list[int] = []
    while len(out) < n_new:
        tok = int(argmax_lowest(logits[-1]))
        out.append(tok)
        if tok == eos or len(out) == n_new:
            break
        logits = model.forward(st, [tok]).logits
    return out


# ---- DSpark drafter (spec dspark.md §2) ------------------------------------------------------


@dataclass
class DraftState:
    """Per-stage support KV windows of the drafter (spec dspark.md §2.3).

    ``rows[s]`` holds at most ``window`` context rows ``[n, D]`` of stage ``s`` for positions
    ``pos`` (ascending, contiguous), ending at ``last_pos`` — the last position the target processed.
    """

    window: int
    rows: list[np.ndarray]
    pos: np.ndarray
    last_pos: int = -1

    def copy(self) -> "DraftState":
        """An independent deep copy (snapshot)."""
        return copy.deepcopy(self)


@dataclass
class Proposal:
    """One draft pass.

    ``tokens``: the proposal after confidence truncation; ``greedy``: all ``block`` Markov-chain
    tokens; ``confidence[block]``: c_k; ``positions``: where the block rows sit (anchor first);
    ``base_logits[block, V]``: U before the Markov bias; ``hidden[block, H]``: pre-norm h_k.
    """

    anchor: int
    tokens: list[int]
    greedy: list[int]
    confidence: np.ndarray
    positions: np.ndarray
    base_logits: np.ndarray
    hidden: np.ndarray


def accept_greedy(draft: Sequence[int], target_top: Sequence[int]) -> int:
    """Greedy verification: the length of the longest prefix with ``draft[i] == target_top[i]``.

    ``target_top[i]`` is the target's argmax after the anchor and ``draft[:i]`` (row ``i`` of the
    verify pass over ``[anchor, d_1 … d_ℓ]``); the bonus token is ``target_top[accepted]``.
    """
    n = 0
    for d, t in zip(draft, target_top):
        if int(d) != int(t):
            break
        n += 1
    return n


class ReferenceDrafter:
    """The DSpark drafter over a :class:`ReferenceModel` (spec dspark.md §2, reference anchor layout).

    ``support`` is a support GGUF path or an opened :class:`SupportModel`; it must be compatible
    with the target (``SupportInvalidError`` lists every problem otherwise).  The drafter uses the
    target's ``token_embd`` and ``output`` and the target's numerics switches (FP8 on the context
    and draft KV rows in ds4 mode).
    """

    def __init__(self, target: ReferenceModel, support: str | Path | SupportModel, *,
                 draft_vocab: "Sequence[int] | None" = None):
        sm = support if isinstance(support, SupportModel) else SupportModel(support, target.config)
        #: the draft vocabulary (spec dspark.md §2.6): sorted token ids the drafts come from, or None
        #: for the whole vocabulary
        self.draft_vocab = None if draft_vocab is None else np.unique(np.asarray(draft_vocab, dtype=np.int64))
        self.support = sm.require_compatible()
        self.target = target
        self.c = target.config
        m = self.support.meta
        self.block_size = int(m.block_size)
        self.rank = int(m.markov_rank)
        self.noise = int(m.noise_token_id)
        self.capture_layers = tuple(m.target_layer_ids)
        self.n_stages = m.n_stages
        self.w = Weights(self.support.path, self.support.tensors)
        self.stages = [BlockWeights(self.w, f"mtp.{s}.") for s in range(self.n_stages)]
        self.last = f"mtp.{self.n_stages - 1}."
        self.rope = target.rope_main  # drafter stages are sliding-window layers (compress ratio 0)

    def new_state(self) -> DraftState:
        """Empty support windows (one per stage, ``sliding_window`` rows each)."""
        D = self.c.head_dim
        return DraftState(window=self.c.sliding_window, rows=[_empty(D) for _ in range(self.n_stages)],
                          pos=np.zeros(0, np.int64))

    def main_x(self, hidden: dict[int, np.ndarray]) -> np.ndarray:
        """``RMSNorm(main_proj · concat(captured rows)) · main_norm``: ``[n, H]`` (spec dspark.md §2.2)."""
        xcat = np.concatenate([hidden[L] for L in self.capture_layers], axis=-1)
        return rms_norm(xcat @ self.w.get("mtp.0.main_proj.weight").T, self.c.rms_eps,
                        self.w.get("mtp.0.main_norm.weight"))

    def add_context(self, ds: DraftState, positions: np.ndarray, hidden: dict[int, np.ndarray]) -> None:
        """Append context rows for target positions ``positions`` (contiguous, right after ``last_pos``).

        ``hidden`` maps each capture layer to ``[n, H]`` stream means from the target pass.
        Raises ``ValueError`` for non-contiguous positions, a missing capture layer or a row count
        that differs from the number of positions; the state is then unchanged.
        """
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return
        missing = [L for L in self.capture_layers if L not in hidden]
        if missing:
            raise ValueError(f"hidden states of capture layer(s) {missing} missing (the support file captures "
                             f"layers {list(self.capture_layers)}: pass capture= to the target forward)")
        shapes = {L: np.shape(hidden[L]) for L in self.capture_layers}
        if any(sh != (positions.size, self.c.n_embd) for sh in shapes.values()):
            raise ValueError(f"hidden states must be [{positions.size}, {self.c.n_embd}] per capture layer, got {shapes}")
        if positions[0] != ds.last_pos + 1 or np.any(np.diff(positions) != 1):
            raise ValueError(f"drafter context must continue at position {ds.last_pos + 1}, got "
                             f"{positions[0]}..{positions[-1]}")
        mx = self.main_x(hidden)
        keep = ds.window
        for s, bw in enumerate(self.stages):
            kv = rms_norm(mx @ bw("attn_kv.weight").T, self.c.rms_eps, bw("attn_kv_a_norm.weight"))
            kv = self.rope.apply(kv, positions)
            if self.target.numerics.fp8_kv:
                kv = fp8_kv_round_trip(kv, self.c.n_rot)
            ds.rows[s] = np.concatenate([ds.rows[s], kv])[-keep:]
        ds.pos = np.concatenate([ds.pos, positions])[-keep:]
        ds.last_pos = int(positions[-1])

    def _stage(self, s: int, X: np.ndarray, pos: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        c, bw, num = self.c, self.stages[s], self.target.numerics
        mix = hc_pre(c, X, bw("hc_attn_fn.weight"), bw("hc_attn_base.weight"), bw("hc_attn_scale.weight"))
        x = rms_norm(mix.x, c.rms_eps, bw("attn_norm.weight"))
        _, q, kv = attn_project(c, bw, x, pos, self.rope)
        if num.fp8_kv:
            kv = fp8_kv_round_trip(kv, c.n_rot)
        keys = np.concatenate([ctx, kv])
        visible = np.ones((X.shape[0], keys.shape[0]), bool)  # non-causal inside the block
        o = attend(q, keys, visible, bw("attn_sinks.weight"))
        X = hc_post(X, attn_output(c, bw, o, pos, self.rope), mix)
        mix = hc_pre(c, X, bw("hc_ffn_fn.weight"), bw("hc_ffn_base.weight"), bw("hc_ffn_scale.weight"))
        x = rms_norm(mix.x, c.rms_eps, bw("ffn_norm.weight"))
        clamp = c.swiglu_clamp[-1]
        clamp_sh = c.swiglu_clamp_shexp[-1] if c.swiglu_clamp_shexp else clamp
        y = moe(c, bw, x, None, hashed=False, clamp=clamp, clamp_shexp=clamp_sh, numerics=num)
        return hc_post(X, y, mix)

    def propose(self, ds: DraftState, anchor: int, *, threshold: float = 0.0, block: int | None = None) -> Proposal:
        """One draft pass for ``anchor`` = the token sampled from the target's logits at ``ds.last_pos``.

        Block rows sit at positions ``last_pos+1 …`` with inputs ``[anchor, noise, …]``; row k
        predicts the token at ``last_pos + 2 + k``.  The proposal is cut at the first k with
        ``confidence[k] < threshold``.  ``block`` (≤ the support block size) shortens the block.
        Raises :class:`TokenRangeError` for an anchor outside the vocabulary, ``ValueError`` for a
        block outside ``1 … block_size``, a non-finite threshold or a drafter without context.
        """
        anchor = int(token_array([anchor], self.c.n_vocab)[0])
        B = self.block_size if block is None else _int("block", block)
        if not 1 <= B <= self.block_size:
            raise ValueError(f"block must be 1..{self.block_size}, got {B}")
        if not math.isfinite(threshold):
            raise ValueError(f"confidence threshold must be finite, got {threshold}")
        if ds.last_pos < 0:
            raise ValueError("the drafter has no context yet: call add_context after the prefill")
        c = self.c
        pos = np.arange(ds.last_pos + 1, ds.last_pos + 1 + B)
        ids = np.array([anchor] + [self.noise] * (B - 1), dtype=np.int64)
        X = self.target.embed(ids)
        for s in range(self.n_stages):
            X = self._stage(s, X, pos, ds.rows[s])
        h = hc_head(c, X, self.w.get(self.last + "hc_head_fn.weight"), self.w.get(self.last + "hc_head_base.weight"),
                    self.w.get(self.last + "hc_head_scale.weight"))
        u = rms_norm(h, c.rms_eps, self.w.get(self.last + "norm.weight")) @ self.target.w.get("output.weight").T
        w1 = self.w.get(self.last + "markov_head.markov_w1.weight")
        w2 = self.w.get(self.last + "markov_head.markov_w2.weight")
        wc = self.w.get(self.last + "confidence_head.proj.weight").reshape(-1)
        prev, toks, conf = int(anchor), [], np.zeros(B, F32)
        vd = self.draft_vocab
        for k in range(B):
            m = w1[prev]
            if vd is None:
                tok = int(argmax_lowest(u[k] + w2 @ m))
            else:  # the same sums over the listed tokens only; ties go to the lowest id, as in full
                tok = int(vd[argmax_lowest(u[k][vd] + w2[vd] @ m)])
            conf[k] = sigmoid(np.dot(wc, np.concatenate([h[k], m])))
            toks.append(tok)
            prev = tok
        cut = next((k for k in range(B) if conf[k] < threshold), B)
        return Proposal(int(anchor), toks[:cut], toks, conf, pos, u.astype(F32), h)


@dataclass
class Cycle:
    """One speculative cycle: the anchor, the proposal, how many drafts were accepted, the bonus."""

    anchor: int
    proposed: list[int]
    accepted: int
    bonus: int
    confidence: list[float]


@dataclass
class SpecResult:
    """Output of :func:`speculative_generate`: the emitted tokens and one record per cycle."""

    tokens: list[int]
    cycles: list[Cycle]


def speculative_generate(model: ReferenceModel, drafter: ReferenceDrafter, prompt: Sequence[int], n_new: int, *,
                         threshold: float = 0.0, block: int | None = None, n_ctx: int | None = None,
                         chunk: int | None = None, eos: int | None = None) -> SpecResult:
    """Greedy DSpark decoding with the reference layout (spec dspark.md §2.5, §3.2 at T = 0).

    Each cycle: the anchor (greedy token from the last committed row) is emitted, the drafter
    proposes ``d_1 … d_ℓ``, the target verifies ``[anchor, d_1 … d_ℓ]`` in one pass, the longest
    matching prefix is accepted, the cache is truncated after it and the bonus token becomes the
    next anchor.  In exact arithmetic the output equals :func:`greedy_generate`'s; in float32 the
    verify pass batches rows differently from one-token decode, so a near tie (top-2 gap below the
    ~1e-3 rounding noise of ds4 numerics) could in principle resolve differently.

    ``n_ctx`` defaults to ``len(prompt) + n_new + block_size + 2``; errors as
    :meth:`ReferenceModel.prefill` and :meth:`ReferenceDrafter.propose`.
    """
    n_new = _int("n_new", n_new, minimum=1)
    cap = drafter.capture_layers
    st = model.new_state(n_ctx or len(prompt) + n_new + drafter.block_size + 2)
    r = model.prefill(st, prompt, chunk=chunk, capture=cap)
    ds = drafter.new_state()
    drafter.add_context(ds, np.arange(len(prompt)), r.hidden)
    anchor = int(argmax_lowest(r.logits[-1]))
    out: list[int] = []
    cycles: list[Cycle] = []
    while True:
        out.append(anchor)
        if anchor == eos or len(out) >= n_new:
            break
        room = min(n_new - len(out), st.n_ctx - st.n_tokens - 1)
        prop = drafter.propose(ds, anchor, threshold=threshold, block=block)
        drafts = prop.tokens[:max(0, room)]
        n0 = st.n_tokens
        v = model.forward(st, [anchor] + drafts, logits="all", capture=cap)
        top = argmax_lowest(v.logits)
        a = accept_greedy(drafts, top)
        model.truncate(st, n0 + 1 + a)
        drafter.add_context(ds, np.arange(n0, n0 + 1 + a), {L: h[: 1 + a] for L, h in v.hidden.items()})
        cycles.append(Cycle(anchor, list(prop.tokens), a, int(top[a]), prop.confidence.tolist()))
        accepted = drafts[:a]
        if eos is not None and eos in accepted:
            out.extend(accepted[: accepted.index(eos) + 1])
            break
        out.extend(accepted)
        anchor = int(top[a])
    return SpecResult(out[:n_new], cycles)
