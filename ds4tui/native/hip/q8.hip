/*
 * q8.hip — products of Q8_0 / Q2_K / IQ2_XXS matrices (planar or GGML layout) with 8-bit activations:
 * the GPU side of the `q8` activations option (spec ds4.md §2.9.5, its GPU paragraph).
 *
 * The activation rows are quantised exactly as the CPU engine does (§2.9.5 step 1): per block of 32,
 * d = max|x| / 127, q = round(x * (1 / d)) with ties away from zero, so the integer codes equal the
 * CPU's.  A one-row pass (a decode) quantises its row in every block of a launch, into shared memory
 * (no extra launch); a pass of 2-8 rows quantises them once into the context's scratch (q8_quant_kernel,
 * one warp a 32-wide block), per dense product or once for the products that share their rows
 * (gpu_q8_share), and every block copies them (a gather's one-row slots stage their own row unless it
 * is shared): the same values either way (q8_quant32's).  The weights are read from the planar layout
 * (hip/planar.hip) or the file's blocks, turned into signed 8-bit integers (Q8_0: the codes; IQ2_XXS:
 * grid value times sign; Q2_K: sub-block scale times 2-bit code) and multiplied four at a time by dp4a
 * / v_dot4, so each block sum I is an exact integer.  A 32-wide block then gives one float32 product,
 * each step rounded on its own: Q8_0 and IQ2_XXS p = (s * d) * I; Q2_K per 16-wide sub-block (half a
 * block) p = (D * d) * I - (M * d) * J with J = min code * sum of the 16 activation codes.  A lane
 * adds its products in the order of its steps, then a warp's lanes are summed in a fixed butterfly and
 * the warps sharing a row in a fixed order, so the result differs from the CPU's q8 result by the
 * float32 order of the block products only (and for Q2_K by splitting a block's two halves into two
 * products).  The order depends on the matrix shape alone (warps per row from rows and columns), never
 * on the token or slot count: verify rows equal one-token decodes bit for bit.
 */
#include "quant.h"

#include <type_traits>

#define Q8_WARPS 8             /* warps per block */
#define Q8_SHORT_ROWS 8192     /* below: several warps share a row's steps */
#define Q8_STAGE 32768         /* bytes of activation codes staged per block (tokens x columns) */
#define Q8_BLOCKS 512          /* blocks a launch aims at: more rows per block beyond that (up to 8 rounds) */
#define Q8_BLOCKS_STAGED 128   /* the same for 2-8 tokens of long rows (q8_go) */
#define Q8_BLOCKS_IQ2_GATHER 1024 /* the same for expert-gathered IQ2_XXS products (q8_go) */
/* Bytes a block may stage for a pass of 2-8 tokens in ONE grid row (codes, scales and Q2_K's sums of
 * the pass's tokens), past Q8_STAGE's codes: the 8192-column rows then read their matrix once, not
 * once per 4 tokens (H100, ncu, 6 tokens: 43.9 -> 42.7 us a launch; that product is bound by its
 * shared-memory reads and its staging, not by the matrix).  NVIDIA: over 48 KB of dynamic shared
 * memory once the kernel's limit is raised (gpu_q8_init); AMD: within gfx1151's 64 KB of LDS, the
 * kernel's static arrays beside it.  A launch's shared memory holds min(n, NT) token rows. */
#if defined(GPU_NVIDIA)
#define Q8_STAGE_WIDE 81920
#else
#define Q8_STAGE_WIDE 61440
#endif

/* Shared-memory bytes of nt staged token rows of `cols` columns (q8_stage): the codes, a scale per
 * 32, and for Q2_K a sum per 16 codes. */
static inline size_t q8_stage_bytes(int type, int64_t nt, int64_t cols) {
    return (size_t)nt * ((size_t)cols + (size_t)(cols / 32) * sizeof(float) +
                         (type == DS4_TYPE_Q2_K ? (size_t)(cols / 16) * sizeof(int) : 0));
}

/* The staged codes of a token row lie as uint4s, uint4 c at q8_swz(c, sm) (or q8_swz2 for the planar
 * Q2_K steps): its low bits XORed with higher bits, a permutation within each aligned group of 8
 * (128 codes), so that the 8 lanes of a 128-bit shared load, whose steps are 32 or 64 codes apart,
 * hit 8 different 16-byte bank groups instead of 2 to 4.  sm is 7, or 0 (no swizzle) when the row's
 * codes do not fill whole groups of 128. */
__device__ __forceinline__ int64_t q8_swz(int64_t c, int sm) { return c ^ ((c >> 3) & sm); }
__device__ __forceinline__ int64_t q8_swz2(int64_t c, int sm) { return c ^ ((c >> 2) & sm & 6); }

/* Four bytes of a uint4 by index (unrolled loops only: constant i). */
__device__ __forceinline__ int q8_word(const uint4 &v, int i) {
    return (int)(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
}

/* The weight side of one step of a lane: STEP weights of a row, as signed 8-bit words. */
template <int TYPE> struct Q8W;

/* Q8_0: a step is one block of 32 codes. */
/* acc + (s * d[b]) * I for block b of a token's codes q and 8 weight words w (Q8_0, IQ2_XXS). */
__device__ __forceinline__ float q8_block(const uint32_t w[8], float s, const int8_t *q, const float *d, int64_t b,
                                          float acc, int sm) {
    const uint4 x0 = ((const uint4 *)q)[q8_swz(2 * b, sm)], x1 = ((const uint4 *)q)[q8_swz(2 * b + 1, sm)];
    int I = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) I = gpu_dp4a((int)w[i], q8_word(x0, i), I);
#pragma unroll
    for (int i = 0; i < 4; i++) I = gpu_dp4a((int)w[4 + i], q8_word(x1, i), I);
    const float p = (s * d[b]) * (float)I;
    return acc + p;
}

template <> struct Q8W<DS4_TYPE_Q8_0> {
    static constexpr int STEP = 32;
    struct D {
        uint32_t w[8];
        float s;
    };
    static __device__ __forceinline__ D load(const uint8_t *row, int64_t nb, int64_t u, const uint2 *) {
        D v;
        const uint4 a = ((const uint4 *)row)[2 * u], b = ((const uint4 *)row)[2 * u + 1];
#pragma unroll
        for (int i = 0; i < 4; i++) v.w[i] = (uint32_t)q8_word(a, i), v.w[4 + i] = (uint32_t)q8_word(b, i);
        v.s = h2f(((const uint16_t *)(row + 32 * nb))[u]);
        return v;
    }
    /* acc + this step's products against token codes q (the step's 32 bytes), scales d, sums s16 */
    static __device__ __forceinline__ float dot(const D &v, const int8_t *q, const float *d, const int *, int64_t u,
                                                float acc, int sm) {
        return q8_block(v.w, v.s, q, d, u, acc, sm);
    }
};

