/* engine.c — the public C API: type sizes, kernels for tests, engine open (tensor binding and
 * checks), sessions (KV cache, eval, decode step, truncate, cancel), sampling, stats, memory. */
#include "ds4_engine.h"
#include "internal.h"
#include "cpu/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DS4_NATIVE_VERSION "0.2.0"

const char *ds4_version(void) { return "ds4tui-native " DS4_NATIVE_VERSION " (cpu)"; }

int ds4_fail(char *err, size_t len, int code, const char *fmt, ...) {
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return code;
}

double ds4_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int64_t ds4_block_elems(int type) {
    switch (type) {
    case DS4_TYPE_F32: case DS4_TYPE_F16: case DS4_TYPE_BF16: case DS4_TYPE_I32: return 1;
    case DS4_TYPE_Q8_0: return 32;
    case DS4_TYPE_Q2_K: case DS4_TYPE_IQ2_XXS: return 256;
    default: return 0;
    }
}

static size_t block_bytes(int type) {
    switch (type) {
    case DS4_TYPE_F32: case DS4_TYPE_I32: return 4;
    case DS4_TYPE_F16: case DS4_TYPE_BF16: return 2;
    case DS4_TYPE_Q8_0: return 34;
    case DS4_TYPE_Q2_K: return 84;
    case DS4_TYPE_IQ2_XXS: return 66;
    default: return 0;
    }
}

size_t ds4_row_bytes(int type, int64_t n) {
    int64_t be = ds4_block_elems(type);
    if (be == 0 || n < 0 || n % be != 0) return 0;
    return (size_t)(n / be) * block_bytes(type);
}

size_t ds4_type_row_bytes(int type, int64_t n) { return ds4_row_bytes(type, n); }

static const char *type_name(int type) {
    switch (type) {
    case DS4_TYPE_F32: return "F32";
    case DS4_TYPE_F16: return "F16";
    case DS4_TYPE_BF16: return "BF16";
    case DS4_TYPE_Q8_0: return "Q8_0";
    case DS4_TYPE_Q2_K: return "Q2_K";
    case DS4_TYPE_IQ2_XXS: return "IQ2_XXS";
    case DS4_TYPE_I32: return "I32";
    default: return "unknown";
    }
}

int ds4_dequantize(int type, const void *src, float *dst, int64_t n, char *err, size_t err_len) {
    int64_t be = ds4_block_elems(type);
    if (be == 0 || type == DS4_TYPE_I32)
        return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "ds4_dequantize: unsupported GGML type %d", type);
    if (n < 0 || n % be != 0)
        return ds4_fail(err, err_len, DS4_E_INVALID,
                    "ds4_dequantize: n=%lld is not a multiple of the block size %lld of GGML type %s",
                    (long long)n, (long long)be, type_name(type));
    if (n > 0 && (!src || !dst)) return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_dequantize: NULL buffer");
    switch (type) {
    case DS4_TYPE_F32: ds4_cpu_dequant_f32(src, dst, n); break;
    case DS4_TYPE_F16: ds4_cpu_dequant_f16(src, dst, n); break;
    case DS4_TYPE_BF16: ds4_cpu_dequant_bf16(src, dst, n); break;
    case DS4_TYPE_Q8_0: ds4_cpu_dequant_q8_0(src, dst, n); break;
    case DS4_TYPE_Q2_K: ds4_cpu_dequant_q2_k(src, dst, n); break;
    case DS4_TYPE_IQ2_XXS: ds4_cpu_dequant_iq2_xxs(src, dst, n); break;
    }
    return DS4_OK;
}

static int matmul_type_ok(int type) {
    return type == DS4_TYPE_F32 || type == DS4_TYPE_F16 || type == DS4_TYPE_BF16 || type == DS4_TYPE_Q8_0 ||
           type == DS4_TYPE_Q2_K || type == DS4_TYPE_IQ2_XXS;
}

int ds4_kernel_matmul(int type, const void *W, int64_t rows, int64_t cols, const float *X, int64_t n_tok, float *Y,
                      int n_threads, char *err, size_t err_len) {
    if (!matmul_type_ok(type)) return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "matmul: unsupported GGML type %d", type);
    if (n_threads < 0 || n_threads > DS4_MAX_THREADS)
        return ds4_fail(err, err_len, DS4_E_INVALID, "matmul: n_threads must be 0 .. %d, got %d", DS4_MAX_THREADS, n_threads);
    if (rows < 0 || n_tok < 0 || cols <= 0 || ds4_row_bytes(type, cols) == 0)
        return ds4_fail(err, err_len, DS4_E_INVALID, "matmul: cols=%lld must be a positive multiple of %s's block size %lld",
                    (long long)cols, type_name(type), (long long)ds4_block_elems(type));
    if ((rows && n_tok) && (!W || !X || !Y)) return ds4_fail(err, err_len, DS4_E_INVALID, "matmul: NULL buffer");
    int perr = 0;
    ds4_pool *pool = ds4_pool_create(n_threads, &perr);
    if (!pool) return ds4_fail(err, err_len, DS4_E_NOMEM, "matmul: cannot start %d threads: %s", n_threads, strerror(perr));
    ds4_cpu_matmul(pool, type, W, rows, cols, X, cols, n_tok, Y, rows);
    ds4_pool_destroy(pool);
    return DS4_OK;
}

typedef struct { char *dst; const char *src; size_t bytes; } copy_task;

static void copy_slice(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const copy_task *t = ctx;
    size_t per = t->bytes / 64;
    size_t lo = per * (size_t)b, hi = e == 64 ? t->bytes : per * (size_t)e;
    memcpy(t->dst + lo, t->src + lo, hi - lo);
}

