/* amx.c — Q8_0 products on Intel's AMX tiles, the `amx` option (spec ds4.md §2.9.6).
 *
 * With 8-bit activations (§2.9.5) a Q8_0 product is, per 32-wide block, an exact int32 sum I_b of
 * code products, then float32 arithmetic on it.  The sums need no order, so AMX's TDPBSSD (16 x 16
 * int32 sums of 64 signed byte products each, per instruction) can form them; the float32 steps
 * after it are those of every other path (p_b = (s_b * d_b) * I_b, eight accumulators, the fixed
 * reduction), so the results are the same bits as the AVX-512, AVX2 and portable kernels'.
 *
 * The weights are repacked once, at load, into the layout the tile unit reads (ds4_cpu_amx_pack):
 * per group of 16 rows, for each 64-column chunk c, one 1 KiB tile whose byte 64 r + 4 n + i is
 * row n's code at column 64 c + 4 r + i (TDPBSSD's B operand: 16 rows of 4-byte column groups), then
 * the group's block scales as f16, 16 per block (row n at 16 b + n).  A group is as many bytes as the
 * 16 GGML rows it holds (34 bytes a block either way).  The activations form the A operand: tokens
 * go in groups of up to 8 (ntg a group); for a chunk, row h * ntg + t holds token t's 64 codes with
 * the half h (its first or second block) kept and the other half zero, so C[h * ntg + t][n] is block
 * 2c + h's sum of token t and weight row n.  Each group of 16 weight rows is read once for all the
 * token groups of a product.
 *
 * Why: a verify of six rows multiplies the demo's 35 MB LM head six times; with AVX-512 VNNI that is
 * ~2.2x a one-row product on this project's benchmark Xeon, on the tile unit ~1.1x, the weights'
 * read (tools/cpu_notes.md, 2026-12-05 (AMX)).  Only x86-64 builds have it; a CPU without AMX-INT8,
 * or a kernel that refuses the tile state (Linux's arch_prctl ARCH_REQ_XCOMP_PERM), keeps the other
 * kernels (ds4_cpu_amx_probe says why).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* syscall() under -std=c11 */
#endif
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* gcc 11+ (its target pragma below turns the tile instructions on for this file's kernel whatever -march
 * says); other compilers build the stubs at the end */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define DS4_HAVE_AMX 1
#endif

#define AMX_ROWS 16      /* weight rows a group */
#define AMX_CHUNK 64     /* columns a tile (two Q8_0 blocks) */
#define AMX_TOK 8        /* tokens a group (A and C tile rows: 2 per token) */

int ds4_cpu_amx_eligible(int type, int64_t rows, int64_t cols) {
    return type == DS4_TYPE_Q8_0 && rows > 0 && cols > 0 && rows % AMX_ROWS == 0 && cols % AMX_CHUNK == 0;
}

size_t ds4_cpu_amx_bytes(int64_t rows, int64_t cols) { return (size_t)rows * (size_t)(cols / 32) * 34; }

#if defined(DS4_HAVE_AMX)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int ds4_cpu_amx_probe(char *why, size_t len) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        if (why && len) snprintf(why, len, "the CPU reports no extended features (cpuid leaf 7)");
        return 0;
    }
    const int tile = (d >> 24) & 1, int8 = (d >> 25) & 1, f512 = (b >> 16) & 1, bw = (b >> 30) & 1;
    if (!tile || !int8 || !f512 || !bw) {
        if (why && len) snprintf(why, len, "this CPU has no AMX-INT8 (cpuid: amx_tile %d, amx_int8 %d, avx512f %d, avx512bw %d)",
                                 tile, int8, f512, bw);
        return 0;
    }
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __get_cpuid(1, &a1, &b1, &c1, &d1);
    if (!((c1 >> 27) & 1) || !((c1 >> 29) & 1)) {
        if (why && len) snprintf(why, len, "the CPU has AMX but no OSXSAVE or F16C");
        return 0;
    }
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3) != 3) {
        if (why && len) snprintf(why, len, "the operating system has not enabled the AMX tile state (XCR0 bits 17-18)");
        return 0;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        if (why && len) snprintf(why, len, "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: Linux 5.16 or later grants it)");
        return 0;
    }
    if (why && len) snprintf(why, len, "AMX-INT8 available");
    return 1;
}

