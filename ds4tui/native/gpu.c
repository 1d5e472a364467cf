/* gpu.c — the engine's side of the GPU backend seam (spec platform.md §0.3, §4 option B).
 *
 * The GPU backend is a separate shared library (backend.h) that is dlopen()ed here; the cffi
 * extension never links a GPU runtime, so it builds and runs wherever a C compiler does.  Every
 * failure names its cause: the file (missing, or dlopen's message), the symbol or table version,
 * no device, a wrong-arch build, a runtime call.
 *
 * With DS4_BACKEND_HIP the engine uploads every weight matrix the forward pass and the drafter
 * multiply with to device memory at open (progress reported through the options' callback); the
 * library's table is then the engine's op table (forward.c runs every pass through it).  Before
 * the first byte goes up, the bytes to upload are held against what the runtime reports free, and
 * a set that cannot fit is refused with the numbers (the Python side checks the amdgpu GTT budget
 * before it opens the engine: ds4tui/engine/memplan.py).
 *
 * A library is loaded once per process and never unloaded (RTLD_NODELETE, no dlclose): the probe,
 * every engine and the stand-alone kernel entry points share the one copy.  Tearing the ROCm
 * runtime down and bringing it up again in one process has crashed it (spec platform.md §4).
 */
#include "internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int ds4_gpu_load(const char *path, void **handle, const ds4_backend **api, char *err, size_t len) {
    *handle = NULL;
    *api = NULL;
    if (!path || !*path)
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "no GPU backend library given (libds4tui_hip.so / libds4tui_cuda.so)");
    struct stat st;
    if (stat(path, &st) != 0)
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "GPU backend library '%s' does not exist", path);
    /* Loaded for the life of the process: RTLD_NODELETE keeps it (and the GPU runtime it brings)
     * mapped whatever else closes it, and nothing here ever calls dlclose.  A second load of the
     * same path returns the same handle. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *why = dlerror();
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "GPU backend library '%s' failed to load: %s", path,
                        why ? why : "unknown dlopen error");
    }
    ds4_gpu_api_fn fn;
    *(void **)&fn = dlsym(h, "ds4_gpu_api_v1");
    if (!fn)
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "'%s' is not a ds4tui GPU backend library: no symbol ds4_gpu_api_v1", path);
    const ds4_backend *a = fn();
    if (!a || a->version != DS4_GPU_API_VERSION)
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "GPU backend library '%s': API version %d, this engine needs %d "
                        "(rebuild it with this ds4tui)", path, a ? a->version : -1, DS4_GPU_API_VERSION);
    *handle = h;
    *api = a;
    return DS4_OK;
}

int ds4_gpu_probe(const char *library, ds4_gpu_info *out, char *err, size_t err_len) {
    if (!out) return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_probe: out is NULL");
    memset(out, 0, sizeof *out);
    snprintf(out->library, sizeof out->library, "%s", library ? library : "");
    void *h;
    const ds4_backend *api;
    int rc = ds4_gpu_load(library, &h, &api, err, err_len);
    if (rc != DS4_OK) return rc;
    return api->probe(out, err, err_len);
}

/* A context on device 0 of a library, for the stand-alone kernel entry points. */
static int scratch_ctx(const char *library, void **h, const ds4_backend **api, ds4_backend_ctx **ctx, char *err,
                       size_t len) {
    int rc = ds4_gpu_load(library, h, api, err, len);
    if (rc != DS4_OK) return rc;
    return (*api)->open(0, ctx, err, len);
}

int ds4_gpu_kernel_matmul(const char *library, int type, int32_t activations, const void *W, int64_t rows, int64_t cols,
                          const float *X, int64_t n_tok, float *Y, int32_t reps, double *ms, char *err, size_t err_len) {
    size_t rb = ds4_row_bytes(type & ~DS4_GPU_PLANAR, cols);
    if (rb == 0 || rows <= 0 || n_tok <= 0 || !W || !X || !Y)
        return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_matmul: bad arguments (type %d, %lld x %lld, %lld tokens)",
                        type, (long long)rows, (long long)cols, (long long)n_tok);
    void *h;
    const ds4_backend *api;
    ds4_backend_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) return rc;
    double t = 0.0;
    rc = api->activations(ctx, activations, err, err_len);
    if (rc == DS4_OK)
        rc = api->bench_matmul(ctx, type, W, rows, cols, (int64_t)rb, X, n_tok, Y, reps < 1 ? 1 : reps, &t, err, err_len);
    if (rc == DS4_OK && ms) *ms = t;
    api->close(ctx);
    return rc;
}

