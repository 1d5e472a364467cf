/* gpu.c — the engine's side of the GPU backend seam (spec platform.md §0.3, §4 option B).
 *
 * The GPU backend is a separate shared library (gpu_api.h) that is dlopen()ed here; the cffi
 * extension never links a GPU runtime, so it builds and runs wherever a C compiler does.  Every
 * failure names its cause: the file (missing, or dlopen's message), the symbol or table version,
 * no device, a wrong-arch build, a runtime call.
 *
 * With DS4_BACKEND_HIP the engine uploads every weight matrix the forward pass and the drafter
 * multiply with to device memory at open (progress reported through the options' callback), and
 * ds4_mm runs those products on the device.  Small vectors (norms, biases, HC bases) stay in the
 * host copies bound by engine.c.  A device failure inside a pass is kept (the first one) and
 * turned into DS4_E_DEVICE with its message by ds4_gpu_check after the pass.
 */
#include "internal.h"
#include "gpu_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int ds4_gpu_load(const char *path, void **handle, const ds4_gpu_api **api, char *err, size_t len) {
    *handle = NULL;
    *api = NULL;
    if (!path || !*path)
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "no GPU backend library given (libds4tui_hip.so / libds4tui_cuda.so)");
    struct stat st;
    if (stat(path, &st) != 0)
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "GPU backend library '%s' does not exist", path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "GPU backend library '%s' failed to load: %s", path,
                        why ? why : "unknown dlopen error");
    }
    ds4_gpu_api_fn fn;
    *(void **)&fn = dlsym(h, "ds4_gpu_api_v1");
    if (!fn) {
        dlclose(h);
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "'%s' is not a ds4tui GPU backend library: no symbol ds4_gpu_api_v1", path);
    }
    const ds4_gpu_api *a = fn();
    if (!a || a->version != DS4_GPU_API_VERSION) {
        dlclose(h);
        return ds4_fail(err, len, DS4_E_UNSUPPORTED, "GPU backend library '%s': API version %d, this engine needs %d "
                        "(rebuild it with this ds4tui)", path, a ? a->version : -1, DS4_GPU_API_VERSION);
    }
    *handle = h;
    *api = a;
    return DS4_OK;
}

void ds4_gpu_unload(void *handle) {
    if (handle) dlclose(handle);
}

int ds4_gpu_probe(const char *library, ds4_gpu_info *out, char *err, size_t err_len) {
    if (!out) return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_probe: out is NULL");
    memset(out, 0, sizeof *out);
    snprintf(out->library, sizeof out->library, "%s", library ? library : "");
    void *h;
    const ds4_gpu_api *api;
    int rc = ds4_gpu_load(library, &h, &api, err, err_len);
    if (rc != DS4_OK) return rc;
    rc = api->probe(out, err, err_len);
    ds4_gpu_unload(h);
    return rc;
}

/* A context on device 0 of a library, for the stand-alone kernel entry points. */
static int scratch_ctx(const char *library, void **h, const ds4_gpu_api **api, ds4_gpu_ctx **ctx, char *err,
                       size_t len) {
    int rc = ds4_gpu_load(library, h, api, err, len);
    if (rc != DS4_OK) return rc;
    rc = (*api)->open(0, ctx, err, len);
    if (rc != DS4_OK) ds4_gpu_unload(*h);
    return rc;
}

int ds4_gpu_kernel_matmul(const char *library, int type, const void *W, int64_t rows, int64_t cols, const float *X,
                          int64_t n_tok, float *Y, int32_t reps, double *ms, char *err, size_t err_len) {
    size_t rb = ds4_type_row_bytes(type & ~DS4_GPU_PLANAR, cols);
    if (rb == 0 || rows <= 0 || n_tok <= 0 || !W || !X || !Y)
        return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_matmul: bad arguments (type %d, %lld x %lld, %lld tokens)",
                        type, (long long)rows, (long long)cols, (long long)n_tok);
    void *h;
    const ds4_gpu_api *api;
    ds4_gpu_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) return rc;
    double t = 0.0;
    rc = api->bench_matmul(ctx, type, W, rows, cols, (int64_t)rb, X, n_tok, Y, reps < 1 ? 1 : reps, &t, err, err_len);
    if (rc == DS4_OK && ms) *ms = t;
    api->close(ctx);
    ds4_gpu_unload(h);
    return rc;
}

