/*
 * gpu_api.h — the seam between the C engine and a GPU backend library (internal, not public).
 *
 * The cffi extension is plain C and never links a GPU runtime.  A GPU backend is a separate shared
 * library (libds4tui_hip.so built by hipcc, or libds4tui_cuda.so built by nvcc from the same
 * sources through hip/hip_compat.h; spec platform.md §0.3, §4) that the engine dlopen()s when a
 * session asks for the hip backend.  The library exports one symbol, `ds4_gpu_api_v1`, a function
 * returning this table; a library whose table has another `version` is refused by name.
 *
 * Conventions: every function returns DS4_OK or a negative DS4_E* code and writes an English
 * message (naming the runtime call and its error string) into err[0..len).  Pointers called
 * "device" are device memory owned by the context; "host" pointers are ordinary memory.
 */
#ifndef DS4_GPU_API_H
#define DS4_GPU_API_H

#include <stddef.h>
#include <stdint.h>

#include "ds4_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS4_GPU_API_VERSION 1

typedef struct ds4_gpu_ctx ds4_gpu_ctx;

typedef struct ds4_gpu_api_s {
    int32_t version; /* DS4_GPU_API_VERSION */
    /* What the library is and what the runtime sees (no context needed). */
    int (*probe)(ds4_gpu_info *info, char *err, size_t len);
    /* A context on device `device`: checks that the library's device code runs there (a wrong
     * --offload-arch / -arch is reported as such), makes a stream and staging buffers. */
    int (*open)(int32_t device, ds4_gpu_ctx **out, char *err, size_t len);
    void (*close)(ds4_gpu_ctx *c);
    /* Device memory: `bytes` bytes, copied from host `src` when src is not NULL. */
    int (*upload)(ds4_gpu_ctx *c, const void *src, size_t bytes, void **out, char *err, size_t len);
    void (*free)(ds4_gpu_ctx *c, void *dev, size_t bytes); /* bytes: as uploaded */
    /* Bytes of device memory this context holds (weights, state, staging). */
    uint64_t (*allocated)(const ds4_gpu_ctx *c);
    int (*mem_info)(ds4_gpu_ctx *c, uint64_t *free_bytes, uint64_t *total_bytes, char *err, size_t len);
    /* Y[t*ldy + r] = sum_c W[r, c] * X[t*ldx + c] for t < n, r < rows: W is device memory of `rows`
     * rows of `row_bytes` bytes (GGML `type`, `cols` elements each); X and Y are host float32.
     * Float32 activations, as the CPU kernels (ds4tui/native/cpu/matmul.c): only the float32
     * summation order differs.  Each (row, token) result is independent of n (batch-invariant). */
    int (*matmul)(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                  const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy, char *err, size_t len);
    /* The matmul kernel alone on device buffers, timed with events: uploads host W/X, runs it
     * `reps` times (after one warm-up), downloads Y, and writes the median milliseconds. */
    int (*bench_matmul)(ds4_gpu_ctx *c, int32_t type, const void *W, int64_t rows, int64_t cols, int64_t row_bytes,
                        const float *X, int64_t n, float *Y, int32_t reps, double *ms, char *err, size_t len);
    /* Device memory bandwidth: a read-only kernel over `bytes` bytes, best of `reps`, in GB/s. */
    int (*bandwidth)(ds4_gpu_ctx *c, size_t bytes, int32_t reps, double *gbs, char *err, size_t len);
} ds4_gpu_api;

typedef const ds4_gpu_api *(*ds4_gpu_api_fn)(void);

/* gpu.c: load a backend library by path; on failure err says which file and why (dlopen's text,
 * missing symbol, version).  *handle is for ds4_gpu_unload. */
int ds4_gpu_load(const char *path, void **handle, const ds4_gpu_api **api, char *err, size_t len);
void ds4_gpu_unload(void *handle);

#ifdef __cplusplus
}
#endif

#endif
