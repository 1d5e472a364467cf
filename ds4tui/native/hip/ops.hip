/*
 * ops.hip — the non-matmul operations of the DS4 forward pass on the device (spec ds4.md §2):
 * embedding, RMS norm, mHC pre/post/head, RoPE, KV store with ds4's FP8/f16 roundings, the
 * compressor, the lightning indexer with top-k, sink-softmax attention, MoE routing, SwiGLU and
 * the expert combination.
 *
 * Each kernel follows the operation order of the CPU engine (ds4tui/native/forward.c, cpu/ops.c),
 * which follows the numpy reference.  Where a loop accumulates in a fixed order there (mHC mixes,
 * attention values, expert sums) the kernel keeps that order, so only reductions that are split
 * over lanes (norms, dot products) differ by float32 summation order.  The ds4 rounding helpers
 * (E4M3 / FP4 block round trips, f16) are the CPU's arithmetic, exact on both sides.
 */
#include "quant.h"

#include <math.h>

#define OPS_THREADS 256
#define EMIT_REG 16 /* compress_emit_kernel: windows of up to this many positions from registers */
#define EMIT_MAX_W 8192 /* compress_emit_kernel builds rows up to this width in shared memory (32 KB) */
#define EMIT_MAX_R 256 /* compress_emit_kernel keeps the ring offsets of windows up to this ratio in shared memory */

static int ops_check(const char *what, char *err, size_t len) {
    GPU_TRY(hipGetLastError(), what);
    return DS4_OK;
}

static unsigned blocks_for(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

/* Sum over a block of OPS_THREADS threads (fixed tree: warp butterflies, then warp 0 over the warps). */
__device__ float block_sum(float v, float *red) {
    v = gpu_warp_sum(v);
    const int w = threadIdx.x / GPU_WARP, l = threadIdx.x % GPU_WARP;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    float s = l < (int)(blockDim.x / GPU_WARP) ? red[l] : 0.0f;
    if (w == 0) s = gpu_warp_sum(s);
    if (threadIdx.x == 0) red[0] = s;
    __syncthreads();
    s = red[0];
    __syncthreads();
    return s;
}

/* The warp sums of NV values at once (NV a power of two <= GPU_WARP): each lane ends with the total of
 * value m over the warp, where m's bit s - 1 is bit (GPU_WARP / 2 >> (s - 1)) of the lane (s = 1 ..
 * log2 NV).  At step s the lanes halve their values, each keeping those whose bit it owns and adding
 * its partner's (lane ^ offset) partial of the same value; the last steps are gpu_warp_sum's.  Every
 * lane so adds, for its value, exactly what gpu_warp_sum adds in that lane at each step (own partial
 * plus the partner's, offsets GPU_WARP / 2 down to 1), so each total is bit for bit gpu_warp_sum's, in
 * NV - 1 + log2(GPU_WARP / NV) exchanges instead of NV log2(GPU_WARP). */
template <int C, int NV>
__device__ __forceinline__ void gpu_warp_halve_(float (&v)[NV], int lane, int o, int s, int *idx) {
    if constexpr (C > 1) { /* C values held; keep C / 2 (a compile-time recursion: v stays in registers) */
        const bool hi = (lane & o) != 0;
        *idx |= (int)hi << s;
#pragma unroll
        for (int p = 0; p < C / 2; p++) {
            const float send = hi ? v[2 * p] : v[2 * p + 1];
            const float keep = hi ? v[2 * p + 1] : v[2 * p];
            v[p] = keep + gpu_shfl_xor(send, o);
        }
        gpu_warp_halve_<C / 2, NV>(v, lane, o >> 1, s + 1, idx);
    }
}

template <int NV>
__device__ __forceinline__ float gpu_warp_sums_(float (&v)[NV], int *m) {
    static_assert(NV >= 1 && NV <= GPU_WARP && (NV & (NV - 1)) == 0, "a power of two up to the warp");
    int idx = 0;
    gpu_warp_halve_<NV, NV>(v, (int)(threadIdx.x % GPU_WARP), GPU_WARP / 2, 0, &idx);
    float x = v[0];
#pragma unroll
    for (int o = GPU_WARP / (2 * NV); o > 0; o >>= 1) x += gpu_shfl_xor(x, o);
    *m = idx;
    return x;
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- ds4 numerics (cpu/ops.c) ---------------------------------------------------------------- */

__device__ int ceil_log2_(float r) {
    int e;
    float m = frexpf(r, &e);
    return m == 0.5f ? e - 1 : e;
}

__device__ float round_minifloat_(float a, int mbits, int emin) {
    if (a == 0.0f) return 0.0f;
    int e;
    frexpf(a, &e);
    int ex = e - 1;
    if (ex < emin) ex = emin;
    float spacing = ldexpf(1.0f, ex - mbits);
    return rintf(a / spacing) * spacing;
}

/* One block of a power-of-two-scaled minifloat round trip (spec ds4.md §2.9) by one warp: lane i
 * holds x[i], x[i + 32], ...  The block's amax is the largest |x| (NaN passed over, as the serial
 * loop of cpu/ops.c does; a maximum is the same in any order), so the scale and every element's
 * rounding are the serial loop's, bit for bit.  Every lane of the warp must call it. */
template <int BLOCK>
__device__ void block_round_trip_warp_(float *x, float qmax, int mbits, int emin, float amax_floor) {
    constexpr int PER = BLOCK / GPU_WARP;
    static_assert(PER * GPU_WARP == BLOCK, "a block of whole warps");
    const int lane = threadIdx.x % GPU_WARP;
    float v[PER], amax = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        v[j] = x[lane + j * GPU_WARP];
        const float a = fabsf(v[j]);
        if (a > amax) amax = a;
    }
    for (int m = GPU_WARP / 2; m > 0; m >>= 1) {
        const float o = gpu_shfl_xor(amax, m);
        if (o > amax) amax = o;
    }
    if (amax < amax_floor) amax = amax_floor;
    const float scale = ldexpf(1.0f, ceil_log2_(amax / qmax));
#pragma unroll
    for (int j = 0; j < PER; j++) {
        float t = v[j] / scale;
        if (t > qmax) t = qmax;
        if (t < -qmax) t = -qmax;
        float q = round_minifloat_(fabsf(t), mbits, emin);
        if (q > qmax) q = qmax;
        x[lane + j * GPU_WARP] = (t < 0 ? -q : q) * scale;
    }
}

/* The FP8 E4M3 round trip of the blocks of 64 lanes of row[0, nb * 64), a warp per block (the
 * caller's whole block takes part; its size is a multiple of the warp). */
__device__ void fp8_blocks_(float *row, int nb) {
    const int warp = threadIdx.x / GPU_WARP, warps = blockDim.x / GPU_WARP;
    for (int b = warp; b < nb; b += warps) block_round_trip_warp_<64>(row + 64 * b, 448.0f, 3, -6, 1e-4f);
}

__device__ __forceinline__ float f16_round_(float v) { return __half2float(__float2half_rn(v)); }

/* FP8 E4M3 round trip of lanes [0, width - n_rot) in blocks of 64, then f16 rounding of every lane,
 * of one row shared by the block. */
__device__ void kv_round_(float *row, int width, int n_rot) {
    const int nb = (width - n_rot) / 64;
    __syncthreads();
    fp8_blocks_(row, nb);
    __syncthreads();
    for (int i = threadIdx.x; i < width; i += blockDim.x) row[i] = f16_round_(row[i]);
    __syncthreads();
}

/* Hadamard (stride 1, 2, 4, ...; scale 1/sqrt(n)) and FP4 E2M1 in blocks of 32 of one row. */
__device__ void indexer_qat_(float *x, int n) {
    for (int stride = 1; stride < n; stride *= 2) {
        __syncthreads();
        for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
            int b = (i / stride) * 2 * stride, j = b + i % stride;
            float a = x[j], c = x[j + stride];
            x[j] = a + c;
            x[j + stride] = a - c;
        }
    }
    __syncthreads();
    const float sc = (float)(1.0 / sqrt((double)n));
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= sc;
    __syncthreads();
    for (int b = threadIdx.x / GPU_WARP; b < n / 32; b += blockDim.x / GPU_WARP) /* a warp per block of 32 */
        block_round_trip_warp_<32>(x + 32 * b, 6.0f, 1, 0, 7.052966104933725e-38f);
    __syncthreads();
}

__device__ void rope_row_(float *x, int width, const double *freq, int n_rot, int64_t pos, int inverse) {
    float *t = x + width - n_rot;
    for (int k = threadIdx.x; k < n_rot / 2; k += blockDim.x) {
        double ang = (double)pos * freq[k];
        float c = (float)cos(ang), s = (float)sin(ang);
        if (inverse) s = -s;
        float a = t[2 * k], b = t[2 * k + 1];
        t[2 * k] = a * c - b * s;
        t[2 * k + 1] = a * s + b * c;
    }
}

#define RMS_REG 16 /* elements per thread held in registers by rms_row_ (the rest are read again) */

/* RMS norm of a row in place or into out, by the whole block.  Thread k sums x[k], x[k + bd], ...
 * in that order; its first RMS_REG elements are all loaded before the sum starts, so a one-row
 * norm is not a chain of dependent loads on one multiprocessor. */
__device__ void rms_row_(const float *x, int64_t width, float eps, const float *__restrict__ w, float *out, float *red) {
    float v[RMS_REG];
    const int64_t bd = blockDim.x;
#pragma unroll
    for (int j = 0; j < RMS_REG; j++) v[j] = threadIdx.x + j * bd < width ? x[threadIdx.x + j * bd] : 0.0f;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < RMS_REG; j++)
        if (threadIdx.x + j * bd < width) ss = fmaf(v[j], v[j], ss);
    for (int64_t i = threadIdx.x + RMS_REG * bd; i < width; i += bd) ss = fmaf(x[i], x[i], ss);
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)width + eps);
    /* the row's first RMS_REG elements of this thread from registers: x may be out, and a reload after
     * each store made the writes a chain of L2 reads (H100, ncu: a 1024-thread norm 7.9 -> 6.9 us) */
    const int64_t rem = width - threadIdx.x; /* element j of this thread exists when j * bd < rem */
    float *o = out + threadIdx.x;
    const float *wt = w ? w + threadIdx.x : NULL;
#pragma unroll
    for (int j = 0; j < RMS_REG; j++)
        if (j * bd < rem) {
            const float y = v[j] * inv;
            o[j * bd] = wt ? y * wt[j * bd] : y;
        }
    for (int64_t i = threadIdx.x + RMS_REG * bd; i < width; i += bd) {
        float y = x[i] * inv;
        out[i] = w ? y * w[i] : y;
    }
    __syncthreads();
}

/* ---- kernels ------------------------------------------------------------------------------------ */

template <int TYPE>
__global__ void embed_kernel(const uint8_t *W, int64_t row_bytes, int H, const int32_t *tokens, int HC, float *X) {
    const int t = blockIdx.x;
    const uint8_t *row = W + (int64_t)tokens[t] * row_bytes;
    for (int c = threadIdx.x; c < (H + 7) / 8; c += blockDim.x) {
        const int m = H - 8 * c < 8 ? H - 8 * c : 8;
        float w[8];
        Chunk<TYPE>::load(row, c, m, w);
        for (int a = 0; a < HC; a++)
            for (int j = 0; j < m; j++) X[((int64_t)t * HC + a) * H + 8 * c + j] = w[j];
    }
}

#define NORM_THREADS 1024

