/* q8_head_bits.c — what fewer activation bits would buy the six-row Q8_0 LM head on an AVX2 core
 * without VNNI (a study for tools/cpu_notes.md; not part of the engine, its build or CI).
 *
 *   gcc -O2 -march=x86-64-v3 -o /tmp/q8_head_bits tools/q8_head_bits.c && /tmp/q8_head_bits
 *
 * Six tokens against the demo model's head shape (129280 rows of 256 columns, Q8_0: 8 blocks of 32
 * a row, weights in [-127, 127]), weights stored block-transposed as the engine's AVX2 kernels read
 * them (ds4tui/native/cpu/dot.c, q8_row_body: vector j holds bytes 4j..4j+3 of the 8 blocks, so a
 * block's sum lands in its own 32-bit lane), one thread, process time, best of 15 alternated rounds:
 *   8-bit  the engine's product: |w| once a row, w's sign moved onto x (sign), maddubs, madd, add;
 *   7-bit  x in [-63, 63] stored as x + 64 (unsigned, 1..127): maddubs(x + 64, w) cannot saturate
 *          (2 * 127 * 127 < 2^15), so no sign step; 64 * sum(w) of each block, kept a row, is taken off;
 *   6-bit  x in [-31, 31] stored as x + 32: two maddubs results add in int16 (4 * 63 * 127 < 2^15)
 *          before one madd, half the madds.
 * Every variant's integer block sums are checked against a scalar product of the same integers. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NR 129280
#define NT 6

static int8_t *W;    /* [NR][8 vectors][32 bytes], block-transposed */
static int32_t *SW;  /* [NR][8]: sum of each block's weights */
static uint8_t *X[3]; /* [NT][256], transposed as W: 8-bit (x as int8), 7-bit (x + 64), 6-bit (x + 32) */
static int32_t Y[3][NT][8]; /* the last row's block sums, for the check */
static volatile float sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float finish(__m256i is, int k, int v) {
    _mm256_storeu_si256((__m256i *)Y[v][k], is);
    __m256 p = _mm256_cvtepi32_ps(is); /* the engine scales here; the cost is the same in every variant */
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

static void run(int v) {
    const __m256i ones = _mm256_set1_epi16(1), off = _mm256_set1_epi32(v == 1 ? 64 : 32);
    float acc = 0.0f;
    for (int r = 0; r < NR; r++) {
        const int8_t *w = W + (size_t)r * 256;
        __m256i c[8], aw[8];
        for (int j = 0; j < 8; j++) c[j] = _mm256_loadu_si256((const __m256i *)(w + 32 * j));
        if (v == 0)
            for (int j = 0; j < 8; j++) aw[j] = _mm256_sign_epi8(c[j], c[j]);
        const __m256i corr = _mm256_mullo_epi32(off, _mm256_loadu_si256((const __m256i *)(SW + 8 * r)));
        for (int k = 0; k < NT; k++) {
            const uint8_t *xt = X[v] + 256 * k;
            __m256i is = _mm256_setzero_si256();
            if (v == 0) {
                for (int j = 0; j < 8; j++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(xt + 32 * j));
                    is = _mm256_add_epi32(is, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(x, c[j])), ones));
                }
            } else if (v == 1) {
                for (int j = 0; j < 8; j++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(xt + 32 * j));
                    is = _mm256_add_epi32(is, _mm256_madd_epi16(_mm256_maddubs_epi16(x, c[j]), ones));
                }
                is = _mm256_sub_epi32(is, corr);
            } else {
                for (int j = 0; j < 8; j += 2) {
                    const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xt + 32 * j));
                    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xt + 32 * j + 32));
                    const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(x0, c[j]), _mm256_maddubs_epi16(x1, c[j + 1]));
                    is = _mm256_add_epi32(is, _mm256_madd_epi16(s, ones));
                }
                is = _mm256_sub_epi32(is, corr);
            }
            acc += finish(is, k, v);
        }
    }
    sink = acc;
}

int main(void) {
    static const int lim[3] = {127, 63, 31};
    W = aligned_alloc(64, (size_t)NR * 256);
    SW = aligned_alloc(64, (size_t)NR * 8 * sizeof(int32_t));
    int xs[3][NT][256]; /* x by column (block b = column / 32) */
    srand(1);
    for (size_t i = 0; i < (size_t)NR * 256; i++) W[i] = (int8_t)(rand() % 255 - 127);
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < 8; b++) {
            int32_t s = 0;
            for (int j = 0; j < 8; j++)
                for (int q = 0; q < 4; q++) s += W[(size_t)r * 256 + 32 * j + 4 * b + q];
            SW[8 * r + b] = s;
        }
    for (int v = 0; v < 3; v++) {
        X[v] = aligned_alloc(64, 256 * NT);
        for (int k = 0; k < NT; k++)
            for (int j = 0; j < 8; j++)
                for (int b = 0; b < 8; b++)
                    for (int q = 0; q < 4; q++) {
                        const int x = rand() % (2 * lim[v] + 1) - lim[v];
                        xs[v][k][32 * b + 4 * j + q] = x;
                        X[v][256 * k + 32 * j + 4 * b + q] = (uint8_t)(v == 0 ? (int8_t)x : x + lim[v] + 1);
                    }
    }
    double best[3] = {1e9, 1e9, 1e9};
    for (int rep = 0; rep < 15; rep++)
        for (int v = 0; v < 3; v++) {
            const double t = now();
            run(v);
            const double dt = now() - t;
            if (dt < best[v]) best[v] = dt;
        }
    int bad = 0; /* the last row's block sums against a scalar product */
    for (int v = 0; v < 3; v++)
        for (int k = 0; k < NT; k++)
            for (int b = 0; b < 8; b++) {
                int32_t s = 0;
                for (int j = 0; j < 8; j++)
                    for (int q = 0; q < 4; q++) s += W[(size_t)(NR - 1) * 256 + 32 * j + 4 * b + q] * xs[v][k][32 * b + 4 * j + q];
                bad += s != Y[v][k][b];
            }
    printf("six tokens x %d rows x 256 columns, one thread: 8-bit %.3f ms, 7-bit %.3f ms (%.2fx), 6-bit %.3f ms (%.2fx); "
           "block sums %s\n", NR, 1e3 * best[0], 1e3 * best[1], best[0] / best[1], 1e3 * best[2], best[0] / best[2],
           bad ? "WRONG" : "exact");
    return bad != 0;
}
