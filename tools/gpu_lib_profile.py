"""Kernel times of several builds of the GPU library, profiled in one process under Nsight Compute.

The synthetic 2-layer DS4 Flash model (``ds4tui.engine.synthetic``, seed 0) is built once; each library
in turn opens an engine on it, fills 2048 tokens and runs a decode and a verify of 1 + 5 rows at each
``--contexts`` value (past 2048 the compressed rows repeat, ``Session.bench_fill``), each inside a
profiler range that a one-thread marker kernel opens; after the first context, 52 tokens past it (past
2048 + 4 the indexer selects), the logits of a verify and a decode are compared bit for bit with the
first library's.  ncu records every launch (``--csv --page raw``); the launches after each marker are
summed per range.  ncu runs the launches one at a time (no overlap of one kernel's tail with the next
one's start) and, with ``--cache-control all`` (its default and this tool's), flushes the caches before
each, so a kernel that in a real pass finds its inputs in L2 (a small pass's activations, the KV rows
a layer just wrote) reads them from memory here.  The sums are larger than a pass's wall time: H100,
2026-12-06, two layers with the head at context 4096, a decode's kernels 952 us against ~0.83 ms of
wall time (1.15x), a verify's 1453 us against ~1.32 ms (1.10x) (``ds4tui bench --dspark-cycle``'s
fixed part plus two layers; tools/gpu_notes.md, "fourth device day"), so their ratio (1.53) is below
the wall's (1.59).  ``--cache-control none`` leaves the caches as the previous launch left them:
closer to a pass, but dependent on the launch order.

    python3 tools/gpu_lib_profile.py base=old/libds4tui_cuda.so new=ds4tui/libds4tui_cuda.so \\
        [--contexts 2048,4096] [--activations q8] [--cache-control all] [--ncu /usr/local/cuda/bin/ncu] \\
        [--out DIR] [--rows 12]

Prints, per library, each range's kernel sum (us) and verify / decode per context, whether its logits
equal the first library's, and the kernels whose sums moved most against the first library, then the
per-library lines again (a device call that returns only the output's tail keeps them); writes
``DIR/ncu.csv`` (ncu's log), ``DIR/regions.json`` (the ranges in order, the bit-for-bit checks) and
``DIR/summary.json``.  The model is built once for every library (one process), where
``tools/gpu_profile.py`` profiles one library a process.  Not part of CI (its parsing is tested in
tests/test_gpu_lib_profile.py); tools/gpu_notes.md records what it printed.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MARKER = "ds4_marker"
#: An empty kernel that opens each profiled range (PTX, loaded through the CUDA driver).
MARKER_PTX = (b".version 7.0\n.target sm_50\n.address_size 64\n"
              b".visible .entry " + MARKER.encode() + b"() { ret; }\n")
NCU_FLAGS = ["--profile-from-start", "off", "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
             "--csv", "--page", "raw"]
UNIT_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
           "second": 1e9}


def split_ranges(text: str) -> list[list[tuple[str, float]]]:
    """The launches of an ncu ``--csv --page raw`` log (one row a launch, ``Kernel Name`` and
    ``gpu__time_duration.sum`` columns, a units row under the header) grouped into ranges, each opened
    by a :data:`MARKER` launch (not included): [[(kernel name without its arguments, ns), ...], ...].
    Launches before the first marker are left out.  ValueError when the log holds no such table, its
    unit is not one of :data:`UNIT_NS` or a launch's time is not a number."""
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in text.splitlines() if ln.startswith('"')))))
    if not rows or "Kernel Name" not in rows[0] or "gpu__time_duration.sum" not in rows[0]:
        raise ValueError("no ncu raw table with the columns Kernel Name and gpu__time_duration.sum "
                         "(run ncu with --csv --page raw --metrics gpu__time_duration.sum)")
    head = rows[0]
    ki, mi = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    body = [r for r in rows[1:] if len(r) == len(head)]
    unit = body[0][mi] if body else ""
    if unit not in UNIT_NS:
        raise ValueError(f"the units row under ncu's header gives gpu__time_duration.sum in {unit!r}; expected one "
                         f"of {', '.join(UNIT_NS)}")
    scale, ranges, cur = UNIT_NS[unit], [], None
    for r in body[1:]:
        value, name = r[mi].replace(",", ""), r[ki]
        try:
            ns = float(value)
        except ValueError:
            raise ValueError(f"launch {r[0]} ({name.split('(')[0]}): gpu__time_duration.sum is {r[mi]!r}, expected a "
                             f"number of {unit}") from None
        if name.startswith(MARKER):
            cur = []
            ranges.append(cur)
        elif cur is not None:
            cur.append((name.split("(")[0].strip(), ns * scale))
    return ranges