int ds4_gpu_kernel_gather(const char *library, int type, const void *W, int64_t n_mat, int64_t rows, int64_t cols,
                          const int32_t *ids, int64_t n_slots, const float *X, float *Y, char *err, size_t err_len) {
    const int32_t base = type & ~DS4_GPU_PLANAR;
    size_t rb = ds4_type_row_bytes(base, cols);
    if (rb == 0 || n_mat <= 0 || rows <= 0 || n_slots <= 0 || !W || !ids || !X || !Y)
        return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_gather: bad arguments (type %d, %lld matrices of "
                        "%lld x %lld, %lld slots)", type, (long long)n_mat, (long long)rows, (long long)cols,
                        (long long)n_slots);
    for (int64_t i = 0; i < n_slots; i++)
        if (ids[i] < 0 || ids[i] >= n_mat)
            return ds4_fail(err, err_len, DS4_E_INVALID, "ds4_gpu_kernel_gather: slot %lld uses matrix %d of %lld",
                            (long long)i, ids[i], (long long)n_mat);
    void *h;
    const ds4_gpu_api *api;
    ds4_gpu_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) return rc;
    void *dw = NULL, *di = NULL, *dx = NULL, *dy = NULL;
    int32_t layout = base;
    const size_t wb = (size_t)(n_mat * rows) * rb, ib = (size_t)n_slots * sizeof(int32_t),
                 xb = (size_t)(n_slots * cols) * sizeof(float), yb = (size_t)(n_slots * rows) * sizeof(float);
    rc = api->upload_matrix(ctx, W, base, n_mat * rows, cols, (int64_t)rb, (type & DS4_GPU_PLANAR) != 0, &dw, &layout,
                            err, err_len);
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
    api->free(ctx, dw, wb);
    api->free(ctx, di, ib);
    api->free(ctx, dx, xb);
    api->free(ctx, dy, yb);
    api->close(ctx);
    ds4_gpu_unload(h);
    return rc;
}

int ds4_gpu_bandwidth(const char *library, uint64_t bytes, int32_t reps, double *gbs, char *err, size_t err_len) {
    void *h;
    const ds4_gpu_api *api;
    ds4_gpu_ctx *ctx;
    int rc = scratch_ctx(library, &h, &api, &ctx, err, err_len);
    if (rc != DS4_OK) return rc;
    rc = api->bandwidth(ctx, (size_t)bytes, reps, gbs, err, err_len);
    api->close(ctx);
    ds4_gpu_unload(h);
    return rc;
}

/* ---- weights in device memory -------------------------------------------------------------- */

/* The weight matrices of one block (unbound ones have no data and are skipped). */
static int block_mats(ds4_layer *l, ds4_w **out) {
    ds4_w *all[] = {&l->hc_attn_fn, &l->hc_ffn_fn, &l->q_a, &l->q_b, &l->kv, &l->out_a, &l->out_b,
                    &l->comp_kv, &l->comp_gate, &l->idx_comp_kv, &l->idx_comp_gate, &l->idx_q_b, &l->idx_proj,
                    &l->gate_inp, &l->gate_exps, &l->up_exps, &l->down_exps, &l->gate_sh, &l->up_sh, &l->down_sh};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->data) out[n++] = all[i];
    return n;
}

#define MAX_BLOCK_MATS 20

static uint64_t w_bytes(const ds4_w *w) { return (uint64_t)w->mat_bytes * (uint64_t)w->n_mat; }

typedef struct {
    ds4_engine *e;
    uint64_t done, total;
    void (*progress)(void *, uint64_t, uint64_t);
    void *ctx;
} uploader;

/* The planar layout (hip/planar.hip) for every matrix the matmul kernels read; the embedding
 * keeps GGML rows (gpu_embed reads them).  DS4_GPU_LAYOUT_GGML keeps GGML rows everywhere (for
 * side-by-side kernel comparisons; results differ only by float32 rounding order). */
