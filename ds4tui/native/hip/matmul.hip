/*
 * matmul.hip — quantised matvec / small-batch matmul on device-resident GGML weights.
 *
 * Y[t, r] = sum_c W[r, c] * X[t, c] for the GGML types the DS4 files use (spec ds4.md §5): F32,
 * F16, BF16, Q8_0 (34-byte blocks of 32), Q2_K (84-byte blocks of 256), IQ2_XXS (66-byte blocks of
 * 256).  Activations stay float32, as in the CPU kernels (cpu/matmul.c): each weight is formed in
 * float exactly as the format defines it and multiplied into the activation with an explicit fmaf,
 * so GPU and CPU differ only by float32 summation order.  (An 8-bit activation path with dp4a /
 * v_dot4 changes numerics; it will be an explicit engine option, never a silent default.)
 *
 * Layout: one 32-lane warp per weight row (MM_WARPS warps for matrices of fewer than
 * MM_SHORT_ROWS rows, MM_TINY_WARPS for fewer than MM_TINY_ROWS); lane l takes the 8-element chunks l, l+32, l+64, ... (32 x 8 = 256 elements
 * per warp step: one K-quant super-block), and up to MM_NT tokens share each chunk's dequantised
 * weights.  A token's accumulator sees the same operations whatever the
 * batch size, so results are batch-invariant (greedy DSpark verification relies on it), and the
 * final warp reduction is one fixed butterfly.
 */
#include "quant.h"

#include <string.h>

#include <algorithm>
#include <vector>

#define MM_NT 8     /* tokens per warp */
/* tokens per warp of a pass of 2..MM_NT tokens (a verify, the drafter's block): more grid rows, less
 * serial work a warp (H200, ncu, 6 tokens: the float products of 2 synthetic layers 196 -> 160 us at 2,
 * the 24-row mixers 11.4 -> 5.5 us a launch; tools/gpu_notes.md, 2026-12-04); at 3 a verify of 1 + 5
 * rows reads each matrix twice instead of three times (H100, the same products 170.8 -> 152.4 us; at 6
 * 174.5: the 1024-thread mixers' blocks then hold too few registers a token and spill, 83.6 -> 101.0;
 * tools/gpu_notes.md, 2026-12-06) */
#define MM_SMALL_NT 3
#define MM_WARPS 4  /* warps (rows) per block */

int gpu_matmul_init(char *err, size_t len) {
    int rc = quant_tables_init(err, len);
    if (rc == DS4_OK) rc = gpu_planar_init(err, len);
    if (rc == DS4_OK) rc = gpu_q8_init(err, len);
    return rc == DS4_OK ? gpu_gemm_init(err, len) : rc;
}

/* WPR warps per row: 1 (MM_WARPS rows per block) for tall matrices, MM_WARPS (one row per block)
 * for short ones, so that a matvec with a few thousand rows still keeps every multiprocessor busy.
 * The choice depends only on the matrix shape, never on the token count (batch invariance). */
/* NT tokens per warp: MM_NT, MM_SMALL_NT for a pass of at most MM_NT tokens, or 1 for a single-token pass (fewer
 * registers, more warps in flight).
 * A token's accumulator sees the same fmaf sequence and the same reduction either way, so the
 * results are bit-identical (tests/test_gpu_backend.py checks one-token passes against prefill). */
