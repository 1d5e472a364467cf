/*
 * gemm.hip — the prefill products on the matrix units (tensor cores / WMMA) through the vendor's
 * BLAS, loaded at run time: the `prefill_gemm` numerics option (spec platform.md §7).
 *
 * The BLAS is never linked: the first use dlopen()s it (cuBLAS on NVIDIA: libcublas.so.13 / .12;
 * rocBLAS on AMD: librocblas.so.5 / .4) and looks up the few entry points declared below, so the
 * build machines, CI and CPU-only machines need no BLAS, and a machine without it gets a message
 * naming the files tried.
 *
 * A product of a planar Q8_0 / Q2_K / IQ2_XXS matrix (hip/planar.hip) with many activation rows
 * runs as:
 *   1. the activation rows rounded to the option's 16-bit type (bf16 or f16, round to nearest even)
 *      into a scratch buffer, gathered by slot for the expert products;
 *   2. a tile of weight rows (or of whole expert matrices) dequantised to the same 16-bit type,
 *      each weight formed in float32 exactly as the planar kernels form it, then rounded once;
 *   3. one GEMM per tile with float32 accumulation and float32 results, written in place (dense),
 *      or one strided-batched GEMM per tile of whole expert matrices into a slot-grouped buffer
 *      that a scatter puts back in slot order (experts).
 * Expert products group the slots by expert on the host (the slot ids come back over one copy), so
 * every used expert's weights are dequantised once per pass and multiplied with all its rows.
 *
 * F16 matrices (the compressors, the router, the mHC control and the indexer's projection) take the
 * same path in either mode with f16 operands: their rows are the GEMM's operand as they lie (exact),
 * and only their activations (RMS-normed rows: far inside f16's range) are rounded to f16.
 *
 * Numerics: both operands are rounded to 16 bits (bf16: 8 significant bits, unit roundoff 2^-9;
 * f16: 11 bits, 2^-12) and the BLAS sums in float32 in its own order, so results differ from the
 * float32 kernels by about u * sum |w x| per product, and a row's result depends on how many rows
 * the pass has.  The engine therefore uses this path only for passes of at least
 * DS4_PREFILL_GEMM_MIN_ROWS tokens (prefill chunks): decode steps and DSpark verify passes (at
 * most DS4_DSPARK_MAX_BLOCK + 1 rows) keep the batch-invariant float32 kernels.
 */
#include "quant.h"

#include <dlfcn.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "gemm_plan.h"

/* 16-bit elements of the dequantised weight tile (64 Mi: 128 MiB). */
#define GM_TILE_ELEMS ((int64_t)64 << 20)
/* Rows (slots with their padding) one chunk of an expert product rounds into gm_x and gets back in
 * gm_y at most, or the largest matrix's slot count where that is more (at most the pass's tokens):
 * what bounds those buffers (ds4tui/engine/memplan.py, gemm_bytes, mirrors these bounds). */
#define GM_CHUNK_ROWS ((int64_t)8192)

/* ---- the vendor BLAS, declared here (no vendor headers at build time) ---------------------------- */

