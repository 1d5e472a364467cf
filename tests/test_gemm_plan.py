"""The prefill GEMM's layout of an expert product (hip/gemm_plan.h, spec platform.md §7.1), built here
with the C++ compiler and checked against the rules the spec states: tiles of whole matrices ordered
by slot count, padded to their largest count, at most `per` matrices and `chunk` padded rows each;
chunks of consecutive tiles of at most `chunk` rows; the padding at most `per` x the largest count.
The GPU library cannot run without a GPU, so this is where CI checks the bookkeeping that bounds the
buffers the memory plan counts (memplan.gemm_bytes)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ds4tui.engine import memplan

HIP = Path(__file__).resolve().parent.parent / "ds4tui" / "native" / "hip"

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gemm_plan.h"
static void out(const char *name, const std::vector<int64_t> &v) {
    printf("\"%s\": [", name);
    for (size_t i = 0; i < v.size(); i++) printf("%s%lld", i ? ", " : "", (long long)v[i]);
    printf("], ");
}
int main(int argc, char **argv) {  /* per chunk count... */
    std::vector<int64_t> counts;
    for (int i = 3; i < argc; i++) counts.push_back(atoll(argv[i]));
    const GmPlan p = gm_plan(counts, atoll(argv[1]), atoll(argv[2]));
    printf("{");
    out("first", p.first), out("base", p.base), out("pad", p.pad), out("cfirst", p.cfirst);
    printf("\"P\": %lld, \"most\": %lld}\n", (long long)p.P, (long long)p.most);
    return 0;
}
"""


@pytest.fixture(scope="module")
def plan_tool(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        pytest.skip("needs a C++ compiler")
    d = tmp_path_factory.mktemp("gemm_plan")
    (d / "driver.cpp").write_text(DRIVER)
    exe = d / "plan"
    subprocess.run([cxx, "-std=c++17", "-O2", f"-I{HIP}", "-o", str(exe), str(d / "driver.cpp")], check=True,
                   capture_output=True, text=True)

    def run(counts, per, chunk):
        r = subprocess.run([str(exe), str(per), str(chunk), *map(str, counts)], check=True, capture_output=True,
                           text=True)
        return json.loads(r.stdout)

    return run


def _check(p, counts, per, chunk):
    """The spec's rules, each asserted on plan p of `counts` (largest first)."""
    U = len(counts)
    first, base, pad, cfirst = p["first"], p["base"], p["pad"], p["cfirst"]
    assert first[0] == 0 and first[-1] == U and all(a < b for a, b in zip(first, first[1:]))
    for t in range(len(first) - 1):
        k0, k1 = first[t], first[t + 1]
        assert k1 - k0 <= per and (k1 - k0) * counts[k0] <= chunk
        assert all(pad[k] == counts[k0] >= counts[k] for k in range(k0, k1))  # padded to the tile's largest
        # a tile ends only where the next matrix would break a rule
        if k1 < U:
            assert k1 - k0 == per or (k1 - k0 + 1) * counts[k0] > chunk
    assert base == [0] + list(np.cumsum(pad, dtype=np.int64))
    assert p["P"] == base[-1] and p["P"] - sum(counts) <= per * (counts[0] if counts else 0)
    T = len(first) - 1
    assert cfirst[0] == 0 and cfirst[-1] == T and all(a < b for a, b in zip(cfirst, cfirst[1:]))
    spans = [base[first[b]] - base[first[a]] for a, b in zip(cfirst, cfirst[1:])]
    assert all(s <= chunk for s in spans) and p["most"] == max(spans, default=0)
    for j in range(len(cfirst) - 2):  # a chunk ends only where the next tile would not fit
        assert base[first[cfirst[j + 1] + 1]] - base[first[cfirst[j]]] > chunk


def test_a_verify_sized_product_is_one_tile_layout_as_before(plan_tool):
    """Counts far below chunk / per: tiles of exactly `per` matrices (the layout before chunks), one chunk."""
    counts = [9, 7, 7, 5, 4, 4, 3, 2, 2, 1, 1, 1]
    p = plan_tool(counts, 8, memplan.GEMM_CHUNK_ROWS)
    _check(p, counts, 8, memplan.GEMM_CHUNK_ROWS)
    assert p["first"] == [0, 8, 12] and p["cfirst"] == [0, 2]
    assert p["pad"] == [9] * 8 + [2] * 4 and p["P"] == 80 == p["most"]


@pytest.mark.parametrize("seed", range(4))
def test_a_flash_prefill_chunk_of_random_routing(plan_tool, seed):
    """2048 tokens x 6 of 256 experts routed at random, 8 matrices a tile (DS4 Flash's 2048 x 4096
    experts): more padded rows than a chunk, so several chunks, each within GEMM_CHUNK_ROWS."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(256, 6, replace=False) for _ in range(2048)]).ravel()
    counts = sorted(np.bincount(ids, minlength=256)[np.bincount(ids, minlength=256) > 0].tolist(), reverse=True)
    p = plan_tool(counts, 8, memplan.GEMM_CHUNK_ROWS)
    _check(p, counts, 8, memplan.GEMM_CHUNK_ROWS)
    assert len(p["cfirst"]) - 1 >= 2 and p["most"] <= memplan.GEMM_CHUNK_ROWS
    assert p["P"] <= 2048 * 6 + 8 * 2048  # the padding bound memplan.gemm_bytes counts


def test_hot_experts_cut_their_tiles_short_and_the_hottest_sets_the_chunk(plan_tool):
    """A trained router's hot experts: a tile whose padded rows would pass the chunk holds fewer
    matrices (one alone where its count passes chunk / 2), and a count above GM_CHUNK_ROWS is a chunk
    of its own (chunk = the largest count, what gemm.hip passes)."""
    chunk = 100
    counts = [60, 50, 30, 30, 30, 30, 10, 10]
    p = plan_tool(counts, 8, chunk)
    _check(p, counts, 8, chunk)
    assert p["first"] == [0, 1, 3, 6, 8] and p["pad"] == [60, 50, 50, 30, 30, 30, 10, 10] and p["P"] == 270
    assert p["cfirst"] == [0, 1, 2, 3, 4] and p["most"] == 100
    big = [150, 20, 20]
    p = plan_tool(big, 8, max(chunk, big[0]))
    _check(p, big, 8, 150)
    assert p["first"] == [0, 1, 3] and p["most"] == 150


def test_a_chunk_fills_to_exactly_its_rows(plan_tool):
    """Tiles whose rows add up to exactly `chunk` share one chunk; one row more starts the next."""
    p = plan_tool([25, 25, 25, 25], 2, 100)
    _check(p, [25, 25, 25, 25], 2, 100)
    assert p["first"] == [0, 2, 4] and p["cfirst"] == [0, 2] and p["most"] == 100
    p = plan_tool([26, 25, 25, 25], 2, 100)
    _check(p, [26, 25, 25, 25], 2, 100)
    assert p["cfirst"] == [0, 1, 2] and p["most"] == 52


def test_an_empty_product_has_no_tile(plan_tool):
    p = plan_tool([], 8, memplan.GEMM_CHUNK_ROWS)
    assert p == {"first": [0], "base": [0], "pad": [], "cfirst": [0], "P": 0, "most": 0}
