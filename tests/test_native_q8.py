"""8-bit matmul activations (the ``q8`` activations option, spec ds4.md §2.9.5).

The native kernels for Q8_0, Q2_K and IQ2_XXS weights against 8-bit activations are held bit for bit
to their numpy simulation (``ds4tui.engine.quants.matmul_q8``) on every instruction-set path (the
build's own, AVX2 only, portable C), at batch sizes 1..19 and 1..3 threads; the simulation itself is
held to gguf.quants' dequantisation times the quantised activations in float64 (within float32
rounding), and to the float64 product within the error that quantising the activations allows.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from ds4tui.engine import quants as dq
from ds4tui.engine.quants import matmul_q8, matmul_q8_0_q8, quantize_q8_act

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "ds4tui" / "native"

# 96 and 32 columns: a number of blocks that is not a multiple of the kernels' 8-block groups
SHAPES = {
    T.Q8_0: [(37, 256), (64, 1024), (129, 96), (8, 32), (9, 288), (33, 128), (23, 224)],
    T.Q2_K: [(37, 256), (64, 1024), (5, 512)],
    T.IQ2_XXS: [(37, 256), (64, 1024), (5, 512)],
}
CASES = [(t, r, c) for t, shapes in SHAPES.items() for r, c in shapes]
_RAW: dict = {}


def _case(qtype, rows: int, cols: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    key = (qtype, rows, cols, seed)
    if key not in _RAW:
        W = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        _RAW[key] = gq.quantize(W, T.Q8_0) if qtype == T.Q8_0 else dq.quantize(W, qtype)
    rng = np.random.default_rng(seed + 1000)
    X = rng.standard_normal((n, cols)).astype(np.float32) * rng.uniform(0.01, 10, (n, 1)).astype(np.float32)
    X[0, :32] = 0.0  # a block of zeros: d = 0
    if n > 1 and cols >= 64:
        X[1, 32: 64] = np.float32(0.5) * (np.arange(32) % 3 - 1)  # values on the rounding ties
    if n > 2 and cols >= 128:
        X[2, 64: 96] = np.float32(1e3) * np.sign(np.arange(32) - 15.5)  # full-scale codes: +-127
    return _RAW[key], X


def _native(lib, ffi, qtype, raw, rows, cols, X, threads: int, activations: int) -> np.ndarray:
    n = X.shape[0]
    Y = np.full((n, rows), np.nan, np.float32)
    err = ffi.new("char[256]")
    rc = lib.ds4_kernel_matmul_act(int(qtype), ffi.from_buffer(raw), rows, cols,
                                   ffi.cast("const float *", ffi.from_buffer(X)), n,
                                   ffi.cast("float *", ffi.from_buffer(Y)), threads, activations, err, 256)
    assert rc == 0, ffi.string(err).decode()
    return Y


def test_quantiser_rounds_ties_away_and_keeps_zero_blocks():
    x = np.zeros((1, 64), np.float32)
    x[0, 32:36] = [127.0, 63.5, -63.5, 0.25]  # d = 1: 63.5 rounds away from zero to 64
    q, d = quantize_q8_act(x)
    assert d.tolist() == [[0.0, 1.0]]
    assert q[0, :32].tolist() == [0] * 32 and q[0, 32:36].tolist() == [127, 64, -64, 0]


@pytest.mark.parametrize("qtype,rows,cols", CASES)
def test_kernel_is_its_simulation_bit_for_bit(qtype, rows, cols):
    """Every batch size 1..19 and 1..3 threads: the simulation's bits (so also batch invariance)."""
    from ds4tui._native import ffi, lib

    raw, X = _case(qtype, rows, cols, 19, rows)
    want = matmul_q8(raw, qtype, rows, cols, X)
    for threads in (1, 2, 3):
        for n in range(1, 20):
            got = _native(lib, ffi, qtype, raw, rows, cols, X[:n], threads, 1)
            assert np.array_equal(got, want[:n]), f"{qtype.name} {rows}x{cols}, {n} tokens, {threads} threads"


