/* sampling.c — the target's sampler: temperature -> top-k -> top-p -> min-p -> a
 * draw from the session's splitmix64 stream; greedy is the argmax with ties to the lowest id. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct { double v; int32_t id; int32_t pad; } cand;

static int by_value_then_id(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->v > b->v) return -1;
    if (a->v < b->v) return 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Greedy's argmax, for every decode, each verify row and the CPU drafter's drafts (up to ~11 rows of
 * V floats a DSpark cycle).  The rule is the scalar loop `best = 0; for i: if (x[i] > x[best]) best
 * = i`: the first maximum (-0.0 and +0.0 are equal), a NaN never becomes best, and a NaN at index 0
 * gives 0 (nothing compares greater than it).  With x[0] not NaN that is the first index holding the
 * largest non-NaN value (-inf when every other element is -inf or NaN: then x[0] itself), so it is
 * found in two passes the compiler vectorises without -ffast-math: the largest non-NaN value, kept
 * lane-wise as `v > m ? v : m` (a NaN v leaves m; the lanes are combined in any order, as a maximum
 * is exact), then the first index equal to it, searched block by block.  Same index as the loop for
 * every input (tests/test_native_argmax.py); ~10x faster on 129280 floats. */
#define ARGMAX_LANES 64

/* The largest non-NaN element (-inf if none), and the first index equal to m (n if none); ELEM(k)
 * is element k. */
#define ARGMAX_PASSES(MAX, FIND, ELEM, ...)                                                            \
    static float MAX(__VA_ARGS__, int32_t n) {                                                         \
        float lane[ARGMAX_LANES];                                                                      \
        for (int j = 0; j < ARGMAX_LANES; j++) lane[j] = -INFINITY;                                     \
        int32_t blocks = n / ARGMAX_LANES;                                                             \
        for (int32_t blk = 0; blk < blocks; blk++)                                                     \
            for (int j = 0; j < ARGMAX_LANES; j++) {                                                   \
                float v = ELEM(blk * ARGMAX_LANES + j);                                                \
                lane[j] = v > lane[j] ? v : lane[j];                                                   \
            }                                                                                          \
        float m = -INFINITY;                                                                           \
        for (int j = 0; j < ARGMAX_LANES; j++) m = lane[j] > m ? lane[j] : m;                          \
        for (int32_t k = blocks * ARGMAX_LANES; k < n; k++) m = ELEM(k) > m ? ELEM(k) : m;             \
        return m;                                                                                      \
    }                                                                                                  \
    static int32_t FIND(__VA_ARGS__, int32_t n, float m) {                                             \
        int32_t blocks = n / ARGMAX_LANES, blk = 0;                                                    \
        for (; blk < blocks; blk++) {                                                                  \
            int hit = 0;                                                                               \
            for (int j = 0; j < ARGMAX_LANES; j++) hit |= ELEM(blk * ARGMAX_LANES + j) == m;           \
            if (hit) break;                                                                            \
        }                                                                                              \
        for (int32_t k = blk * ARGMAX_LANES; k < n; k++)                                               \
            if (ELEM(k) == m) return k;                                                                \
        return n;                                                                                      \
    }

#define ARGMAX_ONE(k) x[k]
#define ARGMAX_SUM(k) (a[k] + b[k])
ARGMAX_PASSES(max_one, find_one, ARGMAX_ONE, const float *x)
ARGMAX_PASSES(max_sum, find_sum, ARGMAX_SUM, const float *a, const float *b)

/* m is one of the elements (x[0] is not NaN, so m >= x[0] > NaN), so FIND finds it. */
int32_t ds4_argmax(const float *x, int32_t n) {
    if (n <= 1 || isnan(x[0])) return 0;
    return find_one(x, n, max_one(x, n));
}

int32_t ds4_argmax_sum(const float *a, const float *b, int32_t n) {
    if (n <= 1 || isnan(a[0] + b[0])) return 0;
    return find_sum(a, b, n, max_sum(a, b, n));
}

double ds4_uniform(ds4_session *s) {
    return (double)(splitmix64(&s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* temperature -> top-k -> top-p -> min-p: the kept candidates in order of decreasing probability
 * (ties to the lower id), left in s->sample_buf; returns how many and their unnormalised sum. */
static int32_t sample_candidates(ds4_session *s, const float *logits, double *sum_out) {
    const ds4_sampling *p = &s->sampling;
    const int32_t V = s->e->c.n_vocab;
    cand *c = (cand *)s->sample_buf;
    for (int32_t i = 0; i < V; i++) c[i] = (cand){(double)logits[i] / (double)p->temperature, i, 0};
    qsort(c, (size_t)V, sizeof *c, by_value_then_id);
    int32_t n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double mx = c[0].v, sum = 0.0;
    for (int32_t i = 0; i < n; i++) { c[i].v = exp(c[i].v - mx); sum += c[i].v; }
    for (int32_t i = 0; i < n; i++) c[i].v /= sum;
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += c[i].v;
            if (cum >= (double)p->top_p) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        double floor_p = (double)p->min_p * c[0].v;
        int32_t keep = 1;
        while (keep < n && c[keep].v >= floor_p) keep++;
        n = keep;
    }
    sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += c[i].v;
    *sum_out = sum;
    return n;
}

/* temperature -> top-k -> top-p -> min-p -> draw (probabilities in double). */
int32_t ds4_sample(ds4_session *s, const float *logits) {
    if (!(s->sampling.temperature > 0.0f)) return ds4_argmax(logits, s->e->c.n_vocab);
    double sum;
    int32_t n = sample_candidates(s, logits, &sum);
    const cand *c = (const cand *)s->sample_buf;
    double u = ds4_uniform(s) * sum;
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].v;
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id;
}

void ds4_sample_dist(ds4_session *s, const float *logits, int32_t *ids, double *p, int32_t *n_out) {
    if (!(s->sampling.temperature > 0.0f)) {
        ids[0] = ds4_argmax(logits, s->e->c.n_vocab);
        p[0] = 1.0;
        *n_out = 1;
        return;
    }
    double sum;
    int32_t n = sample_candidates(s, logits, &sum);
    const cand *c = (const cand *)s->sample_buf;
    for (int32_t i = 0; i < n; i++) { ids[i] = c[i].id; p[i] = c[i].v / sum; }
    *n_out = n;
}

int ds4_check_sampling(const ds4_sampling *p, char *err, size_t err_len) {
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return ds4_fail(err, err_len, DS4_E_INVALID, "temperature must be a finite number >= 0, got %g", (double)p->temperature);
    if (p->top_k < 0) return ds4_fail(err, err_len, DS4_E_INVALID, "top_k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return ds4_fail(err, err_len, DS4_E_INVALID, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return ds4_fail(err, err_len, DS4_E_INVALID, "min_p must be in [0, 1], got %g", (double)p->min_p);
    return DS4_OK;
}
