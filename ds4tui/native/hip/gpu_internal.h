/* gpu_internal.h — state shared by the GPU backend's translation units (not public). */
#ifndef DS4_GPU_INTERNAL_H
#define DS4_GPU_INTERNAL_H

#include "hip_compat.h"
#include "../backend.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

/* The device code target this library was built for (build_native.py passes it). */
#ifndef DS4_GPU_ARCH
#define DS4_GPU_ARCH "unknown"
#endif

/* The GPU backend's context (backend.h's ds4_backend_ctx). */
typedef struct ds4_backend_ctx ds4_gpu_ctx;

/* Bytes of one pinned host staging buffer (two per context). */
#define GPU_STAGE_BYTES ((size_t)32 << 20)

struct ds4_backend_ctx {
    int device;
    hipStream_t stream;
    pthread_mutex_t lock;     /* one caller at a time on the stream and the staging buffers */
    float *dx, *dy;           /* device staging for host activations: [dx_cap], [dy_cap] floats */
    size_t dx_cap, dy_cap;
    uint64_t allocated;       /* bytes held: weights, state, staging */
    /* Pinned host staging (hipHostMalloc, GPU_STAGE_BYTES each, made at first use): every byte that
     * goes from host memory to the device passes through one of them, never straight from
     * pageable or file-backed pages; stage_free[i] is recorded after the copy out of stage[i]. */
    void *stage[2];
    hipEvent_t stage_free[2];
    int stage_next;
    /* The prefill GEMM (gemm.hip): the mode for the products queued now (DS4_PREFILL_GEMM_*), the
     * BLAS handle (made at the first bf16/f16 mode), and scratch grown to the largest pass: the
     * dequantised weight tile, the 16-bit activations, the slot-grouped results and slot lists
     * (device, bytes), and the pinned host copy of the slot lists. */
    int32_t gemm_mode;
    /* The activations option (DS4_ACTIVATIONS_*, spec ds4.md §2.9.5): under Q8 the products of Q8_0 /
     * Q2_K / IQ2_XXS matrices that the BLAS does not take run with 8-bit activations (q8.hip). */
    int32_t act_q8;
    int32_t gm_bf; /* the product being queued rounds to bf16 (1) or f16 (0) */
    void *blas;
    void *gm_w, *gm_x, *gm_y, *gm_idx, *gm_host;
    size_t gm_w_cap, gm_x_cap, gm_y_cap, gm_idx_cap, gm_host_cap;
    /* While the stream is captured into a graph (graph_begin .. graph_end, backend.h version 7):
     * the device word holding the first position of the pass being replayed, and the position
     * of the captured pass.  An op given position p then passes its kernel p - cap_p0 and cap_dp0,
     * and the kernel adds *cap_dp0 (gpu_pos below); host decisions that depend on the position
     * (the compressor windows that close, the indexer's grid) move into the kernels or are sized
     * for every position the graph's key allows (ds4_graph_span).  NULL: plain launches. */
    const int64_t *cap_dp0;
    int64_t cap_p0;
    /* The greedy picks' parts (ops.hip, argmax_launch): ARGMAX_MAX_ROWS x ARGMAX_PARTS values,
     * indices and first non-finite indices, allocated with the context. */
    void *amax;
    /* The activation rows of a short pass quantised once for q8 products (q8.hip, q8_prepare):
     * GPU_Q8_PRE_BYTES, allocated with the context: region 0 for one product's rows, region 1 for
     * the rows the forward pass shares among several (gpu_q8_share, backend.h version 10), which are
     * q8_sx [q8_sn, q8_scols] at stride q8_sldx (q8_sx NULL: none shared). */
    void *q8_pre;
    const float *q8_sx;
    int64_t q8_sldx, q8_sn, q8_scols;
};

/* q8.hip's scratch: two regions of GPU_Q8_PRE_ROWS rows of up to 32768 codes (its Q8_STAGE), their
 * scales (a float a 32) and 16-code sums (an int a 16). */
#define GPU_Q8_PRE_ROWS 8
#define GPU_Q8_PRE_REGION ((size_t)GPU_Q8_PRE_ROWS * (32768 + 32768 / 32 * 4 + 32768 / 16 * 4))
#define GPU_Q8_PRE_BYTES (2 * GPU_Q8_PRE_REGION)

/* The greedy picks (ops.hip): parts per row, threads per part, the most rows one call takes. */
#define ARGMAX_PARTS 64
#define ARGMAX_PART_THREADS 256
#define ARGMAX_MAX_ROWS DS4_GRAPH_MAX_ROWS
#define ARGMAX_SCRATCH_BYTES ((size_t)ARGMAX_MAX_ROWS * ARGMAX_PARTS * 3 * 4)

/* The (position, device position) pair an op passes to a kernel that reads positions. */
#define GPU_POS(c, p0) ((c)->cap_dp0 ? (int64_t)(p0) - (c)->cap_p0 : (int64_t)(p0)), (c)->cap_dp0