double ds4_memcpy_bandwidth(size_t bytes, int reps, int n_threads) {
    if (bytes < 64 || reps < 1 || n_threads < 0 || n_threads > DS4_MAX_THREADS) return DS4_E_INVALID;
    char *a = malloc(bytes), *b = malloc(bytes);
    ds4_pool *pool = ds4_pool_create(n_threads, NULL);
    if (!a || !b || !pool) {
        free(a); free(b); ds4_pool_destroy(pool);
        return DS4_E_NOMEM;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 0.0;
    for (int r = 0; r < reps + 1; r++) {
        copy_task t = {r % 2 ? a : b, r % 2 ? b : a, bytes};
        double t0 = ds4_now_ms();
        ds4_pool_run(pool, copy_slice, &t, 64);
        double ms = ds4_now_ms() - t0;
        double gbs = (double)bytes / (ms * 1e-3) / 1e9;
        if (r > 0 && gbs > best) best = gbs; /* the first copy faults the pages in */
    }
    free(a); free(b);
    ds4_pool_destroy(pool);
    return best;
}

/* ---- engine: binding the tensor table ---------------------------------------------------- */

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
    if (!matmul_type_ok(t->type))
        return ds4_fail(b->err, b->len, DS4_E_UNSUPPORTED,
                    "tensor '%s': GGML type %s (%d) has no CPU kernel (expected F32, F16, BF16, Q8_0, Q2_K or IQ2_XXS)",
                    name, type_name(t->type), t->type);
    if ((rc = check_dims(b, t, cols, rows, n_mat)) != DS4_OK) return rc;
    size_t rb = ds4_row_bytes(t->type, cols);
    if (rb == 0)
        return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': %lld columns is not a multiple of %s's block size",
                    name, (long long)cols, type_name(t->type));
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
    if (t->type != DS4_TYPE_F32 && t->type != DS4_TYPE_F16 && t->type != DS4_TYPE_BF16)
        return ds4_fail(b->err, b->len, DS4_E_UNSUPPORTED, "tensor '%s': wrong type: expected F32, F16 or BF16, found %s",
                    name, type_name(t->type));
    if ((rc = check_dims(b, t, ne0, ne1, 1)) != DS4_OK) return rc;
    int64_t n = ne0 * ne1;
    if (t->nbytes < ds4_row_bytes(t->type, n))
        return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': %llu bytes, expected %llu", name,
                    (unsigned long long)t->nbytes, (unsigned long long)ds4_row_bytes(t->type, n));
    float *v = engine_alloc(b->e, (size_t)n);
    if (!v) return ds4_fail(b->err, b->len, DS4_E_NOMEM, "out of memory binding '%s'", name);
    ds4_dequantize(t->type, t->data, v, n, NULL, 0);
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

/* One block (target layer `blk.L.` or drafter stage `mtp.S.`) with names `prefix<suffix>`. */
static int bind_block(binder *b, ds4_layer *l, const char *prefix, int ratio, int hashed, float clamp, float clamp_sh) {
    ds4_engine *e = b->e;
    const ds4_cfg *c = &e->c;
    char nm[160];
#define N(suffix) (snprintf(nm, sizeof nm, "%s%s", prefix, suffix), nm)
    const int64_t H = c->n_embd, HC = c->hc_count, mix = 2 * HC + HC * HC, D = c->head_dim, NH = c->n_head;
    const int64_t G = c->o_groups, R = c->o_lora_rank, QL = c->q_lora_rank, E = c->n_expert, F = c->n_ff_exp;
    l->ratio = ratio;
    l->kind = l->ratio == 0 ? DS4_SWA : (l->ratio == 4 ? DS4_CSA : DS4_HCA);
    l->hashed = hashed;
    l->clamp = clamp;
    l->clamp_shexp = clamp_sh;
    TRY(bind_mat(b, N("hc_attn_fn.weight"), HC * H, mix, 1, &l->hc_attn_fn));
    TRY(bind_vec(b, N("hc_attn_base.weight"), mix, 1, &l->hc_attn_base));
    TRY(bind_vec(b, N("hc_attn_scale.weight"), 3, 1, &l->hc_attn_scale));
    TRY(bind_vec(b, N("attn_norm.weight"), H, 1, &l->attn_norm));
    TRY(bind_mat(b, N("attn_q_a.weight"), H, QL, 1, &l->q_a));
    TRY(bind_vec(b, N("attn_q_a_norm.weight"), QL, 1, &l->q_a_norm));
    TRY(bind_mat(b, N("attn_q_b.weight"), QL, NH * D, 1, &l->q_b));
    TRY(bind_mat(b, N("attn_kv.weight"), H, D, 1, &l->kv));
    TRY(bind_vec(b, N("attn_kv_a_norm.weight"), D, 1, &l->kv_norm));
    TRY(bind_vec(b, N("attn_sinks.weight"), NH, 1, &l->sinks));
    TRY(bind_mat(b, N("attn_output_a.weight"), NH / G * D, G * R, 1, &l->out_a));
    TRY(bind_mat(b, N("attn_output_b.weight"), G * R, H, 1, &l->out_b));
    if (l->kind != DS4_SWA) {
        int64_t cw = (l->kind == DS4_CSA ? 2 : 1) * D;
        TRY(bind_mat(b, N("attn_compressor_kv.weight"), H, cw, 1, &l->comp_kv));
        TRY(bind_mat(b, N("attn_compressor_gate.weight"), H, cw, 1, &l->comp_gate));
        TRY(bind_vec(b, N("attn_compressor_ape.weight"), cw, l->ratio, &l->comp_ape));
        TRY(bind_vec(b, N("attn_compressor_norm.weight"), D, 1, &l->comp_norm));
    }
    if (l->kind == DS4_CSA) {
        const int64_t IH = c->indexer_n_head, ID = c->indexer_head_dim;
        TRY(bind_mat(b, N("indexer.attn_q_b.weight"), QL, IH * ID, 1, &l->idx_q_b));
        TRY(bind_mat(b, N("indexer.proj.weight"), H, IH, 1, &l->idx_proj));
        TRY(bind_mat(b, N("indexer_compressor_kv.weight"), H, 2 * ID, 1, &l->idx_comp_kv));
        TRY(bind_mat(b, N("indexer_compressor_gate.weight"), H, 2 * ID, 1, &l->idx_comp_gate));
        TRY(bind_vec(b, N("indexer_compressor_ape.weight"), 2 * ID, l->ratio, &l->idx_comp_ape));
        TRY(bind_vec(b, N("indexer_compressor_norm.weight"), ID, 1, &l->idx_comp_norm));
    }
    TRY(bind_mat(b, N("hc_ffn_fn.weight"), HC * H, mix, 1, &l->hc_ffn_fn));
    TRY(bind_vec(b, N("hc_ffn_base.weight"), mix, 1, &l->hc_ffn_base));
    TRY(bind_vec(b, N("hc_ffn_scale.weight"), 3, 1, &l->hc_ffn_scale));
    TRY(bind_vec(b, N("ffn_norm.weight"), H, 1, &l->ffn_norm));
    TRY(bind_mat(b, N("ffn_gate_inp.weight"), H, E, 1, &l->gate_inp));
    if (l->hashed) {
        int rc = DS4_OK;
        const ds4_tensor_desc *t = lookup(b, N("ffn_gate_tid2eid.weight"), &rc);
        if (!t) return rc;
        if (t->type != DS4_TYPE_I32)
            return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': wrong type: expected I32, found %s", nm,
                        type_name(t->type));
        TRY(check_dims(b, t, c->n_expert_used, c->n_vocab, 1));
        l->tid2eid = t->data;
        for (int64_t i = 0; i < (int64_t)c->n_vocab * c->n_expert_used; i++)
            if (l->tid2eid[i] < 0 || l->tid2eid[i] >= c->n_expert)
                return ds4_fail(b->err, b->len, DS4_E_INVALID, "tensor '%s': expert id %d at token %lld outside 0..%d", nm,
                            l->tid2eid[i], (long long)(i / c->n_expert_used), c->n_expert - 1);
        e->weight_bytes += t->nbytes;
    } else {
        TRY(bind_vec(b, N("exp_probs_b.bias"), E, 1, &l->exp_bias));
    }
    TRY(bind_mat(b, N("ffn_gate_exps.weight"), H, F, E, &l->gate_exps));
    TRY(bind_mat(b, N("ffn_up_exps.weight"), H, F, E, &l->up_exps));
    TRY(bind_mat(b, N("ffn_down_exps.weight"), F, H, E, &l->down_exps));
    {
        int rc = DS4_OK;
        const ds4_tensor_desc *t = lookup(b, N("ffn_gate_shexp.weight"), &rc);
        if (!t) return rc;
        int64_t FS = t->n_dims >= 2 ? t->ne[1] : 0;
        TRY(bind_mat(b, N("ffn_gate_shexp.weight"), H, FS, 1, &l->gate_sh));
        TRY(bind_mat(b, N("ffn_up_shexp.weight"), H, FS, 1, &l->up_sh));
        TRY(bind_mat(b, N("ffn_down_shexp.weight"), FS, H, 1, &l->down_sh));
    }
