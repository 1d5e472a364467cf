"""The CPU engine's thread pool: results never depend on how many threads run them, also when
there are far more threads than cores (chunks are claimed by whichever thread gets there first, so
an oversubscribed pool stresses every hand-over between runs)."""

from __future__ import annotations

import numpy as np

from ds4tui.engine.session import Engine, SamplingParams

PROMPT = [(i * 7919 + 13) % 120000 + 100 for i in range(100)]


def _run(model, threads: int):
    with Engine(model, backend="cpu", numerics="ds4", n_threads=threads) as e:
        s = e.session(512, n_batch=32)
        logits = s.prefill(PROMPT, logits="all")
        s.set_sampling(SamplingParams(temperature=0.0))
        ids = list(e.session(512, n_batch=32).generate(PROMPT, max_tokens=16))
    return logits, ids


def test_results_do_not_depend_on_the_thread_count(tiny_q2):
    logits1, ids1 = _run(tiny_q2["model"], 1)
    for threads in (3, 32):  # 32 threads on a 2-core machine: many runs hand over mid-flight
        logits, ids = _run(tiny_q2["model"], threads)
        assert np.array_equal(logits, logits1), f"{threads} threads"
        assert ids == ids1, f"{threads} threads"
