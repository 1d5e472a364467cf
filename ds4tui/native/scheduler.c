/* scheduler.c — DSpark's adaptive scheduler (spec dspark.md §7.3, §7.4): when a cycle drafts, how
 * many drafts it verifies, and what its measured times and acceptance teach it.  dspark.c runs the
 * passes and asks this file at each point of a cycle; ds4_dspark_replay runs the same decisions on a
 * recorded text with given costs instead of passes (spec dspark.md §7.5), so that a policy can be
 * measured on many texts without the timing noise of a shared machine.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

_Static_assert(sizeof(((ds4_dspark_costs *)0)->t_verify) / sizeof(double) == DS4_DSPARK_MAX_BLOCK + 2,
               "ds4_dspark_costs.t_verify[] must have DS4_DSPARK_MAX_BLOCK + 2 entries");
_Static_assert(sizeof(((ds4_dspark_replay_result *)0)->no_draft_reasons) / sizeof(uint64_t) == DS4_ND_COUNT,
               "ds4_dspark_replay_result.no_draft_reasons[] must have DS4_ND_COUNT entries");

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
#define CARRIED_FADE 2       /* own verifies after which the kept acceptance counts a session started
                              * with weigh nothing (linearly: 1/2 after the first); spec dspark.md §7.4 */
#define PROBE_ONE 1          /* ds4_sched.probe: a single-draft probe is due */
#define PROBE_LONG 2         /* ds4_sched.probe: a probe of the optimistic length is due */
#define REPRICE_CYCLES 64    /* a plain decode after this many drafted cycles re-times t_ver(1) */
#define CAL_PRIOR 4.0        /* the weight, in drafts verified, of a raw confidence in its own calibration
                              * (spec dspark.md §7.6): 1 and 16 replayed a little worse, on the demo pair's
                              * calibrated drafter and on the same confidences skewed (tools/cpu_notes.md) */

void ds4_sched_init(ds4_sched *q) {
    memset(q, 0, sizeof *q);
    q->backoff = 2;
    q->times_cold = 1;
}

void ds4_sched_knobs_changed(ds4_sched *q) {
    q->skip_left = 0;
    q->probe = 0;
    q->backoff = 2;
}

int ds4_sched_check_prices(const ds4_dspark_prices *p, char *err, size_t err_len) {
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
    return DS4_OK;
}

void ds4_sched_set_prices(ds4_sched *q, const ds4_dspark_prices *p, int kept) {
    q->pr = *p;
    /* kept counts are another text's: the decisions weigh them apart, fading (accept_at); counts set
     * directly are used as given, as the session's own */
    memset(q->win_reached, 0, sizeof q->win_reached);
    memset(q->win_hit, 0, sizeof q->win_hit);
    memset(q->carried_reached, 0, sizeof q->carried_reached);
    memset(q->carried_hit, 0, sizeof q->carried_hit);
    memcpy(kept ? q->carried_reached : q->win_reached, p->reached, sizeof q->win_reached);
    memcpy(kept ? q->carried_hit : q->win_hit, p->hit, sizeof q->win_hit);
    for (int n = 0; n < DS4_DSPARK_MAX_BLOCK + 2; n++) q->pr.has_ver[n] = p->has_ver[n] ? 1 : 0;
    q->pr.has_prop = p->has_prop ? 1 : 0;
    q->skip_left = 0;
    q->probe = 0;
    q->backoff = 2;
    q->plain_here = 0;
    q->since_plain = 0;
    q->first_n = q->pr.has_ver[1] ? DS4_SCHED_FIRST_DECODES : 0;
    q->kept_check = kept && q->pr.has_ver[1];
    q->own_verifies = kept ? 0 : p->reached[0];
    q->times_cold = !q->pr.has_prop;
    for (int n = 0; n < DS4_DSPARK_MAX_BLOCK + 2; n++) q->carried_ver[n] = kept && n >= 2 && q->pr.has_ver[n];
    q->carried_prop = kept && q->pr.has_prop;
}

/* ---- the cost model (spec dspark.md §7.3) ---------------------------------------------------- */

/* The price of a pass over n rows: its own time, else interpolated between the measured widths
 * around it (flat beyond them: optimistic), and for a verify (n >= 2) never above the time of a wider
 * width the session can draft (up to q->room: a pass over fewer rows does less of the same work).
 * Without that bound one width timed once in a busy spell (kept prices held verify(5) at 12.9 ms
 * beside verify(6) at 7.1) stopped the scan for the best length below it, so that width was never
 * drafted to re-time it, nor any wider one.  Only widths within the room bound it: a cheap kept time
 * of a width the knobs never draft (max_draft below the block) would never be re-timed either, and
 * priced every narrower verify below its cost (spec dspark.md §7.4, Times). */
