/* dspark.c — DSpark speculative decoding (spec dspark.md), on the engine's backend.
 *
 * Reference cycle layout (spec dspark.md §2.5): after a target pass whose last position is p,
 * the anchor t_{p+1} is sampled and emitted but not run (the session's pending token).  A cycle
 *   1. checks the live knobs, the support model, the capture and the scheduler;
 *   2. runs the drafter: context rows main_x(q) -> per-stage KV for q in (p-W, p] (projected lazily
 *      from the captured target hidden rows), block [anchor, noise...] at p+1..p+B through the
 *      stages (non-causal block attention with sinks, MoE), HC head -> pre-norm h_k, confidence
 *      c_k = sigmoid(w . [h_k ; W1[x_{k-1}]]), norm -> the target's LM head -> U_k, Markov head
 *      U_k + W2 W1[x_{k-1}] -> x_k; the proposal is cut at the first c_k < threshold;
 *   3. verifies [anchor, d_1..d_l] in one target pass (batch-invariant kernels make each row equal
 *      to a one-token decode), accepts the longest matching prefix (greedy) or runs rejection
 *      sampling (temperature > 0, spec §3.2), truncates the caches after the accepted prefix
 *      (ring buffers make that exact: there is no separate snapshot to restore), and samples
 *      the next token from the last accepted row; it becomes the next anchor.
 * Every cycle ends in exactly one outcome (ds4_engine.h documents the counters).
 */
#include "internal.h"
#include "cpu/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_EVENTS 256
/* ds4_dspark_stats.no_draft_reasons has DS4_ND_COUNT entries (the cdef spells the number out). */
_Static_assert(sizeof(((ds4_dspark_prices *)0)->t_ver) / sizeof(double) == DS4_DSPARK_MAX_BLOCK + 2 &&
                   sizeof(((ds4_dspark_prices *)0)->hit) / sizeof(uint64_t) == DS4_DSPARK_MAX_BLOCK,
               "ds4_dspark_prices arrays must match DS4_DSPARK_MAX_BLOCK");
_Static_assert(sizeof(((ds4_dspark_stats *)0)->no_draft_reasons) / sizeof(uint64_t) == DS4_ND_COUNT,
               "no_draft_reasons[] must have DS4_ND_COUNT entries");
#define MAX_BACKOFF 128      /* the longest back-off while drafting could still pay (spec dspark.md §7.4) */
#define HOPELESS_BACKOFF 256 /* the back-off when it could not pay enough even optimistically: one single-draft
                              * probe (~2.5 ms) per 256 decodes (~2.2 ms each) on the demo pair's CPU
                              * run, an estimated 0.5 % */
#define HOPELESS_MIN_VERIFIES 12 /* fewer verifies of the session's own than this never make drafting
                                   * hopeless: one cold first proposal, timed alone, can price it out at
                                   * every bound, and a code answer's first lines are hard to draft
                                   * (with 4, five of six fresh sessions on the demo pair's code prompt
                                   * gave up drafting for good: tools/cpu_notes.md, 2026-12-04 (late)) */
#define HOPE_MARGIN 1.25     /* drafting "could pay" only if its optimistic rate beats plain decoding by
                              * 25 %: a smaller best case is not worth the probes that would test it */
#define EMA 0.2
#define ACCEPT_WINDOW 64     /* verifies of the first position after which the decisions' acceptance
                              * counts are halved: acceptance is not stationary (spec dspark.md §7.4) */
#define PROBE_ONE 1          /* ds4_dspark.probe: a single-draft probe is due */
#define PROBE_LONG 2         /* ds4_dspark.probe: a probe of the optimistic length is due */
#define REPRICE_CYCLES 64    /* a plain decode after this many drafted cycles re-times t_ver(1) */
#define FIRST_DECODES 5      /* a session with no kept t_ver(1) decodes plainly this many cycles first and
                              * prices t_ver(1) at their median (spec dspark.md §7.4) */
#define INVALID_DRAFT (-1) /* plain_cycle outcome: a draft id outside the vocabulary */

struct ds4_dspark {
    ds4_span ctx;               /* positions whose context KV rows the drafter's ring holds (forward.c) */
    float *h;                   /* [B, H] pre-norm hidden */
    float *hn;                  /* [B, H] normed hidden */
    float *feat;                /* [H + r] confidence input */
    float *corr;                /* [B, V] corrected (Markov) logits (sampled drafting) */
    float *vlogits;             /* [B + 1, V] verify rows */
    int32_t *cand_ids;          /* [V] */
    double *cand_p;             /* [V] */
    float conf[DS4_DSPARK_MAX_BLOCK];
    int32_t n_conf;
    int32_t drafts[DS4_DSPARK_MAX_BLOCK]; /* the last proposal (before the scheduler's cut) */
    int32_t n_drafts;
    /* knobs */
    pthread_mutex_t mu;
    ds4_dspark_knobs want, act;
    ds4_dspark_event events[N_EVENTS];
    uint64_t n_events;
    char fail_op[32];
    /* scheduler (spec dspark.md §7.3, §7.4): the measured times and the conditional acceptance by
     * draft position (ds4_engine.h documents the fields) */
    ds4_dspark_prices pr;
    int skip_left, backoff, probe;
    int plain_here;             /* a priced plain decode ran since the session began or its prices were set */
    uint64_t n_plain;           /* plain (no-draft) cycles */
    uint64_t n_priced;          /* ... of them not capturing a graph: priced_ms / n_priced prices the savings */
    double priced_ms;
    int since_plain;            /* drafted cycles since the last plain one */
    int first_n;                /* of the FIRST_DECODES plain decodes that price a session without a kept
                                 * t_ver(1), those timed so far (FIRST_DECODES: none are due) */
    double first_ms[FIRST_DECODES];
    int kept_check;             /* the session started from another session's kept prices: its first
                                 * priced plain decode checks them against its own (spec dspark.md §7.4) */
    int32_t carried_ver[DS4_DSPARK_MAX_BLOCK + 2]; /* a kept verify time of this width (>= 2) no pass of this
                                                    * session has timed yet (spec dspark.md §7.4, In-session) */
    int32_t carried_prop;       /* ... the same for the kept proposal time */
    /* the acceptance counts the decisions read (accept_at): pr.reached/pr.hit, halved each time
     * ACCEPT_WINDOW verifies reached the first position, so that they weigh the last 32-64 verifies
     * (spec dspark.md §7.4, Survival); pr keeps the whole counts, which the engine hands on */
    uint64_t win_reached[16], win_hit[16];
    int times_cold;             /* the session began with no proposal time, kept or given: until
                                 * HOPELESS_MIN_VERIFIES verifies its times are its first samples */
    uint64_t own_verifies;      /* drafted cycles verified since the session began or its prices were set
                                 * (and the verifies of prices set directly, not kept: used as given) */
    ds4_dspark_stats st;
};

/* ---- setup ---------------------------------------------------------------------------------- */

static float *take_f32(size_t n, uint64_t *bytes, int *ok) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) *ok = 0;
    *bytes += n * sizeof(float);
    return p;
}

/* DS4_OK, or DS4_E_INVALID naming the knob that is out of range (max_draft 0 passes when
 * zero_max_ok: "the block size" at session creation). */