/* The sign bits of IQ2_XXS's 7-bit sign index s7, one per byte (bit 0 of byte j: weight j negative):
 * the sign byte is s7 with bit 7 the parity of s7's set bits (IQ2_XXS keeps an even number of
 * negative weights per 8, the rule of its sign table).  tx = s7 * (1 + 2^7 + 2^14 + 2^21) holds bit k
 * of s7 at k + 7i for i = 0..3: no two of these positions coincide (|k - k'| < 7), so nothing
 * carries, and the lowest bit of byte j (8j = k + 7i) is bit j of s7 alone.  ty: the same for bits
 * 4..6 (s7 >> 4), plus the popcount times 2^24 (bits 24..26, clear in that product), whose lowest
 * bit is the parity.  (A sign-table lookup put a second random 8-byte shared-memory read beside each
 * grid read: slower.  Forming the sign byte first took 10 operations a group of 8 weights in the
 * source, this 7; H100, 2 layers, ncu: a verify's IQ2_XXS gathers 247.5 -> 233.8 us, a decode's
 * 64.0 -> 61.5.) */
__device__ __forceinline__ void iq2_sign_bits(uint32_t s7, uint32_t &tx, uint32_t &ty) {
    tx = (s7 * 0x00204081u) & 0x01010101u;
    ty = ((uint32_t)gpu_popc(s7) * 0x01000000u + (s7 >> 4) * 0x00204081u) & 0x01010101u;
}

/* IQ2_XXS: a step is one 16-byte unit, two 32-wide groups (each one block of the q8 arithmetic):
 * per group 4 grid-index bytes and a word of 4 x 7 sign-table bits and the 4-bit scale.  A grid
 * value g (8, 25 or 43, never 0) with its sign mask m (0xff where negative) is (g ^ m) + (m & 1) per
 * byte: 256 - g where negative, and no carry leaves a byte. */
template <> struct Q8W<DS4_TYPE_IQ2_XXS> {
    static constexpr int STEP = 64;
    struct D {
        uint32_t w[16];
        float s0, s1;
    };
    static __device__ __forceinline__ D load(const uint8_t *row, int64_t nb, int64_t u, const uint2 *grid) {
        D v;
        const uint4 q = ((const uint4 *)row)[u];
        const float d = h2f(((const uint16_t *)(row + 64 * nb))[u >> 2]);
        const uint32_t idx[2] = {q.x, q.z}, sw[2] = {q.y, q.w};
#pragma unroll
        for (int g = 0; g < 2; g++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint2 gv = grid[(idx[g] >> (8 * k)) & 0xffu];
                uint32_t tx, ty;
                iq2_sign_bits((sw[g] >> (7 * k)) & 127u, tx, ty);
                v.w[8 * g + 2 * k] = (gv.x ^ (tx * 0xffu)) + tx;
                v.w[8 * g + 2 * k + 1] = (gv.y ^ (ty * 0xffu)) + ty;
            }
        v.s0 = (d * (0.5f + (float)(sw[0] >> 28))) * 0.25f;
        v.s1 = (d * (0.5f + (float)(sw[1] >> 28))) * 0.25f;
        return v;
    }
    static __device__ __forceinline__ float dot(const D &v, const int8_t *q, const float *d, const int *, int64_t u,
                                                float acc, int sm) {
        const uint4 *x = (const uint4 *)q;
        const int64_t f = (u >> 1) & sm; /* q8_swz(4u + i, sm) = (4u + i) ^ f for i < 4 */
        int I0 = 0, I1 = 0;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint4 a = x[(4 * u + i) ^ f], b = x[(4 * u + 2 + i) ^ f];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                I0 = gpu_dp4a((int)v.w[4 * i + j], q8_word(a, j), I0);
                I1 = gpu_dp4a((int)v.w[8 + 4 * i + j], q8_word(b, j), I1);
            }
        }
        const float p0 = (v.s0 * d[2 * u]) * (float)I0;
        acc = acc + p0;
        const float p1 = (v.s1 * d[2 * u + 1]) * (float)I1;
        return acc + p1;
    }
};

/* Q2_K: a step is one 16-byte unit u of super-block b = u / 4 (j = u % 4, h = j / 2, half = j % 2):
 * byte i holds element 128h + 16 half + i + 32s at bits 2s, s = 0..3, i.e. half `half` of 32-wide
 * block 4h + s of the super-block, whose 16-wide sub-block 8h + 2s + half has its own scale and
 * min nibbles (hip/planar.hip). */
template <> struct Q8W<DS4_TYPE_Q2_K> {
    static constexpr int STEP = 64;
    struct D {
        uint32_t c[16]; /* codes of s = 0..3, 4 words each, one code per byte */
        uint32_t sc;    /* scale/min bytes of the 4 sub-blocks */
        float dd, dm;   /* the super-block's d and dmin */
    };
    static __device__ __forceinline__ D load(const uint8_t *row, int64_t nb, int64_t u, const uint2 *) {
        D v;
        const int64_t b = u >> 2;
        const int j = (int)(u & 3);
        const uint4 q = ((const uint4 *)row)[u];
        const uint2 s8 = *(const uint2 *)(row + 64 * nb + 16 * b + 8 * (j >> 1));
        v.sc = (j & 1) ? gpu_byte_perm(s8.x, s8.y, 0x7531u) : gpu_byte_perm(s8.x, s8.y, 0x6420u);
        const uint32_t dm = ((const uint32_t *)(row + 80 * nb))[b];
        v.dd = h2f((uint16_t)(dm & 0xffffu));
        v.dm = h2f((uint16_t)(dm >> 16));
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
            for (int i = 0; i < 4; i++) v.c[4 * s + i] = ((uint32_t)q8_word(q, i) >> (2 * s)) & 0x03030303u;
        return v;
    }
    static __device__ __forceinline__ float dot(const D &v, const int8_t *q, const float *d, const int *s16, int64_t u,
                                                float acc, int sm) {
        const int64_t b = u >> 2;
        const int j = (int)(u & 3);
        const int64_t e0 = 256 * b + 128 * (j >> 1) + 16 * (j & 1); /* first element of s = 0 */
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const uint4 x = ((const uint4 *)q)[q8_swz2((e0 >> 4) + 2 * s, sm)];
            int S = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) S = gpu_dp4a((int)v.c[4 * s + i], q8_word(x, i), S);
            const int scm = (int)((v.sc >> (8 * s)) & 0xffu);
            const int I = (scm & 15) * S, J = (scm >> 4) * s16[(e0 + 32 * s) >> 4];
            const float dx = d[(e0 + 32 * s) >> 5];
            const float pi = (v.dd * dx) * (float)I, pj = (v.dm * dx) * (float)J;
            const float p = pi - pj;
            acc = acc + p;
        }
        return acc;
    }
};

