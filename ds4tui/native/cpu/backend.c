/* backend.c — the CPU backend of the op table (../backend.h).
 *
 * "Device" memory is host memory (host_memory = 1): uploads are calloc + memcpy, copies are memcpy,
 * sync is a no-op.  Every op computes in float32 in the operation order of the numpy reference
 * (ds4tui/engine/reference.py, spec ds4.md §2); the per-token loops of attention and the indexer
 * run on the engine's thread pool, the matmuls through cpu/matmul.c (an MoE layer's experts in one
 * pool run), and the row-wise ops of a pass with several rows (norms, mHC, RoPE, SwiGLU, the MoE
 * combine) on the pool when they are large enough (rows_run).  Which thread computes a row never
 * changes it.  These are the reference compositions of the table: the GPU backend's kernels are
 * tested against them.
 */
#include "kernels.h"
#include "../internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define MAXHC 16

struct ds4_backend_ctx {
    ds4_pool *pool;
    int n_threads;
    int act_q8;                /* DS4_ACTIVATIONS_Q8: Q8_0/Q2_K/IQ2_XXS matrices take 8-bit activations */
    pthread_mutex_t lock;      /* the gather buffers (sessions on several threads share the context) */
    float *gx, *gy;            /* mm_gather: gathered activations and results */
    size_t gx_cap, gy_cap;     /* floats */
    ds4_mm_group *groups;      /* mm_gather: one product per matrix id */
    int32_t *group_m;          /* mm_gather: the id of a gathered group, -1 for one in place */
    size_t groups_cap;
    _Atomic uint64_t allocated;
};

int ds4_cpu_backend_open(ds4_pool *pool, int activations, ds4_backend_ctx **out, char *err, size_t len) {
    ds4_backend_ctx *c = calloc(1, sizeof *c);
    if (!c) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    c->pool = pool;
    c->act_q8 = activations == DS4_ACTIVATIONS_Q8;
    c->n_threads = ds4_pool_size(pool);
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return DS4_OK;
}

