"""A/B of two (or more) GPU backend libraries on the same synthetic full-width DS4 Flash weights, in one
process: the weights are built once, each library times decode and verify (2 and 4 layers,
per layer = (t4 - t2) / 2, extrapolated to 43 layers as ``bench --synthetic flash`` does) in
alternating rounds (A B, B A, ...), then each runs the same verify pass and decode step on the
2-layer model after 2100 tokens (so the indexer scores and selects) and the logits are compared bit
for bit.  Not part of CI.

With ``--prefill 2048,8192`` the rounds time prefills instead (each length in chunks of
``--prefill-batch`` tokens under ``--prefill-gemm``, per layer and extrapolated as ``bench
--synthetic flash --prefill-lengths`` does), and the bit-for-bit check is a 64-row pass with every
row's logits after a 2100-token prefill (multi-token passes, where the two libraries may take
other kernels), under prefill_gemm off and the mode timed.

    python3 tools/gpu_lib_ab.py base=ds4tui/libds4tui_cuda.so new=other/ds4tui/libds4tui_cuda.so \\
        [--rounds 2] [--ctx 2048] [--activations f32,q8] [--prefill 2048,8192 [--prefill-gemm bf16] \\
        [--prefill-batch 2048]] [--json out.json]

``--activations`` (decode and verify): the engines' activations option (spec ds4.md §2.9.5), each
mode timed and checked in turn (default f32).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np

from ds4tui.engine import synthetic as S
from ds4tui.engine.session import Engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs="+", metavar="NAME=LIBRARY",
                    help="two or more GPU libraries to compare, each checked against the first")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both libraries (default 2)")
    ap.add_argument("--ctx", type=int, default=2048, help="context (default 2048; past 2048 the rows repeat)")
    ap.add_argument("--prefill", help="time prefills of these lengths (comma-separated) instead of decode/verify")
    ap.add_argument("--prefill-gemm", default="bf16", help="the prefill_gemm mode of --prefill (default bf16)")
    ap.add_argument("--prefill-batch", type=int, default=2048, help="the chunk of --prefill (default 2048)")
    ap.add_argument("--activations", default="f32", help="decode/verify: activations modes, comma-separated "
                    "(default f32)")
    ap.add_argument("--json", help="also write the per-round numbers here")
    args = ap.parse_args(argv)
    if args.prefill:
        return prefill_ab(args)
    if len(args.libs) < 2:
        ap.error(f"compare two or more libraries, got {len(args.libs)}")
    libs = dict(a.split("=", 1) for a in args.libs)
    names = list(libs)
    big_cfg = replace(S.flash_config((4, 128)), n_layer=4, compress_ratios=(4, 128, 4, 128),
                      swiglu_clamp=(10.0,) * 4)
    t0 = time.perf_counter()
    big = S.SyntheticModel(big_cfg, seed=0)
    small = S.SyntheticModel(S.flash_config((4, 128)), seed=0, base=big)
    print(f"weights built in {time.perf_counter() - t0:.1f} s", flush=True)
    report = {}
    for act in [a for a in args.activations.split(",") if a]:
        report[act] = _decode_ab(args, libs, small, big, act)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report if len(report) > 1 else next(iter(report.values())), f, indent=1)
    return 0


def _decode_ab(args, libs: dict, small, big, act: str) -> dict:
    """The decode/verify rounds and the bit-for-bit check of one activations mode."""
    names = list(libs)
    res: dict = {k: [] for k in names}
    for rnd in range(args.rounds):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            opts = {"gpu_layout": "planar", "gpu_library": libs[name], "activations": act}
            kw = dict(backend="hip", ctxs=[args.ctx], fill="repeat", fill_prefix=S.FILL_PREFIX, n_decode=24,
                      n_verify=8, widths=[2, 6], log=lambda m: None, engine_options=opts)
            r2 = S._time_model(small, **kw)["contexts"][0]
            r4 = S._time_model(big, **kw)["contexts"][0]

            def per(k, w=None):
                a, b = (r2[k], r4[k]) if w is None else (r2[k][w], r4[k][w])
                p = (b - a) / 2
                return p, a - 2 * p + 43 * p

            (pd, d43), (pv, v43), (_, v243) = per("decode_ms"), per("verify_ms", 6), per("verify_ms", 2)
            row = {"round": rnd, "decode_ms_layer": pd, "verify6_ms_layer": pv, "tokens_per_s": 1e3 / d43,
                   "verify6_over_decode": v43 / d43, "verify2_over_decode": v243 / d43}
            res[name].append(row)
            print(name, act, json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
    for name in names:
        def med(k):
            return float(np.median([r[k] for r in res[name]]))
        print(f"{act} {name}: decode {med('decode_ms_layer'):.3f} ms/layer, {med('tokens_per_s'):.1f} tok/s (43 layers), "
              f"verify(6) {med('verify6_ms_layer'):.3f} ms/layer, verify(6)/decode {med('verify6_over_decode'):.2f}, "
              f"verify(2)/decode {med('verify2_over_decode'):.2f} (medians of {len(res[name])} rounds)", flush=True)
    out = {}
    for name in names:
        eng = Engine(small, backend="hip", gpu_library=libs[name], activations=act)
        try:
            s = eng.session(2200, n_batch=64)  # past 2048 + 4 tokens: the indexer scores and selects
            s.prefill(np.random.default_rng(5).integers(100, 128000, 2100).tolist(), logits="none")
            out[name] = (s.prefill([5, 6, 7, 8, 9, 10], logits="all"), s.prefill([11]))
        finally:
            eng.close()
    a = names[0]
    same = {b: {"verify": bool(np.array_equal(out[a][0], out[b][0])), "decode": bool(np.array_equal(out[a][1], out[b][1]))}
            for b in names[1:]}
    for b in names[1:]:
        print(f"{act}: logits of {b} bit-identical to {a}'s: verify {same[b]['verify']}, decode {same[b]['decode']}",
              flush=True)
    return {"activations": act, "rounds": res, "bit_identical": same}


def prefill_ab(args) -> int:
    """The --prefill rounds and the multi-row bit-for-bit check (module docstring)."""
    libs = dict(a.split("=", 1) for a in args.libs)
    names = list(libs)
    lengths = tuple(int(x) for x in args.prefill.split(","))
    t0 = time.perf_counter()
    small, big = S.flash_models(log=lambda m: None)
    print(f"weights built in {time.perf_counter() - t0:.1f} s", flush=True)
    mode = args.prefill_gemm
    same = {}
    for m in dict.fromkeys(("off", mode)):
        out = {}
        for name in names:
            eng = Engine(small, backend="hip", gpu_library=libs[name], prefill_gemm=m)
            try:
                s = eng.session(2200, n_batch=2048)  # past 2048 + 4 tokens: the indexer scores and selects
                s.prefill(np.random.default_rng(5).integers(100, 128000, 2100).tolist(), logits="none")
                out[name] = s.prefill(np.random.default_rng(6).integers(100, 128000, 64).tolist(), logits="all")
            finally:
                eng.close()
        same[m] = {name: bool(np.array_equal(out[names[0]], out[name])) for name in names[1:]}
        print(f"prefill_gemm {m}: logits of a 64-row pass after 2100 tokens bit-identical to {names[0]}'s: {same[m]}",
              flush=True)
    res: dict = {k: [] for k in names}
    for rnd in range(args.rounds):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            kw = dict(backend="hip", lengths=lengths, batch=args.prefill_batch, modes=(mode,), log=lambda m: None,
                      engine_options={"gpu_layout": "planar", "gpu_library": libs[name]})
            p2, p4 = S._time_prefill(small, **kw)[mode]["ms"], S._time_prefill(big, **kw)[mode]["ms"]
            row = {"round": rnd}
            for n in lengths:
                per = (p4[n] - p2[n]) / 2
                ext = (p2[n] - 2 * per) + 43 * per
                row[f"ms_2_layers_{n}"], row[f"ms_4_layers_{n}"] = p2[n], p4[n]
                row[f"per_layer_ms_{n}"], row[f"tokens_per_s_{n}"] = per, n / ext * 1e3
            res[name].append(row)
            print(name, mode, json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)
    for n in lengths:
        for name in names:
            per = sorted(r[f"per_layer_ms_{n}"] for r in res[name])
            tps = sorted(r[f"tokens_per_s_{n}"] for r in res[name])
            print(f"{n} tokens, {name}: per layer {np.median(per):.1f} ms [{per[0]:.1f}-{per[-1]:.1f}], "
                  f"{np.median(tps):.0f} tok/s [{tps[0]:.0f}-{tps[-1]:.0f}] (43 layers, {len(per)} rounds)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": mode, "lengths": lengths, "rounds": res, "bit_identical": same}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
