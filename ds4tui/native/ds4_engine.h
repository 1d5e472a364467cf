/*
 * ds4_engine.h — the whole public C API of the ds4tui native engine.
 *
 * The block between the CDEF markers is also the cffi cdef (build_native.py
 * extracts it), so it holds plain declarations only: no #if, no macros
 * with arguments, no inline code.
 *
 * Conventions
 *   - Functions return 0 (DS4_OK) on success and a negative DS4_E* code on
 *     failure; where a message buffer is passed, a NUL-terminated English
 *     message naming the problem is written into it.
 *   - Nothing in the engine prints to the terminal or exits the process.
 *   - Types and block layouts follow the GGML/GGUF definitions (spec ds4.md §5).
 */
#ifndef DS4_ENGINE_H
#define DS4_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CDEF BEGIN */

/* Return codes. */
#define DS4_OK 0
#define DS4_E_INVALID -1      /* a bad argument or descriptor */
#define DS4_E_UNSUPPORTED -2  /* a type, backend or option this build cannot run */
#define DS4_E_NOMEM -3        /* an allocation failed */
#define DS4_E_CONTEXT -4      /* the tokens do not fit in the session's context */
#define DS4_E_CANCELLED -5    /* ds4_session_cancel stopped the call; the session is unchanged */
#define DS4_E_TOKEN -6        /* a token id outside the vocabulary */
#define DS4_E_NONFINITE -7    /* NaN/Inf appeared in the logits (bad weights) */
#define DS4_E_STATE -8        /* the call does not fit the session's state (e.g. step with no logits) */
#define DS4_E_DEVICE -9       /* the GPU backend failed: library, device, memory or a kernel launch */

/* GGML type ids (ggml.h / GGUF tensor-info type field). */
#define DS4_TYPE_F32 0
#define DS4_TYPE_F16 1
#define DS4_TYPE_Q8_0 8
#define DS4_TYPE_Q2_K 10
#define DS4_TYPE_IQ2_XXS 16
#define DS4_TYPE_I32 26
#define DS4_TYPE_BF16 30

/* A GPU weight layout flag (ORed into a type id): the planar device layout of Q8_0, Q2_K and
 * IQ2_XXS rows whose byte length is a multiple of 16 (ds4tui/native/hip/planar.hip). */
#define DS4_GPU_PLANAR 256
/* The CPU backend's layout id of a matrix repacked for the AMX tiles (the amx option; cpu/amx.c). */
#define DS4_CPU_AMX 512

/* Most threads an engine, the matmul kernel or the memcpy test will start. */
#define DS4_MAX_THREADS 256

/* Backends and numerics (spec ds4.md §2.9). */
#define DS4_BACKEND_CPU 0
#define DS4_BACKEND_HIP 1
#define DS4_NUMERICS_DS4 0          /* FP8 KV, f16 cache rows, FP4 indexer, router floor */
#define DS4_NUMERICS_TRANSFORMERS 1 /* plain float32, as Hugging Face transformers */
/* Matmul activations (ds4_engine_options.activations; spec ds4.md §2.9.5): F32 keeps them float32
 * for every weight type; Q8 quantises them to 8 bits in blocks of 32 for Q8_0, Q2_K and IQ2_XXS
 * matrices and sums each block's products exactly in int32 (CPU backend only). */
#define DS4_ACTIVATIONS_F32 0
#define DS4_ACTIVATIONS_Q8 1

/* Logit outputs of ds4_session_eval. */
#define DS4_LOGITS_NONE 0
#define DS4_LOGITS_LAST 1
#define DS4_LOGITS_ALL 2

/* Version string of the native library, e.g. "ds4tui-native 0.2.0 (cpu)". */
const char *ds4_version(void);

/* What this library was compiled for, fixed when it was built: build_native.py passes the -march
 * value, the CPU the compiler resolved it to and the flags that change the code as defines
 * (DS4_BUILD_MARCH, DS4_BUILD_CPU, DS4_BUILD_FLAGS: "unrecorded" when built another way); `isa`
 * comes from the compiler's own predefined macros, so it names the instruction-set paths that the
 * kernels' #if branches compiled.  Static strings, never NULL. */
typedef struct {
    const char *march;    /* the -march value: "native", "x86-64-v3", ...; "" for the compiler's default */
    const char *cpu;      /* what the compiler made of it, e.g. "znver4" or "x86-64"; "" when it did not say */
    const char *flags;    /* the flags that change the code, e.g. "-O3 -std=c11 -fno-fast-math -march=native" */
    const char *isa;      /* the vector extensions compiled in, e.g. "sse4.2 avx avx2 fma f16c avx512f"; "" for none */
    const char *compiler; /* the compiler: "gcc 12.2.0", or clang's own __VERSION__ */
} ds4_build_info;

const ds4_build_info *ds4_build(void);

/* Bytes occupied by n elements of GGML type `type`, or 0 when the type is
 * unsupported or n is not a multiple of the type's block size. */
size_t ds4_type_row_bytes(int type, int64_t n);

/* Dequantise n elements of GGML type `type` from `src` into float `dst`.
 * n must be a multiple of the type's block size (32 for Q8_0, 256 for
 * Q2_K and IQ2_XXS, 1 for F32/F16/BF16).  Returns DS4_OK or a DS4_E* code
 * with a message in err[0..err_len). */
int ds4_dequantize(int type, const void *src, float *dst, int64_t n,
                   char *err, size_t err_len);