__global__ void __launch_bounds__(NORM_THREADS)
rms_norm_kernel(const float *x, int64_t ldx, int64_t width, float eps, const float *w, float *out, int64_t ldo) {
    __shared__ float red[NORM_THREADS / GPU_WARP];
    rms_row_(x + blockIdx.x * ldx, width, eps, w, out + blockIdx.x * ldo, red);
}

#define MAXHC 16

/* One thread per token: the mHC weights of forward.c's ds4_hc_pre, in its order.  HCT is the
 * stream count when known at compile time, or 0 for any count up to MAXHC (local arrays); DS4's 4
 * streams use hc_mix4_kernel below (the same bits, 4 lanes per token). */
template <int HCT>
__global__ void hc_mix_kernel(const float *hcm, int n, int hc, float s0, float s1, float s2, const float *base,
                              float eps, int iters, float *pre, float *post, float *comb) {
    const int HC = HCT ? HCT : hc;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const int mix = 2 * HC + HC * HC;
    const float *m = hcm + (int64_t)t * mix;
    float *pr = pre + (int64_t)t * HC, *po = post + (int64_t)t * HC;
    float cb[(HCT ? HCT : MAXHC) * (HCT ? HCT : MAXHC)];
    for (int a = 0; a < HC; a++) {
        pr[a] = sigmoidf_(s0 * m[a] + base[a]) + eps;
        po[a] = 2.0f * sigmoidf_(s1 * m[HC + a] + base[HC + a]);
    }
    for (int a = 0; a < HC; a++) {
        float *r = cb + a * HC, mx = -INFINITY, sum = 0.0f;
        for (int b = 0; b < HC; b++) {
            r[b] = s2 * m[2 * HC + a * HC + b] + base[2 * HC + a * HC + b];
            if (r[b] > mx) mx = r[b];
        }
        for (int b = 0; b < HC; b++) { r[b] = expf(r[b] - mx); sum += r[b]; }
        for (int b = 0; b < HC; b++) r[b] = r[b] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            for (int a = 0; a < HC; a++) {
                float sum = 0.0f;
                for (int b = 0; b < HC; b++) sum += cb[a * HC + b];
                for (int b = 0; b < HC; b++) cb[a * HC + b] /= sum + eps;
            }
        }
        for (int b = 0; b < HC; b++) {
            float sum = 0.0f;
            for (int a = 0; a < HC; a++) sum += cb[a * HC + b];
            for (int a = 0; a < HC; a++) cb[a * HC + b] /= sum + eps;
        }
    }
    float *out = comb + (int64_t)t * HC * HC;
    for (int i = 0; i < HC * HC; i++) out[i] = cb[i];
}

/* The same for 4 streams with 4 lanes per token, lane a holding row a of the Sinkhorn matrix: every
 * sum and division is the one hc_mix_kernel (and forward.c) does, in the same order (a column sum
 * gathers the 4 rows by shuffles and adds them in ascending a), so the results are the same bits;
 * the row and column passes' divisions run on 4 lanes at once instead of one. */
__global__ void __launch_bounds__(64) hc_mix4_kernel(const float *hcm, int n, float s0, float s1, float s2,
                                                     const float *base, float eps, int iters, float *pre, float *post,
                                                     float *comb) {
    const int HC = 4, mix = 2 * HC + HC * HC;
    const int g = (blockIdx.x * blockDim.x + threadIdx.x) / HC, a = threadIdx.x % HC, lane0 = (threadIdx.x % GPU_WARP) & ~3;
    const int t = g < n ? g : n - 1; /* lanes past the last token shadow it and write nothing */
    const float *m = hcm + (int64_t)t * mix;
    if (g < n) {
        pre[(int64_t)t * HC + a] = sigmoidf_(s0 * m[a] + base[a]) + eps;
        post[(int64_t)t * HC + a] = 2.0f * sigmoidf_(s1 * m[HC + a] + base[HC + a]);
    }
    float r[4], mx = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int b = 0; b < HC; b++) {
        r[b] = s2 * m[2 * HC + a * HC + b] + base[2 * HC + a * HC + b];
        if (r[b] > mx) mx = r[b];
    }
#pragma unroll
    for (int b = 0; b < HC; b++) { r[b] = expf(r[b] - mx); sum += r[b]; }
#pragma unroll
    for (int b = 0; b < HC; b++) r[b] = r[b] / sum + eps;
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            float rs = 0.0f;
#pragma unroll
            for (int b = 0; b < HC; b++) rs += r[b];
#pragma unroll
            for (int b = 0; b < HC; b++) r[b] /= rs + eps;
        }
#pragma unroll
        for (int b = 0; b < HC; b++) {
            const float c0 = gpu_shfl(r[b], lane0), c1 = gpu_shfl(r[b], lane0 + 1), c2 = gpu_shfl(r[b], lane0 + 2),
                        c3 = gpu_shfl(r[b], lane0 + 3);
            float cs = 0.0f;
            cs += c0;
            cs += c1;
            cs += c2;
            cs += c3;
            r[b] /= cs + eps;
        }
    }
    if (g < n)
#pragma unroll
        for (int b = 0; b < HC; b++) comb[(int64_t)t * HC * HC + a * HC + b] = r[b];
}

/* x[t, d] = sum_a w[t, a] X[t, a, d] (ascending a, as the CPU). */
__global__ void hc_collapse_kernel(const float *X, const float *w, int HC, int H, float *x) {
    const int t = blockIdx.y;
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= H) return;
    const float *Xt = X + (int64_t)t * HC * H, *wt = w + (int64_t)t * HC;
    float acc = 0.0f;
    for (int a = 0; a < HC; a++) acc += wt[a] * Xt[(int64_t)a * H + d];
    x[(int64_t)t * H + d] = acc;
}

template <int HCT>
__global__ void hc_post_kernel(const float *X, const float *out, const float *post, const float *comb, int hc, int H,
                               float *Y) {
    const int HC = HCT ? HCT : hc;
    const int t = blockIdx.y;
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= H) return;
    const float *Xt = X + (int64_t)t * HC * H, *po = post + (int64_t)t * HC, *cb = comb + (int64_t)t * HC * HC;
    const float o = out[(int64_t)t * H + d];
    if constexpr (HCT != 0) { /* every input loaded before the first store: the same sums, no reload after one */
        float xv[HCT], cv[HCT * HCT], pv[HCT];
#pragma unroll
        for (int a = 0; a < HCT; a++) xv[a] = Xt[(int64_t)a * H + d], pv[a] = po[a];
#pragma unroll
        for (int i = 0; i < HCT * HCT; i++) cv[i] = cb[i];
#pragma unroll
        for (int b = 0; b < HCT; b++) {
            float acc = 0.0f;
#pragma unroll
            for (int a = 0; a < HCT; a++) acc += cv[a * HCT + b] * xv[a];
            Y[((int64_t)t * HCT + b) * H + d] = pv[b] * o + acc;
        }
    } else {
        for (int b = 0; b < HC; b++) {
            float acc = 0.0f;
            for (int a = 0; a < HC; a++) acc += cb[a * HC + b] * Xt[(int64_t)a * H + d];
            Y[((int64_t)t * HC + b) * H + d] = po[b] * o + acc;
        }
    }
}

__global__ void hc_head_w_kernel(const float *m, int n, int HC, float s0, const float *base, float eps, float *w) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * HC) return;
    w[i] = sigmoidf_(s0 * m[i] + base[i % HC]) + eps;
}

/* The first position of the pass: p0, plus the device word *dp0 when a graph replays the pass
 * (gpu_internal.h's GPU_POS: p0 is then the op's offset from the pass's first position). */
__device__ __forceinline__ int64_t gpu_pos(int64_t p0, const int64_t *dp0) { return dp0 ? p0 + *dp0 : p0; }

__global__ void norm_rope_kernel(float *x, int width, int hpt, float eps, const float *w, const double *freq,
                                 int n_rot, int64_t p0, const int64_t *dp0, int inverse, int qat) {
    __shared__ float red[OPS_THREADS / GPU_WARP];
    float *row = x + (int64_t)blockIdx.x * width;
    const int64_t pos = gpu_pos(p0, dp0) + blockIdx.x / hpt;
    if (eps >= 0.0f) rms_row_(row, width, eps, w, row, red);
    rope_row_(row, width, freq, n_rot, pos, inverse);
    if (qat) indexer_qat_(row, width);
}

/* round: 0 none, 1 FP8 + f16 (target KV rows), 2 FP8 only (the drafter's rows, dspark.c). */
__global__ void kv_store_kernel(const float *kvr, int D, float *ring, int cap, int64_t p0, const int64_t *dp0,
                                int n_rot, int round) {
    const int t = blockIdx.x;
    const float *src = kvr + (int64_t)t * D;
    float *dst = kvr == ring ? (float *)src : ring + ((gpu_pos(p0, dp0) + t) % cap) * D; /* in place: where it is */
    if (dst != src)
        for (int i = threadIdx.x; i < D; i += blockDim.x) dst[i] = src[i];
    if (round == 1) kv_round_(dst, D, n_rot);
    if (round == 2) {
        __syncthreads();
        fp8_blocks_(dst, (D - n_rot) / 64);
        __syncthreads();
    }
}

/* Stream means of X [n, HC, H] into a capture ring (row (p0+t) % cap, slot `slot` of n_slot rows of
 * H): dst[i] = (sum_a X[t, a, i]) * (1/HC), ascending a (dspark.c's ds4_dspark_capture). */
__global__ void capture_kernel(const float *X, int HC, int H, int64_t p0, const int64_t *dp0, float *ring, int cap,
                               int n_slot, int slot) {
    const int t = blockIdx.y;
    p0 = gpu_pos(p0, dp0);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= H) return;
    const float inv = 1.0f / (float)HC;
    const float *Xt = X + (int64_t)t * HC * H;
    float acc = 0.0f;
    for (int a = 0; a < HC; a++) acc += Xt[(int64_t)a * H + i];
    ring[(((p0 + t) % cap) * n_slot + slot) * (int64_t)H + i] = acc * inv;
}

__global__ void compress_append_kernel(const float *cbuf, const float *zbuf, int cw, int64_t p0, const int64_t *dp0,
                                       int R, const float *ape, float *ring_c, float *ring_z, int cap) {
    const int t = blockIdx.x;
    const int64_t p = gpu_pos(p0, dp0) + t;
    float *rc = ring_c + (p % cap) * cw, *rz = ring_z + (p % cap) * cw;
    const float *ap = ape + (p % R) * cw;
    for (int j = threadIdx.x; j < cw; j += blockDim.x) {
        rc[j] = cbuf[(int64_t)t * cw + j];
        rz[j] = zbuf[(int64_t)t * cw + j] + ap[j];
    }
}

/* Window w0 + block of the pass; with dp0 (a graph's replay) the windows are found here: those
 * closing among positions p .. p+n-1 (p = p0 + *dp0) are p / R .. (p + n) / R - 1 (forward.c's
 * closing_windows), and the blocks past them return. */
