"""``ds4tui doctor``: what was built, for which arch, and what the GPU runtime sees.

Prints the native engine's version, file and what it was compiled for (``ds4_build``: the
``-march`` target, the CPU the compiler made of it, the instruction-set extensions compiled in,
the compiler and its code-changing flags; the x86 extensions this CPU has that the build leaves
unused, and a warning for those it lacks), a warning when the package folder holds more than one
``_native*.so`` (Python imports one by its suffix, whatever their age), the GPU build record that
build_native.py wrote (``ds4tui/gpu_build.json``: toolchain, compiler version, offload arch, library, or why nothing was
built), then loads the GPU library and reports the device (name, arch, warp size, memory total and
free as the runtime reports them, runtime and driver versions) or exactly why the hip backend cannot
run: no toolchain, library failed to load, no device, wrong arch.  Last, every environment
variable ds4tui honours (:mod:`ds4tui.commands.environment`) with the value in force ("default: ..."
when unset), and the check of those that change what runs (a bad value is reported here, and the
commands that open an engine refuse it with status 2).  On an amdgpu machine it also reports the
GTT limit, whether it is the kernel's default half of RAM, and the ``ttm.pages_limit`` that raises
it (:func:`ds4tui.engine.memplan.gtt_report`).  A scheduler prices folder that cannot be used (a
file in its place, a read-only file system, a full disk, no permission to write), a demo unpack folder
that cannot take the files still to unpack (a file in its place, a read-only file system, no
permission, too little free space), a relative XDG_CACHE_HOME
(ignored) and a variable's value that the commands refuse are warnings that say what to do (in
both outputs: ``warnings`` in ``--json``).  Exit status 0 when
the report could be made (even without a GPU); 1 when the native engine itself is not built.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ds4tui.interrupts import print_whole


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


# The instruction-set names of ds4_build's `isa` as Linux's /proc/cpuinfo spells them.
_CPUINFO_FLAG = {"sse2": "sse2", "sse4.2": "sse4_2", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
                 "avxvnni": "avx_vnni", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vl": "avx512vl",
                 "avx512vnni": "avx512_vnni", "avx512vbmi": "avx512vbmi", "avx512bitalg": "avx512_bitalg"}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """This CPU's instruction-set flags (the first `flags` line of /proc/cpuinfo); None when unknown."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return None


def native_build(native) -> dict:
    """What the loaded extension was compiled for (ds4_build: the -march value, the CPU the compiler
    made of it, the code-changing flags, the instruction-set extensions compiled in, the compiler), with
    the x86 extensions this CPU lacks (`missing_here`) and has unused (`unused_here`); both [] when
    /proc/cpuinfo cannot say.  An extension built before it recorded its target: every field None."""
    keys = ("march", "cpu", "flags", "isa", "compiler")
    try:
        b = native.lib.ds4_build()
    except AttributeError:  # an older ds4tui's build, without ds4_build
        return {**dict.fromkeys(keys), "missing_here": [], "unused_here": []}
    rec = {k: native.ffi.string(getattr(b, k)).decode() for k in keys}
    have = cpu_flags() or set()  # unknown: nothing missing, nothing unused
    isa = rec["isa"].split()
    rec["missing_here"] = [i for i in isa if have and i in _CPUINFO_FLAG and _CPUINFO_FLAG[i] not in have]
    rec["unused_here"] = [i for i, flag in _CPUINFO_FLAG.items() if isa and flag in have and i not in isa]
    return rec


def _march_text(nb: dict) -> str:
    if nb["march"] == "unrecorded":
        return "a target it does not record (it was not built by build_native.py or pip)"
    m = f"-march={nb['march']}" if nb["march"] else "the compiler's default target"
    return f"{m} ({nb['cpu']})" if nb["cpu"] and nb["cpu"] != nb["march"] else m


def native_files(folder: Path) -> list[Path]:
    """Every native extension file in the package folder (`_native*.so`), by name."""
    return sorted(folder.glob("_native*.so"))


def installed_files(folder: Path) -> set[Path] | None:
    """The files pip installed in ``folder`` when it is an installed ds4tui (in site-packages, named by
    the distribution's RECORD), resolved; None for a source tree (an editable checkout, a clone)."""
    import site
    import sysconfig
    from importlib import metadata

    parent = folder.resolve().parent
    roots = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages(),
                                         sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]}
    if parent not in roots and parent.name not in ("site-packages", "dist-packages"):
        return None
    try:
        recorded = metadata.distribution("ds4tui").files or []
    except metadata.PackageNotFoundError:
        return set()
    return {Path(f.locate()).resolve() for f in recorded}


