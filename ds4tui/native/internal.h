/* internal.h — the native engine's internal structures and the functions its files share (not
 * public; docs/ARCHITECTURE.md draws the floor plan).
 *
 * Files in call order: a file calls only files below it (tests/test_native_floor_plan.py checks
 * this from the object files' symbols):
 *   engine.c       the public API (ds4_engine.h): engines, sessions, eval, step, stats, memory
 *   dspark.c       the DSpark cycle: knobs, propose, verify, accept, commit
 *   scheduler.c    the DSpark scheduler's decisions and prices, and their replay on a recorded text
 *   forward.c      the forward state, ONE target pass and ONE drafter stage through the op table
 *   capture.c      which positions a position-indexed ring holds (capture and context rings)
 *   gpu.c          loading a GPU backend library, uploading weights, the GPU test entry points
 *   load.c         binding the tensor table: config checks, target and support tensors
 *   cpu/backend.c  the CPU backend of the op table (backend.h)
 *   sampling.c     the sampler: temperature, top-k, top-p, min-p, argmax
 *   cpu/matmul.c   the CPU matmul driver (rows, or an MoE layer's expert groups, over the thread pool)
 *   cpu/amx.c      Q8_0 products on Intel's AMX tiles (the amx option)
 *   types.c        the GGML type traits table (types.h)
 *   cpu/ops.c      row operations: RMS norm, RoPE, the ds4 roundings
 *   cpu/dot.c, cpu/dequant.c, cpu/pool.c   the dot kernels, dequantisation, the thread pool
 *   util.c         error messages and the clock
 */
#ifndef DS4_INTERNAL_H
#define DS4_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ds4_engine.h"
#include "backend.h"
#include "types.h"
#include "tensors.h"
#include "cpu/pool.h"

/* A bound weight matrix: n_mat matrices (experts) of rows x cols elements of GGML `type`. */
typedef struct {
    const uint8_t *data;
    int32_t type;
    int64_t rows, cols, n_mat;
    size_t row_bytes, mat_bytes;
    const uint8_t *dev;  /* the backend's copy (the mapped data itself on the CPU backend) */
    int32_t dev_layout;  /* its layout id (backend.h: the GGML type, or DS4_GPU_PLANAR | type) */
    uint8_t *amx;        /* CPU backend, amx on: the rows repacked for the AMX tiles (cpu/amx.c), else NULL */
} ds4_w;

enum { DS4_SWA = 0, DS4_CSA = 1, DS4_HCA = 2 };

/* Weights of one block.  Vectors and small tables are dequantised to float at open.  The members
 * are those of layout.py's inventory (tensors.h, generated from it, binds them by offset); dv[]
 * holds each vector and table where the backend reads it (the host array itself on the CPU;
 * DV(l, field) in forward.c). */
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
    void *dv[DS4_N_BLOCK_TENSORS];
} ds4_layer;

/* The hyper-parameters: the caller's ds4_model_config, with its per-layer array pointers cleared
 * (they are copied into the layers at open). */
typedef ds4_model_config ds4_cfg;

/* An attached DSpark support model (spec dspark.md §2, §4). Stages are bound as SWA layers. */
typedef struct {
    int n_stages, block, rank, noise, n_capture;
    int32_t capture[8];
    int32_t *capture_slot;   /* [n_layer]: slot of a captured target layer, or -1 */
    ds4_layer *stages;
    ds4_w main_proj, hc_head_fn, markov_w1, markov_w2, conf;
    /* The draft vocabulary (spec dspark.md §2.6): n_vd > 0 token ids vd[] (increasing); the rows of the
     * target's LM head, of markov_w2 and of markov_w1 for those ids, copied into vd_rows. The
     * drafter's argmax is then an index j into vd[], the token vd[j]. n_vd == 0: the whole vocabulary. */
    int32_t n_vd;
    int32_t *vd;
    ds4_w vd_lm, vd_w2, vd_w1;
    uint8_t *vd_rows;
    float *main_norm, *hc_head_base, *hc_head_scale, *norm;
    float clamp, clamp_shexp;
    void *dv[DS4_N_SUPPORT_TENSORS]; /* vectors where the backend reads them */
} ds4_support;