__global__ void compress_emit_kernel(int W, int R, int overlap, const float *ring_c, const float *ring_z, int cap,
                                     int64_t w0, int64_t p0, const int64_t *dp0, int n, float *rows,
                                     const float *norm, float eps, const double *freq, int n_rot, int indexer,
                                     int ds4n, int in_smem) {
    __shared__ float red[OPS_THREADS / GPU_WARP];
    if (dp0) {
        const int64_t p = gpu_pos(p0, dp0);
        w0 = p / R;
        if ((int64_t)blockIdx.x >= (p + n) / R - w0) return; /* uniform over the block */
    }
    const int64_t w = w0 + blockIdx.x, a = (int64_t)R * w;
    const int cw = (overlap ? 2 : 1) * W;
    float *out = rows + w * W;
    /* in_smem (rows up to EMIT_MAX_W): the row is built, normed, rotated and rounded in shared memory
     * (W floats, the launch's dynamic shared memory) and written once at the end; wider rows in place */
    extern __shared__ __align__(16) float emit_row[];
    float *row = in_smem ? emit_row : out;
    const int lo = (overlap && w > 0) ? -R : 0;
    /* each position's ring row offset once, in shared memory (not a 64-bit remainder per lane and pass) */
    __shared__ int64_t emit_off[2 * EMIT_MAX_R];
    const bool shared_off = R <= EMIT_MAX_R;
    if (shared_off) {
        for (int k = lo + (int)threadIdx.x; k < R; k += blockDim.x) emit_off[k - lo] = ((a + k) % cap) * cw;
        __syncthreads();
    }
#define EMIT_OFF(k) (shared_off ? emit_off[(k) - lo] : ((a + (k)) % cap) * cw)
#define EMIT_LANE(k) (EMIT_OFF(k) + ((k) < 0 ? d : (overlap ? W + d : d)))
    const int span = R - lo;
    for (int d = threadIdx.x; d < W; d += blockDim.x) {
        float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
        if (span <= EMIT_REG) {
            /* a window of up to EMIT_REG positions (the CSA's 2 x 4): all its gate and value loads in
             * flight together, then the three passes below over registers (H100, a verify's two
             * launches: 21.0 -> 17.0 us each, with the offsets and the row in shared memory) */
            float zv[EMIT_REG], cv[EMIT_REG];
#pragma unroll
            for (int j = 0; j < EMIT_REG; j++) {
                zv[j] = 0.0f, cv[j] = 0.0f;
                if (j < span) {
                    const int64_t off = EMIT_LANE(lo + j);
                    zv[j] = ring_z[off];
                    cv[j] = ring_c[off];
                }
            }
#pragma unroll
            for (int j = 0; j < EMIT_REG; j++)
                if (j < span && zv[j] > mx) mx = zv[j];
            float ev[EMIT_REG]; /* each exponential once, for the sum and then the weights */
#pragma unroll
            for (int j = 0; j < EMIT_REG; j++) {
                ev[j] = j < span ? expf(zv[j] - mx) : 0.0f;
                if (j < span) sum += ev[j];
            }
#pragma unroll
            for (int j = 0; j < EMIT_REG; j++)
                if (j < span) {
                    float pk = ev[j] / sum;
                    acc += pk * cv[j];
                }
        } else { /* the same three passes, in the same order, from the ring */
            for (int k = lo; k < R; k++) {
                float z = ring_z[EMIT_LANE(k)];
                if (z > mx) mx = z;
            }
            for (int k = lo; k < R; k++) sum += expf(ring_z[EMIT_LANE(k)] - mx);
            for (int k = lo; k < R; k++) {
                const int64_t off = EMIT_LANE(k);
                float pk = expf(ring_z[off] - mx) / sum;
                acc += pk * ring_c[off];
            }
        }
        row[d] = acc;
    }
#undef EMIT_LANE
#undef EMIT_OFF
    __syncthreads();
    rms_row_(row, W, eps, norm, row, red);
    rope_row_(row, W, freq, n_rot, a, 0);
    __syncthreads();
    if (indexer) {
        if (ds4n) indexer_qat_(row, W);
    } else if (ds4n) {
        kv_round_(row, W, n_rot);
    }
    if (in_smem) {
        __syncthreads();
        for (int d = threadIdx.x; d < W; d += blockDim.x) out[d] = row[d];
    }
}

/* Indexer scores (forward.c's indexer_slice): one warp per (token, compressed row), lanes split the
 * head dim; per head the dot is reduced over the warp and lane 0 adds iw[h] * relu(dot) * scale in
 * head order.  Tokens with at most top_k visible rows are skipped (they attend to every row). */
#define IDX_WARPS 8
__global__ void __launch_bounds__(IDX_WARPS * GPU_WARP)
indexer_score_kernel(const float *qi, const float *iw, int64_t p0, const int64_t *dp0, int IH, int ID,
                     const float *keys, int ratio, int top_k, float scale, float *score, int max_vis) {
    const int t = blockIdx.y;
    p0 = gpu_pos(p0, dp0);
    const int64_t n_vis = (p0 + t + 1) / ratio;
    if (n_vis <= top_k) return;
    const int lane = threadIdx.x % GPU_WARP;
    const int64_t c = (int64_t)blockIdx.x * IDX_WARPS + threadIdx.x / GPU_WARP;
    if (c >= n_vis) return;
    const float *q = qi + (int64_t)t * IH * ID, *wt = iw + (int64_t)t * IH, *key = keys + c * ID;
    float sc = 0.0f;
    for (int h = 0; h < IH; h++) {
        float dot = 0.0f;
        for (int j = lane; j < ID; j += GPU_WARP) dot = fmaf(q[h * ID + j], key[j], dot);
        dot = gpu_warp_sum(dot);
        sc += wt[h] * ((dot > 0.0f ? dot : 0.0f) * scale);
    }
    if (lane == 0) score[(int64_t)t * max_vis + c] = sc;
}

/* The same scores, 8 keys per warp (head dims up to IDX_JPL * 32): each lane keeps its lanes of
 * the 8 keys in registers and loads the query's lanes once per head for all 8.  The 8 head dots are
 * reduced together by recursive halving: at the xor-16, -8 and -4 steps a lane sends half of its
 * partial sums and adds its partner's matching half, then the xor-2 and -1 steps reduce the one
 * sum left; every sum is formed with the pairings (and the operands) of gpu_warp_sum, so a score
 * is bit for bit the one-key kernel's.  Lane l ends with key 4(l>>4 & 1) + 2(l>>3 & 1) + (l>>2 & 1)
 * of the warp's 8, and adds iw[h] * relu(dot) * scale in head order as that kernel does. */
#define IDX_KPW 8
#define IDX_JPL 4
#define IDX_STAGE_BYTES 40960 /* a token's queries and head weights staged in shared memory up to this */
/* STAGED: the block first copies its token's IH x ID queries and IH weights into shared memory, so
 * the loop over heads reads them there instead of from L2 each head (H100, a verify's 54 blocks at
 * 2048..2053: 36.8 -> 26.8 us).  The same operands in the same order either way. */
template <bool STAGED>
__global__ void __launch_bounds__(IDX_WARPS * GPU_WARP)
indexer_score8_kernel(const float *qi, const float *iw, int64_t p0, const int64_t *dp0, int IH, int ID,
                      const float *keys, int ratio, int top_k, float scale, float *score, int max_vis) {
    const int t = blockIdx.y;
    p0 = gpu_pos(p0, dp0);
    const int64_t n_vis = (p0 + t + 1) / ratio;
    if (n_vis <= top_k) return; /* uniform over the block */
    const int lane = threadIdx.x % GPU_WARP;
    const int64_t c0 = ((int64_t)blockIdx.x * IDX_WARPS + threadIdx.x / GPU_WARP) * IDX_KPW;
    const float *q = qi + (int64_t)t * IH * ID, *wt = iw + (int64_t)t * IH;
    if (STAGED) {
        extern __shared__ __align__(16) float idx_stage[];
        const int nq = IH * ID;
        for (int i = threadIdx.x; i < nq; i += blockDim.x) idx_stage[i] = q[i];
        for (int i = threadIdx.x; i < IH; i += blockDim.x) idx_stage[nq + i] = wt[i];
        __syncthreads();
        q = idx_stage;
        wt = idx_stage + nq;
    }
    if (c0 >= n_vis) return; /* uniform over the warp */
    float kr[IDX_KPW][IDX_JPL];
#pragma unroll
    for (int k = 0; k < IDX_KPW; k++) {
        const int64_t c = c0 + k < n_vis ? c0 + k : n_vis - 1; /* past the end: a copy, never written */
#pragma unroll
        for (int i = 0; i < IDX_JPL; i++) {
            const int j = lane + GPU_WARP * i;
            kr[k][i] = j < ID ? keys[c * ID + j] : 0.0f;
        }
    }
    const int b16 = (lane >> 4) & 1, b8 = (lane >> 3) & 1, b4 = (lane >> 2) & 1;
    float sc = 0.0f;
    for (int h = 0; h < IH; h++) {
        float qv[IDX_JPL];
#pragma unroll
        for (int i = 0; i < IDX_JPL; i++) {
            const int j = lane + GPU_WARP * i;
            qv[i] = j < ID ? q[h * ID + j] : 0.0f;
        }
        float v[IDX_KPW];
#pragma unroll
        for (int k = 0; k < IDX_KPW; k++) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < IDX_JPL; i++)
                if (lane + GPU_WARP * i < ID) dot = fmaf(qv[i], kr[k][i], dot);
            v[k] = dot;
        }
        float w4[4], w2[2];
#pragma unroll
        for (int i = 0; i < 4; i++) { /* xor 16: keep keys 4 b16 + i */
            const float keep = b16 ? v[i + 4] : v[i], send = b16 ? v[i] : v[i + 4];
            w4[i] = keep + gpu_shfl_xor(send, 16);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) { /* xor 8: keep 2 b8 + i of those */
            const float keep = b8 ? w4[i + 2] : w4[i], send = b8 ? w4[i] : w4[i + 2];
            w2[i] = keep + gpu_shfl_xor(send, 8);
        }
        float d; /* xor 4: keep b4 of those */
        {
            const float keep = b4 ? w2[1] : w2[0], send = b4 ? w2[0] : w2[1];
            d = keep + gpu_shfl_xor(send, 4);
        }
        d += gpu_shfl_xor(d, 2);
        d += gpu_shfl_xor(d, 1);
        sc += wt[h] * ((d > 0.0f ? d : 0.0f) * scale);
    }
    const int64_t c = c0 + 4 * b16 + 2 * b8 + b4;
    if ((lane & 3) == 0 && c < n_vis) score[(int64_t)t * max_vis + c] = sc;
}

/* Top-k selection, one block per token (spec ds4.md §2.5): the top_k rows by (score desc, index
 * asc), the CPU engine's rule (cpu/backend.c sorts by it), written in ascending index order;
 * nsel[t] = top_k, or -1 when every visible row is attended.
 *
 * A radix select, O(n) in the visible rows: each score becomes a 32-bit key that orders as the
 * floats do (-0 and +0 one key, as they compare equal), and four passes of 8 bits find the key T
 * of the top_k-th row, how many rows lie above it and how many rows equal to it are still needed
 * ("need", the smallest indices among the ties).  A last pass in index order writes every row
 * with a key above T and the first `need` rows equal to T, a block scan of warp ballots giving
 * each its output slot.  The result depends only on the token's own scores (batch-invariant). */
#define SEL_THREADS 1024
#define SEL_WARPS (SEL_THREADS / GPU_WARP)
#define SEL_NONE 0xffffffffu
#define SEL_CACHE 16 /* rounds of keys held in registers: 16384 rows (a 64K context at ratio 4) */
#define SEL_BURST 4  /* rounds past those loaded together */

__device__ __forceinline__ uint32_t score_key_(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u << 1) == 0u) u = 0u; /* -0 -> +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive rank of this lane's flag among the block's flags of this round, and the round's total
 * (w: the round's SEL_WARPS counters in shared memory; one barrier). */