def duplicate_native_warning(loaded: Path, files: list[Path], installed: set[Path] | None = None) -> str:
    """More than one extension file: Python imports one by its suffix, whatever their age, so a later
    build under the other name is silently ignored.  Names each file (with its time), the one imported,
    and what to do.  In a source tree (``installed`` None): keep the newest, or rebuild (either build
    removes the others).  In an installed ds4tui (``installed``: the files pip installed,
    :func:`installed_files`): remove the files pip did not install (the newest when it names none of
    them); reinstalling would not, since pip removes only the files it installed."""
    from datetime import datetime

    def when(p: Path) -> str:
        return datetime.fromtimestamp(p.stat().st_mtime).strftime("%Y-%m-%d %H:%M:%S")

    loaded = loaded.resolve()
    shown = [f"{f} (modified {when(f)}{', the one Python imports' if f.resolve() == loaded else ', ignored'})"
             for f in files]
    head = (f"{len(files)} native engine files in {loaded.parent}: {' and '.join(shown)}. Python picks one by its "
            f"file name's suffix, not by age, so ")
    newest = max(files, key=lambda p: p.stat().st_mtime)
    if installed is None:
        stale = [str(f) for f in files if f != newest]
        return (f"{head}a build that wrote the other name has no effect. Keep the newest: `rm {' '.join(stale)}`; or "
                f"rebuild (`pip install -e .`, or `python build_native.py`): either writes one file and removes the others")
    ours = [f for f in files if f.resolve() in installed]
    stale = [str(f) for f in files if f not in ours] if ours else [str(f) for f in files if f != newest]
    keep = f"the one pip installed, {ours[0]}" if len(ours) == 1 else "the newest"
    return (f"{head}a file beside the one pip installed may be the one that runs. Keep {keep}: `rm {' '.join(stale)}` "
            f"(reinstalling does not remove it: pip removes only the files it installed)")


