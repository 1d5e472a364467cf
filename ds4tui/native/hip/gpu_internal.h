/* gpu_internal.h — state shared by the GPU backend's translation units (not public). */
#ifndef DS4_GPU_INTERNAL_H
#define DS4_GPU_INTERNAL_H

#include "hip_compat.h"
#include "../gpu_api.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

/* The device code target this library was built for (build_native.py passes it). */
#ifndef DS4_GPU_ARCH
#define DS4_GPU_ARCH "unknown"
#endif

struct ds4_gpu_ctx {
    int device;
    hipStream_t stream;
    pthread_mutex_t lock;     /* one caller at a time on the stream and the staging buffers */
    float *dx, *dy;           /* staging for host activations: [dx_cap], [dy_cap] floats */
    size_t dx_cap, dy_cap;
    uint64_t allocated;       /* bytes held: weights, state, staging */
};

/* Format a failure into err and return `code`. */
static inline int gpu_fail(char *err, size_t len, int code, const char *fmt, ...) {
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Check a runtime call: on failure write "<what>: <runtime error name>: <string>" and return DS4_E_DEVICE. */
#define GPU_TRY(call, what)                                                                                   \
    do {                                                                                                      \
        hipError_t e_ = (call);                                                                               \
        if (e_ != hipSuccess)                                                                                 \
            return gpu_fail(err, len, DS4_E_DEVICE, "%s: %s (%s)", (what), hipGetErrorString(e_),             \
                            hipGetErrorName(e_));                                                             \
    } while (0)

/* Device allocation counted in the context's tally. */
int gpu_alloc(ds4_gpu_ctx *c, size_t bytes, void **out, char *err, size_t len);
void gpu_free(ds4_gpu_ctx *c, void *p, size_t bytes);
/* Grow a staging buffer to hold n floats. */
int gpu_stage(ds4_gpu_ctx *c, float **buf, size_t *cap, size_t n, char *err, size_t len);

/* matmul.hip */
int gpu_matmul_init(char *err, size_t len); /* format tables into constant memory (per process) */
int gpu_matmul_launch(hipStream_t st, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                      const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
int gpu_matmul(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
               const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
int gpu_bench_matmul(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                     const float *X, int64_t n, float *Y, int32_t reps, double *ms, char *err, size_t len);

#endif