#undef N
    return DS4_OK;
}

static int check_config(const ds4_model_config *c, char *err, size_t len) {
#define POS(f) if (c->f <= 0) return ds4_fail(err, len, DS4_E_INVALID, "model config: " #f " must be positive, found %lld", (long long)c->f)
    POS(n_layer); POS(n_embd); POS(n_vocab); POS(n_head); POS(head_dim); POS(n_rot); POS(q_lora_rank);
    POS(o_lora_rank); POS(o_groups); POS(n_expert); POS(n_expert_used); POS(n_ff_exp); POS(sliding_window);
    POS(indexer_n_head); POS(indexer_head_dim); POS(indexer_top_k); POS(hc_count); POS(hc_sinkhorn_iters);
    POS(context_length);
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

/* Free the engine (after its last session: a session's device state is freed through the engine's
 * GPU context, and a garbage collector may free sessions after their engine was closed). */
static void engine_destroy(ds4_engine *e) {
    ds4_gpu_engine_close(e);
    ds4_dspark_free_support(e);
    ds4_pool_destroy(e->pool);
    for (int i = 0; i < e->n_alloc; i++) free(e->allocs[i]);
    free(e->allocs);
    free(e->layers);
    free(e->freq_main);
    free(e->freq_comp);
    pthread_mutex_destroy(&e->life);
    free(e);
}

void ds4_engine_close(ds4_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->life);
    e->closing = 1;
    int last = e->n_sessions == 0;
    pthread_mutex_unlock(&e->life);
    if (last) engine_destroy(e);
}

/* A session is made (+1) or freed (-1); the closed engine goes with its last session. */
static void engine_sessions(ds4_engine *e, int delta) {
    pthread_mutex_lock(&e->life);
    e->n_sessions += delta;
    int last = e->closing && e->n_sessions == 0;
    pthread_mutex_unlock(&e->life);
    if (last) engine_destroy(e);
}

