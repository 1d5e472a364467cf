"""The C dequantisers (``ds4_dequantize``) against ``gguf.quants.dequantize``.

The oracle is gguf's numpy decoder; the C code must agree bit for bit
(compared as uint32 patterns, so NaN payloads, signed zeros and infinities
count) on every block we can think of: random raw bytes (extreme and
non-finite scales), every f16/bf16 bit pattern, every int8 value, every
Q2_K scale/min code pair and 2-bit code byte, every IQ2_XXS grid index, sign
index and scale code.  Layouts: spec ds4.md §5.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import IQ2_XXS, dequantize

from ds4tui.engine.quants import quantize_with_reconstruction

try:
    from ds4tui._native import ffi, lib
except ImportError as exc:  # fail, do not skip: CI must build the extension
    raise ImportError(
        "the native extension ds4tui._native is not built; run `pip install -e .` "
        "(or `python build_native.py` for an in-place rebuild) before the tests"
    ) from exc

T = GGMLQuantizationType
FLOAT_TYPES = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q2_K, T.IQ2_XXS)


def native_dequantize(qtype: int, raw: np.ndarray, n: int) -> np.ndarray:
    """Run ds4_dequantize on raw bytes; fail the test with the C message on error."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.full(n, np.nan, dtype=np.float32)
    err = ffi.new("char[256]")
    rc = lib.ds4_dequantize(
        int(qtype), ffi.from_buffer(raw), ffi.cast("float *", ffi.from_buffer(out)), n, err, 256
    )
    assert rc == lib.DS4_OK, ffi.string(err).decode()
    return out


def assert_bitwise_equal(qtype: GGMLQuantizationType, raw: np.ndarray) -> None:
    """C and gguf decode the same bytes to the same float32 bit patterns."""
    bs, ts = GGML_QUANT_SIZES[qtype]
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    assert raw.size % ts == 0
    n = raw.size // ts * bs
    with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN scales are part of the test
        want = np.asarray(dequantize(raw.reshape(-1, ts), qtype), dtype=np.float32).reshape(-1)
    got = native_dequantize(qtype, raw, n)
    wb, gb = want.view(np.uint32), got.view(np.uint32)
    bad = np.nonzero(wb != gb)[0]
    assert bad.size == 0, (
        f"{qtype.name}: {bad.size} of {n} elements differ; first at {bad[0]} "
        f"(block {bad[0] // bs}): C {got[bad[0]]!r} ({gb[bad[0]]:#010x}) "
        f"vs gguf {want[bad[0]]!r} ({wb[bad[0]]:#010x})"
    )


def f16_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).view(np.uint8)


# ---------------------------------------------------------------- plain types


def test_f32_random_bit_patterns():
    rng = np.random.default_rng(100)
    raw = rng.integers(0, 256, size=4 * 4096, dtype=np.uint8)  # includes NaN payloads, inf, subnormals
    assert_bitwise_equal(T.F32, raw)


@pytest.mark.parametrize("qtype", [T.F16, T.BF16])
def test_half_types_every_bit_pattern(qtype):
    # all 65536 patterns: ±0, subnormals, normals, ±inf, quiet and signalling NaNs
    raw = np.arange(65536, dtype=np.uint16).view(np.uint8)
    assert_bitwise_equal(qtype, raw)


def test_f16_special_values():
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-24, -(2.0**-24), 2.0**-14 - 2.0**-24, 65504.0, 1.0],
                    dtype=np.float16)
    got = native_dequantize(T.F16, vals.view(np.uint8), vals.size)
    assert np.array_equal(got.view(np.uint32), vals.astype(np.float32).view(np.uint32))
    assert np.signbit(got[1]) and not np.signbit(got[0])
    assert got[5] == np.float32(2.0**-24)  # smallest subnormal is exact


# ---------------------------------------------------------------- Q8_0


def test_q8_0_random_raw_blocks():
    # random bytes: d covers every exponent incl. subnormal, inf and NaN
    rng = np.random.default_rng(101)
    assert_bitwise_equal(T.Q8_0, rng.integers(0, 256, size=(2048, 34), dtype=np.uint8))


