/* forward.c — the DS4 forward pass and the DSpark drafter, written once, through the op table
 * (spec ds4.md §2, dspark.md §2.4).
 *
 * One target pass runs a batch of up to n_batch + 1 tokens through every layer:
 * embedding -> [mHC pre -> attention (SWA / CSA with the lightning indexer / HCA, sinks) -> mHC
 * post -> mHC pre -> MoE (hash or top-k routing, shared expert) -> mHC post] x n_layer -> HC head
 * -> norm -> LM head.  The drafter's stages are the same blocks (`attn_q`, `attn_kv`,
 * `attn_output`, `moe`, `hc_pre`) with a non-causal block attention.  The operation order follows
 * the numpy reference (ds4tui/engine/reference.py); tests/test_native_engine.py holds the CPU
 * backend to it and tests/test_gpu_backend.py holds the GPU backend to the CPU.
 *
 * Every op goes through the engine's backend table (backend.h): on the CPU backend the state is
 * host memory and the ops run on the thread pool; on a GPU backend the weights, caches and
 * activations live in device memory, work is queued on one stream, and the only synchronisations
 * are the copies back (logits, the drafter's hidden rows and draft ids).
 *
 * Errors: each op returns its status; the first failure of a pass is kept in the engine
 * (ds4_op_fail) with the op's message and the pass returns DS4_E_DEVICE, which ds4_run_pass
 * reports through ds4_op_check.
 */
#include "internal.h"
#define DS4_TENSOR_TABLES
#include "tensors.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *kv, *cmp_c, *cmp_z, *comp, *idx_c, *idx_z, *idx_keys;
} layer_cache;

/* A graph of one pass shape (the gpu_graphs option, spec platform.md §8): the key is everything the
 * host decides from the pass's rows and position (rows, logits rows, how many CSA layers run the
 * indexer and the position span its grid covers, whether the DSpark capture runs); `h` is the
 * backend's handle, `used` the pass counter at its last replay (the least recently used goes first). */
typedef struct {
    int32_t n, logits_mode, n_idx, capture;
    int64_t span;
    void *h;
    uint64_t used;
} pass_graph;
#define GRAPH_CACHE 32
_Static_assert(DS4_GRAPH_MAX_ROWS == DS4_DSPARK_MAX_BLOCK + 1, "a graph per verify width up to the largest block");

struct ds4_state {
    int n_alloc, cap_alloc;
    void **ptr;
    size_t *bytes;
    layer_cache *lc;                       /* [n_layer] */
    int32_t B, max_vis, keys_cap, FF;      /* rows per pass, indexer scores per token, keys per head, FFN width */
    int32_t *tokens, *sel_comp, *nsel_comp, *sel;
    int32_t *grp_ids;                      /* [B * o_groups]: slot % o_groups, the grouped output's matrix ids */
    float *X, *X3, *X2, *hcm, *pre, *post, *comb, *x, *xn, *qr, *q, *kvr, *att, *u, *y, *cbuf, *zbuf, *qi, *iw;
    float *iscore, *scores, *wsel, *ge, *he, *oe, *shg, *shh, *sho, *lm, *hm, *hw, *logits, *att_sc;
    /* DSpark drafter (support model attached): capture ring [cap, n_capture, H] and context KV
     * ring [n_stages, cap, D] by position (cap = kv_cap), projections of up to W context rows
     * [W, H] / [W, D], the block's KV rows [n_stages, B, D], the greedy heads' normed rows, base
     * logits [block, V], Markov row and draft id */
    float *dcap, *dctx, *dmx, *dkvtmp, *ddkv, *dhn, *dU, *drow, *dfeat;
    int32_t *dbest;
    int32_t *picks; /* greedy picks on a GPU (ds4_run_pass_argmax): ids [DS4_GRAPH_MAX_ROWS], then bad */
    int32_t head_n; /* rows of lm that hold the last DS4_LOGITS_ALL pass's normed final rows (ds4_pass_head; 0:
                     * none, another pass or the drafter's head wrote lm since) */
    int64_t head_p0; /* ... and that pass's first position */
    float *hU; /* host copy of the base logits for sampled drafting (GPU backends; malloc'ed) */
    /* graphs (gpu_graphs): step[0..1] the pass's first position (int64) that replays read, tokens
     * = step + 2; the graphs of the shapes seen, and a pass counter */
    int32_t *step;
    int32_t head[2 + DS4_GRAPH_MAX_ROWS]; /* its host side (a copy may read it after the call returns) */
    pass_graph graphs[GRAPH_CACHE];
    int n_graphs;
    uint64_t n_passes;
    void *draft_graph; /* the drafter's stages over a full context window (ds4_draft_stages), once captured */
};

/* ---- vectors where the backend reads them ------------------------------------------------------ */

/* *out = src in the backend's memory: the host array itself on the CPU backend, else a copy owned by
 * the engine (freed by ds4_engine_vectors_free). */
static int dev_vec(ds4_engine *e, const void *src, size_t bytes, void *out, char *err, size_t len) {
    void **o = (void **)out;
    *o = NULL;
    if (!src) return DS4_OK;
    if (e->ops->host_memory) {
        *o = (void *)src;
        return DS4_OK;
    }
    void **np = realloc(e->dev_vec, (size_t)(e->n_dev_vec + 1) * sizeof *np);
    if (!np) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    e->dev_vec = np;
    size_t *nb = realloc(e->dev_vec_bytes, (size_t)(e->n_dev_vec + 1) * sizeof *nb);
    if (!nb) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    e->dev_vec_bytes = nb;
    int rc = e->ops->upload(e->ctx, src, bytes, o, err, len);
    if (rc != DS4_OK) return rc;
    e->dev_vec[e->n_dev_vec] = *o;
    e->dev_vec_bytes[e->n_dev_vec++] = bytes;
    return DS4_OK;
}

/* Every vector and table of a block, where the backend reads it. */
static int layer_vectors(ds4_engine *e, ds4_layer *l, char *err, size_t len) {
    for (int i = 0; i < DS4_N_BLOCK_TENSORS; i++) {
        if (ds4_block_tensors[i].bind == DS4_BIND_MAT) continue;
        const void *host = *(void *const *)((const char *)l + ds4_block_tensors[i].field);
        int rc = dev_vec(e, host, ds4_block_tensor_bytes(e, l, i), &l->dv[i], err, len);
        if (rc != DS4_OK) return rc;
    }
    return DS4_OK;
}

/* The vectors of a head table (global or support) into dv[]. */
static int head_vectors(ds4_engine *e, const ds4_tensor_row *rows, int n, const void *base, const size_t *bytes,
                        void **dv, char *err, size_t len) {
    for (int i = 0; i < n; i++) {
        if (rows[i].bind == DS4_BIND_MAT) continue;
        int rc = dev_vec(e, *(void *const *)((const char *)base + rows[i].field), bytes[i], &dv[i], err, len);
        if (rc != DS4_OK) return rc;
    }
    return DS4_OK;
}

int ds4_engine_vectors(ds4_engine *e, char *err, size_t len) {
    const ds4_cfg *c = &e->c;
    size_t bytes[DS4_N_GLOBAL_TENSORS];
    for (int i = 0; i < DS4_N_GLOBAL_TENSORS; i++) {
        int64_t ne[3];
        ds4_global_tensor_ne(c, i, ne);
        bytes[i] = (size_t)(ne[0] * ne[1] * ne[2]) * sizeof(float);
    }
    int rc = head_vectors(e, ds4_global_tensors, DS4_N_GLOBAL_TENSORS, e, bytes, e->dv, err, len);
    if (rc != DS4_OK) return rc;
    rc = dev_vec(e, e->freq_main, (size_t)(c->n_rot / 2) * sizeof(double), &e->d_freq_main, err, len);
    if (rc == DS4_OK) rc = dev_vec(e, e->freq_comp, (size_t)(c->n_rot / 2) * sizeof(double), &e->d_freq_comp, err, len);
    for (int L = 0; rc == DS4_OK && L < c->n_layer; L++) rc = layer_vectors(e, &e->layers[L], err, len);
    return rc;
}

int ds4_support_vectors(ds4_engine *e, char *err, size_t len) {
    ds4_support *sup = e->sup;
    const ds4_support_config sc = {sup->n_stages, sup->block, sup->rank, sup->noise, sup->n_capture, sup->capture, 0, NULL};
    size_t bytes[DS4_N_SUPPORT_TENSORS];
    for (int i = 0; i < DS4_N_SUPPORT_TENSORS; i++) {
        int64_t ne[3];
        ds4_support_tensor_ne(&e->c, &sc, i, ne);
        bytes[i] = (size_t)(ne[0] * ne[1] * ne[2]) * sizeof(float);
    }
    int rc = head_vectors(e, ds4_support_tensors, DS4_N_SUPPORT_TENSORS, sup, bytes, sup->dv, err, len);
    for (int st = 0; rc == DS4_OK && st < sup->n_stages; st++) rc = layer_vectors(e, &sup->stages[st], err, len);
    return rc;
}

