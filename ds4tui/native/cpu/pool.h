/* pool.h — persistent thread pool (internal). */
#ifndef DS4_CPU_POOL_H
#define DS4_CPU_POOL_H

#include <stdint.h>

typedef struct ds4_pool ds4_pool;
/* fn processes items [begin, end) on thread `thread` (0 = the caller). */
typedef void (*ds4_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* n_threads <= 0: one per online core.  NULL on failure with an errno value in *error (may be NULL). */
ds4_pool *ds4_pool_create(int n_threads, int *error);
void ds4_pool_destroy(ds4_pool *p);
int ds4_pool_size(const ds4_pool *p);
void ds4_pool_run(ds4_pool *p, ds4_task_fn fn, void *ctx, int64_t n);

#endif
