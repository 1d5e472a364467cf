/*
 * planar.hip — the planar device layout of quantised weight rows, and the matvec / small-batch /
 * expert-gathered kernels that read it.
 *
 * A GGML block interleaves its scales with its codes (Q8_0: 34-byte blocks of 32 weights, Q2_K: 84
 * bytes per 256, IQ2_XXS: 66 per 256; spec ds4.md §5), so a lane can load only 2 or 4 bytes at a
 * time.  At upload (gpu_upload_matrix) every row whose byte length is a multiple of 16 is written
 * to the device as the same bytes in another order, the codes of all its blocks first:
 *
 *   Q8_0     [nb][32] int8 codes  | [nb] f16 d
 *   Q2_K     [nb][64] 2-bit codes | [nb][16] scale/min nibbles | [nb] {f16 d, f16 dmin}
 *   IQ2_XXS  [nb][64] grid/sign words | [nb] f16 d
 *
 * (nb = blocks per row).  A row keeps its GGML byte length, so row slices, expert strides, and the
 * memory accounting are those of the file; the layout id DS4_GPU_PLANAR | type marks such a matrix.
 * A lane reads one 16-byte "unit" of codes per load: 16 Q8_0 weights, or 64 Q2_K / IQ2_XXS weights.
 *
 * Numerics: float32 activations, as the CPU kernels.  Each code becomes an exact float through the
 * 2^23 mantissa (byte b -> bits 0x4B0000bb = 2^23 + b, minus 2^23), a unit's products are summed
 * and then scaled by the block's scale (Q8_0, IQ2_XXS) or formed per weight as d*sc*q - dmin*m
 * (Q2_K), so the result differs from ds4tui/native/cpu/matmul.c by float32 rounding order only.  A
 * (row, token) result depends on the matrix shape alone, never on the token or slot count, so the
 * products are batch-invariant, which greedy DSpark verification needs.
 */
#include "quant.h"

#define PL_WARPS 4         /* warps per block */
#define PL_NT 8            /* tokens per warp in a multi-token pass */
#define PL_SHORT_ROWS 8192 /* below: PL_WARPS warps share a row's units */
#define PL_TINY_ROWS 320   /* below: PL_TINY_WARPS warps per row (HC control, routers) */
#define PL_TINY_WARPS 32
#define PL_TINY_UNITS 512  /* ... when a row has that many units; fewer than PL_WARPS_UNITS: one warp a row, */
#define PL_WARPS_UNITS 128 /* else PL_WARPS (as mm_kernel's tiny matrices: hip/matmul.hip) */
#define PL_REPACK_CHUNK ((size_t)64 << 20) /* staging bytes per upload step */
#define PS_WARPS 8         /* warps per block of the staged kernels (ps_kernel) */
#define PS_BLOCKS 512      /* blocks a staged launch aims at: more rounds of row groups per block beyond */
#define PS_STAGE ((int64_t)48 << 10) /* bytes of staged activations a block may take (any target, unasked) */
#define PS_DENSE_ROWS 2048  /* one-token Q8_0 products from here ... */
#define PS_DENSE_MAX 65536  /* ... to here take the staged kernel (H200: 0.82-0.95x from 2048 to 32768 rows,
                             * 1.05-1.10x below, 1.02x at the 129280-row LM head) */

/* This translation unit's copy of the IQ2_XXS tables (quant.h). */
int gpu_planar_init(char *err, size_t len) { return quant_tables_init(err, len); }

/* Exact float of byte k of w (0..255), and of w's byte k read as int8 after w ^= 0x80808080. */
__device__ __forceinline__ float pl_u8(uint32_t w, int k) {
    return __uint_as_float(gpu_byte_perm(w, 0x4B000000u, 0x7440u | (uint32_t)k)) - 8388608.0f;
}
__device__ __forceinline__ float pl_s8(uint32_t wx, int k) {
    return __uint_as_float(gpu_byte_perm(wx, 0x4B000000u, 0x7440u | (uint32_t)k)) - 8388736.0f;
}

/* The staged kernels keep activation rows in shared memory as float4s, float4 c of a row at
 * ps_swz<SH, MASK>(c): its low bits XORed with the bits from SH up, a permutation within each
 * aligned group of 8 (so a row stays where it was, and the staging's coalesced stores stay
 * conflict-free).  A lane reads float4 i of unit u = l + 32k at 4u + i (Q8_0), 16u + i (IQ2_XXS) or
 * xoff(u) / 4 + 8s + i (Q2_K), 64 or 256 bytes from its neighbour's, which the plain order would put
 * in one 16-byte bank group; with the per-format shift the 8 lanes of each 128-bit access hit 8
 * different groups. */
template <int SH, int MASK> __device__ __forceinline__ int64_t ps_swz(int64_t c) { return c ^ ((c >> SH) & MASK); }

/* Traits of one planar format: BLOCK weights per block, UNIT weights per 16-byte code unit,
 * load() one unit of a row, xoff() the unit's first activation, dot() acc += unit . x; dots() the
 * same sums for several rows and tokens with x read from staged rows (ps_swz). */
template <int TYPE> struct Planar;

