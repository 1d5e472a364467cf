"""Side-by-side speed of two source trees of ds4tui: the same `ds4tui bench` run alternately on each.

``python tools/ab_trees.py --a PATH_A --b PATH_B [--pairs 4] [--out FILE.json] -- BENCH_ARGS...``
builds nothing: each tree must already hold its built extension (``python build_native.py`` in it).
Each pair runs ``python -m ds4tui bench BENCH_ARGS --json`` with ``PYTHONPATH`` set to tree A, then to
tree B (A/B/A/B...), and the figures the bench prints (every number in its JSON at the top level, and
those of ``--ab``'s arms and ``--synthetic``'s per-layer table) are reported per tree as the median
and the range, with the ratio B/A of each pair's figures.  Alternating pairs keep a slow spell of a
noisy machine from landing on one side only.  Not a test: CI never runs it.

Example (the CPU engine before and after a change, the medium model, 4 pairs)::

    git worktree add /tmp/base HEAD~3 && (cd /tmp/base && python build_native.py)
    python tools/ab_trees.py --a /tmp/base --b . --pairs 4 -- --medium
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def _flat(d, prefix="") -> dict[str, float]:
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.update(_flat(v, f"{prefix}{i}."))
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        out[prefix[:-1]] = float(d)
    return out


def run_one(tree: Path, args: list[str]) -> dict[str, float]:
    path = os.pathsep.join(p for p in (str(tree.resolve()), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "ds4tui", "bench", *args, "--json"], env=env, capture_output=True,
                       text=True, cwd=str(tree.resolve()))
    if p.returncode != 0:
        raise SystemExit(f"bench failed in {tree} (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return _flat(json.loads(p.stdout))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="tree A (the base)")
    ap.add_argument("--b", type=Path, required=True, help="tree B (the change)")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--keys", default="tokens_per_s,_ms,ratio,speedup",
                    help="comma-separated substrings: report the figures whose name holds one")
    ap.add_argument("--out", type=Path)
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- then the arguments of ds4tui bench")
    a = ap.parse_args(argv)
    bench = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    runs = {"a": [], "b": []}
    for i in range(a.pairs):
        for side, tree in (("a", a.a), ("b", a.b)):
            runs[side].append(run_one(tree, bench))
            print(f"pair {i + 1}/{a.pairs} {side} done", file=sys.stderr)
    # figures every run reported (a list's length may differ between runs, e.g. the scheduler's retimings)
    keys = [k for k in runs["a"][0] if any(s in k for s in a.keys.split(","))
            and all(k in r for r in runs["a"] + runs["b"])]
    rows = {}
    for k in keys:
        va, vb = [r[k] for r in runs["a"]], [r[k] for r in runs["b"]]
        ratios = [y / x for x, y in zip(va, vb) if x]
        rows[k] = {"a_median": statistics.median(va), "a_range": [min(va), max(va)],
                   "b_median": statistics.median(vb), "b_range": [min(vb), max(vb)],
                   "b_over_a_median": statistics.median(ratios) if ratios else None,
                   "b_over_a_range": [min(ratios), max(ratios)] if ratios else None}
    result = {"a": str(a.a), "b": str(a.b), "bench": bench, "pairs": a.pairs, "figures": rows}
    w = max((len(k) for k in rows), default=10)
    print(f"{'figure':{w}s}  {'A median':>10s}  {'B median':>10s}  {'B/A median':>10s}  B/A range")
    for k, r in rows.items():
        ratio = r["b_over_a_median"]
        rng = r["b_over_a_range"]
        print(f"{k:{w}s}  {r['a_median']:10.3f}  {r['b_median']:10.3f}  "
              f"{(f'{ratio:.3f}' if ratio is not None else '-'):>10s}  "
              f"{(f'{rng[0]:.3f}..{rng[1]:.3f}' if rng else '-')}")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
