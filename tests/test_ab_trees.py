"""tools/ab_trees.py's report, with the bench runs stubbed (the tool runs `ds4tui bench` in two trees)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _tool():
    spec = importlib.util.spec_from_file_location("ab_trees", TOOLS / "ab_trees.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_figures_some_runs_lack_are_left_out_and_the_rest_compared(monkeypatch, tmp_path, capsys):
    """A figure that only some runs report (a list whose length varies between runs, as the
    scheduler's retimings do) is left out on either side instead of failing the report; the others get
    each side's median and range and the median of the pairs' B/A."""
    tool = _tool()
    runs = {"a": [{"x.tokens_per_s": 100.0, "y.kept_ms": 1.0}, {"x.tokens_per_s": 120.0}],
            "b": [{"x.tokens_per_s": 110.0, "y.kept_ms": 2.0}, {"x.tokens_per_s": 150.0, "y.kept_ms": 2.0}]}
    calls = []

    def fake(tree, args):
        side = "a" if tree.name == "A" else "b"
        calls.append((side, tuple(args)))
        return runs[side][sum(1 for s, _ in calls if s == side) - 1]

    monkeypatch.setattr(tool, "run_one", fake)
    out = tmp_path / "r.json"
    assert tool.main(["--a", str(tmp_path / "A"), "--b", str(tmp_path / "B"), "--pairs", "2", "--out", str(out),
                      "--", "--ab"]) == 0
    assert [s for s, _ in calls] == ["a", "b", "a", "b"] and calls[0][1] == ("--ab",)
    fig = json.loads(out.read_text())["figures"]
    assert list(fig) == ["x.tokens_per_s"]
    r = fig["x.tokens_per_s"]
    assert (r["a_median"], r["b_median"], r["a_range"]) == (110.0, 130.0, [100.0, 120.0])
    assert abs(r["b_over_a_median"] - (1.1 + 1.25) / 2) < 1e-12
    assert "x.tokens_per_s" in capsys.readouterr().out