/* The GGML layout (rows whose byte length is not a multiple of 16, e.g. 128-column Q8_0 and the
 * 256-column experts of small models): a step is one 32-wide block of the q8 arithmetic, read from
 * the file's block bytes (Q8_0 and IQ2_XXS blocks are 2-byte aligned, Q2_K's 4-byte). */
template <int TYPE> struct Q8G;


template <> struct Q8G<DS4_TYPE_Q8_0> {
    static constexpr int STEP = 32;
    struct D {
        uint32_t w[8];
        float s;
    };
    static __device__ __forceinline__ D load(const uint8_t *row, int64_t, int64_t b, const uint2 *) {
        D v;
        const uint16_t *p = (const uint16_t *)(row + 34 * b);
        v.s = h2f(p[0]);
#pragma unroll
        for (int k = 0; k < 8; k++) v.w[k] = (uint32_t)p[1 + 2 * k] | ((uint32_t)p[2 + 2 * k] << 16);
        return v;
    }
    static __device__ __forceinline__ float dot(const D &v, const int8_t *q, const float *d, const int *, int64_t b,
                                                float acc, int sm) {
        return q8_block(v.w, v.s, q, d, b, acc, sm);
    }
};

/* IQ2_XXS: block b is group b % 8 of super-block b / 8 (f16 d, then 8 groups of 8 bytes). */
template <> struct Q8G<DS4_TYPE_IQ2_XXS> {
    static constexpr int STEP = 32;
    struct D {
        uint32_t w[8];
        float s;
    };
    static __device__ __forceinline__ D load(const uint8_t *row, int64_t, int64_t b, const uint2 *grid) {
        D v;
        const uint16_t *p = (const uint16_t *)(row + 66 * (b >> 3));
        const float d = h2f(p[0]);
        const uint16_t *g = p + 1 + 4 * (b & 7);
        const uint32_t idx = (uint32_t)g[0] | ((uint32_t)g[1] << 16), sw = (uint32_t)g[2] | ((uint32_t)g[3] << 16);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint2 gv = grid[(idx >> (8 * k)) & 0xffu];
            uint32_t tx, ty;
            iq2_sign_bits((sw >> (7 * k)) & 127u, tx, ty);
            v.w[2 * k] = (gv.x ^ (tx * 0xffu)) + tx;
            v.w[2 * k + 1] = (gv.y ^ (ty * 0xffu)) + ty;
        }
        v.s = (d * (0.5f + (float)(sw >> 28))) * 0.25f;
        return v;
    }
    static __device__ __forceinline__ float dot(const D &v, const int8_t *q, const float *d, const int *s16, int64_t b,
                                                float acc, int sm) {
        return q8_block(v.w, v.s, q, d, b, acc, sm);
    }
};

/* Q2_K: block b = 4h + s of super-block b / 8 (scales[16], qs[64], f16 d, f16 dmin): element
 * 128h + 32s + l has code (qs[32h + l] >> 2s) & 3; its halves are sub-blocks 8h + 2s and 8h + 2s + 1,
 * one product each as in the planar kernel. */
template <> struct Q8G<DS4_TYPE_Q2_K> {
    static constexpr int STEP = 32;
    struct D {
        uint32_t c[8];
        uint32_t sc; /* scale/min bytes of the two halves */
        float dd, dm;
    };
    static __device__ __forceinline__ D load(const uint8_t *row, int64_t, int64_t b, const uint2 *) {
        D v;
        const uint8_t *blk = row + 84 * (b >> 3);
        const int j = (int)(b & 7), h = j >> 2, s = j & 3;
        const uint32_t *qs = (const uint32_t *)(blk + 16 + 32 * h);
#pragma unroll
        for (int k = 0; k < 8; k++) v.c[k] = (qs[k] >> (2 * s)) & 0x03030303u;
        v.sc = (uint32_t)blk[8 * h + 2 * s] | ((uint32_t)blk[8 * h + 2 * s + 1] << 8);
        const uint32_t dm = *(const uint32_t *)(blk + 80);
        v.dd = h2f((uint16_t)(dm & 0xffffu));
        v.dm = h2f((uint16_t)(dm >> 16));
        return v;
    }
    static __device__ __forceinline__ float dot(const D &v, const int8_t *q, const float *d, const int *s16, int64_t b,
                                                float acc, int sm) {
        const uint4 x[2] = {((const uint4 *)q)[q8_swz(2 * b, sm)], ((const uint4 *)q)[q8_swz(2 * b + 1, sm)]};
        const float dx = d[b];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int S = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) S = gpu_dp4a((int)v.c[4 * hf + i], q8_word(x[hf], i), S);
            const int scm = (int)((v.sc >> (8 * hf)) & 0xffu);
            const int I = (scm & 15) * S, J = (scm >> 4) * s16[2 * b + hf];
            const float pi = (v.dd * dx) * (float)I, pj = (v.dm * dx) * (float)J;
            const float p = pi - pj;
            acc = acc + p;
        }
        return acc;
    }
};

/* Step 1 of spec ds4.md §2.9.5, shared by q8_quant32 and q8_quant_kernel so that both give the same
 * values: d = amax / 127 and 1 / d (0 where d is 0); a code, round(x * (1 / d)) with ties away from
 * zero, clamped to +-127. */
__device__ __forceinline__ float q8_scale(float amax, float &dd) {
    dd = amax / 127.0f;
    return dd != 0.0f ? 1.0f / dd : 0.0f;
}
__device__ __forceinline__ int q8_code(float y) {
    const int c = (int)roundf(y);
    return c > 127 ? 127 : c < -127 ? -127 : c;
}

/* One block of 32 activations quantised (spec ds4.md §2.9.5 step 1): its codes w (4 a word, element k
 * in byte k % 4 of word k / 4), d = max|x| / 127 and the sums of its two halves' codes. */
__device__ __forceinline__ void q8_quant32(const float *xb, uint32_t w[8], float &dd, int &sa, int &sb) {
    float v[32];
    if (!((uintptr_t)xb & 15)) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float4 a = ((const float4 *)xb)[k];
            v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < 32; k++) v[k] = xb[k];
    }
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(v[k]));
    const float id = q8_scale(amax, dd);
    sa = 0, sb = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = 0u;
#pragma unroll
    for (int k = 0; k < 32; k++) {
        const int c = q8_code(v[k] * id);
        w[k >> 2] |= ((uint32_t)c & 0xffu) << (8 * (k & 3));
        if (k < 16) sa += c;
        else sb += c;
    }
}