template <> struct Planar<DS4_TYPE_Q8_0> {
    static constexpr int BLOCK = 32, UNIT = 16;
    struct U {
        uint4 q;
        float d;
    };
    static __device__ __forceinline__ U load(const uint8_t *row, int64_t nb, int64_t u) {
        U v;
        v.q = ((const uint4 *)row)[u];
        v.d = h2f(((const uint16_t *)(row + 32 * nb))[u >> 1]);
        return v;
    }
    static __device__ __forceinline__ int64_t xoff(int64_t u) { return 16 * u; }
    static __device__ __forceinline__ float dot(const U &v, const float *x, float acc, const uint2 *, const uint8_t *) {
        const uint32_t w[4] = {v.q.x ^ 0x80808080u, v.q.y ^ 0x80808080u, v.q.z ^ 0x80808080u, v.q.w ^ 0x80808080u};
        const float4 *x4 = (const float4 *)x;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 a = x4[i];
            s = fmaf(pl_s8(w[i], 0), a.x, s);
            s = fmaf(pl_s8(w[i], 1), a.y, s);
            s = fmaf(pl_s8(w[i], 2), a.z, s);
            s = fmaf(pl_s8(w[i], 3), a.w, s);
        }
        return fmaf(v.d, s, acc);
    }
    /* dot() for RPW rows and nt <= NT staged tokens (xs + t * c4), each weight converted once for all
     * tokens; per (row, token) the same operations in the same order as dot(). */
    template <int RPW, int NT>
    static __device__ __forceinline__ void dots(const U (&v)[RPW], const float4 *xs, int64_t c4, int nt, int64_t u,
                                                float (&acc)[RPW][NT], const uint2 *) {
        float s[RPW][NT];
#pragma unroll
        for (int k = 0; k < RPW; k++)
#pragma unroll
            for (int t = 0; t < NT; t++) s[k][t] = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float w[RPW][4];
#pragma unroll
            for (int k = 0; k < RPW; k++) {
                const uint32_t q = (i == 0 ? v[k].q.x : i == 1 ? v[k].q.y : i == 2 ? v[k].q.z : v[k].q.w) ^ 0x80808080u;
#pragma unroll
                for (int j = 0; j < 4; j++) w[k][j] = pl_s8(q, j);
            }
            const int64_t c = ps_swz<3, 7>(4 * u + i);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float4 a = xs[t * c4 + c];
#pragma unroll
                    for (int k = 0; k < RPW; k++) {
                        s[k][t] = fmaf(w[k][0], a.x, s[k][t]);
                        s[k][t] = fmaf(w[k][1], a.y, s[k][t]);
                        s[k][t] = fmaf(w[k][2], a.z, s[k][t]);
                        s[k][t] = fmaf(w[k][3], a.w, s[k][t]);
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < RPW; k++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[k][t] = fmaf(v[k].d, s[k][t], acc[k][t]);
    }
};

/* Unit u of a Q2_K row: block b = u/4, code bytes 16j..16j+15 (j = u%4) of its 64; byte i there
 * holds element 128h + l0 + i + 32s at bits 2s (h = j/2, l0 = 16 (j%2), s = 0..3), whose 16-wide
 * sub-block 8h + 2s + j%2 has its own scale and min nibbles. */
template <> struct Planar<DS4_TYPE_Q2_K> {
    static constexpr int BLOCK = 256, UNIT = 64;
    struct U {
        uint4 q;
        uint32_t sc; /* scale bytes of the unit's 4 sub-blocks, s = 0..3 */
        uint32_t dm; /* f16 d | f16 dmin << 16 */
    };
    static __device__ __forceinline__ U load(const uint8_t *row, int64_t nb, int64_t u) {
        U v;
        const int64_t b = u >> 2;
        const int j = (int)(u & 3);
        v.q = ((const uint4 *)row)[u];
        const uint2 s8 = *(const uint2 *)(row + 64 * nb + 16 * b + 8 * (j >> 1));
        v.sc = (j & 1) ? gpu_byte_perm(s8.x, s8.y, 0x7531u) : gpu_byte_perm(s8.x, s8.y, 0x6420u);
        v.dm = ((const uint32_t *)(row + 80 * nb))[b];
        return v;
    }
    static __device__ __forceinline__ int64_t xoff(int64_t u) {
        const int j = (int)(u & 3);
        return 256 * (u >> 2) + 128 * (j >> 1) + 16 * (j & 1);
    }
    static __device__ __forceinline__ float dot(const U &v, const float *x, float acc, const uint2 *, const uint8_t *) {
        const float d = h2f((uint16_t)(v.dm & 0xffffu)), dmin = h2f((uint16_t)(v.dm >> 16));
        const uint32_t q[4] = {v.q.x, v.q.y, v.q.z, v.q.w};
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const uint32_t scm = (v.sc >> (8 * s)) & 0xffu;
            const float dl = d * (float)(scm & 15u), ml = dmin * (float)(scm >> 4);
            const float4 *x4 = (const float4 *)(x + 32 * s);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t m = (q[i] >> (2 * s)) & 0x03030303u;
                const float4 a = x4[i];
                acc = fmaf(fmaf(dl, pl_u8(m, 0), -ml), a.x, acc);
                acc = fmaf(fmaf(dl, pl_u8(m, 1), -ml), a.y, acc);
                acc = fmaf(fmaf(dl, pl_u8(m, 2), -ml), a.z, acc);
                acc = fmaf(fmaf(dl, pl_u8(m, 3), -ml), a.w, acc);
            }
        }
        return acc;
    }
    /* dot() for RPW rows and nt <= NT staged tokens, each weight formed once for all tokens. */
    template <int RPW, int NT>
    static __device__ __forceinline__ void dots(const U (&v)[RPW], const float4 *xs, int64_t c4, int nt, int64_t u,
                                                float (&acc)[RPW][NT], const uint2 *) {
        const int64_t c0 = xoff(u) >> 2;
#pragma unroll
        for (int s = 0; s < 4; s++) {
            float dl[RPW], ml[RPW];
#pragma unroll
            for (int k = 0; k < RPW; k++) {
                const float d = h2f((uint16_t)(v[k].dm & 0xffffu)), dmin = h2f((uint16_t)(v[k].dm >> 16));
                const uint32_t scm = (v[k].sc >> (8 * s)) & 0xffu;
                dl[k] = d * (float)(scm & 15u), ml[k] = dmin * (float)(scm >> 4);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float w[RPW][4];
#pragma unroll
                for (int k = 0; k < RPW; k++) {
                    const uint32_t q = i == 0 ? v[k].q.x : i == 1 ? v[k].q.y : i == 2 ? v[k].q.z : v[k].q.w;
                    const uint32_t m = (q >> (2 * s)) & 0x03030303u;
#pragma unroll
                    for (int j = 0; j < 4; j++) w[k][j] = fmaf(dl[k], pl_u8(m, j), -ml[k]);
                }
                const int64_t c = ps_swz<5, 3>(c0 + 8 * s + i);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < nt) {
                        const float4 a = xs[t * c4 + c];
#pragma unroll
                        for (int k = 0; k < RPW; k++) {
                            acc[k][t] = fmaf(w[k][0], a.x, acc[k][t]);
                            acc[k][t] = fmaf(w[k][1], a.y, acc[k][t]);
                            acc[k][t] = fmaf(w[k][2], a.z, acc[k][t]);
                            acc[k][t] = fmaf(w[k][3], a.w, acc[k][t]);
                        }
                    }
                }
            }
        }
    }
};