typedef void *blas_handle_t;
#if defined(GPU_NVIDIA)
#define BLAS_NAME "cuBLAS"
static const char *const k_blas_files[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
/* cublasOperation_t, cudaDataType_t, cublasComputeType_t, cublasGemmAlgo_t values (cuBLAS API) */
enum { BL_OP_N = 0, BL_OP_T = 1, BL_R_32F = 0, BL_R_16F = 2, BL_R_16BF = 14, BL_COMPUTE_32F = 68, BL_ALGO = -1 };
typedef int (*bl_create_fn)(blas_handle_t *);
typedef int (*bl_destroy_fn)(blas_handle_t);
typedef int (*bl_stream_fn)(blas_handle_t, hipStream_t);
typedef int (*bl_gemm_fn)(blas_handle_t, int, int, int, int, int, const void *, const void *, int, int, const void *,
                          int, int, const void *, void *, int, int, int, int);
typedef int (*bl_gemm_sb_fn)(blas_handle_t, int, int, int, int, int, const void *, const void *, int, int, long long,
                             const void *, int, int, long long, const void *, void *, int, int, long long, int, int,
                             int);
typedef int (*bl_property_fn)(int, int *);
#define BL_SYM_GEMM_SB "cublasGemmStridedBatchedEx"
#define BL_SYM_CREATE "cublasCreate_v2"
#define BL_SYM_DESTROY "cublasDestroy_v2"
#define BL_SYM_STREAM "cublasSetStream_v2"
#define BL_SYM_GEMM "cublasGemmEx"
#else
#define BLAS_NAME "rocBLAS"
static const char *const k_blas_files[] = {"librocblas.so.5", "librocblas.so.4", "librocblas.so"};
/* rocblas_operation, rocblas_datatype, rocblas_gemm_algo values (rocBLAS API) */
enum { BL_OP_N = 111, BL_OP_T = 112, BL_R_32F = 151, BL_R_16F = 150, BL_R_16BF = 168, BL_COMPUTE_32F = 151, BL_ALGO = 0 };
typedef int (*bl_create_fn)(blas_handle_t *);
typedef int (*bl_destroy_fn)(blas_handle_t);
typedef int (*bl_stream_fn)(blas_handle_t, hipStream_t);
/* rocblas_gemm_ex: ..., beta, C, c_type, ldc, D, d_type, ldd, compute_type, algo, solution_index, flags */
typedef int (*bl_gemm_fn)(blas_handle_t, int, int, int, int, int, const void *, const void *, int, int, const void *,
                          int, int, const void *, const void *, int, int, void *, int, int, int, int, int32_t,
                          uint32_t);
/* rocblas_gemm_strided_batched_ex: ..., lda, stride_a, ..., ldc, stride_c, D, d_type, ldd, stride_d, batch_count,
 * compute_type, algo, solution_index, flags */
typedef int (*bl_gemm_sb_fn)(blas_handle_t, int, int, int, int, int, const void *, const void *, int, int, int64_t,
                             const void *, int, int, int64_t, const void *, const void *, int, int, int64_t, void *, int,
                             int, int64_t, int, int, int, int32_t, uint32_t);
typedef int (*bl_version_fn)(char *, size_t);
#define BL_SYM_GEMM_SB "rocblas_gemm_strided_batched_ex"
#define BL_SYM_CREATE "rocblas_create_handle"
#define BL_SYM_DESTROY "rocblas_destroy_handle"
#define BL_SYM_STREAM "rocblas_set_stream"
#define BL_SYM_GEMM "rocblas_gemm_ex"
#endif

static struct {
    pthread_mutex_t lock;
    int tried, ok;
    char file[64], version[96], why[384];
    bl_create_fn create;
    bl_destroy_fn destroy;
    bl_stream_fn set_stream;
    bl_gemm_fn gemm;
    bl_gemm_sb_fn gemm_sb;
} g_blas = {PTHREAD_MUTEX_INITIALIZER, 0, 0, "", "", "", NULL, NULL, NULL, NULL, NULL};

/* Load the BLAS once per process (never unloaded, like this library). */
static int blas_load(void) {
    pthread_mutex_lock(&g_blas.lock);
    if (!g_blas.tried) {
        g_blas.tried = 1;
        void *h = NULL;
        const char *first_err = NULL;
        char first[256] = "";
        for (const char *f : k_blas_files) {
            h = dlopen(f, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
            if (h) {
                snprintf(g_blas.file, sizeof g_blas.file, "%s", f);
                break;
            }
            if (!first_err) {
                first_err = dlerror();
                snprintf(first, sizeof first, "%s", first_err ? first_err : "not found");
            }
        }
        if (!h) {
            snprintf(g_blas.why, sizeof g_blas.why, "%s not found (tried %s, %s, %s: %s)", BLAS_NAME, k_blas_files[0],
                     k_blas_files[1], k_blas_files[2], first);
        } else {
            *(void **)&g_blas.create = dlsym(h, BL_SYM_CREATE);
            *(void **)&g_blas.destroy = dlsym(h, BL_SYM_DESTROY);
            *(void **)&g_blas.set_stream = dlsym(h, BL_SYM_STREAM);
            *(void **)&g_blas.gemm = dlsym(h, BL_SYM_GEMM);
            *(void **)&g_blas.gemm_sb = dlsym(h, BL_SYM_GEMM_SB);
            if (!g_blas.create || !g_blas.destroy || !g_blas.set_stream || !g_blas.gemm || !g_blas.gemm_sb) {
                snprintf(g_blas.why, sizeof g_blas.why, "%s (%s) lacks %s", BLAS_NAME, g_blas.file,
                         !g_blas.create ? BL_SYM_CREATE : !g_blas.destroy ? BL_SYM_DESTROY
                         : !g_blas.set_stream ? BL_SYM_STREAM : !g_blas.gemm ? BL_SYM_GEMM : BL_SYM_GEMM_SB);
            } else {
                g_blas.ok = 1;
#if defined(GPU_NVIDIA)
                bl_property_fn prop;
                *(void **)&prop = dlsym(h, "cublasGetProperty");
                int v[3] = {0, 0, 0};
                if (prop) /* libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2 */
                    for (int i = 0; i < 3; i++) (void)prop(i, &v[i]);
                snprintf(g_blas.version, sizeof g_blas.version, "%d.%d.%d", v[0], v[1], v[2]);
#else
                bl_version_fn ver;
                *(void **)&ver = dlsym(h, "rocblas_get_version_string");
                if (!ver || ver(g_blas.version, sizeof g_blas.version) != 0) snprintf(g_blas.version, sizeof g_blas.version, "?");
#endif
            }
        }
    }
    const int ok = g_blas.ok;
    pthread_mutex_unlock(&g_blas.lock);
    return ok;
}

int gpu_blas_describe(char *out, size_t n) {
    const int ok = blas_load();
    if (ok) snprintf(out, n, "%s %s (%s)", BLAS_NAME, g_blas.version, g_blas.file);
    else snprintf(out, n, "none: %s", g_blas.why);
    return ok;
}

/* ---- kernels --------------------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t gm_bf16(float f) { /* round to nearest even (finite inputs) */
    const uint32_t u = __float_as_uint(f);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
template <bool BF>
__device__ __forceinline__ uint32_t gm_cvt(float f) {
    if (BF) return gm_bf16(f);
    return (uint32_t)__half_as_ushort(__float2half_rn(f));
}
template <bool BF>
__device__ __forceinline__ uint4 gm_pack8(const float v[8]) {
    uint4 o;
    o.x = gm_cvt<BF>(v[0]) | gm_cvt<BF>(v[1]) << 16;
    o.y = gm_cvt<BF>(v[2]) | gm_cvt<BF>(v[3]) << 16;
    o.z = gm_cvt<BF>(v[4]) | gm_cvt<BF>(v[5]) << 16;
    o.w = gm_cvt<BF>(v[6]) | gm_cvt<BF>(v[7]) << 16;
    return o;
}

/* out[y][r][c] (16-bit, row length cols) = weight (r, c) of matrix ids[y] (W + ids[y] * mat_bytes;
 * W itself when ids is NULL), one thread per 16-byte planar code unit (planar.hip). */
template <int TYPE, bool BF>
__global__ void __launch_bounds__(256) gm_dequant_kernel(const uint8_t *__restrict__ W, int64_t mat_bytes,
                                                         const int32_t *__restrict__ ids, int64_t rows, int64_t cols,
                                                         int64_t row_bytes, uint16_t *__restrict__ out) {
    constexpr int BLOCK = TYPE == DS4_TYPE_Q8_0 ? 32 : 256, UNIT = TYPE == DS4_TYPE_Q8_0 ? 16 : 64;
    const int64_t nu = cols / UNIT, nb = cols / BLOCK;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * nu) return;
    const int64_t r = i / nu, u = i % nu;
    if (ids) W += (int64_t)ids[blockIdx.y] * mat_bytes;
    out += (int64_t)blockIdx.y * rows * cols + r * cols;
    const uint8_t *row = W + r * row_bytes;
    const uint4 q = ((const uint4 *)row)[u];
    float v[8];
    if (TYPE == DS4_TYPE_Q8_0) {
        const float d = h2f(((const uint16_t *)(row + 32 * nb))[u >> 1]);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        uint4 *o = (uint4 *)(out + 16 * u);
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = d * (float)(int8_t)((w[2 * h + k / 4] >> (8 * (k & 3))) & 0xffu);
            o[h] = gm_pack8<BF>(v);
        }
    } else if (TYPE == DS4_TYPE_Q2_K) {
        const int64_t b = u >> 2;
        const int j = (int)(u & 3);
        const uint2 s8 = *(const uint2 *)(row + 64 * nb + 16 * b + 8 * (j >> 1));
        const uint32_t sc = (j & 1) ? gpu_byte_perm(s8.x, s8.y, 0x7531u) : gpu_byte_perm(s8.x, s8.y, 0x6420u);
        const uint32_t dm = ((const uint32_t *)(row + 80 * nb))[b];
        const float d = h2f((uint16_t)(dm & 0xffffu)), dmin = h2f((uint16_t)(dm >> 16));
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        const int64_t x0 = 256 * b + 128 * (j >> 1) + 16 * (j & 1);
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const uint32_t scm = (sc >> (8 * s)) & 0xffu;
            const float dl = d * (float)(scm & 15u), ml = dmin * (float)(scm >> 4);
            uint4 *o = (uint4 *)(out + x0 + 32 * s);
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int k = 0; k < 8; k++)
                    v[k] = fmaf(dl, (float)((w[2 * h + k / 4] >> (8 * (k & 3) + 2 * s)) & 3u), -ml);
                o[h] = gm_pack8<BF>(v);
            }
        }
    } else {
        const float d = h2f(((const uint16_t *)(row + 64 * nb))[u >> 2]);
        const uint32_t idx[2] = {q.x, q.z}, sw[2] = {q.y, q.w};
#pragma unroll
        for (int g = 0; g < 2; g++) {
            const float db = d * (0.5f + (float)(sw[g] >> 28)) * 0.25f;
            uint4 *o = (uint4 *)(out + 64 * u + 32 * g);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint2 gr = *(const uint2 *)c_iq2_grid[(idx[g] >> (8 * k)) & 0xffu];
                const uint32_t sg = c_iq2_ksigns[(sw[g] >> (7 * k)) & 127u];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float m = db * (float)(((e < 4 ? gr.x : gr.y) >> (8 * (e & 3))) & 0xffu);
                    v[e] = (sg >> e) & 1u ? -m : m;
                }
                o[k] = gm_pack8<BF>(v);
            }
        }
    }
}

