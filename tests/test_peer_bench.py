"""tools/peer_bench.py --build-only: a bad argument or a failed build step is one line naming the
step, the command and what to do (status 2 for an argument checked up front, else 1), no traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _load():
    spec = importlib.util.spec_from_file_location("peer_bench", TOOLS / "peer_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pb = _load()


def test_a_build_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(SystemExit) as e:
        pb.main(["--build-only", "--build-dir", str(a_file)])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: --build-dir {a_file}: is a file, not a folder (give a folder to build llama-bench in)")


def test_a_build_dir_that_cannot_be_created_is_one_line(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(SystemExit) as e:
        pb.main(["--build-only", "--build-dir", str(a_file / "sub")])
    assert e.value.code == (f"peer_bench: {a_file / 'sub'}: cannot create the build folder (Not a directory); give "
                            f"--build-dir DIR in a place you can write")


def test_a_failed_fetch_names_the_step_the_command_and_what_to_do(tmp_path, monkeypatch):
    def run(cmd, check=False, **kw):
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(pb.subprocess, "run", run)
    with pytest.raises(SystemExit) as e:
        pb.main(["--build-only", "--build-dir", str(tmp_path / "b"), "--sdist-version", "0.0.0bogus"])
    cmd = (f"{sys.executable} -m pip download --no-deps --no-binary :all: -d {tmp_path / 'b'} "
           f"llama-cpp-python==0.0.0bogus")
    assert e.value.code == (f"peer_bench: the fetch step failed: `{cmd}` exited 1; check that llama-cpp-python "
                            f"0.0.0bogus exists on PyPI (--sdist-version) and that pip can reach it, or give "
                            f"--llama-src DIR or --llama-bench EXE")


@pytest.mark.parametrize("step", ["configure", "build"])
def test_a_failed_configure_or_build_names_the_step(step, tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text("not cmake (\n")
    seen = []

    def run(cmd, check=False, **kw):
        seen.append(cmd)
        if (cmd[1] == "-S") == (step == "configure"):
            raise subprocess.CalledProcessError(2, cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(pb.subprocess, "run", run)
    with pytest.raises(SystemExit) as e:
        pb.main(["--build-only", "--build-dir", str(tmp_path / "b"), "--llama-src", str(src)])
    advice = {"configure": f"cmake's errors are above: check the llama.cpp source tree {src} and the cpu toolchain "
                           f"(or give --llama-bench EXE)",
              "build": "the compiler's errors are above: fix the cpu toolchain or the source tree (or give "
                       "--llama-bench EXE)"}[step]
    assert e.value.code == f"peer_bench: the {step} step failed: `{' '.join(seen[-1])}` exited 2; {advice}"
