/*
 * dequant.c — GGML block formats to float (spec ds4.md §5).
 *
 * The arithmetic order follows the format definitions so that results are
 * bit-identical to gguf.quants' dequantisation (the tests' oracle).
 * The IQ2_XXS grid and sign tables are format data generated at build time
 * from the gguf package (build_native.py writes iq2xxs_tables.h).
 */
#include "kernels.h"
#include "iq2xxs_tables.h"

#include <string.h>

float ds4_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void ds4_cpu_dequant_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void ds4_cpu_dequant_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = (const uint8_t *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = ds4_half(rd16(p + 2 * i));
}

void ds4_cpu_dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = (const uint8_t *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = ds4_bf16_to_f32(rd16(p + 2 * i));
}

/* Q8_0: 32 elements, 34 bytes: f16 d, int8 q[32]; x = d*q. */
void ds4_cpu_dequant_q8_0(const void *src, float *dst, int64_t n) {
    const uint8_t *b = (const uint8_t *)src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += 34, dst += 32) {
        float d = ds4_half(rd16(b));
        const int8_t *q = (const int8_t *)(b + 2);
        for (int i = 0; i < 32; i++) dst[i] = d * (float)q[i];
    }
}

/* Q2_K: 256 elements, 84 bytes: scales[16], qs[64], f16 d, f16 dmin. */
void ds4_cpu_dequant_q2_k(const void *src, float *dst, int64_t n) {
    const uint8_t *b = (const uint8_t *)src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += 84, dst += 256) {
        const uint8_t *scales = b;
        const uint8_t *qs = b + 16;
        float d = ds4_half(rd16(b + 80));
        float dmin = ds4_half(rd16(b + 82));
        for (int e = 0; e < 256; e++) {
            int h = e / 128, j = (e % 128) / 32, l = e % 32, sb = e / 16;
            int code = (qs[32 * h + l] >> (2 * j)) & 3;
            float dl = d * (float)(scales[sb] & 15);
            float ml = dmin * (float)(scales[sb] >> 4);
            dst[e] = dl * (float)code - ml;
        }
    }
}

/* IQ2_XXS: 256 elements, 66 bytes: f16 d, 8 groups of (4 grid bytes, u32 signs+scale). */
void ds4_cpu_dequant_iq2_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = (const uint8_t *)src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += 66, dst += 256) {
        float d = ds4_half(rd16(b));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *g = b + 2 + 8 * ib;
            uint32_t w = rd32(g + 4);
            float db = d * (0.5f + (float)(w >> 28)) * 0.25f;
            for (int k = 0; k < 4; k++) {
                /* multiply by the sign (a table of +-1.0f) rather than negate: a NaN scale keeps its
                 * sign bit exactly as gguf's (db * grid) * signs does */
                const float *grid = ds4_iq2xxs_grid_f[g[k]], *sign = ds4_iq2xxs_sign_f[(w >> (7 * k)) & 127];
                for (int j = 0; j < 8; j++) dst[32 * ib + 8 * k + j] = db * grid[j] * sign[j];
            }
        }
    }
}
