/* matmul.c — dot products and small-batch matmul over GGML-typed weight rows.
 *
 * Y[t, r] = sum_c W[r, c] * X[t, c].  Activations stay float32 for every
 * weight type: a row (or, for one token, a block) is dequantised into float
 * and dotted with the activations, so results differ from
 * "gguf.quants.dequantize then numpy" only by float32 summation order
 * (relative error ~1e-6 of the row norm; tests/test_native_kernels.py).
 * This costs some speed against llama.cpp/ds4's 8-bit activation dot
 * products (which move the tiny test model's logits by ~0.3) and keeps the
 * engine comparable with the numpy reference at 1e-4.
 *
 * Dot products keep 16 independent partial sums so that the compiler can
 * vectorise them without -ffast-math (no reassociation is needed).
 */
#include "kernels.h"

#include <string.h>

#define LANES 16

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

/* Q8_0 block: f16 scale + 32 int8 (spec ds4.md §5.1). */
static float dot_q8_0(const uint8_t *row, const float *x, int64_t n) {
    float acc[LANES] = {0};
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        float d = ds4_f16_to_f32((uint16_t)(blk[0] | (blk[1] << 8)));
        const int8_t *q = (const int8_t *)(blk + 2);
        const float *xb = x + 32 * b;
        float s[LANES];
        for (int j = 0; j < LANES; j++) s[j] = (float)q[j] * xb[j];
        for (int j = 0; j < LANES; j++) s[j] += (float)q[j + LANES] * xb[j + LANES];
        for (int j = 0; j < LANES; j++) acc[j] += d * s[j];
    }
    return hsum(acc);
}

static float dot_f16(const uint16_t *row, const float *x, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += ds4_f16_to_f32(row[i + j]) * x[i + j];
    float s = hsum(acc);
    for (; i < n; i++) s += ds4_f16_to_f32(row[i]) * x[i];
    return s;
}

typedef struct {
    int type;
    const uint8_t *W;
    size_t row_bytes;
    int64_t cols, n_tok, ldx, ldy;
    const float *X;
    float *Y;
} mm_task;

/* Elements per dequantisation block of a type (spec ds4.md §5). */
static int64_t qblock(int type) {
    switch (type) {
    case DS4_TYPE_Q8_0: return 32;
    case DS4_TYPE_Q2_K: case DS4_TYPE_IQ2_XXS: return 256;
    default: return 256; /* float types: any chunk size */
    }
}

static void dequant(int type, const uint8_t *row, int64_t first, float *dst, int64_t n) {
    switch (type) {
    case DS4_TYPE_F32: memcpy(dst, row + 4 * first, (size_t)n * sizeof(float)); break;
    case DS4_TYPE_F16: ds4_cpu_dequant_f16(row + 2 * first, dst, n); break;
    case DS4_TYPE_BF16: ds4_cpu_dequant_bf16(row + 2 * first, dst, n); break;
    case DS4_TYPE_Q8_0: ds4_cpu_dequant_q8_0(row + 34 * (first / 32), dst, n); break;
    case DS4_TYPE_Q2_K: ds4_cpu_dequant_q2_k(row + 84 * (first / 256), dst, n); break;
    case DS4_TYPE_IQ2_XXS: ds4_cpu_dequant_iq2_xxs(row + 66 * (first / 256), dst, n); break;
    }
}

/* One weight row against n_tok activation rows, a 256-element chunk at a time. */
static void row_times_tokens(int type, const uint8_t *row, int64_t cols, const float *X, int64_t ldx,
                             int64_t n_tok, float *Y, int64_t ldy) {
    if (n_tok == 1) {
        switch (type) {
        case DS4_TYPE_F32: Y[0] = ds4_dot_f32((const float *)row, X, cols); return;
        case DS4_TYPE_F16: Y[0] = dot_f16((const uint16_t *)row, X, cols); return;
        case DS4_TYPE_Q8_0: Y[0] = dot_q8_0(row, X, cols); return;
        }
    }
    if (type == DS4_TYPE_F32) {
        for (int64_t k = 0; k < n_tok; k++) Y[k * ldy] = ds4_dot_f32((const float *)row, X + k * ldx, cols);
        return;
    }
    float tmp[256];
    int64_t step = qblock(type) > 256 ? qblock(type) : 256;
    for (int64_t k = 0; k < n_tok; k++) Y[k * ldy] = 0.0f;
    for (int64_t c = 0; c < cols; c += step) {
        int64_t n = cols - c < step ? cols - c : step;
        dequant(type, row, c, tmp, n);
        for (int64_t k = 0; k < n_tok; k++) Y[k * ldy] += ds4_dot_f32(tmp, X + k * ldx + c, n);
    }
}

static void mm_slice(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const mm_task *t = ctx;
    for (int64_t r = r0; r < r1; r++)
        row_times_tokens(t->type, t->W + (size_t)r * t->row_bytes, t->cols, t->X, t->ldx, t->n_tok, t->Y + r, t->ldy);
}

void ds4_cpu_matmul(ds4_pool *pool, int type, const void *W, int64_t rows, int64_t cols, const float *X,
                    int64_t ldx, int64_t n_tok, float *Y, int64_t ldy) {
    if (rows <= 0 || n_tok <= 0) return;
    mm_task t = {type, W, ds4_row_bytes(type, cols), cols, n_tok, ldx, ldy, X, Y};
    ds4_pool_run(pool, mm_slice, &t, rows);
}