/* IQ2_XXS into the same out[y][r][c] as gm_dequant_kernel, each weight formed by the same
 * expressions (so bit for bit the same tile), but one thread per 8 weights (one grid entry of one
 * 16-byte unit), so that a warp stores 512 contiguous bytes instead of 16 bytes to each of 32 rows
 * of 128, and the grid and sign tables in shared memory (lanes index them divergently), loaded once
 * per block for GM_IQ2_ROUNDS rounds of 256 threads.  rows * cols / 8 < 2^31 (gm_dequant checks). */
#define GM_IQ2_ROUNDS 8
template <bool BF>
__global__ void __launch_bounds__(256) gm_dequant_iq2_kernel(const uint8_t *__restrict__ W, int64_t mat_bytes,
                                                             const int32_t *__restrict__ ids, int64_t rows,
                                                             int64_t cols, int64_t row_bytes,
                                                             uint16_t *__restrict__ out) {
    __shared__ uint2 s_grid[256];
    __shared__ uint8_t s_sign[128];
    s_grid[threadIdx.x] = *(const uint2 *)c_iq2_grid[threadIdx.x];
    if (threadIdx.x < 128) s_sign[threadIdx.x] = c_iq2_ksigns[threadIdx.x];
    __syncthreads();
    if (ids) W += (int64_t)ids[blockIdx.y] * mat_bytes;
    out += (int64_t)blockIdx.y * rows * cols;
    const uint32_t n8 = (uint32_t)(cols / 8), total = (uint32_t)(rows * n8);
    const int64_t nb = cols / 256;
    for (int c = 0; c < GM_IQ2_ROUNDS; c++) {
        const uint32_t i = (blockIdx.x * GM_IQ2_ROUNDS + c) * 256u + threadIdx.x;
        if (i >= total) return;
        const uint32_t r = i / n8, e8 = i % n8, u = e8 >> 3, g = (e8 >> 2) & 1u, k = e8 & 3u;
        const uint8_t *row = W + (int64_t)r * row_bytes;
        const uint2 q = *(const uint2 *)(row + 16 * u + 8 * g); /* the group's grid indices, its sign word */
        const float d = h2f(((const uint16_t *)(row + 64 * nb))[u >> 2]);
        const float db = d * (0.5f + (float)(q.y >> 28)) * 0.25f;
        const uint2 gr = s_grid[(q.x >> (8 * k)) & 0xffu];
        const uint32_t sg = s_sign[(q.y >> (7 * k)) & 127u];
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float m = db * (float)(((e < 4 ? gr.x : gr.y) >> (8 * (e & 3))) & 0xffu);
            v[e] = (sg >> e) & 1u ? -m : m;
        }
        *(uint4 *)(out + (int64_t)r * cols + 8 * e8) = gm_pack8<BF>(v);
    }
}

