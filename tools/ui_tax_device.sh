#!/bin/bash
# ui_tax side by side on one machine: the app before the streaming work (BEFORE=path of that
# ds4tui tree) against this tree, interleaved, on the GPU engine and on the CPU engine pinned to two
# cores (taskset), so the CPU arm is a quiet two-core machine.  Writes one JSON per run to $OUT.
# Usage (repository root, native library built): BEFORE=/path/to/old/tree tools/ui_tax_device.sh
set -uo pipefail
: "${BEFORE:?BEFORE= the root of the old tree (holding ds4tui/)}"
OUT=${OUT:-/tmp/ui_tax}; mkdir -p "$OUT"
ROUNDS=${ROUNDS:-2}; REPEAT=${REPEAT:-3}; TOKENS=${TOKENS:-384}
cp ds4tui/*.so ds4tui/gpu_build.json "$BEFORE/ds4tui/" 2>/dev/null  # the same engine build; only the Python above it differs
cp ds4tui/devtools/ui_tax.py "$BEFORE/ds4tui/devtools/"
D=$(python3 -c "from ds4tui.demo import demo_pair; print(demo_pair().model.parent)")
for backend in hip cpu; do
  pin=""; threads=0; [ "$backend" = cpu ] && pin="taskset -c 0,1" && threads=2
  for i in $(seq "$ROUNDS"); do
    for arm in before after; do
      root=$PWD; [ "$arm" = before ] && root=$BEFORE
      (cd "$root" && PYTHONPATH=${SITE:-}:$root $pin python3 -m ds4tui.devtools.ui_tax "$D/model.gguf" \
        --mtp "$D/support.gguf" --backend "$backend" --threads $threads --repeat "$REPEAT" --tokens "$TOKENS" \
        --out "$OUT/${backend}_${arm}_$i.json" 2>&1 | grep -v "^run" | sed "s/^/$backend $arm $i: /")
    done
  done
done
