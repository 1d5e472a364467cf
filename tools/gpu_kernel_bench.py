"""Per-kernel profile of the GPU matmul on DS4 Flash shapes (spec ds4.md §1, §2), with the device's
read bandwidth measured in the same run: for each (weight, GGML type, rows x cols, tokens) the
median kernel time (device events), the weight bytes it reads, the GB/s that implies and the
fraction of the measured bandwidth (the roofline of a weight-bound matvec).  The expert gathers
(one matrix per slot, as the routed experts run) are timed on the host over back-to-back launches.

Usage: python tools/gpu_kernel_bench.py [--json OUT.json]   (needs a built GPU library and a device)

Two or more libraries side by side (planar layout, f32 and q8 activations, alternating rounds on the
same weights; the last column is each library's time over the first one's):

    python tools/gpu_kernel_bench.py --lib base=A/libds4tui_cuda.so --lib new=B/libds4tui_cuda.so \\
        [--rounds 3] [--only gather] [--activations q8] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ds4tui.engine import gpu

PLANAR = 256  # DS4_GPU_PLANAR (ds4_engine.h)

# (name, GGML type id, rows, cols): one full-width DS4 Flash layer's matrices (q2 mix: dense Q8_0,
# routed gate/up IQ2_XXS, routed down Q2_K) and the F16 LM head slice.
SHAPES = [
    ("attn_q_a", 8, 1024, 4096),
    ("attn_q_b", 8, 32768, 1024),
    ("attn_kv", 8, 512, 4096),
    ("attn_output_a(group)", 8, 1024, 4096),
    ("attn_output_b", 8, 4096, 8192),
    ("ffn_gate_shexp", 8, 2048, 4096),
    ("ffn_down_shexp", 8, 4096, 2048),
    ("ffn_gate_exps(1 expert)", 16, 2048, 4096),
    ("ffn_down_exps(1 expert)", 10, 4096, 2048),
    ("ffn_gate_exps(6 experts as rows)", 16, 6 * 2048, 4096),
    ("ffn_down_exps(6 experts as rows)", 10, 6 * 4096, 2048),
    ("output(F16, 16k vocab rows)", 1, 16384, 4096),
    ("output(Q8_0, full vocab)", 8, 129280, 4096),
]

# (name, GGML type id, rows, cols, slots): expert-gathered products, every slot its own matrix (a
# decode step's 6 routed experts, a 6-row verify pass's 36 with a random router; the grouped
# attention output projection: 8 groups per token).
GATHERS = [
    ("ffn_gate_exps gather", 16, 2048, 4096, 6),
    ("ffn_gate_exps gather", 16, 2048, 4096, 36),
    ("ffn_down_exps gather", 10, 4096, 2048, 6),
    ("ffn_down_exps gather", 10, 4096, 2048, 36),
    ("attn_output_a gather", 8, 1024, 4096, 8),
    ("attn_output_a gather", 8, 1024, 4096, 48),
]


def _weights(t: int, rows: int, cols: int, rng, lib) -> np.ndarray:
    """Random bytes of a rows x cols matrix of GGML type t, its f16 scales kept finite."""
    rb = lib.ds4_type_row_bytes(t, cols)
    W = rng.integers(0, 256, rows * rb, dtype=np.uint8)
    if t in (8, 10, 16, 1):  # keep f16 scales / values finite: clear each block's exponent top bits
        W = W.reshape(rows, -1)
        if t == 1:
            W[:, 1::2] &= 0x3B
        elif t == 8:
            W.reshape(rows, -1, 34)[:, :, 1] &= 0x3B
        elif t == 10:
            blocks = W.reshape(rows, -1, 84)
            blocks[:, :, 81] &= 0x3B
            blocks[:, :, 83] &= 0x3B
        else:
            W.reshape(rows, -1, 66)[:, :, 1] &= 0x3B
        W = np.ascontiguousarray(W).ravel()
    return W


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--lib", action="append", metavar="NAME=LIBRARY", default=[],
                    help="a GPU library to time (repeat for a side-by-side; default: the built one)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds with several --lib (default 3)")
    ap.add_argument("--only", metavar="TEXT", default="",
                    help="with several --lib: only the products whose weight name contains TEXT (e.g. gather)")
    ap.add_argument("--activations", choices=("f32", "q8", "both"), default="both",
                    help="with several --lib: the activations timed (default both)")
    args = ap.parse_args(argv)
    info, why = gpu.probe()
    if why:
        print(f"gpu_kernel_bench: {why}", file=sys.stderr)
        return 1
    from ds4tui._native import ffi, lib

    if args.lib:
        return compare(args, info, ffi, lib)
    lib_path = info.library.encode()
    err = ffi.new("char[1024]")
    gbs = ffi.new("double *")
    rc = lib.ds4_gpu_bandwidth(lib_path, 4 << 30, 10, gbs, err, 1024)
    if rc:
        print(ffi.string(err).decode(), file=sys.stderr)
        return 1
    bw = gbs[0]
    print(f"device {info.device_name} ({info.device_arch}); read bandwidth {bw:.0f} GB/s (4 GiB, best of 10)")
    rng = np.random.default_rng(0)
    rows_out = []
    print(f"{'weight':36s} {'type':>4s} {'rows':>6s} {'cols':>5s} {'tok':>3s} {'layout':>6s} {'us':>8s} {'GB/s':>7s} "
          f"{'roof':>5s} {'vs ggml':>7s}")
    for name, t, rows, cols in SHAPES:
        rb = lib.ds4_type_row_bytes(t, cols)
        W = _weights(t, rows, cols, rng, lib)
        # the GGML layout and, where the rows allow it, the planar one, side by side
        # (and the planar one under q8 activations, spec ds4.md §2.9.5)
        layouts = [("ggml", 0, 0)] + ([("planar", PLANAR, 0), ("q8", PLANAR, 1)] if t in (8, 10, 16) and rb % 16 == 0
                                      else [])
        for n in (1, 6):
            X = rng.standard_normal((n, cols)).astype(np.float32)
            base_ms = None
            for lname, flag, act in layouts:
                Y = np.empty((n, rows), np.float32)
                ms = ffi.new("double *")
                rc = lib.ds4_gpu_kernel_matmul(lib_path, t | flag, act, ffi.from_buffer(W), rows, cols,
                                               ffi.cast("float *", X.ctypes.data), n,
                                               ffi.cast("float *", Y.ctypes.data), args.reps, ms, err, 1024)
                if rc:
                    print(f"{name}: {ffi.string(err).decode()}", file=sys.stderr)
                    return 1
                assert np.isfinite(Y).all(), name
                nbytes = rows * rb + n * cols * 4
                g = nbytes / (ms[0] * 1e-3) / 1e9
                base_ms = base_ms or ms[0]
                rows_out.append({"weight": name, "type": t, "rows": rows, "cols": cols, "tokens": n, "layout": lname,
                                 "ms": ms[0], "bytes": nbytes, "gbs": g, "roofline": g / bw,
                                 "speedup_vs_ggml": base_ms / ms[0]})
                print(f"{name:36s} {t:4d} {rows:6d} {cols:5d} {n:3d} {lname:>6s} {ms[0] * 1e3:8.1f} {g:7.0f} "
                      f"{g / bw:5.2f} {base_ms / ms[0]:6.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.to_json(), "bandwidth_gbs": bw, "kernels": rows_out}, f, indent=2)
    return 0


def compare(args, info, ffi, lib) -> int:
    """Several libraries on the same weights, planar f32 and q8, dense products and gathers."""
    libs = dict(a.split("=", 1) for a in args.lib)
    names = list(libs)
    err = ffi.new("char[1024]")
    rng = np.random.default_rng(0)
    out = []
    print(f"device {info.device_name}; libraries " + ", ".join(f"{k}={v}" for k, v in libs.items()), flush=True)
    print(f"{'weight':30s} {'type':>4s} {'rows':>6s} {'cols':>5s} {'n':>3s} {'act':>3s} "
          + " ".join(f"{k + ' us':>12s}" for k in names) + "  " + " ".join(f"{k + '/' + names[0]:>9s}" for k in names[1:]),
          flush=True)

    def run(name, t, rows, cols, n, slots, W, X, ids):
        for act in {"f32": (0,), "q8": (1,), "both": (0, 1)}[args.activations]:
            times: dict = {k: [] for k in names}
            ys = {}
            for r in range(args.rounds):
                for k in (names if r % 2 == 0 else names[::-1]):
                    ms = ffi.new("double *")
                    if slots:
                        Y = np.empty((slots, rows), np.float32)
                        rc = lib.ds4_gpu_kernel_gather(libs[k].encode(), t | PLANAR, act, ffi.from_buffer(W), slots, rows,
                                                       cols, ffi.cast("int32_t *", ids.ctypes.data), slots,
                                                       ffi.cast("float *", X.ctypes.data),
                                                       ffi.cast("float *", Y.ctypes.data), args.reps, ms, err, 1024)
                    else:
                        Y = np.empty((n, rows), np.float32)
                        rc = lib.ds4_gpu_kernel_matmul(libs[k].encode(), t | PLANAR, act, ffi.from_buffer(W), rows, cols,
                                                       ffi.cast("float *", X.ctypes.data), n,
                                                       ffi.cast("float *", Y.ctypes.data), args.reps, ms, err, 1024)
                    if rc:
                        print(f"{name} ({k}): {ffi.string(err).decode()}", file=sys.stderr)
                        return 1
                    times[k].append(ms[0])
                    ys[k] = Y
            med = {k: float(np.median(v)) for k, v in times.items()}
            same = {k: bool(np.array_equal(ys[names[0]], ys[k])) for k in names[1:]}
            out.append({"weight": name, "type": t, "rows": rows, "cols": cols, "tokens": n, "slots": slots,
                        "act": ["f32", "q8"][act], "ms": times, "median_ms": med, "bit_identical": same})
            print(f"{name:30s} {t:4d} {rows:6d} {cols:5d} {slots or n:3d} {['f32', 'q8'][act]:>3s} "
                  + " ".join(f"{med[k] * 1e3:12.1f}" for k in names) + "  "
                  + " ".join(f"{med[k] / med[names[0]]:9.2f}" + ("" if same[k] else " DIFFERS") for k in names[1:]),
                  flush=True)
        return 0

    for name, t, rows, cols in SHAPES:
        if t not in (8, 10, 16) or "experts as rows" in name or "1 expert" in name or args.only not in name:
            continue
        W = _weights(t, rows, cols, rng, lib)
        for n in (1, 6):
            X = rng.standard_normal((n, cols)).astype(np.float32)
            if run(name, t, rows, cols, n, 0, W, X, None):
                return 1
    for name, t, rows, cols, slots in GATHERS:
        if args.only not in name:
            continue
        W = _weights(t, rows * slots, cols, rng, lib)
        X = rng.standard_normal((slots, cols)).astype(np.float32)
        ids = np.arange(slots, dtype=np.int32)
        if run(name, t, rows, cols, 1, slots, W, X, ids):
            return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.to_json(), "libraries": libs, "rounds": args.rounds, "kernels": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