int ds4_gpu_kernel_gather(const char *library, int type, int32_t activations, const void *W, int64_t n_mat, int64_t rows,
                          int64_t cols, const int32_t *ids, int64_t n_slots, const float *X, float *Y, int32_t reps,
                          double *ms, char *err, size_t err_len) {
    const int32_t base = type & ~DS4_GPU_PLANAR;
    size_t rb = ds4_row_bytes(base, cols);
    if (rb == 0 || n_mat <= 0 || rows <= 0 || n_slots <= 0 || !W || !ids || !X || !Y)
        return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_gather: bad arguments (type %d, %lld matrices of "
                        "%lld x %lld, %lld slots)", type, (long long)n_mat, (long long)rows, (long long)cols,
                        (long long)n_slots);
    for (int64_t i = 0; i < n_slots; i++)
        if (ids[i] < 0 || ids[i] >= n_mat)
            return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_gather: slot %lld uses matrix %d of %lld",
                            (long long)i, ids[i], (long long)n_mat);
    void *h;
    const ds4_backend *api;
    ds4_backend_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) return rc;
    void *dw = NULL, *di = NULL, *dx = NULL, *dy = NULL;
    int32_t layout = base;
    const size_t wb = (size_t)(n_mat * rows) * rb, ib = (size_t)n_slots * sizeof(int32_t),
                 xb = (size_t)(n_slots * cols) * sizeof(float), yb = (size_t)(n_slots * rows) * sizeof(float);
    rc = api->activations(ctx, activations, err, err_len);
    if (rc == DS4_OK)
        rc = api->upload_matrix(ctx, W, base, n_mat * rows, cols, (int64_t)rb, (type & DS4_GPU_PLANAR) != 0, &dw,
                                &layout, err, err_len);
    if (rc == DS4_OK && layout != type)
        rc = ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_gather: GGML type %d with %lld columns cannot take "
                      "the planar layout", base, (long long)cols);
    if (rc == DS4_OK) rc = api->upload(ctx, ids, ib, &di, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, X, xb, &dx, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, NULL, yb, &dy, err, err_len);
    if (rc == DS4_OK)
        rc = api->mm_gather(ctx, layout, dw, rows * (int64_t)rb, (const int32_t *)di, rows, cols, (int64_t)rb,
                            (const float *)dx, cols, 1, n_slots, (float *)dy, rows, err, err_len);
    if (rc == DS4_OK) rc = api->copy(ctx, Y, dy, yb, 1, err, err_len);
    if (rc == DS4_OK) rc = api->sync(ctx, err, err_len);
    if (rc == DS4_OK && ms) {
        const int32_t n_rep = reps < 1 ? 1 : reps;
        const double t0 = ds4_now_ms();
        for (int32_t r = 0; rc == DS4_OK && r < n_rep; r++)
            rc = api->mm_gather(ctx, layout, dw, rows * (int64_t)rb, (const int32_t *)di, rows, cols, (int64_t)rb,
                                (const float *)dx, cols, 1, n_slots, (float *)dy, rows, err, err_len);
        if (rc == DS4_OK) rc = api->sync(ctx, err, err_len);
        *ms = (ds4_now_ms() - t0) / n_rep;
    }
    api->free(ctx, dw, wb);
    api->free(ctx, di, ib);
    api->free(ctx, dx, xb);
    api->free(ctx, dy, yb);
    api->close(ctx);
    return rc;
}