int ds4_engine_open(const ds4_model_config *cfg, const ds4_tensor_desc *tensors, int32_t n_tensors,
                    const ds4_engine_options *opt, ds4_engine **out, char *err, size_t err_len) {
    if (!out) return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_engine_open: out is NULL");
    *out = NULL;
    if (!cfg || !tensors || n_tensors <= 0) return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_engine_open: empty descriptor");
    ds4_engine_options o = opt ? *opt : (ds4_engine_options){.backend = DS4_BACKEND_CPU, .numerics = DS4_NUMERICS_DS4};
    if (o.backend != DS4_BACKEND_CPU && o.backend != DS4_BACKEND_HIP)
        return ds4_fail(err, err_len, DS4_E_INVALID, "backend %d: expected %d (cpu) or %d (hip)", o.backend,
                        DS4_BACKEND_CPU, DS4_BACKEND_HIP);
    if (o.numerics != DS4_NUMERICS_DS4 && o.numerics != DS4_NUMERICS_TRANSFORMERS)
        return ds4_fail(err, err_len, DS4_E_INVALID, "numerics %d: expected 0 (ds4) or 1 (transformers)", o.numerics);
    if (o.n_threads < 0 || o.n_threads > DS4_MAX_THREADS)
        return ds4_fail(err, err_len, DS4_E_INVALID, "n_threads must be 0 (one per core) .. %d, got %d", DS4_MAX_THREADS,
                    o.n_threads);
    int rc = check_config(cfg, err, err_len);
    if (rc != DS4_OK) return rc;
    ds4_engine *e = calloc(1, sizeof *e);
    if (!e) return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory");
    pthread_mutex_init(&e->life, NULL);
    e->c = (ds4_cfg){cfg->n_layer, cfg->n_embd, cfg->n_vocab, cfg->n_head, cfg->head_dim, cfg->n_rot,
                     cfg->q_lora_rank, cfg->o_lora_rank, cfg->o_groups, cfg->n_expert, cfg->n_expert_used,
                     cfg->n_ff_exp, cfg->n_hash_layer, cfg->expert_weights_norm, cfg->sliding_window,
                     cfg->indexer_n_head, cfg->indexer_head_dim, cfg->indexer_top_k, cfg->hc_count,
                     cfg->hc_sinkhorn_iters, cfg->expert_weights_scale, cfg->rms_eps, cfg->hc_eps,
                     cfg->context_length};
    e->numerics = o.numerics;
    e->layers = calloc((size_t)cfg->n_layer, sizeof *e->layers);
    e->freq_main = ds4_rope_freqs(cfg->n_rot, cfg->rope_freq_base, 0, 1, 1, 1, 1);
    int yarn = cfg->rope_yarn && cfg->rope_scaling_factor != 1.0f;
    e->freq_comp = ds4_rope_freqs(cfg->n_rot, cfg->compress_rope_freq_base, yarn, cfg->rope_scaling_factor,
                                  (double)cfg->rope_orig_ctx, cfg->yarn_beta_fast, cfg->yarn_beta_slow);
    int perr = 0;
    e->pool = ds4_pool_create(o.n_threads, &perr);
    if (!e->pool) {
        engine_destroy(e);
        return ds4_fail(err, err_len, DS4_E_NOMEM, "cannot start %d threads: %s", o.n_threads, strerror(perr));
    }
    if (!e->layers || !e->freq_main || !e->freq_comp) {
        engine_destroy(e);
        return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory");
    }
    e->n_threads = ds4_pool_size(e->pool);
    binder b = {e, tensors, n_tensors, err, err_len};
    const int64_t H = cfg->n_embd, HC = cfg->hc_count;
    rc = bind_mat(&b, "token_embd.weight", H, cfg->n_vocab, 1, &e->token_embd);
    if (rc == DS4_OK) rc = bind_mat(&b, "output.weight", H, cfg->n_vocab, 1, &e->output);
    if (rc == DS4_OK) rc = bind_mat(&b, "output_hc_fn.weight", HC * H, HC, 1, &e->output_hc_fn);
    if (rc == DS4_OK) rc = bind_vec(&b, "output_hc_base.weight", HC, 1, &e->output_hc_base);
    if (rc == DS4_OK) rc = bind_vec(&b, "output_hc_scale.weight", 1, 1, &e->output_hc_scale);
    if (rc == DS4_OK) rc = bind_vec(&b, "output_norm.weight", H, 1, &e->output_norm);
    for (int L = 0; rc == DS4_OK && L < cfg->n_layer; L++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "blk.%d.", L);
        float clamp = cfg->swiglu_clamp[L], clamp_sh = cfg->swiglu_clamp_shexp ? cfg->swiglu_clamp_shexp[L] : clamp;
        rc = bind_block(&b, &e->layers[L], prefix, cfg->compress_ratios[L], L < cfg->n_hash_layer, clamp, clamp_sh);
    }
    e->backend = o.backend;
    if (rc == DS4_OK && o.backend == DS4_BACKEND_HIP) rc = ds4_gpu_engine_open(e, &o, err, err_len);
    if (rc == DS4_OK) {
        e->sup_clamp = cfg->swiglu_clamp[cfg->n_layer - 1];
        e->sup_clamp_sh = cfg->swiglu_clamp_shexp ? cfg->swiglu_clamp_shexp[cfg->n_layer - 1] : e->sup_clamp;
    }
    if (rc != DS4_OK) {
        engine_destroy(e);
        return rc;
    }
    *out = e;
    return DS4_OK;
}

/* ---- DSpark support model (spec dspark.md §4.2; dflash names are mapped by the caller) ------ */

static int bind_support(binder *b, const ds4_support_config *sc, ds4_support *sup) {
    ds4_engine *e = b->e;
    const ds4_cfg *c = &e->c;
    const int64_t H = c->n_embd, HC = c->hc_count;
    char nm[160];
    for (int st = 0; st < sc->n_stages; st++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "mtp.%d.", st);
        TRY(bind_block(b, &sup->stages[st], prefix, 0, 0, e->sup_clamp, e->sup_clamp_sh));
    }
    const int last = sc->n_stages - 1;
#define M(suffix) (snprintf(nm, sizeof nm, "mtp.%d.%s", last, suffix), nm)
    TRY(bind_mat(b, "mtp.0.main_proj.weight", (int64_t)sc->n_capture * H, H, 1, &sup->main_proj));
    TRY(bind_vec(b, "mtp.0.main_norm.weight", H, 1, &sup->main_norm));
    TRY(bind_vec(b, M("norm.weight"), H, 1, &sup->norm));
    TRY(bind_mat(b, M("hc_head_fn.weight"), HC * H, HC, 1, &sup->hc_head_fn));
    TRY(bind_vec(b, M("hc_head_base.weight"), HC, 1, &sup->hc_head_base));
    TRY(bind_vec(b, M("hc_head_scale.weight"), 1, 1, &sup->hc_head_scale));
    TRY(bind_mat(b, M("markov_head.markov_w1.weight"), sc->markov_rank, c->n_vocab, 1, &sup->markov_w1));
    TRY(bind_mat(b, M("markov_head.markov_w2.weight"), sc->markov_rank, c->n_vocab, 1, &sup->markov_w2));
    TRY(bind_mat(b, M("confidence_head.proj.weight"), H + sc->markov_rank, 1, 1, &sup->conf));