void ds4_engine_vectors_free(ds4_engine *e) {
    for (int i = 0; i < e->n_dev_vec; i++) e->ops->free(e->ctx, e->dev_vec[i], e->dev_vec_bytes[i]);
    free(e->dev_vec);
    free(e->dev_vec_bytes);
    e->dev_vec = NULL;
    e->dev_vec_bytes = NULL;
    e->n_dev_vec = 0;
    memset(e->dv, 0, sizeof e->dv);
    for (int L = 0; e->layers && L < e->c.n_layer; L++) memset(e->layers[L].dv, 0, sizeof e->layers[L].dv);
    if (e->sup) {
        for (int st = 0; st < e->sup->n_stages; st++) memset(e->sup->stages[st].dv, 0, sizeof e->sup->stages[st].dv);
        memset(e->sup->dv, 0, sizeof e->sup->dv);
    }
}

/* ---- session state -------------------------------------------------------------------------- */

static void *dalloc(ds4_session *s, size_t bytes, uint64_t *count, int *rc, char *err, size_t len) {
    ds4_state *d = s->st;
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
    *rc = s->e->ops->upload(s->e->ctx, NULL, bytes, &p, err, len);
    if (*rc != DS4_OK) return NULL;
    d->ptr[d->n_alloc] = p;
    d->bytes[d->n_alloc++] = bytes;
    *count += bytes;
    return p;
}

void ds4_state_free(ds4_session *s) {
    ds4_state *d = s->st;
    if (!d) return;
    if (s->e->ops->q8_share) { /* the shared rows (d->xn) are freed below: end the sharing first */
        char err[64];
        (void)s->e->ops->q8_share(s->e->ctx, NULL, 0, 0, 0, err, sizeof err);
    }
    for (int i = 0; i < d->n_graphs; i++) s->e->ops->graph_free(s->e->ctx, d->graphs[i].h);
    if (d->draft_graph) s->e->ops->graph_free(s->e->ctx, d->draft_graph);
    for (int i = 0; i < d->n_alloc; i++) s->e->ops->free(s->e->ctx, d->ptr[i], d->bytes[i]);
    free(d->ptr);
    free(d->bytes);
    free(d->lc);
    free(d->hU);
    free(d);
    s->st = NULL;
}

/* Benchmarks only (ds4_session_bench_fill): compressed rows (and indexer keys) of windows
 * [m0, n_to / ratio) of every compressed layer become copies of the rows already written, row i
 * taking row i % m0 (m0 = n_tokens / ratio, at least 1), through the host.  The window KV ring and
 * the compressor rings keep the rows of the last real positions. */
int ds4_state_repeat_rows(ds4_session *s, int32_t n_to, char *err, size_t len) {
    ds4_engine *e = s->e;
    const ds4_cfg *c = &e->c;
    ds4_state *d = s->st;
    const int host = e->ops->host_memory;
    for (int L = 0; L < c->n_layer; L++) {
        const ds4_layer *l = &e->layers[L];
        if (l->kind == DS4_SWA) continue;
        const int64_t m0 = s->n_tokens / l->ratio, m1 = n_to / l->ratio;
        if (m0 < 1)
            return ds4_fail(err, len, DS4_E_STATE, "bench fill: layer %d (ratio %d) has no compressed row yet after "
                            "%d tokens: prefill at least %d tokens first", L, l->ratio, s->n_tokens, l->ratio);
        if (m1 <= m0) continue;
        float *bufs[2] = {d->lc[L].comp, d->lc[L].idx_keys};
        const int64_t widths[2] = {c->head_dim, c->indexer_head_dim};
        for (int k = 0; k < 2; k++) {
            if (!bufs[k]) continue;
            const size_t row = (size_t)widths[k] * sizeof(float);
            float *h = host ? bufs[k] : malloc((size_t)m1 * row);
            if (!h) return ds4_fail(err, len, DS4_E_NOMEM, "bench fill: out of memory");
            int rc = host ? DS4_OK : e->ops->copy(e->ctx, h, bufs[k], (size_t)m0 * row, 1, err, len);
            for (int64_t i = m0; rc == DS4_OK && i < m1; i++)
                memcpy((char *)h + (size_t)i * row, (const char *)h + (size_t)(i % m0) * row, row);
            if (!host && rc == DS4_OK)
                rc = e->ops->copy(e->ctx, (char *)bufs[k] + (size_t)m0 * row, (const char *)h + (size_t)m0 * row,
                                  (size_t)(m1 - m0) * row, 0, err, len);
            if (!host && rc == DS4_OK) rc = e->ops->sync(e->ctx, err, len);
            if (!host) free(h);
            if (rc != DS4_OK) return rc;
        }
    }
    return DS4_OK;
}

int ds4_state_init(ds4_session *s, char *err, size_t len) {
    ds4_engine *e = s->e;
    const ds4_cfg *c = &e->c;
    s->st = calloc(1, sizeof *s->st);
    if (!s->st) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    ds4_state *d = s->st;
    d->lc = calloc((size_t)c->n_layer, sizeof *d->lc);
    if (!d->lc) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    int64_t B = (int64_t)s->n_batch + 1;
    if (e->sup && B < e->sup->block) B = e->sup->block; /* the drafter's block runs in the same state */
    int max_ratio = 0, min_ratio = 0;
    int64_t FS = 0;
    for (int L = 0; L < c->n_layer; L++) {
        const ds4_layer *l = &e->layers[L];
        if (l->ratio > max_ratio) max_ratio = l->ratio;
        if (l->ratio && (!min_ratio || l->ratio < min_ratio)) min_ratio = l->ratio;
        if (l->gate_sh.rows > FS) FS = l->gate_sh.rows;
    }
    /* raw KV rows: the window plus one pass (truncate goes back at most n_batch); compressor
     * projections: two windows of the largest ratio plus one pass */
    s->kv_cap = (int32_t)(c->sliding_window + B);
    s->cmp_cap = (int32_t)(2 * max_ratio + B);
    ds4_span_init(&s->cap, s->kv_cap);
    const int64_t H = c->n_embd, HC = c->hc_count, D = c->head_dim, NH = c->n_head, ID = c->indexer_head_dim;
    const int64_t IH = c->indexer_n_head, K = c->n_expert_used, E = c->n_expert, mix = 2 * HC + HC * HC;
    int rc = DS4_OK;
    const size_t F4 = sizeof(float);
    for (int L = 0; L < c->n_layer; L++) {
        const ds4_layer *l = &e->layers[L];
        layer_cache *lc = &d->lc[L];
        lc->kv = dalloc(s, (size_t)s->kv_cap * D * F4, &s->kv_bytes, &rc, err, len);
        if (l->kind == DS4_SWA) continue;
        const int64_t cw = (l->kind == DS4_CSA ? 2 : 1) * D, n_rows = s->n_ctx / l->ratio + 1;
        lc->cmp_c = dalloc(s, (size_t)s->cmp_cap * cw * F4, &s->cmp_bytes, &rc, err, len);
        lc->cmp_z = dalloc(s, (size_t)s->cmp_cap * cw * F4, &s->cmp_bytes, &rc, err, len);
        lc->comp = dalloc(s, (size_t)n_rows * D * F4, &s->cmp_bytes, &rc, err, len);
        if (l->kind == DS4_CSA) {
            lc->idx_c = dalloc(s, (size_t)s->cmp_cap * 2 * ID * F4, &s->cmp_bytes, &rc, err, len);
            lc->idx_z = dalloc(s, (size_t)s->cmp_cap * 2 * ID * F4, &s->cmp_bytes, &rc, err, len);
            lc->idx_keys = dalloc(s, (size_t)n_rows * ID * F4, &s->cmp_bytes, &rc, err, len);
        }
    }
    const int64_t n_comp = min_ratio ? s->n_ctx / min_ratio + 1 : 1;
    /* keys per (token, head): the window, then a CSA layer's selected rows (at most top_k: the
     * indexer runs whenever a token sees more) or every compressed row of an HCA layer; the
     * drafter's block rows (at most DS4_DSPARK_MAX_BLOCK) follow its window of context rows */
    int64_t n_keys_comp = DS4_DSPARK_MAX_BLOCK;
    for (int L = 0; L < c->n_layer; L++) {
        const ds4_layer *l = &e->layers[L];
        if (l->kind == DS4_SWA) continue;
        int64_t k = s->n_ctx / l->ratio + 1;
        if (l->kind == DS4_CSA && k > c->indexer_top_k) k = c->indexer_top_k;
        if (k > n_keys_comp) n_keys_comp = k;
    }
    int64_t keys_cap = c->sliding_window + n_keys_comp;
    keys_cap += keys_cap & 1;
    const int64_t FF = c->n_ff_exp > FS ? c->n_ff_exp : FS, cwmax = 2 * (D > ID ? D : ID);
    d->B = (int32_t)B;
    d->max_vis = (int32_t)n_comp;
    d->keys_cap = (int32_t)keys_cap;
    d->FF = (int32_t)FF;
    /* attention and indexer scratch (backend.h, attend/indexer): a row per (token, head) of one
     * tile of DS4_PASS_TILE_ROWS tokens on a GPU, a row per worker thread on the host */
    const int host = e->ops->host_memory;
    const int64_t T = B < DS4_PASS_TILE_ROWS ? B : DS4_PASS_TILE_ROWS;
    const int64_t att_rows = host ? e->n_threads : T * NH, att_w = host ? 4 * keys_cap : keys_cap;
    const int64_t isc_rows = host ? e->n_threads : T, isc_w = host ? 2 * n_comp : n_comp;
    uint64_t *sb = &s->scratch_bytes;
#define DF(n) dalloc(s, (size_t)(n) * F4, sb, &rc, err, len)
#define DI(n) dalloc(s, (size_t)(n) * sizeof(int32_t), sb, &rc, err, len)
    d->step = DI(B + 2); /* the position word, then the tokens (one copy per replayed pass) */
    d->tokens = d->step ? d->step + 2 : NULL;
    d->X = DF(B * HC * H); d->X3 = DF(B * HC * H); d->X2 = DF(B * HC * H);
    d->hcm = DF(B * mix); d->pre = DF(B * HC); d->post = DF(B * HC); d->comb = DF(B * HC * HC);
    d->x = DF(B * H); d->xn = DF(B * H); d->qr = DF(B * c->q_lora_rank); d->q = DF(B * NH * D);
    d->kvr = DF(B * D); d->att = DF(B * NH * D); d->u = DF(B * c->o_groups * c->o_lora_rank); d->y = DF(B * H);
    d->cbuf = DF(B * cwmax); d->zbuf = DF(B * cwmax); d->qi = DF(B * IH * ID); d->iw = DF(B * IH);
    d->sel_comp = DI(B * c->indexer_top_k); d->nsel_comp = DI(B); d->iscore = DF(isc_rows * isc_w);
    d->scores = DF(B * E); d->sel = DI(B * K); d->wsel = DF(B * K);
    d->ge = DF(B * K * FF); d->he = DF(B * K * FF); d->oe = DF(B * K * H);
    d->shg = DF(B * (FS ? FS : 1)); d->shh = DF(B * (FS ? FS : 1)); d->sho = DF(B * H);
    d->lm = DF(B * H); d->hm = DF(B * HC); d->hw = DF(B * HC); d->logits = DF(host ? 1 : T * c->n_vocab);
    d->att_sc = DF(att_rows * att_w);
    d->grp_ids = DI(B * c->o_groups);
    if (!host) d->picks = DI(2 * DS4_GRAPH_MAX_ROWS);
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
        d->dbest = DI(DS4_DSPARK_MAX_BLOCK); /* a greedy chain's drafts (ds4_draft_markov_chain) */
        if (!host) {
            d->hU = malloc((size_t)sup->block * c->n_vocab * F4);
            if (!d->hU) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
            *sb += (uint64_t)sup->block * c->n_vocab * F4;
        }
    }