def test_q8_0_every_int8_value_and_scale_extremes():
    scales = [1.0, -1.0, 0.0, -0.0, 65504.0, 2.0**-24, np.inf, np.nan]
    blocks = np.zeros((len(scales) * 8, 34), dtype=np.uint8)
    q = np.arange(256, dtype=np.uint8).reshape(8, 32)  # all int8 values over 8 blocks
    for i, d in enumerate(scales):
        blocks[8 * i : 8 * i + 8, 0:2] = f16_bits([d])
        blocks[8 * i : 8 * i + 8, 2:] = q
    assert_bitwise_equal(T.Q8_0, blocks)


# ---------------------------------------------------------------- Q2_K


def test_q2_k_random_raw_blocks():
    rng = np.random.default_rng(102)
    assert_bitwise_equal(T.Q2_K, rng.integers(0, 256, size=(1024, 84), dtype=np.uint8))


def test_q2_k_every_scale_min_pair_and_code_byte():
    # 256 (scale, min) code pairs over 16 blocks of 16 sub-blocks; every qs
    # byte value 0..255 (every combination of four 2-bit codes) over each 4
    # consecutive blocks; four (d, dmin) pairs incl. negative, extreme, inf, NaN
    blocks = np.zeros((16 * 4, 84), dtype=np.uint8)
    pairs = np.arange(256, dtype=np.uint8).reshape(16, 16)
    codes = np.arange(256, dtype=np.uint8).reshape(4, 64)
    for rep, (d, dmin) in enumerate([(0.5, 0.25), (-1.5, 3.0), (65504.0, 2.0**-24), (np.inf, np.nan)]):
        for b in range(16):
            row = blocks[rep * 16 + b]
            row[0:16] = pairs[b]
            row[16:80] = codes[(b + rep) % 4]
            row[80:82] = f16_bits([d])
            row[82:84] = f16_bits([dmin])
    assert_bitwise_equal(T.Q2_K, blocks)


# ---------------------------------------------------------------- IQ2_XXS


def iq2_xxs_block(d: float, groups: list[tuple[list[int], list[int], int]]) -> np.ndarray:
    """One 66-byte IQ2_XXS block from d and 8 (grid indices[4], sign indices[4], scale code)."""
    blk = np.zeros(66, dtype=np.uint8)
    blk[0:2] = f16_bits([d])
    for ib, (g, s, ls) in enumerate(groups):
        word = s[0] | (s[1] << 7) | (s[2] << 14) | (s[3] << 21) | (ls << 28)
        blk[2 + 8 * ib : 6 + 8 * ib] = g
        blk[6 + 8 * ib : 10 + 8 * ib] = np.array([word], dtype="<u4").view(np.uint8)
    return blk


def test_iq2_xxs_random_raw_blocks():
    rng = np.random.default_rng(104)
    assert_bitwise_equal(T.IQ2_XXS, rng.integers(0, 256, size=(1024, 66), dtype=np.uint8))


def test_iq2_xxs_every_grid_index_sign_index_and_scale_code():
    # 64 groups x 4 chunks = 256 chunks: chunk c uses grid index c and sign
    # index c mod 128 (every sign pattern twice), group i scale code i mod 16
    blocks = []
    for d in (1.0, -0.75, 65504.0, 2.0**-24):
        for b in range(8):
            groups = []
            for ib in range(8):
                gi = 8 * b + ib
                chunks = [4 * gi + k for k in range(4)]
                groups.append((chunks, [c % 128 for c in chunks], gi % 16))
            blocks.append(iq2_xxs_block(d, groups))
    blocks = np.stack(blocks)
    assert_bitwise_equal(T.IQ2_XXS, blocks)