/* Unit u of an IQ2_XXS row: groups 2(u%4) and 2(u%4)+1 of block u/4, each 4 grid-index bytes and
 * a word of 4 x 7 sign-table bits plus a 4-bit scale; elements 64u .. 64u+63. */
template <> struct Planar<DS4_TYPE_IQ2_XXS> {
    static constexpr int BLOCK = 256, UNIT = 64;
    struct U {
        uint4 q;
        float d;
    };
    static __device__ __forceinline__ U load(const uint8_t *row, int64_t nb, int64_t u) {
        U v;
        v.q = ((const uint4 *)row)[u];
        v.d = h2f(((const uint16_t *)(row + 64 * nb))[u >> 2]);
        return v;
    }
    static __device__ __forceinline__ int64_t xoff(int64_t u) { return 64 * u; }
    static __device__ __forceinline__ float group(uint32_t idx, uint32_t sw, float d, const float *x, float acc,
                                                  const uint2 *grid, const uint8_t *signs) {
        const float db = d * (0.5f + (float)(sw >> 28)) * 0.25f;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint2 g = grid[(idx >> (8 * k)) & 0xffu];
            const uint32_t sg = signs[(sw >> (7 * k)) & 127u];
            const float4 a = ((const float4 *)x)[2 * k], b = ((const float4 *)x)[2 * k + 1];
            const float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float m = pl_u8(j < 4 ? g.x : g.y, j & 3);
                s = fmaf((sg >> j) & 1u ? -m : m, xs[j], s);
            }
        }
        return fmaf(db, s, acc);
    }
    static __device__ __forceinline__ float dot(const U &v, const float *x, float acc, const uint2 *grid,
                                                const uint8_t *signs) {
        acc = group(v.q.x, v.q.y, v.d, x, acc, grid, signs);
        return group(v.q.z, v.q.w, v.d, x + 32, acc, grid, signs);
    }
    /* dot() for RPW rows and nt <= NT staged tokens, each weight formed once for all tokens, and the
     * signs without a table: the sign byte of 7-bit index i is i with bit 7 the parity of i's set
     * bits (IQ2_XXS keeps an even number of negative weights per 8).  A weight becomes a signed
     * byte, g or 256 - g (mask m = 0xff per negative byte, t = m & 1: (g ^ m) + t, no carry leaves a
     * byte since g is 8, 25 or 43), read as +-g through pl_s8: the float that group() selects. */
    template <int RPW, int NT>
    static __device__ __forceinline__ void dots(const U (&v)[RPW], const float4 *xs, int64_t c4, int nt, int64_t u,
                                                float (&acc)[RPW][NT], const uint2 *grid) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float s[RPW][NT];
#pragma unroll
            for (int k = 0; k < RPW; k++)
#pragma unroll
                for (int t = 0; t < NT; t++) s[k][t] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                float w[RPW][8];
