"""Several builds of the GPU library side by side, from other revisions' (or edited copies of) its sources,
for ``tools/gpu_lib_profile.py`` and ``tools/gpu_lib_ab.py`` to compare in one device call.  Not part of CI.

    python tools/gpu_build_variants.py export REV DIR
        # REV's ds4tui/native/hip/ (every source and header) into DIR, a new or empty folder, from git's
        # history: run it where the history is (a device call carries the working tree, not the history)
    python tools/gpu_build_variants.py build OUTDIR NAME[=DIR] ... [--jobs N]
        # OUTDIR/NAME.so each, built by build_native.py's own command (its toolchain, DS4TUI_CUDA_ARCH or
        # DS4TUI_HIP_ARCH, no fast-math, no FMA contraction) from DIR's whole copy of hip/; NAME alone
        # builds this tree's hip/

DIR must hold every file of this tree's ``hip/`` (what ``export`` writes; to try an edit, export a
revision or copy ``ds4tui/native/hip/`` and edit the copy), so that all of a variant's sources include
its own headers.  What lies outside ``hip/`` (``native/*.h``, the generated ``cpu/iq2xxs_tables.h``) is
this tree's: run ``python build_native.py`` first, and compare revisions whose ``hip/`` fits those
headers.  The builds run in parallel (``--jobs``, default all at once), each into a temporary file
renamed to NAME.so when it succeeds (a failed one leaves no NAME.so); each prints its own time, or the
compiler's last lines and the command.  Exit status 0 when every variant built, 1 when any build
failed, 2 when the tool refused its input.

Example (main against a branch, in one call; a folder ignored by git travels when the call carries it;
a branch of the repository this clone came from is ``origin/NAME``)::

    python tools/gpu_build_variants.py export main .devNN/main
    python tools/gpu_build_variants.py export origin/att-staged .devNN/att
    # there:
    python build_native.py && python tools/gpu_build_variants.py build /tmp/L main=.devNN/main att=.devNN/att
    python tools/gpu_lib_profile.py main=/tmp/L/main.so att=/tmp/L/att.so --contexts 2048,4096
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import build_native  # noqa: E402  (the repository's own build: its command, its toolchain search)

HIP_PREFIX = "ds4tui/native/hip/"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class VariantError(Exception):
    """A refusal with its reason (printed as one line, exit status 2)."""


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True)


def export(rev: str, dest: Path, root: Path = ROOT) -> list[str]:
    """Write revision ``rev``'s files of ``ds4tui/native/hip/`` into ``dest``, a new or empty folder;
    returns their names.  VariantError when git knows no such commit, the revision has no such folder,
    ``dest`` holds anything or cannot be written."""
    r = _git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if r.returncode != 0:
        raise VariantError(f"export {rev}: not a commit, branch or tag of {root} (a branch of the repository "
                           f"this clone came from is origin/NAME; `git branch -a` lists them)")
    commit = r.stdout.decode().strip()
    r = _git(root, "archive", "--format=tar", commit, "--", HIP_PREFIX)
    if r.returncode != 0:
        raise VariantError(f"export {rev}: the revision has no {HIP_PREFIX} (it predates the GPU library)")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        what = "is not a folder" if not dest.is_dir() else "is not empty"
        raise VariantError(f"export {rev}: {dest} {what}: give a new or empty folder (a variant is one revision's "
                           f"whole hip/)")
    names = []
    try:
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tf:
            for m in tf.getmembers():
                name = m.name[len(HIP_PREFIX):]
                if not m.isfile() or not m.name.startswith(HIP_PREFIX) or "/" in name:
                    continue
                (dest / name).write_bytes(tf.extractfile(m).read())
                names.append(name)
    except OSError as exc:
        raise VariantError(f"export {rev}: cannot write {exc.filename or dest} ({exc.strerror or exc})") from None
    if not names:
        raise VariantError(f"export {rev}: the revision has no files in {HIP_PREFIX}")
    return sorted(names)


def tree_files(native: Path = build_native.NATIVE) -> set[str]:
    """The names of this tree's ``hip/`` files (sources and headers)."""
    return {p.name for p in (native / "hip").iterdir() if p.is_file() and p.suffix in (".hip", ".h")}


def parse_spec(spec: str, native: Path = build_native.NATIVE) -> tuple[str, Path | None]:
    """``NAME`` or ``NAME=DIR`` → (name, folder or None).  VariantError on a bad name, or a folder that is
    not a whole hip/ this tree's build can compile."""
    name, sep, folder = spec.partition("=")
    if not NAME_RE.fullmatch(name):
        raise VariantError(f"{spec!r}: a variant's name is letters, digits, '.', '_' and '-', starting with a "
                           f"letter or digit (it names OUTDIR/NAME.so)")
    if not sep:
        return name, None
    if not folder:
        raise VariantError(f"{spec!r}: no folder after '=' (NAME alone builds this tree's hip/)")
    d = Path(folder)
    if not d.is_dir():
        raise VariantError(f"{spec!r}: {d} is not a folder (make one with: export REV {d})")
    held = {p.name for p in d.iterdir() if p.is_file() and p.suffix in (".hip", ".h")}
    missing = sorted(tree_files(native) - held)
    if missing:
        raise VariantError(f"{spec!r}: {d} lacks {', '.join(missing)} of hip/: a variant is a whole hip/ (export "
                           f"REV {d}, or copy ds4tui/native/hip/ and edit the copy)")
    built = {Path(s).name for s in build_native.HIP_SOURCES}
    extra = sorted(n for n in held - built if n.endswith(".hip"))
    if extra:
        raise VariantError(f"{spec!r}: {d} holds {', '.join(extra)}, which this tree's build does not compile "
                           f"(build_native.HIP_SOURCES: {', '.join(sorted(built))})")
    return name, d