void ds4_cpu_amx_pack(const uint8_t *W, int64_t rows, int64_t cols, uint8_t *out) {
    const int64_t nb = cols / 32, nch = cols / AMX_CHUNK;
    const size_t row_bytes = (size_t)nb * 34, group = (size_t)nch * 1024 + (size_t)nb * 32;
    for (int64_t g = 0; g < rows / AMX_ROWS; g++) {
        uint8_t *o = out + (size_t)g * group;
        for (int n = 0; n < AMX_ROWS; n++) {
            const uint8_t *row = W + (size_t)(g * AMX_ROWS + n) * row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                memcpy(o + (size_t)nch * 1024 + (size_t)(b * AMX_ROWS + n) * 2, row + 34 * b, 2);
                const uint8_t *q = row + 34 * b + 2;
                uint8_t *tile = o + (size_t)(b / 2) * 1024 + (b % 2) * 8 * 64 + 4 * n;
                for (int k = 0; k < 32; k += 4) memcpy(tile + (k / 4) * 64, q + k, 4);
            }
        }
    }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) amx_cfg;

typedef struct {
    const uint8_t *P;
    size_t group;
    int64_t cols, nb, nch;
    const int8_t *A;  /* [token group][nch] A tiles of 1 KiB (rows h * ntg + t, ntg = AMX_TOK but for a lone group) */
    int32_t *cb;      /* a pool thread's nch x 1 KiB of block sums, then its nb x 64 bytes of float32 scales */
    const float *dx;  /* [n_tok][nb] activation scales */
    int64_t n_tok;
    int ntg;          /* tokens a group's A tile rows are laid out for (its last group may have fewer) */
    float *Y;
    int64_t ldy;
} amx_task;

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,f16c")
#include <immintrin.h>

/* Groups g0..g1 of 16 weight rows, each read once for every token group (its weights stay in the
 * cache while the token groups take their turns). */
static void amx_slice(void *ctx, int64_t g0, int64_t g1, int thread) {
    const amx_task *t = ctx;
    const int ntg = t->ntg;
    const int64_t nb = t->nb, nch = t->nch;
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 4; i++) cfg.colsb[i] = 64, cfg.rows[i] = (uint8_t)(2 * ntg); /* C 0-1, A 2-3 */
    for (int i = 4; i < 6; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;                  /* B 4-5 */
    _tile_loadconfig(&cfg);
    /* this thread's sums of a group ([chunk][row][16]) and its weight scales as float32 ([block][16]) */
    int32_t *cb = t->cb + (size_t)thread * (size_t)nch * 512;
    float *sw32 = (float *)(cb + (size_t)nch * 256);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *o = t->P + (size_t)g * t->group;
        /* the next group's weights on their way while this one is multiplied: its scales now, each
         * of its tiles beside the same tile of this group (a whole group at once would stall the
         * core on its fill buffers before any product of this one starts) */
        const uint8_t *next = g + 1 < g1 ? o + t->group : NULL;
        if (next)
            for (size_t off = (size_t)nch * 1024; off < t->group; off += 64) _mm_prefetch((const char *)(next + off), _MM_HINT_T0);
        const uint16_t *sc = (const uint16_t *)(o + (size_t)nch * 1024);
        for (int64_t t0 = 0; t0 < t->n_tok; t0 += ntg) {
            const int nt = (int)(t->n_tok - t0 < ntg ? t->n_tok - t0 : ntg);
            const int8_t *A = t->A + (size_t)(t0 / ntg) * (size_t)nch * 1024;
            /* the group's block sums; chunks alternate between two sets of tiles, so that one chunk's
             * loads need not wait for the last one's store */
            for (int64_t ch = 0; ch < nch; ch++) {
                if (next && t0 == 0)
                    for (int l = 0; l < 1024; l += 64) _mm_prefetch((const char *)(next + (size_t)ch * 1024 + l), _MM_HINT_T0);
                if (ch & 1) {
                    _tile_loadd(5, o + (size_t)ch * 1024, 64);
                    _tile_loadd(3, A + (size_t)ch * 1024, 64);
                    _tile_zero(1);
                    _tile_dpbssd(1, 3, 5);
                    _tile_stored(1, cb + ch * 256, 64);
                } else {
                    _tile_loadd(4, o + (size_t)ch * 1024, 64);
                    _tile_loadd(2, A + (size_t)ch * 1024, 64);
                    _tile_zero(0);
                    _tile_dpbssd(0, 2, 4);
                    _tile_stored(0, cb + ch * 256, 64);
                }
            }
            /* the group's weight scales as float32 once (F16C converts exactly), then each token's
             * float32 steps, blocks in order into accumulator b mod 8 (registers) */
            if (t0 == 0)
                for (int64_t b = 0; b < nb; b++)
                    _mm512_store_ps(sw32 + 16 * b, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + AMX_ROWS * b))));
            for (int k = 0; k < nt; k++) {
                __m512 a[8];
                for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_ps();
                const float *dx = t->dx + (size_t)(t0 + k) * nb;
                for (int64_t b0 = 0; b0 < nb; b0 += 8) {
#pragma GCC unroll 8
                    for (int j = 0; j < 8; j++) {
                        const int64_t b = b0 + j;
                        if (b >= nb) break;
                        const __m512 sw = _mm512_load_ps(sw32 + 16 * b);
                        const __m512i I = _mm512_load_si512((const void *)(cb + (b >> 1) * 256 + ((b & 1) * ntg + k) * 16));
                        a[j] = _mm512_add_ps(a[j], _mm512_mul_ps(_mm512_mul_ps(sw, _mm512_set1_ps(dx[b])), _mm512_cvtepi32_ps(I)));
                    }
                }
                const __m512 r = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                               _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
                _mm512_storeu_ps(t->Y + (t0 + k) * t->ldy + g * AMX_ROWS, r);
            }
        }
    }
    _tile_release();
}
#pragma GCC pop_options