#undef M
    return DS4_OK;
}

static int check_support_config(const ds4_engine *e, const ds4_support_config *sc, char *err, size_t len) {
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

void ds4_engine_refuse_support(ds4_engine *e, const char *why) {
    if (!e) return;
    ds4_dspark_free_support(e);
    e->sup_refused = 1;
    snprintf(e->sup_msg, sizeof e->sup_msg, "%s", why ? why : "support model refused");
}

int ds4_engine_attach_support(ds4_engine *e, const ds4_support_config *cfg, const ds4_tensor_desc *tensors,
                              int32_t n_tensors, char *err, size_t err_len) {
    if (!e) return ds4_fail(err, err_len, DS4_E_INVALID, "no engine");
    char msg[1024] = "";
    int rc = check_support_config(e, cfg, msg, sizeof msg);
    if (rc == DS4_OK && (!tensors || n_tensors <= 0))
        rc = ds4_fail(msg, sizeof msg, DS4_E_INVALID, "support model: empty tensor table");
    ds4_support *sup = NULL;
    uint64_t wb = e->weight_bytes, xb = e->expanded_bytes;
    if (rc == DS4_OK) {
        sup = calloc(1, sizeof *sup);
        if (sup) {
            sup->stages = calloc((size_t)cfg->n_stages, sizeof *sup->stages);
            sup->capture_slot = malloc((size_t)e->c.n_layer * sizeof *sup->capture_slot);
        }
        if (!sup || !sup->stages || !sup->capture_slot) rc = ds4_fail(msg, sizeof msg, DS4_E_NOMEM, "out of memory");
    }
    if (rc == DS4_OK) {
        binder b = {e, tensors, n_tensors, msg, sizeof msg};
        rc = bind_support(&b, cfg, sup);
    }
    if (rc != DS4_OK) {
        if (sup) { free(sup->stages); free(sup->capture_slot); free(sup); }
        e->weight_bytes = wb;
        e->expanded_bytes = xb;
        ds4_engine_refuse_support(e, msg);
        return ds4_fail(err, err_len, rc, "%s", msg);
    }
    sup->n_stages = cfg->n_stages;
    sup->block = cfg->block_size;
    sup->rank = cfg->markov_rank;
    sup->noise = cfg->noise_token;
    sup->n_capture = cfg->n_capture;
    for (int L = 0; L < e->c.n_layer; L++) sup->capture_slot[L] = -1;
    for (int i = 0; i < cfg->n_capture; i++) {
        sup->capture[i] = cfg->capture_layers[i];
        sup->capture_slot[cfg->capture_layers[i]] = i;
    }
    ds4_dspark_free_support(e);
    e->sup = sup;
    e->sup_refused = 0;
    e->sup_msg[0] = 0;
    rc = ds4_gpu_upload_support(e, msg, sizeof msg);
    if (rc != DS4_OK) {
        e->weight_bytes = wb;
        e->expanded_bytes = xb;
        ds4_engine_refuse_support(e, msg);
        return ds4_fail(err, err_len, rc, "%s", msg);
    }
    return DS4_OK;
}

int ds4_engine_support_status(const ds4_engine *e, char *msg, size_t len) {
    if (!e) return 0;
    if (msg && len) snprintf(msg, len, "%s", e->sup_msg);
    return e->sup ? 1 : (e->sup_refused ? -1 : 0);
}

int ds4_engine_memory(const ds4_engine *e, ds4_memory *out) {
    if (!e || !out) return DS4_E_INVALID;
    memset(out, 0, sizeof *out);
    out->weights = e->weight_bytes;
    out->scratch = e->expanded_bytes;
    out->device = ds4_gpu_allocated(e);
    return DS4_OK;
}

int32_t ds4_engine_n_threads(const ds4_engine *e) { return e ? e->n_threads : 0; }

/* ---- sessions ------------------------------------------------------------------------------- */

void ds4_session_free(ds4_session *s) {
    if (!s) return;
    if (s->lc) {
        for (int L = 0; L < s->n_layer; L++) {
            ds4_layer_cache *lc = &s->lc[L];
            free(lc->kv); free(lc->cmp_c); free(lc->cmp_z); free(lc->comp);
            free(lc->idx_c); free(lc->idx_z); free(lc->idx_keys);
        }
    }
    free(s->lc);
    ds4_gpu_session_free(s);
    ds4_dspark_session_free(s);
    ds4_scratch *sc = &s->sc;
    void *bufs[] = {sc->X, sc->X3, sc->X2, sc->hcm, sc->post, sc->comb, sc->x, sc->xn, sc->qr, sc->q, sc->kvr,
                    sc->att, sc->u, sc->y, sc->cbuf, sc->zbuf, sc->qi, sc->iw, sc->sel_comp, sc->nsel_comp,
                    sc->scores, sc->sel, sc->wsel, sc->xe, sc->ge, sc->he, sc->oe, sc->erows, sc->eslot,
                    sc->moe_y, sc->lm, sc->att_tmp, sc->iscore, s->logits, s->sample_buf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    ds4_engine *e = s->e;
    free(s);
    engine_sessions(e, -1);
}

static void *take(size_t bytes, uint64_t *count, int *ok) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) *ok = 0;
    *count += bytes;
    return p;
}

