"""Per-kernel table from an Nsight Compute ``--print-summary per-kernel`` log (tools/gpu_profile.py):
kernel, grid, block, launches, mean and total microseconds of gpu__time_duration.sum, sorted by
total time, with the sum over all kernels first.

Usage: python tools/ncu_summary.py NCU_LOG [ROWS] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys

HEAD = re.compile(r"^  (.+?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Device \d+, CC [\d.]+, Invocations (\d+)")
TIME = re.compile(r"\s+gpu__time_duration.sum\s+(ns|us|ms)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3}


def parse(text: str) -> list[dict]:
    """One dict per (kernel, launch shape): name, grid, block, launches, mean_us, total_us."""
    rows, cur = [], None
    for line in text.splitlines():
        m = HEAD.match(line)
        if m:
            cur = {"name": re.sub(r"\(.*", "", m.group(1)), "grid": f"{m.group(2)}x{m.group(3)}x{m.group(4)}",
                   "block": f"{m.group(5)}x{m.group(6)}x{m.group(7)}", "launches": int(m.group(8))}
            continue
        m = TIME.match(line)
        if m and cur:
            mean = float(m.group(4)) * UNIT_US[m.group(1)]
            rows.append({**cur, "mean_us": mean, "total_us": mean * cur["launches"]})
            cur = None
    return sorted(rows, key=lambda r: -r["total_us"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("rows", nargs="?", type=int, default=40)
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args(argv)
    with open(a.log) as f:
        rows = parse(f.read())
    if not rows:
        print(f"ncu_summary: no per-kernel summary in {a.log}", file=sys.stderr)
        return 1
    total = sum(r["total_us"] for r in rows)
    print(f"{len(rows)} kernel shapes, {sum(r['launches'] for r in rows)} launches, {total:.0f} us of kernel time")
    print(f"{'kernel':44s} {'grid':>11s} {'block':>9s} {'n':>3s} {'mean us':>8s} {'total us':>9s} {'share':>6s}")
    for r in rows[:a.rows]:
        print(f"{r['name'][:44]:44s} {r['grid']:>11s} {r['block']:>9s} {r['launches']:3d} {r['mean_us']:8.1f} "
              f"{r['total_us']:9.1f} {r['total_us'] / total:6.1%}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"total_us": total, "kernels": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
