/* engine.c — the public C API (ds4_engine.h) and nothing else: type sizes and the kernels for tests,
 * engines (open, support models, close), sessions (create, eval, decode step, truncate, cancel,
 * sampling settings), stats and memory.  The work is below it: load.c binds the tensors, forward.c
 * runs the passes on the engine's backend, dspark.c runs the DSpark cycle, sampling.c samples. */
#include "internal.h"
#include "cpu/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DS4_NATIVE_VERSION "0.2.0"

const char *ds4_version(void) { return "ds4tui-native " DS4_NATIVE_VERSION " (cpu)"; }

/* The build's target (ds4_engine.h: ds4_build_info).  build_native.py defines the first three; the
 * instruction-set list is the compiler's predefined macros, each entry " name" (the x86 ones the
 * kernels test, and the baselines that tell x86-64 from its levels). */
#ifndef DS4_BUILD_MARCH
#define DS4_BUILD_MARCH "unrecorded"
#endif
#ifndef DS4_BUILD_CPU
#define DS4_BUILD_CPU "unrecorded"
#endif
#ifndef DS4_BUILD_FLAGS
#define DS4_BUILD_FLAGS "unrecorded"
#endif
static const char build_isa[] = ""
#ifdef __SSE2__
    " sse2"
#endif
#ifdef __SSE4_2__
    " sse4.2"
#endif
#ifdef __AVX__
    " avx"
#endif
#ifdef __AVX2__
    " avx2"
#endif
#ifdef __FMA__
    " fma"
#endif
#ifdef __F16C__
    " f16c"
#endif
#ifdef __AVXVNNI__
    " avxvnni"
#endif
#ifdef __AVX512F__
    " avx512f"
#endif
#ifdef __AVX512BW__
    " avx512bw"
#endif
#ifdef __AVX512VL__
    " avx512vl"
#endif
#ifdef __AVX512VNNI__
    " avx512vnni"
#endif
#ifdef __AVX512VBMI__
    " avx512vbmi"
#endif
#ifdef __AVX512BITALG__
    " avx512bitalg"
#endif
#ifdef __ARM_NEON
    " neon"
#endif
#ifdef __ARM_FEATURE_DOTPROD
    " dotprod"
#endif
    ;

static const char build_compiler[] =
#if defined(__GNUC__) && !defined(__clang__)
    "gcc "
#endif
    __VERSION__;

const ds4_build_info *ds4_build(void) {
    static const ds4_build_info info = {DS4_BUILD_MARCH, DS4_BUILD_CPU, DS4_BUILD_FLAGS,
                                        build_isa + (sizeof build_isa > 1), build_compiler};
    return &info;
}

size_t ds4_type_row_bytes(int type, int64_t n) { return ds4_row_bytes(type, n); }

int ds4_dequantize(int type, const void *src, float *dst, int64_t n, char *err, size_t err_len) {
    const ds4_type_traits *tt = ds4_type(type);
    if (!tt || !tt->dequant)
        return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "ds4_dequantize: unsupported GGML type %d", type);
    if (n < 0 || n % tt->block_elems != 0)
        return ds4_fail(err, err_len, DS4_E_INVALID,
                    "ds4_dequantize: n=%lld is not a multiple of the block size %lld of GGML type %s",
                    (long long)n, (long long)tt->block_elems, tt->name);
    if (n > 0 && (!src || !dst)) return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_dequantize: NULL buffer");
    tt->dequant(src, dst, n);
    return DS4_OK;
}

int ds4_kernel_matmul(int type, const void *W, int64_t rows, int64_t cols, const float *X, int64_t n_tok, float *Y,
                      int n_threads, char *err, size_t err_len) {
    return ds4_kernel_matmul_act(type, W, rows, cols, X, n_tok, Y, n_threads, DS4_ACTIVATIONS_F32, err, err_len);
}