struct ds4_engine {
    ds4_cfg c;
    pthread_mutex_t life;   /* guards n_sessions and closing */
    int n_sessions, closing; /* ds4_engine_close frees the engine when its last session goes */
    int numerics;
    int activations;         /* DS4_ACTIVATIONS_*: float32, or 8-bit for Q8_0/Q2_K/IQ2_XXS (CPU) */
    int verify_head;         /* DS4_VERIFY_HEAD_*: a DSpark verify's LM head for every row, or lazily (CPU) */
    int amx;                 /* DS4_AMX_ON: Q8_0 matrices repacked for and multiplied on the AMX tiles (CPU) */
    uint64_t amx_bytes;      /* the repacked copies' bytes (target and support) */
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
    /* The backend: its op table and context (the CPU's, or a dlopen'ed GPU library's; gpu.c).
     * op_rc and op_msg keep the first failure of a pass until ds4_op_check reports it. */
    int backend;
    int gpu_layout;          /* DS4_GPU_LAYOUT_* */
    int prefill_gemm;        /* DS4_PREFILL_GEMM_OFF/BF16/F16 in force (AUTO resolved at open) */
    char prefill_gemm_note[320]; /* the BLAS and threshold, or why it is off */
    int gpu_graphs;          /* DS4_GPU_GRAPHS_ON in force (forward.c turns it off when a capture fails) */
    char gpu_graphs_note[640]; /* what it does, or why it is off */
    uint64_t graph_captures, graph_replays; /* graphs captured and passes replayed (all sessions) */
    int gpu_integrated;      /* the device shares the host's memory (an APU): its runtime free bytes are no plan */
    void *gpu_lib;
    const ds4_backend *ops;
    ds4_backend_ctx *ctx;
    int op_rc;
    char op_msg[512];
    void *dv[DS4_N_GLOBAL_TENSORS];          /* the head's vectors where the backend reads them */
    double *d_freq_main, *d_freq_comp;
    int n_dev_vec;                           /* vector copies owned by the engine (freed at close) */
    void **dev_vec;
    size_t *dev_vec_bytes;
};

/* Positions [from, last] that a ring of `cap` rows (position p at row p % cap) holds (capture.c). */
typedef struct {
    int32_t cap;
    int64_t from, last;
} ds4_span;

typedef struct ds4_dspark ds4_dspark; /* dspark.c */
typedef struct ds4_state ds4_state;   /* forward.c */

struct ds4_session {
    ds4_engine *e;
    int32_t n_layer, n_ctx, n_batch, kv_cap, cmp_cap;
    int32_t n_tokens;
    int32_t pending;
    int has_logits;
    float *logits;         /* [n_vocab] last row */
    void *sample_buf;      /* [n_vocab] sampling candidates */
    atomic_int cancel;
    ds4_sampling sampling;
    uint64_t rng;
    ds4_stats stats;
    uint64_t kv_bytes, cmp_bytes, scratch_bytes;
    ds4_state *st;         /* caches and activations of the forward pass, in the backend's memory */
    ds4_span cap;          /* positions the DSpark capture ring holds */
    ds4_dspark *dsp;       /* DSpark state when the engine has (or refused) a support model */
    int last_pass_captured; /* the last ds4_run_pass captured a graph of its shape (spec platform.md §8):
                             * its time includes the one-time capture, so the scheduler does not price it */
    int last_proposal_captured; /* the last drafter pass captured its stages' graph (the same rule) */
};

/* ---- dspark.c --------------------------------------------------------------------------------- */
int ds4_dspark_session_init(ds4_session *s, const ds4_dspark_knobs *initial, char *err, size_t err_len);
void ds4_dspark_session_free(ds4_session *s);
void ds4_dspark_truncate(ds4_session *s, int32_t n);
void ds4_dspark_free_support(ds4_engine *e);
void ds4_dspark_reset_stats(ds4_session *s); /* counters only: knobs, timings model and events stay */
/* The DSpark decode step (the pending token is the anchor); same contract as ds4_session_step. */
int ds4_dspark_step(ds4_session *s, int32_t *out, int32_t max_out, int32_t *n_out, char *err, size_t err_len);

