/* internal.h — engine and session structures shared by engine.c and forward.c (not public). */
#ifndef DS4_INTERNAL_H
#define DS4_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ds4_engine.h"
#include "cpu/pool.h"

/* A bound weight matrix: n_mat matrices (experts) of rows x cols elements of GGML `type`. */
typedef struct {
    const uint8_t *data;
    int32_t type;
    int64_t rows, cols, n_mat;
    size_t row_bytes, mat_bytes;
    const uint8_t *dev;  /* device copy (GPU backend), or NULL */
    int32_t dev_layout;  /* its layout id (gpu_api.h: the GGML type, or DS4_GPU_PLANAR | type) */
} ds4_w;

enum { DS4_SWA = 0, DS4_CSA = 1, DS4_HCA = 2 };

/* Device copies of a block's vectors and tables (GPU backend; gpu_forward.c). */
typedef struct {
    float *hc_attn_base, *hc_ffn_base, *attn_norm, *q_a_norm, *kv_norm, *sinks, *ffn_norm;
    float *comp_ape, *comp_norm, *idx_comp_ape, *idx_comp_norm, *exp_bias;
    int32_t *tid2eid;
} ds4_layer_dev;

/* Weights of one block.  Vectors and small tables are dequantised to float at open. */
typedef struct {
    int kind, ratio, hashed;
    float clamp, clamp_shexp;
    ds4_w hc_attn_fn, hc_ffn_fn;
    float *hc_attn_base, *hc_attn_scale, *hc_ffn_base, *hc_ffn_scale;
    float *attn_norm, *q_a_norm, *kv_norm, *sinks, *ffn_norm;
    ds4_w q_a, q_b, kv, out_a, out_b;
    /* compressor (CSA/HCA) */
    ds4_w comp_kv, comp_gate;
    float *comp_ape, *comp_norm; /* ape [ratio, coff*D] */
    /* indexer (CSA) */
    ds4_w idx_comp_kv, idx_comp_gate, idx_q_b, idx_proj;
    float *idx_comp_ape, *idx_comp_norm;
    /* MoE */
    ds4_w gate_inp, gate_exps, up_exps, down_exps, gate_sh, up_sh, down_sh;
    float *exp_bias;         /* [n_expert] (top-k layers) */
    const int32_t *tid2eid;  /* [n_vocab, n_expert_used] (hash layers) */
    ds4_layer_dev dv;        /* device copies (GPU backend), NULL pointers otherwise */
} ds4_layer;

typedef struct {
    int32_t n_layer, n_embd, n_vocab, n_head, head_dim, n_rot, q_lora_rank, o_lora_rank, o_groups;
    int32_t n_expert, n_expert_used, n_ff_exp, n_hash_layer, expert_weights_norm;
    int32_t sliding_window, indexer_n_head, indexer_head_dim, indexer_top_k, hc_count, hc_sinkhorn_iters;
    float expert_weights_scale, rms_eps, hc_eps;
    int64_t context_length;
} ds4_cfg;

/* An attached DSpark support model (spec dspark.md §2, §4). Stages are bound as SWA layers. */
typedef struct {
    int n_stages, block, rank, noise, n_capture;
    int32_t capture[8];
    int32_t *capture_slot;   /* [n_layer]: slot of a captured target layer, or -1 */
    ds4_layer *stages;
    ds4_w main_proj, hc_head_fn, markov_w1, markov_w2, conf;
    float *main_norm, *hc_head_base, *hc_head_scale, *norm;
    float clamp, clamp_shexp;
    float *d_main_norm, *d_hc_head_base; /* device copies (GPU backend) */
} ds4_support;

