"""Several builds of the GPU library side by side, from other revisions' (or edited copies of) its sources,
for ``tools/gpu_lib_profile.py`` and ``tools/gpu_lib_ab.py`` to compare in one device call.  Not part of CI.

    python tools/gpu_build_variants.py export REV DIR
        # REV's ds4tui/native/hip/ (its sources and headers) into DIR, from git's history (run it where
        # the history is: a device call carries the working tree, not the repository)
    python tools/gpu_build_variants.py build OUTDIR NAME[=DIR] ... [--jobs N]
        # OUTDIR/NAME.so each, built by build_native.py's own command (its toolchain, DS4TUI_CUDA_ARCH or
        # DS4TUI_HIP_ARCH, no fast-math, no FMA contraction) with DIR's copy of every file of hip/ that
        # DIR holds; NAME alone builds this tree's sources

A variant takes what lies outside ``hip/`` (``native/*.h``, the generated ``cpu/iq2xxs_tables.h``) from
this tree, so run ``python build_native.py`` first, and export a revision whose ``hip/`` still fits
those headers.  The builds run in parallel (``--jobs``, default all at once); each prints its time,
or the compiler's last lines and the command.  Exit status 1 when any build failed.

Example (main against a branch, in one call; ``.dev/`` travels when the call carries it)::

    python tools/gpu_build_variants.py export main .dev/main && python tools/gpu_build_variants.py export att .dev/att
    # there:
    python build_native.py && python tools/gpu_build_variants.py build /tmp/L main=.dev/main att=.dev/att
    python tools/gpu_lib_profile.py main=/tmp/L/main.so att=/tmp/L/att.so --contexts 2048,4096
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import build_native  # noqa: E402  (the repository's own build: its command, its toolchain search)

HIP_PREFIX = "ds4tui/native/hip/"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class VariantError(Exception):
    """A refusal with its reason (printed as one line, exit status 2)."""


def export(rev: str, dest: Path, root: Path = ROOT) -> list[str]:
    """Write revision ``rev``'s files of ``ds4tui/native/hip/`` into ``dest`` (created if missing; files of
    the same name replaced); returns their names.  VariantError when git does not know ``rev`` or the
    revision has no such folder."""
    r = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev, HIP_PREFIX], capture_output=True)
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip().splitlines()
        raise VariantError(f"export {rev}: git archive failed ({err[-1] if err else 'exit %d' % r.returncode}); "
                           f"give a commit, branch or tag of {root}")
    names = []
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VariantError(f"export {rev}: {dest}: cannot create the folder ({exc.strerror or exc})") from None
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tf:
        for m in tf.getmembers():
            if not m.isfile() or not m.name.startswith(HIP_PREFIX) or "/" in m.name[len(HIP_PREFIX):]:
                continue
            name = m.name[len(HIP_PREFIX):]
            (dest / name).write_bytes(tf.extractfile(m).read())
            names.append(name)
    if not names:
        raise VariantError(f"export {rev}: the revision has no files in {HIP_PREFIX}")
    return sorted(names)


def parse_spec(spec: str) -> tuple[str, Path | None]:
    """``NAME`` or ``NAME=DIR`` → (name, folder or None).  VariantError on a bad name or folder."""
    name, sep, folder = spec.partition("=")
    if not NAME_RE.fullmatch(name):
        raise VariantError(f"{spec!r}: a variant's name is letters, digits, '.', '_' and '-' (it names OUTDIR/NAME.so)")
    if not sep:
        return name, None
    d = Path(folder)
    if not d.is_dir():
        raise VariantError(f"{spec!r}: {d} is not a folder (make one with: export REV {d})")
    known = {Path(s).name for s in build_native.HIP_SOURCES}
    if not any((d / k).is_file() for k in known):
        raise VariantError(f"{spec!r}: {d} holds none of the GPU library's sources ({', '.join(sorted(known))})")
    return name, d


def variant_command(cmd: list[str], folder: Path | None, native: Path = build_native.NATIVE) -> list[str]:
    """build_native's command ``cmd`` with each source of ``hip/`` that ``folder`` holds taken from
    there, and ``native/hip`` on the include path (so that a moved source still finds the headers it
    does not bring, and ``../cpu/...`` from there)."""
    if folder is None:
        return list(cmd)
    hip = native / "hip"
    out = []
    for arg in cmd:
        p = Path(arg)
        if p.parent == hip and p.suffix == ".hip" and (folder / p.name).is_file():
            arg = str(folder / p.name)
        out.append(arg)
    i = out.index(f"-I{native}") + 1
    return out[:i] + [f"-I{hip}"] + out[i:]


def build(outdir: Path, specs: list[tuple[str, Path | None]], jobs: int, log=print) -> int:
    """Build every variant into ``outdir``; returns the number that failed."""
    plat, compiler, why = build_native.find_gpu_compiler()
    if plat is None:
        raise VariantError(why)
    archs = build_native.gpu_arch(plat)
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VariantError(f"{outdir}: cannot create the folder ({exc.strerror or exc})") from None
    todo = []
    for name, folder in specs:
        out = outdir / f"{name}.so"
        base = build_native.gpu_command(plat, compiler, archs, str(out),
                                        rocm_formulas=build_native.rocm_formulas() if plat == "cuda" else False)
        todo.append((name, variant_command(base, folder), out))
    running, failed, t0 = [], 0, time.perf_counter()
    while todo or running:
        while todo and len(running) < jobs:
            name, cmd, out = todo.pop(0)
            log(f"gpu_build_variants: {name}: building ({plat}, {','.join(archs)})")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            running.append((name, cmd, out, proc))
        name, cmd, out, proc = running.pop(0)
        text, _ = proc.communicate()
        if proc.returncode == 0 and out.is_file():
            log(f"gpu_build_variants: {name}: built in {time.perf_counter() - t0:.0f} s -> {out}")
        else:
            failed += 1
            tail = "\n".join(text.strip().splitlines()[-30:])
            log(f"gpu_build_variants: {name}: FAILED (exit {proc.returncode}):\n{tail}\ncommand: {' '.join(cmd)}")
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Build several variants of the GPU library side by side (other "
                                 "revisions' or edited copies of ds4tui/native/hip/), for gpu_lib_profile and "
                                 "gpu_lib_ab.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="a revision's ds4tui/native/hip/ into a folder")
    ex.add_argument("rev", help="a commit, branch or tag")
    ex.add_argument("dir", type=Path)
    bd = sub.add_parser("build", help="build NAME[=DIR] variants into OUTDIR/NAME.so")
    bd.add_argument("outdir", type=Path)
    bd.add_argument("variants", nargs="+", metavar="NAME[=DIR]")
    bd.add_argument("--jobs", type=int, default=0, help="builds at once (default: all)")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "export":
            names = export(a.rev, a.dir)
            print(f"gpu_build_variants: {a.rev}: {len(names)} files into {a.dir}: {', '.join(names)}")
            return 0
        if a.jobs < 0:
            ap.error(f"--jobs must be at least 0 (0: all at once), got {a.jobs}")
        specs = [parse_spec(s) for s in a.variants]
        names = [n for n, _ in specs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise VariantError(f"a name given twice: {', '.join(dup)} (each names OUTDIR/NAME.so)")
        return 1 if build(a.outdir, specs, a.jobs or len(specs)) else 0
    except (VariantError, build_native.GPUBuildError) as exc:
        print(f"gpu_build_variants: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
