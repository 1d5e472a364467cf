/* internal.h — engine and session structures shared by engine.c and forward.c (not public). */
#ifndef DS4_INTERNAL_H
#define DS4_INTERNAL_H

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
} ds4_w;

enum { DS4_SWA = 0, DS4_CSA = 1, DS4_HCA = 2 };

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
} ds4_layer;

typedef struct {
    int32_t n_layer, n_embd, n_vocab, n_head, head_dim, n_rot, q_lora_rank, o_lora_rank, o_groups;
    int32_t n_expert, n_expert_used, n_ff_exp, n_hash_layer, expert_weights_norm;
    int32_t sliding_window, indexer_n_head, indexer_head_dim, indexer_top_k, hc_count, hc_sinkhorn_iters;
    float expert_weights_scale, rms_eps, hc_eps;
    int64_t context_length;
} ds4_cfg;

struct ds4_engine {
    ds4_cfg c;
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
};

/* forward.c: run tokens[0..n) (n <= n_batch) at positions s->n_tokens...; logits rows for
 * DS4_LOGITS_LAST/ALL go to `logits`.  Returns DS4_OK or DS4_E_CANCELLED (cache untouched
 * beyond n_tokens in that case: the caller does not advance n_tokens). */
int ds4_forward(ds4_session *s, const int32_t *tokens, int32_t n, int logits_mode, float *logits);

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