/* out[i][:] (16-bit) = X row (xrow ? xrow[i] : i) rounded (zeros where xrow[i] < 0); one thread per 8
 * columns (cols % 8 == 0). */
template <bool BF>
__global__ void __launch_bounds__(256) gm_rows_kernel(const float *__restrict__ X, int64_t ldx,
                                                      const int32_t *__restrict__ xrow, int64_t m, int64_t cols,
                                                      uint16_t *__restrict__ out) {
    const int64_t per = cols / 8, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * per) return;
    const int64_t r = i / per, c = 8 * (i % per);
    const int64_t src = xrow ? (int64_t)xrow[r] : r;
    if (src < 0) { /* a padding row */
        *(uint4 *)(out + r * cols + c) = make_uint4(0u, 0u, 0u, 0u);
        return;
    }
    const float4 *x = (const float4 *)(X + src * ldx + c);
    const float4 a = x[0], b = x[1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    *(uint4 *)(out + r * cols + c) = gm_pack8<BF>(v);
}

/* Y[yrow[i] * ldy + r] = P[i * rows + r]: slot-grouped results back in slot order (yrow[i] < 0: a
 * padding row, dropped). */
__global__ void __launch_bounds__(256) gm_scatter_kernel(const float *__restrict__ P, const int32_t *__restrict__ yrow,
                                                         int64_t m, int64_t rows, float *__restrict__ Y, int64_t ldy) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * rows) return;
    const int64_t k = i / rows, r = i % rows;
    const int32_t y = yrow[k];
    if (y >= 0) Y[(int64_t)y * ldy + r] = P[i];
}

/* ---- host side -------------------------------------------------------------------------------- */

int gpu_gemm_init(char *err, size_t len) { return quant_tables_init(err, len); }

/* A scratch buffer grown to exactly `bytes` when it holds less: its size is the largest request so far,
 * never more, so that the memory plan's bounds on the requests bound the buffers (memplan.gemm_bytes).
 * A pass's requests repeat layer after layer, so it grows a few times in a session's first prefill. */
static int gm_grow(ds4_gpu_ctx *c, void **buf, size_t *cap, size_t bytes, char *err, size_t len) {
    if (bytes <= *cap) return DS4_OK;
    const size_t want = bytes;
    GPU_TRY(hipStreamSynchronize(c->stream), "prefill GEMM: wait before growing a scratch buffer");
    gpu_free(c, *buf, *cap);
    *buf = NULL;
    *cap = 0;
    int rc = gpu_alloc(c, want, buf, err, len);
    if (rc == DS4_OK) *cap = want;
    return rc;
}

