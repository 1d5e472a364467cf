"""Per-kernel profile of the GPU matmul on DS4 Flash shapes (spec ds4.md §1, §2), with the device's
read bandwidth measured in the same run: for each (weight, GGML type, rows x cols, tokens) the
median kernel time (device events), the weight bytes it reads, the GB/s that implies and the
fraction of the measured bandwidth (the roofline of a weight-bound matvec).

Usage: python tools/gpu_kernel_bench.py [--json OUT.json]   (needs a built GPU library and a device)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    info, why = gpu.probe()
    if why:
        print(f"gpu_kernel_bench: {why}", file=sys.stderr)
        return 1
    from ds4tui._native import ffi, lib

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
        W = rng.integers(0, 256, rows * rb, dtype=np.uint8)
        if t in (8, 10, 16, 1):  # keep f16 scales / values finite: clear each block's exponent top bits
            W = W.reshape(rows, -1)
            if t == 1:
                W[:, 1::2] &= 0x3B
            elif t == 8:
                blocks = W.reshape(rows, -1, 34)
                blocks[:, :, 1] &= 0x3B
            elif t == 10:
                blocks = W.reshape(rows, -1, 84)
                blocks[:, :, 81] &= 0x3B
                blocks[:, :, 83] &= 0x3B
            else:
                blocks = W.reshape(rows, -1, 66)
                blocks[:, :, 1] &= 0x3B
            W = np.ascontiguousarray(W).ravel()
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


if __name__ == "__main__":
    sys.exit(main())