static void close_ctx(ds4_backend_ctx *c) {
    if (!c) return;
    free(c->gx);
    free(c->gy);
    free(c->groups);
    free(c->group_m);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static int upload(ds4_backend_ctx *c, const void *src, size_t bytes, void **out, char *err, size_t len) {
    *out = calloc(1, bytes ? bytes : 1);
    if (!*out) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory allocating %zu bytes", bytes);
    if (src) memcpy(*out, src, bytes);
    c->allocated += bytes;
    return DS4_OK;
}

static void release(ds4_backend_ctx *c, void *p, size_t bytes) {
    if (!p) return;
    free(p);
    c->allocated -= bytes;
}

static uint64_t allocated(const ds4_backend_ctx *c) { return c ? c->allocated : 0; }

static int copy(ds4_backend_ctx *c, void *dst, const void *src, size_t bytes, int32_t to_host, char *err, size_t len) {
    (void)c, (void)to_host, (void)err, (void)len;
    if (dst != src) memcpy(dst, src, bytes);
    return DS4_OK;
}

static int sync(ds4_backend_ctx *c, char *err, size_t len) {
    (void)c, (void)err, (void)len;
    return DS4_OK;
}

/* ---- products ----------------------------------------------------------------------------------- */

static int mm(ds4_backend_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
              const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len) {
    (void)row_bytes;
    if (type & DS4_CPU_AMX) { /* the amx option's repacked Q8_0 copy (cpu/amx.c) */
        if (ds4_cpu_amx_matmul(c->pool, W, rows, cols, X, ldx, n, Y, ldy) != 0)
            return ds4_fail(err, len, DS4_E_NOMEM, "amx: a %lld x %lld product: out of memory", (long long)rows, (long long)cols);
        return DS4_OK;
    }
    ds4_cpu_matmul_act(c->pool, c->act_q8, type, W, rows, cols, X, ldx, n, Y, ldy);
    return DS4_OK;
}

static int grow(float **buf, size_t *cap, size_t n) {
    if (n <= *cap) return 1;
    float *p = realloc(*buf, n * sizeof(float));
    if (!p) return 0;
    *buf = p;
    *cap = n;
    return 1;
}

/* Slots grouped by matrix id, ascending; each group is one product (a result never depends on the
 * group's size), and all the groups run in one pass of the thread pool (ds4_cpu_matmul_groups).  A
 * group whose activation rows and result rows are equally spaced is multiplied in place; any other
 * is gathered into the context's buffers and scattered back. */
static int mm_gather(ds4_backend_ctx *c, int32_t type, const void *W, int64_t mat_bytes, const int32_t *ids,
                     int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int32_t x_div,
                     int64_t n_slots, float *Y, int64_t ldy, char *err, size_t len) {
    (void)row_bytes;
    int32_t lo = ids[0], hi = ids[0];
    for (int64_t i = 1; i < n_slots; i++) {
        if (ids[i] < lo) lo = ids[i];
        if (ids[i] > hi) hi = ids[i];
    }
    int rc = DS4_OK;
    pthread_mutex_lock(&c->lock);
    /* pass 1: the groups, and the rows of the gathered ones */
    int n_groups = 0;
    int64_t gathered = 0;
    for (int32_t m = lo; m <= hi; m++) {
        int64_t cnt = 0, step = 0, regular = 1, prev = -1;
        for (int64_t i = 0; i < n_slots; i++) {
            if (ids[i] != m) continue;
            if (cnt == 1) step = i - prev;
            else if (cnt > 1 && i - prev != step) regular = 0;
            prev = i;
            cnt++;
        }
        if (!cnt) continue;
        n_groups++;
        if (!(regular && (cnt == 1 || step % x_div == 0))) gathered += cnt;
    }
    if ((size_t)n_groups > c->groups_cap) {
        ds4_mm_group *p = realloc(c->groups, (size_t)n_groups * sizeof *p);
        if (p) c->groups = p;
        int32_t *q = p ? realloc(c->group_m, (size_t)n_groups * sizeof *q) : NULL;
        if (q) c->group_m = q;
        if (!q) rc = ds4_fail(err, len, DS4_E_NOMEM, "mm_gather: out of memory for %d groups", n_groups);
        else c->groups_cap = (size_t)n_groups;
    }
    if (rc == DS4_OK && gathered &&
        (!grow(&c->gx, &c->gx_cap, (size_t)(gathered * cols)) || !grow(&c->gy, &c->gy_cap, (size_t)(gathered * rows))))
        rc = ds4_fail(err, len, DS4_E_NOMEM, "mm_gather: out of memory for %lld rows", (long long)gathered);
    if (rc != DS4_OK) {
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    /* pass 2: each group's operands, in place or gathered */
    int gi = 0;
    int64_t j = 0; /* gathered rows so far */
    for (int32_t m = lo; m <= hi; m++) {
        int64_t cnt = 0, first = -1, step = 0, regular = 1, prev = -1;
        for (int64_t i = 0; i < n_slots; i++) {
            if (ids[i] != m) continue;
            if (cnt == 0) first = i;
            else if (cnt == 1) step = i - prev;
            else if (i - prev != step) regular = 0;
            prev = i;
            cnt++;
        }
        if (!cnt) continue;
        c->group_m[gi] = -1;
        ds4_mm_group *g = &c->groups[gi++];
        g->W = (const uint8_t *)W + (size_t)m * (size_t)mat_bytes;
        g->n_tok = cnt;
        /* slots first + k*step read X row (first + k*step) / x_div: equally spaced when step divides */
        if (regular && (cnt == 1 || step % x_div == 0)) {
            g->X = X + (first / x_div) * ldx, g->ldx = (step / x_div) * ldx;
            g->Y = Y + first * ldy, g->ldy = step * ldy;
            continue;
        }
        c->group_m[gi - 1] = m;
        g->X = c->gx + (size_t)(j * cols), g->ldx = cols;
        g->Y = c->gy + (size_t)(j * rows), g->ldy = rows;
        for (int64_t i = 0; i < n_slots; i++)
            if (ids[i] == m) memcpy(c->gx + (size_t)(j++ * cols), X + (i / x_div) * ldx, (size_t)cols * sizeof(float));
    }
    ds4_cpu_matmul_groups(c->pool, c->act_q8, type, rows, cols, c->groups, n_groups);
    /* pass 3: the gathered groups' results back to their slots */
    j = 0;
    for (gi = 0; gi < n_groups; gi++) {
        const int32_t m = c->group_m[gi];
        if (m < 0) continue; /* multiplied in place */
        for (int64_t i = 0; i < n_slots; i++)
            if (ids[i] == m) memcpy(Y + i * ldy, c->gy + (size_t)(j++ * rows), (size_t)rows * sizeof(float));
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* Grouped products (backend.h version 9): the gather they are, over the n * groups slots (the
 * gather multiplies each group's slots in one product already). */
static int mm_grouped(ds4_backend_ctx *c, int32_t type, const void *W, int64_t mat_bytes, const int32_t *ids,
                      int32_t groups, int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t n,
                      float *Y, char *err, size_t len) {
    return mm_gather(c, type, W, mat_bytes, ids, rows, cols, row_bytes, X, cols, 1, n * groups, Y, rows, err, len);
}

/* Items [0, n) of a row-wise op: on the pool when the op has several rows and at least `work`
 * elements in all (below that a hand-off costs more than a core gives), else on the caller.  Every
 * item is computed the same way wherever it runs, so the result never depends on the split. */
enum { ROWS_PARALLEL_MIN = 4096 };
static void rows_run(ds4_backend_ctx *c, ds4_task_fn fn, void *ctx, int64_t n, int64_t work) {
    if (c->n_threads > 1 && n > 1 && work >= ROWS_PARALLEL_MIN) ds4_pool_run(c->pool, fn, ctx, n);
    else fn(ctx, 0, n, 0);
}

static int embed(ds4_backend_ctx *c, int32_t type, const void *W, int64_t row_bytes, int32_t H, const int32_t *tokens,
                 int32_t n, int32_t HC, float *X, char *err, size_t len) {
    (void)c, (void)err, (void)len;
    const ds4_type_traits *tt = ds4_type(type);
    for (int t = 0; t < n; t++) {
        float *row = X + (size_t)t * HC * H;
        tt->dequant((const uint8_t *)W + (size_t)tokens[t] * (size_t)row_bytes, row, H);
        for (int a = 1; a < HC; a++) memcpy(row + (size_t)a * H, row, (size_t)H * sizeof(float));
    }
    return DS4_OK;
}

/* ---- norms and hyper-connections (spec ds4.md §2.1) --------------------------------------------- */

/* out[d] = w[0] * rows[0][d] + w[1] * rows[1][d] + ... (n rows of width H), summed from
 * 0.0f in row order for every d: the per-lane operations of a loop over d with an inner loop over
 * the rows, in an order (a tile of lanes, rows outer) that the compiler vectorises over d. */
static void weighted_rows(const float *w, const float *const *rows, int n, int64_t H, float *restrict out) {
    enum { TILE = 64 };
    for (int64_t d0 = 0; d0 < H; d0 += TILE) {
        const int64_t m = H - d0 < TILE ? H - d0 : TILE;
        float acc[TILE];
        for (int64_t j = 0; j < m; j++) acc[j] = 0.0f;
        for (int a = 0; a < n; a++) {
            const float wa = w[a], *restrict r = rows[a] + d0;
            for (int64_t j = 0; j < m; j++) acc[j] += wa * r[j];
        }
        for (int64_t j = 0; j < m; j++) out[d0 + j] = acc[j];
    }
}

typedef struct {
    const float *x, *w;
    int64_t ldx, width, ldo;
    float eps;
    float *out;
} rms_task;

static void rms_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const rms_task *k = ctx;
    for (int64_t r = r0; r < r1; r++) ds4_rms_norm(k->x + r * k->ldx, k->width, k->eps, k->w, k->out + r * k->ldo);
}

static int rms_norm(ds4_backend_ctx *c, const float *x, int64_t ldx, int64_t rows, int64_t width, float eps,
                    const float *w, float *out, int64_t ldo, char *err, size_t len) {
    (void)err, (void)len;
    rms_task k = {x, w, ldx, width, ldo, eps, out};
    rows_run(c, rms_rows, &k, rows, rows * width);
    return DS4_OK;
}

typedef struct {
    const float *hcm, *base, *X;
    int32_t HC, H, iters;
    float s0, s1, s2, eps;
    float *x, *pre_out, *post, *comb;
} hc_pre_task;

static void hc_pre_rows(void *ctx, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const hc_pre_task *k = ctx;
    const int HC = k->HC, H = k->H, iters = k->iters, mix = 2 * HC + HC * HC;
    const float s0 = k->s0, s1 = k->s1, s2 = k->s2, eps = k->eps, *hcm = k->hcm, *base = k->base, *X = k->X;
    float *x = k->x, *pre_out = k->pre_out, *post = k->post, *comb = k->comb;
    for (int64_t t = t0; t < t1; t++) {
        const float *m = hcm + (size_t)t * mix;
        float *pre = pre_out + (size_t)t * HC;
        float *po = post + (size_t)t * HC, *cb = comb + (size_t)t * HC * HC;
        for (int a = 0; a < HC; a++) {
            pre[a] = ds4_sigmoid(s0 * m[a] + base[a]) + eps;
            po[a] = 2.0f * ds4_sigmoid(s1 * m[HC + a] + base[HC + a]);
        }
        for (int a = 0; a < HC; a++) { /* softmax over destinations, + eps */
            float *r = cb + a * HC, mx = -INFINITY, sum = 0.0f;
            for (int b = 0; b < HC; b++) {
                r[b] = s2 * m[2 * HC + a * HC + b] + base[2 * HC + a * HC + b];
                if (r[b] > mx) mx = r[b];
            }
            for (int b = 0; b < HC; b++) { r[b] = expf(r[b] - mx); sum += r[b]; }
            for (int b = 0; b < HC; b++) r[b] = r[b] / sum + eps;
        }
        int it = 0;
#if defined(__AVX512F__)
        if (HC == 4) { /* the 4 x 4 matrix in one vector (lane 4a + b): the same sums in the same order and the
                        * same divisions as the loops below, 16 at a time */
            __m512 C = _mm512_loadu_ps(cb);
            const __m512 e = _mm512_set1_ps(eps);
            for (; it < iters; it++) {
                if (it > 0) {
                    const __m512 rs = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_permute_ps(C, 0x00), _mm512_permute_ps(C, 0x55)),
                                                                  _mm512_permute_ps(C, 0xAA)), _mm512_permute_ps(C, 0xFF));
                    C = _mm512_div_ps(C, _mm512_add_ps(rs, e));
                }
                const __m512 cs = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_shuffle_f32x4(C, C, 0x00), _mm512_shuffle_f32x4(C, C, 0x55)),
                                                              _mm512_shuffle_f32x4(C, C, 0xAA)), _mm512_shuffle_f32x4(C, C, 0xFF));
                C = _mm512_div_ps(C, _mm512_add_ps(cs, e));
            }
            _mm512_storeu_ps(cb, C);
        }
