/* ops.c — element-wise and row operations of the DS4 forward pass (spec ds4.md §2).
 *
 * Float32 throughout, in the operation order of the numpy reference
 * (ds4tui/engine/reference.py), which is checked against transformers.
 */
#include "../internal.h"
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

void ds4_rms_norm(const float *x, int64_t n, float eps, const float *w, float *out) {
    float ss = ds4_dot_f32(x, x, n);
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) {
        float y = x[i] * inv;
        out[i] = w ? y * w[i] : y;
    }
}

float ds4_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* RoPE frequencies of spec ds4.md §2.3: base^(-2k/n_rot), YaRN-blended when `yarn`. */
double *ds4_rope_freqs(int n_rot, double base, int yarn, double factor, double orig_ctx, double beta_fast,
                       double beta_slow) {
    int half = n_rot / 2;
    double *f = malloc((size_t)(half > 0 ? half : 1) * sizeof(double));
    if (!f) return NULL;
    double lo = 0, hi = 0;
    if (yarn) {
        double pi2 = 2.0 * 3.14159265358979323846;
        double c_fast = n_rot * log(orig_ctx / (beta_fast * pi2)) / (2.0 * log(base));
        double c_slow = n_rot * log(orig_ctx / (beta_slow * pi2)) / (2.0 * log(base));
        lo = floor(c_fast);
        if (lo < 0) lo = 0;
        hi = ceil(c_slow);
        if (hi > n_rot - 1.0) hi = n_rot - 1.0;
        if (hi == lo) hi += 0.001;
    }
    for (int k = 0; k < half; k++) {
        double fr = pow(base, -2.0 * k / n_rot);
        if (yarn) {
            double t = ((double)k - lo) / (hi - lo);
            t = t < 0 ? 0 : (t > 1 ? 1 : t);
            fr = fr * (1.0 - t) + (fr / factor) * t;
        }
        f[k] = fr;
    }
    return f;
}

/* Interleaved rotation of the last n_rot lanes of x[width] at position pos. */
void ds4_rope_cs(const double *freq, int n_rot, int64_t pos, int inverse, float *cs) {
    for (int k = 0; k < n_rot / 2; k++) {
        double ang = (double)pos * freq[k];
        float c = (float)cos(ang), s = (float)sin(ang);
        cs[2 * k] = c;
        cs[2 * k + 1] = inverse ? -s : s;
    }
}

/* Kept scalar: GCC's vectoriser turns the pair of rotations into fused multiply-add-subtracts (one
 * rounding fewer), which would change the bits of every rotated lane. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
void ds4_rope_apply(const float *cs, int n_rot, float *x, int64_t width) {
    float *t = x + width - n_rot;
    for (int k = 0; k < n_rot / 2; k++) {
        const float c = cs[2 * k], s = cs[2 * k + 1];
        float a = t[2 * k], b = t[2 * k + 1];
        t[2 * k] = a * c - b * s;
        t[2 * k + 1] = a * s + b * c;
    }
}

void ds4_rope(const double *freq, int n_rot, float *x, int64_t width, int64_t pos, int inverse) {
    float cs[DS4_ROPE_MAX];
    if (n_rot > DS4_ROPE_MAX) { /* wider than any DS4 model: one pair at a time */
        float *t = x + width - n_rot;
        for (int k = 0; k < n_rot / 2; k++) {
            double ang = (double)pos * freq[k];
            float c = (float)cos(ang), s = (float)sin(ang);
            if (inverse) s = -s;
            float a = t[2 * k], b = t[2 * k + 1];
            t[2 * k] = a * c - b * s;
            t[2 * k + 1] = a * s + b * c;
        }
        return;
    }
    ds4_rope_cs(freq, n_rot, pos, inverse, cs);
    ds4_rope_apply(cs, n_rot, x, width);
}

/* Smallest e with 2^e >= r (r > 0), exactly. */
static int ceil_log2(float r) {
    int e;
    float m = frexpf(r, &e); /* r = m * 2^e, m in [0.5, 1) */
    return m == 0.5f ? e - 1 : e;
}

/* Block round trip with power-of-two scales (spec ds4.md §2.9): scale = 2^ceil(log2(amax/qmax)),
 * then each element's |v| = |x / scale| (clamped to qmax) rounded to a minifloat grid with `mbits`
 * mantissa bits whose smallest normal exponent is emin (subnormals share the smallest normal's
 * spacing), ties to the even code: q = rint(|v| / s) * s with s = 2^(max(floor(log2 |v|), emin) -
 * mbits).  floor(log2 |v|) is read from the exponent bits (a subnormal or zero |v| reads below any
 * emin, so it takes emin's spacing, as it must), and s is built from bits: a power of two, so the
 * division and the product are exact and the loop has no library call (the same floats as with
 * frexpf/ldexpf; AVX2 builds run it 8 lanes at a time, the same operations without branches). */
static void block_round_trip(float *x, int64_t n, int block, float qmax, int mbits, int emin, float amax_floor) {
    for (int64_t b = 0; b < n; b += block) {
        float amax = 0.0f;
        int i = 0;
#if defined(__AVX2__)
        /* 8 lanes at a time, each lane the scalar loop's operations (the maximum passes NaNs over as
         * `a > amax` does: max_ps keeps its second operand when the first is NaN; a maximum needs no
         * order; tools/cpu_notes.md, 2026-12-06 (eighth)) */
        if (block % 8 == 0) {
            const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
            __m256 m = _mm256_setzero_ps();
            for (; i < block; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + b + i), absm), m);
            float l[8];
            _mm256_storeu_ps(l, m);
            for (int k = 0; k < 8; k++)
                if (l[k] > amax) amax = l[k];
        }
