"""The GPU backend: build and load seam (everywhere), and the HIP engine against the CPU engine
(``@pytest.mark.gpu``: only where a device answers; skipped cleanly otherwise).

What the GPU backend runs today: the whole target pass with its weights, KV and compressor state
in device memory (ds4tui/native/forward.c over ds4tui/native/hip/), and the DSpark drafter's
context projection, stages, HC head and greedy LM / Markov heads.  Quantised rows of a 16-byte
multiple live in the planar device layout (hip/planar.hip).  The GPU kernels keep float32 activations
like the CPU kernels and follow the CPU's operation order wherever a loop accumulates in a fixed
order, so the two backends differ only by float32 summation order inside dot products and norms:

* kernels: ``|Y_gpu - Y_cpu| <= 2e-5 * sum_c |W[r,c] X[t,c]|`` (each side is within the 1e-5
  bound that tests/test_native_kernels.py holds the CPU kernel to against float64), and a
  (row, token) result is bit-identical whatever the batch size (batch invariance);
* logits at every position of a 230-token prompt: the bounds the CPU engine is held to against
  the numpy reference (tests/test_native_engine.py: 1e-4 in transformers numerics; 1e-2 in ds4
  numerics with at most 2 positions beyond it, because a summation-order difference can move an
  FP8/FP4 rounding of a KV or indexer lane by one step);
* greedy continuations and DSpark decisions (scheduler off, so timing plays no part) identical at
  every *decided* position: where the CPU's top-2 logit gap exceeds twice the largest logit
  difference measured between the two backends at that position on the same tokens.  A near tie may resolve either
  way (AMD's expf, log1pf, sin and cos round differently in the last bit from NVIDIA's and the
  CPU's), so the comparison stops at the first position that is not decided; a DSpark cycle whose
  drafts differ must differ where the drafter's own top-2 gap (from the numpy reference) is a near
  tie.

Uploads go through pinned staging buffers (never a copy straight from the GGUF's file-backed
pages); a test uploads from a file-backed map of a GGUF larger than the staging buffers and reads
the device bytes back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ds4tui.engine import gpu
from ds4tui.engine import session as S

ROOT = Path(__file__).resolve().parent.parent


def _device_or_skip():
    info, why = gpu.probe()
    if why:
        pytest.skip(f"no usable GPU: {why}")
    return info


# ---- the seam, on every machine ------------------------------------------------------------------

def test_hip_backend_names_a_missing_library(tiny_q2, tmp_path):
    with pytest.raises(S.BackendUnavailableError, match=r"the GPU backend \(--backend hip\) is unavailable: GPU library .*no such file"):
        S.Engine(tiny_q2["model"], backend="hip", gpu_library=tmp_path / "libds4tui_hip.so")


def test_hip_backend_names_a_library_that_fails_to_load(tiny_q2, tmp_path):
    bad = tmp_path / "libds4tui_hip.so"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(S.BackendUnavailableError, match=r"libds4tui_hip.so' failed to load: "):
        S.Engine(tiny_q2["model"], backend="hip", gpu_library=str(bad))


def test_a_library_without_the_table_is_refused_by_name():
    from ds4tui import _native

    info, why = gpu.probe(_native.__file__)
    assert info is None and "is not a ds4tui GPU backend library: no symbol ds4_gpu_api_v1" in why


def test_auto_falls_back_to_cpu_and_says_why(tiny_q2, tmp_path):
    e = S.Engine(tiny_q2["model"], backend="auto", gpu_library=tmp_path / "missing.so")
    assert e.backend == "cpu"
    assert e.backend_note == f"no usable GPU (the GPU library {tmp_path / 'missing.so'} does not exist): running on the CPU"
    assert e.backend_detail == (f"the GPU backend (--backend hip) is unavailable: GPU library {tmp_path / 'missing.so'}: "
                                f"no such file")
    assert e.memory().device == 0


def test_the_gpu_library_variable_reaches_the_engine_from_the_command_line(tiny_q2, tmp_path, monkeypatch, capsys):
    """DS4TUI_GPU_LIB is read at the command line's edge and passed to the engine (which reads no
    variable), and doctor reports the library it names."""
    from ds4tui.cli import main as cli_main

    missing = tmp_path / "elsewhere.so"
    monkeypatch.setenv("DS4TUI_GPU_LIB", str(missing))
    assert cli_main(["generate", tiny_q2["model"], "-p", "hi", "-n", "2", "--backend", "auto"]) == 0
    assert (f"ds4tui generate: no usable GPU (the GPU library {missing} does not exist): running on the CPU "
            f"(`ds4tui doctor` says why in full)\n") in capsys.readouterr().err
    assert cli_main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["gpu_library"] is None and r["hip_unavailable_reason"] == f"GPU library {missing}: no such file"
    assert {"name": "DS4TUI_GPU_LIB", "value": str(missing)}.items() <= next(
        v for v in r["environment"] if v["name"] == "DS4TUI_GPU_LIB").items()


def test_build_record_reasons(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu, "PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(gpu, "RECORD", tmp_path / "gpu_build.json")
    assert "gpu_build.json is missing" in gpu.locate()[1]
    (tmp_path / "gpu_build.json").write_text(json.dumps({"status": "skipped", "reason": "no GPU toolchain: hipcc or "
                                                         "nvcc not found"}))
    assert gpu.locate() == (None, "the GPU backend was not built: no GPU toolchain: hipcc or nvcc not found")
    (tmp_path / "gpu_build.json").write_text(json.dumps({"status": "failed", "platform": "hip", "reason": "boom"}))
    assert gpu.locate() == (None, "the GPU backend failed to build: boom")


def test_build_refuses_wave64_and_fast_math(monkeypatch):
    sys.path.insert(0, str(ROOT))
    try:
        import build_native as B
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setenv("DS4TUI_HIP_ARCH", "gfx90a")
    with pytest.raises(B.GPUBuildError, match="wave64"):
        B.gpu_arch("hip")
    monkeypatch.setenv("DS4TUI_HIP_ARCH", "gfx1151,gfx1100")
    assert B.gpu_arch("hip") == ["gfx1151", "gfx1100"]
    monkeypatch.delenv("DS4TUI_HIP_ARCH")
    assert B.gpu_arch("hip") == ["gfx1151"] and B.gpu_arch("cuda") == ["sm_90"]
    hip = B.gpu_command("hip", "hipcc", ["gfx1151"], "/tmp/x.so")
    cu = B.gpu_command("cuda", "nvcc", ["sm_90"], "/tmp/x.so")
    assert "--offload-arch=gfx1151" in hip and "-ffp-contract=off" in hip
    assert ["-x", "cu"] == cu[1:3] and "-fmad=false" in cu
    assert not any("fast-math" in a or "fast_math" in a for a in hip + cu)
    monkeypatch.setenv("DS4TUI_GPU", "off")
    rec = B.build_gpu(Path(os.environ.get("TMPDIR", "/tmp")))
    assert rec["status"] == "skipped" and rec["reason"] == "DS4TUI_GPU=off"


@pytest.mark.skipif(not shutil.which("clang++-19") or not Path("/usr/include/hip/hip_runtime.h").exists(),
                    reason="clang-19 and libamdhip64-dev are not installed (.ci/run installs them)")
@pytest.mark.parametrize("src", ["hip/backend.hip", "hip/matmul.hip", "hip/planar.hip", "hip/gemm.hip", "hip/q8.hip", "hip/ops.hip"])
def test_device_code_compiles_for_gfx1151(src, tmp_path):
    """Spec platform.md §1.2: the device code of every HIP source compiles for gfx1151, wave32."""
    out = tmp_path / "k.s"
    r = subprocess.run(["clang++-19", "-x", "hip", "--offload-arch=gfx1151", "--rocm-path=/usr", "-nogpulib",
                        "--cuda-device-only", "-O2", "-ffp-contract=off", "-std=c++17", "-S", "-o", str(out),
                        str(ROOT / "ds4tui" / "native" / src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    asm = out.read_text()
    assert '.amdgcn_target "amdgcn-amd-amdhsa--gfx1151"' in asm and ".amdhsa_wavefront_size32 1" in asm


def test_doctor_reports_without_a_device(capsys):
    from ds4tui.cli import main

    assert main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["native"].startswith("ds4tui-native")
    assert r["auto_backend"] in ("cpu", "hip")
    assert r["hip_available"] == (r["auto_backend"] == "hip")
    if not r["hip_available"]:
        assert r["hip_unavailable_reason"]
    # which build `--backend hip` is: what the library reports, else the build record
    if r["gpu"]:
        assert (r["gpu_backend"]["platform"], r["gpu_backend"]["arch"]) == (r["gpu"]["platform"], r["gpu"]["built_arch"])


@pytest.mark.parametrize("platform, arch, words", [("cuda", "sm_90", "HIP sources, built for CUDA sm_90"),
                                                   ("hip", "gfx1151", "HIP sources, built for ROCm gfx1151")])
def test_doctor_names_the_gpu_build_the_library_reports(platform, arch, words, capsys, monkeypatch, tmp_path):
    """doctor says which build the GPU backend is (nvcc's CUDA build of the HIP sources is not a
    "hip backend"), from the platform and arch the library reports."""
    from ds4tui.cli import main

    lib = tmp_path / f"libds4tui_{platform}.so"
    info = gpu.GPUInfo(library=str(lib), platform=platform, built_arch=arch, runtime_version=1, driver_version=0,
                       n_devices=0, device=0, device_name="", device_arch="", warp_size=0, arch_ok=False,
                       mem_total=0, mem_free=0, blas="none: not looked for")
    monkeypatch.delenv("DS4TUI_GPU_LIB", raising=False)
    monkeypatch.setattr(gpu, "locate", lambda *a: (lib, ""))
    monkeypatch.setattr(gpu, "probe", lambda *a: (info, f"no device: no {platform} device"))
    assert main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["gpu_backend"] == {"flag": "--backend hip", "platform": platform, "arch": arch,
                                "name": f"GPU backend ({words})"} == {**r["gpu_backend"], "name":
                                                                      gpu.gpu_backend_name(platform, arch)}
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert f"gpu backend       {words} (--backend hip): unavailable: no device: no {platform} device\n" in text
    assert not any(line.startswith("hip backend") for line in text.splitlines())


@pytest.mark.parametrize("platform, arch, words", [("cuda", "sm_90", "HIP sources, built for CUDA sm_90"),
                                                   ("hip", "gfx1151", "HIP sources, built for ROCm gfx1151")])
def test_an_unavailable_gpu_backend_is_named_by_its_build_as_doctor_names_it(platform, arch, words, tiny_q2,
                                                                             monkeypatch, tmp_path, capsys):
    """--backend hip's error and --backend auto's note name the GPU backend by the build that did not
    run (on NVIDIA the CUDA build of the HIP sources, not "the HIP backend"), in doctor's words: what
    the library reported, else the build record when the library did not load."""
    from ds4tui.cli import main

    lib = tmp_path / f"libds4tui_{platform}.so"
    info = gpu.GPUInfo(library=str(lib), platform=platform, built_arch=arch, runtime_version=1, driver_version=0,
                       n_devices=0, device=0, device_name="", device_arch="", warp_size=0, arch_ok=False,
                       mem_total=0, mem_free=0, blas="none: not looked for")
    monkeypatch.delenv("DS4TUI_GPU_LIB", raising=False)
    monkeypatch.setattr(gpu, "locate", lambda *a: (lib, ""))
    monkeypatch.setattr(gpu, "probe", lambda *a: (info, f"no device: no {platform} device"))
    why = f"the GPU backend ({words}) is unavailable: no device: no {platform} device"
    with pytest.raises(S.BackendUnavailableError) as exc:
        S.Engine(tiny_q2["model"], backend="hip")
    assert str(exc.value) == why
    e = S.Engine(tiny_q2["model"], backend="auto")
    runtime = {"cuda": "CUDA", "hip": "ROCm"}[platform]
    assert e.backend == "cpu" and e.backend_detail == why  # the whole reason, as --backend hip's error
    assert e.backend_note == f"no usable GPU (no {runtime} driver is loaded): running on the CPU"  # plain words first
    e.close()
    assert main(["doctor", "--json"]) == 0  # the same name as doctor's
    assert f"the {json.loads(capsys.readouterr().out)['gpu_backend']['name']} is unavailable: " in why

    # the library did not load (no info): the build record names the build
    record = gpu.GPUBuild(status="built", platform=platform, arch=arch, library=lib.name)
    monkeypatch.setattr(gpu, "build_record", lambda: record)
    monkeypatch.setattr(gpu, "probe", lambda *a: (None, f"GPU library {lib} failed to load: bad ELF"))
    e = S.Engine(tiny_q2["model"], backend="auto")
    assert e.backend_note == "no usable GPU (the GPU library does not load): running on the CPU"
    assert e.backend_detail == f"the GPU backend ({words}) is unavailable: GPU library {lib} failed to load: bad ELF"
    e.close()
    # ... but not when another library was named: that one is not the build's
    e = S.Engine(tiny_q2["model"], backend="auto", gpu_library=tmp_path / "other.so")
    assert e.backend_note == f"no usable GPU (the GPU library {tmp_path / 'other.so'} does not exist): running on the CPU"
    assert e.backend_detail == (f"the GPU backend (--backend hip) is unavailable: GPU library {lib} failed to load: "
                                f"bad ELF")
    e.close()


def test_the_gpu_library_names_a_missing_driver_as_the_plain_reason_does():
    """The GPU library's own reason (doctor, backend_detail) says "no CUDA driver is loaded" as the
    CPU fallback's plain words do, not "no cuda GPU driver" (a build on a machine without a driver:
    nvcc here, or hipcc without amdgpu)."""
    info, why = gpu.probe()
    if info is None or not info.platform or info.driver_version or info.n_devices:
        pytest.skip(f"needs a built GPU library and no GPU driver: {why or 'a GPU answers'}")
    runtime = {"cuda": "CUDA", "hip": "ROCm"}[info.platform]
    assert gpu.plain_reason(info) == f"no {runtime} driver is loaded"
    assert why.startswith(f"no device: no {runtime} driver is loaded (the runtime says: "), why

def test_the_plain_reason_auto_gives_for_running_on_the_cpu(monkeypatch, tmp_path):
    """The few words ``--backend auto`` leads with when no GPU runs (the whole reason follows in
    backend_detail): what the runtime reported, else what the build record says."""
    from ds4tui.engine.errors import DeviceFaultError, DeviceMemoryError

    def info(**kw):
        base = dict(library="lib.so", platform="cuda", built_arch="sm_90", runtime_version=13000, driver_version=0,
                    n_devices=0, device=0, device_name="", device_arch="", warp_size=0, arch_ok=False, mem_total=0,
                    mem_free=0)
        return gpu.GPUInfo(**{**base, **kw})

    assert gpu.plain_reason(info()) == "no CUDA driver is loaded"  # nvcc's build on a machine without a GPU
    assert gpu.plain_reason(info(driver_version=13000)) == "the CUDA runtime sees no GPU"
    assert gpu.plain_reason(info(platform="hip", driver_version=60000)) == "the ROCm runtime sees no GPU"
    assert gpu.plain_reason(info(driver_version=13000, n_devices=1, device_name="NVIDIA A100", device_arch="sm_80")) \
        == "NVIDIA A100 cannot run this build (built for sm_90)"
    full = info(driver_version=13000, n_devices=1, device_name="NVIDIA H200", device_arch="sm_90", arch_ok=True)
    assert gpu.plain_reason(full, refused=DeviceMemoryError("x", need=2, budget=1, source="runtime")) == \
        "the model does not fit in its memory"
    assert gpu.plain_reason(full, refused=DeviceFaultError("x", returncode=-6)) == "it failed its first pass"
    for status, words in (("skipped", "no GPU backend was built"), ("failed", "the GPU backend failed to build"),
                          ("built", "the GPU library does not load")):
        monkeypatch.setattr(gpu, "build_record", lambda status=status: gpu.GPUBuild(status=status))
        assert gpu.plain_reason(None) == words
    named = tmp_path / "lib.so"
    assert gpu.plain_reason(None, named) == f"the GPU library {named} does not exist"
    named.write_bytes(b"not an ELF file")
    assert gpu.plain_reason(None, named) == f"the GPU library {named} does not load"


# ---- on a device ---------------------------------------------------------------------------------

TYPES = {"F32": 0, "F16": 1, "BF16": 30, "Q8_0": 8, "Q2_K": 10, "IQ2_XXS": 16}


def _weights(type_id: int, rows: int, cols: int, rng) -> np.ndarray:
    """Random but finite weight bytes of a GGML type (quantised by the project's quantisers)."""
    from gguf import GGMLQuantizationType

    from ds4tui.engine.quants import quantize_with_reconstruction

    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if type_id == 0:
        return w.view(np.uint8).reshape(rows, -1)
    if type_id == 1:
        return w.astype(np.float16).view(np.uint8).reshape(rows, -1)
    if type_id == 30:
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    data, _ = quantize_with_reconstruction(w, GGMLQuantizationType(type_id))
    return np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)


