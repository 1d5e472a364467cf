/* load.c — binding the tensor table (spec ds4.md §3.3, dspark.md §4.2): every tensor the forward
 * pass and the drafter read is looked up by its GGUF name, its type and dims checked against the
 * config, matrices kept where they are mapped and vectors dequantised to float.  A failure names
 * the tensor and the expected and found values. */
#include "internal.h"
#define DS4_TENSOR_TABLES
#include "tensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ds4_engine *e;
    const ds4_tensor_desc *t;
    int32_t n;
    char *err;
    size_t len;
} binder;

static const ds4_tensor_desc *find(const binder *b, const char *name) {
    for (int32_t i = 0; i < b->n; i++)
        if (b->t[i].name && strcmp(b->t[i].name, name) == 0) return &b->t[i];
    return NULL;
}

static int check_dims(const binder *b, const ds4_tensor_desc *t, int64_t ne0, int64_t ne1, int64_t ne2) {
    int64_t want[3] = {ne0, ne1, ne2};
    for (int i = 0; i < 3; i++) {
        int64_t have = i < t->n_dims ? t->ne[i] : 1;
        if (have != want[i])
            return ds4_fail(b->err, b->len, DS4_E_INVALID,
                        "tensor '%s': wrong dims: expected GGUF ne [%lld, %lld, %lld], found ne[%d] = %lld",
                        t->name, (long long)ne0, (long long)ne1, (long long)ne2, i, (long long)have);
    }
    if (!t->data) return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': no data pointer", t->name);
    return DS4_OK;
}

static const ds4_tensor_desc *lookup(const binder *b, const char *name, int *rc) {
    const ds4_tensor_desc *t = find(b, name);
    if (!t) *rc = ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s' is missing from the model descriptor", name);
    return t;
}

/* A weight matrix (or n_mat of them): ne = [cols, rows, n_mat]. */
static int bind_mat(binder *b, const char *name, int64_t cols, int64_t rows, int64_t n_mat, ds4_w *out) {
    int rc = DS4_OK;
    const ds4_tensor_desc *t = lookup(b, name, &rc);
    if (!t) return rc;
    const ds4_type_traits *tt = ds4_type(t->type);
    if (!tt || !tt->matrix)
        return ds4_fail(b->err, b->len, DS4_E_UNSUPPORTED,
                    "tensor '%s': GGML type %s (%d) has no matmul kernel (expected %s)", name,
                    ds4_type_name(t->type), t->type, ds4_type_list(0));
    if ((rc = check_dims(b, t, cols, rows, n_mat)) != DS4_OK) return rc;
    size_t rb = ds4_row_bytes(t->type, cols);
    if (rb == 0)
        return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': %lld columns is not a multiple of %s's block size",
                    name, (long long)cols, ds4_type_name(t->type));
    if (t->nbytes < rb * (uint64_t)rows * (uint64_t)n_mat)
        return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': %llu bytes, expected %llu", name,
                    (unsigned long long)t->nbytes, (unsigned long long)(rb * rows * n_mat));
    *out = (ds4_w){.data = t->data, .type = t->type, .rows = rows, .cols = cols, .n_mat = n_mat, .row_bytes = rb,
                   .mat_bytes = rb * (size_t)rows};
    b->e->weight_bytes += rb * (uint64_t)rows * (uint64_t)n_mat;
    return DS4_OK;
}

static float *engine_alloc(ds4_engine *e, size_t n) {
    float **na = realloc(e->allocs, (size_t)(e->n_alloc + 1) * sizeof *na);
    if (!na) return NULL;
    e->allocs = na;
    float *p = calloc(n ? n : 1, sizeof(float));
    if (p) e->allocs[e->n_alloc++] = p;
    return p;
}

