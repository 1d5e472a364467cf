/* matmul.c — Y = W X over GGML-typed weight rows on the CPU: rows split over the thread pool, each
 * row through its type's dot kernel (types.h's cpu_dot, cpu/dot.c).  The split never changes a
 * result: every (row, token) pair is computed the same way wherever it runs, whatever the batch. */
#include "kernels.h"
#include "../types.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    void (*dot)(const uint8_t *, size_t, int64_t, int64_t, int64_t, const float *, int64_t, int64_t, float *, int64_t);
    const uint8_t *W;
    size_t row_bytes;
    int64_t cols, n_tok, ldx, ldy;
    const float *X;
    float *Y;
} mm_task;

static void mm_slice(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const mm_task *t = ctx;
    t->dot(t->W, t->row_bytes, r0, r1, t->cols, t->X, t->ldx, t->n_tok, t->Y, t->ldy);
}

typedef struct {
    int type;
    const uint8_t *W;
    size_t row_bytes;
    int64_t n_tok, ldy;
    const ds4_q8_act *act;
    float *Y;
} q8_task;

static void q8_slice(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const q8_task *t = ctx;
    ds4_cpu_dot_q8(t->type, t->W, t->row_bytes, r0, r1, t->act, t->n_tok, t->Y, t->ldy);
}

/* The calling thread's buffer for quantised activations (grown as needed, freed with the thread). */
static pthread_key_t q8_key;
static pthread_once_t q8_once = PTHREAD_ONCE_INIT;
typedef struct { void *p; size_t cap; } q8_buf;

static void q8_free(void *b) {
    if (b) free(((q8_buf *)b)->p);
    free(b);
}

static void q8_key_init(void) { pthread_key_create(&q8_key, q8_free); }

static void *q8_scratch(size_t bytes) {
    pthread_once(&q8_once, q8_key_init);
    q8_buf *b = pthread_getspecific(q8_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b || pthread_setspecific(q8_key, b) != 0) { free(b); return NULL; }
    }
    if (bytes > b->cap) {
        void *p = realloc(b->p, bytes);
        if (!p) return NULL;
        b->p = p;
        b->cap = bytes;
    }
    return b->p;
}

void ds4_cpu_matmul_act(ds4_pool *pool, int act_q8, int type, const void *W, int64_t rows, int64_t cols,
                        const float *X, int64_t ldx, int64_t n_tok, float *Y, int64_t ldy) {
    if (!act_q8 || !ds4_cpu_q8_type(type) || rows <= 0 || n_tok <= 0) {
        ds4_cpu_matmul(pool, type, W, rows, cols, X, ldx, n_tok, Y, ldy);
        return;
    }
    void *buf = q8_scratch(ds4_cpu_q8_act_bytes(cols, n_tok));
    if (!buf) { /* no memory for the quantised rows: NaN, so nothing downstream passes for a result */
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < rows; r++) Y[t * ldy + r] = __builtin_nanf("");
        return;
    }
    ds4_q8_act act;
    ds4_cpu_q8_act_prepare(X, ldx, n_tok, cols, buf, &act);
    q8_task t = {type, W, ds4_row_bytes(type, cols), n_tok, ldy, &act, Y};
    if (rows * cols * n_tok < 65536) q8_slice(&t, 0, rows, 0);
    else ds4_pool_run(pool, q8_slice, &t, rows);
}

void ds4_cpu_matmul(ds4_pool *pool, int type, const void *W, int64_t rows, int64_t cols, const float *X,
                    int64_t ldx, int64_t n_tok, float *Y, int64_t ldy) {
    if (rows <= 0 || n_tok <= 0) return;
    const ds4_type_traits *tt = ds4_type(type);
    mm_task t = {tt->cpu_dot, W, ds4_row_bytes(type, cols), cols, n_tok, ldx, ldy, X, Y};
    /* Below ~64K multiply-adds waking the workers costs more than the work. */
    if (rows * cols * n_tok < 65536) mm_slice(&t, 0, rows, 0);
    else ds4_pool_run(pool, mm_slice, &t, rows);
}

typedef struct {
    int type, q8;
    const ds4_type_traits *tt;
    size_t row_bytes;
    int64_t rows, cols;
    const ds4_mm_group *g;
    const ds4_q8_act *act; /* [n_groups] under q8 */
} groups_task;

/* Items are group * rows + row: a chunk runs each group's rows it covers as one row range. */
static void groups_slice(void *ctx, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const groups_task *t = ctx;
    for (int64_t i = i0; i < i1;) {
        const int64_t gi = i / t->rows, r0 = i % t->rows;
        const int64_t r1 = t->rows - r0 < i1 - i ? t->rows : r0 + (i1 - i);
        const ds4_mm_group *g = &t->g[gi];
        if (t->q8) ds4_cpu_dot_q8(t->type, g->W, t->row_bytes, r0, r1, &t->act[gi], g->n_tok, g->Y, g->ldy);
        else t->tt->cpu_dot(g->W, t->row_bytes, r0, r1, t->cols, g->X, g->ldx, g->n_tok, g->Y, g->ldy);
        i += r1 - r0;
    }
}

void ds4_cpu_matmul_groups(ds4_pool *pool, int act_q8, int type, int64_t rows, int64_t cols, const ds4_mm_group *g,
                           int n_groups) {
    if (rows <= 0 || n_groups <= 0) return;
    groups_task t = {type, act_q8 && ds4_cpu_q8_type(type), ds4_type(type), ds4_row_bytes(type, cols), rows, cols, g,
                     NULL};
    int64_t work = 0;
    for (int i = 0; i < n_groups; i++) work += rows * cols * g[i].n_tok;
    ds4_q8_act *act = NULL;
    if (t.q8) {
        size_t bytes = 0;
        for (int i = 0; i < n_groups; i++) bytes += ds4_cpu_q8_act_bytes(cols, g[i].n_tok);
        void *buf = q8_scratch(bytes);
        act = malloc((size_t)n_groups * sizeof *act);
        if (!buf || !act) { /* no memory: NaN, so nothing downstream passes for a result */
            free(act);
            for (int i = 0; i < n_groups; i++)
                for (int64_t k = 0; k < g[i].n_tok; k++)
                    for (int64_t r = 0; r < rows; r++) g[i].Y[k * g[i].ldy + r] = __builtin_nanf("");
            return;
        }
        for (int i = 0; i < n_groups; i++) {
            ds4_cpu_q8_act_prepare(g[i].X, g[i].ldx, g[i].n_tok, cols, buf, &act[i]);
            buf = (uint8_t *)buf + ds4_cpu_q8_act_bytes(cols, g[i].n_tok);
        }
        t.act = act;
    }
    /* below ~64K multiply-adds in all, waking the workers costs more than the work */
    if (work < 65536) groups_slice(&t, 0, (int64_t)n_groups * rows, 0);
    else ds4_pool_run(pool, groups_slice, &t, (int64_t)n_groups * rows);
    free(act);
}
