/* sampling.c — the target's sampler: temperature -> top-k -> top-p -> min-p -> a
 * draw from the session's splitmix64 stream; greedy is the argmax with ties to the lowest id. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct { double v; int32_t id; int32_t pad; } cand;

/* The candidates' order, decreasing value with ties to the lower id, as one unsigned key a
 * candidate: ascending keys are that order.  The value's order is the logit's (v = logit / T with
 * T > 0 keeps every comparison of two float32 logits), so the high half is the logit as an
 * order-keeping integer, inverted for decreasing, and the low half the id.  -0.0 and +0.0 compare
 * equal (v > w and v < w are both false), so -0.0 is keyed as +0.0 and the id decides; a NaN, which
 * compares with nothing, goes last. */
static inline uint64_t cand_key(float f, int32_t id) {
    uint32_t u;
    if (isnan(f)) u = 0;
    else {
        f += 0.0f; /* -0.0 + 0.0 = +0.0 */
        memcpy(&u, &f, sizeof u);
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending u = ascending f */
    }
    return (uint64_t)~u << 32 | (uint32_t)id;
}

/* The keys a[0..n), sorted ascending, into tmp[0..n) (a is overwritten): a stable LSD radix sort in
 * passes of at most 11 bits.  The high halves (the order of the values) take three passes; the low
 * halves (the ids, below 2^id_bits) take passes of their own first when id_bits > 0.  With id_bits 0
 * the keys must come in ascending id order (as built), so that equal high halves stay in id order and
 * the whole keys end sorted. */
static void radix_sort_keys(uint64_t *a, uint64_t *tmp, int64_t n, int id_bits) {
    uint64_t *src = a, *dst = tmp;
    for (int lo = id_bits > 0 ? 0 : 32; lo < 64;) {
        const int end = lo < 32 ? (lo + 11 < id_bits ? lo + 11 : id_bits) : (lo + 11 < 64 ? lo + 11 : 64);
        const int shift = lo, bits = end - lo;
        lo = end < 32 && end >= id_bits ? 32 : end;
        int64_t count[2048] = {0};
        const uint64_t mask = ((uint64_t)1 << bits) - 1;
        for (int64_t i = 0; i < n; i++) count[(src[i] >> shift) & mask]++;
        int64_t at = 0;
        for (int64_t b = 0; b <= (int64_t)mask; b++) {
            const int64_t c = count[b];
            count[b] = at;
            at += c;
        }
        for (int64_t i = 0; i < n; i++) dst[count[(src[i] >> shift) & mask]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != tmp) memcpy(tmp, src, (size_t)n * sizeof *tmp);
}

/* Moves the k smallest of a[0..n) (distinct keys) to a[0..k), in no order (0 < k < n): quickselect,
 * the pivot the median of the first, middle and last key. */
static void select_smallest(uint64_t *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        uint64_t x = a[lo], y = a[mid], z = a[hi];
        const uint64_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                const uint64_t t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++, j--;
            }
        }
        /* a[lo..j] <= pivot <= a[i..hi], and j < i */
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
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

static double uniform(uint64_t *state) { return (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0); }

double ds4_uniform(ds4_session *s) { return uniform(&s->rng); }

/* temperature -> top-k -> top-p -> min-p over logits[0..V): the kept candidates in order of
 * decreasing probability (ties to the lower id), left in buf (16 V bytes); returns how many and
 * their unnormalised sum. */
static int32_t sample_candidates(const ds4_sampling *p, int32_t V, void *buf, const float *logits, double *sum_out) {
    /* the candidates in order, ties to the lower id: every key sorted, or only the top_k smallest
     * after a quickselect (the same order either way, and so the same sums and draws).  The buffer
     * holds V candidates of 16 bytes: the keys in its first half, the sorted keys in its second, and
     * candidate i written over sorted keys 2i - V and 2i - V + 1, both at or below i, so every key is
     * read before it is written over */
    uint64_t *key = (uint64_t *)buf, *sorted = key + V;
    /* a -inf logit (a token outside a draft vocabulary) has probability 0: it adds nothing to any sum
     * and is no candidate (it could only have been drawn when rounding left u at the running sum's end,
     * after every candidate that can be) — unless every logit is -inf */
    int32_t m = 0;
    for (int32_t i = 0; i < V; i++)
        if (logits[i] != -INFINITY) key[m++] = cand_key(logits[i], i);
    if (m == 0)
        for (int32_t i = 0; i < V; i++) key[m++] = cand_key(logits[i], i);
    int32_t n = m, id_bits = 0;
    if (p->top_k > 0 && p->top_k < n) { /* the selection leaves the ids out of order: they are sorted too */
        n = p->top_k;
        select_smallest(key, m, n);
        while (id_bits < 31 && ((int64_t)1 << id_bits) < V) id_bits++;
    }
    radix_sort_keys(key, sorted, n, id_bits);
    cand *c = (cand *)buf;
    const double T = (double)p->temperature;
    for (int32_t i = 0; i < n; i++) {
        const int32_t id = (int32_t)(uint32_t)sorted[i];
        c[i] = (cand){(double)logits[id] / T, id, 0};
    }
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

/* The draw: temperature -> top-k -> top-p -> min-p -> u in [0, 1) from the stream at *rng, times
 * the kept candidates' sum, against their running sum (probabilities in double). */
static int32_t draw(const ds4_sampling *p, int32_t V, void *buf, const float *logits, uint64_t *rng) {
    double sum;
    const int32_t n = sample_candidates(p, V, buf, logits, &sum);
    const cand *c = (const cand *)buf;
    const double u = uniform(rng) * sum;
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].v;
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id;
}

int32_t ds4_sample(ds4_session *s, const float *logits) {
    if (!(s->sampling.temperature > 0.0f)) return ds4_argmax(logits, s->e->c.n_vocab);
    return draw(&s->sampling, s->e->c.n_vocab, s->sample_buf, logits, &s->rng);
}

int32_t ds4_kernel_sample(const float *logits, int32_t n, const ds4_sampling *p, uint64_t *rng) {
    if (n < 1 || !logits || !p || !rng) return DS4_E_INVALID;
    if (ds4_check_sampling(p, NULL, 0) != DS4_OK) return DS4_E_INVALID;
    if (!(p->temperature > 0.0f)) return ds4_argmax(logits, n);
    void *buf = malloc((size_t)n * sizeof(cand));
    if (!buf) return DS4_E_NOMEM;
    const int32_t id = draw(p, n, buf, logits, rng);
    free(buf);
    return id;
}

void ds4_sample_dist(ds4_session *s, const float *logits, int32_t *ids, double *p, int32_t *n_out) {
    if (!(s->sampling.temperature > 0.0f)) {
        ids[0] = ds4_argmax(logits, s->e->c.n_vocab);
        p[0] = 1.0;
        *n_out = 1;
        return;
    }
    double sum;
    int32_t n = sample_candidates(&s->sampling, s->e->c.n_vocab, s->sample_buf, logits, &sum);
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