template <int TYPE, int WPR, int NT>
__global__ void __launch_bounds__(GPU_WARP * (WPR > MM_WARPS ? WPR : MM_WARPS))
mm_kernel(const uint8_t *__restrict__ W, int64_t rows, int64_t cols, int64_t row_bytes,
          const float *__restrict__ X, int64_t ldx, int64_t n, float *__restrict__ Y, int64_t ldy) {
    const int lane = threadIdx.x, wp = threadIdx.y;
    const int64_t r = WPR == 1 ? (int64_t)blockIdx.x * MM_WARPS + wp : (int64_t)blockIdx.x;
    if (r >= rows) return; /* uniform over the block when WPR > 1 */
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int nt = (int)(n - t0 < NT ? n - t0 : NT);
    const uint8_t *row = W + r * row_bytes;
    float acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    const int64_t nchunk = (cols + 7) / 8;
    const int tid = (WPR == 1 ? 0 : wp) * GPU_WARP + lane;
    /* several tokens in blocks of at most MM_WARPS warps: every token's chunk is loaded before the
     * first fmaf, so the NT loads are in flight together (a token past the pass's last reads the
     * first token's chunk and adds nothing); then each token's fmaf sequence is the one below.  (The
     * 1024-thread blocks of the tiny matrices have too few registers a thread for it.) */
    if constexpr (NT > 1 && WPR <= MM_WARPS) {
        const bool x16 = !((uintptr_t)X & 15) && !(ldx & 3); /* every whole chunk 16-byte aligned */
        for (int64_t c = tid; c < nchunk; c += GPU_WARP * WPR) {
            const int m = (int)(cols - 8 * c < 8 ? cols - 8 * c : 8);
            float w[8];
            Chunk<TYPE>::load(row, c, m, w);
            if (m == 8) {
                float xv[NT][8];
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const float *x = X + (t0 + (t < nt ? t : 0)) * ldx + 8 * c;
                    if (x16) {
                        const float4 a = ((const float4 *)x)[0], b = ((const float4 *)x)[1];
                        xv[t][0] = a.x; xv[t][1] = a.y; xv[t][2] = a.z; xv[t][3] = a.w;
                        xv[t][4] = b.x; xv[t][5] = b.y; xv[t][6] = b.z; xv[t][7] = b.w;
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; j++) xv[t][j] = x[j];
                    }
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < nt) {
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[t] = fmaf(w[j], xv[t][j], acc[t]);
                    }
                }
            } else {
                for (int t = 0; t < nt; t++) {
                    const float *x = X + (t0 + t) * ldx + 8 * c;
                    for (int j = 0; j < m; j++) acc[t] = fmaf(w[j], x[j], acc[t]);
                }
            }
        }
    } else {
#pragma unroll 2
        for (int64_t c = tid; c < nchunk; c += GPU_WARP * WPR) {
            const int m = (int)(cols - 8 * c < 8 ? cols - 8 * c : 8);
            float w[8];
            Chunk<TYPE>::load(row, c, m, w);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float *x = X + (t0 + t) * ldx + 8 * c;
                    if (m == 8 && !((uintptr_t)x & 15)) { /* 16-byte loads; the same fmaf sequence */
                        const float4 a = ((const float4 *)x)[0], b = ((const float4 *)x)[1];
                        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[t] = fmaf(w[j], xv[j], acc[t]);
                    } else {
                        for (int j = 0; j < m; j++) acc[t] = fmaf(w[j], x[j], acc[t]);
                    }
                }
            }
        }
    }
    if (WPR == 1) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = gpu_warp_sum(acc[t]);
            if (lane == 0 && t < nt) Y[(t0 + t) * ldy + r] = v;
        }
    } else {
        __shared__ float part[NT][WPR];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = gpu_warp_sum(acc[t]);
            if (lane == 0) part[t][wp] = v;
        }
        __syncthreads();
        if (wp == 0 && lane < nt) {
            float v = part[lane][0];
            for (int k = 1; k < WPR; k++) v += part[lane][k];
            Y[(t0 + lane) * ldy + r] = v;
        }
    }
}

/* Tall matrices of short rows (at most 16 chunks of 8 columns: the drafter's Markov W2, 129280 rows
 * of 32 columns): G lanes per row (G a power of two >= the chunks), 32 / G rows per warp, instead
 * of a warp per row with most lanes idle.  Lane c of a row's group holds chunk c's fmaf sequence
 * from 0, as in mm_kernel; the group's butterfly (masks G/2 .. 1) is mm_kernel's warp butterfly
 * without its first steps, which there only add the idle lanes' zeros: the same sums. */