/* ---- scheduler.c ------------------------------------------------------------------------------ */
#define DS4_SCHED_CAL_BINS 10   /* bins of a raw confidence in the drafter's calibration (spec dspark.md §7.6) */
#define DS4_SCHED_CAL_WINDOW 64 /* a bin's counts are halved when it reached this many drafts: a drafter's
                                 * calibration moves with the text */
#define DS4_SCHED_FIRST_DECODES 5 /* a session with no kept t_ver(1) decodes plainly this many cycles first
                                   * and prices t_ver(1) at their median (spec dspark.md §7.4) */
/* The DSpark scheduler of a session (spec dspark.md §7.3, §7.4): the measured times and the
 * conditional acceptance by draft position (ds4_engine.h documents ds4_dspark_prices), the back-off
 * and the guards on kept prices. */
typedef struct {
    ds4_dspark_prices pr;
    int skip_left, backoff, probe;
    int room;                   /* the widest verify the last cycle could draft (its room + 1): the widths that
                                 * bound the narrower ones' prices (scheduler.c, t_verify) */
    int plain_here;             /* a priced plain decode ran since the session began or its prices were set */
    uint64_t n_plain;           /* plain (no-draft) cycles */
    uint64_t n_priced;          /* ... of them timed (not capturing a graph): priced_ms / n_priced prices the savings */
    double priced_ms;
    int since_plain;            /* drafted cycles since the last plain one */
    int first_n;                /* of the DS4_SCHED_FIRST_DECODES plain decodes that price a session without a
                                 * kept t_ver(1), those timed so far (DS4_SCHED_FIRST_DECODES: none are due) */
    double first_ms[DS4_SCHED_FIRST_DECODES];
    int kept_check;             /* the session started from kept prices: its first timed plain decode checks
                                 * them against its own (spec dspark.md §7.4) */
    int32_t carried_ver[DS4_DSPARK_MAX_BLOCK + 2]; /* a kept verify time of this width (>= 2) no pass of this
                                                    * session has timed yet (spec dspark.md §7.4, In-session) */
    int32_t carried_prop;       /* ... the same for the kept proposal time */
    /* the session's own acceptance counts the decisions read: pr.reached/pr.hit's growth since the
     * start, halved each time ACCEPT_WINDOW verifies reached the first position, so that they weigh
     * the last 32-64 verifies (spec dspark.md §7.4, Survival); pr keeps the whole counts, which the
     * engine hands on.  Counts set directly (not kept) start here. */
    uint64_t win_reached[DS4_DSPARK_MAX_BLOCK], win_hit[DS4_DSPARK_MAX_BLOCK];
    uint64_t carried_reached[DS4_DSPARK_MAX_BLOCK], carried_hit[DS4_DSPARK_MAX_BLOCK]; /* kept counts the session
                                                    * started with: they fade as its own verifies come */
    int times_cold;             /* the session began with no proposal time, kept or given: until
                                 * HOPELESS_MIN_VERIFIES verifies its times are its first samples */
    uint64_t own_verifies;      /* drafted cycles verified since the session began or its prices were set
                                 * (and the verifies of prices set directly, not kept: used as given) */
    /* the drafter's calibration (spec dspark.md §7.6): by bin of a raw confidence c_k, how many drafts
     * the verifies reached with it and how many of them the target accepted (halved at
     * DS4_SCHED_CAL_WINDOW), whatever the policy, so that a switch to the confidence policy starts
     * calibrated */
    double cal_reached[DS4_SCHED_CAL_BINS], cal_hit[DS4_SCHED_CAL_BINS];
    double gain;                /* the confidence policy's recent gain over plain decoding, in decodes a
                                 * cycle (spec dspark.md §7.6) */
} ds4_sched;
void ds4_sched_init(ds4_sched *q);
void ds4_sched_knobs_changed(ds4_sched *q); /* the back-off restarts */
/* DS4_OK, or DS4_E_INVALID naming the field of `p` out of range. */
int ds4_sched_check_prices(const ds4_dspark_prices *p, char *err, size_t err_len);
void ds4_sched_set_prices(ds4_sched *q, const ds4_dspark_prices *p, int kept); /* checked prices */
/* Before a cycle with room for lmax drafts (lroom without the caller's budget) under `policy`
 * (DS4_SCHED_*): -1 to propose *len drafts (*probe: a probe, verified uncut), or the DS4_ND_* reason of
 * a plain cycle. */