int ds4_gpu_kernel_grouped(const char *library, int type, int32_t activations, const void *W, int32_t groups,
                           int64_t rows, int64_t cols, int64_t n, const float *X, float *Y, char *err, size_t err_len) {
    const int32_t base = type & ~DS4_GPU_PLANAR;
    size_t rb = ds4_row_bytes(base, cols);
    if (rb == 0 || groups <= 0 || rows <= 0 || n <= 0 || !W || !X || !Y)
        return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_grouped: bad arguments (type %d, %d groups of "
                        "%lld x %lld, %lld tokens)", type, groups, (long long)rows, (long long)cols, (long long)n);
    const int64_t n_slots = n * groups;
    int32_t *ids = malloc((size_t)n_slots * sizeof *ids);
    if (!ids) return ds4_fail(err, err_len, DS4_E_NOMEM, "ds4_gpu_kernel_grouped: out of memory");
    for (int64_t s = 0; s < n_slots; s++) ids[s] = (int32_t)(s % groups);
    void *h;
    const ds4_backend *api;
    ds4_backend_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) {
        free(ids);
        return rc;
    }
    void *dw = NULL, *di = NULL, *dx = NULL, *dy = NULL;
    int32_t layout = base;
    const size_t wb = (size_t)((int64_t)groups * rows) * rb, ib = (size_t)n_slots * sizeof(int32_t),
                 xb = (size_t)(n_slots * cols) * sizeof(float), yb = (size_t)(n_slots * rows) * sizeof(float);
    if (!api->mm_grouped)
        rc = ds4_fail(err, err_len, DS4_E_UNSUPPORTED, "ds4_gpu_kernel_grouped: %s has no grouped products", library);
    if (rc == DS4_OK) rc = api->activations(ctx, activations, err, err_len);
    if (rc == DS4_OK)
        rc = api->upload_matrix(ctx, W, base, (int64_t)groups * rows, cols, (int64_t)rb, (type & DS4_GPU_PLANAR) != 0,
                                &dw, &layout, err, err_len);
    if (rc == DS4_OK && layout != type)
        rc = ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_grouped: GGML type %d with %lld columns cannot take "
                      "the planar layout", base, (long long)cols);
    if (rc == DS4_OK) rc = api->upload(ctx, ids, ib, &di, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, X, xb, &dx, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, NULL, yb, &dy, err, err_len);
    if (rc == DS4_OK)
        rc = api->mm_grouped(ctx, layout, dw, rows * (int64_t)rb, (const int32_t *)di, groups, rows, cols, (int64_t)rb,
                             (const float *)dx, n, (float *)dy, err, err_len);
    if (rc == DS4_OK) rc = api->copy(ctx, Y, dy, yb, 1, err, err_len);
    if (rc == DS4_OK) rc = api->sync(ctx, err, err_len);
    api->free(ctx, dw, wb);
    api->free(ctx, di, ib);
    api->free(ctx, dx, xb);
    api->free(ctx, dy, yb);
    api->close(ctx);
    free(ids);
    return rc;
}

int ds4_gpu_kernel_indexer(const char *library, const float *qi, const float *iw, int32_t n, int64_t p0, int32_t IH,
                           int32_t ID, const float *keys, int32_t ratio, int32_t top_k, float scale, int32_t *sel,
                           int32_t *nsel, char *err, size_t err_len) {
    const int64_t n_keys = (p0 + n) / (ratio > 0 ? ratio : 1);
    if (!qi || !iw || !keys || !sel || !nsel || n <= 0 || p0 < 0 || IH <= 0 || ID <= 0 || ratio <= 0 || top_k <= 0 ||
        n_keys > INT32_MAX)
        return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_indexer: bad arguments (%d tokens at %lld, %d "
                        "heads of %d, ratio %d, top_k %d)", n, (long long)p0, IH, ID, ratio, top_k);
    void *h;
    const ds4_backend *api;
    ds4_backend_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) return rc;
    const int32_t max_vis = (int32_t)(n_keys > 0 ? n_keys : 1);
    const size_t qb = (size_t)n * IH * ID * sizeof(float), wb = (size_t)n * IH * sizeof(float),
                 kb = (size_t)max_vis * ID * sizeof(float), sb = (size_t)n * max_vis * sizeof(float),
                 selb = (size_t)n * top_k * sizeof(int32_t), nb = (size_t)n * sizeof(int32_t);
    void *dq = NULL, *dw = NULL, *dk = NULL, *ds = NULL, *dsel = NULL, *dn = NULL;
    rc = api->upload(ctx, qi, qb, &dq, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, iw, wb, &dw, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, n_keys > 0 ? keys : NULL, kb, &dk, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, NULL, sb, &ds, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, NULL, selb, &dsel, err, err_len);
    if (rc == DS4_OK) rc = api->upload(ctx, NULL, nb, &dn, err, err_len);
    if (rc == DS4_OK)
        rc = api->indexer(ctx, (const float *)dq, (const float *)dw, n, p0, IH, ID, (const float *)dk, ratio, top_k,
                          scale, (float *)ds, max_vis, (int32_t *)dsel, (int32_t *)dn, err, err_len);
    if (rc == DS4_OK) rc = api->copy(ctx, sel, dsel, selb, 1, err, err_len);
    if (rc == DS4_OK) rc = api->copy(ctx, nsel, dn, nb, 1, err, err_len);
    if (rc == DS4_OK) rc = api->sync(ctx, err, err_len);
    if (dq) api->free(ctx, dq, qb);
    if (dw) api->free(ctx, dw, wb);
    if (dk) api->free(ctx, dk, kb);
    if (ds) api->free(ctx, ds, sb);
    if (dsel) api->free(ctx, dsel, selb);
    if (dn) api->free(ctx, dn, nb);
    api->close(ctx);
    return rc;
}

