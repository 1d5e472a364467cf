"""ds4tui against llama.cpp on the same GGUF files, side by side in one run.  Not part of CI.

    python tools/peer_bench.py MODEL.gguf [MODEL2.gguf ...] --threads 2 [--pairs 3] [--json out.json]  # CPU
    python tools/peer_bench.py --synthetic-flash DIR --backend hip [--pairs 3]                         # GPU

llama.cpp's DeepSeek V4 loader takes compression ratios 0, 4 and 128 only, so neither the bundled
demo nor ``bench --medium`` (HCA ratio 16) loads there; a medium-sized model both engines read:
``python -m ds4tui.devtools.make_test_model DIR --config tiny128 --layers 8 --hidden 1024 --experts
64`` (HCA ratio 128, heads of 256).  llama.cpp's CPU threads spin while they wait, so under any
other load on the cores its multi-threaded figures collapse (on a 2-core machine shared with other
work: 4.8 tok/s decode with 2 threads against 29 with 1): measure on a quiet machine.

The peer is llama.cpp as vendored in the llama-cpp-python sdist on PyPI (``--sdist-version``,
default 0.3.36, whose llama.cpp reads the ``deepseek4`` architecture): its ``llama-bench`` is built
once into ``--build-dir`` (default ``$XDG_CACHE_HOME/ds4tui/peer/llama.cpp-VERSION-BUILD``) for the
CPU (``-DGGML_NATIVE=ON``), CUDA (``--backend hip`` on an NVIDIA machine) or HIP (``--backend hip``
with ``--amd-target gfx1151``), or taken from ``--llama-bench PATH``.  Building needs cmake and a
C++ compiler (nvcc for CUDA, hipcc/clang with ROCm for HIP); the sdist is fetched with pip, or
``--llama-src DIR`` names a llama.cpp source tree to build instead (a machine that cannot reach
PyPI: the sdist is 76 MB, but its ``vendor/llama.cpp`` without ``models``, ``docs``, ``media``,
``benches``, ``gguf-py``, ``conversion``, ``tools/ui`` and the ggml backends other than
``ggml-cpu`` and ``ggml-cuda`` / ``ggml-hip`` is a 5 MB ``tar.xz`` that a device call can carry).
The CUDA build is one static executable without the flash-attention kernels (llama-bench runs
with ``-fa 0``, as the figures the issues start from): 215 s on the H200 machine's 16 cores.

Both engines are timed alike: one untimed warm-up run, then the mean rate of ``--peer-repeats`` runs
(llama-bench ``-r``; ours ``ds4tui bench --repeat`` with its first run dropped), so the first run's
one-time costs (the GPU's BLAS handles, scratch, first touches of the weights) count for neither.

What is timed, per file, the two engines alternating in each pair (ours first in odd pairs, the
peer first in even ones) so that a slow spell of a shared machine lands on both (``--prefill-only``:
the prefill alone, for the prefill goals at long prompts):

* **prefill** of ``--prompt-tokens`` tokens: ours ``ds4tui bench`` (prefill tok/s), llama-bench
  ``-p P -n 0``;
* **decode** of ``--decode-tokens`` tokens after that prompt: ours ``ds4tui bench`` (greedy decode
  steps), llama-bench ``-n T -d P`` (token generation at depth P);
* **verify / decode**: the time of one pass over 6 rows against one pass over 1 row after the
  prompt: ours ``tools/verify_ratio.py`` (all 6 rows' logits, what a DSpark verify computes),
  llama-bench ``-p 1,6 -d P`` (pp6 / pp1 as times; llama.cpp computes the last row's logits only).

``--synthetic-flash DIR`` times the 2- and 4-layer full-width models that ``ds4tui bench
--synthetic flash --write-gguf DIR`` writes (written first when missing) and extrapolates every
time to 43 layers the way that benchmark does: per layer = (t4 - t2) / 2, fixed = t2 - 2 x per
layer, 43 layers = fixed + 43 x per layer.  Every figure is the median over the pairs with its
range; the JSON (``--json``) holds every pair's numbers, the commands and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SDIST = "0.3.36"


def log(msg: str) -> None:
    print(f"peer_bench: {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ds4tui" / "peer"


def peer_build(backend: str, amd_target: str) -> str:
    """Which llama.cpp build times a backend of ours: cpu, cuda (NVIDIA) or hip (AMD)."""
    if backend == "cpu":
        return "cpu"
    return f"hip-{amd_target}" if amd_target else "cuda"


def _step(step: str, cmd: list[str], advice: str, **kw) -> None:
    """Run one build step; a failure ends the program with one line (status 1): the step, the
    command and what to do (the command's own output is above it)."""
    try:
        subprocess.run(cmd, check=True, **kw)
    except (subprocess.CalledProcessError, OSError) as exc:
        why = f"exited {exc.returncode}" if isinstance(exc, subprocess.CalledProcessError) else (exc.strerror or exc)
        raise SystemExit(f"peer_bench: the {step} step failed: `{' '.join(cmd)}` {why}; {advice}") from None


def build_llama_bench(version: str, build: str, folder: Path, src: Path | None = None) -> Path:
    """llama-bench of the llama.cpp in llama-cpp-python ``version``'s sdist (or of the llama.cpp
    source tree ``src``), built in ``folder``."""
    exe = folder / "build" / "bin" / "llama-bench"
    if exe.exists():
        return exe
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"peer_bench: {folder}: cannot create the build folder ({exc.strerror or exc}); give "
                         f"--build-dir DIR in a place you can write") from None
    if src is None:
        sdists = list(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
        if not sdists:
            log(f"fetching the llama-cpp-python {version} sdist")
            _step("fetch", [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d",
                            str(folder), f"llama-cpp-python=={version}"],
                  f"check that llama-cpp-python {version} exists on PyPI (--sdist-version) and that pip can reach "
                  f"it, or give --llama-src DIR or --llama-bench EXE")
            sdists = list(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
            if not sdists:
                raise SystemExit(f"peer_bench: the fetch step failed: pip wrote no llama_cpp_python-{version}.tar.gz "
                                 f"in {folder}; give --llama-src DIR or --llama-bench EXE")
        src = folder / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
        if not src.exists():
            log(f"unpacking {sdists[0].name}")
            try:
                with tarfile.open(sdists[0]) as tf:
                    tf.extractall(folder, filter="data")
            except (tarfile.TarError, OSError) as exc:
                raise SystemExit(f"peer_bench: the fetch step failed: cannot unpack {sdists[0]} ({exc}); delete it "
                                 f"and run again to fetch it anew") from None
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF"]
    if build == "cpu":
        flags += ["-DGGML_NATIVE=ON"]
    elif build == "cuda":
        # -fa 0 is what is timed (the figures the issues start from), so the flash-attention kernels
        # compile as empty stubs (GGML_CUDA_FA=OFF), which halves the build; one static executable
        # (no libggml*.so beside it) can be kept and carried to another machine of the same kind
        flags += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native", "-DGGML_CUDA_FA=OFF",
                  "-DGGML_CUDA_NCCL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
    else:
        flags += ["-DGGML_HIP=ON", f"-DGPU_TARGETS={build.split('-', 1)[1]}"]
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    log(f"building llama-bench ({build}) in {folder / 'build'}: several minutes")
    t0 = time.perf_counter()
    _step("configure", ["cmake", "-S", str(src), "-B", str(folder / "build"), *gen, *flags],
          f"cmake's errors are above: check the llama.cpp source tree {src} and the {build} toolchain "
          f"(or give --llama-bench EXE)", stdout=subprocess.DEVNULL)
    _step("build", ["cmake", "--build", str(folder / "build"), "--target", "llama-bench", "-j",
                    str(os.cpu_count() or 2)],
          f"the compiler's errors are above: fix the {build} toolchain or the source tree (or give --llama-bench EXE)",
          stdout=subprocess.DEVNULL)
    log(f"built in {time.perf_counter() - t0:.0f} s")
    return exe


def run_json(cmd: list[str]) -> object:
    """Run a command and parse its standard output as JSON (stderr passes through)."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"peer_bench: {' '.join(cmd)} exited {p.returncode}")
    return json.loads(p.stdout)


def graphs_flag(a) -> list[str]:
    """ds4tui's ``--gpu-graphs`` flag for ``a`` (the GPU backend only: the cpu launches nothing)."""
    return ["--gpu-graphs", a.gpu_graphs] if a.backend == "hip" else []


def ours(model: Path, a) -> dict:
    """ds4tui's prefill and decode tok/s (``ds4tui bench``), then its verify(6) / decode ratio
    (``--prefill-only``: the prefill alone)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    py = sys.executable
    b = subprocess.run([py, "-m", "ds4tui", "bench", str(model), "--backend", a.backend, "--threads", str(a.threads),
                        "--prompt-tokens", str(a.prompt_tokens), "--decode-tokens", str(a.decode_tokens),
                        "--activations", a.activations, *graphs_flag(a), "--repeat", str(a.peer_repeats + 1), "--json"],
                       stdout=subprocess.PIPE, text=True, env=env)
    if b.returncode != 0:
        raise SystemExit(f"peer_bench: ds4tui bench {model} exited {b.returncode}")
    r = json.loads(b.stdout)
    # timed as llama-bench times: one untimed warm-up run, then the mean rate of the --peer-repeats runs
    rates = {k: statistics.mean(run[k] for run in r["runs"][1:])
             for k in ("prefill_tokens_per_s", "decode_tokens_per_s")}
    if a.prefill_only:
        return {"prefill_ms": a.prompt_tokens / rates["prefill_tokens_per_s"] * 1e3}
    v = subprocess.run([py, str(ROOT / "tools" / "verify_ratio.py"), str(model), "--backend", a.backend,
                        "--threads", str(a.threads), "--rounds", str(a.verify_rounds), "--activations", a.activations,
                        *graphs_flag(a), "--json"],
                       stdout=subprocess.PIPE, text=True, env=env)
    if v.returncode != 0:
        raise SystemExit(f"peer_bench: verify_ratio {model} exited {v.returncode}")
    vr = json.loads(v.stdout)
    return {"prefill_ms": a.prompt_tokens / rates["prefill_tokens_per_s"] * 1e3,
            "decode_ms": 1e3 / rates["decode_tokens_per_s"],
            "pass1_ms": vr["decode_ms"]["median"], "pass6_ms": vr["verify_ms"]["median"]}


def peer(exe: Path, model: Path, a) -> dict:
    """llama.cpp's prefill (pp P), decode (tg T at depth P) and pp1 / pp6 at depth P, in ms
    (``--prefill-only``: pp P alone)."""
    base = [str(exe), "-m", str(model), "-t", str(a.threads), "-ngl", "0" if a.backend == "cpu" else "99",
            "-fa", "0", "-r", str(a.peer_repeats), "-o", "json"]
    rows = run_json(base + ["-p", str(a.prompt_tokens), "-n", "0"])
    if a.prefill_only:
        return {"prefill_ms": int(rows[0]["n_prompt"]) / float(rows[0]["avg_ts"]) * 1e3}
    rows += run_json(base + ["-p", "1,6", "-n", str(a.decode_tokens), "-d", str(a.prompt_tokens)])
    ms = {}
    for row in rows:
        n_p, n_g, tps = int(row["n_prompt"]), int(row["n_gen"]), float(row["avg_ts"])
        key = f"pp{n_p}" if n_g == 0 else f"tg{n_g}"
        ms[key] = (n_p or n_g) / tps * 1e3
    return {"prefill_ms": ms[f"pp{a.prompt_tokens}"], "decode_ms": ms[f"tg{a.decode_tokens}"] / a.decode_tokens,
            "pass1_ms": ms["pp1"], "pass6_ms": ms["pp6"]}


METRICS = ("prefill_ms", "decode_ms", "pass1_ms", "pass6_ms")


def extrapolate(t2: dict, t4: dict, layers: int = 43) -> dict:
    """Each time of a 2- and a 4-layer model carried to ``layers`` layers: fixed + layers x per layer."""
    out = {}
    for k in (m for m in METRICS if m in t2):
        per = (t4[k] - t2[k]) / 2
        out[k] = (t2[k] - 2 * per) + layers * per
    return out


def figures(t: dict, a) -> dict:
    """The reported figures of one set of times (``--prefill-only``: the prefill's alone)."""
    if a.prefill_only:
        return {"prefill_tokens_per_s": a.prompt_tokens / t["prefill_ms"] * 1e3}
    return {"prefill_tokens_per_s": a.prompt_tokens / t["prefill_ms"] * 1e3,
            "decode_tokens_per_s": 1e3 / t["decode_ms"],
            "verify_over_decode": t["pass6_ms"] / t["pass1_ms"]}


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path, help="DS4 GGUF files")
    ap.add_argument("--synthetic-flash", type=Path, metavar="DIR",
                    help="the full-width 2- and 4-layer models in DIR (written when missing), extrapolated to 43 layers")
    ap.add_argument("--backend", choices=("cpu", "hip"), default="cpu")
    ap.add_argument("--amd-target", default="", help="build llama.cpp for this AMD target (e.g. gfx1151) with HIP")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-graphs", choices=("off", "on"), default="off",
                    help="ds4tui replays its decode and verify passes from graphs (spec platform.md §8; "
                         "--backend hip only; default off)")
    ap.add_argument("--activations", choices=("f32", "q8"), default="f32",
                    help="ds4tui's matmul activations (a numerics option, spec ds4.md §2.9.5; default f32)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=3, help="alternating pairs of runs (default 3)")
    ap.add_argument("--verify-rounds", type=int, default=10, help="verify_ratio.py rounds per run (default 10)")
    ap.add_argument("--peer-repeats", type=int, default=3,
                    help="timed runs of each engine, after one warm-up run each (llama-bench -r; default 3)")
    ap.add_argument("--sdist-version", default=DEFAULT_SDIST)
    ap.add_argument("--build-dir", type=Path)
    ap.add_argument("--llama-bench", type=Path, help="use this llama-bench instead of building one")
    ap.add_argument("--llama-src", type=Path, metavar="DIR",
                    help="build llama-bench from this llama.cpp source tree instead of the sdist")
    ap.add_argument("--prefill-only", action="store_true", help="time the prefill alone (no decode, no verify)")
    ap.add_argument("--build-only", action="store_true",
                    help="build llama-bench (in --build-dir), print its path and stop: no model is read or written")
    ap.add_argument("--json", type=Path, help="write every pair's numbers here")
    a = ap.parse_args(argv)

    # every input is checked here, before minutes of fetching and building llama.cpp
    for flag in ("threads", "prompt_tokens", "decode_tokens", "pairs", "verify_rounds", "peer_repeats"):
        if getattr(a, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(a, flag)}")
    if a.llama_bench is not None and not (a.llama_bench.is_file() and os.access(a.llama_bench, os.X_OK)):
        ap.error(f"--llama-bench {a.llama_bench}: not an executable file")
    if a.llama_src is not None and not (a.llama_src / "CMakeLists.txt").is_file():
        ap.error(f"--llama-src {a.llama_src}: no CMakeLists.txt there (expected a llama.cpp source tree)")
    if a.build_dir is not None and a.build_dir.exists() and not a.build_dir.is_dir():
        ap.error(f"--build-dir {a.build_dir}: is a file, not a folder (give a folder to build llama-bench in)")
    build = peer_build(a.backend, a.amd_target)
    tag = "src" if a.llama_src else a.sdist_version
    folder = a.build_dir or cache_root() / f"llama.cpp-{tag}-{build}"
    if a.build_only:
        print(a.llama_bench or build_llama_bench(a.sdist_version, build, folder, a.llama_src))
        return 0
    sys.path.insert(0, str(ROOT))
    from ds4tui.engine.errors import ConversionError
    from ds4tui.engine.gguf_model import DS4Model, ModelFileError

    files = list(a.models)
    n_plain = len(files)
    if a.synthetic_flash:
        from ds4tui.engine import synthetic

        paths = [a.synthetic_flash / synthetic.GGUF_NAMES[n] for n in (2, 4)]
        if not all(p.exists() for p in paths):
            try:
                synthetic.write_flash_ggufs(a.synthetic_flash, log=log)
            except ConversionError as exc:
                ap.error(f"--synthetic-flash {a.synthetic_flash}: {exc}")
        files += paths
    if not files:
        ap.error("give GGUF files or --synthetic-flash DIR")
    for f in files:
        if not f.is_file():
            ap.error(f"{f}: no such file")
        try:
            ratios = DS4Model(f).config.compress_ratios
        except (ModelFileError, OSError) as exc:
            ap.error(f"{f}: not a DS4 GGUF ds4tui can read: {exc}")
        if not set(ratios) <= {0, 4, 128}:
            ap.error(f"{f}: compression ratios {sorted(set(ratios))}, but llama.cpp's DeepSeek V4 loader takes only "
                     "0, 4 and 128 (make a comparable model with make_test_model --config tiny128)")
    exe = a.llama_bench or build_llama_bench(a.sdist_version, build, folder, a.llama_src)
    pairs = []
    for i in range(a.pairs):
        order = ("ours", "peer") if i % 2 == 0 else ("peer", "ours")
        pair = {}
        for f in files:
            pair[str(f)] = {}
            for who in order:
                log(f"pair {i + 1}/{a.pairs}: {who} on {f.name}")
                pair[str(f)][who] = ours(f, a) if who == "ours" else peer(exe, f, a)
        pairs.append(pair)
    groups = {str(f): [str(f)] for f in files[:n_plain]}
    if a.synthetic_flash:
        groups["synthetic flash, 43 layers"] = [str(p) for p in files[n_plain:]]
    summary = {}
    for label, names in groups.items():
        per_pair = {"ours": [], "peer": []}
        for pair in pairs:
            for who in per_pair:
                t = (extrapolate(pair[names[0]][who], pair[names[1]][who]) if len(names) == 2
                     else pair[names[0]][who])
                per_pair[who].append(figures(t, a))
        summary[label] = {}
        for k in figures({"prefill_ms": 1.0, "decode_ms": 1.0, "pass1_ms": 1.0, "pass6_ms": 1.0}, a):
            o, p = [x[k] for x in per_pair["ours"]], [x[k] for x in per_pair["peer"]]
            summary[label][k] = {"ours": spread(o), "llama.cpp": spread(p),
                                 "ours_over_llama.cpp": spread([x / y for x, y in zip(o, p)])}
    out = {"backend": a.backend, "threads": a.threads, "activations": a.activations, "gpu_graphs": a.gpu_graphs,
           "prompt_tokens": a.prompt_tokens, "decode_tokens": a.decode_tokens, "pairs": a.pairs,
           "peer": {"llama_bench": str(exe),
                    "source": (f"llama.cpp source tree {a.llama_src}" if a.llama_src
                               else f"llama-cpp-python {a.sdist_version} sdist (vendor/llama.cpp)"),
                    "build": build},
           "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                       "load_average": os.getloadavg()},
           "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
           "summary": summary, "runs": pairs}
    for label, s in summary.items():
        print(f"{label} ({a.backend}, {a.threads} threads, ds4tui activations {a.activations}, graphs {a.gpu_graphs}, {a.pairs} alternating "
              f"pairs; median [range])")
        for k, v in s.items():
            o, p, r = v["ours"], v["llama.cpp"], v["ours_over_llama.cpp"]
            print(f"  {k:22s} ds4tui {o['median']:9.2f} [{o['min']:.2f}-{o['max']:.2f}]   llama.cpp "
                  f"{p['median']:9.2f} [{p['min']:.2f}-{p['max']:.2f}]   ratio {r['median']:.2f} "
                  f"[{r['min']:.2f}-{r['max']:.2f}]")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