template <int TYPE, int G, int NT>
__global__ void __launch_bounds__(GPU_WARP * MM_WARPS)
mm_short_kernel(const uint8_t *__restrict__ W, int64_t rows, int64_t cols, int64_t row_bytes,
                const float *__restrict__ X, int64_t ldx, int64_t n, float *__restrict__ Y, int64_t ldy) {
    const int lane = threadIdx.x, wp = threadIdx.y, c = lane % G;
    const int64_t r = ((int64_t)blockIdx.x * MM_WARPS + wp) * (GPU_WARP / G) + lane / G;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int nt = (int)(n - t0 < NT ? n - t0 : NT);
    float acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    const int64_t nchunk = (cols + 7) / 8;
    if (r < rows && c < nchunk) { /* no early return: every lane takes part in the butterfly */
        const int m = (int)(cols - 8 * c < 8 ? cols - 8 * c : 8);
        float w[8];
        Chunk<TYPE>::load(W + r * row_bytes, c, m, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float *x = X + (t0 + t) * ldx + 8 * c;
                for (int j = 0; j < m; j++) acc[t] = fmaf(w[j], x[j], acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
        for (int msk = G / 2; msk > 0; msk >>= 1) acc[t] += gpu_shfl_xor(acc[t], msk);
    if (r < rows && c == 0)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) Y[(t0 + t) * ldy + r] = acc[t];
}

template <int TYPE, int G, int NT>
static void mm_short_launch(hipStream_t st, const uint8_t *w, int64_t rows, int64_t cols, int64_t row_bytes,
                            const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy) {
    const int64_t per_block = (int64_t)MM_WARPS * (GPU_WARP / G);
    hipLaunchKernelGGL((mm_short_kernel<TYPE, G, NT>), dim3((unsigned)((rows + per_block - 1) / per_block),
                       (unsigned)((n + NT - 1) / NT)), dim3(GPU_WARP, MM_WARPS), 0, st, w, rows, cols, row_bytes, X, ldx,
                       n, Y, ldy);
}

/* Rows below which a row gets MM_WARPS warps, and below which it gets MM_TINY_WARPS (the HC
 * control and router matrices: a few dozen to a few hundred rows of up to 16384 columns), as long as
 * its chunks fill them: a tiny matrix of fewer than MM_TINY_UNITS chunks a row takes MM_WARPS warps
 * a row, and of fewer than MM_WARPS_UNITS one warp a row (the small models' mixers and heads: rows of
 * 256-1024 columns left 31 of 32 warps idle and paid their block-wide sum).  The choice depends only
 * on the matrix shape, never on the token count (batch invariance). */
#define MM_SHORT_ROWS 8192
#define MM_TINY_ROWS 320
#define MM_TINY_WARPS 32
#define MM_TINY_UNITS 512
#define MM_WARPS_UNITS 128

template <int TYPE, int NT>
static void mm_launch_nt(hipStream_t st, const uint8_t *w, int64_t rows, int64_t cols, int64_t row_bytes,
                         const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy) {
    const dim3 block(GPU_WARP, MM_WARPS);
    const unsigned gy = (unsigned)((n + NT - 1) / NT);
    const int64_t units = (cols + 7) / 8;
    if (rows < MM_TINY_ROWS && units >= MM_TINY_UNITS)
        hipLaunchKernelGGL((mm_kernel<TYPE, MM_TINY_WARPS, NT>), dim3((unsigned)rows, gy), dim3(GPU_WARP, MM_TINY_WARPS),
                           0, st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
    else if (rows < MM_TINY_ROWS && units < MM_WARPS_UNITS)
        hipLaunchKernelGGL((mm_kernel<TYPE, 1, NT>), dim3((unsigned)((rows + MM_WARPS - 1) / MM_WARPS), gy), block, 0,
                           st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
    else if (rows < MM_SHORT_ROWS)
        hipLaunchKernelGGL((mm_kernel<TYPE, MM_WARPS, NT>), dim3((unsigned)rows, gy), block, 0, st, w, rows, cols,
                           row_bytes, X, ldx, n, Y, ldy);
    else if ((cols + 7) / 8 <= 4) /* a tall matrix of short rows: 4 lanes a row (8 for <= 64 columns, 16 ...) */
        mm_short_launch<TYPE, 4, NT>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
    else if ((cols + 7) / 8 <= 8)
        mm_short_launch<TYPE, 8, NT>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
    else if ((cols + 7) / 8 <= 16)
        mm_short_launch<TYPE, 16, NT>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
    else
        hipLaunchKernelGGL((mm_kernel<TYPE, 1, NT>), dim3((unsigned)((rows + MM_WARPS - 1) / MM_WARPS), gy), block, 0,
                           st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
}

template <int TYPE>
static void mm_launch_t(hipStream_t st, const uint8_t *w, int64_t rows, int64_t cols, int64_t row_bytes,
                        const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy) {
    if (n == 1) mm_launch_nt<TYPE, 1>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
    else if (n <= MM_NT) mm_launch_nt<TYPE, MM_SMALL_NT>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
    else mm_launch_nt<TYPE, MM_NT>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy);
}

int gpu_matmul_launch(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                      const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len) {
    if (rows <= 0 || n <= 0) return DS4_OK;
    hipStream_t st = c->stream;
    if (c->act_q8 && gpu_q8_type(type)) /* GGML layout */
        return gpu_q8_launch(c, type, W, 0, NULL, 0, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy, err, len);
    if (type & DS4_GPU_PLANAR)
        return gpu_planar_launch(c, type, W, 0, NULL, 0, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy, err, len);
    const uint8_t *w = (const uint8_t *)W;
    switch (type) {
    case DS4_TYPE_F32: mm_launch_t<DS4_TYPE_F32>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy); break;
    case DS4_TYPE_F16: mm_launch_t<DS4_TYPE_F16>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy); break;
    case DS4_TYPE_BF16: mm_launch_t<DS4_TYPE_BF16>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy); break;
    case DS4_TYPE_Q8_0: mm_launch_t<DS4_TYPE_Q8_0>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy); break;
    case DS4_TYPE_Q2_K: mm_launch_t<DS4_TYPE_Q2_K>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy); break;
    case DS4_TYPE_IQ2_XXS: mm_launch_t<DS4_TYPE_IQ2_XXS>(st, w, rows, cols, row_bytes, X, ldx, n, Y, ldy); break;
    default:
        return gpu_fail(err, len, DS4_E_UNSUPPORTED, "GPU matmul: GGML type %d has no kernel (expected F32, F16, BF16, "
                        "Q8_0, Q2_K or IQ2_XXS)", type);
    }
    /* the message is formatted only on failure: a launch costs no host formatting */
    const hipError_t e_launch = hipGetLastError();
    if (e_launch != hipSuccess)
        return gpu_fail(err, len, DS4_E_DEVICE,
                        "GPU matmul launch (type %d, %lld x %lld, %lld tokens): %s (%s)",
                        type, (long long)rows, (long long)cols, (long long)n, hipGetErrorString(e_launch),
                        hipGetErrorName(e_launch));
    return DS4_OK;
}

