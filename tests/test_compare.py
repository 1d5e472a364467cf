"""``ds4tui compare A.json B.json`` on real runs: the knobs that differ, the figures, the warning when
more than one variable moved."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pilot_helpers import loaded

from ds4tui.cli import main as cli_main
from ds4tui.commands import compare as C

PROMPT = "Write a Python function that reverses a linked list."


def _generate(tiny_q2, tmp_path, capsys, name: str, *extra: str) -> str:
    rc = cli_main(["generate", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "-p", PROMPT, "-n", "16",
                   "--threads", "2", "--backend", "cpu", "--json", *extra])
    out = capsys.readouterr().out
    assert rc == 0
    path = tmp_path / name
    path.write_text(out)
    return str(path)


def test_one_knob_moved_no_warning_and_every_figure_side_by_side(tiny_q2, tmp_path, capsys):
    a = _generate(tiny_q2, tmp_path, capsys, "a.json")
    b = _generate(tiny_q2, tmp_path, capsys, "b.json", "--no-scheduler")
    rc = cli_main(["compare", a, b, "--json"])
    out = capsys.readouterr()
    assert rc == 0 and "warning" not in out.err
    r = json.loads(out.out)
    assert r["kind_a"] == r["kind_b"] == "generate"
    assert r["knobs"] == [["dspark.scheduler", True, False]] and r["warning"] is None
    ja, jb = json.loads((tmp_path / "a.json").read_text()), json.loads((tmp_path / "b.json").read_text())
    figures = {k: (x, y, q) for k, x, y, q in r["figures"]}
    x, y, q = figures["dspark_stats.stage_timing.verify_ms_per_drafted_cycle"]
    assert x == ja["dspark_stats"]["stage_timing"]["verify_ms_per_drafted_cycle"]
    assert y == jb["dspark_stats"]["stage_timing"]["verify_ms_per_drafted_cycle"] and q == pytest.approx(y / x)
    assert figures["timings.decode_tokens_per_s"][:2] == (ja["timings"]["decode_tokens_per_s"],
                                                         jb["timings"]["decode_tokens_per_s"])
    assert figures["dspark_stats.cycles"][:2] == (ja["dspark_stats"]["cycles"], jb["dspark_stats"]["cycles"])
    assert not any(k.startswith(("generated_ids", "text", "from_draft")) for k in figures)  # ids and text left out
    rc = cli_main(["compare", a, b])
    text = capsys.readouterr().out
    assert "knobs that differ (1):\n  dspark.scheduler  True -> False" in text and "WARNING" not in text


def test_runs_whose_scheduler_started_differently_say_so(tiny_q2, tmp_path, capsys):
    """The second of two identical generate runs starts its DSpark scheduler from the prices the first
    kept: compare names that among the knobs (scheduler_start, in text and --json) with a note on what
    it means, and counts it as one variable."""
    a = _generate(tiny_q2, tmp_path, capsys, "a.json")  # the prices folder is the test's own: nothing kept yet
    b = _generate(tiny_q2, tmp_path, capsys, "b.json")
    ja, jb = (json.loads(Path(p).read_text()) for p in (a, b))
    assert (ja["scheduler_prices_at_start"], jb["scheduler_prices_at_start"]) == ("fresh", "saved")
    rc = cli_main(["compare", a, b, "--json"])
    out = capsys.readouterr()
    r = json.loads(out.out)
    assert rc == 0 and r["knobs"] == [["scheduler_start", "fresh", "saved"]] and r["variables"] == 1
    assert r["warning"] is None and r["scheduler_start_note"].startswith(
        "the DSpark scheduler started differently in the two runs (scheduler_start: fresh measures its own prices")
    assert out.err == f"ds4tui compare: note: {r['scheduler_start_note']}\n"
    rc = cli_main(["compare", a, b])
    text = capsys.readouterr().out
    assert rc == 0 and 'knobs that differ (1):\n  scheduler_start  "fresh" -> "saved"\n\nNOTE: the DSpark scheduler ' in text
    assert text.count("for an A/B, run both with --scheduler-prices fresh") == 1
    # kept times left for drafting to re-time are a start of their own
    jc = dict(jb, scheduler_prices_retime="the kept times of verify(6) were measured 2.0 h ago (over 1 h): drafting "
                                          "re-times them")
    c = tmp_path / "c.json"
    c.write_text(json.dumps(jc))
    rc = cli_main(["compare", b, str(c), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["knobs"] == [["scheduler_start", "saved", "saved, kept times re-timed"]] and r["scheduler_start_note"]
    # a prices mode that differs too: the start follows from it, one variable under two names
    d = _generate(tiny_q2, tmp_path, capsys, "d.json", "--scheduler-prices", "fresh")
    rc = cli_main(["compare", b, d, "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["knobs"] == [["scheduler_prices", "saved", "fresh"], ["scheduler_start", "saved", "fresh"]]
    assert r["variables"] == 1 and r["warning"] is None
    rc = cli_main(["compare", b, d])
    assert "knobs that differ (1 variable under 2 names):\n" in capsys.readouterr().out
    # with another knob moved as well: two variables, the warning
    e = _generate(tiny_q2, tmp_path, capsys, "e.json", "--confidence", "0.5")  # the same prices file as b's
    rc = cli_main(["compare", a, e, "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["knobs"] == [["dspark.threshold", 0.0, 0.5], ["scheduler_start", "fresh", "saved"]]
    assert r["variables"] == 2 and r["warning"].startswith(
        "2 variables differ between the runs (dspark.threshold, scheduler_start)")
    # a run without the scheduler has no start to compare: its own knob says why
    f = _generate(tiny_q2, tmp_path, capsys, "f.json", "--no-scheduler")
    rc = cli_main(["compare", b, f, "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["knobs"] == [["dspark.scheduler", True, False]] and r["scheduler_start_note"] is None


def test_a_file_against_itself_or_its_copy_is_named_not_called_noise(tiny_q2, tmp_path, capsys):
    a = _generate(tiny_q2, tmp_path, capsys, "a.json")
    rc = cli_main(["compare", a, a])
    text = capsys.readouterr().out
    assert rc == 0 and f"NOTE: A and B are the same file ({a}): every figure is equal by construction" in text
    assert "run-to-run noise" not in text
    copy = tmp_path / "copy.json"
    copy.write_text((tmp_path / "a.json").read_text())
    rc = cli_main(["compare", a, str(copy), "--json"])
    out = capsys.readouterr()
    assert rc == 0 and json.loads(out.out)["same_run"].startswith(f"{a} and {copy} hold the same run (equal contents")
    assert "note: " in out.err and "hold the same run" in out.err


def test_two_knobs_moved_is_a_warning(tiny_q2, tmp_path, capsys):
    a = _generate(tiny_q2, tmp_path, capsys, "a.json")
    b = _generate(tiny_q2, tmp_path, capsys, "b.json", "--no-scheduler", "--numerics", "transformers")
    rc = cli_main(["compare", a, b])
    out = capsys.readouterr()
    assert rc == 0
    assert out.out.count("WARNING: 2 variables differ between the runs (dspark.scheduler, numerics)") == 1
    assert out.err == ""  # printed once: in the table
    rc = cli_main(["compare", a, b, "--json"])
    out = capsys.readouterr()
    assert rc == 0 and json.loads(out.out)["warning"].startswith("2 variables differ")
    assert out.err.count("warning") == 1 and out.err.startswith("ds4tui compare: warning: 2 variables differ")


def test_bench_results_and_bad_files(tiny_q2, tmp_path, capsys):
    outs = []
    for i, threads in enumerate(("1", "2")):
        p = tmp_path / f"bench{i}.json"
        rc = cli_main(["bench", str(tiny_q2["model"]), "--backend", "cpu", "--threads", threads, "--prompt-tokens", "16",
                       "--decode-tokens", "4", "--json", "--out", str(p)])
        capsys.readouterr()
        assert rc == 0
        outs.append(str(p))
    rc = cli_main(["compare", *outs, "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["kind_a"] == "bench" and r["warning"] is None  # one variable, recorded twice
    assert r["knobs"] == [["memcpy.n_threads", 1, 2], ["n_threads", 1, 2]]
    assert "decode_tokens_per_s" in {k for k, *_ in r["figures"]}
    bad = tmp_path / "bad.json"
    for content, why in (("{", "not JSON"), ("[1]", "expected a JSON object"), ('{"x": 1}', "not the result")):
        bad.write_text(content)
        rc = cli_main(["compare", outs[0], str(bad)])
        err = capsys.readouterr().err
        assert rc == 1 and err.startswith(f"ds4tui compare: error: {bad}: ") and why in err and err.count("\n") == 1
    for path, why in ((tmp_path / "missing.json", "No such file or directory"), (tmp_path, "Is a directory")):
        rc = cli_main(["compare", outs[0], str(path)])  # it said what was wrong, not what to do
        assert (rc, capsys.readouterr().err) == (1, f"ds4tui compare: error: {path}: cannot read: {why} (check the "
                                                    f"path); {C.ACCEPTS}\n")


def test_knobs_and_figures_are_told_apart():
    for name in ("backend", "numerics", "knobs.scheduler", "dspark.max_draft", "sampling.top_p", "model.path",
                 "arms[1].knobs.enabled", "n_ctx", "support"):
        assert C.is_knob(name), name
    for name in ("dspark_stats.verify", "timings.decode_tokens_per_s", "memory.kv", "arms[1].tokens_per_s",
                 "stats.n_steps", "interface.cpu_s"):
        assert not C.is_knob(name), name


def test_generate_against_bench_compares_the_headline_and_not_the_kinds(tiny_q2, tmp_path, capsys):
    g = _generate(tiny_q2, tmp_path, capsys, "g.json", "--no-dspark")
    b = tmp_path / "b.json"
    rc = cli_main(["bench", str(tiny_q2["model"]), "--backend", "cpu", "--threads", "2", "--prompt-tokens", "16",
                   "--decode-tokens", "4", "--json", "--out", str(b)])
    capsys.readouterr()
    assert rc == 0
    jg, jb = json.loads(open(g).read()), json.loads(b.read_text())
    rc = cli_main(["compare", g, str(b), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and (r["kind_a"], r["kind_b"]) == ("generate", "bench")
    # the same model, threads and backend: not a difference; the context, the prompt's length and the
    # support model generate attached (its weights are in the memory figures) are
    assert sorted(r["knobs"]) == sorted([["ctx", jg["n_ctx"], jb["ctx"]], ["prompt_tokens", len(jg["prompt_ids"]), 16],
                                         ["support.path", str(tiny_q2["support"]), None],
                                         ["support.status", "attached", "none"]])
    # the context both sized themselves (it follows from the token counts); the support path and status: one
    assert r["variables"] == 2 and r["derived"] == ["ctx"]
    figures = {k: (x, y) for k, x, y, _ in r["figures"]}
    assert figures["decode_tokens_per_s"] == (jg["timings"]["decode_tokens_per_s"], jb["decode_tokens_per_s"])
    assert figures["prefill_tokens_per_s"] == (jg["timings"]["prefill_tokens_per_s"], jb["prefill_tokens_per_s"])
    rc = cli_main(["compare", g, str(b)])
    text = capsys.readouterr().out
    assert "knobs that differ (2 variables under 4 names):\n" in text and "WARNING: 2 variables differ" in text


def test_a_bad_file_with_json_is_a_json_failure(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    rc = cli_main(["compare", str(bad), str(bad), "--json"])
    out = capsys.readouterr()
    message = (f"{bad}: not JSON: Expecting property name enclosed in double quotes: line 1 column 2; the file ends "
               f"before its JSON does: it was cut short (truncated); write it again; {ACCEPTS}")
    assert rc == 1 and json.loads(out.out) == {"ok": False, "error": message, "error_type": "CompareError"}
    assert out.err == f"ds4tui compare: error: {message}\n"


def test_empty_binary_and_text_files_are_named_with_what_was_found_and_what_compare_reads(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"model": "m.gguf", "backend": "cpu", "generated_ids": [1], "timings": {"x": 1.0}}))
    bad = tmp_path / "bad.json"
    redirected = "expected JSON (a run that failed or was stopped leaves the file its output was redirected to empty)"
    cases = [
        (b"", f"{bad}: the file is empty (0 bytes), {redirected}"),
        (b" \n\t", f"{bad}: the file is blank (3 bytes of white space only), {redirected}"),
        (b"\xff\xfe\x00x", f"{bad}: not UTF-8 text (byte 0xff at offset 0; it looks like binary data, starting "
                           f"ff fe 00 78), expected JSON"),
        (b"GGUF\x03\x00\x00\x00\x80\x81", f"{bad}: not UTF-8 text (byte 0x80 at offset 8; it looks like a GGUF "
                                             f"model file, starting 47 47 55 46 03 00 00 00), expected JSON"),
        (b"decode 81.2 tokens/s\n", f'{bad}: not JSON: Expecting value: line 1 column 1 (it starts "decode 81.2 '
                                    f'tokens/s\\n")'),
    ]
    for content, found in cases:
        bad.write_bytes(content)
        assert _refusal(capsys, str(good), bad) == f"{found}; {ACCEPTS}", content


def test_a_pipe_a_device_or_a_huge_file_is_refused_before_it_is_read(tmp_path, capsys):
    """compare read its files whole: a model file given by mistake (81 GB) or /dev/zero filled the
    memory, and a named pipe blocked; each is now refused by its kind or size, unread."""
    import os

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"model": "m.gguf", "backend": "cpu", "generated_ids": [1], "timings": {"x": 1.0}}))
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    assert _refusal(capsys, str(good), fifo) == f"{fifo}: expected a JSON file, found a pipe (FIFO); {ACCEPTS}"
    assert _refusal(capsys, str(good), "/dev/zero") == (f"/dev/zero: expected a JSON file, found a character device; "
                                                        f"{ACCEPTS}")
    big = tmp_path / "model.gguf"
    with open(big, "wb") as fh:  # sparse: 257 MiB that take no disk
        fh.write(b"GGUF")
        fh.truncate(257 << 20)
    assert _refusal(capsys, str(good), big) == (f"{big}: {257 << 20} bytes (it looks like a GGUF model file), more "
                                                f"than the 256 MiB a run's JSON can be; {ACCEPTS}")


def _refusal(capsys, good: str, bad) -> str:
    """compare's one-line error for ``bad`` (either side), the same both ways."""
    errors = []
    for pair in ((good, str(bad)), (str(bad), good)):
        rc = cli_main(["compare", *pair])
        out = capsys.readouterr()
        assert rc == 1 and out.out == "" and out.err.count("\n") == 1
        errors.append(out.err.strip())
    assert errors[0] == errors[1]
    return errors[0].removeprefix("ds4tui compare: error: ")


