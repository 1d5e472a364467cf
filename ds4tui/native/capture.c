/* capture.c — which positions a position-indexed ring holds (spec dspark.md §2.2).
 *
 * The DSpark capture ring (the stream means of the captured target layers, written by every target
 * pass) and the drafter's context-KV ring keep position p in row p % cap.  A span [from, last]
 * says which positions are current: writing new positions overwrites the oldest, a gap starts
 * afresh, truncating forgets positions at and after n.  The rows themselves live in the forward
 * state (forward.c); only this bookkeeping is here.
 */
#include "internal.h"

void ds4_span_init(ds4_span *s, int32_t cap) {
    s->cap = cap;
    s->from = 0;
    s->last = -1;
}

void ds4_span_writing(ds4_span *s, int64_t p0, int n) {
    if (p0 + n - s->cap > s->from) s->from = p0 + n - s->cap;
}

void ds4_span_written(ds4_span *s, int64_t p0, int n) {
    if (p0 != s->last + 1) s->from = p0; /* a gap: older rows do not continue this one */
    s->last = p0 + n - 1;
    if (s->last - s->cap + 1 > s->from) s->from = s->last - s->cap + 1;
}

void ds4_span_truncate(ds4_span *s, int64_t n) {
    if (s->last > n - 1) s->last = n - 1;
    if (s->last < s->from) {
        s->from = 0;
        s->last = -1;
    }
}