/* Expert-gathered products (MoE): slot s uses matrix ids[s] of a stack of matrices (mat_bytes apart)
 * and activation row s / x_div of X; Y[s * ldy + r].  One slot per grid row, so a slot's result
 * does not depend on how many slots run (batch-invariant, like mm_kernel). */
template <int TYPE>
__global__ void __launch_bounds__(GPU_WARP * MM_WARPS)
mm_gather_kernel(const uint8_t *__restrict__ W, int64_t mat_bytes, const int32_t *__restrict__ ids, int64_t rows,
                 int64_t cols, int64_t row_bytes, const float *__restrict__ X, int64_t ldx, int x_div,
                 float *__restrict__ Y, int64_t ldy) {
    const int lane = threadIdx.x;
    const int64_t r = (int64_t)blockIdx.x * MM_WARPS + threadIdx.y; /* one warp per row: rows x slots is large */
    if (r >= rows) return;
    const int64_t slot = blockIdx.y;
    const uint8_t *row = W + (int64_t)ids[slot] * mat_bytes + r * row_bytes;
    const float *xs = X + (slot / x_div) * ldx;
    float acc = 0.0f;
    const int64_t nchunk = (cols + 7) / 8;
#pragma unroll 4
    for (int64_t c = lane; c < nchunk; c += GPU_WARP) {
        const int m = (int)(cols - 8 * c < 8 ? cols - 8 * c : 8);
        float w[8];
        Chunk<TYPE>::load(row, c, m, w);
        const float *x = xs + 8 * c;
        for (int j = 0; j < m; j++) acc = fmaf(w[j], x[j], acc);
    }
    const float v = gpu_warp_sum(acc);
    if (lane == 0) Y[slot * ldy + r] = v;
}