__device__ __forceinline__ uint32_t sel_scan_(int flag, uint32_t *w, uint32_t *total) {
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP;
    const uint32_t m = gpu_ballot(flag);
    if (lane == 0) w[warp] = (uint32_t)gpu_popc(m);
    __syncthreads();
    uint32_t before = 0, all = 0;
    for (int i = 0; i < SEL_WARPS; i++) {
        const uint32_t v = w[i];
        before += i < warp ? v : 0u;
        all += v;
    }
    *total = all;
    return before + (uint32_t)gpu_popc(m & ((1u << lane) - 1u));
}

__global__ void __launch_bounds__(SEL_THREADS)
indexer_select_kernel(int64_t p0, const int64_t *dp0, int ratio, int top_k, const float *score, int max_vis,
                      int32_t *sel, int32_t *nsel) {
    const int t = blockIdx.x;
    const int64_t n_vis = ((dp0 ? *dp0 : 0) + p0 + t + 1) / ratio; /* gpu_pos */
    if (n_vis <= top_k) {
        if (threadIdx.x == 0) nsel[t] = -1;
        return;
    }
    const int n = (int)n_vis, tid = threadIdx.x, lane = tid % GPU_WARP;
    const float *s = score + (int64_t)t * max_vis;
    int32_t *out = sel + (int64_t)t * top_k;
    __shared__ uint32_t hist[256];
    __shared__ uint32_t wcnt[2][SEL_WARPS];
    __shared__ uint32_t s_prefix, s_need, s_eq;
    /* the first SEL_CACHE rounds of keys stay in registers for all five passes (all their loads in
     * flight at once); rows past SEL_CACHE * SEL_THREADS are read again in each pass */
    uint32_t kc[SEL_CACHE];
#pragma unroll
    for (int i = 0; i < SEL_CACHE; i++) {
        const int c = i * SEL_THREADS + tid;
        kc[i] = c < n ? score_key_(s[c]) : 0u;
    }
    uint32_t prefix = 0u, mask = 0u, need = (uint32_t)top_k, n_eq = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += SEL_THREADS) hist[i] = 0u;
        __syncthreads();
        /* one round of SEL_THREADS rows; uniform over the block (the warp calls inside) */
        auto count = [&](uint32_t k, int c) {
            uint32_t bin = SEL_NONE;
            if (c < n && (k & mask) == prefix) bin = (k >> shift) & 255u;
            /* a warp whose counted rows all fall in one bin (the exponent byte, mostly) adds once */
            const uint32_t valid = gpu_ballot(bin != SEL_NONE);
            if (!valid) return;
            const int lead = __ffs((int)valid) - 1;
            const uint32_t lb = (uint32_t)gpu_shfl_int((int)bin, lead);
            if (gpu_ballot(bin == lb) == valid) {
                if (lane == lead) atomicAdd(&hist[lb], (uint32_t)gpu_popc(valid));
            } else if (bin != SEL_NONE) {
                atomicAdd(&hist[bin], 1u);
            }
        };
#pragma unroll
        for (int i = 0; i < SEL_CACHE; i++) {
            if (i * SEL_THREADS >= n) break;
            count(kc[i], i * SEL_THREADS + tid);
        }
        for (int c0 = SEL_CACHE * SEL_THREADS; c0 < n; c0 += SEL_BURST * SEL_THREADS) {
            uint32_t kk[SEL_BURST]; /* the burst's loads first, all in flight */
#pragma unroll
            for (int q = 0; q < SEL_BURST; q++) {
                const int c = c0 + q * SEL_THREADS + tid;
                kk[q] = c < n ? score_key_(s[c]) : 0u;
            }
#pragma unroll
            for (int q = 0; q < SEL_BURST; q++) {
                if (c0 + q * SEL_THREADS >= n) break;
                count(kk[q], c0 + q * SEL_THREADS + tid);
            }
        }
        __syncthreads();
        if (tid < GPU_WARP) { /* lane l holds bins 255-8l down to 248-8l: descending keys */
            uint32_t cnt[8], tot = 0u;
            for (int j = 0; j < 8; j++) {
                cnt[j] = hist[255 - 8 * lane - j];
                tot += cnt[j];
            }
            uint32_t inc = tot;
            for (int d = 1; d < GPU_WARP; d <<= 1) {
                const uint32_t up = (uint32_t)gpu_shfl_int((int)inc, lane >= d ? lane - d : lane);
                if (lane >= d) inc += up;
            }
            uint32_t before = inc - tot;
            if (before < need && need <= inc) { /* the one lane whose bins hold the need-th key */
                for (int j = 0; j < 8; j++) {
                    if (need <= before + cnt[j]) {
                        s_prefix = prefix | ((uint32_t)(255 - 8 * lane - j) << shift);
                        s_need = need - before;
                        s_eq = cnt[j];
                        break;
                    }
                    before += cnt[j];
                }
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        n_eq = s_eq;
        mask |= 255u << shift;
    }
    /* prefix is now T; n_eq rows equal it, the first `need` of them (by index) are taken */
    const uint32_t T = prefix;
    const int all_ties = need == n_eq;
    uint32_t taken = 0u, eq_seen = 0u;
    int round = 0;
    auto emit = [&](uint32_t k, int c) { /* one round of SEL_THREADS rows in index order */
        const int gt = c < n && k > T, eq = c < n && k == T;
        int take = gt || (eq && all_ties);
        if (!all_ties) {
            uint32_t n_round;
            const uint32_t r = eq_seen + sel_scan_(eq, wcnt[round & 1], &n_round);
            round++;
            eq_seen += n_round;
            take = gt || (eq && r < need);
        }
        uint32_t n_take;
        const uint32_t pos = taken + sel_scan_(take, wcnt[round & 1], &n_take);
        round++;
        if (take) out[pos] = (int32_t)c;
        taken += n_take;
    };
#pragma unroll
    for (int i = 0; i < SEL_CACHE; i++) {
        if (i * SEL_THREADS >= n || taken >= (uint32_t)top_k) break;
        emit(kc[i], i * SEL_THREADS + tid);
    }
    for (int c0 = SEL_CACHE * SEL_THREADS; c0 < n && taken < (uint32_t)top_k; c0 += SEL_BURST * SEL_THREADS) {
        uint32_t kk[SEL_BURST];
#pragma unroll
        for (int q = 0; q < SEL_BURST; q++) {
            const int c = c0 + q * SEL_THREADS + tid;
            kk[q] = c < n ? score_key_(s[c]) : 0u;
        }
#pragma unroll
        for (int q = 0; q < SEL_BURST; q++) {
            if (c0 + q * SEL_THREADS >= n || taken >= (uint32_t)top_k) break;
            emit(kk[q], c0 + q * SEL_THREADS + tid);
        }
    }
    if (tid == 0) nsel[t] = top_k;
}

/* One block of ATT_WARPS warps per (token, HPB heads of it).  Keys (the ring's window rows, then the
 * compressed rows) are dealt to the warps round-robin: a warp dots its keys with the query (lanes
 * split the head's D lanes), the block takes the max over the scores and the sink, the softmax
 * denominator, then each warp accumulates p_k * key_k over its keys for all D lanes (ATT_DPL per
 * lane, in key order) and the warps' partial sums are added in warp order.  The split depends only
 * on the key count, so a (token, head) result does not depend on how many tokens the pass has.
 *
 * All heads of a token read the same keys (one KV head, spec ds4.md §2.2; the CSA selection is
 * per token), so a block of HPB > 1 heads loads each key once into registers and uses it for its
 * HPB heads: HPB times fewer key reads, the same arithmetic per (token, head) in the same order
 * (each head keeps its own per-warp max, per-thread denominator sum and per-warp accumulators,
 * reduced exactly as with one head), so every head's result is bit for bit the HPB = 1 kernel's.
 * gpu_attend takes HPB = ATT_GROUP_HEADS for passes of at least ATT_GROUP_MIN_ROWS tokens and one
 * head per block below.  Passes of at most ATT_SCORE_MAX_ROWS tokens (a decode, a DSpark verify) take
 * the same steps in two kernels instead (attend_score_kernel, attend_value_kernel), spread over
 * more blocks; this kernel is the prefill's and the drafter's. */
#define ATT_WARPS 8
#define ATT_DPL 16 /* D <= 32 * ATT_DPL */
#define ATT_UNROLL 4 /* keys whose rows a warp loads before reducing them (one head per block) */
#define ATT_GROUP_HEADS 4
#define ATT_GROUP_UNROLL 1 /* the same with ATT_GROUP_HEADS heads: one key in flight, 4 heads of work on it */
#define ATT_GROUP_MIN_ROWS 4
#if defined(GPU_NVIDIA) /* two blocks of the grouped kernel per multiprocessor (128 registers, no spills on sm_90) */
#define ATT_BOUNDS(hpb) __launch_bounds__(ATT_WARPS * GPU_WARP, (hpb) > 1 ? 2 : 0)
#else
#define ATT_BOUNDS(hpb) __launch_bounds__(ATT_WARPS * GPU_WARP)
#endif

/* Key k's row: window key k at ring row (first + k) % kv_cap, found from fm = first % kv_cap (the
 * caller's, once a token) by subtraction instead of a 64-bit remainder in every key's load (the
 * same rows; H100, a decode's attention 29.7 -> 23.8 us a layer). */
__device__ __forceinline__ const float *att_key(int k, int n_win, int fm, const float *kv, int kv_cap,
                                                const float *comp, const int32_t *cs, int D) {
    if (k < n_win) {
        int r = fm + k;
        while (r >= kv_cap) r -= kv_cap;
        return kv + (int64_t)r * D;
    }
    return comp + (int64_t)(cs ? cs[k - n_win] : k - n_win) * D;
}

/* The keys of token t (position p) of a causal pass: the window's rows from `first` (n_win), then
 * n_comp compressed rows, the selected ones (cs) where the indexer chose, else all of them. */
__device__ __forceinline__ void att_span(int64_t p, int window, int ratio, const int32_t *sel, const int32_t *nsel,
                                         int top_k, int t, int64_t *first, int *n_win, int *n_comp,
                                         const int32_t **cs) {
    *first = p - window + 1 < 0 ? 0 : p - window + 1;
    *n_win = (int)(p - *first + 1);
    *n_comp = 0;
    *cs = NULL;
    if (ratio > 0) {
        if (sel && nsel[t] >= 0) {
            *n_comp = nsel[t];
            *cs = sel + (int64_t)t * top_k;
        } else {
            *n_comp = (int)((p + 1) / ratio);
        }
    }
}

/* The scores of a causal pass (attend_kernel's first pass) on a grid of (token, HPB heads) x key
 * chunks: warp w of chunk c takes keys ATT_SCORE_KEYS c + w + ATT_WARPS u (u < ATT_SCORE_UNROLL) and
 * writes each key's score exactly as attend_kernel's first pass does (the same fmaf sequence over the
 * head's lanes, the same warp butterfly and scale); attend_value_kernel then finishes the pass as
 * attend_kernel would.  A decode's 64 heads in 64 blocks left half of an H200 idle
 * and read every key twice. */
#define ATT_SCORE_UNROLL 4
#define ATT_SCORE_KEYS (ATT_WARPS * ATT_SCORE_UNROLL) /* keys per block */
#define ATT_SCORE_MAX_ROWS 8                          /* passes of at most this many tokens score apart */
#define ATT_SCORE_GROUP_MIN_ROWS 1 /* a decode's scores too: 4 heads a block read each key once for the 4 */
#define ATT_VALUE_SPLIT 4  /* blocks a (token, head group) of those passes' weighted sums: 128 of a head's (at most
                            * 512) elements each, 4 a thread lane; blocks past a smaller head's D return at once */