/* Quantise nt activation rows of `cols` floats into shared memory (spec ds4.md §2.9.5 step 1):
 * codes q[t * cols + e] (their uint4s placed by q8_swz, or q8_swz2 when alt), scales
 * d[t * cols / 32 + blk] and, when s16, the sums of each 16 codes s16[t * cols / 16 + k].  Every
 * thread of the block takes part. */
__device__ __forceinline__ void q8_stage(const float *X, int64_t ldx, int nt, int64_t cols, int8_t *q, float *d,
                                         int *s16, int sm, bool alt) {
    const int nthr = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int64_t nb = cols / 32;
    for (int64_t i = tid; i < nt * nb; i += nthr) {
        const int64_t t = i / nb, blk = i % nb;
        uint32_t w[8];
        float dd;
        int sa, sb;
        q8_quant32(X + t * ldx + 32 * blk, w, dd, sa, sb);
        uint4 *dst = (uint4 *)(q + t * cols);
        const int64_t c = 2 * blk;
        dst[alt ? q8_swz2(c, sm) : q8_swz(c, sm)] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[alt ? q8_swz2(c + 1, sm) : q8_swz(c + 1, sm)] = make_uint4(w[4], w[5], w[6], w[7]);
        d[t * nb + blk] = dd;
        if (s16) {
            s16[t * 2 * nb + 2 * blk] = sa;
            s16[t * 2 * nb + 2 * blk + 1] = sb;
        }
    }
}

/* Activation rows quantised once for a launch (q8_quant_kernel), read by every block of it instead of
 * quantising them again: row r's codes at q + r * ld, its scales at d + r * ld / 32, its 16-code sums
 * at s + r * ld / 16 (the same values q8_stage computes). */
struct Q8Pre {
    const int8_t *q;
    const float *d;
    const int *s;
    int64_t ld;
};

/* q8_quant32's values over rows x blocks of X, one warp a 32-wide block (block i = blockIdx.x * 8 +
 * threadIdx.y: block i % nbr of row i / nbr), lane k its element k: the maximum of fmaxf(0, |x|) over
 * the lanes (a NaN passes over, as fmaxf does in q8_quant32; the maximum does not depend on the
 * order), then each lane's code by q8_quant32's operations and the halves' sums exactly (integers). */
__global__ void q8_quant_kernel(const float *__restrict__ X, int64_t ldx, int64_t nbr, int64_t total, int8_t *q,
                                float *d, int *s) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    if (i >= total) return; /* the whole warp: i is the same on its lanes */
    const int k = threadIdx.x;
    const int64_t t = i / nbr, b = i % nbr;
    const float x = X[t * ldx + 32 * b + k];
    float amax = fmaxf(0.0f, fabsf(x));
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) amax = fmaxf(amax, gpu_shfl_xor(amax, m));
    float dd;
    const float id = q8_scale(amax, dd);
    const int c = q8_code(x * id);
    q[t * 32 * nbr + 32 * b + k] = (int8_t)c;
    int h = c; /* the sum of this lane's half (lanes 0-15, 16-31) */
#pragma unroll
    for (int m = 8; m >= 1; m >>= 1) h += gpu_shfl_xor_int(h, m);
    if (k == 0) d[i] = dd, s[2 * i] = h;
    if (k == 16) s[2 * i + 1] = h;
}

/* q8_stage's result copied from pre-quantised rows (row t of the launch at element offset off + t * ld). */
__device__ __forceinline__ void q8_copy(const Q8Pre &pre, int64_t off, int nt, int64_t cols, int8_t *q, float *d,
                                        int *s16, int sm, bool alt) {
    const int nthr = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int64_t nu = cols / 16, nb = cols / 32;
    for (int64_t i = tid; i < nt * nu; i += nthr) {
        const int64_t t = i / nu, c = i % nu;
        const uint4 v = ((const uint4 *)(pre.q + off + t * pre.ld))[c];
        ((uint4 *)(q + t * cols))[alt ? q8_swz2(c, sm) : q8_swz(c, sm)] = v;
    }
    for (int64_t i = tid; i < nt * nb; i += nthr) {
        const int64_t t = i / nb, b = i % nb;
        d[i] = pre.d[(off + t * pre.ld) / 32 + b];
    }
    if (s16)
        for (int64_t i = tid; i < nt * 2 * nb; i += nthr) {
            const int64_t t = i / (2 * nb), k = i % (2 * nb);
            s16[i] = pre.s[(off + t * pre.ld) / 16 + k];
        }
}

/* Y[t, r] = W[r, :] . X[t, :] under q8 activations, W in the planar layout (PL) or the GGML one.
 * The block's Q8_WARPS warps form Q8_WARPS / WPR groups; a group of WPR warps takes RPW rows at a
 * time and splits their steps (lane l of warp w of the group takes steps (32 w + l) + 32 WPR k),
 * `loops` times over the block's row groups, so that the activations staged once serve `loops`
 * times as many rows.  NT tokens per grid row (blockIdx.y); with ids (expert gather) grid row y is slot y,
 * which uses matrix ids[y] (mat_bytes apart), activation row y / x_div and output row y (NT = 1);
 * with `groups` (and no ids) grid row y is group y % groups (matrix y % groups, activation columns
 * and output rows at that group's offset in each token's row) for NT tokens from (y / groups) NT.
 * RPW, NT and loops only share loads: a (row, token) sum is the same for any of them. */
/* The one-token Q2_K row-group kernel (the experts' down gathers: 91 registers, 2 blocks a
 * multiprocessor on sm_90) is held to 3 blocks' registers (77; H100, ncu: 57.5 -> 49.2 us a launch
 * at 36 slots, 15.2 -> 15.7 at 6). */
#if defined(GPU_NVIDIA)
#define Q8_BOUNDS(type, nt, wpr) \
    __launch_bounds__(GPU_WARP * Q8_WARPS, (type) == DS4_TYPE_Q2_K && (nt) == 1 && (wpr) == 1 ? 3 : 0)
#else
#define Q8_BOUNDS(type, nt, wpr) __launch_bounds__(GPU_WARP * Q8_WARPS)
#endif

