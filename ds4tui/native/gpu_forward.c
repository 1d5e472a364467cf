/* gpu_forward.c — the DS4 target forward pass with its state in device memory (spec ds4.md §2).
 *
 * The same pass as forward.c, operation for operation, through the GPU library's operation table
 * (gpu_api.h): the weights, the KV rings, the compressor rings and rows, the indexer keys and
 * every activation live in device memory; the host sends the token ids and receives the logit
 * rows (and, with DSpark, the captured layers' stream rows the drafter reads).  Work is queued on
 * one stream; the only synchronisations are those copies back.
 *
 * Errors: each operation returns its launch status; the first failure is kept in the engine
 * (ds4_gpu_fail) with the operation's message and the pass returns DS4_E_DEVICE, which
 * ds4_run_pass reports through ds4_gpu_check.
 */
#include "internal.h"
#include "gpu_api.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *kv, *cmp_c, *cmp_z, *comp, *idx_c, *idx_z, *idx_keys;
} gpu_cache;

struct ds4_gpu_session {
    int n_alloc, cap_alloc;
    void **ptr;
    size_t *bytes;
    gpu_cache *lc;                         /* [n_layer] device pointers */
    int32_t B, max_vis, keys_cap, FF;      /* rows per pass, indexer scores per token, keys per head, FFN width */
    int32_t *tokens, *sel_comp, *nsel_comp, *sel;
    int32_t *grp_ids;                      /* [B * o_groups]: slot % o_groups, the grouped output's matrix ids */
    float *X, *X3, *X2, *hcm, *pre, *post, *comb, *x, *xn, *qr, *q, *kvr, *att, *u, *y, *cbuf, *zbuf, *qi, *iw;
    float *iscore, *scores, *wsel, *ge, *he, *oe, *shg, *shh, *sho, *lm, *hm, *hw, *logits, *att_sc;
    float *host_X;                         /* host staging of captured stream rows [B, HC*H] */
    /* DSpark drafter (support model attached): capture ring [cap, n_capture, H] and context KV
     * ring [n_stages, cap, D] by position (cap = kv_cap, as dspark.c), projections of up to W
     * context rows [W, H] / [W, D], and the block's KV rows [n_stages, B, D] */
    float *dcap, *dctx, *dmx, *dkvtmp, *ddkv;
    float *dhn, *dU, *drow, *dfeat; /* the drafter's greedy heads: normed rows, base logits [B, V], Markov row */
    int32_t *dbest;
};

/* ---- engine vectors ------------------------------------------------------------------------- */

static int dev_vec(ds4_engine *e, const void *src, size_t bytes, void *out, char *err, size_t len) {
    void **o = (void **)out;
    *o = NULL;
    if (!src) return DS4_OK;
    void **np = realloc(e->dev_vec, (size_t)(e->n_dev_vec + 1) * sizeof *np);
    if (!np) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    e->dev_vec = np;
    size_t *nb = realloc(e->dev_vec_bytes, (size_t)(e->n_dev_vec + 1) * sizeof *nb);
    if (!nb) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    e->dev_vec_bytes = nb;
    int rc = e->gpu->upload(e->gpu_ctx, src, bytes, o, err, len);
    if (rc != DS4_OK) return rc;
    e->dev_vec[e->n_dev_vec] = *o;
    e->dev_vec_bytes[e->n_dev_vec++] = bytes;
    return DS4_OK;
}

#define V(src, n, dst) do { int rc_ = dev_vec(e, (src), (size_t)(n), &(dst), err, len); if (rc_ != DS4_OK) return rc_; } while (0)

/* Device copies of one block's vectors (a target layer or a drafter stage). */
static int layer_vectors(ds4_engine *e, ds4_layer *l, char *err, size_t len) {
    const ds4_cfg *c = &e->c;
    const size_t H = c->n_embd, HC = c->hc_count, mix = 2 * HC + HC * HC, D = c->head_dim, ID = c->indexer_head_dim;
    const size_t F = sizeof(float);
    ds4_layer_dev *d = &l->dv;
    const size_t cw = (l->kind == DS4_CSA ? 2 : 1) * D;
    V(l->hc_attn_base, mix * F, d->hc_attn_base);
    V(l->hc_ffn_base, mix * F, d->hc_ffn_base);
    V(l->attn_norm, H * F, d->attn_norm);
    V(l->q_a_norm, (size_t)c->q_lora_rank * F, d->q_a_norm);
    V(l->kv_norm, D * F, d->kv_norm);
    V(l->sinks, (size_t)c->n_head * F, d->sinks);
    V(l->ffn_norm, H * F, d->ffn_norm);
    V(l->comp_ape, (size_t)l->ratio * cw * F, d->comp_ape);
    V(l->comp_norm, D * F, d->comp_norm);
    V(l->idx_comp_ape, (size_t)l->ratio * 2 * ID * F, d->idx_comp_ape);
    V(l->idx_comp_norm, ID * F, d->idx_comp_norm);
    V(l->exp_bias, (size_t)c->n_expert * F, d->exp_bias);
    V(l->tid2eid, (size_t)c->n_vocab * c->n_expert_used * sizeof(int32_t), d->tid2eid);
    return DS4_OK;
}

