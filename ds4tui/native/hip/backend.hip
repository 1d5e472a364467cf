/*
 * backend.hip — the GPU backend library's entry point: device probe, context, device memory,
 * bandwidth test and the exported function table `ds4_gpu_api_v1` (see ../backend.h).
 *
 * Built as libds4tui_hip.so (hipcc/clang, AMD) or libds4tui_cuda.so (nvcc -x cu, NVIDIA) by
 * build_native.py; the C engine dlopen()s it (spec platform.md §0.3).
 */
#include "gpu_internal.h"

#include <stdlib.h>
#include <string.h>

#include <algorithm>

int gpu_alloc(ds4_gpu_ctx *c, size_t bytes, void **out, char *err, size_t len) {
    *out = NULL;
    if (bytes == 0) bytes = 1;
    hipError_t e = hipMalloc(out, bytes);
    if (e != hipSuccess) {
        *out = NULL;
        size_t fr = 0, tot = 0;
        (void)hipMemGetInfo(&fr, &tot);
        return gpu_fail(err, len, DS4_E_NOMEM, "device allocation of %zu bytes failed: %s (device %d: %zu of %zu bytes "
                        "free, %llu held by this engine)", bytes, hipGetErrorString(e), c->device, fr, tot,
                        (unsigned long long)c->allocated);
    }
    c->allocated += bytes;
    return DS4_OK;
}

void gpu_free(ds4_gpu_ctx *c, void *p, size_t bytes) {
    if (!p) return;
    (void)hipFree(p);
    c->allocated -= bytes ? bytes : 1;
}

int gpu_stage(ds4_gpu_ctx *c, float **buf, size_t *cap, size_t n, char *err, size_t len) {
    if (n <= *cap) return DS4_OK;
    size_t want = std::max(n, *cap * 2);
    gpu_free(c, *buf, *cap * sizeof(float));
    *buf = NULL;
    *cap = 0;
    void *p = NULL;
    int rc = gpu_alloc(c, want * sizeof(float), &p, err, len);
    if (rc != DS4_OK) return rc;
    *buf = (float *)p;
    *cap = want;
    return DS4_OK;
}

int gpu_stage_ready(ds4_gpu_ctx *c, char *err, size_t len) {
    if (c->stage[1] && c->stage_free[1]) return DS4_OK;
    for (int i = 0; i < 2; i++) {
        if (!c->stage[i]) {
            hipError_t e = hipHostMalloc(&c->stage[i], GPU_STAGE_BYTES, hipHostMallocDefault);
            if (e != hipSuccess) {
                c->stage[i] = NULL;
                return gpu_fail(err, len, DS4_E_NOMEM, "pinned host staging buffer of %zu bytes (hipHostMalloc): %s",
                                GPU_STAGE_BYTES, hipGetErrorString(e));
            }
        }
        if (!c->stage_free[i])
            GPU_TRY(hipEventCreateWithFlags(&c->stage_free[i], hipEventDisableTiming), "staging event");
    }
    return DS4_OK;
}

int gpu_stage_wait(ds4_gpu_ctx *c, char *err, size_t len) {
    int rc = gpu_stage_ready(c, err, len);
    if (rc != DS4_OK) return rc;
    for (int i = 0; i < 2; i++) GPU_TRY(hipEventSynchronize(c->stage_free[i]), "wait for a staging copy");
    return DS4_OK;
}

int gpu_put(ds4_gpu_ctx *c, void *dst, const void *src, size_t bytes, char *err, size_t len) {
    int rc = gpu_stage_ready(c, err, len);
    if (rc != DS4_OK) return rc;
    for (size_t off = 0; off < bytes; off += GPU_STAGE_BYTES) {
        const size_t n = std::min(GPU_STAGE_BYTES, bytes - off);
        const int b = c->stage_next;
        c->stage_next ^= 1;
        GPU_TRY(hipEventSynchronize(c->stage_free[b]), "wait for a staging buffer"); /* its last copy is done */
        memcpy(c->stage[b], (const uint8_t *)src + off, n);
        hipError_t e = hipMemcpyAsync((uint8_t *)dst + off, c->stage[b], n, hipMemcpyHostToDevice, c->stream);
        if (e == hipSuccess) e = hipEventRecord(c->stage_free[b], c->stream);
        if (e != hipSuccess)
            return gpu_fail(err, len, DS4_E_DEVICE, "copy %zu bytes to the device (bytes %zu..%zu of %zu) through "
                            "pinned staging: %s", n, off, off + n, bytes, hipGetErrorString(e));
    }
    return DS4_OK;
}