static int check_knobs(const ds4_dspark_knobs *k, int block, int zero_max_ok, char *err, size_t err_len) {
    if (k->enabled != 0 && k->enabled != 1) return ds4_fail(err, err_len, DS4_E_INVALID, "enabled must be 0 or 1, got %d", k->enabled);
    if (k->scheduler != 0 && k->scheduler != 1)
        return ds4_fail(err, err_len, DS4_E_INVALID, "scheduler must be 0 or 1, got %d", k->scheduler);
    if (!(k->threshold >= 0.0f && k->threshold <= 1.0f))
        return ds4_fail(err, err_len, DS4_E_INVALID, "confidence threshold must be in [0, 1], got %g", (double)k->threshold);
    if ((k->max_draft < 1 && !(zero_max_ok && k->max_draft == 0)) || k->max_draft > block)
        return ds4_fail(err, err_len, DS4_E_INVALID, "max draft length must be 1..%d (the support block size), got %d", block,
                        k->max_draft);
    return DS4_OK;
}

int ds4_dspark_session_init(ds4_session *s, const ds4_dspark_knobs *initial, char *err, size_t err_len) {
    ds4_engine *e = s->e;
    const ds4_support *sup = e->sup;
    int block = sup ? sup->block : DS4_DSPARK_MAX_BLOCK;
    ds4_dspark_knobs k = {sup ? 1 : 0, 1, 0.0f, block};
    if (initial) {
        int rc = check_knobs(initial, block, 1, err, err_len);
        if (rc != DS4_OK) return rc;
        k = *initial;
        if (!sup) k.enabled = 0;
        if (k.max_draft == 0) k.max_draft = block;
    }
    ds4_dspark *d = calloc(1, sizeof *d);
    if (!d) return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory allocating the DSpark state of a session");
    s->dsp = d;
    pthread_mutex_init(&d->mu, NULL);
    ds4_span_init(&d->ctx, s->kv_cap); /* sliding_window + batch + 1: as far back as truncate may go */
    d->backoff = 2;
    d->times_cold = 1;
    d->want = k;
    d->act = d->want;
    d->st.block_size = sup ? sup->block : 0;
    if (!sup) return DS4_OK;
    const ds4_cfg *c = &e->c;
    const int64_t H = c->n_embd, V = c->n_vocab, B = sup->block;
    uint64_t *sb = &s->scratch_bytes;
    int ok = 1;
#define A(n) take_f32((size_t)(n), sb, &ok)
    d->h = A(B * H);
    d->hn = A(B * H);
    d->feat = A(H + sup->rank);
    d->corr = A(B * V);
    d->vlogits = A((B + 1) * V);
#undef A
    d->cand_ids = malloc((size_t)V * sizeof(int32_t));
    d->cand_p = malloc((size_t)V * sizeof(double));
    *sb += (size_t)V * (sizeof(int32_t) + sizeof(double));
    if (!ok || !d->cand_ids || !d->cand_p)
        return ds4_fail(err, err_len, DS4_E_NOMEM, "out of memory allocating the DSpark state of a session");
    return DS4_OK;
}

void ds4_dspark_session_free(ds4_session *s) {
    ds4_dspark *d = s->dsp;
    if (!d) return;
    void *bufs[] = {d->h, d->hn, d->feat, d->corr, d->vlogits, d->cand_ids, d->cand_p};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    pthread_mutex_destroy(&d->mu);
    free(d);
    s->dsp = NULL;
}

void ds4_dspark_free_support(ds4_engine *e) {
    if (!e->sup) return;
    ds4_gpu_free_support(e);
    free(e->sup->vd);
    free(e->sup->vd_rows);
    free(e->sup->stages);
    free(e->sup->capture_slot);
    free(e->sup);
    e->sup = NULL;
}

/* Forget captured and context rows of positions >= n (the rings keep theirs: nothing to restore). */
void ds4_dspark_truncate(ds4_session *s, int32_t n) {
    ds4_span_truncate(&s->cap, n);
    ds4_span_truncate(&s->dsp->ctx, n);
}

/* ---- the drafter pass ----------------------------------------------------------------------- */

typedef struct {
    int fail;
    const char *op;
} chain;

/* 1 if the op must fail (the test hook) or `bad` (a real failure); records the op. */
static int op_failed(ds4_dspark *d, chain *ch, const char *op, int bad) {
    if (bad || (d->fail_op[0] && strcmp(d->fail_op, op) == 0)) {
        ch->fail = 1;
        ch->op = op;
        return 1;
    }
    return 0;
}

/* The confidence head's input row [h ; W1[prev]] (H + rank floats) into f. */
static void conf_features(const ds4_session *s, const float *h, int32_t prev, float *f) {
    const ds4_support *sup = s->e->sup;
    const int H = s->e->c.n_embd;
    const ds4_w *w1 = &sup->markov_w1;
    memcpy(f, h, (size_t)H * sizeof(float));
    ds4_type(w1->type)->dequant(w1->data + (size_t)prev * w1->row_bytes, f + H, sup->rank);
}

static float confidence(ds4_session *s, const float *h, int32_t prev) {
    ds4_engine *e = s->e;
    ds4_dspark *d = s->dsp;
    const int H = e->c.n_embd, r = e->sup->rank;
    conf_features(s, h, prev, d->feat);
    float z;
    ds4_host_mm(e, &e->sup->conf, 0, 1, d->feat, H + r, 1, &z, 1);
    return ds4_sigmoid(z);
}

/* c_k for k = 1..want-1 of a greedy chain's drafts x (c_0 is the caller's) in one product of the
 * confidence head over want - 1 feature rows [h_k ; W1[x_{k-1}]] (in d->corr, free in greedy
 * drafting): the head's product is batch-invariant, so each c_k is what confidence() gives alone.
 * Returns 0 when the rows do not fit there (the caller then asks one at a time). */
static int chain_confidences(ds4_session *s, const int32_t *x, int want, float *out) {
    ds4_engine *e = s->e;
    const ds4_support *sup = e->sup;
    ds4_dspark *d = s->dsp;
    const int H = e->c.n_embd, r = sup->rank;
    if (want < 2 || (int64_t)(want - 1) * (H + r) > (int64_t)sup->block * e->c.n_vocab) return 0;
    for (int k = 1; k < want; k++)
        conf_features(s, d->h + (size_t)k * H, x[k - 1], d->corr + (size_t)(k - 1) * (H + r));
    float z[DS4_DSPARK_MAX_BLOCK];
    ds4_host_mm(e, &sup->conf, 0, 1, d->corr, H + r, want - 1, z, 1);
    for (int k = 1; k < want; k++) out[k] = ds4_sigmoid(z[k - 1]);
    return 1;
}

static void note_conf(ds4_dspark *d, float c) {
    int bin = (int)(c * DS4_DSPARK_CONF_BINS);
    if (bin < 0) bin = 0;
    if (bin >= DS4_DSPARK_CONF_BINS) bin = DS4_DSPARK_CONF_BINS - 1;
    d->st.conf_hist[bin]++;
    if (d->n_conf < DS4_DSPARK_MAX_BLOCK) d->conf[d->n_conf++] = c;
}

/* The normaliser of softmax(row / T) over V entries: q(i) = exp(row[i] / T - *mx) / *sum. */
static void softmax_norm(const float *row, int32_t V, float T, double *mx_out, double *sum_out) {
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < V; i++) if ((double)row[i] / T > mx) mx = (double)row[i] / T;
    for (int32_t i = 0; i < V; i++) sum += exp((double)row[i] / T - mx);
    *mx_out = mx;
    *sum_out = sum;
}

/* Draw from softmax(row / T) over the whole vocabulary. */
static int32_t draw_q(ds4_session *s, const float *row, float T) {
    const int32_t V = s->e->c.n_vocab;
    double mx, sum;
    softmax_norm(row, V, T, &mx, &sum);
    double u = ds4_uniform(s) * sum, cum = 0.0;
    int32_t last = V - 1;
    for (int32_t i = 0; i < V; i++) {
        const double q = exp((double)row[i] / T - mx);
        if (q > 0.0) last = i; /* rounding's fallback: the last token q can draw (not one outside the
                                  draft vocabulary, whose logits are -inf) */
        cum += q;
        if (u < cum) return i;
    }
    return last;
}