int ds4_gpu_engine_vectors(ds4_engine *e, char *err, size_t len) {
    const ds4_cfg *c = &e->c;
    const size_t H = c->n_embd, HC = c->hc_count, F = sizeof(float);
    V(e->output_hc_base, HC * F, e->d_output_hc_base);
    V(e->output_norm, H * F, e->d_output_norm);
    V(e->freq_main, (size_t)(c->n_rot / 2) * sizeof(double), e->d_freq_main);
    V(e->freq_comp, (size_t)(c->n_rot / 2) * sizeof(double), e->d_freq_comp);
    for (int L = 0; L < c->n_layer; L++) {
        int rc = layer_vectors(e, &e->layers[L], err, len);
        if (rc != DS4_OK) return rc;
    }
    return DS4_OK;
}

int ds4_gpu_support_vectors(ds4_engine *e, char *err, size_t len) {
    ds4_support *sup = e->sup;
    const size_t H = e->c.n_embd, HC = e->c.hc_count, F = sizeof(float);
    V(sup->main_norm, H * F, sup->d_main_norm);
    V(sup->hc_head_base, HC * F, sup->d_hc_head_base);
    for (int st = 0; st < sup->n_stages; st++) {
        int rc = layer_vectors(e, &sup->stages[st], err, len);
        if (rc != DS4_OK) return rc;
    }
    return DS4_OK;
}
#undef V

void ds4_gpu_engine_vectors_free(ds4_engine *e) {
    for (int i = 0; i < e->n_dev_vec; i++) e->gpu->free(e->gpu_ctx, e->dev_vec[i], e->dev_vec_bytes[i]);
    free(e->dev_vec);
    free(e->dev_vec_bytes);
    e->dev_vec = NULL;
    e->dev_vec_bytes = NULL;
    e->n_dev_vec = 0;
    for (int L = 0; e->layers && L < e->c.n_layer; L++) memset(&e->layers[L].dv, 0, sizeof e->layers[L].dv);
    if (e->sup) {
        for (int st = 0; st < e->sup->n_stages; st++) memset(&e->sup->stages[st].dv, 0, sizeof e->sup->stages[st].dv);
        e->sup->d_main_norm = e->sup->d_hc_head_base = NULL;
    }
}

/* ---- session state -------------------------------------------------------------------------- */

static void *dalloc(ds4_session *s, size_t bytes, uint64_t *count, int *rc, char *err, size_t len) {
    ds4_gpu_session *d = s->gs;
    if (*rc != DS4_OK) return NULL;
    if (d->n_alloc == d->cap_alloc) {
        int cap = d->cap_alloc ? 2 * d->cap_alloc : 64;
        void **np = realloc(d->ptr, (size_t)cap * sizeof *np);
        size_t *nb = np ? realloc(d->bytes, (size_t)cap * sizeof *nb) : NULL;
        if (np) d->ptr = np;
        if (!nb) { *rc = ds4_fail(err, len, DS4_E_NOMEM, "out of memory"); return NULL; }
        d->bytes = nb;
        d->cap_alloc = cap;
    }
    void *p = NULL;
    if (bytes == 0) bytes = 4;
    *rc = s->e->gpu->upload(s->e->gpu_ctx, NULL, bytes, &p, err, len);
    if (*rc != DS4_OK) return NULL;
    d->ptr[d->n_alloc] = p;
    d->bytes[d->n_alloc++] = bytes;
    *count += bytes;
    return p;
}

void ds4_gpu_session_free(ds4_session *s) {
    ds4_gpu_session *d = s->gs;
    if (!d) return;
    for (int i = 0; i < d->n_alloc; i++) s->e->gpu->free(s->e->gpu_ctx, d->ptr[i], d->bytes[i]);
    free(d->ptr);
    free(d->bytes);
    free(d->lc);
    free(d->host_X);
    free(d);
    s->gs = NULL;
}