int gpu_reserve(ds4_gpu_ctx *c, int64_t x_floats, int64_t y_floats, char *err, size_t len) {
    pthread_mutex_lock(&c->lock);
    int rc = gpu_stage(c, &c->dx, &c->dx_cap, (size_t)(x_floats > 0 ? x_floats : 0), err, len);
    if (rc == DS4_OK) rc = gpu_stage(c, &c->dy, &c->dy_cap, (size_t)(y_floats > 0 ? y_floats : 0), err, len);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

__global__ void probe_kernel(int *out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *out = 0x5eed;
}

static void device_arch(const hipDeviceProp_t &p, char *out, size_t n) {
#if defined(GPU_AMD)
    snprintf(out, n, "%s", p.gcnArchName);
    char *colon = strchr(out, ':'); /* "gfx90a:sramecc+:xnack-" -> "gfx90a" */
    if (colon) *colon = 0;
#else
    snprintf(out, n, "sm_%d%d", p.major, p.minor);
#endif
}

/* Run a trivial kernel: a library built for another arch fails here ("no kernel image", "invalid
 * device function"), which the probe reports as a wrong-arch build. */
static int check_kernel_runs(int device, const char *dev_arch, char *err, size_t len) {
    int *d = NULL, h = 0;
    GPU_TRY(hipMalloc((void **)&d, sizeof(int)), "allocate the probe word");
    hipLaunchKernelGGL(probe_kernel, dim3(1), dim3(GPU_WARP), 0, 0, d);
    hipError_t e = hipGetLastError();
    if (e == hipSuccess) e = hipDeviceSynchronize();
    if (e == hipSuccess) e = hipMemcpy(&h, d, sizeof h, hipMemcpyDeviceToHost);
    (void)hipFree(d);
    if (e != hipSuccess || h != 0x5eed)
        return gpu_fail(err, len, DS4_E_DEVICE,
                        "wrong arch: this library's device code (built for %s) does not run on device %d (%s): %s; "
                        "rebuild with %s=%s", DS4_GPU_ARCH, device, dev_arch,
                        e != hipSuccess ? hipGetErrorString(e) : "the probe kernel wrote nothing",
#if defined(GPU_AMD)
                        "DS4TUI_HIP_ARCH",
#else
                        "DS4TUI_CUDA_ARCH",
#endif
                        dev_arch);
    return DS4_OK;
}

static int probe(ds4_gpu_info *info, char *err, size_t len) {
    snprintf(info->platform, sizeof info->platform, "%s", GPU_PLATFORM);
    snprintf(info->built_arch, sizeof info->built_arch, "%s", DS4_GPU_ARCH);
    (void)gpu_blas_describe(info->blas, sizeof info->blas); /* the prefill GEMM's library (gemm.hip) */
    int v = 0;
    if (hipRuntimeGetVersion(&v) == hipSuccess) info->runtime_version = v;
    v = 0;
    if (hipDriverGetVersion(&v) == hipSuccess) info->driver_version = v;
    int n = 0;
    hipError_t e = hipGetDeviceCount(&n);
    if (e != hipSuccess || n <= 0) {
        info->n_devices = 0;
        if (info->driver_version == 0)
            return gpu_fail(err, len, DS4_E_DEVICE, "no device: no %s driver is loaded (the runtime says: %s)",
                            GPU_RUNTIME_NAME, e != hipSuccess ? hipGetErrorString(e) : "device count 0");
        return gpu_fail(err, len, DS4_E_DEVICE, "no device: the %s runtime sees no GPU (%s)", GPU_RUNTIME_NAME,
                        e != hipSuccess ? hipGetErrorString(e) : "device count 0");
    }
    info->n_devices = n;
    int dev = info->device;
    if (dev < 0 || dev >= n)
        return gpu_fail(err, len, DS4_E_DEVICE, "no device %d: the runtime sees %d device(s)", dev, n);
    hipDeviceProp_t p;
    GPU_TRY(hipGetDeviceProperties(&p, dev), "hipGetDeviceProperties");
    snprintf(info->device_name, sizeof info->device_name, "%s", p.name);
    device_arch(p, info->device_arch, sizeof info->device_arch);
    info->warp_size = p.warpSize;
    info->integrated = p.integrated != 0;
    GPU_TRY(hipSetDevice(dev), "hipSetDevice");
    size_t fr = 0, tot = 0;
    GPU_TRY(hipMemGetInfo(&fr, &tot), "hipMemGetInfo");
    info->mem_free = fr;
    info->mem_total = tot;
    if (p.warpSize != GPU_WARP)
        return gpu_fail(err, len, DS4_E_DEVICE, "device %d (%s, %s) runs %d-lane warps; the kernels need %d", dev, p.name,
                        info->device_arch, p.warpSize, GPU_WARP);
    int rc = check_kernel_runs(dev, info->device_arch, err, len);
    info->arch_ok = rc == DS4_OK;
    return rc;
}

static int open_ctx(int32_t device, ds4_gpu_ctx **out, char *err, size_t len) {
    *out = NULL;
    ds4_gpu_info info;
    memset(&info, 0, sizeof info);
    info.device = device;
    int rc = probe(&info, err, len);
    if (rc != DS4_OK) return rc;
    if ((rc = gpu_matmul_init(err, len)) != DS4_OK) return rc;
    if ((rc = gpu_ops_init(err, len)) != DS4_OK) return rc;
    ds4_gpu_ctx *c = (ds4_gpu_ctx *)calloc(1, sizeof *c);
    if (!c) return gpu_fail(err, len, DS4_E_NOMEM, "out of memory");
    c->device = device;
    pthread_mutex_init(&c->lock, NULL);
    hipError_t e = hipStreamCreate(&c->stream);
    if (e != hipSuccess) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        return gpu_fail(err, len, DS4_E_DEVICE, "hipStreamCreate: %s", hipGetErrorString(e));
    }
    rc = gpu_alloc(c, ARGMAX_SCRATCH_BYTES, &c->amax, err, len);
    if (rc == DS4_OK) rc = gpu_alloc(c, GPU_Q8_PRE_BYTES, &c->q8_pre, err, len);
    if (rc != DS4_OK) {
        gpu_free(c, c->amax, ARGMAX_SCRATCH_BYTES);
        (void)hipStreamDestroy(c->stream);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return rc;
    }
    *out = c;
    return DS4_OK;
}

