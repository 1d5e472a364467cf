"""The GPU backend's host side, on any machine: the library loaded once per process, the memory
plan against the amdgpu GTT budget (a fake sysfs), the child-process guard of the first device
pass, the build switches and the AMD build's code checks (on sample metadata).

The parts that need a device are in tests/test_gpu_backend.py; the real AMD library is built,
loaded and checked by ``python -m ds4tui.devtools.amd_build`` (``.ci/run``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ds4tui.engine import device_check, gpu, memplan
from ds4tui.engine import session as S
from ds4tui.engine.errors import BackendUnavailableError, DeviceFaultError, DeviceMemoryError

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "ds4tui" / "native"
GIB = 1 << 30


# ---- the library, loaded once per process ------------------------------------------------------

FAKE_LIBRARY = r"""
#include "backend.h"
#include <stdio.h>
static int probes; /* a reload would start it at 0 again */
static int fake_probe(ds4_gpu_info *info, char *err, size_t len) {
    probes++;
    snprintf(info->platform, sizeof info->platform, "fake");
    info->n_devices = probes;
    snprintf(err, len, "no device: fake probe %d", probes);
    return DS4_E_DEVICE;
}
static const ds4_backend table = {DS4_GPU_API_VERSION, fake_probe};
__attribute__((visibility("default"))) const ds4_backend *ds4_gpu_api_v1(void) { return &table; }
"""


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler")
def test_a_gpu_library_is_loaded_once_and_never_unloaded(tmp_path):
    """Probes, engines and the kernel entry points share one load of a library for the life of the
    process (RTLD_NODELETE, no dlclose): ROCm's runtime has crashed when torn down and brought up
    again.  A fake library counts its probes in a static: a reload would count from 1 again."""
    src = tmp_path / "fake.c"
    src.write_text(FAKE_LIBRARY)
    lib = tmp_path / "libfake_gpu.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", f"-I{NATIVE}", "-o", str(lib), str(src)], check=True)
    for n in (1, 2, 3):
        info, why = gpu.probe(lib)
        assert why == f"no device: fake probe {n}" and info.platform == "fake" and info.n_devices == n
    assert str(lib) in Path("/proc/self/maps").read_text()


# ---- the memory plan -------------------------------------------------------------------------------

def _amdgpu(root: Path, *, gtt_total: int, gtt_used: int = 0, vram_total: int = 512 << 20, vram_used: int = 0,
            ram: int = 126 * GIB, pages_limit: int = 0) -> dict:
    """A fake sysfs (drm card, ttm parameters) and /proc/meminfo; returns memplan.check's roots."""
    dev = root / "devices" / "0000:c3:00.0"
    dev.mkdir(parents=True)
    (root / "drivers" / "amdgpu").mkdir(parents=True)
    (dev / "driver").symlink_to(root / "drivers" / "amdgpu")
    for name, v in (("mem_info_gtt_total", gtt_total), ("mem_info_gtt_used", gtt_used),
                    ("mem_info_vram_total", vram_total), ("mem_info_vram_used", vram_used)):
        (dev / name).write_text(f"{v}\n")
    (root / "drm" / "card1").mkdir(parents=True)
    (root / "drm" / "card1" / "device").symlink_to(dev)
    (root / "proc").mkdir()
    (root / "proc" / "meminfo").write_text(f"MemTotal:       {ram // 1024} kB\nMemFree:        1000 kB\n")
    (root / "ttm").mkdir()
    (root / "ttm" / "pages_limit").write_text(f"{pages_limit}\n")
    (root / "ttm" / "page_pool_size").write_text(f"{pages_limit}\n")
    return {"sysfs_root": root / "drm", "proc_root": root / "proc", "ttm_root": root / "ttm"}


def _info(platform="hip", *, integrated=True, free=0, total=0, name="AMD Radeon 8060S"):
    return gpu.GPUInfo(library="/x/libds4tui_hip.so", platform=platform, built_arch="gfx1151", runtime_version=1,
                       driver_version=1, n_devices=1, device=0, device_name=name, device_arch="gfx1151", warp_size=32,
                       arch_ok=True, mem_total=total, mem_free=free, integrated=integrated)