int gpu_gemm(ds4_gpu_ctx *c, int32_t mode, char *info, size_t info_len, char *err, size_t len) {
    if (mode != DS4_PREFILL_GEMM_OFF && mode != DS4_PREFILL_GEMM_BF16 && mode != DS4_PREFILL_GEMM_F16)
        return gpu_fail(err, len, DS4_E_INVALID, "prefill GEMM mode %d: expected %d (off), %d (bf16) or %d (f16)", mode,
                        DS4_PREFILL_GEMM_OFF, DS4_PREFILL_GEMM_BF16, DS4_PREFILL_GEMM_F16);
    if (mode != DS4_PREFILL_GEMM_OFF && !c->blas) {
        if (!blas_load())
            return gpu_fail(err, len, DS4_E_UNSUPPORTED, "prefill GEMM: %s", g_blas.why);
        blas_handle_t h = NULL;
        int st = g_blas.create(&h);
        if (st != 0)
            return gpu_fail(err, len, DS4_E_DEVICE, "prefill GEMM: %s (%s) %s failed with status %d", BLAS_NAME,
                            g_blas.file, BL_SYM_CREATE, st);
        st = g_blas.set_stream(h, c->stream);
        if (st != 0) {
            (void)g_blas.destroy(h);
            return gpu_fail(err, len, DS4_E_DEVICE, "prefill GEMM: %s %s failed with status %d", BLAS_NAME,
                            BL_SYM_STREAM, st);
        }
        c->blas = h;
    }
    if (info && info_len) {
        if (g_blas.ok) snprintf(info, info_len, "%s %s (%s)", BLAS_NAME, g_blas.version, g_blas.file);
        else snprintf(info, info_len, "none");
    }
    c->gemm_mode = mode;
    return DS4_OK;
}

void gpu_gemm_close(ds4_gpu_ctx *c) {
    if (c->blas) (void)g_blas.destroy(c->blas);
    c->blas = NULL;
    gpu_free(c, c->gm_w, c->gm_w_cap);
    gpu_free(c, c->gm_x, c->gm_x_cap);
    gpu_free(c, c->gm_y, c->gm_y_cap);
    gpu_free(c, c->gm_idx, c->gm_idx_cap);
    if (c->gm_host) (void)hipHostFree(c->gm_host);
    c->gm_host = NULL;
    c->gm_host_cap = 0;
}

int gpu_gemm_takes(const ds4_gpu_ctx *c, int32_t layout, int64_t cols, int dense) {
    const int32_t t = layout & ~DS4_GPU_PLANAR;
    if (c->gemm_mode == DS4_PREFILL_GEMM_OFF || !c->blas) return 0;
    if (layout == DS4_TYPE_F16) return dense && cols % 8 == 0; /* F16 rows as they are: f16 operands */
    return (layout & DS4_GPU_PLANAR) && (t == DS4_TYPE_Q8_0 || t == DS4_TYPE_Q2_K || t == DS4_TYPE_IQ2_XXS) &&
           cols % 32 == 0;
}

/* Matrices ids (NULL: W itself; n_mat of them) of `rows` rows dequantised into c->gm_w. */
static int gm_dequant(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, const int32_t *ids,
                      int64_t n_mat, int64_t rows, int64_t cols, int64_t row_bytes, char *err, size_t len) {
    const int32_t t = layout & ~DS4_GPU_PLANAR;
    const int bf = c->gm_bf;
    const int64_t units = rows * (cols / (t == DS4_TYPE_Q8_0 ? 16 : 64));
    const dim3 grid((unsigned)((units + 255) / 256), (unsigned)n_mat), block(256);
    const uint8_t *w = (const uint8_t *)W;
    uint16_t *o = (uint16_t *)c->gm_w;
#define GM_DQ(T)                                                                                                      \
    if (bf) hipLaunchKernelGGL((gm_dequant_kernel<T, true>), grid, block, 0, c->stream, w, mat_bytes, ids, rows, cols, \
                               row_bytes, o);                                                                         \
    else hipLaunchKernelGGL((gm_dequant_kernel<T, false>), grid, block, 0, c->stream, w, mat_bytes, ids, rows, cols,   \
                            row_bytes, o);
    if (t == DS4_TYPE_Q8_0) { GM_DQ(DS4_TYPE_Q8_0) }
    else if (t == DS4_TYPE_Q2_K) { GM_DQ(DS4_TYPE_Q2_K) }
    else if (rows * (cols / 8) < ((int64_t)1 << 31)) { /* the same tile, faster (gm_dequant_iq2_kernel) */
        const int64_t n8 = rows * (cols / 8);
        const dim3 g8((unsigned)((n8 + 256 * GM_IQ2_ROUNDS - 1) / (256 * GM_IQ2_ROUNDS)), (unsigned)n_mat);
        if (bf) hipLaunchKernelGGL((gm_dequant_iq2_kernel<true>), g8, block, 0, c->stream, w, mat_bytes, ids, rows,
                                   cols, row_bytes, o);
        else hipLaunchKernelGGL((gm_dequant_iq2_kernel<false>), g8, block, 0, c->stream, w, mat_bytes, ids, rows,
                                cols, row_bytes, o);
    }
    else { GM_DQ(DS4_TYPE_IQ2_XXS) }
#undef GM_DQ
    GPU_TRY(hipGetLastError(), "prefill GEMM: dequantise a weight tile");
    return DS4_OK;
}

