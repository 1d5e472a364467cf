/* dot.c — dot products of GGML-typed weight rows with float activation rows (the CPU dot kernels
 * of types.h; cpu/matmul.c drives them over rows and threads).
 *
 * Y[t, r] = sum_c W[r, c] * X[t, c].  By default (activations = f32) activations stay float32 for
 * every weight type (the `q8` option's 8-bit kernels are at the end of this file, spec ds4.md
 * §2.9.5): each block's weights are formed in float registers (the
 * values gguf.quants' dequantisation gives) and dotted with the activations,
 * so results differ from "dequantise, then numpy" only by float32 summation
 * order (~1e-7 of sum |w*x| measured; tests/test_native_kernels.py bounds it
 * at 1e-5).  This costs speed against llama.cpp/ds4's 8-bit activation dot
 * products (which move the tiny test model's logits by ~0.3) and keeps the
 * engine comparable with the numpy reference at 1e-4.
 *
 * cpu/matmul.c splits rows over the thread pool; each (row, token) pair uses the same
 * dot product whatever the batch size, so results are batch-invariant.  Where several tokens
 * share a call (a verify, a prefill chunk, the drafter's block), the Q8_0, F16 and 2-bit kernels
 * form each block's weights once for a group of up to 8 tokens and run every token's lanes
 * through its one-token operations: a further token then costs only its fused multiply-adds.
 * Dot products keep 8-32 independent partial sums so that the compiler can
 * vectorise them without -ffast-math (no reassociation is needed); x86 AVX2,
 * FMA and F16C paths sit behind the compiler's feature macros.
 */
#include "kernels.h"
#include "iq2xxs_tables.h"

#include <math.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define LANES 16

/* a*b + c: fused where the target has a fast FMA (checked by the compiler's __FP_FAST_FMAF), else
 * two roundings.  Either way the result stays within the tests' summation-order bound. */
#ifdef __FP_FAST_FMAF
#define MADD(a, b, c) fmaf((a), (b), (c))
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

static inline float hsum(const float *acc) {
    float s8[8];
    for (int j = 0; j < 8; j++) s8[j] = acc[j] + acc[j + 8];
    float s4[4];
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

float ds4_dot_f32(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out[k] = ds4_dot_f32(a, b[k], n) for k < 4, bit for bit: a's 16 lanes loaded once for the four
 * (attention scores of 4 keys, the indexer's heads against one key). */
void ds4_dot_f32_4(const float *a, const float *const b[4], int64_t n, float out[4]) {
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512 acc[4];
    for (int k = 0; k < 4; k++) acc[k] = _mm512_setzero_ps();
    for (; i + LANES <= n; i += LANES) {
        const __m512 va = _mm512_loadu_ps(a + i);
        for (int k = 0; k < 4; k++) acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(va, _mm512_loadu_ps(b[k] + i)));
    }
    for (int k = 0; k < 4; k++) { /* hsum's additions: lanes j + 8, then j + 4, then (0 + 2) + (1 + 3) */
        const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc[k]), _mm512_extractf32x8_ps(acc[k], 1));
        float s4[4];
        _mm_storeu_ps(s4, _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)));
        out[k] = (s4[0] + s4[2]) + (s4[1] + s4[3]);
    }
#else
    float acc[4][LANES] = {{0}};
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < LANES; j++) acc[k][j] += a[i + j] * b[k][i + j];
    for (int k = 0; k < 4; k++) out[k] = hsum(acc[k]);
#endif
    for (int k = 0; k < 4; k++)
        for (int64_t t = i; t < n; t++) out[k] += a[t] * b[k][t];
}

/* Q8_0 block: f16 scale d + 32 int8 q (spec ds4.md §5.1).  A block's weights are formed once as
 * w = d * q in float32, which is exact (an 11-bit significand times an 8-bit integer needs at most
 * 19 bits): they are the values gguf.quants' dequantisation gives.  Element j of every block is
 * fused-multiply-added into lane j of 32 running sums (acc[j] = fma(w_j, x_j, acc[j]), blocks in
 * order), so each product w * x is rounded once, inside its accumulation; then acc[j] += acc[j + 16]
 * and hsum.  The AVX-512 path holds the 32 lanes in two vectors, the AVX2 path in four, the portable
 * one in an array: the same operations on the same lanes.
 *
 * Several tokens share a row (verify, prefill, the drafter's block): the block's weights are formed
 * once for up to Q8_MAXNT tokens and every token's lanes see exactly the fused multiply-adds and the
 * final reduction of its one-token call, so the results are bit-identical to one-token calls (batch
 * invariance), and each further token costs two fused multiply-adds per block (AVX-512). */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* hsum of the 16 lanes a0 | a1 in vector form: the same additions in the same order. */
static inline float hsum16_256(__m256 a0, __m256 a1) {
    const __m256 s8 = _mm256_add_ps(a0, a1);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
#endif
#if defined(__AVX512F__)
/* hsum of the 32 lanes a0 | a1 after acc[j] += acc[j + 16], in vector form: the same additions in
 * the same order (a 256-element row has too few blocks to hide a scalar reduction). */
static inline float hsum32_512(__m512 a0, __m512 a1) {
    const __m512 a = _mm512_add_ps(a0, a1);
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* The block's scale in every lane (F16C where the target has it: the same exact value). */
static inline __m512 q8_0_scale(const uint8_t *blk) {
#if defined(__F16C__)
    return _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(blk[0] | (blk[1] << 8))));
#else
    return _mm512_set1_ps(ds4_half((uint16_t)(blk[0] | (blk[1] << 8))));
#endif
}

#define Q8_MAXNT 8
static inline __attribute__((always_inline)) void q8_0_tokens(const uint8_t *row, const float *X, int64_t ldx,
                                                               int64_t n, float *Y, int64_t ldy, const int NT) {
    __m512 a0[Q8_MAXNT], a1[Q8_MAXNT];
    for (int k = 0; k < NT; k++) a0[k] = a1[k] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        const __m512 d = q8_0_scale(blk);
        const __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))));
        const __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))));
        for (int k = 0; k < NT; k++) {
            const float *xb = X + k * ldx + 32 * b;
            a0[k] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), a0[k]);
            a1[k] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), a1[k]);
        }
    }
    for (int k = 0; k < NT; k++) Y[k * ldy] = hsum32_512(a0[k], a1[k]);
}

#elif defined(__AVX2__) && defined(__FMA__)
#define Q8_MAXNT 8
/* Up to 3 tokens: 4 accumulators a token and 4 weight vectors in 16 registers.  4 to 8 tokens: the
 * 32 lanes are independent sums, so the row runs as four passes over its blocks, pass j holding
 * lanes 8j .. 8j + 7 of every token in one register each (one weight vector and NT accumulators in
 * 16 registers; with fewer tokens one chain of fused multiply-adds a pass would wait on its latency).
 * Either way each lane sees the same fused multiply-adds in the same block order as a one-token
 * call. */
static inline __attribute__((always_inline)) __m256 q8_0_scale8(const uint8_t *blk) {
#if defined(__F16C__) /* F16C converts exactly: the same value as ds4_half */
    return _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(blk[0] | (blk[1] << 8))));
#else
    return _mm256_set1_ps(ds4_half((uint16_t)(blk[0] | (blk[1] << 8))));
#endif
}

static inline __attribute__((always_inline)) void q8_0_tokens(const uint8_t *row, const float *X, int64_t ldx,
                                                               int64_t n, float *Y, int64_t ldy, const int NT) {
    const int64_t nb = n / 32;
    float acc[Q8_MAXNT][32];
    if (NT <= 3) {
        __m256 a[3][4];
        for (int k = 0; k < NT; k++)
            for (int j = 0; j < 4; j++) a[k][j] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + 34 * b;
            const __m256 d = q8_0_scale8(blk);
            __m256 w[4];
            for (int j = 0; j < 4; j++)
                w[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * j)))));
            for (int k = 0; k < NT; k++) {
                const float *xb = X + k * ldx + 32 * b;
                for (int j = 0; j < 4; j++) a[k][j] = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(xb + 8 * j), a[k][j]);
            }
        }
        for (int k = 0; k < NT; k++)
            for (int j = 0; j < 4; j++) _mm256_storeu_ps(acc[k] + 8 * j, a[k][j]);
    } else {
        for (int j = 0; j < 4; j++) {
            __m256 a[Q8_MAXNT];
            for (int k = 0; k < NT; k++) a[k] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + 34 * b;
                const __m256 w = _mm256_mul_ps(q8_0_scale8(blk),
                                               _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * j)))));
                for (int k = 0; k < NT; k++) a[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(X + k * ldx + 32 * b + 8 * j), a[k]);
            }
            for (int k = 0; k < NT; k++) _mm256_storeu_ps(acc[k] + 8 * j, a[k]);
        }
    }
    for (int k = 0; k < NT; k++) {
        for (int j = 0; j < 16; j++) acc[k][j] += acc[k][j + 16];
        Y[k * ldy] = hsum(acc[k]);
    }
}
#else
#define Q8_MAXNT 1
static inline void q8_0_tokens(const uint8_t *row, const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy,
                               const int NT) {
    (void)ldx, (void)ldy, (void)NT;
    float acc[32] = {0};
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));
        const int8_t *q = (const int8_t *)(blk + 2);
        const float *xb = X + 32 * b;
        for (int j = 0; j < 32; j++) acc[j] = MADD(d * (float)q[j], xb[j], acc[j]);
    }
    for (int j = 0; j < 16; j++) acc[j] += acc[j + 16];
    Y[0] = hsum(acc);
}
#endif

#define Q8_NT(NT)                                                                                          \
    static void dot_q8_0_x##NT(const uint8_t *row, const float *X, int64_t ldx, int64_t n, float *Y,     \
                               int64_t ldy) {                                                              \
        q8_0_tokens(row, X, ldx, n, Y, ldy, NT);                                                           \
    }
typedef void (*q8_0_fn)(const uint8_t *, const float *, int64_t, int64_t, float *, int64_t);
Q8_NT(1)
#if Q8_MAXNT >= 3
Q8_NT(2)
Q8_NT(3)
#endif
#if Q8_MAXNT >= 8
Q8_NT(4)
Q8_NT(5)
Q8_NT(6)
Q8_NT(7)
Q8_NT(8)
#endif
/* the kernel for a group of nt tokens, 1 <= nt <= Q8_MAXNT */
static const q8_0_fn q8_0_group[Q8_MAXNT + 1] = {
    NULL, dot_q8_0_x1,
#if Q8_MAXNT >= 3
    dot_q8_0_x2, dot_q8_0_x3,
#endif
#if Q8_MAXNT >= 8
    dot_q8_0_x4, dot_q8_0_x5, dot_q8_0_x6, dot_q8_0_x7, dot_q8_0_x8,
#endif
};
#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
/* F16C converts 8 halves per instruction, exactly (the same values as ds4_half). */
#if defined(__AVX512F__)
/* One 512-bit vector holds both 8-lane halves: lane j < 8 is acc0's lane j, lane 8 + j is acc1's, the
 * same fused multiply-adds per lane as the 256-bit form below, in half the instructions. */
static float dot_f16(const uint16_t *row, const float *x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + i))), _mm512_loadu_ps(x + i),
                              acc);
    float a[LANES];
    _mm512_storeu_ps(a, acc);
    float s = hsum(a);
    for (; i < n; i++) s += ds4_half(row[i]) * x[i];
    return s;
}
#else
static float dot_f16(const uint16_t *row, const float *x, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + i + 8)));
        acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), acc1);
    }
    float acc[LANES];
    _mm256_storeu_ps(acc, acc0);
    _mm256_storeu_ps(acc + 8, acc1);
    float s = hsum(acc);
    for (; i < n; i++) s += ds4_half(row[i]) * x[i];
    return s;
}
#endif
#else
static float dot_f16(const uint16_t *row, const float *x, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] = MADD(ds4_half(row[i + j]), x[i + j], acc[j]);
    float s = hsum(acc);
    for (; i < n; i++) s += ds4_half(row[i]) * x[i];
    return s;
}
#endif

/* Q2_K (spec ds4.md §5.2): element 128h + 32j + l of a block has code (qs[32h + l] >> 2j) & 3 and
 * belongs to sub-block 8h + 2j + l/16, whose weight is d*(sc & 15)*code - dmin*(sc >> 4) (the values
 * gguf.quants produces), dotted with x in 16 lanes.
 * IQ2_XXS (spec ds4.md §5.3): 8 groups of 32; each group has 4 grid indices, 4 x 7 sign bits and a
 * 4-bit scale; weight = d * (0.5 + scale) / 4 * grid * sign (grid and signs as float rows). */
#if defined(__AVX2__) && defined(__FMA__)
static float dot_q2_k(const uint8_t *row, const float *x, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i three = _mm256_set1_epi32(3);
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *blk = row + 84 * b, *sc = blk, *qs = blk + 16;
        const float d = ds4_half((uint16_t)(blk[80] | (blk[81] << 8)));
        const float dmin = ds4_half((uint16_t)(blk[82] | (blk[83] << 8)));
        const float *xb = x + 256 * b;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int half = 0; half < 2; half++) {
                    const int sb = 8 * h + 2 * j + half;
                    const __m256 dl = _mm256_set1_ps(d * (float)(sc[sb] & 15));
                    const __m256 ml = _mm256_set1_ps(dmin * (float)(sc[sb] >> 4));
                    const uint8_t *q = qs + 32 * h + 16 * half;
                    const float *xs = xb + 128 * h + 32 * j + 16 * half;
                    const __m128i sh = _mm_cvtsi32_si128(2 * j);
                    __m256i c0 = _mm256_and_si256(_mm256_srl_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q)), sh), three);
                    __m256i c1 = _mm256_and_si256(_mm256_srl_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8))), sh), three);
                    __m256 w0 = _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(c0)), ml);
                    __m256 w1 = _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(c1)), ml);
                    acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs), acc0);
                    acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xs + 8), acc1);
                }
    }
    return hsum16_256(acc0, acc1);
}

