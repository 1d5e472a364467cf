"""Build the real AMD GPU library with Debian's packages, load it, and check its gfx1151 code.

CI has no AMD GPU and no ROCm install, but Debian 12 has what a full HIP build needs: ``clang-19``
(a HIP compiler that knows gfx1151), ``libamdhip64-dev`` (the HIP 5.2 headers and
``libamdhip64.so``), ``rocm-device-libs`` (the ocml / ockl / oclc bitcode the device code links)
and ``lld-19``.  The one file missing for gfx1151 is ``oclc_isa_version_1151.bc`` (Debian's device
libraries stop at gfx1036): it holds a single constant, the ISA version, and is written here from
Debian's ``oclc_isa_version_1030.bc`` with 10300 replaced by 11501.

``python -m ds4tui.devtools.amd_build [--out DIR]`` (``.ci/run`` runs it after the tests):

1. builds ``libds4tui_hip.so`` for gfx1151 with ``build_native.hip_clang_command`` (host and device
   code, linked against libamdhip64; the flags of the hipcc build);
2. loads it through the engine (``ds4_gpu_probe``) twice: the probe must answer "no device" with
   the platform and the built arch filled in, and the library must still be mapped afterwards (it is
   loaded once per process, never unloaded);
3. checks the device code that went into the library (each translation unit's code object, cut
   out of its ``.hip_fatbin`` section, and its kernel metadata): every kernel is wave32, and no
   kernel uses scratch memory (a private segment or a dynamic stack) except the ones in
   :data:`SCRATCH_ALLOWED`;
4. checks that a plain ``a * b + c`` is not contracted into an FMA: no source's device IR, compiled
   with the build's flags, has an ``llvm.fmuladd`` or a ``contract`` flag, and a probe kernel
   ``y = a * b + c`` compiles to ``v_mul_f32`` + ``v_add_f32`` (with the compiler's default
   contraction it becomes one ``v_fmac_f32``, which shows the check can fail).

Exit status 0 when every check passes; each failure is printed with what was expected.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCH = "gfx1151"
ISA_VERSION = 11501  # gfx1151: major 11, minor 5, stepping 1 (gfx1030 is 10300)
DEBIAN_BITCODE = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
TOOLS = {"clang": "clang++-19", "llvm-as": "llvm-as-19", "llvm-dis": "llvm-dis-19", "objcopy": "llvm-objcopy-19",
         "readelf": "llvm-readelf-19", "bundler": "clang-offload-bundler-19", "lld": "ld.lld-19"}
#: Debian packages that hold the tools and files above.
# llvm-19 (llvm-as, llvm-dis, llvm-objcopy, llvm-readelf) and clang-tools-19 (clang-offload-bundler)
# are only Recommends of clang-19: an install without recommends lacks them
PACKAGES = ("clang-19", "lld-19", "llvm-19", "clang-tools-19", "libamdhip64-dev", "rocm-device-libs")
#: Kernels allowed a private segment: the mHC mix for any stream count up to 16 keeps a 16 x 16
#: matrix in a local array (DS4's 4 streams run hc_mix4_kernel, which has none).
SCRATCH_ALLOWED = ("_Z13hc_mix_kernelILi0EEvPKfiifffS1_fiPfS2_S2_",)
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
FMA_PROBE = """#include <hip/hip_runtime.h>
__global__ void fma_probe(const float *a, const float *b, const float *c, float *y) {
    const int i = threadIdx.x;
    y[i] = a[i] * b[i] + c[i];
}
"""


class AMDBuildError(RuntimeError):
    """A tool or file is missing, or a build step failed (the message says which)."""


def missing() -> list[str]:
    """The tools and files this check needs that are not here (empty when all are)."""
    out = [t for t in TOOLS.values() if not shutil.which(t)]
    if not (Path("/usr/include/hip/hip_runtime.h")).exists():
        out.append("/usr/include/hip/hip_runtime.h (libamdhip64-dev)")
    if not (DEBIAN_BITCODE / "ocml.bc").exists():
        out.append(f"{DEBIAN_BITCODE}/ocml.bc (rocm-device-libs)")
    return out


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=kw.pop("text", True), **kw)
    if r.returncode != 0:
        err = r.stderr if isinstance(r.stderr, str) else r.stderr.decode(errors="replace")
        tail = "\n".join(err.strip().splitlines()[-20:])
        raise AMDBuildError(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    return r


def device_libs(folder: Path) -> Path:
    """A device-library folder for clang: links to Debian's bitcode plus oclc_isa_version_1151.bc."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in DEBIAN_BITCODE.glob("*.bc"):
        link = folder / f.name
        if not link.exists():
            link.symlink_to(f)
    isa = folder / f"oclc_isa_version_{ARCH[3:]}.bc"
    if not isa.exists():
        text = _run([TOOLS["llvm-dis"], "-o", "-", str(DEBIAN_BITCODE / "oclc_isa_version_1030.bc")], "llvm-dis").stdout
        text, n = re.subn(r"(@__oclc_ISA_version = .* i32 )10300\b", rf"\g<1>{ISA_VERSION}", text)
        if n != 1:
            raise AMDBuildError("oclc_isa_version_1030.bc does not hold the one constant 10300 it should")
        ll = folder / "isa.ll"
        ll.write_text(text)
        _run([TOOLS["llvm-as"], str(ll), "-o", str(isa)], "llvm-as")
    return folder