template <int TYPE, bool PL, int NT, int RPW, int WPR>
__global__ void Q8_BOUNDS(TYPE, NT, WPR)
q8_kernel(const uint8_t *__restrict__ W, int64_t mat_bytes, const int32_t *__restrict__ ids, int64_t rows,
          int64_t cols, int64_t row_bytes, const float *__restrict__ X, int64_t ldx, int x_div, int64_t n,
          float *__restrict__ Y, int64_t ldy, int loops, int groups, Q8Pre pre) {
    typedef typename std::conditional<PL, Q8W<TYPE>, Q8G<TYPE>>::type P;
    constexpr int G = Q8_WARPS / WPR;
    static_assert(WPR == 1 || RPW * NT <= GPU_WARP * WPR,
                  "a group's lanes sum its rows' tokens: one (row, token) each");
    extern __shared__ __align__(16) uint8_t q8_smem[];
    __shared__ uint2 s_grid[TYPE == DS4_TYPE_IQ2_XXS ? 256 : 1];
    __shared__ float part[WPR > 1 ? G * RPW * NT * WPR : 1];
    const int nthr = blockDim.x * blockDim.y, tix = threadIdx.y * blockDim.x + threadIdx.x;
    if (TYPE == DS4_TYPE_IQ2_XXS) {
        for (int i = tix; i < 256; i += nthr) s_grid[i] = *(const uint2 *)c_iq2_grid[i];
    }
    int nt = 1;
    int64_t poff = 0; /* the launch's first activation row in pre's rows */
    if (ids) {
        const int64_t slot = blockIdx.y;
        W += (int64_t)ids[slot] * mat_bytes;
        poff = (slot / x_div) * pre.ld;
        X += (slot / x_div) * ldx;
        Y += slot * ldy;
    } else if (groups) { /* grid row y: group y % groups of tokens (y / groups) NT.. (gpu_q8_grouped) */
        const int64_t g = blockIdx.y % groups, t0 = (int64_t)(blockIdx.y / groups) * NT;
        nt = (int)(n - t0 < NT ? n - t0 : NT);
        W += g * mat_bytes;
        poff = t0 * pre.ld + g * cols;
        X += t0 * ldx + g * cols;
        Y += t0 * ldy + g * rows;
    } else {
        const int64_t t0 = (int64_t)blockIdx.y * NT;
        nt = (int)(n - t0 < NT ? n - t0 : NT);
        poff = t0 * pre.ld;
        X += t0 * ldx;
        Y += t0 * ldy;
    }
    const int64_t nb = cols / 32;
    const int64_t ns = n < NT ? n : NT; /* token rows the launch's shared memory holds (q8_go) */
    int8_t *sq = (int8_t *)q8_smem;
    float *sd = (float *)(q8_smem + ns * cols);
    int *ss = TYPE == DS4_TYPE_Q2_K ? (int *)(sd + ns * nb) : NULL;
    /* the swizzle needs whole groups of 128 codes; the planar Q2_K steps take q8_swz2.  Q8_0 only with
     * several tokens a grid row: H200, the 129280-row LM head at one token 1.21x slower with it (the
     * 2-bit experts 0.93-1.00x); H100, 6 tokens, where each staged code is read once a token, the
     * 8192-column product 42.8 -> 38.1 us a launch (lanes' 32-byte steps conflicted 2-way without it) */
    const int sm = (TYPE != DS4_TYPE_Q8_0 || NT > 1) && cols % 128 == 0 ? 7 : 0;
    constexpr bool alt = PL && TYPE == DS4_TYPE_Q2_K;
    if (pre.q) q8_copy(pre, poff, nt, cols, sq, sd, ss, sm, alt);
    else q8_stage(X, ldx, nt, cols, sq, sd, ss, sm, alt);
    __syncthreads();

    const int lane = threadIdx.x, wp = threadIdx.y, grp = wp / WPR, wg = wp % WPR;
    const int64_t wnb = cols / (TYPE == DS4_TYPE_Q8_0 ? 32 : 256), nu = cols / P::STEP;
    for (int it = 0; it < loops; it++) {
        const int64_t r0 = (((int64_t)blockIdx.x * loops + it) * G + grp) * RPW;
        const bool active = r0 < rows;
        float acc[RPW][NT];
#pragma unroll
        for (int k = 0; k < RPW; k++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[k][t] = 0.0f;
        if (active) {
            const uint8_t *rp[RPW];
#pragma unroll
            for (int k = 0; k < RPW; k++) rp[k] = W + (r0 + k < rows ? r0 + k : rows - 1) * row_bytes;
            for (int64_t u = wg * GPU_WARP + lane; u < nu; u += GPU_WARP * WPR) {
                typename P::D v[RPW];
#pragma unroll
                for (int k = 0; k < RPW; k++) v[k] = P::load(rp[k], wnb, u, s_grid);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < nt) {
#pragma unroll
                        for (int k = 0; k < RPW; k++)
                            acc[k][t] = P::dot(v[k], sq + t * cols, sd + t * nb, ss ? ss + t * 2 * nb : NULL, u,
                                               acc[k][t], sm);
                    }
                }
            }
        }
        if (WPR == 1) {
            if (active) {
#pragma unroll
                for (int k = 0; k < RPW; k++)
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const float s = gpu_warp_sum(acc[k][t]);
                        if (lane == 0 && t < nt && r0 + k < rows) Y[t * ldy + r0 + k] = s;
                    }
            }
        } else { /* the warps of a group meet in shared memory; every warp of the block runs `loops` rounds */
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
    }
}

/* Rounds per block: about Q8_BLOCKS blocks in the launch (row groups times grid rows), 1 to 8 rounds
 * (they change which block computes a row, never its arithmetic).  mat_groups: q8_kernel's groups. */
template <int TYPE, bool PL, int NT, int RPW, int WPR>
static void q8_go(hipStream_t st, unsigned gy, const uint8_t *W, int64_t mat_bytes, const int32_t *ids, int64_t rows,
                  int64_t cols, int64_t row_bytes, const float *X, int64_t ldx, int x_div, int64_t n, float *Y,
                  int64_t ldy, const Q8Pre &pre, int mat_groups = 0) {
    constexpr int G = Q8_WARPS / WPR;
    const int64_t groups = (rows + RPW - 1) / RPW, blocks1 = (groups + G - 1) / G;
    /* Every block stages all its tokens' rows (quantising them, or copying rows quantised once:
     * q8_prepare): a pass of 2-8 tokens (a verify) over rows
     * of 2048 columns or more gives a block 4x the rows (H200, 6 tokens: 0.69-0.85x for 1024-4096
     * rows of 4096 and the LM head; 1.14x for 32768 rows of 1024 and 1.06-1.14x for one token, which
     * keep Q8_BLOCKS). */
    /* The routed IQ2_XXS gate/up gathers (4 rows a warp: q8_launch_t) aim at twice the blocks (H200, 6
     * and 36 slots of 2048 x 4096: 0.83x and 0.92x; the Q2_K downs lost 5 % at 6 slots with either) */
    const int64_t target = ids ? (TYPE == DS4_TYPE_IQ2_XXS ? Q8_BLOCKS_IQ2_GATHER : Q8_BLOCKS)
                           : n > 1 && n <= 8 && cols >= 2048 ? Q8_BLOCKS_STAGED : Q8_BLOCKS;
    const int64_t want = blocks1 * (int64_t)gy / target;
    const int loops = (int)(want < 1 ? 1 : want > 8 ? 8 : want);
    const int64_t per_block = (int64_t)G * loops;
    const size_t smem = q8_stage_bytes(TYPE, n < NT ? n : NT, cols);
    hipLaunchKernelGGL((q8_kernel<TYPE, PL, NT, RPW, WPR>), dim3((unsigned)((groups + per_block - 1) / per_block), gy),
                       dim3(GPU_WARP, Q8_WARPS), smem, st, W, mat_bytes, ids, rows, cols, row_bytes, X, ldx, x_div, n,
                       Y, ldy, loops, mat_groups, pre);
}