#if defined(__AVX512F__)
/* Two 8-element grid rows per 16-lane vector; the weights are the same products as below. */
static float dot_iq2_xxs(const uint8_t *row, const float *x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *blk = row + 66 * b;
        const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *g = blk + 2 + 8 * ib;
            uint32_t w = (uint32_t)g[4] | ((uint32_t)g[5] << 8) | ((uint32_t)g[6] << 16) | ((uint32_t)g[7] << 24);
            const __m512 db = _mm512_set1_ps(d * (0.5f + (float)(w >> 28)) * 0.25f);
            const float *xs = x + 256 * b + 32 * ib;
            for (int k = 0; k < 4; k += 2) {
                __m512 grid = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(ds4_iq2xxs_grid_f[g[k]])),
                                                 _mm256_loadu_ps(ds4_iq2xxs_grid_f[g[k + 1]]), 1);
                __m512 sign = _mm512_insertf32x8(
                    _mm512_castps256_ps512(_mm256_loadu_ps(ds4_iq2xxs_sign_f[(w >> (7 * k)) & 127])),
                    _mm256_loadu_ps(ds4_iq2xxs_sign_f[(w >> (7 * (k + 1))) & 127]), 1);
                acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(db, grid), sign), _mm512_loadu_ps(xs + 8 * k), acc);
            }
        }
    }
    return hsum16_256(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
}
#else
static float dot_iq2_xxs(const uint8_t *row, const float *x, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *blk = row + 66 * b;
        const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *g = blk + 2 + 8 * ib;
            uint32_t w = (uint32_t)g[4] | ((uint32_t)g[5] << 8) | ((uint32_t)g[6] << 16) | ((uint32_t)g[7] << 24);
            const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(w >> 28)) * 0.25f);
            const float *xs = x + 256 * b + 32 * ib;
            for (int k = 0; k < 4; k += 2) {
                __m256 w0 = _mm256_mul_ps(_mm256_mul_ps(db, _mm256_loadu_ps(ds4_iq2xxs_grid_f[g[k]])),
                                          _mm256_loadu_ps(ds4_iq2xxs_sign_f[(w >> (7 * k)) & 127]));
                __m256 w1 = _mm256_mul_ps(_mm256_mul_ps(db, _mm256_loadu_ps(ds4_iq2xxs_grid_f[g[k + 1]])),
                                          _mm256_loadu_ps(ds4_iq2xxs_sign_f[(w >> (7 * (k + 1))) & 127]));
                acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs + 8 * k), acc0);
                acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xs + 8 * k + 8), acc1);
            }
        }
    }
    return hsum16_256(acc0, acc1);
}
#endif
#else
static float dot_q2_k(const uint8_t *row, const float *x, int64_t n) {
    float acc[LANES] = {0};
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *blk = row + 84 * b, *sc = blk, *qs = blk + 16;
        const float d = ds4_half((uint16_t)(blk[80] | (blk[81] << 8)));
        const float dmin = ds4_half((uint16_t)(blk[82] | (blk[83] << 8)));
        const float *xb = x + 256 * b;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int half = 0; half < 2; half++) {
                    const int sb = 8 * h + 2 * j + half;
                    const float dl = d * (float)(sc[sb] & 15), ml = dmin * (float)(sc[sb] >> 4);
                    const uint8_t *q = qs + 32 * h + 16 * half;
                    const float *xs = xb + 128 * h + 32 * j + 16 * half;
                    for (int l = 0; l < 16; l++) {
                        float w = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
                        acc[l] = MADD(w, xs[l], acc[l]);
                    }
                }
    }
    return hsum(acc);
}

static float dot_iq2_xxs(const uint8_t *row, const float *x, int64_t n) {
    float acc[8] = {0};
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *blk = row + 66 * b;
        const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *g = blk + 2 + 8 * ib;
            uint32_t w = (uint32_t)g[4] | ((uint32_t)g[5] << 8) | ((uint32_t)g[6] << 16) | ((uint32_t)g[7] << 24);
            const float db = d * (0.5f + (float)(w >> 28)) * 0.25f;
            const float *xs = x + 256 * b + 32 * ib;
            for (int k = 0; k < 4; k++) {
                const float *grid = ds4_iq2xxs_grid_f[g[k]], *sign = ds4_iq2xxs_sign_f[(w >> (7 * k)) & 127];
                for (int j = 0; j < 8; j++) acc[j] = MADD(db * grid[j] * sign[j], xs[8 * k + j], acc[j]);
            }
        }
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}


#endif

/* ---- rows [r0, r1) of a weight matrix against n_tok activation rows, per type (types.h's
 * cpu_dot) ---------------------------------------------------------------------------------------
 * Every token goes through the same dot product, so a result never depends on how many tokens
 * share the batch: prefill, decode and speculative verification give bit-identical rows (the
 * weight row stays in L1 between tokens).  One call per slice of rows keeps the dispatch on the
 * type out of the per-row loop. */

#define ROWS_OF(FN, DOT)                                                                                   \
    void FN(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, int64_t cols, const float *X,     \
            int64_t ldx, int64_t n_tok, float *Y, int64_t ldy) {                                          \
        for (int64_t r = r0; r < r1; r++) {                                                                \
            const uint8_t *row = W + (size_t)r * row_bytes;                                                \
            for (int64_t k = 0; k < n_tok; k++) Y[k * ldy + r] = DOT(row, X + k * ldx, cols);              \
        }                                                                                                  \
    }

static inline float dot_f32_row(const uint8_t *row, const float *x, int64_t n) {
    return ds4_dot_f32((const float *)row, x, n);
}
static inline float dot_f16_row(const uint8_t *row, const float *x, int64_t n) {
    return dot_f16((const uint16_t *)row, x, n);
}
/* BF16 (no fused kernel): 256-element chunks dequantised into a stack buffer. */
static float dot_bf16_row(const uint8_t *row, const float *x, int64_t cols) {
    float tmp[256], s = 0.0f;
    for (int64_t c = 0; c < cols; c += 256) {
        int64_t n = cols - c < 256 ? cols - c : 256;
        ds4_cpu_dequant_bf16(row + 2 * c, tmp, n);
        s += ds4_dot_f32(tmp, x + c, n);
    }
    return s;
}

ROWS_OF(ds4_cpu_dot_f32, dot_f32_row)
#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
/* F16 rows against several tokens (the mHC mixers, the router): each 16 halves are converted once
 * for up to F16_MAXNT tokens, and every token's lanes see exactly dot_f16's fused multiply-adds, its
 * reduction and its scalar tail, so the bits are those of one-token calls. */
#if defined(__AVX512F__)
#define F16_MAXNT 8 /* 32 vector registers */
#else
#define F16_MAXNT 6
#endif
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void f16_tokens(const uint16_t *row, const float *X, int64_t ldx,
                                                              int64_t n, float *Y, int64_t ldy, const int NT,
                                                              float *lanes) {
    __m512 a[F16_MAXNT]; /* a[k]: token k's two 8-lane halves in one vector (dot_f16's lanes) */
    for (int k = 0; k < NT; k++) a[k] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + i)));
        for (int k = 0; k < NT; k++) a[k] = _mm512_fmadd_ps(w, _mm512_loadu_ps(X + k * ldx + i), a[k]);
    }
    if (lanes) { /* n a multiple of 16: token k's lanes to lanes + 64 * k, for f16_reduce4 */
        for (int k = 0; k < NT; k++) _mm512_storeu_ps(lanes + 64 * k, a[k]);
        return;
    }
    for (int k = 0; k < NT; k++) {
        float acc[LANES];
        _mm512_storeu_ps(acc, a[k]);
        float s = hsum(acc);
        for (int64_t j = i; j < n; j++) s += ds4_half(row[j]) * X[k * ldx + j];
        Y[k * ldy] = s;
    }
}
#else
static inline __attribute__((always_inline)) void f16_tokens(const uint16_t *row, const float *X, int64_t ldx,
                                                              int64_t n, float *Y, int64_t ldy, const int NT,
                                                              float *lanes) {
    (void)lanes; /* the 4-row reduction is the AVX-512 path's */
    __m256 a0[F16_MAXNT], a1[F16_MAXNT];
    for (int k = 0; k < NT; k++) a0[k] = a1[k] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + i)));
        const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + i + 8)));
        for (int k = 0; k < NT; k++) {
            a0[k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(X + k * ldx + i), a0[k]);
            a1[k] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(X + k * ldx + i + 8), a1[k]);
        }
    }
    for (int k = 0; k < NT; k++) {
        float acc[LANES];
        _mm256_storeu_ps(acc, a0[k]);
        _mm256_storeu_ps(acc + 8, a1[k]);
        float s = hsum(acc);
        for (int64_t j = i; j < n; j++) s += ds4_half(row[j]) * X[k * ldx + j];
        Y[k * ldy] = s;
    }
}
#endif
#define F16_NT(NT)                                                                                         \
    static void dot_f16_x##NT(const uint16_t *row, const float *X, int64_t ldx, int64_t n, float *Y,     \
                              int64_t ldy, float *lanes) {                                                 \
        f16_tokens(row, X, ldx, n, Y, ldy, NT, lanes);                                                     \
    }
F16_NT(1)
F16_NT(2)
F16_NT(3)
F16_NT(4)
F16_NT(5)
F16_NT(6)
#if F16_MAXNT >= 8
F16_NT(7)
F16_NT(8)
#endif
static void (*const f16_group[F16_MAXNT + 1])(const uint16_t *, const float *, int64_t, int64_t, float *, int64_t,
                                              float *) = {
    NULL, dot_f16_x1, dot_f16_x2, dot_f16_x3, dot_f16_x4, dot_f16_x5, dot_f16_x6,
#if F16_MAXNT >= 8
    dot_f16_x7, dot_f16_x8,
#endif
};

#if defined(__AVX512F__)
/* 4 rows' final sums at once: l + 16 i holds row i's 16 lanes; y[i] = hsum of them, hsum's additions
 * (lanes j + 8, then j + 4, then (0 + 2) + (1 + 3)). */
static inline void f16_reduce4(const float *l, float *y) {
    const __m512 v0 = _mm512_loadu_ps(l), v1 = _mm512_loadu_ps(l + 16), v2 = _mm512_loadu_ps(l + 32), v3 = _mm512_loadu_ps(l + 48);
    const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xEE));
    const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xEE));
    const __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88), _mm512_shuffle_f32x4(a01, a23, 0xDD));
    const __m512 e = _mm512_add_ps(z, _mm512_permute_ps(z, 0x4E));
    const __m512 f = _mm512_add_ps(e, _mm512_permute_ps(e, 0xB1));
    const __m512i ix = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm_storeu_ps(y, _mm512_castps512_ps128(_mm512_permutexvar_ps(ix, f)));
}
#endif

void ds4_cpu_dot_f16(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, int64_t cols, const float *X,
                     int64_t ldx, int64_t n_tok, float *Y, int64_t ldy) {
    int64_t r = r0;
#if defined(__AVX512F__)
    if (cols % 16 == 0) { /* 4 rows at a time: their final reductions run together */
        float lanes[F16_MAXNT * 64];
        for (; r + 4 <= r1; r += 4)
            for (int64_t k = 0; k < n_tok;) {
                const int nt = (int)(n_tok - k < F16_MAXNT ? n_tok - k : F16_MAXNT);
                for (int i = 0; i < 4; i++)
                    f16_group[nt]((const uint16_t *)(W + (size_t)(r + i) * row_bytes), X + k * ldx, ldx, cols, NULL, 0,
                                  lanes + 16 * i);
                for (int j = 0; j < nt; j++) f16_reduce4(lanes + 64 * j, Y + (k + j) * ldy + r);
                k += nt;
            }
    }
#endif
    for (; r < r1; r++) {
        const uint16_t *row = (const uint16_t *)(W + (size_t)r * row_bytes);
        for (int64_t k = 0; k < n_tok;) {
            const int nt = (int)(n_tok - k < F16_MAXNT ? n_tok - k : F16_MAXNT);
            if (nt == 1) Y[k * ldy + r] = dot_f16(row, X + k * ldx, cols);
            else f16_group[nt](row, X + k * ldx, ldx, cols, Y + k * ldy + r, ldy, NULL);
            k += nt;
        }
    }
}
#else
ROWS_OF(ds4_cpu_dot_f16, dot_f16_row)
#endif
ROWS_OF(ds4_cpu_dot_bf16, dot_bf16_row)
/* ---- the 2-bit types against several tokens at once -------------------------------------------
 * Each block's weights are formed once (the same vector products dot_q2_k / dot_iq2_xxs form) and
 * shared by NT tokens; every token's accumulators see exactly the fused multiply-adds and the final
 * reduction its one-token call performs, so the results are bit-identical to NT one-token calls. */
#if defined(__AVX2__) && defined(__FMA__)
#define Q2K_MULTI(NT)                                                                                           \
    static void dot_q2_k_x##NT(const uint8_t *row, const float *X, int64_t ldx, int64_t n, float *Y,          \
                               int64_t ldy) {                                                                  \
        __m256 a0[NT], a1[NT];                                                                                 \
        for (int k = 0; k < NT; k++) a0[k] = a1[k] = _mm256_setzero_ps();                                      \
        const __m256i three = _mm256_set1_epi32(3);                                                            \
        for (int64_t b = 0; b < n / 256; b++) {                                                                \
            const uint8_t *blk = row + 84 * b, *sc = blk, *qs = blk + 16;                                      \
            const float d = ds4_half((uint16_t)(blk[80] | (blk[81] << 8)));                                    \
            const float dmin = ds4_half((uint16_t)(blk[82] | (blk[83] << 8)));                                 \
            for (int h = 0; h < 2; h++)                                                                        \
                for (int j = 0; j < 4; j++)                                                                    \
                    for (int half = 0; half < 2; half++) {                                                     \
                        const int sb = 8 * h + 2 * j + half;                                                   \
                        const __m256 dl = _mm256_set1_ps(d * (float)(sc[sb] & 15));                            \
                        const __m256 ml = _mm256_set1_ps(dmin * (float)(sc[sb] >> 4));                         \
                        const uint8_t *q = qs + 32 * h + 16 * half;                                            \
                        const int64_t xo = 256 * b + 128 * h + 32 * j + 16 * half;                             \
                        const __m128i sh = _mm_cvtsi32_si128(2 * j);                                           \
                        __m256i c0 = _mm256_and_si256(                                                         \
                            _mm256_srl_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q)), sh), three); \
                        __m256i c1 = _mm256_and_si256(                                                         \
                            _mm256_srl_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8))), sh), \
                            three);                                                                            \
                        __m256 w0 = _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(c0)), ml);              \
                        __m256 w1 = _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(c1)), ml);              \
                        for (int k = 0; k < NT; k++) {                                                         \
                            const float *xs = X + k * ldx + xo;                                                \
                            a0[k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs), a0[k]);                           \
                            a1[k] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xs + 8), a1[k]);                       \
                        }                                                                                      \
                    }                                                                                          \
        }                                                                                                      \
        for (int k = 0; k < NT; k++) Y[k * ldy] = hsum16_256(a0[k], a1[k]);                                   \
    }
