"""tools/gpu_lib_profile.py without a GPU: the ncu log split into the ranges each marker kernel opens,
the sums per range and kernel, the report, and the arguments it refuses."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "gpu_lib_profile.py"
_spec = importlib.util.spec_from_file_location("gpu_lib_profile", TOOL)
glp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(glp)

HEAD = '"ID","Process ID","Kernel Name","Context","gpu__time_duration.sum"'


def _log(rows, unit="nsecond"):
    """An ncu --csv --page raw log: its own lines, the header, the units row, one row a launch."""
    body = [f'"{i}","7","{name}","1","{ns}"' for i, (name, ns) in enumerate(rows)]
    return "\n".join(["==PROF== Connected to process 7", HEAD, f'"","","","","{unit}"', *body,
                      "a line the profiled program printed", "==PROF== Disconnected from process 7"])


def test_ranges_are_the_launches_after_each_marker_in_nanoseconds():
    """A launch before the first marker is left out; kernel names lose their arguments; ncu's thousands
    separators are read; each range holds the launches up to the next marker."""
    text = _log([("warmup_kernel(float *)", "999"), ("ds4_marker", "1,024"),
                 ("void q8_kernel<8, 1, 8, 4, 4>(const unsigned char *, long)", "10,500"),
                 ("rms_norm_kernel(const float *)", "2000"), ("ds4_marker", "900"),
                 ("void q8_kernel<8, 1, 8, 4, 4>(const unsigned char *, long)", "20,250")])
    assert glp.split_ranges(text) == [[("void q8_kernel<8, 1, 8, 4, 4>", 10500.0), ("rms_norm_kernel", 2000.0)],
                                      [("void q8_kernel<8, 1, 8, 4, 4>", 20250.0)]]


def test_a_log_in_microseconds_is_read_as_such():
    text = _log([("ds4_marker", "1"), ("k(int)", "2.5")], unit="usecond")
    assert glp.split_ranges(text) == [[("k", 2500.0)]]


def test_a_log_without_the_table_says_what_to_run():
    with pytest.raises(ValueError, match="--csv --page raw --metrics gpu__time_duration.sum"):
        glp.split_ranges("==PROF== Connected\nno table here\n")


def test_sums_per_range_and_kernel_and_the_report():
    """Two libraries, one context: each range's total and launches, per-kernel sums, the ratio, the
    bit-for-bit verdict and the kernels that moved."""
    ranges = [[("a", 100_000.0), ("b", 50_000.0)], [("a", 200_000.0), ("b", 100_000.0), ("b", 30_000.0)],
              [("a", 90_000.0), ("b", 50_000.0)], [("a", 150_000.0), ("b", 130_000.0)]]
    names = ["old decode 2048", "old verify 2048", "new decode 2048", "new verify 2048"]
    s = glp.summarise(names, ranges)
    assert s["old verify 2048"] == {"launches": 3, "total_us": 330.0, "kernels": {"a": [1, 200.0], "b": [2, 130.0]}}
    assert s["new decode 2048"]["total_us"] == 140.0
    text = glp.table(s, ["old", "new"], [2048], {"old": {"verify": True, "decode": True},
                                                 "new": {"verify": True, "decode": False}})
    lines = text.splitlines()
    assert lines[0] == "old: ctx 2048: decode 150.0 us, verify 330.0 us, verify / decode 2.200"
    assert lines[1].startswith("new: ctx 2048: decode 140.0 us, verify 280.0 us, verify / decode 2.000; "
                               "logits DIFFER from old's")
    assert "new against old, verify at 2048: -50.0 us" in text
    assert any(ln.split()[0] == "a" and ln.split()[-1] == "-50.0" for ln in lines if ln.startswith("  "))
    assert lines[-3:] == ["totals again:", lines[0], lines[1]]  # last too: a cut output keeps its tail


def test_a_run_that_stopped_part_way_is_named():
    with pytest.raises(ValueError, match="3 profiled ranges in the ncu log, 4 named by the run"):
        glp.summarise(["a", "b", "c", "d"], [[], [], []])


def test_units_it_does_not_know_and_times_that_are_not_numbers_are_refused():
    with pytest.raises(ValueError, match="gives gpu__time_duration.sum in 'minute'; expected one of ns"):
        glp.split_ranges(_log([("ds4_marker", "1"), ("k(int)", "2")], unit="minute"))
    assert glp.split_ranges(_log([("ds4_marker", "1"), ("k(int)", "0.5")], unit="second")) == [[("k", 5e8)]]
    with pytest.raises(ValueError, match=r"launch 1 \(k\): gpu__time_duration.sum is 'n/a', expected a number of ns"):
        glp.split_ranges(_log([("ds4_marker", "1"), ("k(int)", "n/a")], unit="ns"))


@pytest.mark.parametrize("argv,needle", [
    (["base"], "'base': expected NAME=LIBRARY"),
    (["=@LIB@"], "'=@LIB@': expected NAME=LIBRARY"),
    (["a=@LIB@", "a=@LIB@"], "the name a is given twice"),
    (["a=/nonexistent/lib.so"], "no library file at /nonexistent/lib.so"),
    (["a=@LIB@", "--contexts", "4096,2048"], "expected ascending contexts, each once"),
    (["a=@LIB@", "--contexts", "2048,2048"], "expected ascending contexts, each once"),
    (["a=@LIB@", "--contexts", "1024"], "the first at least 2048"),
    (["a=@LIB@", "--contexts", "2k"], "expected whole numbers"),
    (["a=@LIB@", "--contexts", "2048,,4096"], "expected whole numbers"),
    (["a=@LIB@", "--rows", "-1"], "--rows -1: expected 0 or more"),
    (["a=@LIB@", "--ncu", "/nonexistent/ncu"], "no Nsight Compute program at /nonexistent/ncu"),
    (["a=@LIB@", "--ncu", "/"], "no Nsight Compute program at /"),
    (["a=@LIB@", "--cache-control", "some"], "invalid choice: 'some'"),
    (["a=@LIB@", "--ncu", "@NCU@", "--out", "@LIB@"], "a file is there, expected a folder"),
])
def test_arguments_it_refuses(argv, needle, capsys, tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    ncu = tmp_path / "ncu"
    ncu.write_text("#!/bin/sh\nexit 3\n")
    ncu.chmod(0o755)
    argv = [a.replace("@LIB@", str(lib)).replace("@NCU@", str(ncu)) for a in argv]
    with pytest.raises(SystemExit):
        glp.main(argv)
    assert needle.replace("@LIB@", str(lib)) in capsys.readouterr().err


@pytest.mark.parametrize("cache", [None, "all", "none"])
def test_the_run_end_to_end_with_a_stand_in_for_ncu(tmp_path, capsys, cache):
    """The parent's side: ncu (here a script that checks the flags it is given, runs nothing and
    writes what the profiled run would: the ranges' log and regions.json) is called with the child's
    command (ncu's cache control as asked, all when not), and the report and summary.json come from
    what it wrote."""
    flag = [] if cache is None else ["--cache-control", cache]
    cache = cache or "all"
    fake = tmp_path / "ncu"
    fake.write_text(f"""#!{sys.executable}
import json, sys
a = sys.argv[1:]
assert a[:9] == {glp.NCU_FLAGS!r}, a
assert a[9:11] == ["--cache-control", {cache!r}], a
assert "--child" in a and a[a.index("--contexts") + 1] == "2048" and a[a.index("--activations") + 1] == "q8", a
names = [f"{{lib}} {{kind}} 2048" for lib in ("old", "new") for kind in ("decode", "verify")]
json.dump({{"regions": names, "bit_identical": {{"old": {{"verify": True, "decode": True}},
           "new": {{"verify": True, "decode": True}}}}}}, open(a[a.index("--regions") + 1], "w"))
print({HEAD!r})
print('"","","","","nsecond"')
for i, ns in enumerate((100000, 300000, 90000, 200000)):
    print(f'"{{2 * i}}","7","ds4_marker","1","1"')
    print(f'"{{2 * i + 1}}","7","k(int)","1","{{ns}}"')
""")
    fake.chmod(0o755)
    for lib in ("a.so", "b.so"):
        (tmp_path / lib).write_bytes(b"")
    out = tmp_path / "out"
    argv = [f"old={tmp_path / 'a.so'}", f"new={tmp_path / 'b.so'}", "--contexts", "2048", "--ncu", str(fake),
            "--out", str(out), *flag]
    assert glp.main(argv) == 0
    text = capsys.readouterr().out
    assert "old: ctx 2048: decode 100.0 us, verify 300.0 us, verify / decode 3.000\n" in text
    assert ("new: ctx 2048: decode 90.0 us, verify 200.0 us, verify / decode 2.222; logits bit-identical to "
            "old's") in text
    assert "new against old, verify at 2048: -100.0 us" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranges"]["new verify 2048"]["total_us"] == 200.0
    assert summary["cache_control"] == cache and f"ncu --cache-control {cache};" in text
    assert text.startswith(f"kernel sums under ncu --cache-control {cache} (us)\n")
    # a later run that fails leaves none of this one's results behind, and says why
    fake.write_text("#!/bin/sh\nexit 5\n")
    assert glp.main(argv) == 1
    assert "the profiled run failed (exit 5)" in capsys.readouterr().err
    assert not (out / "summary.json").exists() and not (out / "regions.json").exists()