/* Spread the first ds4_draft_vocab_size columns of row over the whole vocabulary in place: column j
 * to token vd[j], -inf for every token outside the draft vocabulary (spec dspark.md §2.6). Safe in
 * place: the ids increase and vd[j] >= j, so a column is read before anything is written over it. */
static void spread_draft_row(const ds4_engine *e, float *row) {
    const ds4_support *sup = e->sup;
    if (!sup->n_vd) return;
    int32_t hi = (int32_t)e->c.n_vocab;
    for (int32_t j = sup->n_vd - 1; j >= 0; j--) {
        const float v = row[j];
        for (int32_t i = sup->vd[j] + 1; i < hi; i++) row[i] = -INFINITY;
        row[sup->vd[j]] = v;
        hi = sup->vd[j];
    }
    for (int32_t i = 0; i < hi; i++) row[i] = -INFINITY;
}

typedef struct {
    double stage0, setup, cache, chain, hidden, conf0, logits, markov, confidence;
} prop_times;

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static int propose_heads(ds4_session *s, int32_t anchor, int want, float threshold, int32_t *drafts, chain *ch,
                         prop_times *pt, double t);

/* The drafter pass for `anchor` after context ending at last = n_tokens - 1 (forward.c runs it on
 * the engine's backend).  Writes up to `want` drafts (fewer where c_k < threshold).  Returns the
 * number of drafts, 0 for the confidence gate, or -1 for a chain failure (ch names the op).
 * Stage timers: the context projection is prop_cache; the embedding prop_setup, the stages
 * prop_chain and the HC head prop_hidden on a host backend; on a GPU backend the embedding, the
 * stages and the HC head are one queued sequence timed as prop_chain (prop_setup and prop_hidden
 * stay 0).  The test hook's op names are checked in the order the ops run. */
static int propose(ds4_session *s, int32_t anchor, int want, float threshold, int32_t *drafts, chain *ch,
                   prop_times *pt) {
    ds4_engine *e = s->e;
    const ds4_support *sup = e->sup;
    ds4_dspark *d = s->dsp;
    const int H = e->c.n_embd, B = sup->block;
    const int host = e->ops->host_memory;
    const int64_t last = s->n_tokens - 1, W = e->c.sliding_window;
    const int64_t lo = last - W + 1 < 0 ? 0 : last - W + 1;
    double t = ds4_now_ms(), t1, t_chain = t;
    d->n_conf = 0;
    d->n_drafts = 0;
    /* context rows (lazily projected; positions the ring already holds are reused) */
    int64_t from = (d->ctx.last >= lo - 1 && d->ctx.from <= lo) ? d->ctx.last + 1 : lo;
    if (from <= last) {
        if (op_failed(d, ch, "main_proj", 0) || op_failed(d, ch, "context_kv", 0)) return -1;
        const char *op = "main_proj";
        if (ds4_draft_context(s, from, last, &op) != DS4_OK) {
            op_failed(d, ch, op, 1);
            return -1;
        }
        ds4_span_written(&d->ctx, from, (int)(last - from + 1));
    }
    t1 = ds4_now_ms(); pt->cache += t1 - t; t = t1; t_chain = t;
    /* block input: [anchor, noise...] embedded with the target's table, repeated over the streams */
    if (op_failed(d, ch, "embed", 0)) return -1;
    if (ds4_draft_embed(s, anchor) != DS4_OK) {
        op_failed(d, ch, "embed", 1);
        return -1;
    }
    t1 = ds4_now_ms(); if (host) pt->setup += t1 - t; t = t1;
    static const char *const stage_ops[] = {"hc_pre", "attn_q", "attn_kv", "attention", "attn_output", "moe"};
    for (int st = 0; st < sup->n_stages; st++)
        for (size_t i = 0; i < sizeof stage_ops / sizeof stage_ops[0]; i++)
            if (op_failed(d, ch, stage_ops[i], 0)) return -1;
    const char *op = "hc_pre";
    int rc = ds4_draft_stages(s, last + 1, lo, last, &op);
    t1 = ds4_now_ms(); if (host) pt->chain += t1 - t; t = t1;
    if (rc != DS4_OK) {
        if (!host) pt->chain += t1 - t_chain;
        op_failed(d, ch, op, 1);
        return -1;
    }
    rc = ds4_draft_head(s, d->h);
    t1 = ds4_now_ms();
    if (host) pt->hidden += t1 - t;
    else pt->chain += t1 - t_chain;
    t = t1;
    if (op_failed(d, ch, "hc_head", rc != DS4_OK || !all_finite(d->h, (int64_t)B * H))) return -1;
    return propose_heads(s, anchor, want, threshold, drafts, ch, pt, t);
}

/* After the HC head: confidences, the LM head and the Markov head.  Greedy drafting keeps the base
 * logits in the backend's memory and takes each draft's argmax there; sampled drafting (T > 0) reads
 * host rows of them. */
static int propose_heads(ds4_session *s, int32_t anchor, int want, float threshold, int32_t *drafts, chain *ch,
                         prop_times *pt, double t) {
    ds4_engine *e = s->e;
    const ds4_support *sup = e->sup;
    ds4_dspark *d = s->dsp;
    const int H = e->c.n_embd;
    const int32_t V = e->c.n_vocab;
    double t1;
    float c0 = confidence(s, d->h, anchor);
    if (op_failed(d, ch, "confidence", !isfinite(c0))) return -1;
    note_conf(d, c0);
    t1 = ds4_now_ms(); pt->conf0 += t1 - t; t = t1;
    if (c0 < threshold || threshold >= 1.0f) return 0; /* 1 = never draft (even a saturated c = 1) */
    /* base logits of the rows that may be drafted */
    for (int k = 0; k < want; k++)
        ds4_rms_norm(d->h + (size_t)k * H, H, e->c.rms_eps, sup->norm, d->hn + (size_t)k * H);
    if (op_failed(d, ch, "lm_head", 0)) return -1;
    const float T = s->sampling.temperature;
    const float *U = NULL;
    if (op_failed(d, ch, "lm_head", ds4_draft_logits(s, d->hn, want, T > 0.0f ? &U : NULL) != DS4_OK)) return -1;
    t1 = ds4_now_ms(); pt->logits += t1 - t; t = t1;
    int32_t prev = anchor;
    int n = 0;
    int32_t chain_x[DS4_DSPARK_MAX_BLOCK];
    float chain_c[DS4_DSPARK_MAX_BLOCK];
    const int on_device = !(T > 0.0f) && ds4_device_picks(s); /* spec platform.md §9 */
    int have_c = 0;
    if (on_device) { /* every draft's argmax queued at once; the confidences below cut the proposal */
        if (op_failed(d, ch, "markov", 0)) return -1;
        if (op_failed(d, ch, "markov", ds4_draft_markov_chain(s, want, chain_x) != DS4_OK)) return -1;
        double tc = ds4_now_ms();
        have_c = chain_confidences(s, chain_x, want, chain_c);
        double tc1 = ds4_now_ms();
        pt->confidence += tc1 - tc;
        t += tc1 - tc; /* keep it out of prop_markov */
    }
    for (int k = 0; k < want; k++) {
        if (k > 0) { /* c_k needs m_k = W1[x_{k-1}] */
            double tc = ds4_now_ms();
            float ck = have_c ? chain_c[k] : confidence(s, d->h + (size_t)k * H, prev);
            if (op_failed(d, ch, "confidence", !isfinite(ck))) return -1;
            note_conf(d, ck);
            double tc1 = ds4_now_ms();
            pt->confidence += tc1 - tc;
            t += tc1 - tc; /* keep it out of prop_markov */
            if (ck < threshold) break;
        }
        int32_t x;
        if (on_device) {
            x = chain_x[k];
            drafts[n++] = x;
            d->drafts[d->n_drafts++] = x;
            prev = x;
            continue;
        }
        if (op_failed(d, ch, "markov", 0)) return -1;
        const ds4_w *w1 = &sup->markov_w1;
        ds4_type(w1->type)->dequant(w1->data + (size_t)prev * w1->row_bytes, d->feat, sup->rank);
        if (!(T > 0.0f)) {
            if (op_failed(d, ch, "markov", ds4_draft_markov(s, k, d->feat, &x) != DS4_OK)) return -1;
        } else {
            float *row = d->corr + (size_t)k * V;
            const int32_t Vd = ds4_draft_vocab_size(e);
            if (op_failed(d, ch, "markov", ds4_host_mm(e, sup->n_vd ? &sup->vd_w2 : &sup->markov_w2, 0, Vd, d->feat,
                                                       sup->rank, 1, row, Vd) != DS4_OK))
                return -1;
            const float *u = U + (size_t)k * Vd;
            for (int32_t i = 0; i < Vd; i++) row[i] += u[i];
            spread_draft_row(e, row);
            x = draw_q(s, row, T);
        }
        drafts[n++] = x;
        d->drafts[d->n_drafts++] = x;
        prev = x;
    }
    pt->markov += ds4_now_ms() - t;
    return n;
}