int ds4_session_create(ds4_engine *e, int32_t n_ctx, int32_t n_batch, const ds4_dspark_knobs *dspark, ds4_session **out,
                       char *err, size_t err_len) {
    if (!out) return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_session_create: out is NULL");
    *out = NULL;
    if (!e) return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_session_create: no engine");
    const ds4_cfg *c = &e->c;
    if (n_ctx < 1 || n_ctx > c->context_length)
        return ds4_fail(err, err_len, DS4_E_INVALID, "context size %d outside 1..%lld (the model's context length)", n_ctx,
                    (long long)c->context_length);
    if (n_batch < 1) return ds4_fail(err, err_len, DS4_E_INVALID, "batch size must be >= 1, got %d", n_batch);
    if (n_batch > n_ctx) n_batch = n_ctx;
    ds4_session *s = calloc(1, sizeof *s);
    if (!s) return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory");
    s->e = e;
    engine_sessions(e, +1);
    s->n_layer = c->n_layer;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->pending = -1;
    s->sampling = (ds4_sampling){0.0f, 0, 1.0f, 0.0f, 0};
    int64_t B = (int64_t)n_batch + 1;
    if (e->sup && B < e->sup->block) B = e->sup->block; /* the drafter's block runs in the same scratch */
    int max_ratio = 0, min_ratio = 0;
    for (int L = 0; L < c->n_layer; L++) {
        int r = e->layers[L].ratio;
        if (r > max_ratio) max_ratio = r;
        if (r && (!min_ratio || r < min_ratio)) min_ratio = r;
    }
    s->kv_cap = (int32_t)(c->sliding_window + B);
    s->cmp_cap = (int32_t)(2 * max_ratio + B);
    const int64_t H = c->n_embd, HC = c->hc_count, D = c->head_dim, NH = c->n_head, ID = c->indexer_head_dim;
    const int64_t IH = c->indexer_n_head, K = c->n_expert_used, E = c->n_expert;
    int ok = 1;
    s->lc = calloc((size_t)c->n_layer, sizeof *s->lc);
    if (!s->lc) ok = 0;
    int64_t FS = 0;
    for (int L = 0; ok && L < c->n_layer; L++) {
        const ds4_layer *l = &e->layers[L];
        ds4_layer_cache *lc = &s->lc[L];
        if (l->gate_sh.rows > FS) FS = l->gate_sh.rows;
        if (e->gpu_ctx) continue; /* the caches live in device memory (ds4_gpu_session_init) */
        lc->kv = take((size_t)s->kv_cap * D * sizeof(float), &s->kv_bytes, &ok);
        if (l->kind == DS4_SWA) continue;
        int64_t cw = (l->kind == DS4_CSA ? 2 : 1) * D, n_rows = n_ctx / l->ratio + 1;
        lc->cmp_c = take((size_t)s->cmp_cap * cw * sizeof(float), &s->cmp_bytes, &ok);
        lc->cmp_z = take((size_t)s->cmp_cap * cw * sizeof(float), &s->cmp_bytes, &ok);
        lc->comp = take((size_t)n_rows * D * sizeof(float), &s->cmp_bytes, &ok);
        if (l->kind == DS4_CSA) {
            lc->idx_c = take((size_t)s->cmp_cap * 2 * ID * sizeof(float), &s->cmp_bytes, &ok);
            lc->idx_z = take((size_t)s->cmp_cap * 2 * ID * sizeof(float), &s->cmp_bytes, &ok);
            lc->idx_keys = take((size_t)n_rows * ID * sizeof(float), &s->cmp_bytes, &ok);
        }
    }
    const int64_t F = c->n_ff_exp > FS ? c->n_ff_exp : FS;
    const int64_t mix = 2 * HC + HC * HC, cwmax = 2 * (D > ID ? D : ID);
    const int64_t n_comp = min_ratio ? n_ctx / min_ratio + 1 : 1;
    int64_t keys_cap = c->sliding_window + (n_comp > DS4_DSPARK_MAX_BLOCK ? n_comp : DS4_DSPARK_MAX_BLOCK);
    keys_cap += keys_cap & 1;
    const int nt = e->n_threads;
    ds4_scratch *sc = &s->sc;
    uint64_t *sb = &s->scratch_bytes;
#define F32S(n) take((size_t)(n) * sizeof(float), sb, &ok)
#define I32S(n) take((size_t)(n) * sizeof(int32_t), sb, &ok)
    sc->X = F32S(B * HC * H); sc->X3 = F32S(B * HC * H); sc->X2 = F32S(B * HC * H);
    sc->hcm = F32S(B * mix); sc->post = F32S(B * HC); sc->comb = F32S(B * HC * HC);
    sc->x = F32S(B * H); sc->xn = F32S(B * H); sc->qr = F32S(B * c->q_lora_rank); sc->q = F32S(B * NH * D);
    sc->kvr = F32S(B * D); sc->att = F32S(B * NH * D); sc->u = F32S(B * c->o_groups * c->o_lora_rank);
    sc->y = F32S(B * H); sc->cbuf = F32S(B * cwmax); sc->zbuf = F32S(B * cwmax);
    sc->qi = F32S(B * IH * ID); sc->iw = F32S(B * IH); sc->sel_comp = I32S(B * c->indexer_top_k);
    sc->nsel_comp = I32S(B); sc->scores = F32S(B * E); sc->sel = I32S(B * K); sc->wsel = F32S(B * K);
    sc->xe = F32S(B * H); sc->ge = F32S(B * F); sc->he = F32S(B * F); sc->oe = F32S(B * H);
    sc->erows = I32S(B); sc->eslot = I32S(B); sc->moe_y = F32S(B * H); sc->lm = F32S(B * H);
    sc->att_tmp_stride = 4 * keys_cap;
    sc->att_tmp = F32S(nt * sc->att_tmp_stride);
    sc->isel_stride = 2 * n_comp;
    sc->iscore = F32S(nt * sc->isel_stride);
    s->logits = F32S(c->n_vocab);
    s->sample_buf = take((size_t)c->n_vocab * 16, sb, &ok);
#undef F32S
#undef I32S
    if (!ok) {
        ds4_session_free(s);
        return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory allocating a session of %d tokens", n_ctx);
    }
    atomic_init(&s->cancel, 0);
    if (e->gpu_ctx) {
        int rc = ds4_gpu_session_init(s, &s->kv_bytes, &s->cmp_bytes, &s->scratch_bytes, err, err_len);
        if (rc != DS4_OK) {
            ds4_session_free(s);
            return rc;
        }
    }
    if (e->sup || e->sup_refused) {
        int rc = ds4_dspark_session_init(s, dspark, err, err_len);
        if (rc != DS4_OK) {
            ds4_session_free(s);
            return rc;
        }
    }
    *out = s;
    return DS4_OK;
}