static int want_planar(const ds4_engine *e, const ds4_w *w) {
    return w != &e->token_embd && e->gpu_layout == DS4_GPU_LAYOUT_PLANAR;
}

static int upload_w(uploader *u, ds4_w *w, char *err, size_t len) {
    ds4_engine *e = u->e;
    void *dev = NULL;
    int32_t layout = w->type;
    int planar = want_planar(e, w);
    int rc = e->gpu->upload_matrix(e->gpu_ctx, w->data, w->type, w->rows * w->n_mat, w->cols, (int64_t)w->row_bytes,
                                   planar, &dev, &layout, err, len);
    if (rc != DS4_OK) return rc;
    w->dev = dev;
    w->dev_layout = layout;
    u->done += w_bytes(w);
    if (u->progress) u->progress(u->ctx, u->done, u->total);
    return DS4_OK;
}

static void free_w(ds4_engine *e, ds4_w *w) {
    if (w->dev) e->gpu->free(e->gpu_ctx, (void *)w->dev, (size_t)w_bytes(w));
    w->dev = NULL;
}

/* Every matrix of the target: the embedding, the LM head, the HC head and each layer's. */
static int target_mats(ds4_engine *e, ds4_w **out, int cap) {
    int n = 0;
    out[n++] = &e->token_embd;
    out[n++] = &e->output;
    out[n++] = &e->output_hc_fn;
    for (int L = 0; L < e->c.n_layer && n + MAX_BLOCK_MATS <= cap; L++) n += block_mats(&e->layers[L], out + n);
    return n;
}

static int support_mats(ds4_engine *e, ds4_w **out) {
    ds4_support *s = e->sup;
    int n = 0;
    ds4_w *heads[] = {&s->main_proj, &s->hc_head_fn, &s->markov_w1, &s->markov_w2, &s->conf};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
        if (heads[i]->data) out[n++] = heads[i];
    for (int st = 0; st < s->n_stages; st++) n += block_mats(&s->stages[st], out + n);
    return n;
}

static int upload_all(ds4_engine *e, ds4_w **ws, int n, void (*progress)(void *, uint64_t, uint64_t), void *pctx,
                      char *err, size_t len) {
    uploader u = {e, 0, 0, progress, pctx};
    for (int i = 0; i < n; i++) u.total += w_bytes(ws[i]);
    if (progress) progress(pctx, 0, u.total);
    for (int i = 0; i < n; i++) {
        int rc = upload_w(&u, ws[i], err, len);
        if (rc != DS4_OK) {
            for (int j = 0; j < i; j++) free_w(e, ws[j]);
            return rc;
        }
    }
    return DS4_OK;
}

int ds4_gpu_engine_open(ds4_engine *e, const ds4_engine_options *o, char *err, size_t len) {
    if (o->gpu_layout != DS4_GPU_LAYOUT_PLANAR && o->gpu_layout != DS4_GPU_LAYOUT_GGML)
        return ds4_fail(err, len, DS4_E_INVALID, "gpu_layout %d: expected %d (planar) or %d (ggml)", o->gpu_layout,
                        DS4_GPU_LAYOUT_PLANAR, DS4_GPU_LAYOUT_GGML);
    e->gpu_layout = o->gpu_layout;
    int rc = ds4_gpu_load(o->gpu_library, &e->gpu_lib, &e->gpu, err, len);
    if (rc != DS4_OK) return rc;
    rc = e->gpu->open(o->gpu_device, &e->gpu_ctx, err, len);
    if (rc != DS4_OK) return rc;
    int cap = 3 + e->c.n_layer * MAX_BLOCK_MATS;
    ds4_w **ws = malloc((size_t)cap * sizeof *ws);
    if (!ws) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    rc = upload_all(e, ws, target_mats(e, ws, cap), o->progress, o->progress_ctx, err, len);
    free(ws);
    if (rc == DS4_OK) rc = ds4_gpu_engine_vectors(e, err, len);
    return rc;
}