static void close_ctx(ds4_gpu_ctx *c) {
    if (!c) return;
    (void)hipStreamSynchronize(c->stream);
    gpu_gemm_close(c);
    gpu_free(c, c->amax, ARGMAX_SCRATCH_BYTES);
    gpu_free(c, c->q8_pre, GPU_Q8_PRE_BYTES);
    for (int i = 0; i < 2; i++) {
        if (c->stage[i]) (void)hipHostFree(c->stage[i]);
        if (c->stage_free[i]) (void)hipEventDestroy(c->stage_free[i]);
    }
    gpu_free(c, c->dx, c->dx_cap * sizeof(float));
    gpu_free(c, c->dy, c->dy_cap * sizeof(float));
    (void)hipStreamDestroy(c->stream);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* Vectors and small tensors (and anything the forward state uploads): through the pinned staging
 * buffers, as the weight matrices (planar.hip), never a copy straight from the caller's pages (a
 * GGUF mapping: ROCm pins large pageable sources in place rather than staging them). */
static int upload(ds4_gpu_ctx *c, const void *src, size_t bytes, void **out, char *err, size_t len) {
    int rc = gpu_alloc(c, bytes, out, err, len);
    if (rc != DS4_OK || !src) return rc;
    pthread_mutex_lock(&c->lock);
    rc = gpu_put(c, *out, src, bytes, err, len);
    if (rc == DS4_OK) {
        hipError_t e = hipStreamSynchronize(c->stream);
        if (e != hipSuccess)
            rc = gpu_fail(err, len, DS4_E_DEVICE, "copy %zu bytes to the device: %s", bytes, hipGetErrorString(e));
    }
    pthread_mutex_unlock(&c->lock);
    if (rc != DS4_OK) {
        gpu_free(c, *out, bytes);
        *out = NULL;
    }
    return rc;
}