/* Format a failure into err and return `code`. */
static inline int gpu_fail(char *err, size_t len, int code, const char *fmt, ...) {
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Check a runtime call: on failure write "<what>: <runtime error name>: <string>" and return DS4_E_DEVICE. */
#define GPU_TRY(call, what)                                                                                   \
    do {                                                                                                      \
        hipError_t e_ = (call);                                                                               \
        if (e_ != hipSuccess)                                                                                 \
            return gpu_fail(err, len, DS4_E_DEVICE, "%s: %s (%s)", (what), hipGetErrorString(e_),             \
                            hipGetErrorName(e_));                                                             \
    } while (0)

/* Device allocation counted in the context's tally. */
int gpu_alloc(ds4_gpu_ctx *c, size_t bytes, void **out, char *err, size_t len);
void gpu_free(ds4_gpu_ctx *c, void *p, size_t bytes);
/* Grow a staging buffer to hold n floats. */
int gpu_stage(ds4_gpu_ctx *c, float **buf, size_t *cap, size_t n, char *err, size_t len);
/* The pinned staging buffers (made at the first call); stage_wait: both free again. */
int gpu_stage_ready(ds4_gpu_ctx *c, char *err, size_t len);
int gpu_stage_wait(ds4_gpu_ctx *c, char *err, size_t len);
/* Queue a copy of `bytes` host bytes to device `dst` on the context's stream, through the pinned
 * staging buffers in turn (the host copies piece k+1 in while the device takes piece k); src has
 * been read when it returns, dst is written once the stream gets there.  The caller holds c->lock. */
int gpu_put(ds4_gpu_ctx *c, void *dst, const void *src, size_t bytes, char *err, size_t len);

/* matmul.hip */
int gpu_matmul_init(char *err, size_t len); /* format tables into constant memory (per process) */
int gpu_matmul_launch(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                      const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
int gpu_matmul(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
               const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
int gpu_mm_dev(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
               const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
int gpu_mm_gather(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t mat_bytes, const int32_t *ids, int64_t rows,
                  int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int32_t x_div, int64_t n_slots,
                  float *Y, int64_t ldy, char *err, size_t len);
int gpu_mm_grouped(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t mat_bytes, const int32_t *ids, int32_t groups,
                   int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t n, float *Y, char *err,
                   size_t len);
int gpu_bench_matmul(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                     const float *X, int64_t n, float *Y, int32_t reps, double *ms, char *err, size_t len);

/* planar.hip: the planar device layout of Q8_0 / Q2_K / IQ2_XXS rows (layout id DS4_GPU_PLANAR | type) */
int gpu_planar_init(char *err, size_t len); /* its IQ2_XXS tables (called by gpu_matmul_init) */
int gpu_planar_ok(int32_t type, int64_t cols, int64_t row_bytes);
int gpu_planar_launch(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, const int32_t *ids,
                      int64_t n_slots, int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t ldx,
                      int32_t x_div, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
/* q8.hip: the Q8_0 / Q2_K / IQ2_XXS products under q8 activations (spec ds4.md §2.9.5), either layout */
int gpu_q8_init(char *err, size_t len); /* its IQ2_XXS tables (called by gpu_matmul_init) */
/* The GGML types the q8 kernels take (in either layout): Q8_0, Q2_K, IQ2_XXS. */
static inline int gpu_q8_type(int32_t type) {
    return type == DS4_TYPE_Q8_0 || type == DS4_TYPE_Q2_K || type == DS4_TYPE_IQ2_XXS;
}
int gpu_q8_launch(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, const int32_t *ids,
                  int64_t n_slots, int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t ldx,
                  int32_t x_div, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
int gpu_q8_share(ds4_gpu_ctx *c, const float *X, int64_t ldx, int64_t n, int64_t cols, char *err, size_t len);
int gpu_q8_grouped(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, int32_t groups, int64_t rows,
                   int64_t cols, int64_t row_bytes, const float *X, int64_t n, float *Y, char *err, size_t len);
int gpu_upload_matrix(ds4_gpu_ctx *c, const void *src, int32_t type, int64_t rows, int64_t cols, int64_t row_bytes,
                      int32_t want_planar, void **out, int32_t *layout, char *err, size_t len);
int gpu_reserve(ds4_gpu_ctx *c, int64_t x_floats, int64_t y_floats, char *err, size_t len);

/* gemm.hip: the prefill GEMM through the vendor BLAS (dlopen'ed at the first bf16/f16 mode) */
int gpu_gemm_init(char *err, size_t len); /* its IQ2_XXS tables (called by gpu_matmul_init) */
int gpu_blas_describe(char *out, size_t n); /* "cuBLAS 13.0.2 (libcublas.so.13)" or "none: why"; 1 if found */
int gpu_gemm(ds4_gpu_ctx *c, int32_t mode, char *info, size_t info_len, char *err, size_t len);
void gpu_gemm_close(ds4_gpu_ctx *c);
int gpu_gemm_takes(const ds4_gpu_ctx *c, int32_t layout, int64_t cols, int dense); /* this product goes through the BLAS */
int gpu_gemm_dense(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                   const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
int gpu_gemm_gather(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, const int32_t *ids, int64_t rows,
                    int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int32_t x_div, int64_t n_slots,
                    float *Y, int64_t ldy, char *err, size_t len);

/* ops.hip (see the table in ../gpu_api.h for the contracts) */
int gpu_ops_init(char *err, size_t len);
int gpu_copy(ds4_gpu_ctx *c, void *dst, const void *src, size_t bytes, int32_t to_host, char *err, size_t len);
int gpu_sync(ds4_gpu_ctx *c, char *err, size_t len);
int gpu_embed(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t row_bytes, int32_t H, const int32_t *tokens,
              int32_t n, int32_t HC, float *X, char *err, size_t len);
int gpu_rms_norm(ds4_gpu_ctx *c, const float *x, int64_t ldx, int64_t rows, int64_t width, float eps, const float *w,
                 float *out, int64_t ldo, char *err, size_t len);
int gpu_hc_pre(ds4_gpu_ctx *c, const float *hcm, int32_t n, int32_t HC, int32_t H, float s0, float s1, float s2,
               const float *base, float eps, int32_t iters, const float *X, float *x, float *pre, float *post,
               float *comb, char *err, size_t len);
int gpu_hc_post(ds4_gpu_ctx *c, const float *X, const float *out, const float *post, const float *comb, int32_t n,
                int32_t HC, int32_t H, float *Y, char *err, size_t len);
int gpu_hc_head(ds4_gpu_ctx *c, const float *X, const float *m, int32_t n, int32_t HC, int32_t H, float s0,
                const float *base, float eps, float *w, float *out, char *err, size_t len);
int gpu_norm_rope(ds4_gpu_ctx *c, float *x, int64_t rows, int32_t width, int32_t hpt, float eps, const float *w,
                  const double *freq, int32_t n_rot, int64_t p0, int32_t inverse, int32_t qat, char *err, size_t len);
int gpu_kv_store(ds4_gpu_ctx *c, const float *kvr, int32_t n, int32_t D, float *ring, int32_t cap, int64_t p0,
                 int32_t n_rot, int32_t round, char *err, size_t len);
int gpu_capture(ds4_gpu_ctx *c, const float *X, int32_t n, int32_t HC, int32_t H, int64_t p0, float *ring, int32_t cap,
                int32_t n_slot, int32_t slot, char *err, size_t len);
int gpu_attend_nc(ds4_gpu_ctx *c, const float *q, int32_t n, int32_t NH, int32_t D, const float *ring, int32_t cap,
                  int64_t lo, int32_t n_ctx, const float *rows, int32_t n_rows, const float *sinks, float *sc,
                  int32_t keys_cap, float *att, char *err, size_t len);
int gpu_compress(ds4_gpu_ctx *c, const float *cbuf, const float *zbuf, int32_t n, int64_t p0, int32_t W, int32_t R,
                 int32_t overlap, const float *ape, float *ring_c, float *ring_z, int32_t cap, int64_t w0, int32_t nw,
                 float *rows, const float *norm, float eps, const double *freq, int32_t n_rot, int32_t indexer,
                 int32_t ds4n, char *err, size_t len);
int gpu_indexer(ds4_gpu_ctx *c, const float *qi, const float *iw, int32_t n, int64_t p0, int32_t IH, int32_t ID,
                const float *keys, int32_t ratio, int32_t top_k, float scale, float *score, int32_t max_vis,
                int32_t *sel, int32_t *nsel, char *err, size_t len);
int gpu_attend(ds4_gpu_ctx *c, const float *q, int32_t n, int32_t NH, int32_t D, int64_t p0, int32_t window,
               const float *kv, int32_t kv_cap, const float *comp, int32_t ratio, const int32_t *sel,
               const int32_t *nsel, int32_t top_k, const float *sinks, float *sc, int32_t keys_cap, float *att,
               char *err, size_t len);
int gpu_moe_route(ds4_gpu_ctx *c, float *scores, int32_t n, int32_t E, int32_t K, const int32_t *tid2eid,
                  const int32_t *tokens, const float *bias, int32_t norm, int32_t ds4n, float scale, int32_t *sel,
                  float *wsel, char *err, size_t len);
int gpu_swiglu(ds4_gpu_ctx *c, float *a, const float *b, int64_t n, float clamp, char *err, size_t len);
int gpu_moe_combine(ds4_gpu_ctx *c, const float *oe, const int32_t *sel, const float *wsel, int32_t n, int32_t K,
                    int32_t H, const float *shared, float *y, char *err, size_t len);
int gpu_scale(ds4_gpu_ctx *c, float *x, int64_t n, float s, char *err, size_t len);
int gpu_add_argmax(ds4_gpu_ctx *c, const float *a, const float *b, int32_t n, int32_t *out, char *err, size_t len);
int gpu_argmax_rows(ds4_gpu_ctx *c, const float *x, int64_t ld, int32_t rows, int32_t n, int32_t *ids, int32_t *bad,
                    char *err, size_t len);

#endif