#pragma unroll
                for (int k = 0; k < RPW; k++) {
                    const uint32_t idx = h ? v[k].q.z : v[k].q.x, sw = h ? v[k].q.w : v[k].q.y;
                    const uint2 g = grid[(idx >> (8 * kk)) & 0xffu];
                    const uint32_t s7 = (sw >> (7 * kk)) & 127u;
                    const uint32_t sg = s7 | ((uint32_t)gpu_popc(s7) & 1u) << 7;
                    const uint32_t t0 = ((sg & 15u) * 0x00204081u) & 0x01010101u, t1 = ((sg >> 4) * 0x00204081u) & 0x01010101u;
                    const uint32_t w0 = (g.x ^ (t0 * 0xffu) ^ 0x80808080u) + t0;
                    const uint32_t w1 = (g.y ^ (t1 * 0xffu) ^ 0x80808080u) + t1;
#pragma unroll
                    for (int j = 0; j < 4; j++) w[k][j] = pl_s8(w0, j), w[k][4 + j] = pl_s8(w1, j);
                }
                const int64_t ca = ps_swz<4, 7>(16 * u + 8 * h + 2 * kk), cb = ps_swz<4, 7>(16 * u + 8 * h + 2 * kk + 1);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < nt) {
                        const float4 a = xs[t * c4 + ca], b = xs[t * c4 + cb];
#pragma unroll
                        for (int k = 0; k < RPW; k++) {
                            s[k][t] = fmaf(w[k][0], a.x, s[k][t]);
                            s[k][t] = fmaf(w[k][1], a.y, s[k][t]);
                            s[k][t] = fmaf(w[k][2], a.z, s[k][t]);
                            s[k][t] = fmaf(w[k][3], a.w, s[k][t]);
                            s[k][t] = fmaf(w[k][4], b.x, s[k][t]);
                            s[k][t] = fmaf(w[k][5], b.y, s[k][t]);
                            s[k][t] = fmaf(w[k][6], b.z, s[k][t]);
                            s[k][t] = fmaf(w[k][7], b.w, s[k][t]);
                        }
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < RPW; k++) {
                const uint32_t sw = h ? v[k].q.w : v[k].q.y;
                const float db = v[k].d * (0.5f + (float)(sw >> 28)) * 0.25f;
#pragma unroll
                for (int t = 0; t < NT; t++) acc[k][t] = fmaf(db, s[k][t], acc[k][t]);
            }
        }
    }
};

/* Y[t, r] = W[r, :] . X[t, :] over a planar matrix: RPW rows per row group, WPR warps per row group
 * (splitting its units), NT tokens per grid row.  With ids (expert gather): grid row y is slot y,
 * which uses matrix ids[y] (mat_bytes apart), activation row y / x_div and output row y (NT = 1).
 * Lane l of warp w (of WPR) takes units (32 w + l) + 32 WPR k of every row of its group; RPW only
 * shares the activation loads between rows, so a (row, token) sum is the same for any RPW and NT. */
template <int TYPE, int NT, int RPW, int WPR>
__global__ void __launch_bounds__(GPU_WARP *(WPR > PL_WARPS ? WPR : PL_WARPS))
pl_kernel(const uint8_t *__restrict__ W, int64_t mat_bytes, const int32_t *__restrict__ ids, int64_t rows,
          int64_t cols, int64_t row_bytes, const float *__restrict__ X, int64_t ldx, int x_div, int64_t n,
          float *__restrict__ Y, int64_t ldy) {
    typedef Planar<TYPE> P;
    /* IQ2_XXS: the grid and sign tables in shared memory (lanes index them divergently) */
    __shared__ uint2 s_grid[TYPE == DS4_TYPE_IQ2_XXS ? 256 : 1];
    __shared__ uint8_t s_sign[TYPE == DS4_TYPE_IQ2_XXS ? 128 : 1];
    if (TYPE == DS4_TYPE_IQ2_XXS) {
        const int nthr = blockDim.x * blockDim.y, i0 = threadIdx.y * blockDim.x + threadIdx.x;
        for (int i = i0; i < 256; i += nthr) s_grid[i] = *(const uint2 *)c_iq2_grid[i];
        for (int i = i0; i < 128; i += nthr) s_sign[i] = c_iq2_ksigns[i];
        __syncthreads();
    }
    const int lane = threadIdx.x, wp = threadIdx.y;
    const int64_t r0 = (WPR == 1 ? (int64_t)blockIdx.x * PL_WARPS + wp : (int64_t)blockIdx.x) * RPW;
    if (r0 >= rows) return; /* uniform over the block when WPR > 1 */
    int64_t t0 = 0;
    int nt = 1;
    if (ids) {
        const int64_t slot = blockIdx.y;
        W += (int64_t)ids[slot] * mat_bytes;
        X += (slot / x_div) * ldx;
        Y += slot * ldy;
    } else {
        t0 = (int64_t)blockIdx.y * NT;
        nt = (int)(n - t0 < NT ? n - t0 : NT);
    }
    const int64_t nb = cols / P::BLOCK, nu = cols / P::UNIT;
    const uint8_t *rp[RPW];
#pragma unroll
    for (int k = 0; k < RPW; k++) rp[k] = W + (r0 + k < rows ? r0 + k : rows - 1) * row_bytes;
    float acc[RPW][NT];
#pragma unroll
    for (int k = 0; k < RPW; k++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[k][t] = 0.0f;
    const int tid = (WPR == 1 ? 0 : wp) * GPU_WARP + lane;
#pragma unroll 2
    for (int64_t u = tid; u < nu; u += GPU_WARP * WPR) {
        typename P::U v[RPW];
#pragma unroll
        for (int k = 0; k < RPW; k++) v[k] = P::load(rp[k], nb, u);
        const int64_t xo = P::xoff(u);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float *x = X + (t0 + t) * ldx + xo;
#pragma unroll
                for (int k = 0; k < RPW; k++) acc[k][t] = P::dot(v[k], x, acc[k][t], s_grid, s_sign);
            }
        }
    }
    if (WPR == 1) {
#pragma unroll
        for (int k = 0; k < RPW; k++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float s = gpu_warp_sum(acc[k][t]);
                if (lane == 0 && t < nt && r0 + k < rows) Y[(t0 + t) * ldy + r0 + k] = s;
            }
    } else {
        __shared__ float part[RPW * NT][WPR];
#pragma unroll
        for (int k = 0; k < RPW; k++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float s = gpu_warp_sum(acc[k][t]);
                if (lane == 0) part[k * NT + t][wp] = s;
            }
        __syncthreads();
        const int i = wp * GPU_WARP + lane, k = i / NT, t = i % NT;
        if (i < RPW * NT && t < nt && r0 + k < rows) {
            float s = part[i][0];
            for (int w = 1; w < WPR; w++) s += part[i][w];
            Y[(t0 + t) * ldy + r0 + k] = s;
        }
    }
}