/* Warps per row from the shape alone: one warp per row group for tall matrices (many rows) and for
 * rows too short to share, else enough warps that each lane has about one step.  Rows a warp takes
 * when it has a row to itself (WPR 1): the GGML layout one; where several warps share rows,
 * q8_shared_rpw. */
template <int TYPE, bool PL> constexpr int q8_dense_rpw() { return !PL ? 1 : TYPE == DS4_TYPE_Q8_0 ? 4 : 2; }

/* Rows a warp group takes at once where several warps share a row's steps (WPR 2 and 4; planar
 * Q8_0): with several tokens each staged code a lane reads from shared memory then serves 4 rows
 * instead of one (those products were bound by their shared-memory reads; H100, 6 tokens, 2 layers,
 * ncu: a verify's WPR 4 Q8_0 products 199.6 -> 159.5 us and WPR 2 33.6 -> 24.9, the kernels 64 -> 120
 * registers; 2 rows: 173.4 and 27.0; Q2_K and IQ2_XXS at 4 rows would take 172-210 registers and
 * stay at 1).  The arithmetic of a (row, token) is the same for any RPW. */
template <int TYPE, bool PL, int NT> constexpr int q8_shared_rpw() {
    return NT > 1 && PL && TYPE == DS4_TYPE_Q8_0 ? 4 : 1;
}

template <int TYPE, bool PL, int NT>
static void q8_dense(hipStream_t st, unsigned gy, const uint8_t *W, int64_t rows, int64_t cols, int64_t row_bytes,
                     const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, const Q8Pre &pre) {
    constexpr int RPW = q8_dense_rpw<TYPE, PL>();
    const int64_t per_lane = cols / (PL ? Q8W<TYPE>::STEP : 32) / GPU_WARP;
    constexpr int SR = q8_shared_rpw<TYPE, PL, NT>();
    if (rows >= Q8_SHORT_ROWS || per_lane < 2) q8_go<TYPE, PL, NT, RPW, 1>(st, gy, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy, pre);
    else if (per_lane < 4) q8_go<TYPE, PL, NT, SR, 2>(st, gy, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy, pre);
    else q8_go<TYPE, PL, NT, SR, 4>(st, gy, W, 0, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy, pre);
}

#if defined(GPU_NVIDIA)
/* The dense NT = 8 kernels may take Q8_STAGE_WIDE bytes of dynamic shared memory (over CUDA's 48 KB
 * default), for the current device. */
template <int TYPE, bool PL> static int q8_allow_wide(char *err, size_t len) {
    const hipFuncAttribute a = hipFuncAttributeMaxDynamicSharedMemorySize;
    GPU_TRY(hipFuncSetAttribute((const void *)q8_kernel<TYPE, PL, 8, q8_dense_rpw<TYPE, PL>(), 1>, a, Q8_STAGE_WIDE),
            "raise a q8 kernel's shared memory");
    GPU_TRY(hipFuncSetAttribute((const void *)q8_kernel<TYPE, PL, 8, q8_shared_rpw<TYPE, PL, 8>(), 2>, a, Q8_STAGE_WIDE),
            "raise a q8 kernel's shared memory");
    GPU_TRY(hipFuncSetAttribute((const void *)q8_kernel<TYPE, PL, 8, q8_shared_rpw<TYPE, PL, 8>(), 4>, a, Q8_STAGE_WIDE),
            "raise a q8 kernel's shared memory");
    return DS4_OK;
}
#endif

/* The activation rows of a pass of Q8_PRE_MIN_ROWS..GPU_Q8_PRE_ROWS rows (a verify, the drafter's
 * block) are quantised once by q8_quant_kernel into the context's q8_pre scratch (GPU_Q8_PRE_BYTES:
 * two regions laid out as in q8_region), and every block of a product copies them instead of
 * quantising them again: the same codes, scales and sums (q8_quant32's values either way), so a row's result
 * does not depend on the path.  Region 1 holds the rows the forward pass shares among several products
 * (gpu_q8_share), region 0 one product's rows.  A one-row pass (a decode) keeps each block's own
 * quantisation (there the extra launch costs more than the copy saves). */
#define Q8_PRE_MIN_ROWS 2
static_assert(Q8_STAGE == 32768, "the context's q8 scratch (GPU_Q8_PRE_BYTES) holds rows of 32768 codes");

/* Region k of the scratch for rows of qcols codes: codes, then scales, then 16-code sums. */
static Q8Pre q8_region(ds4_gpu_ctx *c, int k, int64_t qcols) {
    int8_t *q = (int8_t *)c->q8_pre + (size_t)k * GPU_Q8_PRE_REGION;
    float *d = (float *)(q + (size_t)GPU_Q8_PRE_ROWS * Q8_STAGE);
    int *s = (int *)(d + (size_t)GPU_Q8_PRE_ROWS * Q8_STAGE / 32);
    Q8Pre p = {q, d, s, qcols};
    return p;
}

static bool q8_pre_fits(const ds4_gpu_ctx *c, int64_t rows, int64_t qcols) {
    return c->q8_pre && rows >= Q8_PRE_MIN_ROWS && rows <= GPU_Q8_PRE_ROWS && qcols <= Q8_STAGE && qcols % 32 == 0;
}

static void q8_quantise(ds4_gpu_ctx *c, const Q8Pre &p, const float *X, int64_t ldx, int64_t rows) {
    const int64_t nbr = p.ld / 32, total = rows * nbr;
    hipLaunchKernelGGL(q8_quant_kernel, dim3((unsigned)((total + 7) / 8)), dim3(32, 8), 0, c->stream, X, ldx, nbr,
                       total, (int8_t *)p.q, (float *)p.d, (int *)p.s);
}

/* The pre-quantised rows for a product reading xrows rows of qcols floats at X (stride ldx): the
 * shared rows where X lies among them at their stride and width, else (own: not a gather, whose
 * one-row slots each block stages once anyway) region 0 filled now, else none (pre.q NULL: the blocks
 * quantise). */