int ds4_gpu_session_init(ds4_session *s, uint64_t *kv_bytes, uint64_t *cmp_bytes, uint64_t *scratch_bytes, char *err,
                         size_t len) {
    ds4_engine *e = s->e;
    const ds4_cfg *c = &e->c;
    s->gs = calloc(1, sizeof *s->gs);
    if (!s->gs) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    ds4_gpu_session *d = s->gs;
    d->lc = calloc((size_t)c->n_layer, sizeof *d->lc);
    if (!d->lc) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    int64_t B = (int64_t)s->n_batch + 1;
    if (e->sup && B < e->sup->block) B = e->sup->block;
    const int64_t H = c->n_embd, HC = c->hc_count, D = c->head_dim, NH = c->n_head, ID = c->indexer_head_dim;
    const int64_t IH = c->indexer_n_head, K = c->n_expert_used, E = c->n_expert, mix = 2 * HC + HC * HC;
    int min_ratio = 0;
    int64_t FS = 0;
    int rc = DS4_OK;
    const size_t F4 = sizeof(float);
    for (int L = 0; L < c->n_layer; L++) {
        const ds4_layer *l = &e->layers[L];
        gpu_cache *lc = &d->lc[L];
        if (l->gate_sh.rows > FS) FS = l->gate_sh.rows;
        if (l->ratio && (!min_ratio || l->ratio < min_ratio)) min_ratio = l->ratio;
        lc->kv = dalloc(s, (size_t)s->kv_cap * D * F4, kv_bytes, &rc, err, len);
        if (l->kind == DS4_SWA) continue;
        const int64_t cw = (l->kind == DS4_CSA ? 2 : 1) * D, n_rows = s->n_ctx / l->ratio + 1;
        lc->cmp_c = dalloc(s, (size_t)s->cmp_cap * cw * F4, cmp_bytes, &rc, err, len);
        lc->cmp_z = dalloc(s, (size_t)s->cmp_cap * cw * F4, cmp_bytes, &rc, err, len);
        lc->comp = dalloc(s, (size_t)n_rows * D * F4, cmp_bytes, &rc, err, len);
        if (l->kind == DS4_CSA) {
            lc->idx_c = dalloc(s, (size_t)s->cmp_cap * 2 * ID * F4, cmp_bytes, &rc, err, len);
            lc->idx_z = dalloc(s, (size_t)s->cmp_cap * 2 * ID * F4, cmp_bytes, &rc, err, len);
            lc->idx_keys = dalloc(s, (size_t)n_rows * ID * F4, cmp_bytes, &rc, err, len);
        }
    }
    const int64_t n_comp = min_ratio ? s->n_ctx / min_ratio + 1 : 1;
    int64_t keys_cap = c->sliding_window + (n_comp > DS4_DSPARK_MAX_BLOCK ? n_comp : DS4_DSPARK_MAX_BLOCK);
    const int64_t FF = c->n_ff_exp > FS ? c->n_ff_exp : FS, cwmax = 2 * (D > ID ? D : ID);
    d->B = (int32_t)B;
    d->max_vis = (int32_t)n_comp;
    d->keys_cap = (int32_t)keys_cap;
    d->FF = (int32_t)FF;
    uint64_t *sb = scratch_bytes;
#define DF(n) dalloc(s, (size_t)(n) * F4, sb, &rc, err, len)
#define DI(n) dalloc(s, (size_t)(n) * sizeof(int32_t), sb, &rc, err, len)
    d->tokens = DI(B);
    d->X = DF(B * HC * H); d->X3 = DF(B * HC * H); d->X2 = DF(B * HC * H);
    d->hcm = DF(B * mix); d->pre = DF(B * HC); d->post = DF(B * HC); d->comb = DF(B * HC * HC);
    d->x = DF(B * H); d->xn = DF(B * H); d->qr = DF(B * c->q_lora_rank); d->q = DF(B * NH * D);
    d->kvr = DF(B * D); d->att = DF(B * NH * D); d->u = DF(B * c->o_groups * c->o_lora_rank); d->y = DF(B * H);
    d->cbuf = DF(B * cwmax); d->zbuf = DF(B * cwmax); d->qi = DF(B * IH * ID); d->iw = DF(B * IH);
    d->sel_comp = DI(B * c->indexer_top_k); d->nsel_comp = DI(B); d->iscore = DF(B * n_comp);
    d->scores = DF(B * E); d->sel = DI(B * K); d->wsel = DF(B * K);
    d->ge = DF(B * K * FF); d->he = DF(B * K * FF); d->oe = DF(B * K * H);
    d->shg = DF(B * (FS ? FS : 1)); d->shh = DF(B * (FS ? FS : 1)); d->sho = DF(B * H);
    d->lm = DF(B * H); d->hm = DF(B * HC); d->hw = DF(B * HC); d->logits = DF(B * c->n_vocab);
    d->att_sc = DF(B * NH * keys_cap);
    d->grp_ids = DI(B * c->o_groups);
    if (e->sup) {
        const ds4_support *sup = e->sup;
        d->dcap = DF((int64_t)s->kv_cap * sup->n_capture * H);
        d->dctx = DF((int64_t)sup->n_stages * s->kv_cap * D);
        d->dmx = DF((int64_t)c->sliding_window * H);
        d->dkvtmp = DF((int64_t)c->sliding_window * D);
        d->ddkv = DF((int64_t)sup->n_stages * sup->block * D);
        d->dhn = DF((int64_t)sup->block * H);
        d->dU = DF((int64_t)sup->block * c->n_vocab);
        d->drow = DF(c->n_vocab);
        d->dfeat = DF(sup->rank > 0 ? sup->rank : 1);
        d->dbest = DI(4);
    }
#undef DF
#undef DI
    if (rc != DS4_OK) return rc;
    int32_t *ids = malloc((size_t)(B * c->o_groups) * sizeof *ids);
    if (!ids) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    for (int64_t i = 0; i < B * c->o_groups; i++) ids[i] = (int32_t)(i % c->o_groups);
    rc = e->gpu->copy(e->gpu_ctx, d->grp_ids, ids, (size_t)(B * c->o_groups) * sizeof *ids, 0, err, len);
    if (rc == DS4_OK) rc = e->gpu->sync(e->gpu_ctx, err, len);
    free(ids);
    if (rc != DS4_OK) return rc;
    d->host_X = malloc((size_t)(B * HC * H) * F4);
    if (!d->host_X) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    *sb += (uint64_t)(B * HC * H) * F4;
    return DS4_OK;
}