/* ---- verification --------------------------------------------------------------------------- */

/* Rejection sampling at one verified row (spec dspark.md §3.2): accept draft x with probability
 * min(1, p(x)/q(x)); otherwise draw from normalize(max(p - q, 0)) into *repl. */
static int accept_sampled(ds4_session *s, const float *trow, const float *qrow, int32_t x, int32_t *repl) {
    ds4_dspark *d = s->dsp;
    const int32_t V = s->e->c.n_vocab;
    const float T = s->sampling.temperature;
    int32_t n;
    ds4_sample_dist(s, trow, d->cand_ids, d->cand_p, &n);
    double px = 0.0;
    for (int32_t i = 0; i < n; i++) if (d->cand_ids[i] == x) { px = d->cand_p[i]; break; }
    double mx, z;
    softmax_norm(qrow, V, T, &mx, &z); /* q, once for the test and the residual */
    double qx = exp((double)qrow[x] / T - mx) / z;
    if (qx > 0.0 && ds4_uniform(s) < px / qx) return 1;
    /* residual over p's support */
    double mass = 0.0;
    for (int32_t i = 0; i < n; i++) {
        double r = d->cand_p[i] - exp((double)qrow[d->cand_ids[i]] / T - mx) / z;
        d->cand_p[i] = r > 0.0 ? r : 0.0;
        mass += d->cand_p[i];
    }
    if (!(mass > 1e-12)) { /* p <= q everywhere up to rounding: fall back to p */
        *repl = ds4_sample(s, trow);
        return 0;
    }
    double u = ds4_uniform(s) * mass, cum = 0.0;
    *repl = d->cand_ids[n - 1];
    for (int32_t i = 0; i < n; i++) {
        cum += d->cand_p[i];
        if (u < cum && d->cand_p[i] > 0.0) { *repl = d->cand_ids[i]; break; }
    }
    return 0;
}

/* ---- scheduler (spec dspark.md §7.3) -------------------------------------------------------- */

static double t_verify(const ds4_dspark *d, int n) {
    if (d->pr.has_ver[n]) return d->pr.t_ver[n];
    int lo = n, hi = n;
    while (lo > 1 && !d->pr.has_ver[lo]) lo--;
    while (hi < DS4_DSPARK_MAX_BLOCK + 1 && !d->pr.has_ver[hi]) hi++;
    if (d->pr.has_ver[lo] && d->pr.has_ver[hi] && hi != lo)
        return d->pr.t_ver[lo] + (d->pr.t_ver[hi] - d->pr.t_ver[lo]) * (double)(n - lo) / (double)(hi - lo);
    return d->pr.has_ver[lo] ? d->pr.t_ver[lo] : d->pr.t_ver[hi]; /* optimistic: flat beyond what was measured */
}

/* Acceptance of draft position k given that every earlier draft was accepted: the mean of the
 * Beta(hit + 1, miss + 1) posterior (the Laplace prior), or with upper = 1 its mean plus two
 * standard deviations, capped at 1 (an optimistic bound; 1 for a position never verified). */
static double accept_at(const ds4_dspark *d, int k, int upper) {
    const double al = (double)d->win_hit[k] + 1.0, be = (double)(d->win_reached[k] - d->win_hit[k]) + 1.0, n = al + be;
    const double mean = al / n;
    if (!upper) return mean;
    const double ub = mean + 2.0 * sqrt(al * be / (n * n * (n + 1.0)));
    return ub < 1.0 ? ub : 1.0;
}

/* Expected tokens per ms with l drafts verified: the survival to position k is the product of the
 * conditional acceptances up to k (their optimistic bounds with upper = 1).  Under verify_head lazy
 * t_ver(l + 1) is the verify's mean cost over the acceptance seen (its later rows' LM head is paid
 * only in the cycles that reach them), so this is expected tokens over expected time; at the
 * optimistic bounds it prices a verify that accepts everything a little below its cost (spec
 * dspark.md §7.4). */
static double rate(const ds4_dspark *d, int l, int upper) {
    double surv = 1.0, tokens = 1.0;
    for (int k = 0; k < l; k++) {
        surv *= accept_at(d, k, upper);
        tokens += surv;
    }
    return tokens / (d->pr.t_prop + t_verify(d, l + 1));
}

/* 1 when no verify length up to lmax beats plain decoding by HOPE_MARGIN even with every
 * position's acceptance at its optimistic bound (every draft accepted where a position was never
 * verified): a probe is then unlikely to change the decision, or to gain much if it did, so the
 * back-off goes to its longest at once.  That takes HOPELESS_MIN_VERIFIES verifies of the session's
 * own (or of prices set directly, used as given): a fresh session's one pricing cycle, its proposal
 * timed cold, made drafting hopeless for 256 cycles, and so did a code answer's first lines, hard to
 * draft, where drafting later paid 1.4x; kept counts are another text's.  Without them only the
 * times can say it, where they are not a fresh session's first samples (times_cold): kept or given
 * times, or past the minimum, make drafting hopeless when not even every draft accepted would beat
 * plain decoding. */
static int hopeless(const ds4_dspark *d, int lmax) {
    const double plain = 1.0 / t_verify(d, 1);
    if (!d->times_cold || d->own_verifies >= HOPELESS_MIN_VERIFIES) {
        int can = 0;
        for (int l = 1; l <= lmax && !can; l++) can = (double)(l + 1) / (d->pr.t_prop + t_verify(d, l + 1)) > plain;
        if (!can) return 1;
    }
    if (d->own_verifies < HOPELESS_MIN_VERIFIES) return 0;
    for (int l = 1; l <= lmax; l++)
        if (rate(d, l, 1) > HOPE_MARGIN * plain) return 0;
    return 1;
}

/* The verify length (<= lmax) with the best expected rate at the optimistic bounds (spec
 * dspark.md §7.4): the draft a probe makes while drafting might still pay. */
static int optimistic_length(const ds4_dspark *d, int lmax) {
    int best = 1;
    double r = rate(d, 1, 1);
    for (int l = 2; l <= lmax; l++) {
        const double rl = rate(d, l, 1);
        if (rl > r) r = rl, best = l;
    }
    return best;
}