static Q8Pre q8_prepare(ds4_gpu_ctx *c, const float *X, int64_t ldx, int64_t xrows, int64_t qcols, bool own) {
    Q8Pre p = {NULL, NULL, NULL, 0};
    if (c->q8_sx && ldx == c->q8_sldx && qcols == c->q8_scols && X >= c->q8_sx && (X - c->q8_sx) % ldx == 0 &&
        (X - c->q8_sx) / ldx + xrows <= c->q8_sn) {
        const int64_t r0 = (X - c->q8_sx) / ldx;
        p = q8_region(c, 1, qcols);
        p.q += r0 * qcols, p.d += r0 * qcols / 32, p.s += r0 * qcols / 16;
        return p;
    }
    if (!own || !q8_pre_fits(c, xrows, qcols)) return p;
    p = q8_region(c, 0, qcols);
    q8_quantise(c, p, X, ldx, xrows);
    return p;
}

/* Share one quantisation of n activation rows X [n, cols] (stride ldx) among the q8 products that
 * read them until the next call (backend.h version 10): X NULL ends the sharing; rows the scratch
 * cannot hold, or f32 activations, share nothing (each product then quantises as before).  The
 * caller calls again (or with NULL) before it writes those rows. */
int gpu_q8_share(ds4_gpu_ctx *c, const float *X, int64_t ldx, int64_t n, int64_t cols, char *err, size_t len) {
    c->q8_sx = NULL;
    if (!X || !c->act_q8 || !q8_pre_fits(c, n, cols) || ldx < cols) return DS4_OK;
    q8_quantise(c, q8_region(c, 1, cols), X, ldx, n);
    const hipError_t e = hipGetLastError();
    if (e != hipSuccess)
        return gpu_fail(err, len, DS4_E_DEVICE, "GPU q8 activations: quantising %lld shared rows of %lld columns: %s",
                        (long long)n, (long long)cols, hipGetErrorString(e));
    c->q8_sx = X, c->q8_sldx = ldx, c->q8_sn = n, c->q8_scols = cols;
    return DS4_OK;
}

/* This translation unit's copy of the IQ2_XXS tables (quant.h); on NVIDIA, the wide stage's shared
 * memory limit of the dense kernels (called after the context's hipSetDevice). */
int gpu_q8_init(char *err, size_t len) {
    int rc = quant_tables_init(err, len);
#if defined(GPU_NVIDIA)
    if (rc == DS4_OK) rc = q8_allow_wide<DS4_TYPE_Q8_0, true>(err, len);
    if (rc == DS4_OK) rc = q8_allow_wide<DS4_TYPE_Q8_0, false>(err, len);
    if (rc == DS4_OK) rc = q8_allow_wide<DS4_TYPE_Q2_K, true>(err, len);
    if (rc == DS4_OK) rc = q8_allow_wide<DS4_TYPE_Q2_K, false>(err, len);
    if (rc == DS4_OK) rc = q8_allow_wide<DS4_TYPE_IQ2_XXS, true>(err, len);
    if (rc == DS4_OK) rc = q8_allow_wide<DS4_TYPE_IQ2_XXS, false>(err, len);
#endif
    return rc;
}

/* Rows a warp of the gathered and grouped products (one warp a row group, WPR 1).  The grouped
 * products take the gathers' shape, so that one token's grouped product equals the gather it
 * replaced bit for bit. */
template <int TYPE, bool PL> constexpr int q8_gather_rpw() { return !PL ? 1 : TYPE == DS4_TYPE_Q2_K ? 2 : 4; }

template <int TYPE, bool PL>
static void q8_launch_t(hipStream_t st, int ntp, const uint8_t *W, int64_t mat_bytes, const int32_t *ids,
                        int64_t n_slots, int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t ldx,
                        int x_div, int64_t n, float *Y, int64_t ldy, const Q8Pre &pre) {
    if (ids) {
        constexpr int RPW = q8_gather_rpw<TYPE, PL>();
        q8_go<TYPE, PL, 1, RPW, 1>(st, (unsigned)n_slots, W, mat_bytes, ids, rows, cols, row_bytes, X, ldx, x_div, 1,
                                      Y, ldy, pre);
        return;
    }
    const unsigned gy = (unsigned)((n + ntp - 1) / ntp);
    if (ntp == 1) q8_dense<TYPE, PL, 1>(st, gy, W, rows, cols, row_bytes, X, ldx, n, Y, ldy, pre);
    else if (ntp == 4) q8_dense<TYPE, PL, 4>(st, gy, W, rows, cols, row_bytes, X, ldx, n, Y, ldy, pre);
    else q8_dense<TYPE, PL, 8>(st, gy, W, rows, cols, row_bytes, X, ldx, n, Y, ldy, pre);
}

/* Called by gpu_planar_launch (hip/planar.hip) and gpu_matmul_launch / gpu_mm_gather (the GGML
 * layout of Q8_0, Q2_K and IQ2_XXS), which have checked the layout and shape. */
int gpu_q8_launch(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, const int32_t *ids,
                  int64_t n_slots, int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t ldx,
                  int32_t x_div, int64_t n, float *Y, int64_t ldy, char *err, size_t len) {
    const int32_t type = layout & ~DS4_GPU_PLANAR;
    if (cols > Q8_STAGE)
        return gpu_fail(err, len, DS4_E_UNSUPPORTED, "GPU matmul with q8 activations: rows of %lld columns (GGML type "
                        "%d); the kernels stage at most %d columns per token (choose activations f32)",
                        (long long)cols, type, Q8_STAGE);
    /* tokens per grid row: a pass of 2-8 tokens in one grid row when Q8_STAGE_WIDE bytes hold them all,
     * else as many as Q8_STAGE bytes of codes hold, up to 8 */
    const int ntp = n == 1                                                          ? 1
                    : n <= 8 && q8_stage_bytes(type, n, cols) <= (size_t)Q8_STAGE_WIDE ? 8
                    : Q8_STAGE / cols >= 8                                          ? 8
                    : Q8_STAGE / cols >= 4                                          ? 4
                                                                                    : 1;
    if (!ids && (n + ntp - 1) / ntp > 65535)
        return gpu_fail(err, len, DS4_E_INVALID, "GPU matmul with q8 activations: %lld tokens in one pass exceed the "
                        "launch grid (at most %lld)", (long long)n, 65535LL * ntp);
    hipStream_t st = c->stream;
    const uint8_t *w = (const uint8_t *)W;
    const Q8Pre pre = q8_prepare(c, X, ldx, ids ? (n_slots + x_div - 1) / x_div : n, cols, !ids);
    if (!(layout & DS4_GPU_PLANAR)) {
        switch (type) {
        case DS4_TYPE_Q8_0: q8_launch_t<DS4_TYPE_Q8_0, false>(st, ntp, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy, pre); break;
        case DS4_TYPE_Q2_K: q8_launch_t<DS4_TYPE_Q2_K, false>(st, ntp, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy, pre); break;
        case DS4_TYPE_IQ2_XXS: q8_launch_t<DS4_TYPE_IQ2_XXS, false>(st, ntp, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy, pre); break;
        default:
            return gpu_fail(err, len, DS4_E_INVALID, "GPU matmul with q8 activations: GGML type %d (expected Q8_0, Q2_K "
                            "or IQ2_XXS)", type);
        }
    } else switch (type) {
    case DS4_TYPE_Q8_0: q8_launch_t<DS4_TYPE_Q8_0, true>(st, ntp, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy, pre); break;
    case DS4_TYPE_Q2_K: q8_launch_t<DS4_TYPE_Q2_K, true>(st, ntp, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy, pre); break;
    default: q8_launch_t<DS4_TYPE_IQ2_XXS, true>(st, ntp, w, mat_bytes, ids, n_slots, rows, cols, row_bytes, X, ldx, x_div, n, Y, ldy, pre); break;
    }
    /* the message is formatted only on failure: a launch costs no host formatting */
    const hipError_t e_launch = hipGetLastError();
    if (e_launch != hipSuccess)
        return gpu_fail(err, len, DS4_E_DEVICE,
                        "GPU q8 matmul launch (type %d, %lld x %lld, %lld %s): %s (%s)",
                        type, (long long)rows, (long long)cols, (long long)(ids ? n_slots : n),
                        ids ? "slots" : "tokens", hipGetErrorString(e_launch), hipGetErrorName(e_launch));
    return DS4_OK;
}

