"""Graphs on vs off (the gpu_graphs option, spec platform.md §8) on the same synthetic full-width
DS4 Flash weights, in one process.  Not part of CI.

The weights are built once.  For each activations mode, one engine per model (2 and 4 layers) and
one session brought to ``--ctx`` as ``bench --synthetic flash`` brings it (a real prefill of the
first 2048 tokens, then the compressed rows repeated up to the context).  Then ``--rounds`` rounds
alternate the option on the same engine and session (off on, on off, ...): ``--decode`` one-token
passes (median of all but the first two) and ``--verify`` passes of each width with every row's
logits (median of all but the first), all rolled back so that every round runs at the same
positions.  Per layer = (t4 - t2) / 2, extrapolated to 43 layers as the bench does.  Last, on the
2-layer engine at the same position: a decode step and a verify pass of each width under off and
under on, logits compared bit for bit.

    python3 tools/gpu_graphs_ab.py [--activations f32,q8] [--rounds 4] [--ctx 2048] \\
        [--widths 2,6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ds4tui.engine import synthetic as S
from ds4tui.engine.session import Engine


def _median(xs: list[float]) -> float:
    return float(np.median(np.asarray(xs)))


def _time_passes(s, toks: list[int], n_decode: int, n_verify: int, widths: list[int]) -> dict:
    """Milliseconds of the decode steps and verify passes at the session's position (rolled back)."""
    base = s.n_tokens
    dec = []
    for i in range(n_decode):
        t = time.perf_counter()
        s.prefill([toks[i]])
        dec.append((time.perf_counter() - t) * 1e3)
    s.truncate(base)
    ver = {}
    for w in widths:
        times = []
        for j in range(n_verify):
            t = time.perf_counter()
            s.prefill(toks[j:j + w], logits="all")
            times.append((time.perf_counter() - t) * 1e3)
            s.truncate(base)
        ver[w] = _median(times[1:] or times)
    return {"decode_ms": _median(dec[2:] or dec), "verify_ms": ver, "decode_all_ms": dec}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--activations", default="f32,q8", help="activations modes, comma-separated (default f32,q8)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of both modes (default 4)")
    ap.add_argument("--ctx", type=int, default=2048, help="context (default 2048; past 2048 the rows repeat)")
    ap.add_argument("--widths", default="2,6", help="verify widths (default 2,6)")
    ap.add_argument("--decode", type=int, default=24, help="decode steps per round (default 24, at most 63)")
    ap.add_argument("--verify", type=int, default=8, help="verify passes per width and round (default 8)")
    ap.add_argument("--json", help="also write every number here")
    args = ap.parse_args(argv)
    acts = [a for a in args.activations.split(",") if a]
    widths = [int(w) for w in args.widths.split(",") if w]
    t0 = time.perf_counter()
    small, big = S.flash_models(log=lambda m: None)
    print(f"weights built in {time.perf_counter() - t0:.1f} s", flush=True)
    rng = np.random.default_rng(3)
    toks = rng.integers(100, 128000, max(args.decode, args.verify + max(widths))).tolist()
    out: dict = {"ctx": args.ctx, "widths": widths, "rounds": args.rounds, "activations": {}}
    for act in acts:
        per_model: dict = {}
        same: dict = {}
        notes: dict = {}
        for model in (small, big):
            L = model.config.n_layer
            t1 = time.perf_counter()
            eng = Engine(model, backend="hip", activations=act, gpu_graphs="off")
            try:
                s = eng.session(args.ctx + max(widths) + args.decode + 8, n_batch=64)
                real = min(args.ctx, S.FILL_PREFIX)
                s.prefill(rng.integers(100, 128000, real).tolist(), logits="none")
                if args.ctx > real:
                    s.bench_fill(args.ctx, filler=100)
                print(f"{act}, {L} layers: engine open and context {args.ctx} in {time.perf_counter() - t1:.1f} s",
                      flush=True)
                rows = {"off": [], "on": []}
                for rnd in range(args.rounds):
                    for mode in (("off", "on") if rnd % 2 == 0 else ("on", "off")):
                        eng.set_gpu_graphs(mode)
                        r = _time_passes(s, toks, args.decode, args.verify, widths)
                        rows[mode].append(r)
                        print(f"  {act} {L} layers round {rnd} graphs {mode}: decode {r['decode_ms']:.3f} ms, verify "
                              + ", ".join(f"{w}: {v:.3f}" for w, v in r["verify_ms"].items()) + " ms", flush=True)
                notes[L] = eng.gpu_graphs_note
                per_model[L] = rows
                if L == small.config.n_layer:  # bit for bit at the same position, same engine
                    base = s.n_tokens
                    got = {}
                    for mode in ("off", "on"):
                        eng.set_gpu_graphs(mode)
                        got[mode] = [s.prefill([toks[0]])]
                        s.truncate(base)
                        for w in widths:
                            got[mode].append(s.prefill(toks[:w], logits="all"))
                            s.truncate(base)
                    same = {"decode": bool(np.array_equal(got["off"][0], got["on"][0])),
                            **{f"verify{w}": bool(np.array_equal(a, b))
                               for w, a, b in zip(widths, got["off"][1:], got["on"][1:])}}
                    print(f"  {act}: logits bit-identical off vs on: {same}", flush=True)
            finally:
                eng.close()
        l2, l4 = small.config.n_layer, big.config.n_layer
        summary = {}
        for mode in ("off", "on"):
            def per(key, w=None):
                a = [r[key] if w is None else r[key][w] for r in per_model[l2][mode]]
                b = [r[key] if w is None else r[key][w] for r in per_model[l4][mode]]
                p = (_median(b) - _median(a)) / (l4 - l2)
                return p, _median(a) - l2 * p + 43 * p

            pd, d43 = per("decode_ms")
            ver = {w: per("verify_ms", w) for w in widths}
            summary[mode] = {"decode_ms_layer": pd, "decode_ms_43": d43, "tokens_per_s_43": 1e3 / d43,
                             "verify_ms_layer": {w: v[0] for w, v in ver.items()},
                             "verify_over_decode": {w: v[1] / d43 for w, v in ver.items()}}
            print(f"{act} graphs {mode}: decode {pd:.3f} ms/layer, {1e3 / d43:.1f} tok/s (43 layers); verify/decode "
                  + ", ".join(f"{w}: {v[1] / d43:.2f}" for w, v in ver.items()), flush=True)
        out["activations"][act] = {"per_round": {str(k): v for k, v in per_model.items()}, "summary": summary,
                                   "bit_identical": same, "gpu_graphs_note": {str(k): v for k, v in notes.items()}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