/* The CPU matmul kernel on its own (for tests and benchmarks):
 * Y[t, r] = sum_c W[r, c] * X[t, c] for t < n_tok, r < rows, c < cols.
 * W: `rows` rows of `cols` elements of GGML type `type` (row-major, rows
 * contiguous); X: float [n_tok, cols]; Y: float [n_tok, rows].
 * Activations stay float32 for every weight type (no 8-bit activation
 * quantisation), so the only difference from dequantise-then-numpy is the
 * float32 summation order.  n_threads 0 = one thread per online core. */
int ds4_kernel_matmul(int type, const void *W, int64_t rows, int64_t cols,
                      const float *X, int64_t n_tok, float *Y, int n_threads,
                      char *err, size_t err_len);

/* ds4_kernel_matmul with the matmul activations of DS4_ACTIVATIONS_* (Q8: 8-bit activations for
 * a Q8_0, Q2_K or IQ2_XXS matrix, spec ds4.md §2.9.5; any other type keeps float32). */
int ds4_kernel_matmul_act(int type, const void *W, int64_t rows, int64_t cols,
                          const float *X, int64_t n_tok, float *Y, int n_threads,
                          int activations, char *err, size_t err_len);

/* The amx option's kernels (spec ds4.md §2.9.6): 1 when this CPU and operating system run them (the
 * process is then granted the AMX tile state), else 0 with the reason in why (may be NULL). */
int ds4_cpu_amx(char *why, size_t len);
/* ds4_kernel_matmul_act with q8 activations for a Q8_0 matrix (rows a multiple of 16, columns of 64),
 * repacked and multiplied on the AMX tiles: the same bits.  DS4_E_UNSUPPORTED without AMX. */
int ds4_kernel_matmul_amx(const void *W, int64_t rows, int64_t cols, const float *X, int64_t n_tok, float *Y,
                          int n_threads, char *err, size_t err_len);

/* Greedy's argmax on its own (for tests and benchmarks): the first i < n holding the largest x[i]
 * (-0.0 equals +0.0), where a NaN is never the largest and a NaN at x[0] gives 0; n <= 1 gives 0.
 * With b non-NULL, the same rule on the float32 sums x[i] + b[i] (the CPU drafter's greedy draft).
 * The engine's decode, verify and draft argmax (ds4_argmax, ds4_argmax_sum). */
int32_t ds4_kernel_argmax(const float *x, const float *b, int32_t n);

/* memcpy bandwidth: copy `bytes` bytes `reps` times between two buffers,
 * split over n_threads threads (0 = one per core), and return the best
 * rate in GB/s (1e9 bytes copied per second), or a negative DS4_E* code. */
double ds4_memcpy_bandwidth(size_t bytes, int reps, int n_threads);

/* ---- model descriptor (built by Python from the memory-mapped GGUF) ---- */

/* One tensor: ne[] in GGUF order (ne[0] innermost, unused dims 1); data
 * points into the caller's mapping, which must outlive the engine. */
typedef struct {
    const char *name;
    int32_t type;
    int32_t n_dims;
    int64_t ne[4];
    const void *data;
    uint64_t nbytes;
} ds4_tensor_desc;

/* The hyper-parameters of spec ds4.md §1/§3.2.  The per-layer arrays have
 * n_layer entries and are copied by ds4_engine_open. */
typedef struct {
    int32_t n_layer, n_embd, n_vocab, n_head, head_dim, n_rot;
    int32_t q_lora_rank, o_lora_rank, o_groups;
    int32_t n_expert, n_expert_used, n_ff_exp, n_hash_layer, expert_weights_norm;
    int32_t sliding_window, indexer_n_head, indexer_head_dim, indexer_top_k;
    int32_t hc_count, hc_sinkhorn_iters;
    int32_t n_expert_shared;        /* shared experts (their FFN width is n_ff_exp * n_expert_shared) */
    int32_t rope_yarn;              /* 1: YaRN on compressed layers (rope.scaling.type yarn) */
    int64_t rope_orig_ctx, context_length;
    float rope_freq_base, rope_scaling_factor, yarn_beta_fast, yarn_beta_slow;
    float compress_rope_freq_base, expert_weights_scale, rms_eps, hc_eps;
    const int32_t *compress_ratios;   /* [n_layer] 0 = SWA, 4 = CSA, other = HCA */
    const float *swiglu_clamp;        /* [n_layer] routed experts; <= 0 disables */
    const float *swiglu_clamp_shexp;  /* [n_layer] shared expert */
} ds4_model_config;

typedef struct {
    int32_t backend;    /* DS4_BACKEND_* */
    int32_t n_threads;  /* 0: one per online core; at most DS4_MAX_THREADS */
    int32_t numerics;   /* DS4_NUMERICS_* */
    /* DS4_BACKEND_HIP only: the GPU backend library to dlopen (libds4tui_hip.so or
     * libds4tui_cuda.so; required), the device index, and an optional progress callback called
     * from the opening thread as weights are uploaded: done/total in bytes. */
    const char *gpu_library;
    int32_t gpu_device;
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
    /* DS4_BACKEND_HIP only: the device layout of the weight matrices (DS4_GPU_LAYOUT_*). */
    int32_t gpu_layout;
    int32_t activations;  /* DS4_ACTIVATIONS_* (both backends) */
    int32_t prefill_gemm; /* DS4_PREFILL_GEMM_* (0: off) */
    int32_t gpu_graphs;   /* DS4_GPU_GRAPHS_* (0: off) */
    int32_t verify_head;  /* DS4_VERIFY_HEAD_* (0: all) */
    int32_t amx;          /* DS4_AMX_* (0: off) */
} ds4_engine_options;