def test_iq2_xxs_decodes_grid_and_signs_as_the_spec_says():
    # an independent check of the layout (spec §5), not only agreement with gguf
    IQ2_XXS.init_grid()
    grid = np.asarray(IQ2_XXS.grid).reshape(256, 8)
    groups = [([5, 77, 200, 255], [0, 1, 127, 64], 15)] + [([0, 0, 0, 0], [0, 0, 0, 0], 0)] * 7
    got = native_dequantize(T.IQ2_XXS, iq2_xxs_block(2.0, groups), 256)
    db = 2.0 * (0.5 + 15) / 4
    for k, (g, s) in enumerate(zip(groups[0][0], groups[0][1])):
        bits = s | ((bin(s).count("1") & 1) << 7)  # 8th sign = parity
        sign = np.array([-1.0 if (bits >> j) & 1 else 1.0 for j in range(8)])
        assert np.array_equal(got[8 * k : 8 * k + 8], (db * grid[g] * sign).astype(np.float32))
    assert np.all(got[32:] == np.float32(2.0 * 0.5 / 4 * 8))  # grid 0 is all 8s, no signs


@pytest.mark.parametrize("qtype", FLOAT_TYPES)
def test_our_quantiser_output_decodes_in_c_to_its_values(qtype):
    # end to end: what the converter writes is what the engine will read
    x = np.random.default_rng(105).standard_normal((8, 512)).astype(np.float32)
    res = quantize_with_reconstruction(x, qtype)
    got = native_dequantize(qtype, res.data, x.size)
    assert np.array_equal(got.view(np.uint32), res.values.reshape(-1).view(np.uint32))


# ---------------------------------------------------------------- sizes and errors


@pytest.mark.parametrize("qtype", [*FLOAT_TYPES, T.I32])
def test_type_row_bytes_match_gguf(qtype):
    bs, ts = GGML_QUANT_SIZES[qtype]
    for blocks in (0, 1, 3, 1000):
        assert lib.ds4_type_row_bytes(int(qtype), blocks * bs) == blocks * ts
    if bs > 1:
        assert lib.ds4_type_row_bytes(int(qtype), bs + 1) == 0
        assert lib.ds4_type_row_bytes(int(qtype), bs - 1) == 0


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q4_0, T.IQ2_XS])
def test_type_row_bytes_unsupported_is_zero(qtype):
    assert lib.ds4_type_row_bytes(int(qtype), 256) == 0


def call_dequantize(qtype: int, n: int, nbytes: int = 1024):
    src = np.zeros(nbytes, dtype=np.uint8)
    dst = np.zeros(max(n, 1) + 256, dtype=np.float32)
    err = ffi.new("char[256]")
    rc = lib.ds4_dequantize(qtype, ffi.from_buffer(src), ffi.cast("float *", ffi.from_buffer(dst)), n, err, 256)
    return rc, ffi.string(err).decode()


@pytest.mark.parametrize("qtype", [int(T.Q4_K), int(T.Q4_0), int(T.I32), 999, -1])
def test_unsupported_type_is_reported(qtype):
    rc, msg = call_dequantize(qtype, 256)
    assert rc == lib.DS4_E_UNSUPPORTED
    assert "unsupported" in msg and str(qtype) in msg, msg


@pytest.mark.parametrize(("qtype", "n"), [(T.Q8_0, 33), (T.Q8_0, 16), (T.Q2_K, 255), (T.IQ2_XXS, 32), (T.Q2_K, -256)])
def test_n_not_a_multiple_of_the_block_size_is_invalid(qtype, n):
    rc, msg = call_dequantize(int(qtype), n)
    assert rc == lib.DS4_E_INVALID
    bs = GGML_QUANT_SIZES[qtype][0]
    assert str(n) in msg and str(bs) in msg and "multiple" in msg, msg


def test_null_buffer_is_invalid():
    err = ffi.new("char[128]")
    rc = lib.ds4_dequantize(int(T.Q8_0), ffi.NULL, ffi.NULL, 32, err, 128)
    assert rc == lib.DS4_E_INVALID and "NULL" in ffi.string(err).decode()


def test_zero_elements_is_ok_and_small_error_buffers_are_safe():
    assert lib.ds4_dequantize(int(T.Q2_K), ffi.NULL, ffi.NULL, 0, ffi.NULL, 0) == lib.DS4_OK
    err = ffi.new("char[8]")
    assert lib.ds4_dequantize(12, ffi.NULL, ffi.NULL, 256, err, 8) == lib.DS4_E_UNSUPPORTED
    assert len(ffi.string(err)) == 7  # truncated, still NUL-terminated