int gpu_mm_gather(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t mat_bytes, const int32_t *ids, int64_t rows,
                  int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int32_t x_div, int64_t n_slots,
                  float *Y, int64_t ldy, char *err, size_t len) {
    if (rows <= 0 || n_slots <= 0) return DS4_OK;
    if (x_div < 1) return gpu_fail(err, len, DS4_E_INVALID, "GPU expert matmul: x_div %d < 1", x_div);
    if (gpu_gemm_takes(c, type, cols, 0)) /* a prefill pass under the prefill_gemm option (gemm.hip) */
        return gpu_gemm_gather(c, type, W, mat_bytes, ids, rows, cols, row_bytes, X, ldx, x_div, n_slots, Y, ldy, err,
                               len);
    /* slots go on grid y (at most 65535 per launch): launch in chunks of whole activation rows */
    const int64_t chunk = 65535 - 65535 % x_div;
    for (int64_t s0 = 0; s0 < n_slots; s0 += chunk) {
        const int64_t ns = n_slots - s0 < chunk ? n_slots - s0 : chunk;
        const float *Xs = X + (s0 / x_div) * ldx;
        float *Ys = Y + s0 * ldy;
        if (type & DS4_GPU_PLANAR) {
            int rc = gpu_planar_launch(c, type, W, mat_bytes, ids + s0, ns, rows, cols, row_bytes, Xs, ldx,
                                       x_div, 1, Ys, ldy, err, len);
            if (rc != DS4_OK) return rc;
            continue;
        }
        if (c->act_q8 && gpu_q8_type(type)) {
            int rc = gpu_q8_launch(c, type, W, mat_bytes, ids + s0, ns, rows, cols, row_bytes, Xs, ldx, x_div, 1,
                                   Ys, ldy, err, len);
            if (rc != DS4_OK) return rc;
            continue;
        }
        const dim3 block(GPU_WARP, MM_WARPS), grid((unsigned)((rows + MM_WARPS - 1) / MM_WARPS), (unsigned)ns);
        GPU_TYPE_SWITCH(type, mm_gather_kernel, grid, block, 0, c->stream, (const uint8_t *)W, mat_bytes, ids + s0,
                        rows, cols, row_bytes, Xs, ldx, x_div, Ys, ldy)
        GPU_TRY(hipGetLastError(), "GPU expert matmul launch");
    }
    return DS4_OK;
}

/* Grouped products (backend.h version 9): the products of gpu_mm_gather over the n * groups slots
 * s = t * groups + g with ids[s] = g, X rows of cols floats and Y rows of `rows` floats.  Under q8
 * activations (and no prefill GEMM) one block takes up to 8 tokens of a group (gpu_q8_grouped), so a
 * verify reads each group's matrix once; its one-token launch is the gather's, bit for bit.
 * Otherwise the gather runs. */
