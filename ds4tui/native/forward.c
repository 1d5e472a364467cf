/* forward.c — the DS4 target forward pass on the CPU (spec ds4.md §2).
 *
 * One call runs a batch of up to n_batch tokens through every layer:
 * embedding -> [mHC pre -> attention (SWA / CSA with the lightning indexer /
 * HCA, sinks) -> mHC post -> mHC pre -> MoE (hash or top-k routing, shared
 * expert) -> mHC post] x n_layer -> HC head -> norm -> LM head.
 * The operation order follows the numpy reference (ds4tui/engine/reference.py);
 * tests/test_native_engine.py holds the engine to it.
 */
#include "internal.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAXHC 16

void ds4_mm(ds4_engine *e, const ds4_w *w, int64_t mat, const float *X, int64_t ldx, int64_t n, float *Y,
               int64_t ldy) {
    if (w->dev) ds4_gpu_mm(e, w, mat, 0, w->rows, X, ldx, n, Y, ldy);
    else ds4_cpu_matmul(e->pool, w->type, w->data + (size_t)mat * w->mat_bytes, w->rows, w->cols, X, ldx, n, Y, ldy);
}

/* Rows [r0, r0+nr) of a matrix. */
void ds4_mm_rows(ds4_engine *e, const ds4_w *w, int64_t r0, int64_t nr, const float *X, int64_t ldx, int64_t n,
                    float *Y, int64_t ldy) {
    if (w->dev) ds4_gpu_mm(e, w, 0, r0, nr, X, ldx, n, Y, ldy);
    else ds4_cpu_matmul(e->pool, w->type, w->data + (size_t)r0 * w->row_bytes, nr, w->cols, X, ldx, n, Y, ldy);
}

static const double *rope_of(const ds4_engine *e, const ds4_layer *l) {
    return l->kind == DS4_SWA ? e->freq_main : e->freq_comp;
}

/* ---- hyper-connections (spec ds4.md §2.1) ------------------------------------------------- */

/* mHC pre-mix of X[n, HC, H]: writes the collapsed input x[n, H], post[n, HC], comb[n, HC*HC]
 * (row = source stream, column = destination). */