/* ---- the pass ------------------------------------------------------------------------------- */

typedef struct {
    ds4_session *s;
    ds4_engine *e;
    const ds4_gpu_api *g;
    struct ds4_gpu_ctx *cx;
    ds4_gpu_session *d;
    char msg[512];
} pass;

#define G(call) do { int rc_ = (call); if (rc_ != DS4_OK) return ds4_gpu_fail(P->e, DS4_E_DEVICE, P->msg); } while (0)
#define M P->msg, sizeof P->msg

static int mm(pass *P, const ds4_w *w, const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy) {
    G(P->g->mm(P->cx, w->dev_layout, w->dev, w->rows, w->cols, (int64_t)w->row_bytes, X, ldx, n, Y, ldy, M));
    return DS4_OK;
}

#define TRYP(x) do { int rc__ = (x); if (rc__ != DS4_OK) return rc__; } while (0)

/* mHC pre of X [n, HC, H] into d->x, d->pre/post/comb. */
static int hc_pre(pass *P, const ds4_w *fn, const float *base_dev, const float *scale, const float *X, int n) {
    ds4_gpu_session *d = P->d;
    const ds4_cfg *c = &P->e->c;
    const int HC = c->hc_count, H = c->n_embd, mix = 2 * HC + HC * HC;
    G(P->g->rms_norm(P->cx, X, (int64_t)HC * H, n, (int64_t)HC * H, c->rms_eps, NULL, d->X2, (int64_t)HC * H, M));
    TRYP(mm(P, fn, d->X2, (int64_t)HC * H, n, d->hcm, mix));
    G(P->g->hc_pre(P->cx, d->hcm, n, HC, H, scale[0], scale[1], scale[2], base_dev, c->hc_eps, c->hc_sinkhorn_iters, X,
                   d->x, d->pre, d->post, d->comb, M));
    return DS4_OK;
}

/* Windows that close among positions p0 .. p0+n-1 of a ratio-R compressor: w0 .. w0+*nw-1. */
static void closing_windows(int64_t p0, int n, int R, int64_t *w0, int32_t *nw) {
    *nw = 0;
    *w0 = 0;
    for (int t = 0; t < n; t++)
        if ((p0 + t + 1) % R == 0) {
            if (*nw == 0) *w0 = (p0 + t) / R;
            (*nw)++;
        }
}