int ds4_gpu_bandwidth(const char *library, uint64_t bytes, int32_t reps, double *gbs, char *err, size_t err_len) {
    void *h;
    const ds4_backend *api;
    ds4_backend_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) return rc;
    rc = api->bandwidth(ctx, (size_t)bytes, reps, gbs, err, err_len);
    api->close(ctx);
    return rc;
}

int ds4_gpu_kernel_upload(const char *library, int32_t type, const void *src, int64_t rows, int64_t cols, void *out,
                          int32_t *layout, char *err, size_t err_len) {
    const int32_t base = type & ~DS4_GPU_PLANAR;
    const size_t rb = type == DS4_GPU_UPLOAD_BYTES ? (size_t)cols : ds4_row_bytes(base, cols);
    if (rb == 0 || rows <= 0 || !src || !out || !layout)
        return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_upload: bad arguments (type %d, %lld x %lld)", type,
                        (long long)rows, (long long)cols);
    void *h;
    const ds4_backend *api;
    ds4_backend_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) return rc;
    const size_t bytes = (size_t)rows * rb;
    void *dev = NULL;
    *layout = type;
    if (type == DS4_GPU_UPLOAD_BYTES) rc = api->upload(ctx, src, bytes, &dev, err, err_len);
    else
        rc = api->upload_matrix(ctx, src, base, rows, cols, (int64_t)rb, (type & DS4_GPU_PLANAR) != 0, &dev, layout, err,
                                err_len);
    if (rc == DS4_OK) rc = api->copy(ctx, out, dev, bytes, 1, err, err_len);
    if (dev) api->free(ctx, dev, bytes);
    api->close(ctx);
    return rc;
}

/* ---- weights in device memory -------------------------------------------------------------- */

static uint64_t w_bytes(const ds4_w *w) { return (uint64_t)w->mat_bytes * (uint64_t)w->n_mat; }

typedef struct {
    ds4_engine *e;
    uint64_t done, total;
    void (*progress)(void *, uint64_t, uint64_t);
    void *ctx;
} uploader;

/* The planar layout (hip/planar.hip) for every matrix the matmul kernels read; the embedding and
 * the drafter's Markov W1 keep GGML rows (gpu_embed reads them: spec platform.md §9).  DS4_GPU_LAYOUT_GGML keeps GGML rows everywhere (for
 * side-by-side kernel comparisons; results differ only by float32 rounding order). */
static int want_planar(const ds4_engine *e, const ds4_w *w) {
    return w != &e->token_embd && !(e->sup && (w == &e->sup->markov_w1 || w == &e->sup->vd_w1)) && e->gpu_layout == DS4_GPU_LAYOUT_PLANAR && ds4_type(w->type)->gpu_planar;
}

static int upload_w(uploader *u, ds4_w *w, char *err, size_t len) {
    ds4_engine *e = u->e;
    void *dev = NULL;
    int32_t layout = w->type;
    int planar = want_planar(e, w);
    int rc = e->ops->upload_matrix(e->ctx, w->data, w->type, w->rows * w->n_mat, w->cols, (int64_t)w->row_bytes,
                                   planar, &dev, &layout, err, len);
    if (rc != DS4_OK) return rc;
    w->dev = dev;
    w->dev_layout = layout;
    u->done += w_bytes(w);
    if (u->progress) u->progress(u->ctx, u->done, u->total);
    return DS4_OK;
}