def collect() -> dict:
    """The report as one JSON-able dict."""
    from ds4tui import __version__, demo
    from ds4tui.commands import environment
    from ds4tui.engine import gpu, memplan, prices
    from ds4tui.engine.backend import DEFAULT_SCHEDULER_POLICY, SCHEDULER_POLICIES
    from ds4tui.engine.session import amx_available, auto_activations, auto_amx, auto_verify_head, native_not_built

    env = environment.report()
    out: dict = {"ds4tui": __version__, "demo": demo.status(), "environment": env}
    try:
        from ds4tui import _native
    except ImportError as exc:
        out["native"] = None
        out["native_error"] = f"{native_not_built()} ({exc})"
        return out
    out["native"] = _native.ffi.string(_native.lib.ds4_version()).decode()
    out["native_file"] = _native.__file__
    out["native_build"] = native_build(_native)
    files = native_files(Path(_native.__file__).parent)
    out["native_files"] = [str(f) for f in files]
    out["gpu_build"] = gpu.build_record().__dict__
    lib, why = gpu.locate(next(v["value"] for v in env if v["name"] == "DS4TUI_GPU_LIB"))
    out["gpu_library"] = str(lib) if lib else None
    info, why2 = gpu.probe(lib) if lib else (None, why)
    out["gpu"] = info.to_json() if info else None
    out["hip_available"] = not why2
    out["hip_unavailable_reason"] = why2
    out["auto_backend"] = "hip" if not why2 else "cpu"
    # which build `--backend hip` is: the HIP sources built by hipcc for AMD, or by nvcc for NVIDIA
    # (hip_compat.h): what the library reports when it loads, else the build record
    other_lib = next(v["value"] for v in env if v["name"] == "DS4TUI_GPU_LIB")  # not the build's library
    platform, arch = gpu.build_of(info, other_lib)
    out["gpu_backend"] = {"flag": "--backend hip", "platform": platform, "arch": arch,
                          "name": gpu.gpu_backend_name(platform, arch) if platform or not other_lib else
                          "GPU backend (the library DS4TUI_GPU_LIB names, which did not load)"}
    # the prefill GEMM (spec platform.md §7): the BLAS the GPU library found, and what the option gives here
    out["blas"] = info.blas if info else None
    want = next((v["value"] for v in env if v["name"] == "DS4TUI_PREFILL_GEMM"), None) or "auto"
    found = bool(info and info.blas and not info.blas.startswith("none"))
    if want == "off":
        got = "off (chosen): float32 products everywhere"
    elif why2:
        got = f"off on the cpu backend (float32 products); the GPU backend (--backend hip) is unavailable"
    elif found:
        got = f"{'bf16' if want == 'auto' else want} for passes of 32+ tokens through {info.blas}"
    else:
        got = ("off (auto): " if want == "auto" else f"{want} refused at open: ") + (info.blas if info else "no BLAS")
    out["prefill_gemm"] = {"wanted": want, "in_force": got}
    # the matmul activations (spec ds4.md §2.9.5): a flag of chat, generate and bench, no variable
    out["activations"] = {"default": "auto", "choices": ["auto", "f32", "q8"],
                          "note": "auto: q8 on the cpu backend (as ds4 and llama.cpp compute on a CPU), f32 on hip; "
                                  "f32 (--activations f32 on chat, generate and bench): float32 activations for "
                                  "every weight type; q8: 8-bit activations for Q8_0, Q2_K and IQ2_XXS matrices, cpu "
                                  "and hip backends",
                          # what auto runs here: the backend --backend auto chooses decides it
                          "here": auto_activations(out["auto_backend"])[0]}
    # graphs of the decode and verify passes (spec platform.md §8): a flag of chat, generate and bench, no variable
    out["gpu_graphs"] = {"default": "off", "choices": ["off", "on"],
                         "note": "on (--gpu-graphs on on chat, generate and bench): each pass of at most 17 rows "
                                 "(decode, DSpark verify) replayed from a graph of its shape on the hip backend, the "
                                 "same kernels and logits bit for bit; off: kernels launched one by one"}
    # the tokens DSpark's drafter proposes from (spec dspark.md §2.6): a flag of chat, generate and bench
    out["draft_vocab"] = {"default": environment.Settings().draft_vocab, "choices": ["auto", "full", "N"],
                          "note": "the tokens DSpark's drafter proposes from (--draft-vocab on chat, generate and "
                                  "bench): auto (the support file's draft vocabulary when it has one, else all), "
                                  "full (the whole vocabulary) or N (the first N of the file's list); only the "
                                  "drafts change, never the output"}
    # which rows of a DSpark verify get the LM head (spec dspark.md §3.4): a flag of chat, generate and bench
    out["verify_head"] = {"default": environment.Settings().verify_head, "choices": ["auto", "lazy", "all"],
                          "note": "which rows of a DSpark verify get the LM head (--verify-head on chat, generate "
                                  "and bench): auto (lazy on the cpu backend with f32 activations, all with q8 and on "
                                  "hip), lazy (rows 0-2, and the "
                                  "others only when their drafts were all accepted: the same tokens, a cheaper "
                                  "verify; cpu backend only, refused with --backend hip) or all (every row); the hip "
                                  "backend always runs all (its verify is one pass on the device)",
                          # what auto runs here: the backend --backend auto chooses decides it
                          "here": auto_verify_head(out["auto_backend"], auto_activations(out["auto_backend"])[0])[0]}
    # Q8_0 products on the AMX tiles (spec ds4.md §2.9.6): a flag of chat, generate and bench
    amx_ok, amx_why = amx_available()
    out["amx"] = {"default": environment.Settings().amx, "choices": ["auto", "on", "off"],
                  "available": amx_ok, "reason": amx_why,
                  "note": "Q8_0 products on Intel's AMX tiles (--amx on chat, generate and bench): the same results "
                          "bit for bit, a verify's LM head costing about its weight read, and a repacked copy of the "
                          "Q8_0 matrices in memory; auto turns it on where the cpu backend multiplies q8 activations "
                          "and the CPU has AMX-INT8",
                  # what auto runs here: the backend --backend auto chooses, with its default activations
                  "here": auto_amx(out["auto_backend"], auto_activations(out["auto_backend"])[0])[0]}
    # what the DSpark scheduler decides from (spec dspark.md §7.6): a knob, a flag of chat, generate and bench --ab
    out["scheduler_policy"] = {"default": DEFAULT_SCHEDULER_POLICY, "choices": list(SCHEDULER_POLICIES),
                               "note": "what the DSpark scheduler decides from (--scheduler-policy on chat, generate "
                                       "and bench --ab; Ctrl+R and the knobs pane in the chat): confidence (each "
                                       "proposal's drafts verified as far as their confidences, calibrated on the "
                                       "verifies so far, pay; proposals skipped while recent cycles gained nothing) "
                                       "or acceptance (drafting decided before proposing, from the acceptance "
                                       "measured at each draft position, with probes); it changes what is verified, "
                                       "never a greedy answer (sampled answers draw from the same distribution)"}
    # where the DSpark scheduler's prices start (spec dspark.md §7.4): a flag of chat, generate and bench
    folder = environment.scheduler_prices_dir()
    saved = sorted(folder.glob("*.json")) if folder.is_dir() else []
    unusable = prices.folder_problem(folder)
    prices_problem = None if unusable is None else (
        f"the scheduler prices folder {folder} cannot be used: expected a writable folder, found {unusable[0]}, so "
        f"--scheduler-prices saved (the default) keeps no prices between runs. To fix it, "
        f"{prices.keep_advice(unusable[1])}")
    out["scheduler_prices"] = {
        "default": environment.Settings().scheduler_prices, "choices": ["fresh", "engine", "saved"],
        "folder": str(folder), "saved_files": len(saved), "problem": prices_problem,
        "note": "where a new session's DSpark scheduler starts (--scheduler-prices on chat, generate and bench): "
                "fresh (it drafts once to price a verify and the drafter's acceptance), engine (from the run's "
                "earlier sessions) or saved (as engine, and kept between runs in the folder, one file per model, "
                "support file, backend, threads, numerics, activations, draft vocabulary, verify head and AMX tiles)"}
    out["gtt"] = memplan.gtt_report()
    hsa = os.environ.get("HSA_OVERRIDE_GFX_VERSION")
    out["warnings"] = [prices_problem] if prices_problem else []
    if len(files) > 1:
        out["warnings"].append(duplicate_native_warning(Path(_native.__file__), files,
                                                        installed_files(Path(_native.__file__).parent)))
    if out["native_build"]["missing_here"]:
        nb = out["native_build"]
        out["warnings"].append(f"the native engine {_native.__file__} was built for {_march_text(nb)} with "
                               f"{' '.join(nb['missing_here'])}, which this CPU does not have: the CPU kernels stop "
                               f"with 'Illegal instruction'. Rebuild it on this machine (`pip install .`, or "
                               f"`python build_native.py` in a source tree), or set DS4TUI_MARCH to a target this "
                               f"CPU runs (e.g. x86-64-v2) before building")
    out["warnings"] += [v["ignored"] for v in env if v.get("ignored")]
    # a value a command refuses: in the environment list (marked invalid) and here, in both outputs
    out["warnings"] += [f"{v['error']}; chat, generate and bench refuse to start while it is set so (exit status 2): "
                        f"set an accepted value, or unset it" for v in env if v.get("error")]
    out["warnings"] += [v["problem"] for v in env if v.get("problem")]
    demo_problem = out["demo"].get("problem")
    if demo_problem and not any(w.startswith(demo_problem) for w in out["warnings"]):  # said once
        out["warnings"].append(demo_problem)
    if hsa:
        out["warnings"].append(f"HSA_OVERRIDE_GFX_VERSION={hsa} is set: the runtime then looks for code objects of "
                               f"that version, not the ones this library was built for (spec platform.md §1.1)")
    return out