#endif
        for (; it < iters; it++) {
            if (it > 0) { /* rows (over destinations) */
                for (int a = 0; a < HC; a++) {
                    float sum = 0.0f;
                    for (int b = 0; b < HC; b++) sum += cb[a * HC + b];
                    for (int b = 0; b < HC; b++) cb[a * HC + b] /= sum + eps;
                }
            }
            for (int b = 0; b < HC; b++) { /* columns (over sources) */
                float sum = 0.0f;
                for (int a = 0; a < HC; a++) sum += cb[a * HC + b];
                for (int a = 0; a < HC; a++) cb[a * HC + b] /= sum + eps;
            }
        }
        const float *Xt = X + (size_t)t * HC * H, *rows[MAXHC];
        for (int a = 0; a < HC; a++) rows[a] = Xt + (size_t)a * H;
        weighted_rows(pre, rows, HC, H, x + (size_t)t * H);
    }
}

static int hc_pre(ds4_backend_ctx *c, const float *hcm, int32_t n, int32_t HC, int32_t H, float s0, float s1, float s2,
                  const float *base, float eps, int32_t iters, const float *X, float *x, float *pre_out, float *post,
                  float *comb, char *err, size_t len) {
    (void)err, (void)len;
    hc_pre_task k = {hcm, base, X, HC, H, iters, s0, s1, s2, eps, x, pre_out, post, comb};
    rows_run(c, hc_pre_rows, &k, n, (int64_t)n * HC * H);
    return DS4_OK;
}

typedef struct {
    const float *X, *out, *post, *comb;
    int32_t HC, H;
    float *Y;
} hc_post_task;

