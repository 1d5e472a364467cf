"""Quantisers for the GGML block formats that the GGUF converter writes.

``quantize(x, qtype)`` turns float rows into the bytes of a GGUF tensor of
GGML type ``qtype``.  The block layouts are those of spec ds4.md §5 (the GGML
block formats); the written bytes decode with ``gguf.quants.dequantize`` and
with the native ``ds4_dequantize``.

* F32, F16, BF16 — plain arrays (BF16: round to nearest even, as GGML's
  ``ggml_compute_fp32_to_bf16``).
* Q8_0 — delegated to ``gguf.quants.quantize`` (byte-identical to GGML's
  reference quantiser).
* Q2_K, IQ2_XXS — our own quantisers (gguf 0.19 cannot write them): a
  weighted least-squares fit per sub-block (Q2_K) and a vectorised
  nearest-grid search with a small search over the group scale (IQ2_XXS).
  Both take an optional per-column importance vector (e.g. the mean squared
  activation of each input column, an "imatrix").

Output is deterministic on a given machine (no random numbers; ties go to
the lowest index).  The IQ2_XXS grid search ranks candidates with a float32
BLAS matmul, so another BLAS build may round differently and pick another of
two near-equal grid rows; the bytes always decode to what ``values`` says.

Speed (one core, numpy + OpenBLAS, N(0,1) data): IQ2_XXS and Q2_K about
2-3 M weights/s (1.5-2 s per 4M weights), Q8_0/BF16/F16 tens of M weights/s.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

__all__ = [
    "SUPPORTED_TYPES",
    "QuantResult",
    "block_size",
    "quantize",
    "quantize_with_reconstruction",
    "row_bytes",
]

T = GGMLQuantizationType

#: GGML types that :func:`quantize` can write.
SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q2_K, T.IQ2_XXS)

_F16_MAX = 65504.0
# Blocks processed per batch by the K/IQ quantisers: the (2048 chunks x 256)
# float32 cost matrix of the IQ2_XXS grid search is 2 MiB and stays in cache
# (4x faster than 256-block batches); memory use does not grow with the tensor.
_BATCH_BLOCKS = 64


class QuantResult(NamedTuple):
    """Bytes of a quantised tensor and the float32 values they decode to.

    ``data``: uint8, shape ``x.shape[:-1] + (row_bytes,)``.
    ``values``: float32, shape ``x.shape``; for Q2_K and IQ2_XXS computed by
    the quantiser with the same float32 operations as the GGML decoder, so
    it equals ``gguf.quants.dequantize(data, qtype)`` exactly.
    """

    data: np.ndarray
    values: np.ndarray


def _as_type(qtype: GGMLQuantizationType | int) -> GGMLQuantizationType:
    try:
        qt = GGMLQuantizationType(int(qtype))
    except (ValueError, TypeError):
        raise ValueError(f"quantize: unknown GGML type {qtype!r}") from None
    if qt not in SUPPORTED_TYPES:
        names = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise ValueError(f"quantize: GGML type {qt.name} ({int(qt)}) is not supported; supported: {names}")
    return qt


def block_size(qtype: GGMLQuantizationType | int) -> int:
    """Elements per block of a supported GGML type (1, 32 or 256)."""
    return GGML_QUANT_SIZES[_as_type(qtype)][0]


def row_bytes(qtype: GGMLQuantizationType | int, n: int) -> int:
    """Bytes of a row of ``n`` elements of a supported GGML type.

    Raises ValueError when ``n`` is not a positive multiple of the block size.
    """
    qt = _as_type(qtype)
    bs, ts = GGML_QUANT_SIZES[qt]
    if n <= 0 or n % bs:
        raise ValueError(f"quantize: last dimension {n} is not a positive multiple of the {qt.name} block size {bs}")
    return n // bs * ts


def _check_input(x: np.ndarray, qt: GGMLQuantizationType, importance: np.ndarray | None):
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"quantize: input dtype {x.dtype} is not a real number type")
    if x.ndim == 0:
        raise ValueError(f"quantize: input must have at least one dimension to quantise to {qt.name}")
    row_bytes(qt, x.shape[-1])  # validates the last dimension
    x = np.ascontiguousarray(x, dtype=np.float32)
    bad = x.size - int(np.count_nonzero(np.isfinite(x)))
    if bad:
        raise ValueError(
            f"quantize: input has {bad} non-finite value(s) (NaN or inf) of {x.size}; cannot quantise to {qt.name}"
        )
    if importance is None:
        return x, None
    imp = np.asarray(importance)
    if imp.shape not in ((x.shape[-1],), x.shape):
        raise ValueError(
            f"quantize: importance shape {imp.shape} must be ({x.shape[-1]},) (one weight per column) "
            f"or the input shape {x.shape}"
        )
    imp = imp.astype(np.float32)
    bad = imp.size - int(np.count_nonzero(np.isfinite(imp)))
    if bad:
        raise ValueError(f"quantize: importance has {bad} non-finite value(s)")
    if (imp < 0).any():
        raise ValueError(f"quantize: importance has {int(np.count_nonzero(imp < 0))} negative value(s)")
    imp = np.ascontiguousarray(np.broadcast_to(imp, x.shape))
    return x, imp


def quantize(
    x: np.ndarray,
    qtype: GGMLQuantizationType,
    importance: np.ndarray | None = None,
) -> np.ndarray:
    """Quantise rows of ``x`` to the GGUF bytes of GGML type ``qtype``.

    x: real array, shape ``(..., n)``; blocks run along the last axis (GGUF
        ``ne[0]``), so ``n`` must be a multiple of the type's block size
        (1 for F32/F16/BF16, 32 for Q8_0, 256 for Q2_K and IQ2_XXS).  It is
        converted to float32 first, as GGML quantisers take float32 rows.
    qtype: one of :data:`SUPPORTED_TYPES`.
    importance: optional non-negative weights, shape ``(n,)`` (one per
        column, e.g. mean squared activation of that input) or ``x.shape``.
        Q2_K and IQ2_XXS minimise the importance-weighted squared error;
        without it Q2_K weighs elements uniformly and IQ2_XXS uses
        ``x**2 + mean(x**2)`` (the mean over the 256-element block): x**2
        protects large weights, and the block's mean square keeps small ones
        from being ignored (pure x**2 raises the plain relative RMS error on
        Gaussian data from 0.35 to 0.51).  The other types ignore it.

    Returns uint8 of shape ``x.shape[:-1] + (n // block * type_size,)``: the
    layout ``gguf.quants.quantize`` produces (for F32/F16 the byte view of its
    float arrays), ready for ``GGUFWriter.add_tensor(..., raw_dtype=qtype)``.

    Raises ValueError for an unsupported type, a last dimension that is not a
    multiple of the block size, non-finite input (the message gives the
    count), bad importance, or values whose block scale does not fit in f16
    (|x| above about 8.3e6 for Q8_0, 2.9e6 (positive) or 9.8e5
    (negative) for Q2_K, 1.09e7 for IQ2_XXS), F16 input beyond ±65504 and
    BF16 input that rounds to inf.  Blocks too small for the smallest f16
    scale (|x| below ~1e-7) are written as zeros.

    Source: spec ds4.md §5 "Quant block formats" (GGML block formats).
    """
    return quantize_with_reconstruction(x, qtype, importance).data


def quantize_with_reconstruction(
    x: np.ndarray,
    qtype: GGMLQuantizationType,
    importance: np.ndarray | None = None,
) -> QuantResult:
    """:func:`quantize`, also returning the float32 values the bytes decode to.

    Same arguments and errors as :func:`quantize`.  ``values`` has the shape
    of ``x``; the converter uses it to report quantisation error without a
    second decoding pass.
    """
    qt = _as_type(qtype)
    x, imp = _check_input(x, qt, importance)
    shape = x.shape
    n = shape[-1]
    out_shape = shape[:-1] + (row_bytes(qt, n),)

    if qt == T.F32:
        x = x.copy()  # never alias the caller's array
        return QuantResult(x.view(np.uint8).reshape(out_shape), x)
    if qt == T.F16:
        over = int(np.count_nonzero(np.abs(x) >= 65520.0))  # rounds to inf in f16
        if over:
            raise ValueError(f"quantize: {over} value(s) exceed the F16 range ±{_F16_MAX:g}")
        h = x.astype(np.float16)
        return QuantResult(h.view(np.uint8).reshape(out_shape), h.astype(np.float32))
    if qt == T.BF16:
        b = _f32_to_bf16_bits(x)
        over = int(np.count_nonzero((b & 0x7FFF) == 0x7F80))
        if over:
            raise ValueError(f"quantize: {over} value(s) round to inf in BF16")
        vals = (b.astype(np.uint32) << 16).view(np.float32)
        return QuantResult(b.view(np.uint8).reshape(out_shape), vals)
    if qt == T.Q8_0:
        blocks = x.reshape(-1, 32)
        dmax = np.abs(blocks).max(axis=1) / np.float32(127)
        if (dmax >= 65520.0).any():
            raise ValueError(f"quantize: Q8_0 block scale overflows f16 (max |x| {float(np.abs(x).max()):g} > ~8.3e6)")
        data = np.asarray(gguf_quants.quantize(x, T.Q8_0), dtype=np.uint8).reshape(out_shape)
        return QuantResult(data, gguf_quants.dequantize(data, T.Q8_0).reshape(shape))

    nb = x.size // 256
    blocks = x.reshape(nb, 256)
    wts = None if imp is None else imp.reshape(nb, 256)
    ts = GGML_QUANT_SIZES[qt][1]
    data = np.empty((nb, ts), dtype=np.uint8)
    vals = np.empty((nb, 256), dtype=np.float32)
    fn = _q2_k_blocks if qt == T.Q2_K else _iq2_xxs_blocks
    for s in range(0, nb, _BATCH_BLOCKS):
        e = min(nb, s + _BATCH_BLOCKS)
        data[s:e], vals[s:e] = fn(blocks[s:e], None if wts is None else wts[s:e])
    return QuantResult(data.reshape(out_shape), vals.reshape(shape))


# --------------------------------------------------------------------------- BF16


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns (uint16), round to nearest, ties to even."""
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return u.astype(np.uint16)


# --------------------------------------------------------------------------- f16 helpers


_F16_TINY = np.float32(2.0**-24)  # smallest positive f16 (subnormal)


def _f16_scale(v: np.ndarray, what: str) -> np.ndarray:
    """Round non-negative float32 scales to f16 (returned as float32).

    A positive scale that would round to 0 becomes the smallest f16 subnormal
    instead, so tiny blocks keep a usable (if coarse) scale.  Raises
    ValueError on overflow.
    """
    if (v >= 65520.0).any():
        raise ValueError(
            f"quantize: {what} {float(v.max()):g} overflows f16 (max {_F16_MAX:g}); input values are too large"
        )
    h = v.astype(np.float16).astype(np.float32)
    return np.where((v > 0) & (h == 0), _F16_TINY, h).astype(np.float32)


def _per_block_normalised(w: np.ndarray) -> np.ndarray:
    """Weights (nb, 256) divided by their block mean; all-zero blocks become uniform.

    Blocks are fitted independently, so this changes no choice; it keeps the
    floors added by the fits relative and the sums away from f32 underflow.
    """
    m = w.mean(axis=1, keepdims=True, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(m > 0, w / m, 1.0)
    return out.astype(np.float32)


# --------------------------------------------------------------------------- Q2_K

# Starting points for the per-sub-block range fit: the top code 3 is first
# placed at (max - min) / (3 + delta) above the minimum, for each delta.
_Q2K_DELTAS = np.array([0.0, 0.25, -0.25], dtype=np.float32)


def _q2_k_fit(x: np.ndarray, w: np.ndarray):
    """Continuous weighted fit x ~ a*q - b, q in 0..3, a >= 0, b >= 0, per row.

    x, w: (m, 16), w > 0.  From a few starting ranges, alternate nearest-code
    assignment and a weighted least-squares (a, b) restricted to a, b >= 0.
    Returns a, b of shape (m,).
    """
    m = x.shape[0]
    mn = np.minimum(x.min(axis=1), 0.0)
    mx = x.max(axis=1)
    rng = mx - mn
    sw = w.sum(axis=1)
    swx = (w * x).sum(axis=1)
    b_flat = np.maximum(-swx / sw, 0)  # best a = 0 fit: a constant offset
    best_err = np.full(m, np.inf, dtype=np.float32)
    best_a = np.zeros(m, dtype=np.float32)
    best_b = np.zeros(m, dtype=np.float32)
    for delta in _Q2K_DELTAS:
        a = rng / np.float32(3.0 + delta)
        b = -mn
        for _ in range(2):
            with np.errstate(divide="ignore", invalid="ignore"):
                q = np.clip(np.rint((x + b[:, None]) / a[:, None]), 0, 3)
            q = np.where(a[:, None] > 0, q, 0).astype(np.float32)
            swq = (w * q).sum(axis=1)
            swqq = (w * q * q).sum(axis=1)
            swqx = (w * q * x).sum(axis=1)
            det = swqq * sw - swq * swq
            with np.errstate(divide="ignore", invalid="ignore"):
                a_ls = (sw * swqx - swq * swx) / det
                c_ls = (swqq * swx - swq * swqx) / det  # the offset, -b
                a_c0 = np.where(swqq > 0, np.maximum(swqx / swqq, 0), 0)  # b = 0
            ok = (det > 1e-6 * swqq * sw) & (c_ls <= 0) & (a_ls >= 0)
            # candidates: unconstrained LS (when feasible), b = 0, a = 0
            cand_a = np.stack([np.where(ok, a_ls, 0), a_c0, np.zeros_like(a)])
            cand_b = np.stack([np.where(ok, -c_ls, b_flat), np.zeros_like(b), b_flat])
            r = cand_a[..., None] * q - cand_b[..., None] - x
            err = (w * r * r).sum(axis=-1)
            err[0] = np.where(ok, err[0], np.inf)
            k = err.argmin(axis=0)
            a = np.take_along_axis(cand_a, k[None], axis=0)[0].astype(np.float32)
            b = np.take_along_axis(cand_b, k[None], axis=0)[0].astype(np.float32)
            e = np.take_along_axis(err, k[None], axis=0)[0]
        better = e < best_err
        best_err = np.where(better, e, best_err)
        best_a = np.where(better, a, best_a)
        best_b = np.where(better, b, best_b)
    return best_a, best_b


def _q2_k_blocks(x: np.ndarray, imp: np.ndarray | None):
    """Q2_K for blocks x (nb, 256) float32; returns (bytes (nb, 84), values (nb, 256))."""
    nb = x.shape[0]
    xs = x.reshape(nb * 16, 16)
    if imp is None:
        w = np.ones_like(xs)
    else:
        w = _per_block_normalised(imp).reshape(nb * 16, 16)
        # a sub-block with all-zero importance still gets a sensible fit
        w = w + np.float32(1e-6) * w.mean(axis=1, keepdims=True) + np.float32(1e-12)
    a, b = _q2_k_fit(xs, w)
    a = a.reshape(nb, 16)
    b = b.reshape(nb, 16)
    d = _f16_scale(a.max(axis=1) / np.float32(15), "Q2_K super-block scale d")
    dmin = _f16_scale(b.max(axis=1) / np.float32(15), "Q2_K super-block scale dmin")
    with np.errstate(divide="ignore", invalid="ignore"):
        sc0 = np.where(d[:, None] > 0, np.rint(a / d[:, None]), 0)
        m0 = np.where(dmin[:, None] > 0, np.rint(b / dmin[:, None]), 0)
    # try the rounded codes and their neighbours; keep the best per sub-block
    off = np.array([0, -1, 1], dtype=np.float32)
    sc_c = np.clip(sc0[..., None, None] + off[:, None], 0, 15)  # (nb,16,3,1)
    m_c = np.clip(m0[..., None, None] + off[None, :], 0, 15)  # (nb,16,1,3)
    sc_c, m_c = np.broadcast_arrays(sc_c, m_c)
    sc_c = sc_c.reshape(nb, 16, 9).astype(np.float32)
    m_c = m_c.reshape(nb, 16, 9).astype(np.float32)
    dl = d[:, None, None] * sc_c  # same float32 products as the decoder
    ml = dmin[:, None, None] * m_c
    xv = x.reshape(nb, 16, 1, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.rint((xv + ml[..., None]) / dl[..., None]), 0, 3)
    # integer codes (this also turns the -0.0 that rint gives for small
    # negatives into +0.0, as the decoder sees an unsigned code)
    q = np.where(dl[..., None] > 0, q, 0).astype(np.uint8).astype(np.float32)
    rec = dl[..., None] * q - ml[..., None]
    r = rec - xv
    err = (w.reshape(nb, 16, 1, 16) * r * r).sum(axis=-1)
    k = err.argmin(axis=-1)  # first minimum: the rounded codes win ties
    pick = lambda arr: np.take_along_axis(arr, k[..., None], axis=2)[:, :, 0]  # noqa: E731
    sc = pick(sc_c).astype(np.uint8)
    mc = pick(m_c).astype(np.uint8)
    qq = np.take_along_axis(q, k[..., None, None], axis=2)[:, :, 0].astype(np.uint8)  # (nb,16,16)
    vals = np.take_along_axis(rec, k[..., None, None], axis=2)[:, :, 0].reshape(nb, 256)
    # a block whose fit is worse than all zeros (values far below the
    # smallest f16 scale) is written as zeros
    zero = pick(err).sum(axis=1) > (w * xs * xs).reshape(nb, 256).sum(axis=1)
    if zero.any():
        d[zero] = 0
        dmin[zero] = 0
        vals[zero] = 0

    out = np.empty((nb, 84), dtype=np.uint8)
    out[:, 0:16] = sc | (mc << 4)
    # element e = 128h + 32j + l sits in byte 32h + l at shift 2j
    qe = qq.reshape(nb, 2, 4, 32)
    packed = qe[:, :, 0] | (qe[:, :, 1] << 2) | (qe[:, :, 2] << 4) | (qe[:, :, 3] << 6)
    out[:, 16:80] = packed.reshape(nb, 64)
    out[:, 80:82] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    out[:, 82:84] = dmin.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return out, vals


# --------------------------------------------------------------------------- IQ2_XXS

_IQ2 = None


def _iq2_tables():
    """(grid (256,8) f32, grid^2 (256,8) f32, [grid^2; grid] transposed (16,256) f32)."""
    global _IQ2
    if _IQ2 is None:
        cls = gguf_quants.IQ2_XXS
        cls.init_grid()
        grid = np.ascontiguousarray(np.asarray(cls.grid, dtype=np.float32).reshape(256, 8))
        ks = np.frombuffer(cls.ksigns, dtype=np.uint8)
        # the format's sign table is "7 bits + even parity bit"; the packing below relies on it
        par = np.array([bin(i).count("1") & 1 for i in range(128)], dtype=np.uint8)
        if not np.array_equal(ks, np.arange(128, dtype=np.uint8) | (par << 7)):
            raise RuntimeError("gguf's IQ2_XXS ksigns table is not '7 sign bits + even parity'")
        grid2 = grid * grid
        _IQ2 = (grid, grid2, np.ascontiguousarray(np.concatenate([grid2, grid], axis=1).T))
    return _IQ2


# Candidate group scales, relative to max|x| / 43 (43 = the largest grid
# magnitude); each candidate is refined by least squares.  43/8 puts the
# largest element on magnitude 8, so flat groups (constant |x|) find the
# all-8 grid row and round-trip exactly.
_IQ2_SCALE_FACTORS = np.array([0.8, 1.0, 1.25, 43 / 8], dtype=np.float32)


def _iq2_xxs_blocks(x: np.ndarray, imp: np.ndarray | None):
    """IQ2_XXS for blocks x (nb, 256) float32; returns (bytes (nb, 66), values (nb, 256)).

    Per 8-element chunk with signs fixed (x's signs, parity repaired), the
    weighted error of grid row k at group scale s is, up to a constant,
    ``s * sum_j w_j g_kj^2 - 2 sum_j w_j t_j g_kj`` with t = |x| (negated at
    a flipped element): one (chunks x 16) @ (16 x 256) matmul and an argmin.
    """
    grid, grid2, gg_t = _iq2_tables()
    nb = x.shape[0]
    ng = nb * 8  # 32-element groups
    nc = ng * 4  # 8-element chunks
    xc = x.reshape(nc, 8)
    if imp is None:
        # x^2 regularised by the block's mean square (see quantize's docstring)
        xb = x * x
        imp = xb + xb.mean(axis=1, keepdims=True)
    w = _per_block_normalised(imp).reshape(nc, 8)
    # small floor so that all-zero weights in a group still pick sensibly
    gmean = w.reshape(ng, 32).mean(axis=1)
    w = w + (np.float32(1e-4) * np.repeat(gmean, 4)[:, None] + np.float32(1e-12))

    # signs follow x; an odd number of negatives flips the least important element
    neg = xc < 0
    odd = (np.count_nonzero(neg, axis=1) & 1).astype(bool)
    rows = np.nonzero(odd)[0]
    flip = np.argmin(w[rows] * np.abs(xc[rows]), axis=1)
    neg[rows, flip] = ~neg[rows, flip]
    sgn = np.where(neg, np.float32(-1), np.float32(1))
    t = xc * sgn  # target magnitudes (negative at a flipped element)
    wt = w * t

    lhs = np.empty((nc, 16), dtype=np.float32)
    lhs[:, 8:] = -2 * wt
    cost = np.empty((nc, 256), dtype=np.float32)

    def assign(scale_g):
        """Best grid row per chunk for per-group scales (ng,): idx, sum w t g, sum w g^2 per group."""
        np.multiply(w, np.repeat(scale_g, 4)[:, None], out=lhs[:, :8])
        np.matmul(lhs, gg_t, out=cost)
        idx = cost.argmin(axis=1)
        a = np.einsum("ij,ij->i", wt, np.take(grid, idx, axis=0)).reshape(ng, 4).sum(axis=1)
        b = np.einsum("ij,ij->i", w, np.take(grid2, idx, axis=0)).reshape(ng, 4).sum(axis=1)
        return idx, a, b

    s0 = np.abs(x.reshape(ng, 32)).max(axis=1) / np.float32(43)
    best_err = np.full(ng, np.inf, dtype=np.float32)
    best_s = np.zeros(ng, dtype=np.float32)
    for f in _IQ2_SCALE_FACTORS:
        _, a, b = assign(s0 * f)
        s = np.maximum(a, 0) / b  # least-squares group scale for this assignment
        err = -s * a  # weighted error at that scale, minus sum w t^2
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)

    # super-block scale: the largest group scale maps to code 15
    d = _f16_scale(best_s.reshape(nb, 8).max(axis=1) * np.float32(4 / 15.5), "IQ2_XXS super-block scale d")
    dg = np.repeat(d, 8)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(dg > 0, best_s * 4 / dg - 0.5, 0)
    lo = np.clip(np.floor(u), 0, 15).astype(np.float32)
    best_err = np.full(ng, np.inf, dtype=np.float32)
    ls = np.zeros(ng, dtype=np.float32)
    idx = np.zeros(nc, dtype=np.intp)
    for cand in (lo, np.minimum(lo + 1, 15)):
        db = dg * (np.float32(0.5) + cand) * np.float32(0.25)  # the decoder's float32 order
        ci, a, b = assign(db)
        err = db * db * b - 2 * db * a
        better = err < best_err
        best_err = np.where(better, err, best_err)
        ls = np.where(better, cand, ls)
        idx = np.where(np.repeat(better, 4), ci, idx)
    # a block whose fit is worse than all zeros (values far below the
    # smallest f16 scale) is written with d = 0
    zero = best_err.reshape(nb, 8).sum(axis=1) > 0
    d[zero] = 0
    dg = np.repeat(d, 8)
    db = dg * (np.float32(0.5) + ls) * np.float32(0.25)
    vals = (np.repeat(db, 4)[:, None] * grid[idx]) * sgn  # the decoder's float32 order

    bits = (neg[:, :7].astype(np.uint32) << np.arange(7, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    bits = bits.reshape(ng, 4)
    word = bits[:, 0] | (bits[:, 1] << 7) | (bits[:, 2] << 14) | (bits[:, 3] << 21) | (ls.astype(np.uint32) << 28)
    out = np.empty((nb, 66), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    grp = np.empty((ng, 8), dtype=np.uint8)
    grp[:, 0:4] = idx.reshape(ng, 4).astype(np.uint8)
    grp[:, 4:8] = word.astype("<u4").view(np.uint8).reshape(ng, 4)
    out[:, 2:] = grp.reshape(nb, 64)
    return out, vals.reshape(nb, 256)


# ---- 8-bit matmul activations (the `q8` activations option; spec ds4.md §2.9.5) ----------------

def quantize_q8_act(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Activation rows ``x`` [..., n] (n a multiple of 32) as the native engine quantises them:
    per block of 32, ``d = max|x| / 127`` and ``q = round(x * (1 / d))`` with ties away from zero
    (``q = 0`` when ``d = 0``), all in float32.  Returns (q int8 [..., n], d float32 [..., n / 32])."""
    x = np.asarray(x, np.float32)
    if x.shape[-1] % 32:
        raise ValueError(f"activation rows of {x.shape[-1]} elements are not a multiple of the 32-element block")
    xb = x.reshape(*x.shape[:-1], -1, 32)
    d = (np.abs(xb).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    v = (xb * inv[..., None]).astype(np.float32)
    t = np.trunc(v)
    q = t + np.where(np.abs(v - t) >= np.float32(0.5), np.sign(v), 0)  # ties away from zero, exactly
    return np.clip(q, -127, 127).astype(np.int8).reshape(x.shape), d


def _q8_weight_blocks(raw: np.ndarray, qtype, rows: int, cols: int):
    """A GGUF matrix as the ``q8`` arithmetic sees it (spec ds4.md §2.9.5): per 32-wide block the
    integer weights w [rows, nb, 32] (int32), the block scale s [rows, nb] (float32) and, for Q2_K, the
    super-block's dmin m [rows, nb] and the two 16-wide sub-blocks' min codes mn [rows, nb, 2]
    (None for the other types)."""
    qt = _as_type(qtype)
    nb = cols // 32
    data = np.frombuffer(np.ascontiguousarray(raw).tobytes(), np.uint8)
    if qt == GGMLQuantizationType.Q8_0:
        blocks = data.reshape(rows, nb, 34)
        s = blocks[:, :, :2].copy().view(np.float16).reshape(rows, nb).astype(np.float32)
        w = blocks[:, :, 2:].copy().view(np.int8).astype(np.int32)
        return w, s, None, None
    ns = cols // 256
    if qt == GGMLQuantizationType.Q2_K:
        blocks = data.reshape(rows, ns, 84)
        sc = blocks[:, :, :16].astype(np.int32)  # [rows, ns, 16 sub-blocks]
        qs = blocks[:, :, 16:80].astype(np.int32).reshape(rows, ns, 2, 32)  # [.., h, l]
        d = blocks[:, :, 80:82].copy().view(np.float16).reshape(rows, ns).astype(np.float32)
        dmin = blocks[:, :, 82:84].copy().view(np.float16).reshape(rows, ns).astype(np.float32)
        shifts = (2 * np.arange(4)).reshape(1, 1, 1, 4, 1)
        codes = (qs[:, :, :, None, :] >> shifts) & 3  # [rows, ns, h, j, l]: block 4h + j of the super-block
        sub = sc.reshape(rows, ns, 2, 4, 2)  # sub-block 8h + 2j + half
        lo = np.repeat(sub & 15, 16, axis=-1)  # [rows, ns, h, j, 32]
        w = (lo * codes).reshape(rows, nb, 32)
        mn = (sub >> 4).reshape(rows, nb, 2)
        return w, np.repeat(d, 8, axis=1), np.repeat(dmin, 8, axis=1), mn
    if qt == GGMLQuantizationType.IQ2_XXS:
        grid = _iq2_tables()[0].astype(np.int32)  # [256, 8]
        from gguf.quants import IQ2_XXS

        IQ2_XXS.init_grid()
        ksigns = np.frombuffer(bytes(IQ2_XXS.ksigns), np.uint8)
        blocks = data.reshape(rows, ns, 66)
        d = blocks[:, :, :2].copy().view(np.float16).reshape(rows, ns).astype(np.float32)
        grp = blocks[:, :, 2:].reshape(rows, ns, 8, 8)
        idx = grp[..., :4].astype(np.intp)
        word = grp[..., 4:].copy().view("<u4").reshape(rows, ns, 8)
        sg = ksigns[(word[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]  # [.., 8, 4]
        neg = (sg[..., None] >> np.arange(8, dtype=np.uint8)) & 1  # [.., 8, 4, 8]
        w = (grid[idx] * (1 - 2 * neg.astype(np.int32))).reshape(rows, nb, 32)
        ls = (word >> 28).astype(np.float32)
        s = ((d[..., None] * (np.float32(0.5) + ls)) * np.float32(0.25)).astype(np.float32).reshape(rows, nb)
        return w, s, None, None
    raise ValueError(f"the q8 activations option takes Q8_0, Q2_K and IQ2_XXS matrices, not {qt.name}")


def matmul_q8(raw: np.ndarray, qtype, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
    """Y [n_tok, rows] = the GGUF matrix ``raw`` (Q8_0, Q2_K or IQ2_XXS bytes, ``rows`` x ``cols``) times
    activation rows ``x`` [n_tok, cols] under the ``q8`` activations option, bit for bit as the native
    kernel computes it (cpu/dot.c; spec ds4.md §2.9.5): per 32-wide block an exact integer sum I of
    weight codes times activation codes, ``p = (s_w * d_x) * I`` (Q2_K: minus ``(dmin * d_x) * J``), added
    into 8 float32 accumulators (block b into b % 8, blocks in order), then a fixed reduction.  Raises
    ValueError for another type."""
    x = np.atleast_2d(np.asarray(x, np.float32))
    nb = cols // 32
    w, s, m, mn = _q8_weight_blocks(raw, qtype, rows, cols)
    qx, dx = quantize_q8_act(x)
    q = qx.astype(np.int32).reshape(-1, nb, 32)
    isum = np.einsum("rbj,tbj->trb", w, q).astype(np.float32)  # exact: |I| < 2^24
    p = (s[None] * dx[:, None, :]).astype(np.float32) * isum
    if m is not None:
        bs = q.reshape(-1, nb, 2, 16).sum(-1)  # [t, nb, 2]
        jsum = np.einsum("rbh,tbh->trb", mn, bs).astype(np.float32)
        p = p - (m[None] * dx[:, None, :]).astype(np.float32) * jsum
    acc = np.zeros((x.shape[0], rows, 8), np.float32)
    for b in range(nb):
        acc[..., b % 8] += p[..., b]
    s4 = acc[..., :4] + acc[..., 4:]
    s2 = s4[..., :2] + s4[..., 2:]
    return (s2[..., 0] + s2[..., 1]).astype(np.float32)


def matmul_q8_0_q8(raw: np.ndarray, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
    """``matmul_q8`` of a Q8_0 matrix: Y [n_tok, rows]."""
    return matmul_q8(raw, GGMLQuantizationType.Q8_0, rows, cols, x)
