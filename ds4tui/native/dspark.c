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
#define INVALID_DRAFT (-1) /* plain_cycle outcome: a draft id outside the vocabulary */

struct ds4_dspark {
    ds4_span ctx;               /* positions whose context KV rows the drafter's ring holds (forward.c) */
    float *h;                   /* [B, H] pre-norm hidden */
    float *hn;                  /* [B, H] normed hidden */
    float *feat;                /* [H + r] confidence input */
    float *corr;                /* [B, V] corrected (Markov) logits (sampled drafting) */
    double q_mx[DS4_DSPARK_MAX_BLOCK], q_sum[DS4_DSPARK_MAX_BLOCK]; /* corr row k's softmax(row / T) normaliser:
                                                                     * q(i) = exp(row[i] / T - q_mx) / q_sum */
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
    /* the scheduler (scheduler.c; spec dspark.md §7.3, §7.4) */
    ds4_sched q;
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
    if (k->policy < 0 || k->policy >= DS4_SCHED_POLICIES)
        return ds4_fail(err, err_len, DS4_E_INVALID, "scheduler policy must be %d (acceptance) or %d (confidence), got %d",
                        DS4_SCHED_ACCEPTANCE, DS4_SCHED_CONFIDENCE, k->policy);
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
    ds4_dspark_knobs k = {sup ? 1 : 0, 1, 0.0f, block, DS4_SCHED_CONFIDENCE};
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
    ds4_sched_init(&d->q);
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

/* exp(x / T - mx): a -inf x (outside the draft vocabulary) is exactly +0.0 without calling exp. */
static inline double softmax_exp(float x, float T, double mx) {
    return x == -INFINITY ? 0.0 : exp((double)x / T - mx);
}

/* Draw from softmax(row / T) over the draft vocabulary's n columns of a corrected row (token vd[j]
 * for column j, or token j without a draft vocabulary), before it is spread: the draw and the
 * normaliser (*mx_out, *sum_out) are those of softmax(spread row / T) over the whole vocabulary, term
 * for term in the same (increasing id) order, as the tokens outside the draft vocabulary have -inf
 * logits and add exactly +0.0; only the ~113 000 of them on the demo are not visited. */
static int32_t draw_q(ds4_session *s, const float *row, int32_t n, float T, double *mx_out, double *sum_out) {
    const ds4_support *sup = s->e->sup;
    const int32_t *vd = sup->n_vd ? sup->vd : NULL;
    double *q = s->dsp->cand_p; /* the terms, kept for the draw (the verify's scratch, free while proposing) */
    double mx = -INFINITY, sum = 0.0;
    for (int32_t j = 0; j < n; j++) {
        q[j] = (double)row[j] / T;
        if (q[j] > mx) mx = q[j];
    }
    for (int32_t j = 0; j < n; j++) {
        q[j] = row[j] == -INFINITY ? 0.0 : exp(q[j] - mx); /* softmax_exp's term */
        sum += q[j];
    }
    *mx_out = mx;
    *sum_out = sum;
    double u = ds4_uniform(s) * sum, cum = 0.0;
    int32_t last = s->e->c.n_vocab - 1;
    for (int32_t j = 0; j < n; j++) {
        const int32_t id = vd ? vd[j] : j;
        if (q[j] > 0.0) last = id; /* rounding's fallback: the last token q can draw (not one outside the
                                      draft vocabulary, whose logits are -inf) */
        cum += q[j];
        if (u < cum) return id;
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
            x = draw_q(s, row, Vd, T, &d->q_mx[k], &d->q_sum[k]);
            spread_draft_row(e, row); /* the rejection test looks tokens up by id */
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
 * min(1, p(x)/q(x)); otherwise draw from normalize(max(p - q, 0)) into *repl.  q is softmax(qrow / T)
 * with the normaliser its draw computed (mx, z: draw_q). */
static int accept_sampled(ds4_session *s, const float *trow, const float *qrow, double mx, double z, int32_t x,
                          int32_t *repl) {
    ds4_dspark *d = s->dsp;
    const float T = s->sampling.temperature;
    int32_t n;
    ds4_sample_dist(s, trow, d->cand_ids, d->cand_p, &n);
    double px = 0.0;
    for (int32_t i = 0; i < n; i++) if (d->cand_ids[i] == x) { px = d->cand_p[i]; break; }
    double qx = softmax_exp(qrow[x], T, mx) / z;
    if (qx > 0.0 && ds4_uniform(s) < px / qx) return 1;
    /* residual over p's support */
    double mass = 0.0;
    for (int32_t i = 0; i < n; i++) {
        double r = d->cand_p[i] - softmax_exp(qrow[d->cand_ids[i]], T, mx) / z;
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
        ds4_sched_knobs_changed(&d->q);
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
    ds4_sched_plain(&d->q, !s->last_pass_captured, t1 - t0);
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
        int len;
        const int why = ds4_sched_decide(&d->q, k.policy, lmax, lroom, &len, &probe);
        if (why >= 0) return plain_cycle(s, why, out, n_out, err, err_len, t_start, NULL, 0.0);
        lmax = len;
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
    if (lmax == lroom && !s->last_proposal_captured) ds4_sched_proposed(&d->q, propose_ms);
    const int confident = k.scheduler && k.policy == DS4_SCHED_CONFIDENCE;
    if (nd == 0) { /* the threshold gated the proposal: for the confidence policy a cycle that gained nothing */
        if (confident) ds4_sched_confident_done(&d->q, 0, 0);
        return plain_cycle(s, DS4_ND_CONFIDENCE_GATE, out, n_out, err, err_len, t_start, &pt, propose_ms);
    }
    if (confident) {
        nd = ds4_sched_cut_confident(&d->q, nd, d->conf); /* d->conf[i]: draft i's c (propose kept one a draft) */
        if (nd == 0) {
            ds4_sched_confident_done(&d->q, 0, 0);
            return plain_cycle(s, DS4_ND_CONFIDENCE_CUT, out, n_out, err, err_len, t_start, &pt, propose_ms);
        }
    } else if (k.scheduler && !probe) {
        nd = ds4_sched_cut(&d->q, nd); /* a probe verifies what it drafted: that is what it is for */
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
            if (!accept_sampled(s, d->vlogits + (size_t)a * V, d->corr + (size_t)a * V, d->q_mx[a], d->q_sum[a], drafts[a],
                                &repl)) {
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
    st->propose_ms += propose_ms;
    add_prop_times(st, &pt);
    st->verify_ms += tv1 - tv0 + head_ms;
    st->verify_head_rows += (uint64_t)have;
    st->spec_total_ms += t_end - tv0;
    /* under verify_head lazy the price of a width is its mean over the acceptance seen: 3 rows of
     * the head when a draft of the first group is rejected, every row otherwise.  Greedy with every
     * verified draft accepted and drafts the cut left out: the bonus shows the next position */
    const int next_seen = !(T > 0.0f) && a == nd && nd < d->n_drafts;
    ds4_sched_verified(&d->q, nd, a, next_seen, next_seen && bonus == d->drafts[nd], probe, !s->last_pass_captured,
                       tv1 - tv0 + head_ms, d->conf, d->n_conf);
    if (confident) ds4_sched_confident_done(&d->q, nd, a);
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
    if (d->q.n_priced) {
        double td = d->q.priced_ms / (double)d->q.n_priced;
        out->t_decode_measured = 1;
        out->t_decode_ms = td;
        out->saved_ms = (double)d->st.accepted_draft * td;
        out->net_saved_ms = (double)(d->st.cycles - d->q.n_plain + d->st.accepted_draft) * td -
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
    *out = s->dsp->q.pr;
    return DS4_OK;
}

int ds4_session_set_dspark_prices(ds4_session *s, const ds4_dspark_prices *p, int kept, char *err, size_t err_len) {
    if (!s || !p) return ds4_fail(err, err_len, DS4_E_INVALID, "no session or prices");
    if (!s->dsp || !s->e->sup)
        return ds4_fail(err, err_len, DS4_E_STATE, "scheduler prices need an attached DSpark support model");
    int rc = ds4_sched_check_prices(p, err, err_len);
    if (rc != DS4_OK) return rc;
    ds4_sched_set_prices(&s->dsp->q, p, kept);
    return DS4_OK;
}

void ds4_dspark_reset_stats(ds4_session *s) {
    ds4_dspark *d = s->dsp;
    int32_t block = d->st.block_size;
    uint64_t n_events = d->st.n_events;
    memset(&d->st, 0, sizeof d->st);
    d->st.block_size = block;
    d->st.n_events = n_events;
    d->q.n_plain = d->q.n_priced = 0;
    d->q.priced_ms = 0.0;
}

int ds4_session_dspark_fail_op(ds4_session *s, const char *op) {
    if (!s || !s->dsp) return DS4_E_STATE;
    snprintf(s->dsp->fail_op, sizeof s->dsp->fail_op, "%s", op ? op : "");
    return DS4_OK;
}
