"""tools/gpu_build_variants.py without a GPU toolchain: the export from git's history, the variant's
command (its sources taken from the folder, the include path), and the parallel builds through a
stand-in compiler that writes the library file it is asked for."""

from __future__ import annotations

import importlib.util
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("gpu_build_variants", ROOT / "tools" / "gpu_build_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gbv = _tool()


@pytest.fixture
def history():
    """The tests that export a revision need this checkout's git history."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to export from")


def _committed(rev: str, name: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:ds4tui/native/hip/{name}"], capture_output=True,
                          check=True).stdout


def test_export_writes_the_revisions_files(history, tmp_path):
    names = gbv.export("HEAD", tmp_path / "v")
    assert {"ops.hip", "q8.hip", "hip_compat.h"} <= set(names)
    for n in names:
        assert (tmp_path / "v" / n).read_bytes() == _committed("HEAD", n)


@pytest.mark.parametrize("rev, words", [
    ("no-such-rev-xyz", "not a commit, branch or tag"),
    ("--output=x.tar", "not a commit, branch or tag"),  # never an option of git's
])
def test_export_of_an_unknown_revision_is_refused_by_name(history, rev, words, tmp_path, capsys):
    assert gbv.main(["export", "--", rev, str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert rev in err and words in err and "Traceback" not in err
    assert not (tmp_path / "v").exists() and not (ROOT / "x.tar").exists()


def test_export_refuses_a_folder_that_holds_anything(history, tmp_path, capsys):
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "ops.hip").write_text("// another revision's\n")
    assert gbv.main(["export", "HEAD", str(tmp_path / "v")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "v" / "ops.hip").read_text() == "// another revision's\n"


def test_export_of_a_revision_without_the_gpu_library_says_so(history, tmp_path, capsys):
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True,
                             text=True).stdout.strip()
    if shallow != "false":
        pytest.skip("a shallow clone: its first commit already holds the GPU library")
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True, check=True).stdout.split()[0]
    assert gbv.main(["export", first, str(tmp_path / "v")]) == 2
    assert "has no ds4tui/native/hip/" in capsys.readouterr().err


def test_the_variants_command_takes_every_source_from_the_folder(tmp_path):
    native = gbv.build_native.NATIVE
    base = gbv.build_native.gpu_command("cuda", "nvcc", ["sm_90"], str(tmp_path / "x.so"))
    cmd = gbv.variant_command(base, tmp_path)
    for src in gbv.build_native.HIP_SOURCES:
        assert str(tmp_path / Path(src).name) in cmd and str(native / src) not in cmd
    assert cmd.index(f"-I{native / 'hip'}") == cmd.index(f"-I{native}") + 1
    assert len(cmd) == len(base) + 1
    assert gbv.variant_command(base, None) == base


@pytest.mark.parametrize("spec, words", [
    ("bad/name", "a variant's name"),
    ("x=/no/such/folder", "is not a folder"),
])
def test_bad_variants_are_refused_by_name(spec, words, tmp_path, capsys):
    assert gbv.main(["build", str(tmp_path / "out"), spec]) == 2
    err = capsys.readouterr().err
    assert words in err and spec in err and "Traceback" not in err


def test_a_folder_that_is_not_a_whole_hip_folder_is_refused(history, tmp_path, capsys):
    part = tmp_path / "part"
    gbv.export("HEAD", part)
    (part / "quant.h").unlink()  # its sources would include this tree's quant.h: refused
    assert gbv.main(["build", str(tmp_path / "out"), f"x={part}"]) == 2
    assert "lacks quant.h of hip/" in capsys.readouterr().err
    gbv.export("HEAD", tmp_path / "more")
    (tmp_path / "more" / "new.hip").write_text("// a source this tree's build does not compile\n")
    assert gbv.main(["build", str(tmp_path / "out"), f"x={tmp_path / 'more'}"]) == 2
    assert "holds new.hip, which this tree's build does not compile" in capsys.readouterr().err


def test_a_name_given_twice_is_refused(tmp_path, capsys):
    assert gbv.main(["build", str(tmp_path / "out"), "a", "a"]) == 2
    assert "a name given twice: a" in capsys.readouterr().err


def _stand_in(tmp_path: Path, fail_on: str = "") -> Path:
    """A compiler that records its arguments and writes the -o file (or fails when an argument holds
    ``fail_on``)."""
    exe = tmp_path / "fakecc"
    exe.write_text(f"""#!{sys.executable}
import sys
args = sys.argv[1:]
if {fail_on!r} and any({fail_on!r} in a for a in args):
    print("error: the stand-in compiler refuses this variant")
    sys.exit(3)
out = args[args.index("-o") + 1]
open(out, "w").write("\\n".join(args))
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_variants_build_side_by_side_through_the_repositorys_command(history, tmp_path, monkeypatch, capsys):
    cc = _stand_in(tmp_path)
    monkeypatch.setattr(gbv.build_native, "find_gpu_compiler", lambda: ("cuda", str(cc), ""))
    monkeypatch.setattr(gbv.build_native, "gpu_arch", lambda plat: ["sm_90"])
    old = tmp_path / "old"
    gbv.export("HEAD", old)
    assert gbv.main(["build", str(tmp_path / "L"), f"old={old}", "cur", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "old: built" in out and "cur: built" in out
    args_old = (tmp_path / "L" / "old.so").read_text().splitlines()
    args_cur = (tmp_path / "L" / "cur.so").read_text().splitlines()
    assert str(old / "ops.hip") in args_old and "-fmad=false" in args_old  # the repository's own flags
    assert str(gbv.build_native.NATIVE / "hip" / "ops.hip") in args_cur


def test_a_failed_build_names_the_variant_leaves_no_library_and_the_others_still_build(history, tmp_path,
                                                                                         monkeypatch, capsys):
    cc = _stand_in(tmp_path, fail_on=str(tmp_path / "bad"))
    monkeypatch.setattr(gbv.build_native, "find_gpu_compiler", lambda: ("cuda", str(cc), ""))
    monkeypatch.setattr(gbv.build_native, "gpu_arch", lambda plat: ["sm_90"])
    gbv.export("HEAD", tmp_path / "bad")
    (tmp_path / "L").mkdir()
    (tmp_path / "L" / "bad.so").write_text("an earlier build")  # must not survive a failed one
    assert gbv.main(["build", str(tmp_path / "L"), f"bad={tmp_path / 'bad'}", "cur"]) == 1
    out = capsys.readouterr().out
    assert "bad: FAILED (exit 3)" in out and "refuses this variant" in out and "cur: built" in out
    assert sorted(p.name for p in (tmp_path / "L").iterdir()) == ["cur.so"]  # no temporary file left


def test_hipcc_builds_for_amd_whatever_else_is_on_the_path(tmp_path, monkeypatch):
    cc = tmp_path / "hipcc"
    cc.write_text(f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
open(args[args.index("-o") + 1], "w").write(os.environ.get("HIP_PLATFORM", "<unset>"))
""")
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(gbv.build_native, "find_gpu_compiler", lambda: ("hip", str(cc), ""))
    monkeypatch.setattr(gbv.build_native, "gpu_arch", lambda plat: ["gfx1151"])
    monkeypatch.delenv("HIP_PLATFORM", raising=False)
    assert gbv.main(["build", str(tmp_path / "L"), "cur"]) == 0
    assert (tmp_path / "L" / "cur.so").read_text() == "amd"


def test_ds4tui_gpu_off_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DS4TUI_GPU", "off")
    assert gbv.main(["build", str(tmp_path / "L"), "cur"]) == 2
    assert "unset DS4TUI_GPU, or set it to cuda or hip" in capsys.readouterr().err


def test_no_toolchain_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gbv.build_native, "find_gpu_compiler", lambda: (None, None, "no GPU toolchain: nvcc not found"))
    assert gbv.main(["build", str(tmp_path / "L"), "cur"]) == 2
    assert capsys.readouterr().err.strip() == "gpu_build_variants: error: no GPU toolchain: nvcc not found"