PLANAR = 256  # DS4_GPU_PLANAR: the planar device layout of Q8_0 / Q2_K / IQ2_XXS rows
# (type, layout, rows, cols): the GGML layout for every type (Q8_0 rows of 1056 cannot be planar:
# 33 blocks are not a 16-byte multiple), the planar one at each kernel shape class (tiny rows: 32
# warps per row, short: 4 warps, tall: 2 rows per warp, with an odd row count)
MATMUL_CASES = [(t, 0, 67, 2048 if t in (10, 16) else 1056) for t in TYPES.values()] + [
    (t, PLANAR, rows, 1024 if t == 8 else 2048) for t in (8, 10, 16) for rows in (67, 400, 8195)] + [
    (8, 0, 8195, 32), (1, 0, 8200, 96), (0, 0, 8197, 128)] + [  # tall matrices of short rows: a few lanes per row
    (1, 0, 67, 512), (1, 0, 67, 4096), (8, PLANAR, 67, 8192)]  # tiny matrices: 1, 32 and 32 warps a row


def _cpu_matmul(t, W, rows, cols, X):
    from ds4tui._native import ffi, lib

    n = X.shape[0]
    y = np.empty((n, rows), np.float32)
    err = ffi.new("char[1024]")
    assert lib.ds4_kernel_matmul(t, ffi.from_buffer(W), rows, cols, ffi.cast("float *", X.ctypes.data), n,
                                 ffi.cast("float *", y.ctypes.data), 1, err, 1024) == 0, ffi.string(err).decode()
    return y


def _bound(t, W, rows, cols, X):
    """2e-5 * sum_c |W[r, c] X[t, c]|: the dequantised weights from the CPU's own dequantiser."""
    from ds4tui._native import ffi, lib

    Wf = np.empty((rows, cols), np.float32)
    err = ffi.new("char[1024]")
    assert lib.ds4_dequantize(t, ffi.from_buffer(W), ffi.cast("float *", Wf.ctypes.data), rows * cols, err, 1024) == 0
    return 2e-5 * (np.abs(X).astype(np.float64) @ np.abs(Wf).astype(np.float64).T) + 1e-30


@pytest.mark.gpu
@pytest.mark.parametrize("t,layout,rows,cols", MATMUL_CASES,
                         ids=[f"{k}-{'planar' if lay else 'ggml'}-{r}x{c}" for (t, lay, r, c) in MATMUL_CASES
                              for k in [next(n for n, v in TYPES.items() if v == t)]])