int ds4_gpu_upload_support(ds4_engine *e, char *err, size_t len) {
    if (!e->gpu_ctx || !e->sup) return DS4_OK;
    int cap = 5 + e->sup->n_stages * MAX_BLOCK_MATS;
    ds4_w **ws = malloc((size_t)cap * sizeof *ws);
    if (!ws) return ds4_fail(err, len, DS4_E_NOMEM, "out of memory");
    int rc = upload_all(e, ws, support_mats(e, ws), NULL, NULL, err, len);
    free(ws);
    if (rc == DS4_OK) rc = ds4_gpu_support_vectors(e, err, len);
    if (rc == DS4_OK) { /* the drafter's host-row products (dspark.c), staged at their largest now */
        const ds4_support *sp = e->sup;
        const int64_t H = e->c.n_embd, W = e->c.sliding_window, V = e->c.n_vocab, B = sp->block, r = sp->rank;
        const int64_t CW = (int64_t)sp->n_capture * H;
        int64_t x = W * CW, y = W * H;
        if (B * H > x) x = B * H;
        if (H + r > x) x = H + r;
        if (B * V > y) y = B * V;
        rc = e->gpu->reserve(e->gpu_ctx, x, y, err, len);
    }
    return rc;
}

void ds4_gpu_free_support(ds4_engine *e) {
    if (!e->gpu_ctx || !e->sup) return;
    ds4_w *ws[5 + DS4_DSPARK_MAX_BLOCK * MAX_BLOCK_MATS];
    int n = e->sup->n_stages <= DS4_DSPARK_MAX_BLOCK ? support_mats(e, ws) : 0;
    for (int i = 0; i < n; i++) free_w(e, ws[i]);
}

void ds4_gpu_engine_close(ds4_engine *e) {
    if (e->gpu_ctx) {
        ds4_gpu_free_support(e);
        ds4_gpu_engine_vectors_free(e);
        int cap = 3 + e->c.n_layer * MAX_BLOCK_MATS;
        ds4_w **ws = e->layers ? malloc((size_t)cap * sizeof *ws) : NULL;
        if (ws) {
            int n = target_mats(e, ws, cap);
            for (int i = 0; i < n; i++) free_w(e, ws[i]);
            free(ws);
        }
        e->gpu->close(e->gpu_ctx);
        e->gpu_ctx = NULL;
    }
    ds4_gpu_unload(e->gpu_lib);
    e->gpu_lib = NULL;
    e->gpu = NULL;
}

uint64_t ds4_gpu_allocated(const ds4_engine *e) { return e->gpu_ctx ? e->gpu->allocated(e->gpu_ctx) : 0; }

/* Rows [r0, r0 + nr) of matrix `mat` of w, on the device.  The first failure is kept in the engine
 * (ds4_gpu_check reports it after the pass) and Y is filled with NaN so nothing downstream can
 * pass for a result. */
void ds4_gpu_mm(ds4_engine *e, const ds4_w *w, int64_t mat, int64_t r0, int64_t nr, const float *X, int64_t ldx,
                int64_t n, float *Y, int64_t ldy) {
    char msg[512];
    const uint8_t *W = w->dev + (size_t)mat * w->mat_bytes + (size_t)r0 * w->row_bytes;
    int rc = e->gpu->matmul(e->gpu_ctx, w->dev_layout, W, nr, w->cols, (int64_t)w->row_bytes, X, ldx, n, Y, ldy, msg,
                            sizeof msg);
    if (rc == DS4_OK) return;
    if (e->gpu_rc == DS4_OK) {
        e->gpu_rc = rc;
        snprintf(e->gpu_msg, sizeof e->gpu_msg, "%s", msg);
    }
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < nr; r++) Y[t * ldy + r] = __builtin_nanf("");
}

int ds4_gpu_fail(ds4_engine *e, int rc, const char *msg) {
    if (e->gpu_rc == DS4_OK) {
        e->gpu_rc = rc;
        snprintf(e->gpu_msg, sizeof e->gpu_msg, "%s", msg);
    }
    return rc;
}

int ds4_gpu_check(ds4_engine *e, char *err, size_t len) {
    if (e->gpu_rc == DS4_OK) return DS4_OK;
    int rc = e->gpu_rc;
    e->gpu_rc = DS4_OK;
    return ds4_fail(err, len, rc == DS4_E_NOMEM ? DS4_E_NOMEM : DS4_E_DEVICE, "GPU backend: %s", e->gpu_msg);
}