Q2K_MULTI(8)
Q2K_MULTI(7)
Q2K_MULTI(6)
Q2K_MULTI(5)
Q2K_MULTI(4)
Q2K_MULTI(3)
Q2K_MULTI(2)
#define Q2K_GROUPS 1
#endif

#if defined(__AVX512F__)
#define IQ2_MULTI(NT)                                                                                           \
    static void dot_iq2_xxs_x##NT(const uint8_t *row, const float *X, int64_t ldx, int64_t n, float *Y,       \
                                  int64_t ldy) {                                                               \
        __m512 acc[NT];                                                                                        \
        for (int k = 0; k < NT; k++) acc[k] = _mm512_setzero_ps();                                             \
        for (int64_t b = 0; b < n / 256; b++) {                                                                \
            const uint8_t *blk = row + 66 * b;                                                                 \
            const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));                                      \
            for (int ib = 0; ib < 8; ib++) {                                                                   \
                const uint8_t *g = blk + 2 + 8 * ib;                                                           \
                uint32_t w = (uint32_t)g[4] | ((uint32_t)g[5] << 8) | ((uint32_t)g[6] << 16) |                 \
                             ((uint32_t)g[7] << 24);                                                           \
                const __m512 db = _mm512_set1_ps(d * (0.5f + (float)(w >> 28)) * 0.25f);                       \
                for (int kk = 0; kk < 4; kk += 2) {                                                            \
                    __m512 grid = _mm512_insertf32x8(                                                          \
                        _mm512_castps256_ps512(_mm256_loadu_ps(ds4_iq2xxs_grid_f[g[kk]])),                     \
                        _mm256_loadu_ps(ds4_iq2xxs_grid_f[g[kk + 1]]), 1);                                     \
                    __m512 sign = _mm512_insertf32x8(                                                          \
                        _mm512_castps256_ps512(_mm256_loadu_ps(ds4_iq2xxs_sign_f[(w >> (7 * kk)) & 127])),     \
                        _mm256_loadu_ps(ds4_iq2xxs_sign_f[(w >> (7 * (kk + 1))) & 127]), 1);                   \
                    const __m512 wv = _mm512_mul_ps(_mm512_mul_ps(db, grid), sign);                            \
                    const int64_t xo = 256 * b + 32 * ib + 8 * kk;                                             \
                    for (int k = 0; k < NT; k++)                                                               \
                        acc[k] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(X + k * ldx + xo), acc[k]);               \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int k = 0; k < NT; k++)                                                                           \
            Y[k * ldy] = hsum16_256(_mm512_castps512_ps256(acc[k]), _mm512_extractf32x8_ps(acc[k], 1));         \
    }
IQ2_MULTI(8)
IQ2_MULTI(7)
IQ2_MULTI(6)
IQ2_MULTI(5)
IQ2_MULTI(4)
IQ2_MULTI(3)
IQ2_MULTI(2)
#define IQ2_GROUPS 1
#elif defined(__AVX2__) && defined(__FMA__)
#define IQ2_MULTI(NT)                                                                                           \
    static void dot_iq2_xxs_x##NT(const uint8_t *row, const float *X, int64_t ldx, int64_t n, float *Y,       \
                                  int64_t ldy) {                                                               \
        __m256 a0[NT], a1[NT];                                                                                 \
        for (int k = 0; k < NT; k++) a0[k] = a1[k] = _mm256_setzero_ps();                                      \
        for (int64_t b = 0; b < n / 256; b++) {                                                                \
            const uint8_t *blk = row + 66 * b;                                                                 \
            const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));                                      \
            for (int ib = 0; ib < 8; ib++) {                                                                   \
                const uint8_t *g = blk + 2 + 8 * ib;                                                           \
                uint32_t w = (uint32_t)g[4] | ((uint32_t)g[5] << 8) | ((uint32_t)g[6] << 16) |                 \
                             ((uint32_t)g[7] << 24);                                                           \
                const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(w >> 28)) * 0.25f);                       \
                for (int kk = 0; kk < 4; kk += 2) {                                                            \
                    __m256 w0 = _mm256_mul_ps(_mm256_mul_ps(db, _mm256_loadu_ps(ds4_iq2xxs_grid_f[g[kk]])),    \
                                              _mm256_loadu_ps(ds4_iq2xxs_sign_f[(w >> (7 * kk)) & 127]));      \
                    __m256 w1 = _mm256_mul_ps(_mm256_mul_ps(db, _mm256_loadu_ps(ds4_iq2xxs_grid_f[g[kk + 1]])), \
                                              _mm256_loadu_ps(ds4_iq2xxs_sign_f[(w >> (7 * (kk + 1))) & 127])); \
                    const int64_t xo = 256 * b + 32 * ib + 8 * kk;                                             \
                    for (int k = 0; k < NT; k++) {                                                             \
                        a0[k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(X + k * ldx + xo), a0[k]);                 \
                        a1[k] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(X + k * ldx + xo + 8), a1[k]);             \
                    }                                                                                          \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int k = 0; k < NT; k++) Y[k * ldy] = hsum16_256(a0[k], a1[k]);                                   \
    }
IQ2_MULTI(8)
IQ2_MULTI(7)
IQ2_MULTI(6)
IQ2_MULTI(5)
IQ2_MULTI(4)
IQ2_MULTI(3)
IQ2_MULTI(2)
#define IQ2_GROUPS 1
#endif

/* Rows r0..r1 of a 2-bit matrix: tokens in groups of up to 8 sharing each row's weights (a group of
 * one is the one-token kernel). */
#define GROUPED_ROWS(FN, ONE, P)                                                                           \
    void FN(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, int64_t cols, const float *X,      \
            int64_t ldx, int64_t n_tok, float *Y, int64_t ldy) {                                           \
        for (int64_t r = r0; r < r1; r++) {                                                                \
            const uint8_t *row = W + (size_t)r * row_bytes;                                                \
            float *y = Y + r;                                                                              \
            for (int64_t k = 0; k < n_tok;) {                                                              \
                const int64_t nt = n_tok - k < 8 ? n_tok - k : 8;                                          \
                const float *x = X + k * ldx;                                                              \
                float *yk = y + k * ldy;                                                                   \
                switch (nt) {                                                                              \
                case 8: P##8(row, x, ldx, cols, yk, ldy); break;                                           \
                case 7: P##7(row, x, ldx, cols, yk, ldy); break;                                           \
                case 6: P##6(row, x, ldx, cols, yk, ldy); break;                                           \
                case 5: P##5(row, x, ldx, cols, yk, ldy); break;                                           \
                case 4: P##4(row, x, ldx, cols, yk, ldy); break;                                           \
                case 3: P##3(row, x, ldx, cols, yk, ldy); break;                                           \
                case 2: P##2(row, x, ldx, cols, yk, ldy); break;                                           \
                default: yk[0] = ONE(row, x, cols);                                                        \
                }                                                                                          \
                k += nt;                                                                                   \
            }                                                                                              \
        }                                                                                                  \
    }

#ifdef Q2K_GROUPS
GROUPED_ROWS(ds4_cpu_dot_q2_k, dot_q2_k, dot_q2_k_x)
#else
ROWS_OF(ds4_cpu_dot_q2_k, dot_q2_k)
#endif
#ifdef IQ2_GROUPS
GROUPED_ROWS(ds4_cpu_dot_iq2_xxs, dot_iq2_xxs, dot_iq2_xxs_x)
#else
ROWS_OF(ds4_cpu_dot_iq2_xxs, dot_iq2_xxs)
#endif

#if defined(__AVX512F__)
/* One-block rows (32 columns, e.g. the DSpark Markov head W2 [V, rank 32]) against one token, 16 rows
 * at a time.  Each row goes through exactly the one-token operations for n = 32: w = d * q, the
 * fused multiply-add of w * x into zero lanes, the 16 + 16 pairing, then the fixed reduction
 * 16 -> 8 -> 4 -> 2 -> 1; the reduction runs on the 16 rows together (each step pairs the same lanes
 * as the one-row form, with shuffles moving two rows' halves side by side), so the bits are the same
 * and a row costs a dozen instructions instead of a horizontal sum of its own. */
static void q8_0_rows32(const uint8_t *W, size_t row_bytes, int64_t r, const float *x, float *y) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16), zero = _mm512_setzero_ps();
    const uint8_t *base = W + (size_t)r * row_bytes;
    __m512 u[16];
    for (int i = 0; i < 16; i++) { /* the 16 + 16 pairing of row i */
        const uint8_t *blk = base + (size_t)i * row_bytes;
        const __m512 d = q8_0_scale(blk);
        const __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))));
        const __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))));
        u[i] = _mm512_add_ps(_mm512_fmadd_ps(w0, x0, zero), _mm512_fmadd_ps(w1, x1, zero));
    }
    __m512 c[8], g[4], k[2];
    for (int p = 0; p < 8; p++) /* s8[j] = u[j] + u[j + 8]: rows 2p, 2p+1 in 128-bit chunks 0-1, 2-3 */
        c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * p], u[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(u[2 * p], u[2 * p + 1], 0xEE));
    for (int q = 0; q < 4; q++) /* s4[j] = s8[j] + s8[j + 4]: rows 4q .. 4q+3, one chunk each */
        g[q] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * q], c[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * q], c[2 * q + 1], 0xDD));
    for (int m = 0; m < 2; m++) /* s2[j] = s4[j] + s4[j + 2]: chunk i holds rows 8m+i and 8m+4+i */
        k[m] = _mm512_add_ps(_mm512_shuffle_ps(g[2 * m], g[2 * m + 1], 0x44),
                             _mm512_shuffle_ps(g[2 * m], g[2 * m + 1], 0xEE));
    /* s2[0] + s2[1]: lane 4i + k holds row i + 4k */
    const __m512 sum = _mm512_add_ps(_mm512_shuffle_ps(k[0], k[1], 0x88), _mm512_shuffle_ps(k[0], k[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(y, _mm512_permutexvar_ps(order, sum));
}
#elif defined(__AVX2__) && defined(__FMA__)
/* The same for the AVX2 one-token form (q8_0_tokens above), 8 rows at a time: each row's
 * w = d * q in four 8-lane vectors a0..a3, the fused multiply-adds into zero lanes, acc[j] +=
 * acc[j + 16] (the 16 lanes a0 + a2 | a1 + a3), then hsum's order: s8 = (a0 + a2) + (a1 + a3),
 * s4 = s8[j] + s8[j + 4], (s4[0] + s4[2]) + (s4[1] + s4[3]), with the 8 rows' lanes moved side by
 * side by shuffles.  The same additions of the same operands, so the same values (a NaN's payload
 * aside, which the compiler's operand order picks on either path; tools/cpu_notes.md, 2026-12-06
 * (seventh): the Markov head under f32 activations 107 -> 56 us). */
static void q8_0_rows8(const uint8_t *W, size_t row_bytes, int64_t r, const float *x, float *y) {
    __m256 xv[4];
    for (int j = 0; j < 4; j++) xv[j] = _mm256_loadu_ps(x + 8 * j);
    const __m256 zero = _mm256_setzero_ps();
    const uint8_t *base = W + (size_t)r * row_bytes;
    __m256 v[8];
    for (int i = 0; i < 8; i++) { /* s8 of row i */
        const uint8_t *blk = base + (size_t)i * row_bytes;
        const __m256 d = q8_0_scale8(blk);
        __m256 a[4];
        for (int j = 0; j < 4; j++)
            a[j] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                        _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * j))))),
                                   xv[j], zero);
        v[i] = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    }
    __m256 t[4], m[2];
    for (int p = 0; p < 4; p++) /* s4: row 2p in lanes 0-3, row 2p+1 in lanes 4-7 */
        t[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
    for (int q = 0; q < 2; q++) /* s4[0] + s4[2], s4[1] + s4[3]: rows 4q, 4q+2 (low half), 4q+1, 4q+3 (high) */
        m[q] = _mm256_add_ps(_mm256_shuffle_ps(t[2 * q], t[2 * q + 1], 0x44),
                             _mm256_shuffle_ps(t[2 * q], t[2 * q + 1], 0xEE));
    /* their sum: low half rows 0, 2, 4, 6, high half rows 1, 3, 5, 7 */
    const __m256 sum = _mm256_add_ps(_mm256_shuffle_ps(m[0], m[1], 0x88), _mm256_shuffle_ps(m[0], m[1], 0xDD));
    _mm256_storeu_ps(y, _mm256_permutevar8x32_ps(sum, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#endif

void ds4_cpu_dot_q8_0(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, int64_t cols, const float *X,
                      int64_t ldx, int64_t n_tok, float *Y, int64_t ldy) {
#if defined(__AVX512F__)
    if (cols == 32 && n_tok == 1)
        for (; r0 + 16 <= r1; r0 += 16) q8_0_rows32(W, row_bytes, r0, X, Y + r0);
#elif defined(__AVX2__) && defined(__FMA__)
    if (cols == 32 && n_tok == 1)
        for (; r0 + 8 <= r1; r0 += 8) q8_0_rows8(W, row_bytes, r0, X, Y + r0);
#endif
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = W + (size_t)r * row_bytes;
        for (int64_t k = 0; k < n_tok;) { /* tokens in groups of up to Q8_MAXNT sharing the row's weights */
            const int nt = (int)(n_tok - k < Q8_MAXNT ? n_tok - k : Q8_MAXNT);
            q8_0_group[nt](row, X + k * ldx, ldx, cols, Y + k * ldy + r, ldy);
            k += nt;
        }
    }
}

/* ---- 8-bit activations (the `activations = q8` numerics option; spec ds4.md §2.9.5) -------------
 *
 * An activation row is quantised in blocks of 32: d = max|x| / 127, q = round(x * (1 / d)) (ties away
 * from zero; q = 0 when d = 0).  A weight row is seen as 32-wide blocks of small integers w (Q8_0: its
 * int8 codes; IQ2_XXS: grid value times sign; Q2_K: sub-block scale times 2-bit code) with float
 * scales.  For block b of a weight row and an activation row:
 *   I_b = sum of the 32 products w * q, exact in int32 (any summation order gives the same integer);
 *   Q8_0, IQ2_XXS: p_b = (s_b * d_b) * (float)I_b, s_b the block's weight scale;
 *   Q2_K:          p_b = (D * d_b) * (float)I_b - (M * d_b) * (float)J_b, D and M the super-block's d
 *                  and dmin, J_b = sum over the block's two 16-wide sub-blocks of min code * sum of q;
 *   8 float accumulators, a[b % 8] += p_b in block order, then ((a0 + a4) + (a2 + a6)) +
 *   ((a1 + a5) + (a3 + a7)).
 * Every step is a separate float32 rounding (no fused multiply-add), so the AVX-512 VNNI, AVX-VNNI,
 * AVX2 and portable paths give the same bits, a token's result never depends on the batch, and the
 * numpy reference simulates it exactly (ds4tui/engine/quants.py: matmul_q8).
 *
 * Kernel: a weight row is decoded once (Q8_0 is read in place), then 8 blocks at a time are
 * transposed so that 32-bit lane i of vector j holds bytes 4j..4j+3 of block i; the activation rows
 * are stored in the same layout once per call.  Eight chained 4-byte dot products (VNNI vpdpbusd, or
 * AVX2 maddubs + madd) then leave I_b of 8 blocks in the 8 lanes, and one vector multiply scales them:
 * each token of a verify or prefill group costs about one integer instruction per block. */

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <pthread.h>
#include <stdlib.h>

void ds4_cpu_quantize_q8_act(const float *x, int64_t n, int8_t *q, float *d) {
    int64_t b = 0;
#if defined(__AVX512F__)
    /* the same operations 16 lanes at a time: max |x| (exact in any order), d = amax / 127,
     * v = x * (1 / d), rounded half away from zero as trunc(v) + sign(v) where |v - trunc(v)| >= 0.5
     * (the subtraction is exact), clamped to +-127 */
    const __m512 half = _mm512_set1_ps(0.5f), lim = _mm512_set1_ps(127.0f), one = _mm512_set1_ps(1.0f);
    const __m512i sgn = _mm512_set1_epi32((int)0x80000000u);
    for (; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        const __m512 vid = _mm512_set1_ps(id);
        for (int h = 0; h < 2; h++) {
            const __m512 v = _mm512_mul_ps(h ? x1 : x0, vid);
            const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), half, _CMP_GE_OQ);
            const __m512 sv = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), sgn),
                                                                  _mm512_castps_si512(one)));
            __m512 r = _mm512_mask_add_ps(t, up, t, sv);
            r = _mm512_min_ps(_mm512_max_ps(r, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
            _mm_storeu_si128((__m128i *)(q + 32 * b + 16 * h), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
        }
    }
#elif defined(__AVX2__)
    /* the same operations 8 lanes at a time (max |x| keeps the running maximum where x is NaN, as the
     * scalar loop's `a > amax` does); the codes are whole numbers in [-127, 127], so the saturating
     * packs to int16 and int8 are exact */
    const __m256 half = _mm256_set1_ps(0.5f), lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    const __m256 one = _mm256_set1_ps(1.0f), sgn = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 xv[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) xv[i] = _mm256_loadu_ps(xb + 8 * i), m = _mm256_max_ps(_mm256_andnot_ps(sgn, xv[i]), m);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i r[4];
        for (int i = 0; i < 4; i++) {
            const __m256 v = _mm256_mul_ps(xv[i], vid);
            const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sgn, _mm256_sub_ps(v, t)), half, _CMP_GE_OQ);
            const __m256 sv = _mm256_or_ps(_mm256_and_ps(v, sgn), one);
            __m256 rv = _mm256_add_ps(t, _mm256_and_ps(up, sv));
            rv = _mm256_min_ps(_mm256_max_ps(rv, nlim), lim);
            r[i] = _mm256_cvtps_epi32(rv);
        }
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), _mm256_permutevar8x32_epi32(p, order));
    }
