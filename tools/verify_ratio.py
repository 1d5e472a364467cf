"""Verify(1+k rows) against a one-token decode, measured in one run (the ratio DSpark's scheduler
prices, spec dspark.md §7.3).

``python tools/verify_ratio.py (--demo | --medium | MODEL) [--threads 2] [--rows 6] [--rounds 20]
[--json] [--backend cpu|hip] [--amx auto|on|off]`` opens the model on the CPU backend (or ``--backend``), prefills a
200-token prompt, then alternates rounds of 10 one-token passes and 10 passes of ``--rows`` tokens
with all logits (what a verify runs), each followed by a truncate back to the prompt, and prints the
median and range of both and the ratio of the medians.  Rounds alternate so that a slow spell of a
shared machine lands on both sides.  With ``--threads 1`` on the CPU the times are the process's
CPU time (immune to other work taking the core); otherwise wall time.  ``--activations q8``
measures the 8-bit activation option, ``--amx`` the AMX tiles (spec ds4.md §2.9.6; auto: on where
the CPU has them, with q8), ``--gpu-graphs on`` the graph replay of the passes (spec
platform.md §8; the warm-up passes capture the graphs, so the timed ones replay them).  Not a test: CI never runs it; ``tools/cpu_notes.md`` records
what it printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from ds4tui.cli import positive_int, thread_count
from ds4tui.commands.bench import BenchError
from ds4tui.demo import DemoError
from ds4tui.engine.errors import BackendUnavailableError, EngineError, ModelFileError


PROMPT_TOKENS = 200  # prefilled before the timed passes
MAX_ROWS = 4096  # a verify is 1 + block rows; wider passes are prefill chunks, which bench times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Time verify passes of --rows tokens against one-token decodes in alternating rounds of one "
        "run, and print the median and range of both and the ratio of the medians (the ratio DSpark's scheduler "
        "prices, spec dspark.md §7.3).")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("model", nargs="?", type=Path, help="a DS4 GGUF")
    g.add_argument("--demo", action="store_true", help="the bundled demo model")
    g.add_argument("--medium", action="store_true", help="the cached medium benchmark model (ds4tui bench --medium)")
    ap.add_argument("--threads", type=thread_count, default=2, help="engine threads (0 = one per core; default 2)")
    ap.add_argument("--rows", type=positive_int, default=6, help="rows of the verify pass, >= 1 (anchor + drafts; "
                    "default 6)")
    ap.add_argument("--rounds", type=positive_int, default=20,
                    help="rounds of 10 decodes and 10 verifies, >= 1 (default 20)")
    ap.add_argument("--activations", choices=("f32", "q8"), default="f32")
    ap.add_argument("--gpu-graphs", choices=("off", "on"), default="off",
                    help="replay the passes from graphs (spec platform.md §8; GPU backend only; default off)")
    ap.add_argument("--amx", choices=("auto", "on", "off"), default="auto",
                    help="Q8_0 products on the AMX tiles (spec ds4.md §2.9.6; cpu backend, q8 activations; default auto)")
    ap.add_argument("--backend", choices=("cpu", "hip"), default="cpu",
                    help="engine backend (default cpu); hip times wall time")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.rows > MAX_ROWS:
        ap.error(f"argument --rows: at most {MAX_ROWS} rows a pass, got {a.rows} (a verify is 1 + the drafts; "
                 f"time longer passes as prefill with `ds4tui bench --prefill-lengths`)")
    if a.gpu_graphs == "on" and a.backend == "cpu":
        ap.error("--gpu-graphs on needs --backend hip (the cpu backend launches nothing)")

    try:
        return _measure(a)
    except BackendUnavailableError as exc:  # the backend's fault (no GPU, no library), not the model's
        print(f"verify_ratio: error: --backend {a.backend}: {exc}", file=sys.stderr)
        return 1
    except (EngineError, ModelFileError, DemoError, BenchError) as exc:
        print(f"verify_ratio: error: {exc}", file=sys.stderr)
        return 1


def _measure(a: argparse.Namespace) -> int:
    from ds4tui.engine.session import Engine

    if a.demo:
        from ds4tui.demo import demo_pair

        pair = demo_pair()
        if pair is None:
            raise SystemExit("verify_ratio: this build ships no demo pair")
        model, name = pair.model, "demo"
    elif a.medium:
        from ds4tui.commands.bench import medium_model

        model, name = medium_model(), "medium"
    else:
        model, name = a.model, str(a.model)
    clock = time.process_time if a.threads == 1 and a.backend == "cpu" else time.perf_counter
    eng = Engine(model, backend=a.backend, n_threads=a.threads, activations=a.activations, gpu_graphs=a.gpu_graphs,
                 amx=a.amx)
    # the pass's rows are their own ids (the prompt's first ones first), so --rows may exceed the prompt
    ids = [(i * 7919 + 13) % 120000 + 100 for i in range(max(PROMPT_TOKENS, a.rows))]
    prompt = ids[:PROMPT_TOKENS]
    s = eng.session(n_ctx=max(1024, PROMPT_TOKENS + a.rows), n_batch=max(16, a.rows))
    s.prefill(prompt, logits="none")
    b, n0 = s.backend, len(s.tokens)

    def passes(n: int, k: int) -> list[float]:
        out = []
        for _ in range(k):
            t = clock()
            b.eval(ids[:n], "all", None)
            out.append((clock() - t) * 1e3)
            b.truncate(n0)
        return out

    passes(1, 3), passes(a.rows, 3)  # warm caches and the pool
    dec: list[float] = []
    ver: list[float] = []
    for _ in range(a.rounds):
        dec += passes(1, 10)
        ver += passes(a.rows, 10)
    md, mv = statistics.median(dec), statistics.median(ver)
    res = {"model": name, "threads": a.threads, "activations": a.activations, "amx": eng.amx, "amx_note": eng.amx_note,
           "gpu_graphs": eng.gpu_graphs,
           "gpu_graphs_note": eng.gpu_graphs_note, "rows": a.rows,
           "backend": a.backend, "clock": "process" if clock is time.process_time else "wall",
           "decode_ms": {"median": md, "min": min(dec), "max": max(dec)},
           "verify_ms": {"median": mv, "min": min(ver), "max": max(ver)}, "ratio": mv / md}
    eng.close()
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{name} threads={a.threads} activations={a.activations} amx={eng.amx} ({res['clock']} time): decode {md:.3f} ms "
              f"[{min(dec):.3f}-{max(dec):.3f}], verify({a.rows}) {mv:.3f} ms [{min(ver):.3f}-{max(ver):.3f}], "
              f"ratio {mv / md:.2f}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("verify_ratio: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