template <int TYPE, int NT, int RPW, int WPR>
static void pl_go(hipStream_t st, unsigned gy, const uint8_t *W, int64_t mat_bytes, const int32_t *ids, int64_t rows,
                  int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int x_div, int64_t n, float *Y,
                  int64_t ldy) {
    const int64_t groups = (rows + RPW - 1) / RPW;
    const dim3 block(GPU_WARP, WPR > PL_WARPS ? WPR : PL_WARPS);
    const unsigned gx = (unsigned)(WPR == 1 ? (groups + PL_WARPS - 1) / PL_WARPS : groups);
    hipLaunchKernelGGL((pl_kernel<TYPE, NT, RPW, WPR>), dim3(gx, gy), block, 0, st, W, mat_bytes, ids, rows, cols,
                       row_bytes, X, ldx, x_div, n, Y, ldy);
}

/* ps_swz's shift and mask for a format's staged rows. */
template <int TYPE> struct PsSwz;
template <> struct PsSwz<DS4_TYPE_Q8_0> { static constexpr int SH = 3, MASK = 7; };
template <> struct PsSwz<DS4_TYPE_Q2_K> { static constexpr int SH = 5, MASK = 3; };
template <> struct PsSwz<DS4_TYPE_IQ2_XXS> { static constexpr int SH = 4, MASK = 7; };

/* pl_kernel's products with the activations staged: a block first copies the nt activation rows it
 * multiplies (the slot's row of a gather, or NT tokens) into shared memory, then runs `loops` rounds
 * of row groups, PS_WARPS / WPR groups of WPR warps per round, each taking RPW rows of the matrix.
 * A lane's units, their order and every operation on them are pl_kernel's (lane l of warp w of a
 * group takes units (32 w + l) + 32 WPR k, k ascending; the warp sum; the group's warps summed in
 * order), so a (row, token) result is the same bits as pl_kernel's for any RPW, NT, loops or slot
 * count.  What changes is where the operands come from: x from conflict-free shared loads instead
 * of strided global ones (a lane's x is 64 or 256 bytes from its neighbour's), the IQ2_XXS grid
 * loaded once per block for all its rounds, and the weights of the lane's next unit (in this round
 * or the next) loaded before the current unit's arithmetic, the first ones before the staging. */
template <int TYPE, int NT, int RPW, int WPR>
__global__ void __launch_bounds__(GPU_WARP *PS_WARPS)
ps_kernel(const uint8_t *__restrict__ W, int64_t mat_bytes, const int32_t *__restrict__ ids, int64_t rows,
          int64_t cols, int64_t row_bytes, const float *__restrict__ X, int64_t ldx, int x_div, int64_t n,
          float *__restrict__ Y, int64_t ldy, int loops) {
    typedef Planar<TYPE> P;
    constexpr int G = PS_WARPS / WPR, SH = PsSwz<TYPE>::SH, MASK = PsSwz<TYPE>::MASK;
    extern __shared__ float4 ps_x[];
    __shared__ uint2 s_grid[TYPE == DS4_TYPE_IQ2_XXS ? 256 : 1];
    __shared__ float part[WPR > 1 ? G * RPW * NT * WPR : 1];
    const int nthr = GPU_WARP * PS_WARPS, tix = threadIdx.y * GPU_WARP + threadIdx.x;
    int nt = 1;
    if (ids) {
        const int64_t slot = blockIdx.y;
        W += (int64_t)ids[slot] * mat_bytes;
        X += (slot / x_div) * ldx;
        Y += slot * ldy;
    } else {
        const int64_t t0 = (int64_t)blockIdx.y * NT;
        nt = (int)(n - t0 < NT ? n - t0 : NT);
        X += t0 * ldx;
        Y += t0 * ldy;
    }
    const int lane = threadIdx.x, wp = threadIdx.y, grp = wp / WPR, wg = wp % WPR;
    const int tid = wg * GPU_WARP + lane;
    const int64_t nb = cols / P::BLOCK, nu = cols / P::UNIT, c4 = cols / 4;
    const int steps = (int)((nu + GPU_WARP * WPR - 1) / (GPU_WARP * WPR)); /* a round's units per lane, at most */
    const int64_t rbase = (int64_t)blockIdx.x * loops * G + grp;           /* row group of round 0 */

    /* the lane's first units, in flight during the staging */
    typename P::U v[RPW];
    int it = 0, st = 0;
    int64_t r0 = rbase * RPW, u = tid;
    if (r0 < rows && u < nu) {
#pragma unroll
        for (int k = 0; k < RPW; k++) v[k] = P::load(W + (r0 + k < rows ? r0 + k : rows - 1) * row_bytes, nb, u);
    }
    if (TYPE == DS4_TYPE_IQ2_XXS)
        for (int i = tix; i < 256; i += nthr) s_grid[i] = *(const uint2 *)c_iq2_grid[i];
    for (int64_t i = tix; i < nt * c4; i += nthr) {
        const int64_t t = i / c4, c = i - t * c4;
        ps_x[t * c4 + ps_swz<SH, MASK>(c)] = ((const float4 *)(X + t * ldx))[c];
    }
    __syncthreads();

    float acc[RPW][NT];
#pragma unroll
    for (int k = 0; k < RPW; k++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[k][t] = 0.0f;
    for (int idx = 0, total = loops * steps; idx < total; idx++) {
        /* the next unit of the lane: the next step of this round, or the first of the next round */
        const int nst = st + 1 < steps ? st + 1 : 0, nit = st + 1 < steps ? it : it + 1;
        const int64_t nr0 = (rbase + (int64_t)nit * G) * RPW, nu_ = (int64_t)nst * GPU_WARP * WPR + tid;
        typename P::U nv[RPW];
        if (nit < loops && nr0 < rows && nu_ < nu) {
#pragma unroll
            for (int k = 0; k < RPW; k++) nv[k] = P::load(W + (nr0 + k < rows ? nr0 + k : rows - 1) * row_bytes, nb, nu_);
        }
        const bool active = r0 < rows; /* uniform over the warp */
        if (active && u < nu) P::template dots<RPW, NT>(v, ps_x, c4, nt, u, acc, s_grid);
        if (st == steps - 1) { /* the round's rows are done */
            if (WPR == 1) {
                if (active) {
#pragma unroll
                    for (int k = 0; k < RPW; k++)
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            if (t < nt) {
                                const float s = gpu_warp_sum(acc[k][t]);
                                if (lane == 0 && r0 + k < rows) Y[t * ldy + r0 + k] = s;
                            }
                        }
                }
            } else { /* every warp of the block gets here in every round */
#pragma unroll
                for (int k = 0; k < RPW; k++)
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const float s = gpu_warp_sum(acc[k][t]);
                        if (lane == 0) part[((grp * RPW + k) * NT + t) * WPR + wg] = s;
                    }
                __syncthreads();
                const int i = wg * GPU_WARP + lane, k = i / NT, t = i % NT;
                if (active && i < RPW * NT && t < nt && r0 + k < rows) {
                    const float *pp = part + ((grp * RPW + k) * NT + t) * WPR;
                    float s = pp[0];
                    for (int w = 1; w < WPR; w++) s += pp[w];
                    Y[t * ldy + r0 + k] = s;
                }
                __syncthreads(); /* part is written again in the next round */
            }
#pragma unroll
            for (int k = 0; k < RPW; k++)
#pragma unroll
                for (int t = 0; t < NT; t++) acc[k][t] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < RPW; k++) v[k] = nv[k];
        it = nit, st = nst, r0 = nr0, u = nu_;
    }
}