static void hc_post_rows(void *ctx, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const hc_post_task *k = ctx;
    const int HC = k->HC, H = k->H;
    const float *X = k->X, *out = k->out, *post = k->post, *comb = k->comb;
    float *Y = k->Y;
    for (int64_t t = t0; t < t1; t++) {
        const float *Xt = X + (size_t)t * HC * H, *o = out + (size_t)t * H;
        const float *po = post + (size_t)t * HC, *cb = comb + (size_t)t * HC * HC;
        float *Yt = Y + (size_t)t * HC * H;
        const float *rows[MAXHC];
        for (int a = 0; a < HC; a++) rows[a] = Xt + (size_t)a * H;
        for (int b = 0; b < HC; b++) {
            float w[MAXHC], *restrict yb = Yt + (size_t)b * H;
            for (int a = 0; a < HC; a++) w[a] = cb[a * HC + b];
            weighted_rows(w, rows, HC, H, yb); /* acc, then po[b] * o[d] + acc per lane */
            for (int d = 0; d < H; d++) yb[d] = po[b] * o[d] + yb[d];
        }
    }
}

static int hc_post(ds4_backend_ctx *c, const float *X, const float *out, const float *post, const float *comb, int32_t n,
                   int32_t HC, int32_t H, float *Y, char *err, size_t len) {
    (void)err, (void)len;
    hc_post_task k = {X, out, post, comb, HC, H, Y};
    rows_run(c, hc_post_rows, &k, n, (int64_t)n * HC * HC * H);
    return DS4_OK;
}

static int hc_head(ds4_backend_ctx *c, const float *X, const float *m, int32_t n, int32_t HC, int32_t H, float s0,
                   const float *base, float eps, float *w_out, float *out, char *err, size_t len) {
    (void)c, (void)err, (void)len;
    for (int t = 0; t < n; t++) {
        const float *Xt = X + (size_t)t * HC * H;
        float *w = w_out + (size_t)t * HC;
        for (int a = 0; a < HC; a++) w[a] = ds4_sigmoid(s0 * m[(size_t)t * HC + a] + base[a]) + eps;
        const float *rows[MAXHC];
        for (int a = 0; a < HC; a++) rows[a] = Xt + (size_t)a * H;
        weighted_rows(w, rows, HC, H, out + (size_t)t * H);
    }
    return DS4_OK;
}

/* ---- attention pieces (spec ds4.md §2.2-§2.6) ---------------------------------------------------- */

typedef struct {
    float *x;
    int32_t width, heads_per_tok, n_rot, inverse, qat;
    float eps;
    const float *w;
    const double *freq;
    int64_t p0;
} rope_task;

static void norm_rope_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const rope_task *k = ctx;
    const int32_t width = k->width, n_rot = k->n_rot;
    float cs[DS4_ROPE_MAX]; /* the angles of position `at`, shared by its heads */
    int64_t at = -1;
    for (int64_t r = r0; r < r1; r++) {
        float *row = k->x + r * width;
        const int64_t pos = k->p0 + r / k->heads_per_tok;
        if (k->eps >= 0.0f) ds4_rms_norm(row, width, k->eps, k->w, row);
        if (n_rot > DS4_ROPE_MAX) ds4_rope(k->freq, n_rot, row, width, pos, k->inverse);
        else {
            if (pos != at) ds4_rope_cs(k->freq, n_rot, pos, k->inverse, cs), at = pos;
            ds4_rope_apply(cs, n_rot, row, width);
        }
        if (k->qat) ds4_indexer_qat(row, width);
    }
}

static int norm_rope(ds4_backend_ctx *c, float *x, int64_t rows, int32_t width, int32_t heads_per_tok, float eps,
                     const float *w, const double *freq, int32_t n_rot, int64_t p0, int32_t inverse, int32_t qat,
                     char *err, size_t len) {
    (void)err, (void)len;
    rope_task k = {x, width, heads_per_tok, n_rot, inverse, qat, eps, w, freq, p0};
    /* rows of one position share its angles: split by positions when there are several */
    rows_run(c, norm_rope_rows, &k, rows, rows * width * (qat ? 4 : 1));
    return DS4_OK;
}

static int kv_store(ds4_backend_ctx *c, const float *kvr, int32_t n, int32_t D, float *ring, int32_t cap, int64_t p0,
                    int32_t n_rot, int32_t round, char *err, size_t len) {
    (void)c, (void)err, (void)len;
    for (int t = 0; t < n; t++) {
        float *dst = ring + (size_t)((p0 + t) % cap) * D;
        const float *src = kvr + (size_t)t * D;
        if (dst != src) memcpy(dst, src, (size_t)D * sizeof(float));
        if (round) ds4_fp8_kv_round_trip(dst, D, n_rot);
        if (round == 1) ds4_f16_round(dst, D);
    }
    return DS4_OK;
}

