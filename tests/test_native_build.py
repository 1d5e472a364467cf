"""One file name for the native extension, and what it was built for.

``pip install`` (setuptools) and ``python build_native.py`` write the extension under one name, and
each build removes another ``_native*.so`` beside it: Python imports one of two such files by its
suffix alone, so an old direct build (``_native.cpython-311-*.so``) used to win over every later
``pip install -e .`` (``_native.abi3.so``).  The extension records its target (``ds4_build``: the
``-march`` value, the CPU the compiler made of it, the code-changing flags, the instruction-set
extensions compiled in), and ``ds4tui doctor`` shows it and warns about a second extension file."""

from __future__ import annotations

import json
import os
import platform
import shutil
import site
import subprocess
import sys
import sysconfig
from datetime import datetime
from pathlib import Path

import pytest
from cffi import FFI

import ds4tui
from ds4tui.cli import main as cli_main
from ds4tui.commands import doctor
from ds4tui.commands import environment as E

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import build_native  # noqa: E402

sys.path.remove(str(ROOT))

x86_64 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="an x86-64 target")
#: the name an older build_native.py gave the extension (the interpreter's own suffix)
TAGGED = "_native" + sysconfig.get_config_var("EXT_SUFFIX")
TINY = 'int answer(void) { return 42; }'


def _cpu_has(flag: str) -> bool:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return any(flag in ln.partition(":")[2].split() for ln in text.splitlines() if ln.startswith("flags"))


def _doctor(pkg: Path, *argv: str) -> subprocess.CompletedProcess:
    """`python -m ds4tui doctor` with the ds4tui in `pkg` (no site hooks: an editable install's finder
    would find the tests' own ds4tui)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg), *site.getsitepackages()])}
    for v in E.VARIABLES:
        env.pop(v.name, None)
    return subprocess.run([sys.executable, "-S", "-m", "ds4tui", "doctor", *argv], cwd=pkg, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def x86_64_build(tmp_path_factory):
    """A copy of the package whose folder held an older build's extension (a copy of the tests' own,
    under the interpreter's suffix), rebuilt by build_native.py with DS4TUI_MARCH=x86-64 (no AVX)."""
    from ds4tui import _native

    pkg = tmp_path_factory.mktemp("native_build")
    shutil.copytree(Path(ds4tui.__file__).parent, pkg / "ds4tui",
                    ignore=shutil.ignore_patterns("_native*", "*.so", "*.xz", "__pycache__", "gpu_build.json"))
    stray = pkg / "ds4tui" / TAGGED
    shutil.copy2(_native.__file__, stray)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_MARCH", "x86-64")
        r = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; import build_native as b; "
                            "b.compile_extension_atomically(b.make_ffibuilder(absolute=True), "
                            "out_dir=Path(sys.argv[1]))", str(pkg / "ds4tui")],
                           cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    return {"pkg": pkg, "stray": stray, "stderr": r.stderr, "built_from": Path(_native.__file__)}


def test_setuptools_names_the_extension_as_build_native_does(tmp_path):
    """A cffi extension built by setuptools (what pip runs) gets build_native.extension_filename()."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "tiny_build.py").write_text(f'from cffi import FFI\nffibuilder = FFI()\nffibuilder.cdef("int answer(void);")\n'
                                            f'ffibuilder.set_source("pkg._native", "{TINY}")\n')
    (tmp_path / "setup.py").write_text('from setuptools import setup\n'
                                       'setup(name="pkg", packages=["pkg"], cffi_modules=["tiny_build.py:ffibuilder"])\n')
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "pkg").glob("_native*.so")] == [build_native.extension_filename()]


def test_a_direct_build_writes_that_name_and_removes_the_other(tmp_path, capsys):
    """build_native.compile_extension_atomically (`python build_native.py`) writes extension_filename()
    and removes an older build's file beside it, saying so in one line."""
    ffi = FFI()
    ffi.cdef("int answer(void);")
    ffi.set_source("pkg._native", TINY)
    stray = tmp_path / TAGGED
    stray.write_bytes(b"an older build")
    out = build_native.compile_extension_atomically(ffi, out_dir=tmp_path)
    assert out == tmp_path / build_native.extension_filename() != stray
    assert sorted(tmp_path.glob("_native*.so")) == [out]
    assert capsys.readouterr().err == (f"build_native: removed {stray}: another build's extension beside {out.name}, "
                                       f"which Python might have imported instead\n")