int32_t ds4_session_n_tokens(const ds4_session *s) { return s ? s->n_tokens : 0; }
int32_t ds4_session_n_ctx(const ds4_session *s) { return s ? s->n_ctx : 0; }
int32_t ds4_session_pending(const ds4_session *s) { return s ? s->pending : -1; }
void ds4_session_cancel(ds4_session *s) { if (s) atomic_store(&s->cancel, 1); }
void ds4_session_clear_cancel(ds4_session *s) { if (s) atomic_store(&s->cancel, 0); }

/* First non-finite logit of rows[0..n), or -1. */
static int64_t first_nonfinite(const float *rows, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(rows[i])) return i;
    return -1;
}

/* Run seq[0..n) (n <= n_batch + 1) as one pass; on failure the session is unchanged. */
int ds4_run_pass(ds4_session *s, const int32_t *seq, int32_t n, int mode, float *logits, int64_t n_logit_rows,
                    char *err, size_t err_len) {
    int rc = s->gs ? ds4_gpu_forward(s, seq, n, mode, logits) : ds4_forward(s, seq, n, mode, logits);
    if (s->e->gpu_ctx) {
        int grc = ds4_gpu_check(s->e, err, err_len);
        if (grc != DS4_OK) return grc;
    }
    if (rc == DS4_E_CANCELLED) {
        atomic_store(&s->cancel, 0);
        s->stats.n_cancelled++;
        return ds4_fail(err, err_len, rc, "cancelled");
    }
    if (rc != DS4_OK) return ds4_fail(err, err_len, rc, "forward pass failed (%d)", rc);
    if (mode != DS4_LOGITS_NONE) {
        int64_t bad = first_nonfinite(logits, n_logit_rows * s->e->c.n_vocab);
        if (bad >= 0) {
            int64_t row = bad / s->e->c.n_vocab;
            int64_t pos = s->n_tokens + (mode == DS4_LOGITS_ALL ? row : n - 1);
            return ds4_fail(err, err_len, DS4_E_NONFINITE,
                        "non-finite logit (token id %lld) at position %lld: the model has NaN/Inf weights or "
                        "overflows (check the file with `ds4tui inspect --check-finite`)",
                        (long long)(bad % s->e->c.n_vocab), (long long)pos);
        }
    }
    if (s->dsp && s->e->sup) ds4_dspark_captured(s, s->n_tokens, n);
    s->n_tokens += n;
    s->stats.n_target_evals++;
    return DS4_OK;
}