template <int TYPE, bool PL>
static void q8_grouped_t(hipStream_t st, int ntp, unsigned gy, const uint8_t *W, int64_t mat_bytes, int32_t groups,
                         int64_t rows, int64_t cols, int64_t row_bytes, const float *X, int64_t n, float *Y,
                         const Q8Pre &pre) {
    constexpr int RPW = q8_gather_rpw<TYPE, PL>();
    const int64_t ldx = (int64_t)groups * cols, ldy = (int64_t)groups * rows;
    if (ntp == 1) q8_go<TYPE, PL, 1, RPW, 1>(st, gy, W, mat_bytes, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy, pre, groups);
    else if (ntp == 4) q8_go<TYPE, PL, 4, RPW, 1>(st, gy, W, mat_bytes, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy, pre, groups);
    else q8_go<TYPE, PL, 8, RPW, 1>(st, gy, W, mat_bytes, NULL, rows, cols, row_bytes, X, ldx, 1, n, Y, ldy, pre, groups);
}

/* Grouped products under q8 activations (backend.h version 9, gpu_mm_grouped): for token t < n and
 * group g < groups, Y[(t * groups + g) * rows + r] = W_g[r, :] . X[(t * groups + g) * cols + :], W_g
 * at g * mat_bytes; each block stages up to 8 tokens of one group, so a pass reads each group's
 * weights once per 8 tokens instead of once per token.  The caller has checked the layout. */
int gpu_q8_grouped(ds4_gpu_ctx *c, int32_t layout, const void *W, int64_t mat_bytes, int32_t groups, int64_t rows,
                   int64_t cols, int64_t row_bytes, const float *X, int64_t n, float *Y, char *err, size_t len) {
    const int32_t type = layout & ~DS4_GPU_PLANAR;
    if (cols > Q8_STAGE)
        return gpu_fail(err, len, DS4_E_UNSUPPORTED, "GPU grouped matmul with q8 activations: rows of %lld columns "
                        "(GGML type %d); the kernels stage at most %d columns per token (choose activations f32)",
                        (long long)cols, type, Q8_STAGE);
    const int ntp = n == 1 ? 1 : Q8_STAGE / cols >= 8 ? 8 : Q8_STAGE / cols >= 4 ? 4 : 1;
    const int64_t gy = (int64_t)groups * ((n + ntp - 1) / ntp);
    if (gy > 65535)
        return gpu_fail(err, len, DS4_E_INVALID, "GPU grouped matmul with q8 activations: %lld tokens of %d groups in "
                        "one pass exceed the launch grid (at most 65535 rows)", (long long)n, groups);
    hipStream_t st = c->stream;
    const uint8_t *w = (const uint8_t *)W;
    const bool pl = (layout & DS4_GPU_PLANAR) != 0;
    const Q8Pre pre = q8_prepare(c, X, (int64_t)groups * cols, n, (int64_t)groups * cols, true);
    switch (type) {
    case DS4_TYPE_Q8_0:
        if (pl) q8_grouped_t<DS4_TYPE_Q8_0, true>(st, ntp, (unsigned)gy, w, mat_bytes, groups, rows, cols, row_bytes, X, n, Y, pre);
        else q8_grouped_t<DS4_TYPE_Q8_0, false>(st, ntp, (unsigned)gy, w, mat_bytes, groups, rows, cols, row_bytes, X, n, Y, pre);
        break;
    case DS4_TYPE_Q2_K:
        if (pl) q8_grouped_t<DS4_TYPE_Q2_K, true>(st, ntp, (unsigned)gy, w, mat_bytes, groups, rows, cols, row_bytes, X, n, Y, pre);
        else q8_grouped_t<DS4_TYPE_Q2_K, false>(st, ntp, (unsigned)gy, w, mat_bytes, groups, rows, cols, row_bytes, X, n, Y, pre);
        break;
    case DS4_TYPE_IQ2_XXS:
        if (pl) q8_grouped_t<DS4_TYPE_IQ2_XXS, true>(st, ntp, (unsigned)gy, w, mat_bytes, groups, rows, cols, row_bytes, X, n, Y, pre);
        else q8_grouped_t<DS4_TYPE_IQ2_XXS, false>(st, ntp, (unsigned)gy, w, mat_bytes, groups, rows, cols, row_bytes, X, n, Y, pre);
        break;
    default:
        return gpu_fail(err, len, DS4_E_INVALID, "GPU grouped matmul with q8 activations: GGML type %d (expected Q8_0, "
                        "Q2_K or IQ2_XXS)", type);
    }
    const hipError_t e_launch = hipGetLastError();
    if (e_launch != hipSuccess)
        return gpu_fail(err, len, DS4_E_DEVICE, "GPU q8 grouped matmul launch (type %d, %d groups of %lld x %lld, %lld "
                        "tokens): %s (%s)", type, groups, (long long)rows, (long long)cols, (long long)n,
                        hipGetErrorString(e_launch), hipGetErrorName(e_launch));
    return DS4_OK;
}
