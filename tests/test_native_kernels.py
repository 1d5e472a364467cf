"""The C matmul kernel (``ds4_kernel_matmul``) against dequantise-then-numpy.

Oracle: ``gguf.quants.dequantize`` of the weight bytes (numpy views for
F32/F16/BF16), then a float64 matmul with the float32 activations.  The
kernel keeps activations in float32 and differs only in float32 summation
order, so every element must satisfy

    |Y[t, r] - Y_ref[t, r]| <= 1e-5 * sum_c |W[r, c] * X[t, c]| + 1e-30

The relative term is the classical float32 bound (k + 1) * 2**-24 * sum|w x|
for a chain of k roundings per product, and 1e-5 is ~168 * 2**-24.  The batched
path (n_tok > 1, and BF16 always) dots 256-element chunks in 16 partial sums,
k <= ~40.  The fused single-token paths dot the whole row: 16 lanes for
F32/F16/Q2_K and 32 for Q8_0 give k <= ~150 at the widths used here (2047
float columns, 4096 Q8_0, 2304 Q2_K), within the worst case; the 8-lane
IQ2_XXS dot has k = cols/8 + 3 = 291 at 2304 columns, where 1e-5 is no longer
a worst-case guarantee, only a margin of ~100x over the random-signed errors
actually seen (all paths stay below ~1.5e-7 * sum|w x|).  The 1e-30 absorbs
float32 underflow of products with subnormal weights.

Weights come from the project's quantisers and from raw blocks with random
codes but scales chosen explicitly, one magnitude band a row so that every
block shows in the row's sum (finite f16: near ±65504, the smallest
subnormals, around 2**-14, ±0; two rows mix them), so no weight decodes to
inf/NaN (decode_weights asserts it); raw F32/F16/BF16 weights likewise never
have an all-ones exponent.  Coverage tests put every
Q8_0 int8 value, every Q2_K scale/min nibble pair and 2-bit code, every
IQ2_XXS grid index, sign index and scale code, and every finite F16/BF16
pattern through the kernel.  Row splits over 1, 2, 3 threads (and 0 = one
per core) must agree bit for bit.  Layouts: spec ds4.md §5.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from gguf.quants import quantize as quantize_q8
from test_native_dequant import f16_bits, iq2_xxs_block  # also fails loudly if the extension is missing

from ds4tui._native import ffi, lib
from ds4tui.engine.quants import quantize_with_reconstruction

T = GGMLQuantizationType
TYPES = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q2_K, T.IQ2_XXS)
ROWS = 7  # not a multiple of 2 or 3 threads
N_TOKS = (1, 2, 7, 33)  # 1: the fused single-token path (all types but BF16); others: the batched path
COLS = {
    T.F32: (1, 33, 2047),
    T.F16: (1, 33, 2047),
    T.BF16: (1, 33, 2047),
    T.Q8_0: (32, 96, 4096),
    T.Q2_K: (256, 512, 2304),
    T.IQ2_XXS: (256, 512, 2304),
}
REL_TOL = 1e-5
ABS_TOL = 1e-30
GUARD = 8  # float32 sentinels after Y that the kernel must not touch

# Raw blocks: row r draws every block's f16 scale from F16_SCALE_CLASSES[r]
# (bit ranges, random sign), so the blocks of a row have comparable scales and
# each one is visible in the row's sum; rows 4 and 6 mix magnitudes.
F16_SCALE_CLASSES = (
    (0x7BF0, 0x7BFF),  # the largest finite: 65024 .. 65504
    (0x0001, 0x000F),  # the smallest subnormals: 2**-24 .. 15 * 2**-24
    (0x03F0, 0x040F),  # the largest subnormals and smallest normals, around 2**-14
    (0x3800, 0x3FFF),  # 0.5 .. 2
    (0x0000, 0x7BFF),  # anything finite, mixed within the row
    (0x0000, 0x0000),  # zero (±0)
    None,  # only the extremes ±65504, ±2**-24, ±0, mixed within the row
)
EXTREME_F16_SCALES = (65504.0, -65504.0, 2.0**-24, -(2.0**-24), 0.0, -0.0)


# ---------------------------------------------------------------- helpers


def kernel_matmul(qtype: int, raw: np.ndarray, rows: int, cols: int, x: np.ndarray, n_threads: int = 3) -> np.ndarray:
    """Run ds4_kernel_matmul; fail with the C message on error; check Y is fully written and not overrun."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    assert raw.size == rows * lib.ds4_type_row_bytes(int(qtype), cols)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_tok = x.shape[0]
    assert x.shape == (n_tok, cols)
    y = np.full(n_tok * rows + GUARD, np.nan, dtype=np.float32)
    err = ffi.new("char[256]")
    rc = lib.ds4_kernel_matmul(int(qtype), ffi.from_buffer(raw), rows, cols,
                               ffi.cast("const float *", ffi.from_buffer(x)), n_tok,
                               ffi.cast("float *", ffi.from_buffer(y)), n_threads, err, 256)
    assert rc == lib.DS4_OK, ffi.string(err).decode()
    assert np.isnan(y[n_tok * rows :]).all(), "the kernel wrote past the end of Y"
    return y[: n_tok * rows].reshape(n_tok, rows)