int ds4_sched_decide(ds4_sched *q, int policy, int lmax, int lroom, int *len, int *probe);
void ds4_sched_proposed(ds4_sched *q, double ms);  /* a whole-length proposal took ms (not capturing) */
int ds4_sched_cut(const ds4_sched *q, int nd);     /* the drafts of nd to verify (not a probe's) */
/* The confidence policy's cut (spec dspark.md §7.6): how many of the nd drafts, whose raw confidences
 * are conf[0..nd), to verify (0: none, the cycle ends in a plain decode). */
int ds4_sched_cut_confident(const ds4_sched *q, int nd, const float *conf);
/* The confidence policy's back-off after a cycle that proposed and verified nd drafts (0: the cut left
 * none) of which a were accepted (spec dspark.md §7.6). */
void ds4_sched_confident_done(ds4_sched *q, int nd, int a);
/* A verify of nd drafts accepted a; next_seen: greedy, all accepted and the proposal held more, so the
 * bonus showed the next position (next_hit: it matched); timed: ms is a sample (no graph captured);
 * conf[0..n_conf): the proposal's raw confidences (the calibration's samples; n_conf may be 0). */
void ds4_sched_verified(ds4_sched *q, int nd, int a, int next_seen, int next_hit, int probe, int timed, double ms,
                        const float *conf, int n_conf);
void ds4_sched_plain(ds4_sched *q, int timed, double ms); /* a plain cycle's decode took ms */

/* ---- forward.c -------------------------------------------------------------------------------- */
/* Rows per attention, indexer and LM-head launch inside a pass (spec ds4.md §2.8): the per-row
 * scratch of those ops (scores over every key of every head, the indexer's scores over every
 * compressed row, a vocabulary of logits) is sized for this many rows, not for n_batch, so a long
 * prefill chunk costs no more scratch than a 256-row one.  Every row of those ops is computed on
 * its own, so the tiles change no result. */
#define DS4_PASS_TILE_ROWS 256
/* The forward state of a session (caches, activations, the DSpark rings) in the backend's memory;
 * sizes are added to the session's kv/cmp/scratch byte counts. */
int ds4_state_init(ds4_session *s, char *err, size_t len);
void ds4_state_free(ds4_session *s);
/* Benchmarks: repeat the written compressed rows up to n_to tokens' worth (ds4_session_bench_fill). */
int ds4_state_repeat_rows(ds4_session *s, int32_t n_to, char *err, size_t len);
/* The engine's (and the support model's) vectors where the backend reads them. */
int ds4_engine_vectors(ds4_engine *e, char *err, size_t len);
int ds4_support_vectors(ds4_engine *e, char *err, size_t len);
void ds4_engine_vectors_free(ds4_engine *e);
/* Run seq[0..n) (n <= n_batch + 1) at positions n_tokens... as one target pass; logits rows for
 * DS4_LOGITS_LAST/ALL into `logits` (host, n_logit_rows rows, checked for non-finite values).  With
 * DS4_LOGITS_ALL the LM head runs for the first n_logit_rows rows (1..n) only: every row's normed
 * final hidden row stays in the forward state, and ds4_pass_head computes the head of the others.
 * On success n_tokens advances by n; on failure (cancel, device, non-finite) the session is
 * unchanged and err says why. */
int ds4_run_pass(ds4_session *s, const int32_t *seq, int32_t n, int mode, float *logits, int64_t n_logit_rows,
                 char *err, size_t err_len);
