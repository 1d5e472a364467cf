/* quant.h — GGML weight formats on the device (spec ds4.md §5): the 8 weights of one 8-element
 * chunk of a row, formed in float exactly as the format defines them (the values gguf.quants'
 * dequantisation and the CPU kernels give).  Included by each translation unit that reads
 * quantised weights; each calls quant_tables_init() once before its first launch. */
#ifndef DS4_GPU_QUANT_H
#define DS4_GPU_QUANT_H

#include "gpu_internal.h"
#include "../cpu/iq2xxs_tables.h"

/* In global memory, not __constant__: lanes index the tables divergently, which the constant cache
 * serialises (measured on an H200: IQ2_XXS matvec at 23 GB/s with __constant__ tables). */
static __device__ __attribute__((aligned(8))) uint8_t c_iq2_grid[256][8];
static __device__ uint8_t c_iq2_ksigns[128];

/* The IQ2_XXS grid and sign tables into this translation unit's constant memory. */
static inline int quant_tables_init(char *err, size_t len) {
    GPU_TRY(hipMemcpyToSymbol(c_iq2_grid, ds4_iq2xxs_grid, sizeof ds4_iq2xxs_grid), "copy the IQ2_XXS grid");
    GPU_TRY(hipMemcpyToSymbol(c_iq2_ksigns, ds4_iq2xxs_ksigns, sizeof ds4_iq2xxs_ksigns), "copy the IQ2_XXS signs");
    return DS4_OK;
}

__device__ __forceinline__ float h2f(uint16_t u) { return __half2float(__ushort_as_half(u)); }
__device__ __forceinline__ uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* The 8 weights of chunk c (elements 8c .. 8c+7) of one row; m = valid elements (< 8 only at the
 * end of an F32/F16/BF16 row whose length is not a multiple of 8). */
template <int TYPE> struct Chunk;

/* F32, F16, BF16: a whole chunk at a 16-byte boundary is read in 16-byte loads (the same values). */
template <> struct Chunk<DS4_TYPE_F32> {
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int m, float w[8]) {
        const float *p = (const float *)row + 8 * c;
        if (m == 8 && !((uintptr_t)p & 15)) {
            const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
            w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
            return;
        }
        for (int j = 0; j < 8; j++) w[j] = j < m ? p[j] : 0.0f;
    }
};
template <> struct Chunk<DS4_TYPE_F16> {
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int m, float w[8]) {
        const uint16_t *p = (const uint16_t *)row + 8 * c;
        if (m == 8 && !((uintptr_t)p & 15)) {
            const uint4 u = *(const uint4 *)p;
            const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; j++) w[2 * j] = h2f((uint16_t)(v[j] & 0xffffu)), w[2 * j + 1] = h2f((uint16_t)(v[j] >> 16));
            return;
        }
        for (int j = 0; j < 8; j++) w[j] = j < m ? h2f(p[j]) : 0.0f;
    }
};
template <> struct Chunk<DS4_TYPE_BF16> {
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int m, float w[8]) {
        const uint16_t *p = (const uint16_t *)row + 8 * c;
        if (m == 8 && !((uintptr_t)p & 15)) {
            const uint4 u = *(const uint4 *)p;
            const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; j++) w[2 * j] = __uint_as_float(v[j] << 16), w[2 * j + 1] = __uint_as_float(v[j] & 0xffff0000u);
            return;
        }
        for (int j = 0; j < 8; j++) w[j] = j < m ? __uint_as_float((uint32_t)p[j] << 16) : 0.0f;
    }
};
/* Q8_0: f16 d, int8 q[32]; x = d * q (exact in float32). */
template <> struct Chunk<DS4_TYPE_Q8_0> {
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int, float w[8]) {
        const uint8_t *blk = row + 34 * (c >> 2);
        const float d = h2f(*(const uint16_t *)blk);
        const uint16_t *q = (const uint16_t *)(blk + 2 + 8 * (c & 3)); /* 2-byte aligned: 4 loads, not 8 */
        for (int j = 0; j < 4; j++) {
            const uint16_t u = q[j];
            w[2 * j] = d * (float)(int8_t)(u & 0xff);
            w[2 * j + 1] = d * (float)(int8_t)(u >> 8);
        }
    }
};
/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64] (2-bit codes), f16 d, f16 dmin;
 * element e: code = (qs[32*(e/128) + e%32] >> 2*((e%128)/32)) & 3, x = d*sc*code - dmin*mn. */