static int attention(pass *P, int L, int n, int64_t p0) {
    ds4_engine *e = P->e;
    ds4_session *s = P->s;
    ds4_gpu_session *d = P->d;
    const ds4_cfg *c = &e->c;
    const ds4_layer *l = &e->layers[L];
    const ds4_layer_dev *dl = &l->dv;
    gpu_cache *lc = &d->lc[L];
    const int H = c->n_embd, NH = c->n_head, D = c->head_dim, QL = c->q_lora_rank, nr = c->n_rot;
    const double *freq = l->kind == DS4_SWA ? e->d_freq_main : e->d_freq_comp;
    const int ds4n = e->numerics == DS4_NUMERICS_DS4;
    /* queries */
    TRYP(mm(P, &l->q_a, d->xn, H, n, d->qr, QL));
    G(P->g->rms_norm(P->cx, d->qr, QL, n, QL, c->rms_eps, dl->q_a_norm, d->qr, QL, M));
    TRYP(mm(P, &l->q_b, d->qr, QL, n, d->q, (int64_t)NH * D));
    G(P->g->norm_rope(P->cx, d->q, (int64_t)n * NH, D, NH, c->rms_eps, NULL, freq, nr, p0, 0, 0, M));
    /* KV row */
    TRYP(mm(P, &l->kv, d->xn, H, n, d->kvr, D));
    G(P->g->norm_rope(P->cx, d->kvr, n, D, 1, c->rms_eps, dl->kv_norm, freq, nr, p0, 0, 0, M));
    G(P->g->kv_store(P->cx, d->kvr, n, D, lc->kv, s->kv_cap, p0, nr, ds4n ? 1 : 0, M));
    const int32_t *sel = NULL, *nsel = NULL;
    if (l->kind != DS4_SWA) {
        const int cw = (l->kind == DS4_CSA ? 2 : 1) * D;
        int64_t w0;
        int32_t nw;
        closing_windows(p0, n, l->ratio, &w0, &nw);
        TRYP(mm(P, &l->comp_kv, d->xn, H, n, d->cbuf, cw));
        TRYP(mm(P, &l->comp_gate, d->xn, H, n, d->zbuf, cw));
        G(P->g->compress(P->cx, d->cbuf, d->zbuf, n, p0, D, l->ratio, l->kind == DS4_CSA, dl->comp_ape, lc->cmp_c,
                         lc->cmp_z, s->cmp_cap, w0, nw, lc->comp, dl->comp_norm, c->rms_eps, e->d_freq_comp, nr, 0,
                         ds4n, M));
        if (l->kind == DS4_CSA) {
            const int IH = c->indexer_n_head, ID = c->indexer_head_dim;
            TRYP(mm(P, &l->idx_comp_kv, d->xn, H, n, d->cbuf, 2 * ID));
            TRYP(mm(P, &l->idx_comp_gate, d->xn, H, n, d->zbuf, 2 * ID));
            G(P->g->compress(P->cx, d->cbuf, d->zbuf, n, p0, ID, l->ratio, 1, dl->idx_comp_ape, lc->idx_c, lc->idx_z,
                             s->cmp_cap, w0, nw, lc->idx_keys, dl->idx_comp_norm, c->rms_eps, e->d_freq_comp, nr, 1,
                             ds4n, M));
            if ((p0 + n) / l->ratio > c->indexer_top_k) {
                TRYP(mm(P, &l->idx_q_b, d->qr, QL, n, d->qi, (int64_t)IH * ID));
                G(P->g->norm_rope(P->cx, d->qi, (int64_t)n * IH, ID, IH, -1.0f, NULL, e->d_freq_comp, nr, p0, 0, ds4n,
                                  M));
                TRYP(mm(P, &l->idx_proj, d->xn, H, n, d->iw, IH));
                G(P->g->scale(P->cx, d->iw, (int64_t)n * IH, (float)pow((double)IH, -0.5), M));
                G(P->g->indexer(P->cx, d->qi, d->iw, n, p0, IH, ID, lc->idx_keys, l->ratio, c->indexer_top_k,
                                (float)pow((double)ID, -0.5), d->iscore, d->max_vis, d->sel_comp, d->nsel_comp, M));
                sel = d->sel_comp;
                nsel = d->nsel_comp;
            }
        }
    }
    G(P->g->attend(P->cx, d->q, n, NH, D, p0, c->sliding_window, lc->kv, s->kv_cap, lc->comp,
                   l->kind == DS4_SWA ? 0 : l->ratio, sel, nsel, c->indexer_top_k, dl->sinks, d->att_sc, d->keys_cap,
                   d->att, M));
    /* output: inverse RoPE, grouped low-rank projection */
    G(P->g->norm_rope(P->cx, d->att, (int64_t)n * NH, D, NH, -1.0f, NULL, freq, nr, p0, 1, 0, M));
    /* group g of token t is slot t*G + g: rows [g*R, (g+1)*R) of out_a times att[t, g*gw ..] into u[t, g*R ..] */
    const int G_ = c->o_groups, R = c->o_lora_rank, gw = NH / G_ * D;
    G(P->g->mm_gather(P->cx, l->out_a.dev_layout, l->out_a.dev, (int64_t)R * (int64_t)l->out_a.row_bytes, d->grp_ids, R,
                      l->out_a.cols, (int64_t)l->out_a.row_bytes, d->att, gw, 1, (int64_t)n * G_, d->u, R, M));
    TRYP(mm(P, &l->out_b, d->u, (int64_t)G_ * R, n, d->y, H));
    return DS4_OK;
}