#define ATT_VALUE_UNROLL 8 /* keys whose rows a warp of them loads before using them */
template <int HPB, bool FULL>
__global__ void __launch_bounds__(ATT_WARPS * GPU_WARP)
attend_score_kernel(const float *q, int NH, int D, int64_t p0, const int64_t *dp0, int window, const float *kv,
                    int kv_cap, const float *comp, int ratio, const int32_t *sel, const int32_t *nsel, int top_k,
                    float *scr, int keys_cap) {
    const int lane = threadIdx.x % GPU_WARP, wp = threadIdx.x / GPU_WARP;
    const int groups = NH / HPB;
    const int t = (int)(blockIdx.x / groups), h0 = (int)(blockIdx.x % groups) * HPB;
    const int64_t item0 = (int64_t)t * NH + h0;
    int64_t first;
    int n_win, n_comp;
    const int32_t *cs;
    att_span(gpu_pos(p0, dp0) + t, window, ratio, sel, nsel, top_k, t, &first, &n_win, &n_comp, &cs);
    const int fm = (int)(first % kv_cap);
    const int nk = n_win + n_comp, kb = (int)blockIdx.y * ATT_SCORE_KEYS + wp;
    if (kb >= nk) return;
    const float scale = (float)(1.0 / sqrt((double)D));
    bool live[ATT_DPL]; /* the lane's elements of the head (all of them when FULL: D = GPU_WARP * ATT_DPL) */
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++) live[i] = FULL || lane + GPU_WARP * i < D;
    float kr[ATT_SCORE_UNROLL][ATT_DPL];
#pragma unroll
    for (int u = 0; u < ATT_SCORE_UNROLL; u++) {
        const int k = kb + u * ATT_WARPS < nk ? kb + u * ATT_WARPS : kb; /* past the keys: scored, not written */
        const float *key = att_key(k, n_win, fm, kv, kv_cap, comp, cs, D) + lane;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) kr[u][i] = live[i] ? key[GPU_WARP * i] : 0.0f;
    }
    constexpr int NV = HPB * ATT_SCORE_UNROLL; /* the warp's dots, summed at once (gpu_warp_sums_) */
    float dots[NV];
#pragma unroll
    for (int j = 0; j < HPB; j++) {
        const float *qh = q + (item0 + j) * D;
        float qv[ATT_DPL];
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) qv[i] = live[i] ? qh[lane + GPU_WARP * i] : 0.0f;
#pragma unroll
        for (int u = 0; u < ATT_SCORE_UNROLL; u++) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++)
                if (live[i]) dot = fmaf(qv[i], kr[u][i], dot);
            dots[j * ATT_SCORE_UNROLL + u] = dot;
        }
    }
    int m;
    const float dot = gpu_warp_sums_<NV>(dots, &m) * scale;
    const int j = m / ATT_SCORE_UNROLL, k = kb + (m % ATT_SCORE_UNROLL) * ATT_WARPS;
    if (k < nk && lane % (GPU_WARP / NV) == 0) scr[(item0 + j) * keys_cap + k] = dot;
}

template <int HPB, int UNR>
__global__ void ATT_BOUNDS(HPB)
attend_kernel(const float *q, int n, int NH, int D, int64_t p0, const int64_t *dp0, int window, const float *kv,
              int kv_cap, const float *comp, int ratio, const int32_t *sel, const int32_t *nsel, int top_k,
              const float *sinks, float *scr, int keys_cap, float *att, int64_t nc_lo, int nc_n) {
    __shared__ float red[ATT_WARPS * HPB];
    __shared__ float part[ATT_WARPS][GPU_WARP * ATT_DPL];
    const int lane = threadIdx.x % GPU_WARP, wp = threadIdx.x / GPU_WARP;
    const int groups = NH / HPB; /* gpu_attend takes HPB > 1 only when it divides NH */
    const int t = (int)(blockIdx.x / groups), h0 = (int)(blockIdx.x % groups) * HPB;
    const int64_t item0 = (int64_t)t * NH + h0;   /* (token, head) item of the block's first head */
    const float scale = (float)(1.0 / sqrt((double)D));
    int64_t first;
    int n_win, n_comp;
    const int32_t *cs = NULL;
    if (nc_n >= 0) { /* non-causal drafter block: context ring rows nc_lo.. (nc_n), then `ratio` block rows */
        first = gpu_pos(nc_lo, dp0); /* a replayed drafter graph: nc_lo is relative to the pass's position */
        n_win = nc_n;
        n_comp = ratio;
    } else {
        att_span(gpu_pos(p0, dp0) + t, window, ratio, sel, nsel, top_k, t, &first, &n_win, &n_comp, &cs);
    }
    const int fm = (int)(first % kv_cap);
    const int nk = n_win + n_comp;
    float qv[HPB][ATT_DPL], mx[HPB];
#pragma unroll
    for (int j = 0; j < HPB; j++) {
        const float *qh = q + (item0 + j) * D;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++)
            qv[j][i] = lane + GPU_WARP * i < D ? qh[lane + GPU_WARP * i] : 0.0f;
        mx[j] = -INFINITY;
    }
    /* A warp takes keys wp, wp + ATT_WARPS, ... in ascending order, UNR at a time: their rows are
     * loaded before any is reduced, so the loads of several keys are in flight at once (the
     * arithmetic per key, and so the result, is that of one key at a time). */
    for (int k0 = wp; k0 < nk; k0 += ATT_WARPS * UNR) {
        float kr[UNR][ATT_DPL];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int k = k0 + u * ATT_WARPS;
            const float *key = k < nk ? att_key(k, n_win, fm, kv, kv_cap, comp, cs, D) : NULL;
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++) {
                const int d = lane + GPU_WARP * i;
                kr[u][i] = key && d < D ? key[d] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int k = k0 + u * ATT_WARPS;
#pragma unroll
            for (int j = 0; j < HPB; j++) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < ATT_DPL; i++)
                    if (lane + GPU_WARP * i < D) dot = fmaf(qv[j][i], kr[u][i], dot);
                dot = gpu_warp_sum(dot) * scale;
                if (k < nk) {
                    if (lane == 0) scr[(item0 + j) * keys_cap + k] = dot;
                    mx[j] = dot > mx[j] ? dot : mx[j];
                }
            }
        }
    }
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < HPB; j++) red[j * ATT_WARPS + wp] = mx[j];
    __syncthreads();
    float sink[HPB];
#pragma unroll
    for (int j = 0; j < HPB; j++) {
        sink[j] = sinks[h0 + j];
        mx[j] = sink[j];
        for (int w = 0; w < ATT_WARPS; w++) mx[j] = red[j * ATT_WARPS + w] > mx[j] ? red[j * ATT_WARPS + w] : mx[j];
    }
    __syncthreads();
    float den[HPB];
#pragma unroll
    for (int j = 0; j < HPB; j++) den[j] = 0.0f;
    for (int k = threadIdx.x; k < nk; k += blockDim.x) {
#pragma unroll
        for (int j = 0; j < HPB; j++) {
            float *sc = scr + (item0 + j) * keys_cap;
            const float e = expf(sc[k] - mx[j]);
            sc[k] = e;
            den[j] += e;
        }
    }
#pragma unroll
    for (int j = 0; j < HPB; j++) den[j] = block_sum(den[j], red) + expf(sink[j] - mx[j]);
    float acc[HPB][ATT_DPL];
#pragma unroll
    for (int j = 0; j < HPB; j++)
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) acc[j][i] = 0.0f;
    for (int k0 = wp; k0 < nk; k0 += ATT_WARPS * UNR) {
        float kr[UNR][ATT_DPL];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int k = k0 + u * ATT_WARPS;
            const float *key = k < nk ? att_key(k, n_win, fm, kv, kv_cap, comp, cs, D) : NULL;
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++) {
                const int d = lane + GPU_WARP * i;
                kr[u][i] = key && d < D ? key[d] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int k = k0 + u * ATT_WARPS;
            if (k >= nk) break;
#pragma unroll
            for (int j = 0; j < HPB; j++) {
                const float pk = scr[(item0 + j) * keys_cap + k] / den[j];
#pragma unroll
                for (int i = 0; i < ATT_DPL; i++)
                    if (lane + GPU_WARP * i < D) acc[j][i] += pk * kr[u][i];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < HPB; j++) {
        for (int i = 0; i < ATT_DPL; i++) part[wp][lane + GPU_WARP * i] = acc[j][i];
        __syncthreads();
        float *o = att + (item0 + j) * D;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float v = part[0][d];
            for (int w = 1; w < ATT_WARPS; w++) v += part[w][d];
            o[d] = v;
        }
        __syncthreads();
    }
}

/* A short pass's softmax and weighted sums of the keys (the scores from attend_score_kernel): the
 * softmax exactly as attend_kernel takes it (every block of an item computes it), p_k = e_k / den as
 * attend_kernel divides as it reads each key; then a block of ATT_WARPS warps
 * per (token, HPB heads) and DSPLIT-th of the head's lanes (blockIdx.y), so a decode's or a verify's
 * few (token, head) items fill the device without reading a key more often.  Warp wp accumulates p_k *
 * key_k over keys wp, wp + ATT_WARPS, ... in ascending order for its lanes d = lane + GPU_WARP i, and
 * the warps' sums are added in warp order: attend_kernel's chains and order, so the same bits.  In
 * blocks of several heads the keys' row addresses and probabilities are staged in shared memory
 * ATT_VALUE_CHUNK keys at a time (one thread a key; the HPB probabilities of a key side by side), so
 * a warp's step over a key is two shared reads, its row's loads and its arithmetic (H100: each warp
 * found every key's row and loaded its probabilities itself, ~115 instructions a key for 32 of
 * arithmetic).  The source loads UNR keys' rows before using them; the compiler may interleave the
 * loads with the sums (the full-width 4-head instance does, in 48 registers against 115).  FULL:
 * D = GPU_WARP * ATT_DPL (every lane holds elements). */
#define ATT_VALUE_CHUNK 512 /* a multiple of ATT_WARPS: a warp's keys stay in order across chunks */
/* One-head blocks (a decode; also passes of 1-3 rows, and any pass whose head count is not a multiple
 * of ATT_GROUP_HEADS; a decode is 64 items of 4 blocks, about two a multiprocessor) wait out every chunk's
 * staging with nothing else to run: 0 stages nothing there (each warp finds its keys' rows and
 * probabilities itself), else their chunk in keys (a multiple of ATT_WARPS).  H100, two full-width
 * layers at context 2048 / 4096, a decode's kernel sums: staged 512 at a time 891.8 / 956.0 us, 2048
 * at a time 891.7 / 955.4, not staged 876.6 / 952.4 (before the staging and the folded softmax:
 * 889.1 / 958.9). */
