#!/usr/bin/env bash
# The gpu_graphs option on a GPU machine in one go (spec platform.md §8), within a time budget:
# build; doctor; the graph test of tests/test_gpu_backend.py (logits of decode steps and verify
# passes bit for bit with graphs off and on, f32 and q8); graphs off vs on side by
# side on the same synthetic Flash weights in one process (tools/gpu_graphs_ab.py: decode and
# verify(2, 6) per layer, extrapolated to 43 layers as `bench --synthetic flash --contexts 2048
# --verify-widths 2,6` does, f32 and q8 activations, alternating rounds, plus a bit-for-bit check
# on one engine); then, with the time left, the DSpark-with-graphs test and the other GPU tests.
# Run from the repository root after the wheels are installed (tools/gpu_check.sh says how); logs
# and JSON go to $OUT (default /tmp/gpu-graphs).  BUDGET: seconds for the whole script (default 330); ROUNDS: A/B rounds
# (default 4); ACTS: activations modes (default f32,q8); BENCH=1 also runs `ds4tui bench --synthetic
# flash` with --gpu-graphs on when at least 150 s are left.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-graphs}
BUDGET=${BUDGET:-330}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
left() { local n=$(( BUDGET - ($(date +%s) - t0) )); echo $(( n > 1 ? n : 1 )); }
stamp() { echo "[$1: $(( $(date +%s) - t0 )) s]" | tee -a "$OUT/times.txt"; }
python3 build_native.py 2>&1 | grep -E "build_native|error|warning" | tee "$OUT/build.log"
stamp build
python3 -m ds4tui doctor 2>&1 | tee "$OUT/doctor.txt" | grep -E "gpu graphs|device|gpu backend|built for"
timeout "$(left)" python3 -m pytest -p no:cacheprovider -rs -s -q -m gpu tests/test_gpu_backend.py -k graphs_replay \
    2>&1 | tee "$OUT/pytest_graphs.log" | grep -E "graphs \(|passed|failed|Error|error|assert" | head -40
stamp "graph tests"
timeout "$(left)" python3 tools/gpu_graphs_ab.py --activations "${ACTS:-f32,q8}" --rounds "${ROUNDS:-4}" \
    --ctx 2048 --widths 2,6 --json "$OUT/graphs_ab.json" 2>&1 | tee "$OUT/graphs_ab.log" | grep -v "^  .* round "
stamp "A/B"
if [ "${BENCH:-0}" = 1 ] && [ "$(left)" -ge 150 ]; then
    timeout "$(left)" python3 -m ds4tui bench --synthetic flash --backend hip --contexts 2048 --verify-widths 2,6 \
        --gpu-graphs on --out "$OUT/bench_graphs_on.json" 2>&1 | tee "$OUT/bench_graphs_on.txt" | tail -12
    stamp bench
fi
if [ "$(left)" -ge 20 ]; then  # DSpark with graphs (it fits the support model first), then the rest
    timeout "$(left)" python3 -m pytest -p no:cacheprovider -rs -q -m gpu tests/test_gpu_backend.py -k graphs_keep \
        2>&1 | tee "$OUT/pytest_dspark_graphs.log" | tail -4
    stamp "DSpark graph test"
fi
if [ "$(left)" -ge 20 ]; then
    timeout "$(left)" python3 -m pytest -p no:cacheprovider -rs -q -m gpu tests/test_gpu_backend.py -k "not graphs" \
        2>&1 | tee "$OUT/pytest.log" | tail -15
    stamp "other GPU tests"
fi