static int compress(ds4_backend_ctx *c, const float *cbuf, const float *zbuf, int32_t n, int64_t p0, int32_t W,
                    int32_t R, int32_t overlap, const float *ape, float *ring_c, float *ring_z, int32_t cap, int64_t w0,
                    int32_t nw, float *rows, const float *norm, float eps, const double *freq, int32_t n_rot,
                    int32_t indexer, int32_t ds4n, char *err, size_t len) {
    (void)c, (void)err, (void)len;
    const int cw = (overlap ? 2 : 1) * W;
    for (int t = 0; t < n; t++) { /* append the projections; the gate gets the position's ape row */
        int64_t p = p0 + t;
        float *rc = ring_c + (size_t)(p % cap) * cw, *rz = ring_z + (size_t)(p % cap) * cw;
        const float *a = ape + (size_t)(p % R) * cw;
        memcpy(rc, cbuf + (size_t)t * cw, (size_t)cw * sizeof(float));
        for (int j = 0; j < cw; j++) rz[j] = zbuf[(size_t)t * cw + j] + a[j];
    }
    for (int64_t w = w0; w < w0 + nw; w++) { /* emit the windows that closed */
        int64_t a = R * w;
        float *row = rows + (size_t)w * W;
        int lo = (overlap && w > 0) ? -R : 0; /* lane A of the previous window, then this window */
        for (int d = 0; d < W; d++) {
            float mx = -INFINITY;
            for (int k = lo; k < R; k++) {
                float z = ring_z[(size_t)((a + k) % cap) * cw + (k < 0 ? d : (overlap ? W + d : d))];
                if (z > mx) mx = z;
            }
            float sum = 0.0f;
            for (int k = lo; k < R; k++)
                sum += expf(ring_z[(size_t)((a + k) % cap) * cw + (k < 0 ? d : (overlap ? W + d : d))] - mx);
            float acc = 0.0f;
            for (int k = lo; k < R; k++) {
                size_t off = (size_t)((a + k) % cap) * cw + (k < 0 ? d : (overlap ? W + d : d));
                float pk = expf(ring_z[off] - mx) / sum;
                acc += pk * ring_c[off];
            }
            row[d] = acc;
        }
        ds4_rms_norm(row, W, eps, norm, row);
        ds4_rope(freq, n_rot, row, W, a, 0);
        if (indexer) {
            if (ds4n) ds4_indexer_qat(row, W);
        } else if (ds4n) {
            ds4_fp8_kv_round_trip(row, W, n_rot);
            ds4_f16_round(row, W);
        }
    }
    return DS4_OK;
}

typedef struct { float score; int32_t idx; } scored;

/* The indexer's order: higher score first, ties by lower index; a comes before b */
static inline int score_before(const scored *a, const scored *b) {
    return a->score > b->score || (!(a->score < b->score) && a->idx < b->idx);
}

static inline void scored_swap(scored *a, scored *b) { const scored t = *a; *a = *b; *b = t; }

/* Move the k first of v[0..n) in score_before's order to v[0..k), in no particular order
 * (quickselect, median-of-three pivots; the order is total: indices differ), where a full qsort
 * of every compressed row cost O(n log n) a token and layer. */
static void select_first(scored *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (score_before(&v[mid], &v[lo])) scored_swap(&v[mid], &v[lo]);
        if (score_before(&v[hi], &v[lo])) scored_swap(&v[hi], &v[lo]);
        if (score_before(&v[mid], &v[hi])) scored_swap(&v[mid], &v[hi]); /* the median now at hi */
        const scored pivot = v[hi];
        int64_t store = lo;
        for (int64_t i = lo; i < hi; i++)
            if (score_before(&v[i], &pivot)) scored_swap(&v[i], &v[store++]);
        scored_swap(&v[store], &v[hi]);
        if (store == k - 1) return;
        if (store > k - 1) hi = store - 1;
        else lo = store + 1;
    }
}

static int by_index(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

typedef struct {
    const float *qi, *iw, *keys;
    int64_t p0;
    int IH, ID, ratio, top_k;
    float scale;
    float *score;          /* [n_threads, 2 * max_vis] (score, index) pairs */
    int32_t max_vis;
    int32_t *sel, *nsel;
} idx_task;

/* The indexer scores of token t for compressed rows cc0 <= cc < cc1: buf[cc] = (sum_h w_h *
 * relu(q_h . K_cc) * scale, cc). */
static void index_scores(const idx_task *a, int64_t t, int64_t cc0, int64_t cc1, scored *buf) {
    const int IH = a->IH, ID = a->ID;
    const float *qi = a->qi + (size_t)t * IH * ID, *iw = a->iw + (size_t)t * IH;
    for (int64_t cc = cc0; cc < cc1; cc++) {
        const float *key = a->keys + (size_t)cc * ID;
        float sc = 0.0f, dots[4];
        int h = 0;
        for (; h + 4 <= IH; h += 4) { /* 4 heads against the key at once, the same bits */
            const float *qh[4] = {qi + (size_t)h * ID, qi + (size_t)(h + 1) * ID, qi + (size_t)(h + 2) * ID,
                                  qi + (size_t)(h + 3) * ID};
            ds4_dot_f32_4(key, qh, ID, dots);
            for (int j = 0; j < 4; j++) sc += iw[h + j] * ((dots[j] > 0.0f ? dots[j] : 0.0f) * a->scale);
        }
        for (; h < IH; h++) {
            const float dot = ds4_dot_f32(qi + (size_t)h * ID, key, ID);
            sc += iw[h] * ((dot > 0.0f ? dot : 0.0f) * a->scale);
        }
        buf[cc].score = sc;
        buf[cc].idx = (int32_t)cc;
    }
}

/* Token t's top_k rows from its n_vis scores in buf (sel sorted by index). */
static void index_select(const idx_task *a, int64_t t, int64_t n_vis, scored *buf) {
    const int K = a->top_k;
    select_first(buf, n_vis, K);
    int32_t *sel = a->sel + (size_t)t * K;
    for (int k = 0; k < K; k++) sel[k] = buf[k].idx;
    qsort(sel, (size_t)K, sizeof *sel, by_index);
    a->nsel[t] = K;
}

/* Lightning indexer for token t: the top_k compressed rows by sum_h w_h * relu(q_h . K_c). */
static void indexer_slice(void *ctx, int64_t t0, int64_t t1, int thread) {
    const idx_task *a = ctx;
    scored *buf = (scored *)(a->score + (size_t)thread * 2 * a->max_vis);
    for (int64_t t = t0; t < t1; t++) {
        const int64_t n_vis = (a->p0 + t + 1) / a->ratio;
        if (n_vis <= a->top_k) { a->nsel[t] = -1; continue; }
        index_scores(a, t, 0, n_vis, buf);
        index_select(a, t, n_vis, buf);
    }
}

/* Fewer tokens than threads (a decode): item i scores keys [i % nkc, + 1) * INDEX_KEYS of token i / nkc
 * into scratch row t (threads share a token's rows), then each token selects. */
enum { INDEX_KEYS = 128 };
typedef struct { const idx_task *a; int64_t nkc; } idx_keys_task;

static void index_keys_slice(void *ctx, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const idx_keys_task *k = ctx;
    const idx_task *a = k->a;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = i / k->nkc, n_vis = (a->p0 + t + 1) / a->ratio, cc0 = (i % k->nkc) * INDEX_KEYS;
        if (n_vis <= a->top_k || cc0 >= n_vis) continue;
        index_scores(a, t, cc0, cc0 + INDEX_KEYS < n_vis ? cc0 + INDEX_KEYS : n_vis,
                     (scored *)(a->score + (size_t)t * 2 * a->max_vis));
    }
}