int gpu_mm_grouped(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t mat_bytes, const int32_t *ids, int32_t groups,
                   int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t n, float *Y, char *err,
                   size_t len) {
    if (rows <= 0 || n <= 0 || groups <= 0) return DS4_OK;
    const int32_t base = type & ~DS4_GPU_PLANAR;
    const bool planar_ok = !(type & DS4_GPU_PLANAR) ||
                           (!((uintptr_t)W & 15) && !((uintptr_t)X & 15) && !(cols & 3) && !(mat_bytes & 15));
    if (c->act_q8 && gpu_q8_type(base) && planar_ok && !gpu_gemm_takes(c, type, cols, 0))
        return gpu_q8_grouped(c, type, W, mat_bytes, groups, rows, cols, row_bytes, X, n, Y, err, len);
    return gpu_mm_gather(c, type, W, mat_bytes, ids, rows, cols, row_bytes, X, cols, 1, n * groups, Y, rows, err, len);
}

/* Device activations in and out, queued on the context's stream. */
int gpu_mm_dev(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
               const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len) {
    if (rows > 0 && n > 0 && !((uintptr_t)X & 15) && !(ldx & 3) && gpu_gemm_takes(c, type, cols, 1)) /* prefill_gemm */
        return gpu_gemm_dense(c, type, W, rows, cols, row_bytes, X, ldx, n, Y, ldy, err, len);
    return gpu_matmul_launch(c, type, W, rows, cols, row_bytes, X, ldx, n, Y, ldy, err, len);
}

/* Host activations in, host results out (the drafter's host-row products: the confidence head and
 * the sampled path).  The rows go through the context's pinned staging buffers both ways: X's rows
 * are packed into stage[0] and copied in, Y's rows come back into stage[1] and are unpacked to ldy
 * (no strided copy from or to pageable memory, which ROCm runs synchronously or, on RDNA, has hung
 * in).  Tokens go in groups that fit a staging buffer; a (row, token) result does not depend on the
 * group (batch invariance). */