def summarise(names: list[str], ranges: list[list[tuple[str, float]]]) -> dict:
    """{range name: {"launches", "total_us", "kernels": {kernel: [launches, us]}}} for the ranges in
    order; ValueError when the counts differ (a run that stopped part-way)."""
    if len(names) != len(ranges):
        raise ValueError(f"{len(ranges)} profiled ranges in the ncu log, {len(names)} named by the run "
                         f"(a run that stopped part-way?)")
    out = {}
    for name, launches in zip(names, ranges):
        kernels: dict[str, list] = {}
        for k, ns in launches:
            e = kernels.setdefault(k, [0, 0.0])
            e[0] += 1
            e[1] += ns / 1e3
        out[name] = {"launches": len(launches), "total_us": sum(ns for _, ns in launches) / 1e3, "kernels": kernels}
    return out


def table(summary: dict, libs: list[str], contexts: list[int], bits: dict, rows: int = 12) -> str:
    """The printed report (module docstring)."""
    lines: list[str] = []
    for lib in libs:
        parts = []
        for c in contexts:
            d, v = summary.get(f"{lib} decode {c}"), summary.get(f"{lib} verify {c}")
            if d and v:
                parts.append(f"ctx {c}: decode {d['total_us']:.1f} us, verify {v['total_us']:.1f} us, "
                             f"verify / decode {v['total_us'] / d['total_us']:.3f}")
        same = bits.get(lib) if lib != libs[0] else None
        tail = ("" if same is None else "; logits bit-identical to " + libs[0] + "'s"
                if same["verify"] and same["decode"] else f"; logits DIFFER from {libs[0]}'s ({same})")
        lines.append(f"{lib}: " + " | ".join(parts) + tail)
    base = libs[0]
    for lib in libs[1:]:
        for c in contexts:
            for kind in ("decode", "verify"):
                a, b = summary.get(f"{base} {kind} {c}"), summary.get(f"{lib} {kind} {c}")
                if not a or not b:
                    continue
                keys = set(a["kernels"]) | set(b["kernels"])
                moved = sorted(keys, key=lambda k: -abs(b["kernels"].get(k, [0, 0.0])[1]
                                                       - a["kernels"].get(k, [0, 0.0])[1]))[:rows]
                lines.append(f"{lib} against {base}, {kind} at {c}: {b['total_us'] - a['total_us']:+.1f} us")
                for k in moved:
                    x, y = a["kernels"].get(k, [0, 0.0]), b["kernels"].get(k, [0, 0.0])
                    if abs(y[1] - x[1]) >= 0.05:
                        lines.append(f"  {k[:64]:64s} {x[0]:3d} {x[1]:8.1f} -> {y[0]:3d} {y[1]:8.1f} "
                                     f"{y[1] - x[1]:+8.1f}")
    if len(lines) > len(libs):  # the totals again last: an output cut to its tail still holds them
        lines += ["totals again:"] + lines[:len(libs)]
    return "\n".join(lines)


def _marker_launcher():
    cuda = ctypes.CDLL("libcuda.so.1")
    state = {}

    def launch() -> None:
        if not state:
            ctx = ctypes.c_void_p()
            if cuda.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
                raise RuntimeError("no current CUDA context for the marker kernel")
            mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
            if cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(MARKER_PTX)) != 0:
                raise RuntimeError("the marker kernel's PTX did not load")
            if cuda.cuModuleGetFunction(ctypes.byref(fn), mod, MARKER.encode()) != 0:
                raise RuntimeError("the marker kernel was not found in its module")
            state["fn"] = fn
        r = cuda.cuLaunchKernel(state["fn"], 1, 1, 1, 1, 1, 1, 0, None, None, None)
        if r != 0 or cuda.cuCtxSynchronize() != 0:
            raise RuntimeError(f"the marker kernel's launch failed (CUDA error {r})")

    return cuda, launch


