/*
 * gemm_plan.h — how the prefill GEMM takes an expert product's slots (spec platform.md §7.1): the used
 * matrices in tiles, their padded rows, and the tiles in chunks.  Host code only (no GPU types), so
 * that tests/test_gemm_plan.py builds it with the C++ compiler and checks the layout on any machine.
 */
#ifndef DS4_GEMM_PLAN_H
#define DS4_GEMM_PLAN_H

#include <stdint.h>

#include <algorithm>
#include <vector>

/* The layout of one expert product's `used` matrices (ordered by slot count, largest first; counts[k]
 * is used[k]'s count): tile t holds used[first[t] .. first[t + 1] - 1], at most `per` of them and at
 * most `chunk` padded rows, each matrix padded to the count of the tile's first (largest) matrix;
 * base[k] is the padded row of used[k]'s first slot (base[U]: all rows, P).  Chunk j holds tiles
 * cfirst[j] .. cfirst[j + 1] - 1, as many consecutive tiles as `chunk` rows hold; `most` is the
 * largest chunk's rows.  chunk is at least the largest count, so every matrix fits a tile. */
struct GmPlan {
    std::vector<int64_t> first, base, pad, cfirst;
    int64_t P = 0, most = 0;
};

static inline GmPlan gm_plan(const std::vector<int64_t> &counts, int64_t per, int64_t chunk) {
    GmPlan p;
    const int64_t U = (int64_t)counts.size();
    p.base.assign((size_t)U + 1, 0);
    p.pad.assign((size_t)U, 0);
    for (int64_t k = 0; k < U;) {
        const int64_t m = counts[(size_t)k];
        int64_t nk = 1;
        while (nk < per && k + nk < U && (nk + 1) * m <= chunk) nk++;
        p.first.push_back(k);
        for (int64_t j = k; j < k + nk; j++) {
            p.pad[(size_t)j] = m;
            p.base[(size_t)j + 1] = p.base[(size_t)j] + m;
        }
        k += nk;
    }
    p.first.push_back(U);
    p.P = p.base[(size_t)U];
    const int64_t T = (int64_t)p.first.size() - 1;
    for (int64_t t = 0; t < T;) {
        int64_t t2 = t + 1;
        while (t2 < T && p.base[(size_t)p.first[(size_t)t2 + 1]] - p.base[(size_t)p.first[(size_t)t]] <= chunk) t2++;
        p.cfirst.push_back(t);
        p.most = std::max(p.most, p.base[(size_t)p.first[(size_t)t2]] - p.base[(size_t)p.first[(size_t)t]]);
        t = t2;
    }
    p.cfirst.push_back(T);
    return p;
}

#endif /* DS4_GEMM_PLAN_H */