template <> struct Chunk<DS4_TYPE_Q2_K> {
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int, float w[8]) {
        const uint8_t *blk = row + 84 * (c >> 5); /* 4-byte aligned: rows are multiples of 84 bytes */
        const int k = (int)(c & 31), h = k >> 4, sh = 2 * ((k >> 2) & 3), l0 = 8 * (k & 3), sb = k >> 1;
        const uint32_t dd = *(const uint32_t *)(blk + 80);
        const float d = h2f((uint16_t)(dd & 0xffff)), dmin = h2f((uint16_t)(dd >> 16));
        const uint8_t scm = blk[sb];
        const float dl = d * (float)(scm & 15), ml = dmin * (float)(scm >> 4);
        const uint32_t *qs = (const uint32_t *)(blk + 16 + 32 * h + l0);
        const uint32_t q0 = qs[0] >> sh, q1 = qs[1] >> sh;
        for (int j = 0; j < 4; j++) {
            w[j] = dl * (float)((q0 >> (8 * j)) & 3) - ml;
            w[4 + j] = dl * (float)((q1 >> (8 * j)) & 3) - ml;
        }
    }
};
/* IQ2_XXS: f16 d, then 8 groups of 32: 4 grid indices (bytes) and a u32 whose 4 x 7 low bits
 * index the sign table and whose top 4 bits are the group scale; x = d*(0.5+s)/4 * grid * sign. */
template <> struct Chunk<DS4_TYPE_IQ2_XXS> {
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int, float w[8]) {
        const uint8_t *blk = row + 66 * (c >> 5); /* 2-byte aligned: rows are multiples of 66 bytes */
        const int k = (int)(c & 31), ib = k >> 2, kk = k & 3;
        const uint16_t *g = (const uint16_t *)(blk + 2 + 8 * ib);
        const uint32_t sw = (uint32_t)g[2] | ((uint32_t)g[3] << 16);
        const uint8_t idx = (uint8_t)(g[kk >> 1] >> (8 * (kk & 1)));
        const float db = h2f(*(const uint16_t *)blk) * (0.5f + (float)(sw >> 28)) * 0.25f;
        const uint64_t grid = *(const uint64_t *)c_iq2_grid[idx]; /* one 8-byte load of the 8 magnitudes */
        const uint8_t signs = c_iq2_ksigns[(sw >> (7 * kk)) & 127];
        for (int j = 0; j < 8; j++) {
            float v = db * (float)(uint8_t)(grid >> (8 * j));
            w[j] = (signs >> j) & 1 ? -v : v;
        }
    }
};

/* Launch KERNEL<type>(...) for a GGML weight type, or fail naming the type. */
#define GPU_TYPE_SWITCH(type, KERNEL, ...)                                                                      \
    switch (type) {                                                                                           \
    case DS4_TYPE_F32: hipLaunchKernelGGL(KERNEL<DS4_TYPE_F32>, __VA_ARGS__); break;                            \
    case DS4_TYPE_F16: hipLaunchKernelGGL(KERNEL<DS4_TYPE_F16>, __VA_ARGS__); break;                            \
    case DS4_TYPE_BF16: hipLaunchKernelGGL(KERNEL<DS4_TYPE_BF16>, __VA_ARGS__); break;                          \
    case DS4_TYPE_Q8_0: hipLaunchKernelGGL(KERNEL<DS4_TYPE_Q8_0>, __VA_ARGS__); break;                          \
    case DS4_TYPE_Q2_K: hipLaunchKernelGGL(KERNEL<DS4_TYPE_Q2_K>, __VA_ARGS__); break;                          \
    case DS4_TYPE_IQ2_XXS: hipLaunchKernelGGL(KERNEL<DS4_TYPE_IQ2_XXS>, __VA_ARGS__); break;                    \
    default:                                                                                                  \
        return gpu_fail(err, len, DS4_E_UNSUPPORTED, "GPU matmul: GGML type %d has no kernel (expected F32, "   \
                        "F16, BF16, Q8_0, Q2_K or IQ2_XXS)", type);                                           \
    }

#endif