/* The verify length (<= lmax) that maximises expected tokens per ms, scanning up and stopping at
 * the first length that does not improve; 0 when target-only decoding is expected to be faster. */
static int best_length(const ds4_dspark *d, int lmax) {
    int best = 1;
    double r = rate(d, 1, 0);
    for (int l = 2; l <= lmax; l++) {
        double rl = rate(d, l, 0);
        if (rl <= r) break;
        r = rl;
        best = l;
    }
    return r > 1.0 / t_verify(d, 1) ? best : 0;
}

/* The median of n (<= FIRST_DECODES) times. */
static double median_ms(const double *x, int n) {
    double v[FIRST_DECODES];
    memcpy(v, x, (size_t)n * sizeof(double));
    for (int i = 1; i < n; i++) /* insertion sort: n is tiny */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The moving average of a measured time; a sample is first clamped to [v / 2, 2 v], so that one
 * pass stalled by other work on the cores moves a price by at most EMA (20 %). */
static void ema(double *v, int32_t *has, double x) {
    if (*has) {
        if (x > 2.0 * *v) x = 2.0 * *v;
        if (x < 0.5 * *v) x = 0.5 * *v;
    }
    *v = *has ? (1.0 - EMA) * *v + EMA * x : x;
    *has = 1;
}

/* A verify or proposal sample: the first one of a session that started from kept prices replaces
 * the kept time when it is cheaper (a pass is slowed by other work, never sped up, so a cheaper
 * real pass says the kept time came from a busier spell), else it enters the moving average.
 * Through the clamped average alone a kept time five times too dear fell by ~10 % a sample, and a
 * scheduler that it priced out of drafting never drew the samples (spec dspark.md §7.4, In-session). */
static void sample_time(double *v, int32_t *has, int32_t *carried, double x) {
    if (*carried) {
        *carried = 0;
        if (*has && x < *v) {
            *v = x;
            return;
        }
    }
    ema(v, has, x);
}

/* ---- the cycle ------------------------------------------------------------------------------ */

/* Row r of a verify's logits in d->vlogits, where *have rows of n are computed: under verify_head
 * lazy the rows from *have to n are computed in one product (ds4_pass_head) the first time
 * acceptance reaches one of them; its time is added to *ms. */
static int verify_row(ds4_session *s, int r, int *have, int n, double *ms, char *err, size_t err_len) {
    if (r < *have) return DS4_OK;
    const double t0 = ds4_now_ms();
    int rc = ds4_pass_head(s, *have, n, s->dsp->vlogits + (size_t)*have * s->e->c.n_vocab, err, err_len);
    *ms += ds4_now_ms() - t0;
    if (rc == DS4_OK) *have = n;
    return rc;
}

static void apply_knobs(ds4_dspark *d) {
    pthread_mutex_lock(&d->mu);
    if (memcmp(&d->want, &d->act, sizeof d->act) != 0) {
        d->act = d->want;
        ds4_dspark_event *ev = &d->events[d->n_events % N_EVENTS];
        ev->cycle = d->st.cycles;
        ev->knobs = d->act;
        d->n_events++;
        d->st.n_events = d->n_events;
        d->skip_left = 0;
        d->probe = 0;
        d->backoff = 2;
    }
    pthread_mutex_unlock(&d->mu);
}

static void no_draft(ds4_dspark *d, int reason) {
    d->st.no_draft++;
    d->st.no_draft_reasons[reason]++;
    d->st.draft_len_hist[0]++;
    d->st.accepted_len_hist[0]++;
    if (reason == DS4_ND_NO_ROOM) d->st.no_room++;
    if (reason == DS4_ND_SCHEDULER_SKIP) d->st.scheduler_skips++;
    if (reason == DS4_ND_TAIL_SKIP) d->st.tail_skips++;
    if (reason == DS4_ND_CHAIN_FAIL) d->st.chain_fail++;
}

/* The proposal's stage timers join the counters only when its cycle completes. */
static void add_prop_times(ds4_dspark_stats *st, const prop_times *pt) {
    if (!pt) return;
    st->prop_stage0_ms += pt->stage0;
    st->prop_setup_ms += pt->setup;
    st->prop_cache_ms += pt->cache;
    st->prop_chain_ms += pt->chain;
    st->prop_hidden_ms += pt->hidden;
    st->prop_conf0_ms += pt->conf0;
    st->prop_logits_ms += pt->logits;
    st->prop_markov_ms += pt->markov;
    st->prop_confidence_ms += pt->confidence;
}

/* A plain decode of the anchor (no draft to verify): outcome no_draft with `reason`, or invalid.
 * `pt`/`propose_ms`: the drafter pass that ran first (NULL/0 if none). */
static int plain_cycle(ds4_session *s, int reason, int32_t *out, int32_t *n_out, char *err, size_t err_len,
                       double t_start, const prop_times *pt, double propose_ms) {
    ds4_dspark *d = s->dsp;
    int32_t tok = s->pending, next = -1;
    const int picks = !(s->sampling.temperature > 0.0f) && ds4_device_picks(s); /* platform.md §9 */
    double t0 = ds4_now_ms();
    int rc = picks ? ds4_run_pass_argmax(s, &tok, 1, DS4_LOGITS_LAST, &next, err, err_len)
                   : ds4_run_pass(s, &tok, 1, DS4_LOGITS_LAST, s->logits, 1, err, err_len);
    double t1 = ds4_now_ms();
    if (rc != DS4_OK) {
        s->stats.decode_ms += t1 - t_start;
        return rc;
    }
    s->has_logits = !picks;
    d->st.cycles++;
    d->st.first_tokens++;
    d->st.target_ms += t1 - t0;
    d->st.propose_ms += propose_ms;
    add_prop_times(&d->st, pt);
    if (!s->last_pass_captured) {
        if (d->kept_check) {
            d->kept_check = 0;
            if (t1 - t0 < 0.5 * d->pr.t_ver[1]) {
                /* the kept times were measured where a decode cost over twice this one (a longer
                 * context, a busier machine): a verify priced that high would never be drafted to
                 * re-time it, and the clamped average would take dozens of decodes to bring t_ver(1)
                 * down.  They go, and the session prices itself as a fresh one does (five plain
                 * decodes, then a pricing draft); the acceptance counts stay (spec dspark.md §7.4) */
                for (int n = 0; n < DS4_DSPARK_MAX_BLOCK + 2; n++) d->pr.has_ver[n] = d->carried_ver[n] = 0;
                d->pr.has_prop = d->carried_prop = 0;
                d->first_n = 0;
                d->times_cold = 1; /* its times are now its own first samples, as a fresh session's */
            }
        }
        ema(&d->pr.t_ver[1], &d->pr.has_ver[1], t1 - t0);
        if (d->first_n < FIRST_DECODES) {
            d->first_ms[d->first_n++] = t1 - t0;
            if (d->first_n == FIRST_DECODES) d->pr.t_ver[1] = median_ms(d->first_ms, FIRST_DECODES);
        }
        d->n_priced++;
        d->priced_ms += t1 - t0;
        d->plain_here = 1;
    }
    d->n_plain++;
    d->since_plain = 0;
    if (reason >= 0) {
        no_draft(d, reason);
    } else { /* INVALID_DRAFT */
        d->st.invalid++;
        d->st.draft_len_hist[0]++;
        d->st.accepted_len_hist[0]++;
    }
    double ts = ds4_now_ms();
    if (!picks) next = ds4_sample(s, s->logits);
    double te = ds4_now_ms();
    s->stats.sample_ms += te - ts;
    s->pending = next;
    out[0] = next;
    *n_out = 1;
    s->stats.n_decode_tokens++;
    s->stats.n_steps++;
    s->stats.decode_ms += te - t_start;
    return DS4_OK;
}

int ds4_dspark_step(ds4_session *s, int32_t *out, int32_t max_out, int32_t *n_out, char *err, size_t err_len) {
    ds4_engine *e = s->e;
    ds4_dspark *d = s->dsp;
    const ds4_support *sup = e->sup;
    double t_start = ds4_now_ms();
    if (s->n_tokens + 1 > s->n_ctx)
        return ds4_fail(err, err_len, DS4_E_CONTEXT, "context overflow: %d tokens in the cache + 1 new > context size %d",
                        s->n_tokens, s->n_ctx);
    apply_knobs(d);
    const ds4_dspark_knobs k = d->act;
    if (!sup) return plain_cycle(s, e->sup_refused ? DS4_ND_SUPPORT_INVALID : DS4_ND_DISABLED, out, n_out, err,
                                 err_len, t_start, NULL, 0.0);
    if (!k.enabled) return plain_cycle(s, DS4_ND_DISABLED, out, n_out, err, err_len, t_start, NULL, 0.0);
    const int64_t last = s->n_tokens - 1, W = e->c.sliding_window;
    const int64_t lo = last - W + 1 < 0 ? 0 : last - W + 1;
    if (last < 0 || s->cap.last != last || s->cap.from > lo || (d->fail_op[0] && !strcmp(d->fail_op, "capture")))
        return plain_cycle(s, DS4_ND_CAPTURE_INVALID, out, n_out, err, err_len, t_start, NULL, 0.0);
    /* room: budget, context (anchor + drafts), batch */
    int lmax = k.max_draft < sup->block ? k.max_draft : sup->block;
    if (lmax > s->n_ctx - s->n_tokens - 1) lmax = s->n_ctx - s->n_tokens - 1;
    if (lmax > s->n_batch) lmax = s->n_batch;
    const int lroom = lmax; /* the length the budget left aside allows (the tail and t_prop, below) */
    if (lmax > max_out - 1) lmax = max_out - 1;
    int probe = 0;
    if (k.scheduler) {
        if (d->skip_left > 0) {
            d->skip_left--;
            return plain_cycle(s, DS4_ND_SCHEDULER_SKIP, out, n_out, err, err_len, t_start, NULL, 0.0);
        }
        if (!d->plain_here || d->first_n < FIRST_DECODES)
            /* plain decodes first: the cost model is priced in them (a session that starts from
             * another's prices re-times t_ver(1) once before deciding anything; one without a kept
             * t_ver(1) times FIRST_DECODES and takes their median, as the first decode after a
             * prefill runs slow and priced alone made drafting look cheaper than it is) */
            return plain_cycle(s, DS4_ND_SCHEDULER_SKIP, out, n_out, err, err_len, t_start, NULL, 0.0);
        if (d->since_plain >= REPRICE_CYCLES) /* drafting only never re-times the decode it is weighed against */
            return plain_cycle(s, DS4_ND_SCHEDULER_SKIP, out, n_out, err, err_len, t_start, NULL, 0.0);
        if (d->probe) {
            /* a back-off just ended: a probe.  After a hopeless back-off one cheap single-draft
             * cycle refreshes the first position's acceptance (the one every longer draft depends
             * on), unless the widest verify's or the proposal's time is still the kept one, which
             * a single draft re-times neither of: then the whole proposal, verified uncut (spec
             * dspark.md §7.4, In-session).  Otherwise the probe drafts the length that could pay
             * with the optimistic bounds, so that it measures the positions that keep drafting in
             * question */
            const int stale = d->carried_prop || d->carried_ver[lroom + 1];
            const int l = d->probe == PROBE_ONE ? (stale && lroom > 1 ? lroom : 1) : optimistic_length(d, lroom);
            if (lmax < l)
                /* the caller's budget cuts the probe short (tail_skip), or there is no room for a
                 * draft at all (no_room): the probe waits for the next cycle with room for it (spec
                 * dspark.md §7.4).  Spent here it measured less than it is for, and the next cycle,
                 * finding drafting still not paying, backed off twice as long as after a whole probe */
                return plain_cycle(s, lmax < 1 ? DS4_ND_NO_ROOM : DS4_ND_TAIL_SKIP, out, n_out, err, err_len,
                                   t_start, NULL, 0.0);
            d->probe = 0;
            probe = 1;
            lmax = l;
        } else if (d->pr.has_prop && lmax >= 1 && lmax < lroom && best_length(d, lmax) == 0 &&
                   best_length(d, lroom) > 0) {
            /* tail (spec dspark.md §7.4): the caller's budget clips the draft to a length that
             * cannot pay, where the unclipped one would: a plain cycle, and no back-off, as the
             * prices say nothing against drafting */
            return plain_cycle(s, DS4_ND_TAIL_SKIP, out, n_out, err, err_len, t_start, NULL, 0.0);
        } else if (d->pr.has_prop && lmax >= 1 && best_length(d, lmax) == 0) {
            /* skip for `backoff` cycles (this one included), doubling up to MAX_BACKOFF while
             * drafting stays unprofitable; HOPELESS_BACKOFF when it could not pay even with
             * every position's acceptance at its optimistic bound */
            const int none = hopeless(d, lroom); /* not the budget's cut: that says nothing about later cycles */
            if (none) d->backoff = HOPELESS_BACKOFF;
            d->skip_left = d->backoff - 1;
            d->probe = none ? PROBE_ONE : PROBE_LONG;
            d->backoff = d->backoff * 2 > MAX_BACKOFF ? MAX_BACKOFF : d->backoff * 2;
            return plain_cycle(s, DS4_ND_SCHEDULER_SKIP, out, n_out, err, err_len, t_start, NULL, 0.0);
        } else if (lmax >= 1) { /* a cycle with no room for a draft (below) says nothing about drafting */
            d->backoff = 2;
        }
    }
    if (lmax < 1) return plain_cycle(s, DS4_ND_NO_ROOM, out, n_out, err, err_len, t_start, NULL, 0.0);

    /* propose */
    int32_t drafts[DS4_DSPARK_MAX_BLOCK];
    chain ch = {0, NULL};
    prop_times pt = {0};
    double tp0 = ds4_now_ms();
    const int32_t anchor = s->pending;
    int nd = propose(s, anchor, lmax, k.threshold, drafts, &ch, &pt);
    double tp1 = ds4_now_ms(), propose_ms = tp1 - tp0;
    if (nd < 0) {
        snprintf(d->st.chain_fail_op, sizeof d->st.chain_fail_op, "%s", ch.op ? ch.op : "unknown");
        return plain_cycle(s, DS4_ND_CHAIN_FAIL, out, n_out, err, err_len, t_start, &pt, propose_ms);
    }
    /* t_prop prices the longest proposal: a shorter one (fewer LM head rows and Markov steps), a
     * probe's or one the caller's budget cut (the tail, whatever the scheduler), would make every
     * longer draft look cheaper than it is */
    if (lmax == lroom && !s->last_proposal_captured) sample_time(&d->pr.t_prop, &d->pr.has_prop, &d->carried_prop, propose_ms);
    if (nd == 0) return plain_cycle(s, DS4_ND_CONFIDENCE_GATE, out, n_out, err, err_len, t_start, &pt, propose_ms);
    if (k.scheduler && !probe) { /* a probe verifies what it drafted: that is what it is for */
        int l = best_length(d, nd);
        if (l >= 1 && l < nd) nd = l;
    }
    for (int i = 0; i < nd; i++)
        if (drafts[i] < 0 || drafts[i] >= e->c.n_vocab) { /* cannot happen with an argmax; counted if it does */
            return plain_cycle(s, INVALID_DRAFT, out, n_out, err, err_len, t_start, &pt, propose_ms);
        }

    /* verify [anchor, d_1..d_nd] in one pass; under verify_head lazy (spec dspark.md §3.4) with the
     * LM head of the first DS4_VERIFY_HEAD_FIRST rows, and of the others only when acceptance reaches
     * them (verify_row) */
    const int32_t V = e->c.n_vocab;
    int32_t seq[DS4_DSPARK_MAX_BLOCK + 1];
    seq[0] = anchor;
    memcpy(seq + 1, drafts, (size_t)nd * sizeof(int32_t));
    const int64_t p0 = s->n_tokens;
    double tv0 = ds4_now_ms();
    const float T = s->sampling.temperature;
    const int picks = !(T > 0.0f) && ds4_device_picks(s); /* greedy: the argmaxes on the device (platform.md §9) */
    int32_t vids[DS4_DSPARK_MAX_BLOCK + 1];
    const int rows = nd + 1;
    int have = !picks && e->verify_head == DS4_VERIFY_HEAD_LAZY && rows > DS4_VERIFY_HEAD_FIRST ? DS4_VERIFY_HEAD_FIRST
                                                                                               : rows;
    int rc = picks ? ds4_run_pass_argmax(s, seq, rows, DS4_LOGITS_ALL, vids, err, err_len)
                   : ds4_run_pass(s, seq, rows, DS4_LOGITS_ALL, d->vlogits, have, err, err_len);
    double tv1 = ds4_now_ms();
    if (rc != DS4_OK) {
        s->stats.decode_ms += tv1 - t_start;
        return rc; /* the session is unchanged (cancel, non-finite logits) */
    }
    /* accept: row r is read only when d_1..d_r were all accepted (greedy: row i's argmax is d_{i+1};
     * sampled: row i's rejection test), so a row past `have` is computed only then */
    int a = 0;
    int32_t bonus = -1;
    double head_ms = 0.0; /* verify_row's products: verify time, not sampling */
    const uint64_t rng0 = s->rng;
    double ts0 = ds4_now_ms();
    if (T > 0.0f) {
        for (a = 0; a < nd; a++) {
            int32_t repl;
            if ((rc = verify_row(s, a, &have, rows, &head_ms, err, err_len)) != DS4_OK) break;
            if (!accept_sampled(s, d->vlogits + (size_t)a * V, d->corr + (size_t)a * V, drafts[a], &repl)) {
                bonus = repl;
                break;
            }
        }
        if (rc == DS4_OK && bonus < 0 && (rc = verify_row(s, nd, &have, rows, &head_ms, err, err_len)) == DS4_OK)
            bonus = ds4_sample(s, d->vlogits + (size_t)nd * V);
    } else if (picks) {
        while (a < nd && vids[a] == drafts[a]) a++;
        bonus = vids[a];
    } else {
        while (a < nd && (rc = verify_row(s, a, &have, rows, &head_ms, err, err_len)) == DS4_OK &&
               ds4_argmax(d->vlogits + (size_t)a * V, V) == drafts[a])
            a++;
        if (rc == DS4_OK && (rc = verify_row(s, a, &have, rows, &head_ms, err, err_len)) == DS4_OK)
            bonus = ds4_argmax(d->vlogits + (size_t)a * V, V);
    }
    double ts1 = ds4_now_ms();
    if (rc != DS4_OK) { /* the later rows' head failed (a non-finite logit, the backend): as a failed pass, the
                         * session is left as it was before the cycle */
        s->rng = rng0;
        s->n_tokens = (int32_t)p0;
        ds4_dspark_truncate(s, s->n_tokens);
        s->stats.decode_ms += ts1 - t_start;
        return rc;
    }
    s->stats.sample_ms += ts1 - ts0 - head_ms;
    /* commit: keep anchor + a accepted rows */
    s->n_tokens = (int32_t)(p0 + 1 + a);
    ds4_dspark_truncate(s, s->n_tokens);
    if (picks) { /* the logits stayed on the device: the next token is taken, nothing samples them */
        s->has_logits = 0;
    } else {
        memcpy(s->logits, d->vlogits + (size_t)a * V, (size_t)V * sizeof(float));
        s->has_logits = 1;
    }
    s->pending = bonus;
    for (int i = 0; i < a; i++) out[i] = drafts[i];
    out[a] = bonus;
    *n_out = a + 1;
    double t_end = ds4_now_ms();
    /* stats */
    ds4_dspark_stats *st = &d->st;
    st->cycles++;
    st->first_tokens++;
    st->proposed += (uint64_t)nd;
    st->accepted_draft += (uint64_t)a;
    if (a == nd) st->full++;
    else if (a > 0) st->partial++;
    else st->miss_first++;
    st->draft_len_hist[nd]++;
    st->accepted_len_hist[a]++;
    for (int i = 0; i < nd; i++) st->pos_proposed[i]++;
    for (int i = 0; i < a; i++) st->pos_accepted[i]++;
    d->own_verifies++;
    for (int i = 0; i <= a && i < nd; i++) d->pr.reached[i]++, d->win_reached[i]++;
    for (int i = 0; i < a; i++) d->pr.hit[i]++, d->win_hit[i]++;
    /* greedy, every verified draft accepted and the proposal cut by the scheduler (best_length):
     * the bonus is the target's pick at the next draft position, so that position's acceptance is
     * observed without verifying it (spec dspark.md §7.4, Survival); the scheduler's counts only,
     * not the cycle's statistics.  Without it a position the cut left out was never measured
     * again, and one early run of misses held every later draft at the cut. */
    if (!(T > 0.0f) && a == nd && nd < d->n_drafts) {
        d->pr.reached[nd]++, d->win_reached[nd]++;
        if (bonus == d->drafts[nd]) d->pr.hit[nd]++, d->win_hit[nd]++;
    }
    if (d->win_reached[0] >= ACCEPT_WINDOW) /* the older half of the window weighs half as much */
        for (int i = 0; i < 16; i++) d->win_reached[i] /= 2, d->win_hit[i] /= 2;
    /* a probe of two or more drafts that were all accepted: the text may have turned predictable
     * (acceptance is not stationary: a code answer's boilerplate, a repeated block), so the next
     * back-off starts at its shortest again and the probes that test it come soon (spec dspark.md
     * §7.4, Back-off) */
    if (probe && nd >= 2 && a == nd) d->backoff = 2;
    st->propose_ms += propose_ms;
    add_prop_times(st, &pt);
    st->verify_ms += tv1 - tv0 + head_ms;
    st->verify_head_rows += (uint64_t)have;
    st->spec_total_ms += t_end - tv0;
    /* under verify_head lazy the price of a width is its mean over the acceptance seen: 3 rows of
     * the head when a draft of the first group is rejected, every row otherwise */
    if (!s->last_pass_captured)
        sample_time(&d->pr.t_ver[nd + 1], &d->pr.has_ver[nd + 1], &d->carried_ver[nd + 1], tv1 - tv0 + head_ms);
    d->since_plain++;
    s->stats.n_decode_tokens += (uint64_t)(a + 1);
    s->stats.n_steps++;
    s->stats.decode_ms += t_end - t_start;
    return DS4_OK;
}

/* ---- knobs, stats, hooks -------------------------------------------------------------------- */

int ds4_session_set_dspark(ds4_session *s, const ds4_dspark_knobs *k, char *err, size_t err_len) {
    if (!s || !k) return ds4_fail(err, err_len, DS4_E_INVALID, "no session or knobs");
    if (!s->dsp) return ds4_fail(err, err_len, DS4_E_STATE, "no DSpark support model is attached to this engine");
    const ds4_support *sup = s->e->sup;
    if (!sup)
        return ds4_fail(err, err_len, DS4_E_STATE, "DSpark knobs cannot change: the support model was refused: %s",
                        s->e->sup_msg);
    int rc = check_knobs(k, sup->block, 0, err, err_len);
    if (rc != DS4_OK) return rc;
    pthread_mutex_lock(&s->dsp->mu);
    s->dsp->want = *k;
    pthread_mutex_unlock(&s->dsp->mu);
    return DS4_OK;
}

int ds4_session_get_dspark(ds4_session *s, ds4_dspark_knobs *out) {
    if (!s || !out || !s->dsp) return DS4_E_STATE;
    pthread_mutex_lock(&s->dsp->mu);
    *out = s->dsp->want;
    pthread_mutex_unlock(&s->dsp->mu);
    return DS4_OK;
}

int ds4_session_dspark_events(ds4_session *s, ds4_dspark_event *out, int32_t max, int32_t *n) {
    if (!s || !n || (max > 0 && !out)) return DS4_E_INVALID;
    *n = 0;
    if (!s->dsp) return DS4_OK;
    ds4_dspark *d = s->dsp;
    pthread_mutex_lock(&d->mu);
    uint64_t have = d->n_events < N_EVENTS ? d->n_events : N_EVENTS;
    uint64_t take = have < (uint64_t)(max > 0 ? max : 0) ? have : (uint64_t)(max > 0 ? max : 0);
    for (uint64_t i = 0; i < take; i++) out[i] = d->events[(d->n_events - take + i) % N_EVENTS];
    pthread_mutex_unlock(&d->mu);
    *n = (int32_t)take;
    return DS4_OK;
}

int ds4_session_dspark_stats(ds4_session *s, ds4_dspark_stats *out) {
    if (!s || !out) return DS4_E_INVALID;
    memset(out, 0, sizeof *out);
    if (!s->dsp) return DS4_OK;
    ds4_dspark *d = s->dsp;
    *out = d->st;
    /* savings are priced at the mean plain (single-token) decode of this session; a decode that
     * captured a graph of its shape (a one-time cost, spec platform.md §8) is no timing of one.
     * Before one was timed they are unknown and reported as 0 with t_decode_measured = 0 (the
     * scheduler times one first; without it any no-draft cycle does).  net_saved is
     * (cycles + accepted) t_decode - (target + propose + spec_total) with the captured decodes left
     * out of both sides; as the timed plain decodes cost n_priced t_decode, that is the drafted
     * cycles' (1 + accepted) decodes minus every proposal and speculative step (spec dspark.md §6). */
    if (d->n_priced) {
        double td = d->priced_ms / (double)d->n_priced;
        out->t_decode_measured = 1;
        out->t_decode_ms = td;
        out->saved_ms = (double)d->st.accepted_draft * td;
        out->net_saved_ms = (double)(d->st.cycles - d->n_plain + d->st.accepted_draft) * td -
                            (d->st.propose_ms + d->st.spec_total_ms);
    }
    return DS4_OK;
}

int ds4_session_dspark_last_proposal(ds4_session *s, int32_t *tokens, float *conf, int32_t max, int32_t *n_tokens,
                                    int32_t *n_conf) {
    if (!s || !n_tokens || !n_conf || (max > 0 && (!tokens || !conf))) return DS4_E_INVALID;
    *n_tokens = *n_conf = 0;
    if (!s->dsp || max <= 0) return DS4_OK;
    const ds4_dspark *d = s->dsp;
    int32_t nt = d->n_drafts < max ? d->n_drafts : max, nc = d->n_conf < max ? d->n_conf : max;
    memcpy(tokens, d->drafts, (size_t)nt * sizeof(int32_t));
    memcpy(conf, d->conf, (size_t)nc * sizeof(float));
    *n_tokens = nt;
    *n_conf = nc;
    return DS4_OK;
}

int ds4_session_dspark_prices(ds4_session *s, ds4_dspark_prices *out) {
    if (!s || !out) return DS4_E_INVALID;
    memset(out, 0, sizeof *out);
    if (!s->dsp) return DS4_OK;
    *out = s->dsp->pr;
    return DS4_OK;
}

int ds4_session_set_dspark_prices(ds4_session *s, const ds4_dspark_prices *p, int kept, char *err, size_t err_len) {
    if (!s || !p) return ds4_fail(err, err_len, DS4_E_INVALID, "no session or prices");
    if (!s->dsp || !s->e->sup)
        return ds4_fail(err, err_len, DS4_E_STATE, "scheduler prices need an attached DSpark support model");
    for (int n = 0; n < DS4_DSPARK_MAX_BLOCK + 2; n++)
        if (p->has_ver[n] && (n == 0 || !(isfinite(p->t_ver[n]) && p->t_ver[n] > 0.0)))
            return ds4_fail(err, err_len, DS4_E_INVALID, "t_ver[%d] must be a finite time > 0 ms (widths 1..%d), got %g",
                            n, DS4_DSPARK_MAX_BLOCK + 1, p->t_ver[n]);
    if (p->has_prop && !(isfinite(p->t_prop) && p->t_prop > 0.0))
        return ds4_fail(err, err_len, DS4_E_INVALID, "t_prop must be a finite time > 0 ms, got %g", p->t_prop);
    for (int k = 0; k < DS4_DSPARK_MAX_BLOCK; k++)
        if (p->hit[k] > p->reached[k])
            return ds4_fail(err, err_len, DS4_E_INVALID, "hit[%d] = %llu is more than reached[%d] = %llu", k,
                            (unsigned long long)p->hit[k], k, (unsigned long long)p->reached[k]);
    ds4_dspark *d = s->dsp;
    d->pr = *p;
    memcpy(d->win_reached, p->reached, sizeof d->win_reached);
    memcpy(d->win_hit, p->hit, sizeof d->win_hit);
    for (int n = 0; n < DS4_DSPARK_MAX_BLOCK + 2; n++) d->pr.has_ver[n] = p->has_ver[n] ? 1 : 0;
    d->pr.has_prop = p->has_prop ? 1 : 0;
    d->skip_left = 0;
    d->probe = 0;
    d->backoff = 2;
    d->plain_here = 0;
    d->since_plain = 0;
    d->first_n = d->pr.has_ver[1] ? FIRST_DECODES : 0;
    d->kept_check = kept && d->pr.has_ver[1];
    d->own_verifies = kept ? 0 : p->reached[0]; /* prices set directly are used as given, their counts too */
    d->times_cold = !d->pr.has_prop;
    for (int n = 0; n < DS4_DSPARK_MAX_BLOCK + 2; n++) d->carried_ver[n] = kept && n >= 2 && d->pr.has_ver[n];
    d->carried_prop = kept && d->pr.has_prop;
    return DS4_OK;
}

void ds4_dspark_reset_stats(ds4_session *s) {
    ds4_dspark *d = s->dsp;
    int32_t block = d->st.block_size;
    uint64_t n_events = d->st.n_events;
    memset(&d->st, 0, sizeof d->st);
    d->st.block_size = block;
    d->st.n_events = n_events;
    d->n_plain = d->n_priced = 0;
    d->priced_ms = 0.0;
}

int ds4_session_dspark_fail_op(ds4_session *s, const char *op) {
    if (!s || !s->dsp) return DS4_E_STATE;
    snprintf(s->dsp->fail_op, sizeof s->dsp->fail_op, "%s", op ? op : "");
    return DS4_OK;
}