@pytest.mark.parametrize("qtype,rows,cols", CASES)
def test_simulation_is_the_dequantised_product_of_the_quantised_activations(qtype, rows, cols):
    """gguf.quants' weights times the simulated 8-bit activations (q * d), in float64: the q8 result
    differs only by float32 roundings, at most (n_blocks / 8 + 8) * 2^-24 of the sum of the magnitudes
    that are rounded (for Q2_K both terms, d * scale * code and dmin * min, before they cancel)."""
    raw, X = _case(qtype, rows, cols, 6, 11)
    got = matmul_q8(raw, qtype, rows, cols, X).astype(np.float64)
    Wd = gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    q, d = quantize_q8_act(X)
    Xq = (q.astype(np.float64).reshape(len(X), -1, 32) * d[..., None].astype(np.float64)).reshape(len(X), cols)
    want = Xq @ Wd.T
    mag = np.abs(Wd)
    if qtype == T.Q2_K:  # |d * scale * code| + |dmin * min| per element, from the bytes
        b = np.frombuffer(raw.tobytes(), np.uint8).reshape(rows, cols // 256, 84)
        sc = b[:, :, :16].astype(np.float64)
        dd = b[:, :, 80:82].copy().view(np.float16).astype(np.float64)
        dm = b[:, :, 82:84].copy().view(np.float16).astype(np.float64)
        part_min = np.repeat(np.abs(dm) * np.floor(sc / 16), 16, axis=-1).reshape(rows, cols)
        part_max = np.repeat(np.abs(dd) * (sc % 16) * 3, 16, axis=-1).reshape(rows, cols)
        mag = part_min + part_max
    tol = (cols // 32 / 8 + 8) * 2.0 ** -24 * (np.abs(Xq) @ mag.T) + 1e-30
    err = np.abs(got - want)
    assert (err <= tol).all(), float((err / tol).max())


@pytest.mark.parametrize("qtype", list(SHAPES))
def test_simulation_is_within_the_quantisation_error(qtype):
    """|q8 - float64| <= sum over blocks of (sum |w|) * d_x / 2, plus float32 rounding."""
    rows, cols = 64, 1024
    raw, X = _case(qtype, rows, cols, 4, 7)
    Wd = gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    got = matmul_q8(raw, qtype, rows, cols, X).astype(np.float64)
    exact = X.astype(np.float64) @ Wd.T
    _, dx = quantize_q8_act(X)
    wabs = np.abs(Wd).reshape(rows, cols // 32, 32).sum(-1)  # [rows, blocks]
    bound = (wabs[None] * dx[:, None, :].astype(np.float64) / 2).sum(-1)  # [n, rows]
    slack = 1e-5 * (np.abs(X.astype(np.float64)) @ np.abs(Wd).T) + 1e-30
    err = np.abs(got - exact)
    assert (err <= bound + slack).all(), float((err - bound - slack).max())
    assert err.max() > 0  # it does quantise: not the float path under another name


def test_q8_0_shorthand_is_matmul_q8():
    raw, X = _case(T.Q8_0, 8, 64, 3, 5)
    assert np.array_equal(matmul_q8_0_q8(raw, 8, 64, X), matmul_q8(raw, T.Q8_0, 8, 64, X))
    with pytest.raises(ValueError, match="Q8_0, Q2_K and IQ2_XXS.*not F16"):
        matmul_q8(np.zeros(64, np.uint8), T.F16, 1, 32, X[:, :32])


def test_float_path_is_unchanged_by_the_option():
    from ds4tui._native import ffi, lib

    raw, X = _case(T.Q8_0, 37, 256, 6, 3)
    for n in (1, 6):
        a = _native(lib, ffi, T.F16, np.zeros(37 * 256 * 2, np.uint8) + 60, 37, 256, X[:n], 2, 1)
        y = np.zeros((n, 37), np.float32)
        err = ffi.new("char[256]")
        assert lib.ds4_kernel_matmul(int(T.F16), ffi.from_buffer(np.zeros(37 * 256 * 2, np.uint8) + 60), 37, 256,
                                     ffi.cast("const float *", ffi.from_buffer(X[:n])), n,
                                     ffi.cast("float *", ffi.from_buffer(y)), 2, err, 256) == 0
        assert np.array_equal(a, y)  # F16 keeps float32 activations under q8
        a = _native(lib, ffi, T.Q8_0, raw, 37, 256, X[:n], 2, 0)
        assert lib.ds4_kernel_matmul(int(T.Q8_0), ffi.from_buffer(raw), 37, 256,
                                     ffi.cast("const float *", ffi.from_buffer(X[:n])), n,
                                     ffi.cast("float *", ffi.from_buffer(y)), 2, err, 256) == 0
        assert np.array_equal(a, y)
    err = ffi.new("char[256]")
    Y = np.zeros((1, 37), np.float32)
    rc = lib.ds4_kernel_matmul_act(int(T.Q8_0), ffi.from_buffer(raw), 37, 256,
                                   ffi.cast("const float *", ffi.from_buffer(X[:1])), 1,
                                   ffi.cast("float *", ffi.from_buffer(Y)), 1, 7, err, 256)
    assert rc == lib.DS4_E_INVALID and "activations 7" in ffi.string(err).decode()


# AVX-512 targets run only where this CPU has their instructions: cascadelake has VNNI but neither
# VBMI nor BITALG (the two-row kernels with the older 2-bit decodings), icelake-server has all three
# (the qword layout of the 2-bit rows)
MARCH_NEEDS = {"cascadelake": {"avx512bw", "avx512vl", "avx512_vnni"},
               "icelake-server": {"avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi", "avx512_bitalg"}}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.skipif(sys.platform != "linux" or not (shutil.which("cc") or shutil.which("gcc")),
                    reason="needs a C compiler")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64", "cascadelake", "icelake-server"])
def test_other_instruction_sets_give_the_same_bits(tmp_path, march):
    """cpu/dot.c built for an AVX2-only target (no VNNI, no AVX-512), for plain x86-64 (no AVX) and
    for two AVX-512 targets gives the simulation's bits too (the build's own path is checked above)."""
    import platform

    import cffi

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86-64 targets")
    missing = MARCH_NEEDS.get(march, set()) - _cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))} for -march={march}")
    if not (NATIVE / "cpu" / "iq2xxs_tables.h").exists():
        pytest.skip("the extension was not built from this tree (no generated tables)")
    cc = shutil.which("cc") or shutil.which("gcc")
    so = tmp_path / f"dot_{march}.so"  # -O3 as the extension: it unrolls the loops whose intrinsics take immediates
    subprocess.run([cc, "-shared", "-fPIC", "-O3", "-std=c11", "-D_GNU_SOURCE", f"-march={march}", "-o", str(so),
                    str(NATIVE / "cpu" / "dot.c"), str(NATIVE / "cpu" / "dequant.c"), "-lm", "-lpthread"], check=True,
                   capture_output=True, text=True)
    ffi = cffi.FFI()
    ffi.cdef("void ds4_cpu_quantize_q8_act(const float *x, int64_t n, int8_t *q, float *d);"
             "int ds4_cpu_matmul_q8_1(int type, const uint8_t *W, int64_t rows, int64_t cols, const float *X,"
             " int64_t n_tok, float *Y);")
    lib = ffi.dlopen(str(so))
    for qtype, rows, cols in CASES:
        raw, X = _case(qtype, rows, cols, 11, rows + 1)
        n = X.shape[0]
        qx = np.empty((n, cols), np.int8)
        dx = np.empty((n, cols // 32), np.float32)
        for t in range(n):
            lib.ds4_cpu_quantize_q8_act(ffi.cast("const float *", ffi.from_buffer(X[t])), cols,
                                        ffi.cast("int8_t *", ffi.from_buffer(qx[t])),
                                        ffi.cast("float *", ffi.from_buffer(dx[t])))
        q_ref, d_ref = quantize_q8_act(X)
        assert np.array_equal(qx, q_ref) and np.array_equal(dx, d_ref)
        want = matmul_q8(raw, qtype, rows, cols, X)
        for k in (1, 6, n):
            Y = np.full((k, rows), np.nan, np.float32)
            assert lib.ds4_cpu_matmul_q8_1(int(qtype), ffi.from_buffer(raw), rows, cols,
                                           ffi.cast("const float *", ffi.from_buffer(X[:k])), k,
                                           ffi.cast("float *", ffi.from_buffer(Y))) == 0
            assert np.array_equal(Y, want[:k]), f"{march}: {qtype.name} {rows}x{cols}, {k} tokens"



# bytes of a 32-wide block whose products one int16 lane of the IQ2_XXS kernel sums (the lane of dword
# pair 0 over the first three 4-byte vectors: bytes 4j, 4j + 1 for j < 3)
_IQ2_LANE = [0, 1, 4, 5, 8, 9]


def _extreme_rows(qtype, rows: int, cols: int, seed: int) -> np.ndarray:
    """Raw rows whose 8-bit products are as large as the format allows: Q2_K every scale and code at
    its maximum (w = 15 * 3 = 45, min code 15); IQ2_XXS grid rows chosen so that the bytes one int16
    lane sums are 43 wherever the grid allows, random signs and group scales."""
    rng = np.random.default_rng(seed)
    nsb = rows * cols // 256
    one = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    if qtype == T.Q2_K:
        b = np.full((nsb, 84), 0xFF, np.uint8)
        b[:, 80:82] = one
        b[:, 82:84] = one
        return b.reshape(-1)
    grid = dq._iq2_tables()[0]
    # grid row k of a group covers bytes 8k .. 8k + 7: rows 0 and 1 get the grid entry with the largest
    # sum over bytes 0, 1, 4, 5 (the lane's six products then reach 188 * 127 = 23876; eight of them,
    # one vector more, would reach 274 * 127 = 34798 and leave int16)
    big = int(np.argmax(grid[:, [0, 1, 4, 5]].sum(1)))
    b = np.zeros((nsb, 66), np.uint8)
    b[:, 0:2] = one
    g = b[:, 2:].reshape(nsb, 8, 8)
    g[:, :, 0], g[:, :, 1] = big, big
    g[:, :, 2:4] = rng.integers(0, 256, (nsb, 8, 2), dtype=np.uint8)
    words = rng.integers(0, 2 ** 32, (nsb, 8), dtype=np.uint64).astype(np.uint32)
    g[:, :, 4:] = words.view(np.uint8).reshape(nsb, 8, 4)
    return b.reshape(-1)


@pytest.mark.parametrize("qtype", [T.Q2_K, T.IQ2_XXS])
def test_largest_products_of_the_small_weight_types(qtype):
    """Q2_K and IQ2_XXS weights at their largest against activations of +-127 whose signs follow the
    weights (every product positive and maximal: the AVX2 kernels add several vectors of maddubs sums
    in int16 for these types, which must stay exact): the simulation's bits at 1..8 tokens, 1..3
    threads."""
    from ds4tui._native import ffi, lib

    rows, cols = 8, 512
    raw = _extreme_rows(qtype, rows, cols, 3)
    Wd = gq.dequantize(raw, qtype).reshape(rows, cols)
    X = (np.where(Wd >= 0, 1.0, -1.0) * 1000.0).astype(np.float32)  # token t follows row t's signs
    q, _ = quantize_q8_act(X)
    assert (np.abs(q) == 127).all()
    if qtype == T.IQ2_XXS:  # six products of a lane reach 0.7 of the int16 bound, eight would pass it
        grid = dq._iq2_tables()[0]
        six = grid[int(raw[2])][[0, 1, 4, 5]].sum() + grid[int(raw[3])][[0, 1]].sum()
        eight = six + grid[int(raw[3])][[4, 5]].sum()
        assert six * 127 >= 0.7 * 32767 and eight * 127 > 32767
    want = matmul_q8(raw, qtype, rows, cols, X)
    for threads in (1, 2, 3):
        for n in range(1, rows + 1):
            got = _native(lib, ffi, qtype, raw, rows, cols, X[:n], threads, 1)
            assert np.array_equal(got, want[:n]), f"{qtype.name}, {n} tokens, {threads} threads"