static double t_verify(const ds4_sched *q, int n) {
    double t;
    if (q->pr.has_ver[n]) {
        t = q->pr.t_ver[n];
    } else {
        int lo = n, hi = n;
        while (lo > 1 && !q->pr.has_ver[lo]) lo--;
        while (hi < DS4_DSPARK_MAX_BLOCK + 1 && !q->pr.has_ver[hi]) hi++;
        if (q->pr.has_ver[lo] && q->pr.has_ver[hi] && hi != lo)
            t = q->pr.t_ver[lo] + (q->pr.t_ver[hi] - q->pr.t_ver[lo]) * (double)(n - lo) / (double)(hi - lo);
        else
            t = q->pr.has_ver[lo] ? q->pr.t_ver[lo] : q->pr.t_ver[hi];
    }
    if (n >= 2) /* a plain decode is priced by the plain decodes alone, which every skipped cycle times */
        for (int m = n + 1; m <= q->room && m < DS4_DSPARK_MAX_BLOCK + 2; m++)
            if (q->pr.has_ver[m] && q->pr.t_ver[m] < t) t = q->pr.t_ver[m];
    return t;
}

/* Acceptance of draft position k given that every earlier draft was accepted: the mean of the
 * Beta(hit + 1, miss + 1) posterior (the Laplace prior), or with upper = 1 its mean plus two
 * standard deviations, capped at 1 (an optimistic bound; 1 for a position never verified).  The
 * counts are the session's own (halved window) plus the kept counts it started with, weighed
 * 1 - own / CARRIED_FADE (none from CARRIED_FADE own verifies on): kept counts say where to start,
 * and a session's first verifies say more of its own text than another text's many (spec
 * dspark.md §7.4, kept prices). */