int gpu_matmul(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
               const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len) {
    if (n <= 0 || rows <= 0) return DS4_OK;
    const int64_t widest = cols > rows ? cols : rows;
    const int64_t group = (int64_t)(GPU_STAGE_BYTES / sizeof(float)) / widest;
    if (group < 1)
        return gpu_fail(err, len, DS4_E_INVALID, "GPU matmul with host rows: a row of %lld floats exceeds the %zu-byte "
                        "staging buffer", (long long)widest, GPU_STAGE_BYTES);
    const int64_t g = n < group ? n : group;
    pthread_mutex_lock(&c->lock);
    int rc = gpu_stage_wait(c, err, len);
    if (rc == DS4_OK) rc = gpu_stage(c, &c->dx, &c->dx_cap, (size_t)(g * cols), err, len);
    if (rc == DS4_OK) rc = gpu_stage(c, &c->dy, &c->dy_cap, (size_t)(g * rows), err, len);
    float *hx = (float *)c->stage[0], *hy = (float *)c->stage[1];
    for (int64_t t0 = 0; rc == DS4_OK && t0 < n; t0 += g) {
        const int64_t nt = n - t0 < g ? n - t0 : g;
        for (int64_t t = 0; t < nt; t++) memcpy(hx + t * cols, X + (t0 + t) * ldx, (size_t)cols * sizeof(float));
        hipError_t e = hipMemcpyAsync(c->dx, hx, (size_t)(nt * cols) * sizeof(float), hipMemcpyHostToDevice, c->stream);
        if (e != hipSuccess) {
            rc = gpu_fail(err, len, DS4_E_DEVICE, "copy activations to the device: %s", hipGetErrorString(e));
            break;
        }
        rc = gpu_matmul_launch(c, type, W, rows, cols, row_bytes, c->dx, cols, nt, c->dy, rows, err, len);
        if (rc != DS4_OK) break;
        e = hipMemcpyAsync(hy, c->dy, (size_t)(nt * rows) * sizeof(float), hipMemcpyDeviceToHost, c->stream);
        if (e == hipSuccess) e = hipStreamSynchronize(c->stream);
        if (e != hipSuccess) {
            rc = gpu_fail(err, len, DS4_E_DEVICE, "GPU matmul (type %d, %lld x %lld): %s", type, (long long)rows,
                          (long long)cols, hipGetErrorString(e));
            break;
        }
        for (int64_t t = 0; t < nt; t++) memcpy(Y + (t0 + t) * ldy, hy + t * rows, (size_t)rows * sizeof(float));
    }
    if (rc != DS4_OK) (void)hipStreamSynchronize(c->stream); /* nothing left reading the staging buffers */
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int gpu_bench_matmul(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                     const float *X, int64_t n, float *Y, int32_t reps, double *ms, char *err, size_t len) {
    if (reps < 1) return gpu_fail(err, len, DS4_E_INVALID, "reps must be >= 1, got %d", reps);
    void *dw = NULL, *dx = NULL, *dy = NULL;
    const size_t wb = (size_t)rows * (size_t)row_bytes, xb = (size_t)(n * cols) * sizeof(float),
                 yb = (size_t)(n * rows) * sizeof(float);
    int32_t layout = type;
    int rc = gpu_upload_matrix(c, W, type & ~DS4_GPU_PLANAR, rows, cols, row_bytes, (type & DS4_GPU_PLANAR) != 0, &dw,
                               &layout, err, len);
    if (rc == DS4_OK && layout != type)
        rc = gpu_fail(err, len, DS4_E_INVALID, "bench: GGML type %d with %lld columns cannot take the planar layout "
                      "(rows of %lld bytes)", type & ~DS4_GPU_PLANAR, (long long)cols, (long long)row_bytes);
    if (rc == DS4_OK) rc = gpu_alloc(c, xb, &dx, err, len);
    if (rc == DS4_OK) rc = gpu_alloc(c, yb, &dy, err, len);
    hipEvent_t e0 = NULL, e1 = NULL;
    std::vector<float> times;
    if (rc == DS4_OK) {
        pthread_mutex_lock(&c->lock);
        rc = gpu_put(c, dx, X, xb, err, len);
        pthread_mutex_unlock(&c->lock);
    }
    if (rc == DS4_OK) {
        hipError_t e = hipMemsetAsync(dy, 0xff, yb, c->stream); /* NaN poison: every element must be written */
        if (e == hipSuccess) e = hipStreamSynchronize(c->stream);
        if (e == hipSuccess) e = hipEventCreate(&e0);
        if (e == hipSuccess) e = hipEventCreate(&e1);
        if (e != hipSuccess) rc = gpu_fail(err, len, DS4_E_DEVICE, "bench setup: %s", hipGetErrorString(e));
    }
    for (int i = 0; rc == DS4_OK && i <= reps; i++) {
        hipError_t e = hipEventRecord(e0, c->stream);
        if (e != hipSuccess) { rc = gpu_fail(err, len, DS4_E_DEVICE, "event: %s", hipGetErrorString(e)); break; }
        rc = gpu_matmul_launch(c, layout, dw, rows, cols, row_bytes, (const float *)dx, cols, n, (float *)dy,
                               rows, err, len);
        if (rc != DS4_OK) break;
        e = hipEventRecord(e1, c->stream);
        if (e == hipSuccess) e = hipEventSynchronize(e1);
        float t = 0.0f;
        if (e == hipSuccess) e = hipEventElapsedTime(&t, e0, e1);
        if (e != hipSuccess) { rc = gpu_fail(err, len, DS4_E_DEVICE, "GPU matmul run: %s", hipGetErrorString(e)); break; }
        if (i > 0) times.push_back(t); /* run 0 is the warm-up */
    }
    if (rc == DS4_OK) {
        hipError_t e = hipMemcpy(Y, dy, yb, hipMemcpyDeviceToHost);
        if (e != hipSuccess) rc = gpu_fail(err, len, DS4_E_DEVICE, "copy results back: %s", hipGetErrorString(e));
    }
    if (rc == DS4_OK && ms) {
        std::sort(times.begin(), times.end());
        *ms = times[times.size() / 2];
    }
    if (e0) (void)hipEventDestroy(e0);
    if (e1) (void)hipEventDestroy(e1);
    gpu_free(c, dw, wb);
    gpu_free(c, dx, xb);
    gpu_free(c, dy, yb);
    return rc;
}