def decode_weights(qtype: GGMLQuantizationType, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The oracle's float64 weights [rows, cols]; asserts they are finite (by construction)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, -1)
    if qtype == T.F32:
        w = raw.view("<f4")
    elif qtype == T.F16:
        w = raw.view("<f2")
    elif qtype == T.BF16:
        w = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        w = dequantize(raw, qtype)
    w = np.asarray(w, dtype=np.float64).reshape(rows, cols)
    assert np.isfinite(w).all(), "test weights must be finite"
    return w


def assert_matches_oracle(qtype, raw, rows, cols, x, y) -> None:
    w = decode_weights(qtype, raw, rows, cols)
    x64 = np.asarray(x, dtype=np.float64)
    want = x64 @ w.T
    bound = REL_TOL * (np.abs(x64) @ np.abs(w).T) + ABS_TOL
    assert np.isfinite(want).all()
    err = np.abs(y.astype(np.float64) - want)
    bad = np.argwhere(~(err <= bound))  # NaN in y counts as bad
    assert bad.size == 0, (
        f"{qtype.name} rows={rows} cols={cols} n_tok={x.shape[0]}: {len(bad)} of {y.size} outside the bound; "
        f"first [t={bad[0][0]}, r={bad[0][1]}]: C {y[tuple(bad[0])]!r} vs oracle {want[tuple(bad[0])]!r}, "
        f"|diff| {err[tuple(bad[0])]:.3g} > bound {bound[tuple(bad[0])]:.3g}"
    )


def activations(rng: np.random.Generator, n_tok: int, cols: int) -> np.ndarray:
    return rng.standard_normal((n_tok, cols)).astype(np.float32)


def f16_scales(rng: np.random.Generator, n: int, cls) -> np.ndarray:
    """n finite f16 scales of one F16_SCALE_CLASSES entry, as bytes (n, 2)."""
    if cls is None:
        bits = np.asarray(EXTREME_F16_SCALES, dtype=np.float16).view(np.uint16)[rng.integers(0, 6, size=n)]
    else:
        bits = rng.integers(cls[0], cls[1] + 1, size=n).astype(np.uint16)
        bits |= rng.integers(0, 2, size=n).astype(np.uint16) << 15
    assert np.isfinite(bits.view(np.float16)).all()
    return bits.view(np.uint8).reshape(n, 2)


def float_bits(rng: np.random.Generator, shape, exp_bits: int, mant_bits: int, lo: int, hi: int) -> np.ndarray:
    """Random sign and mantissa with biased exponent lo..hi (< all ones: no inf/NaN), as uint32."""
    assert 0 <= lo <= hi < (1 << exp_bits) - 1
    sign = rng.integers(0, 2, size=shape).astype(np.uint32)
    exp = rng.integers(lo, hi + 1, size=shape).astype(np.uint32)
    mant = rng.integers(0, 1 << mant_bits, size=shape).astype(np.uint32)
    return (sign << (exp_bits + mant_bits)) | (exp << mant_bits) | mant


FLOAT_LAYOUT = {T.F32: (8, 23, "<u4"), T.F16: (5, 10, "<u2"), T.BF16: (8, 7, "<u2")}  # exponent, mantissa bits


def float_exp_range(row: int, bias: int, top: int) -> tuple[int, int]:
    """Biased-exponent range of raw float weight row `row`: like F16_SCALE_CLASSES, one
    magnitude band a row (largest, subnormals, smallest normals, around 1), rows 4 and 6 mixed;
    `top` is the largest exponent used (30 for F16; bias + 100 for F32/BF16, so that float32
    sums stay finite; test_float_range_ends goes to the formats' ends)."""
    return [(top - 1, top), (0, 0), (1, 2), (bias - 1, bias), (0, top), (0, 1), (0, top)][row % 7]


def raw_extreme_weights(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int) -> np.ndarray:
    """rows x cols weights of random codes with explicitly chosen finite, often extreme, scales."""
    rng = np.random.default_rng(seed)
    if qtype in FLOAT_LAYOUT:
        eb, mb, dt = FLOAT_LAYOUT[qtype]
        bias = (1 << (eb - 1)) - 1
        top = 30 if qtype == T.F16 else bias + 100
        bits = np.stack([float_bits(rng, cols, eb, mb, *float_exp_range(r, bias, top)) for r in range(rows)])
        bits[0, 0] = (top << mb) | ((1 << mb) - 1)  # the largest value used (65504 for F16)
        if rows > 1:
            bits[1, :3] = [1, 0, 1 << (eb + mb)][:cols]  # smallest subnormal, +0, -0
        return bits.astype(dt).view(np.uint8).reshape(rows, -1)
    bs, ts = GGML_QUANT_SIZES[qtype]
    per_row = cols // bs
    blocks = rng.integers(0, 256, size=(rows, per_row, ts), dtype=np.uint8)  # every byte value is a valid code
    scale_fields = {T.Q8_0: [0], T.Q2_K: [80, 82], T.IQ2_XXS: [0]}[qtype]  # d (and dmin for Q2_K)
    for r in range(rows):
        for off in scale_fields:
            blocks[r, :, off : off + 2] = f16_scales(rng, per_row, F16_SCALE_CLASSES[r % 7])
    return blocks.reshape(rows, -1)


@functools.lru_cache(maxsize=None)
def weights(source: str, qtype: GGMLQuantizationType, cols: int) -> np.ndarray:
    seed = 1000 * TYPES.index(qtype) + cols
    if source == "quantised":
        w = np.random.default_rng(seed).standard_normal((ROWS, cols)).astype(np.float32)
        raw = quantize_with_reconstruction(w, qtype).data
    else:
        raw = raw_extreme_weights(qtype, ROWS, cols, seed)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(ROWS, -1)
    raw.flags.writeable = False
    return raw


# ---------------------------------------------------------------- agreement with the oracle


CASES = [pytest.param(qt, c, id=f"{qt.name}-{c}") for qt in TYPES for c in COLS[qt]]


@pytest.mark.parametrize("source", ["quantised", "raw_extreme"])
@pytest.mark.parametrize(("qtype", "cols"), CASES)
def test_matmul_matches_dequantise_then_numpy(qtype, cols, source):
    raw = weights(source, qtype, cols)
    rng = np.random.default_rng(cols)
    assert np.abs(decode_weights(qtype, raw, ROWS, cols)).max() > 0  # something to multiply
    for n_tok in N_TOKS:
        x = activations(rng, n_tok, cols)
        for rows in (1, ROWS):
            y = kernel_matmul(qtype, raw[:rows], rows, cols, x, n_threads=3)
            assert_matches_oracle(qtype, raw[:rows], rows, cols, x, y)


@pytest.mark.parametrize("qtype", TYPES)
def test_row_split_over_threads_is_bitwise_identical(qtype):
    # every row is computed by one thread, so the split must not change a bit;
    # rows 1 and 2 leave threads without work, 5 and 7 split unevenly
    cols = COLS[qtype][1]
    raw = weights("raw_extreme", qtype, cols)
    rng = np.random.default_rng(7)
    for n_tok in (1, 7):
        x = activations(rng, n_tok, cols)
        for rows in (1, 2, 5, ROWS):
            ys = [kernel_matmul(qtype, raw[:rows], rows, cols, x, n_threads=k) for k in (1, 2, 3, 0)]
            for k, y in zip((2, 3, 0), ys[1:]):
                assert np.array_equal(y.view(np.uint32), ys[0].view(np.uint32)), (
                    f"{qtype.name} rows={rows} n_tok={n_tok}: n_threads={k} differs from n_threads=1"
                )
            assert_matches_oracle(qtype, raw[:rows], rows, cols, x, ys[0])


@pytest.mark.parametrize("qtype", TYPES)
def test_batch_rows_equal_single_token_rows_bitwise(qtype):
    """Batch invariance: a batch of n tokens (the Q8_0, F16 and 2-bit kernels form each block's
    weights once for groups of up to 8 tokens, of any size) gives every token exactly the bits of a
    one-token call, for every batch size 1..19 (every group size and remainder) and 1..3 threads."""
    cols = COLS[qtype][1]
    raw = weights("raw_extreme", qtype, cols)
    x = activations(np.random.default_rng(3), 19, cols)
    single = np.stack([kernel_matmul(qtype, raw, ROWS, cols, x[k:k + 1], n_threads=1)[0] for k in range(19)])
    for threads in (1, 2, 3):
        for n in range(1, 20):
            y = kernel_matmul(qtype, raw, ROWS, cols, x[:n], n_threads=threads)
            assert np.array_equal(y.view(np.uint32), single[:n].view(np.uint32)), (
                f"{qtype.name} n_tok={n} threads={threads}")
        assert_matches_oracle(qtype, raw, ROWS, cols, x, y)


def test_f32_exact_small_integers():
    # an oracle-free check of the layout: integer products and sums are exact in float32
    rng = np.random.default_rng(8)
    w = rng.integers(-8, 9, size=(5, 40)).astype(np.float32)
    for n_tok in (1, 3):
        x = rng.integers(-8, 9, size=(n_tok, 40)).astype(np.float32)
        y = kernel_matmul(T.F32, w.view(np.uint8), 5, 40, x)
        assert np.array_equal(y, (x.astype(np.int64) @ w.T.astype(np.int64)).astype(np.float32))


# ---------------------------------------------------------------- every code through the kernel


@pytest.mark.parametrize("qtype", [T.F16, T.BF16])
def test_every_finite_half_pattern(qtype):
    # a row holds the 2**mantissa_bits patterns of one sign and exponent, so
    # every element is visible in its row's sum
    eb, mb, _ = FLOAT_LAYOUT[qtype]
    exp_mask = ((1 << eb) - 1) << mb
    bits = np.arange(65536, dtype=np.uint32)
    bits = bits[(bits & exp_mask) != exp_mask].astype("<u2")  # drop inf/NaN
    cols = 1 << mb
    raw = bits.view(np.uint8).reshape(-1, 2 * cols)
    assert len(raw) == 2 * ((1 << eb) - 1)
    # bf16 spans 2**-133 .. 3.4e38: activations x 2**64 for the lower half of the
    # exponents and x 2**-64 for the upper half keep the products normal float32 numbers
    row_exp = (bits[::cols] & exp_mask) >> mb
    groups = [(row_exp >= 0, 1.0)] if qtype == T.F16 else [(row_exp < 127, 2.0**64), (row_exp >= 127, 2.0**-64)]
    rng = np.random.default_rng(9)
    for rows_sel, scale in groups:
        part = np.ascontiguousarray(raw[rows_sel])
        for n_tok in (1, 3):
            x = activations(rng, n_tok, cols) * np.float32(scale)
            y = kernel_matmul(qtype, part, len(part), cols, x, n_threads=2)
            assert_matches_oracle(qtype, part, len(part), cols, x, y)
            assert (np.abs(y) > 2.0**-100).all()  # no row flushed to zero


@pytest.mark.parametrize("qtype", list(FLOAT_LAYOUT))
def test_float_range_ends(qtype):
    # the ends of the float formats, with activations scaled so that the
    # products are normal float32 numbers (else the absolute 1e-30 would hide
    # them): subnormal and smallest-normal weights times 2**100, the largest
    # finite weights times 2**-100; catches flush-to-zero and overflow in the kernel
    eb, mb, dt = FLOAT_LAYOUT[qtype]
    hi = (1 << eb) - 2
    rng = np.random.default_rng(13)
    for (lo_e, hi_e), scale in (((0, 1), 2.0**100), ((hi - 1, hi), 2.0**-100)):
        for cols in (33, 512):
            bits = float_bits(rng, (5, cols), eb, mb, lo_e, hi_e)
            if lo_e == 0:
                bits[0, :3] = [1, 0, 1 << (eb + mb)]  # the smallest subnormal, +0, -0
            else:
                bits[0, 0] = (hi << mb) | ((1 << mb) - 1)  # the largest finite value (65504 for F16)
            raw = bits.astype(dt).view(np.uint8).reshape(5, -1)
            for n_tok in (1, 3):
                x = activations(rng, n_tok, cols) * np.float32(scale)
                y = kernel_matmul(qtype, raw, 5, cols, x)
                assert_matches_oracle(qtype, raw, 5, cols, x, y)
                assert (np.abs(y) > 2.0**-100).all()  # nothing flushed to zero or lost


def test_q8_0_every_int8_value_with_extreme_scales():
    # one scale a row, the 256 int8 values over the row's 8 blocks
    scales = [65504.0, -65504.0, 65472.0, 2.0**-24, -(2.0**-24), 2.0**-23, 2.0**-14 - 2.0**-24, 2.0**-14,
              1.0, -0.1, 0.0, -0.0]
    blocks = np.zeros((len(scales), 8, 34), dtype=np.uint8)
    blocks[:, :, 2:] = np.arange(256, dtype=np.uint8).reshape(8, 32)
    for i, d in enumerate(scales):
        blocks[i, :, 0:2] = f16_bits([d])
    rows = len(scales)
    raw = blocks.reshape(rows, -1)
    rng = np.random.default_rng(10)
    for n_tok in (1, 2, 33):
        x = activations(rng, n_tok, 256)
        y = kernel_matmul(T.Q8_0, raw, rows, 256, x)
        assert_matches_oracle(T.Q8_0, raw, rows, 256, x, y)
        assert np.all(y[:, -2:] == 0)  # zero scales give exact zeros


def test_q2_k_every_scale_min_pair_and_code():
    # 16 blocks hold the 256 (scale, min) nibble pairs; every 4 blocks hold the
    # 256 qs bytes (each 2-bit code at each of the 4 shifts); 4 (d, dmin) pairs
    pairs = np.arange(256, dtype=np.uint8).reshape(16, 16)
    codes = np.arange(256, dtype=np.uint8).reshape(4, 64)
    blocks = np.zeros((4, 16, 84), dtype=np.uint8)
    for rep, (d, dmin) in enumerate([(0.5, 0.25), (-65504.0, 2.0**-24), (2.0**-24, -65504.0), (0.0, 1.5)]):
        for b in range(16):
            blocks[rep, b, 0:16] = pairs[b]
            blocks[rep, b, 16:80] = codes[(b + rep) % 4]
            blocks[rep, b, 80:82] = f16_bits([d])
            blocks[rep, b, 82:84] = f16_bits([dmin])
    sc, qs = blocks[..., 0:16], blocks[..., 16:80]
    assert set(np.unique(sc & 15)) == set(range(16)) and set(np.unique(sc >> 4)) == set(range(16))
    assert all(set(np.unique((qs >> s) & 3)) == {0, 1, 2, 3} for s in (0, 2, 4, 6))
    rows, cols = 8, 2048  # 8 blocks a row
    raw = blocks.reshape(rows, -1)
    rng = np.random.default_rng(11)
    for n_tok in (1, 2, 7):
        x = activations(rng, n_tok, cols)
        y = kernel_matmul(T.Q2_K, raw, rows, cols, x)
        assert_matches_oracle(T.Q2_K, raw, rows, cols, x, y)


def test_iq2_xxs_every_grid_index_sign_index_and_scale_code():
    # per d: 8 blocks x 8 groups x 4 chunks = 256 chunks take a permutation of
    # the 256 grid indices and two of the 128 sign indices; scale codes cycle 0..15
    rng = np.random.default_rng(12)
    blocks = []
    for d in (1.0, -0.75, 65504.0, 2.0**-24, 0.0):
        grid = rng.permutation(256).reshape(8, 8, 4)
        sign = np.concatenate([rng.permutation(128), rng.permutation(128)]).reshape(8, 8, 4)
        for b in range(8):
            groups = [(list(grid[b, g]), list(sign[b, g]), (8 * b + g) % 16) for g in range(8)]
            blocks.append(iq2_xxs_block(d, groups))
    blocks = np.stack(blocks)
    words = blocks[:, 2:].reshape(-1, 8, 8)[:, :, 4:].copy().view("<u4")[..., 0]
    assert set(np.unique(blocks[:, 2:].reshape(-1, 8, 8)[:, :, :4])) == set(range(256))
    assert set(np.unique(np.stack([(words >> (7 * k)) & 127 for k in range(4)]))) == set(range(128))
    assert set(np.unique(words >> 28)) == set(range(16))
    rows, cols = 5, 2048
    raw = blocks.reshape(rows, -1)
    for n_tok in (1, 2, 7):
        x = activations(rng, n_tok, cols)
        y = kernel_matmul(T.IQ2_XXS, raw, rows, cols, x)
        assert_matches_oracle(T.IQ2_XXS, raw, rows, cols, x, y)
    assert np.all(y[:, 4] == 0)  # the d = 0 row


# ---------------------------------------------------------------- errors


def call_matmul(qtype: int, rows: int, cols: int, n_tok: int = 1, nbytes: int = 4096):
    w = np.zeros(nbytes, dtype=np.uint8)
    x = np.zeros(max(n_tok * cols, 1) + 64, dtype=np.float32)
    y = np.full(max(n_tok * rows, 1) + 64, 7.0, dtype=np.float32)
    err = ffi.new("char[256]")
    rc = lib.ds4_kernel_matmul(qtype, ffi.from_buffer(w), rows, cols, ffi.cast("const float *", ffi.from_buffer(x)),
                               n_tok, ffi.cast("float *", ffi.from_buffer(y)), 2, err, 256)
    assert np.all(y == 7.0) or rc == lib.DS4_OK, "a failed call wrote to Y"
    return rc, ffi.string(err).decode()


@pytest.mark.parametrize("qtype", [2, int(T.I32), int(T.Q4_K), 999, -1])
def test_unsupported_type_is_reported(qtype):
    rc, msg = call_matmul(qtype, 2, 256)
    assert rc == lib.DS4_E_UNSUPPORTED
    assert "unsupported" in msg and str(qtype) in msg, msg


@pytest.mark.parametrize(("qtype", "cols"), [(T.Q8_0, 33), (T.Q8_0, 16), (T.Q2_K, 255), (T.Q2_K, 288),
                                             (T.IQ2_XXS, 32), (T.IQ2_XXS, 2304 + 128), (T.F32, 0), (T.Q2_K, -256)])
def test_cols_not_a_multiple_of_the_block_size_is_invalid(qtype, cols):
    rc, msg = call_matmul(int(qtype), 2, cols)
    assert rc == lib.DS4_E_INVALID
    bs = GGML_QUANT_SIZES[qtype][0]
    assert f"cols={cols}" in msg and str(bs) in msg and "multiple" in msg and qtype.name in msg, msg


def test_null_buffers_are_invalid_and_empty_products_are_ok():
    err = ffi.new("char[128]")
    rc = lib.ds4_kernel_matmul(int(T.Q8_0), ffi.NULL, 2, 32, ffi.NULL, 1, ffi.NULL, 1, err, 128)
    assert rc == lib.DS4_E_INVALID and "NULL" in ffi.string(err).decode()
    for rows, n_tok in ((0, 3), (3, 0)):
        assert lib.ds4_kernel_matmul(int(T.Q2_K), ffi.NULL, rows, 256, ffi.NULL, n_tok, ffi.NULL, 2, err, 128) == lib.DS4_OK


def test_one_block_rows_take_the_same_bits_one_token_or_many():
    """Q8_0 rows of one block (32 columns: the DSpark Markov head) against one token run 16 rows per
    vector on AVX-512; a row's result must be the bits of the multi-token kernels and close to the
    float64 product."""
    rng = np.random.default_rng(11)
    rows, cols = 16 * 5 + 3, 32
    raw = quantize_q8((rng.standard_normal((rows, cols)) * 0.1).astype(np.float32), GGMLQuantizationType.Q8_0)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    err = ffi.new("char[128]")

    def run(X):
        Y = np.full((X.shape[0], rows), np.nan, np.float32)
        assert lib.ds4_kernel_matmul(int(GGMLQuantizationType.Q8_0), ffi.from_buffer(raw), rows, cols,
                                     ffi.cast("const float *", ffi.from_buffer(X)), X.shape[0],
                                     ffi.cast("float *", ffi.from_buffer(Y)), 2, err, 128) == lib.DS4_OK
        return Y

    one, two = run(x), run(np.repeat(x, 2, axis=0))
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[0], two[1])
    ref = dequantize(raw, GGMLQuantizationType.Q8_0).reshape(rows, cols).astype(np.float64) @ x[0].astype(np.float64)
    assert np.abs(one[0] - ref).max() <= 1e-5 * np.abs(ref).max()