void ds4_hc_pre(ds4_session *s, const ds4_w *fn, const float *base, const float *scale, const float *X, int n,
                   float *x, float *post, float *comb) {
    ds4_engine *e = s->e;
    const int HC = e->c.hc_count, H = e->c.n_embd, mix = 2 * HC + HC * HC;
    const float eps = e->c.hc_eps;
    float *f = s->sc.X2; /* [n, HC*H] normalised streams (X2 is free here) */
    for (int t = 0; t < n; t++) ds4_rms_norm(X + (size_t)t * HC * H, (int64_t)HC * H, e->c.rms_eps, NULL, f + (size_t)t * HC * H);
    ds4_mm(e, fn, 0, f, (int64_t)HC * H, n, s->sc.hcm, mix);
    for (int t = 0; t < n; t++) {
        const float *m = s->sc.hcm + (size_t)t * mix;
        float pre[MAXHC];
        float *po = post + (size_t)t * HC, *cb = comb + (size_t)t * HC * HC;
        for (int a = 0; a < HC; a++) {
            pre[a] = ds4_sigmoid(scale[0] * m[a] + base[a]) + eps;
            po[a] = 2.0f * ds4_sigmoid(scale[1] * m[HC + a] + base[HC + a]);
        }
        for (int a = 0; a < HC; a++) { /* softmax over destinations, + eps */
            float *r = cb + a * HC, mx = -INFINITY, sum = 0.0f;
            for (int b = 0; b < HC; b++) {
                r[b] = scale[2] * m[2 * HC + a * HC + b] + base[2 * HC + a * HC + b];
                if (r[b] > mx) mx = r[b];
            }
            for (int b = 0; b < HC; b++) { r[b] = expf(r[b] - mx); sum += r[b]; }
            for (int b = 0; b < HC; b++) r[b] = r[b] / sum + eps;
        }
        for (int it = 0; it < e->c.hc_sinkhorn_iters; it++) {
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
        const float *Xt = X + (size_t)t * HC * H;
        float *xt = x + (size_t)t * H;
        for (int d = 0; d < H; d++) {
            float acc = 0.0f;
            for (int a = 0; a < HC; a++) acc += pre[a] * Xt[(size_t)a * H + d];
            xt[d] = acc;
        }
    }
}

/* X'[b] = post[b] * out + sum_a comb[a, b] * X[a]; written to Y (may not alias X). */
void ds4_hc_post(const ds4_engine *e, const float *X, const float *out, const float *post, const float *comb, int n,
                    float *Y) {
    const int HC = e->c.hc_count, H = e->c.n_embd;
    for (int t = 0; t < n; t++) {
        const float *Xt = X + (size_t)t * HC * H, *o = out + (size_t)t * H;
        const float *po = post + (size_t)t * HC, *cb = comb + (size_t)t * HC * HC;
        float *Yt = Y + (size_t)t * HC * H;
        for (int b = 0; b < HC; b++)
            for (int d = 0; d < H; d++) {
                float acc = 0.0f;
                for (int a = 0; a < HC; a++) acc += cb[a * HC + b] * Xt[(size_t)a * H + d];
                Yt[(size_t)b * H + d] = po[b] * o[d] + acc;
            }
    }
}

/* ---- compressor (spec ds4.md §2.4) ---------------------------------------------------------- */

typedef struct {
    const ds4_w *kv, *gate;
    const float *ape, *norm;
    int ratio, width, overlap, indexer;
    float *ring_c, *ring_z, *rows;
} compressor;

/* Append the projections of n tokens (positions p0...) and emit every window that closes. */
static void compress(ds4_session *s, const compressor *cp, const float *xn, int n, int64_t p0) {
    ds4_engine *e = s->e;
    const int H = e->c.n_embd, W = cp->width, cw = (cp->overlap ? 2 : 1) * W, R = cp->ratio;
    const int cap = s->cmp_cap;
    float *cbuf = s->sc.cbuf, *zbuf = s->sc.zbuf;
    ds4_mm(e, cp->kv, 0, xn, H, n, cbuf, cw);
    ds4_mm(e, cp->gate, 0, xn, H, n, zbuf, cw);
    for (int t = 0; t < n; t++) {
        int64_t p = p0 + t;
        float *rc = cp->ring_c + (size_t)(p % cap) * cw, *rz = cp->ring_z + (size_t)(p % cap) * cw;
        const float *ape = cp->ape + (size_t)(p % R) * cw;
        memcpy(rc, cbuf + (size_t)t * cw, (size_t)cw * sizeof(float));
        for (int j = 0; j < cw; j++) rz[j] = zbuf[(size_t)t * cw + j] + ape[j];
        if ((p + 1) % R) continue;
        int64_t w = p / R, a = R * w;
        float *row = cp->rows + (size_t)w * W;
        for (int d = 0; d < W; d++) {
            /* candidates: lane A of the previous window (overlap, w > 0), then this window */
            float mx = -INFINITY;
            int lo = (cp->overlap && w > 0) ? -R : 0;
            for (int k = lo; k < R; k++) {
                int64_t q = a + k;
                float z = cp->ring_z[(size_t)(q % cap) * cw + (k < 0 ? d : (cp->overlap ? W + d : d))];
                if (z > mx) mx = z;
            }
            float sum = 0.0f;
            for (int k = lo; k < R; k++) {
                int64_t q = a + k;
                sum += expf(cp->ring_z[(size_t)(q % cap) * cw + (k < 0 ? d : (cp->overlap ? W + d : d))] - mx);
            }
            float acc = 0.0f;
            for (int k = lo; k < R; k++) {
                int64_t q = a + k;
                size_t off = (size_t)(q % cap) * cw + (k < 0 ? d : (cp->overlap ? W + d : d));
                float pk = expf(cp->ring_z[off] - mx) / sum;
                acc += pk * cp->ring_c[off];
            }
            row[d] = acc;
        }
        ds4_rms_norm(row, W, e->c.rms_eps, cp->norm, row);
        ds4_rope(e->freq_comp, e->c.n_rot, row, W, a, 0);
        if (cp->indexer) {
            if (e->numerics == DS4_NUMERICS_DS4) ds4_indexer_qat(row, W);
        } else if (e->numerics == DS4_NUMERICS_DS4) {
            ds4_fp8_kv_round_trip(row, W, e->c.n_rot);
            ds4_f16_round(row, W);
        }
    }
}

/* ---- attention (spec ds4.md §2.2, §2.5) ----------------------------------------------------- */

typedef struct {
    ds4_session *s;
    const ds4_layer *l;
    const ds4_layer_cache *lc;
    int64_t p0;
    int n;
    int32_t *csel;   /* [n, top_k] selected compressed rows (CSA with more than top_k visible) */
    int32_t *ncsel;  /* [n]: count, or -1 = every visible compressed row */
} att_task;

typedef struct { float score; int32_t idx; } scored;

static int by_score_then_index(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

static int by_index(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

/* Lightning indexer for token t: the top_k compressed rows by sum_h w_h * relu(q_h . K_c). */
static void indexer_slice(void *ctx, int64_t t0, int64_t t1, int thread) {
    att_task *a = ctx;
    ds4_session *s = a->s;
    const ds4_engine *e = s->e;
    const int IH = e->c.indexer_n_head, ID = e->c.indexer_head_dim, K = e->c.indexer_top_k;
    scored *buf = (scored *)(s->sc.iscore + (size_t)thread * s->sc.isel_stride);
    for (int64_t t = t0; t < t1; t++) {
        int64_t p = a->p0 + t;
        int64_t n_vis = (p + 1) / a->l->ratio;
        if (n_vis <= K) { a->ncsel[t] = -1; continue; }
        const float *qi = s->sc.qi + (size_t)t * IH * ID, *iw = s->sc.iw + (size_t)t * IH;
        const float scale = (float)pow((double)ID, -0.5);
        for (int64_t c = 0; c < n_vis; c++) {
            const float *key = a->lc->idx_keys + (size_t)c * ID;
            float sc = 0.0f;
            for (int h = 0; h < IH; h++) {
                float dot = ds4_dot_f32(qi + (size_t)h * ID, key, ID);
                sc += iw[h] * ((dot > 0.0f ? dot : 0.0f) * scale);
            }
            buf[c].score = sc;
            buf[c].idx = (int32_t)c;
        }
        qsort(buf, (size_t)n_vis, sizeof *buf, by_score_then_index);
        int32_t *sel = a->csel + (size_t)t * K;
        for (int k = 0; k < K; k++) sel[k] = buf[k].idx;
        qsort(sel, (size_t)K, sizeof *sel, by_index);
        a->ncsel[t] = K;
    }
}

/* o[D] = sum_k p_k keys[k] with p = softmax over (q . keys[k] * scale, sink) of the nk keys and the
 * head's sink logit, which takes probability mass but adds no value (V = K; spec ds4.md §2.2).
 * sc[nk] is scratch. */
void ds4_attend_keys(const float *q, const float *const *keys, int nk, float sink, int D, float scale, float *sc,
                     float *o) {
    float mx = sink;
    for (int k = 0; k < nk; k++) {
        sc[k] = ds4_dot_f32(q, keys[k], D) * scale;
        if (sc[k] > mx) mx = sc[k];
    }
    float denom = 0.0f;
    for (int k = 0; k < nk; k++) { sc[k] = expf(sc[k] - mx); denom += sc[k]; }
    denom += expf(sink - mx);
    memset(o, 0, (size_t)D * sizeof(float));
    for (int k = 0; k < nk; k++) {
        float pk = sc[k] / denom;
        const float *kk = keys[k];
        for (int d = 0; d < D; d++) o[d] += pk * kk[d];
    }
}

/* Sink softmax attention of one (token, head) pair; V = K.  Items are t * n_head + h. */
static void attend_slice(void *ctx, int64_t i0, int64_t i1, int thread) {
    att_task *a = ctx;
    ds4_session *s = a->s;
    const ds4_engine *e = s->e;
    const int NH = e->c.n_head, D = e->c.head_dim, Wn = e->c.sliding_window;
    const float scale = (float)(1.0 / sqrt((double)D));
    float *sc = s->sc.att_tmp + (size_t)thread * s->sc.att_tmp_stride;
    const float **keys = (const float **)(sc + s->sc.att_tmp_stride / 2);
    for (int64_t it = i0; it < i1; it++) {
        int t = (int)(it / NH), h = (int)(it % NH);
        int64_t p = a->p0 + t;
        const float *q = s->sc.q + ((size_t)t * NH + h) * D;
        int nk = 0;
        int64_t first = p - Wn + 1 < 0 ? 0 : p - Wn + 1;
        for (int64_t kp = first; kp <= p; kp++) keys[nk++] = a->lc->kv + (size_t)(kp % s->kv_cap) * D;
        if (a->l->kind != DS4_SWA) {
            int64_t n_vis = (p + 1) / a->l->ratio;
            if (a->ncsel && a->ncsel[t] >= 0) {
                const int32_t *sel = a->csel + (size_t)t * e->c.indexer_top_k;
                for (int k = 0; k < a->ncsel[t]; k++) keys[nk++] = a->lc->comp + (size_t)sel[k] * D;
            } else {
                for (int64_t c = 0; c < n_vis; c++) keys[nk++] = a->lc->comp + (size_t)c * D;
            }
        }
        ds4_attend_keys(q, keys, nk, a->l->sinks[h], D, scale, sc, s->sc.att + ((size_t)t * NH + h) * D);
    }
}

/* Queries of n tokens at positions p0...: sc->qr [n, q_lora] (normed, kept for the indexer) and
 * sc->q [n, NH, D] (head-normed, RoPE'd). */
void ds4_attn_q(ds4_session *s, const ds4_layer *l, const float *xn, int n, int64_t p0, const double *freq) {
    ds4_engine *e = s->e;
    ds4_scratch *sc = &s->sc;
    const int H = e->c.n_embd, NH = e->c.n_head, D = e->c.head_dim, QL = e->c.q_lora_rank;
    ds4_mm(e, &l->q_a, 0, xn, H, n, sc->qr, QL);
    for (int t = 0; t < n; t++) ds4_rms_norm(sc->qr + (size_t)t * QL, QL, e->c.rms_eps, l->q_a_norm, sc->qr + (size_t)t * QL);
    ds4_mm(e, &l->q_b, 0, sc->qr, QL, n, sc->q, (int64_t)NH * D);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < NH; h++) {
            float *qh = sc->q + ((size_t)t * NH + h) * D;
            ds4_rms_norm(qh, D, e->c.rms_eps, NULL, qh);
            ds4_rope(freq, e->c.n_rot, qh, D, p0 + t, 0);
        }
}

/* KV rows [n, D] of n tokens at positions p0... (normed, RoPE'd, not rounded) into out. */
void ds4_attn_kv(ds4_session *s, const ds4_layer *l, const float *xn, int n, int64_t p0, const double *freq, float *out) {
    ds4_engine *e = s->e;
    const int H = e->c.n_embd, D = e->c.head_dim;
    ds4_mm(e, &l->kv, 0, xn, H, n, out, D);
    for (int t = 0; t < n; t++) {
        float *r = out + (size_t)t * D;
        ds4_rms_norm(r, D, e->c.rms_eps, l->kv_norm, r);
        ds4_rope(freq, e->c.n_rot, r, D, p0 + t, 0);
    }
}

/* Inverse RoPE of sc->att [n, NH, D] at the query positions, then the grouped low-rank output
 * projection (group g maps its heads' NH/G*D lanes to R lanes) into out [n, H]. */
void ds4_attn_output(ds4_session *s, const ds4_layer *l, int n, int64_t p0, const double *freq, float *out) {
    ds4_engine *e = s->e;
    ds4_scratch *sc = &s->sc;
    const int H = e->c.n_embd, NH = e->c.n_head, D = e->c.head_dim;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < NH; h++) ds4_rope(freq, e->c.n_rot, sc->att + ((size_t)t * NH + h) * D, D, p0 + t, 1);
    const int G = e->c.o_groups, R = e->c.o_lora_rank, gw = NH / G * D;
    for (int g = 0; g < G; g++)
        ds4_mm_rows(e, &l->out_a, (int64_t)g * R, R, sc->att + (size_t)g * gw, (int64_t)NH * D, n, sc->u + (size_t)g * R,
                    (int64_t)G * R);
    ds4_mm(e, &l->out_b, 0, sc->u, (int64_t)G * R, n, out, H);
}

static void attention(ds4_session *s, int L, const float *xn, int n, int64_t p0, float *out) {
    ds4_engine *e = s->e;
    const ds4_layer *l = &e->layers[L];
    ds4_layer_cache *lc = &s->lc[L];
    ds4_scratch *sc = &s->sc;
    const int H = e->c.n_embd, NH = e->c.n_head, D = e->c.head_dim, QL = e->c.q_lora_rank, nr = e->c.n_rot;
    const double *freq = rope_of(e, l);
    const int ds4n = e->numerics == DS4_NUMERICS_DS4;

    ds4_attn_q(s, l, xn, n, p0, freq);
    ds4_attn_kv(s, l, xn, n, p0, freq, sc->kvr);
    for (int t = 0; t < n; t++) {
        float *dst = lc->kv + (size_t)((p0 + t) % s->kv_cap) * D;
        memcpy(dst, sc->kvr + (size_t)t * D, (size_t)D * sizeof(float));
        if (ds4n) {
            ds4_fp8_kv_round_trip(dst, D, nr);
            ds4_f16_round(dst, D);
        }
    }
    att_task at = {s, l, lc, p0, n, NULL, NULL};
    if (l->kind != DS4_SWA) {
        compressor cp = {&l->comp_kv, &l->comp_gate, l->comp_ape, l->comp_norm, l->ratio, D, l->kind == DS4_CSA, 0,
                         lc->cmp_c, lc->cmp_z, lc->comp};
        compress(s, &cp, xn, n, p0);
    }
    if (l->kind == DS4_CSA) {
        const int IH = e->c.indexer_n_head, ID = e->c.indexer_head_dim;
        compressor ip = {&l->idx_comp_kv, &l->idx_comp_gate, l->idx_comp_ape, l->idx_comp_norm, l->ratio, ID, 1, 1,
                         lc->idx_c, lc->idx_z, lc->idx_keys};
        compress(s, &ip, xn, n, p0);
        int need = (p0 + n) / l->ratio > e->c.indexer_top_k;
        if (need) {
            ds4_mm(e, &l->idx_q_b, 0, sc->qr, QL, n, sc->qi, (int64_t)IH * ID);
            for (int t = 0; t < n; t++)
                for (int h = 0; h < IH; h++) {
                    float *qh = sc->qi + ((size_t)t * IH + h) * ID;
                    ds4_rope(e->freq_comp, nr, qh, ID, p0 + t, 0);
                    if (ds4n) ds4_indexer_qat(qh, ID);
                }
            ds4_mm(e, &l->idx_proj, 0, xn, H, n, sc->iw, IH);
            const float ws = (float)pow((double)IH, -0.5);
            for (int64_t i = 0; i < (int64_t)n * IH; i++) sc->iw[i] *= ws;
        }
        at.csel = sc->sel_comp;
        at.ncsel = sc->nsel_comp;
        if (need) {
            ds4_pool_run(e->pool, indexer_slice, &at, n);
        } else {
            for (int t = 0; t < n; t++) at.ncsel[t] = -1;
        }
    }
    ds4_pool_run(e->pool, attend_slice, &at, (int64_t)n * NH);
    ds4_attn_output(s, l, n, p0, freq, out);
}

/* ---- MoE (spec ds4.md §2.7) ----------------------------------------------------------------- */

static float sqrt_softplus(float x) {
    float sp = x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
    return sqrtf(sp);
}

static void swiglu(float *a, const float *b, int64_t n, float clamp) {
    for (int64_t i = 0; i < n; i++) {
        float g = a[i], u = b[i];
        if (clamp > 0.0f) {
            if (g > clamp) g = clamp;
            if (u > clamp) u = clamp;
            if (u < -clamp) u = -clamp;
        }
        a[i] = g * ds4_sigmoid(g) * u;
    }
}

void ds4_moe(ds4_session *s, const ds4_layer *l, const float *xn, const int32_t *tokens, int n, float *out) {
    ds4_engine *e = s->e;
    ds4_scratch *sc = &s->sc;
    const int H = e->c.n_embd, E = e->c.n_expert, K = e->c.n_expert_used, F = e->c.n_ff_exp;
    ds4_mm(e, &l->gate_inp, 0, xn, H, n, sc->scores, E);
    for (int64_t i = 0; i < (int64_t)n * E; i++) sc->scores[i] = sqrt_softplus(sc->scores[i]);
    for (int t = 0; t < n; t++) {
        const float *st = sc->scores + (size_t)t * E;
        int32_t *sel = sc->sel + (size_t)t * K;
        float *ws = sc->wsel + (size_t)t * K;
        if (l->hashed) {
            memcpy(sel, l->tid2eid + (size_t)tokens[t] * K, (size_t)K * sizeof(int32_t));
        } else { /* top-k of score + bias, ties to the lowest expert id */
            for (int k = 0; k < K; k++) {
                int best = -1;
                float bv = -INFINITY;
                for (int x = 0; x < E; x++) {
                    int used = 0;
                    for (int j = 0; j < k; j++) used |= sel[j] == x;
                    float v = st[x] + l->exp_bias[x];
                    if (!used && (best < 0 || v > bv)) { best = x; bv = v; }
                }
                sel[k] = best;
            }
        }
        float total = 0.0f;
        for (int k = 0; k < K; k++) { ws[k] = st[sel[k]]; total += ws[k]; }
        if (e->c.expert_weights_norm) {
            total = e->numerics == DS4_NUMERICS_DS4 ? (total < 6.1035e-5f ? 6.1035e-5f : total) : total + 1e-20f;
            for (int k = 0; k < K; k++) ws[k] /= total;
        }
        for (int k = 0; k < K; k++) ws[k] *= e->c.expert_weights_scale;
    }
    memset(sc->moe_y, 0, (size_t)n * H * sizeof(float));
    for (int x = 0; x < E; x++) { /* experts in ascending order, each over the tokens that chose it */
        int ne = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (sc->sel[(size_t)t * K + k] == x) {
                    sc->erows[ne] = t;
                    sc->eslot[ne] = k;
                    memcpy(sc->xe + (size_t)ne * H, xn + (size_t)t * H, (size_t)H * sizeof(float));
                    ne++;
                }
        if (!ne) continue;
        ds4_mm(e, &l->gate_exps, x, sc->xe, H, ne, sc->ge, F);
        ds4_mm(e, &l->up_exps, x, sc->xe, H, ne, sc->he, F);
        swiglu(sc->ge, sc->he, (int64_t)ne * F, l->clamp);
        ds4_mm(e, &l->down_exps, x, sc->ge, F, ne, sc->oe, H);
        for (int i = 0; i < ne; i++) {
            int t = sc->erows[i];
            float w = sc->wsel[(size_t)t * K + sc->eslot[i]];
            float *y = sc->moe_y + (size_t)t * H;
            const float *o = sc->oe + (size_t)i * H;
            for (int d = 0; d < H; d++) y[d] += w * o[d];
        }
    }
    const int FS = (int)l->gate_sh.rows;
    ds4_mm(e, &l->gate_sh, 0, xn, H, n, sc->ge, FS);
    ds4_mm(e, &l->up_sh, 0, xn, H, n, sc->he, FS);
    swiglu(sc->ge, sc->he, (int64_t)n * FS, l->clamp_shexp);
    ds4_mm(e, &l->down_sh, 0, sc->ge, FS, n, sc->oe, H);
    for (int64_t i = 0; i < (int64_t)n * H; i++) out[i] = sc->moe_y[i] + sc->oe[i];
}

/* ---- the whole pass ------------------------------------------------------------------------- */

/* HC head: collapse X [n, HC, H] to out [n, H] with weights sigmoid(scale * fn . rmsnorm(X) + base)
 * + eps (spec ds4.md §2.1); out is the pre-norm hidden state. */
void ds4_hc_head(ds4_session *s, const float *X, int n, const ds4_w *fn, const float *base, const float *scale,
                 float *out) {
    ds4_engine *e = s->e;
    const int HC = e->c.hc_count, H = e->c.n_embd;
    for (int t = 0; t < n; t++) {
        const float *Xt = X + (size_t)t * HC * H;
        float *f = s->sc.X2;
        ds4_rms_norm(Xt, (int64_t)HC * H, e->c.rms_eps, NULL, f);
        float m[MAXHC], w[MAXHC];
        ds4_mm(e, fn, 0, f, (int64_t)HC * H, 1, m, HC);
        for (int a = 0; a < HC; a++) w[a] = ds4_sigmoid(scale[0] * m[a] + base[a]) + e->c.hc_eps;
        float *yt = out + (size_t)t * H;
        for (int d = 0; d < H; d++) {
            float acc = 0.0f;
            for (int a = 0; a < HC; a++) acc += w[a] * Xt[(size_t)a * H + d];
            yt[d] = acc;
        }
    }
}

static void lm_head(ds4_session *s, const float *X, int n, float *logits) {
    ds4_engine *e = s->e;
    const int H = e->c.n_embd;
    float *y = s->sc.lm;
    ds4_hc_head(s, X, n, &e->output_hc_fn, e->output_hc_base, e->output_hc_scale, y);
    for (int t = 0; t < n; t++) ds4_rms_norm(y + (size_t)t * H, H, e->c.rms_eps, e->output_norm, y + (size_t)t * H);
    ds4_mm(e, &e->output, 0, y, H, n, logits, e->c.n_vocab);
}

int ds4_forward(ds4_session *s, const int32_t *tokens, int32_t n, int logits_mode, float *logits) {
    ds4_engine *e = s->e;
    ds4_scratch *sc = &s->sc;
    const int HC = e->c.hc_count, H = e->c.n_embd;
    const int64_t p0 = s->n_tokens;
    for (int t = 0; t < n; t++) {
        const ds4_w *te = &e->token_embd;
        float *row = sc->x + (size_t)t * H;
        ds4_dequantize(te->type, te->data + (size_t)tokens[t] * te->row_bytes, row, H, NULL, 0);
        for (int a = 0; a < HC; a++) memcpy(sc->X + ((size_t)t * HC + a) * H, row, (size_t)H * sizeof(float));
    }
    float *X = sc->X, *Y = sc->X3;
    for (int L = 0; L < e->c.n_layer; L++) {
        if (atomic_load(&s->cancel)) return DS4_E_CANCELLED;
        const ds4_layer *l = &e->layers[L];
        ds4_hc_pre(s, &l->hc_attn_fn, l->hc_attn_base, l->hc_attn_scale, X, n, sc->x, sc->post, sc->comb);
        for (int t = 0; t < n; t++) ds4_rms_norm(sc->x + (size_t)t * H, H, e->c.rms_eps, l->attn_norm, sc->xn + (size_t)t * H);
        attention(s, L, sc->xn, n, p0, sc->y);
        ds4_hc_post(e, X, sc->y, sc->post, sc->comb, n, Y);
        float *tmp = X; X = Y; Y = tmp;
        ds4_hc_pre(s, &l->hc_ffn_fn, l->hc_ffn_base, l->hc_ffn_scale, X, n, sc->x, sc->post, sc->comb);
        for (int t = 0; t < n; t++) ds4_rms_norm(sc->x + (size_t)t * H, H, e->c.rms_eps, l->ffn_norm, sc->xn + (size_t)t * H);
        ds4_moe(s, l, sc->xn, tokens, n, sc->y);
        ds4_hc_post(e, X, sc->y, sc->post, sc->comb, n, Y);
        tmp = X; X = Y; Y = tmp;
        if (s->dsp) ds4_dspark_capture(s, L, X, n, p0);
    }
    if (logits_mode == DS4_LOGITS_ALL) lm_head(s, X, n, logits);
    else if (logits_mode == DS4_LOGITS_LAST) lm_head(s, X + (size_t)(n - 1) * HC * H, 1, logits);
    return DS4_OK;
}