int ds4_cpu_amx_matmul(ds4_pool *pool, const uint8_t *P, int64_t rows, int64_t cols, const float *X, int64_t ldx,
                       int64_t n_tok, float *Y, int64_t ldy) {
    if (!ds4_cpu_amx_eligible(DS4_TYPE_Q8_0, rows, cols)) return -1;
    if (n_tok <= 0) return 0;
    const int64_t nb = cols / 32, nch = cols / AMX_CHUNK, n_groups = (n_tok + AMX_TOK - 1) / AMX_TOK;
    const int ntg = n_tok < AMX_TOK ? (int)n_tok : AMX_TOK;
    const size_t abytes = (size_t)nch * 1024, nth = (size_t)ds4_pool_size(pool);
    int8_t *A = aligned_alloc(64, (size_t)n_groups * abytes + (size_t)cols + 64);
    int32_t *cb = aligned_alloc(64, nth * 2 * abytes); /* a thread's sums (abytes) and float32 scales (nb * 64 bytes) */
    float *dx = malloc((size_t)n_tok * (size_t)nb * sizeof(float));
    if (!A || !cb || !dx) {
        free(A), free(cb), free(dx);
        return -1;
    }
    /* every token's codes into its group's A tiles: row h * ntg + t of chunk c holds the token's codes of
     * block 2c + h and zeros where the other block's are */
    int8_t *q = A + (size_t)n_groups * abytes;
    memset(A, 0, (size_t)n_groups * abytes);
    for (int64_t i = 0; i < n_tok; i++) {
        ds4_cpu_quantize_q8_act(X + i * ldx, cols, q, dx + (size_t)i * nb);
        int8_t *Ag = A + (size_t)(i / AMX_TOK) * abytes;
        const int k = (int)(i % AMX_TOK);
        for (int64_t ch = 0; ch < nch; ch++)
            for (int h = 0; h < 2; h++)
                memcpy(Ag + (size_t)ch * 1024 + (size_t)(h * ntg + k) * 64 + 32 * h, q + ch * AMX_CHUNK + 32 * h, 32);
    }
    amx_task t = {P, ds4_cpu_amx_bytes(AMX_ROWS, cols), cols, nb, nch, A, cb, dx, n_tok, ntg, Y, ldy};
    if (rows * cols * n_tok < 65536) amx_slice(&t, 0, rows / AMX_ROWS, 0);
    else ds4_pool_run(pool, amx_slice, &t, rows / AMX_ROWS);
    free(A);
    free(cb);
    free(dx);
    return 0;
}

#else /* no AMX in this build */

int ds4_cpu_amx_probe(char *why, size_t len) {
    if (why && len) snprintf(why, len, "this build has no AMX kernels (an x86-64 Linux build with gcc 11 or later has them)");
    return 0;
}

void ds4_cpu_amx_pack(const uint8_t *W, int64_t rows, int64_t cols, uint8_t *out) { (void)W, (void)rows, (void)cols, (void)out; }

int ds4_cpu_amx_matmul(ds4_pool *pool, const uint8_t *P, int64_t rows, int64_t cols, const float *X, int64_t ldx,
                       int64_t n_tok, float *Y, int64_t ldy) {
    (void)pool, (void)P, (void)rows, (void)cols, (void)X, (void)ldx, (void)n_tok, (void)Y, (void)ldy;
    return -1;
}
#endif