/* The amx option (spec ds4.md §2.9.6; ds4_engine_options.amx): ON repacks, at open, every Q8_0 weight
 * matrix that a product reads whole (all but the token embedding) and whose rows are a multiple of 16
 * and columns of 64 (on the demo model the LM head and most projections; the drafter's draft-vocabulary
 * head too) into the layout of Intel's AMX tiles, and multiplies them there.  The results are the same
 * bits as without it (the q8 arithmetic, §2.9.5); what changes is the time of a product of several
 * rows (a verify, a prefill) and the memory: a copy as large as the matrices repacked
 * (ds4_memory.amx).  ON needs the CPU backend, activations q8 and a CPU and kernel with AMX-INT8
 * (ds4_cpu_amx): DS4_E_UNSUPPORTED naming what is missing otherwise. */
#define DS4_AMX_OFF 0
#define DS4_AMX_ON 1

/* The verify_head option (spec dspark.md §3.4; ds4_engine_options.verify_head): which rows of a DSpark
 * verify pass get the LM head.  ALL: every row of [anchor, d_1..d_l], in the pass.  LAZY: the pass
 * runs every layer for every row and keeps the normed final rows; the head is computed for the first
 * DS4_VERIFY_HEAD_FIRST rows, and for the rest (in one product) only when the drafts of those rows
 * were all accepted, as acceptance never reads a row after the first rejected draft.  The kernels
 * are batch-invariant, so every row that is computed is the same bit for bit, and so are the
 * accepted drafts, the next token, the sampler's draws and the logits kept; what changes is the
 * verify's time and ds4_dspark_stats.verify_head_rows (a non-finite logit in a row that acceptance
 * never reaches is then not seen).  LAZY runs on the CPU backend only (DS4_E_UNSUPPORTED on the GPU
 * backend, whose greedy verify picks the argmaxes on the device in one pass). */
#define DS4_VERIFY_HEAD_ALL 0
#define DS4_VERIFY_HEAD_LAZY 1
#define DS4_VERIFY_HEAD_FIRST 3 /* rows of the first group: about one row's cost at the weight-read bound */

/* The gpu_graphs option (spec platform.md §8; ds4_engine_options.gpu_graphs): ON replays every
 * forward pass of at most DS4_GRAPH_MAX_ROWS rows (decode steps, DSpark verify passes) on the GPU
 * backend from a graph of its shape, captured at the shape's first pass, instead of launching its
 * kernels one by one.  The kernels and their results are the same bit for bit; what changes is the
 * host's launch work, the gaps between kernels and a little device memory per shape.  A capture
 * the runtime refuses turns the option off for the engine, with the reason in the note
 * (ds4_engine_gpu_graphs).  The CPU backend launches nothing: the option is off there. */
#define DS4_GPU_GRAPHS_OFF 0
#define DS4_GPU_GRAPHS_ON 1
#define DS4_GRAPH_MAX_ROWS 17 /* DS4_DSPARK_MAX_BLOCK + 1: a verify pass of the largest block */

/* The prefill_gemm numerics option (spec platform.md §7; ds4_engine_options.prefill_gemm): forward
 * passes of at least DS4_PREFILL_GEMM_MIN_ROWS tokens (prefill chunks) multiply the planar Q8_0 /
 * Q2_K / IQ2_XXS matrices on the GPU's matrix units through the vendor's BLAS (cuBLAS, rocBLAS;
 * dlopen'ed), with activations and dequantised weights rounded to bf16 or f16 and float32
 * accumulation.  Shorter passes (decode, DSpark verify: at most DS4_DSPARK_MAX_BLOCK + 1 rows) keep
 * the float32 kernels.  OFF: float32 kernels everywhere.  AUTO: BF16 when the BLAS loads, else
 * OFF (ds4_engine_prefill_gemm says which and why).  BF16/F16 on the CPU backend, or with no BLAS,
 * are refused (DS4_E_UNSUPPORTED). */
#define DS4_PREFILL_GEMM_OFF 0
#define DS4_PREFILL_GEMM_BF16 1
#define DS4_PREFILL_GEMM_F16 2
#define DS4_PREFILL_GEMM_AUTO 3
#define DS4_PREFILL_GEMM_MIN_ROWS 32

/* Device layouts of the weight matrices (ds4_engine_options.gpu_layout).  PLANAR (the default):
 * Q8_0, Q2_K and IQ2_XXS rows of a 16-byte multiple are rewritten at upload with their codes
 * first and their scales after (the same bytes; hip/planar.hip), every other matrix keeps its
 * GGML rows; GGML: the file's rows everywhere (the previous kernels, for side-by-side timing).
 * Results differ only by float32 rounding order. */
#define DS4_GPU_LAYOUT_PLANAR 0
#define DS4_GPU_LAYOUT_GGML 1

/* Memory held, in bytes.  weights: tensor bytes the engine reads (mapped
 * from the GGUF on the CPU backend); kv: raw KV rows; compressor: compressor
 * and indexer state plus compressed rows; scratch: activations and buffers;
 * device: bytes the GPU backend allocated (0 on the CPU backend); amx: the weight matrices' copies
 * repacked for the AMX tiles (the amx option; 0 without it). */
typedef struct {
    uint64_t weights, kv, compressor, scratch, device, amx;
} ds4_memory;

/* Sampling settings.  temperature <= 0: greedy (argmax, ties to the lowest
 * id).  Otherwise logits/temperature, then top_k (0 = off), top_p (1 = off),
 * min_p (0 = off), sampled with a splitmix64 stream seeded by `seed`. */
typedef struct {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    uint64_t seed;
} ds4_sampling;

/* The sampler on its own (for tests and benchmarks): what a session with sampling settings p draws
 * from logits[0..n) with its splitmix64 stream at *rng (advanced by one draw; greedy draws nothing):
 * temperature -> top_k -> top_p -> min_p -> draw, candidates ordered by decreasing logit, ties to the
 * lower id (the engine's ds4_sample; ds4tui.engine.backend.sample_reference in numpy).  Returns the
 * id, or DS4_E_INVALID (n < 1, a NULL pointer, settings out of range) or DS4_E_NOMEM, both < 0. */