#endif
    for (; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(xb[j]);
            if (a > amax) amax = a;
        }
        const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        for (int j = 0; j < 32; j++) {
            float v = roundf(xb[j] * id);
            q[32 * b + j] = (int8_t)(v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v));
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define Q8_VNNI 1
#define Q8_DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define Q8_VNNI 1
#define Q8_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#endif
#if defined(Q8_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define Q8_ZMM 1 /* two rows at once in 512-bit vectors */
#endif
#if defined(__AVX2__)
#define Q8_AVX2 1
/* the 8 x 8 transpose of 32-bit lanes: r[i] = block i (8 lanes) -> c[j] lane i = lane j of block i */
static inline void q8_transpose(const __m256i r[8], __m256i c[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        c[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
        c[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
    }
}

static inline float q8_hsum8(__m256 a) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
#endif

/* I of one block (32 int8 weights against 32 int8 activations), exact. */
static inline int32_t q8_isum(const int8_t *w, const int8_t *x) {
#if defined(Q8_AVX2)
    const __m256i vw = _mm256_loadu_si256((const __m256i *)w), vx = _mm256_loadu_si256((const __m256i *)x);
    const __m256i l = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(vw, vw), _mm256_sign_epi8(vx, vw)),
                                        _mm256_set1_epi16(1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
#else
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)w[j] * (int32_t)x[j];
    return s;
#endif
}

size_t ds4_cpu_q8_act_bytes(int64_t cols, int64_t n_tok) {
    const int64_t nb = cols / 32;
    return (size_t)n_tok * ((size_t)cols * 5 + (size_t)nb * 5 * (sizeof(float) + 2 * sizeof(int16_t))) + 9 * 64;
}

void ds4_cpu_q8_act_prepare(const float *X, int64_t ldx, int64_t n_tok, int64_t cols, void *buf, ds4_q8_act *a) {
    const int64_t nb = cols / 32;
    uintptr_t p = ((uintptr_t)buf + 63) & ~(uintptr_t)63;
    a->cols = cols, a->nb = nb;
    a->xt = (const uint8_t *)p, p += (size_t)n_tok * (size_t)cols;
    a->q = (const int8_t *)p, p += (size_t)n_tok * (size_t)cols;
    p = (p + 63) & ~(uintptr_t)63;
    a->d = (const float *)p, p += (size_t)n_tok * (size_t)nb * sizeof(float);
    p = (p + 63) & ~(uintptr_t)63;
    a->bs = (const int16_t *)p, p += (size_t)n_tok * (size_t)nb * 2 * sizeof(int16_t);
    p = (p + 63) & ~(uintptr_t)63;
    a->xz = (const uint8_t *)p, p += (size_t)n_tok * (size_t)cols * 2;
    p = (p + 63) & ~(uintptr_t)63;
    a->dz = (const float *)p, p += (size_t)n_tok * (size_t)nb * 2 * sizeof(float);
    p = (p + 63) & ~(uintptr_t)63;
    a->bz = (const int32_t *)p, p += (size_t)n_tok * (size_t)nb * 2 * sizeof(int32_t);
    p = (p + 63) & ~(uintptr_t)63;
    a->cz = (const int32_t *)p, p += (size_t)n_tok * (size_t)nb * 2 * sizeof(int32_t);
    p = (p + 63) & ~(uintptr_t)63;
    a->xq = (const int8_t *)p, p += (size_t)n_tok * (size_t)cols;
    p = (p + 63) & ~(uintptr_t)63;
    a->cq = (const int32_t *)p;
#if !defined(Q8_ZMM)
    a->xz = NULL, a->dz = NULL, a->bz = NULL, a->cz = NULL, a->xq = NULL, a->cq = NULL;
#endif
    for (int64_t t = 0; t < n_tok; t++) {
        int8_t *q = (int8_t *)a->q + t * cols;
        float *d = (float *)a->d + t * nb;
        int16_t *bs = (int16_t *)a->bs + t * 2 * nb;
        ds4_cpu_quantize_q8_act(X + t * ldx, cols, q, d);
        for (int64_t b = 0; b < nb; b++)
            for (int h = 0; h < 2; h++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += q[32 * b + 16 * h + j];
                bs[2 * b + h] = (int16_t)s;
            }
#if defined(Q8_AVX2)
        uint8_t *xt = (uint8_t *)a->xt + t * cols;
        for (int64_t g = 0; g + 8 <= nb; g += 8) {
            __m256i r[8], c[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(q + 32 * (g + i)));
            q8_transpose(r, c);
            for (int j = 0; j < 8; j++) {
#if defined(Q8_ZMM) /* [blocks 0-3 | blocks 0-3 | blocks 4-7 | blocks 4-7] for the two-row kernel, signed q:
                     * there the weights are the unsigned operand of vpdpbusd */
                const __m512i z = _mm512_castsi256_si512(c[j]);
                _mm512_storeu_si512((void *)(a->xz + t * 2 * cols + 64 * (g + j)), _mm512_shuffle_i64x2(z, z, 0x50));
#endif
#if defined(Q8_VNNI) /* unsigned q + 128 for vpdpbusd (the weights' sum, times 128, is taken off again) */
                c[j] = _mm256_xor_si256(c[j], _mm256_set1_epi8((char)0x80));
#endif
                _mm256_storeu_si256((__m256i *)(xt + 32 * (g + j)), c[j]);
            }
#if defined(Q8_ZMM)
            const __m512 dd = _mm512_castps256_ps512(_mm256_loadu_ps(d + g));
            _mm512_storeu_ps((float *)a->dz + t * 2 * nb + 2 * g, _mm512_shuffle_f32x4(dd, dd, 0x50));
            const __m512i bb = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(bs + 2 * g)));
            _mm512_storeu_si512((void *)(a->bz + t * 2 * nb + 2 * g), _mm512_shuffle_i64x2(bb, bb, 0x50));
            /* -128 * each block's sum of q: the offset that weights made unsigned (w + 128) add */
            const __m256i bsum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(bs + 2 * g)), _mm256_set1_epi16(-128));
            const __m512i cc = _mm512_castsi256_si512(bsum);
            _mm512_storeu_si512((void *)(a->cz + t * 2 * nb + 2 * g), _mm512_shuffle_i64x2(cc, cc, 0x50));
            /* the qword layout of the 2-bit rows (q8_pair_body's qw path): for k < 4, 64 bytes whose qword i is q
             * of block g + i, bytes 8k .. 8k + 7; and -128 * block i's sum in lane 2i (lane 2i + 1: 0) */
            const __m512i L0 = _mm512_loadu_si512((const void *)(q + 32 * g)), L1 = _mm512_loadu_si512((const void *)(q + 32 * g + 64));
            const __m512i L2 = _mm512_loadu_si512((const void *)(q + 32 * g + 128)), L3 = _mm512_loadu_si512((const void *)(q + 32 * g + 192));
            int8_t *xq = (int8_t *)a->xq + t * cols + 32 * g;
            for (int k = 0; k < 4; k++) {
                const __m512i ik = _mm512_setr_epi64(k, 4 + k, 8 + k, 12 + k, k, 4 + k, 8 + k, 12 + k);
                const __m512i lo = _mm512_permutex2var_epi64(L0, ik, L1), hi = _mm512_permutex2var_epi64(L2, ik, L3);
                _mm512_storeu_si512((void *)(xq + 64 * k), _mm512_shuffle_i64x2(lo, hi, 0x44));
            }
            _mm512_storeu_si512((void *)(a->cq + t * 2 * nb + 2 * g), _mm512_cvtepu32_epi64(bsum));
#endif
        }
#endif
    }
}

/* A weight row as the q8 arithmetic sees it: 32-wide blocks of int8 (block b at w + b * stride), the
 * block scales s (Q8_0: d; IQ2_XXS: d * (0.5 + scale) / 4; Q2_K: d) and, for Q2_K, dmin per block and
 * the two sub-blocks' min codes. */
typedef struct {
    const int8_t *w;
    const uint8_t *q80; /* the Q8_0 row itself (its scales are read in place), else NULL */
    int tr;             /* 1: w holds 8-block groups already transposed (256 bytes a group: vector j at 32 j);
                         * 2: in the qword layout (qword i of 64 bytes k: block i's codes 8k..8k+7), w + 128 where signed */
    int64_t stride;
    float *s, *m;
    int16_t *mn;
    int8_t *buf;
} q8_wrow;

static pthread_key_t q8w_key;
static pthread_once_t q8w_once = PTHREAD_ONCE_INIT;
static void q8w_free(void *p) { free(p); }
static void q8w_key_init(void) { pthread_key_create(&q8w_key, q8w_free); }

/* The calling thread's scratch for 8 rows of `cols` columns (grown as needed, freed with the thread). */
static int q8_wrow_alloc(q8_wrow r[8], int64_t cols) {
    pthread_once(&q8w_once, q8w_key_init);
    const int64_t nb = cols / 32;
    const size_t one = ((size_t)cols + (size_t)nb * (2 * sizeof(float) + 2 * sizeof(int16_t)) + 63) & ~(size_t)63;
    const size_t need = 8 * one + 64 + sizeof(size_t) * 8;
    size_t *h = pthread_getspecific(q8w_key);
    if (!h || h[0] < need) {
        size_t *n = realloc(h, need);
        if (!n) return -1;
        n[0] = need;
        if (pthread_setspecific(q8w_key, n) != 0) { free(n); return -1; }
        h = n;
    }
    const uintptr_t base = ((uintptr_t)(h + 8) + 63) & ~(uintptr_t)63;
    for (int i = 0; i < 8; i++) {
        uintptr_t p = base + i * one;
        r[i].buf = (int8_t *)p, p += (size_t)cols;
        r[i].s = (float *)p, p += (size_t)nb * sizeof(float);
        r[i].m = (float *)p, p += (size_t)nb * sizeof(float);
        r[i].mn = (int16_t *)p;
    }
    return 0;
}

static void q8_decode_q8_0(const uint8_t *row, int64_t nb, q8_wrow *r, int scales) {
    r->w = (const int8_t *)(row + 2), r->stride = 34, r->q80 = row, r->tr = 0;
    if (!scales) return;
    int64_t b = 0;
#if defined(Q8_AVX2) && defined(__F16C__)
    /* 8 scales at once (F16C converts exactly: the same values as ds4_half) */
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *p = row + 34 * b;
        uint16_t h[8];
        for (int i = 0; i < 8; i++) memcpy(&h[i], p + 34 * i, 2);
        _mm256_storeu_ps(r->s + b, _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3],
                                                                   (short)h[4], (short)h[5], (short)h[6], (short)h[7])));
    }
#endif
    for (; b < nb; b++) r->s[b] = ds4_half((uint16_t)(row[34 * b] | (row[34 * b + 1] << 8)));
}