def child(args) -> int:
    """The profiled run: every library on one model (module docstring); writes the ranges' names and
    the bit-for-bit checks to ``args.regions`` after each library."""
    import numpy as np

    from ds4tui.engine import synthetic
    from ds4tui.engine.session import Engine

    libs = [a.split("=", 1) for a in args.libs]
    cuda, marker = _marker_launcher()
    model = synthetic.SyntheticModel(synthetic.flash_config((4, 128)), seed=0)
    regions, bits, ref = [], {}, None
    for name, lib in libs:
        eng = Engine(model, backend="hip", gpu_library=lib, activations=args.activations)
        try:
            s = eng.session(max(args.contexts) + 64, n_batch=64)
            s.prefill(np.random.default_rng(1).integers(100, 128000, 2048).tolist(), logits="none")
            for i, ctx in enumerate(args.contexts):
                if ctx > s.n_tokens:
                    s.bench_fill(ctx, filler=100)
                s.prefill([5000])  # warm
                s.truncate(ctx)
                for kind, toks, logits in (("decode", [5001], "last"),
                                           ("verify", [5002, 5003, 5004, 5005, 5006, 5007], "all")):
                    cuda.cuProfilerStart()
                    marker()
                    s.prefill(toks, logits=logits)
                    cuda.cuProfilerStop()
                    regions.append(f"{name} {kind} {ctx}")
                    s.truncate(ctx)
                if i == 0:  # past 2048 + 4 tokens the indexer selects: the logits then, against the first library's
                    s.prefill(np.random.default_rng(5).integers(100, 128000, 52).tolist(), logits="none")
                    got = (s.prefill([5, 6, 7, 8, 9, 10], logits="all"), s.prefill([11]))
                    ref = ref or got
                    bits[name] = {"verify": bool(np.array_equal(ref[0], got[0])),
                                  "decode": bool(np.array_equal(ref[1], got[1]))}
                    s.truncate(ctx)
        finally:
            eng.close()
        Path(args.regions).write_text(json.dumps({"regions": regions, "bit_identical": bits}, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs="+", metavar="NAME=LIBRARY", help="GPU libraries, each checked against the first")
    ap.add_argument("--contexts", default="2048,4096",
                    help="contexts of the profiled passes, ascending, the first at least 2048 (default 2048,4096)")
    ap.add_argument("--activations", choices=("f32", "q8"), default="q8", help="the engines' activations (default q8)")
    ap.add_argument("--cache-control", choices=("all", "none"), default="all",
                    help="ncu's --cache-control: all flushes the caches before every launch (default), none "
                         "leaves them as the previous launch did")
    ap.add_argument("--ncu", default=None, help="Nsight Compute's ncu (default: on PATH, else /usr/local/cuda/bin/ncu)")
    ap.add_argument("--out", default="gpu_lib_profile", help="folder for ncu.csv, regions.json, summary.json")
    ap.add_argument("--rows", type=int, default=12, help="kernels listed per comparison (default 12)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--regions", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = []
    for a in args.libs:
        name, _, lib = a.partition("=")
        if not name or not lib:
            ap.error(f"{a!r}: expected NAME=LIBRARY")
        if name in names:
            ap.error(f"{a!r}: the name {name} is given twice (each library needs its own)")
        if not args.child and not Path(lib).is_file():
            ap.error(f"{a!r}: no library file at {lib}")
        names.append(name)
    text = args.contexts
    try:
        args.contexts = [int(c) for c in text.split(",")]
    except ValueError:
        ap.error(f"--contexts {text!r}: expected whole numbers separated by commas")
    if args.contexts != sorted(set(args.contexts)) or args.contexts[0] < 2048:
        ap.error(f"--contexts {text!r}: expected ascending contexts, each once, the first at least 2048")
    if args.rows < 0:
        ap.error(f"--rows {args.rows}: expected 0 or more kernels a comparison")
    if args.child:
        return child(args)
    ncu = args.ncu or shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not (os.path.isfile(ncu) and os.access(ncu, os.X_OK)):
        ap.error(f"--ncu: no Nsight Compute program at {ncu} (give the path of ncu)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        ap.error(f"--out {out}: a file is there, expected a folder (or a path to create one)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for f in ("regions.json", "summary.json", "ncu.csv"):  # nothing of an earlier run passes for this one's
            (out / f).unlink(missing_ok=True)
    except OSError as e:
        ap.error(f"--out {out}: cannot write there ({e.strerror})")
    regions = out / "regions.json"
    cmd = [ncu, *NCU_FLAGS, "--cache-control", args.cache_control, sys.executable, str(Path(__file__).resolve()), *args.libs, "--child",
           "--regions", str(regions), "--contexts", ",".join(map(str, args.contexts)),
           "--activations", args.activations]
    t0 = time.perf_counter()
    try:
        with open(out / "ncu.csv", "w") as log:
            rc = subprocess.run(cmd, stdout=log).returncode
    except OSError as e:
        (out / "ncu.csv").unlink(missing_ok=True)
        print(f"gpu_lib_profile: error: {ncu} did not start ({e.strerror})", file=sys.stderr)
        return 1
    if rc != 0 or not regions.exists():
        print(f"gpu_lib_profile: error: the profiled run failed (exit {rc}); ncu's log: {out / 'ncu.csv'}",
              file=sys.stderr)
        return 1
    done = json.loads(regions.read_text())
    try:
        summary = summarise(done["regions"], split_ranges((out / "ncu.csv").read_text()))
    except ValueError as e:
        print(f"gpu_lib_profile: error: {out / 'ncu.csv'}: {e}", file=sys.stderr)
        return 1
    (out / "summary.json").write_text(json.dumps({"contexts": args.contexts, "cache_control": args.cache_control,
                                                  "bit_identical": done["bit_identical"],
                                                  "ranges": summary}, indent=1))
    print(f"kernel sums under ncu --cache-control {args.cache_control} (us)")
    print(table(summary, names, args.contexts, done["bit_identical"], args.rows))
    print(f"({time.perf_counter() - t0:.0f} s; ncu --cache-control {args.cache_control}; {out / 'summary.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