/* A vector or small table, dequantised to float: ne = [ne0, ne1]. */
static int bind_vec(binder *b, const char *name, int64_t ne0, int64_t ne1, float **out) {
    int rc = DS4_OK;
    const ds4_tensor_desc *t = lookup(b, name, &rc);
    if (!t) return rc;
    const ds4_type_traits *tt = ds4_type(t->type);
    if (!tt || !tt->vector)
        return ds4_fail(b->err, b->len, DS4_E_UNSUPPORTED, "tensor '%s': wrong type: expected %s, found %s", name,
                    ds4_type_list(1), ds4_type_name(t->type));
    if ((rc = check_dims(b, t, ne0, ne1, 1)) != DS4_OK) return rc;
    int64_t n = ne0 * ne1;
    if (t->nbytes < ds4_row_bytes(t->type, n))
        return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': %llu bytes, expected %llu", name,
                    (unsigned long long)t->nbytes, (unsigned long long)ds4_row_bytes(t->type, n));
    float *v = engine_alloc(b->e, (size_t)n);
    if (!v) return ds4_fail(b->err, b->len, DS4_E_NOMEM, "out of memory binding '%s'", name);
    tt->dequant(t->data, v, n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return ds4_fail(b->err, b->len, DS4_E_NONFINITE, "tensor '%s': non-finite value %g at element %lld", name,
                        (double)v[i], (long long)i);
    b->e->expanded_bytes += (uint64_t)n * sizeof(float);
    b->e->weight_bytes += ds4_row_bytes(t->type, n);
    *out = v;
    return DS4_OK;
}

#define TRY(x) do { int rc_ = (x); if (rc_ != DS4_OK) return rc_; } while (0)

/* An I32 table (the hash routing table tid2eid [n_vocab, n_expert_used]): expert ids checked. */
static int bind_idx(binder *b, const char *name, int64_t ne0, int64_t ne1, const int32_t **out) {
    int rc = DS4_OK;
    const ds4_tensor_desc *t = lookup(b, name, &rc);
    if (!t) return rc;
    if (t->type != DS4_TYPE_I32)
        return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': wrong type: expected I32, found %s", name,
                        ds4_type_name(t->type));
    TRY(check_dims(b, t, ne0, ne1, 1));
    const int32_t *v = t->data;
    const int32_t E = b->e->c.n_expert;
    for (int64_t i = 0; i < ne0 * ne1; i++)
        if (v[i] < 0 || v[i] >= E)
            return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': expert id %d at token %lld outside 0..%d", name,
                            v[i], (long long)(i / ne0), E - 1);
    b->e->weight_bytes += t->nbytes;
    *out = v;
    return DS4_OK;
}

/* One row of a tensor table into the member at base + row->field. */
static int bind_row(binder *b, const ds4_tensor_row *row, const char *name, const int64_t ne[3], void *base) {
    void *field = (char *)base + row->field;
    switch (row->bind) {
    case DS4_BIND_MAT: return bind_mat(b, name, ne[0], ne[1], ne[2], field);
    case DS4_BIND_VEC: return bind_vec(b, name, ne[0], ne[1] * ne[2], field);
    default: return bind_idx(b, name, ne[0], ne[1], field);
    }
}

/* One block (target layer `blk.L.` or drafter stage `mtp.S.`): the rows of tensors.h that its
 * variant (attention kind, hash or top-k routing) has, with names `prefix<suffix>`. */
static int bind_block(binder *b, ds4_layer *l, const char *prefix, int ratio, int hashed, float clamp, float clamp_sh) {
    l->ratio = ratio;
    l->kind = l->ratio == 0 ? DS4_SWA : (l->ratio == 4 ? DS4_CSA : DS4_HCA);
    l->hashed = hashed;
    l->clamp = clamp;
    l->clamp_shexp = clamp_sh;
    const unsigned variant = 1u << (3 * (hashed ? 1 : 0) + l->kind);
    for (int i = 0; i < DS4_N_BLOCK_TENSORS; i++) {
        const ds4_tensor_row *row = &ds4_block_tensors[i];
        if (!(row->when & variant)) continue;
        char nm[160];
        int64_t ne[3];
        snprintf(nm, sizeof nm, "%s%s", prefix, row->name);
        ds4_block_tensor_ne(&b->e->c, l->kind, l->ratio, i, ne);
        TRY(bind_row(b, row, nm, ne, l));
    }
    return DS4_OK;
}

size_t ds4_block_tensor_bytes(const ds4_engine *e, const ds4_layer *l, int i) {
    const ds4_tensor_row *row = &ds4_block_tensors[i];
    const void *p = *(const void *const *)((const char *)l + row->field);
    if (row->bind == DS4_BIND_MAT || !p) return 0;
    int64_t ne[3];
    ds4_block_tensor_ne(&e->c, l->kind, l->ratio, i, ne);
    return (size_t)(ne[0] * ne[1] * ne[2]) * sizeof(float); /* floats, or I32 ids */
}