static int gm_rows(ds4_gpu_ctx *c, const float *X, int64_t ldx, const int32_t *xrow, int64_t m, int64_t cols,
                   char *err, size_t len) {
    const int64_t n = m * (cols / 8);
    const dim3 grid((unsigned)((n + 255) / 256)), block(256);
    if (c->gm_bf)
        hipLaunchKernelGGL((gm_rows_kernel<true>), grid, block, 0, c->stream, X, ldx, xrow, m, cols, (uint16_t *)c->gm_x);
    else
        hipLaunchKernelGGL((gm_rows_kernel<false>), grid, block, 0, c->stream, X, ldx, xrow, m, cols, (uint16_t *)c->gm_x);
    GPU_TRY(hipGetLastError(), "prefill GEMM: round the activations to 16 bits");
    return DS4_OK;
}

/* C[t * ldc + r] = sum_k A[r * cols + k] * B[t * cols + k] for r < m, t < n (16-bit A, B; float C). */
static int gm_call(ds4_gpu_ctx *c, int64_t m, int64_t n, int64_t cols, const void *A, const void *B, float *C,
                   int64_t ldc, char *err, size_t len) {
    const float one = 1.0f, zero = 0.0f;
    const int ty = c->gm_bf ? BL_R_16BF : BL_R_16F;
#if defined(GPU_NVIDIA)
    const int st = g_blas.gemm(c->blas, BL_OP_T, BL_OP_N, (int)m, (int)n, (int)cols, &one, A, ty, (int)cols, B, ty,
                               (int)cols, &zero, C, BL_R_32F, (int)ldc, BL_COMPUTE_32F, BL_ALGO);
#else
    const int st = g_blas.gemm(c->blas, BL_OP_T, BL_OP_N, (int)m, (int)n, (int)cols, &one, A, ty, (int)cols, B, ty,
                               (int)cols, &zero, C, BL_R_32F, (int)ldc, C, BL_R_32F, (int)ldc, BL_COMPUTE_32F, BL_ALGO,
                               0, 0u);
#endif
    if (st != 0)
        return gpu_fail(err, len, DS4_E_DEVICE, "prefill GEMM: %s %s (%lld x %lld x %lld) failed with status %d",
                        BLAS_NAME, BL_SYM_GEMM, (long long)m, (long long)n, (long long)cols, st);
    return DS4_OK;
}

/* Room for `bytes` in the pinned host lists, keeping their first `keep` ints. */
static int gm_host_room(ds4_gpu_ctx *c, size_t bytes, int64_t keep, char *err, size_t len) {
    if (bytes <= c->gm_host_cap) return DS4_OK;
    const size_t want = std::max(bytes, std::max((size_t)(1 << 20), c->gm_host_cap * 2));
    void *p = NULL;
    hipError_t e = hipHostMalloc(&p, want, hipHostMallocDefault);
    if (e != hipSuccess)
        return gpu_fail(err, len, DS4_E_NOMEM, "prefill GEMM: pinned slot lists of %zu bytes: %s", want,
                        hipGetErrorString(e));
    GPU_TRY(hipStreamSynchronize(c->stream), "prefill GEMM: wait before growing the slot lists");
    if (c->gm_host) {
        if (keep > 0) memcpy(p, c->gm_host, (size_t)keep * sizeof(int32_t));
        (void)hipHostFree(c->gm_host);
    }
    c->gm_host = p;
    c->gm_host_cap = want;
    return DS4_OK;
}

/* The slots' matrix ids into the pinned host lists (the stream has run up to here on return). */
static int gm_host_ids(ds4_gpu_ctx *c, const int32_t *ids, int64_t n_slots, char *err, size_t len) {
    int rc = gm_host_room(c, (size_t)n_slots * sizeof(int32_t), 0, err, len);
    if (rc != DS4_OK) return rc;
    GPU_TRY(hipMemcpyAsync(c->gm_host, ids, (size_t)n_slots * sizeof(int32_t), hipMemcpyDeviceToHost, c->stream),
            "prefill GEMM: copy the slots' matrix ids");
    GPU_TRY(hipStreamSynchronize(c->stream), "prefill GEMM: wait for the slots' matrix ids");
    return DS4_OK;
}