#undef DF
#undef DI
    if (rc != DS4_OK) return rc;
    int32_t *ids = malloc((size_t)(B * c->o_groups) * sizeof *ids);
    if (!ids) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    for (int64_t i = 0; i < B * c->o_groups; i++) ids[i] = (int32_t)(i % c->o_groups);
    rc = e->ops->copy(e->ctx, d->grp_ids, ids, (size_t)(B * c->o_groups) * sizeof *ids, 0, err, len);
    if (rc == DS4_OK) rc = e->ops->sync(e->ctx, err, len);
    free(ids);
    return rc;
}

/* ---- the pass ------------------------------------------------------------------------------- */

typedef struct {
    ds4_session *s;
    ds4_engine *e;
    const ds4_backend *g;
    ds4_backend_ctx *cx;
    ds4_state *d;
    char msg[512];
} pass;

/* A vector or table of block l / of the target's head / of the support model where the backend
 * reads it (tensors.h names the tensors after their members). */
#define DV(l, f) ((float *)(l)->dv[DS4_BT_##f])
#define DV_TID2EID(l) ((const int32_t *)(l)->dv[DS4_BT_tid2eid])
#define GV(e, f) ((const float *)(e)->dv[DS4_GT_##f])
#define SV(sup, f) ((const float *)(sup)->dv[DS4_ST_##f])

#define PASS(s_) pass P_ = {(s_), (s_)->e, (s_)->e->ops, (s_)->e->ctx, (s_)->st, ""}, *P = &P_
#define G(call) do { int rc_ = (call); if (rc_ != DS4_OK) return ds4_op_fail(P->e, DS4_E_DEVICE, P->msg); } while (0)
#define M P->msg, sizeof P->msg
#define TRYP(x) do { int rc__ = (x); if (rc__ != DS4_OK) return rc__; } while (0)

int ds4_op_fail(ds4_engine *e, int rc, const char *msg) {
    if (e->op_rc == DS4_OK) {
        e->op_rc = rc;
        snprintf(e->op_msg, sizeof e->op_msg, "%s", msg);
    }
    return rc;
}

int ds4_op_check(ds4_engine *e, char *err, size_t len) {
    if (e->op_rc == DS4_OK) return DS4_OK;
    int rc = e->op_rc;
    e->op_rc = DS4_OK;
    return ds4_fail(err, len, rc == DS4_E_NOMEM ? DS4_E_NOMEM : DS4_E_DEVICE, "%s backend: %s",
                    e->backend == DS4_BACKEND_HIP ? "GPU" : "CPU", e->op_msg);
}

static int mm(pass *P, const ds4_w *w, const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy) {
    if (w->amx) /* the amx option: the copy repacked for the tiles (CPU backend) */
        G(P->g->mm(P->cx, DS4_CPU_AMX | w->type, w->amx, w->rows, w->cols, (int64_t)w->row_bytes, X, ldx, n, Y, ldy, M));
    else
        G(P->g->mm(P->cx, w->dev_layout, w->dev, w->rows, w->cols, (int64_t)w->row_bytes, X, ldx, n, Y, ldy, M));
    return DS4_OK;
}

/* One q8 quantisation of the n rows X [n, cols] (stride ldx) shared by the products that read them
 * until the next call (backend.h version 10; the same values as each product's own): X NULL ends it.
 * Only sub_in shares rows (d->xn), and it ends the sharing before it writes them again. */
static int q8_share(pass *P, const float *X, int64_t ldx, int n, int64_t cols) {
    if (P->g->q8_share) G(P->g->q8_share(P->cx, X, ldx, n, cols, M));
    return DS4_OK;
}

/* Rows of matrix w in groups: slot i multiplies matrix ids[i] (mat_bytes apart) by X row i / x_div. */
static int mm_gather(pass *P, const ds4_w *w, int64_t mat_bytes, const int32_t *ids, int64_t rows, const float *X,
                     int64_t ldx, int32_t x_div, int64_t n_slots, float *Y, int64_t ldy) {
    G(P->g->mm_gather(P->cx, w->dev_layout, w->dev, mat_bytes, ids, rows, w->cols, (int64_t)w->row_bytes, X, ldx, x_div,
                      n_slots, Y, ldy, M));
    return DS4_OK;
}

/* Y rows (host) of `w` for host activations X: the drafter's confidence and sampled Markov heads.
 * On failure Y is NaN, so nothing downstream can pass for a result, and the message is kept. */
int ds4_host_mm(ds4_engine *e, const ds4_w *w, int64_t r0, int64_t nr, const float *X, int64_t ldx, int64_t n,
                float *Y, int64_t ldy) {
    char msg[512];
    const uint8_t *W = w->dev + (size_t)r0 * w->row_bytes;
    int rc = e->ops->matmul(e->ctx, w->dev_layout, W, nr, w->cols, (int64_t)w->row_bytes, X, ldx, n, Y, ldy, msg,
                            sizeof msg);
    if (rc == DS4_OK) return DS4_OK;
    ds4_op_fail(e, rc, msg);
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < nr; r++) Y[t * ldy + r] = __builtin_nanf("");
    return rc;
}