static uint64_t allocated(const ds4_gpu_ctx *c) { return c ? c->allocated : 0; }

static int mem_info(ds4_gpu_ctx *c, uint64_t *free_bytes, uint64_t *total_bytes, char *err, size_t len) {
    (void)c;
    size_t fr = 0, tot = 0;
    GPU_TRY(hipMemGetInfo(&fr, &tot), "hipMemGetInfo");
    *free_bytes = fr;
    *total_bytes = tot;
    return DS4_OK;
}

/* Read-only streaming kernel: each thread sums float4s; one store per thread keeps the loads live. */
__global__ void read_kernel(const float4 *__restrict__ p, size_t n4, float *__restrict__ sink) {
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = p[i];
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 12345.678f) sink[0] = s; /* never true for the zero-filled buffer; the compiler cannot know */
}

static int bandwidth(ds4_gpu_ctx *c, size_t bytes, int32_t reps, double *gbs, char *err, size_t len) {
    if (reps < 1) return gpu_fail(err, len, DS4_E_INVALID, "reps must be >= 1, got %d", reps);
    bytes &= ~(size_t)15;
    void *buf = NULL, *sink = NULL;
    int rc = gpu_alloc(c, bytes, &buf, err, len);
    if (rc == DS4_OK) rc = gpu_alloc(c, 16, &sink, err, len);
    hipEvent_t e0 = NULL, e1 = NULL;
    double best = 0.0;
    if (rc == DS4_OK) {
        hipError_t e = hipMemset(buf, 0, bytes);
        if (e == hipSuccess) e = hipEventCreate(&e0);
        if (e == hipSuccess) e = hipEventCreate(&e1);
        hipDeviceProp_t p;
        if (e == hipSuccess) e = hipGetDeviceProperties(&p, c->device);
        const int blocks = e == hipSuccess ? p.multiProcessorCount * 8 : 1;
        for (int i = 0; e == hipSuccess && i <= reps; i++) {
            e = hipEventRecord(e0, c->stream);
            hipLaunchKernelGGL(read_kernel, dim3(blocks), dim3(256), 0, c->stream, (const float4 *)buf, bytes / 16,
                               (float *)sink);
            if (e == hipSuccess) e = hipGetLastError();
            if (e == hipSuccess) e = hipEventRecord(e1, c->stream);
            if (e == hipSuccess) e = hipEventSynchronize(e1);
            float ms = 0.0f;
            if (e == hipSuccess) e = hipEventElapsedTime(&ms, e0, e1);
            if (e == hipSuccess && i > 0 && ms > 0.0f) best = std::max(best, (double)bytes / (ms * 1e-3) / 1e9);
        }
        if (e != hipSuccess) rc = gpu_fail(err, len, DS4_E_DEVICE, "bandwidth test: %s", hipGetErrorString(e));
    }
    if (e0) (void)hipEventDestroy(e0);
    if (e1) (void)hipEventDestroy(e1);
    gpu_free(c, buf, bytes);
    gpu_free(c, sink, 16);
    if (rc == DS4_OK) *gbs = best;
    return rc;
}

static int gpu_activations(ds4_gpu_ctx *c, int32_t mode, char *err, size_t len) {
    if (mode != DS4_ACTIVATIONS_F32 && mode != DS4_ACTIVATIONS_Q8)
        return gpu_fail(err, len, DS4_E_INVALID, "activations %d: expected %d (f32) or %d (q8)", mode,
                        DS4_ACTIVATIONS_F32, DS4_ACTIVATIONS_Q8);
    pthread_mutex_lock(&c->lock);
    c->act_q8 = mode == DS4_ACTIVATIONS_Q8;
    c->q8_sx = NULL; /* rows shared under the old mode are not the new mode's */
    pthread_mutex_unlock(&c->lock);
    return DS4_OK;
}