/* batch GEMMs: for b < batch, C_b = A_b^T B_b (A_b = A + b*sa, B_b = B + b*sb elements, C_b = C + b*sc). */
static int gm_call_batched(ds4_gpu_ctx *c, int64_t m, int64_t n, int64_t cols, const void *A, int64_t sa,
                           const uint16_t *B, int64_t sb, float *C, int64_t ldc, int64_t sc, int64_t batch, char *err,
                           size_t len) {
    if (batch == 1) return gm_call(c, m, n, cols, A, B, C, ldc, err, len);
    const float one = 1.0f, zero = 0.0f;
    const int ty = c->gm_bf ? BL_R_16BF : BL_R_16F;
#if defined(GPU_NVIDIA)
    const int st = g_blas.gemm_sb(c->blas, BL_OP_T, BL_OP_N, (int)m, (int)n, (int)cols, &one, A, ty, (int)cols,
                                  (long long)sa, B, ty, (int)cols, (long long)sb, &zero, C, BL_R_32F, (int)ldc,
                                  (long long)sc, (int)batch, BL_COMPUTE_32F, BL_ALGO);
#else
    const int st = g_blas.gemm_sb(c->blas, BL_OP_T, BL_OP_N, (int)m, (int)n, (int)cols, &one, A, ty, (int)cols,
                                  (int64_t)sa, B, ty, (int)cols, (int64_t)sb, &zero, C, BL_R_32F, (int)ldc, (int64_t)sc,
                                  C, BL_R_32F, (int)ldc, (int64_t)sc, (int)batch, BL_COMPUTE_32F, BL_ALGO, 0, 0u);
#endif
    if (st != 0)
        return gpu_fail(err, len, DS4_E_DEVICE, "prefill GEMM: %s %s (%lld x %lld x %lld, batch %lld) failed with "
                        "status %d", BLAS_NAME, BL_SYM_GEMM_SB, (long long)m, (long long)n, (long long)cols,
                        (long long)batch, st);
    return DS4_OK;
}

int gpu_gemm_dense(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                   const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len) {
    if (layout == DS4_TYPE_F16) { /* the F16 rows are the GEMM's operand as they lie: only the activations round */
        c->gm_bf = 0;
        int rc = gm_grow(c, &c->gm_x, &c->gm_x_cap, (size_t)(n * cols) * 2, err, len);
        if (rc == DS4_OK) rc = gm_rows(c, X, ldx, NULL, n, cols, err, len);
        if (rc == DS4_OK && row_bytes != 2 * cols)
            rc = gpu_fail(err, len, DS4_E_INVALID, "prefill GEMM: F16 rows of %lld bytes for %lld columns",
                          (long long)row_bytes, (long long)cols);
        return rc == DS4_OK ? gm_call(c, rows, n, cols, W, c->gm_x, Y, ldy, err, len) : rc;
    }
    c->gm_bf = c->gemm_mode == DS4_PREFILL_GEMM_BF16;
    const int64_t tile = std::max<int64_t>(1, std::min<int64_t>(rows, GM_TILE_ELEMS / cols));
    int rc = gm_grow(c, &c->gm_x, &c->gm_x_cap, (size_t)(n * cols) * 2, err, len);
    if (rc == DS4_OK) rc = gm_grow(c, &c->gm_w, &c->gm_w_cap, (size_t)(tile * cols) * 2, err, len);
    if (rc == DS4_OK) rc = gm_rows(c, X, ldx, NULL, n, cols, err, len);
    for (int64_t r0 = 0; rc == DS4_OK && r0 < rows; r0 += tile) {
        const int64_t tr = std::min(tile, rows - r0);
        rc = gm_dequant(c, layout, (const uint8_t *)W + r0 * row_bytes, 0, NULL, 1, tr, cols, row_bytes, err, len);
        if (rc == DS4_OK) rc = gm_call(c, tr, n, cols, c->gm_w, c->gm_x, Y + r0, ldy, err, len);
    }
    return rc;
}

/* Expert products: the slots grouped by matrix on the host (one copy of their ids), the used
 * matrices ordered by slot count (largest first) and taken in tiles of whole matrices, each tile as
 * many as GM_TILE_ELEMS holds and its padded rows a chunk holds; a tile's matrices are dequantised by
 * one launch and multiplied by one strided-batched GEMM, each matrix's rows padded to the tile's
 * largest count (zero rows whose results are dropped; ordering by count keeps the padding small).
 * Consecutive tiles form chunks of at most `chunk` rows, each rounded into gm_x, multiplied into gm_y
 * and scattered back in slot order before the next, so gm_x and gm_y hold one chunk, not the pass. */