struct ds4_engine {
    ds4_cfg c;
    pthread_mutex_t life;   /* guards n_sessions and closing */
    int n_sessions, closing; /* ds4_engine_close frees the engine when its last session goes */
    int numerics;
    ds4_pool *pool;
    int n_threads;
    double *freq_main, *freq_comp; /* [n_rot/2] RoPE frequencies (YaRN-blended for compressed layers) */
    ds4_layer *layers;
    ds4_w token_embd, output, output_hc_fn;
    float *output_hc_base, *output_hc_scale, *output_norm;
    uint64_t weight_bytes;   /* mapped tensor bytes used */
    uint64_t expanded_bytes; /* small tensors dequantised to float at open */
    int n_alloc;             /* float arrays owned by the engine */
    float **allocs;
    ds4_support *sup;        /* NULL: no support model attached */
    int sup_refused;         /* 1: a support file was refused (sup_msg says why) */
    float sup_clamp, sup_clamp_sh; /* SwiGLU clamps the drafter stages use (the target's last layer's) */
    char sup_msg[1024];
    /* GPU backend (DS4_BACKEND_HIP; gpu.c): the dlopen'ed library's table and context.  gpu_rc and
     * gpu_msg keep the first device failure of a pass until ds4_gpu_check reports it. */
    int backend;
    int gpu_layout;          /* DS4_GPU_LAYOUT_* */
    void *gpu_lib;
    const struct ds4_gpu_api_s *gpu;
    struct ds4_gpu_ctx *gpu_ctx;
    int gpu_rc;
    char gpu_msg[512];
    float *d_output_hc_base, *d_output_norm; /* device copies of the head's vectors */
    double *d_freq_main, *d_freq_comp;
    int n_dev_vec;                           /* device vectors owned by the engine (freed at close) */
    void **dev_vec;
    size_t *dev_vec_bytes;
};

/* Per-layer cache.  Raw rows live in a ring of kv_cap rows (position p at p % kv_cap);
 * compressor projections in a ring of cmp_cap positions; compressed rows are kept for the
 * whole context (window w at row w). */
typedef struct {
    float *kv;        /* [kv_cap, D] */
    float *cmp_c;     /* [cmp_cap, coff*D] */
    float *cmp_z;     /* [cmp_cap, coff*D] (ape added) */
    float *comp;      /* [n_ctx/ratio + 1, D] */
    float *idx_c;     /* [cmp_cap, 2*ID] */
    float *idx_z;
    float *idx_keys;  /* [n_ctx/4 + 1, ID] */
} ds4_layer_cache;

/* Scratch for one forward pass of up to B = n_batch + 1 tokens. */
typedef struct {
    float *X, *X3;            /* [B, HC, H] streams (current and next) */
    float *X2;                /* [B, HC*H] normalised streams for the HC control matmul */
    float *hcm;               /* [B, mix] */
    float *post, *comb;       /* [B, HC], [B, HC*HC] */
    float *x, *xn;            /* [B, H] */
    float *qr, *q, *kvr;      /* [B, q_lora], [B, NH*D], [B, D] */
    float *att;               /* [B, NH*D] */
    float *u, *y;             /* [B, G*R], [B, H] */
    float *cbuf, *zbuf;       /* [B, 2*max(D, ID)] compressor projections */
    float *qi, *iw;           /* [B, IH*ID], [B, IH] indexer queries and weights */
    int32_t *sel_comp;        /* [B, top_k] compressed rows chosen by the indexer */
    int32_t *nsel_comp;       /* [B] */
    float *scores;            /* [B, E] router scores */
    int32_t *sel;             /* [B, K] chosen experts */
    float *wsel;              /* [B, K] their weights */
    float *xe, *ge, *he, *oe; /* expert batch: [B, H], [B, F'], [B, F'], [B, H] (F' = max(F, shared F)) */
    int32_t *erows, *eslot;   /* [B] */
    float *moe_y;             /* [B, H] */
    float *lm;                /* [B, H] */
    float *att_tmp;           /* [n_threads, att_tmp_stride]: scores then key pointers */
    int64_t att_tmp_stride;
    float *iscore;            /* [n_threads, isel_stride]: (score, index) pairs for the indexer */
    int64_t isel_stride;
} ds4_scratch;