static void free_w(ds4_engine *e, ds4_w *w) {
    if (w->dev) e->ops->free(e->ctx, (void *)w->dev, (size_t)w_bytes(w));
    w->dev = NULL;
}

/* The memory plan, before any upload: `need` bytes against what the runtime reports free.  On an
 * integrated GPU (an APU) the runtime's numbers are no plan: hipMemGetInfo has reported only the
 * VRAM carve-out there, or free > total; the plan is then the caller's, against the amdgpu GTT and
 * VRAM pools (ds4tui/engine/memplan.py). */
static int plan_fits(ds4_engine *e, uint64_t need, const char *what, char *err, size_t len) {
    uint64_t fr = 0, tot = 0;
    char why[256];
    if (e->gpu_integrated || e->ops->mem_info(e->ctx, &fr, &tot, why, sizeof why) != DS4_OK || fr > tot || need <= fr)
        return DS4_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return ds4_fail(err, len, DS4_E_NOMEM, "%s need %.2f GiB of device memory, but the GPU runtime reports %.2f GiB "
                    "free of %.2f GiB: nothing was uploaded", what, (double)need / gib, (double)fr / gib,
                    (double)tot / gib);
}

static int upload_all(ds4_engine *e, ds4_w **ws, int n, void (*progress)(void *, uint64_t, uint64_t), void *pctx,
                      const char *what, char *err, size_t len) {
    uploader u = {e, 0, 0, progress, pctx};
    for (int i = 0; i < n; i++) u.total += w_bytes(ws[i]);
    int rc = plan_fits(e, u.total, what, err, len);
    if (rc != DS4_OK) return rc;
    if (progress) progress(pctx, 0, u.total);
    for (int i = 0; i < n; i++) {
        rc = upload_w(&u, ws[i], err, len);
        if (rc != DS4_OK) {
            for (int j = 0; j < i; j++) free_w(e, ws[j]);
            return rc;
        }
    }
    return DS4_OK;
}

/* The prefill_gemm option (spec platform.md §7): BF16/F16 load the BLAS now or fail naming it; AUTO
 * takes BF16 when it loads, else OFF with the reason in the note.  The mode is set on the context
 * only around passes of DS4_PREFILL_GEMM_MIN_ROWS tokens or more (ds4_run_pass). */
static int prefill_gemm_open(ds4_engine *e, int32_t want, char *err, size_t len) {
    e->prefill_gemm = DS4_PREFILL_GEMM_OFF;
    if (want == DS4_PREFILL_GEMM_OFF) {
        snprintf(e->prefill_gemm_note, sizeof e->prefill_gemm_note, "off: float32 products everywhere (chosen)");
        return DS4_OK;
    }
    const int32_t mode = want == DS4_PREFILL_GEMM_AUTO ? DS4_PREFILL_GEMM_BF16 : want;
    const char *name = mode == DS4_PREFILL_GEMM_BF16 ? "bf16" : "f16";
    char info[192] = "", why[384] = "";
    int rc = e->ops->gemm ? e->ops->gemm(e->ctx, mode, info, sizeof info, why, sizeof why) : DS4_E_UNSUPPORTED;
    if (rc == DS4_OK) rc = e->ops->gemm(e->ctx, DS4_PREFILL_GEMM_OFF, NULL, 0, why, sizeof why);
    if (rc == DS4_OK) {
        e->prefill_gemm = mode;
        snprintf(e->prefill_gemm_note, sizeof e->prefill_gemm_note, "%s: passes of %d+ tokens on the matrix units "
                 "through %s%s", name, DS4_PREFILL_GEMM_MIN_ROWS, info, want == DS4_PREFILL_GEMM_AUTO ? " (auto)" : "");
        return DS4_OK;
    }
    if (want == DS4_PREFILL_GEMM_AUTO) {
        snprintf(e->prefill_gemm_note, sizeof e->prefill_gemm_note, "off (auto): %s", why);
        return DS4_OK;
    }
    return ds4_fail(err, len, DS4_E_DEVICE, "prefill_gemm %s: %s (choose prefill_gemm off, or auto to fall back by "
                    "itself)", name, why);
}