#define ATT_VALUE_CHUNK_ONE 0
#define ATT_VALUE_CHUNK_OF(hpb) ((hpb) == 1 ? ATT_VALUE_CHUNK_ONE : ATT_VALUE_CHUNK)
template <int HPB, int DSPLIT, int UNR, bool FULL>
__global__ void __launch_bounds__(ATT_WARPS * GPU_WARP)
attend_value_kernel(int NH, int D, int64_t p0, const int64_t *dp0, int window, const float *kv, int kv_cap,
                    const float *comp, int ratio, const int32_t *sel, const int32_t *nsel, int top_k,
                    const float *sinks, const float *scr, int keys_cap, float *att) {
    constexpr int IPER = ATT_DPL / DSPLIT; /* lanes' elements a block takes of a head */
    static_assert(IPER * DSPLIT == ATT_DPL, "DSPLIT divides ATT_DPL");
    __shared__ float part[ATT_WARPS][GPU_WARP * IPER];
    __shared__ float red[ATT_WARPS * HPB];
    constexpr int CH = ATT_VALUE_CHUNK_OF(HPB);
    static_assert(CH % ATT_WARPS == 0, "chunks of whole rounds of the warps");
    __shared__ const float *rows[CH > 0 ? CH : 1];
    __shared__ __align__(16) float pks[CH > 0 ? CH : 1][HPB];
    static_assert(sizeof part + sizeof red + sizeof rows + sizeof pks <= 48 * 1024,
                  "static shared memory within 48 KB (NVIDIA's static limit; gfx1151 has 64 KB of LDS)");
    const int lane = threadIdx.x % GPU_WARP, wp = threadIdx.x / GPU_WARP;
    const int groups = NH / HPB;
    const int t = (int)(blockIdx.x / groups), h0 = (int)(blockIdx.x % groups) * HPB;
    const int64_t item0 = (int64_t)t * NH + h0;
    const int i0 = (int)blockIdx.y * IPER; /* the block's lanes: d = lane + GPU_WARP (i0 + i), i < IPER */
    if (GPU_WARP * i0 >= D) return;        /* a head of fewer elements: nothing here (the whole block) */
    const int lo = lane + GPU_WARP * i0;   /* this lane's first element */
    int64_t first;
    int n_win, n_comp;
    const int32_t *cs;
    att_span(gpu_pos(p0, dp0) + t, window, ratio, sel, nsel, top_k, t, &first, &n_win, &n_comp, &cs);
    const int fm = (int)(first % kv_cap);
    const int nk = n_win + n_comp;
    /* the softmax, as attend_kernel takes it: each warp's maximum over its keys, the block's with the
     * sink, thread k's sum of the exponentials of keys k, k + blockDim, ..., block_sum, the sink's term */
    float mx[HPB], den[HPB];
#pragma unroll
    for (int j = 0; j < HPB; j++) mx[j] = -INFINITY;
    for (int k = wp; k < nk; k += ATT_WARPS)
#pragma unroll
        for (int j = 0; j < HPB; j++) {
            const float sc = scr[(item0 + j) * keys_cap + k];
            mx[j] = sc > mx[j] ? sc : mx[j];
        }
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < HPB; j++) red[j * ATT_WARPS + wp] = mx[j];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < HPB; j++) {
        mx[j] = sinks[h0 + j];
        for (int w = 0; w < ATT_WARPS; w++) mx[j] = red[j * ATT_WARPS + w] > mx[j] ? red[j * ATT_WARPS + w] : mx[j];
        den[j] = 0.0f;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < nk; k += blockDim.x)
#pragma unroll
        for (int j = 0; j < HPB; j++) den[j] += expf(scr[(item0 + j) * keys_cap + k] - mx[j]);
#pragma unroll
    for (int j = 0; j < HPB; j++) den[j] = block_sum(den[j], red) + expf(sinks[h0 + j] - mx[j]);
    bool live[IPER];
    float acc[HPB][IPER];
#pragma unroll
    for (int i = 0; i < IPER; i++) live[i] = FULL || lo + GPU_WARP * i < D;
#pragma unroll
    for (int j = 0; j < HPB; j++)
#pragma unroll
        for (int i = 0; i < IPER; i++) acc[j][i] = 0.0f;
    if (CH == 0) { /* every warp its own keys' rows and probabilities (the staged path's values) */
        for (int x0 = wp; x0 < nk; x0 += ATT_WARPS * UNR) {
            float kr[UNR][IPER], pk[UNR][HPB];
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int x = x0 + u * ATT_WARPS < nk ? x0 + u * ATT_WARPS : x0; /* past the keys: unused */
                const float *row = att_key(x, n_win, fm, kv, kv_cap, comp, cs, D) + lo;
#pragma unroll
                for (int i = 0; i < IPER; i++) kr[u][i] = live[i] ? row[GPU_WARP * i] : 0.0f;
#pragma unroll
                for (int j = 0; j < HPB; j++) pk[u][j] = expf(scr[(item0 + j) * keys_cap + x] - mx[j]) / den[j];
            }
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                if (x0 + u * ATT_WARPS >= nk) break;
#pragma unroll
                for (int j = 0; j < HPB; j++)
#pragma unroll
                    for (int i = 0; i < IPER; i++)
                        if (live[i]) acc[j][i] += pk[u][j] * kr[u][i];
            }
        }
    }
    for (int c0 = 0; CH > 0 && c0 < nk; c0 += CH) {
        const int cn = nk - c0 < CH ? nk - c0 : CH;
        __syncthreads(); /* the previous chunk's reads are done */
        for (int x = threadIdx.x; x < cn; x += blockDim.x) {
            rows[x] = att_key(c0 + x, n_win, fm, kv, kv_cap, comp, cs, D);
#pragma unroll
            for (int j = 0; j < HPB; j++) pks[x][j] = expf(scr[(item0 + j) * keys_cap + c0 + x] - mx[j]) / den[j];
        }
        __syncthreads();
        for (int x0 = wp; x0 < cn; x0 += ATT_WARPS * UNR) {
            float kr[UNR][IPER], pk[UNR][HPB];
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int x = x0 + u * ATT_WARPS < cn ? x0 + u * ATT_WARPS : x0; /* past the chunk: unused */
                const float *row = rows[x] + lo;
#pragma unroll
                for (int i = 0; i < IPER; i++) kr[u][i] = live[i] ? row[GPU_WARP * i] : 0.0f;
#pragma unroll
                for (int j = 0; j < HPB; j++) pk[u][j] = pks[x][j];
            }
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                if (x0 + u * ATT_WARPS >= cn) break;
#pragma unroll
                for (int j = 0; j < HPB; j++)
#pragma unroll
                    for (int i = 0; i < IPER; i++)
                        if (live[i]) acc[j][i] += pk[u][j] * kr[u][i];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < HPB; j++) {
#pragma unroll
        for (int i = 0; i < IPER; i++) part[wp][lane + GPU_WARP * i] = acc[j][i];
        __syncthreads();
        float *o = att + (item0 + j) * D + GPU_WARP * i0;
        for (int dl = threadIdx.x; dl < GPU_WARP * IPER; dl += blockDim.x) {
            if (GPU_WARP * i0 + dl >= D) break;
            float v = part[0][dl];
            for (int w = 1; w < ATT_WARPS; w++) v += part[w][dl];
            o[dl] = v;
        }
        __syncthreads();
    }
}

__device__ float sqrt_softplus_(float x) {
    float sp = x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
    return sqrtf(sp);
}

/* One block per token: sqrt(softplus) of every expert's score in parallel, then K rounds of a
 * block argmax of score + bias over the unused experts (ties to the lowest id, as forward.c's
 * loop), or the hash table's row; the weights by one thread in the CPU's order. */
#define ROUTE_THREADS 256
__global__ void __launch_bounds__(ROUTE_THREADS)
moe_route_kernel(float *scores, int E, int K, const int32_t *tid2eid, const int32_t *tokens, const float *bias,
                 int norm, int ds4n, float wscale, int32_t *sel, float *wsel) {
    __shared__ float bv_s[ROUTE_THREADS / GPU_WARP];
    __shared__ int bi_s[ROUTE_THREADS / GPU_WARP];
    __shared__ int chosen[32];
    const int t = blockIdx.x;
    float *st = scores + (int64_t)t * E;
    for (int x = threadIdx.x; x < E; x += blockDim.x) st[x] = sqrt_softplus_(st[x]);
    __syncthreads();
    int32_t *sl = sel + (int64_t)t * K;
    float *ws = wsel + (int64_t)t * K;
    if (tid2eid) {
        if (threadIdx.x < K) chosen[threadIdx.x] = tid2eid[(int64_t)tokens[t] * K + threadIdx.x];
    } else {
        const int lane = threadIdx.x % GPU_WARP, wp = threadIdx.x / GPU_WARP;
        for (int k = 0; k < K; k++) {
            float bv = -INFINITY;
            int bi = -1;
            for (int x = threadIdx.x; x < E; x += blockDim.x) {
                int used = 0;
                for (int j = 0; j < k; j++) used |= chosen[j] == x;
                const float v = st[x] + bias[x];
                if (!used && (bi < 0 || v > bv)) { bv = v; bi = x; }
            }
            for (int m = GPU_WARP / 2; m > 0; m >>= 1) { /* max value, then lowest id */
                const float ov = gpu_shfl_xor(bv, m);
                const int oi = gpu_shfl_xor_int(bi, m);
                if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
            }
            if (lane == 0) { bv_s[wp] = bv; bi_s[wp] = bi; }
            __syncthreads();
            if (threadIdx.x == 0) {
                float b = bv_s[0];
                int i = bi_s[0];
                for (int w = 1; w < (int)(blockDim.x / GPU_WARP); w++)
                    if (bi_s[w] >= 0 && (i < 0 || bv_s[w] > b || (bv_s[w] == b && bi_s[w] < i))) { b = bv_s[w]; i = bi_s[w]; }
                chosen[k] = i;
            }
            __syncthreads();
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 0; k < K; k++) sl[k] = chosen[k];
        float total = 0.0f;
        for (int k = 0; k < K; k++) { ws[k] = st[sl[k]]; total += ws[k]; }
        if (norm) {
            total = ds4n ? (total < 6.1035e-5f ? 6.1035e-5f : total) : total + 1e-20f;
            for (int k = 0; k < K; k++) ws[k] /= total;
        }
        for (int k = 0; k < K; k++) ws[k] *= wscale;
    }
}

__global__ void swiglu_kernel(float *a, const float *b, int64_t n, float clamp) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = a[i], u = b[i];
    if (clamp > 0.0f) {
        if (g > clamp) g = clamp;
        if (u > clamp) u = clamp;
        if (u < -clamp) u = -clamp;
    }
    a[i] = g * sigmoidf_(g) * u;
}

#define MAXK 32

__global__ void moe_combine_kernel(const float *oe, const int32_t *sel, const float *wsel, int K, int H,
                                   const float *shared, float *y) {
    const int t = blockIdx.y;
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= H) return;
    const int32_t *sl = sel + (int64_t)t * K;
    /* the slots in ascending (expert id, slot) order, as the CPU visits experts; found by a scan per
     * step rather than sorted into a local array (an indexed local array lives in scratch memory) */
    float acc = 0.0f;
    int prev_id = 0, prev_k = -1;
    for (int i = 0; i < K; i++) {
        int k = -1;
        for (int j = 0; j < K; j++) {
            const int id = sl[j];
            const bool later = prev_k < 0 || id > prev_id || (id == prev_id && j > prev_k);
            if (later && (k < 0 || id < sl[k])) k = j;
        }
        acc += wsel[(int64_t)t * K + k] * oe[((int64_t)t * K + k) * H + d];
        prev_id = sl[k];
        prev_k = k;
    }
    y[(int64_t)t * H + d] = acc + shared[(int64_t)t * H + d];
}

__global__ void scale_kernel(float *x, int64_t n, float s) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

/* ---- host entry points ----------------------------------------------------------------------- */

int gpu_ops_init(char *err, size_t len) { return quant_tables_init(err, len); }

