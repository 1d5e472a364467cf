"""Greedy's argmax (``ds4_kernel_argmax``: the engine's ``ds4_argmax`` and ``ds4_argmax_sum``) against
the scalar rule it replaces.

The rule (spec dspark.md §2.4 and §3.4: greedy decoding, the verify's per-row argmax and the CPU
drafter's add-and-argmax) is the loop ``best = 0; for i in 1..n: if x[i] > x[best]: best = i``:
the first maximum, ``-0.0 == +0.0``, a NaN never becomes best, a NaN at index 0 gives 0.  The
vectorised version finds the largest non-NaN value and then its first index; every row here must
give exactly the loop's index.  The reference below is that loop in Python over the float32 values
(a float32 compares the same as a double), and for the sum form over numpy's float32 sums (one
IEEE addition each, the same as C's).
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4tui._native import ffi, lib

V = 129280  # the demo's (and V4 Flash's) vocabulary


def scalar_rule(x: np.ndarray) -> int:
    """The loop the engine ran before: first maximum, NaN never best, NaN at 0 gives 0."""
    vals = x.tolist()
    best = 0
    for i in range(1, len(vals)):
        if vals[i] > vals[best]:
            best = i
    return best


def native(x: np.ndarray, b: np.ndarray | None = None) -> int:
    x = np.ascontiguousarray(x, dtype=np.float32)
    px = ffi.cast("float *", ffi.from_buffer(x)) if x.size else ffi.new("float[1]")
    if b is None:
        return lib.ds4_kernel_argmax(px, ffi.NULL, x.size)
    b = np.ascontiguousarray(b, dtype=np.float32)
    assert b.size == x.size
    pb = ffi.cast("float *", ffi.from_buffer(b)) if b.size else ffi.new("float[1]")
    return lib.ds4_kernel_argmax(px, pb, x.size)


def check(x: np.ndarray) -> int:
    """Assert the native index equals the scalar rule's, also as a sum with zeros and split in two
    rows whose float32 sum is x; return the index."""
    want = scalar_rule(x)
    assert native(x) == want, (x.size, want, native(x))
    zeros = np.zeros_like(x)
    assert native(x, zeros) == scalar_rule(x + zeros) == native(x + zeros)
    return want


def check_sum(a: np.ndarray, b: np.ndarray) -> None:
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf and overflow are part of the cases
        s = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float32)
    assert native(a, b) == scalar_rule(s), (a.size, scalar_rule(s), native(a, b))


SPECIALS = (np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, np.float32(3.4028235e38), -np.float32(3.4028235e38),
            np.float32(1e-45), -np.float32(1e-45))


def test_fixed_cases_give_the_loop_s_index():
    f = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731
    nan, inf = np.nan, np.inf
    cases = {
        (): 0, (5.0,): 0, (nan,): 0,
        (nan, 1.0, 2.0): 0,                # NaN at 0: nothing compares greater than it
        (1.0, nan, 2.0): 2, (1.0, 2.0, nan): 1, (1.0, nan, nan): 0,
        (-0.0, 0.0): 0, (0.0, -0.0): 0, (-1.0, -0.0, 0.0): 1, (-1.0, 0.0, -0.0): 1,
        (-inf, -inf, -inf): 0, (-inf, nan, -inf): 0, (1.0, inf, inf): 1, (inf, nan, inf): 0,
        (-inf, -5.0, -inf): 1, (3.0, 3.0, 3.0): 0, (1.0, 3.0, 2.0, 3.0): 1,
    }
    for vals, want in cases.items():
        x = f(*vals)
        assert scalar_rule(x) == want, vals  # the reference itself
        assert native(x) == want, vals
    # the sum form: inf + -inf is a NaN, and a NaN sum at 0 gives 0
    assert native(f(inf, 1.0, 2.0), f(-inf, 0.0, 0.0)) == 0
    assert native(f(1.0, inf, 2.0), f(0.0, -inf, 0.0)) == 2
    assert native(f(1.0, 2.0, 0.5), f(1.0, 0.0, 1.5)) == 0   # 2, 2, 2: the first


@pytest.mark.parametrize("n", range(1, 71))
def test_short_rows_every_length(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        check(rng.standard_normal(n).astype(np.float32))
        check(rng.integers(-2, 3, n).astype(np.float32))              # ties at many places
        x = rng.choice(np.array(SPECIALS, dtype=np.float32), n)       # NaN/inf/±0 anywhere
        check(x)
        y = rng.standard_normal(n).astype(np.float32)
        y[rng.integers(0, n)] = np.nan
        check(y)
        check_sum(rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32))
        check_sum(rng.choice(np.array(SPECIALS, dtype=np.float32), n), rng.choice(np.array(SPECIALS, dtype=np.float32), n))


def test_all_zeros_of_both_signs_and_all_nan_tails():
    for n in (1, 2, 63, 64, 65, 127, 128, 129, 1000):
        rng = np.random.default_rng(n)
        z = np.where(rng.random(n) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
        assert check(z) == 0
        z[: n // 2] = -1.0
        assert check(z) == n // 2
        x = np.full(n, np.nan, dtype=np.float32)
        x[0] = -np.inf
        assert check(x) == 0
        x[n - 1] = -1e30 if n > 1 else x[0]
        assert check(x) == (n - 1 if n > 1 else 0)


def _vocab_rows(rng):
    base = (rng.standard_normal(V) * 3).astype(np.float32)
    yield base
    # the maximum planted at the start, around the 64-element block edges, the middle, the tail
    for at in (0, 1, 63, 64, 65, V // 2, V - 65, V - 64, V - 2, V - 1):
        x = base.copy()
        x[at] = 100.0
        yield x
        y = x.copy()                   # the same maximum again later: still the first
        y[min(at + 1 + at % 7, V - 1)] = 100.0
        yield y
    # ties everywhere (few distinct values), signed zeros as the maximum, NaN and inf planted
    yield rng.integers(-3, 4, V).astype(np.float32)
    z = -np.abs(base)
    z[[70000, 5, 129279]] = [0.0, -0.0, 0.0]
    yield z
    for at in (0, 1, 64, V // 2, V - 1):
        for special in (np.nan, np.inf, -np.inf):
            x = base.copy()
            x[at] = special
            yield x
    x = base.copy()
    x[rng.integers(0, V, 5000)] = np.nan
    yield x
    x = base.copy()
    x[[10, 90000]] = np.inf
    x[[3, 129000]] = np.nan
    yield x
    x = np.full(V, -np.inf, dtype=np.float32)
    x[[40000, 129279]] = np.nan
    yield x
    x[77777] = -3.0
    yield x


def test_vocabulary_rows():
    rng = np.random.default_rng(24)
    n_rows = 0
    for x in _vocab_rows(rng):
        check(x)
        n_rows += 1
    assert n_rows > 40


def test_vocabulary_rows_as_sums():
    """The drafter's form: argmax of base logits + the Markov head's row, summed in float32."""
    rng = np.random.default_rng(25)
    rows = list(_vocab_rows(rng))
    for i, a in enumerate(rows):
        b = (rng.standard_normal(V) * 0.5).astype(np.float32)
        if i % 3 == 0:
            b[rng.integers(0, V, 50)] = rng.choice(np.array([np.nan, np.inf, -np.inf], dtype=np.float32), 50)
        check_sum(a, b)
    # sums that tie although the parts differ
    a = np.arange(V, dtype=np.float32) % 1000
    b = (1000 - a).astype(np.float32)
    assert native(a, b) == 0
    b[500] += 1
    assert native(a, b) == 500