@x86_64
def test_build_native_replaced_the_stray_file(x86_64_build):
    pkg = x86_64_build["pkg"] / "ds4tui"
    assert sorted(p.name for p in pkg.glob("_native*.so")) == [build_native.extension_filename()]
    removed = [ln for ln in x86_64_build["stderr"].splitlines() if "removed" in ln]
    assert removed == [f"build_native: removed {x86_64_build['stray']}: another build's extension beside "
                       f"{build_native.extension_filename()}, which Python might have imported instead"]


@x86_64
def test_doctor_shows_the_target_the_build_used(x86_64_build):
    pkg = x86_64_build["pkg"]
    r = _doctor(pkg, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    lib = pkg / "ds4tui" / build_native.extension_filename()
    assert rep["native_file"] == str(lib) and rep["native_files"] == [str(lib)]
    nb = rep["native_build"]
    assert {k: nb[k] for k in ("march", "cpu", "flags", "isa")} == {
        "march": "x86-64", "cpu": "x86-64", "flags": "-O3 -std=c11 -fno-fast-math -march=x86-64", "isa": "sse2"}
    assert nb["missing_here"] == []
    if _cpu_has("avx2"):  # the silent slowdown of such a build, said
        assert "avx2" in nb["unused_here"] and "sse2" not in nb["unused_here"]
    assert not any("native engine files" in w for w in rep["warnings"])
    r = _doctor(pkg)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("native build"))
    assert line.split(None, 2)[2] == f"for -march=x86-64: sse2; {nb['compiler']}, -O3 -std=c11 -fno-fast-math -march=x86-64"
    if _cpu_has("avx2"):
        nxt = r.stdout.splitlines()[r.stdout.splitlines().index(line) + 1]
        assert nxt == (f"  this CPU also has {' '.join(nb['unused_here'])}, which this build does not use: rebuild "
                       f"without DS4TUI_MARCH (`pip install .`, or `python build_native.py` in a source tree) to use them")


@x86_64
def test_doctor_warns_about_a_second_extension_file(x86_64_build):
    """The older build's file back beside the new one: Python imports it (its suffix comes first), and
    doctor says so in both outputs, naming both files and what to do."""
    pkg = x86_64_build["pkg"]
    lib = pkg / "ds4tui" / build_native.extension_filename()
    stray = x86_64_build["stray"]
    shutil.copy2(x86_64_build["built_from"], stray)
    try:
        t_old, t_new = 1_700_000_000, 1_700_003_600
        os.utime(stray, (t_old, t_old))
        os.utime(lib, (t_new, t_new))
        when = lambda t: datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
        files = sorted([(lib, t_new), (stray, t_old)])
        shown = [f"{p} (modified {when(t)}, {'the one Python imports' if p == stray else 'ignored'})" for p, t in files]
        want = (f"2 native engine files in {pkg / 'ds4tui'}: {' and '.join(shown)}. Python picks one by its file "
                f"name's suffix, not by age, so a build that wrote the other name has no effect. Keep the newest: "
                f"`rm {stray}`; or rebuild (`pip install -e .`, or `python build_native.py`): either writes one file "
                f"and removes the others")
        r = _doctor(pkg, "--json")
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["native_file"] == str(stray)  # the older build wins the import
        assert rep["native_files"] == [str(p) for p, _ in files]
        assert rep["native_build"]["march"] == "native"  # it is the tests' own (-march=native) build
        assert want in rep["warnings"]
        r = _doctor(pkg)
        assert r.returncode == 0 and f"warning: {want}\n" in r.stdout
    finally:
        stray.unlink()