int ds4_session_eval(ds4_session *s, const int32_t *tokens, int32_t n, int32_t logits_mode, float *logits, char *err,
                     size_t err_len) {
    if (!s) return ds4_fail(err, err_len, DS4_E_INVALID, "no session");
    const ds4_cfg *c = &s->e->c;
    if (logits_mode < DS4_LOGITS_NONE || logits_mode > DS4_LOGITS_ALL)
        return ds4_fail(err, err_len, DS4_E_INVALID, "logits mode %d: expected 0 (none), 1 (last) or 2 (all)", logits_mode);
    if (n < 0 || (n > 0 && !tokens)) return ds4_fail(err, err_len, DS4_E_INVALID, "bad token buffer (n = %d)", n);
    if (n > s->n_batch)
        return ds4_fail(err, err_len, DS4_E_INVALID, "%d tokens in one call exceed the batch size %d: split the input", n,
                    s->n_batch);
    if (logits_mode != DS4_LOGITS_NONE && !logits) return ds4_fail(err, err_len, DS4_E_INVALID, "logits buffer is NULL");
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return ds4_fail(err, err_len, DS4_E_TOKEN, "token id %d at index %d is outside the vocabulary 0..%d", tokens[i], i,
                        c->n_vocab - 1);
    int has_pending = s->pending >= 0;
    int32_t total = n + has_pending;
    if (total == 0) {
        if (logits_mode == DS4_LOGITS_NONE) return DS4_OK;
        return ds4_fail(err, err_len, DS4_E_INVALID, "no tokens to evaluate (empty prompt)");
    }
    if (n == 0 && logits_mode == DS4_LOGITS_ALL)
        return ds4_fail(err, err_len, DS4_E_INVALID, "no tokens to evaluate (empty prompt)");
    if ((int64_t)s->n_tokens + total > s->n_ctx)
        return ds4_fail(err, err_len, DS4_E_CONTEXT, "context overflow: %d tokens in the cache + %d new > context size %d",
                    s->n_tokens, total, s->n_ctx);
    const int32_t *seq = tokens;
    int32_t *owned = NULL;
    if (has_pending) { /* the emitted-but-unrun token goes first */
        owned = malloc((size_t)total * sizeof(int32_t));
        if (!owned) return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory");
        owned[0] = s->pending;
        if (n) memcpy(owned + 1, tokens, (size_t)n * sizeof(int32_t));
        seq = owned;
    }
    double t0 = ds4_now_ms();
    int rc;
    if (logits_mode == DS4_LOGITS_ALL && has_pending) {
        /* rows for tokens only: run the pass with all logits into a temporary and drop row 0 */
        float *tmp = malloc((size_t)total * c->n_vocab * sizeof(float));
        if (!tmp) { free(owned); return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory"); }
        rc = ds4_run_pass(s, seq, total, DS4_LOGITS_ALL, tmp, total, err, err_len);
        if (rc == DS4_OK) memcpy(logits, tmp + c->n_vocab, (size_t)n * c->n_vocab * sizeof(float));
        free(tmp);
    } else {
        float *dst = logits_mode == DS4_LOGITS_NONE ? NULL : logits;
        rc = ds4_run_pass(s, seq, total, logits_mode, dst, logits_mode == DS4_LOGITS_ALL ? total : 1, err, err_len);
    }
    free(owned);
    s->stats.prefill_ms += ds4_now_ms() - t0;
    if (rc != DS4_OK) return rc;
    s->stats.n_prefill_tokens += (uint64_t)total;
    s->pending = -1;
    s->has_logits = logits_mode != DS4_LOGITS_NONE;
    if (s->has_logits)
        memcpy(s->logits, logits + (logits_mode == DS4_LOGITS_ALL ? (size_t)(n - 1) * c->n_vocab : 0),
               (size_t)c->n_vocab * sizeof(float));
    return DS4_OK;
}

/* ---- sampling ------------------------------------------------------------------------------- */

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

int32_t ds4_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
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

int ds4_session_set_sampling(ds4_session *s, const ds4_sampling *p, char *err, size_t err_len) {
    if (!s || !p) return ds4_fail(err, err_len, DS4_E_INVALID, "no session or settings");
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return ds4_fail(err, err_len, DS4_E_INVALID, "temperature must be a finite number >= 0, got %g", (double)p->temperature);
    if (p->top_k < 0) return ds4_fail(err, err_len, DS4_E_INVALID, "top_k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return ds4_fail(err, err_len, DS4_E_INVALID, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return ds4_fail(err, err_len, DS4_E_INVALID, "min_p must be in [0, 1], got %g", (double)p->min_p);
    s->sampling = *p;
    s->rng = p->seed;
    return DS4_OK;
}

int ds4_session_get_sampling(const ds4_session *s, ds4_sampling *out) {
    if (!s || !out) return DS4_E_INVALID;
    *out = s->sampling;
    return DS4_OK;
}

int ds4_session_step(ds4_session *s, int32_t *out, int32_t max_out, int32_t *n_out, char *err, size_t err_len) {
    if (!s || !out || !n_out || max_out < 1) return ds4_fail(err, err_len, DS4_E_INVALID, "bad output buffer");
    *n_out = 0;
    if (s->dsp && s->pending >= 0) return ds4_dspark_step(s, out, max_out, n_out, err, err_len);
    double t0 = ds4_now_ms();
    if (s->pending >= 0) {
        if (s->n_tokens + 1 > s->n_ctx)
            return ds4_fail(err, err_len, DS4_E_CONTEXT, "context overflow: %d tokens in the cache + 1 new > context size %d",
                        s->n_tokens, s->n_ctx);
        int32_t tok = s->pending;
        int rc = ds4_run_pass(s, &tok, 1, DS4_LOGITS_LAST, s->logits, 1, err, err_len);
        if (rc != DS4_OK) {
            s->stats.decode_ms += ds4_now_ms() - t0;
            return rc;
        }
        s->pending = -1;
        s->has_logits = 1;
    }
    if (!s->has_logits) return ds4_fail(err, err_len, DS4_E_STATE, "no logits to sample from: evaluate a prompt first");
    double ts = ds4_now_ms();
    int32_t tok = ds4_sample(s, s->logits);
    double te = ds4_now_ms();
    s->stats.sample_ms += te - ts;
    s->pending = tok;
    out[0] = tok;
    *n_out = 1;
    s->stats.n_decode_tokens++;
    s->stats.n_steps++;
    s->stats.decode_ms += te - t0;
    return DS4_OK;
}

int ds4_session_truncate(ds4_session *s, int32_t n, char *err, size_t err_len) {
    if (!s) return ds4_fail(err, err_len, DS4_E_INVALID, "no session");
    if (n < 0 || n > s->n_tokens)
        return ds4_fail(err, err_len, DS4_E_INVALID, "cannot truncate a session of %d tokens to %d", s->n_tokens, n);
    if (n != 0 && s->n_tokens - n > s->n_batch)
        return ds4_fail(err, err_len, DS4_E_INVALID,
                    "cannot truncate %d tokens: at most %d (the batch size) can be taken back, or all of them",
                    s->n_tokens - n, s->n_batch);
    s->n_tokens = n;
    s->pending = -1;
    s->has_logits = 0;
    if (s->dsp) ds4_dspark_truncate(s, n);
    return DS4_OK;
}

int ds4_session_set_pending(ds4_session *s, int32_t token, char *err, size_t err_len) {
    if (!s) return ds4_fail(err, err_len, DS4_E_INVALID, "no session");
    if (token < 0 || token >= s->e->c.n_vocab)
        return ds4_fail(err, err_len, DS4_E_TOKEN, "token id %d is outside the vocabulary 0..%d", token,
                        s->e->c.n_vocab - 1);
    if (s->pending >= 0) return ds4_fail(err, err_len, DS4_E_STATE, "the session already has a pending token");
    s->pending = token;
    return DS4_OK;
}

int ds4_session_stats(const ds4_session *s, ds4_stats *out) {
    if (!s || !out) return DS4_E_INVALID;
    *out = s->stats;
    return DS4_OK;
}

void ds4_session_reset_stats(ds4_session *s) {
    if (!s) return;
    memset(&s->stats, 0, sizeof s->stats);
    if (s->dsp) ds4_dspark_reset_stats(s);
}

int ds4_session_memory(const ds4_session *s, ds4_memory *out) {
    if (!s || !out) return DS4_E_INVALID;
    ds4_engine_memory(s->e, out);
    out->kv = s->kv_bytes;
    out->compressor = s->cmp_bytes;
    out->scratch += s->scratch_bytes;
    return DS4_OK;
}
