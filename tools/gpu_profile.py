"""Per-kernel profile of one decode step and one verify pass (1 + 5 rows), or of one prefill pass
(``--only prefill``: ``--prefill N`` tokens in one pass, under ``--prefill-gemm``), on synthetic
full-width DS4 Flash layers (ds4tui.engine.synthetic) or on a GGUF (``--gguf MODEL``, with
``--mtp SUPPORT`` also ``--only propose``: one greedy DSpark proposal), for Nsight Compute:

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \\
        --print-summary per-kernel python3 tools/gpu_profile.py [--ctx 2048] [--layers 2] [--only decode]

(tools/ncu_summary.py turns that log into a table sorted by total kernel time.)

The model is built and the context filled with profiling off (a real prefill of up to 2048 tokens,
then the compressed rows repeated up to --ctx, as ``bench --synthetic flash --fill repeat`` does); cuProfilerStart/Stop (libcuda)
bracket the decode step and the verify pass, so only their kernels are measured.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time

import numpy as np

from ds4tui.engine import synthetic
from ds4tui.engine.session import Engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2, help="layers, alternating CSA and HCA (default 2)")
    ap.add_argument("--only", choices=("decode", "verify", "both", "prefill", "propose"), default="both",
                    help="profile only the decode step, only the verify pass, or one prefill pass (default: decode "
                    "and verify)")
    ap.add_argument("--prefill", type=int, default=2048, help="tokens of the profiled prefill pass (default 2048)")
    ap.add_argument("--prefill-gemm", choices=("auto", "off", "bf16", "f16"), default="auto",
                    help="the engine's prefill_gemm option (default auto)")
    ap.add_argument("--activations", choices=("f32", "q8"), default="f32",
                    help="the engine's activations option (spec ds4.md §2.9.5; default f32)")
    ap.add_argument("--gguf", help="profile this DS4 GGUF instead of synthetic layers (e.g. the demo pair's model)")
    ap.add_argument("--mtp", help="with --gguf: its DSpark support GGUF (needed for --only propose)")
    ap.add_argument("--gpu-graphs", choices=("off", "on"), default="off",
                    help="the engine's gpu_graphs option (spec platform.md §8; default off)")
    args = ap.parse_args(argv)
    if args.only == "propose" and not args.mtp:
        ap.error("--only propose needs --gguf MODEL --mtp SUPPORT")
    if args.gguf:
        model = args.gguf
    else:
        ratios = tuple(4 if i % 2 == 0 else 128 for i in range(args.layers))
        model = synthetic.SyntheticModel(synthetic.flash_config(ratios), seed=0)
    eng = Engine(model, backend="hip", prefill_gemm=args.prefill_gemm, activations=args.activations,
                 support=args.mtp, gpu_graphs=args.gpu_graphs)
    if args.only == "propose":
        return _propose(eng, args)
    if args.only == "prefill":
        rng = np.random.default_rng(1)
        n = args.prefill
        with eng.session(n + 16, n_batch=n) as s:  # warm: BLAS handle and heuristics, scratch sizes
            s.prefill(rng.integers(100, 128000, n).tolist(), logits="none")
        with eng.session(n + 16, n_batch=n) as s:
            prompt = rng.integers(100, 128000, n).tolist()
            cuda = ctypes.CDLL("libcuda.so.1")
            cuda.cuProfilerStart()
            t = time.perf_counter()
            s.prefill(prompt, logits="none")
            t_pre = time.perf_counter() - t
            cuda.cuProfilerStop()
        print(f"prefill {n} tokens, prefill_gemm {eng.prefill_gemm}: {t_pre * 1e3:.1f} ms (wall, under the profiler)",
              file=sys.stderr)
        eng.close()
        return 0
    s = eng.session(args.ctx + 16, n_batch=64)
    if args.mtp:
        s.set_dspark(enabled=False)  # plain passes; the capture rows are written as in a DSpark session
    rng = np.random.default_rng(1)
    real = min(args.ctx, synthetic.FILL_PREFIX)  # past it, the compressed rows repeat (Session.bench_fill)
    s.prefill(rng.integers(100, 128000, real).tolist(), logits="none")
    if args.ctx > real:
        s.bench_fill(args.ctx, filler=100)
    s.prefill([5000])  # warm
    cuda = ctypes.CDLL("libcuda.so.1")
    if args.only != "verify":
        cuda.cuProfilerStart()
    t = time.perf_counter()
    s.prefill([5001])
    t_dec = time.perf_counter() - t
    base = s.n_tokens
    if args.only == "verify":
        cuda.cuProfilerStart()
    elif args.only == "decode":
        cuda.cuProfilerStop()
    t = time.perf_counter()
    s.prefill([5002, 5003, 5004, 5005, 5006, 5007], logits="all")
    t_ver = time.perf_counter() - t
    if args.only != "decode":
        cuda.cuProfilerStop()
    s.truncate(base)
    print(f"decode {t_dec * 1e3:.2f} ms, verify(6 rows) {t_ver * 1e3:.2f} ms (wall, under the profiler)",
          file=sys.stderr)
    eng.close()
    return 0


def _propose(eng, args) -> int:
    """One greedy DSpark cycle after a prompt of ``--ctx`` tokens (scheduler off, every draft
    proposed): the profiler brackets the step whose proposal and verify are measured."""
    s = eng.session(args.ctx + 64, n_batch=64)
    s.set_dspark(scheduler=False, threshold=0.0)
    rng = np.random.default_rng(1)
    s.prefill(rng.integers(100, 128000, args.ctx).tolist())
    for _ in range(4):  # warm: the drafter's context rows, graphs when on
        s.step()
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuProfilerStart()
    t = time.perf_counter()
    out = s.step()
    dt = time.perf_counter() - t
    cuda.cuProfilerStop()
    print(f"one DSpark cycle: {len(out)} tokens, {len(s.last_proposal()[0])} drafts, {dt * 1e3:.2f} ms (wall, under "
          f"the profiler)", file=sys.stderr)
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