int32_t ds4_kernel_sample(const float *logits, int32_t n, const ds4_sampling *p, uint64_t *rng);

/* Monotonic counters of a session (rates are derived by the caller). */
typedef struct {
    uint64_t n_prefill_tokens;  /* tokens run through ds4_session_eval */
    uint64_t n_decode_tokens;   /* tokens emitted by ds4_session_step */
    uint64_t n_steps;           /* ds4_session_step calls that emitted */
    uint64_t n_target_evals;    /* target forward passes (any batch size) */
    double prefill_ms;          /* wall time inside ds4_session_eval */
    double decode_ms;           /* wall time inside ds4_session_step */
    double sample_ms;           /* part of decode_ms spent sampling */
    uint64_t n_cancelled;       /* calls stopped by ds4_session_cancel */
} ds4_stats;

/* The scheduler's policies (ds4_dspark_knobs.policy; spec dspark.md §7.4, §7.6). */
#define DS4_SCHED_ACCEPTANCE 0 /* draft when the acceptance measured at each position pays (§7.4) */
#define DS4_SCHED_CONFIDENCE 1 /* propose unless backing off; verify the drafts whose calibrated
                                * confidences pay for their verify (§7.6) */
#define DS4_SCHED_POLICIES 2

/* DSpark's live knobs (spec dspark.md §7), applied at the next cycle boundary. */
typedef struct {
    int32_t enabled;     /* 1: draft and verify; 0: target-only decode */
    int32_t scheduler;   /* 1: adaptive scheduler (spec dspark.md §7.3) */
    float threshold;     /* confidence threshold 0..1: cut at the first c_k < threshold (1: never draft) */
    int32_t max_draft;   /* 1..block_size drafts per cycle */
    int32_t policy;      /* the scheduler's policy, DS4_SCHED_ACCEPTANCE or _CONFIDENCE */
} ds4_dspark_knobs;

typedef struct ds4_engine ds4_engine;
typedef struct ds4_session ds4_session;

/* Open an engine over the tensors of a validated DS4 model.  Every tensor
 * the forward pass needs is looked up by its GGUF name and its type and
 * dims are checked; the error names the tensor and the expected and found
 * values. */
int ds4_engine_open(const ds4_model_config *cfg, const ds4_tensor_desc *tensors,
                    int32_t n_tensors, const ds4_engine_options *opt,
                    ds4_engine **out, char *err, size_t err_len);
void ds4_engine_close(ds4_engine *e);
int ds4_engine_memory(const ds4_engine *e, ds4_memory *out);
int32_t ds4_engine_n_threads(const ds4_engine *e);
/* The prefill_gemm mode in force (DS4_PREFILL_GEMM_OFF, _BF16 or _F16; AUTO resolved at open) and,
 * in note, what it means here: the BLAS and the row threshold, or why it is off. */
int32_t ds4_engine_prefill_gemm(const ds4_engine *e, char *note, size_t note_len);
/* The gpu_graphs option in force (DS4_GPU_GRAPHS_OFF or _ON) and, in note, what it means here or
 * why it is off (chosen, the CPU backend, or a capture the runtime refused and its reason), then
 * how many graphs were captured and passes replayed so far when any were. */
int32_t ds4_engine_gpu_graphs(const ds4_engine *e, char *note, size_t note_len);
/* Switch the gpu_graphs option between passes (DS4_GPU_GRAPHS_OFF or _ON; a side-by-side timing on
 * one engine): the graphs already captured are kept for when it is on again.  DS4_E_INVALID for
 * another mode, DS4_E_UNSUPPORTED for ON on the CPU backend. */
int ds4_engine_set_gpu_graphs(ds4_engine *e, int32_t mode, char *err, size_t err_len);

/* A session: KV cache and compressor state for up to n_ctx tokens,
 * evaluating at most n_batch tokens per forward pass (longer inputs are
 * split).  n_batch also bounds how far back ds4_session_truncate can go.
 * `dspark`: the DSpark knobs the session starts with (NULL: DSpark on when a
 * support model is attached, scheduler on, threshold 0, max_draft = the
 * block size; max_draft 0 also means the block size).  Knobs given here are
 * in force from cycle 0 and are not logged as a change. */
int ds4_session_create(ds4_engine *e, int32_t n_ctx, int32_t n_batch,
                       const ds4_dspark_knobs *dspark,
                       ds4_session **out, char *err, size_t err_len);
void ds4_session_free(ds4_session *s);

/* Tokens in the KV cache, the context size, and the sampled token that is
 * emitted but not yet run through the model (-1 if none). */
int32_t ds4_session_n_tokens(const ds4_session *s);
int32_t ds4_session_n_ctx(const ds4_session *s);
int32_t ds4_session_pending(const ds4_session *s);

/* Run tokens[0..n) at the next positions (a pending token, if any, is run
 * first) and write logits: DS4_LOGITS_LAST -> logits[n_vocab] of the last
 * token, DS4_LOGITS_ALL -> logits[n, n_vocab], DS4_LOGITS_NONE -> logits may
 * be NULL.  The last row is also kept for ds4_session_step.  On any error
 * (context overflow, bad id, cancel) the session is left as before the call. */
int ds4_session_eval(ds4_session *s, const int32_t *tokens, int32_t n,
                     int32_t logits_mode, float *logits, char *err, size_t err_len);