/* The LM head of rows [r0, r1) of the last DS4_LOGITS_ALL pass into logits [r1 - r0, n_vocab] (host),
 * by the same product the pass runs (batch-invariant kernels: each row equals the pass's own).  Valid
 * until the next target pass or drafter head; DS4_E_STATE when those rows are not held (another pass
 * ran, or they are outside the pass), DS4_E_NONFINITE naming the position of a non-finite logit,
 * DS4_E_DEVICE for a backend failure.  The session's positions are not changed. */
int ds4_pass_head(ds4_session *s, int32_t r0, int32_t r1, float *logits, char *err, size_t err_len);
/* 1 when the session's greedy picks can run where its logits are (spec platform.md §9): a GPU
 * backend; then ds4_run_pass_argmax is ds4_run_pass followed by ds4_argmax of each logits row. */
int ds4_device_picks(const ds4_session *s);
/* ds4_run_pass with the logits left in the backend's memory and ids[r] = ds4_argmax of row r (n
 * rows for DS4_LOGITS_ALL, 1 for DS4_LOGITS_LAST; n <= DS4_GRAPH_MAX_ROWS): only the ids come back.
 * The same errors as ds4_run_pass (a non-finite logit is found on the device). */
int ds4_run_pass_argmax(ds4_session *s, const int32_t *seq, int32_t n, int mode, int32_t *ids, char *err,
                        size_t err_len);
/* The drafter (spec dspark.md §2.4), on the session's backend.  Each returns DS4_OK, DS4_E_DEVICE
 * (the message kept for ds4_op_check: the next pass reports it) or DS4_E_NONFINITE (a non-finite
 * drafter row, seen on host backends); *op names the stage op that failed. */
int ds4_draft_context(ds4_session *s, int64_t lo, int64_t hi, const char **op);
int ds4_draft_embed(ds4_session *s, int32_t anchor);
int ds4_draft_stages(ds4_session *s, int64_t p0, int64_t lo, int64_t hi, const char **op);
int ds4_draft_head(ds4_session *s, float *h_host);
int32_t ds4_draft_vocab_size(const ds4_engine *e);
int32_t ds4_draft_token(const ds4_engine *e, int32_t j);
int ds4_draft_logits(ds4_session *s, const float *hn, int want, const float **U_host);
int ds4_draft_markov(ds4_session *s, int k, const float *feat, int32_t *x);
int ds4_draft_markov_chain(ds4_session *s, int want, int32_t *x);
/* A matmul with host activations (the drafter's heads): Y = rows [r0, r0+nr) of w times X. */
int ds4_host_mm(ds4_engine *e, const ds4_w *w, int64_t r0, int64_t nr, const float *X, int64_t ldx, int64_t n,
                float *Y, int64_t ldy);
int ds4_op_fail(ds4_engine *e, int rc, const char *msg); /* keep the first failure of a pass; returns rc */
int ds4_op_check(ds4_engine *e, char *err, size_t len);  /* DS4_OK, or the pass's first failure */

/* ---- capture.c -------------------------------------------------------------------------------- */
void ds4_span_init(ds4_span *s, int32_t cap);
void ds4_span_writing(ds4_span *s, int64_t p0, int n); /* positions p0..p0+n-1 are being written */
void ds4_span_written(ds4_span *s, int64_t p0, int n); /* ... and are now current */
void ds4_span_truncate(ds4_span *s, int64_t n);        /* forget positions >= n */

/* ---- gpu.c ------------------------------------------------------------------------------------ */
int ds4_gpu_load(const char *path, void **handle, const ds4_backend **api, char *err, size_t len);
int ds4_gpu_engine_open(ds4_engine *e, const ds4_engine_options *o, char *err, size_t len);
void ds4_gpu_engine_close(ds4_engine *e);
int ds4_gpu_upload_support(ds4_engine *e, char *err, size_t len);
void ds4_gpu_free_support(ds4_engine *e);

/* ---- load.c ----------------------------------------------------------------------------------- */
int ds4_check_config(const ds4_model_config *c, char *err, size_t len);
int ds4_bind_target(ds4_engine *e, const ds4_model_config *cfg, const ds4_tensor_desc *tensors, int32_t n,
                    char *err, size_t len);