/* ---- the block, shared by the target's layers and the drafter's stages ------------------------ */

/* mHC pre of X [n, HC, H] (spec ds4.md §2.1) into d->x, d->pre/post/comb. */
static int hc_pre(pass *P, const ds4_w *fn, const float *base_dev, const float *scale, const float *X, int n) {
    ds4_state *d = P->d;
    const ds4_cfg *c = &P->e->c;
    const int HC = c->hc_count, H = c->n_embd, mix = 2 * HC + HC * HC;
    G(P->g->rms_norm(P->cx, X, (int64_t)HC * H, n, (int64_t)HC * H, c->rms_eps, NULL, d->X2, (int64_t)HC * H, M));
    TRYP(mm(P, fn, d->X2, (int64_t)HC * H, n, d->hcm, mix));
    G(P->g->hc_pre(P->cx, d->hcm, n, HC, H, scale[0], scale[1], scale[2], base_dev, c->hc_eps, c->hc_sinkhorn_iters, X,
                   d->x, d->pre, d->post, d->comb, M));
    return DS4_OK;
}

/* The sub-block input: mHC pre of X, then the RMS norm `norm` into d->xn, whose q8 quantisation the
 * sub-block's products then share. */
static int sub_in(pass *P, const ds4_w *fn, const float *base_dev, const float *scale, const float *norm,
                  const float *X, int n) {
    const ds4_cfg *c = &P->e->c;
    TRYP(q8_share(P, NULL, 0, 0, 0)); /* d->xn is written below */
    TRYP(hc_pre(P, fn, base_dev, scale, X, n));
    G(P->g->rms_norm(P->cx, P->d->x, c->n_embd, n, c->n_embd, c->rms_eps, norm, P->d->xn, c->n_embd, M));
    return q8_share(P, P->d->xn, c->n_embd, n, c->n_embd);
}

/* Queries of n tokens at positions p0... (spec ds4.md §2.2): d->qr [n, q_lora] (normed, kept for
 * the indexer) and d->q [n, NH, D] (head-normed, RoPE'd). */
static int attn_q(pass *P, const ds4_layer *l, int n, int64_t p0, const double *freq) {
    ds4_state *d = P->d;
    const ds4_cfg *c = &P->e->c;
    const int H = c->n_embd, NH = c->n_head, D = c->head_dim, QL = c->q_lora_rank;
    TRYP(mm(P, &l->q_a, d->xn, H, n, d->qr, QL));
    G(P->g->rms_norm(P->cx, d->qr, QL, n, QL, c->rms_eps, DV(l, q_a_norm), d->qr, QL, M));
    TRYP(mm(P, &l->q_b, d->qr, QL, n, d->q, (int64_t)NH * D));
    G(P->g->norm_rope(P->cx, d->q, (int64_t)n * NH, D, NH, c->rms_eps, NULL, freq, c->n_rot, p0, 0, 0, M));
    return DS4_OK;
}

/* KV rows [n, D] of n rows of xn at positions p0... (normed, RoPE'd, not rounded) into out. */
static int attn_kv(pass *P, const ds4_layer *l, const float *xn, int n, int64_t p0, const double *freq, float *out) {
    const ds4_cfg *c = &P->e->c;
    TRYP(mm(P, &l->kv, xn, c->n_embd, n, out, c->head_dim));
    G(P->g->norm_rope(P->cx, out, n, c->head_dim, 1, c->rms_eps, DV(l, kv_norm), freq, c->n_rot, p0, 0, 0, M));
    return DS4_OK;
}

/* Inverse RoPE of d->att [n, NH, D] at the query positions, then the grouped low-rank output
 * projection (group g maps its heads' NH/G*D lanes to R lanes) into d->y [n, H]. */
static int attn_output(pass *P, const ds4_layer *l, int n, int64_t p0, const double *freq) {
    ds4_state *d = P->d;
    const ds4_cfg *c = &P->e->c;
    const int NH = c->n_head, D = c->head_dim, G_ = c->o_groups, R = c->o_lora_rank;
    G(P->g->norm_rope(P->cx, d->att, (int64_t)n * NH, D, NH, -1.0f, NULL, freq, c->n_rot, p0, 1, 0, M));
    /* group g of token t: rows [g*R, (g+1)*R) of out_a times att[t, g*gw ..] into u[t, g*R ..], gw = NH / G * D
     * (out_a's columns) */
    G(P->g->mm_grouped(P->cx, l->out_a.dev_layout, l->out_a.dev, (int64_t)R * (int64_t)l->out_a.row_bytes, d->grp_ids,
                       G_, R, l->out_a.cols, (int64_t)l->out_a.row_bytes, d->att, n, d->u, M));
    TRYP(mm(P, &l->out_b, d->u, (int64_t)G_ * R, n, d->y, c->n_embd));
    return DS4_OK;
}

/* MoE (spec ds4.md §2.7) of d->xn [n, H] into d->y: routing, the K routed experts by gathered
 * products, the shared expert, the weighted sum.  tokens: d->tokens (hash layers). */
static int moe(pass *P, const ds4_layer *l, int n) {
    ds4_engine *e = P->e;
    ds4_state *d = P->d;
    const ds4_cfg *c = &e->c;
    const int H = c->n_embd, E = c->n_expert, K = c->n_expert_used, F = c->n_ff_exp;
    TRYP(mm(P, &l->gate_inp, d->xn, H, n, d->scores, E));
    G(P->g->moe_route(P->cx, d->scores, n, E, K, l->hashed ? DV_TID2EID(l) : NULL, d->tokens, DV(l, exp_bias),
                      c->expert_weights_norm, e->numerics == DS4_NUMERICS_DS4, c->expert_weights_scale, d->sel, d->wsel,
                      M));
    const int64_t slots = (int64_t)n * K;
    TRYP(mm_gather(P, &l->gate_exps, (int64_t)l->gate_exps.mat_bytes, d->sel, F, d->xn, H, K, slots, d->ge, F));
    TRYP(mm_gather(P, &l->up_exps, (int64_t)l->up_exps.mat_bytes, d->sel, F, d->xn, H, K, slots, d->he, F));
    G(P->g->swiglu(P->cx, d->ge, d->he, slots * F, l->clamp, M));
    TRYP(mm_gather(P, &l->down_exps, (int64_t)l->down_exps.mat_bytes, d->sel, H, d->ge, F, 1, slots, d->oe, H));
    const int FS = (int)l->gate_sh.rows;
    TRYP(mm(P, &l->gate_sh, d->xn, H, n, d->shg, FS));
    TRYP(mm(P, &l->up_sh, d->xn, H, n, d->shh, FS));
    G(P->g->swiglu(P->cx, d->shg, d->shh, (int64_t)n * FS, l->clamp_shexp, M));
    TRYP(mm(P, &l->down_sh, d->shg, FS, n, d->sho, H));
    G(P->g->moe_combine(P->cx, d->oe, d->sel, d->wsel, n, K, H, d->sho, d->y, M));
    return DS4_OK;
}

/* The FFN half of a block: X [n, HC, H] -> Y (mHC pre, norm, MoE, mHC post). */
static int ffn_half(pass *P, const ds4_layer *l, const float *X, float *Y, int n) {
    const ds4_cfg *c = &P->e->c;
    TRYP(sub_in(P, &l->hc_ffn_fn, DV(l, hc_ffn_base), l->hc_ffn_scale, DV(l, ffn_norm), X, n));
    TRYP(moe(P, l, n));
    G(P->g->hc_post(P->cx, X, P->d->y, P->d->post, P->d->comb, n, c->hc_count, c->n_embd, Y, M));
    return DS4_OK;
}