ACCEPTS = ("compare reads the JSON of one run: a stats export of the chat (F6), a transcript (Ctrl+S), "
           "`ds4tui generate --json` output, or a `ds4tui bench` / `bench --ab` result (--json or --out)")


def test_files_that_are_not_results_are_named_with_the_field_and_the_types(tiny_q2, tmp_path, capsys):
    from ds4tui.engine import prices

    good = tmp_path / "bench.json"
    assert cli_main(["bench", str(tiny_q2["model"]), "--backend", "cpu", "--threads", "2", "--prompt-tokens", "16",
                     "--decode-tokens", "4", "--json", "--out", str(good)]) == 0
    capsys.readouterr()
    text = good.read_text()
    bad = tmp_path / "bad.json"
    # the scheduler's prices file, as it writes it (a format number where a transcript has a string)
    prices.save(bad, {"ds4tui": "0", "backend": "cpu"}, prices.SchedulerPrices(t_ver={1: 6.5}, t_prop=20.0))
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: a DSpark scheduler prices file (what the scheduler keeps between runs under --scheduler-prices "
        f"saved), not the result of a run; {ACCEPTS}")
    bad.write_text(text[:len(text) // 2])  # cut short
    assert _refusal(capsys, str(good), bad).endswith(
        f"; the file ends before its JSON does: it was cut short (truncated); write it again; {ACCEPTS}")
    assert " at at " not in _refusal(capsys, str(good), bad)
    d = json.loads(text)
    bad.write_text(json.dumps({**d, "decode_tokens_per_s": "fast"}))
    assert _refusal(capsys, str(good), bad) == (
        f'{bad}: looks like a `bench` result but field `decode_tokens_per_s` is string "fast", expected number: the '
        f'file was edited or damaged; write it again with ds4tui bench --json')
    bad.write_text(json.dumps({"decode_tokens_per_s": 1.0, "memcpy_gb_per_s": 1.0}))  # near-empty
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: looks like a `bench` result but has no field `model` (expected object): the file is incomplete; "
        f"write it again with ds4tui bench --json")
    bad.write_text(json.dumps({"model": "m", "backend": "cpu", "generated_ids": [], "timings": [1, 2]}))
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: looks like `generate --json` output but field `timings` is array [1, 2], expected object: the file "
        f"was edited or damaged; write it again with ds4tui generate --json")
    bad.write_text(json.dumps({"mode": "ab", "arms": [], "model": {}, "backend": "cpu", "tokens": 64}))
    assert _refusal(capsys, str(good), bad) == (  # a knob compare reads: not a silent "n_threads 2 -> null"
        f"{bad}: looks like a `bench --ab` result but has no field `n_threads` (expected integer): the file is "
        f"incomplete; write it again with ds4tui bench --ab --json")
    bad.write_text(json.dumps({"mode": "ab", "arms": [], "model": {}, "backend": "cpu", "tokens": 64,
                               "n_threads": 2}))
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: looks like a `bench --ab` result but its `arms` is empty (expected the three arms): the file is "
        f"incomplete; write it again with ds4tui bench --ab --json")
    bad.write_text(json.dumps({"mode": "ab", "arms": [{"name": "target-only", "tokens_per_s": [3]}], "model": {},
                               "backend": "cpu", "tokens": 64, "n_threads": 2}))
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: looks like a `bench --ab` result but field `arms[0].tokens_per_s` is array [3], expected number or "
        f"null: the file was edited or damaged; write it again with ds4tui bench --ab --json")
    for rate, shown in ((-5.0, "-5.0"), (float("nan"), "NaN")):  # rates no run writes
        bad.write_text(json.dumps({"mode": "ab", "arms": [{"name": "target-only", "tokens_per_s": rate}],
                                   "model": {}, "backend": "cpu", "tokens": 64, "n_threads": 2}))
        assert _refusal(capsys, str(good), bad) == (
            f"{bad}: looks like a `bench --ab` result but field `arms[0].tokens_per_s` is number {shown}, expected "
            f"a finite number >= 0 (a rate) or null: the file was edited or damaged; write it again with ds4tui "
            f"bench --ab --json")
    bad.write_text(json.dumps({**d, "decode_tokens_per_s": float("inf")}))
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: looks like a `bench` result but field `decode_tokens_per_s` is number Infinity, expected a finite "
        f"number >= 0 (a rate): the file was edited or damaged; write it again with ds4tui bench --json")
    for rate, shown in ((-5.5, "-5.5"), (float("nan"), "NaN"), (float("inf"), "Infinity")):  # inside an object too
        bad.write_text(json.dumps({"model": "m", "backend": "cpu", "generated_ids": [],
                                   "timings": {"prefill_tokens_per_s": 9.5, "decode_tokens_per_s": rate}}))
        assert _refusal(capsys, str(good), bad) == (
            f"{bad}: looks like `generate --json` output but field `timings.decode_tokens_per_s` is number {shown}, "
            f"expected a finite number >= 0 (a rate) or null: the file was edited or damaged; write it again with "
            f"ds4tui generate --json")
    gen = {"model": "m", "backend": "cpu", "generated_ids": [], "timings": {"decode_tokens_per_s": 9.0}}
    for field, value, expected in (("accept_rate", 250.0, "a percent 0..100 or null"),
                                   ("accept_rate", -3.0, "a percent 0..100 or null"),
                                   ("saved", float("nan"), "a finite number"),
                                   ("tokens_per_cycle", float("inf"), "a finite number")):
        bad.write_text(json.dumps({**gen, "dspark_stats": {field: value}}))
        shown = json.dumps(value)
        assert _refusal(capsys, str(good), bad) == (
            f"{bad}: looks like `generate --json` output but field `dspark_stats.{field}` is number {shown}, "
            f"expected {expected}: the file was edited or damaged; write it again with ds4tui generate --json")
    bad.write_text(json.dumps({"format": "ds4tui-chat/1", "messages": [], "session": None}))
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: looks like a transcript (Ctrl+S) but field `session` is null, expected an object holding the "
        f"session's stats (a transcript saved before any answer has none): save it again after an answer")
    bad.write_text(json.dumps({"format": 1, "x": 2}))
    assert _refusal(capsys, str(good), bad) == f"{bad}: not the result of a ds4tui run: {ACCEPTS}"


