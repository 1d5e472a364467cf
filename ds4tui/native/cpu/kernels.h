/* kernels.h — internal CPU kernels (not part of the public API). */
#ifndef DS4_CPU_KERNELS_H
#define DS4_CPU_KERNELS_H

#include <stdint.h>

float ds4_f16_to_f32(uint16_t h);
float ds4_bf16_to_f32(uint16_t h);

/* Dequantisation of n elements (n a multiple of the block size; spec ds4.md §5). */
void ds4_cpu_dequant_f32(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_f16(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_bf16(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_q8_0(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_q2_k(const void *src, float *dst, int64_t n);
void ds4_cpu_dequant_iq2_xxs(const void *src, float *dst, int64_t n);

#endif
