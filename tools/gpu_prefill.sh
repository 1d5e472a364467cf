#!/usr/bin/env bash
# The prefill GEMM on a GPU machine in one go (spec platform.md §7): build, doctor, the GPU tests
# of the float32 and prefill_gemm paths, then the synthetic Flash prefill at the lengths given
# (default 2048,8192), prefill_gemm off and bf16 side by side on the same weights.  Run from the
# repository root after the wheels are installed (tools/gpu_check.sh says how); logs and JSON go
# to $OUT (default /tmp/gpu-prefill).  An NVIDIA BLAS from the nvidia-cublas pip package is found
# by ds4tui.engine.gpu itself.  TESTS: the pytest -k selection (default: the prefill GEMM, the
# float32 logits and the DSpark decisions); PROFILE=1 adds an Nsight Compute profile of one
# 2048-token prefill pass on 2 layers under prefill_gemm bf16 (tools/gpu_profile.py).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-prefill}
LENGTHS=${1:-2048,8192}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 build_native.py 2>&1 | grep -E "build_native|error|warning" | tee "$OUT/build.log"
echo "build: $(( $(date +%s) - t0 )) s"
python3 -m ds4tui doctor 2>&1 | tee "$OUT/doctor.txt" | grep -E "gpu blas|prefill gemm|device|gpu backend"
python3 -m pytest -p no:cacheprovider -rs -s -q -m gpu tests/test_gpu_backend.py \
    -k "${TESTS:-prefill_gemm or hip_logits or dspark_decisions}" 2>&1 | tee "$OUT/pytest.log" | grep -E "prefill_gemm|hip vs cpu|greedy|passed|failed|Error|error" | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
python3 -m ds4tui bench --synthetic flash --backend hip --prefill-lengths "$LENGTHS" --prefill-ab \
    --prefill-gemm bf16 --out "$OUT/flash.json" 2>&1 | tee "$OUT/flash.txt" | tail -20
echo "bench: $(( $(date +%s) - t0 )) s"
if [ "${PROFILE:-0}" = 1 ]; then
    timeout 150 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
        --print-summary per-kernel python3 tools/gpu_profile.py --only prefill --prefill 2048 --prefill-gemm bf16 \
        > "$OUT/ncu.log" 2>&1
    python3 tools/ncu_summary.py "$OUT/ncu.log" 25 | tee "$OUT/ncu_summary.txt"
fi
echo "all: $(( $(date +%s) - t0 )) s"