static int moe(pass *P, const ds4_layer *l, int n) {
    ds4_engine *e = P->e;
    ds4_gpu_session *d = P->d;
    const ds4_cfg *c = &e->c;
    const int H = c->n_embd, E = c->n_expert, K = c->n_expert_used, F = c->n_ff_exp;
    TRYP(mm(P, &l->gate_inp, d->xn, H, n, d->scores, E));
    G(P->g->moe_route(P->cx, d->scores, n, E, K, l->hashed ? l->dv.tid2eid : NULL, d->tokens, l->dv.exp_bias,
                      c->expert_weights_norm, e->numerics == DS4_NUMERICS_DS4, c->expert_weights_scale, d->sel, d->wsel,
                      M));
    const int64_t slots = (int64_t)n * K;
    G(P->g->mm_gather(P->cx, l->gate_exps.dev_layout, l->gate_exps.dev, (int64_t)l->gate_exps.mat_bytes, d->sel, F, H,
                      (int64_t)l->gate_exps.row_bytes, d->xn, H, K, slots, d->ge, F, M));
    G(P->g->mm_gather(P->cx, l->up_exps.dev_layout, l->up_exps.dev, (int64_t)l->up_exps.mat_bytes, d->sel, F, H,
                      (int64_t)l->up_exps.row_bytes, d->xn, H, K, slots, d->he, F, M));
    G(P->g->swiglu(P->cx, d->ge, d->he, slots * F, l->clamp, M));
    G(P->g->mm_gather(P->cx, l->down_exps.dev_layout, l->down_exps.dev, (int64_t)l->down_exps.mat_bytes, d->sel, H, F,
                      (int64_t)l->down_exps.row_bytes, d->ge, F, 1, slots, d->oe, H, M));
    const int FS = (int)l->gate_sh.rows;
    TRYP(mm(P, &l->gate_sh, d->xn, H, n, d->shg, FS));
    TRYP(mm(P, &l->up_sh, d->xn, H, n, d->shh, FS));
    G(P->g->swiglu(P->cx, d->shg, d->shh, (int64_t)n * FS, l->clamp_shexp, M));
    TRYP(mm(P, &l->down_sh, d->shg, FS, n, d->sho, H));
    G(P->g->moe_combine(P->cx, d->oe, d->sel, d->wsel, n, K, H, d->sho, d->y, M));
    return DS4_OK;
}

int ds4_gpu_forward(ds4_session *s, const int32_t *tokens, int32_t n, int logits_mode, float *logits) {
    ds4_engine *e = s->e;
    pass P_ = {s, e, e->gpu, e->gpu_ctx, s->gs, ""}, *P = &P_;
    ds4_gpu_session *d = s->gs;
    const ds4_cfg *c = &e->c;
    const int HC = c->hc_count, H = c->n_embd;
    const int64_t p0 = s->n_tokens;
    G(P->g->copy(P->cx, d->tokens, tokens, (size_t)n * sizeof(int32_t), 0, M));
    G(P->g->embed(P->cx, e->token_embd.type, e->token_embd.dev, (int64_t)e->token_embd.row_bytes, H, d->tokens, n, HC,
                  d->X, M));
    float *X = d->X, *Y = d->X3;
    for (int L = 0; L < c->n_layer; L++) {
        if (atomic_load(&s->cancel)) return DS4_E_CANCELLED;
        const ds4_layer *l = &e->layers[L];
        TRYP(hc_pre(P, &l->hc_attn_fn, l->dv.hc_attn_base, l->hc_attn_scale, X, n));
        G(P->g->rms_norm(P->cx, d->x, H, n, H, c->rms_eps, l->dv.attn_norm, d->xn, H, M));
        TRYP(attention(P, L, n, p0));
        G(P->g->hc_post(P->cx, X, d->y, d->post, d->comb, n, HC, H, Y, M));
        float *tmp = X; X = Y; Y = tmp;
        TRYP(hc_pre(P, &l->hc_ffn_fn, l->dv.hc_ffn_base, l->hc_ffn_scale, X, n));
        G(P->g->rms_norm(P->cx, d->x, H, n, H, c->rms_eps, l->dv.ffn_norm, d->xn, H, M));
        TRYP(moe(P, l, n));
        G(P->g->hc_post(P->cx, X, d->y, d->post, d->comb, n, HC, H, Y, M));
        tmp = X; X = Y; Y = tmp;
        if (s->dsp && e->sup && e->sup->capture_slot[L] >= 0) {
            G(P->g->capture(P->cx, X, n, HC, H, p0, d->dcap, s->kv_cap, e->sup->n_capture, e->sup->capture_slot[L], M));
            ds4_dspark_capture_mark(s, n, p0);
        }
    }
    if (logits_mode == DS4_LOGITS_NONE) {
        G(P->g->sync(P->cx, M));
        return DS4_OK;
    }
    const int rows = logits_mode == DS4_LOGITS_ALL ? n : 1;
    const float *Xs = logits_mode == DS4_LOGITS_ALL ? X : X + (size_t)(n - 1) * HC * H;
    G(P->g->rms_norm(P->cx, Xs, (int64_t)HC * H, rows, (int64_t)HC * H, c->rms_eps, NULL, d->X2, (int64_t)HC * H, M));
    TRYP(mm(P, &e->output_hc_fn, d->X2, (int64_t)HC * H, rows, d->hm, HC));
    G(P->g->hc_head(P->cx, Xs, d->hm, rows, HC, H, e->output_hc_scale[0], e->d_output_hc_base, c->hc_eps, d->hw, d->lm,
                    M));
    G(P->g->rms_norm(P->cx, d->lm, H, rows, H, c->rms_eps, e->d_output_norm, d->lm, H, M));
    TRYP(mm(P, &e->output, d->lm, H, rows, d->logits, c->n_vocab));
    G(P->g->copy(P->cx, logits, d->logits, (size_t)rows * c->n_vocab * sizeof(float), 1, M));
    return DS4_OK;
}