def _cc_build(tmp_path, march, sources, ffi):
    """cpu/SOURCES built here for -march=MARCH as the extension builds them (-O3, no fast math) into a
    shared library, opened through FFI (a cffi.FFI holding the declarations); skips where this is no
    x86-64 Linux machine, no C compiler is found, or (x86-64-v3) the CPU does not run the target."""
    import platform
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86-64 Linux targets")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("needs a C compiler")
    if march == "x86-64-v3" and not {"avx2", "fma", "f16c", "bmi2"} <= set(open("/proc/cpuinfo").read().split()):
        pytest.skip("this CPU does not run x86-64-v3")
    native = Path(__file__).resolve().parent.parent / "ds4tui" / "native"
    so = tmp_path / f"{Path(sources[0]).stem}_{march}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O3", "-std=c11", "-D_GNU_SOURCE", f"-march={march}", f"-I{native / 'cpu'}",
                    f"-I{native}", "-o", str(so), *(str(native / "cpu" / f) for f in sources), "-lm", "-lpthread"],
                   check=True, capture_output=True, text=True)
    return ffi.dlopen(str(so))


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])
def test_one_block_rows_same_bits_on_other_instruction_sets(tmp_path, march):
    """The one-block rows' 8-row kernel of AVX2 builds (x86-64-v3: AVX2 and FMA, no AVX-512) and the
    plain per-row form (x86-64), built from cpu/dot.c here, give a one-token call the bits of two-token
    calls (which run the build's per-row form), on any x86-64 CPU that runs the target; also where the
    extension itself is built for AVX-512 and takes the 16-row kernel instead."""
    import cffi

    cf = cffi.FFI()
    cf.cdef("void ds4_cpu_dot_q8_0(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, int64_t cols,"
            " const float *X, int64_t ldx, int64_t n_tok, float *Y, int64_t ldy);")
    dot = _cc_build(tmp_path, march, ["dot.c", "dequant.c"], cf)
    rng = np.random.default_rng(12)
    rows, cols = 8 * 9 + 5, 32
    raw = quantize_q8((rng.standard_normal((rows, cols)) * 0.1).astype(np.float32), GGMLQuantizationType.Q8_0)
    raw[3, 2:] = 0x80  # codes of -128, the extreme int8 value, in one row
    x = rng.standard_normal((1, cols)).astype(np.float32)
    x[0, 6] = np.float32(-1e-40)  # a subnormal activation

    def run(X, r0=0, r1=rows):
        Y = np.full((X.shape[0], rows), np.nan, np.float32)
        dot.ds4_cpu_dot_q8_0(cf.from_buffer(raw), cols + 2, r0, r1, cols, cf.cast("const float *", cf.from_buffer(X)),
                             cols, X.shape[0], cf.cast("float *", cf.from_buffer(Y)), rows)
        return Y

    one, two = run(x), run(np.repeat(x, 2, axis=0))
    assert np.array_equal(one[0].view(np.uint32), two[0].view(np.uint32))
    assert np.array_equal(one[0].view(np.uint32), two[1].view(np.uint32))
    shifted = run(x, 3, rows)  # the 8-row groups start at row 3: other rows share a vector
    assert np.array_equal(shifted[0, 3:].view(np.uint32), one[0, 3:].view(np.uint32))
    x2 = rng.standard_normal((1, cols)).astype(np.float32)  # no lane dominates: every addition's order shows
    one, two = run(x2), run(np.repeat(x2, 2, axis=0))
    assert np.array_equal(one[0].view(np.uint32), two[0].view(np.uint32))
    assert np.array_equal(one[0].view(np.uint32), two[1].view(np.uint32))
    ref = dequantize(raw, GGMLQuantizationType.Q8_0).reshape(rows, cols).astype(np.float64) @ x2[0].astype(np.float64)
    assert np.abs(one[0] - ref).max() <= 1e-5 * np.abs(ref).max()


