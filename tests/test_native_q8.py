"""8-bit matmul activations (the ``q8`` activations option, spec ds4.md §2.9.5).

The native Q8_0 x 8-bit-activation kernel is held bit for bit to its numpy simulation
(``ds4tui.engine.quants.matmul_q8_0_q8``) on every instruction-set path (the build's own, AVX2 only,
portable C), at batch sizes 1..19 and 1..3 threads; the simulation itself is held to a float64
product within the error that quantising the activations allows.
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

from ds4tui.engine.quants import matmul_q8_0_q8, quantize_q8_act

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "ds4tui" / "native"

SHAPES = [(37, 256), (64, 1024), (129, 96), (8, 32)]  # 96 and 32 columns: an odd number of blocks


def _case(rows: int, cols: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    raw = gq.quantize(W, T.Q8_0)
    X = rng.standard_normal((n, cols)).astype(np.float32) * rng.uniform(0.01, 10, (n, 1)).astype(np.float32)
    X[0, :32] = 0.0  # a block of zeros: d = 0
    if n > 1 and cols >= 64:
        X[1, 32: 64] = np.float32(0.5) * (np.arange(32) % 3 - 1)  # values on the rounding ties
    return raw, X


def _native(lib, ffi, raw, rows, cols, X, threads: int, activations: int) -> np.ndarray:
    n = X.shape[0]
    Y = np.full((n, rows), np.nan, np.float32)
    err = ffi.new("char[256]")
    rc = lib.ds4_kernel_matmul_act(int(T.Q8_0), ffi.from_buffer(raw), rows, cols,
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


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_kernel_is_its_simulation_bit_for_bit(rows, cols):
    from ds4tui._native import ffi, lib

    raw, X = _case(rows, cols, 19, rows)
    want = matmul_q8_0_q8(raw, rows, cols, X)
    for threads in (1, 2, 3):
        for n in (1, 2, 5, 6, 8, 13, 19):
            got = _native(lib, ffi, raw, rows, cols, X[:n], threads, 1)
            assert np.array_equal(got, want[:n]), f"{rows}x{cols}, {n} tokens, {threads} threads"


def test_simulation_is_within_the_quantisation_error():
    """|q8 - float64| <= sum over blocks of (sum |w|) * d_x / 2, plus float32 rounding."""
    rows, cols = 64, 1024
    raw, X = _case(rows, cols, 4, 7)
    Wd = gq.dequantize(raw, T.Q8_0).reshape(rows, cols).astype(np.float64)
    got = matmul_q8_0_q8(raw, rows, cols, X).astype(np.float64)
    exact = X.astype(np.float64) @ Wd.T
    _, dx = quantize_q8_act(X)
    wabs = np.abs(Wd).reshape(rows, cols // 32, 32).sum(-1)  # [rows, blocks]
    bound = (wabs[None] * dx[:, None, :].astype(np.float64) / 2).sum(-1)  # [n, rows]
    slack = 1e-5 * (np.abs(X.astype(np.float64)) @ np.abs(Wd).T) + 1e-30
    err = np.abs(got - exact)
    assert (err <= bound + slack).all(), float((err - bound - slack).max())
    assert err.max() > 0  # it does quantise: not the float path under another name


def test_float_path_is_unchanged_by_the_option():
    from ds4tui._native import ffi, lib

    raw, X = _case(37, 256, 6, 3)
    for n in (1, 6):
        a = _native(lib, ffi, raw, 37, 256, X[:n], 2, 0)
        y = np.zeros((n, 37), np.float32)
        err = ffi.new("char[256]")
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


@pytest.mark.skipif(sys.platform != "linux" or not (shutil.which("cc") or shutil.which("gcc")),
                    reason="needs a C compiler")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])
def test_other_instruction_sets_give_the_same_bits(tmp_path, march):
    """cpu/dot.c built for an AVX2-only target and for plain x86-64 (no AVX) gives the simulation's
    bits too (the build's own path is checked above)."""
    import platform

    import cffi

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86-64 targets")
    if not (NATIVE / "cpu" / "iq2xxs_tables.h").exists():
        pytest.skip("the extension was not built from this tree (no generated tables)")
    cc = shutil.which("cc") or shutil.which("gcc")
    so = tmp_path / f"dot_{march}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-std=c11", "-D_GNU_SOURCE", f"-march={march}", "-o", str(so),
                    str(NATIVE / "cpu" / "dot.c"), str(NATIVE / "cpu" / "dequant.c"), "-lm"], check=True,
                   capture_output=True, text=True)
    ffi = cffi.FFI()
    ffi.cdef("void ds4_cpu_quantize_q8_act(const float *x, int64_t n, int8_t *q, float *d);"
             "void ds4_cpu_dot_q8_0_q8(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, int64_t cols,"
             " const int8_t *qx, int64_t ldq, const float *dx, int64_t n_tok, float *Y, int64_t ldy);")
    lib = ffi.dlopen(str(so))
    for rows, cols in SHAPES:
        raw, X = _case(rows, cols, 11, rows + 1)
        n = X.shape[0]
        qx = np.empty((n, cols), np.int8)
        dx = np.empty((n, cols // 32), np.float32)
        for t in range(n):
            lib.ds4_cpu_quantize_q8_act(ffi.cast("const float *", ffi.from_buffer(X[t])), cols,
                                        ffi.cast("int8_t *", ffi.from_buffer(qx[t])),
                                        ffi.cast("float *", ffi.from_buffer(dx[t])))
        q_ref, d_ref = quantize_q8_act(X)
        assert np.array_equal(qx, q_ref) and np.array_equal(dx, d_ref)
        Y = np.full((n, rows), np.nan, np.float32)
        lib.ds4_cpu_dot_q8_0_q8(ffi.from_buffer(raw), cols // 32 * 34, 0, rows, cols,
                                ffi.cast("const int8_t *", ffi.from_buffer(qx)), cols,
                                ffi.cast("const float *", ffi.from_buffer(dx)), n,
                                ffi.cast("float *", ffi.from_buffer(Y)), rows)
        assert np.array_equal(Y, matmul_q8_0_q8(raw, rows, cols, X)), f"{march}: {rows}x{cols}"