def test_doctor_warns_when_this_cpu_lacks_an_instruction_set_of_the_build(monkeypatch, capsys):
    """A build for another CPU (a copied install, DS4TUI_MARCH): the extensions this CPU lacks, named."""
    from ds4tui import _native

    isa = _native.ffi.string(_native.lib.ds4_build().isa).decode().split()
    if not set(isa) - {"sse2"}:
        pytest.skip("the extension was built without extensions beyond sse2")
    for v in E.VARIABLES:
        monkeypatch.delenv(v.name, raising=False)
    monkeypatch.setattr(doctor, "cpu_flags", lambda: {"sse2"})
    assert cli_main(["doctor", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    nb = rep["native_build"]
    assert nb["missing_here"] == [i for i in isa if i != "sse2"] and nb["unused_here"] == []
    march = doctor._march_text(nb)  # e.g. "-march=native (rocketlake)"
    want = (f"the native engine {_native.__file__} was built for {march} with {' '.join(nb['missing_here'])}, which "
            f"this CPU does not have: the CPU kernels stop with 'Illegal instruction'. Rebuild it on this machine "
            f"(`pip install .`, or `python build_native.py` in a source tree), or set DS4TUI_MARCH to a target this "
            f"CPU runs (e.g. x86-64-v2) before building")
    assert want in rep["warnings"]


def test_doctor_says_when_the_extension_predates_the_record(monkeypatch, capsys):
    """An extension from before ds4_build (the stale file of the defect itself) is reported as not
    recorded, with what to do, instead of failing the report."""
    from ds4tui import _native

    class OlderLib:  # the loaded library without ds4_build, as an older build's is
        def __getattr__(self, name):
            if name == "ds4_build":
                raise AttributeError(f"cffi library 'ds4tui._native' has no function named '{name}'")
            return getattr(_native.lib, name)

    older = type(sys)("ds4tui._native")
    older.ffi, older.lib, older.__file__ = _native.ffi, OlderLib(), _native.__file__
    monkeypatch.setitem(sys.modules, "ds4tui._native", older)
    monkeypatch.setattr(ds4tui, "_native", older)
    for v in E.VARIABLES:
        monkeypatch.delenv(v.name, raising=False)
    assert cli_main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["native_build"] == {
        "march": None, "cpu": None, "flags": None, "isa": None, "compiler": None, "missing_here": [],
        "unused_here": []}
    assert cli_main(["doctor"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("native build"))
    assert line.split(None, 2)[2] == ("not recorded: an older ds4tui built this extension, before it recorded its "
                                      "target; rebuild it (`pip install -e .`, or `python build_native.py`) to see the "
                                      "target here")


@pytest.mark.parametrize("how", [["build_native.py"], ["-c", "import build_native"]], ids=["direct", "pip"])
def test_a_march_the_compiler_rejects_is_one_line_naming_ds4tui_march(how):
    """DS4TUI_MARCH=bogus: one line naming the variable, the value, the compiler's own error and what
    to do, status 2, before anything compiles; the same when setup.py imports build_native (pip)."""
    env = {**os.environ, "DS4TUI_MARCH": "bogus", "DS4TUI_GPU": "off"}
    r = subprocess.run([sys.executable, *how], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    cc = " ".join(build_native.c_compiler())
    assert (r.returncode, r.stdout, r.stderr.count("\n")) == (2, "", 1), r.stderr
    assert r.stderr.startswith(f"build_native: error: DS4TUI_MARCH='bogus': the C compiler ({cc}) rejects -march=bogus (")
    said = r.stderr.split(" (", 2)[2].rpartition("); unset")[0]
    assert "bogus" in said and "error" in said  # the compiler's own line, e.g. gcc's "cc1: error: bad value ‘bogus’ ..."
    assert r.stderr.endswith("); unset DS4TUI_MARCH to build for this machine's CPU, or set it to a -march value the "
                             "compiler accepts, e.g. x86-64-v3\n")


def test_a_march_the_compiler_accepts_passes_the_check(monkeypatch):
    monkeypatch.setenv("DS4TUI_MARCH", "x86-64" if platform.machine().lower() in ("x86_64", "amd64") else "")
    assert build_native.arch_flags() == (["-march=x86-64"] if os.environ["DS4TUI_MARCH"] else [])


def test_a_stray_extension_in_an_installed_ds4tui_is_removed_by_rm_not_by_a_rebuild(tmp_path):
    """`pip install .`, then another `_native*.so` in site-packages (newer than pip's): neither rebuild
    touches site-packages and `pip install --force-reinstall .` leaves a file it did not install, so the
    advice is to remove the file pip did not install, named, even when it is the newer one."""
    folder = tmp_path / "site-packages" / "ds4tui"
    folder.mkdir(parents=True)
    ours, stray = folder / "_native.abi3.so", folder / TAGGED
    ours.write_bytes(b"a")
    stray.write_bytes(b"b")
    os.utime(ours, (1_700_000_000, 1_700_000_000))
    os.utime(stray, (1_700_003_600, 1_700_003_600))
    assert doctor.installed_files(folder) is not None  # in site-packages: an installed ds4tui
    assert doctor.installed_files(Path(ds4tui.__file__).parent) is None  # the tests' source tree
    text = doctor.duplicate_native_warning(stray, sorted([ours, stray]), {ours.resolve()})
    assert text.endswith(f"Keep the one pip installed, {ours}: `rm {stray}` (reinstalling does not remove it: pip "
                         f"removes only the files it installed)")
    assert "pip install -e ." not in text and "build_native.py" not in text