/* score: n_threads rows of 2 * max_vis floats (one per worker; forward.c sizes it). */
static int indexer(ds4_backend_ctx *c, const float *qi, const float *iw, int32_t n, int64_t p0, int32_t IH, int32_t ID,
                   const float *keys, int32_t ratio, int32_t top_k, float scale, float *score, int32_t max_vis,
                   int32_t *sel, int32_t *nsel, char *err, size_t len) {
    (void)err, (void)len;
    idx_task t = {qi, iw, keys, p0, IH, ID, ratio, top_k, scale, score, max_vis, sel, nsel};
    const int64_t vis_last = (p0 + n) / ratio;
    if (n < c->n_threads && vis_last >= 2 * INDEX_KEYS) { /* the keys split over the threads, the same scores */
        idx_keys_task k = {&t, (vis_last + INDEX_KEYS - 1) / INDEX_KEYS};
        ds4_pool_run(c->pool, index_keys_slice, &k, n * k.nkc);
        for (int64_t r = 0; r < n; r++) {
            const int64_t n_vis = (p0 + r + 1) / ratio;
            if (n_vis <= top_k) nsel[r] = -1;
            else index_select(&t, r, n_vis, (scored *)(score + (size_t)r * 2 * max_vis));
        }
        return DS4_OK;
    }
    ds4_pool_run(c->pool, indexer_slice, &t, n);
    return DS4_OK;
}

/* o[D] = sum_k p_k keys[k] with p = softmax over (q . keys[k] * scale, sink) of the nk keys and the
 * head's sink logit, which takes probability mass but adds no value (V = K; spec ds4.md §2.2).
 * sc[nk] is scratch. */
static void attend_keys(const float *q, const float *const *keys, int nk, float sink, int D, float scale, float *sc,
                        float *restrict o) {
    float mx = sink;
    int k4 = 0;
    for (; k4 + 4 <= nk; k4 += 4) ds4_dot_f32_4(q, keys + k4, D, sc + k4);
    for (; k4 < nk; k4++) sc[k4] = ds4_dot_f32(q, keys[k4], D);
    for (int k = 0; k < nk; k++) {
        sc[k] = sc[k] * scale;
        if (sc[k] > mx) mx = sc[k];
    }
    float denom = 0.0f;
    for (int k = 0; k < nk; k++) { sc[k] = expf(sc[k] - mx); denom += sc[k]; }
    denom += expf(sink - mx);
    memset(o, 0, (size_t)D * sizeof(float));
    /* four keys per pass over o: each lane still adds p_k * key_k[d] in key order (the same floats
     * as one key at a time), with one load and store of o per four keys */
    int k = 0;
    for (; k + 4 <= nk; k += 4) {
        const float p0 = sc[k] / denom, p1 = sc[k + 1] / denom, p2 = sc[k + 2] / denom, p3 = sc[k + 3] / denom;
        const float *restrict k0 = keys[k], *restrict k1 = keys[k + 1], *restrict k2 = keys[k + 2],
                    *restrict k3 = keys[k + 3];
        for (int d = 0; d < D; d++) {
            float v = o[d];
            v += p0 * k0[d];
            v += p1 * k1[d];
            v += p2 * k2[d];
            v += p3 * k3[d];
            o[d] = v;
        }
    }
    for (; k < nk; k++) {
        float pk = sc[k] / denom;
        const float *kk = keys[k];
        for (int d = 0; d < D; d++) o[d] += pk * kk[d];
    }
}

typedef struct {
    const float *q;
    int NH, D;
    int64_t p0;
    int window;
    const float *kv;
    int32_t kv_cap;
    const float *comp;
    int ratio;
    const int32_t *sel, *nsel;
    int top_k;
    const float *sinks;
    float *sc;              /* [n_threads, 4 * keys_cap]: scores, then key pointers */
    int64_t stride;
    float *att;
    /* non-causal block attention (attend_nc): context ring rows lo .. lo+n_ctx-1, then n_rows rows */
    int64_t lo;
    int32_t n_ctx, n_rows;
    const float *rows;
} att_task;