/* ---- the DSpark drafter (dspark.c's project_context / run_stage / HC head, on the device) ---- */

int ds4_gpu_draft_context(ds4_session *s, int64_t lo, int64_t hi) {
    ds4_engine *e = s->e;
    pass P_ = {s, e, e->gpu, e->gpu_ctx, s->gs, ""}, *P = &P_;
    ds4_gpu_session *d = s->gs;
    const ds4_support *sup = e->sup;
    const ds4_cfg *c = &e->c;
    const int H = c->n_embd, D = c->head_dim, nr = c->n_rot, cap = s->kv_cap;
    const int64_t CW = (int64_t)sup->n_capture * H, W = c->sliding_window;
    const int ds4n = e->numerics == DS4_NUMERICS_DS4;
    for (int64_t p0 = lo; p0 <= hi; p0 += W) {
        const int n = (int)(hi - p0 + 1 < W ? hi - p0 + 1 : W);
        for (int done = 0; done < n;) { /* main_proj over the capture ring, in contiguous pieces */
            const int64_t r0 = (p0 + done) % cap;
            const int k = (int)(n - done < cap - r0 ? n - done : cap - r0);
            TRYP(mm(P, &sup->main_proj, d->dcap + r0 * CW, CW, k, d->dmx + (size_t)done * H, H));
            done += k;
        }
        G(P->g->rms_norm(P->cx, d->dmx, H, n, H, c->rms_eps, sup->d_main_norm, d->dmx, H, M));
        for (int st = 0; st < sup->n_stages; st++) {
            const ds4_layer *l = &sup->stages[st];
            TRYP(mm(P, &l->kv, d->dmx, H, n, d->dkvtmp, D));
            G(P->g->norm_rope(P->cx, d->dkvtmp, n, D, 1, c->rms_eps, l->dv.kv_norm, e->d_freq_main, nr, p0, 0, 0, M));
            G(P->g->kv_store(P->cx, d->dkvtmp, n, D, d->dctx + (size_t)st * cap * D, cap, p0, nr, ds4n ? 2 : 0, M));
        }
    }
    G(P->g->sync(P->cx, M));
    return DS4_OK;
}

/* One drafter stage over the block X [B, HC, H] -> X (Y is scratch). *op names the op that failed. */
static int draft_stage(pass *P, int st, float *X, float *Y, int B, int64_t p0, int64_t lo, int64_t hi,
                       const char **op) {
    ds4_engine *e = P->e;
    ds4_session *s = P->s;
    ds4_gpu_session *d = P->d;
    const ds4_cfg *c = &e->c;
    const ds4_layer *l = &e->sup->stages[st];
    const int H = c->n_embd, NH = c->n_head, D = c->head_dim, QL = c->q_lora_rank, nr = c->n_rot, HC = c->hc_count;
    const double *freq = e->d_freq_main;
    *op = "hc_pre";
    TRYP(hc_pre(P, &l->hc_attn_fn, l->dv.hc_attn_base, l->hc_attn_scale, X, B));
    G(P->g->rms_norm(P->cx, d->x, H, B, H, c->rms_eps, l->dv.attn_norm, d->xn, H, M));
    *op = "attn_q";
    TRYP(mm(P, &l->q_a, d->xn, H, B, d->qr, QL));
    G(P->g->rms_norm(P->cx, d->qr, QL, B, QL, c->rms_eps, l->dv.q_a_norm, d->qr, QL, M));
    TRYP(mm(P, &l->q_b, d->qr, QL, B, d->q, (int64_t)NH * D));
    G(P->g->norm_rope(P->cx, d->q, (int64_t)B * NH, D, NH, c->rms_eps, NULL, freq, nr, p0, 0, 0, M));
    *op = "attn_kv";
    float *dkv = d->ddkv + (size_t)st * B * D;
    TRYP(mm(P, &l->kv, d->xn, H, B, dkv, D));
    G(P->g->norm_rope(P->cx, dkv, B, D, 1, c->rms_eps, l->dv.kv_norm, freq, nr, p0, 0, 0, M));
    if (e->numerics == DS4_NUMERICS_DS4) G(P->g->kv_store(P->cx, dkv, B, D, dkv, B, 0, nr, 2, M));
    *op = "attention";
    G(P->g->attend_nc(P->cx, d->q, B, NH, D, d->dctx + (size_t)st * s->kv_cap * D, s->kv_cap, lo, (int)(hi - lo + 1),
                      dkv, B, l->dv.sinks, d->att_sc, d->keys_cap, d->att, M));
    *op = "attn_output";
    G(P->g->norm_rope(P->cx, d->att, (int64_t)B * NH, D, NH, -1.0f, NULL, freq, nr, p0, 1, 0, M));
    const int G_ = c->o_groups, R = c->o_lora_rank, gw = NH / G_ * D;
    G(P->g->mm_gather(P->cx, l->out_a.dev_layout, l->out_a.dev, (int64_t)R * (int64_t)l->out_a.row_bytes, d->grp_ids, R,
                      l->out_a.cols, (int64_t)l->out_a.row_bytes, d->att, gw, 1, (int64_t)B * G_, d->u, R, M));
    TRYP(mm(P, &l->out_b, d->u, (int64_t)G_ * R, B, d->y, H));
    G(P->g->hc_post(P->cx, X, d->y, d->post, d->comb, B, HC, H, Y, M));
    *op = "moe";
    TRYP(hc_pre(P, &l->hc_ffn_fn, l->dv.hc_ffn_base, l->hc_ffn_scale, Y, B));
    G(P->g->rms_norm(P->cx, d->x, H, B, H, c->rms_eps, l->dv.ffn_norm, d->xn, H, M));
    TRYP(moe(P, l, B));
    G(P->g->hc_post(P->cx, Y, d->y, d->post, d->comb, B, HC, H, X, M));
    return DS4_OK;
}

