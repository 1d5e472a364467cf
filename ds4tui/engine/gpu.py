"""The GPU backend library: where it is, how it was built, what the runtime sees.

The C engine ``dlopen``s the GPU backend at run time (spec platform.md §0.3, §4): build_native.py
builds ``ds4tui/libds4tui_hip.so`` (hipcc, AMD) or ``ds4tui/libds4tui_cuda.so`` (nvcc, NVIDIA)
next to the extension when it finds a toolchain and records what happened in
``ds4tui/gpu_build.json``.  A caller may name another library (the command line passes
``DS4TUI_GPU_LIB``; nothing here reads the environment).

:func:`locate` answers "which library, and if none, exactly why" (no toolchain at build time,
the build failed, a wrong-arch build); :func:`probe` loads it and asks the runtime for the device
(name, arch, memory), turning each failure into :class:`~ds4tui.engine.session.BackendUnavailableError`
text that names the cause: no toolchain, library failed to load, no device, wrong arch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
RECORD = PACKAGE_DIR / "gpu_build.json"
LIBRARIES = ("libds4tui_hip.so", "libds4tui_cuda.so")


@dataclass
class GPUBuild:
    """What build_native.py did about the GPU library (``gpu_build.json``); status ``unknown`` when
    the record is missing (a build that predates it, or a copied tree)."""

    status: str  # built | skipped | failed | unknown
    platform: str | None = None
    compiler: str | None = None
    compiler_version: str | None = None
    arch: str | None = None
    library: str | None = None
    reason: str = ""
    command: str | None = None
    #: built with DS4TUI_GPU_ROCM_FORMULAS=1 (CUDA: ROCm's shuffle and byte-perm arithmetic)
    rocm_formulas: bool = False


@dataclass
class GPUInfo:
    """``ds4_gpu_info`` of the C API: the library and device 0 as the runtime reports them."""

    library: str
    platform: str
    built_arch: str
    runtime_version: int
    driver_version: int
    n_devices: int
    device: int
    device_name: str
    device_arch: str
    warp_size: int
    arch_ok: bool
    mem_total: int  # bytes
    mem_free: int  # bytes
    integrated: bool = False  # the device shares the host's memory (an APU such as Strix Halo)
    #: the prefill GEMM's BLAS (spec platform.md §7): "cuBLAS 13.0.2 (libcublas.so.13)" or "none: why"
    blas: str = ""

    def to_json(self) -> dict:
        return asdict(self)


#: The GPU runtime a build's platform name stands for, in the words ``ds4tui doctor`` uses.
PLATFORM_WORDS = {"cuda": "CUDA", "hip": "ROCm"}


def gpu_backend_name(platform: str | None, arch: str | None) -> str:
    """The GPU backend (``--backend hip``) in words, by the build it is: ``GPU backend (HIP sources,
    built for CUDA sm_90)`` for nvcc's build, ``... built for ROCm gfx1151)`` for hipcc's; ``GPU
    backend (none built)`` when there is no library.  ``platform`` and ``arch`` as the library
    reports them (``ds4_gpu_info``) or the build record holds them (:func:`build_of`)."""
    if not platform:
        return "GPU backend (none built)"
    return f"GPU backend (HIP sources, built for {PLATFORM_WORDS.get(platform, platform)} {arch or 'an unknown arch'})"


def build_of(info: "GPUInfo | None", library: str | os.PathLike | None = None) -> tuple[str | None, str | None]:
    """(platform, arch) of the GPU library that ``--backend hip`` runs: what the library reported
    when it loaded (``info`` from :func:`probe`), else the build record's (``cuda`` / ``hip``) when
    the library is the built one (no other ``library`` named); (None, None) when neither says."""
    rec = build_record()
    platform = (info.platform if info else None) or (rec.platform if rec.status == "built" and not library else None)
    arch = (info.built_arch if info else None) or (rec.arch if platform else None)
    return platform, arch


def unavailable(info: "GPUInfo | None", why: str, library: str | os.PathLike | None = None) -> str:
    """``the GPU backend (HIP sources, built for CUDA sm_90) is unavailable: WHY``: the backend named
    by its build as ``ds4tui doctor`` names it (:func:`build_of`, :func:`gpu_backend_name`; on
    NVIDIA the library is the CUDA build of the HIP sources), or ``the GPU backend (--backend hip)
    is unavailable: WHY`` when no build is known (``why`` then says that none was built or loaded)."""
    platform, arch = build_of(info, library)
    name = gpu_backend_name(platform, arch) if platform else "GPU backend (--backend hip)"
    return f"the {name} is unavailable: {why}"


def plain_reason(info: "GPUInfo | None", library: str | os.PathLike | None = None,
                 refused: Exception | None = None) -> str:
    """Why no GPU runs here, in a few plain words: the first thing ``--backend auto`` says when it
    runs on the CPU (``no usable GPU (WHY): running on the CPU``), :func:`unavailable` giving the
    whole reason after it.  ``info`` and ``library`` as for :func:`unavailable`; ``refused``: the
    error :func:`admit` returned (the model does not fit, the first device pass failed)."""
    from ds4tui.engine.errors import DeviceFaultError, DeviceMemoryError

    if isinstance(refused, DeviceMemoryError):
        return "the model does not fit in its memory"
    if isinstance(refused, DeviceFaultError):
        return "it failed its first pass"
    if info is None or not info.platform:  # the library did not load
        if library:
            return (f"the GPU library {library} does not load" if Path(library).exists()
                    else f"the GPU library {library} does not exist")
        rec = build_record()
        if rec.status == "skipped":
            return "no GPU backend was built"
        if rec.status == "failed":
            return "the GPU backend failed to build"
        return "the GPU library does not load"
    runtime = PLATFORM_WORDS.get(info.platform, info.platform)
    if info.n_devices == 0:
        return f"no {runtime} driver is loaded" if info.driver_version == 0 else f"the {runtime} runtime sees no GPU"
    if info.device_name:
        return f"{info.device_name} cannot run this build (built for {info.built_arch})"
    return f"the {runtime} runtime gives no device {info.device}"


def build_record() -> GPUBuild:
    try:
        data = json.loads(RECORD.read_text())
    except FileNotFoundError:
        return GPUBuild(status="unknown", reason=f"{RECORD} is missing (rebuild with `pip install -e .` or "
                                                 f"`python build_native.py`)")
    except (OSError, ValueError) as exc:
        return GPUBuild(status="unknown", reason=f"{RECORD}: unreadable build record: {exc}")
    known = {k: data.get(k) for k in GPUBuild.__dataclass_fields__ if k in data}
    known.setdefault("status", "unknown")
    known["reason"] = known.get("reason") or ""
    return GPUBuild(**known)


def locate(library: str | os.PathLike | None = None) -> tuple[Path | None, str]:
    """(library path, "") or (None, why there is none).  ``library``: a library to use instead of
    the built one (it must exist)."""
    if library:
        p = Path(library)
        return (p, "") if p.exists() else (None, f"GPU library {p}: no such file")
    rec = build_record()
    if rec.status == "built" and rec.library and (PACKAGE_DIR / rec.library).exists():
        return PACKAGE_DIR / rec.library, ""
    for name in LIBRARIES:
        if (PACKAGE_DIR / name).exists():
            return PACKAGE_DIR / name, ""
    if rec.status == "skipped":
        return None, f"the GPU backend was not built: {rec.reason}"
    if rec.status == "failed":
        return None, f"the GPU backend failed to build: {rec.reason}"
    if rec.status == "built":
        return None, f"the GPU backend was built but {PACKAGE_DIR / (rec.library or '?')} is gone"
    return None, f"the GPU backend was not built ({rec.reason})"


_PRELOADED: list = []


def preload_vendor_blas() -> list[str]:
    """Map the NVIDIA BLAS of a pip-installed ``nvidia-cublas`` package (``nvidia/cublas/lib``),
    if there is one, so that the GPU library's ``dlopen("libcublas.so.N")`` finds it by its soname
    (spec platform.md §7; a system-wide cuBLAS or ROCm's rocBLAS is found by the dynamic loader
    itself).  Returns the files mapped; once per process."""
    if _PRELOADED:
        return [p for p in _PRELOADED if isinstance(p, str)]
    _PRELOADED.append(None)
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia.cublas")
    except (ImportError, ValueError):
        spec = None
    dirs = [Path(p) / "lib" for p in (spec.submodule_search_locations or [])] if spec else []
    import ctypes

    for d in dirs:
        for stem in ("libcublasLt.so", "libcublas.so"):  # Lt first: libcublas needs it
            for f in sorted(d.glob(stem + ".*"), reverse=True):
                try:
                    ctypes.CDLL(str(f), mode=ctypes.RTLD_GLOBAL)
                    _PRELOADED.append(str(f))
                    break
                except OSError:
                    continue
    return [p for p in _PRELOADED if isinstance(p, str)]


def probe(library: Path | str | None = None) -> tuple[GPUInfo | None, str]:
    """(info, "") when the library (``library``, else the built one: :func:`locate`) loads, a
    device is there and its kernels run on it; otherwise (info filled as far as the probe got, or
    None, and the reason)."""
    library, why = locate(library)
    if library is None:
        return None, why
    try:
        from ds4tui import _native
    except ImportError:  # the GPU library is loaded through the native engine: said as `ds4tui doctor` says it
        from ds4tui.engine.session import native_not_built

        return None, native_not_built()

    preload_vendor_blas()
    ffi, lib = _native.ffi, _native.lib
    info = ffi.new("ds4_gpu_info *")
    err = ffi.new("char[1024]")
    rc = lib.ds4_gpu_probe(str(library).encode(), info, err, 1024)
    s = lambda b: ffi.string(b).decode("utf-8", "replace")  # noqa: E731
    got = GPUInfo(library=s(info.library), platform=s(info.platform), built_arch=s(info.built_arch),
                  runtime_version=int(info.runtime_version), driver_version=int(info.driver_version),
                  n_devices=int(info.n_devices), device=int(info.device), device_name=s(info.device_name),
                  device_arch=s(info.device_arch), warp_size=int(info.warp_size), arch_ok=bool(info.arch_ok),
                  mem_total=int(info.mem_total), mem_free=int(info.mem_free), integrated=bool(info.integrated),
                  blas=s(info.blas))
    if rc != 0:
        return (got if got.platform else None), s(err)
    return got, ""


def admit(model, support, info: GPUInfo, draft_vocab_extra: int = 0):
    """Whether ``model`` (an opened DS4Model; ``support``: a support model or its path, or None; and
    ``draft_vocab_extra`` bytes of draft-vocabulary row copies, :func:`memplan.draft_vocab_bytes`) may
    go on the device of ``info``, decided before the engine uploads anything: None when it may,
    else the :class:`~ds4tui.engine.errors.BackendUnavailableError` to raise.  First the memory
    plan (:mod:`ds4tui.engine.memplan`: a :class:`~ds4tui.engine.errors.DeviceMemoryError` that
    names the numbers and, on AMD, the ``ttm.pages_limit`` to set); then, on AMD, the first device
    pass in a child process (:mod:`ds4tui.engine.device_check`: a
    :class:`~ds4tui.engine.errors.DeviceFaultError` where ROCm would abort this process)."""
    from ds4tui.engine import device_check, memplan

    too_big = memplan.check(model, support, info, draft_vocab_extra=draft_vocab_extra)
    if too_big is not None:
        return too_big
    if info.platform == "hip":
        return device_check.guard(info.library, model.config)
    return None