def test_gpu_matmul_matches_cpu_kernel(t, layout, rows, cols):
    info = _device_or_skip()
    from ds4tui._native import ffi, lib

    rng = np.random.default_rng(7 + t + rows)
    W = _weights(t, rows, cols, rng)
    err = ffi.new("char[1024]")
    one = {}
    for n in (1, 2, 6, 8, 13):
        X = rng.standard_normal((n, cols)).astype(np.float32)
        if n in (6, 13):
            X[:] = np.resize(X0, (n, cols))  # the same tokens again, in a verify-sized batch and a bigger one
        ycpu = _cpu_matmul(t, W, rows, cols, X)
        ygpu = np.full((n, rows), np.nan, np.float32)
        rc = lib.ds4_gpu_kernel_matmul(info.library.encode(), t | layout, 0, ffi.from_buffer(W), rows, cols,
                                       ffi.cast("float *", X.ctypes.data), n, ffi.cast("float *", ygpu.ctypes.data), 1,
                                       ffi.NULL, err, 1024)
        assert rc == 0, ffi.string(err).decode()
        bound = _bound(t, W, rows, cols, X)
        assert np.all(np.abs(ygpu - ycpu) <= bound), (t, layout, n, float(np.nanmax(np.abs(ygpu - ycpu) / bound)))
        if n == 1:
            X0 = X
        one[n] = (X, ygpu)
    # batch invariance: X0 gives the same bits alone and at every place of a 6-token batch (two warps'
    # tokens of a short pass) and of a 13-token batch (a full group of 8 tokens and a partial one)
    assert all(np.array_equal(one[m][1][i], one[1][1][0]) for m in (6, 13) for i in range(m))


@pytest.mark.gpu
@pytest.mark.parametrize("t,cols", [(8, 1024), (10, 2048), (16, 2048)], ids=["Q8_0", "Q2_K", "IQ2_XXS"])
@pytest.mark.parametrize("layout", [0, PLANAR], ids=["ggml", "planar"])
@pytest.mark.parametrize("act", [0, 1], ids=["f32", "q8"])
def test_gpu_expert_gather_matches_cpu_kernel(t, cols, layout, act):
    """The MoE product: slot s multiplies expert ids[s] (repeats included) by activation row s; under
    q8 activations against the CPU's q8 arithmetic (spec ds4.md §2.9.5)."""
    info = _device_or_skip()
    from ds4tui._native import ffi, lib

    rng = np.random.default_rng(100 + t)
    n_mat, rows, n_slots = 5, 515, 12
    Ws = [_weights(t, rows, cols, rng) for _ in range(n_mat)]
    W = np.ascontiguousarray(np.concatenate(Ws))
    ids = np.array([3, 0, 3, 4, 1, 1, 2, 0, 4, 3, 2, 2], np.int32)
    X = rng.standard_normal((n_slots, cols)).astype(np.float32)
    Y = np.full((n_slots, rows), np.nan, np.float32)
    err = ffi.new("char[1024]")
    rc = lib.ds4_gpu_kernel_gather(info.library.encode(), t | layout, act, ffi.from_buffer(W), n_mat, rows, cols,
                                   ffi.cast("int32_t *", ids.ctypes.data), n_slots, ffi.cast("float *", X.ctypes.data),
                                   ffi.cast("float *", Y.ctypes.data), 1, ffi.NULL, err, 1024)
    assert rc == 0, ffi.string(err).decode()
    for s in range(n_slots):
        if act:
            want, bound = _q8_want_and_bound(t, Ws[ids[s]], rows, cols, X[s:s + 1])
        else:
            want, bound = _cpu_matmul(t, Ws[ids[s]], rows, cols, X[s:s + 1]), _bound(t, Ws[ids[s]], rows, cols, X[s:s + 1])
        assert np.all(np.abs(Y[s].astype(np.float64) - want[0]) <= bound[0]), (t, layout, act, s)
    # the same expert and the same activation give the same bits in any slot
    X2 = np.ascontiguousarray(np.repeat(X[:1], n_slots, axis=0))
    Y2 = np.empty_like(Y)
    same = np.full(n_slots, ids[0], np.int32)
    assert lib.ds4_gpu_kernel_gather(info.library.encode(), t | layout, act, ffi.from_buffer(W), n_mat, rows, cols,
                                     ffi.cast("int32_t *", same.ctypes.data), n_slots,
                                     ffi.cast("float *", X2.ctypes.data), ffi.cast("float *", Y2.ctypes.data),
                                     1, ffi.NULL, err, 1024) == 0
    assert all(np.array_equal(Y2[s], Y[0]) for s in range(n_slots))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [0, PLANAR], ids=["ggml", "planar"])
@pytest.mark.parametrize("act", [0, 1], ids=["f32", "q8"])
def test_gpu_grouped_products_equal_the_gather(layout, act):
    """backend.h version 9, the grouped attention output (spec ds4.md §2.2): token t's group g times
    matrix g equals the expert gather with ids[t * groups + g] = g bit for bit, for a pass of 1, 6
    (a verify), 8 and 9 tokens, within the CPU kernel's bound of the oracle, and a token's rows do not
    depend on the tokens beside it."""
    info = _device_or_skip()
    from ds4tui._native import ffi, lib

    t, groups, rows, cols = 8, 8, 96, 512  # Q8_0, as the DS4 grouped output
    rng = np.random.default_rng(7)
    Ws = [_weights(t, rows, cols, rng) for _ in range(groups)]
    W = np.ascontiguousarray(np.concatenate(Ws))
    X0 = rng.standard_normal((groups, cols)).astype(np.float32)
    err = ffi.new("char[1024]")
    first = None
    for n in (1, 6, 8, 9):
        X = np.ascontiguousarray(np.concatenate([X0, rng.standard_normal(((n - 1) * groups, cols)).astype(np.float32)]))
        Y = np.full((n * groups, rows), np.nan, np.float32)
        rc = lib.ds4_gpu_kernel_grouped(info.library.encode(), t | layout, act, ffi.from_buffer(W), groups, rows, cols,
                                        n, ffi.cast("float *", X.ctypes.data), ffi.cast("float *", Y.ctypes.data), err,
                                        1024)
        assert rc == 0, ffi.string(err).decode()
        ids = np.tile(np.arange(groups, dtype=np.int32), n)
        Yg = np.full_like(Y, np.nan)
        rc = lib.ds4_gpu_kernel_gather(info.library.encode(), t | layout, act, ffi.from_buffer(W), groups, rows, cols,
                                       ffi.cast("int32_t *", ids.ctypes.data), n * groups,
                                       ffi.cast("float *", X.ctypes.data), ffi.cast("float *", Yg.ctypes.data), 1,
                                       ffi.NULL, err, 1024)
        assert rc == 0, ffi.string(err).decode()
        assert np.array_equal(Y, Yg), (layout, act, n)
        for s in range(n * groups):
            g = s % groups
            if act:
                want, bound = _q8_want_and_bound(t, Ws[g], rows, cols, X[s:s + 1])
            else:
                want, bound = _cpu_matmul(t, Ws[g], rows, cols, X[s:s + 1]), _bound(t, Ws[g], rows, cols, X[s:s + 1])
            assert np.all(np.abs(Y[s].astype(np.float64) - want[0]) <= bound[0]), (layout, act, n, s)
        if first is None:
            first = Y[:groups].copy()
        assert np.array_equal(Y[:groups], first), (layout, act, n)


def _q8_want_and_bound(t, W, rows, cols, X):
    """The CPU engine's q8 product (numpy's bit-exact simulation, spec ds4.md §2.9.5) and the bound a
    GPU q8 result keeps from it: both sum the same exactly-rounded block products (Q2_K: the GPU
    rounds each 16-wide half on its own) in different float32 orders, so each is within
    (n_blocks + 2) * 2^-24 of the sum of the products' magnitudes from the exact sum."""
    from gguf import GGMLQuantizationType as Q

    from ds4tui.engine import quants as QN

    qt = Q(t)
    want = QN.matmul_q8(W, qt, rows, cols, X)
    w, s, m, mn = QN._q8_weight_blocks(W, qt, rows, cols)
    qx, dx = QN.quantize_q8_act(X)
    q = qx.astype(np.int64).reshape(X.shape[0], -1, 32)
    wabs = np.abs(w).astype(np.float64)
    mag = np.einsum("rbj,tbj->trb", wabs, np.abs(q).astype(np.float64)) * np.abs(s[None] * dx[:, None, :])
    if m is not None:
        bs = np.abs(q.reshape(X.shape[0], -1, 2, 16)).sum(-1).astype(np.float64)
        mag = mag + np.einsum("rbh,tbh->trb", mn.astype(np.float64), bs) * np.abs(m[None] * dx[:, None, :])
    nb = cols // 32
    return want, 2 * (nb + 2) * 2.0 ** -24 * mag.sum(-1) + 1e-30