int gpu_gemm_gather(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, const int32_t *ids, int64_t rows,
                    int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int32_t x_div, int64_t n_slots,
                    float *Y, int64_t ldy, char *err, size_t len) {
    c->gm_bf = c->gemm_mode == DS4_PREFILL_GEMM_BF16;
    int rc = gm_host_ids(c, ids, n_slots, err, len);
    if (rc != DS4_OK) return rc;
    const int32_t *hid = (const int32_t *)c->gm_host;
    int32_t n_mat = 0;
    for (int64_t s = 0; s < n_slots; s++) {
        if (hid[s] < 0)
            return gpu_fail(err, len, DS4_E_INVALID, "prefill GEMM: slot %lld has matrix id %d", (long long)s, hid[s]);
        n_mat = std::max(n_mat, hid[s] + 1);
    }
    std::vector<int64_t> count((size_t)n_mat, 0);
    for (int64_t s = 0; s < n_slots; s++) count[(size_t)hid[s]]++;
    std::vector<int32_t> used;
    for (int32_t e = 0; e < n_mat; e++)
        if (count[(size_t)e]) used.push_back(e);
    std::stable_sort(used.begin(), used.end(), [&](int32_t a, int32_t b) { return count[(size_t)a] > count[(size_t)b]; });
    const int64_t per_mat = rows * cols, U = (int64_t)used.size();
    const int64_t per = std::max<int64_t>(1, std::min<int64_t>(U, GM_TILE_ELEMS / per_mat));
    const int64_t chunk = std::max<int64_t>(GM_CHUNK_ROWS, U ? count[(size_t)used[0]] : 0);
    std::vector<int64_t> counts((size_t)U);
    for (int64_t k = 0; k < U; k++) counts[(size_t)k] = count[(size_t)used[(size_t)k]];
    const GmPlan pl = gm_plan(counts, per, chunk);
    const std::vector<int64_t> &first = pl.first, &base = pl.base, &pad = pl.pad, &cfirst = pl.cfirst;
    const int64_t P = pl.P, most = pl.most;
    /* lists (pinned, then to the device): used ids [U], xrow [P] and yrow [P] (-1: a padding row) */
    rc = gm_host_room(c, (size_t)(n_slots + U + 2 * P) * sizeof(int32_t), n_slots, err, len);
    if (rc != DS4_OK) return rc;
    int32_t *hl = (int32_t *)c->gm_host + n_slots, *hx = hl + U, *hy = hx + P;
    hid = (const int32_t *)c->gm_host;
    std::vector<int64_t> rank((size_t)n_mat, -1), at((size_t)U, 0);
    for (int64_t k = 0; k < U; k++) {
        hl[k] = used[(size_t)k];
        rank[(size_t)used[(size_t)k]] = k;
        at[(size_t)k] = base[(size_t)k];
    }
    for (int64_t j = 0; j < P; j++) hx[j] = hy[j] = -1;
    for (int64_t s = 0; s < n_slots; s++) {
        const int64_t j = at[(size_t)rank[(size_t)hid[s]]]++;
        hx[j] = (int32_t)(s / x_div);
        hy[j] = (int32_t)s;
    }
    const size_t list_bytes = (size_t)(U + 2 * P) * sizeof(int32_t);
    rc = gm_grow(c, &c->gm_idx, &c->gm_idx_cap, list_bytes, err, len);
    if (rc != DS4_OK) return rc;
    int32_t *d_used = (int32_t *)c->gm_idx, *d_x = d_used + U, *d_y = d_x + P;
    GPU_TRY(hipMemcpyAsync(c->gm_idx, hl, list_bytes, hipMemcpyHostToDevice, c->stream),
            "prefill GEMM: copy the slot lists");
    rc = gm_grow(c, &c->gm_x, &c->gm_x_cap, (size_t)(most * cols) * 2, err, len);
    if (rc == DS4_OK) rc = gm_grow(c, &c->gm_w, &c->gm_w_cap, (size_t)(per * per_mat) * 2, err, len);
    if (rc == DS4_OK) rc = gm_grow(c, &c->gm_y, &c->gm_y_cap, (size_t)(most * rows) * sizeof(float), err, len);
    const uint16_t *xb = (const uint16_t *)c->gm_x;
    for (size_t j = 0; rc == DS4_OK && j + 1 < cfirst.size(); j++) {
        const int64_t r0 = base[(size_t)first[(size_t)cfirst[j]]], r1 = base[(size_t)first[(size_t)cfirst[j + 1]]];
        rc = gm_rows(c, X, ldx, d_x + r0, r1 - r0, cols, err, len);
        for (int64_t t = cfirst[j]; rc == DS4_OK && t < cfirst[j + 1]; t++) {
            const int64_t k0 = first[(size_t)t], nk = first[(size_t)t + 1] - k0, m = pad[(size_t)k0];
            const int64_t b0 = base[(size_t)k0] - r0;
            rc = gm_dequant(c, layout, W, mat_bytes, d_used + k0, nk, rows, cols, row_bytes, err, len);
            if (rc == DS4_OK)
                rc = gm_call_batched(c, rows, m, cols, c->gm_w, per_mat, xb + b0 * cols, m * cols,
                                     (float *)c->gm_y + b0 * rows, rows, m * rows, nk, err, len);
        }
        if (rc != DS4_OK) return rc;
        const int64_t total = (r1 - r0) * rows;
        hipLaunchKernelGGL(gm_scatter_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, c->stream,
                           (const float *)c->gm_y, d_y + r0, r1 - r0, rows, Y, ldy);
        GPU_TRY(hipGetLastError(), "prefill GEMM: results back in slot order");
    }
    return rc;
}