/* IQ2_XXS: w = grid * sign (|w| <= 43) per byte; a sign mask m (0xff per negative byte) flips a byte as
 * (g ^ m) + (m & 1): grid bytes are 8..43, so no carry crosses a byte. */
#if defined(Q8_AVX2) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
/* Byte permutes of the IQ2_XXS vector decoding: the grid index of (group i, row k) to byte 8k + i;
 * the four 7-bit sign fields of each group (bits 32 + 7k of its qword); each byte's sign bit; the sign
 * byte (i, k) spread over qword i. */
static const uint8_t q8_iq2_gidx[64] = {
    0, 8, 16, 24, 32, 40, 48, 56, 1, 9, 17, 25, 33, 41, 49, 57, 2, 10, 18, 26, 34, 42, 50, 58, 3, 11, 19, 27,
    35, 43, 51, 59, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0,
};
/* The 8 group scales of an IQ2_XXS super-block (blk; D = its 8 group qwords), d * (0.5 + scale) * 0.25,
 * the same float32 operations as the portable decoding, 8 lanes at a time. */
static inline void q8_iq2_scales(const uint8_t *blk, __m512i D, float *s) {
    const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));
    const __m256i wv = _mm512_cvtepi64_epi32(_mm512_srli_epi64(D, 32));
    const __m256 ls = _mm256_cvtepi32_ps(_mm256_srli_epi32(wv, 28));
    _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_add_ps(_mm256_set1_ps(0.5f), ls)), _mm256_set1_ps(0.25f)));
}

/* Byte 16k + i = the grid index of (group i, row k) (byte 8i + k of the super-block's 8 qwords): after
 * the code bytes are looked up, unpacklo puts code (i, k) in word i of 128-bit lane k. */
static const uint8_t q8_iq2_gidx16[64] = {
    0, 8, 16, 24, 32, 40, 48, 56, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 17, 25, 33, 41, 49, 57, 0, 0, 0, 0, 0, 0, 0, 0,
    2, 10, 18, 26, 34, 42, 50, 58, 0, 0, 0, 0, 0, 0, 0, 0, 3, 11, 19, 27, 35, 43, 51, 59, 0, 0, 0, 0, 0, 0, 0, 0,
};
static const uint8_t q8_iq2_sidx[64] = {
    32, 39, 46, 53, 0, 0, 0, 0, 32, 39, 46, 53, 0, 0, 0, 0, 32, 39, 46, 53, 0, 0, 0, 0, 32, 39, 46, 53, 0, 0,
    0, 0, 32, 39, 46, 53, 0, 0, 0, 0, 32, 39, 46, 53, 0, 0, 0, 0, 32, 39, 46, 53, 0, 0, 0, 0, 32, 39, 46, 53,
    0, 0, 0, 0,
};
static const uint8_t q8_iq2_bits[64] = {
    1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32,
    64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4,
    8, 16, 32, 64, 128,
};
static const uint8_t q8_iq2_bk[4][64] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8,
     16, 16, 16, 16, 16, 16, 16, 16, 24, 24, 24, 24, 24, 24, 24, 24,
     32, 32, 32, 32, 32, 32, 32, 32, 40, 40, 40, 40, 40, 40, 40, 40,
     48, 48, 48, 48, 48, 48, 48, 48, 56, 56, 56, 56, 56, 56, 56, 56},
    {1, 1, 1, 1, 1, 1, 1, 1, 9, 9, 9, 9, 9, 9, 9, 9,
     17, 17, 17, 17, 17, 17, 17, 17, 25, 25, 25, 25, 25, 25, 25, 25,
     33, 33, 33, 33, 33, 33, 33, 33, 41, 41, 41, 41, 41, 41, 41, 41,
     49, 49, 49, 49, 49, 49, 49, 49, 57, 57, 57, 57, 57, 57, 57, 57},
    {2, 2, 2, 2, 2, 2, 2, 2, 10, 10, 10, 10, 10, 10, 10, 10,
     18, 18, 18, 18, 18, 18, 18, 18, 26, 26, 26, 26, 26, 26, 26, 26,
     34, 34, 34, 34, 34, 34, 34, 34, 42, 42, 42, 42, 42, 42, 42, 42,
     50, 50, 50, 50, 50, 50, 50, 50, 58, 58, 58, 58, 58, 58, 58, 58},
    {3, 3, 3, 3, 3, 3, 3, 3, 11, 11, 11, 11, 11, 11, 11, 11,
     19, 19, 19, 19, 19, 19, 19, 19, 27, 27, 27, 27, 27, 27, 27, 27,
     35, 35, 35, 35, 35, 35, 35, 35, 43, 43, 43, 43, 43, 43, 43, 43,
     51, 51, 51, 51, 51, 51, 51, 51, 59, 59, 59, 59, 59, 59, 59, 59},
};
#endif

static void q8_decode_iq2_xxs(const uint8_t *row, int64_t nb, q8_wrow *r, int qw) {
    r->w = r->buf, r->stride = 32, r->q80 = NULL, r->tr = 0;
    (void)qw;
#if defined(Q8_ZMM) && defined(__AVX512VBMI__) && defined(__AVX512BITALG__)
    if (qw) {
        /* the qword layout, w + 128 (q8_pair_body's qw path): each grid index's 2-bit codes looked up as two bytes
         * (ds4_iq2xxs_grid16_lo / _hi, 128 entries a byte permute), the codes spread to bytes by
         * multishift and mapped to 128 + 8/25/43 by a byte permute; a negative weight is 0 - (128 + g),
         * i.e. 128 - g, under the sign mask that bitshuffle takes from the ksigns byte */
        r->tr = 2;
        __m512i TL[4], TH[4];
        for (int i = 0; i < 4; i++) {
            TL[i] = _mm512_loadu_si512((const void *)(ds4_iq2xxs_grid16_lo + 64 * i));
            TH[i] = _mm512_loadu_si512((const void *)(ds4_iq2xxs_grid16_hi + 64 * i));
        }
        const __m512i K0 = _mm512_loadu_si512((const void *)ds4_iq2xxs_ksigns), K1 = _mm512_loadu_si512((const void *)(ds4_iq2xxs_ksigns + 64));
        const __m512i gidx = _mm512_loadu_si512((const void *)q8_iq2_gidx16), sidx = _mm512_loadu_si512((const void *)q8_iq2_sidx);
        const __m512i shifts = _mm512_set1_epi64(0x0e0c0a0806040200ll);
        const __m512i vals = _mm512_set1_epi32((int)0x80ab9988); /* byte j: 128 + (8, 25, 43, 0)[j & 3] */
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *blk = row + 66 * sb;
            const __m512i D = _mm512_loadu_si512((const void *)(blk + 2)); /* qword i = group i */
            q8_iq2_scales(blk, D, r->s + 8 * sb);
            /* byte 16k + i: grid index k of group i; its code's low and high bytes; then as words, code
             * (i, k) in word i of 128-bit lane k */
            const __m512i gb = _mm512_permutexvar_epi8(gidx, D);
            const __mmask64 up = _mm512_movepi8_mask(gb);
            const __m512i L = _mm512_mask_blend_epi8(up, _mm512_permutex2var_epi8(TL[0], gb, TL[1]), _mm512_permutex2var_epi8(TL[2], gb, TL[3]));
            const __m512i H = _mm512_mask_blend_epi8(up, _mm512_permutex2var_epi8(TH[0], gb, TH[1]), _mm512_permutex2var_epi8(TH[2], gb, TH[3]));
            const __m512i codes = _mm512_unpacklo_epi8(L, H);
            /* byte 8i + k = ksigns of sign field k of group i */
            const __m512i sg = _mm512_permutex2var_epi8(K0, _mm512_and_si512(_mm512_multishift_epi64_epi8(sidx, D), _mm512_set1_epi8(127)), K1);
            int8_t *out = r->buf + 256 * sb;
            for (int k = 0; k < 4; k++) {
                /* qword i: code (i, k) in its low word (the other words are not read) */
                const __m512i c16 = _mm512_permutexvar_epi16(_mm512_add_epi64(_mm512_set1_epi64(8 * k), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7)), codes);
                const __m512i g = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shifts, c16), vals);
                const __mmask64 neg = _mm512_bitshuffle_epi64_mask(sg, _mm512_set1_epi64(0x0706050403020100ll + 0x0808080808080808ll * k));
                _mm512_storeu_si512((void *)(out + 64 * k), _mm512_mask_sub_epi8(g, neg, _mm512_setzero_si512(), g));
            }
        }
        return;
    }
#endif
#if defined(Q8_AVX2) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
    /* all 32 grid rows of a super-block at once: the grid as 2-bit codes (ds4_iq2xxs_grid16) looked
     * up by word permutes, expanded to bytes by multishift, mapped to 8/25/43 by a byte shuffle; the
     * signs' ksigns looked up by a byte permute and spread to byte masks */
    r->tr = 1;
    __m512i T[8];
    for (int i = 0; i < 8; i++) T[i] = _mm512_loadu_si512((const void *)(ds4_iq2xxs_grid16 + 32 * i));
    const __m512i K0 = _mm512_loadu_si512((const void *)ds4_iq2xxs_ksigns), K1 = _mm512_loadu_si512((const void *)(ds4_iq2xxs_ksigns + 64));
    const __m512i gidx = _mm512_loadu_si512((const void *)q8_iq2_gidx), sidx = _mm512_loadu_si512((const void *)q8_iq2_sidx);
    const __m512i bits = _mm512_loadu_si512((const void *)q8_iq2_bits);
    __m512i bk[4];
    for (int k = 0; k < 4; k++) bk[k] = _mm512_loadu_si512((const void *)q8_iq2_bk[k]);
    const __m512i shifts = _mm512_set1_epi64(0x0e0c0a0806040200ll), three = _mm512_set1_epi8(3);
    const __m512i vals = _mm512_broadcast_i32x4(_mm_setr_epi8(8, 25, 43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const uint8_t *blk = row + 66 * sb;
        const __m512i D = _mm512_loadu_si512((const void *)(blk + 2)); /* qword i = group i */
        q8_iq2_scales(blk, D, r->s + 8 * sb);
        /* word 8k + i = grid code row of index byte k of group i */
        const __m512i gi = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(_mm512_permutexvar_epi8(gidx, D)));
        const __m512i lo = _mm512_permutex2var_epi16(T[0], gi, T[1]), mid = _mm512_permutex2var_epi16(T[2], gi, T[3]);
        const __m512i hi = _mm512_permutex2var_epi16(T[4], gi, T[5]), top = _mm512_permutex2var_epi16(T[6], gi, T[7]);
        const __mmask32 b6 = _mm512_test_epi16_mask(gi, _mm512_set1_epi16(64)), b7 = _mm512_test_epi16_mask(gi, _mm512_set1_epi16(128));
        const __m512i codes = _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, lo, mid), _mm512_mask_blend_epi16(b6, hi, top));
        /* byte 8i + k = ksigns of sign field k of group i */
        const __m512i sg = _mm512_permutex2var_epi8(K0, _mm512_and_si512(_mm512_multishift_epi64_epi8(sidx, D), _mm512_set1_epi8(127)), K1);
        int8_t *out = r->buf + 256 * sb;
        for (int k = 0; k < 4; k++) {
            const __m512i c16 = _mm512_cvtepu16_epi64(_mm512_extracti32x4_epi32(codes, k));
            const __m512i g = _mm512_shuffle_epi8(vals, _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, c16), three));
            const __m512i sk = _mm512_permutexvar_epi8(bk[k], sg); /* qword i: the sign byte (i, k) 8 times */
            const __m512i q = _mm512_mask_sub_epi8(g, _mm512_test_epi8_mask(sk, bits), _mm512_setzero_si512(), g);
            _mm256_storeu_si256((__m256i *)(out + 64 * k), _mm512_cvtepi64_epi32(q));
            _mm256_storeu_si256((__m256i *)(out + 64 * k + 32), _mm512_cvtepi64_epi32(_mm512_srli_epi64(q, 32)));
        }
    }
    return;
#elif defined(Q8_AVX2)
    /* straight into the transposed layout: the 8 groups of a super-block are the 8 blocks of a kernel
     * group; qword k of every block (grid row k with its signs) gives vectors 2k (low dwords) and
     * 2k + 1 (high dwords) */
    r->tr = 1;
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const uint8_t *blk = row + 66 * sb;
        const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));
        uint32_t w[8];
        for (int ib = 0; ib < 8; ib++) memcpy(&w[ib], blk + 2 + 8 * ib + 4, 4);
        { /* the 8 group scales d * (0.5 + scale) * 0.25, the same float32 operations 8 lanes at a time */
            const __m256 g0 = _mm256_loadu_ps((const float *)(blk + 2)), g1 = _mm256_loadu_ps((const float *)(blk + 34));
            const __m256i wv = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(g0, g1, 0xDD)), 0xD8);
            const __m256 ls = _mm256_cvtepi32_ps(_mm256_srli_epi32(wv, 28));
            _mm256_storeu_ps(r->s + 8 * sb, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_add_ps(_mm256_set1_ps(0.5f), ls)),
                                                          _mm256_set1_ps(0.25f)));
        }
        int8_t *out = r->buf + 256 * sb;
        for (int k = 0; k < 4; k++) {
            __m256i h[2];
            for (int q = 0; q < 2; q++) {
#define Q8_LD2(a, b) _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)(a))), (const double *)(b)))
                const uint8_t *gi = blk + 2 + 32 * q + k;
                const __m256i gv = _mm256_set_m128i(Q8_LD2(ds4_iq2xxs_grid[gi[16]], ds4_iq2xxs_grid[gi[24]]),
                                                    Q8_LD2(ds4_iq2xxs_grid[gi[0]], ds4_iq2xxs_grid[gi[8]]));
                const __m256i mv = _mm256_set_m128i(Q8_LD2(&ds4_iq2xxs_sign_mask[(w[4 * q + 2] >> (7 * k)) & 127],
                                                           &ds4_iq2xxs_sign_mask[(w[4 * q + 3] >> (7 * k)) & 127]),
                                                    Q8_LD2(&ds4_iq2xxs_sign_mask[(w[4 * q] >> (7 * k)) & 127],
                                                           &ds4_iq2xxs_sign_mask[(w[4 * q + 1] >> (7 * k)) & 127]));
#undef Q8_LD2
                h[q] = _mm256_sub_epi8(_mm256_xor_si256(gv, mv), mv); /* (g ^ m) - m: blocks 4q .. 4q + 3 */
            }
            const __m256 a = _mm256_castsi256_ps(h[0]), b = _mm256_castsi256_ps(h[1]);
            _mm256_storeu_si256((__m256i *)(out + 64 * k),
                                _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
            _mm256_storeu_si256((__m256i *)(out + 64 * k + 32),
                                _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
        }
    }
    return;
#endif
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const uint8_t *blk = row + 66 * sb;
        const float d = ds4_half((uint16_t)(blk[0] | (blk[1] << 8)));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *g = blk + 2 + 8 * ib;
            const uint32_t w = (uint32_t)g[4] | ((uint32_t)g[5] << 8) | ((uint32_t)g[6] << 16) | ((uint32_t)g[7] << 24);
            r->s[8 * sb + ib] = d * (0.5f + (float)(w >> 28)) * 0.25f;
            int8_t *out = r->buf + 32 * (8 * sb + ib);
            for (int k = 0; k < 4; k++) {
                uint64_t v;
                memcpy(&v, ds4_iq2xxs_grid[g[k]], 8);
                const uint64_t m = ds4_iq2xxs_sign_mask[(w >> (7 * k)) & 127];
                v = (v ^ m) + (m & 0x0101010101010101ull);
                memcpy(out + 8 * k, &v, 8);
            }
        }
    }
}