int ds4_kernel_matmul_act(int type, const void *W, int64_t rows, int64_t cols, const float *X, int64_t n_tok, float *Y,
                          int n_threads, int activations, char *err, size_t err_len) {
    if (activations != DS4_ACTIVATIONS_F32 && activations != DS4_ACTIVATIONS_Q8)
        return ds4_fail(err, err_len, DS4_E_INVALID, "matmul: activations %d: expected %d (f32) or %d (q8)", activations,
                        DS4_ACTIVATIONS_F32, DS4_ACTIVATIONS_Q8);
    const ds4_type_traits *tt = ds4_type(type);
    if (!tt || !tt->matrix) return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "matmul: unsupported GGML type %d", type);
    if (n_threads < 0 || n_threads > DS4_MAX_THREADS)
        return ds4_fail(err, err_len, DS4_E_INVALID, "matmul: n_threads must be 0 .. %d, got %d", DS4_MAX_THREADS, n_threads);
    if (rows < 0 || n_tok < 0 || cols <= 0 || ds4_row_bytes(type, cols) == 0)
        return ds4_fail(err, err_len, DS4_E_INVALID, "matmul: cols=%lld must be a positive multiple of %s's block size %lld",
                    (long long)cols, tt->name, (long long)tt->block_elems);
    if ((rows && n_tok) && (!W || !X || !Y)) return ds4_fail(err, err_len, DS4_E_INVALID, "matmul: NULL buffer");
    int perr = 0;
    ds4_pool *pool = ds4_pool_create(n_threads, &perr);
    if (!pool) return ds4_fail(err, err_len, DS4_E_NOMEM, "matmul: cannot start %d threads: %s", n_threads, strerror(perr));
    ds4_cpu_matmul_act(pool, activations == DS4_ACTIVATIONS_Q8, type, W, rows, cols, X, cols, n_tok, Y, rows);
    ds4_pool_destroy(pool);
    return DS4_OK;
}

int ds4_cpu_amx(char *why, size_t len) { return ds4_cpu_amx_probe(why, len); }

int ds4_kernel_matmul_amx(const void *W, int64_t rows, int64_t cols, const float *X, int64_t n_tok, float *Y,
                          int n_threads, char *err, size_t err_len) {
    char why[256];
    if (!ds4_cpu_amx_probe(why, sizeof why)) return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "matmul_amx: %s", why);
    if (!ds4_cpu_amx_eligible(DS4_TYPE_Q8_0, rows, cols))
        return ds4_fail(err, err_len, DS4_E_INVALID, "matmul_amx: a Q8_0 matrix of rows a multiple of 16 and columns a "
                        "multiple of 64 expected, got %lld x %lld", (long long)rows, (long long)cols);
    if (n_threads < 0 || n_threads > DS4_MAX_THREADS)
        return ds4_fail(err, err_len, DS4_E_INVALID, "matmul_amx: n_threads must be 0 .. %d, got %d", DS4_MAX_THREADS, n_threads);
    if (n_tok < 0 || (n_tok && (!W || !X || !Y))) return ds4_fail(err, err_len, DS4_E_INVALID, "matmul_amx: NULL buffer");
    if (!n_tok) return DS4_OK;
    uint8_t *P = aligned_alloc(64, ds4_cpu_amx_bytes(rows, cols));
    int perr = 0;
    ds4_pool *pool = P ? ds4_pool_create(n_threads, &perr) : NULL;
    if (!pool) {
        free(P);
        return ds4_fail(err, err_len, DS4_E_NOMEM, "matmul_amx: out of memory or cannot start %d threads", n_threads);
    }
    ds4_cpu_amx_pack(W, rows, cols, P);
    int rc = ds4_cpu_amx_matmul(pool, P, rows, cols, X, cols, n_tok, Y, rows);
    ds4_pool_destroy(pool);
    free(P);
    return rc == 0 ? DS4_OK : ds4_fail(err, err_len, DS4_E_NOMEM, "matmul_amx: out of memory");
}