def native_build_line(nb: dict) -> str:
    """doctor's line for the extension's build: target, instruction sets, compiler and flags, and the
    extensions this CPU has that the build leaves unused."""
    if nb["isa"] is None:
        return ("not recorded: an older ds4tui built this extension, before it recorded its target; rebuild it "
                "(`pip install -e .`, or `python build_native.py`) to see the target here")
    line = (f"for {_march_text(nb)}: {nb['isa'] or 'no vector extensions'}; {nb['compiler']}"
            + (f", {nb['flags']}" if nb["flags"] != "unrecorded" else ""))
    if nb["unused_here"]:
        line += (f"\n  this CPU also has {' '.join(nb['unused_here'])}, which this build does not use: rebuild "
                 f"without DS4TUI_MARCH (`pip install .`, or `python build_native.py` in a source tree) to use them")
    return line


def run(args) -> int:
    r = collect()
    if args.json:
        print_whole(json.dumps(r, indent=2))
        return 0 if r.get("native") else 1
    if not r.get("native"):
        print(f"ds4tui doctor: {r['native_error']}", file=sys.stderr)
        return 1
    b = r["gpu_build"]
    lines = [
        ("ds4tui", r["ds4tui"]),
        ("native", f"{r['native']}  ({r['native_file']})"),
        ("native build", native_build_line(r["native_build"])),
        ("gpu build", b["status"] + (f": {b['platform']} for {b['arch']} with {b['compiler']} ({b['compiler_version']})"
                                     if b.get("platform") else "") + (", ROCm shuffle and byte-perm formulas"
                                                                        if b.get("rocm_formulas") else "")
         + (f"\n  reason: {b['reason']}" if b["reason"] else "")),
        ("gpu library", r["gpu_library"] or "none"),
    ]
    g = r["gpu"]
    if g and g.get("n_devices"):
        lines += [
            ("platform", f"{g['platform']} (runtime {g['runtime_version']}, driver {g['driver_version']}), "
                         f"{g['n_devices']} device(s)"),
            ("device", f"{g['device']}: {g['device_name']} ({g['device_arch']}, warp {g['warp_size']})"),
            ("built for", f"{g['built_arch']} ({'runs on this device' if g['arch_ok'] else 'does NOT run here'})"),
            ("memory", f"{_gib(g['mem_total'])} total, {_gib(g['mem_free'])} free (as the runtime reports it)"),
        ]
    gb = r["gpu_backend"]
    built = gb["name"].removeprefix("GPU backend (").removesuffix(")")
    lines.append(("gpu backend", f"{built} ({gb['flag']}): "
                  + ("available" if r["hip_available"] else f"unavailable: {r['hip_unavailable_reason']}")))
    lines.append(("--backend auto", r["auto_backend"]))
    if r.get("blas") is not None:
        lines.append(("gpu blas", r["blas"]))
    lines.append(("prefill gemm", f"{r['prefill_gemm']['wanted']}: {r['prefill_gemm']['in_force']}"))
    lines.append(("activations", f"{r['activations']['default']} by default (here {r['activations']['here']}, on the "
                                 f"{r['auto_backend']} backend that --backend auto chooses); {r['activations']['note']}"))
    lines.append(("gpu graphs", f"{r['gpu_graphs']['default']} by default; {r['gpu_graphs']['note']}"))
    lines.append(("draft vocab", f"{r['draft_vocab']['default']} by default; {r['draft_vocab']['note']}"))
    lines.append(("verify head", f"{r['verify_head']['default']} by default (here {r['verify_head']['here']}, on the "
                                 f"{r['auto_backend']} backend that --backend auto chooses, with its default "
                                 f"activations); {r['verify_head']['note']}"))
    amx = r["amx"]
    lines.append(("amx", f"{amx['default']} by default (here {amx['here']}, on the {r['auto_backend']} backend that "
                         f"--backend auto chooses, with its default activations); this CPU: "
                         f"{'AMX-INT8 available' if amx['available'] else amx['reason']}; {amx['note']}"))
    lines.append(("scheduler policy", f"{r['scheduler_policy']['default']} by default; {r['scheduler_policy']['note']}"))
    sp = r["scheduler_prices"]
    lines.append(("scheduler prices", f"{sp['default']} by default; {sp['note']}; {sp['saved_files']} saved "
                                      f"file(s) in {sp['folder']}"
                  + (" (the folder cannot be used: see the warning below)" if sp["problem"] else "")))
    if r["gtt"]["card"]:
        lines.append(("gtt limit", f"{r['gtt']['card']}: {r['gtt']['note']}"))
    d = r["demo"]
    if not d["bundled"]:
        lines.append(("demo model", "not in this build"))
    else:
        where = "unpacked in" if d["unpacked"] else "unpacked on first use into"
        lines.append(("demo model", f"bundled ({d['bytes'] / 2**20:.0f} MiB unpacked), "
                      + (f"{where} {d['folder']}" if d["folder"] else "no folder to unpack it into")
                      + (" (it cannot be unpacked there: see the warning below)" if d.get("problem") and d["folder"]
                         else " (see the warning below)" if d.get("problem") else "")))
        for o in d.get("other_versions", []):
            lines.append(("", f"another version's pair ({o['bytes'] / 2**20:.0f} MiB), unused by this ds4tui: "
                              f"{o['folder']} (delete it to free the space)"))
    w = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k:<{w}}  {v}")
    print("environment")
    nw = max(len(v["name"]) for v in r["environment"])
    for v in r["environment"]:
        print(f"  {v['name']:<{nw}}  {v['in_force']}" + (f"  (invalid: {v['error']})" if v["error"] else "")
              + ("  (see the warning below)" if v.get("problem") else ""))
    for msg in r["warnings"]:
        print(f"warning: {msg}")
    return 0
