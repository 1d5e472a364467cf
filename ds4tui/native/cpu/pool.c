/* pool.c — a persistent thread pool that splits a range of items over threads.
 *
 * ds4_pool_run(pool, fn, ctx, n) calls fn(ctx, begin, end, thread) on disjoint, contiguous chunks
 * that cover 0..n (CHUNKS_PER_THREAD per thread), and returns when every chunk is done.  The caller
 * and the workers claim chunks from one counter, so a worker that the operating system has not
 * scheduled yet (another process, or the UI, holds its core) costs nothing: the caller takes its
 * chunks instead of waiting a time slice for it.  The claim word carries the run's generation and its
 * chunk count with the next chunk, so a claim is checked against one consistent snapshot: a worker
 * that wakes late can never take a chunk of a run it did not read, nor one beyond its run's end.  `thread` is the index of
 * the thread running the chunk (0 = the caller): a thread runs its chunks one after another, so
 * per-thread scratch stays private.  Which thread runs a chunk never changes a result: every item
 * is computed the same way wherever it runs.  Workers sleep on a condition variable between runs.
 */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct ds4_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t run_mu; /* one run at a time (sessions on several threads share the pool) */
    pthread_mutex_t mu;
    pthread_cond_t start;
    uint64_t generation;  /* bumped for every run */
    _Atomic uint64_t gen_seen; /* a copy of generation that workers poll without the lock */
    _Atomic uint64_t claim;    /* generation << 32 | chunks of the run << 16 | the next chunk to claim */
    _Atomic int64_t done;      /* chunks finished in the current run */
    int quit;
    ds4_task_fn fn;
    void *ctx;
    int64_t n, n_chunks, chunk;
};

enum { CHUNKS_PER_THREAD = 4 }; /* at most 256 threads (DS4_MAX_THREADS): the count fits 16 bits */

typedef struct { ds4_pool *pool; int index; } worker_arg;

/* Worker polling between runs: POLL_SPINS pause instructions, then POLL_YIELDS sched_yield()s,
 * then sleep on the condition variable. */
enum { POLL_SPINS = 512, POLL_YIELDS = 4096 };

static inline void sched_yield_light(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Claim and run chunks of run `gen` until none is left (a claim of another run fails). */
static void run_chunks(ds4_pool *p, uint64_t gen, int t) {
    for (;;) {
        uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
        if ((v >> 32) != (gen & 0xffffffffu) || (v & 0xffffu) >= ((v >> 16) & 0xffffu)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        /* this chunk is ours and unfinished, so the run is still current: its fields are stable */
        int64_t b = (int64_t)(v & 0xffffu) * p->chunk, e = b + p->chunk;
        if (e > p->n) e = p->n;
        if (b < e) p->fn(p->ctx, b, e, t);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
    }
}

static void *worker(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    ds4_pool *p = wa.pool;
    uint64_t seen = 0;
    for (;;) {
        /* Poll briefly before sleeping: a decode step dispatches hundreds of runs a few
         * microseconds apart, and a condition-variable wake-up costs tens of microseconds.
         * After a short busy poll, yield the core at every poll: when the machine has more
         * runnable threads than cores (a UI, another process), a worker that only spins keeps
         * the thread it waits for (the caller, or a preempted worker) off the core. */
        for (int spin = 0; spin < POLL_SPINS + POLL_YIELDS && atomic_load_explicit(&p->gen_seen, memory_order_acquire) == seen; spin++) {
            if (spin < POLL_SPINS) sched_yield_light();
            else sched_yield();
        }
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start, &p->mu);
        if (p->quit) { pthread_mutex_unlock(&p->mu); return NULL; }
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, seen, wa.index);
    }
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

ds4_pool *ds4_pool_create(int n_threads, int *error) {
    if (error) *error = 0;
    if (n_threads <= 0) n_threads = online_cores();
    ds4_pool *p = calloc(1, sizeof *p);
    if (!p) {
        if (error) *error = ENOMEM;
        return NULL;
    }
    p->n_threads = n_threads;
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            free(p);
            if (error) *error = ENOMEM;
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            int rc = wa ? pthread_create(&p->threads[i - 1], NULL, worker, (wa->pool = p, wa->index = i, wa)) : ENOMEM;
            if (rc != 0) { /* never run with fewer threads than asked: stop the ones that started */
                free(wa);
                p->n_threads = i;
                ds4_pool_destroy(p);
                if (error) *error = rc;
                return NULL;
            }
        }
    }
    return p;
}

void ds4_pool_destroy(ds4_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    pthread_cond_destroy(&p->start);
    free(p);
}

int ds4_pool_size(const ds4_pool *p) { return p ? p->n_threads : 1; }

void ds4_pool_run(ds4_pool *p, ds4_task_fn fn, void *ctx, int64_t n) {
    if (n <= 0) return;
    if (!p || p->n_threads == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    int64_t want = (int64_t)p->n_threads * CHUNKS_PER_THREAD;
    p->n_chunks = n < want ? n : want;
    p->chunk = (n + p->n_chunks - 1) / p->n_chunks;
    p->n_chunks = (n + p->chunk - 1) / p->chunk;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    p->generation++;
    const uint64_t gen = p->generation;
    atomic_store_explicit(&p->claim, (gen & 0xffffffffu) << 32 | (uint64_t)p->n_chunks << 16, memory_order_release);
    atomic_store_explicit(&p->gen_seen, gen, memory_order_release);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, gen, 0);
    /* the chunks still running are on workers that are running: a short wait */
    for (int spin = 0; atomic_load_explicit(&p->done, memory_order_acquire) < p->n_chunks; spin++) {
        if (spin < POLL_SPINS) sched_yield_light();
        else sched_yield();
    }
    pthread_mutex_unlock(&p->run_mu);
}