int gpu_copy(ds4_gpu_ctx *c, void *dst, const void *src, size_t bytes, int32_t to_host, char *err, size_t len) {
    if (!bytes) return DS4_OK;
    GPU_TRY(hipMemcpyAsync(dst, src, bytes, to_host ? hipMemcpyDeviceToHost : hipMemcpyHostToDevice, c->stream),
            to_host ? "copy to the host" : "copy to the device");
    if (to_host) GPU_TRY(hipStreamSynchronize(c->stream), "device work before a copy to the host");
    return DS4_OK;
}

int gpu_sync(ds4_gpu_ctx *c, char *err, size_t len) {
    GPU_TRY(hipStreamSynchronize(c->stream), "device work");
    return DS4_OK;
}

int gpu_embed(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t row_bytes, int32_t H, const int32_t *tokens,
              int32_t n, int32_t HC, float *X, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    GPU_TYPE_SWITCH(type, embed_kernel, dim3(n), dim3(OPS_THREADS), 0, c->stream, (const uint8_t *)W, row_bytes, H,
                    tokens, HC, X)
    return ops_check("embed kernel", err, len);
}

int gpu_rms_norm(ds4_gpu_ctx *c, const float *x, int64_t ldx, int64_t rows, int64_t width, float eps, const float *w,
                 float *out, int64_t ldo, char *err, size_t len) {
    if (rows <= 0) return DS4_OK;
    const int threads = width >= 4 * NORM_THREADS ? NORM_THREADS : OPS_THREADS; /* the HC-wide rows get more */
    hipLaunchKernelGGL(rms_norm_kernel, dim3((unsigned)rows), dim3(threads), 0, c->stream, x, ldx, width, eps, w, out,
                       ldo);
    return ops_check("rms_norm kernel", err, len);
}

int gpu_hc_pre(ds4_gpu_ctx *c, const float *hcm, int32_t n, int32_t HC, int32_t H, float s0, float s1, float s2,
               const float *base, float eps, int32_t iters, const float *X, float *x, float *pre, float *post,
               float *comb, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    if (HC > MAXHC) return gpu_fail(err, len, DS4_E_UNSUPPORTED, "hc_count %d > %d", HC, MAXHC);
    if (HC == 4)
        hipLaunchKernelGGL(hc_mix4_kernel, dim3(blocks_for((int64_t)n * 4, 64)), dim3(64), 0, c->stream, hcm, n, s0, s1,
                           s2, base, eps, iters, pre, post, comb);
    else
        hipLaunchKernelGGL(hc_mix_kernel<0>, dim3(blocks_for(n, 64)), dim3(64), 0, c->stream, hcm, n, HC, s0, s1, s2,
                           base, eps, iters, pre, post, comb);
    int rc = ops_check("hc_pre mix kernel", err, len);
    if (rc != DS4_OK) return rc;
    hipLaunchKernelGGL(hc_collapse_kernel, dim3(blocks_for(H, OPS_THREADS), n), dim3(OPS_THREADS), 0, c->stream, X,
                       pre, HC, H, x);
    return ops_check("hc_pre collapse kernel", err, len);
}

int gpu_hc_post(ds4_gpu_ctx *c, const float *X, const float *out, const float *post, const float *comb, int32_t n,
                int32_t HC, int32_t H, float *Y, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    if (HC == 4)
        hipLaunchKernelGGL(hc_post_kernel<4>, dim3(blocks_for(H, OPS_THREADS), n), dim3(OPS_THREADS), 0, c->stream, X,
                           out, post, comb, HC, H, Y);
    else
        hipLaunchKernelGGL(hc_post_kernel<0>, dim3(blocks_for(H, OPS_THREADS), n), dim3(OPS_THREADS), 0, c->stream, X,
                           out, post, comb, HC, H, Y);
    return ops_check("hc_post kernel", err, len);
}

int gpu_hc_head(ds4_gpu_ctx *c, const float *X, const float *m, int32_t n, int32_t HC, int32_t H, float s0,
                const float *base, float eps, float *w, float *out, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    hipLaunchKernelGGL(hc_head_w_kernel, dim3(blocks_for((int64_t)n * HC, 64)), dim3(64), 0, c->stream, m, n, HC, s0,
                       base, eps, w);
    int rc = ops_check("hc_head weight kernel", err, len);
    if (rc != DS4_OK) return rc;
    hipLaunchKernelGGL(hc_collapse_kernel, dim3(blocks_for(H, OPS_THREADS), n), dim3(OPS_THREADS), 0, c->stream, X, w,
                       HC, H, out);
    return ops_check("hc_head collapse kernel", err, len);
}

int gpu_norm_rope(ds4_gpu_ctx *c, float *x, int64_t rows, int32_t width, int32_t hpt, float eps, const float *w,
                  const double *freq, int32_t n_rot, int64_t p0, int32_t inverse, int32_t qat, char *err, size_t len) {
    if (rows <= 0) return DS4_OK;
    hipLaunchKernelGGL(norm_rope_kernel, dim3((unsigned)rows), dim3(OPS_THREADS), 0, c->stream, x, width, hpt, eps, w,
                       freq, n_rot, GPU_POS(c, p0), inverse, qat);
    return ops_check("norm_rope kernel", err, len);
}

int gpu_kv_store(ds4_gpu_ctx *c, const float *kvr, int32_t n, int32_t D, float *ring, int32_t cap, int64_t p0,
                 int32_t n_rot, int32_t round, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    hipLaunchKernelGGL(kv_store_kernel, dim3(n), dim3(OPS_THREADS), 0, c->stream, kvr, D, ring, cap, GPU_POS(c, p0), n_rot,
                       round);
    return ops_check("kv_store kernel", err, len);
}

int gpu_capture(ds4_gpu_ctx *c, const float *X, int32_t n, int32_t HC, int32_t H, int64_t p0, float *ring, int32_t cap,
                int32_t n_slot, int32_t slot, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    hipLaunchKernelGGL(capture_kernel, dim3(blocks_for(H, OPS_THREADS), n), dim3(OPS_THREADS), 0, c->stream, X, HC, H,
                       GPU_POS(c, p0), ring, cap, n_slot, slot);
    return ops_check("capture kernel", err, len);
}

int gpu_compress(ds4_gpu_ctx *c, const float *cbuf, const float *zbuf, int32_t n, int64_t p0, int32_t W, int32_t R,
                 int32_t overlap, const float *ape, float *ring_c, float *ring_z, int32_t cap, int64_t w0, int32_t nw,
                 float *rows, const float *norm, float eps, const double *freq, int32_t n_rot, int32_t indexer,
                 int32_t ds4n, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    const int cw = (overlap ? 2 : 1) * W;
    hipLaunchKernelGGL(compress_append_kernel, dim3(n), dim3(OPS_THREADS), 0, c->stream, cbuf, zbuf, cw,
                       GPU_POS(c, p0), R, ape, ring_c, ring_z, cap);
    int rc = ops_check("compressor append kernel", err, len);
    if (c->cap_dp0) nw = (n + R - 1) / R; /* a graph: the kernel finds the windows (at most this many) */
    if (rc != DS4_OK || nw <= 0) return rc;
    const int in_smem = W <= EMIT_MAX_W;
    hipLaunchKernelGGL(compress_emit_kernel, dim3(nw), dim3(OPS_THREADS), in_smem ? (size_t)W * sizeof(float) : 0,
                       c->stream, W, R, overlap, ring_c, ring_z, cap, w0, GPU_POS(c, p0), n, rows, norm, eps, freq,
                       n_rot, indexer, ds4n, in_smem);
    return ops_check("compressor emit kernel", err, len);
}

int gpu_indexer(ds4_gpu_ctx *c, const float *qi, const float *iw, int32_t n, int64_t p0, int32_t IH, int32_t ID,
                const float *keys, int32_t ratio, int32_t top_k, float scale, float *score, int32_t max_vis,
                int32_t *sel, int32_t *nsel, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    int64_t max_n_vis = (p0 + n) / ratio;
    if (c->cap_dp0 && max_n_vis > top_k) { /* a graph: every position of its span (backend.h) */
        max_n_vis = ds4_graph_span(p0 + n) / ratio;
        if (max_n_vis > max_vis) max_n_vis = max_vis;
    }
    if (max_n_vis > top_k) {
        const size_t stage = ((size_t)IH * (size_t)ID + (size_t)IH) * sizeof(float);
        if (ID <= IDX_JPL * GPU_WARP && stage <= IDX_STAGE_BYTES)
            hipLaunchKernelGGL(indexer_score8_kernel<true>, dim3(blocks_for(max_n_vis, IDX_WARPS * IDX_KPW), n),
                               dim3(IDX_WARPS * GPU_WARP), stage, c->stream, qi, iw, GPU_POS(c, p0), IH, ID, keys,
                               ratio, top_k, scale, score, max_vis);
        else if (ID <= IDX_JPL * GPU_WARP)
            hipLaunchKernelGGL(indexer_score8_kernel<false>, dim3(blocks_for(max_n_vis, IDX_WARPS * IDX_KPW), n),
                               dim3(IDX_WARPS * GPU_WARP), 0, c->stream, qi, iw, GPU_POS(c, p0), IH, ID, keys, ratio,
                               top_k, scale, score, max_vis);
        else
            hipLaunchKernelGGL(indexer_score_kernel, dim3(blocks_for(max_n_vis, IDX_WARPS), n),
                               dim3(IDX_WARPS * GPU_WARP), 0, c->stream, qi, iw, GPU_POS(c, p0), IH, ID, keys, ratio,
                               top_k, scale, score, max_vis);
        int rc = ops_check("indexer score kernel", err, len);
        if (rc != DS4_OK) return rc;
    }
    hipLaunchKernelGGL(indexer_select_kernel, dim3(n), dim3(SEL_THREADS), 0, c->stream, GPU_POS(c, p0), ratio, top_k,
                       score, max_vis, sel, nsel);
    return ops_check("indexer kernel", err, len);
}