/* Items are t * NH + h; each worker uses its own scratch row. */
static void attend_slice(void *ctx, int64_t i0, int64_t i1, int thread) {
    const att_task *a = ctx;
    const int NH = a->NH, D = a->D;
    const float scale = (float)(1.0 / sqrt((double)D));
    float *sc = a->sc + (size_t)thread * a->stride;
    const float **keys = (const float **)(sc + a->stride / 2);
    for (int64_t it = i0; it < i1; it++) {
        int t = (int)(it / NH), h = (int)(it % NH);
        const float *q = a->q + ((size_t)t * NH + h) * D;
        int nk = 0;
        if (a->rows) {
            for (int64_t p = a->lo; p < a->lo + a->n_ctx; p++) keys[nk++] = a->kv + (size_t)(p % a->kv_cap) * D;
            for (int j = 0; j < a->n_rows; j++) keys[nk++] = a->rows + (size_t)j * D;
        } else {
            int64_t p = a->p0 + t;
            int64_t first = p - a->window + 1 < 0 ? 0 : p - a->window + 1;
            for (int64_t kp = first; kp <= p; kp++) keys[nk++] = a->kv + (size_t)(kp % a->kv_cap) * D;
            if (a->ratio > 0) {
                if (a->nsel && a->nsel[t] >= 0) {
                    const int32_t *sel = a->sel + (size_t)t * a->top_k;
                    for (int k = 0; k < a->nsel[t]; k++) keys[nk++] = a->comp + (size_t)sel[k] * D;
                } else {
                    int64_t n_vis = (p + 1) / a->ratio;
                    for (int64_t cc = 0; cc < n_vis; cc++) keys[nk++] = a->comp + (size_t)cc * D;
                }
            }
        }
        attend_keys(q, keys, nk, a->sinks[h], D, scale, sc, a->att + ((size_t)t * NH + h) * D);
    }
}

/* sc: n_threads rows of 4 * keys_cap floats (one per worker; forward.c sizes it). */
static int attend(ds4_backend_ctx *c, const float *q, int32_t n, int32_t NH, int32_t D, int64_t p0, int32_t window,
                  const float *kv, int32_t kv_cap, const float *comp, int32_t ratio, const int32_t *sel,
                  const int32_t *nsel, int32_t top_k, const float *sinks, float *sc, int32_t keys_cap, float *att,
                  char *err, size_t len) {
    (void)err, (void)len;
    att_task t = {q, NH, D, p0, window, kv, kv_cap, comp, ratio, sel, nsel, top_k, sinks, sc, 4 * (int64_t)keys_cap,
                  att, 0, 0, 0, NULL};
    ds4_pool_run(c->pool, attend_slice, &t, (int64_t)n * NH);
    return DS4_OK;
}

static int attend_nc(ds4_backend_ctx *c, const float *q, int32_t n, int32_t NH, int32_t D, const float *ring, int32_t cap,
                     int64_t lo, int32_t n_ctx, const float *rows, int32_t n_rows, const float *sinks, float *sc,
                     int32_t keys_cap, float *att, char *err, size_t len) {
    (void)err, (void)len;
    att_task t = {q, NH, D, 0, 0, ring, cap, NULL, 0, NULL, NULL, 0, sinks, sc, 4 * (int64_t)keys_cap, att, lo, n_ctx,
                  n_rows, rows};
    ds4_pool_run(c->pool, attend_slice, &t, (int64_t)n * NH);
    return DS4_OK;
}

/* ---- MoE (spec ds4.md §2.7) ------------------------------------------------------------------- */

static float sqrt_softplus(float x) {
    float sp = x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
    return sqrtf(sp);
}

static int moe_route(ds4_backend_ctx *c, float *scores, int32_t n, int32_t E, int32_t K, const int32_t *tid2eid,
                     const int32_t *tokens, const float *bias, int32_t norm, int32_t ds4n, float scale, int32_t *sel_out,
                     float *wsel, char *err, size_t len) {
    (void)c, (void)err, (void)len;
    for (int64_t i = 0; i < (int64_t)n * E; i++) scores[i] = sqrt_softplus(scores[i]);
    for (int t = 0; t < n; t++) {
        const float *st = scores + (size_t)t * E;
        int32_t *sel = sel_out + (size_t)t * K;
        float *ws = wsel + (size_t)t * K;
        if (tid2eid) {
            memcpy(sel, tid2eid + (size_t)tokens[t] * K, (size_t)K * sizeof(int32_t));
        } else { /* top-k of score + bias, ties to the lowest expert id */
            for (int k = 0; k < K; k++) {
                int best = -1;
                float bv = -INFINITY;
                for (int x = 0; x < E; x++) {
                    int used = 0;
                    for (int j = 0; j < k; j++) used |= sel[j] == x;
                    float v = st[x] + bias[x];
                    if (!used && (best < 0 || v > bv)) { best = x; bv = v; }
                }
                sel[k] = best;
            }
        }
        float total = 0.0f;
        for (int k = 0; k < K; k++) { ws[k] = st[sel[k]]; total += ws[k]; }
        if (norm) {
            total = ds4n ? (total < 6.1035e-5f ? 6.1035e-5f : total) : total + 1e-20f;
            for (int k = 0; k < K; k++) ws[k] /= total;
        }
        for (int k = 0; k < K; k++) ws[k] *= scale;
    }
    return DS4_OK;
}

typedef struct { float *a; const float *b; float clamp; } swiglu_task;

enum { SWIGLU_ITEM = 1024 }; /* elements per item of the pool */

static void swiglu_items(void *ctx, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const swiglu_task *k = ctx;
    const float clamp = k->clamp;
    float *a = k->a;
    const float *b = k->b;
    for (int64_t i = i0; i < i1; i++) {
        float g = a[i], u = b[i];
        if (clamp > 0.0f) {
            if (g > clamp) g = clamp;
            if (u > clamp) u = clamp;
            if (u < -clamp) u = -clamp;
        }
        a[i] = g * ds4_sigmoid(g) * u;
    }
}