# q8 kernels (hip/q8.hip) at each shape class of the planar layout: one warp per row group (tall,
# and rows too short for more warps), 2 and 4 warps per row; 8192 columns stage a pass of 2-8 tokens
# in one grid row (over 48 KB of shared memory on NVIDIA) and 4 tokens per grid row beyond; and the
# GGML layout (one row per warp, Q8_0 rows of 33 blocks)
# planar Q8_0 at 2048 and 4096 columns: warp groups of 2 and 4 warps a row, 4 rows a group at several
# tokens (rows not a multiple of 4: the last group's rows past the end)
Q8_CASES = [(8, PLANAR, 67, 1024), (8, PLANAR, 400, 4096), (8, PLANAR, 8195, 1024), (8, PLANAR, 300, 8192),
            (8, PLANAR, 402, 2048), (8, PLANAR, 401, 4096),
            (10, PLANAR, 67, 2048), (10, PLANAR, 400, 4096), (10, PLANAR, 8195, 2048), (16, PLANAR, 67, 2048),
            (16, PLANAR, 400, 8192), (16, PLANAR, 8195, 4096), (8, 0, 67, 1056), (10, 0, 400, 2048),
            (16, 0, 300, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("t,layout,rows,cols", Q8_CASES,
                         ids=[f"{next(n for n, v in TYPES.items() if v == t)}-{'planar' if lay else 'ggml'}-{r}x{c}"
                              for (t, lay, r, c) in Q8_CASES])
def test_gpu_q8_matmul_matches_the_cpu_arithmetic(t, layout, rows, cols):
    """Spec ds4.md §2.9.5: the device's q8 product equals the CPU engine's (numpy's exact simulation)
    up to the float32 order of the block products, and a token's row does not depend on the batch."""
    info = _device_or_skip()
    from ds4tui._native import ffi, lib

    rng = np.random.default_rng(31 + t + rows + cols)
    W = _weights(t, rows, cols, rng)
    err = ffi.new("char[1024]")
    one = {}
    for n in (1, 2, 6, 8, 13):
        X = rng.standard_normal((n, cols)).astype(np.float32)
        X[:, :32] = 0.0  # a block of zeros: d = 0, codes 0
        if n in (6, 13):  # the first token again, in a verify-sized batch and a bigger one
            X[:] = np.resize(X0, (n, cols))
        ygpu = np.full((n, rows), np.nan, np.float32)
        rc = lib.ds4_gpu_kernel_matmul(info.library.encode(), t | layout, 1, ffi.from_buffer(W), rows, cols,
                                       ffi.cast("float *", X.ctypes.data), n, ffi.cast("float *", ygpu.ctypes.data), 1,
                                       ffi.NULL, err, 1024)
        assert rc == 0, ffi.string(err).decode()
        want, bound = _q8_want_and_bound(t, W, rows, cols, X)
        assert np.all(np.abs(ygpu.astype(np.float64) - want) <= bound), \
            (t, n, float(np.nanmax(np.abs(ygpu - want) / bound)))
        if n == 1:
            X0 = X
            yf32 = _cpu_matmul(t, W, rows, cols, X)
            assert not np.array_equal(ygpu, yf32)  # the option changes the arithmetic
        one[n] = ygpu
    assert all(np.array_equal(one[m][i], one[1][0]) for m in (6, 13) for i in range(m))


def _indexer_inputs(scores: np.ndarray, signs: list[float]):
    """Indexer inputs whose score for key c is exactly sign * scores[c] (spec ds4.md §2.5): two heads
    of two lanes, q_0 = (1, 0), q_1 = (0, 1), head weights (sign, -sign), scale 1, and key c =
    (v, 0) for v >= 0, (0, -v) for v < 0, so one head adds sign * v and the other adds a zero."""
    keys = np.zeros((scores.size, 2), np.float32)
    keys[:, 0] = np.where(scores >= 0, scores, 0)
    keys[:, 1] = np.where(scores < 0, -scores, 0)
    n = len(signs)
    qi = np.ascontiguousarray(np.tile(np.eye(2, dtype=np.float32), (n, 1, 1)))
    iw = np.array([[s, -s] for s in signs], np.float32)
    return qi, iw, keys


def _gpu_indexer(info, qi, iw, keys, p0, ratio, top_k):
    from ds4tui._native import ffi, lib

    n = iw.shape[0]
    sel = np.full((n, top_k), -7, np.int32)
    nsel = np.full(n, -7, np.int32)
    keys = np.ascontiguousarray(keys[:(p0 + n) // ratio])
    err = ffi.new("char[1024]")
    rc = lib.ds4_gpu_kernel_indexer(info.library.encode(), ffi.cast("float *", qi.ctypes.data),
                                    ffi.cast("float *", iw.ctypes.data), n, p0, 2, 2,
                                    ffi.cast("float *", keys.ctypes.data), ratio, top_k, 1.0,
                                    ffi.cast("int32_t *", sel.ctypes.data), ffi.cast("int32_t *", nsel.ctypes.data),
                                    err, 1024)
    assert rc == 0, ffi.string(err).decode()
    return sel, nsel


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ties", "all-equal", "distinct"])
@pytest.mark.parametrize("top_k", [512, 2048])
def test_gpu_indexer_top_k_matches_a_sort(kind, top_k):
    """The device top-k (spec ds4.md §2.5: highest scores, lowest index on ties, written in ascending
    index order) against a plain sort, at 40000 visible rows: each of three tokens sees its own
    causal prefix ((p0 + t + 1) / 4 rows), one token ranks the negated scores, and every token's
    selection is the same alone as inside the batch."""
    info = _device_or_skip()
    rng = np.random.default_rng(19 + top_k)
    ratio, n_keys = 4, 40000
    if kind == "ties":  # 60 levels, negatives and zeros included: the boundary falls inside a level
        scores = (rng.integers(-20, 40, n_keys) / 8).astype(np.float32)
    elif kind == "all-equal":
        scores = np.zeros(n_keys, np.float32)
    else:
        scores = rng.standard_normal(n_keys).astype(np.float32)
    signs = [1.0, 2.0, -1.0]
    qi, iw, keys = _indexer_inputs(scores, signs)
    n = len(signs)
    p0 = ratio * n_keys - n
    sel, nsel = _gpu_indexer(info, qi, iw, keys, p0, ratio, top_k)
    assert list(nsel) == [top_k] * n
    for t, sign in enumerate(signs):
        n_vis = (p0 + t + 1) // ratio
        s = (sign * scores[:n_vis]).astype(np.float32)
        want = np.sort(np.lexsort((np.arange(n_vis), -s))[:top_k])
        assert np.array_equal(sel[t], want), (kind, t, int(np.sum(sel[t] != want)))
        alone, nalone = _gpu_indexer(info, qi[t:t + 1], iw[t:t + 1], keys, p0 + t, ratio, top_k)
        assert nalone[0] == top_k and np.array_equal(alone[0], sel[t])
    # a token with no more than top_k visible rows attends to all of them
    _, few = _gpu_indexer(info, qi[:1], iw[:1], keys, ratio * top_k - 1, ratio, top_k)
    assert few[0] == -1


@pytest.mark.gpu
def test_planar_layout_refuses_rows_it_cannot_take():
    info = _device_or_skip()
    from ds4tui._native import ffi, lib

    W = _weights(8, 4, 1056, np.random.default_rng(0))  # 33 Q8_0 blocks: 1122-byte rows
    X = np.ones((1, 1056), np.float32)
    Y = np.empty((1, 4), np.float32)
    err = ffi.new("char[1024]")
    rc = lib.ds4_gpu_kernel_matmul(info.library.encode(), 8 | PLANAR, 0, ffi.from_buffer(W), 4, 1056,
                                   ffi.cast("float *", X.ctypes.data), 1, ffi.cast("float *", Y.ctypes.data), 1,
                                   ffi.NULL, err, 1024)
    assert rc != 0 and "cannot take the planar layout (rows of 1122 bytes)" in ffi.string(err).decode()


def _planar_q8_0(rows: np.ndarray) -> np.ndarray:
    """Q8_0 rows (34-byte blocks: f16 d, 32 int8 codes) in the planar device layout: every
    block's codes, then every block's d (hip/planar.hip)."""
    b = rows.reshape(rows.shape[0], -1, 34)
    return np.concatenate([b[:, :, 2:].reshape(rows.shape[0], -1), b[:, :, :2].reshape(rows.shape[0], -1)], axis=1)


@pytest.mark.gpu
def test_uploads_from_a_file_backed_gguf_map_arrive_intact(tmp_path):
    """The engine uploads from the GGUF's memory map; every upload goes through the pinned staging
    buffers (two of 32 MiB), in pieces.  A 104 MiB Q8_0 matrix (four staging pieces, two planar
    repack chunks) and a 40 MiB vector, read from a file-backed map, arrive byte for byte."""
    info = _device_or_skip()
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader, GGUFWriter

    from ds4tui._native import ffi, lib
    from ds4tui.engine.synthetic import random_tensor

    rows, cols = 6000, 16384
    rng = np.random.default_rng(5)
    q = random_tensor(rng, T.Q8_0, (rows, cols), "w").reshape(rows, -1)
    v = rng.standard_normal(10_000_000).astype(np.float32)
    path = tmp_path / "multi.gguf"
    w = GGUFWriter(str(path), arch="ds4tui-upload-test")
    w.add_tensor("w", q, raw_dtype=T.Q8_0)
    w.add_tensor("v", v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = GGUFReader(str(path))
    mapped = {t.name: np.asarray(t.data) for t in r.tensors}
    assert all(isinstance(a.base, np.memmap) or isinstance(a, np.memmap) for a in mapped.values())
    W = mapped["w"].reshape(rows, -1)
    assert W.nbytes == 6000 * 17408 and np.array_equal(W, q)
    err = ffi.new("char[1024]")
    layout = ffi.new("int32_t *")
    for t, want, want_layout in ((8, q, 8), (8 | PLANAR, _planar_q8_0(q), 8 | PLANAR)):
        out = np.zeros_like(q)
        rc = lib.ds4_gpu_kernel_upload(info.library.encode(), t, ffi.from_buffer(W), rows, cols,
                                       ffi.from_buffer(out), layout, err, 1024)
        assert rc == 0, ffi.string(err).decode()
        assert layout[0] == want_layout and np.array_equal(out, want), (t, layout[0])
    V = mapped["v"].view(np.uint8)
    out = np.zeros_like(V)
    rc = lib.ds4_gpu_kernel_upload(info.library.encode(), lib.DS4_GPU_UPLOAD_BYTES, ffi.from_buffer(V), 1, V.size,
                                   ffi.from_buffer(out), layout, err, 1024)
    assert rc == 0, ffi.string(err).decode()
    assert np.array_equal(out.view(np.float32), v)


@pytest.mark.gpu
def test_the_first_device_pass_in_a_child_passes_on_a_working_device(tiny_q2):
    """The guard AMD engines run before they upload (ds4tui/engine/device_check.py), run here on
    this device: the child opens a synthetic model of the test model's widths, prefills, decodes
    and verifies, and exits 0; then at DS4 Flash's widths (3 layers, 16 experts), timed."""
    import time

    from ds4tui.engine import device_check
    from ds4tui.engine.gguf_model import DS4Model
    from ds4tui.engine.synthetic import flash_config

    info = _device_or_skip()
    assert device_check.guard(info.library, DS4Model(tiny_q2["model"]).config, force=True) is None
    flash = flash_config((0, 0) + (4, 128) * 20 + (4,), n_hash_layer=3)
    cut = device_check.check_config(flash)
    assert (cut.n_layer, cut.compress_ratios, cut.n_expert, cut.n_hash_layer) == (3, (0, 4, 128), 16, 0)
    t0 = time.monotonic()
    assert device_check.guard(info.library, flash, force=True) is None
    print(f"\nfirst device pass in a child at Flash widths: {time.monotonic() - t0:.1f} s")


N_PROMPT = 230
TOL = {"transformers": 1e-4, "ds4": 1e-2}
MAX_FLIPS = {"transformers": 0, "ds4": 2}


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return np.random.default_rng(11).integers(0, 129280, N_PROMPT).tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("numerics", ["ds4", "transformers"])
def test_hip_logits_and_greedy_match_cpu(tiny_q2, prompt, numerics):
    _device_or_skip()
    progress = []
    hip = S.Engine(tiny_q2["model"], backend="hip", numerics=numerics, progress=lambda d, t: progress.append((d, t)),
                   prefill_gemm="off")  # the float32 kernels; the prefill GEMM has its own bounds (below)
    cpu = S.Engine(tiny_q2["model"], backend="cpu", numerics=numerics)
    assert hip.backend == "hip" and hip.memory().device > 0
    assert progress and progress[-1][0] == progress[-1][1] > 0 and progress[0][0] == 0
    got = hip.session(1024, n_batch=64).prefill(prompt, logits="all")
    want = cpu.session(1024, n_batch=64).prefill(prompt, logits="all")
    err = np.abs(got - want).max(axis=1)
    print(f"\n{numerics}: hip vs cpu logits over {N_PROMPT} positions: max {err.max():.3g}, median "
          f"{np.median(err):.3g}, positions > {TOL[numerics]}: {int((err > TOL[numerics]).sum())}")
    assert int((err > TOL[numerics]).sum()) <= MAX_FLIPS[numerics]
    assert np.median(err) < TOL[numerics] / 10
    # one token per pass on the device is bit-identical to the chunked prefill (batch invariance;
    # attention runs one head per block there and 4 heads per block in the 64-row chunks)
    lc, g_cpu = _one_token_passes_and_greedy(hip, cpu, prompt, got, numerics)
    assert np.argmax(lc, axis=1).tolist() == g_cpu  # the CPU's greedy tokens are its own argmax


def _one_token_passes_and_greedy(hip, cpu, prompt, got, label):
    """The checks both engine tests share: one token per pass on the device equals its chunked
    prefill ``got`` bit for bit (verify = decode), and 64 greedy tokens agree with the CPU engine's
    up to the first near tie.  Returns the CPU's teacher-forced logits and its greedy tokens."""
    s1 = hip.session(1024, n_batch=64)
    rows = np.stack([s1.prefill([t]) for t in prompt[:40]])
    assert np.array_equal(rows, got[:40])
    g_hip = list(hip.session(1024, n_batch=64).generate(prompt, max_tokens=64))
    g_cpu = list(cpu.session(1024, n_batch=64).generate(prompt, max_tokens=64))
    lc, lh = _teacher_forced(cpu, hip, prompt, g_cpu)
    n, diff = _decided_prefix(lc, lh)
    print(f"{label}: greedy 64 tokens: logits differ by at most {diff:.3g} at the generated positions; "
          f"{n} decided positions before the first near tie; identical: {g_hip == g_cpu}")
    assert g_hip[:n] == g_cpu[:n]
    return lc, g_cpu


@pytest.mark.gpu
def test_hip_q8_activations_follow_the_cpu_q8_engine(tiny_q2, prompt):
    """Spec ds4.md §2.9.5: the device's q8 products are the CPU's q8 arithmetic up to float32 order
    (the kernel tests above), but the quantiser turns an order-sized difference at a rounding edge
    into a whole code, and downstream into q8's own noise: so the device's q8 logits must be as close
    to the CPU's q8 logits as those are to float32, within the spec's q8 bound; one token per pass
    equals the chunked prefill bit for bit (verify = decode); greedy tokens agree where decided."""
    _device_or_skip()
    hip = S.Engine(tiny_q2["model"], backend="hip", activations="q8", prefill_gemm="off")
    cpu = S.Engine(tiny_q2["model"], backend="cpu", activations="q8")
    cpu32 = S.Engine(tiny_q2["model"], backend="cpu")
    got = hip.session(1024, n_batch=64).prefill(prompt, logits="all")
    want = cpu.session(1024, n_batch=64).prefill(prompt, logits="all")
    f32 = cpu32.session(1024, n_batch=64).prefill(prompt, logits="all")
    err = np.abs(got - want).max(axis=1)
    noise = np.abs(want - f32).max(axis=1)
    print(f"\nq8: hip vs cpu logits over {N_PROMPT} positions: max {err.max():.3g}, median {np.median(err):.3g}; "
          f"cpu q8 vs cpu f32: max {noise.max():.3g}, median {np.median(noise):.3g}")
    assert np.median(err) <= np.median(noise) and err.max() < 1.0
    _one_token_passes_and_greedy(hip, cpu, prompt, got, "q8")


@pytest.mark.gpu
def test_hip_passes_longer_than_a_tile_equal_short_chunks(tiny_q2):
    """Attention, the indexer and the LM head in 256-row tiles on the device (spec ds4.md §2.8):
    one 600-token pass of the float32 kernels equals 64-token chunks bit for bit (the logits come
    back one tile at a time, the scratch holds one tile)."""
    _device_or_skip()
    long_prompt = np.random.default_rng(12).integers(0, 129280, 600).tolist()
    hip = S.Engine(tiny_q2["model"], backend="hip", numerics="transformers", prefill_gemm="off")
    try:
        one = hip.session(1024, n_batch=600).prefill(long_prompt, logits="all")
        chunked = hip.session(1024, n_batch=64).prefill(long_prompt, logits="all")
        assert one.shape == (600, 129280) and np.array_equal(one, chunked)
    finally:
        hip.close()


@pytest.mark.gpu
@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_hip_short_pass_rows_equal_one_token_passes(tiny_q2, activations):
    """A 6-row pass (a DSpark verify: its attention's value sums at 4 heads a block, the keys' rows and
    probabilities staged 512 at a time) equals six one-token passes (value sums at one head a block,
    nothing staged) bit for bit, at a context where the HCA layers attend 16 window rows and 605-606
    compressed rows, i.e. across two staged chunks (spec platform.md §10.2); and the first six rows of
    a 9-row pass from the same state (past ATT_SCORE_MAX_ROWS: the one-kernel attend_kernel, scores
    included, which the short passes share at every row count) equal them too.  The tiny model's
    head_dim (128) takes the kernels' partial-width instances; the full-width ones (D = 512) are
    checked by tools/gpu_lib_profile.py's bit-for-bit comparison on the synthetic Flash layers.  q8:
    the same with the 8-bit activations' products, whose rows are also batch-invariant."""
    _device_or_skip()
    ids = np.random.default_rng(21).integers(0, 129280, 9700).tolist()
    hip = S.Engine(tiny_q2["model"], backend="hip", activations=activations, prefill_gemm="off")
    try:
        a, b = hip.session(10240, n_batch=512), hip.session(10240, n_batch=512)
        a.prefill(ids[:9690])
        b.prefill(ids[:9690])
        rows = a.prefill(ids[9690:9696], logits="all")
        ones = np.stack([b.prefill([t], logits="last") for t in ids[9690:9696]])
        assert rows.shape == ones.shape == (6, 129280) and np.array_equal(rows, ones)
        a.truncate(9690)
        nine = a.prefill(ids[9690:9699], logits="all")
        assert nine.shape == (9, 129280) and np.array_equal(nine[:6], rows)
    finally:
        hip.close()


@pytest.mark.gpu
def test_hip_long_context_greedy_matches_cpu(tiny_q2):
    """A 16K-token prompt (the indexer selects from 4096 compressed rows, the HCA layers attend
    1024): the device's logits after the prefill equal the CPU engine's within the float32 bound,
    and over 32 greedy steps, teacher-forced with the CPU's tokens, the device picks the CPU's token
    at every position that a near tie does not leave open (so its greedy continuation is the CPU's
    as far as both are decided)."""
    _device_or_skip()
    n_prompt, n_gen = 16384, 32
    long_prompt = np.random.default_rng(16).integers(0, 129280, n_prompt).tolist()
    hip = S.Engine(tiny_q2["model"], backend="hip", numerics="transformers", prefill_gemm="off")
    cpu = S.Engine(tiny_q2["model"], backend="cpu", numerics="transformers")
    try:
        sh, sc = hip.session(n_prompt + n_gen + 8), cpu.session(n_prompt + n_gen + 8)
        lh, lc = [sh.prefill(long_prompt)], [sc.prefill(long_prompt)]
        first = float(np.abs(lh[0] - lc[0]).max())
        for _ in range(n_gen - 1):
            t = int(np.argmax(lc[-1]))  # the CPU's greedy token, fed to both
            lh.append(sh.prefill([t]))
            lc.append(sc.prefill([t]))
        lh, lc = np.stack(lh), np.stack(lc)
        diffs = np.abs(lh - lc).max(axis=1)
        decided = [_gap(r) > 2 * float(d) for r, d in zip(lc, diffs)]
        agree = [int(np.argmax(h)) == int(np.argmax(c)) for h, c, ok in zip(lh, lc, decided) if ok]
        print(f"\n16K prompt: logits after the prefill differ by {first:.3g}; over {n_gen} steps at most "
              f"{diffs.max():.3g}; {sum(decided)} decided positions, argmax equal at {sum(agree)}")
        assert first < 10 * TOL["transformers"]
        assert sum(decided) >= n_gen // 2 and all(agree)
    finally:
        hip.close()
        cpu.close()


def _graph_passes(engine, prompt):
    """Logits of one fixed sequence of short passes: a 24-row prefill (plain: above the graphs' 17
    rows), one-token decode steps across compressor windows (ratio 4 and 16) and past the indexer's
    start (position 36 on the tiny model: 8 x 4 rows), verify passes of 2..6 rows (every row's
    logits, rolled back) before and after it, and a pass without logits."""
    s = engine.session(256, n_batch=64)
    out = [s.prefill(prompt[:24], logits="all")]
    k = 24
    for _ in range(6):
        out.append(s.prefill([prompt[k]]))
        k += 1
    for w in range(2, 7):
        base = s.n_tokens
        out.append(s.prefill(prompt[k:k + w], logits="all"))
        s.truncate(base)
    for _ in range(20):
        out.append(s.prefill([prompt[k]]))
        k += 1
    for w in (2, 6, 17):
        base = s.n_tokens
        out.append(s.prefill(prompt[k:k + w], logits="all"))
        s.truncate(base)
    s.prefill(prompt[k:k + 3], logits="none")
    k += 3
    for _ in range(3):
        out.append(s.prefill([prompt[k]]))
        k += 1
    s.close()
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_hip_graphs_replay_the_plain_passes_bit_for_bit(tiny_q2, activations):
    """The gpu_graphs option (spec platform.md §8): decode steps and verify passes replayed from
    graphs give the plain launches' logits bit for bit, in both activations, at every position
    (windows closing or not, the indexer off then on), and the option stays on (no capture
    refused)."""
    _device_or_skip()
    prompt = np.random.default_rng(19).integers(100, 128000, 120).tolist()
    e = S.Engine(tiny_q2["model"], backend="hip", activations=activations, prefill_gemm="off", gpu_graphs="off")
    try:
        got = {"off": _graph_passes(e, prompt)}
        e.set_gpu_graphs("on")  # the same engine and weights, switched between passes
        got["on"] = _graph_passes(e, prompt)
        assert e.gpu_graphs == "on", e.gpu_graphs_note
        print(f"\ngraphs ({activations}): {e.gpu_graphs_note}")
        m = re.search(r"; (\d+) graphs captured, (\d+) passes replayed$", e.gpu_graphs_note)
        assert m and int(m[2]) > 2 * int(m[1]) > 0  # the shapes repeat: most passes are replays
    finally:
        e.close()
    assert len(got["on"]) == len(got["off"])
    for i, (a, b) in enumerate(zip(got["off"], got["on"])):
        assert a.shape == b.shape and np.array_equal(a, b), f"pass {i}: max diff {np.abs(a - b).max():.3g}"


@pytest.mark.gpu
def test_hip_graphs_keep_dspark_decisions(tiny_q2, fitted_support):
    """DSpark with the capture rows written inside the graphs (spec platform.md §8, dspark.md §2.2):
    greedy tokens, each step's emitted tokens and drafts, and the counters equal the plain
    launches' (scheduler off)."""
    _device_or_skip()
    prompt = np.random.default_rng(20).integers(100, 128000, 41).tolist()
    runs = {}
    for mode in ("off", "on"):
        e = S.Engine(tiny_q2["model"], backend="hip", support=fitted_support, prefill_gemm="off", gpu_graphs=mode)
        try:
            assert e.support_status == "attached", e.support_message
            runs[mode] = _dspark_run(e, prompt, 80)
            assert e.gpu_graphs == mode, e.gpu_graphs_note
        finally:
            e.close()
    (t0, s0, st0), (t1, s1, st1) = runs["off"], runs["on"]
    assert t0 == t1 and s0 == s1
    for k in ("cycles", "proposed", "accepted_draft", "full", "partial", "miss_first", "no_draft", "draft_len_hist",
              "accepted_len_hist", "pos_proposed", "pos_accepted"):
        assert getattr(st0, k) == getattr(st1, k), k
    assert st1.proposed > 0


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", ["off", "on"])
def test_hip_greedy_picks_on_the_device_are_the_host_argmax(tiny_q2, fitted_support, graphs):
    """Spec platform.md §9: greedy decode steps and DSpark verify passes take their argmax on the
    device and bring back only the ids.  Oracles: the same engine's host path (temperature 1 with
    top-k 1 copies the logits row and draws its first maximum on the host), and the first maximum of
    each teacher-forced logits row (one prefill of the emitted tokens: the passes are batch
    invariant); greedy DSpark emits exactly the target-only tokens."""
    from ds4tui.engine.backend import SamplingParams

    _device_or_skip()
    prompt = np.random.default_rng(23).integers(100, 128000, 37).tolist()
    e = S.Engine(tiny_q2["model"], backend="hip", support=fitted_support, prefill_gemm="off", gpu_graphs=graphs)
    try:
        n = 64
        plain = e.session(len(prompt) + n + 8)
        plain.set_dspark(enabled=False)
        greedy = list(plain.generate(prompt, max_tokens=n))
        host = e.session(len(prompt) + n + 8)
        host.set_dspark(enabled=False)
        host.set_sampling(SamplingParams(temperature=1.0, top_k=1, seed=5))
        assert list(host.generate(prompt, max_tokens=n)) == greedy
        spec, steps, st = _dspark_run(e, prompt, n)
        assert spec == greedy and st.accepted_draft > 0 and st.proposed > st.accepted_draft
        seq = list(prompt) + greedy[:-1]
        rows = e.session(len(seq) + 8, n_batch=64).prefill(seq, logits="all")[len(prompt) - 1:]
        assert np.isfinite(rows).all()
        assert np.argmax(rows, axis=1).tolist() == greedy  # numpy's argmax is the first maximum too
        assert e.gpu_graphs == graphs, e.gpu_graphs_note
    finally:
        e.close()
    target = S.Engine(tiny_q2["model"], backend="hip", prefill_gemm="off", gpu_graphs=graphs)  # no drafter
    try:
        assert list(target.session(len(prompt) + n + 8).generate(prompt, max_tokens=n)) == greedy
    finally:
        target.close()


@pytest.mark.gpu
def test_hip_graphs_captures_are_not_priced(tiny_q2, fitted_support):
    """Spec dspark.md §7.4: a pass that captured a graph of its shape is no sample of the
    scheduler's prices.  A session without kept prices decodes plainly until it has priced five plain
    decodes (their median prices a decode), then drafts once to price a proposal: with graphs off
    that draft comes at the sixth cycle; with graphs on the first plain decode captured the one-row
    graph, so it takes a sixth plain decode (a replay) and the draft comes at the seventh.  (The
    first step after the prefill samples the prefill's logits: no cycle.)"""
    _device_or_skip()
    prompt = np.random.default_rng(21).integers(100, 128000, 41).tolist()
    for mode, plain in (("off", 5), ("on", 6)):
        e = S.Engine(tiny_q2["model"], backend="hip", support=fitted_support, prefill_gemm="off", gpu_graphs=mode)
        try:
            s = e.session(len(prompt) + 32)
            s.set_dspark(scheduler=True)
            s.prefill(prompt)
            proposed = []
            for _ in range(plain + 2):
                s.step(S.STEP_MAX)
                proposed.append(s.dspark_stats().proposed)
            s.close()
            assert e.gpu_graphs == mode, e.gpu_graphs_note
        finally:
            e.close()
        assert proposed[:plain + 1] == [0] * (plain + 1) and proposed[plain + 1] > 0, (mode, proposed)


#: Unit roundoff of the prefill_gemm options' 16-bit operands (round to nearest: bf16 keeps 8
#: significant bits, f16 11).  A product rounds both operands, so each term moves by at most
#: 2u relative and a dot product by at most 2u * sum |w x| (the float32 sum adds far less).
UNIT = {"bf16": 2.0 ** -9, "f16": 2.0 ** -12}
#: The logits bound: GEMM_K * u * the largest |logit| of the prompt (the per-product 2u, grown through
#: the layers and norms of the tiny model; the H200 measured 7.1 (bf16) and 1.3 (f16): tools/gpu_notes.md).
GEMM_K = 16


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "f16"])
def test_hip_prefill_gemm_stays_within_its_bound(tiny_q2, prompt, mode):
    """Spec platform.md §7: prefill chunks through the vendor BLAS (16-bit operands, float32 sums)
    against the CPU engine, transformers numerics (no FP8/FP4 rounding steps in the way): every
    logit within GEMM_K * u(mode) * max|logit|; decode steps (one row) keep the float32 kernels,
    so greedy continuations agree at every decided position."""
    info = _device_or_skip()
    if info.blas.startswith("none"):
        pytest.skip(f"no vendor BLAS on this machine: {info.blas}")
    hip = S.Engine(tiny_q2["model"], backend="hip", numerics="transformers", prefill_gemm=mode)
    cpu = S.Engine(tiny_q2["model"], backend="cpu", numerics="transformers")
    assert hip.prefill_gemm == mode and info.blas in hip.prefill_gemm_note, hip.prefill_gemm_note
    auto = S.Engine(tiny_q2["model"], backend="hip", numerics="transformers")
    assert auto.prefill_gemm == "bf16" and "(auto)" in auto.prefill_gemm_note
    auto.close()
    got = hip.session(1024, n_batch=64).prefill(prompt, logits="all")
    want = cpu.session(1024, n_batch=64).prefill(prompt, logits="all")
    err = np.abs(got - want).max(axis=1)
    scale = float(np.abs(want).max())
    bound = GEMM_K * UNIT[mode] * scale
    print(f"\nprefill_gemm {mode}: hip vs cpu logits over {N_PROMPT} positions: max {err.max():.3g}, median "
          f"{np.median(err):.3g}, max |logit| {scale:.3g}; max / (u max|logit|) = {err.max() / (UNIT[mode] * scale):.2f} "
          f"(bound {GEMM_K})")
    assert np.isfinite(got).all() and err.max() <= bound
    # a pass below the threshold keeps the float32 kernels: the last rows one at a time match the CPU closely
    s1 = hip.session(1024, n_batch=S.PREFILL_GEMM_MIN_ROWS - 1)
    rows = s1.prefill(prompt[:S.PREFILL_GEMM_MIN_ROWS - 1], logits="all")
    assert np.abs(rows - want[:S.PREFILL_GEMM_MIN_ROWS - 1]).max() < TOL["transformers"]
    g_hip = list(hip.session(1024, n_batch=64).generate(prompt, max_tokens=32))
    g_cpu = list(cpu.session(1024, n_batch=64).generate(prompt, max_tokens=32))
    lc, lh = _teacher_forced(cpu, hip, prompt, g_cpu)
    n, diff = _decided_prefix(lc, lh)
    print(f"prefill_gemm {mode}: greedy 32 tokens: {n} decided positions before the first near tie (logits differ "
          f"by at most {diff:.3g}); identical: {g_hip == g_cpu}")
    assert g_hip[:n] == g_cpu[:n]


@pytest.mark.gpu
def test_hip_prefill_gemm_chunks_stay_within_the_memory_plan():
    """Spec platform.md §7.1: a 2048-token pass of a full-width synthetic DS4 Flash layer pair takes
    its expert products through the GEMM in chunks (2048 x 6 slots > GM_CHUNK_ROWS): the device
    memory the bf16 prefill adds beyond the float32 kernels' is within memplan.gemm_bytes (the plan
    that ``inspect --ctx`` counts), and the rows' logits stay near the float32 kernels' (a chunk's
    rows scattered to the wrong slots would leave most rows far off; transformers numerics, without
    FP8 or FP4 steps, and a few rows allowed for routing flips: 16-bit operands can move a token's
    router scores across a tie, spec ds4.md §2.9)."""
    info = _device_or_skip()
    if info.blas.startswith("none"):
        pytest.skip(f"no vendor BLAS on this machine: {info.blas}")
    from ds4tui.engine import memplan, synthetic

    model = synthetic.SyntheticModel(synthetic.flash_config((4, 128)), seed=0)
    n = 2048
    prompt = np.random.default_rng(5).integers(100, 128000, n).tolist()
    got = {}
    for mode in ("off", "bf16"):
        e = S.Engine(model, backend="hip", numerics="transformers", prefill_gemm=mode, gpu_graphs="off")
        try:
            with e.session(n + 8, n_batch=n) as s:
                before = e.memory().device
                logits = s.prefill(prompt, logits="all")
                got[mode] = (logits, e.memory().device - before)
        finally:
            e.close()
    bound = memplan.gemm_bytes(model.specs, n + 1, model.config.n_expert_used, model.config.o_groups)
    grown = got["bf16"][1] - got["off"][1]
    want, have = got["off"][0], got["bf16"][0]
    rel = np.linalg.norm(have - want, axis=1) / np.linalg.norm(want, axis=1)
    print(f"\nprefill_gemm bf16, 2 Flash layers, {n} tokens: GEMM buffers {grown} bytes (bound {bound}); "
          f"logits vs float32 kernels: relative error median {np.median(rel):.3g}, 99th percentile "
          f"{np.quantile(rel, 0.99):.3g}, max {rel.max():.3g}; rows above 0.2: {int((rel > 0.2).sum())}")
    assert 0 < grown <= bound
    assert np.isfinite(have).all() and np.median(rel) < 0.05 and (rel > 0.2).mean() < 0.05


def _gap(row: np.ndarray) -> float:
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def _teacher_forced(cpu, hip, prompt, tokens):
    """Both backends' logits at the positions that produced ``tokens`` (after ``prompt``), with
    the same tokens in the context (one prefill each)."""
    seq = list(prompt) + list(tokens[:-1])
    lc = cpu.session(len(seq) + 8, n_batch=64).prefill(seq, logits="all")[len(prompt) - 1:]
    lh = hip.session(len(seq) + 8, n_batch=64).prefill(seq, logits="all")[len(prompt) - 1:]
    return lc, lh


def _decided_prefix(lc: np.ndarray, lh: np.ndarray) -> tuple[int, float]:
    """(positions before the first one whose CPU top-2 gap is at most twice the largest logit
    difference measured between the backends at that position, the largest difference over all).
    Per position: in ds4 numerics one position's FP8 rounding step moves its row by ~0.1 while the
    others differ by ~1e-3, and a global margin would leave nothing decided."""
    diffs = np.abs(lh - lc).max(axis=1)
    decided = [_gap(r) > 2 * float(d) for r, d in zip(lc, diffs)]
    return (decided.index(False) if False in decided else len(decided)), float(diffs.max())


def _dspark_run(engine, prompt, n):
    """Greedy DSpark, scheduler off: (tokens, the tokens each step emitted, stats)."""
    s = engine.session(len(prompt) + n + 8)
    s.set_dspark(scheduler=False)
    s.prefill(prompt)
    out, steps = [], []
    while len(out) < n:
        r = s.step(min(S.STEP_MAX, n - len(out)))
        steps.append((r, s.last_proposal()[0]))
        out += r
    st = s.dspark_stats()
    s.close()
    return out[:n], steps, st


def _drafter_gap(model, support, prompt, emitted, drafts, k) -> tuple[float, int]:
    """The numpy reference drafter's row k for the cycle after ``emitted`` (its last token the
    anchor, the rest committed after ``prompt``), with the engine's ``drafts[:k]`` before it:
    (top-2 gap, argmax)."""
    from ds4tui.engine import reference as R

    ref = R.ReferenceModel(model)
    drafter = R.ReferenceDrafter(ref, support)
    committed = list(prompt) + list(emitted[:-1])
    st = ref.new_state(len(committed) + drafter.block_size + 4)
    r = ref.prefill(st, committed, capture=drafter.capture_layers)
    ds = drafter.new_state()
    drafter.add_context(ds, np.arange(len(committed)), r.hidden)
    prop = drafter.propose(ds, emitted[-1])
    w1 = drafter.w.get(drafter.last + "markov_head.markov_w1.weight")
    w2 = drafter.w.get(drafter.last + "markov_head.markov_w2.weight")
    prev = emitted[-1] if k == 0 else drafts[k - 1]
    row = prop.base_logits[k] + w2 @ w1[prev]
    return _gap(row), int(np.argmax(row))


#: What the numpy reference may differ from the engines by in ds4 numerics (the engine's tests hold
#: the CPU engine's logits to 1e-2 of it), added to the drafter's near-tie margin.
REF_TOL = 1e-2


def _compare_dspark(model, support, hip, cpu, prompt, n):
    """Greedy DSpark on both backends: the same emitted tokens in every step up to the first
    undecided target position; a step that differs before it must have drafts that differ where
    the drafter's own argmax is a near tie.  Returns (stats hip, stats cpu, whether every step agreed)."""
    got, steps_h, st_h = _dspark_run(hip, prompt, n)
    want, steps_c, st_c = _dspark_run(cpu, prompt, n)
    lc, lh = _teacher_forced(cpu, hip, prompt, want)
    n_dec, diff = _decided_prefix(lc, lh)
    assert got[:n_dec] == want[:n_dec]
    emitted: list[int] = []
    for (r_h, d_h), (r_c, d_c) in zip(steps_h, steps_c):
        if len(emitted) + len(r_c) > n_dec:
            return st_h, st_c, got == want and [x[0] for x in steps_h] == [x[0] for x in steps_c]
        if r_h != r_c:
            ks = [i for i in range(min(len(d_h), len(d_c))) if d_h[i] != d_c[i]]
            assert ks, f"step after {len(emitted)} tokens: hip emitted {r_h}, cpu {r_c} with the same drafts {d_c}"
            k = ks[0]
            gap, top = _drafter_gap(model, support, prompt, emitted, d_c, k)
            print(f"  drafts differ at step {len(emitted)}, draft {k}: hip {d_h[k]}, cpu {d_c[k]}, reference drafter "
                  f"argmax {top} with a top-2 gap of {gap:.3g}")
            assert gap <= 2 * diff + 2 * REF_TOL
            return st_h, st_c, False
        emitted += r_c
    return st_h, st_c, True


@pytest.mark.gpu
def test_hip_dspark_decisions_match_cpu(tiny_q2, fitted_support):
    _device_or_skip()
    hip = S.Engine(tiny_q2["model"], backend="hip", support=fitted_support, prefill_gemm="off")
    cpu = S.Engine(tiny_q2["model"], backend="cpu", support=fitted_support)
    assert hip.support_status == "attached", hip.support_message
    rng = np.random.default_rng(2024)
    keys = ("cycles", "proposed", "accepted_draft", "full", "partial", "miss_first", "no_draft",
            "draft_len_hist", "accepted_len_hist", "pos_proposed", "pos_accepted")
    tot = {"proposed": 0, "accepted_draft": 0}
    agreed = 0
    for n_prompt in (24, 41, 57):
        p = rng.integers(100, 128000, n_prompt).tolist()
        st_h, st_c, same = _compare_dspark(tiny_q2["model"], fitted_support, hip, cpu, p, 120)
        assert st_h.check_invariants() == []
        if same:  # every step agreed: so do the counters
            agreed += 1
            for k in keys:
                assert getattr(st_h, k) == getattr(st_c, k), k
        tot["proposed"] += st_h.proposed
        tot["accepted_draft"] += st_h.accepted_draft
    print(f"\nDSpark on hip: {tot['accepted_draft']}/{tot['proposed']} drafts accepted; {agreed} of 3 runs made the "
          f"same decisions as cpu in every step")
    assert tot["accepted_draft"] > 0


def test_the_decided_position_comparison_on_two_cpu_engines(tiny_q2, fitted_support):
    """The comparison the device tests make, between two CPU engines of different thread counts
    (bit-identical by design): no logit differs, every position with a nonzero top-2 gap is
    decided, and every DSpark step agrees."""
    a = S.Engine(tiny_q2["model"], backend="cpu", support=fitted_support, n_threads=1)
    b = S.Engine(tiny_q2["model"], backend="cpu", support=fitted_support, n_threads=2)
    p = np.random.default_rng(7).integers(100, 128000, 24).tolist()
    st_a, st_b, same = _compare_dspark(tiny_q2["model"], fitted_support, a, b, p, 30)
    assert same and st_a.proposed == st_b.proposed > 0 and st_a.accepted_draft == st_b.accepted_draft
    toks = list(a.session(64).generate(p, max_tokens=12))
    la, lb = _teacher_forced(a, b, p, toks)
    assert _decided_prefix(la, lb) == (12, 0.0)


def test_reference_drafter_gap_names_the_engines_draft(tiny_q2, fitted_support):
    """The helper that judges a DSpark difference on a device: for a CPU run, the numpy reference
    drafter's row (with the engine's own context and drafts) picks the engine's draft."""
    cpu = S.Engine(tiny_q2["model"], backend="cpu", support=fitted_support)
    p = np.random.default_rng(2024).integers(100, 128000, 24).tolist()
    _, steps, _ = _dspark_run(cpu, p, 12)
    emitted = list(steps[0][0])  # the first step samples the prefill's logits; the second drafts
    drafts = steps[1][1]
    assert len(drafts) >= 2
    for k in (0, 1):
        gap, top = _drafter_gap(tiny_q2["model"], fitted_support, p, emitted, drafts, k)
        assert top == drafts[k] and gap > 0


def test_synthetic_flash_bench_runs_shrunk_on_the_cpu():
    """The benchmark's model building, timing and extrapolation, on layers shrunk to CPU size, at
    two contexts (the second reached by repeating the compressed rows) and two verify widths."""
    from ds4tui.engine import synthetic

    shrunk = dict(n_embd=256, n_head=4, head_dim=128, q_lora_rank=128, o_lora_rank=64, o_groups=2, n_expert=8,
                  n_ff_exp=256, indexer_n_head=2, indexer_top_k=4, compress_ratios=(4, 16))
    real_time = synthetic._time_model
    timed = []

    def fixed_times(model, **kw):  # run the real timing, then report known times: the arithmetic is checked
        r = real_time(model, **kw)
        n = r["layers"]
        timed.append((n, [c["ctx"] for c in r["contexts"]], [sorted(c["verify_ms"]) for c in r["contexts"]]))
        return {**r, "contexts": [{"ctx": c["ctx"], "decode_ms": (10.0 + 2.0 * n) * (1 + i),
                                   "verify_ms": {3: 15.0 + 3.0 * n, 6: 20.0 + 5.0 * n}}
                                  for i, c in enumerate(r["contexts"])]}

    real_prefill = synthetic._time_prefill
    prefilled = []

    def fixed_prefill(model, **kw):  # the real prefill timing, then known times (per layer 3 ms per 10 tokens)
        r = real_prefill(model, **kw)
        n = model.config.n_layer
        prefilled.append((n, {m: sorted(v["ms"]) for m, v in r.items()}))
        return {m: {**v, "ms": {k: 7.0 + 0.3 * k * n for k in v["ms"]}} for m, v in r.items()}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synthetic, "_time_model", fixed_times)
        mp.setattr(synthetic, "_time_prefill", fixed_prefill)
        r = synthetic.run_flash_bench(backend="cpu", ctx=[300, 40], fill_prefix=32, n_decode=3, n_verify=2,
                                      verify_widths=[3], log=lambda *_: None, prefill_lengths=(40, 20),
                                      prefill_batch=16, **shrunk)
    assert timed == [(2, [40, 300], [[3, 6], [3, 6]]), (4, [40, 300], [[3, 6], [3, 6]])]
    assert prefilled == [(2, {"auto": [20, 40]}), (4, {"auto": [20, 40]})]
    p40 = r["prefill"]["modes"]["auto"]["lengths"]["40"]
    assert r["prefill"]["batch"] == 16 and set(r["device_bytes"]) == {"2", "4"}
    assert p40["per_layer_ms"] == pytest.approx(12.0) and p40["ms"] == pytest.approx(7.0 + 43 * 12.0)
    assert p40["tokens_per_s"] == pytest.approx(40 / (7.0 + 43 * 12.0) * 1e3)
    assert p40["first_token_s"] == pytest.approx((7.0 + 43 * 12.0 + 10.0 + 43 * 2.0) / 1e3)
    assert f"first token after {p40['first_token_s']:.2f} s" in synthetic.render(r)
    assert "prefill_gemm auto" in synthetic.render(r)
    assert r["ctx"] == 40 and [c["ctx"] for c in r["contexts"]] == [40, 300] and r["fill"] == "repeat"
    assert r["measured"][0]["layers"] == 2 and r["measured"][1]["layers"] == 4
    assert r["per_layer_ms"] == {"decode_ms": 2.0, "verify_ms": 5.0} and r["fixed_ms"] == {"decode_ms": 10.0,
                                                                                          "verify_ms": 20.0}
    assert r["decode_ms"] == pytest.approx(10.0 + 43 * 2.0) and r["decode_tokens_per_s"] == pytest.approx(1e3 / 96.0)
    assert r["verify_over_decode"] == pytest.approx((20.0 + 43 * 5.0) / 96.0)
    assert r["verify_over_decode_by_width"][3] == pytest.approx((15.0 + 43 * 3.0) / 96.0)
    assert r["contexts"][1]["decode_vs_first_ctx"] == pytest.approx(0.5)
    assert r["bytes_per_token"] > 0 and r["roofline_fraction"] is None
    assert r["contexts"][1]["bytes_per_token"] > r["bytes_per_token"]
    assert "verify(1+5 rows) / decode(1 row)" in synthetic.render(r) and "context 300" in synthetic.render(r)

    def noisy(model, **kw):  # the 4-layer model timed faster: refuse to extrapolate
        r = real_time(model, **kw)
        n = r["layers"]
        return {**r, "contexts": [{**c, "decode_ms": 10.0 - n, "verify_ms": {6: 20.0 + n}} for c in r["contexts"]]}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synthetic, "_time_model", noisy)
        with pytest.raises(RuntimeError, match="timing noise exceeds two layers' cost"):
            synthetic.run_flash_bench(backend="cpu", ctx=40, n_decode=3, n_verify=2, log=lambda *_: None, **shrunk)


def test_bench_fill_repeats_rows_and_refuses_what_it_cannot_do(tiny_q2):
    """``Session.bench_fill`` on the CPU engine: a pass after it runs (finite logits at the new
    position), it is refused below the tokens so far, past the context and on the reference backend."""
    from ds4tui.engine.errors import StateError

    eng = S.Engine(tiny_q2["model"], backend="cpu")
    s = eng.session(1024)
    s.prefill(list(range(100, 400)), logits="none")
    s.bench_fill(900, filler=100)
    assert s.n_tokens == 900 and s.pending is None
    assert np.all(np.isfinite(s.prefill([5])))
    with pytest.raises(ValueError):
        s.bench_fill(10)
    with pytest.raises(ValueError):
        s.bench_fill(5000)
    ref = S.Engine(tiny_q2["model"], backend="reference").session(512)
    ref.prefill(list(range(100, 300)), logits="none")
    with pytest.raises(StateError):
        ref.bench_fill(400)


@pytest.mark.gpu
def test_hip_drafts_from_the_draft_vocabulary(tiny_q2, fitted_support):
    """With a draft vocabulary (spec dspark.md §2.6) the device drafter proposes listed tokens only
    (the greedy chain's argmaxes over the listed columns, mapped back to ids on the host) and the
    output is target-only decoding's on the same backend, token for token."""
    _device_or_skip()
    rng = np.random.default_rng(11)
    prompts = [rng.integers(100, 128000, n).tolist() for n in (24, 41)]
    plain = S.Engine(tiny_q2["model"], backend="hip", prefill_gemm="off")
    want = [list(plain.session(200).generate(p, max_tokens=100)) for p in prompts]
    listed = list(dict.fromkeys(t for w in want for t in w)) + rng.integers(0, 129280, 500).tolist()
    listed = list(dict.fromkeys(listed))
    hip = S.Engine(tiny_q2["model"], backend="hip", support=fitted_support, prefill_gemm="off", draft_vocab=listed)
    assert hip.support_status == "attached" and hip.draft_vocab == len(listed)
    accepted = 0
    for p, w in zip(prompts, want):
        s = hip.session(200)
        s.set_dspark(scheduler=False)
        s.prefill(p)
        out: list[int] = []
        while len(out) < 100:
            out += s.step()
            assert set(s.last_proposal()[0]) <= set(listed)
        assert out[:100] == w
        accepted += s.dspark_stats().accepted_draft
        s.close()
    assert accepted > 0