int gpu_attend(ds4_gpu_ctx *c, const float *q, int32_t n, int32_t NH, int32_t D, int64_t p0, int32_t window,
               const float *kv, int32_t kv_cap, const float *comp, int32_t ratio, const int32_t *sel,
               const int32_t *nsel, int32_t top_k, const float *sinks, float *sc, int32_t keys_cap, float *att,
               char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    if (D > GPU_WARP * ATT_DPL)
        return gpu_fail(err, len, DS4_E_UNSUPPORTED, "attention: head_dim %d > %d", D, GPU_WARP * ATT_DPL);
    /* the same results in every branch: grouped heads read each key once per group, and a short
     * pass scores its keys over the whole device first (attend_score_kernel) */
    const bool grouped = n >= ATT_GROUP_MIN_ROWS && NH % ATT_GROUP_HEADS == 0;
    const int hpb = grouped ? ATT_GROUP_HEADS : 1;
    const unsigned items = (unsigned)((int64_t)n * (NH / hpb));
    if (n <= ATT_SCORE_MAX_ROWS) {
        /* scores take ATT_GROUP_HEADS heads a block from ATT_SCORE_GROUP_MIN_ROWS rows (each score's
         * arithmetic is the same in either kernel) */
        const bool sgrouped = n >= ATT_SCORE_GROUP_MIN_ROWS && NH % ATT_GROUP_HEADS == 0;
        const dim3 sgrid((unsigned)((int64_t)n * (NH / (sgrouped ? ATT_GROUP_HEADS : 1))),
                         (unsigned)((keys_cap + ATT_SCORE_KEYS - 1) / ATT_SCORE_KEYS));
        const bool full = D == GPU_WARP * ATT_DPL;
#define ATT_SCORE_LAUNCH(hpb, f)                                                                                      \
    hipLaunchKernelGGL((attend_score_kernel<hpb, f>), sgrid, dim3(ATT_WARPS * GPU_WARP), 0, c->stream, q, NH, D,        \
                       GPU_POS(c, p0), window, kv, kv_cap, comp, ratio, sel, nsel, top_k, sc, keys_cap)
        if (sgrouped && full)
            ATT_SCORE_LAUNCH(ATT_GROUP_HEADS, true);
        else if (sgrouped)
            ATT_SCORE_LAUNCH(ATT_GROUP_HEADS, false);
        else if (full)
            ATT_SCORE_LAUNCH(1, true);
        else
            ATT_SCORE_LAUNCH(1, false);
#undef ATT_SCORE_LAUNCH
        const dim3 vgrid(items, ATT_VALUE_SPLIT);
#define ATT_VALUE_LAUNCH(hpb, f)                                                                                      \
    hipLaunchKernelGGL((attend_value_kernel<hpb, ATT_VALUE_SPLIT, ATT_VALUE_UNROLL, f>), vgrid,                       \
                       dim3(ATT_WARPS * GPU_WARP), 0, c->stream, NH, D, GPU_POS(c, p0), window, kv, kv_cap, comp,     \
                       ratio, sel, nsel, top_k, sinks, sc, keys_cap, att)
        if (grouped && full)
            ATT_VALUE_LAUNCH(ATT_GROUP_HEADS, true);
        else if (grouped)
            ATT_VALUE_LAUNCH(ATT_GROUP_HEADS, false);
        else if (full)
            ATT_VALUE_LAUNCH(1, true);
        else
            ATT_VALUE_LAUNCH(1, false);
#undef ATT_VALUE_LAUNCH
    } else if (grouped)
        hipLaunchKernelGGL((attend_kernel<ATT_GROUP_HEADS, ATT_GROUP_UNROLL>), dim3(items),
                           dim3(ATT_WARPS * GPU_WARP), 0, c->stream, q, n, NH, D, GPU_POS(c, p0), window, kv, kv_cap,
                           comp, ratio, sel, nsel, top_k, sinks, sc, keys_cap, att, (int64_t)0, -1);
    else
        hipLaunchKernelGGL((attend_kernel<1, ATT_UNROLL>), dim3(items), dim3(ATT_WARPS * GPU_WARP), 0, c->stream,
                           q, n, NH, D, GPU_POS(c, p0), window, kv, kv_cap, comp, ratio, sel, nsel, top_k, sinks, sc,
                           keys_cap, att, (int64_t)0, -1);
    return ops_check("attention kernel", err, len);
}

int gpu_attend_nc(ds4_gpu_ctx *c, const float *q, int32_t n, int32_t NH, int32_t D, const float *ring, int32_t cap,
                  int64_t lo, int32_t n_ctx, const float *rows, int32_t n_rows, const float *sinks, float *sc,
                  int32_t keys_cap, float *att, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    if (D > GPU_WARP * ATT_DPL)
        return gpu_fail(err, len, DS4_E_UNSUPPORTED, "attention: head_dim %d > %d", D, GPU_WARP * ATT_DPL);
    if (n_ctx + n_rows > keys_cap)
        return gpu_fail(err, len, DS4_E_INVALID, "drafter attention: %d keys > scratch %d", n_ctx + n_rows, keys_cap);
    hipLaunchKernelGGL((attend_kernel<1, ATT_UNROLL>), dim3((unsigned)((int64_t)n * NH)), dim3(ATT_WARPS * GPU_WARP), 0,
                       c->stream, q, n, NH, D, (int64_t)0, c->cap_dp0, 0, ring, cap, rows, n_rows, (const int32_t *)NULL,
                       (const int32_t *)NULL, 0, sinks, sc, keys_cap, att, c->cap_dp0 ? lo - c->cap_p0 : lo, n_ctx);
    return ops_check("drafter attention kernel", err, len);
}

int gpu_moe_route(ds4_gpu_ctx *c, float *scores, int32_t n, int32_t E, int32_t K, const int32_t *tid2eid,
                  const int32_t *tokens, const float *bias, int32_t norm, int32_t ds4n, float scale, int32_t *sel,
                  float *wsel, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    if (K > MAXK) return gpu_fail(err, len, DS4_E_UNSUPPORTED, "n_expert_used %d > %d", K, MAXK);
    hipLaunchKernelGGL(moe_route_kernel, dim3(n), dim3(ROUTE_THREADS), 0, c->stream, scores, E, K, tid2eid, tokens,
                       bias, norm, ds4n, scale, sel, wsel);
    return ops_check("moe_route kernel", err, len);
}

int gpu_swiglu(ds4_gpu_ctx *c, float *a, const float *b, int64_t n, float clamp, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    hipLaunchKernelGGL(swiglu_kernel, dim3(blocks_for(n, OPS_THREADS)), dim3(OPS_THREADS), 0, c->stream, a, b, n, clamp);
    return ops_check("swiglu kernel", err, len);
}

int gpu_moe_combine(ds4_gpu_ctx *c, const float *oe, const int32_t *sel, const float *wsel, int32_t n, int32_t K,
                    int32_t H, const float *shared, float *y, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    hipLaunchKernelGGL(moe_combine_kernel, dim3(blocks_for(H, OPS_THREADS), n), dim3(OPS_THREADS), 0, c->stream, oe,
                       sel, wsel, K, H, shared, y);
    return ops_check("moe_combine kernel", err, len);
}

int gpu_scale(ds4_gpu_ctx *c, float *x, int64_t n, float s, char *err, size_t len) {
    if (n <= 0) return DS4_OK;
    hipLaunchKernelGGL(scale_kernel, dim3(blocks_for(n, OPS_THREADS)), dim3(OPS_THREADS), 0, c->stream, x, n, s);
    return ops_check("scale kernel", err, len);
}

/* ---- the drafter's greedy Markov head (dspark.c) ---------------------------------------------- */


/* The first maximum over a block: each thread brings the first maximum (bv, bi) of its strided
 * elements (bi < 0: it saw none), and a tree keeps the larger value, or the lower index on equal
 * values; the winner's index is returned to thread 0 (-1 when no thread saw one). */
__device__ int argmax_block(float bv, int bi, float *sv, int *si) {
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            const float ov = sv[threadIdx.x + w];
            const int oi = si[threadIdx.x + w];
            if (oi >= 0 && (si[threadIdx.x] < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x]))) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    return si[0];
}

/* Greedy picks in two launches (ds4_argmax's rule on the float values: the first maximum, NaN
 * entries passed over, a NaN at 0 gives 0): ARGMAX_PARTS blocks per row each reduce a contiguous
 * part of the row to its first maximum and its first non-finite entry, then one block per row
 * reduces the parts in order.  One block per row would walk 129280 entries with few loads in
 * flight (latency-bound on one multiprocessor); the parts spread a row over the device. */
template <int ADD>
__global__ void __launch_bounds__(ARGMAX_PART_THREADS)
argmax_part_kernel(const float *a, const float *b, int64_t ld, int n, float *pv, int *pi, int *pb) {
    __shared__ float sv[ARGMAX_PART_THREADS];
    __shared__ int si[ARGMAX_PART_THREADS];
    __shared__ int sb[ARGMAX_PART_THREADS];
    const int row = blockIdx.y, part = blockIdx.x;
    const float *ra = a + (int64_t)row * ld;
    const float *rb = ADD ? b + (int64_t)row * ld : NULL;
    const int per = (n + ARGMAX_PARTS - 1) / ARGMAX_PARTS, lo = part * per, hi = min(n, lo + per);
    float bv = -INFINITY;
    int bi = -1, fb = n; /* a thread's indices grow: its first non-finite one is its lowest */
    for (int i = lo + (int)threadIdx.x; i < hi; i += blockDim.x) {
        const float v = ADD ? ra[i] + rb[i] : ra[i];
        if (fb == n && (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u) fb = i;
        if (v == v && (bi < 0 || v > bv)) { bv = v; bi = i; }
    }
    sb[threadIdx.x] = fb;
    const int best = argmax_block(bv, bi, sv, si); /* its barriers also publish sb */
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w && sb[threadIdx.x + w] < sb[threadIdx.x]) sb[threadIdx.x] = sb[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const int k = row * ARGMAX_PARTS + part;
        pv[k] = best >= 0 ? sv[0] : -INFINITY;
        pi[k] = best;
        pb[k] = sb[0];
    }
}

/* One block of ARGMAX_PARTS threads per row: the parts in order (the lower index wins on equal
 * values, so the first maximum overall), and the row's first non-finite entry (-1: none). */
template <int ADD>
__global__ void __launch_bounds__(ARGMAX_PARTS)
argmax_final_kernel(const float *a, const float *b, int64_t ld, int n, const float *pv, const int *pi, const int *pb,
                    int32_t *ids, int32_t *bad) {
    __shared__ float sv[ARGMAX_PARTS];
    __shared__ int si[ARGMAX_PARTS];
    __shared__ int sb[ARGMAX_PARTS];
    const int row = blockIdx.x, k = row * ARGMAX_PARTS + (int)threadIdx.x;
    sb[threadIdx.x] = pb[k];
    const int best = argmax_block(pv[k], pi[k], sv, si);
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w && sb[threadIdx.x + w] < sb[threadIdx.x]) sb[threadIdx.x] = sb[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float v0 = ADD ? a[(int64_t)row * ld] + b[(int64_t)row * ld] : a[(int64_t)row * ld];
        ids[row] = (v0 != v0 || best < 0) ? 0 : best; /* the host loop never leaves a NaN at 0 */
        if (bad) bad[row] = sb[0] < n ? sb[0] : -1;
    }
}

template <int ADD>
static int argmax_launch(ds4_gpu_ctx *c, const float *a, const float *b, int64_t ld, int32_t rows, int32_t n,
                         int32_t *ids, int32_t *bad, const char *what, char *err, size_t len) {
    if (n <= 0 || rows <= 0 || rows > ARGMAX_MAX_ROWS)
        return gpu_fail(err, len, DS4_E_INVALID, "%s: %d rows of %d entries (at most %d rows)", what, rows, n,
                        ARGMAX_MAX_ROWS);
    if (!c->amax) return gpu_fail(err, len, DS4_E_STATE, "%s: no scratch for the parts", what);
    float *pv = (float *)c->amax;
    int *pi = (int *)(pv + ARGMAX_MAX_ROWS * ARGMAX_PARTS), *pb = pi + ARGMAX_MAX_ROWS * ARGMAX_PARTS;
    hipLaunchKernelGGL(argmax_part_kernel<ADD>, dim3(ARGMAX_PARTS, (unsigned)rows), dim3(ARGMAX_PART_THREADS), 0,
                       c->stream, a, b, ld, n, pv, pi, pb);
    hipLaunchKernelGGL(argmax_final_kernel<ADD>, dim3((unsigned)rows), dim3(ARGMAX_PARTS), 0, c->stream, a, b, ld, n,
                       pv, pi, pb, ids, bad);
    return ops_check(what, err, len);
}

int gpu_add_argmax(ds4_gpu_ctx *c, const float *a, const float *b, int32_t n, int32_t *out, char *err, size_t len) {
    return argmax_launch<1>(c, a, b, n, 1, n, out, NULL, "add_argmax kernels", err, len);
}

int gpu_argmax_rows(ds4_gpu_ctx *c, const float *x, int64_t ld, int32_t rows, int32_t n, int32_t *ids, int32_t *bad,
                    char *err, size_t len) {
    return argmax_launch<0>(c, x, NULL, ld, rows, n, ids, bad, "argmax_rows kernels", err, len);
}