def variant_command(cmd: list[str], folder: Path | None, native: Path = build_native.NATIVE) -> list[str]:
    """build_native's command ``cmd`` with every source of ``hip/`` taken from ``folder`` (which holds the
    whole hip/, so each source's own headers are the folder's), and ``native/hip`` on the include path
    after ``native`` (so that ``../cpu/...`` and ``../*.h`` from the folder find this tree's)."""
    if folder is None:
        return list(cmd)
    hip = native / "hip"
    out = [str(folder / Path(a).name) if Path(a).parent == hip and a.endswith(".hip") else a for a in cmd]
    i = out.index(f"-I{native}") + 1
    return out[:i] + [f"-I{hip}"] + out[i:]


def build(outdir: Path, specs: list[tuple[str, Path | None]], jobs: int, log=print) -> int:
    """Build every variant into ``outdir``; returns the number that failed."""
    plat, compiler, why = build_native.find_gpu_compiler()
    if plat is None:
        hint = " (unset DS4TUI_GPU, or set it to cuda or hip)" if why.startswith("DS4TUI_GPU=off") else ""
        raise VariantError(why + hint)
    archs = build_native.gpu_arch(plat)
    formulas = build_native.rocm_formulas(plat)
    if outdir.exists() and not outdir.is_dir():
        raise VariantError(f"{outdir}: is a file, not a folder (give a folder for the libraries)")
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VariantError(f"{outdir}: cannot create the folder ({exc.strerror or exc})") from None
    env = build_native.gpu_build_env(plat)
    todo = []
    for name, folder in specs:
        out = outdir / f"{name}.so"
        try:
            out.unlink(missing_ok=True)  # a failed build leaves no earlier NAME.so to be loaded by mistake
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=outdir)
            os.close(fd)
        except OSError as exc:
            raise VariantError(f"{out}: cannot write ({exc.strerror or exc})") from None
        todo.append((name, variant_command(build_native.gpu_command(plat, compiler, archs, tmp,
                                                                    rocm_formulas=formulas), folder), Path(tmp), out))
    running, failed = [], 0
    try:
        while todo or running:
            while todo and len(running) < jobs:
                name, cmd, tmp, out = todo.pop(0)
                log(f"gpu_build_variants: {name}: building ({plat}, {','.join(archs)})")
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                running.append((name, cmd, tmp, out, proc, time.perf_counter()))
            name, cmd, tmp, out, proc, t0 = running[0]
            text, _ = proc.communicate()
            running.pop(0)
            if proc.returncode == 0 and tmp.stat().st_size > 0:
                tmp.chmod(0o755)
                tmp.replace(out)
                log(f"gpu_build_variants: {name}: built in {time.perf_counter() - t0:.0f} s -> {out}")
            else:
                failed += 1
                tmp.unlink(missing_ok=True)
                tail = "\n".join(text.strip().splitlines()[-30:])
                log(f"gpu_build_variants: {name}: FAILED (exit {proc.returncode}):\n{tail}\ncommand: {shlex.join(cmd)}")
    finally:  # an interrupt: the compilers started stop too, and their temporary files go
        for _, _, tmp, _, proc, _ in running:
            proc.kill()
            proc.wait()
        for tmp in [r[2] for r in running] + [t[2] for t in todo]:
            tmp.unlink(missing_ok=True)
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Build several variants of the GPU library side by side from other revisions' (or edited "
        "copies of) ds4tui/native/hip/, for tools/gpu_lib_profile.py and tools/gpu_lib_ab.py.  Exit status: 0 "
        "built, 1 a build failed, 2 refused.",
        epilog="Example: `export main .devNN/main` here (where the git history is), then `build /tmp/L "
        "main=.devNN/main cur` on the GPU machine after `python build_native.py`.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{export,build}")
    ex = sub.add_parser("export", help="a revision's ds4tui/native/hip/ into a new folder",
                        description="Write a revision's ds4tui/native/hip/ (every source and header) into DIR, "
                        "a new or empty folder, from git's history.")
    ex.add_argument("rev", help="a commit, branch or tag (another clone's branch: origin/NAME)")
    ex.add_argument("dir", type=Path, help="a new or empty folder")
    bd = sub.add_parser("build", help="build NAME[=DIR] variants into OUTDIR/NAME.so",
                        description="Build each variant with build_native.py's own command (its toolchain, "
                        "DS4TUI_CUDA_ARCH / DS4TUI_HIP_ARCH, no fast-math, no FMA contraction) into OUTDIR/NAME.so.")
    bd.add_argument("outdir", type=Path, help="the folder for the libraries (created if missing)")
    bd.add_argument("variants", nargs="+", metavar="NAME[=DIR]",
                    help="NAME=DIR: DIR's whole hip/ (from export); NAME alone: this tree's hip/")
    bd.add_argument("--jobs", type=int, default=0, help="builds at once (default 0: all at once)")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "export":
            names = export(a.rev, a.dir)
            print(f"gpu_build_variants: {a.rev}: {len(names)} files into {a.dir}: {', '.join(names)}")
            return 0
        if a.jobs < 0:
            bd.error(f"--jobs must be at least 0 (0: all at once), got {a.jobs}")
        specs = [parse_spec(s) for s in a.variants]
        names = [n for n, _ in specs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise VariantError(f"a name given twice: {', '.join(dup)} (each names OUTDIR/NAME.so)")
        return 1 if build(a.outdir, specs, a.jobs or len(specs)) else 0
    except (VariantError, build_native.GPUBuildError) as exc:
        print(f"gpu_build_variants: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpu_build_variants: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