typedef struct ds4_dspark ds4_dspark; /* dspark.c */
typedef struct ds4_gpu_session ds4_gpu_session; /* gpu_forward.c */

struct ds4_session {
    ds4_engine *e;
    int32_t n_layer, n_ctx, n_batch, kv_cap, cmp_cap;
    int32_t n_tokens;
    int32_t pending;
    int has_logits;
    float *logits;         /* [n_vocab] last row */
    void *sample_buf;      /* [n_vocab] sampling candidates */
    ds4_layer_cache *lc;
    ds4_scratch sc;
    atomic_int cancel;
    ds4_sampling sampling;
    uint64_t rng;
    ds4_stats stats;
    uint64_t kv_bytes, cmp_bytes, scratch_bytes;
    ds4_dspark *dsp;       /* DSpark state when the engine has (or refused) a support model */
    ds4_gpu_session *gs;   /* device caches and scratch (GPU backend): the pass runs on the device */
};

/* forward.c: run tokens[0..n) (n <= n_batch) at positions s->n_tokens...; logits rows for
 * DS4_LOGITS_LAST/ALL go to `logits`.  Returns DS4_OK or DS4_E_CANCELLED (cache untouched
 * beyond n_tokens in that case: the caller does not advance n_tokens). */
int ds4_forward(ds4_session *s, const int32_t *tokens, int32_t n, int logits_mode, float *logits);

/* forward.c building blocks (shared with the drafter in dspark.c) */
void ds4_mm(ds4_engine *e, const ds4_w *w, int64_t mat, const float *X, int64_t ldx, int64_t n, float *Y, int64_t ldy);
void ds4_mm_rows(ds4_engine *e, const ds4_w *w, int64_t r0, int64_t nr, const float *X, int64_t ldx, int64_t n,
                 float *Y, int64_t ldy);
void ds4_hc_pre(ds4_session *s, const ds4_w *fn, const float *base, const float *scale, const float *X, int n,
                float *x, float *post, float *comb);
void ds4_hc_post(const ds4_engine *e, const float *X, const float *out, const float *post, const float *comb, int n,
                 float *Y);
void ds4_hc_head(ds4_session *s, const float *X, int n, const ds4_w *fn, const float *base, const float *scale,
                 float *out);
void ds4_attn_q(ds4_session *s, const ds4_layer *l, const float *xn, int n, int64_t p0, const double *freq);
void ds4_attn_kv(ds4_session *s, const ds4_layer *l, const float *xn, int n, int64_t p0, const double *freq, float *out);
void ds4_attn_output(ds4_session *s, const ds4_layer *l, int n, int64_t p0, const double *freq, float *out);
void ds4_attend_keys(const float *q, const float *const *keys, int nk, float sink, int D, float scale, float *sc,
                     float *o);
void ds4_moe(ds4_session *s, const ds4_layer *l, const float *xn, const int32_t *tokens, int n, float *out);

/* dspark.c */
void ds4_dspark_capture(ds4_session *s, int L, const float *X, int n, int64_t p0);
int ds4_dspark_session_init(ds4_session *s, const ds4_dspark_knobs *initial, char *err, size_t err_len);
void ds4_dspark_session_free(ds4_session *s);
void ds4_dspark_truncate(ds4_session *s, int32_t n);
void ds4_dspark_captured(ds4_session *s, int64_t p0, int n); /* after a successful pass */
void ds4_dspark_capture_mark(ds4_session *s, int n, int64_t p0); /* bookkeeping of a device capture */
void ds4_dspark_free_support(ds4_engine *e);
void ds4_dspark_reset_stats(ds4_session *s); /* counters only: knobs, timings model and events stay */
/* The DSpark decode step (the pending token is the anchor); same contract as ds4_session_step. */
int ds4_dspark_step(ds4_session *s, int32_t *out, int32_t max_out, int32_t *n_out, char *err, size_t err_len);

