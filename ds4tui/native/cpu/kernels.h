/* kernels.h — internal CPU kernels (not part of the public API). */
#ifndef DS4_CPU_KERNELS_H
#define DS4_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../ds4_engine.h"
#include "pool.h"

/* IEEE half -> float, exact for every input (subnormals, inf, NaN payloads), branch-free so that
 * loops over it vectorise: the 15 exponent/mantissa bits shifted into a float and rescaled by
 * 2^112 (the bias difference 127 - 15) give normal and subnormal halves; inf/NaN get the all-ones
 * exponent. */
static inline float ds4_half(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    float f;
    memcpy(&f, &em, sizeof f);
    f *= 5.192296858534828e+33f; /* 2^112 */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (em >= (0x7c00u << 13)) bits = em | 0x7f800000u;
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float ds4_bf16_to_f32(uint16_t h);
uint16_t ds4_f32_to_f16(float f); /* round to nearest, ties to even */

/* Dequantisation of n elements (n a multiple of the block size; spec ds4.md §5). */
void ds4_cpu_dequant_f32(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_f16(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_bf16(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_q8_0(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_q2_k(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_iq2_xxs(const void *src, float *dst, int64_t n);

/* Float dot product with 16 partial sums (vectorisable without -ffast-math). */
float ds4_dot_f32(const float *a, const float *b, int64_t n);
/* out[k] = ds4_dot_f32(a, b[k], n), k < 4, with the same bits (a's loads shared). */
void ds4_dot_f32_4(const float *a, const float *const b[4], int64_t n, float out[4]);

/* The CPU dot kernels of types.h (cpu/dot.c): Y[t*ldy + r] = W row r . X[t*ldx, 0..cols) for rows
 * r0 <= r < r1 (row r at W + r * row_bytes) and t < n_tok. */
#define DS4_CPU_DOT(name)                                                                                  \
    void name(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, int64_t cols, const float *X,  \
              int64_t ldx, int64_t n_tok, float *Y, int64_t ldy)
DS4_CPU_DOT(ds4_cpu_dot_f32);
DS4_CPU_DOT(ds4_cpu_dot_f16);
DS4_CPU_DOT(ds4_cpu_dot_bf16);
DS4_CPU_DOT(ds4_cpu_dot_q8_0);
DS4_CPU_DOT(ds4_cpu_dot_q2_k);
DS4_CPU_DOT(ds4_cpu_dot_iq2_xxs);
#undef DS4_CPU_DOT

/* 8-bit activations (spec ds4.md §2.9.5; cpu/dot.c).  ds4_cpu_quantize_q8_act: n floats (a multiple
 * of 32) to int8 q[n] and block scales d[n / 32].  A ds4_q8_act holds n_tok quantised rows as the
 * kernels read them (made by ds4_cpu_q8_act_prepare in a buffer of ds4_cpu_q8_act_bytes bytes). */
typedef struct {
    int64_t cols, nb;       /* columns and 32-wide blocks of a row */
    const uint8_t *xt;      /* [n_tok][cols]: q in the kernels' transposed 8-block layout */
    const int8_t *q;        /* [n_tok][cols]: q in column order */
    const float *d;         /* [n_tok][nb]: block scales */
    const int16_t *bs;      /* [n_tok][nb][2]: sums of q over each block's two 16-wide halves */
    const uint8_t *xz;      /* [n_tok][2 * cols]: the AVX-512 two-row layout of xt (NULL without it) */
    const float *dz;        /* [n_tok][2 * nb]: d in that layout */
    const int32_t *bz;      /* [n_tok][2 * nb]: bs in that layout (an int16 pair a lane) */
    const int32_t *cz;      /* [n_tok][2 * nb]: -128 * each block's sum of q, in that layout */
    const int8_t *xq;       /* [n_tok][cols]: q in the qword layout of the 2-bit rows (AVX-512 only) */
    const int32_t *cq;      /* [n_tok][2 * nb]: -128 * block i's sum of q in lane 2i of its 8-block group */
} ds4_q8_act;
void ds4_cpu_quantize_q8_act(const float *x, int64_t n, int8_t *q, float *d);
size_t ds4_cpu_q8_act_bytes(int64_t cols, int64_t n_tok);
void ds4_cpu_q8_act_prepare(const float *X, int64_t ldx, int64_t n_tok, int64_t cols, void *buf, ds4_q8_act *a);
/* 1 for the weight types with a q8 kernel: Q8_0, Q2_K, IQ2_XXS. */
int ds4_cpu_q8_type(int type);
/* Y[t*ldy + r] = W row r . activation row t under the q8 arithmetic, rows r0 <= r < r1, t < n_tok. */
void ds4_cpu_dot_q8(int type, const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, const ds4_q8_act *a,
                    int64_t n_tok, float *Y, int64_t ldy);
/* The whole product Y [n_tok][rows] on the calling thread (for tests of other instruction sets);
 * -1 for another type, a column count that is not whole blocks, or no memory. */
int ds4_cpu_matmul_q8_1(int type, const uint8_t *W, int64_t rows, int64_t cols, const float *X, int64_t n_tok, float *Y);

/* Q8_0 products on AMX tiles (the amx option, spec ds4.md §2.9.6; cpu/amx.c), the same bits as
 * ds4_cpu_dot_q8.  ds4_cpu_amx_probe: 1 when this CPU and kernel run them (this process is then
 * granted the tile state), else 0 with the reason in why.  ds4_cpu_amx_eligible: a matrix the kernel
 * takes (Q8_0, rows a multiple of 16, columns of 64).  ds4_cpu_amx_pack: W (GGML rows) into the tile
 * layout at out, ds4_cpu_amx_bytes(rows, cols) bytes (as many as W).  ds4_cpu_amx_matmul: Y[t*ldy + r]
 * = packed row r . X row t under the q8 arithmetic, groups of 16 rows over the pool; -1 (Y untouched)
 * for a matrix it does not take, no memory, or a build without AMX. */
int ds4_cpu_amx_probe(char *why, size_t len);
int ds4_cpu_amx_eligible(int type, int64_t rows, int64_t cols);
size_t ds4_cpu_amx_bytes(int64_t rows, int64_t cols);
void ds4_cpu_amx_pack(const uint8_t *W, int64_t rows, int64_t cols, uint8_t *out);
int ds4_cpu_amx_matmul(ds4_pool *pool, const uint8_t *P, int64_t rows, int64_t cols, const float *X, int64_t ldx,
                       int64_t n_tok, float *Y, int64_t ldy);

/* Y[t*ldy + r] = sum_c W[r, c] * X[t*ldx + c]; rows split over the pool (cpu/matmul.c).  With
 * act_q8, Q8_0, Q2_K and IQ2_XXS matrices multiply 8-bit quantised activations (the other types
 * keep float32). */
void ds4_cpu_matmul_act(ds4_pool *pool, int act_q8, int type, const void *W, int64_t rows, int64_t cols,
                        const float *X, int64_t ldx, int64_t n_tok, float *Y, int64_t ldy);
void ds4_cpu_matmul(ds4_pool *pool, int type, const void *W, int64_t rows, int64_t cols, const float *X,
                    int64_t ldx, int64_t n_tok, float *Y, int64_t ldy);

/* One product of a group of ds4_cpu_matmul_groups: Y[t*ldy + r] = W row r . X row t (t < n_tok). */
typedef struct {
    const void *W;
    const float *X;
    int64_t ldx, n_tok;
    float *Y;
    int64_t ldy;
} ds4_mm_group;
/* n_groups products of rows x cols matrices of one type (the experts of an MoE layer) in one run
 * of the pool: every (group, row) is an item, so the workers are woken once for all of them.  Each
 * group's rows see exactly ds4_cpu_matmul_act's operations for that group's tokens (the same
 * floats). */
void ds4_cpu_matmul_groups(ds4_pool *pool, int act_q8, int type, int64_t rows, int64_t cols, const ds4_mm_group *g,
                           int n_groups);

#endif
