/*
 * backend.h — the operation table every backend implements (internal, not public).
 *
 * The forward pass (forward.c) and the DSpark drafter run through this table only, so both
 * backends run the same pass, written once:
 *   - the CPU backend (cpu/backend.c) is built into the cffi extension; its "device" memory is
 *     ordinary host memory (host_memory = 1) and its ops run on the engine's thread pool;
 *   - a GPU backend is a separate shared library (libds4tui_hip.so built by hipcc, or
 *     libds4tui_cuda.so built by nvcc from the same sources through hip/hip_compat.h; spec
 *     platform.md §0.3, §4) that gpu.c dlopen()s when an engine asks for the hip backend.  The
 *     library exports one symbol, `ds4_gpu_api_v1`, a function returning this table; a library
 *     whose table has another `version` is refused by name.
 * A fused operation is an entry of this table with a reference composition (the CPU backend's
 * implementation, or the ops it fuses), so both backends stay checkable op by op.
 *
 * Conventions: every function returns DS4_OK or a negative DS4_E* code and writes an English
 * message (naming the runtime call and its error string) into err[0..len).  Pointers called
 * "device" are memory owned by the backend's context (host memory on the CPU backend); "host"
 * pointers are ordinary memory.
 */
#ifndef DS4_BACKEND_H
#define DS4_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ds4_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 4: the probe fills ds4_gpu_info.integrated (the struct grew; the table is version 3's).
 * 5: the prefill GEMM entry (`gemm`) and ds4_gpu_info.blas.
 * 6: the activations entry (`activations`: the q8 option on the GPU).
 * 7: graphs of a pass (`graph_begin`, `graph_end`, `graph_launch`, `graph_free`).
 * 8: greedy picks on the device (`argmax_rows`).
 * 9: grouped products (`mm_grouped`: the grouped attention output).
 * 10: shared 8-bit activations (`q8_share`). */
#define DS4_GPU_API_VERSION 10

/* Graphs of a pass (the gpu_graphs option, spec platform.md §8): a graph replays the kernels of one
 * captured pass at any position p whose key is the captured pass's; the key holds
 * ds4_graph_span(p + n), and the ops size their position-dependent grids (the indexer's scores)
 * for that span: the first DS4_GRAPH_SPAN-multiple of positions at or past p + n. */
#define DS4_GRAPH_SPAN 16384
static inline int64_t ds4_graph_span(int64_t end) { return (end + DS4_GRAPH_SPAN - 1) / DS4_GRAPH_SPAN * DS4_GRAPH_SPAN; }

/* A device matrix's layout id is its GGML type, or DS4_GPU_PLANAR | type (ds4_engine.h) when
 * upload_matrix wrote its rows in the planar layout (hip/planar.hip: Q8_0, Q2_K and IQ2_XXS rows
 * of a 16-byte multiple; the same bytes in another order).  The matmul entry points take it. */

typedef struct ds4_backend_ctx ds4_backend_ctx;