/* engine.c helpers shared with dspark.c */
double ds4_now_ms(void);
int ds4_fail(char *err, size_t len, int code, const char *fmt, ...);
int ds4_run_pass(ds4_session *s, const int32_t *seq, int32_t n, int mode, float *logits, int64_t n_logit_rows,
                 char *err, size_t err_len);
int32_t ds4_sample(ds4_session *s, const float *logits);
int32_t ds4_argmax(const float *x, int32_t n);
/* The target sampler's distribution over the candidates it keeps: ids[0..*n) and probabilities
 * p[0..*n) (sum 1); greedy gives one candidate with p = 1. */
void ds4_sample_dist(ds4_session *s, const float *logits, int32_t *ids, double *p, int32_t *n);
double ds4_uniform(ds4_session *s);  /* [0, 1) from the session's splitmix64 stream */

/* gpu.c */
int ds4_gpu_engine_open(ds4_engine *e, const ds4_engine_options *o, char *err, size_t len);
void ds4_gpu_engine_close(ds4_engine *e);
int ds4_gpu_upload_support(ds4_engine *e, char *err, size_t len);
void ds4_gpu_free_support(ds4_engine *e);
uint64_t ds4_gpu_allocated(const ds4_engine *e);
void ds4_gpu_mm(ds4_engine *e, const ds4_w *w, int64_t mat, int64_t r0, int64_t nr, const float *X, int64_t ldx,
                int64_t n, float *Y, int64_t ldy);
int ds4_gpu_check(ds4_engine *e, char *err, size_t len); /* DS4_OK, or the pass's first device failure */
int ds4_gpu_fail(ds4_engine *e, int rc, const char *msg); /* keep the first device failure; returns rc */

/* gpu_forward.c: the target pass on the device (same contract as ds4_forward; a device failure
 * returns DS4_E_DEVICE with the message kept for ds4_gpu_check). */
int ds4_gpu_engine_vectors(ds4_engine *e, char *err, size_t len);
void ds4_gpu_engine_vectors_free(ds4_engine *e);
int ds4_gpu_session_init(ds4_session *s, uint64_t *kv_bytes, uint64_t *cmp_bytes, uint64_t *scratch_bytes, char *err,
                         size_t len);
void ds4_gpu_session_free(ds4_session *s);
int ds4_gpu_forward(ds4_session *s, const int32_t *tokens, int32_t n, int logits_mode, float *logits);
int ds4_gpu_support_vectors(ds4_engine *e, char *err, size_t len);
/* The drafter on the device (dspark.c decides when; spec dspark.md §2.4): context KV rows of
 * positions lo..hi projected from the device capture ring; the block [anchor, noise...] at p0..
 * through the stages and the HC head into h_host [B, H].  On failure *op names the stage op. */
int ds4_gpu_draft_context(ds4_session *s, int64_t lo, int64_t hi);
int ds4_gpu_draft_logits(ds4_session *s, const float *hn, int want);
int ds4_gpu_draft_markov(ds4_session *s, int k, const float *feat, int32_t *x);
int ds4_gpu_draft_chain(ds4_session *s, int32_t anchor, int64_t p0, int64_t lo, int64_t hi, float *h_host,
                        const char **op);

/* ops.c */
void ds4_rms_norm(const float *x, int64_t n, float eps, const float *w, float *out);
void ds4_rope(const double *freq, int n_rot, float *x, int64_t width, int64_t pos, int inverse);
void ds4_fp8_kv_round_trip(float *row, int64_t width, int n_rot);
void ds4_f16_round(float *x, int64_t n);
void ds4_indexer_qat(float *x, int64_t n);
float ds4_sigmoid(float x);
double *ds4_rope_freqs(int n_rot, double base, int yarn, double factor, double orig_ctx, double beta_fast,
                       double beta_slow);

#endif