int ds4_check_support_config(const ds4_engine *e, const ds4_support_config *sc, char *err, size_t len);
int ds4_bind_support(ds4_engine *e, const ds4_support_config *sc, const ds4_tensor_desc *tensors, int32_t n,
                     ds4_support *sup, char *err, size_t len);
void ds4_engine_free_vectors(ds4_engine *e); /* the dequantised host vectors */
/* The bound weight matrices of a block / of the target (embedding, heads, layers) / of the support
 * model (heads, stages) into out[] (at most DS4_N_*_TENSORS per block); returns how many. */
int ds4_block_mats(ds4_layer *l, ds4_w **out);
int ds4_target_mats(ds4_engine *e, ds4_w **out);
/* The support model's matrices (the draft vocabulary's row copies last, when there are any); out
 * holds at least DS4_SUPPORT_MATS_MAX. */
#define DS4_SUPPORT_MATS_MAX (DS4_N_SUPPORT_TENSORS + 8 * DS4_N_BLOCK_TENSORS + 3)
int ds4_support_mats(ds4_engine *e, ds4_w **out);
/* Bytes of block tensor i as bound in l (0: not bound). */
size_t ds4_block_tensor_bytes(const ds4_engine *e, const ds4_layer *l, int i);

/* ---- cpu/backend.c ---------------------------------------------------------------------------- */
const ds4_backend *ds4_cpu_backend(void);
int ds4_cpu_backend_open(ds4_pool *pool, int activations, ds4_backend_ctx **out, char *err, size_t len);
/* gpu.c: the gpu_graphs mode (DS4_GPU_GRAPHS_*) in force on a GPU engine and its note. */
void ds4_gpu_graphs_mode(ds4_engine *e, int32_t mode);

/* ---- sampling.c ------------------------------------------------------------------------------- */
int32_t ds4_sample(ds4_session *s, const float *logits);
/* The first index of the largest x[i] (a NaN never wins; NaN at 0 gives 0; n <= 1 gives 0). */
int32_t ds4_argmax(const float *x, int32_t n);
/* ds4_argmax's rule on the float32 sums a[i] + b[i]. */
int32_t ds4_argmax_sum(const float *a, const float *b, int32_t n);
/* The target sampler's distribution over the candidates it keeps: ids[0..*n) and probabilities
 * p[0..*n) (sum 1); greedy gives one candidate with p = 1. */
void ds4_sample_dist(ds4_session *s, const float *logits, int32_t *ids, double *p, int32_t *n);
double ds4_uniform(ds4_session *s);  /* [0, 1) from the session's splitmix64 stream */
int ds4_check_sampling(const ds4_sampling *p, char *err, size_t err_len);

/* ---- cpu/ops.c -------------------------------------------------------------------------------- */
void ds4_rms_norm(const float *x, int64_t n, float eps, const float *w, float *out);
void ds4_rope(const double *freq, int n_rot, float *x, int64_t width, int64_t pos, int inverse);
/* ds4_rope in two steps, so that the heads of one position share the angles: cs[n_rot] = (cos, sin)
 * of each pair's angle at pos (sin negated when inverse), then the rotation of x's last n_rot lanes
 * (the same float operations as ds4_rope).  DS4_ROPE_MAX: the widest cs a caller keeps on its stack. */
#define DS4_ROPE_MAX 256
void ds4_rope_cs(const double *freq, int n_rot, int64_t pos, int inverse, float *cs);
void ds4_rope_apply(const float *cs, int n_rot, float *x, int64_t width);
void ds4_fp8_kv_round_trip(float *row, int64_t width, int n_rot);
void ds4_f16_round(float *x, int64_t n);
void ds4_indexer_qat(float *x, int64_t n);
float ds4_sigmoid(float x);
double *ds4_rope_freqs(int n_rot, double base, int yarn, double factor, double orig_ctx, double beta_fast,
                       double beta_slow);

/* ---- util.c ----------------------------------------------------------------------------------- */
double ds4_now_ms(void);
int ds4_fail(char *err, size_t len, int code, const char *fmt, ...);

#endif