/* Q2_K: block 4h + j of a super-block has codes (qs[32h + l] >> 2j) & 3, l < 32, in sub-blocks
 * 8h + 2j (l < 16) and 8h + 2j + 1; w = (scale & 15) * code (<= 45), the min codes (scale >> 4) go
 * to mn. */
static void q8_decode_q2_k(const uint8_t *row, int64_t nb, q8_wrow *r, int qw) {
    r->w = r->buf, r->stride = 32, r->q80 = NULL, r->tr = 0;
#if defined(Q8_ZMM)
    if (qw) {
        /* the qword layout (q8_pair_body's qw path): for k < 4, qword i = 4h + j of 64 bytes is block i's codes
         * 8k .. 8k + 7, (qs qword 4h + k >> 2j) & 3 per byte, times the scale of sub-block 2i + (k >= 2) */
        r->tr = 2;
        const __m512i sh = _mm512_setr_epi64(0, 2, 4, 6, 0, 2, 4, 6), three = _mm512_set1_epi8(3);
        static const int16_t q8_q2k_sidx[32] = {0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6,
                                                 8, 8, 8, 8, 10, 10, 10, 10, 12, 12, 12, 12, 14, 14, 14, 14};
        const __m512i i0 = _mm512_loadu_si512((const void *)q8_q2k_sidx);
        const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(1)), nib = _mm512_set1_epi16(15);
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *blk = row + 84 * sb, *qs = blk + 16;
            const float d = ds4_half((uint16_t)(blk[80] | (blk[81] << 8)));
            const float dmin = ds4_half((uint16_t)(blk[82] | (blk[83] << 8)));
            const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)blk)); /* word 2i + h: sc[2i + h] */
            _mm256_storeu_si256((__m256i *)(r->mn + 16 * sb), _mm256_srli_epi16(sc16, 4));
            _mm256_storeu_ps(r->s + 8 * sb, _mm256_set1_ps(d));
            _mm256_storeu_ps(r->m + 8 * sb, _mm256_set1_ps(dmin));
            const __m512i scw = _mm512_and_si512(_mm512_castsi256_si512(sc16), nib);
            const __m512i s0 = _mm512_permutexvar_epi16(i0, scw), s1 = _mm512_permutexvar_epi16(i1, scw);
            const __m512i Q = _mm512_loadu_si512((const void *)qs);
            int8_t *out = r->buf + 256 * sb;
            for (int k = 0; k < 4; k++) {
                const __m512i v = _mm512_permutexvar_epi64(_mm512_setr_epi64(k, k, k, k, 4 + k, 4 + k, 4 + k, 4 + k), Q);
                const __m512i code = _mm512_and_si512(_mm512_srlv_epi64(v, sh), three);
                _mm512_storeu_si512((void *)(out + 64 * k), _mm512_mullo_epi16(code, k < 2 ? s0 : s1));
            }
        }
        return;
    }
#endif
    (void)qw;
#if defined(Q8_AVX2)
    /* straight into the transposed layout: lane i = 4h + j of vector jj holds bytes 4jj .. 4jj + 3 of
     * block (h, j), i.e. (qs dword (8h + jj) >> 2j) & 3 per byte, times the scale of sub-block
     * 8h + 2j + (jj >= 4) (a 16-bit multiply: code * scale <= 45 stays inside its byte) */
    r->tr = 1;
    const __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), three = _mm256_set1_epi8(3);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const uint8_t *blk = row + 84 * sb, *sc = blk, *qs = blk + 16;
        const float d = ds4_half((uint16_t)(blk[80] | (blk[81] << 8)));
        const float dmin = ds4_half((uint16_t)(blk[82] | (blk[83] << 8)));
        /* block i = 4h + j has sub-blocks 2i and 2i + 1: dword i of sc16 = sc[2i] | sc[2i + 1] << 8 */
        const __m256i sc16 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)sc));
        const __m256i nib = _mm256_set1_epi32(15);
        const __m256i lo = _mm256_and_si256(sc16, nib), hi = _mm256_and_si256(_mm256_srli_epi32(sc16, 8), nib);
        const __m256i vlo = _mm256_or_si256(lo, _mm256_slli_epi32(lo, 16)), vhi = _mm256_or_si256(hi, _mm256_slli_epi32(hi, 16));
        /* the min codes as int16 pairs (sc[2i] >> 4, sc[2i + 1] >> 4) */
        const __m256i mins = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(sc16, 4), nib),
                                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sc16, 12), nib), 16));
        _mm256_storeu_si256((__m256i *)(r->mn + 16 * sb), mins);
        _mm256_storeu_ps(r->s + 8 * sb, _mm256_set1_ps(d));
        _mm256_storeu_ps(r->m + 8 * sb, _mm256_set1_ps(dmin));
        const __m256i q0 = _mm256_loadu_si256((const __m256i *)qs), q1 = _mm256_loadu_si256((const __m256i *)(qs + 32));
        int8_t *out = r->buf + 256 * sb;
        for (int jj = 0; jj < 8; jj++) {
            const __m256i sel = _mm256_set1_epi32(jj);
            const __m256i v = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(q0, sel), _mm256_permutevar8x32_epi32(q1, sel), 0xF0);
            const __m256i code = _mm256_and_si256(_mm256_srlv_epi32(v, sh), three);
            _mm256_storeu_si256((__m256i *)(out + 32 * jj), _mm256_mullo_epi16(code, jj < 4 ? vlo : vhi));
        }
    }
    return;
#endif
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const uint8_t *blk = row + 84 * sb, *sc = blk, *qs = blk + 16;
        const float d = ds4_half((uint16_t)(blk[80] | (blk[81] << 8)));
        const float dmin = ds4_half((uint16_t)(blk[82] | (blk[83] << 8)));
        for (int h = 0; h < 2; h++) {
#if defined(Q8_AVX2)
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h)), three = _mm256_set1_epi8(3);
#endif
            for (int j = 0; j < 4; j++) {
                const int64_t b = 8 * sb + 4 * h + j;
                const int s0 = sc[8 * h + 2 * j], s1 = sc[8 * h + 2 * j + 1];
                r->s[b] = d, r->m[b] = dmin;
                r->mn[2 * b] = (int16_t)(s0 >> 4), r->mn[2 * b + 1] = (int16_t)(s1 >> 4);
                int8_t *out = r->buf + 32 * b;
#if defined(Q8_AVX2)
                const __m256i code = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), three);
                const __m256i tbl = _mm256_setr_epi32((s0 & 15) * 0x03020100, 0, 0, 0, (s1 & 15) * 0x03020100, 0, 0, 0);
                _mm256_storeu_si256((__m256i *)out, _mm256_shuffle_epi8(tbl, code));
#else
                for (int l = 0; l < 32; l++)
                    out[l] = (int8_t)(((l < 16 ? s0 : s1) & 15) * ((qs[32 * h + l] >> (2 * j)) & 3));
#endif
            }
        }
    }
}

#define Q8_TOK 16 /* tokens that share one pass over a decoded row */
#define Q8_AHEAD 8  /* rows prefetched ahead in the two-row kernel */


/* Tokens t0 .. t0 + nt - 1 (nt <= Q8_TOK) against one decoded row; Y[k * ldy] for token t0 + k.  With
 * `lanes` (AVX2 paths, nb a multiple of 8) the 8 accumulators of token k go to lanes + 64 * k instead,
 * for q8_reduce_rows. */
#define Q8_KIND_Q80 0
#define Q8_KIND_Q2K 1
#define Q8_KIND_IQ2 2
static inline __attribute__((always_inline)) void q8_row_body(const q8_wrow *r, const int kind, const ds4_q8_act *a,
                                                              int64_t t0, int nt, float *Y, int64_t ldy, float *lanes) {
    const int q2k = kind == Q8_KIND_Q2K;
    const int64_t nb = a->nb, cols = a->cols;
    float acc[Q8_TOK][8];
    int64_t b = 0;
#if defined(Q8_AVX2)
    __m256 va[Q8_TOK];
    for (int k = 0; k < nt; k++) va[k] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        __m256i rw[8], c[8];
        if (r->tr) {
            for (int j = 0; j < 8; j++) c[j] = _mm256_loadu_si256((const __m256i *)(r->w + 32 * b + 32 * j));
        } else {
            for (int i = 0; i < 8; i++) rw[i] = _mm256_loadu_si256((const __m256i *)(r->w + r->stride * (b + i)));
            q8_transpose(rw, c);
        }
#if defined(Q8_VNNI)
        /* 128 * the block's weight sum, taken off the offset q (4 independent chains: short latency) */
        const __m256i m128 = _mm256_set1_epi8((char)0x80);
        __m256i k0 = Q8_DPBUSD(_mm256_setzero_si256(), m128, c[0]), k1 = Q8_DPBUSD(_mm256_setzero_si256(), m128, c[1]);
        __m256i k2 = Q8_DPBUSD(_mm256_setzero_si256(), m128, c[2]), k3 = Q8_DPBUSD(_mm256_setzero_si256(), m128, c[3]);
        k0 = Q8_DPBUSD(k0, m128, c[4]), k1 = Q8_DPBUSD(k1, m128, c[5]), k2 = Q8_DPBUSD(k2, m128, c[6]);
        k3 = Q8_DPBUSD(k3, m128, c[7]);
        const __m256i corr = _mm256_add_epi32(_mm256_add_epi32(k0, k1), _mm256_add_epi32(k2, k3));
#else
        /* |w| with the weight's sign moved onto q (Q2_K's w = scale * code is never negative) */
        __m256i aw[8];
        if (kind != Q8_KIND_Q2K)
            for (int j = 0; j < 8; j++) aw[j] = _mm256_sign_epi8(c[j], c[j]);
        const __m256i ones = _mm256_set1_epi16(1);
#endif
        const __m256 sv = _mm256_loadu_ps(r->s + b);
        __m256 mv = _mm256_setzero_ps();
        __m256i mnv = _mm256_setzero_si256();
        if (q2k) mv = _mm256_loadu_ps(r->m + b), mnv = _mm256_loadu_si256((const __m256i *)(r->mn + 2 * b));
        for (int k = 0; k < nt; k++) {
            const uint8_t *xt = a->xt + (t0 + k) * cols + 32 * b;
#if defined(Q8_VNNI)
            __m256i i[4];
            for (int j = 0; j < 4; j++)
                i[j] = Q8_DPBUSD(_mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(xt + 32 * j)), c[j]);
            for (int j = 0; j < 4; j++)
                i[j] = Q8_DPBUSD(i[j], _mm256_loadu_si256((const __m256i *)(xt + 32 * j + 128)), c[j + 4]);
            const __m256i is = _mm256_sub_epi32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])), corr);
#else
            /* maddubs leaves int16 sums of two products; where |w| is small, several of them are added
             * in int16 before one madd widens them (exact: no sum leaves int16): IQ2_XXS |w| <= 43, so
             * 3 vectors (6 products, |sum| <= 6 * 43 * 127 = 32766); Q2_K 0 <= w <= 45, unsigned, so q
             * needs no sign and 2 vectors add (|sum| <= 4 * 45 * 127 = 22860); Q8_0 none */
            __m256i is;
            if (kind == Q8_KIND_Q2K) {
                __m256i s[4];
                for (int j = 0; j < 4; j++)
                    s[j] = _mm256_add_epi16(_mm256_maddubs_epi16(c[2 * j], _mm256_loadu_si256((const __m256i *)(xt + 64 * j))),
                                            _mm256_maddubs_epi16(c[2 * j + 1], _mm256_loadu_si256((const __m256i *)(xt + 64 * j + 32))));
                is = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(s[0], ones), _mm256_madd_epi16(s[1], ones)),
                                      _mm256_add_epi32(_mm256_madd_epi16(s[2], ones), _mm256_madd_epi16(s[3], ones)));
            } else if (kind == Q8_KIND_IQ2) {
                __m256i p[8];
                for (int j = 0; j < 8; j++)
                    p[j] = _mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xt + 32 * j)), c[j]));
                const __m256i s0 = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), p[2]);
                const __m256i s1 = _mm256_add_epi16(_mm256_add_epi16(p[3], p[4]), p[5]);
                const __m256i s2 = _mm256_add_epi16(p[6], p[7]);
                is = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones)),
                                      _mm256_madd_epi16(s2, ones));
            } else {
                is = _mm256_setzero_si256();
                for (int j = 0; j < 8; j++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(xt + 32 * j));
                    is = _mm256_add_epi32(is, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(x, c[j])), ones));
                }
            }
#endif
            const __m256 dx = _mm256_loadu_ps(a->d + (t0 + k) * nb + b);
            __m256 p = _mm256_mul_ps(_mm256_mul_ps(sv, dx), _mm256_cvtepi32_ps(is));
            if (q2k) {
                const __m256i bs = _mm256_loadu_si256((const __m256i *)(a->bs + ((t0 + k) * nb + b) * 2));
                p = _mm256_sub_ps(p, _mm256_mul_ps(_mm256_mul_ps(mv, dx), _mm256_cvtepi32_ps(_mm256_madd_epi16(mnv, bs))));
            }
            va[k] = _mm256_add_ps(va[k], p);
        }
    }
    if (b == nb && lanes) {
        for (int k = 0; k < nt; k++) _mm256_storeu_ps(lanes + 64 * k, va[k]);
        return;
    }
    if (b == nb) {
        for (int k = 0; k < nt; k++) Y[k * ldy] = q8_hsum8(va[k]);
        return;
    }
    for (int k = 0; k < nt; k++) _mm256_storeu_ps(acc[k], va[k]);
