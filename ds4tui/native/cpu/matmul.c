/* matmul.c — Y = W X over GGML-typed weight rows on the CPU: rows split over the thread pool, each
 * row through its type's dot kernel (types.h's cpu_dot, cpu/dot.c).  The split never changes a
 * result: every (row, token) pair is computed the same way wherever it runs, whatever the batch. */
#include "kernels.h"
#include "../types.h"

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

void ds4_cpu_matmul(ds4_pool *pool, int type, const void *W, int64_t rows, int64_t cols, const float *X,
                    int64_t ldx, int64_t n_tok, float *Y, int64_t ldy) {
    if (rows <= 0 || n_tok <= 0) return;
    const ds4_type_traits *tt = ds4_type(type);
    mm_task t = {tt->cpu_dot, W, ds4_row_bytes(type, cols), cols, n_tok, ldx, ldy, X, Y};
    /* Below ~64K multiply-adds waking the workers costs more than the work. */
    if (rows * cols * n_tok < 65536) mm_slice(&t, 0, rows, 0);
    else ds4_pool_run(pool, mm_slice, &t, rows);
}