/* One decode cycle: run the pending token (if any), sample the next token
 * from the last logits and make it the pending token.  Writes the emitted
 * tokens to out[0..*n_out) (max_out >= 1).  DS4_E_STATE when there are no
 * logits yet (nothing evaluated).
 * With DSpark (a support model attached and enabled) the pending token is
 * the anchor (spec dspark.md §2.5): the drafter proposes d_1..d_l, one
 * target pass verifies [anchor, d_1..d_l], and the step emits the accepted
 * drafts followed by the next sampled token (which becomes pending), so
 * *n_out is 1 + accepted.  max_out is the caller's remaining budget: drafts
 * are clipped to max_out - 1 (no_room when that is 0). */
int ds4_session_step(ds4_session *s, int32_t *out, int32_t max_out, int32_t *n_out,
                     char *err, size_t err_len);

/* Decode cycles back to back in one call, so that a caller in an interpreter
 * pays its per-call costs once for many cycles (spec ux.md §2.4).  Runs
 * ds4_session_step cycles, each with the budget left (max_out minus the ids
 * emitted so far, at most 64), writing the emitted ids one cycle after the
 * other to out[] and each cycle's count to cycle_len[0..*n_cycles).  Stops
 * after a cycle when max_cycles cycles ran, max_out ids were emitted, the
 * cycle emitted an id of stop[0..n_stop), budget_ms milliseconds of wall
 * time have passed since the call began (budget_ms <= 0: no time limit),
 * ds4_session_cancel was called (the flag stays set: the next call returns
 * DS4_E_CANCELLED at once), or the next cycle's token would not fit the
 * context.  The cycles are exactly those of as many ds4_session_step calls.
 * Errors: those of ds4_session_step.  An error in the first cycle leaves the
 * session as before the call (*n_cycles = 0); an error in a later cycle is
 * returned with *n_cycles and out[] holding the cycles that completed before
 * it, which stand. */
int ds4_session_step_many(ds4_session *s, int32_t *out, int32_t max_out, int32_t max_cycles, double budget_ms,
                          const int32_t *stop, int32_t n_stop, int32_t *cycle_len, int32_t *n_cycles,
                          char *err, size_t err_len);

/* Forget every token at position >= n (0 <= n <= n_tokens, and no further
 * back than n_batch tokens unless n == 0).  Clears the pending token and the
 * last logits. */
int ds4_session_truncate(ds4_session *s, int32_t n, char *err, size_t err_len);

/* Benchmarks only: advance a session of at least 128 prefilled tokens to n
 * tokens without running them.  The compressed rows (and indexer keys) of the
 * skipped windows repeat the rows already written (row i = row i % rows
 * written), so a pass at position n reads and selects over as many rows as one
 * after a real prefill of n tokens would, but the values are repeats: use it to
 * time, never to generate.  Clears the pending token and the last logits;
 * DS4_E_STATE with a DSpark support model attached. */
int ds4_session_bench_fill(ds4_session *s, int32_t n, char *err, size_t err_len);

/* Make `token` the pending token (emitted, not yet run) of a session that has
 * none, e.g. after truncating drafts accepted past a stop token. */
int ds4_session_set_pending(ds4_session *s, int32_t token, char *err, size_t err_len);

/* Ask a running eval/step to stop at the next layer boundary (thread-safe;
 * sticky until that call returns DS4_E_CANCELLED or ds4_session_clear_cancel). */
void ds4_session_cancel(ds4_session *s);
void ds4_session_clear_cancel(ds4_session *s);

int ds4_session_set_sampling(ds4_session *s, const ds4_sampling *p, char *err, size_t err_len);
int ds4_session_get_sampling(const ds4_session *s, ds4_sampling *out);
int ds4_session_stats(const ds4_session *s, ds4_stats *out);
void ds4_session_reset_stats(ds4_session *s);
int ds4_session_memory(const ds4_session *s, ds4_memory *out);

/* ---- GPU backend library (spec platform.md §0.3, §4: dlopen'ed, never linked) ---- */

/* What a GPU backend library was built as and what its runtime sees. */
typedef struct {
    char library[512];      /* the file that was loaded */
    char platform[16];      /* "hip" (AMD, hipcc/clang) or "cuda" (NVIDIA, nvcc through hip_compat.h) */
    char built_arch[64];    /* device code target of the build, e.g. gfx1151 or sm_90 */
    int32_t runtime_version, driver_version; /* as the runtime reports them (0: unknown) */
    int32_t n_devices;      /* devices the runtime sees */
    int32_t device;         /* the device described below */
    char device_name[256];
    char device_arch[64];   /* gfx1151 (gcnArchName) or sm_90 (compute capability) */
    int32_t warp_size;
    int32_t arch_ok;        /* 1: a kernel of this library ran on the device */
    uint64_t mem_total, mem_free; /* bytes, hipMemGetInfo / cudaMemGetInfo */
    int32_t integrated;     /* 1: the device shares the host's memory (an APU: Strix Halo) */
    char blas[192];         /* the prefill GEMM's BLAS: "cuBLAS 13.0.2 (libcublas.so.13)", or "none: why" */
} ds4_gpu_info;

/* Load `library` and describe it and device 0.  Returns DS4_OK when a device is there and the
 * library's kernels run on it; otherwise DS4_E_DEVICE (or DS4_E_UNSUPPORTED when the file cannot be
 * loaded) with the reason in err: no such file / dlopen's message, no device, wrong arch.  `out`
 * is filled as far as the probe got (library, platform, built_arch even without a device). */
int ds4_gpu_probe(const char *library, ds4_gpu_info *out, char *err, size_t err_len);