#else
    for (int k = 0; k < nt; k++)
        for (int j = 0; j < 8; j++) acc[k][j] = 0.0f;
#endif
    for (; b < nb; b++) { /* portable, and the blocks after the last full 8 */
        const int8_t *w = r->w + r->stride * b;
        for (int k = 0; k < nt; k++) {
            const int64_t t = t0 + k;
            const float dx = a->d[t * nb + b];
            float p = (r->s[b] * dx) * (float)q8_isum(w, a->q + t * cols + 32 * b);
            if (q2k) {
                const int16_t *bs = a->bs + (t * nb + b) * 2;
                p = p - (r->m[b] * dx) * (float)((int32_t)r->mn[2 * b] * bs[0] + (int32_t)r->mn[2 * b + 1] * bs[1]);
            }
            acc[k][b & 7] += p;
        }
    }
    (void)lanes;
    for (int k = 0; k < nt; k++) {
        const float *v = acc[k];
        Y[k * ldy] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    }
}

/* q8_row_body for the row's type (IQ2_XXS is the row that is neither Q2_K nor read in place as Q8_0). */
static void q8_row_tokens(const q8_wrow *r, int q2k, const ds4_q8_act *a, int64_t t0, int nt, float *Y, int64_t ldy,
                          float *lanes) {
    if (q2k) q8_row_body(r, Q8_KIND_Q2K, a, t0, nt, Y, ldy, lanes);
    else if (r->q80) q8_row_body(r, Q8_KIND_Q80, a, t0, nt, Y, ldy, lanes);
    else q8_row_body(r, Q8_KIND_IQ2, a, t0, nt, Y, ldy, lanes);
}

#if defined(Q8_AVX2)
/* The final reduction of 8 rows at once: lanes[8 * i + j] is accumulator j of row i; y[i] =
 * ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) of row i, the same additions as q8_hsum8. */
static inline void q8_reduce_rows(const float *lanes, float *y) {
    __m256i r[8], c[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_castps_si256(_mm256_loadu_ps(lanes + 8 * i));
    q8_transpose(r, c);
    __m256 v[8];
    for (int j = 0; j < 8; j++) v[j] = _mm256_castsi256_ps(c[j]);
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])),
                                      _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7]))));
}
#endif

#if defined(Q8_AVX2)
/* Q8_0 rows of fewer than 8 blocks (the 128-column projections, the DSpark Markov head's 32 columns),
 * 8 rows at a time with the rows in the lanes: block b of rows r .. r + 7 transposed (q8_transpose:
 * lane i of vector j holds codes 4j .. 4j + 3 of row r + i), each token's four codes broadcast, and
 * I_b by q8_row_body's AVX2 operations (|w| times q with w's sign, int16 pairs widened by madd).  The
 * same values as q8_row_tokens: p_b = (s_b * d_b) * I_b, accumulator b < nb is +0 + p_b, the others
 * +0, then the fixed reduction.  Row by row these rows took ~28 ns for one 32-column block. */
static void q8_rows8_small(const uint8_t *W, size_t row_bytes, int64_t r, const ds4_q8_act *a, int64_t t0, int nt,
                           float *Y, int64_t ldy) {
    const int64_t nb = a->nb, cols = a->cols;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[Q8_TOK][8];
    for (int k = 0; k < nt; k++)
        for (int j = 0; j < 8; j++) acc[k][j] = _mm256_setzero_ps();
    const uint8_t *base = W + (size_t)r * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
        __m256i v[8], c[8], aw[8];
        for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_si256((const __m256i *)(base + (size_t)i * row_bytes + 34 * b + 2));
        q8_transpose(v, c);
        for (int j = 0; j < 8; j++) aw[j] = _mm256_sign_epi8(c[j], c[j]);
        float s[8];
        for (int i = 0; i < 8; i++) {
            const uint8_t *h = base + (size_t)i * row_bytes + 34 * b;
            s[i] = ds4_half((uint16_t)(h[0] | (h[1] << 8)));
        }
        const __m256 sv = _mm256_loadu_ps(s);
        for (int k = 0; k < nt; k++) {
            const int8_t *xq = a->q + (t0 + k) * cols + 32 * b;
            __m256i is = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                int32_t x4;
                memcpy(&x4, xq + 4 * j, 4);
                const __m256i x = _mm256_set1_epi32(x4);
                is = _mm256_add_epi32(is, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(x, c[j])), ones));
            }
            const __m256 p = _mm256_mul_ps(_mm256_mul_ps(sv, _mm256_set1_ps(a->d[(t0 + k) * nb + b])), _mm256_cvtepi32_ps(is));
            acc[k][b] = _mm256_add_ps(acc[k][b], p);
        }
    }
    for (int k = 0; k < nt; k++) {
        const __m256 *v = acc[k];
        _mm256_storeu_ps(Y + k * ldy, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])),
                                                    _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7]))));
    }
}
#endif

#if defined(Q8_ZMM)
/* The 8 x 8 transpose of 32-bit lanes within each 256-bit half: r[i] = block i of rows A (low half) and
 * B (high half) -> c[j] = lane j of blocks 0-3 of A, of B, then of blocks 4-7 of A, of B. */
static inline void q8_transpose_zmm(const __m512i r[8], __m512i c[8]) {
    __m512i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        c[j] = _mm512_shuffle_i64x2(u[j], u[j + 4], 0x88);
        c[j + 4] = _mm512_shuffle_i64x2(u[j], u[j + 4], 0xDD);
    }
}

#if defined(__AVX512VBMI__)
/* The f16 scales of 8 consecutive Q8_0 blocks (34 bytes each: the scale, then 32 codes) from p, the
 * first block's start: scale i at byte 34 i, picked from the 256 bytes p .. p + 255 by two two-table
 * byte permutes (each block group is 272 bytes, so the loads stay within it). */
static inline __m128i q80_scales8(const uint8_t *p) {
    const __m512i z0 = _mm512_loadu_si512((const void *)p), z1 = _mm512_loadu_si512((const void *)(p + 64));
    const __m512i z2 = _mm512_loadu_si512((const void *)(p + 128)), z3 = _mm512_loadu_si512((const void *)(p + 192));
    /* scales 0-3 at bytes 0, 34, 68, 102 of z0:z1; scales 4-7 at 136, 170, 204, 238, i.e. 8, 42, 76, 110 of z2:z3 */
    const __m512i lo = _mm512_permutex2var_epi8(z0, _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, 0x6766454423220100LL), z1);
    const __m512i hi = _mm512_permutex2var_epi8(z2, _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, 0x6F6E4D4C2B2A0908LL), z3);
    return _mm_unpacklo_epi64(_mm512_castsi512_si128(lo), _mm512_castsi512_si128(hi));
}
#endif

/* Two decoded rows A and B (nb a multiple of 8) against tokens t0 .. t0 + nt - 1: the same integer sums
 * and float operations as q8_row_tokens, with 8 blocks of both rows in one vector: lanes [A blocks 0-3,
 * B blocks 0-3, A blocks 4-7, B blocks 4-7] (the activations' xz/dz/bz layout). */
static inline __attribute__((always_inline)) void q8_pair_body(const q8_wrow *ra, const q8_wrow *rb, int q2k,
                                                               const ds4_q8_act *a, int64_t t0, int nt, float *Y,
                                                               int64_t ldy, float *lanes, const int qw) {
    const int64_t nb = a->nb, cols = a->cols;
    __m512 va[Q8_TOK];
    for (int k = 0; k < nt; k++) va[k] = _mm512_setzero_ps();
    const __m512i m128 = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b += 8) {
        __m512i c[8];
        if (qw) { /* the qword layout (q8_decode's qw): A's 4 vectors, then B's, already w + 128 where signed */
            for (int j = 0; j < 4; j++) {
                c[j] = _mm512_loadu_si512((const void *)(ra->w + 32 * b + 64 * j));
                c[4 + j] = _mm512_loadu_si512((const void *)(rb->w + 32 * b + 64 * j));
            }
        } else if (ra->tr) { /* both rows already transposed: [A 0-3, B 0-3, A 4-7, B 4-7] from the two vectors j */
            const __m512i ix = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
            for (int j = 0; j < 8; j++)
                c[j] = _mm512_permutex2var_epi64(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ra->w + 32 * b + 32 * j))), ix,
                                                 _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rb->w + 32 * b + 32 * j))));
        } else {
            __m512i r[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ra->w + ra->stride * (b + i)))),
                                          _mm256_loadu_si256((const __m256i *)(rb->w + rb->stride * (b + i))), 1);
            q8_transpose_zmm(r, c);
        }
        /* the weights are vpdpbusd's unsigned operand: Q2_K's (scale * code, never negative) as they
         * are, the signed ones as w + 128, whose extra 128 * sum(q) the activations' cz takes off */
        if (!q2k && !qw)
            for (int j = 0; j < 8; j++) c[j] = _mm512_xor_si512(c[j], m128);
        __m512 s2;
        if (ra->q80) { /* the 16 scales of a Q8_0 pair, read in place; F16C converts exactly */
#if defined(__AVX512VBMI__)
            /* each row's 8 scales picked by byte permutes from the four vectors its 8 blocks' first
             * 256 bytes load as (lines the weights' loads read too): a gather of 16 dwords is
             * microcoded on AMD's cores and cost 13-29 % of a Q8_0 product there (tools/cpu_notes.md,
             * 2026-12-04 (late)) */
            s2 = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(q80_scales8(ra->q80 + 34 * b)),
                                                         q80_scales8(rb->q80 + 34 * b), 1));
#else
            /* one gather of the 16 blocks' first dwords (scale + 2 weights), narrowed to the scales */
            const int32_t off = (int32_t)(rb->q80 - ra->q80);
            const __m512i ix = _mm512_add_epi32(_mm512_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238, 0, 34, 68, 102, 136, 170, 204, 238),
                                                _mm512_maskz_set1_epi32(0xff00, off));
            const __m512i g = _mm512_i32gather_epi32(ix, (const void *)(ra->q80 + 34 * b), 1);
            s2 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
#endif
        } else {
            s2 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(ra->s + b)), _mm256_loadu_ps(rb->s + b), 1);
        }
        const __m512 sv = _mm512_shuffle_f32x4(s2, s2, 0xD8);
        __m512 mv = _mm512_setzero_ps();
        __m512i mnv = _mm512_setzero_si512();
        if (q2k) {
            const __m512 m2 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(ra->m + b)), _mm256_loadu_ps(rb->m + b), 1);
            mv = _mm512_shuffle_f32x4(m2, m2, 0xD8);
            const __m512i n2 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ra->mn + 2 * b))),
                                                  _mm256_loadu_si256((const __m256i *)(rb->mn + 2 * b)), 1);
            mnv = _mm512_shuffle_i64x2(n2, n2, 0xD8);
        }
        for (int k = 0; k < nt; k++) {
            __m512i is;
            if (qw) {
                /* lanes 2i and 2i + 1 of a row's sums: block i's codes 0-3 and 4-7 of each 8, summed
                 * over the 4 vectors; the two added into [A 0-3, B 0-3, A 4-7, B 4-7] */
                const int8_t *xq = a->xq + (t0 + k) * cols + 32 * b;
                const __m512i i00 = q2k ? _mm512_setzero_si512() : _mm512_loadu_si512((const void *)(a->cq + (t0 + k) * 2 * nb + 2 * b));
                __m512i iA = i00, iB = i00;
                for (int j = 0; j < 4; j++) {
                    const __m512i x = _mm512_loadu_si512((const void *)(xq + 64 * j));
                    iA = _mm512_dpbusd_epi32(iA, c[j], x);
                    iB = _mm512_dpbusd_epi32(iB, c[4 + j], x);
                }
                const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 16, 18, 20, 22, 8, 10, 12, 14, 24, 26, 28, 30);
                is = _mm512_add_epi32(_mm512_permutex2var_epi32(iA, ev, iB),
                                      _mm512_permutex2var_epi32(iA, _mm512_add_epi32(ev, _mm512_set1_epi32(1)), iB));
            } else {
            const uint8_t *xz = a->xz + (t0 + k) * 2 * cols + 64 * b;
            const __m512i i00 = q2k ? _mm512_setzero_si512() : _mm512_loadu_si512((const void *)(a->cz + (t0 + k) * 2 * nb + 2 * b));
            __m512i i0 = _mm512_dpbusd_epi32(i00, c[0], _mm512_loadu_si512((const void *)xz));
            __m512i i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[1], _mm512_loadu_si512((const void *)(xz + 64)));
            i0 = _mm512_dpbusd_epi32(i0, c[2], _mm512_loadu_si512((const void *)(xz + 128)));
            i1 = _mm512_dpbusd_epi32(i1, c[3], _mm512_loadu_si512((const void *)(xz + 192)));
            i0 = _mm512_dpbusd_epi32(i0, c[4], _mm512_loadu_si512((const void *)(xz + 256)));
            i1 = _mm512_dpbusd_epi32(i1, c[5], _mm512_loadu_si512((const void *)(xz + 320)));
            i0 = _mm512_dpbusd_epi32(i0, c[6], _mm512_loadu_si512((const void *)(xz + 384)));
            i1 = _mm512_dpbusd_epi32(i1, c[7], _mm512_loadu_si512((const void *)(xz + 448)));
            is = _mm512_add_epi32(i0, i1);
            }
            const __m512 dx = _mm512_loadu_ps(a->dz + (t0 + k) * 2 * nb + 2 * b);
            __m512 p = _mm512_mul_ps(_mm512_mul_ps(sv, dx), _mm512_cvtepi32_ps(is));
            if (q2k) {
                const __m512i bs = _mm512_loadu_si512((const void *)(a->bz + (t0 + k) * 2 * nb + 2 * b));
                p = _mm512_sub_ps(p, _mm512_mul_ps(_mm512_mul_ps(mv, dx), _mm512_cvtepi32_ps(_mm512_madd_epi16(mnv, bs))));
            }
            va[k] = _mm512_add_ps(va[k], p);
        }
    }
    if (lanes) { /* the 16 accumulators of token k to lanes + 64 * k, for q8_reduce_pairs */
        for (int k = 0; k < nt; k++) _mm512_storeu_ps(lanes + 64 * k, va[k]);
        return;
    }
    for (int k = 0; k < nt; k++) {
        /* s4 of A in lanes 0-3, of B in 4-7; then (s4_0 + s4_2) + (s4_1 + s4_3) per row */
        const __m256 s4 = _mm256_add_ps(_mm512_castps512_ps256(va[k]), _mm512_extractf32x8_ps(va[k], 1));
        const __m256 x = _mm256_permute_ps(s4, 0xD8);
        const __m256 h = _mm256_hadd_ps(x, x);
        const __m256 f = _mm256_hadd_ps(h, h);
        Y[k * ldy] = _mm256_cvtss_f32(f);
        Y[k * ldy + 1] = _mm_cvtss_f32(_mm256_extractf128_ps(f, 1));
    }
}