int ds4_gpu_draft_chain(ds4_session *s, int32_t anchor, int64_t p0, int64_t lo, int64_t hi, float *h_host,
                        const char **op) {
    ds4_engine *e = s->e;
    pass P_ = {s, e, e->gpu, e->gpu_ctx, s->gs, ""}, *P = &P_;
    ds4_gpu_session *d = s->gs;
    const ds4_support *sup = e->sup;
    const ds4_cfg *c = &e->c;
    const int H = c->n_embd, HC = c->hc_count, B = sup->block;
    int32_t toks[DS4_DSPARK_MAX_BLOCK];
    for (int i = 0; i < B; i++) toks[i] = i == 0 ? anchor : sup->noise;
    *op = "embed";
    G(P->g->copy(P->cx, d->tokens, toks, (size_t)B * sizeof(int32_t), 0, M));
    G(P->g->embed(P->cx, e->token_embd.type, e->token_embd.dev, (int64_t)e->token_embd.row_bytes, H, d->tokens, B, HC,
                  d->X, M));
    for (int st = 0; st < sup->n_stages; st++) TRYP(draft_stage(P, st, d->X, d->X3, B, p0, lo, hi, op));
    *op = "hc_head";
    G(P->g->rms_norm(P->cx, d->X, (int64_t)HC * H, B, (int64_t)HC * H, c->rms_eps, NULL, d->X2, (int64_t)HC * H, M));
    TRYP(mm(P, &sup->hc_head_fn, d->X2, (int64_t)HC * H, B, d->hm, HC));
    G(P->g->hc_head(P->cx, d->X, d->hm, B, HC, H, sup->hc_head_scale[0], sup->d_hc_head_base, c->hc_eps, d->hw, d->lm,
                    M));
    G(P->g->copy(P->cx, h_host, d->lm, (size_t)B * H * sizeof(float), 1, M));
    return DS4_OK;
}

/* The drafter's LM head on the device for rows hn [want, H] (host): base logits kept in device
 * memory for ds4_gpu_draft_markov (greedy drafting: no V-wide row comes back to the host). */
int ds4_gpu_draft_logits(ds4_session *s, const float *hn, int want) {
    ds4_engine *e = s->e;
    pass P_ = {s, e, e->gpu, e->gpu_ctx, s->gs, ""}, *P = &P_;
    ds4_gpu_session *d = s->gs;
    const int64_t H = e->c.n_embd;
    G(P->g->copy(P->cx, d->dhn, hn, (size_t)(want * H) * sizeof(float), 0, M));
    return mm(P, &e->output, d->dhn, H, want, d->dU, e->c.n_vocab);
}

/* Greedy draft k: argmax over V of W2 feat + U[k] (dspark.md §2.4), with feat = W1[prev] [rank]
 * (host); the sum and the argmax rule are the host loop's, so the draft is the same token. */
int ds4_gpu_draft_markov(ds4_session *s, int k, const float *feat, int32_t *x) {
    ds4_engine *e = s->e;
    pass P_ = {s, e, e->gpu, e->gpu_ctx, s->gs, ""}, *P = &P_;
    ds4_gpu_session *d = s->gs;
    const ds4_support *sup = e->sup;
    const int32_t V = e->c.n_vocab;
    G(P->g->copy(P->cx, d->dfeat, feat, (size_t)sup->rank * sizeof(float), 0, M));
    TRYP(mm(P, &sup->markov_w2, d->dfeat, sup->rank, 1, d->drow, V));
    G(P->g->add_argmax(P->cx, d->drow, d->dU + (size_t)k * V, V, d->dbest, M));
    G(P->g->copy(P->cx, x, d->dbest, sizeof(int32_t), 1, M));
    return DS4_OK;
}