def test_fp4_and_fp8_round_trips_same_bits_with_and_without_avx2(tmp_path):
    """cpu/ops.c's indexer QAT (Hadamard, then the FP4 E2M1 block round trip, spec ds4.md §2.9.3) and the
    KV's FP8 E4M3 round trip (§2.9.1) built for x86-64-v3 (their AVX2 paths: 8 lanes, no branches) give
    the bits of the plain x86-64 build's scalar loops (NaNs compared as NaNs), on random, huge, tiny,
    subnormal, tie and non-finite inputs, and on finite rows the values of the numpy reference
    (ds4tui.engine.reference: the same float32 steps)."""
    import cffi

    from ds4tui.engine import reference as R

    cf = cffi.FFI()
    cf.cdef("void ds4_indexer_qat(float *x, int64_t n); void ds4_fp8_kv_round_trip(float *row, int64_t width, int n_rot);")
    libs = {march: _cc_build(tmp_path, march, ["ops.c", "dot.c", "dequant.c"], cf) for march in ("x86-64-v3", "x86-64")}
    rng = np.random.default_rng(14)

    def row(kind, n):
        if kind == 0:
            return rng.standard_normal(n).astype(np.float32)
        if kind == 1:  # one magnitude a row, from subnormal to near the float32 maximum
            return (rng.standard_normal(n) * 10.0 ** rng.uniform(-44, 37)).astype(np.float32)
        if kind == 2:  # any bit pattern: NaNs, infinities, subnormals, -0
            return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
        if kind == 3:  # values on the grids' rounding ties
            return (rng.integers(-64, 65, n) * 0.125).astype(np.float32)
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.integers(0, n, 4)] = np.array([np.nan, -0.0, np.inf, 1e-45], np.float32)
        return x

    checked = 0
    for it in range(600):
        n = (64, 128, 256, 512)[it % 4]
        x = row(it % 5, n)
        for call in ("qat", "fp8"):
            out = {}
            for march, lib in libs.items():
                y = x.copy()
                p = cf.cast("float *", cf.from_buffer(y))
                if call == "qat":
                    lib.ds4_indexer_qat(p, n)
                else:
                    lib.ds4_fp8_kv_round_trip(p, n, 64 if n > 64 and it % 2 else 0)
                out[march] = y
            a, b = out["x86-64-v3"], out["x86-64"]
            same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
            assert same.all(), (call, n, it % 5, x[~same][:4], a[~same][:4], b[~same][:4])
            checked += n
            if it % 5 in (0, 3):  # finite rows: the numpy reference's float32 simulation, value for value
                n_rot = 64 if n > 64 and it % 2 else 0
                want = R.indexer_qat(x) if call == "qat" else R.fp8_kv_round_trip(x[None], n_rot)[0]
                assert np.array_equal(a, want), (call, n, it % 5)
    assert checked == 2 * 150 * (64 + 128 + 256 + 512)
    # FP4 ties after the Hadamard: for n a power of 4 the scaled transform is exact in float32 and its
    # own inverse, so rows built as H y / sqrt(n) come out of it as y, here on the E2M1 grid's
    # midpoints (0.25, 0.75, ..., 5) with a maximum of 6 (scale 1)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0, 6.0])
    for n in (64, 256, 1024):
        for _ in range(20):
            y = rng.choice(mids, n) * rng.choice([-1.0, 1.0], n)
            y[rng.integers(0, n)] = 6.0
            h = y.copy()
            stride = 1
            while stride < n:  # the Sylvester butterflies in float64
                h = h.reshape(-1, 2, stride)
                h = np.stack([h[:, 0] + h[:, 1], h[:, 0] - h[:, 1]], axis=1).reshape(n)
                stride *= 2
            x = (h / np.sqrt(n)).astype(np.float32)
            outs = []
            for lib in libs.values():
                z = x.copy()
                lib.ds4_indexer_qat(cf.cast("float *", cf.from_buffer(z)), n)
                outs.append(z)
            assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), n
            assert set(np.abs(outs[1]).tolist()) <= {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0}  # on the grid