def _build_native():
    sys.path.insert(0, str(ROOT))
    try:
        import build_native
    finally:
        sys.path.remove(str(ROOT))
    return build_native


def build(out: Path) -> Path:
    """Build ``out/libds4tui_hip.so`` for gfx1151 with clang-19 and Debian's HIP and device libraries."""
    B = _build_native()
    B.write_iq2xxs_tables(B.NATIVE / "cpu" / "iq2xxs_tables.h")  # matmul.hip includes it
    libs = device_libs(out / "bitcode")
    lib = out / "libds4tui_hip.so"
    _run(B.hip_clang_command(TOOLS["clang"], [ARCH], str(lib), str(libs)), f"the {ARCH} library build")
    return lib


def code_objects(lib: Path, work: Path) -> list[Path]:
    """The gfx1151 code object of every translation unit in the library's ``.hip_fatbin`` section."""
    fatbin = work / "hip_fatbin.bin"
    _run([TOOLS["objcopy"], f"--dump-section=.hip_fatbin={fatbin}", str(lib), str(work / "lib.copy")], "objcopy")
    data = fatbin.read_bytes()
    starts = [m.start() for m in re.finditer(re.escape(BUNDLE_MAGIC), data)] + [len(data)]
    out = []
    for i in range(len(starts) - 1):
        part = work / f"bundle{i}.bin"
        part.write_bytes(data[starts[i]:starts[i + 1]])
        co = work / f"code{i}.o"
        _run([TOOLS["bundler"], "--unbundle", "--type=o", f"--targets=hipv4-amdgcn-amd-amdhsa--{ARCH}",
              f"--input={part}", f"--output={co}"], "clang-offload-bundler")
        out.append(co)
    return out


@dataclass
class Kernel:
    """A kernel's entry in a code object's AMDGPU metadata."""

    name: str
    wavefront_size: int = 0
    private_segment: int = 0
    dynamic_stack: bool = False
    vgprs: int = 0
    sgprs: int = 0
    vgpr_spills: int = 0
    target: str = ""


def parse_metadata(notes: str) -> list[Kernel]:
    """The kernels of ``llvm-readelf --notes`` output (the AMDGPU metadata in YAML form)."""
    target = next(iter(re.findall(r"amdhsa\.target:\s+(\S+)", notes)), "").strip("'\"")
    kernels: list[Kernel] = []
    fields = {".wavefront_size": ("wavefront_size", int), ".private_segment_fixed_size": ("private_segment", int),
              ".uses_dynamic_stack": ("dynamic_stack", lambda v: v == "true"), ".vgpr_count": ("vgprs", int),
              ".sgpr_count": ("sgprs", int), ".vgpr_spill_count": ("vgpr_spills", int)}
    cur: dict = {}

    def flush():
        if "name" in cur:
            kernels.append(Kernel(target=target, **cur))

    for line in notes.splitlines():
        m = re.match(r"\s*-?\s*(\.[a-z_]+):\s*(\S+)\s*$", line)
        if not m:
            continue
        key, val = m.groups()
        if key == ".name" and line.startswith("    .name:"):  # a kernel's own name (args have none at this depth)
            flush()
            cur = {"name": val}
        elif key in fields and cur and line.startswith("    ."):
            attr, conv = fields[key]
            cur[attr] = conv(val)
    flush()
    return kernels


@dataclass
class Report:
    kernels: list[Kernel] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_kernels(kernels: list[Kernel], report: Report) -> None:
    if not kernels:
        report.problems.append("no kernel found in the library's gfx1151 code objects")
    for k in kernels:
        if k.wavefront_size != 32:
            report.problems.append(f"{k.name}: wavefront size {k.wavefront_size}, the kernels need wave32")
        if k.target and ARCH not in k.target:
            report.problems.append(f"{k.name}: built for {k.target}, expected {ARCH}")
        if (k.private_segment or k.dynamic_stack or k.vgpr_spills) and k.name not in SCRATCH_ALLOWED:
            report.problems.append(f"{k.name}: uses scratch memory (private segment {k.private_segment} bytes, "
                                   f"dynamic stack {k.dynamic_stack}, {k.vgpr_spills} VGPR spills)")


def _device_flags(B) -> list[str]:
    cmd = B.gpu_command("hip", TOOLS["clang"], [ARCH], "/dev/null")
    keep = [a for a in cmd[1:] if a.startswith(("-O", "-std", "-D", "-I", "-ffp-contract", "--offload-arch")) or a == "hip"
            or a == "-x"]
    return keep + ["--rocm-path=/usr", "--cuda-device-only"]