def _export(counters_id, scheduler: bool, cycles: int, skips: int) -> dict:
    return {"model": "m.gguf", "backend": "cpu", "knobs": {"enabled": True, "scheduler": scheduler},
            "stats": {"n_steps": cycles, "decode_ms": 2.5 * cycles},
            "dspark_stats": {"cycles": cycles, "scheduler_skips": skips, "accept_rate": 0.5},
            "n_ctx": 4096, "counters_id": counters_id, "interface": {"cpu_share": 0.1}}


def test_an_export_whose_knobs_changed_after_its_last_cycle_is_compared_with_the_knobs_that_ran(tmp_path, capsys):
    """F3 and F2 after the answer, then F6: the export's knobs say DSpark off, but no cycle ran with them
    (``knobs_in_force``: what its cycles ran with). Compared as DSpark off, a session that drafted read as one
    that did not."""
    on = {"enabled": True, "scheduler": True, "threshold": 0.0, "max_draft": 5}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({**_export("20261201T180000-0123abcd", True, 100, 4), "knobs": on, "knobs_in_force": on}))
    off = {**on, "enabled": False, "scheduler": False}
    b.write_text(json.dumps({**_export("20261201T181500-89abcdef", True, 100, 4), "knobs": off, "knobs_in_force": on,
                             "knob_events": []}))
    assert cli_main(["compare", str(a), str(b), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["knobs"] == [] and r["knob_change_warnings"] == [
        f"B ({b}) had its DSpark knobs changed after its last cycle (enabled false, scheduler false): no cycle ran "
        f"with them, so compared are the knobs its cycles ran with"]


def test_knobs_changed_after_the_last_cycle_do_not_hide_a_change_while_it_ran(tmp_path, capsys):
    """The policy switched at cycle 18 (Ctrl+R), then F3 after the answer: both warnings, the one about the
    knobs no cycle ran with and the one about the cycles that ran with two policies."""
    first = {"enabled": True, "scheduler": True, "threshold": 0.0, "max_draft": 5, "policy": "acceptance"}
    ran = {**first, "policy": "confidence"}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({**_export("20261201T180000-0123abcd", True, 100, 4), "knobs": ran, "knobs_in_force": ran}))
    b.write_text(json.dumps({**_export("20261201T181500-89abcdef", True, 100, 4), "knobs": {**ran, "scheduler": False},
                             "knobs_in_force": ran, "knob_events": [{"cycle": 0, **first}, {"cycle": 18, **ran}]}))
    assert cli_main(["compare", str(a), str(b), "--json"]) == 0
    (w,) = json.loads(capsys.readouterr().out)["knob_change_warnings"]
    assert w.startswith(f"B ({b}) had its DSpark knobs changed after its last cycle (scheduler false): no cycle ran")
    assert ("Also: B (" + str(b) + ") changed its DSpark knobs while it ran (from cycle 18: policy \"confidence\"): its "
            "figures mix the knobs before and after, and the knobs compared are those its last cycle ran with") in w


def test_a_result_written_before_the_policy_knob_ran_the_acceptance_policy():
    """A result without ``policy`` (written before 2026-12-06) ran the acceptance policy: no difference from
    a new acceptance run, "acceptance" -> "confidence" against a new default one; a policy where the
    scheduler was off in a run decided nothing there (moot, no variable)."""
    def run(**kw):
        return {"dspark": {"enabled": True, "scheduler": True, "threshold": 0.0, "max_draft": 5, **kw},
                "timings": {"decode_tokens_per_s": 100.0}}
    old = run()  # no policy field
    assert C.compare(old, run(policy="acceptance"))["knobs"] == []
    r = C.compare(old, run(policy="confidence"))
    assert r["knobs"] == [["dspark.policy", "acceptance", "confidence"]] and r["variables"] == 1
    r = C.compare(run(scheduler=False, policy="confidence"), run(scheduler=False, policy="acceptance", threshold=0.5))
    assert (r["variables"], r["moot"], r["warning"]) == (1, ["dspark.policy"], None)
    text = C.render("a", "b", "generate", "generate", r)
    assert "(dspark.policy: no effect where DSpark or its scheduler was off, so no variable of its own)" in text


def test_an_export_that_contains_the_other_is_a_warning(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_export("20261201T180000-0123abcd", True, 100, 424)))
    b.write_text(json.dumps(_export("20261201T180000-0123abcd", False, 160, 424)))  # F3, one more answer, F6
    rc = cli_main(["compare", str(a), str(b)])
    out = capsys.readouterr()
    warning = ("B contains A: both are exports of one chat session (counters 20261201T180000-0123abcd) and B's "
               "counters include A's, so B's figures cover A's turns too and a knob changed in between is not an "
               "A/B; start a new session between the two runs (in the chat: Ctrl+G, or start it again)")
    assert rc == 0 and out.out.count(f"WARNING: {warning}") == 1 and out.err == ""
    c = tmp_path / "c.json"  # the same knobs, one answer later: one session at two times, no "noise" between runs
    c.write_text(json.dumps(_export("20261201T180000-0123abcd", True, 160, 424)))
    assert cli_main(["compare", str(a), str(c)]) == 0
    text = capsys.readouterr().out
    assert "knobs: the same (one chat session at two times: see below)" in text and "noise" not in text.split("WARNING")[0]
    rc = cli_main(["compare", str(b), str(a), "--json"])
    out = capsys.readouterr()
    r = json.loads(out.out)
    assert r["contains"] == "a" and r["contains_warning"].startswith("A contains B: ")
    assert out.err == f"ds4tui compare: warning: {r['contains_warning']}\n"
    b.write_text(json.dumps(_export("20261201T181500-89abcdef", False, 160, 424)))  # counters reset in between
    rc = cli_main(["compare", str(a), str(b), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["contains"] is None and r["contains_warning"] is None


def test_the_chat_engine_renews_its_counters_id_when_they_restart(tiny_q2):
    from ds4tui.engine import worker as W

    chat = W.ChatEngine(tiny_q2["model"], backend="cpu", n_ctx=64)
    try:
        first = chat.counters_id
        assert first and chat.counters_id == first
        chat.reset_stats()
        second = chat.counters_id
        assert second != first
        chat.set_context(96)  # a new session: its counters start from zero
        assert chat.counters_id not in (first, second)
    finally:
        chat.close()


def test_an_export_generate_and_bench_compare_their_dspark_knobs_and_context(tmp_path, capsys):
    """Three kinds record the DSpark knobs and the context under different names: an export's
    ``knobs`` and ``n_ctx``, generate's ``dspark`` and ``n_ctx``, and a plain bench (target-only)
    none; compared across kinds they are one set of names, so a change is never hidden."""
    knobs = {"enabled": True, "scheduler": True, "threshold": 0.3, "max_draft": 5}
    export = {"model": "m.gguf", "backend": "cpu", "knobs": knobs, "stats": {"n_steps": 10},
              "n_ctx": 4096, "interface": {"cpu_share": 0.1}}
    gen = {"model": "m.gguf", "backend": "cpu", "dspark": {**knobs, "threshold": 0.0}, "n_ctx": 37,
           "generated_ids": [1, 2], "prompt_ids": [5, 6, 7], "timings": {"decode_tokens_per_s": 339.3}}
    bench = {"model": {"path": "m.gguf"}, "backend": "cpu", "ctx": 65, "prompt_tokens": 3,
             "decode_tokens_per_s": 404.9, "memcpy_gb_per_s": 10.0}
    files = {}
    for name, d in (("export", export), ("gen", gen), ("bench", bench)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(d))

    def knobs_of(a, b):
        assert cli_main(["compare", str(files[a]), str(files[b]), "--json"]) == 0
        return json.loads(capsys.readouterr().out)["knobs"]

    assert knobs_of("export", "gen") == [["ctx", 4096, 37], ["dspark.threshold", 0.3, 0.0]]
    assert knobs_of("gen", "bench") == [["ctx", 37, 65], ["dspark.enabled", True, False]]
    assert knobs_of("export", "bench") == [["ctx", 4096, 65], ["dspark.enabled", True, False]]


@pytest.mark.parametrize("text", ["0GiB", "0B", "0.0GiB"])
def test_a_zero_budget_is_refused_for_its_size_not_its_unit(text):
    from ds4tui.cli import size_bytes

    with pytest.raises(argparse.ArgumentTypeError, match=f"expected a size of at least 1 byte, found '{text}'"):
        size_bytes(text)


async def test_chat_exports_record_the_numerics_options_and_compare_lists_them(tiny_q2, tmp_path, capsys):
    """Two chat stats exports (F6), one with ``--activations q8``: each records the options in
    force under generate --json's names, and compare lists the activations between the two
    exports and between an export and a ``generate --json``."""
    from ds4tui.app import ChatOptions, DS4App

    async def export(activations: str, threads: int = 0) -> dict:
        folder = tmp_path / activations
        folder.mkdir()
        app = DS4App(ChatOptions(model=str(tiny_q2["model"]), support=None, backend="auto", ctx=64,
                                 save_dir=folder, telemetry="rss", activations=activations, threads=threads))
        async with app.run_test(size=(160, 40)) as pilot:
            await loaded(pilot, app)
            engine = app.engine.engine
            await pilot.press("f6")
            await pilot.pause()
        app.close_engine()
        path = next(folder.glob("ds4tui-stats-*.json"))
        d = json.loads(path.read_text())
        assert (d["activations"], d["prefill_gemm"], d["prefill_gemm_note"]) == \
            (engine.activations, engine.prefill_gemm, engine.prefill_gemm_note)
        assert (d["n_threads"], d["gpu_graphs"], d["system"]) == (engine.n_threads, engine.gpu_graphs, None)
        st = d["stats"]  # the session's decode rate, as its counters give it (None before a decode)
        assert d["decode_tokens_per_s"] == (1000 * st["n_decode_tokens"] / st["decode_ms"] if st["decode_ms"] else None)
        return {"path": str(path), **d}

    a, b = await export("f32"), await export("q8", threads=1)
    assert (a["activations"], b["activations"]) == ("f32", "q8") and b["n_threads"] == 1
    assert a["prefill_gemm"] == b["prefill_gemm"] == "off"  # the cpu backend keeps float32 products
    assert cli_main(["compare", a["path"], b["path"], "--json"]) == 0
    knobs = json.loads(capsys.readouterr().out)["knobs"]
    assert ["activations", "f32", "q8"] in knobs
    assert (["n_threads", a["n_threads"], 1] in knobs) == (a["n_threads"] != 1)  # the chat's --threads, listed
    dflt = _generate(tiny_q2, tmp_path, capsys, "dflt.json")
    assert json.loads(Path(dflt).read_text())["activations"] == "q8"  # auto, the default: q8 on the cpu
    gen = _generate(tiny_q2, tmp_path, capsys, "gen.json", "--activations", "f32")
    assert json.loads(Path(gen).read_text())["activations"] == "f32"
    assert cli_main(["compare", gen, b["path"], "--json"]) == 0
    knobs = json.loads(capsys.readouterr().out)["knobs"]
    assert ["activations", "f32", "q8"] in knobs and not any(k[0] == "prefill_gemm" for k in knobs)


def test_files_that_share_no_figures_get_a_short_note_and_a_bounded_summary(tmp_path, capsys):
    """A ``bench --ab`` result (every figure under ``arms``) against ``generate --json`` output: no figure
    in common, so the report says so, what each file is and what to compare instead, and summarises
    what only one has (counts per top-level name, a few names) instead of listing hundreds; --json
    keeps every name."""
    n_arm = 150  # figures per arm
    arms = [{"name": f"arm{i}", "tokens_per_s": 10.0 + i, **{f"f{j}": float(j + 1) for j in range(n_arm - 1)}}
            for i in range(3)]
    ab = {"mode": "ab", "arms": arms, "model": {"path": "m.gguf"}, "backend": "cpu", "tokens": 64, "n_threads": 2}
    gen = {"model": "m.gguf", "backend": "cpu", "generated_ids": [1, 2],
           "timings": {f"t{j}": float(j + 1) for j in range(40)},
           "dspark_stats": {f"s{j}": j + 1 for j in range(60)}}
    a, b = tmp_path / "ab.json", tmp_path / "gen.json"
    a.write_text(json.dumps(ab))
    b.write_text(json.dumps(gen))
    rc = cli_main(["compare", str(a), str(b)])
    text = capsys.readouterr().out
    assert rc == 0 and len(text) < 2000, len(text)
    assert (f"NOTE: the two files share no figures, so there is nothing to set side by side: A {a} is a `bench --ab` "
            f"result (written by ds4tui bench --ab --json; model m.gguf, backend cpu); B {b} is `generate --json` "
            f"output (written by ds4tui generate --json; model m.gguf, backend cpu); give two files of one kind: "
            f"{a} with another file written by ds4tui bench --ab --json, or {b} with another written by ds4tui "
            f"generate --json") in text
    assert f"only in A: {3 * n_arm} figures (under arms {3 * n_arm}), e.g. arms[0].f0, arms[0].f1, arms[0].f10; " \
           f"--json lists every one" in text
    assert "only in B: 100 figures (under dspark_stats 60, timings 40), e.g. " in text
    rc = cli_main(["compare", str(a), str(b), "--json"])
    out = capsys.readouterr()
    r = json.loads(out.out)
    assert rc == 0 and r["figures"] == [] and r["no_shared_figures"].startswith("the two files share no figures")
    assert len(r["only_a"]) == 3 * n_arm and len(r["only_b"]) == 100  # nothing lost
    assert out.err == f"ds4tui compare: note: {r['no_shared_figures']}\n"
    # files that share figures get no note; a short list is given in full
    assert C.names_summary(["x", "y.z"]) == "x, y.z"
    b.write_text(json.dumps({**gen, "timings": {"t0": 2.0}, "dspark_stats": {}, "extra": 1.0}))
    c = tmp_path / "gen2.json"
    c.write_text(json.dumps({**gen, "dspark_stats": {}}))
    rc = cli_main(["compare", str(c), str(b)])
    text = capsys.readouterr().out
    assert rc == 0 and "NOTE" not in text and "only in B: extra" in text
    assert "only in A: 39 figures (under timings 39), e.g. timings.t1, timings.t10, timings.t11;" in text


def test_an_interrupted_ab_result_is_refused_naming_what_finished(tmp_path, capsys):
    # bench --ab writes the runs that finished when it is interrupted ("ok": false, "interrupted": true):
    # its arms are not whole, so compare names what finished and what did not instead of comparing.
    part = tmp_path / "part.json"
    part.write_text(json.dumps({
        "ok": False, "interrupted": True, "mode": "ab", "error": "interrupted after 2 of 6 runs",
        "model": {"path": "m.gguf"}, "backend": "cpu", "tokens": 64, "n_threads": 2,
        "finished": [{"arm": "target-only", "kind": "code"}, {"arm": "dspark-no-scheduler", "kind": "code"}],
        "not_finished": [{"arm": "dspark-scheduler", "kind": "code"}],
        "runs": [{"arm": "target-only", "kind": "code", "tokens_per_s": 10.0}]}))
    rc = cli_main(["compare", str(part), str(part), "--json"])
    out = capsys.readouterr()
    message = (f"{part}: an interrupted `bench --ab` run (interrupted after 2 of 6 runs; finished: target-only code, "
               f"dspark-no-scheduler code; not finished: dspark-scheduler code): its arms are not whole, so no figure "
               f"of it compares with another run's; its finished runs' own figures are in its `runs`; run "
               f"`ds4tui bench --ab` to the end to compare")
    assert rc == 1 and json.loads(out.out) == {"ok": False, "error": message, "error_type": "CompareError"}
    assert out.err == f"ds4tui compare: error: {message}\n"


def _ab(tiny_q2, tmp_path, capsys, name: str, *extra: str) -> tuple[str, dict]:
    path = tmp_path / name
    rc = cli_main(["bench", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "--ab", "--backend", "cpu",
                   "--threads", "2", "--tokens", "16", "--json", "--out", str(path), *extra])
    capsys.readouterr()
    assert rc == 0
    return str(path), json.loads(path.read_text())


def test_two_ab_results_compare_arm_by_arm(tiny_q2, tmp_path, capsys):
    """Two ``bench --ab`` results: one table per arm under the arm's name and knobs, with the figures
    an A/B is read by (tokens/s overall and per prompt, the ratio to target-only, accept rate, tokens
    per cycle, the stage costs), each A, B and B/A from the files' own values; every figure by its
    JSON name only with --all."""
    # fresh prices: the second run's scheduler would start from what the first kept (a knob of its own)
    a, ja = _ab(tiny_q2, tmp_path, capsys, "a.json", "--scheduler-prices", "fresh")
    b, jb = _ab(tiny_q2, tmp_path, capsys, "b.json", "--scheduler-prices", "fresh")
    rc = cli_main(["compare", a, b, "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["knobs"] == [] and r["figures"]  # the full comparison is still there
    t = r["arms"]
    assert [x["arm"] for x in t["tables"]] == ["target-only", "dspark-no-scheduler", "dspark-scheduler"]
    assert [x["knobs_a"] for x in t["tables"]] == ["DSpark off", "DSpark on, scheduler off, confidence 0, max draft 5",
                                                  "DSpark on, scheduler on (confidence), confidence 0, max draft 5"]
    assert t["only_a"] == t["only_b"] == [] and t["outputs_identical"] == [True, True]
    for table, arm_a, arm_b in zip(t["tables"], ja["arms"], jb["arms"]):
        rows = {(label, kind): (x, y, q) for label, kind, x, y, q in table["rows"]}
        runs_a = {run["kind"]: run for run in arm_a["runs"]}
        runs_b = {run["kind"]: run for run in arm_b["runs"]}
        x, y, q = rows[("tokens/s", None)]
        assert (x, y) == (arm_a["tokens_per_s"], arm_b["tokens_per_s"]) and q == pytest.approx(y / x)
        for kind in ("code", "prose"):
            assert rows[("tokens/s", kind)][:2] == (runs_a[kind]["tokens_per_s"], runs_b[kind]["tokens_per_s"])
        dspark = arm_a["knobs"]["enabled"]
        assert (("accept rate", None) in rows) == (("tokens per cycle", "code") in rows) == dspark
        assert (("vs target-only", None) in rows) == (arm_a["name"] != "target-only")
        if dspark:
            assert rows[("vs target-only", "prose")][:2] == (runs_a["prose"]["ratio_to_target"],
                                                            runs_b["prose"]["ratio_to_target"])
            assert rows[("accept rate", None)][:2] == (arm_a["accept_rate"], arm_b["accept_rate"])
            assert rows[("tokens per cycle", "code")][:2] == (runs_a["code"]["tokens_per_cycle"],
                                                             runs_b["code"]["tokens_per_cycle"])
            assert rows[("drafted cycles", None)][:2] == (arm_a["stage_timing"]["drafted_cycles"],
                                                         arm_b["stage_timing"]["drafted_cycles"])
        verify = [arm.get("verify_over_target_decode") for arm in (arm_a, arm_b)]
        if any(verify):
            assert rows[("verify in target-only decodes", None)][:2] == tuple(v and v["ratio"] for v in verify)
        else:
            assert ("verify in target-only decodes", None) not in rows
    no_sched = next(x for x in t["tables"] if x["arm"] == "dspark-no-scheduler")["rows"]
    assert ["drafter pass (ms)", None, ja["arms"][1]["stage_timing"]["ms_per_drafter_pass"]["propose"],
            jb["arms"][1]["stage_timing"]["ms_per_drafter_pass"]["propose"]] in [row[:4] for row in no_sched]

    rc = cli_main(["compare", a, b])
    text = capsys.readouterr().out
    lines = text.splitlines()
    shown = sum(len(x["rows"]) for x in t["tables"])
    # a figure one run lacks (e.g. the verify price of a scheduler arm that drafted in one run only) is a
    # "-" in the tables and one counted line after them, never a raw JSON path
    only = sum(1 for side in ("only_a", "only_b") if r[side])
    # and a note that both files' runs were too short (16 tokens of the tiny model)
    assert len(r["noise_notes"]) == 1 and r["noise_notes"][0].startswith("A and B ran short")
    assert rc == 0 and "arms[" not in text and len(lines) == 5 + 1 + 3 + shown + 3 + only + 2, text
    x, y = ja["arms"][0]["tokens_per_s"], jb["arms"][0]["tokens_per_s"]
    i = lines.index("target-only: DSpark off")
    assert lines[i - 1].split() == ["per", "arm", "A", "B", "B/A"]
    assert lines[i + 1].split() == ["tokens/s", f"{x:.2f}", f"{y:.2f}", f"{y / x:.3f}"]
    assert lines[i + 2].split()[:3] == ["code", "prompt", f"{ja['arms'][0]['runs'][0]['tokens_per_s']:.2f}"]
    assert "dspark-no-scheduler: DSpark on, scheduler off, confidence 0, max draft 5" in lines
    v = ja["arms"][1]["accept_rate"], jb["arms"][1]["accept_rate"]
    assert any(line.split()[:4] == ["accept", "rate", f"{v[0]:.2f}%", f"{v[1]:.2f}%"] for line in lines)
    assert "greedy outputs: identical in every arm in both runs" in lines
    assert lines[-1 - only] == (f"(the tables hold {shown} figures; --all lists every one of the {len(r['figures'])} "
                                f"both runs have by its JSON name, as --json does; {r['zero_in_both']} more are 0 in both)")
    rc = cli_main(["compare", a, b, "--all"])
    full = capsys.readouterr().out
    assert rc == 0 and full.startswith(text[:text.index("greedy outputs")])  # the tables, then every figure
    assert "every figure both runs have, by its JSON name:" in full
    assert len([line for line in full.splitlines() if line.startswith("arms[")]) == \
        len([k for k, *_ in r["figures"] if k.startswith("arms[")])
    assert full.splitlines()[-1 - only] == f"({r['zero_in_both']} more figures are 0 in both runs)"


def test_ab_results_whose_arms_or_outputs_differ_say_so(tiny_q2, tmp_path, capsys):
    a, ja = _ab(tiny_q2, tmp_path, capsys, "a.json")
    jb = json.loads(json.dumps(ja))
    jb["arms"][1]["knobs"]["max_draft"] = 3
    jb["arms"][2]["name"] = "dspark-other"
    jb["outputs_identical"] = False
    b = tmp_path / "b.json"
    b.write_text(json.dumps(jb))
    rc = cli_main(["compare", a, str(b)])
    text = capsys.readouterr().out
    assert rc == 0 and ('knobs that differ (2):\n  arms[1].knobs.max_draft  5 -> 3\n  arms[2].name             '
                        '"dspark-scheduler" -> "dspark-other"\n') in text
    assert ("dspark-no-scheduler: A: DSpark on, scheduler off, confidence 0, max draft 5; B: DSpark on, scheduler "
            "off, confidence 0, max draft 3\n") in text
    assert "\ndspark-scheduler:" not in text and "\ndspark-other:" not in text
    assert "arms only in A: dspark-scheduler (not compared)\narms only in B: dspark-other (not compared)\n" in text
    assert ("greedy outputs: A identical in every arm; B DIFFERENT between arms (see its `mismatches`)\n") in text
    rc = cli_main(["compare", a, str(b), "--json"])
    t = json.loads(capsys.readouterr().out)["arms"]
    assert [x["arm"] for x in t["tables"]] == ["target-only", "dspark-no-scheduler"]
    assert (t["only_a"], t["only_b"], t["outputs_identical"]) == (["dspark-scheduler"], ["dspark-other"], [True, False])
    # figures one run lacks: counted after the tables, named with --all
    jc = json.loads(json.dumps(ja))
    del jc["arms"][1]["verify_over_target_decode"]
    c = tmp_path / "c.json"
    c.write_text(json.dumps(jc))
    rc = cli_main(["compare", a, str(c)])
    text = capsys.readouterr().out
    # the ratio is a row of the tables (a "-" there); the plain decodes beside it are not
    assert rc == 0 and text.endswith('only in A: 1 figure of the tables (a "-" in the other run\'s column; --all names '
                                     'it)\nonly in A, besides: arms[1].verify_over_target_decode.plain_decodes\n')
    rc = cli_main(["compare", a, str(c), "--all"])
    assert ("only in A: arms[1].verify_over_target_decode.plain_decodes, arms[1].verify_over_target_decode.ratio"
            in capsys.readouterr().out)
    # a scheduler that started elsewhere in one run: named by the run; the arms without the scheduler are not
    jd = json.loads(json.dumps(ja))
    start = ja["arms"][2]["runs"][0]["scheduler_prices_at_start"]
    other = "fresh" if start != "fresh" else "saved"
    for arm in (0, 1, 2):
        jd["arms"][arm]["runs"][0]["scheduler_prices_at_start"] = other
    d = tmp_path / "d.json"
    d.write_text(json.dumps(jd))
    rc = cli_main(["compare", a, str(d)])
    text = capsys.readouterr().out
    assert rc == 0 and (f'knobs that differ (1):\n  arms[2].runs[0].scheduler_start  "{start}" -> "{other}"\n\n'
                        f'NOTE: the DSpark scheduler started differently') in text


def test_only_two_ab_results_get_arm_tables(tiny_q2, tmp_path, capsys):
    g = _generate(tiny_q2, tmp_path, capsys, "g.json")
    rc = cli_main(["compare", g, g, "--json"])
    assert rc == 0 and "arms" not in json.loads(capsys.readouterr().out)
    rc = cli_main(["compare", g, g, "--all"])
    text = capsys.readouterr().out
    assert rc == 0 and "per arm" not in text and "figure" in text.splitlines()[5]


def test_two_chat_stats_exports_whose_scheduler_started_differently_say_so():
    """F6's export names where the session's scheduler started (the chat's first session fresh, the
    one Ctrl+G opened from the prices the first kept): compare lists it among the knobs, where it said
    "the same in both runs" while proposed went 3 -> 17."""
    knobs = {"enabled": True, "scheduler": True, "threshold": 0.0, "max_draft": 5}
    a = {"knobs": knobs, "scheduler_prices": "engine", "scheduler_prices_at_start": "fresh",
         "scheduler_prices_retime": "", "dspark_stats": {"proposed": 3}}
    b = dict(a, scheduler_prices_at_start="engine", dspark_stats={"proposed": 17})
    r = C.compare(a, b)
    assert r["knobs"] == [["scheduler_start", "fresh", "engine"]] and r["variables"] == 1 and r["scheduler_start_note"]
    off = dict(b, knobs=dict(knobs, scheduler=False))  # the scheduler off in B: its knob says so, no start
    assert C.compare(a, off)["knobs"] == [["knobs.scheduler", True, False]]


def test_a_knob_of_another_type_or_out_of_range_is_refused_naming_the_file_and_the_field(tmp_path, capsys):
    """A knob compare would show (a setting of the run) holding another JSON type or a value its writer
    never writes is an edited or damaged file: refused like a field of the wrong type, with the field,
    what it holds, what was expected and what writes the file, not compared as a setting ("threshold
    0.3 -> x")."""
    knobs = {"enabled": True, "scheduler": True, "threshold": 0.3, "max_draft": 5}
    gen = {"model": "m.gguf", "backend": "cpu", "numerics": "ds4", "scheduler_prices": "fresh",
           "scheduler_prices_at_start": "fresh", "scheduler_prices_retime": None, "dspark": knobs, "n_ctx": 37,
           "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0},
           "generated_ids": [1, 2], "prompt_ids": [5, 6, 7], "timings": {"decode_tokens_per_s": 339.3}}
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(gen))
    bad.write_text(json.dumps(gen))
    assert cli_main(["compare", str(good), str(bad)]) == 0  # as written: compared
    capsys.readouterr()
    damaged = "the file was edited or damaged; write it again with ds4tui generate --json"
    for change, found in (
            ({"scheduler_prices_at_start": 5},
             'field `scheduler_prices_at_start` is integer 5, expected string "fresh", "engine" or "saved"'),
            ({"dspark": dict(knobs, threshold="x")}, 'field `dspark.threshold` is string "x", expected number in 0..1'),
            ({"dspark": dict(knobs, threshold=1.5)}, "field `dspark.threshold` is number 1.5, expected number in 0..1"),
            ({"dspark": dict(knobs, scheduler="on")}, 'field `dspark.scheduler` is string "on", expected true/false'),
            ({"numerics": "fp8"}, 'field `numerics` is string "fp8", expected string "ds4" or "transformers"'),
            ({"sampling": "greedy"}, 'field `sampling` is string "greedy", expected object'),
            ({"n_ctx": 0}, "field `n_ctx` is integer 0, expected integer >= 1")):
        bad.write_text(json.dumps({**gen, **change}))
        assert _refusal(capsys, str(good), bad) == f"{bad}: looks like `generate --json` output but {found}: {damaged}"
    # with --json, the error object as for every other refusal
    rc = cli_main(["compare", str(good), str(bad), "--json"])
    assert rc == 1 and json.loads(capsys.readouterr().out)["error"].startswith(
        f"{bad}: looks like `generate --json` output but field `n_ctx`")
    # an arm's knobs, and where a run's scheduler started, in a bench --ab result
    run = {"kind": "code", "knobs": knobs, "scheduler_prices_at_start": "kept", "tokens_per_s": 10.0}
    ab = {"mode": "ab", "model": {"path": "m.gguf"}, "backend": "cpu", "tokens": 64, "n_threads": 2,
          "arms": [{"name": "target-only", "tokens_per_s": 9.0, "knobs": dict(knobs, enabled=False)},
                   {"name": "dspark", "tokens_per_s": 10.0, "knobs": knobs, "runs": [run]}]}
    bad.write_text(json.dumps(ab))
    assert _refusal(capsys, str(good), bad) == (
        f'{bad}: looks like a `bench --ab` result but field `arms[1].runs[0].scheduler_prices_at_start` is string '
        f'"kept", expected string "fresh", "engine" or "saved": the file was edited or damaged; write it again with '
        f'ds4tui bench --ab --json')
    ab["arms"][1]["runs"] = [dict(run, scheduler_prices_at_start="engine")]
    ab["arms"][0]["knobs"] = dict(knobs, max_draft=0)
    bad.write_text(json.dumps(ab))
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: looks like a `bench --ab` result but field `arms[0].knobs.max_draft` is integer 0, expected integer "
        f">= 1: the file was edited or damaged; write it again with ds4tui bench --ab --json")
    # a stats export (F6): its knobs under `knobs`
    export = dict(_export("20261201T180000-0123abcd", True, 100, 424), knobs=dict(knobs, enabled=None))
    bad.write_text(json.dumps(export))
    assert _refusal(capsys, str(good), bad) == (
        f"{bad}: looks like a stats export (F6) but field `knobs.enabled` is null, expected true/false: the file was "
        f"edited or damaged; write it again with F6 in the chat")


def test_a_ratio_or_figure_that_rounds_to_zero_has_no_minus_sign(tmp_path, capsys):
    """A net time saved of -0.02 ms against 250 ms is a B/A of -0.00008: printed 0.000, as a value of
    -0.0 is printed 0, in the figures and in the arm tables; --json keeps the numbers as they are."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    gen = {"model": "m.gguf", "backend": "cpu", "generated_ids": [1, 2], "prompt_ids": [5, 6, 7]}
    a.write_text(json.dumps({**gen, "timings": {"net_saved_ms": 250.0, "decode_tokens_per_s": 339.3}}))
    b.write_text(json.dumps({**gen, "timings": {"net_saved_ms": -0.02, "decode_tokens_per_s": -0.0}}))
    assert cli_main(["compare", str(a), str(b)]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.startswith("timings.")}
    assert rows == {"timings.net_saved_ms": ["250", "-0.02", "ms", "0.000"],
                    "timings.decode_tokens_per_s": ["339.3", "0", "tok/s", "0.000"]}
    assert cli_main(["compare", str(a), str(b), "--json"]) == 0
    figures = {k: (x, y, q) for k, x, y, q in json.loads(capsys.readouterr().out)["figures"]}
    assert figures["timings.net_saved_ms"] == (250.0, -0.02, -0.02 / 250.0)
    table = {"tables": [{"arm": "dspark", "knobs_a": "DSpark on", "knobs_b": "DSpark on",
                         "rows": [["vs target-only", "code", 1.5, -0.0001, -0.0001 / 1.5],
                                  ["drafter pass (ms)", "code", 0.9, -0.0, -0.0]]}],
             "only_a": [], "only_b": [], "outputs_identical": [True, True]}
    lines = C.render_arms(table)
    assert lines[2].split() == ["code", "prompt", "1.500x", "0.000x", "0.000"]
    assert lines[3].split() == ["code", "prompt", "0.900", "0.000", "0.000"]


def test_a_short_ab_run_is_named_with_its_bench_note(tiny_q2, tmp_path, capsys):
    """A ``bench --ab`` result whose runs were too short to resolve a few percent carries bench's
    ``noise_note``; compare names that file (A or B) and what its note measured, on one line cut to
    NOISE_NOTE_CHARS, in the table and in --json: one note for both files when both say so, none for a
    file without one, for a file against itself, or for another kind of file.  A ``noise_note`` of
    another JSON type is refused by name."""
    a, ja = _ab(tiny_q2, tmp_path, capsys, "a.json", "--scheduler-prices", "fresh")
    assert ja["noise_note"].startswith("the shortest run decoded for")  # 16 tokens of the tiny model
    measured = ja["noise_note"].split(": ", 1)[0]  # "the shortest run decoded for 0.03 s (the longest 0.08 s)"
    long_b = tmp_path / "b.json"
    long_b.write_text(json.dumps({**ja, "noise_note": None, "tokens": 17}))
    rc = cli_main(["compare", a, str(long_b), "--json"])
    out = capsys.readouterr()
    r = json.loads(out.out)
    want = (f"A ({a}) ran short ({measured}): a B/A within a few percent of 1 says nothing about a change; its "
            f"bench report says what resolves a few percent")
    assert rc == 0 and r["noise_notes"] == [want] and f"ds4tui compare: note: {want}" in out.err
    rc = cli_main(["compare", str(long_b), a])
    text = capsys.readouterr().out
    assert rc == 0 and f"NOTE: B ({a}) ran short ({measured})" in text and "A (" not in text.split("NOTE")[1]

    # both short: one note; its text on one line, without control characters, cut short
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({**ja, "tokens": 18, "noise_note": "\x1b[31mRED\x1b[0m\nWARNING: fake" + "x" * 500}))
    rc = cli_main(["compare", a, str(odd), "--json"])
    notes = json.loads(capsys.readouterr().out)["noise_notes"]
    assert rc == 0 and len(notes) == 1 and notes[0].startswith(f"A and B ran short (A: {measured}; B: ")
    assert "\x1b" not in notes[0] and "\n" not in notes[0] and "[31m" not in notes[0] and "; B: RED WARNING)" in notes[0]
    assert len(notes[0]) < 2 * C.NOISE_NOTE_CHARS + 200
    assert C._noise_clause("bench-ab", {"noise_note": "\x1b]0;TITLE\x07evil \x1b[2J " + "y" * 400 + ": z"}) == \
        "evil " + "y" * (C.NOISE_NOTE_CHARS - 8) + "..."
    assert C.noise_notes("a", "b", "generate", "generate", {"noise_note": "short: x"}, {"noise_note": "x: y"}) == []

    # a file against itself: the same-run note alone
    rc = cli_main(["compare", a, a, "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["noise_notes"] == [] and r["same_run"]
    # a blank note is none
    blank = tmp_path / "blank.json"
    blank.write_text(json.dumps({**ja, "tokens": 19, "noise_note": "   "}))
    rc = cli_main(["compare", str(blank), str(long_b), "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["noise_notes"] == []

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**ja, "noise_note": 5}))
    rc = cli_main(["compare", a, str(bad)])
    err = capsys.readouterr().err
    assert rc == 1 and "noise_note" in err and "integer" in err and str(bad) in err


def test_settings_left_at_auto_follow_from_the_knob_that_moved():
    """--activations f32 against q8 with --amx and --verify-head at auto: amx and verify_head change
    with it (their notes say "auto: ..."), so the runs differ in one variable, listed with the two that
    followed; where only auto settings differ (another machine), they are the variables."""
    a = {"kind": "generate", "activations": "q8", "amx": "on", "amx_note": "auto: on: this CPU has AMX-INT8",
         "verify_head": "all", "verify_head_note": "auto: all on the cpu backend with q8 activations",
         "timings": {"decode_tokens_per_s": 600.0}}
    b = dict(a, activations="f32", amx="off", amx_note="auto: off with f32 activations", verify_head="lazy",
             verify_head_note="auto: lazy on the cpu backend with f32 activations", timings={"decode_tokens_per_s": 300.0})
    r = C.compare(a, b)
    assert [k for k, _, _ in r["knobs"]] == ["activations", "amx", "verify_head"]
    assert (r["variables"], r["derived"], r["warning"]) == (1, ["amx", "verify_head"], None)
    text = C.render("a.json", "b.json", "generate", "generate", r)
    assert "knobs that differ (1 variable under 3 names):" in text
    assert "(amx, verify_head: auto in both runs, so they follow from the knobs above and are no variable of their own)" in text
    # --verify-head lazy given in one run: its note is not auto, so verify_head is a variable of its own
    c = dict(b, verify_head_note="lazy: asked with --verify-head lazy")
    r = C.compare(a, c)
    assert r["variables"] == 2 and r["derived"] == ["amx"] and "2 variables differ" in r["warning"]
    # only auto settings differ (the same options on a CPU without AMX): they are what differs
    d = dict(a, amx="off", amx_note="auto: off: this CPU has no AMX-INT8")
    r = C.compare(a, d)
    assert (r["variables"], r["derived"]) == (1, [])


def test_a_dspark_knob_of_a_run_with_dspark_off_is_no_variable_of_its_own():
    """DSpark on with the scheduler against --no-dspark (whose scheduler flag is off too): one variable, not
    "2 variables differ (dspark.enabled, dspark.scheduler)"; with DSpark on in both, the scheduler is one."""
    def run(enabled, scheduler):
        return {"dspark": {"enabled": enabled, "scheduler": scheduler, "threshold": 0.0, "max_draft": 5},
                "timings": {"decode_tokens_per_s": 100.0}}
    r = C.compare(run(True, True), run(False, False))
    assert r["knobs"] == [["dspark.enabled", True, False], ["dspark.scheduler", True, False]]
    assert (r["variables"], r["moot"], r["warning"]) == (1, ["dspark.scheduler"], None)
    text = C.render("a.json", "b.json", "generate", "generate", r)
    assert "(dspark.scheduler: no effect where DSpark was off, so no variable of its own)" in text
    r = C.compare(run(True, True), run(True, False))
    assert (r["variables"], r["moot"]) == (1, [])
    both_off = dict(run(False, True), dspark={"enabled": False, "scheduler": True, "threshold": 0.5, "max_draft": 5})
    r = C.compare(both_off, run(False, False))  # --no-dspark twice, other DSpark flags: nothing differs that ran
    assert (r["variables"], r["moot"], r["warning"]) == (0, ["dspark.scheduler", "dspark.threshold"], None)
    assert "knobs that differ (2, none a variable of the runs):" in C.render("a", "b", "generate", "generate", r)
    # a support model in one run only: its path, status, block size and DSpark's knobs (null without it): one
    no_support = {"dspark": None, "support": {"path": None, "status": "none", "block_size": 0}, "draft_vocab": 0,
                  "timings": {"decode_tokens_per_s": 100.0}}
    with_support = {**run(True, True), "support": {"path": "s.gguf", "status": "attached", "block_size": 5},
                    "draft_vocab": 16384}
    r = C.compare(with_support, no_support)
    assert r["variables"] == 1 and r["warning"] is None, r["knobs"]


def test_the_drafts_saved_time_is_a_figure_and_a_transcripts_saved_stamp_is_not():
    """``dspark_stats.saved`` (ms the accepted drafts saved) was left out with the transcript's top-level
    ``saved`` (when it was written), which shares its name."""
    a = {"dspark_stats": {"saved": 0.0, "net_saved": -3.5}, "saved": "2026-12-05T16:00:00"}
    b = {"dspark_stats": {"saved": 2.322, "net_saved": -1.0}, "saved": "2026-12-05T16:05:00"}
    r = C.compare(a, b)
    assert [f[0] for f in r["figures"]] == ["dspark_stats.saved", "dspark_stats.net_saved"]
    assert "saved" not in C.flatten(a) and C.flatten(a)["dspark_stats.saved"] == 0.0


def test_a_context_sized_by_the_run_follows_from_the_prompt_and_the_system_text_is_a_knob():
    """generate sizes its context prompt + -n without --ctx (``n_ctx_note`` "auto: ..."): another prompt, or a
    --system text (recorded now), moves it, and compare listed n_ctx as the one variable (the system text was
    not in the file at all); a --ctx given is a variable of its own."""
    def run(prompt_tokens, n_ctx, system=None, note=None):
        return C.canonical("generate", {
            "model": "m.gguf", "backend": "cpu", "generated_ids": [], "prompt_ids": list(range(prompt_tokens)),
            "prompt": "p", "system": system, "n_ctx": n_ctx,
            "n_ctx_note": note or f"auto: the prompt's {prompt_tokens} tokens + -n 48 (no --ctx)",
            "timings": {"decode_tokens_per_s": 100.0}})
    r = C.compare(run(19, 67), run(24, 72, system="You are terse."))
    assert r["knobs"] == [["ctx", 67, 72], ["prompt_tokens", 19, 24], ["system", None, "You are terse."]]
    assert r["derived"] == ["ctx"] and r["variables"] == 2  # the system text and the prompt it renders
    r = C.compare(run(19, 67), run(19, 67, system="You are terse."))
    assert r["knobs"] == [["system", None, "You are terse."]] and r["variables"] == 1
    r = C.compare(run(19, 67), run(19, 80, note="--ctx 80: given"))
    assert r["knobs"] == [["ctx", 67, 80]] and r["derived"] == [] and r["variables"] == 1


@pytest.mark.parametrize("name,unit", [
    ("timings.decode_tokens_per_s", "tok/s"), ("arms[1].runs[0].tokens_per_s", "tok/s"), ("memcpy_gb_per_s", "GB/s"),
    ("stats.decode_ms", "ms"), ("dspark_stats.verify", "ms"), ("dspark_stats.prop_chain", "ms"),
    ("dspark_stats.stage_timing.ms_per_drafter_pass.prop_markov", "ms"),
    ("dspark_stats.stage_timing.verify_ms_per_drafted_cycle", "ms"), ("timings.load_s", "s"),
    ("runs[0].decode_seconds", "s"), ("memory.kv", "bytes"), ("bytes_per_token_detail.kv", "bytes"),
    ("memcpy.buffer_bytes", "bytes"), ("dspark_stats.accept_rate", "%"), ("scheduler_other_work_cores", "cores"),
    ("dspark_stats.cycles", ""), ("dspark_stats.per_position_accept[0]", ""), ("bandwidth_ratio", ""),
    ("model.n_layer", ""), ("dspark_stats.stage_timing.verify_over_decode", ""),
    ("bytes_per_token_detail.at_ctx", "tokens"), ("ctx", "tokens"), ("arms[0].memory.kv", "bytes"),
    ("arms[1].dspark_stats.propose", "ms"), ("arms[1].runs[0].memory.scratch", "bytes"),
    ("arms[0].runs[1].decode_seconds", "s"),
])
def test_every_figure_has_the_unit_its_name_gives(name, unit):
    from ds4tui.commands.compare import figure_unit

    assert figure_unit(name) == unit


def test_the_figure_table_shows_each_unit(tiny_q2, tmp_path, capsys):
    g = _generate(tiny_q2, tmp_path, capsys, "g.json")
    assert cli_main(["compare", g, g]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("figure"))
    assert lines[head].split() == ["figure", "A", "B", "unit", "B/A"]
    rows = {line.split()[0]: line.split() for line in lines[head + 1:] if line and not line.startswith(("(", "only"))}
    assert rows["timings.decode_tokens_per_s"][3:] == ["tok/s", "1.000"]
    assert rows["stats.n_steps"][3:] == ["1.000"]


def test_knobs_changed_during_a_run_are_a_warning_not_noise(tmp_path, capsys):
    """An export whose scheduler was turned off during the session (F3 at cycle 15: its knob_events)
    records scheduler false at its end: compared with a run that had it off throughout, the knobs are
    the same, but its counters mix both settings, which compare says, naming the cycle and the knob,
    instead of "the figures differ by run-to-run noise only"."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_export("20261201T180000-0123abcd", False, 30, 0)))
    changed = _export("20261201T190000-4567abcd", False, 30, 7)
    changed["knob_events"] = [{"cycle": 0, "enabled": True, "scheduler": True, "threshold": 0.0, "max_draft": 5},
                              {"cycle": 9, "enabled": True, "scheduler": True, "threshold": 0.0, "max_draft": 5},
                              {"cycle": 15, "enabled": True, "scheduler": False, "threshold": 0.0, "max_draft": 5},
                              {"cycle": 22, "enabled": True, "scheduler": False, "threshold": 0.0, "max_draft": 4},
                              {"cycle": 25, "enabled": True, "scheduler": False, "threshold": 0.0, "max_draft": 5}]
    b.write_text(json.dumps(changed))
    assert cli_main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    # what each event changed, from the knobs set at cycle 0; an event that changed nothing (cycle 9) is left out
    want = (f"WARNING: B ({b}) changed its DSpark knobs while it ran (from cycle 15: scheduler false; from cycle 22: "
            f"max_draft 4; from cycle 25: max_draft 5): its figures mix the knobs before and after, and the knobs "
            f"compared are those at its end; for an A/B, keep a run's knobs fixed (in the chat, Ctrl+G starts a "
            f"session whose counters start afresh)")
    assert want in out and "noise only" not in out
    assert "knobs: the same at the end of both runs (but see below: they changed during a run)" in out
    assert cli_main(["compare", str(a), str(b), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["knob_change_warnings"] == [want.removeprefix("WARNING: ")]
    assert f"ds4tui compare: warning: {want.removeprefix('WARNING: ')}" in captured.err
