/* kernels.h — internal CPU kernels (not part of the public API). */
#ifndef DS4_CPU_KERNELS_H
#define DS4_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../ds4_engine.h"
#include "pool.h"

float ds4_f16_to_f32(uint16_t h);
float ds4_bf16_to_f32(uint16_t h);
uint16_t ds4_f32_to_f16(float f); /* round to nearest, ties to even */

/* Dequantisation of n elements (n a multiple of the block size; spec ds4.md §5). */
void ds4_cpu_dequant_f32(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_f16(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_bf16(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_q8_0(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_q2_k(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_iq2_xxs(const void *src, float *dst, int64_t n);

/* Block geometry: elements per block and bytes per block (0 if unsupported). */
int64_t ds4_block_elems(int type);
size_t ds4_row_bytes(int type, int64_t n);

/* Float dot product with 16 partial sums (vectorisable without -ffast-math). */
float ds4_dot_f32(const float *a, const float *b, int64_t n);

/* Y[t*ldy + r] = sum_c W[r, c] * X[t*ldx + c]; rows split over the pool. */
void ds4_cpu_matmul(ds4_pool *pool, int type, const void *W, int64_t rows, int64_t cols, const float *X,
                    int64_t ldx, int64_t n_tok, float *Y, int64_t ldy);

#endif