/* The GPU matmul kernel on its own (tests, benchmarks): the same contract as ds4_kernel_matmul
 * (W host memory, uploaded first; X float [n_tok, cols]; Y float [n_tok, rows]); the kernel runs
 * `reps` >= 1 times on device buffers and *ms (may be NULL) gets the median time of one run in
 * milliseconds (device events).  `activations`: DS4_ACTIVATIONS_F32, or _Q8 for the q8 kernels of a
 * planar matrix (spec ds4.md §2.9.5). */
int ds4_gpu_kernel_matmul(const char *library, int type, int32_t activations, const void *W, int64_t rows, int64_t cols,
                          const float *X, int64_t n_tok, float *Y, int32_t reps, double *ms,
                          char *err, size_t err_len);

/* The GPU expert-gathered product on its own (tests): W host memory holding n_mat matrices of
 * rows x cols elements of GGML `type` (with DS4_GPU_PLANAR: uploaded in the planar layout, or
 * DS4_E_INVALID when the rows cannot take it); slot s < n_slots multiplies matrix ids[s] by row s
 * of X (float [n_slots, cols]) into row s of Y (float [n_slots, rows]); `activations` as above.
 * With ms (may be NULL), the product then runs `reps` >= 1 more times back to back and *ms gets
 * the mean host time of one in milliseconds (launches queued, one wait at the end). */
int ds4_gpu_kernel_gather(const char *library, int type, int32_t activations, const void *W, int64_t n_mat, int64_t rows,
                          int64_t cols, const int32_t *ids, int64_t n_slots, const float *X, float *Y,
                          int32_t reps, double *ms, char *err, size_t err_len);

/* The GPU backend's grouped products on their own (tests; backend.h version 9): `groups` matrices
 * of rows x cols (GGML type `type`, DS4_GPU_PLANAR as above) one after another in W; token t < n,
 * group g: row (t * groups + g) of X (float [n * groups, cols]) times matrix g into row
 * (t * groups + g) of Y (float [n * groups, rows]), i.e. ds4_gpu_kernel_gather's products with
 * ids[t * groups + g] = g.  `activations` as above.  DS4_E_UNSUPPORTED when the library has no
 * grouped products. */
int ds4_gpu_kernel_grouped(const char *library, int type, int32_t activations, const void *W, int32_t groups,
                           int64_t rows, int64_t cols, int64_t n, const float *X, float *Y, char *err, size_t err_len);

/* The GPU lightning indexer on its own (tests; spec ds4.md §2.5): n tokens at positions p0..
 * with queries qi [n, IH, ID] and head weights iw [n, IH] against the (p0 + n) / ratio keys
 * [*, ID] (host memory, uploaded first); sel [n, top_k] and nsel [n] as the backend's indexer
 * writes them (nsel[t] = -1: every visible row attended, sel row untouched). */
int ds4_gpu_kernel_indexer(const char *library, const float *qi, const float *iw, int32_t n, int64_t p0, int32_t IH,
                           int32_t ID, const float *keys, int32_t ratio, int32_t top_k, float scale, int32_t *sel,
                           int32_t *nsel, char *err, size_t err_len);

/* Device memory read bandwidth in GB/s (1e9 bytes read per second; best of `reps` passes over a
 * buffer of `bytes` bytes), or a negative DS4_E* code. */
int ds4_gpu_bandwidth(const char *library, uint64_t bytes, int32_t reps, double *gbs, char *err, size_t err_len);

/* A weight upload on its own (tests): `rows` rows of `cols` elements of GGML `type` from host
 * memory `src` (a file-backed map, as the engine uploads from), through the path the engine uses
 * (with DS4_GPU_PLANAR: the planar layout where the rows take it), then the device bytes copied
 * back into out[rows * row bytes].  *layout: the layout id the device copy got.  `type`
 * DS4_GPU_UPLOAD_BYTES: `rows` rows of `cols` bytes through the backend's vector upload. */
#define DS4_GPU_UPLOAD_BYTES -1
int ds4_gpu_kernel_upload(const char *library, int32_t type, const void *src, int64_t rows, int64_t cols, void *out,
                          int32_t *layout, char *err, size_t err_len);

/* ---- DSpark speculative decoding (spec dspark.md) ----------------------- */

/* Largest drafter block the engine supports (spec dspark.md §4.3: ds4's
 * metadata check refuses block sizes above 16). */
#define DS4_DSPARK_MAX_BLOCK 16
/* Bins of the confidence histogram: bin i counts c in [i/20, (i+1)/20). */
#define DS4_DSPARK_CONF_BINS 20

/* Why a cycle verified no draft (ds4_dspark_stats.no_draft_reasons[]). */
#define DS4_ND_DISABLED 0         /* DSpark switched off (or no support model) */
#define DS4_ND_SUPPORT_INVALID 1  /* the support file was refused at load */
#define DS4_ND_CAPTURE_INVALID 2  /* captured target hidden rows not current */
#define DS4_ND_CHAIN_FAIL 3       /* a drafter op failed (chain_fail_op names it) */
#define DS4_ND_CONFIDENCE_GATE 4  /* c_1 below the threshold: nothing to verify */
#define DS4_ND_SCHEDULER_SKIP 5   /* the adaptive scheduler skipped drafting */
#define DS4_ND_TAIL_SKIP 6        /* the budget cuts the draft to a length that cannot pay, or a due probe
                                   * short (scheduler on) */
#define DS4_ND_NO_ROOM 7          /* budget or context leaves no room for a draft */
#define DS4_ND_CONFIDENCE_CUT 8   /* the confidence policy found no draft of the proposal worth a verify */
#define DS4_ND_COUNT 9

/* The support model's shape (spec dspark.md §4.1).  Tensors are passed
 * with the ds4 support names (`mtp.N.<suffix>`, final-stage heads under
 * `mtp.<n_stages-1>.`); llama.cpp `dflash` names are mapped by the caller. */