def check_contraction(work: Path, report: Report) -> None:
    """No contracted a*b+c: the sources' device IR, and a probe kernel's ISA."""
    B = _build_native()
    flags = _device_flags(B)
    assert "-ffp-contract=off" in flags, flags
    for src in B.HIP_SOURCES:
        ll = work / (Path(src).stem + ".ll")
        _run([TOOLS["clang"]] + flags + ["-nogpulib", "-S", "-emit-llvm", "-o", str(ll), str(B.NATIVE / src)],
             f"device IR of {src}")
        text = ll.read_text()
        n_fmuladd = len(re.findall(r"call [^\n]*@llvm\.fmuladd", text))
        n_contract = len(re.findall(r"\b(fmul|fadd|fsub|fneg|call)\b[^\n]*\bcontract\b", text))
        if n_fmuladd or n_contract:
            report.problems.append(f"{src}: {n_fmuladd} llvm.fmuladd and {n_contract} contract-flagged operations in "
                                   f"the device IR (a plain a*b+c may become an FMA)")
    probe = work / "fma_probe.hip"
    probe.write_text(FMA_PROBE)
    libs = str(device_libs(work / "bitcode"))

    def isa(extra: list[str]) -> str:
        out = work / "fma_probe.s"
        _run([TOOLS["clang"]] + extra + [f"--rocm-device-lib-path={libs}", "-S", "-o", str(out), str(probe)],
             "the FMA probe")
        body = out.read_text()
        return body[body.index("fma_probe"):]

    strict = isa(flags)
    default = isa([a for a in flags if not a.startswith("-ffp-contract")])
    fused = lambda s: re.search(r"\bv_(fma|fmac)_f32", s) is not None  # noqa: E731
    if fused(strict) or not (re.search(r"\bv_mul_f32", strict) and re.search(r"\bv_add_f32", strict)):
        report.problems.append("the build's flags compile y = a*b + c to a fused multiply-add on gfx1151")
    if not fused(default):
        report.notes.append("note: without -ffp-contract=off the probe did not fuse either (the check proves less)")


def check_library(lib: Path, report: Report) -> None:
    """Load the library through the engine: the probe answers "no device", and it stays loaded."""
    from ds4tui.engine import gpu

    for attempt in (1, 2):
        info, why = gpu.probe(lib)
        if info is None or info.platform != "hip" or info.built_arch != ARCH:
            report.problems.append(f"probe {attempt}: expected a hip library built for {ARCH}, got {info} ({why})")
            return
        if not why.startswith("no device"):
            report.problems.append(f"probe {attempt}: expected 'no device ...', got {why!r}")
        if info.n_devices != 0:
            report.problems.append(f"probe {attempt}: {info.n_devices} devices on a machine without a GPU")
        report.notes.append(f"probe {attempt}: {why} (HIP runtime {info.runtime_version})")
        # the prefill GEMM's BLAS is looked up by the probe (spec platform.md §7): found, or named as missing
        if not info.blas.startswith(("rocBLAS ", "none: rocBLAS not found (tried librocblas.so.5")):
            report.problems.append(f"probe {attempt}: the BLAS line names no rocBLAS: {info.blas!r}")
        else:
            report.notes.append(f"probe {attempt}: prefill GEMM BLAS: {info.blas}")
    maps = Path("/proc/self/maps").read_text()
    if str(lib.resolve()) not in maps and str(lib) not in maps:
        report.problems.append(f"{lib} is no longer mapped after the probes: it must stay loaded for the process")


def run(out: Path) -> Report:
    report = Report()
    lack = missing()
    if lack:
        raise AMDBuildError("missing: " + ", ".join(lack) + f" (apt-get install {' '.join(PACKAGES)})")
    lib = build(out)
    report.notes.append(f"built {lib} ({lib.stat().st_size} bytes) for {ARCH}")
    check_library(lib, report)
    work = out / "objects"
    work.mkdir(exist_ok=True)
    for co in code_objects(lib, work):
        notes = _run([TOOLS["readelf"], "--notes", str(co)], "readelf").stdout
        report.kernels += parse_metadata(notes)
    check_kernels(report.kernels, report)
    check_contraction(work, report)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ds4tui.devtools.amd_build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for the library and the intermediate files (default: a temporary one)")
    ap.add_argument("--json", help="also write the kernel table and the result to this file")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ds4tui-amd-") as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        try:
            report = run(out)
        except AMDBuildError as exc:
            print(f"amd_build: {exc}", file=sys.stderr)
            return 1
    for n in report.notes:
        print(f"amd_build: {n}")
    ks = report.kernels
    print(f"amd_build: {len(ks)} kernels, all wave{sorted({k.wavefront_size for k in ks})}, max {max(k.vgprs for k in ks)} "
          f"VGPRs, scratch only in {[k.name for k in ks if k.private_segment] or 'none'}")
    for k in sorted(ks, key=lambda k: -k.vgprs)[:8]:
        print(f"amd_build:   {k.vgprs:4d} VGPRs {k.sgprs:4d} SGPRs  {k.name}")
    if a.json:
        Path(a.json).write_text(json.dumps({"problems": report.problems, "kernels": [k.__dict__ for k in ks]}, indent=1))
    for p in report.problems:
        print(f"amd_build: FAIL: {p}", file=sys.stderr)
    print("amd_build: " + ("FAILED" if report.problems else "OK: the AMD library links, loads, and its gfx1151 code "
                           "checks out"))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