int32_t ds4_kernel_argmax(const float *x, const float *b, int32_t n) {
    return b ? ds4_argmax_sum(x, b, n) : ds4_argmax(x, n);
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

static void cpu_free_target(ds4_engine *e);
static void free_support(ds4_engine *e);

/* Free the engine (after its last session: a session's device state is freed through the engine's
 * GPU context, and a garbage collector may free sessions after their engine was closed). */
static void engine_destroy(ds4_engine *e) {
    free_support(e);
    if (e->layers) cpu_free_target(e);
    ds4_engine_vectors_free(e);
    if (e->backend == DS4_BACKEND_HIP) {
        ds4_gpu_engine_close(e);
    } else if (e->ctx) {
        e->ops->close(e->ctx);
        e->ctx = NULL;
    }
    ds4_pool_destroy(e->pool);
    ds4_engine_free_vectors(e);
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

/* The CPU backend: the op table over host memory; the weights are read where they are mapped, and
 * under amx on the Q8_0 matrices that products read whole are repacked for the tiles as well (the
 * mapped rows stay for the row-range products: the drafter's heads, the embedding). */
static int cpu_weights(ds4_engine *e, ds4_w **ws, int n, char *err, size_t len) {
    for (int i = 0; i < n; i++) {
        ds4_w *w = ws[i];
        w->dev = w->data;
        w->dev_layout = w->type;
        if (!e->amx || w == &e->token_embd || w->n_mat != 1 || w->amx || !ds4_cpu_amx_eligible(w->type, w->rows, w->cols))
            continue;
        const size_t bytes = ds4_cpu_amx_bytes(w->rows, w->cols);
        w->amx = aligned_alloc(64, bytes);
        if (!w->amx)
            return ds4_fail(err, len, DS4_E_NOMEM, "amx: out of memory for a %.1f MiB repacked copy of a %lld x %lld Q8_0 "
                            "matrix (amx off keeps the mapped rows alone)", (double)bytes / (1 << 20),
                            (long long)w->rows, (long long)w->cols);
        ds4_cpu_amx_pack(w->data, w->rows, w->cols, w->amx);
        e->amx_bytes += bytes;
    }
    return DS4_OK;
}

/* The repacked copies of ws[0..n) freed (their bytes off e->amx_bytes). */
static void cpu_weights_free(ds4_engine *e, ds4_w **ws, int n) {
    for (int i = 0; i < n; i++) {
        if (!ws[i]->amx) continue;
        free(ws[i]->amx);
        ws[i]->amx = NULL;
        e->amx_bytes -= ds4_cpu_amx_bytes(ws[i]->rows, ws[i]->cols);
    }
}

static int cpu_open(ds4_engine *e, char *err, size_t len) {
    e->ops = ds4_cpu_backend();
    int rc = ds4_cpu_backend_open(e->pool, e->activations, &e->ctx, err, len);
    if (rc != DS4_OK) return rc;
    ds4_w **ws = malloc((size_t)(DS4_N_GLOBAL_TENSORS + e->c.n_layer * DS4_N_BLOCK_TENSORS) * sizeof *ws);
    if (!ws) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    rc = cpu_weights(e, ws, ds4_target_mats(e, ws), err, len);
    free(ws);
    return rc;
}

static int cpu_support(ds4_engine *e, char *err, size_t len) {
    ds4_w *ws[DS4_SUPPORT_MATS_MAX];
    return cpu_weights(e, ws, ds4_support_mats(e, ws), err, len);
}

/* The support model freed, with its repacked copies. */
static void free_support(ds4_engine *e) {
    if (e->sup) {
        ds4_w *ws[DS4_SUPPORT_MATS_MAX];
        cpu_weights_free(e, ws, ds4_support_mats(e, ws));
    }
    ds4_dspark_free_support(e);
}

/* The target's repacked copies freed. */
static void cpu_free_target(ds4_engine *e) {
    ds4_w **ws = malloc((size_t)(DS4_N_GLOBAL_TENSORS + e->c.n_layer * DS4_N_BLOCK_TENSORS) * sizeof *ws);
    if (!ws) return; /* the process is out of memory: the copies go with it */
    cpu_weights_free(e, ws, ds4_target_mats(e, ws));
    free(ws);
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
    if (o.activations != DS4_ACTIVATIONS_F32 && o.activations != DS4_ACTIVATIONS_Q8)
        return ds4_fail(err, err_len, DS4_E_INVALID, "activations %d: expected %d (f32) or %d (q8)", o.activations,
                        DS4_ACTIVATIONS_F32, DS4_ACTIVATIONS_Q8);
    if (o.prefill_gemm < DS4_PREFILL_GEMM_OFF || o.prefill_gemm > DS4_PREFILL_GEMM_AUTO)
        return ds4_fail(err, err_len, DS4_E_INVALID, "prefill_gemm %d: expected %d (off), %d (bf16), %d (f16) or %d "
                        "(auto)", o.prefill_gemm, DS4_PREFILL_GEMM_OFF, DS4_PREFILL_GEMM_BF16, DS4_PREFILL_GEMM_F16,
                        DS4_PREFILL_GEMM_AUTO);
    if (o.backend == DS4_BACKEND_CPU && (o.prefill_gemm == DS4_PREFILL_GEMM_BF16 || o.prefill_gemm == DS4_PREFILL_GEMM_F16))
        return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "prefill_gemm %s runs on the GPU backend only; the CPU backend "
                        "keeps float32 products (choose prefill_gemm off or auto with the cpu backend)",
                        o.prefill_gemm == DS4_PREFILL_GEMM_BF16 ? "bf16" : "f16");
    if (o.gpu_graphs != DS4_GPU_GRAPHS_OFF && o.gpu_graphs != DS4_GPU_GRAPHS_ON)
        return ds4_fail(err, err_len, DS4_E_INVALID, "gpu_graphs %d: expected %d (off) or %d (on)", o.gpu_graphs,
                        DS4_GPU_GRAPHS_OFF, DS4_GPU_GRAPHS_ON);
    if (o.verify_head != DS4_VERIFY_HEAD_ALL && o.verify_head != DS4_VERIFY_HEAD_LAZY)
        return ds4_fail(err, err_len, DS4_E_INVALID, "verify_head %d: expected %d (all) or %d (lazy)", o.verify_head,
                        DS4_VERIFY_HEAD_ALL, DS4_VERIFY_HEAD_LAZY);
    if (o.backend == DS4_BACKEND_HIP && o.verify_head == DS4_VERIFY_HEAD_LAZY)
        return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "verify_head lazy runs on the CPU backend only; the GPU "
                        "backend's verify computes every row in one pass (choose verify_head all with the hip backend)");
    if (o.n_threads < 0 || o.n_threads > DS4_MAX_THREADS)
        return ds4_fail(err, err_len, DS4_E_INVALID, "n_threads must be 0 (one per core) .. %d, got %d", DS4_MAX_THREADS,
                    o.n_threads);
    if (o.amx != DS4_AMX_OFF && o.amx != DS4_AMX_ON)
        return ds4_fail(err, err_len, DS4_E_INVALID, "amx %d: expected %d (off) or %d (on)", o.amx, DS4_AMX_OFF, DS4_AMX_ON);
    if (o.amx == DS4_AMX_ON) {
        char why[256];
        if (o.backend != DS4_BACKEND_CPU)
            return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "amx on runs on the CPU backend only (choose amx off with the hip "
                            "backend)");
        if (o.activations != DS4_ACTIVATIONS_Q8)
            return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "amx on multiplies 8-bit activations: it needs activations q8 "
                            "(choose activations q8, or amx off)");
        if (!ds4_cpu_amx_probe(why, sizeof why))
            return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "amx on: %s (choose amx off)", why);
    }
    int rc = ds4_check_config(cfg, err, err_len);
    if (rc != DS4_OK) return rc;
    ds4_engine *e = calloc(1, sizeof *e);
    if (!e) return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory");
    pthread_mutex_init(&e->life, NULL);
    e->c = *cfg;
    e->c.compress_ratios = NULL; /* copied into the layers by the binder */
    e->c.swiglu_clamp = e->c.swiglu_clamp_shexp = NULL;
    e->numerics = o.numerics;
    e->activations = o.activations;
    e->verify_head = o.verify_head;
    e->amx = o.amx == DS4_AMX_ON;
    e->prefill_gemm = DS4_PREFILL_GEMM_OFF; /* the GPU backend resolves the option at open (gpu.c) */
    snprintf(e->prefill_gemm_note, sizeof e->prefill_gemm_note, "off: the CPU backend keeps float32 products");
    e->gpu_graphs = DS4_GPU_GRAPHS_OFF; /* the GPU backend resolves the option at open (gpu.c) */
    snprintf(e->gpu_graphs_note, sizeof e->gpu_graphs_note, "off: the CPU backend launches no kernels");
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
    rc = ds4_bind_target(e, cfg, tensors, n_tensors, err, err_len);
    e->backend = o.backend;
    if (rc == DS4_OK) rc = o.backend == DS4_BACKEND_HIP ? ds4_gpu_engine_open(e, &o, err, err_len) : cpu_open(e, err, err_len);
    if (rc == DS4_OK) rc = ds4_engine_vectors(e, err, err_len);
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