/* HC head (spec ds4.md §2.1) of X [n, HC, H] with fn/scale/base: the pre-norm hidden rows d->lm. */
static int hc_head(pass *P, const float *X, int n, const ds4_w *fn, const float *scale, const float *base_dev) {
    ds4_state *d = P->d;
    d->head_n = 0; /* lm is rewritten: the last pass's rows are gone */
    TRYP(q8_share(P, NULL, 0, 0, 0)); /* the blocks' products are done */
    const ds4_cfg *c = &P->e->c;
    const int HC = c->hc_count, H = c->n_embd;
    G(P->g->rms_norm(P->cx, X, (int64_t)HC * H, n, (int64_t)HC * H, c->rms_eps, NULL, d->X2, (int64_t)HC * H, M));
    TRYP(mm(P, fn, d->X2, (int64_t)HC * H, n, d->hm, HC));
    G(P->g->hc_head(P->cx, X, d->hm, n, HC, H, scale[0], base_dev, c->hc_eps, d->hw, d->lm, M));
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

/* Causal attention of target layer L (spec ds4.md §2.2-§2.6): KV ring, compressors, indexer. */
static int attention(pass *P, int L, int n, int64_t p0) {
    ds4_engine *e = P->e;
    ds4_session *s = P->s;
    ds4_state *d = P->d;
    const ds4_cfg *c = &e->c;
    const ds4_layer *l = &e->layers[L];
    layer_cache *lc = &d->lc[L];
    const int H = c->n_embd, NH = c->n_head, D = c->head_dim, QL = c->q_lora_rank, nr = c->n_rot;
    const double *freq = l->kind == DS4_SWA ? e->d_freq_main : e->d_freq_comp;
    const int ds4n = e->numerics == DS4_NUMERICS_DS4;
    TRYP(attn_q(P, l, n, p0, freq));
    TRYP(attn_kv(P, l, d->xn, n, p0, freq, d->kvr));
    G(P->g->kv_store(P->cx, d->kvr, n, D, lc->kv, s->kv_cap, p0, nr, ds4n ? 1 : 0, M));
    const int32_t *sel = NULL, *nsel = NULL;
    if (l->kind != DS4_SWA) {
        const int cw = (l->kind == DS4_CSA ? 2 : 1) * D;
        int64_t w0;
        int32_t nw;
        closing_windows(p0, n, l->ratio, &w0, &nw);
        TRYP(mm(P, &l->comp_kv, d->xn, H, n, d->cbuf, cw));
        TRYP(mm(P, &l->comp_gate, d->xn, H, n, d->zbuf, cw));
        G(P->g->compress(P->cx, d->cbuf, d->zbuf, n, p0, D, l->ratio, l->kind == DS4_CSA, DV(l, comp_ape), lc->cmp_c,
                         lc->cmp_z, s->cmp_cap, w0, nw, lc->comp, DV(l, comp_norm), c->rms_eps, e->d_freq_comp, nr, 0,
                         ds4n, M));
        if (l->kind == DS4_CSA) {
            const int IH = c->indexer_n_head, ID = c->indexer_head_dim;
            TRYP(mm(P, &l->idx_comp_kv, d->xn, H, n, d->cbuf, 2 * ID));
            TRYP(mm(P, &l->idx_comp_gate, d->xn, H, n, d->zbuf, 2 * ID));
            G(P->g->compress(P->cx, d->cbuf, d->zbuf, n, p0, ID, l->ratio, 1, DV(l, idx_comp_ape), lc->idx_c, lc->idx_z,
                             s->cmp_cap, w0, nw, lc->idx_keys, DV(l, idx_comp_norm), c->rms_eps, e->d_freq_comp, nr, 1,
                             ds4n, M));
            if ((p0 + n) / l->ratio > c->indexer_top_k) {
                TRYP(mm(P, &l->idx_q_b, d->qr, QL, n, d->qi, (int64_t)IH * ID));
                G(P->g->norm_rope(P->cx, d->qi, (int64_t)n * IH, ID, IH, -1.0f, NULL, e->d_freq_comp, nr, p0, 0, ds4n,
                                  M));
                TRYP(mm(P, &l->idx_proj, d->xn, H, n, d->iw, IH));
                G(P->g->scale(P->cx, d->iw, (int64_t)n * IH, (float)pow((double)IH, -0.5), M));
                for (int r0 = 0; r0 < n; r0 += DS4_PASS_TILE_ROWS) { /* scratch for one tile (internal.h) */
                    const int rt = n - r0 < DS4_PASS_TILE_ROWS ? n - r0 : DS4_PASS_TILE_ROWS;
                    G(P->g->indexer(P->cx, d->qi + (size_t)r0 * IH * ID, d->iw + (size_t)r0 * IH, rt, p0 + r0, IH,
                                    ID, lc->idx_keys, l->ratio, c->indexer_top_k, (float)pow((double)ID, -0.5),
                                    d->iscore, d->max_vis, d->sel_comp + (size_t)r0 * c->indexer_top_k,
                                    d->nsel_comp + r0, M));
                }
                sel = d->sel_comp;
                nsel = d->nsel_comp;
            }
        }
    }
    for (int r0 = 0; r0 < n; r0 += DS4_PASS_TILE_ROWS) { /* scratch for one tile of rows (internal.h) */
        const int rt = n - r0 < DS4_PASS_TILE_ROWS ? n - r0 : DS4_PASS_TILE_ROWS;
        G(P->g->attend(P->cx, d->q + (size_t)r0 * NH * D, rt, NH, D, p0 + r0, c->sliding_window, lc->kv, s->kv_cap,
                       lc->comp, l->kind == DS4_SWA ? 0 : l->ratio, sel ? sel + (size_t)r0 * c->indexer_top_k : NULL,
                       nsel ? nsel + r0 : NULL, c->indexer_top_k, DV(l, sinks), d->att_sc, d->keys_cap,
                       d->att + (size_t)r0 * NH * D, M));
    }
    return attn_output(P, l, n, p0, freq);
}

/* The LM head of the normed rows [r0, r1) of d->lm, in tiles of rows: a GPU's d->logits holds one
 * tile, copied out after each (internal.h); the host's rows go straight into `logits` (row r0 first).
 * graph, or no `logits` on a GPU: the rows stay in d->logits (one tile). */
static int lm_head(pass *P, int r0, int r1, float *logits, int graph) {
    const ds4_cfg *c = &P->e->c;
    const int H = c->n_embd, host = P->g->host_memory;
    for (int t0 = r0; t0 < r1; t0 += DS4_PASS_TILE_ROWS) {
        const int rt = r1 - t0 < DS4_PASS_TILE_ROWS ? r1 - t0 : DS4_PASS_TILE_ROWS;
        float *out = graph || !logits ? NULL : logits + (size_t)(t0 - r0) * c->n_vocab;
        TRYP(mm(P, &P->e->output, P->d->lm + (size_t)t0 * H, H, rt, host ? out : P->d->logits, c->n_vocab));
        if (out && !host) G(P->g->copy(P->cx, out, P->d->logits, (size_t)rt * c->n_vocab * sizeof(float), 1, M));
    }
    return DS4_OK;
}

/* The pass's queued work after the tokens are in d->tokens: embedding, layers, HC head, norm and
 * the LM head of the first head_rows rows (every row's normed row stays in d->lm for ds4_pass_head).
 * graph: the work is being captured (spec platform.md §8): no cancellation point, and the logits
 * stay in d->logits for the caller to copy (rows <= DS4_PASS_TILE_ROWS there); so do they on a GPU
 * when `logits` is NULL (ds4_run_pass_argmax). */
static int pass_body(pass *P, int32_t n, int64_t p0, int logits_mode, float *logits, int head_rows, int graph) {
    ds4_session *s = P->s;
    ds4_engine *e = P->e;
    ds4_state *d = P->d;
    const ds4_cfg *c = &e->c;
    const int HC = c->hc_count, H = c->n_embd;
    G(P->g->embed(P->cx, e->token_embd.dev_layout, e->token_embd.dev, (int64_t)e->token_embd.row_bytes, H, d->tokens, n,
                  HC, d->X, M));
    float *X = d->X, *Y = d->X3;
    for (int L = 0; L < c->n_layer; L++) {
        if (!graph && atomic_load(&s->cancel)) return DS4_E_CANCELLED;
        const ds4_layer *l = &e->layers[L];
        TRYP(sub_in(P, &l->hc_attn_fn, DV(l, hc_attn_base), l->hc_attn_scale, DV(l, attn_norm), X, n));
        TRYP(attention(P, L, n, p0));
        G(P->g->hc_post(P->cx, X, d->y, d->post, d->comb, n, HC, H, Y, M));
        TRYP(ffn_half(P, l, Y, X, n));
        if (s->dsp && e->sup && e->sup->capture_slot[L] >= 0) {
            G(P->g->capture(P->cx, X, n, HC, H, p0, d->dcap, s->kv_cap, e->sup->n_capture, e->sup->capture_slot[L], M));
            ds4_span_writing(&s->cap, p0, n);
        }
    }
    if (logits_mode == DS4_LOGITS_NONE) return DS4_OK;
    const int rows = logits_mode == DS4_LOGITS_ALL ? n : 1;
    const float *Xs = logits_mode == DS4_LOGITS_ALL ? X : X + (size_t)(n - 1) * HC * H;
    TRYP(hc_head(P, Xs, rows, &e->output_hc_fn, e->output_hc_scale, GV(e, output_hc_base)));
    G(P->g->rms_norm(P->cx, d->lm, H, rows, H, c->rms_eps, GV(e, output_norm), d->lm, H, M));
    return lm_head(P, 0, head_rows < rows ? head_rows : rows, logits, graph);
}

/* Graphs stop for this engine (spec platform.md §8): plain launches from now on, and the note says
 * why (ds4_engine_gpu_graphs). */
static void graphs_off(ds4_engine *e, const char *what, int32_t n, const char *why) {
    e->gpu_graphs = 0;
    snprintf(e->gpu_graphs_note, sizeof e->gpu_graphs_note, "off: the capture of %s of %d rows failed (%s); plain "
             "launches from then on", what, n, why);
}

/* The pass from a graph of its shape (captured now when there is none).  Returns DS4_OK when the
 * graph was launched (the caller copies the logits), 1 when the capture failed and graphs went off
 * (the caller runs the pass with plain launches), or an error. */
static int graph_pass(pass *P, const int32_t *tokens, int32_t n, int64_t p0, int logits_mode) {
    ds4_session *s = P->s;
    ds4_engine *e = P->e;
    ds4_state *d = P->d;
    const ds4_cfg *c = &e->c;
    if (atomic_load(&s->cancel)) return DS4_E_CANCELLED;
    pass_graph key = {n, logits_mode, 0, s->dsp && e->sup, 0, NULL, 0};
    for (int L = 0; L < c->n_layer; L++) /* each CSA layer turns its indexer on once, as positions grow */
        key.n_idx += e->layers[L].kind == DS4_CSA && (p0 + n) / e->layers[L].ratio > c->indexer_top_k;
    if (key.n_idx) key.span = ds4_graph_span(p0 + n); /* the indexer's grid covers the span (backend.h) */
    memcpy(d->head, &p0, sizeof p0);
    memcpy(d->head + 2, tokens, (size_t)n * sizeof(int32_t));
    G(P->g->copy(P->cx, d->step, d->head, (size_t)(2 + n) * sizeof(int32_t), 0, M));
    pass_graph *g = NULL;
    for (int i = 0; i < d->n_graphs && !g; i++) {
        pass_graph *q = &d->graphs[i];
        if (q->n == key.n && q->logits_mode == key.logits_mode && q->n_idx == key.n_idx && q->capture == key.capture &&
            q->span == key.span)
            g = q;
    }
    if (!g) {
        const int op_rc = e->op_rc; /* a refused capture is no failure of the pass */
        char why[512];
        int rc = P->g->graph_begin(P->cx, (const int64_t *)(void *)d->step, p0, why, sizeof why);
        if (rc == DS4_OK) {
            rc = pass_body(P, n, p0, logits_mode, NULL, n, 1);
            if (rc != DS4_OK) snprintf(why, sizeof why, "%s", P->msg[0] ? P->msg : "an op failed");
            void *h = NULL;
            char why2[512];
            int erc = P->g->graph_end(P->cx, rc == DS4_OK, &h, why2, sizeof why2);
            if (rc == DS4_OK && erc != DS4_OK) snprintf(why, sizeof why, "%s", why2);
            if (rc == DS4_OK) rc = erc;
            if (rc == DS4_OK) {
                if (d->n_graphs == GRAPH_CACHE) { /* the least recently used shape makes room */
                    int lru = 0;
                    for (int i = 1; i < d->n_graphs; i++)
                        if (d->graphs[i].used < d->graphs[lru].used) lru = i;
                    P->g->graph_free(P->cx, d->graphs[lru].h);
                    d->graphs[lru] = d->graphs[--d->n_graphs];
                }
                g = &d->graphs[d->n_graphs++];
                *g = key;
                g->h = h;
                e->graph_captures++;
                s->last_pass_captured = 1;
            }
        }
        if (!g) {
            e->op_rc = op_rc;
            graphs_off(e, "a pass", n, why);
            return 1;
        }
    }
    g->used = ++d->n_passes;
    G(P->g->graph_launch(P->cx, g->h, M));
    e->graph_replays++;
    if (s->dsp && e->sup) /* the capture rows the replay writes (pass_body's bookkeeping) */
        for (int L = 0; L < c->n_layer; L++)
            if (e->sup->capture_slot[L] >= 0) ds4_span_writing(&s->cap, p0, n);
    return DS4_OK;
}

/* head_rows: rows of the LM head under DS4_LOGITS_ALL (pass_body); a graph computes every row. */
static int forward(ds4_session *s, const int32_t *tokens, int32_t n, int logits_mode, float *logits, int head_rows) {
    ds4_engine *e = s->e;
    PASS(s);
    ds4_state *d = s->st;
    const int64_t p0 = s->n_tokens;
    const int rows = logits_mode == DS4_LOGITS_ALL ? n : 1;
    int rc = 1;
    d->head_n = 0;
    if (e->gpu_graphs && !P->g->host_memory && n <= DS4_GRAPH_MAX_ROWS && head_rows >= rows) {
        rc = graph_pass(P, tokens, n, p0, logits_mode);
        if (rc != DS4_OK && rc != 1) return rc;
        if (rc == DS4_OK && logits_mode != DS4_LOGITS_NONE && logits) /* one tile of rows: in d->logits */
            G(P->g->copy(P->cx, logits, d->logits, (size_t)rows * e->c.n_vocab * sizeof(float), 1, M));
    }
    if (rc != DS4_OK) {
        G(P->g->copy(P->cx, d->tokens, tokens, (size_t)n * sizeof(int32_t), 0, M));
        TRYP(pass_body(P, n, p0, logits_mode, logits, head_rows, 0));
    }
    if (logits_mode == DS4_LOGITS_NONE) G(P->g->sync(P->cx, M));
    if (logits_mode == DS4_LOGITS_ALL) {
        d->head_n = n;
        d->head_p0 = p0;
    }
    return DS4_OK;
}

/* First non-finite logit of rows[0..n), or -1.  Chunks of 4096 are tested with an integer test
 * of the exponent bits that the compiler vectorises (all-ones exponent: inf or NaN, the floats
 * isfinite rejects); only a chunk that has one is searched element by element. */
static int64_t first_nonfinite(const float *rows, int64_t n) {
    for (int64_t c0 = 0; c0 < n; c0 += 4096) {
        const int64_t c1 = n - c0 < 4096 ? n : c0 + 4096;
        uint32_t bad = 0;
        for (int64_t i = c0; i < c1; i++) {
            uint32_t b;
            memcpy(&b, rows + i, sizeof b);
            bad |= (b & 0x7f800000u) == 0x7f800000u;
        }
        if (!bad) continue;
        for (int64_t i = c0; i < c1; i++)
            if (!isfinite(rows[i])) return i;
    }
    return -1;
}

static int nonfinite_at(int64_t pos, int64_t col, char *err, size_t err_len) {
    return ds4_fail(err, err_len, DS4_E_NONFINITE,
                    "non-finite logit (token id %lld) at position %lld: the model has NaN/Inf weights or "
                    "overflows (check the file with `ds4tui inspect --check-finite`)", (long long)col, (long long)pos);
}

static int nonfinite_error(ds4_session *s, int64_t row, int64_t col, int mode, int32_t n, char *err, size_t err_len) {
    return nonfinite_at(s->n_tokens + (mode == DS4_LOGITS_ALL ? row : n - 1), col, err, err_len);
}

/* ds4_run_pass, or with ids != NULL ds4_run_pass_argmax (logits == NULL: they stay on the device). */
static int run_pass(ds4_session *s, const int32_t *seq, int32_t n, int mode, float *logits, int64_t n_logit_rows,
                    int32_t *ids, char *err, size_t err_len) {
    ds4_engine *e = s->e;
    const int32_t rows = mode == DS4_LOGITS_ALL ? n : 1;
    if (mode == DS4_LOGITS_ALL && !ids && (n_logit_rows < 1 || n_logit_rows > n))
        return ds4_fail(err, err_len, DS4_E_INVALID, "a pass of %d rows with the LM head of %lld rows", n,
                        (long long)n_logit_rows);
    /* prefill_gemm (spec platform.md §7): the BLAS products for this pass only, and only when it has
     * enough rows; decode steps and verify passes stay on the batch-invariant float32 kernels */
    const int gemm = e->prefill_gemm != DS4_PREFILL_GEMM_OFF && n >= DS4_PREFILL_GEMM_MIN_ROWS;
    if (gemm) {
        char m[384];
        if (e->ops->gemm(e->ctx, e->prefill_gemm, NULL, 0, m, sizeof m) != DS4_OK)
            return ds4_fail(err, err_len, DS4_E_DEVICE, "GPU backend: %s", m);
    }
    s->last_pass_captured = 0;
    int rc = forward(s, seq, n, mode, logits, mode == DS4_LOGITS_ALL && !ids ? (int)n_logit_rows : rows);
    if (gemm) (void)e->ops->gemm(e->ctx, DS4_PREFILL_GEMM_OFF, NULL, 0, NULL, 0);
    if (rc == DS4_OK && ids) { /* the picks where the logits are, and only they come back */
        ds4_state *d = s->st;
        char m[384];
        int32_t back[2 * DS4_GRAPH_MAX_ROWS];
        if (e->ops->argmax_rows(e->ctx, d->logits, e->c.n_vocab, rows, e->c.n_vocab, d->picks, d->picks + rows, m,
                                sizeof m) != DS4_OK ||
            e->ops->copy(e->ctx, back, d->picks, (size_t)(2 * rows) * sizeof(int32_t), 1, m, sizeof m) != DS4_OK) {
            ds4_op_fail(e, DS4_E_DEVICE, m);
        } else {
            for (int32_t r = 0; r < rows; r++)
                if (back[rows + r] >= 0) return nonfinite_error(s, r, back[rows + r], mode, n, err, err_len);
            memcpy(ids, back, (size_t)rows * sizeof(int32_t));
        }
    }
    int orc = ds4_op_check(s->e, err, err_len);
    if (orc != DS4_OK) return orc;
    if (rc == DS4_E_CANCELLED) {
        atomic_store(&s->cancel, 0);
        s->stats.n_cancelled++;
        return ds4_fail(err, err_len, rc, "cancelled");
    }
    if (rc != DS4_OK) return ds4_fail(err, err_len, rc, "forward pass failed (%d)", rc);
    if (mode != DS4_LOGITS_NONE && !ids) {
        int64_t bad = first_nonfinite(logits, n_logit_rows * s->e->c.n_vocab);
        if (bad >= 0) return nonfinite_error(s, bad / e->c.n_vocab, bad % e->c.n_vocab, mode, n, err, err_len);
    }
    if (s->dsp && s->e->sup) ds4_span_written(&s->cap, s->n_tokens, n);
    s->n_tokens += n;
    s->stats.n_target_evals++;
    return DS4_OK;
}

int ds4_run_pass(ds4_session *s, const int32_t *seq, int32_t n, int mode, float *logits, int64_t n_logit_rows,
                 char *err, size_t err_len) {
    return run_pass(s, seq, n, mode, logits, n_logit_rows, NULL, err, err_len);
}

int ds4_pass_head(ds4_session *s, int32_t r0, int32_t r1, float *logits, char *err, size_t err_len) {
    ds4_state *d = s->st;
    if (!logits || r0 < 0 || r1 <= r0 || r1 > d->head_n)
        return ds4_fail(err, err_len, DS4_E_STATE, "the LM head of rows %d..%d: the last pass holds %d rows", r0, r1 - 1,
                        d->head_n);
    PASS(s);
    int rc = lm_head(P, r0, r1, logits, 0);
    int orc = ds4_op_check(s->e, err, err_len);
    if (orc != DS4_OK) return orc;
    if (rc != DS4_OK) return ds4_fail(err, err_len, rc, "the LM head failed (%d)", rc);
    const int64_t V = s->e->c.n_vocab, bad = first_nonfinite(logits, (int64_t)(r1 - r0) * V);
    return bad >= 0 ? nonfinite_at(d->head_p0 + r0 + bad / V, bad % V, err, err_len) : DS4_OK;
}

int ds4_device_picks(const ds4_session *s) { return !s->e->ops->host_memory && s->e->ops->argmax_rows != NULL; }

int ds4_run_pass_argmax(ds4_session *s, const int32_t *seq, int32_t n, int mode, int32_t *ids, char *err,
                        size_t err_len) {
    if (!ds4_device_picks(s) || mode == DS4_LOGITS_NONE || (mode == DS4_LOGITS_ALL && n > DS4_GRAPH_MAX_ROWS))
        return ds4_fail(err, err_len, DS4_E_INVALID, "device picks: %d rows (mode %d) on this backend", n, mode);
    return run_pass(s, seq, n, mode, NULL, 0, ids, err, err_len);
}

/* ---- the DSpark drafter (spec dspark.md §2.4) ------------------------------------------------ */

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Context KV rows of positions lo..hi of every stage, projected from the capture ring: main_proj
 * of the captured rows, its norm, then each stage's KV projection into the stage's context ring
 * (FP8-rounded in ds4 numerics).  On a host backend a non-finite projection returns
 * DS4_E_NONFINITE (not kept as a device failure) with *op = "main_proj". */
int ds4_draft_context(ds4_session *s, int64_t lo, int64_t hi, const char **op) {
    ds4_engine *e = s->e;
    PASS(s);
    ds4_state *d = s->st;
    const ds4_support *sup = e->sup;
    const ds4_cfg *c = &e->c;
    const int H = c->n_embd, D = c->head_dim, nr = c->n_rot, cap = s->kv_cap;
    const int64_t CW = (int64_t)sup->n_capture * H, W = c->sliding_window;
    const int ds4n = e->numerics == DS4_NUMERICS_DS4;
    for (int64_t p0 = lo; p0 <= hi; p0 += W) {
        const int n = (int)(hi - p0 + 1 < W ? hi - p0 + 1 : W);
        *op = "main_proj";
        for (int done = 0; done < n;) { /* main_proj over the capture ring, in contiguous pieces */
            const int64_t r0 = (p0 + done) % cap;
            const int k = (int)(n - done < cap - r0 ? n - done : cap - r0);
            TRYP(mm(P, &sup->main_proj, d->dcap + r0 * CW, CW, k, d->dmx + (size_t)done * H, H));
            done += k;
        }
        G(P->g->rms_norm(P->cx, d->dmx, H, n, H, c->rms_eps, SV(sup, main_norm), d->dmx, H, M));
        if (P->g->host_memory && !all_finite(d->dmx, (int64_t)n * H)) return DS4_E_NONFINITE;
        *op = "context_kv";
        for (int st = 0; st < sup->n_stages; st++) {
            const ds4_layer *l = &sup->stages[st];
            TRYP(attn_kv(P, l, d->dmx, n, p0, e->d_freq_main, d->dkvtmp));
            G(P->g->kv_store(P->cx, d->dkvtmp, n, D, d->dctx + (size_t)st * cap * D, cap, p0, nr, ds4n ? 2 : 0, M));
        }
    }
    G(P->g->sync(P->cx, M));
    return DS4_OK;
}

/* The block [anchor, noise...] embedded with the target's table, repeated over the streams. */
int ds4_draft_embed(ds4_session *s, int32_t anchor) {
    ds4_engine *e = s->e;
    PASS(s);
    const ds4_support *sup = e->sup;
    const int B = sup->block;
    int32_t toks[DS4_DSPARK_MAX_BLOCK];
    for (int i = 0; i < B; i++) toks[i] = i == 0 ? anchor : sup->noise;
    G(P->g->copy(P->cx, P->d->tokens, toks, (size_t)B * sizeof(int32_t), 0, M));
    G(P->g->embed(P->cx, e->token_embd.dev_layout, e->token_embd.dev, (int64_t)e->token_embd.row_bytes, e->c.n_embd,
                  P->d->tokens, B, e->c.hc_count, P->d->X, M));
    return DS4_OK;
}

/* One drafter stage over the block X [B, HC, H] -> X (Y is scratch): the target's block functions
 * with a non-causal attention over the context rows lo..hi and the block's own KV rows. */
static int draft_stage(pass *P, int st, float *X, float *Y, int B, int64_t p0, int64_t lo, int64_t hi,
                       const char **op) {
    ds4_engine *e = P->e;
    ds4_session *s = P->s;
    ds4_state *d = P->d;
    const ds4_cfg *c = &e->c;
    const ds4_layer *l = &e->sup->stages[st];
    const int NH = c->n_head, D = c->head_dim, HC = c->hc_count, H = c->n_embd;
    const double *freq = e->d_freq_main;
    *op = "hc_pre";
    TRYP(sub_in(P, &l->hc_attn_fn, DV(l, hc_attn_base), l->hc_attn_scale, DV(l, attn_norm), X, B));
    *op = "attn_q";
    TRYP(attn_q(P, l, B, p0, freq));
    *op = "attn_kv";
    float *dkv = d->ddkv + (size_t)st * B * D;
    TRYP(attn_kv(P, l, d->xn, B, p0, freq, dkv));
    if (e->numerics == DS4_NUMERICS_DS4) G(P->g->kv_store(P->cx, dkv, B, D, dkv, B, 0, c->n_rot, 2, M));
    *op = "attention";
    G(P->g->attend_nc(P->cx, d->q, B, NH, D, d->dctx + (size_t)st * s->kv_cap * D, s->kv_cap, lo, (int)(hi - lo + 1),
                      dkv, B, DV(l, sinks), d->att_sc, d->keys_cap, d->att, M));
    *op = "attn_output";
    TRYP(attn_output(P, l, B, p0, freq));
    G(P->g->hc_post(P->cx, X, d->y, d->post, d->comb, B, HC, H, Y, M));
    *op = "moe";
    TRYP(ffn_half(P, l, Y, X, B));
    if (P->g->host_memory && !all_finite(d->y, (int64_t)B * H)) return DS4_E_NONFINITE;
    return DS4_OK;
}

/* The stages from a graph (spec platform.md §8.5): captured at the first proposal whose context
 * rows fill the window, replayed at the position word d->step (the kernels read the block's
 * positions and the context rows' first position relative to it).  Returns DS4_OK when the graph
 * was launched, 1 when the capture failed and graphs went off (the caller launches the stages),
 * or an error. */
static int draft_graph(pass *P, int64_t p0, int64_t lo, int64_t hi, const char **op) {
    ds4_session *s = P->s;
    ds4_engine *e = P->e;
    ds4_state *d = P->d;
    const int B = e->sup->block;
    memcpy(d->head, &p0, sizeof p0);
    G(P->g->copy(P->cx, d->step, d->head, sizeof p0, 0, M));
    if (!d->draft_graph) {
        const int op_rc = e->op_rc; /* a refused capture is no failure of the proposal */
        char why[512], why2[512];
        void *h = NULL;
        int rc = P->g->graph_begin(P->cx, (const int64_t *)(void *)d->step, p0, why, sizeof why);
        if (rc == DS4_OK) {
            for (int st = 0; st < e->sup->n_stages && rc == DS4_OK; st++)
                rc = draft_stage(P, st, d->X, d->X3, B, p0, lo, hi, op);
            if (rc != DS4_OK) snprintf(why, sizeof why, "%s", P->msg[0] ? P->msg : "an op failed");
            int erc = P->g->graph_end(P->cx, rc == DS4_OK, &h, why2, sizeof why2);
            if (rc == DS4_OK && erc != DS4_OK) snprintf(why, sizeof why, "%s", why2);
            if (rc == DS4_OK) rc = erc;
        }
        if (rc != DS4_OK) {
            e->op_rc = op_rc;
            graphs_off(e, "the drafter's stages", B, why);
            return 1;
        }
        d->draft_graph = h;
        e->graph_captures++;
        s->last_proposal_captured = 1;
    }
    G(P->g->graph_launch(P->cx, d->draft_graph, M));
    e->graph_replays++;
    return DS4_OK;
}

/* The stages over the embedded block at positions p0.., context rows lo..hi (*op: the stage op that
 * failed; on a host backend a non-finite MoE output returns DS4_E_NONFINITE as "moe").  Under
 * gpu_graphs a full window of context rows replays the stages' graph (the key: the window, the
 * block and the engine's options, all fixed for a session). */
int ds4_draft_stages(ds4_session *s, int64_t p0, int64_t lo, int64_t hi, const char **op) {
    PASS(s);
    s->last_proposal_captured = 0;
    if (s->e->gpu_graphs && !P->g->host_memory && hi - lo + 1 == s->e->c.sliding_window) {
        int rc = draft_graph(P, p0, lo, hi, op);
        if (rc != 1) return rc;
    }
    for (int st = 0; st < s->e->sup->n_stages; st++)
        TRYP(draft_stage(P, st, P->d->X, P->d->X3, s->e->sup->block, p0, lo, hi, op));
    return DS4_OK;
}

/* The HC head of the block: pre-norm hidden rows into h_host [block, H]. */
int ds4_draft_head(ds4_session *s, float *h_host) {
    ds4_engine *e = s->e;
    PASS(s);
    const ds4_support *sup = e->sup;
    TRYP(hc_head(P, P->d->X, sup->block, &sup->hc_head_fn, sup->hc_head_scale, SV(sup, hc_head_base)));
    G(P->g->copy(P->cx, h_host, P->d->lm, (size_t)sup->block * e->c.n_embd * sizeof(float), 1, M));
    return DS4_OK;
}

/* Columns of the drafter's logits: the draft vocabulary's size, or the whole vocabulary. */
int32_t ds4_draft_vocab_size(const ds4_engine *e) { return e->sup && e->sup->n_vd ? e->sup->n_vd : (int32_t)e->c.n_vocab; }

/* The token of column j of the drafter's logits. */
int32_t ds4_draft_token(const ds4_engine *e, int32_t j) { return e->sup && e->sup->n_vd ? e->sup->vd[j] : j; }

/* The LM head for normed rows hn [want, H] (host): base logits U [want, Vd] (Vd = ds4_draft_vocab_size:
 * the draft vocabulary's rows of the LM head when there is one, spec dspark.md §2.6) kept in the
 * backend's memory for ds4_draft_markov; *U_host (when not NULL) gets host-readable rows for sampling. */
int ds4_draft_logits(ds4_session *s, const float *hn, int want, const float **U_host) {
    ds4_engine *e = s->e;
    PASS(s);
    ds4_state *d = s->st;
    const ds4_support *sup = e->sup;
    const int64_t H = e->c.n_embd, V = ds4_draft_vocab_size(e);
    G(P->g->copy(P->cx, d->dhn, hn, (size_t)(want * H) * sizeof(float), 0, M));
    TRYP(mm(P, sup->n_vd ? &sup->vd_lm : &e->output, d->dhn, H, want, d->dU, V));
    if (!U_host) return DS4_OK;
    if (P->g->host_memory) {
        *U_host = d->dU;
        return DS4_OK;
    }
    G(P->g->copy(P->cx, d->hU, d->dU, (size_t)(want * V) * sizeof(float), 1, M));
    *U_host = d->hU;
    return DS4_OK;
}

/* Greedy draft k: argmax over V of W2 feat + U[k] (dspark.md §2.4), with feat = W1[prev] [rank]
 * (host); the sum and the argmax rule are ds4_argmax's (first maximum), so the draft is the same
 * token on every backend. */
int ds4_draft_markov(ds4_session *s, int k, const float *feat, int32_t *x) {
    ds4_engine *e = s->e;
    PASS(s);
    ds4_state *d = s->st;
    const ds4_support *sup = e->sup;
    const int32_t V = ds4_draft_vocab_size(e);
    G(P->g->copy(P->cx, d->dfeat, feat, (size_t)sup->rank * sizeof(float), 0, M));
    TRYP(mm(P, sup->n_vd ? &sup->vd_w2 : &sup->markov_w2, d->dfeat, sup->rank, 1, d->drow, V));
    G(P->g->add_argmax(P->cx, d->drow, d->dU + (size_t)k * V, V, d->dbest, M));
    int32_t j;
    G(P->g->copy(P->cx, &j, d->dbest, sizeof(int32_t), 1, M));
    *x = ds4_draft_token(e, j);
    return DS4_OK;
}

/* Greedy drafts 0..want-1 as one queued sequence (spec platform.md §9): draft k is the argmax of
 * W2 W1[x_{k-1}] + U[k] with x_{-1} the block's first input (the anchor, d->tokens[0] since
 * ds4_draft_embed) and x_{k-1} read where the device wrote it; the W1 row is copied by the
 * embedding kernel from its GGML row (the host's dequantisation: the same floats).  The same ops
 * and operands as `want` calls of ds4_draft_markov, so the same drafts; one copy brings x back. */
int ds4_draft_markov_chain(ds4_session *s, int want, int32_t *x) {
    ds4_engine *e = s->e;
    PASS(s);
    ds4_state *d = s->st;
    const ds4_support *sup = e->sup;
    const int32_t V = ds4_draft_vocab_size(e);
    for (int k = 0; k < want; k++) {
        /* the anchor is a token id (its W1 row); a draft is a column j of the draft vocabulary, whose
         * W1 row is row j of the draft vocabulary's copy */
        const int32_t *prev = k == 0 ? d->tokens : d->dbest + (k - 1);
        const ds4_w *w1 = k > 0 && sup->n_vd ? &sup->vd_w1 : &sup->markov_w1;
        G(P->g->embed(P->cx, w1->dev_layout, w1->dev, (int64_t)w1->row_bytes, sup->rank, prev, 1, 1, d->dfeat, M));
        TRYP(mm(P, sup->n_vd ? &sup->vd_w2 : &sup->markov_w2, d->dfeat, sup->rank, 1, d->drow, V));
        G(P->g->add_argmax(P->cx, d->drow, d->dU + (size_t)k * V, V, d->dbest + k, M));
    }
    G(P->g->copy(P->cx, x, d->dbest, (size_t)want * sizeof(int32_t), 1, M));
    for (int k = 0; k < want; k++) x[k] = ds4_draft_token(e, x[k]);
    return DS4_OK;
}