/* ---- graphs of a pass (backend.h version 7; spec platform.md §8) ------------------------------ */

static int gpu_graph_begin(ds4_gpu_ctx *c, const int64_t *dp0, int64_t p0, char *err, size_t len) {
    if (!dp0) return gpu_fail(err, len, DS4_E_INVALID, "graph capture: no device position word");
    if (c->cap_dp0) return gpu_fail(err, len, DS4_E_STATE, "graph capture: already capturing");
    /* thread-local: another thread's runtime calls (memory telemetry) neither break nor join it */
    GPU_TRY(hipStreamBeginCapture(c->stream, hipStreamCaptureModeThreadLocal), "begin a graph capture of the pass");
    c->cap_dp0 = dp0;
    c->cap_p0 = p0;
    return DS4_OK;
}

static int gpu_graph_end(ds4_gpu_ctx *c, int32_t ok, void **graph, char *err, size_t len) {
    *graph = NULL;
    if (!c->cap_dp0) return gpu_fail(err, len, DS4_E_STATE, "graph capture: not capturing");
    c->cap_dp0 = NULL;
    hipGraph_t g = NULL;
    hipError_t e = hipStreamEndCapture(c->stream, &g);
    (void)hipGetLastError(); /* a refused capture leaves its error behind: the plain launches start clean */
    if (e != hipSuccess || !g) {
        if (g) (void)hipGraphDestroy(g);
        if (!ok) return DS4_OK;
        return gpu_fail(err, len, DS4_E_UNSUPPORTED, "graph capture of the pass: %s (%s)",
                        e != hipSuccess ? hipGetErrorString(e) : "the runtime returned no graph",
                        e != hipSuccess ? hipGetErrorName(e) : "no graph");
    }
    if (!ok) {
        (void)hipGraphDestroy(g);
        return DS4_OK;
    }
    hipGraphExec_t x = NULL;
    e = hipGraphInstantiateWithFlags(&x, g, 0);
    (void)hipGraphDestroy(g); /* the executable graph keeps what it needs */
    if (e != hipSuccess || !x) {
        (void)hipGetLastError();
        return gpu_fail(err, len, DS4_E_UNSUPPORTED, "graph instantiation of the pass: %s (%s)",
                        e != hipSuccess ? hipGetErrorString(e) : "the runtime returned no graph",
                        e != hipSuccess ? hipGetErrorName(e) : "no graph");
    }
    *graph = (void *)x;
    return DS4_OK;
}

static int gpu_graph_launch(ds4_gpu_ctx *c, void *graph, char *err, size_t len) {
    GPU_TRY(hipGraphLaunch((hipGraphExec_t)graph, c->stream), "launch the graph of the pass");
    return DS4_OK;
}

static void gpu_graph_free(ds4_gpu_ctx *c, void *graph) {
    if (!graph) return;
    (void)hipStreamSynchronize(c->stream); /* no replay of it still queued */
    (void)hipGraphExecDestroy((hipGraphExec_t)graph);
}

static const ds4_backend k_api = {
    DS4_GPU_API_VERSION, probe, open_ctx, close_ctx, upload, gpu_free, allocated, mem_info,
    gpu_matmul, gpu_bench_matmul, bandwidth,
    gpu_copy, gpu_sync, gpu_mm_dev, gpu_mm_gather, gpu_embed, gpu_rms_norm, gpu_hc_pre, gpu_hc_post, gpu_hc_head,
    gpu_norm_rope, gpu_kv_store, gpu_compress, gpu_indexer, gpu_attend, gpu_moe_route, gpu_swiglu, gpu_moe_combine,
    gpu_scale, gpu_capture, gpu_attend_nc,
    gpu_upload_matrix, gpu_reserve, gpu_add_argmax,
    0, /* host_memory */
    gpu_gemm,
    gpu_activations,
    gpu_graph_begin, gpu_graph_end, gpu_graph_launch, gpu_graph_free,
    gpu_argmax_rows,
    gpu_mm_grouped,
    gpu_q8_share,
};

extern "C" __attribute__((visibility("default"))) const ds4_backend *ds4_gpu_api_v1(void) { return &k_api; }