int ds4_block_mats(ds4_layer *l, ds4_w **out) {
    int n = 0;
    for (int i = 0; i < DS4_N_BLOCK_TENSORS; i++) {
        if (ds4_block_tensors[i].bind != DS4_BIND_MAT) continue;
        ds4_w *w = (ds4_w *)((char *)l + ds4_block_tensors[i].field);
        if (w->data) out[n++] = w;
    }
    return n;
}

static int head_mats(const ds4_tensor_row *rows, int n_rows, void *base, ds4_w **out) {
    int n = 0;
    for (int i = 0; i < n_rows; i++) {
        if (rows[i].bind != DS4_BIND_MAT) continue;
        ds4_w *w = (ds4_w *)((char *)base + rows[i].field);
        if (w->data) out[n++] = w;
    }
    return n;
}

int ds4_target_mats(ds4_engine *e, ds4_w **out) {
    int n = head_mats(ds4_global_tensors, DS4_N_GLOBAL_TENSORS, e, out);
    for (int L = 0; e->layers && L < e->c.n_layer; L++) n += ds4_block_mats(&e->layers[L], out + n);
    return n;
}

int ds4_support_mats(ds4_engine *e, ds4_w **out) {
    ds4_support *sup = e->sup;
    int n = head_mats(ds4_support_tensors, DS4_N_SUPPORT_TENSORS, sup, out);
    for (int st = 0; st < sup->n_stages; st++) n += ds4_block_mats(&sup->stages[st], out + n);
    if (sup->n_vd > 0) out[n++] = &sup->vd_lm, out[n++] = &sup->vd_w2, out[n++] = &sup->vd_w1;
    return n;
}

int ds4_check_config(const ds4_model_config *c, char *err, size_t len) {
#define POS(f) if (c->f <= 0) return ds4_fail(err, len, DS4_E_INVALID, "model config: " #f " must be positive, found %lld", (long long)c->f)
    POS(n_layer); POS(n_embd); POS(n_vocab); POS(n_head); POS(head_dim); POS(n_rot); POS(q_lora_rank);
    POS(o_lora_rank); POS(o_groups); POS(n_expert); POS(n_expert_used); POS(n_ff_exp); POS(sliding_window);
    POS(indexer_n_head); POS(indexer_head_dim); POS(indexer_top_k); POS(hc_count); POS(hc_sinkhorn_iters);
    POS(context_length); POS(n_expert_shared);
#undef POS
    if (c->hc_count > 16) return ds4_fail(err, len, DS4_E_UNSUPPORTED, "model config: hc_count %d > 16", c->hc_count);
    if (c->n_rot % 2 || c->n_rot > c->head_dim || c->n_rot > c->indexer_head_dim)
        return ds4_fail(err, len, DS4_E_INVALID, "model config: n_rot %d must be even and at most head_dim %d / indexer_head_dim %d",
                    c->n_rot, c->head_dim, c->indexer_head_dim);
    if (c->n_head % c->o_groups)
        return ds4_fail(err, len, DS4_E_INVALID, "model config: n_head %d is not a multiple of o_groups %d", c->n_head, c->o_groups);
    if (c->n_expert_used > c->n_expert)
        return ds4_fail(err, len, DS4_E_INVALID, "model config: n_expert_used %d > n_expert %d", c->n_expert_used, c->n_expert);
    if (!c->compress_ratios || !c->swiglu_clamp)
        return ds4_fail(err, len, DS4_E_INVALID, "model config: compress_ratios and swiglu_clamp are required");
    for (int L = 0; L < c->n_layer; L++)
        if (c->compress_ratios[L] < 0 || c->compress_ratios[L] == 1)
            return ds4_fail(err, len, DS4_E_INVALID, "model config: compress_ratios[%d] = %d (expected 0, 4 or another ratio >= 2)",
                        L, c->compress_ratios[L]);
    int64_t ID = c->indexer_head_dim;
    if ((ID & (ID - 1)) || ID % 32)
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "model config: indexer_head_dim %d must be a power of two >= 32", c->indexer_head_dim);
    if ((c->head_dim - c->n_rot) % 64)
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "model config: head_dim - n_rot = %d is not a multiple of 64 (FP8 KV blocks)",
                    c->head_dim - c->n_rot);
    return DS4_OK;
}

/* ---- DSpark support model (spec dspark.md §4.2; dflash names are mapped by the caller) ------ */