void ds4_gpu_graphs_mode(ds4_engine *e, int32_t mode) {
    e->gpu_graphs = mode == DS4_GPU_GRAPHS_ON && e->ops->graph_begin;
    if (e->gpu_graphs)
        snprintf(e->gpu_graphs_note, sizeof e->gpu_graphs_note, "on: passes of up to %d rows replayed from one graph "
                 "per shape", DS4_GRAPH_MAX_ROWS);
    else
        snprintf(e->gpu_graphs_note, sizeof e->gpu_graphs_note, "off: kernels launched one by one (chosen)");
}

int ds4_gpu_engine_open(ds4_engine *e, const ds4_engine_options *o, char *err, size_t len) {
    if (o->gpu_layout != DS4_GPU_LAYOUT_PLANAR && o->gpu_layout != DS4_GPU_LAYOUT_GGML)
        return ds4_fail(err, len, DS4_E_INVALID, "gpu_layout %d: expected %d (planar) or %d (ggml)", o->gpu_layout,
                        DS4_GPU_LAYOUT_PLANAR, DS4_GPU_LAYOUT_GGML);
    e->gpu_layout = o->gpu_layout;
    int rc = ds4_gpu_load(o->gpu_library, &e->gpu_lib, &e->ops, err, len);
    if (rc != DS4_OK) return rc;
    rc = e->ops->open(o->gpu_device, &e->ctx, err, len);
    if (rc != DS4_OK) return rc;
    ds4_gpu_info info;
    memset(&info, 0, sizeof info);
    info.device = o->gpu_device;
    char why[256];
    e->gpu_integrated = e->ops->probe(&info, why, sizeof why) == DS4_OK && info.integrated;
    rc = prefill_gemm_open(e, o->prefill_gemm, err, len);
    if (rc == DS4_OK) rc = e->ops->activations(e->ctx, o->activations, err, len);
    if (rc != DS4_OK) return rc;
    /* gpu_graphs (spec platform.md §8): forward.c captures and replays; a refused capture turns it off */
    ds4_gpu_graphs_mode(e, o->gpu_graphs);
    int cap = DS4_N_GLOBAL_TENSORS + e->c.n_layer * DS4_N_BLOCK_TENSORS;
    ds4_w **ws = malloc((size_t)cap * sizeof *ws);
    if (!ws) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    rc = upload_all(e, ws, ds4_target_mats(e, ws), o->progress, o->progress_ctx, "the model's weight matrices", err,
                    len);
    free(ws);
    return rc;
}

int ds4_gpu_upload_support(ds4_engine *e, char *err, size_t len) {
    if (e->backend != DS4_BACKEND_HIP || !e->ctx || !e->sup) return DS4_OK;
    int cap = DS4_SUPPORT_MATS_MAX;
    ds4_w **ws = malloc((size_t)cap * sizeof *ws);
    if (!ws) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    int rc = upload_all(e, ws, ds4_support_mats(e, ws), NULL, NULL, "the support model's weight matrices", err, len);
    free(ws);
    if (rc == DS4_OK) { /* the drafter's host-row products (the confidence head, the sampled Markov head),
                          * staged at their largest now */
        const ds4_support *sp = e->sup;
        rc = e->ops->reserve(e->ctx, (int64_t)e->c.n_embd + sp->rank, e->c.n_vocab, err, len);
    }
    return rc;
}

void ds4_gpu_free_support(ds4_engine *e) {
    if (e->backend != DS4_BACKEND_HIP || !e->ctx || !e->sup) return;
    ds4_w *ws[DS4_SUPPORT_MATS_MAX]; /* at most 8 stages (load.c) */
    int n = ds4_support_mats(e, ws);
    for (int i = 0; i < n; i++) free_w(e, ws[i]);
}

void ds4_gpu_engine_close(ds4_engine *e) {
    if (e->ctx) {
        ds4_gpu_free_support(e);
        int cap = DS4_N_GLOBAL_TENSORS + e->c.n_layer * DS4_N_BLOCK_TENSORS;
        ds4_w **ws = e->layers ? malloc((size_t)cap * sizeof *ws) : NULL;
        if (ws) {
            int n = ds4_target_mats(e, ws);
            for (int i = 0; i < n; i++) free_w(e, ws[i]);
            free(ws);
        }
        e->ops->close(e->ctx);
        e->ctx = NULL;
    }
    e->gpu_lib = NULL; /* the library stays loaded (ds4_gpu_load) */
    e->ops = NULL;
}