class _Model:
    """What the plan reads of a model: its path and its tensors' bytes."""

    def __init__(self, nbytes: int, path="flash.gguf"):
        self.path = path
        self.tensors = {"t": type("T", (), {"nbytes": nbytes})()}


FLASH = 81_000_000_000  # bytes of DS4 Flash's tensors, about


def test_a_model_larger_than_the_default_gtt_is_refused_with_the_pages_limit_to_set(tmp_path):
    roots = _amdgpu(tmp_path, gtt_total=63 * GIB, gtt_used=GIB // 2)
    e = memplan.check(_Model(FLASH), None, _info(), **roots)
    assert isinstance(e, DeviceMemoryError) and isinstance(e, BackendUnavailableError)
    msg = str(e)
    assert msg.startswith("flash.gguf: the model needs 79.4 GiB of GPU memory (75.4 GiB of weights")
    assert "GTT 63.0 GiB (the kernel's default: half of RAM) with 62.5 GiB free" in msg
    assert "VRAM (the BIOS carve-out) 0.5 GiB" in msg and "at most 62.5 GiB in one pool" in msg
    assert "`ttm.pages_limit=32505856 ttm.page_pool_size=32505856`" in msg and "(124 GiB of GTT" in msg
    assert msg.endswith("nothing was uploaded")
    assert e.need == FLASH + memplan.WORKING_RESERVE and e.budget == 62 * GIB + GIB // 2 and e.source == "amdgpu GTT (sysfs)"
    assert e.advice.startswith("add `ttm.pages_limit=32505856")


def test_a_raised_gtt_holds_the_model(tmp_path):
    roots = _amdgpu(tmp_path, gtt_total=32505856 * 4096, gtt_used=GIB, pages_limit=32505856)
    assert memplan.check(_Model(FLASH), None, _info(), **roots) is None
    # the draft vocabulary's row copies count: a plan that just fits without them does not with them
    left = 32505856 * 4096 - GIB - FLASH - memplan.WORKING_RESERVE
    assert memplan.check(_Model(FLASH), None, _info(), draft_vocab_extra=left, **roots) is None
    e = memplan.check(_Model(FLASH), None, _info(), draft_vocab_extra=left + 1, **roots)
    assert isinstance(e, DeviceMemoryError) and e.need == FLASH + memplan.WORKING_RESERVE + left + 1
    g = memplan.read_gtt(**roots)
    assert g.default_half is False and g.pages_limit == 32505856 and g.gtt_total == 124 * GIB


def test_a_model_larger_than_ram_is_refused_without_advice(tmp_path):
    roots = _amdgpu(tmp_path, gtt_total=63 * GIB)
    e = memplan.check(_Model(140 * GIB), None, _info(), **roots)
    assert "This machine's 126.0 GiB of RAM cannot hold it at any GTT limit" in str(e) and e.advice == ""


def test_a_raised_gtt_in_use_names_the_use(tmp_path):
    roots = _amdgpu(tmp_path, gtt_total=124 * GIB, gtt_used=60 * GIB)
    e = memplan.check(_Model(FLASH), None, _info(), **roots)
    assert "GTT is large enough (124.0 GiB) but 60.0 GiB of it is in use" in str(e)


def test_a_discrete_amd_gpu_is_planned_on_its_vram(tmp_path):
    roots = _amdgpu(tmp_path, gtt_total=32 * GIB, vram_total=24 * GIB, vram_used=GIB)
    e = memplan.check(_Model(30 * GIB), None, _info(integrated=False), **roots)
    assert e.source == "amdgpu VRAM (sysfs)" and e.budget == 23 * GIB and "ttm" not in str(e)


def test_nvidia_is_planned_on_the_runtime_numbers_and_the_support_model_counts(tmp_path):
    support = tmp_path / "support.gguf"
    support.write_bytes(b"\0" * 4096)
    info = _info("cuda", integrated=False, free=10 * GIB, total=80 * GIB, name="H100")
    fits = 10 * GIB - memplan.WORKING_RESERVE - 4096  # the weights that fit beside the support model
    assert memplan.check(_Model(fits), support, info) is None
    e = memplan.check(_Model(fits + 1), support, info)
    assert "device 0 (H100): the CUDA runtime reports 10.0 GiB free of 80.0 GiB" in str(e)
    assert e.need == 10 * GIB + 1
    # free > total (reported by hipMemGetInfo on APUs): no usable numbers, no refusal
    assert memplan.check(_Model(FLASH), None, _info(free=200 * GIB, total=100 * GIB),
                         sysfs_root=tmp_path / "none") is None


def test_the_gtt_report_says_whether_the_limit_is_the_default_half(tmp_path):
    r = memplan.gtt_report(**_amdgpu(tmp_path / "a", gtt_total=63 * GIB))
    assert r["default_half"] is True and r["suggested_pages_limit"] == 32505856 and r["gtt_total"] == 63 * GIB
    assert r["card"] == "amdgpu card1 (0000:c3:00.0)" and r["ram_total"] == 126 * GIB
    assert r["note"].startswith("GTT is the kernel's default, half of the 126.0 GiB of RAM: a model larger than "
                                "63.0 GiB will not load; to raise it, add `ttm.pages_limit=32505856")
    r = memplan.gtt_report(**_amdgpu(tmp_path / "b", gtt_total=124 * GIB, pages_limit=32505856))
    assert r["default_half"] is False and r["pages_limit"] == 32505856
    assert memplan.gtt_report(sysfs_root=tmp_path / "none")["card"] is None


def test_the_engine_refuses_before_uploading_and_auto_falls_back(tiny_q2, monkeypatch):
    """Engine(backend="hip") raises the plan's DeviceMemoryError before the native engine opens;
    backend="auto" uses the CPU and says why."""
    small = _info("cuda", integrated=False, free=1 << 20, total=80 * GIB, name="tiny GPU")
    monkeypatch.setattr(gpu, "probe", lambda library=None: (small, ""))
    opened = []
    monkeypatch.setattr(S.Engine, "_open_native", lambda self, *a: opened.append(self.backend))
    with pytest.raises(DeviceMemoryError, match=r"model.gguf: the model needs .* but device 0 \(tiny GPU\): the CUDA "
                                                r"runtime reports 0\.0 GiB free of 80\.0 GiB"):
        S.Engine(tiny_q2["model"], backend="hip")
    assert opened == []
    e = S.Engine(tiny_q2["model"], backend="auto")
    assert e.backend == "cpu" and opened == ["cpu"]
    assert e.backend_note == "no usable GPU (the model does not fit in its memory): running on the CPU"
    assert e.backend_detail.startswith("the GPU backend (HIP sources, built for CUDA gfx1151) is unavailable: ") and \
        "the CUDA runtime reports 0.0 GiB free" in e.backend_detail


# ---- the first device pass in a child (AMD) -------------------------------------------------------

FAULT = ("import os, sys; print('device check: starting'); sys.stderr.write('Memory access fault by GPU node-1 "
         "(Agent handle: 0x55d0) on address 0x7f0000000000. Reason: Page not present or supervisor privilege.\\n'); "
         "sys.stderr.flush(); os.abort()")


def test_a_device_fault_in_the_child_becomes_a_named_error():
    from ds4tui.engine.synthetic import flash_config

    e = device_check.guard("/x/libds4tui_hip.so", flash_config((0, 4, 128)), force=True,
                           argv=[sys.executable, "-c", FAULT])
    assert isinstance(e, DeviceFaultError) and isinstance(e, BackendUnavailableError)
    assert e.returncode == -6
    msg = str(e)
    assert msg.startswith("the GPU failed its first device pass: a child process running a small model with this "
                          "model's widths on /x/libds4tui_hip.so was killed by SIGABRT (ROCm aborts a process on a GPU "
                          "memory fault) after ")
    assert "Memory access fault by GPU node-1 (Agent handle: 0x55d0) on address 0x7f0000000000. Reason: Page not " \
           "present or supervisor privilege. Nothing was uploaded" in msg
    e = device_check.guard("/x/lib.so", flash_config((0,)), force=True,
                           argv=[sys.executable, "-c", "import sys; sys.exit('hipErrorNoBinaryForGpu')"])
    assert "failed with exit status 1" in str(e) and str(e).count("hipErrorNoBinaryForGpu") == 1
    e = device_check.guard("/x/lib.so", flash_config((0,)), force=True, timeout=0.5,
                           argv=[sys.executable, "-c", "import time; time.sleep(30)"])
    assert "did not finish its first device pass in 0 s" in str(e) and e.returncode is None


def test_a_library_that_passed_is_not_checked_again(monkeypatch):
    from ds4tui.engine.synthetic import flash_config

    monkeypatch.setattr(device_check, "_passed", set())
    cfg = flash_config((0,))
    assert device_check.guard("/y/lib.so", cfg, argv=[sys.executable, "-c", "pass"]) is None
    assert device_check.guard("/y/lib.so", cfg, argv=[sys.executable, "-c", "import os; os.abort()"]) is None
    assert device_check.guard("/y/lib.so", cfg, force=True, argv=[sys.executable, "-c", "import os; os.abort()"])


def test_gpu_admit_runs_the_guard_on_amd_only(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(device_check, "guard", lambda lib, cfg: calls.append(lib))
    monkeypatch.setattr(memplan, "check", lambda *a, **k: None)
    m = _Model(1)
    m.config = None
    assert gpu.admit(m, None, _info("cuda")) is None and calls == []
    assert gpu.admit(m, None, _info("hip")) is None and calls == ["/x/libds4tui_hip.so"]


def test_the_child_model_keeps_one_layer_of_each_kind():
    from ds4tui.engine.synthetic import flash_config

    cut = device_check.check_config(flash_config((0, 0) + (4, 128) * 20 + (4,), n_hash_layer=3))
    assert (cut.n_layer, cut.compress_ratios, cut.swiglu_clamp, cut.n_expert, cut.n_expert_used, cut.n_hash_layer,
            cut.n_embd, cut.n_ff_exp) == (3, (0, 4, 128), (10.0,) * 3, 16, 6, 0, 4096, 2048)


# ---- build switches and the AMD build's checks -----------------------------------------------------

def _build_native():
    sys.path.insert(0, str(ROOT))
    try:
        import build_native
    finally:
        sys.path.remove(str(ROOT))
    return build_native


def test_the_rocm_formulas_switch_is_a_named_build_option(monkeypatch):
    B = _build_native()
    cu = B.gpu_command("cuda", "nvcc", ["sm_90"], "/tmp/x.so", rocm_formulas=True)
    assert "-DDS4_GPU_ROCM_FORMULAS=1" in cu and "-fmad=false" in cu
    assert "-DDS4_GPU_ROCM_FORMULAS=1" not in B.gpu_command("cuda", "nvcc", ["sm_90"], "/tmp/x.so")
    monkeypatch.setenv("DS4TUI_GPU_ROCM_FORMULAS", "1")
    assert B.rocm_formulas() is True
    monkeypatch.setenv("DS4TUI_GPU_ROCM_FORMULAS", "yes")
    with pytest.raises(B.GPUBuildError, match="DS4TUI_GPU_ROCM_FORMULAS='yes': expected 0 or 1"):
        B.rocm_formulas()
    compat = (NATIVE / "hip" / "hip_compat.h").read_text()
    assert "#if defined(GPU_NVIDIA) && defined(DS4_GPU_ROCM_FORMULAS)" in compat
    planar = (NATIVE / "hip" / "planar.hip").read_text()
    assert "__byte_perm" not in planar and "gpu_byte_perm(" in planar


def test_the_clang_build_of_the_amd_library_keeps_the_hipcc_flags():
    B = _build_native()
    cmd = B.hip_clang_command("clang++-19", ["gfx1151"], "/tmp/x.so", "/tmp/bc")
    hip = B.gpu_command("hip", "clang++-19", ["gfx1151"], "/tmp/x.so")
    assert [a for a in cmd if a in hip] == hip
    assert {"--rocm-path=/usr", "--rocm-device-lib-path=/tmp/bc", "-fuse-ld=lld", "-lamdhip64",
            "-ffp-contract=off", "--offload-arch=gfx1151"} <= set(cmd)


NOTES = """Displaying notes found in: .note
  Owner                Data size 	Description
  AMDGPU               0x00000733	NT_AMDGPU_METADATA (AMDGPU Metadata)
    AMDGPU Metadata:
        ---
amdhsa.kernels:
  - .args:
      - .address_space:  global
        .name:           out
        .offset:         0
        .size:           8
        .value_kind:     global_buffer
    .group_segment_fixed_size: 0
    .name:           _Z12probe_kernelPi
    .private_segment_fixed_size: 0
    .sgpr_count:     3
    .uses_dynamic_stack: false
    .vgpr_count:     2
    .vgpr_spill_count: 0
    .wavefront_size: 32
  - .args:
      - .offset:         0
        .size:           8
    .name:           _Z3badPf
    .private_segment_fixed_size: 144
    .sgpr_count:     40
    .uses_dynamic_stack: true
    .vgpr_count:     90
    .vgpr_spill_count: 3
    .wavefront_size: 64
amdhsa.target:   amdgcn-amd-amdhsa--gfx1151
amdhsa.version:
  - 1
  - 2
"""


def test_the_amd_build_check_reads_kernel_metadata_and_names_wave64_and_scratch():
    from ds4tui.devtools import amd_build as A

    ks = A.parse_metadata(NOTES)
    assert [(k.name, k.wavefront_size, k.private_segment, k.dynamic_stack, k.vgprs, k.vgpr_spills) for k in ks] == [
        ("_Z12probe_kernelPi", 32, 0, False, 2, 0), ("_Z3badPf", 64, 144, True, 90, 3)]
    assert ks[0].target == "amdgcn-amd-amdhsa--gfx1151"
    rep = A.Report()
    A.check_kernels(ks, rep)
    assert rep.problems == ["_Z3badPf: wavefront size 64, the kernels need wave32",
                            "_Z3badPf: uses scratch memory (private segment 144 bytes, dynamic stack True, 3 VGPR "
                            "spills)"]
    allowed = [A.Kernel(A.SCRATCH_ALLOWED[0], 32, 1040)]
    rep = A.Report()
    A.check_kernels(allowed, rep)
    assert rep.problems == []


def test_the_amd_build_lists_what_it_lacks(monkeypatch):
    from ds4tui.devtools import amd_build as A

    monkeypatch.setattr(A.shutil, "which", lambda name: None)
    monkeypatch.setattr(A, "DEBIAN_BITCODE", Path("/nonexistent"))
    lack = A.missing()
    assert "clang++-19" in lack and "ld.lld-19" in lack and "/nonexistent/ocml.bc (rocm-device-libs)" in lack
    assert A.main(["--out", "/tmp/ds4tui-amd-missing"]) == 1


def test_the_doctor_reports_the_gtt_limit(capsys, monkeypatch, tmp_path):
    from ds4tui.cli import main

    assert main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["gtt"]) >= {"card", "note"}
    roots = _amdgpu(tmp_path, gtt_total=63 * GIB)
    real = memplan.gtt_report
    monkeypatch.setattr(memplan, "gtt_report", lambda: real(**roots))
    assert main(["doctor"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gtt limit"))
    assert line.split(None, 2)[2] == (
        "amdgpu card1 (0000:c3:00.0): GTT is the kernel's default, half of the 126.0 GiB of RAM: a model larger "
        "than 63.0 GiB will not load; to raise it, add `ttm.pages_limit=32505856 ttm.page_pool_size=32505856` to the "
        "kernel command line (124 GiB of GTT = pages x 4096 bytes) and reboot")