static int bind_support_tensors(binder *b, const ds4_support_config *sc, ds4_support *sup) {
    ds4_engine *e = b->e;
    for (int st = 0; st < sc->n_stages; st++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "mtp.%d.", st);
        TRY(bind_block(b, &sup->stages[st], prefix, 0, 0, e->sup_clamp, e->sup_clamp_sh));
    }
    for (int i = 0; i < DS4_N_SUPPORT_TENSORS; i++) { /* `mtp.%d.` names are the last stage's */
        char nm[160];
        int64_t ne[3];
        snprintf(nm, sizeof nm, ds4_support_tensors[i].name, sc->n_stages - 1);
        ds4_support_tensor_ne(&e->c, sc, i, ne);
        TRY(bind_row(b, &ds4_support_tensors[i], nm, ne, sup));
    }
    return DS4_OK;
}

int ds4_check_support_config(const ds4_engine *e, const ds4_support_config *sc, char *err, size_t len) {
    const ds4_cfg *c = &e->c;
    if (!sc) return ds4_fail(err, len, DS4_E_INVALID, "support config is NULL");
    if (sc->n_stages < 1 || sc->n_stages > 8)
        return ds4_fail(err, len, DS4_E_INVALID, "support stages: expected 1..8, found %d", sc->n_stages);
    if (sc->block_size < 1 || sc->block_size > DS4_DSPARK_MAX_BLOCK)
        return ds4_fail(err, len, DS4_E_INVALID, "support block size: expected 1..%d, found %d", DS4_DSPARK_MAX_BLOCK,
                        sc->block_size);
    if (sc->markov_rank < 1)
        return ds4_fail(err, len, DS4_E_INVALID, "support Markov rank: expected > 0, found %d", sc->markov_rank);
    if (sc->noise_token < 0 || sc->noise_token >= c->n_vocab)
        return ds4_fail(err, len, DS4_E_INVALID, "support noise token id: expected 0..%d, found %d", c->n_vocab - 1,
                        sc->noise_token);
    if (sc->n_capture < 1 || sc->n_capture > 8 || !sc->capture_layers)
        return ds4_fail(err, len, DS4_E_INVALID, "support capture layers: expected 1..8 ids, found %d", sc->n_capture);
    for (int i = 0; i < sc->n_capture; i++) {
        int L = sc->capture_layers[i];
        if (L < 0 || L >= c->n_layer)
            return ds4_fail(err, len, DS4_E_INVALID, "support capture layer %d: expected 0..%d (target block_count %d)", L,
                            c->n_layer - 1, c->n_layer);
        if (i && L <= sc->capture_layers[i - 1])
            return ds4_fail(err, len, DS4_E_INVALID, "support capture layers must be strictly increasing (%d after %d)", L,
                            sc->capture_layers[i - 1]);
    }
    return DS4_OK;
}


/* The target's tensors: the embedding, the head and every layer. */
int ds4_bind_target(ds4_engine *e, const ds4_model_config *cfg, const ds4_tensor_desc *tensors, int32_t n, char *err,
                    size_t len) {
    binder b = {e, tensors, n, err, len};
    for (int i = 0; i < DS4_N_GLOBAL_TENSORS; i++) {
        int64_t ne[3];
        ds4_global_tensor_ne(&e->c, i, ne);
        TRY(bind_row(&b, &ds4_global_tensors[i], ds4_global_tensors[i].name, ne, e));
    }
    for (int L = 0; L < cfg->n_layer; L++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "blk.%d.", L);
        float clamp = cfg->swiglu_clamp[L], clamp_sh = cfg->swiglu_clamp_shexp ? cfg->swiglu_clamp_shexp[L] : clamp;
        TRY(bind_block(&b, &e->layers[L], prefix, cfg->compress_ratios[L], L < cfg->n_hash_layer, clamp, clamp_sh));
    }
    return DS4_OK;
}

int ds4_bind_support(ds4_engine *e, const ds4_support_config *sc, const ds4_tensor_desc *tensors, int32_t n,
                     ds4_support *sup, char *err, size_t len) {
    binder b = {e, tensors, n, err, len};
    return bind_support_tensors(&b, sc, sup);
}

void ds4_engine_free_vectors(ds4_engine *e) {
    for (int i = 0; i < e->n_alloc; i++) free(e->allocs[i]);
    free(e->allocs);
    e->allocs = NULL;
    e->n_alloc = 0;
}