static double accept_at(const ds4_sched *q, int k, int upper) {
    const double f = q->own_verifies < CARRIED_FADE ? 1.0 - (double)q->own_verifies / CARRIED_FADE : 0.0;
    const double hit = (double)q->win_hit[k] + f * (double)q->carried_hit[k];
    const double reached = (double)q->win_reached[k] + f * (double)q->carried_reached[k];
    const double al = hit + 1.0, be = reached - hit + 1.0, n = al + be;
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
static double rate(const ds4_sched *q, int l, int upper) {
    double surv = 1.0, tokens = 1.0;
    for (int k = 0; k < l; k++) {
        surv *= accept_at(q, k, upper);
        tokens += surv;
    }
    return tokens / (q->pr.t_prop + t_verify(q, l + 1));
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
static int hopeless(const ds4_sched *q, int lmax) {
    const double plain = 1.0 / t_verify(q, 1);
    if (!q->times_cold || q->own_verifies >= HOPELESS_MIN_VERIFIES) {
        int can = 0;
        for (int l = 1; l <= lmax && !can; l++) can = (double)(l + 1) / (q->pr.t_prop + t_verify(q, l + 1)) > plain;
        if (!can) return 1;
    }
    if (q->own_verifies < HOPELESS_MIN_VERIFIES) return 0;
    for (int l = 1; l <= lmax; l++)
        if (rate(q, l, 1) > HOPE_MARGIN * plain) return 0;
    return 1;
}

/* The verify length (<= lmax) with the best expected rate at the optimistic bounds (spec
 * dspark.md §7.4): the draft a probe makes while drafting might still pay. */
static int optimistic_length(const ds4_sched *q, int lmax) {
    int best = 1;
    double r = rate(q, 1, 1);
    for (int l = 2; l <= lmax; l++) {
        const double rl = rate(q, l, 1);
        if (rl > r) r = rl, best = l;
    }
    return best;
}

/* The verify length (<= lmax) that maximises expected tokens per ms, scanning up and stopping at
 * the first length that does not improve; 0 when target-only decoding is expected to be faster. */
static int best_length(const ds4_sched *q, int lmax) {
    int best = 1;
    double r = rate(q, 1, 0);
    for (int l = 2; l <= lmax; l++) {
        double rl = rate(q, l, 0);
        if (rl <= r) break;
        r = rl;
        best = l;
    }
    return r > 1.0 / t_verify(q, 1) ? best : 0;
}

/* The median of n (<= DS4_SCHED_FIRST_DECODES) times. */
static double median_ms(const double *x, int n) {
    double v[DS4_SCHED_FIRST_DECODES];
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

/* ---- the confidence policy (spec dspark.md §7.6) --------------------------------------------- */

static int cal_bin(float c) {
    const int b = (int)(c * (float)DS4_SCHED_CAL_BINS);
    return b < 0 ? 0 : b >= DS4_SCHED_CAL_BINS ? DS4_SCHED_CAL_BINS - 1 : b;
}

/* The chance that a draft of raw confidence c is accepted once the drafts before it were: its bin's
 * acceptance seen so far, with c itself as a prior worth CAL_PRIOR drafts (a drafter whose head is
 * calibrated keeps its c; one whose head is not, as DS4 Flash's released ones, learns its bins'). */
static double calibrated(const ds4_sched *q, float c) {
    const int b = cal_bin(c);
    return (q->cal_hit[b] + CAL_PRIOR * (double)c) / (q->cal_reached[b] + CAL_PRIOR);
}

static void calibrate(ds4_sched *q, float c, int hit) {
    const int b = cal_bin(c);
    q->cal_reached[b] += 1.0;
    if (hit) q->cal_hit[b] += 1.0;
    if (q->cal_reached[b] >= DS4_SCHED_CAL_WINDOW) q->cal_reached[b] *= 0.5, q->cal_hit[b] *= 0.5;
}

/* The proposal is spent: verify the n drafts whose expected tokens, 1 + sum_{k<=n} prod_{j<=k} ĉ_j,
 * per ms of a verify of n + 1 rows beat a plain decode's 1 per t_ver(1) by the most (0: none do). */
int ds4_sched_cut_confident(const ds4_sched *q, int nd, const float *conf) {
    int best = 0;
    double r = 1.0 / t_verify(q, 1), surv = 1.0, tokens = 1.0;
    for (int n = 1; n <= nd; n++) {
        surv *= calibrated(q, conf[n - 1]);
        tokens += surv;
        const double rn = tokens / t_verify(q, n + 1);
        if (rn > r) r = rn, best = n;
    }
    return best;
}

/* A cycle's gain over plain decoding at the prices: its a + 1 tokens less the decodes its proposal and
 * verify cost.  While the recent cycles gained (their gains averaged with weights 1/2, 1/4, ...: one
 * miss on text that drafts well does not stop drafting) the next back-off starts at its shortest;
 * otherwise the proposals of the next `backoff` cycles are skipped, doubling up to MAX_BACKOFF.  The
 * last cycle's gain alone (tools/cpu_notes.md, 2026-12-06) replayed 0.971 / 1.134 of target-only
 * (min / mean, 46 demo answers) against 0.975 / 1.148 averaged so. */
void ds4_sched_confident_done(ds4_sched *q, int nd, int a) {
    const double t1 = t_verify(q, 1);
    const double spent = (q->pr.has_prop ? q->pr.t_prop : 0.0) + (nd > 0 ? t_verify(q, nd + 1) : t1);
    q->gain = 0.5 * q->gain + 0.5 * ((double)(a + 1) - spent / t1);
    if (q->gain > 0.0) {
        q->backoff = 2;
        return;
    }
    q->skip_left = q->backoff;
    q->backoff = q->backoff * 2 > MAX_BACKOFF ? MAX_BACKOFF : q->backoff * 2;
}

/* ---- a cycle's decisions and what it teaches ------------------------------------------------ */

int ds4_sched_decide(ds4_sched *q, int policy, int lmax, int lroom, int *len, int *probe) {
    *probe = 0;
    *len = lmax;
    q->room = lroom + 1;
    if (q->skip_left > 0) {
        q->skip_left--;
        return DS4_ND_SCHEDULER_SKIP;
    }
    if (!q->plain_here || q->first_n < DS4_SCHED_FIRST_DECODES)
        /* plain decodes first: the cost model is priced in them (a session that starts from
         * another's prices re-times t_ver(1) once before deciding anything; one without a kept
         * t_ver(1) times DS4_SCHED_FIRST_DECODES and takes their median, as the first decode after a
         * prefill runs slow and priced alone made drafting look cheaper than it is) */
        return DS4_ND_SCHEDULER_SKIP;
    if (q->since_plain >= REPRICE_CYCLES) /* drafting only never re-times the decode it is weighed against */
        return DS4_ND_SCHEDULER_SKIP;
    if (policy == DS4_SCHED_CONFIDENCE) /* every cycle out of a back-off proposes; its cut decides (§7.6) */
        return -1;
    if (q->probe) {
        /* a back-off just ended: a probe.  After a hopeless back-off one cheap single-draft cycle
         * refreshes the first position's acceptance (the one every longer draft depends on), unless
         * the widest verify's or the proposal's time is still the kept one, which a single draft
         * re-times neither of: then the whole proposal, verified uncut (spec dspark.md §7.4,
         * In-session).  Otherwise the probe drafts the length that could pay with the optimistic
         * bounds, so that it measures the positions that keep drafting in question */
        const int stale = q->carried_prop || q->carried_ver[lroom + 1];
        const int l = q->probe == PROBE_ONE ? (stale && lroom > 1 ? lroom : 1) : optimistic_length(q, lroom);
        if (lmax < l)
            /* the caller's budget cuts the probe short (tail_skip), or there is no room for a draft at
             * all (no_room): the probe waits for the next cycle with room for it (spec dspark.md
             * §7.4).  Spent here it measured less than it is for, and the next cycle, finding drafting
             * still not paying, backed off twice as long as after a whole probe */
            return lmax < 1 ? DS4_ND_NO_ROOM : DS4_ND_TAIL_SKIP;
        q->probe = 0;
        *probe = 1;
        *len = l;
        return -1;
    }
    if (q->pr.has_prop && lmax >= 1 && lmax < lroom && best_length(q, lmax) == 0 && best_length(q, lroom) > 0)
        /* tail (spec dspark.md §7.4): the caller's budget clips the draft to a length that cannot
         * pay, where the unclipped one would: a plain cycle, and no back-off, as the prices say
         * nothing against drafting */
        return DS4_ND_TAIL_SKIP;
    if (q->pr.has_prop && lmax >= 1 && best_length(q, lmax) == 0) {
        /* skip for `backoff` cycles (this one included), doubling up to MAX_BACKOFF while drafting
         * stays unprofitable; HOPELESS_BACKOFF when it could not pay even with every position's
         * acceptance at its optimistic bound */
        const int none = hopeless(q, lroom); /* not the budget's cut: that says nothing about later cycles */
        if (none) q->backoff = HOPELESS_BACKOFF;
        q->skip_left = q->backoff - 1;
        q->probe = none ? PROBE_ONE : PROBE_LONG;
        q->backoff = q->backoff * 2 > MAX_BACKOFF ? MAX_BACKOFF : q->backoff * 2;
        return DS4_ND_SCHEDULER_SKIP;
    }
    if (lmax >= 1) q->backoff = 2; /* a cycle with no room for a draft says nothing about drafting */
    return -1;
}

void ds4_sched_proposed(ds4_sched *q, double ms) { sample_time(&q->pr.t_prop, &q->pr.has_prop, &q->carried_prop, ms); }

int ds4_sched_cut(const ds4_sched *q, int nd) {
    const int l = best_length(q, nd);
    return l >= 1 && l < nd ? l : nd;
}

void ds4_sched_verified(ds4_sched *q, int nd, int a, int next_seen, int next_hit, int probe, int timed, double ms,
                        const float *conf, int n_conf) {
    q->own_verifies++;
    for (int i = 0; i <= a && i < nd && i < n_conf; i++) calibrate(q, conf[i], i < a); /* the drafts reached */
    if (next_seen && nd < n_conf) calibrate(q, conf[nd], next_hit);
    for (int i = 0; i <= a && i < nd; i++) q->pr.reached[i]++, q->win_reached[i]++;
    for (int i = 0; i < a; i++) q->pr.hit[i]++, q->win_hit[i]++;
    /* greedy, every verified draft accepted and the proposal cut by the scheduler: the bonus is the
     * target's pick at the next draft position, so that position's acceptance is observed without
     * verifying it (spec dspark.md §7.4, Survival).  Without it a position the cut left out was never
     * measured again, and one early run of misses held every later draft at the cut. */
    if (next_seen) {
        q->pr.reached[nd]++, q->win_reached[nd]++;
        if (next_hit) q->pr.hit[nd]++, q->win_hit[nd]++;
    }
    if (q->win_reached[0] >= ACCEPT_WINDOW) /* the older half of the window weighs half as much */
        for (int i = 0; i < DS4_DSPARK_MAX_BLOCK; i++) q->win_reached[i] /= 2, q->win_hit[i] /= 2;
    /* a probe of two or more drafts that were all accepted: the text may have turned predictable
     * (acceptance is not stationary: a code answer's boilerplate, a repeated block), so the next
     * back-off starts at its shortest again and the probes that test it come soon (spec dspark.md
     * §7.4, Back-off) */
    if (probe && nd >= 2 && a == nd) q->backoff = 2;
    if (timed) sample_time(&q->pr.t_ver[nd + 1], &q->pr.has_ver[nd + 1], &q->carried_ver[nd + 1], ms);
    q->since_plain++;
}

void ds4_sched_plain(ds4_sched *q, int timed, double ms) {
    if (timed) {
        if (q->kept_check) {
            q->kept_check = 0;
            if (ms < 0.5 * q->pr.t_ver[1]) {
                /* the kept times were measured where a decode cost over twice this one (a longer
                 * context, a busier machine): a verify priced that high would never be drafted to
                 * re-time it, and the clamped average would take dozens of decodes to bring t_ver(1)
                 * down.  They go, and the session prices itself as a fresh one does (five plain
                 * decodes, then a pricing draft); the acceptance counts stay (spec dspark.md §7.4) */
                for (int n = 0; n < DS4_DSPARK_MAX_BLOCK + 2; n++) q->pr.has_ver[n] = q->carried_ver[n] = 0;
                q->pr.has_prop = q->carried_prop = 0;
                q->first_n = 0;
                q->times_cold = 1; /* its times are now its own first samples, as a fresh session's */
            }
        }
        ema(&q->pr.t_ver[1], &q->pr.has_ver[1], ms);
        if (q->first_n < DS4_SCHED_FIRST_DECODES) {
            q->first_ms[q->first_n++] = ms;
            if (q->first_n == DS4_SCHED_FIRST_DECODES) q->pr.t_ver[1] = median_ms(q->first_ms, DS4_SCHED_FIRST_DECODES);
        }
        q->n_priced++;
        q->priced_ms += ms;
        q->plain_here = 1;
    }
    q->n_plain++;
    q->since_plain = 0;
}

/* ---- the replay (spec dspark.md §7.5) -------------------------------------------------------- */

int ds4_dspark_replay(const ds4_dspark_prices *start, int32_t kept, const ds4_dspark_knobs *knobs, int32_t block,
                      const uint8_t *accepted, const float *confidence, int32_t n_positions, int32_t n_tokens,
                      const ds4_dspark_costs *costs, ds4_dspark_prices *end, ds4_dspark_replay_result *out, char *err,
                      size_t err_len) {
    if (!knobs || !costs || !out || (n_positions > 0 && !accepted))
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: NULL knobs, costs, result or acceptance");
    if (block < 1 || block > DS4_DSPARK_MAX_BLOCK)
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: block must be 1..%d, got %d", DS4_DSPARK_MAX_BLOCK, block);
    if (knobs->enabled != 0 && knobs->enabled != 1)
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: enabled must be 0 or 1, got %d", knobs->enabled);
    if (knobs->scheduler != 0 && knobs->scheduler != 1)
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: scheduler must be 0 or 1, got %d", knobs->scheduler);
    if (knobs->max_draft < 1 || knobs->max_draft > block)
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: max draft length must be 1..%d (the block), got %d", block,
                        knobs->max_draft);
    if (knobs->policy < 0 || knobs->policy >= DS4_SCHED_POLICIES)
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: policy must be %d (acceptance) or %d (confidence), got %d",
                        DS4_SCHED_ACCEPTANCE, DS4_SCHED_CONFIDENCE, knobs->policy);
    if (!(knobs->threshold >= 0.0f && knobs->threshold <= 1.0f))
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: the confidence threshold must be in [0, 1], got %g",
                        (double)knobs->threshold);
    if (!confidence && knobs->threshold != 0.0f)
        return ds4_fail(err, err_len, DS4_E_INVALID,
                        "replay: the confidence threshold must be 0 without recorded confidences, got %g",
                        (double)knobs->threshold);
    if (!confidence && knobs->scheduler && knobs->policy == DS4_SCHED_CONFIDENCE)
        return ds4_fail(err, err_len, DS4_E_INVALID,
                        "replay: the confidence policy needs the recorded confidences (none were given)");
    if (n_tokens < 1 || n_tokens > n_positions)
        return ds4_fail(err, err_len, DS4_E_INVALID,
                        "replay: n_tokens must be 1..%d (the recorded positions: a cycle at position p reads "
                        "accepted[p]), got %d", n_positions, n_tokens);
    for (int32_t p = 0; p < n_positions; p++)
        if (accepted[p] > block)
            return ds4_fail(err, err_len, DS4_E_INVALID, "replay: accepted[%d] = %d is more than the block, %d", p,
                            accepted[p], block);
    for (int64_t i = 0; confidence && i < (int64_t)n_positions * block; i++)
        if (!(confidence[i] >= 0.0f && confidence[i] <= 1.0f))
            return ds4_fail(err, err_len, DS4_E_INVALID, "replay: confidence[%lld] (position %lld, draft %lld) must be in "
                            "[0, 1], got %g", (long long)i, (long long)(i / block), (long long)(i % block + 1),
                            (double)confidence[i]);
    if (!(isfinite(costs->t_decode) && costs->t_decode > 0.0))
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: t_decode must be a finite time > 0 ms, got %g", costs->t_decode);
    if (!(isfinite(costs->t_propose) && costs->t_propose > 0.0))
        return ds4_fail(err, err_len, DS4_E_INVALID, "replay: t_propose must be a finite time > 0 ms, got %g",
                        costs->t_propose);
    for (int n = 2; n <= block + 1; n++)
        if (!(isfinite(costs->t_verify[n]) && costs->t_verify[n] > 0.0))
            return ds4_fail(err, err_len, DS4_E_INVALID, "replay: t_verify[%d] must be a finite time > 0 ms (widths 2..%d), got %g",
                            n, block + 1, costs->t_verify[n]);
    ds4_sched q;
    ds4_sched_init(&q);
    if (start) {
        char why[256];
        int rc = ds4_sched_check_prices(start, why, sizeof why);
        if (rc != DS4_OK) return ds4_fail(err, err_len, rc, "replay: start prices: %s", why);
        ds4_sched_set_prices(&q, start, kept);
    }
    memset(out, 0, sizeof *out);
    int32_t pos = 0;
    while (pos < n_tokens) {
        /* the step's room: the knobs' length, the caller's budget (the tokens left) less the one the
         * verify adds */
        const int lroom = knobs->max_draft;
        const int left = n_tokens - pos;
        int lmax = lroom < left - 1 ? lroom : left - 1;
        const int confident = knobs->scheduler && knobs->policy == DS4_SCHED_CONFIDENCE;
        int len = lmax, probe = 0, reason = -1;
        if (!knobs->enabled) reason = DS4_ND_DISABLED;
        else if (knobs->scheduler) reason = ds4_sched_decide(&q, knobs->policy, lmax, lroom, &len, &probe);
        if (reason < 0 && len < 1) reason = DS4_ND_NO_ROOM;
        /* the drafter proposes `len` drafts, cut at the first confidence below the threshold (c_1
         * below it: nothing); a whole-length one prices t_prop */
        const float *conf = confidence ? confidence + (size_t)pos * (size_t)block : NULL;
        int drafted = 0;
        if (reason < 0) {
            out->ms += costs->t_propose;
            if (len == lroom) ds4_sched_proposed(&q, costs->t_propose);
            while (drafted < len && !(conf && conf[drafted] < knobs->threshold)) drafted++;
            if (drafted == 0 || knobs->threshold >= 1.0f) reason = DS4_ND_CONFIDENCE_GATE;
        }
        int nd = drafted;
        if (reason < 0 && knobs->scheduler && !probe)
            nd = confident ? ds4_sched_cut_confident(&q, drafted, conf) : ds4_sched_cut(&q, drafted);
        if (reason < 0 && nd == 0) reason = DS4_ND_CONFIDENCE_CUT;
        if (reason >= 0) {
            if (reason == DS4_ND_CONFIDENCE_CUT || (confident && reason == DS4_ND_CONFIDENCE_GATE))
                ds4_sched_confident_done(&q, 0, 0); /* a proposal spent for nothing */
            ds4_sched_plain(&q, 1, costs->t_decode);
            out->ms += costs->t_decode;
            out->cycles++;
            out->no_draft_reasons[reason]++;
            pos++;
            continue;
        }
        const int take = accepted[pos];
        const int a = take < nd ? take : nd;
        ds4_sched_verified(&q, nd, a, a == nd && nd < drafted, take > nd, probe, 1, costs->t_verify[nd + 1], conf,
                           conf ? drafted : 0);
        if (confident) ds4_sched_confident_done(&q, nd, a);
        out->ms += costs->t_verify[nd + 1];
        out->cycles++;
        out->drafted_cycles++;
        out->proposed += (uint64_t)nd;
        out->accepted += (uint64_t)a;
        pos += a + 1;
    }
    out->tokens = (uint64_t)pos;
    if (end) *end = q.pr;
    return DS4_OK;
}