/* Shared bytes of a staged launch: nt rows of cols floats. */
static inline int64_t ps_bytes(int64_t nt, int64_t cols) { return nt * cols * (int64_t)sizeof(float); }

/* Rounds per block: about PS_BLOCKS blocks in the launch (row groups times grid rows), 1 to 8 rounds
 * (they change which block computes a row, never its arithmetic). */
template <int TYPE, int NT, int RPW, int WPR>
static void ps_go(hipStream_t st, unsigned gy, int nt_stage, const uint8_t *W, int64_t mat_bytes, const int32_t *ids,
                  int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int x_div, int64_t n,
                  float *Y, int64_t ldy) {
    constexpr int G = PS_WARPS / WPR;
    const int64_t groups = (rows + RPW - 1) / RPW, blocks1 = (groups + G - 1) / G;
    const int64_t want = blocks1 * (int64_t)gy / PS_BLOCKS;
    const int loops = (int)(want < 1 ? 1 : want > 8 ? 8 : want);
    const int64_t per_block = (int64_t)G * loops;
    hipLaunchKernelGGL((ps_kernel<TYPE, NT, RPW, WPR>), dim3((unsigned)((groups + per_block - 1) / per_block), gy),
                       dim3(GPU_WARP, PS_WARPS), (size_t)ps_bytes(nt_stage, cols), st, W, mat_bytes, ids, rows, cols,
                       row_bytes, X, ldx, x_div, n, Y, ldy, loops);
}

/* Rows per warp of a multi-token pass: more rows, so that each activation load serves more weights
 * (Q8_0 4, IQ2_XXS 2, Q2_K 1: more would spill registers on gfx1151); half as many (at least 1)
 * where several warps share a row. */
template <int TYPE> struct PlRpw {
    static constexpr int MULTI = TYPE == DS4_TYPE_Q8_0 ? 4 : TYPE == DS4_TYPE_IQ2_XXS ? 2 : 1;
    static constexpr int SHORT = MULTI > 1 ? MULTI / 2 : 1;
};

/* The warps per row depend on the shape only (batch invariance); rows per warp and tokens per
 * warp may follow the token count. */