typedef struct {
    int32_t n_stages;        /* drafter MoE stages (3 for Flash) */
    int32_t block_size;      /* draft rows per pass (5 for Flash), 1..DS4_DSPARK_MAX_BLOCK */
    int32_t markov_rank;     /* r of markov_w1/markov_w2 */
    int32_t noise_token;     /* block filler id (128799 for Flash) */
    int32_t n_capture;       /* target layers captured, 1..8 */
    const int32_t *capture_layers;  /* [n_capture] post-layer ids, increasing */
    int32_t n_draft_vocab;   /* 0: the drafter proposes from the whole vocabulary; else the number of ids */
    const int32_t *draft_vocab;     /* [n_draft_vocab] distinct token ids the drafter proposes from, any
                                       order (spec dspark.md §2.6); the engine keeps its own copy */
} ds4_support_config;

/* One applied knob change: the knobs in force from cycle `cycle` on. */
typedef struct {
    uint64_t cycle;
    ds4_dspark_knobs knobs;
} ds4_dspark_event;

/* DSpark counters of a session (spec dspark.md §6 names; times in ms).
 * Where our reference layout makes ds4's definitions differ:
 *   target      plain (no-draft) single-token passes only: the anchor of a
 *               drafted cycle runs inside the verify pass;
 *   verify      the one pass over [anchor, drafts] (anchor included);
 *   snapshot    0: caches are rings truncated after the accepted prefix, so
 *               nothing is saved or restored;
 *   saved       accepted_draft * t_decode_ms;
 *   net_saved   (cycles + accepted_draft) * t_decode_ms
 *               - (target + propose + spec_total): the time target-only
 *               decoding would have needed for the tokens these cycles
 *               emitted, minus the time spent.  (ds4's saved - propose -
 *               spec_total would charge the anchor's own decode, which
 *               the verify pass does, as overhead.)
 *   tail_skips  counted as cycles (no_draft reason tail_skip).
 * ds4_session_reset_stats zeroes these counters too.
 * A cycle is one ds4_session_step that runs the target on a pending anchor
 * while a support model is attached (or was refused).  Each cycle ends in
 * exactly one of: full, partial, miss_first (verified, 0 accepted),
 * no_draft (nothing verified; no_draft_reasons[] says why and sums to it),
 * invalid, verifier_unavailable, errors.  Both histograms have one entry per
 * cycle (index = draft tokens verified / accepted; 0 for no-draft cycles). */
typedef struct {
    uint64_t cycles, first_tokens, proposed, accepted_draft;
    uint64_t full, partial, miss_first, no_draft, no_room, invalid;
    uint64_t scheduler_skips, tail_skips, verifier_unavailable, errors;
    uint64_t chain_fail;
    double propose_ms, prop_stage0_ms, prop_setup_ms, prop_cache_ms, prop_chain_ms;
    double prop_hidden_ms, prop_conf0_ms, prop_logits_ms, prop_markov_ms, prop_confidence_ms;
    double snapshot_ms, verify_ms, spec_total_ms, target_ms, saved_ms, net_saved_ms;
    double t_decode_ms;          /* mean plain single-token pass: the price of the savings */
    int32_t t_decode_measured;   /* 0: no plain decode yet, so saved/net_saved are unknown (0) */
    int32_t block_size;
    uint64_t draft_len_hist[17];      /* [DS4_DSPARK_MAX_BLOCK + 1] */
    uint64_t accepted_len_hist[17];
    uint64_t pos_proposed[16];        /* [k]: cycles that verified a draft at block row k */
    uint64_t pos_accepted[16];        /* [k]: ... and accepted it */
    uint64_t conf_hist[20];           /* every computed c_k, DS4_DSPARK_CONF_BINS bins */
    uint64_t no_draft_reasons[9];     /* [DS4_ND_COUNT] */
    char chain_fail_op[32];           /* the op of the last chain failure ("" if none) */
    uint64_t n_events;                /* knob changes applied so far */
    uint64_t verify_head_rows;        /* LM-head rows the verify passes computed: 1 + drafts per
                                         drafted cycle under DS4_VERIFY_HEAD_ALL, fewer under LAZY
                                         (min(DS4_VERIFY_HEAD_FIRST, 1 + drafts) unless the first
                                         group's drafts were all accepted) */
} ds4_dspark_stats;

/* Attach a DSpark support model to an engine (once, before sessions are
 * made).  Every tensor is bound by name with its type and dims checked
 * against the target; vectors are scanned for NaN/Inf.  On failure the
 * engine keeps running target-only, the message is kept (ds4_engine_support_status)
 * and every cycle counts as no_draft with reason support_invalid. */
int ds4_engine_attach_support(ds4_engine *e, const ds4_support_config *cfg,
                              const ds4_tensor_desc *tensors, int32_t n_tensors,
                              char *err, size_t err_len);
/* Record a support file that was refused before attaching (the caller's
 * validation); `why` is kept as the status message. */
void ds4_engine_refuse_support(ds4_engine *e, const char *why);
/* 1: a support model is attached and drafting is possible; 0: none;
 * -1: refused (message in msg[0..len)). */
int ds4_engine_support_status(const ds4_engine *e, char *msg, size_t len);

/* Knobs (thread-safe; take effect at the next cycle; each applied change is
 * logged with its cycle number).  Errors for out-of-range values. */