void ds4_engine_refuse_support(ds4_engine *e, const char *why) {
    if (!e) return;
    free_support(e);
    e->sup_refused = 1;
    snprintf(e->sup_msg, sizeof e->sup_msg, "%s", why ? why : "support model refused");
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* One matrix of the draft vocabulary: the rows of `src` for the ids vd[0..n), copied to `dst`. */
static void vd_matrix(const ds4_w *src, const int32_t *vd, int32_t n, uint8_t *dst, ds4_w *out) {
    for (int32_t i = 0; i < n; i++) memcpy(dst + (size_t)i * src->row_bytes, src->data + (size_t)vd[i] * src->row_bytes, src->row_bytes);
    *out = (ds4_w){.data = dst, .type = src->type, .rows = n, .cols = src->cols, .n_mat = 1, .row_bytes = src->row_bytes,
                   .mat_bytes = (size_t)n * src->row_bytes};
}

/* The draft vocabulary (spec dspark.md §2.6): the ids sorted, checked (in range, distinct) and the
 * rows the drafter reads for them copied (the LM head, Markov W2 and W1), counted as expanded bytes. */
static int draft_vocab(ds4_engine *e, const ds4_support_config *cfg, ds4_support *sup, char *err, size_t len) {
    const int32_t n = cfg->n_draft_vocab, V = (int32_t)e->c.n_vocab;
    if (n == 0) return DS4_OK;
    if (n < 0 || n > V || !cfg->draft_vocab)
        return ds4_fail(err, len, DS4_E_INVALID, "draft vocabulary: expected 1..%d token ids, found %d%s", V, n,
                        cfg->draft_vocab ? "" : " and no id array");
    sup->vd = malloc((size_t)n * sizeof *sup->vd);
    if (!sup->vd) return ds4_fail(err, len, DS4_E_NOMEM, "draft vocabulary: out of memory for %d ids", n);
    memcpy(sup->vd, cfg->draft_vocab, (size_t)n * sizeof *sup->vd);
    qsort(sup->vd, (size_t)n, sizeof *sup->vd, cmp_i32);
    for (int32_t i = 0; i < n; i++) {
        if (sup->vd[i] < 0 || sup->vd[i] >= V)
            return ds4_fail(err, len, DS4_E_INVALID, "draft vocabulary: token id %d is outside the vocabulary 0..%d",
                            sup->vd[i], V - 1);
        if (i > 0 && sup->vd[i] == sup->vd[i - 1])
            return ds4_fail(err, len, DS4_E_INVALID, "draft vocabulary: token id %d is listed twice", sup->vd[i]);
    }
    const ds4_w *lm = &e->output, *w2 = &sup->markov_w2, *w1 = &sup->markov_w1;
    const size_t bytes = (size_t)n * (lm->row_bytes + w2->row_bytes + w1->row_bytes);
    sup->vd_rows = malloc(bytes);
    if (!sup->vd_rows)
        return ds4_fail(err, len, DS4_E_NOMEM, "draft vocabulary: out of memory for %.1f MiB of row copies",
                        (double)bytes / (1 << 20));
    uint8_t *p = sup->vd_rows;
    vd_matrix(lm, sup->vd, n, p, &sup->vd_lm), p += sup->vd_lm.mat_bytes;
    vd_matrix(w2, sup->vd, n, p, &sup->vd_w2), p += sup->vd_w2.mat_bytes;
    vd_matrix(w1, sup->vd, n, p, &sup->vd_w1);
    sup->n_vd = n;
    e->expanded_bytes += bytes;
    return DS4_OK;
}

int ds4_engine_attach_support(ds4_engine *e, const ds4_support_config *cfg, const ds4_tensor_desc *tensors,
                              int32_t n_tensors, char *err, size_t err_len) {
    if (!e) return ds4_fail(err, err_len, DS4_E_INVALID, "no engine");
    char msg[1024] = "";
    int rc = ds4_check_support_config(e, cfg, msg, sizeof msg);
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
    if (rc == DS4_OK) rc = ds4_bind_support(e, cfg, tensors, n_tensors, sup, msg, sizeof msg);
    if (rc == DS4_OK) rc = draft_vocab(e, cfg, sup, msg, sizeof msg);
    if (rc != DS4_OK) {
        if (sup) { free(sup->vd); free(sup->vd_rows); free(sup->stages); free(sup->capture_slot); free(sup); }
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
    free_support(e);
    e->sup = sup;
    e->sup_refused = 0;
    e->sup_msg[0] = 0;
    rc = e->backend == DS4_BACKEND_HIP ? ds4_gpu_upload_support(e, msg, sizeof msg) : cpu_support(e, msg, sizeof msg);
    if (rc == DS4_OK) rc = ds4_support_vectors(e, msg, sizeof msg);
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
    out->amx = e->amx_bytes;
    if (e->ctx && !e->ops->host_memory) out->device = e->ops->allocated(e->ctx);
    return DS4_OK;
}

int32_t ds4_engine_n_threads(const ds4_engine *e) { return e ? e->n_threads : 0; }

int32_t ds4_engine_prefill_gemm(const ds4_engine *e, char *note, size_t note_len) {
    if (!e) return DS4_PREFILL_GEMM_OFF;
    if (note && note_len) snprintf(note, note_len, "%s", e->prefill_gemm_note);
    return e->prefill_gemm;
}

int32_t ds4_engine_gpu_graphs(const ds4_engine *e, char *note, size_t note_len) {
    if (!e) return DS4_GPU_GRAPHS_OFF;
    if (note && note_len) {
        if (e->graph_captures || e->graph_replays)
            snprintf(note, note_len, "%s; %llu graphs captured, %llu passes replayed", e->gpu_graphs_note,
                     (unsigned long long)e->graph_captures, (unsigned long long)e->graph_replays);
        else
            snprintf(note, note_len, "%s", e->gpu_graphs_note);
    }
    return e->gpu_graphs;
}

int ds4_engine_set_gpu_graphs(ds4_engine *e, int32_t mode, char *err, size_t err_len) {
    if (!e) return ds4_fail(err, err_len, DS4_E_INVALID, "no engine");
    if (mode != DS4_GPU_GRAPHS_OFF && mode != DS4_GPU_GRAPHS_ON)
        return ds4_fail(err, err_len, DS4_E_INVALID, "gpu_graphs %d: expected %d (off) or %d (on)", mode,
                        DS4_GPU_GRAPHS_OFF, DS4_GPU_GRAPHS_ON);
    if (e->backend != DS4_BACKEND_HIP || !e->ctx) {
        if (mode == DS4_GPU_GRAPHS_OFF) return DS4_OK;
        return ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "gpu_graphs on: the CPU backend launches no kernels");
    }
    ds4_gpu_graphs_mode(e, mode);
    return DS4_OK;
}

/* ---- sessions ------------------------------------------------------------------------------- */

void ds4_session_free(ds4_session *s) {
    if (!s) return;
    ds4_dspark_session_free(s);
    ds4_state_free(s);
    free(s->logits);
    free(s->sample_buf);
    ds4_engine *e = s->e;
    free(s);
    engine_sessions(e, -1);
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
    s->logits = calloc((size_t)c->n_vocab, sizeof(float));
    s->sample_buf = calloc((size_t)c->n_vocab, 16);
    s->scratch_bytes += (uint64_t)c->n_vocab * (sizeof(float) + 16);
    if (!s->logits || !s->sample_buf) {
        ds4_session_free(s);
        return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory allocating a session of %d tokens", n_ctx);
    }
    atomic_init(&s->cancel, 0);
    int rc = ds4_state_init(s, err, err_len);
    if (rc != DS4_OK) {
        ds4_session_free(s);
        return rc;
    }
    if (e->sup || e->sup_refused) {
        rc = ds4_dspark_session_init(s, dspark, err, err_len);
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

int ds4_session_set_sampling(ds4_session *s, const ds4_sampling *p, char *err, size_t err_len) {
    if (!s || !p) return ds4_fail(err, err_len, DS4_E_INVALID, "no session or settings");
    int rc = ds4_check_sampling(p, err, err_len);
    if (rc != DS4_OK) return rc;
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
        if (!(s->sampling.temperature > 0.0f) && ds4_device_picks(s)) { /* greedy on a GPU: spec platform.md §9 */
            int32_t next = -1;
            int rc = ds4_run_pass_argmax(s, &tok, 1, DS4_LOGITS_LAST, &next, err, err_len);
            double te = ds4_now_ms();
            s->stats.decode_ms += te - t0;
            if (rc != DS4_OK) return rc;
            s->has_logits = 0; /* they stayed on the device; the next token is taken */
            s->pending = next;
            out[0] = next;
            *n_out = 1;
            s->stats.n_decode_tokens++;
            s->stats.n_steps++;
            return DS4_OK;
        }
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

int ds4_session_step_many(ds4_session *s, int32_t *out, int32_t max_out, int32_t max_cycles, double budget_ms,
                          const int32_t *stop, int32_t n_stop, int32_t *cycle_len, int32_t *n_cycles,
                          char *err, size_t err_len) {
    if (!s || !out || !cycle_len || !n_cycles || max_out < 1 || max_cycles < 1 || n_stop < 0 || (n_stop && !stop))
        return ds4_fail(err, err_len, DS4_E_INVALID, "bad output buffers or limits");
    *n_cycles = 0;
    double t0 = ds4_now_ms();
    int32_t emitted = 0;
    for (int32_t k = 0; k < max_cycles && emitted < max_out; k++) {
        if (k > 0) {
            if (atomic_load(&s->cancel)) break;
            if (budget_ms > 0 && ds4_now_ms() - t0 >= budget_ms) break;
            if (s->pending >= 0 && s->n_tokens + 1 > s->n_ctx) break;
        }
        int32_t room = max_out - emitted, n = 0;
        int rc = ds4_session_step(s, out + emitted, room < 64 ? room : 64, &n, err, err_len);
        if (rc != DS4_OK) return rc;
        cycle_len[k] = n;
        *n_cycles = k + 1;
        int hit = 0;
        for (int32_t i = 0; i < n && !hit; i++)
            for (int32_t j = 0; j < n_stop; j++)
                if (out[emitted + i] == stop[j]) { hit = 1; break; }
        emitted += n;
        if (hit) break;
    }
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

int ds4_session_bench_fill(ds4_session *s, int32_t n, char *err, size_t err_len) {
    if (!s) return ds4_fail(err, err_len, DS4_E_INVALID, "no session");
    if (s->e->sup || s->dsp)
        return ds4_fail(err, err_len, DS4_E_STATE, "bench fill: not with a DSpark support model attached");
    if (n < s->n_tokens || n > s->n_ctx)
        return ds4_fail(err, err_len, DS4_E_INVALID, "bench fill: %d tokens is outside %d .. %d (the session's tokens "
                        ".. its context)", n, s->n_tokens, s->n_ctx);
    int rc = ds4_state_repeat_rows(s, n, err, err_len);
    if (rc != DS4_OK) return rc;
    s->n_tokens = n;
    s->pending = -1;
    s->has_logits = 0;
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