typedef struct ds4_backend_s {
    int32_t version; /* DS4_GPU_API_VERSION */
    /* What the library is and what the runtime sees (no context needed). */
    int (*probe)(ds4_gpu_info *info, char *err, size_t len);
    /* A context on device `device`: checks that the library's device code runs there (a wrong
     * --offload-arch / -arch is reported as such), makes a stream and staging buffers. */
    int (*open)(int32_t device, ds4_backend_ctx **out, char *err, size_t len);
    void (*close)(ds4_backend_ctx *c);
    /* Device memory: `bytes` bytes, copied from host `src` when src is not NULL. */
    int (*upload)(ds4_backend_ctx *c, const void *src, size_t bytes, void **out, char *err, size_t len);
    void (*free)(ds4_backend_ctx *c, void *dev, size_t bytes); /* bytes: as uploaded */
    /* Bytes of device memory this context holds (weights, state, staging). */
    uint64_t (*allocated)(const ds4_backend_ctx *c);
    int (*mem_info)(ds4_backend_ctx *c, uint64_t *free_bytes, uint64_t *total_bytes, char *err, size_t len);
    /* Y[t*ldy + r] = sum_c W[r, c] * X[t*ldx + c] for t < n, r < rows: W is device memory of `rows`
     * rows of `row_bytes` bytes (layout id `type`, `cols` elements each); X and Y are host float32.
     * Float32 activations, as the CPU kernels (ds4tui/native/cpu/matmul.c): only the float32
     * rounding order differs.  Each (row, token) result is independent of n (batch-invariant). */
    int (*matmul)(ds4_backend_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                  const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
    /* The matmul kernel alone on device buffers, timed with events: uploads host W/X, runs it
     * `reps` times (after one warm-up), downloads Y, and writes the median milliseconds.  `type`
     * with DS4_GPU_PLANAR: upload in the planar layout (refused when the rows cannot take it). */
    int (*bench_matmul)(ds4_backend_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                        const float *X, int64_t n, float *Y, int32_t reps, double *ms, char *err, size_t len);
    /* Device memory bandwidth: a read-only kernel over `bytes` bytes, best of `reps`, in GB/s. */
    int (*bandwidth)(ds4_backend_ctx *c, size_t bytes, int32_t reps, double *gbs, char *err, size_t len);

    /* ---- operations of the forward pass (forward.c runs them on either backend; spec ds4.md §2) -
     * Every pointer below is device memory; the work is queued on the context's stream in call
     * order and a call returns the launch status (DS4_E_DEVICE with the kernel's name on failure).
     * Shapes are row-major [rows, width]; positions are absolute token positions. */
    /* bytes from src to dst; to_host: device -> host, and the call returns when they are there (the
     * work queued before it has run); else host -> device, queued. */
    int (*copy)(ds4_backend_ctx *c, void *dst, const void *src, size_t bytes, int32_t to_host, char *err, size_t len);
    int (*sync)(ds4_backend_ctx *c, char *err, size_t len);
    /* Y[t*ldy + r] = W[r, :] . X[t*ldx + :], device X and Y (the matmul contract above). */
    int (*mm)(ds4_backend_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
              const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
    /* MoE products: slot s uses matrix ids[s] (mat_bytes apart) and X row s / x_div; Y[s*ldy + r]. */
    int (*mm_gather)(ds4_backend_ctx *c, int32_t type, const void *W, int64_t mat_bytes, const int32_t *ids, int64_t rows,
                     int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int32_t x_div, int64_t n_slots,
                     float *Y, int64_t ldy, char *err, size_t len);
    /* X[t, a, :] = row tokens[t] of the embedding W (GGML type, H columns) for each of HC streams. */
    int (*embed)(ds4_backend_ctx *c, int32_t type, const void *W, int64_t row_bytes, int32_t H, const int32_t *tokens,
                 int32_t n, int32_t HC, float *X, char *err, size_t len);
    /* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) (* w when w is not NULL) for r < rows. */
    int (*rms_norm)(ds4_backend_ctx *c, const float *x, int64_t ldx, int64_t rows, int64_t width, float eps,
                    const float *w, float *out, int64_t ldo, char *err, size_t len);
    /* mHC pre (spec ds4.md §2.1): from hcm [n, 2HC+HC^2] the weights pre, post [n, HC] and the
     * Sinkhorn combination comb [n, HC, HC]; x[t] = sum_a pre[t, a] X[t, a]. */
    int (*hc_pre)(ds4_backend_ctx *c, const float *hcm, int32_t n, int32_t HC, int32_t H, float s0, float s1, float s2,
                  const float *base, float eps, int32_t iters, const float *X, float *x, float *pre, float *post,
                  float *comb, char *err, size_t len);
    /* Y[t, b] = post[t, b] * out[t] + sum_a comb[t, a, b] X[t, a]. */
    int (*hc_post)(ds4_backend_ctx *c, const float *X, const float *out, const float *post, const float *comb, int32_t n,
                   int32_t HC, int32_t H, float *Y, char *err, size_t len);
    /* HC head: w[t, a] = sigmoid(s0 * m[t, a] + base[a]) + eps; out[t] = sum_a w[t, a] X[t, a]. */
    int (*hc_head)(ds4_backend_ctx *c, const float *X, const float *m, int32_t n, int32_t HC, int32_t H, float s0,
                   const float *base, float eps, float *w, float *out, char *err, size_t len);
    /* Rows of `width` lanes, heads_per_tok rows per token at position p0 + row / heads_per_tok:
     * optional RMS norm (eps >= 0; weight w or none), RoPE of the last n_rot lanes (freq: n_rot/2
     * doubles; inverse rotates back), optional indexer QAT (Hadamard + FP4, ds4 numerics). */
    int (*norm_rope)(ds4_backend_ctx *c, float *x, int64_t rows, int32_t width, int32_t heads_per_tok, float eps,
                     const float *w, const double *freq, int32_t n_rot, int64_t p0, int32_t inverse, int32_t qat,
                     char *err, size_t len);
    /* KV rows [n, D] into the ring (position p at row p % cap; kvr may be the ring itself, with p0 = 0 and
     * cap >= n: each row is then rounded where it is, also in a replayed graph), rounded
     * by `round`: 0 none, 1 FP8 + f16 (target rows, ds4 numerics), 2 FP8 only (drafter rows). */
    int (*kv_store)(ds4_backend_ctx *c, const float *kvr, int32_t n, int32_t D, float *ring, int32_t cap, int64_t p0,
                    int32_t n_rot, int32_t round, char *err, size_t len);
    /* Compressor (spec ds4.md §2.4): append n projections (cbuf, zbuf [n, cw]; ape [R, cw]) at
     * p0... to the rings, then emit windows w0 .. w0+nw-1 into rows [*, W] (pooled, normed,
     * RoPE'd at R*w, rounded: FP8+f16, or the indexer's QAT). */
    int (*compress)(ds4_backend_ctx *c, const float *cbuf, const float *zbuf, int32_t n, int64_t p0, int32_t W,
                    int32_t R, int32_t overlap, const float *ape, float *ring_c, float *ring_z, int32_t cap,
                    int64_t w0, int32_t nw, float *rows, const float *norm, float eps, const double *freq,
                    int32_t n_rot, int32_t indexer, int32_t ds4n, char *err, size_t len);
    /* Lightning indexer (spec ds4.md §2.5): for each token with more than top_k visible
     * compressed rows, the top_k rows by sum_h iw[h] relu(q_h . key) * scale, ascending; nsel[t]
     * = top_k, or -1 (every visible row).  score: scratch [n, max_vis]. */
    int (*indexer)(ds4_backend_ctx *c, const float *qi, const float *iw, int32_t n, int64_t p0, int32_t IH, int32_t ID,
                   const float *keys, int32_t ratio, int32_t top_k, float scale, float *score, int32_t max_vis,
                   int32_t *sel, int32_t *nsel, char *err, size_t len);
    /* Sink softmax attention, V = K (spec ds4.md §2.2): for each (token, head) the window keys of
     * the ring, then the compressed rows (ratio > 0: selected by sel/nsel when given, else all
     * visible); sc: scratch [n * NH, keys_cap]. */
    int (*attend)(ds4_backend_ctx *c, const float *q, int32_t n, int32_t NH, int32_t D, int64_t p0, int32_t window,
                  const float *kv, int32_t kv_cap, const float *comp, int32_t ratio, const int32_t *sel,
                  const int32_t *nsel, int32_t top_k, const float *sinks, float *sc, int32_t keys_cap, float *att,
                  char *err, size_t len);
    /* MoE routing (spec ds4.md §2.7): scores [n, E] -> sqrt(softplus); the K experts (hash table
     * tid2eid [vocab, K] by token, or top-k of score + bias) and their weights. */
    int (*moe_route)(ds4_backend_ctx *c, float *scores, int32_t n, int32_t E, int32_t K, const int32_t *tid2eid,
                     const int32_t *tokens, const float *bias, int32_t norm, int32_t ds4n, float scale, int32_t *sel,
                     float *wsel, char *err, size_t len);
    /* a = silu(min(a, clamp)) * clip(b, +-clamp) (clamp <= 0: none), n elements. */
    int (*swiglu)(ds4_backend_ctx *c, float *a, const float *b, int64_t n, float clamp, char *err, size_t len);
    /* y[t] = (sum over t's K experts in ascending id of wsel * oe[t*K + k]) + shared[t]. */
    int (*moe_combine)(ds4_backend_ctx *c, const float *oe, const int32_t *sel, const float *wsel, int32_t n, int32_t K,
                       int32_t H, const float *shared, float *y, char *err, size_t len);
    /* x[i] *= s. */
    int (*scale)(ds4_backend_ctx *c, float *x, int64_t n, float s, char *err, size_t len);
    /* DSpark capture (spec dspark.md §2.2): the stream mean of X [n, HC, H] into ring row
     * (p0 + t) % cap, capture slot `slot` of n_slot. */
    int (*capture)(ds4_backend_ctx *c, const float *X, int32_t n, int32_t HC, int32_t H, int64_t p0, float *ring,
                   int32_t cap, int32_t n_slot, int32_t slot, char *err, size_t len);
    /* The drafter's non-causal block attention (spec dspark.md §2.4): every one of the n block rows
     * attends to the context ring rows of positions lo .. lo+n_ctx-1 (row p % cap), then to all
     * n_rows block KV rows, with the head's sink; V = K. */
    int (*attend_nc)(ds4_backend_ctx *c, const float *q, int32_t n, int32_t NH, int32_t D, const float *ring, int32_t cap,
                     int64_t lo, int32_t n_ctx, const float *rows, int32_t n_rows, const float *sinks, float *sc,
                     int32_t keys_cap, float *att, char *err, size_t len);

    /* ---- version 2 ---------------------------------------------------------------------------
     * A weight matrix of `rows` rows (all experts of a stack together) into device memory, in the
     * planar layout when want_planar and the rows allow it (staged through a 64 MiB buffer);
     * *layout gets the id the matmul entry points take.  Freed with free(rows * row_bytes). */
    int (*upload_matrix)(ds4_backend_ctx *c, const void *src, int32_t type, int64_t rows, int64_t cols,
                         int64_t row_bytes, int32_t want_planar, void **out, int32_t *layout, char *err, size_t len);
    /* Size the host-activation staging of `matmul` for x_floats in and y_floats out now, so that
     * device memory stays constant while a session runs. */
    int (*reserve)(ds4_backend_ctx *c, int64_t x_floats, int64_t y_floats, char *err, size_t len);
    /* *out (device int) = the first i of the largest a[i] + b[i], i < n (ds4_argmax's rule on the
     * float sums; NaN sums are passed over, and a NaN at 0 gives 0 as on the host). */
    int (*add_argmax)(ds4_backend_ctx *c, const float *a, const float *b, int32_t n, int32_t *out, char *err, size_t len);

    /* ---- version 3 ---------------------------------------------------------------------------
     * 1: "device" memory is host memory (the CPU backend): a vector may be used where it lies,
     * and a device buffer may be read by the host without a copy.  0 on a GPU backend. */
    int32_t host_memory;

    /* ---- version 5 ---------------------------------------------------------------------------
     * The prefill_gemm numerics option (spec platform.md §7): `mode` (DS4_PREFILL_GEMM_OFF, _BF16
     * or _F16) for the products queued after this call.  Under BF16/F16, mm and mm_gather of
     * planar Q8_0 / Q2_K / IQ2_XXS matrices round the activations and dequantised weight tiles to
     * that 16-bit type and multiply on the matrix units through the vendor's BLAS (float32
     * accumulation and results); other layouts keep the float32 kernels.  Results then depend on
     * the number of rows, so the engine sets it only around passes of at least
     * DS4_PREFILL_GEMM_MIN_ROWS tokens.  The first BF16/F16 call on a context loads the BLAS
     * (dlopen, once per process): DS4_E_UNSUPPORTED naming the files tried when it cannot.  info
     * (may be NULL): the library, e.g. "cuBLAS 13.0.2 (libcublas.so.13)".  NULL on the CPU
     * backend. */
    int (*gemm)(ds4_backend_ctx *c, int32_t mode, char *info, size_t info_len, char *err, size_t len);

    /* ---- version 6 ---------------------------------------------------------------------------
     * The activations numerics option (spec ds4.md §2.9.5): `mode` DS4_ACTIVATIONS_F32 or _Q8 for
     * the products queued after this call.  Under Q8, mm, mm_gather and matmul of Q8_0 / Q2_K /
     * IQ2_XXS matrices (planar or GGML layout) quantise the activations to 8 bits in blocks of 32 and
     * sum exact integer block products (hip/q8.hip), unless the prefill_gemm mode takes the product;
     * other types keep float32.  DS4_E_INVALID for another mode.  NULL on the CPU backend (it takes the option
     * at open). */
    int (*activations)(ds4_backend_ctx *c, int32_t mode, char *err, size_t len);

    /* ---- version 7 ---------------------------------------------------------------------------
     * Graphs (the gpu_graphs option, spec platform.md §8).  graph_begin starts capturing the
     * context's stream: the ops queued until graph_end are recorded, not run.  While capturing,
     * an op given position p (norm_rope, kv_store, compress, indexer, attend, capture) records its
     * kernels to read the pass's first position from the device word *dp0 (int64, written by the
     * caller before each launch) plus p - p0, where p0 is the position of the pass being captured;
     * compress ignores w0/nw and finds the windows that close in the kernel; indexer sizes its grid
     * for positions up to ds4_graph_span(p0 + n).  Nothing may copy to or from the host or
     * synchronise while capturing.  graph_end(ok): ends the capture and, when ok, instantiates the
     * graph into *graph (an opaque handle); ok = 0 discards it.  A capture or instantiation the
     * runtime refuses is DS4_E_UNSUPPORTED with the runtime's reason.  graph_launch queues one
     * replay of the whole pass on the stream; graph_free releases a handle.  NULL on the CPU
     * backend. */
    int (*graph_begin)(ds4_backend_ctx *c, const int64_t *dp0, int64_t p0, char *err, size_t len);
    int (*graph_end)(ds4_backend_ctx *c, int32_t ok, void **graph, char *err, size_t len);
    int (*graph_launch)(ds4_backend_ctx *c, void *graph, char *err, size_t len);
    void (*graph_free)(ds4_backend_ctx *c, void *graph);

    /* ---- version 8 ---------------------------------------------------------------------------
     * Greedy picks where the logits are (spec platform.md §9): for each of `rows` rows of x
     * [rows, ld] (n entries each), ids[r] = the first index of the row's largest entry (ds4_argmax's
     * rule: NaN entries are passed over, a NaN at 0 gives 0) and bad[r] = the index of the row's
     * first non-finite entry (inf or NaN), or -1.  ids, bad: device int32 [rows], queued like the
     * other ops.  NULL on the CPU backend (its logits are in host memory already). */
    int (*argmax_rows)(ds4_backend_ctx *c, const float *x, int64_t ld, int32_t rows, int32_t n, int32_t *ids,
                       int32_t *bad, char *err, size_t len);

    /* ---- version 9 ---------------------------------------------------------------------------
     * Grouped products (the attention's grouped output projection, spec ds4.md §2.2): for token
     * t < n and group g < groups, Y[(t*groups + g)*rows + r] = W_g[r, :] . X[(t*groups + g)*cols + :],
     * W_g the matrix at g * mat_bytes: mm_gather's products over the n*groups slots s = t*groups + g
     * with ids[s] = g (ids: that device list), which a backend may run as they are; a GPU backend
     * may instead read each group's matrix once for several tokens.  A (token, group, row) result
     * does not depend on n.  The CPU backend runs it as that gather (which groups the slots by
     * matrix already). */
    int (*mm_grouped)(ds4_backend_ctx *c, int32_t type, const void *W, int64_t mat_bytes, const int32_t *ids,
                      int32_t groups, int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t n,
                      float *Y, char *err, size_t len);

    /* ---- version 10 --------------------------------------------------------------------------
     * Shared 8-bit activations (spec ds4.md §2.9.5, the GPU paragraph): the products under q8
     * activations that read rows of X [n, cols] (stride ldx, device floats) after this call and
     * before the next one may use one quantisation of them, made now, instead of each quantising
     * them again; the same codes and scales, so no result changes.  X NULL ends it.  The caller
     * ends it (or shares other rows) before anything writes those rows.  A backend may share
     * nothing (the GPU backend shares passes of 2-8 rows of at most 32768 columns under q8);
     * NULL on the CPU backend. */
    int (*q8_share)(ds4_backend_ctx *c, const float *X, int64_t ldx, int64_t n, int64_t cols, char *err, size_t len);
} ds4_backend;

typedef const ds4_backend *(*ds4_gpu_api_fn)(void);

/* gpu.c: load a backend library by path, once per process (it is never unloaded); on failure err
 * says which file and why (dlopen's text, missing symbol, version). */
int ds4_gpu_load(const char *path, void **handle, const ds4_backend **api, char *err, size_t len);

#ifdef __cplusplus
}
#endif

#endif