static void swiglu_blocks(void *ctx, int64_t j0, int64_t j1, int thread) {
    swiglu_items(ctx, j0 * SWIGLU_ITEM, j1 * SWIGLU_ITEM, thread);
}

static int swiglu(ds4_backend_ctx *c, float *a, const float *b, int64_t n, float clamp, char *err, size_t len) {
    (void)err, (void)len;
    swiglu_task k = {a, b, clamp};
    const int64_t whole = n / SWIGLU_ITEM;
    rows_run(c, swiglu_blocks, &k, whole, n);
    swiglu_items(&k, whole * SWIGLU_ITEM, n, 0);
    return DS4_OK;
}

/* y[t] = (sum of t's expert rows in ascending expert id, then slot order) + shared[t]. */
typedef struct {
    const float *oe, *wsel, *shared;
    const int32_t *sel;
    int32_t K, H;
    float *y;
} combine_task;

static void combine_rows(void *ctx, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const combine_task *c = ctx;
    const float *oe = c->oe, *wsel = c->wsel, *shared = c->shared;
    const int32_t *sel = c->sel;
    const int32_t K = c->K, H = c->H;
    float *y = c->y;
    for (int64_t t = t0; t < t1; t++) {
        int order[64];
        int nk = K < 64 ? K : 64;
        for (int k = 0; k < nk; k++) { /* insertion sort of the slots by (expert id, slot) */
            int j = k;
            while (j > 0 && sel[(size_t)t * K + order[j - 1]] > sel[(size_t)t * K + k]) { order[j] = order[j - 1]; j--; }
            order[j] = k;
        }
        float *restrict yt = y + (size_t)t * H, w[64];
        const float *sh = shared + (size_t)t * H, *rows[64];
        for (int i = 0; i < nk; i++) {
            w[i] = wsel[(size_t)t * K + order[i]];
            rows[i] = oe + ((size_t)t * K + order[i]) * H;
        }
        weighted_rows(w, rows, nk, H, yt); /* acc, then acc + sh[d] per lane */
        for (int d = 0; d < H; d++) yt[d] = yt[d] + sh[d];
    }
}

static int moe_combine(ds4_backend_ctx *c, const float *oe, const int32_t *sel, const float *wsel, int32_t n, int32_t K,
                       int32_t H, const float *shared, float *y, char *err, size_t len) {
    (void)err, (void)len;
    combine_task k = {oe, wsel, shared, sel, K, H, y};
    rows_run(c, combine_rows, &k, n, (int64_t)n * K * H);
    return DS4_OK;
}

static int scale(ds4_backend_ctx *c, float *x, int64_t n, float s, char *err, size_t len) {
    (void)c, (void)err, (void)len;
    for (int64_t i = 0; i < n; i++) x[i] *= s;
    return DS4_OK;
}

/* ---- DSpark (spec dspark.md §2.2, §2.4) -------------------------------------------------------- */

static int capture(ds4_backend_ctx *c, const float *X, int32_t n, int32_t HC, int32_t H, int64_t p0, float *ring,
                   int32_t cap, int32_t n_slot, int32_t slot, char *err, size_t len) {
    (void)c, (void)err, (void)len;
    const float inv = 1.0f / (float)HC;
    for (int t = 0; t < n; t++) {
        const float *Xt = X + (size_t)t * HC * H;
        float *dst = ring + ((size_t)((p0 + t) % cap) * n_slot + slot) * H, ones[MAXHC];
        const float *rows[MAXHC];
        for (int a = 0; a < HC; a++) rows[a] = Xt + (size_t)a * H, ones[a] = 1.0f;
        weighted_rows(ones, rows, HC, H, dst); /* the plain sum (1 * x is x), then times 1/HC */
        for (int i = 0; i < H; i++) dst[i] = dst[i] * inv;
    }
    return DS4_OK;
}

/* ds4_argmax's rule (first maximum; NaN never wins) on the sums a[i] + b[i]. */
static int add_argmax(ds4_backend_ctx *c, const float *a, const float *b, int32_t n, int32_t *out, char *err,
                      size_t len) {
    (void)c, (void)err, (void)len;
    *out = ds4_argmax_sum(a, b, n);
    return DS4_OK;
}

static int reserve(ds4_backend_ctx *c, int64_t x_floats, int64_t y_floats, char *err, size_t len) {
    (void)c, (void)x_floats, (void)y_floats, (void)err, (void)len;
    return DS4_OK;
}

static const ds4_backend k_cpu = {
    .version = DS4_GPU_API_VERSION,
    .close = close_ctx,
    .upload = upload,
    .free = release,
    .allocated = allocated,
    .matmul = mm,
    .copy = copy,
    .sync = sync,
    .mm = mm,
    .mm_gather = mm_gather,
    .mm_grouped = mm_grouped,
    .embed = embed,
    .rms_norm = rms_norm,
    .hc_pre = hc_pre,
    .hc_post = hc_post,
    .hc_head = hc_head,
    .norm_rope = norm_rope,
    .kv_store = kv_store,
    .compress = compress,
    .indexer = indexer,
    .attend = attend,
    .moe_route = moe_route,
    .swiglu = swiglu,
    .moe_combine = moe_combine,
    .scale = scale,
    .capture = capture,
    .attend_nc = attend_nc,
    .reserve = reserve,
    .add_argmax = add_argmax,
    .host_memory = 1,
};

const ds4_backend *ds4_cpu_backend(void) { return &k_cpu; }