int ds4_session_set_dspark(ds4_session *s, const ds4_dspark_knobs *k, char *err, size_t err_len);
int ds4_session_get_dspark(ds4_session *s, ds4_dspark_knobs *out);
/* The latest min(max, n_events) applied changes, oldest first; *n = written. */
int ds4_session_dspark_events(ds4_session *s, ds4_dspark_event *out, int32_t max, int32_t *n);
int ds4_session_dspark_stats(ds4_session *s, ds4_dspark_stats *out);
/* The scheduler's measured prices and acceptance (spec dspark.md §7.4):
 * what a session learnt, or what a new one starts with.  t_ver[n] is the
 * moving average of a pass over n rows in ms (n = 1: a plain decode; index
 * 0 unused; under DS4_VERIFY_HEAD_LAZY a verify's time includes the later
 * rows' LM head where acceptance reached them, so t_ver[n > 3] is the mean
 * over the acceptance seen), valid where has_ver[n]; t_prop the full proposal's; reached[k]
 * counts verifies that reached draft position k (every earlier draft
 * accepted) and hit[k] those that accepted it. */
typedef struct {
    double t_ver[18];                 /* [DS4_DSPARK_MAX_BLOCK + 2] */
    int32_t has_ver[18];
    double t_prop;
    int32_t has_prop;
    uint64_t reached[16];             /* [DS4_DSPARK_MAX_BLOCK] */
    uint64_t hit[16];
} ds4_dspark_prices;

/* The scheduler state of a session, as it stands after its last cycle. */
int ds4_session_dspark_prices(ds4_session *s, ds4_dspark_prices *out);
/* Start a session's scheduler from `p` (e.g. another session's prices):
 * the prices and counts replace the session's, the back-off restarts, and
 * the next cycle is still a plain decode that re-times t_ver[1] before the
 * scheduler decides anything.  `kept` != 0: `p` was kept from other sessions
 * (spec dspark.md §7.4), so when that plain decode takes less than half the
 * kept t_ver[1] the kept times are dropped (the counts stay) and the session
 * prices itself as a fresh one does, and a kept verify (width >= 2) or
 * proposal time is replaced by the session's first sample of it when that
 * is cheaper, and the acceptance counts weigh apart from the session's own,
 * half after its first verify and nothing from its second on (they go on in
 * the prices it hands back); `kept` == 0: `p` is used as given.
 * DS4_E_INVALID names the field when a time is not finite and positive where
 * it is marked valid, or hit[k] > reached[k]; DS4_E_STATE without an
 * attached support model. */
int ds4_session_set_dspark_prices(ds4_session *s, const ds4_dspark_prices *p, int kept, char *err, size_t err_len);
/* The scheduler replayed on a recorded text (spec dspark.md §7.5): the same
 * decisions a session's scheduler makes, with each pass's time given instead
 * of measured.  accepted[p] (0..block) is how many of the block's drafts
 * proposed at anchor position p the target accepts (greedy: the longest
 * prefix equal to its own tokens); a cycle at position p that verifies nd
 * drafts accepts min(accepted[p], nd) and the next position it reaches is
 * p + accepted + 1.  confidence (NULL: none recorded) holds the raw
 * confidences c_1..c_block of the proposal at each anchor position,
 * confidence[p * block + k - 1] in [0, 1] (0 past a proposal's end); without
 * them the threshold must be 0 and the policy DS4_SCHED_ACCEPTANCE.  The
 * replay emits n_tokens tokens (1..n_positions) from `start` (NULL: a fresh
 * session; `kept` as for ds4_session_set_dspark_prices) with `knobs`, each
 * plain decode costing t_decode, each proposal t_propose and each verify
 * t_verify[nd + 1] (ms; a proposal the threshold or the confidence policy
 * cuts to nothing is followed by a plain decode); `end` (may be NULL) gets
 * the scheduler's prices after it.  DS4_E_INVALID names the argument out of
 * range. */
typedef struct {
    double t_decode;                  /* ms, a plain decode */
    double t_propose;                 /* ms, a proposal of the whole block */
    double t_verify[18];              /* [DS4_DSPARK_MAX_BLOCK + 2] ms, a verify of n rows (2..block + 1) */
} ds4_dspark_costs;
typedef struct {
    double ms;                        /* the replayed decode's time */
    uint64_t tokens;                  /* emitted (n_tokens) */
    uint64_t cycles;
    uint64_t drafted_cycles;          /* cycles that verified drafts */
    uint64_t proposed;                /* drafts verified */
    uint64_t accepted;                /* ... of them accepted */
    uint64_t no_draft_reasons[9];     /* [DS4_ND_COUNT] plain cycles by reason */
} ds4_dspark_replay_result;
int ds4_dspark_replay(const ds4_dspark_prices *start, int32_t kept, const ds4_dspark_knobs *knobs, int32_t block,
                      const uint8_t *accepted, const float *confidence, int32_t n_positions, int32_t n_tokens,
                      const ds4_dspark_costs *costs, ds4_dspark_prices *end, ds4_dspark_replay_result *out, char *err,
                      size_t err_len);
/* The last drafter pass: its draft tokens (after the confidence cut, before
 * any budget or scheduler cut) and the raw confidences c_1..c_n it computed
 * (uncalibrated; c_k is computed up to the first one below the threshold). */
int ds4_session_dspark_last_proposal(ds4_session *s, int32_t *tokens, float *conf, int32_t max,
                                    int32_t *n_tokens, int32_t *n_conf);
/* Test hook: make the named drafter op fail on every pass ("" or NULL: none).
 * Op names: main_proj, context_kv, embed, hc_pre, attn_q, attn_kv, attention,
 * attn_output, moe, hc_head, lm_head, markov, confidence; "capture" makes the
 * capture check fail instead (no-draft reason capture_invalid). */
int ds4_session_dspark_fail_op(ds4_session *s, const char *op);

/* CDEF END */

#ifdef __cplusplus
}
#endif

#endif /* DS4_ENGINE_H */