/* Q8_0 matrices of fewer than 8 blocks a row (nb < 8: projections of 128 columns, the DSpark Markov
 * head's 32): 16 rows at a time, rows in the lanes.  Each row sees the same operations as in
 * q8_row_tokens: accumulator b < nb is +0 + p_b, the others stay +0, then the same reduction. */
static void q8_rows16_small(const uint8_t *W, size_t row_bytes, int64_t r, const ds4_q8_act *a, int64_t t0, int nt,
                            float *Y, int64_t ldy) {
    const int64_t nb = a->nb, cols = a->cols;
    const __m512i m128 = _mm512_set1_epi8((char)0x80);
    __m512 acc[Q8_TOK][8];
    for (int k = 0; k < nt; k++)
        for (int j = 0; j < 8; j++) acc[k][j] = _mm512_setzero_ps();
    const uint8_t *base = W + (size_t)r * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
        __m512i v[8], t[8], u[8], c[8];
        for (int i = 0; i < 8; i++)
            v[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(base + (size_t)i * row_bytes + 34 * b + 2))),
                                      _mm256_loadu_si256((const __m256i *)(base + (size_t)(i + 8) * row_bytes + 34 * b + 2)), 1);
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
            t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
            u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
            u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
            u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
            u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
        }
        for (int j = 0; j < 4; j++) { /* lanes: rows 0-3, 8-11, 4-7, 12-15 */
            c[j] = _mm512_shuffle_i64x2(u[j], u[j + 4], 0x88);
            c[j + 4] = _mm512_shuffle_i64x2(u[j], u[j + 4], 0xDD);
        }
        __m512i k0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), m128, c[0]);
        __m512i k1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), m128, c[1]);
        k0 = _mm512_dpbusd_epi32(k0, m128, c[2]), k1 = _mm512_dpbusd_epi32(k1, m128, c[3]);
        k0 = _mm512_dpbusd_epi32(k0, m128, c[4]), k1 = _mm512_dpbusd_epi32(k1, m128, c[5]);
        k0 = _mm512_dpbusd_epi32(k0, m128, c[6]), k1 = _mm512_dpbusd_epi32(k1, m128, c[7]);
        const __m512i corr = _mm512_add_epi32(k0, k1);
        uint16_t h[16];
        for (int l = 0; l < 16; l++) { /* lane l holds row (l & 3) + 8 * ((l >> 2) & 1) + 4 * (l >> 3) */
            const int row = (l & 3) + 8 * ((l >> 2) & 1) + 4 * (l >> 3);
            memcpy(&h[l], base + (size_t)row * row_bytes + 34 * b, 2);
        }
        const __m512 sv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
        for (int k = 0; k < nt; k++) {
            const int8_t *xq = a->q + (t0 + k) * cols + 32 * b;
            __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
            for (int j = 0; j < 8; j += 2) {
                int32_t x0, x1;
                memcpy(&x0, xq + 4 * j, 4), memcpy(&x1, xq + 4 * j + 4, 4);
                i0 = _mm512_dpbusd_epi32(i0, _mm512_set1_epi32((int32_t)((uint32_t)x0 ^ 0x80808080u)), c[j]);
                i1 = _mm512_dpbusd_epi32(i1, _mm512_set1_epi32((int32_t)((uint32_t)x1 ^ 0x80808080u)), c[j + 1]);
            }
            const __m512i is = _mm512_sub_epi32(_mm512_add_epi32(i0, i1), corr);
            const __m512 p = _mm512_mul_ps(_mm512_mul_ps(sv, _mm512_set1_ps(a->d[(t0 + k) * nb + b])), _mm512_cvtepi32_ps(is));
            acc[k][b] = _mm512_add_ps(acc[k][b], p);
        }
    }
    for (int k = 0; k < nt; k++) {
        const __m512 *v = acc[k];
        const __m512 R = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                                       _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
        _mm512_storeu_ps(Y + k * ldy, _mm512_shuffle_f32x4(R, R, 0xD8)); /* back to row order */
    }
}

static void q8_pair_tokens(const q8_wrow *ra, const q8_wrow *rb, int q2k, const ds4_q8_act *a, int64_t t0, int nt,
                           float *Y, int64_t ldy, float *lanes) {
    /* one token (a decode) with a constant count: its accumulator then stays in a register (with the
     * variable count the accumulators lived on the stack, zeroed by a memset call per row pair;
     * tools/cpu_notes.md, 2026-12-04 (late)) */
    if (ra->tr == 2) {
        if (nt == 1) q8_pair_body(ra, rb, q2k, a, t0, 1, Y, ldy, lanes, 1);
        else q8_pair_body(ra, rb, q2k, a, t0, nt, Y, ldy, lanes, 1);
    } else if (nt == 1) {
        q8_pair_body(ra, rb, q2k, a, t0, 1, Y, ldy, lanes, 0);
    } else {
        q8_pair_body(ra, rb, q2k, a, t0, nt, Y, ldy, lanes, 0);
    }
}

/* The final reduction of 4 row pairs at once (8 rows): l + 16 p holds pair p's accumulators [A 0-3, B
 * 0-3, A 4-7, B 4-7]; y[2p] (row A) and y[2p + 1] (row B) = (s0 + s2) + (s1 + s3) with s_j = v_j +
 * v_(j+4), the same additions as q8_pair_body's own reduction. */
static inline void q8_reduce_pairs(const float *l, float *y) {
    const __m512 v0 = _mm512_loadu_ps(l), v1 = _mm512_loadu_ps(l + 16), v2 = _mm512_loadu_ps(l + 32), v3 = _mm512_loadu_ps(l + 48);
    /* 128-bit lanes: one row's s0 s1 s2 s3 (rows of pairs 0, 1 | pairs 2, 3) */
    const __m512 z01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xEE));
    const __m512 z23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xEE));
    /* [s0 + s2, s1 + s3, ...], then lane 0 = (s0 + s2) + (s1 + s3) */
    const __m512 e01 = _mm512_add_ps(z01, _mm512_permute_ps(z01, 0x4E)), e23 = _mm512_add_ps(z23, _mm512_permute_ps(z23, 0x4E));
    const __m512 f01 = _mm512_add_ps(e01, _mm512_permute_ps(e01, 0xB1)), f23 = _mm512_add_ps(e23, _mm512_permute_ps(e23, 0xB1));
    const __m512i ix = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm256_storeu_ps(y, _mm512_castps512_ps256(_mm512_permutex2var_ps(f01, ix, f23)));
}
#endif

int ds4_cpu_q8_type(int type) { return type == DS4_TYPE_Q8_0 || type == DS4_TYPE_Q2_K || type == DS4_TYPE_IQ2_XXS; }

/* qw: the 2-bit rows in the qword layout of q8_pair_body's qw path where this build has it (then wr->tr == 2). */
static void q8_decode(int type, const uint8_t *row, int64_t nb, q8_wrow *wr, int scales, int qw) {
    if (type == DS4_TYPE_Q8_0) q8_decode_q8_0(row, nb, wr, scales);
    else if (type == DS4_TYPE_Q2_K) q8_decode_q2_k(row, nb, wr, qw);
    else q8_decode_iq2_xxs(row, nb, wr, qw);
}

void ds4_cpu_dot_q8(int type, const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, const ds4_q8_act *a,
                    int64_t n_tok, float *Y, int64_t ldy) {
    q8_wrow wr[8];
    if (q8_wrow_alloc(wr, a->cols) != 0) { /* no memory for a decoded row: NaN, so nothing passes for a result */
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++) Y[t * ldy + r] = __builtin_nanf("");
        return;
    }
    const int q2k = type == DS4_TYPE_Q2_K;
    int64_t r = r0;
#if defined(Q8_ZMM)
    if (type == DS4_TYPE_Q8_0 && a->nb < 8) {
        for (; r + 16 <= r1; r += 16)
            for (int64_t t = 0; t < n_tok; t += Q8_TOK)
                q8_rows16_small(W, row_bytes, r, a, t, (int)(n_tok - t < Q8_TOK ? n_tok - t : Q8_TOK), Y + t * ldy + r, ldy);
    }
    if (a->nb % 8 == 0 && a->xz) {
        /* 4 pairs at a time: their final reductions run together */
        float lanes[Q8_TOK * 64];
        for (; r + 8 <= r1; r += 8) {
            for (int64_t t = 0; t < n_tok; t += Q8_TOK) {
                const int nt = (int)(n_tok - t < Q8_TOK ? n_tok - t : Q8_TOK);
                for (int p = 0; p < 4; p++) {
                    const int64_t rp = r + 2 * p;
                    if (t == 0) {
                        if (rp + Q8_AHEAD + 2 <= r1) /* the transposing loads stride across two rows */
                            for (size_t o = 0; o < 2 * row_bytes; o += 64) __builtin_prefetch(W + (size_t)(rp + Q8_AHEAD) * row_bytes + o);
                        q8_decode(type, W + (size_t)rp * row_bytes, a->nb, &wr[2 * p], 0, 1);
                        q8_decode(type, W + (size_t)(rp + 1) * row_bytes, a->nb, &wr[2 * p + 1], 0, 1);
                    }
                    q8_pair_tokens(&wr[2 * p], &wr[2 * p + 1], q2k, a, t, nt, NULL, 0, lanes + 16 * p);
                }
                for (int k = 0; k < nt; k++) q8_reduce_pairs(lanes + 64 * k, Y + (t + k) * ldy + r);
            }
        }
        for (; r + 2 <= r1; r += 2) {
            if (r + Q8_AHEAD + 2 <= r1) /* the pair after next: the transposing loads stride across two rows */
                for (size_t o = 0; o < 2 * row_bytes; o += 64) __builtin_prefetch(W + (size_t)(r + Q8_AHEAD) * row_bytes + o);
            q8_decode(type, W + (size_t)r * row_bytes, a->nb, &wr[0], 0, 1);
            q8_decode(type, W + (size_t)(r + 1) * row_bytes, a->nb, &wr[1], 0, 1);
            for (int64_t t = 0; t < n_tok; t += Q8_TOK)
                q8_pair_tokens(&wr[0], &wr[1], q2k, a, t, (int)(n_tok - t < Q8_TOK ? n_tok - t : Q8_TOK), Y + t * ldy + r, ldy, NULL);
        }
    }
#endif
#if defined(Q8_AVX2)
    if (type == DS4_TYPE_Q8_0 && a->nb < 8) /* after the 16-row kernel where the build has it */
        for (; r + 8 <= r1; r += 8)
            for (int64_t t = 0; t < n_tok; t += Q8_TOK)
                q8_rows8_small(W, row_bytes, r, a, t, (int)(n_tok - t < Q8_TOK ? n_tok - t : Q8_TOK), Y + t * ldy + r, ldy);
    /* 8 rows at a time: their final reductions run together (rows overlap instead of each one ending
     * in a horizontal sum) */
    if (a->nb % 8 == 0) {
        float lanes[Q8_TOK * 64], y8[8];
        /* Q8_0 rows of one 8-block group (256 columns, e.g. the demo's LM head): the next 8 rows
         * prefetched, one stretch of 8 * 272 bytes (tools/cpu_notes.md, 2026-12-02: the demo's q8
         * decode 10 % faster; with 1024-column rows the medium's was 5 % slower, so only here) */
        const int ahead = type == DS4_TYPE_Q8_0 && a->nb <= 8;
        for (; r + 8 <= r1; r += 8) {
            if (ahead && r + 16 <= r1)
                for (size_t o = 0; o < 8 * row_bytes; o += 64) __builtin_prefetch(W + (size_t)(r + 8) * row_bytes + o);
            for (int i = 0; i < 8; i++) q8_decode(type, W + (size_t)(r + i) * row_bytes, a->nb, &wr[i], 1, 0);
            for (int64_t t = 0; t < n_tok; t += Q8_TOK) {
                const int nt = (int)(n_tok - t < Q8_TOK ? n_tok - t : Q8_TOK);
                for (int i = 0; i < 8; i++) q8_row_tokens(&wr[i], q2k, a, t, nt, NULL, 0, lanes + 8 * i);
                for (int k = 0; k < nt; k++) {
                    q8_reduce_rows(lanes + 64 * k, y8);
                    memcpy(Y + (t + k) * ldy + r, y8, sizeof y8);
                }
            }
        }
    }
#endif
    for (; r < r1; r++) {
        q8_decode(type, W + (size_t)r * row_bytes, a->nb, &wr[0], 1, 0);
        for (int64_t t = 0; t < n_tok; t += Q8_TOK)
            q8_row_tokens(&wr[0], q2k, a, t, (int)(n_tok - t < Q8_TOK ? n_tok - t : Q8_TOK), Y + t * ldy + r, ldy, NULL);
    }
}

int ds4_cpu_matmul_q8_1(int type, const uint8_t *W, int64_t rows, int64_t cols, const float *X, int64_t n_tok, float *Y) {
    const size_t rb = type == DS4_TYPE_Q8_0 ? 34 : type == DS4_TYPE_Q2_K ? 84 : 66;
    const int64_t be = type == DS4_TYPE_Q8_0 ? 32 : 256;
    if (!ds4_cpu_q8_type(type) || cols % be) return -1;
    void *buf = malloc(ds4_cpu_q8_act_bytes(cols, n_tok));
    if (!buf) return -1;
    ds4_q8_act a;
    ds4_cpu_q8_act_prepare(X, cols, n_tok, cols, buf, &a);
    ds4_cpu_dot_q8(type, W, rb * (size_t)(cols / be), 0, rows, &a, n_tok, Y, rows);
    free(buf);
    return 0;
}