template <int TYPE>
static void pl_launch_t(hipStream_t st, const uint8_t *W, int64_t mat_bytes, const int32_t *ids, int64_t n_slots,
                        int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int x_div,
                        int64_t n, float *Y, int64_t ldy) {
    if (ids) { /* rows of the slot's matrix per warp sharing each activation load: 4 (Q2_K 2: 4 spill on gfx1151) */
        constexpr int PL_RPW_GATHER = TYPE == DS4_TYPE_Q2_K ? 2 : 4;
        /* the 2-bit experts staged (H200: IQ2_XXS 0.68x, Q2_K 0.88-0.93x); Q8_0 gathers were 1.07-1.25x */
        if constexpr (TYPE != DS4_TYPE_Q8_0) {
            if (ps_bytes(1, cols) <= PS_STAGE) {
                ps_go<TYPE, 1, PL_RPW_GATHER, 1>(st, (unsigned)n_slots, 1, W, mat_bytes, ids, rows, cols, row_bytes, X,
                                                 ldx, x_div, 1, Y, ldy);
                return;
            }
        }
        pl_go<TYPE, 1, PL_RPW_GATHER, 1>(st, (unsigned)n_slots, W, mat_bytes, ids, rows, cols, row_bytes, X, ldx, x_div,
                                         1, Y, ldy);
        return;
    }
    /* tiny matrices: warps a row by the units a row has (shape only: one token and several agree) */
    const int64_t units = cols / Planar<TYPE>::UNIT;
    const bool tiny_units = units >= PL_TINY_UNITS, few_units = units < PL_WARPS_UNITS;
    if (n == 1) {
        if constexpr (TYPE == DS4_TYPE_Q8_0) { /* staged (ps_kernel), the same rows and warps per row as below */
            if (rows >= PS_DENSE_ROWS && rows < PS_DENSE_MAX && ps_bytes(1, cols) <= PS_STAGE) {
                if (rows < PL_SHORT_ROWS) ps_go<TYPE, 1, 1, PL_WARPS>(st, 1, 1, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
                else ps_go<TYPE, 1, 2, 1>(st, 1, 1, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
                return;
            }
        }
        if (rows < PL_TINY_ROWS && tiny_units) pl_go<TYPE, 1, 1, PL_TINY_WARPS>(st, 1, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
        else if (rows < PL_TINY_ROWS && few_units) pl_go<TYPE, 1, 1, 1>(st, 1, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
        else if (rows < PL_SHORT_ROWS) pl_go<TYPE, 1, 1, PL_WARPS>(st, 1, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
        else pl_go<TYPE, 1, 2, 1>(st, 1, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
        return;
    }
    constexpr int PL_RPW_MULTI = PlRpw<TYPE>::MULTI, PL_RPW_SHORT = PlRpw<TYPE>::SHORT;
    const unsigned gy = (unsigned)((n + PL_NT - 1) / PL_NT);
    /* (several tokens staged through ps_kernel, 8 rows a warp's tokens: 1.24-1.51x slower on the H200,
     * 202 registers and 96 KB of activations leave one block of 8 warps per multiprocessor) */
    if (rows < PL_TINY_ROWS && tiny_units) pl_go<TYPE, PL_NT, 1, PL_TINY_WARPS>(st, gy, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
    else if (rows < PL_TINY_ROWS && few_units) pl_go<TYPE, PL_NT, 1, 1>(st, gy, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
    else if (rows < PL_SHORT_ROWS) pl_go<TYPE, PL_NT, PL_RPW_SHORT, PL_WARPS>(st, gy, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
    else pl_go<TYPE, PL_NT, PL_RPW_MULTI, 1>(st, gy, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy);
}

int gpu_planar_ok(int32_t type, int64_t cols, int64_t row_bytes) {
    int64_t block = 0, bytes = 0;
    switch (type) {
    case DS4_TYPE_Q8_0: block = 32, bytes = 34; break;
    case DS4_TYPE_Q2_K: block = 256, bytes = 84; break;
    case DS4_TYPE_IQ2_XXS: block = 256, bytes = 66; break;
    default: return 0;
    }
    return cols > 0 && cols % block == 0 && row_bytes == cols / block * bytes && row_bytes % 16 == 0;
}

int gpu_planar_launch(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, const int32_t *ids,
                      int64_t n_slots, int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t ldx,
                      int32_t x_div, int64_t n, float *Y, int64_t ldy, char *err, size_t len) {
    const int32_t type = layout & ~DS4_GPU_PLANAR;
    if (type != DS4_TYPE_Q8_0 && type != DS4_TYPE_Q2_K && type != DS4_TYPE_IQ2_XXS)
        return gpu_fail(err, len, DS4_E_INVALID, "GPU matmul: GGML type %d has no planar layout (Q8_0, Q2_K and "
                        "IQ2_XXS have)", type);
    if (!gpu_planar_ok(type, cols, row_bytes))
        return gpu_fail(err, len, DS4_E_INVALID, "GPU matmul: a planar matrix of GGML type %d needs rows of 16-byte "
                        "multiples (%lld columns, %lld bytes per row)", type, (long long)cols, (long long)row_bytes);
    if (((uintptr_t)W & 15) || ((uintptr_t)X & 15) || (ldx & 3) || (ids && (mat_bytes & 15)))
        return gpu_fail(err, len, DS4_E_INVALID, "GPU matmul: planar kernels need 16-byte aligned weights, matrix "
                        "strides and activations (W %p, matrix stride %lld bytes, X %p, ldx %lld)", W,
                        (long long)mat_bytes, (const void *)X, (long long)ldx);
    if (c->act_q8) return gpu_q8_launch(c, layout, W, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy, err, len);
    hipStream_t st = c->stream;
    const uint8_t *w = (const uint8_t *)W;
    switch (type) {
    case DS4_TYPE_Q8_0: pl_launch_t<DS4_TYPE_Q8_0>(st, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy); break;
    case DS4_TYPE_Q2_K: pl_launch_t<DS4_TYPE_Q2_K>(st, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy); break;
    default: pl_launch_t<DS4_TYPE_IQ2_XXS>(st, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy); break;
    }
    /* the message is formatted only on failure: a launch costs no host formatting */
    const hipError_t e_launch = hipGetLastError();
    if (e_launch != hipSuccess)
        return gpu_fail(err, len, DS4_E_DEVICE,
                        "GPU planar matmul launch (type %d, %lld x %lld, %lld %s): %s (%s)",
                        type, (long long)rows, (long long)cols, (long long)(ids ? n_slots : n),
                        ids ? "slots" : "tokens", hipGetErrorString(e_launch), hipGetErrorName(e_launch));
    return DS4_OK;
}

/* One thread per block: GGML block (row r, block b) of src -> its planar places in dst's row r. */
template <int TYPE>
__global__ void repack_kernel(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, int64_t rows, int64_t nb,
                              int64_t row_bytes) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * nb) return;
    const int64_t r = i / nb, b = i % nb;
    const uint8_t *s = src + r * row_bytes;
    uint8_t *d = dst + r * row_bytes;
    if (TYPE == DS4_TYPE_Q8_0) {
        s += 34 * b;
        for (int k = 0; k < 32; k++) d[32 * b + k] = s[2 + k];
        d[32 * nb + 2 * b] = s[0];
        d[32 * nb + 2 * b + 1] = s[1];
    } else if (TYPE == DS4_TYPE_Q2_K) {
        s += 84 * b;
        for (int k = 0; k < 64; k++) d[64 * b + k] = s[16 + k];
        for (int k = 0; k < 16; k++) d[64 * nb + 16 * b + k] = s[k];
        for (int k = 0; k < 4; k++) d[80 * nb + 4 * b + k] = s[80 + k];
    } else {
        s += 66 * b;
        for (int k = 0; k < 64; k++) d[64 * b + k] = s[2 + k];
        d[64 * nb + 2 * b] = s[0];
        d[64 * nb + 2 * b + 1] = s[1];
    }
}

/* A weight matrix to the device.  Its bytes come from host memory that is usually the GGUF's file
 * mapping, so they go through the context's pinned staging buffers (gpu_put), never by a copy
 * straight from those pages: ROCm pins a large pageable source in place instead of staging it,
 * which has hung or crawled on file-backed pages of Strix Halo (spec platform.md §2.2).  Planar
 * rows are staged into a device buffer of PL_REPACK_CHUNK bytes and repacked from there. */
int gpu_upload_matrix(ds4_gpu_ctx *c, const void *src, int32_t type, int64_t rows, int64_t cols, int64_t row_bytes,
                      int32_t want_planar, void **out, int32_t *layout, char *err, size_t len) {
    const size_t bytes = (size_t)rows * (size_t)row_bytes;
    *layout = type;
    int rc = gpu_alloc(c, bytes, out, err, len);
    if (rc != DS4_OK || !src) return rc;
    const int planar = want_planar && gpu_planar_ok(type, cols, row_bytes);
    const int64_t per = (int64_t)(PL_REPACK_CHUNK / (size_t)row_bytes) > 0 ? (int64_t)(PL_REPACK_CHUNK / (size_t)row_bytes) : 1;
    const int64_t chunk_rows = per < rows ? per : rows, nb = cols / (type == DS4_TYPE_Q8_0 ? 32 : 256);
    void *tmp = NULL;
    if (planar) rc = gpu_alloc(c, (size_t)chunk_rows * (size_t)row_bytes, &tmp, err, len);
    pthread_mutex_lock(&c->lock);
    if (rc == DS4_OK && !planar) rc = gpu_put(c, *out, src, bytes, err, len);
    hipError_t e = hipSuccess;
    for (int64_t r = 0; planar && rc == DS4_OK && e == hipSuccess && r < rows; r += chunk_rows) {
        const int64_t nr = rows - r < chunk_rows ? rows - r : chunk_rows;
        /* queued on the context's stream, after the previous chunk's repack has read tmp */
        rc = gpu_put(c, tmp, (const uint8_t *)src + r * row_bytes, (size_t)nr * (size_t)row_bytes, err, len);
        if (rc != DS4_OK) break;
        const int64_t nt = nr * nb;
        const unsigned grid = (unsigned)((nt + 255) / 256);
        uint8_t *dst = (uint8_t *)*out + r * row_bytes;
        if (type == DS4_TYPE_Q8_0) hipLaunchKernelGGL(repack_kernel<DS4_TYPE_Q8_0>, dim3(grid), dim3(256), 0, c->stream, (const uint8_t *)tmp, dst, nr, nb, row_bytes);
        else if (type == DS4_TYPE_Q2_K) hipLaunchKernelGGL(repack_kernel<DS4_TYPE_Q2_K>, dim3(grid), dim3(256), 0, c->stream, (const uint8_t *)tmp, dst, nr, nb, row_bytes);
        else hipLaunchKernelGGL(repack_kernel<DS4_TYPE_IQ2_XXS>, dim3(grid), dim3(256), 0, c->stream, (const uint8_t *)tmp, dst, nr, nb, row_bytes);
        e = hipGetLastError();
    }
    if (rc == DS4_OK && e == hipSuccess) e = hipStreamSynchronize(c->stream);
    pthread_mutex_unlock(&c->lock);
    if (tmp) gpu_free(c, tmp, (size_t)chunk_rows * (size_t)row_bytes);
    if (rc == DS4_OK && e != hipSuccess)
        rc = gpu_fail(err, len, DS4_E_DEVICE, "upload a %lld x %lld matrix of GGML type %d%s: %s", (long long)rows,
                      (long long)cols, type, planar ? " in the planar layout" : "", hipGetErrorString(e));
    if (rc != DS4_OK) {
        gpu_free(c, *out, bytes);
        *out = NULL;
        return rc;
    }
    if (planar) *layout = type | DS4_GPU_PLANAR;
    return DS4_OK;
}