#endif
        for (; i < block; i++) {
            float a = fabsf(x[b + i]);
            if (a > amax) amax = a;
        }
        if (amax < amax_floor) amax = amax_floor;
        const float scale = ldexpf(1.0f, ceil_log2(amax / qmax));
        float *xb = x + b;
        i = 0;
#if defined(__AVX2__)
        const __m256 vs = _mm256_set1_ps(scale), vq = _mm256_set1_ps(qmax), vnq = _mm256_set1_ps(-qmax);
        const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)), zero = _mm256_setzero_ps();
        const __m256i v127 = _mm256_set1_epi32(127), vemin = _mm256_set1_epi32(emin), vsb = _mm256_set1_epi32(127 - mbits);
        for (; i + 8 <= block; i += 8) {
            __m256 v = _mm256_div_ps(_mm256_loadu_ps(xb + i), vs);
            v = _mm256_blendv_ps(v, vq, _mm256_cmp_ps(v, vq, _CMP_GT_OQ));
            v = _mm256_blendv_ps(v, vnq, _mm256_cmp_ps(v, vnq, _CMP_LT_OQ));
            const __m256 a = _mm256_andnot_ps(sign, v);
            const __m256i ex = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(a), 23), v127), vemin);
            const __m256 spacing = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ex, vsb), 23));
            __m256 q = _mm256_mul_ps(_mm256_round_ps(_mm256_div_ps(a, spacing), _MM_FROUND_CUR_DIRECTION), spacing);
            q = _mm256_blendv_ps(q, vq, _mm256_cmp_ps(q, vq, _CMP_GT_OQ));
            q = _mm256_blendv_ps(q, _mm256_xor_ps(q, sign), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
            _mm256_storeu_ps(xb + i, _mm256_mul_ps(q, vs));
        }
#endif
        for (; i < block; i++) {
            float v = xb[i] / scale;
            v = v > qmax ? qmax : v;
            v = v < -qmax ? -qmax : v;
            const float a = fabsf(v);
            uint32_t bits;
            memcpy(&bits, &a, sizeof bits);
            int32_t ex = (int32_t)(bits >> 23) - 127;
            ex = ex < emin ? emin : ex;
            const uint32_t sbits = (uint32_t)(ex - mbits + 127) << 23;
            float spacing;
            memcpy(&spacing, &sbits, sizeof spacing);
            float q = rintf(a / spacing) * spacing;
            q = q > qmax ? qmax : q;
            xb[i] = (v < 0 ? -q : q) * scale;
        }
    }
}

/* FP8 E4M3 round trip of the non-RoPE lanes in blocks of 64 (spec ds4.md §2.9.1). */
void ds4_fp8_kv_round_trip(float *row, int64_t width, int n_rot) {
    block_round_trip(row, width - n_rot, 64, 448.0f, 3, -6, 1e-4f);
}

uint16_t ds4_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) { /* below 2^-14: half subnormal, unit 2^-24 */
        float a;
        memcpy(&a, &ax, sizeof a);
        return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f));
    }
    uint32_t h = ((((ax >> 23) - 127u + 15u)) << 10) | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

void ds4_f16_round(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = ds4_half(ds4_f32_to_f16(x[i]));
}

/* Hadamard (Sylvester butterflies, stride 1, 2, 4, ...; scale 1/sqrt(n)) then FP4 E2M1 in blocks
 * of 32 (spec ds4.md §2.9.3).  n is a power of two and a multiple of 32. */
void ds4_indexer_qat(float *x, int64_t n) {
    int64_t stride = 1;
#if defined(__AVX2__)
    /* the butterflies of strides 1, 2 and 4 inside 8-lane vectors (sw: each lane's partner; a lane
     * whose partner lies above takes x + partner, else partner - x: a + c and a - c with a the lower
     * element, as below), then strides of 8 and more a vector at a time */
    if (n % 8 == 0) {
        for (int64_t i = 0; i < n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i), sw;
            sw = _mm256_permute_ps(v, 0xB1); /* stride 1: lanes 1 0 3 2 */
            v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xAA);
            sw = _mm256_permute_ps(v, 0x4E); /* stride 2: lanes 2 3 0 1 */
            v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xCC);
            sw = _mm256_permute2f128_ps(v, v, 0x01); /* stride 4: the halves swapped */
            v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xF0);
            _mm256_storeu_ps(x + i, v);
        }
        for (stride = 8; stride < n; stride *= 2)
            for (int64_t b = 0; b < n; b += 2 * stride)
                for (int64_t i = b; i < b + stride; i += 8) {
                    const __m256 a = _mm256_loadu_ps(x + i), c = _mm256_loadu_ps(x + i + stride);
                    _mm256_storeu_ps(x + i, _mm256_add_ps(a, c));
                    _mm256_storeu_ps(x + i + stride, _mm256_sub_ps(a, c));
                }
    }
#endif
    for (; stride < n; stride *= 2)
        for (int64_t b = 0; b < n; b += 2 * stride)
            for (int64_t i = b; i < b + stride; i++) {
                float a = x[i], c = x[i + stride];
                x[i] = a + c;
                x[i + stride] = a - c;
            }
    float sc = (float)(1.0 / sqrt((double)n));
    for (int64_t i = 0; i < n; i++) x[i] *= sc;
    block_round_trip(x, n, 32, 6.0f, 1, 0, 7.052966104933725e-38f);
}
