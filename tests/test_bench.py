"""``ds4tui bench``: real measurements on the tiny model, the bytes-per-token figure recomputed from
the tensor table, error handling, the --medium cache (with a stand-in builder: the real medium
model takes minutes to build), and the --ab comparison of target-only and DSpark arms."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.commands import bench
from ds4tui.devtools import make_test_model as mtm
from ds4tui.engine.gguf_model import DS4Model
from ds4tui.engine.stats import DSparkStats
from ds4tui.engine.telemetry import format_bytes

# 12 prompt tokens, then 5 timed decode steps at positions 12..16, i.e. contexts 13..17: mean 15.
PROMPT, DECODE, MEAN_CTX = 12, 5, 15


def _independent_bytes_per_token(path: str) -> tuple[int, int]:
    """Bytes one decoded token reads in the tiny model at context 15, summed from TensorInfo.nbytes.

    Every tensor once, except: one row of the embedding and of the hash-routing table, 6 of the 16
    experts (per-expert slice × 6), and no indexer scoring weights (15 // 4 = 3 compressed rows is
    fewer than top-8, so the indexer does not score).  KV (f32 rows of head_dim 128 = 512 B):
    6 layers × 15 raw rows (window 16); CSA layers 2 and 4: 15 // 4 = 3 rows each; HCA layers 3
    and 5: 15 // 16 = 0 rows."""
    weights = 0
    for name, t in DS4Model(path).tensors.items():
        if name == "token_embd.weight" or name.endswith("tid2eid.weight"):
            weights += t.nbytes // t.shape[0]
        elif "_exps." in name:
            weights += t.nbytes // t.shape[0] * 6
        elif name.endswith(("indexer.attn_q_b.weight", "indexer.proj.weight")):
            pass
        else:
            weights += t.nbytes
    kv = 6 * 15 * 512 + 2 * 3 * 512
    return weights, kv


def _bench(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["bench", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_bench_json_measures_the_tiny_model(tiny_q2, tmp_path, capsys):
    out_file = tmp_path / "bench.json"
    rc, out, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", str(PROMPT), "--decode-tokens", str(DECODE),
                          "--threads", "2", "--json", "--out", str(out_file))
    assert rc == 0, err
    r = json.loads(out)
    assert json.loads(out_file.read_text()) == r
    for key in ("ok", "timestamp", "model", "backend", "numerics", "n_threads", "threads_note", "prompt_tokens",
                "decode_tokens",
                "ctx", "prefill_tokens_per_s", "decode_tokens_per_s", "bytes_per_token", "effective_gb_per_s",
                "memcpy_gb_per_s", "bandwidth_ratio", "bandwidth_note", "memcpy", "memory", "machine", "runs"):
        assert key in r, key
    assert r["ok"] is True and r["backend"] == "cpu" and r["numerics"] == "ds4" and r["n_threads"] == 2
    assert (r["prompt_tokens"], r["decode_tokens"], r["ctx"], r["prompt"]) == (PROMPT, DECODE, PROMPT + DECODE + 1,
                                                                              "text")
    assert r["model"]["path"] == tiny_q2["model"] and r["model"]["medium"] is False
    assert r["model"]["file_bytes"] == os.path.getsize(tiny_q2["model"])
    assert r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
    run = r["runs"][0]
    assert run["prefill_tokens_per_s"] == pytest.approx(PROMPT / run["prefill_seconds"])
    assert run["decode_tokens_per_s"] == pytest.approx(DECODE / run["decode_seconds"])

    weights, kv = _independent_bytes_per_token(tiny_q2["model"])
    assert r["bytes_per_token_detail"] == {"weights": weights, "kv": kv, "at_ctx": MEAN_CTX}
    assert r["bytes_per_token"] == weights + kv

    assert r["effective_gb_per_s"] == pytest.approx(r["bytes_per_token"] * r["decode_tokens_per_s"] / 1e9)
    assert r["memcpy_gb_per_s"] > 0
    assert r["memcpy"]["buffer_bytes"] >= 256 << 20 and r["memcpy"]["n_threads"] == 2
    assert r["bandwidth_ratio"] == pytest.approx(r["effective_gb_per_s"] / r["memcpy_gb_per_s"])
    llc = r["machine"]["llc_bytes"]
    if llc and r["bytes_per_token"] <= llc:  # the tiny model's bytes sit in the cache: the ratio says nothing
        assert f"fit in the CPU's last-level cache ({format_bytes(llc)})" in r["bandwidth_note"]
    else:
        assert r["bandwidth_note"] is None

    m = r["memory"]
    assert m["total"] == m["weights"] + m["kv"] + m["compressor"] + m["scratch"] + m["device"] + m["amx_copies"]
    assert m["weights"] > 0 and m["kv"] > 0
    assert (m["amx_copies"] > 0) == (r["amx"] == "on")  # the amx option's copies (spec ds4.md §2.9.6)
    assert r["machine"]["cpu_count"] == os.cpu_count() and r["machine"]["platform"]
    assert datetime.datetime.fromisoformat(r["timestamp"]).tzinfo is not None


def test_bench_text_table_reference_backend_and_repeat(tiny_q2, capsys):
    rc, out, err = _bench(capsys, tiny_q2["model"], "--backend", "reference", "--numerics", "transformers",
                          "--prompt-tokens", "6", "--decode-tokens", "2", "--repeat", "2", "--ctx", "32")
    assert rc == 0, err
    lines = out.splitlines()
    labels = [line.split()[0] for line in lines]
    assert labels == ["model", "engine", "machine", "memory", "prefill", "decode", "bytes/token", "effective",
                      "memcpy", "ratio"]
    width = len("bytes/token")  # labels padded to the longest one: the values start in one column
    assert all(line[:width].rstrip() == label and line[width:width + 2] == "  " and line[width + 2:].strip()
               for line, label in zip(lines, labels))
    assert "reference backend, transformers numerics, f32 activations, 1 thread, context 32" in out
    assert "prefill-gemm off: the reference backend keeps float32 products" in out  # a numerics option, named
    assert "fastest of 2 runs" in out
    assert float(lines[4].split()[1]) > 0 and float(lines[5].split()[1]) > 0


def test_the_bandwidth_note_says_when_a_tokens_bytes_fit_in_the_last_level_cache():
    from ds4tui.commands.bench import bandwidth_note

    def r(backend="cpu", llc=32 << 20, bpt=16 << 20):
        return {"backend": backend, "machine": {"llc_bytes": llc}, "bytes_per_token": bpt}

    assert bandwidth_note(r()).startswith("the 16.0 MiB a token reads fit in the CPU's last-level cache (32.0 MiB): ")
    assert bandwidth_note(r(bpt=(32 << 20) + 1)) is None  # a memory stream: the ratio means what it says
    assert bandwidth_note(r(llc=None)) is None and bandwidth_note(r(backend="hip")) is None


def test_missing_model_file_is_one_line_and_status_1(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    rc, out, err = _bench(capsys, str(missing))
    assert rc == 1 and out == ""
    hint = " (argument MODEL: expected a DS4 model GGUF; check the path, or leave MODEL out for the bundled demo model)"
    assert err.splitlines() == [f"ds4tui bench: error: {missing}: no such file{hint}"]
    rc, out, err = _bench(capsys, str(missing), "--json")
    assert rc == 1 and json.loads(out) == {"ok": False, "error": f"{missing}: no such file{hint}",
                                           "error_type": "ModelFileError"}


def test_not_a_gguf_is_one_line_and_status_1(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(60))
    rc, out, err = _bench(capsys, str(bad))
    assert rc == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"ds4tui bench: error: {bad}: wrong magic")
    assert err.rstrip().endswith("(argument MODEL: expected a DS4 model GGUF; check the path, or leave MODEL out for "
                                 "the bundled demo model)")  # which argument named it, and what to do


@pytest.mark.parametrize("argv, message", [
    (["--medium", "--synthetic", "flash"], "argument --synthetic: not allowed with argument --medium"),
    (["model.gguf", "--medium"], "argument --medium: not allowed with argument MODEL"),
    (["model.gguf", "--decode-tokens", "0"], "argument --decode-tokens: expected a positive integer, found 0"),
    (["model.gguf", "--threads", "-1"], "argument --threads: expected a thread count >= 0 (0 = one per core), found -1"),
])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_ctx_too_small_and_bad_out_folder(tiny_q2, tmp_path, capsys):
    rc, _, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", "8", "--decode-tokens", "4", "--ctx", "12")
    assert rc == 2  # a usage error, before the weights load
    assert err.strip() == ("ds4tui bench: error: argument --ctx: expected at least 13 (--prompt-tokens 8 + "
                           "--decode-tokens 4 + 1), found 12")
    rc, _, err = _bench(capsys, tiny_q2["model"], "--out", str(tmp_path / "no" / "such" / "r.json"))
    assert rc == 2 and err.strip() == (
        f"ds4tui bench: error: --out {tmp_path}/no/such/r.json: cannot write the result there: its folder "
        f"{tmp_path}/no/such does not exist (or is not a folder); create it, or give --out a path in an existing folder")
    rc, _, err = _bench(capsys, tiny_q2["model"], "--out", str(tmp_path))
    assert rc == 2 and err.strip() == (
        f"ds4tui bench: error: --out {tmp_path}: cannot write the result there: expected a file name, found a "
        f"folder; give a file name, e.g. --out {tmp_path}/bench.json")
    rc, _, err = _bench(capsys, tiny_q2["model"], "--out", "")  # an unset variable: it said "found a folder"
    assert rc == 2 and err == ("ds4tui bench: error: argument --out: expected a file name, found an empty one; give a "
                               "file name, e.g. --out bench.json\n")  # a usage error, as a bad flag
    # the model file itself, or the support file of an A/B run: refused before the run, the file kept whole
    model, support = tmp_path / "m.gguf", tmp_path / "s.gguf"
    shutil.copyfile(tiny_q2["model"], model)
    shutil.copyfile(tiny_q2["support"], support)
    before = (model.read_bytes(), support.read_bytes())
    for argv, target in (([str(model), "--prompt-tokens", "8", "--decode-tokens", "2"], model),
                         ([str(model), "--mtp", str(support), "--ab", "--tokens", "16"], support)):
        rc, out, err = _bench(capsys, *argv, "--out", str(target), "--json")
        message = (f"--out {target}: cannot write the result there: expected a result file, found a GGUF file (a "
                   f"model or support file), which the result would replace; give a file name of its own, e.g. "
                   f"--out {target.with_suffix('.json')}")
        assert rc == 2 and err == f"ds4tui bench: error: {message}\n" and json.loads(out)["error"] == message
    assert (model.read_bytes(), support.read_bytes()) == before


def test_out_naming_a_pipe_or_device_is_refused_before_the_run_and_kept(tiny_q2, tmp_path, capsys, monkeypatch):
    """The result was written beside the path and renamed onto it: --out on a FIFO (or, as root, on
    /dev/null) replaced it with a regular file after a run that said nothing."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    ran = []
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: ran.append(1))
    rc, out, err = _bench(capsys, tiny_q2["model"], "--out", str(fifo))
    assert rc == 2 and out == "" and ran == []
    assert err == (f"ds4tui bench: error: --out {fifo}: cannot write the result there: expected a file name, found a "
                   f"pipe (FIFO), which the result would replace; give a file name of its own, e.g. --out bench.json "
                   f"(--json prints the result on stdout)\n")
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


@pytest.mark.parametrize("target, found", [("/dev", "a folder"), ("/dev/null", "a character device")])
def test_out_naming_a_folder_or_device_is_a_usage_error_before_anything_is_measured(target, found, tiny_q2, capsys,
                                                                                   monkeypatch):
    """--out /dev (a folder) or /dev/null (a device) is a bad value of the flag: exit status 2 and,
    under --json, the usage error's JSON object on stdout, as every other bad flag; nothing runs."""
    ran = []
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: ran.append(1))
    rc, out, err = _bench(capsys, tiny_q2["model"], "--out", target, "--json")
    message = (f"--out {target}: cannot write the result there: expected a file name, found {found}"
               + ("; give a file name, e.g. --out /dev/bench.json" if found == "a folder" else
                  ", which the result would replace; give a file name of its own, e.g. --out bench.json (--json "
                  "prints the result on stdout)"))
    assert (rc, ran) == (2, [])
    assert json.loads(out) == {"ok": False, "error": message, "error_type": "BenchUsageError"}
    assert err == f"ds4tui bench: error: {message}\n"


def test_out_in_a_folder_that_cannot_be_written_fails_before_the_run(tiny_q2, tmp_path, capsys, monkeypatch):
    # root ignores folder modes, so the refusal is injected where the check creates its probe file
    import errno

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    ran = []
    monkeypatch.setattr(bench.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: ran.append(1))
    rc, out, err = _bench(capsys, tiny_q2["model"], "--out", str(tmp_path / "r.json"))
    assert rc == 2 and out == "" and ran == []
    assert err.strip() == (f"ds4tui bench: error: --out {tmp_path}/r.json: cannot write the result there: its folder "
                           f"{tmp_path} is not writable (creating a file there failed: Permission denied); give --out "
                           f"a path in a folder you can write")


def test_a_result_that_cannot_be_written_goes_to_stdout(tiny_q2, tmp_path, capsys, monkeypatch):
    # the folder passed the check, then the disk filled up during the run: the result is not lost
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bench.os, "replace", full)
    target = tmp_path / "r.json"
    rc, out, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", "8", "--decode-tokens", "4", "--out", str(target))
    assert rc == 1
    result = json.loads(out)
    assert result["ok"] is True and result["prompt_tokens"] == 8 and result["decode_tokens"] == 4
    assert result["decode_tokens_per_s"] > 0
    assert err.strip().endswith(
        f"ds4tui bench: error: --out {target}: cannot write the result there: No space left on device; the result "
        f"is the JSON above on stdout: save it from there (and give --out a path that can be written next time)")
    assert list(tmp_path.iterdir()) == []  # no partial file left


def test_interrupt_during_decode_exits_130(tiny_q2, capsys, monkeypatch):
    # Decoding 100000 tokens would take most of an hour: the SIGINT (Ctrl-C) below must cut it short.
    # It is sent once decoding has started (a fixed delay could land while the tokenizer is built,
    # where a slow machine would spend it).
    from ds4tui.engine import session as S

    decoding = threading.Event()
    real_step = S.Session.step_many

    def step_many(self, *args, **kwargs):
        decoding.set()
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(S.Session, "step_many", step_many)
    # A shell starts background jobs with SIGINT ignored, and Python then keeps it ignored: install
    # Python's own handler for this test so that it behaves as at a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=lambda: decoding.wait(60) and os.kill(os.getpid(), signal.SIGINT), daemon=True)
    t0 = time.perf_counter()
    sender.start()
    try:
        rc, out, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", "4", "--decode-tokens", "100000")
    finally:
        signal.signal(signal.SIGINT, previous)
    sender.join(5)
    assert rc == 130 and out.startswith("INTERRUPTED after 0 of 1 runs") and "no run finished" in out
    assert err.strip().endswith("ds4tui: interrupted")
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("at_run", [2, 0])
def test_interrupted_json_prints_the_runs_that_finished(at_run, tiny_q2, tmp_path, capsys, monkeypatch):
    # --repeat 3 --json, a SIGINT as run at_run (0-based) starts: the runs before it are the JSON on
    # stdout, marked interrupted, and the status is still 130.
    from ds4tui.engine import session as S

    starts: list = []
    cancelled = threading.Event()
    real_prefill, real_cancel = S.Session.prefill, S.Session.cancel

    def prefill(self, *args, **kwargs):
        starts.append(self)
        if len(starts) - 1 == at_run:
            _sigint_main()
            assert cancelled.wait(30)  # the main thread took it: this prefill stops at once
        return real_prefill(self, *args, **kwargs)

    def cancel(self):
        real_cancel(self)
        cancelled.set()

    monkeypatch.setattr(S.Session, "prefill", prefill)
    monkeypatch.setattr(S.Session, "cancel", cancel)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc, out, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", str(PROMPT), "--decode-tokens",
                              str(DECODE), "--repeat", "3", "--json")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert rc == 130 and len(starts) == at_run + 1  # no run after the interrupted one
    r = json.loads(out)
    assert r["ok"] is False and r["interrupted"] is True
    assert r["error"] == f"interrupted after {at_run} of 3 runs"
    assert r["runs_planned"] == 3 and r["runs_finished"] == at_run and len(r["runs"]) == at_run
    for run in r["runs"]:
        assert run["decode_tokens_per_s"] == pytest.approx(DECODE / run["decode_seconds"])
        assert run["prefill_tokens_per_s"] == pytest.approx(PROMPT / run["prefill_seconds"])
    assert r["model"]["path"] == str(tiny_q2["model"]) and r["repeat"] == 3
    assert r["prompt_tokens"] == PROMPT and r["decode_tokens"] == DECODE
    for absent in ("decode_tokens_per_s", "memcpy", "bandwidth_ratio"):  # nothing derived from a partial run
        assert absent not in r
    what = "the finished runs are" if at_run else "no run finished; the record of the planned runs is"
    assert err.endswith(f"ds4tui bench: interrupted after {at_run} of 3 runs; {what} in the JSON on stdout (marked "
                        f'"ok": false, "interrupted": true)\nds4tui: interrupted\n')
    # compare refuses it, naming it
    saved = tmp_path / "partial.json"
    saved.write_text(out)
    rc = cli_main(["compare", str(saved), str(saved)])
    cmp = capsys.readouterr()
    assert rc == 1 and cmp.err.startswith(f"ds4tui compare: error: {saved}: an interrupted `bench` run (interrupted "
                                          f"after {at_run} of 3 runs)")


@pytest.mark.parametrize("during_memcpy", [True, False])
def test_interrupted_after_the_last_run_keeps_the_fastest_run(during_memcpy, tiny_q2, tmp_path, capsys, monkeypatch):
    # --repeat 3 --json, a SIGINT after the third run: while the memcpy bandwidth is measured (a copy
    # that cannot be cancelled: the command stops without waiting for it), or just before it starts.
    # Every run is kept, and so is what is derived from them (the fastest run, the effective
    # bandwidth); only the memcpy figure and the ratio are not measured, said why; compare reads it.
    from ds4tui.engine import session as S

    copy_done, copying, cancelled = threading.Event(), threading.Event(), threading.Event()
    real_cancel, real_measure = S.Session.cancel, bench.measure

    def memcpy_bandwidth(n_threads):  # the copy: started, interrupted, and not cancellable
        copying.set()
        _sigint_main()
        copy_done.wait(20)
        return {"gb_per_s": 99.0, "buffer_bytes": 1 << 28, "reps": 5, "n_threads": n_threads}

    def measure(*args, **kwargs):  # the interrupt as the last run returns, before the copy starts
        runs = real_measure(*args, **kwargs)
        _sigint_main()
        assert cancelled.wait(30)
        return runs

    def cancel(self):
        real_cancel(self)
        cancelled.set()

    monkeypatch.setattr(bench, "memcpy_bandwidth", memcpy_bandwidth)
    monkeypatch.setattr(S.Session, "cancel", cancel)
    if not during_memcpy:
        monkeypatch.setattr(bench, "measure", measure)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc, out, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", str(PROMPT), "--decode-tokens",
                              str(DECODE), "--repeat", "3", "--threads", "2", "--json")
        copy_still_running = copying.is_set() and not copy_done.is_set()
    finally:
        copy_done.set()
        signal.signal(signal.SIGINT, previous)
    assert rc == 130 and copy_still_running == during_memcpy and copying.is_set() == during_memcpy
    r = json.loads(out)
    error = ("interrupted while measuring the memcpy bandwidth, after 3 of 3 runs" if during_memcpy
             else "interrupted after 3 of 3 runs, before the memcpy bandwidth was measured")
    assert (r["ok"], r["interrupted"], r["error"]) == (False, True, error)
    assert r["runs_planned"] == 3 and r["runs_finished"] == 3 and len(r["runs"]) == 3
    for run in r["runs"]:
        assert run["decode_tokens_per_s"] == pytest.approx(DECODE / run["decode_seconds"])
    assert r["decode_tokens_per_s"] == max(run["decode_tokens_per_s"] for run in r["runs"])
    assert r["prefill_tokens_per_s"] == max(run["prefill_tokens_per_s"] for run in r["runs"])
    weights, kv = _independent_bytes_per_token(tiny_q2["model"])
    assert r["bytes_per_token"] == weights + kv
    assert r["effective_gb_per_s"] == pytest.approx((weights + kv) * r["decode_tokens_per_s"] / 1e9)
    assert r["memcpy_gb_per_s"] is None and r["bandwidth_ratio"] is None
    why = "while it was measured" if during_memcpy else "before it was measured"
    assert r["memcpy"] == {"gb_per_s": None, "buffer_bytes": max(bench.MEMCPY_MIN_BYTES, 4 * bench._llc_bytes()),
                           "reps": bench.MEMCPY_REPS, "n_threads": 2,
                           "error": f"not measured: interrupted {why} (every run had finished)"}
    assert r["memory"]["total"] > 0 and r["repeat"] == 3
    assert err.endswith(f"ds4tui bench: {error}; every run finished; the runs and the fastest run's figures are in "
                        f'the JSON on stdout (marked "ok": false, "interrupted": true)\nds4tui: interrupted\n')
    # compare compares its runs with a finished run's, saying what it lacks
    part, done = tmp_path / "part.json", tmp_path / "done.json"
    part.write_text(out)
    finished = {k: v for k, v in r.items() if k not in ("interrupted", "error", "runs_planned", "runs_finished")}
    finished.update(ok=True, decode_tokens_per_s=2 * r["decode_tokens_per_s"], memcpy_gb_per_s=20.0)
    done.write_text(json.dumps(finished))
    rc = cli_main(["compare", str(part), str(done), "--json"])
    cmp = capsys.readouterr()
    assert rc == 0
    c = json.loads(cmp.out)
    note = (f"A ({part}) was {error}: every run finished, so its figures compare; its memcpy bandwidth and bandwidth "
            f"ratio were not measured (run `ds4tui bench` to the end for them)")
    assert c["ok"] is True and c["interrupted_notes"] == [note] and c["knobs"] == []
    figures = {name: (a, b, q) for name, a, b, q in c["figures"]}
    assert figures["decode_tokens_per_s"] == (r["decode_tokens_per_s"], 2 * r["decode_tokens_per_s"],
                                              pytest.approx(2.0))
    assert cmp.err == f"ds4tui compare: note: {note}\n"


def test_interrupted_while_measuring_memcpy_text_report(tiny_q2, capsys, monkeypatch):
    # the text report: the whole report under its INTERRUPTED heading, the memcpy line saying why it is empty
    copy_done = threading.Event()

    def memcpy_bandwidth(n_threads):
        _sigint_main()
        copy_done.wait(20)
        return {"gb_per_s": 99.0, "buffer_bytes": 1 << 28, "reps": 5, "n_threads": n_threads}

    monkeypatch.setattr(bench, "memcpy_bandwidth", memcpy_bandwidth)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc, out, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", str(PROMPT), "--decode-tokens",
                              str(DECODE), "--repeat", "2")
    finally:
        copy_done.set()
        signal.signal(signal.SIGINT, previous)
    lines = out.splitlines()
    assert rc == 130 and lines[0] == ("INTERRUPTED while measuring the memcpy bandwidth, after 2 of 2 runs: every run "
                                      "finished (the figures below are whole); the memcpy bandwidth and the ratio "
                                      "were not measured")
    assert [line.split()[0] for line in lines[1:11]] == ["model", "engine", "machine", "memory", "prefill", "decode",
                                                         "bytes/token", "effective", "memcpy", "ratio"]
    # then the bandwidth note where the tiny model's bytes fit in this CPU's last-level cache (bench.bandwidth_note)
    assert lines[11:] == [] or (len(lines) == 12 and "fit in the CPU's last-level cache" in lines[11])
    assert re.fullmatch(r"decode +\d+\.\d\d tok/s  5 tokens in \d\.\d{3} s \(fastest of 2 runs\)", lines[6])
    assert lines[9].split(None, 2)[1:] == ["-", "not measured: interrupted while it was measured (every run had "
                                                "finished)"]
    assert err.endswith("ds4tui bench: interrupted while measuring the memcpy bandwidth, after 2 of 2 runs; every run "
                        "finished; the runs and the fastest run's figures are above (headed \"INTERRUPTED\")\n"
                        "ds4tui: interrupted\n")


def _sigint_main() -> None:
    """A SIGINT to the main thread, as a Ctrl-C at a terminal lands there."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_an_interrupted_wait_still_waits_for_the_worker(monkeypatch):
    # On Python 3.11 a Thread.join interrupted by a signal marks the thread stopped while it runs:
    # _in_worker must not return before fn has (the caller then frees the engine under it).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    gate, seen = threading.Event(), []

    def fn():
        _sigint_main()
        gate.wait(60)  # the native call that the interrupt's cancel stops
        time.sleep(0.3)  # the call winding down after the cancel (widens the window a bad wait falls into)
        seen.append("fn returned")

    def on_interrupt():
        seen.append("cancel")
        gate.set()

    try:
        with pytest.raises(KeyboardInterrupt):
            bench._in_worker(fn, on_interrupt)
        seen.append("main went on")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == ["cancel", "fn returned", "main went on"]


def test_ab_interrupted_while_a_session_is_made_closes_the_engine_after_it(tiny_q2, capsys, monkeypatch):
    # The Ctrl-C lands while the worker is inside Engine.session (ds4_session_create), with no
    # session to cancel: the engine must be closed only once that call has returned, and no arm
    # must run after it (the new session is cancelled at once).
    from ds4tui.engine import session as S

    events: list[str] = []
    engines: list = []  # the A/B's engine (engines of earlier tests may be collected and closed meanwhile)
    real_session, real_close = S.Engine.session, S.Engine.close

    def session(self, *args, **kwargs):
        n = sum(e == "session made" for e in events)
        if n == 1:  # the second arm's session
            _sigint_main()
            time.sleep(0.3)  # still creating it when the interrupt is handled
        s = real_session(self, *args, **kwargs)
        engines.append(self)
        events.append("session made")
        return s

    def close(self):
        if engines and self is engines[0]:
            events.append("engine closed")
        real_close(self)

    monkeypatch.setattr(S.Engine, "session", session)
    monkeypatch.setattr(S.Engine, "close", close)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc, out, err = _ab(capsys, tiny_q2, "--tokens", "16")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert rc == 130 and out.startswith("INTERRUPTED after 1 of 6 runs")  # the first arm's run only
    assert err.strip().endswith("ds4tui: interrupted")
    assert events[:3] == ["session made", "session made", "engine closed"]


def _interrupted_ab(tiny_q2, capsys, monkeypatch, *argv: str, at_run: int, where: str = "session",
                    during_close: int = 0) -> tuple[int, str, str, list]:
    """An A/B run of 16 tokens that a SIGINT stops in run ``at_run`` (0-based): as its session is made
    (``where="session"``: the session is cancelled at once, its prefill stops) or once it decodes
    (``"decode"``: the decode loop ends "cancelled" after some tokens); ``during_close`` more SIGINTs
    while the engine is being closed.  Returns rc, stdout, stderr and the engines closed."""
    from ds4tui.engine import session as S

    calls: list = []
    closed: list = []
    engines: list = []
    real_one, real_step, real_close = bench._ab_one, S.Session.step_many, S.Engine.close
    armed = threading.Event()

    def ab_one(engine, ctx, ids, n_tokens, knobs, current, session_options=None, stopping=None):
        engines.append(engine)
        calls.append(knobs)
        if len(calls) - 1 == at_run:
            if where == "session":
                _sigint_main()
                assert stopping.wait(30)  # the main thread took it: the new session is cancelled at once
            else:
                armed.set()
                calls.append(stopping)
        return real_one(engine, ctx, ids, n_tokens, knobs, current, session_options, stopping)

    def step_many(self, *args, **kwargs):
        if armed.is_set() and self.tokens and len(self.tokens) > 3:
            armed.clear()
            _sigint_main()
            assert calls[-1].wait(30)  # stop() ran: this session is cancelled
        return real_step(self, *args, **kwargs)

    def close(self):  # only the A/B's engine (those of earlier runs may be collected and closed meanwhile)
        if engines and self is engines[0] and not closed:
            for _ in range(during_close):  # Ctrl-C pressed again and again while the engine is freed
                _sigint_main()
                time.sleep(0.02)
            closed.append(self)
        real_close(self)

    monkeypatch.setattr(bench, "_ab_one", ab_one)
    monkeypatch.setattr(S.Session, "step_many", step_many)
    monkeypatch.setattr(S.Engine, "close", close)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc, out, err = _ab(capsys, tiny_q2, "--tokens", "16", *argv)
    finally:
        signal.signal(signal.SIGINT, previous)
    return rc, out, err, closed


@pytest.mark.parametrize("at_run,where,during_close", [(3, "session", 0), (1, "decode", 3)])
def test_ab_interrupted_writes_the_runs_that_finished(at_run, where, during_close, tiny_q2, tmp_path, capsys,
                                                      monkeypatch):
    # The oracle: an uninterrupted A/B of the same 16 tokens (greedy: the same ids in every run).
    rc, full_out, err = _ab(capsys, tiny_q2, "--tokens", "16", "--json")
    assert rc == 0, err
    full = json.loads(full_out)
    want_ids = {r["kind"]: r["generated_ids"] for r in full["arms"][0]["runs"]}
    out_file = tmp_path / "ab.json"
    rc, out, err, closed = _interrupted_ab(tiny_q2, capsys, monkeypatch, "--json", "--out", str(out_file),
                                           at_run=at_run, where=where, during_close=during_close)
    assert rc == 130 and len(closed) == 1
    r = json.loads(out)
    assert json.loads(out_file.read_text()) == r
    assert [p.name for p in tmp_path.iterdir()] == ["ab.json"]  # no temporary file left
    planned = [(name, o["kind"]) for o in full["arm_order"] for name in o["order"]]
    assert r["ok"] is False and r["interrupted"] is True and r["mode"] == "ab"
    assert r["runs_planned"] == 6 and r["runs_finished"] == at_run
    assert r["error"] == f"interrupted after {at_run} of 6 runs"
    assert [(x["arm"], x["kind"]) for x in r["finished"]] == planned[:at_run]
    assert [(x["arm"], x["kind"]) for x in r["not_finished"]] == planned[at_run:]
    assert [(x["arm"], x["kind"]) for x in r["runs"]] == planned[:at_run]
    for run, (name, kind) in zip(r["runs"], planned):
        assert run["generated_ids"] == want_ids[kind] and run["generated_tokens"] == 16
        assert run["ids_sha256"] == bench.ids_sha256(want_ids[kind])
        assert run["knobs"]["enabled"] == dict(bench.AB_ARMS)[name]["enabled"]
        assert run["tokens_per_s"] == pytest.approx(run["decode_tokens"] / run["decode_seconds"])
        st = DSparkStats.from_dict(run["dspark_stats"])
        assert st.check_invariants() == [] and run["from_draft"] == st.accepted_draft
        assert run["stage_timing"] == st.stage_timing()
        assert "ratio_to_target" not in run  # nothing derived from runs that did not finish
    for absent in ("arms", "outputs_identical", "mismatches", "memory_identical"):
        assert absent not in r
    assert r["model"]["path"] == str(tiny_q2["model"]) and r["support"]["status"] == "attached"
    assert r["tokens"] == 16 and r["ctx"] == full["ctx"] and [p["kind"] for p in r["prompts"]] == ["code", "prose"]
    assert (f"ds4tui bench: interrupted after {at_run} of 6 runs; the finished runs are in {out_file} (marked "
            f'"ok": false, "interrupted": true)\n') in err
    assert err.endswith("ds4tui: interrupted\n") and err.count("ds4tui: interrupted") == 1
    # compare refuses it, naming what finished
    rc = cli_main(["compare", str(out_file), str(out_file)])
    cmp = capsys.readouterr()
    assert rc == 1 and cmp.out == ""
    assert cmp.err.startswith(f"ds4tui compare: error: {out_file}: an interrupted `bench --ab` run (interrupted after "
                              f"{at_run} of 6 runs; finished: " + ", ".join(f"{a} {k}" for a, k in planned[:at_run]))


def test_ab_interrupted_text_report_lists_the_finished_runs(tiny_q2, capsys, monkeypatch):
    rc, out, err, _ = _interrupted_ab(tiny_q2, capsys, monkeypatch, at_run=2)
    assert rc == 130
    assert out.startswith("INTERRUPTED after 2 of 6 runs")
    rows = [line.split() for line in out.splitlines() if line.split()[:1] and line.split()[0] in ARMS]
    assert [(row[0], row[1]) for row in rows] == [("target-only", "code"), ("dspark-no-scheduler", "code")]
    assert out.rstrip().endswith("not finished: dspark-scheduler (code prompt), dspark-scheduler (prose prompt), "
                                 "dspark-no-scheduler (prose prompt), target-only (prose prompt)")
    assert "interrupted after 2 of 6 runs; the finished runs are above" in err


def test_ab_interrupted_before_any_run_finished_says_so(tiny_q2, capsys, monkeypatch):
    rc, out, err, _ = _interrupted_ab(tiny_q2, capsys, monkeypatch, at_run=0)
    assert rc == 130 and out.startswith("INTERRUPTED after 0 of 6 runs")
    # the text report is headed INTERRUPTED, and stderr names that mark, not the JSON's
    assert ('interrupted after 0 of 6 runs; no run finished; the record of the planned runs is above (headed '
            '"INTERRUPTED")') in err
    assert "the finished runs are" not in err and '"ok": false' not in err


# ---- --medium ----------------------------------------------------------------------------------

def test_medium_config_is_the_specified_size():
    c = mtm.CONFIGS["medium"]()
    assert (c.n_embd, c.n_layer, c.n_expert, c.n_expert_used) == (1024, 8, 64, 6)
    assert c.n_embd % 256 == 0
    assert bench.MEDIUM_RECIPE == {"config": "medium", "seed": 0, "types": "q2"}


@pytest.fixture
def fake_medium_build(tiny_q2, tmp_path, monkeypatch):
    """XDG_CACHE_HOME in tmp_path and a stand-in for make_test_model.make that links the tiny model
    (and a dummy hf/ checkpoint) into the build folder; ``calls`` records each build folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls: list[Path] = []

    def fake_make(outdir, *, config, seed, types, quiet):
        assert (config, seed, types, quiet) == ("medium", 0, "q2", False)
        out = Path(outdir)
        calls.append(out)
        (out / "hf").mkdir(parents=True)
        (out / "hf" / "model.safetensors").write_bytes(b"x" * 100)
        try:
            os.link(tiny_q2["model"], out / "model.gguf")
        except OSError:
            shutil.copyfile(tiny_q2["model"], out / "model.gguf")
        return {"hf": str(out / "hf"), "model": str(out / "model.gguf"), "support": str(out / "support.gguf")}

    monkeypatch.setattr(mtm, "make", fake_make)
    return calls


def test_medium_builds_once_then_reuses_the_cache(fake_medium_build, tmp_path, capsys):
    folder = tmp_path / "cache" / "ds4tui" / "bench-medium"
    argv = ("--medium", "--prompt-tokens", "4", "--decode-tokens", "2", "--json")
    rc, out, err = _bench(capsys, *argv)
    assert rc == 0, err
    assert "building the medium model (hidden 1024, 8 layers, 64 experts, q2)" in err and "ready in" in err
    r = json.loads(out)
    assert r["model"]["path"] == str(folder / "model.gguf") and r["model"]["medium"] is True
    assert len(fake_medium_build) == 1
    assert not (folder / "hf").exists()  # the f32 checkpoint is dropped
    marker = json.loads((folder / bench.MEDIUM_MARKER).read_text())
    assert marker["model_bytes"] == (folder / "model.gguf").stat().st_size
    assert marker["recipe"]["model_config"]["n_embd"] == 1024

    rc, out, err = _bench(capsys, *argv)
    assert rc == 0 and "building" not in err
    assert len(fake_medium_build) == 1  # reused

    (folder / bench.MEDIUM_MARKER).unlink()  # an unfinished build: no marker → rebuilt
    rc, out, err = _bench(capsys, *argv)
    assert rc == 0 and len(fake_medium_build) == 2
    assert sorted(p.name for p in folder.parent.iterdir()) == ["bench-medium"]  # no partial folders left


def test_medium_build_interrupted_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def interrupted_make(outdir, **kw):
        (Path(outdir) / "model.gguf").write_bytes(b"GGUF partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(mtm, "make", interrupted_make)
    rc, out, err = _bench(capsys, "--medium")
    assert rc == 130 and err.strip().endswith("ds4tui: interrupted")
    assert list((tmp_path / "cache" / "ds4tui").iterdir()) == []
    # the text report says how far it got, and stderr names the report's own mark
    stage = "while building the medium model (the next run builds it afresh)"
    assert out == f"INTERRUPTED after 0 of 1 runs, {stage}: nothing was measured\nmodel    the medium model (not built yet)\n"
    assert err.endswith(f"ds4tui bench: interrupted after 0 of 1 runs, {stage}; no run finished; the record of the "
                        f'planned runs is above (headed "INTERRUPTED")\nds4tui: interrupted\n')


@pytest.mark.parametrize("ab", [False, True])
def test_medium_build_interrupted_json_still_prints_the_record(ab, tmp_path, monkeypatch, capsys):
    # `bench --medium --json` interrupted while the model builds: one JSON object on stdout, marked as
    # every interrupted bench result is, with no run finished (the A/B: every planned run not finished)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def interrupted_make(outdir, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(mtm, "make", interrupted_make)
    rc, out, err = _bench(capsys, "--medium", *(["--ab"] if ab else ["--repeat", "2"]), "--json")
    assert rc == 130
    r = json.loads(out)
    n = 6 if ab else 2
    stage = "while building the medium model (the next run builds it afresh)"
    assert (r["ok"], r["interrupted"], r["error"]) == (False, True, f"interrupted after 0 of {n} runs, {stage}")
    assert (r["runs_planned"], r["runs_finished"], r["runs"]) == (n, 0, [])
    assert r["model"] == {"path": None, "medium": True}
    if ab:
        assert r["mode"] == "ab" and r["finished"] == []
        assert r["not_finished"] == [{"arm": a, "kind": k} for k, order in (("code", ARMS), ("prose", ARMS[::-1]))
                                     for a in order]
    else:
        assert "mode" not in r
    assert err.endswith(f"ds4tui bench: interrupted after 0 of {n} runs, {stage}; no run finished; the record of the "
                        f'planned runs is in the JSON on stdout (marked "ok": false, "interrupted": true)\n'
                        f"ds4tui: interrupted\n")
    # compare refuses it as the interrupted bench result it is
    saved = tmp_path / "partial.json"
    saved.write_text(out)
    assert cli_main(["compare", str(saved), str(saved)]) == 1
    word = "bench --ab" if ab else "bench"
    assert capsys.readouterr().err.startswith(f"ds4tui compare: error: {saved}: an interrupted `{word}` run "
                                              f"(interrupted after 0 of {n} runs, {stage}")


# ---- --ab --------------------------------------------------------------------------------------

ARMS = ["target-only", "dspark-no-scheduler", "dspark-scheduler"]


def _ab(capsys, tiny_q2, *argv: str) -> tuple[int, str, str]:
    return _bench(capsys, tiny_q2["model"], "--mtp", tiny_q2["support"], "--ab", "--threads", "2", *argv)


def test_ab_runs_three_arms_with_identical_greedy_outputs(tiny_q2, tmp_path, capsys):
    out_file = tmp_path / "ab.json"
    rc, out, err = _ab(capsys, tiny_q2, "--tokens", "40", "--scheduler-policy", "acceptance", "--json", "--out",
                       str(out_file))
    assert rc == 0, err
    r = json.loads(out)
    assert json.loads(out_file.read_text()) == r
    assert {a["knobs"]["policy"] for a in r["arms"]} == {"acceptance"}  # the scheduler arm's (and shown in each)
    assert r["ok"] and r["mode"] == "ab" and r["tokens"] == 40 and r["sampling"] == "greedy"
    assert r["support"]["status"] == "attached" and r["support"]["path"] == tiny_q2["support"]
    assert [p["kind"] for p in r["prompts"]] == ["code", "prose"]
    assert [a["name"] for a in r["arms"]] == ARMS
    knobs = [(a["knobs"]["enabled"], a["knobs"]["scheduler"]) for a in r["arms"]]
    assert knobs == [(False, True), (True, False), (True, True)]
    assert r["outputs_identical"] is True and r["mismatches"] == []
    assert len({a["ids_sha256"] for a in r["arms"]}) == 1
    assert r["memory_identical"] and r["arms"][0]["memory"]["kv"] > 0
    # 40 tokens of the tiny model decode in well under 2 s: the note on what one short bench can show
    lo = min(run["decode_seconds"] for arm in r["arms"] for run in arm["runs"])
    assert lo < bench.AB_SHORT_RUN_S and r["noise_note"].startswith(f"the shortest run decoded for {lo:.2f} s")
    for arm in r["arms"]:
        assert [run["kind"] for run in arm["runs"]] == ["code", "prose"]
        assert arm["tokens_per_s"] > 0 and arm["ratio_to_target"] > 0
        total = DSparkStats.from_dict(arm["dspark_stats"])
        assert total.check_invariants() == []
        for run, want in zip(arm["runs"], r["arms"][0]["runs"]):
            assert run["generated_tokens"] == len(run["generated_ids"]) == 40
            assert run["ids_sha256"] == bench.ids_sha256(run["generated_ids"]) == want["ids_sha256"]
            assert run["ratio_to_target"] == pytest.approx(run["tokens_per_s"] / want["tokens_per_s"])
            st = DSparkStats.from_dict(run["dspark_stats"])
            assert st.check_invariants() == [] and run["from_draft"] == st.accepted_draft
            assert run["dspark_line"].startswith("DSpark stats cycles=")
            t = run["stage_timing"]
            assert t == st.stage_timing() and set(t["ms_per_drafter_pass"]) >= {"prop_chain", "propose"}
        assert total.cycles == sum(run["dspark_stats"]["cycles"] for run in arm["runs"])
        assert total.accepted_draft == sum(run["from_draft"] for run in arm["runs"])
    assert r["arms"][0]["ratio_to_target"] == 1.0
    target = DSparkStats.from_dict(r["arms"][0]["dspark_stats"])
    assert target.proposed == 0 and target.no_draft_reasons["disabled"] == target.cycles > 0
    assert DSparkStats.from_dict(r["arms"][1]["dspark_stats"]).proposed > 0  # no scheduler: it drafts
    ref = r["arms"][0]["stage_timing"]  # one verify in the target-only arm's plain decodes (many of them)
    assert ref["plain_decodes"] > 0
    for arm in r["arms"][1:]:
        t, got = arm["stage_timing"], arm["verify_over_target_decode"]
        if t["verify_ms_per_drafted_cycle"] and ref["plain_decodes"] > t["plain_decodes"]:
            assert got == {"ratio": pytest.approx(t["verify_ms_per_drafted_cycle"] / ref["decode_ms_per_plain_decode"]),
                           "plain_decodes": ref["plain_decodes"]}
        else:
            assert got is None


def test_a_bench_of_short_runs_says_what_one_bench_can_show():
    """bench --ab's runs are one run each against one run: under AB_SHORT_RUN_S of decoding each, the
    result (and the text report's last line) says that one bench resolves large effects only and
    how to get a figure that resolves a few percent; runs of 2 s or more get no note."""
    note = bench.ab_noise_note([0.45, 0.761, 0.52], 128)
    assert note == ("the shortest run decoded for 0.45 s (the longest 0.76 s): a run this short moves by up to a "
                    "third with other work on the machine, so a ratio to target-only from one bench resolves large "
                    "effects only; for a few percent, give --tokens 576 or more (runs of 2 s or more) and compare "
                    "several benches (ds4tui compare)")  # 128 * 2 / 0.45 = 569, up to a multiple of 64
    assert bench.ab_noise_note([0.5, 0.5]).startswith("the shortest run decoded for 0.50 s: ")
    assert "give --tokens so that runs last 2 s or more and" in bench.ab_noise_note([0.5])
    assert bench.ab_noise_note([2.0, 3.5], 512) is None and bench.ab_noise_note([], 512) is None
    assert "decoded for 1.09 s (the longest 2.81 s)" in bench.ab_noise_note([2.81, 1.09], 512)  # the shortest decides


def test_the_verify_ratio_uses_the_target_only_arms_decodes():
    t = {"ms_per_drafter_pass": {"propose": 1.0}, "drafter_passes": 7, "drafted_cycles": 7,
         "verify_ms_per_drafted_cycle": 16.1, "plain_decodes": 1, "decode_ms_per_plain_decode": 2.505,
         "verify_over_decode": 16.1 / 2.505}
    ref = {"plain_decodes": 62, "decode_ms_per_plain_decode": 5.524}
    r = bench.verify_over_reference(t, ref)
    assert r == {"ratio": pytest.approx(16.1 / 5.524), "plain_decodes": 62}
    assert bench.stage_timing_line(t, r).endswith("verify per drafted cycle (7 cycles) 16.100 ms; plain decode "
                                                  "(1 decode) 2.505 ms; verify = 2.91 decodes of the target-only "
                                                  "arm (62 decodes)")
    assert bench.stage_timing_line(t).endswith("plain decode (1 decode) 2.505 ms; verify = 6.43 decodes")
    assert bench.verify_over_reference(t, {"plain_decodes": 1, "decode_ms_per_plain_decode": 5.0}) is None


def test_an_arms_decode_price_leaves_out_the_runs_that_timed_no_decode():
    """The no-scheduler arm's code run drafted every cycle (no plain decode timed: t_decode_ms 0,
    t_decode_measured false) and its prose run timed one at 1.674 ms: the arm's price is 1.674 ms,
    the only one measured, not 1.674 * 29 / 53 cycles = 0.916 ms.  Counts still add up."""
    code = DSparkStats(cycles=24, first_tokens=24, proposed=117, accepted_draft=39, block_size=5, propose=30.0,
                       spec_total=90.0)
    prose = DSparkStats(cycles=29, first_tokens=29, proposed=138, accepted_draft=34, no_draft=1, no_room=1,
                        target=1.674, saved=56.918, net_saved=-79.596, t_decode_ms=1.674, t_decode_measured=True,
                        block_size=5, no_draft_reasons={"no_room": 1})
    total = bench.sum_stats([code, prose])
    assert (total.t_decode_ms, total.t_decode_measured) == (pytest.approx(1.674), True)
    assert (total.cycles, total.proposed, total.accepted_draft) == (53, 255, 73)
    # the code run's own savings (unknown alone) priced at that price, as the engine prices a session's: the
    # arm's saved covered the prose run's 34 drafts only (of 73), beside t_decode_measured true
    assert total.saved == pytest.approx(56.918 + 39 * 1.674)
    assert total.net_saved == pytest.approx(-79.596 + (24 + 39) * 1.674 - (30.0 + 90.0))
    # two timed runs: the cycle-weighted mean of their prices
    other = DSparkStats(cycles=60, first_tokens=60, t_decode_ms=2.0, t_decode_measured=True, block_size=5)
    assert bench.sum_stats([code, prose, other]).t_decode_ms == pytest.approx((1.674 * 29 + 2.0 * 60) / 89)
    # none timed: no price
    assert (bench.sum_stats([code, code]).t_decode_ms, bench.sum_stats([code, code]).t_decode_measured) == (0.0, False)


def test_ab_text_report(tiny_q2, capsys):
    rc, out, err = _ab(capsys, tiny_q2, "--tokens", "16")
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.split()[:1] and line.split()[0] in ARMS]
    assert [(row[0], row[1]) for row in rows] == [(a, k) for a in ARMS for k in ("code", "prose", "all")]
    assert all(row[3].endswith("x") for row in rows) and rows[0][3] == "1.000x"
    assert out.count("  DSpark stats cycles=") == 3 and out.count("  ms per drafter pass (") == 3
    assert "greedy outputs: identical in all 3 arms" in out


def test_ab_reports_different_outputs(tiny_q2, capsys, monkeypatch):
    real = bench._ab_one

    def altered(engine, ctx, ids, n_tokens, knobs, current, *rest):
        r = real(engine, ctx, ids, n_tokens, knobs, current, *rest)
        if knobs.get("scheduler") is False:
            r["generated_ids"] = r["generated_ids"][:3] + [r["generated_ids"][3] ^ 1] + r["generated_ids"][4:]
        return r

    monkeypatch.setattr(bench, "_ab_one", altered)
    rc, out, err = _ab(capsys, tiny_q2, "--tokens", "16", "--json")
    assert rc == 1
    r = json.loads(out)
    assert r["outputs_identical"] is False
    assert [(m["arm"], m["kind"], m["first_difference"]) for m in r["mismatches"]] == [
        ("dspark-no-scheduler", "code", 3), ("dspark-no-scheduler", "prose", 3)]
    assert "the greedy outputs of the arms differ: dspark-no-scheduler (code prompt) from token 3" in err


@pytest.mark.parametrize("argv, message", [
    (["--ab"], "--ab needs a support model: add --mtp SUPPORT.gguf (or use --medium, which builds one)"),
    (["--tokens", "5"], "--tokens is an option of the A/B run: add --ab"),
    (["--mtp", "s.gguf"], "--mtp is an option of the A/B run: add --ab"),
    (["--draft-vocab", "8"], "--draft-vocab is an option of the A/B run: add --ab"),
    (["--scheduler-prices", "fresh"], "--scheduler-prices is an option of the A/B run: add --ab"),
    (["--scheduler-policy", "acceptance"], "--scheduler-policy is an option of the A/B run: add --ab"),
    (["--ab", "--mtp", "s.gguf", "--decode-tokens", "4", "--repeat", "2"],
     "--decode-tokens, --repeat do not apply to --ab (it runs its own code and prose prompts, once each; --tokens N "
     "sets how many tokens each answer generates)"),
    (["--ab", "--mtp", "s.gguf", "--tokens", "15"],
     "argument --tokens: expected at least 16 (the first token comes from the prefill and the scheduler arm's first "
     "cycles are plain decodes, five with no kept prices: fewer leave it too few tokens to draft in for the arms to "
     "compare), found 15; the default 512 measures well"),
])
def test_ab_option_errors(argv, message, tiny_q2, capsys):
    rc, out, err = _bench(capsys, tiny_q2["model"], *argv)
    assert rc == 2 and out == "" and err.strip() == f"ds4tui bench: error: {message}"


@pytest.mark.parametrize("argv, message", [
    (["--ab", "--tokens", "8"],
     "argument --tokens: expected at least 16 (the first token comes from the prefill and the scheduler arm's first "
     "cycles are plain decodes, five with no kept prices: fewer leave it too few tokens to draft in for the arms to "
     "compare), found 8; the default 512 measures well"),
    (["--tokens", "20"], "--tokens is an option of the A/B run: add --ab"),
    (["--contexts", "2048"], "--contexts is an option of --synthetic flash"),
    (["--synthetic", "flash", "--ab"], "--synthetic runs no A/B (drop --ab/--mtp)"),
    (["--synthetic", "flash", "--backend", "cpu"],
     "--synthetic flash times the GPU backend (full-width layers, about 9 GiB of weights built on the host): add "
     "--backend hip (--backend cpu given)"),
    (["--synthetic", "flash", "--write-gguf", " "], "--write-gguf needs a folder name (got an empty one)"),
])
def test_usage_errors_under_json_print_a_json_object(argv, message, capsys):
    # every usage error of bench under --json: one JSON object on stdout as the others', the line on
    # stderr, exit status 2 (before any model is looked for: no MODEL needed)
    rc, out, err = _bench(capsys, *argv, "--json")
    assert rc == 2
    assert json.loads(out) == {"ok": False, "error": message, "error_type": "BenchUsageError"}
    assert err == f"ds4tui bench: error: {message}\n"


def test_ab_notes_an_unusable_draft_vocabulary_whatever_the_backend(tiny_q2, tmp_path, capsys):
    """A support file whose draft vocabulary cannot be used (auto then drafts from the whole
    vocabulary) is a note on stderr with --backend cpu too, not only when auto chose the backend;
    the backend's own note stays an auto one, as in generate."""
    from gguf import GGUFValueType

    from ds4tui.engine import draft_vocab as DV
    from gguf_edit import rewrite

    bad = rewrite(tiny_q2["support"], tmp_path / "support_bad.gguf",
                  set_keys={DV.KEY: ([3, 3], GGUFValueType.ARRAY, GGUFValueType.UINT32)})
    rc, out, err = _bench(capsys, tiny_q2["model"], "--mtp", str(bad), "--ab", "--threads", "2", "--tokens", "16",
                          "--backend", "cpu", "--scheduler-prices", "fresh", "--json")
    assert rc == 0, err
    assert err.splitlines()[0] == (f"ds4tui bench: note: {bad}: its draft vocabulary (ds4tui.draft_vocab) cannot be "
                                   f"used: token id 3 is listed twice; drafting from the whole vocabulary")
    assert "no usable GPU" not in err
    r = json.loads(out)
    assert r["draft_vocab"] == 0 and "token id 3 is listed twice" in r["draft_vocab_note"]


def test_ab_refuses_a_support_model_that_cannot_draft(tiny_q2, tmp_path, capsys):
    bad = mtm.write_support(tmp_path / "experts8.gguf", mtm.tiny_config(), 0, types="f16", n_expert=8)
    rc, out, err = _bench(capsys, tiny_q2["model"], "--mtp", str(bad), "--ab", "--tokens", "16")
    assert rc == 1 and out == ""
    err = err[err.index("ds4tui bench: error:"):]  # after auto's backend note
    assert err.startswith(f"ds4tui bench: error: an A/B run needs a support model that drafts: {bad}: support model "
                          f"refused") and "support has 8 experts" in err


def test_medium_ab_writes_the_support_model_once(fake_medium_build, tiny_q2, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "cache" / "ds4tui" / "bench-medium"
    written: list[Path] = []

    def fake_write_support(path, c, seed, *, types, **kw):
        assert (c.n_embd, seed, types) == (1024, 0, "q2")
        written.append(Path(path))
        shutil.copyfile(tiny_q2["support"], path)
        return Path(path)

    monkeypatch.setattr(mtm, "write_support", fake_write_support)
    argv = ("--medium", "--ab", "--tokens", "16", "--threads", "2", "--json")
    rc, out, err = _bench(capsys, *argv)
    assert rc == 0, err
    r = json.loads(out)
    assert r["support"]["path"] == str(folder / "support.gguf") and r["model"]["medium"] is True
    assert len(written) == 1 and "writing the medium model's support file" in err
    assert sorted(p.name for p in folder.iterdir()) == sorted([bench.MEDIUM_MARKER, "model.gguf", "support.gguf"])
    rc, out, err = _bench(capsys, *argv)
    assert rc == 0 and len(written) == 1 and json.loads(out)["outputs_identical"]


def test_a_missing_path_is_named_before_a_medium_build_or_a_demo_unpack(fake_medium_build, tmp_path, monkeypatch,
                                                                         capsys):
    from ds4tui import demo

    missing, folder = tmp_path / "MISSING.gguf", tmp_path / "a-folder"
    folder.mkdir()
    monkeypatch.setattr(demo, "demo_pair", lambda *a, **k: pytest.fail("the demo was unpacked first"))
    for argv in (("--medium", "--ab", "--mtp", str(missing)), ("--ab", "--mtp", str(missing))):
        rc, out, err = _bench(capsys, *argv, "--tokens", "16")
        assert rc == 1 and out == "" and fake_medium_build == []  # no build started
        assert err.splitlines() == [f"ds4tui bench: error: {missing}: no such file (argument --mtp: expected a DSpark "
                                    f"support GGUF; check the path)"]
    rc, out, err = _bench(capsys, "--medium", "--ab", "--mtp", str(folder), "--json")
    assert rc == 1 and fake_medium_build == []
    assert json.loads(out) == {"ok": False, "error_type": "ModelFileError",
                               "error": f"{folder}: is a directory, expected a .gguf file (argument --mtp: expected "
                                        f"a DSpark support GGUF; check the path)"}


def test_a_support_file_that_is_not_one_is_named_before_a_medium_build_or_a_model_load(
        fake_medium_build, tiny_q2, tmp_path, monkeypatch, capsys):
    """An --mtp file whose contents are not a DSpark support GGUF (not a GGUF, cut short, a target
    model) is refused before the medium model is built (and before a demo unpack or a MODEL load),
    with the message and status that loading it beside the model gives."""
    from ds4tui import demo

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"hello, not a GGUF file at all")
    whole = Path(tiny_q2["support"]).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:len(whole) // 2])
    model = tiny_q2["model"]
    expected = {
        garbage: (f"{garbage}: wrong magic: expected b'GGUF', found b'hell' (not a GGUF file) (argument --mtp: "
                  f"expected a DSpark support GGUF; check the path)"),
        cut: f"{cut}: file is truncated or damaged: tensor '",
        Path(model): (f"{model}: general.architecture: expected 'deepseek4-dspark' or 'dflash', found 'deepseek4' "
                      f"(this is a target model, not a support file) (argument --mtp: expected a DSpark support "
                      f"GGUF; check the path)"),
    }
    monkeypatch.setattr(demo, "demo_pair", lambda *a, **k: pytest.fail("the demo was unpacked first"))
    monkeypatch.setattr(bench, "DS4Model", lambda *a, **k: pytest.fail("the model was loaded first"))
    cache = tmp_path / "cache"
    for bad, message in expected.items():
        for argv in (("--medium",), ("--threads", "2"), (model,)):
            rc, out, err = _bench(capsys, *argv, "--ab", "--mtp", str(bad), "--tokens", "16")
            assert rc == 1 and out == "", err
            assert fake_medium_build == [] and not cache.exists()  # no build started, no cache folder made
            line = f"ds4tui bench: error: {message}"
            assert err.splitlines()[0].startswith(line) if bad == cut else err.splitlines() == [line]
        rc, out, err = _bench(capsys, "--medium", "--ab", "--mtp", str(bad), "--json")
        assert rc == 1 and json.loads(out)["error"] == err.splitlines()[0].removeprefix("ds4tui bench: error: ")
        assert json.loads(out)["error_type"] == {garbage: "GGUFFormatError", cut: "TruncatedFileError",
                                                 Path(model): "ArchitectureError"}[bad]
    assert "(argument --mtp)" in _bench(capsys, "--medium", "--ab", "--mtp", str(cut))[2]  # says what to do


def test_a_support_file_refused_early_says_what_loading_it_says(tiny_q2, tmp_path, capsys):
    """The early check of the --mtp file's contents is the one loading it beside the model makes: the
    engine's attach (:class:`SupportModel`) raises the same error for the same file."""
    from ds4tui.commands.environment import file_error
    from ds4tui.engine.gguf_model import ModelFileError, SupportModel

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"hello, not a GGUF file at all")
    for bad in (garbage, Path(tiny_q2["model"])):
        with pytest.raises(ModelFileError) as loading:
            SupportModel(bad, tiny_q2["config"], check_finite=False)
        rc, out, err = _bench(capsys, tiny_q2["model"], "--ab", "--mtp", str(bad), "--tokens", "16", "--json")
        r = json.loads(out)
        assert rc == 1 and r["error_type"] == type(loading.value).__name__
        assert r["error"] == file_error(loading.value, tiny_q2["model"], str(bad))


def test_synthetic_flash_refuses_the_cpu_backend_before_building_anything():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ds4tui", "bench", "--synthetic", "flash", "--backend", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--synthetic flash times the GPU backend" in out.stderr and "--backend hip" in out.stderr


def test_a_missing_gpu_is_not_blamed_on_the_model(tiny_q2, capsys):
    from ds4tui.engine import gpu

    if not gpu.probe(None)[1]:
        pytest.skip("a GPU runs here: --backend hip would benchmark it")
    rc = cli_main(["bench", str(tiny_q2["model"]), "--backend", "hip", "--decode-tokens", "2", "--prompt-tokens", "8"])
    err = capsys.readouterr().err
    assert rc == 1 and re.match(r"ds4tui bench: error: --backend hip: the GPU backend \((--backend hip|HIP sources, "
                                r"built for (CUDA|ROCm) \w+)\) is unavailable: ", err), err
    assert str(tiny_q2["model"]) not in err and err.count("\n") == 1
    # the same advice as generate's
    assert err.endswith("(--backend auto runs on the cpu when the GPU cannot; `ds4tui doctor` says what is missing)\n")


def test_synthetic_flash_write_gguf_holds_the_benchmarks_bytes(tmp_path, monkeypatch, capsys):
    """``bench --synthetic flash --write-gguf DIR`` writes the 2- and 4-layer models (widths shrunk
    here): every tensor's type, shape and bytes are the in-memory model's (read back through the
    ``gguf`` package's reader), and DS4Model validates the config (equal up to f32 storage)."""
    import dataclasses

    import gguf
    import numpy as np

    from ds4tui.engine import synthetic

    shrunk = dict(n_embd=256, n_head=4, head_dim=128, value_dim=128, q_lora_rank=128, o_lora_rank=64, o_groups=2,
                  n_expert=8, n_ff_exp=256, indexer_n_head=2, indexer_top_k=4, compress_ratios=(4, 16))
    real, real_configs = synthetic.flash_models, synthetic.flash_configs
    monkeypatch.setattr(synthetic, "flash_models", lambda **kw: real(**{**kw, **shrunk}))
    monkeypatch.setattr(synthetic, "flash_configs", lambda **kw: real_configs(**{**kw, **shrunk}))  # the space check
    out = tmp_path / "files"
    assert cli_main(["bench", "--synthetic", "flash", "--write-gguf", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["wrote"] == {"2": str(out / "flash-2-layers.gguf"), "4": str(out / "flash-4-layers.gguf")}
    for model in real(log=lambda *_: None, **shrunk):
        path = out / synthetic.GGUF_NAMES[model.config.n_layer]
        f32 = {k: float(np.float32(getattr(model.config, k))) for k in ("rms_eps", "hc_eps")}
        assert DS4Model(path).config == dataclasses.replace(model.config, **f32)
        got = {t.name: t for t in gguf.GGUFReader(path).tensors}
        assert set(got) == set(model.tensors)
        for name, t in model.tensors.items():
            assert got[name].tensor_type == t.type
            assert np.array_equal(np.asarray(got[name].data).reshape(-1).view(np.uint8),
                                  np.asarray(t.data).reshape(-1).view(np.uint8)), name
        assert tensor_bytes_ok(path.stat().st_size, synthetic.tensor_bytes(model.config))
    assert cli_main(["bench", str(tmp_path / "m.gguf"), "--write-gguf", str(out)]) == 2
    assert "--write-gguf is an option of --synthetic flash" in capsys.readouterr().err


@pytest.mark.parametrize("as_json", [True, False])
def test_synthetic_flash_write_gguf_interrupted_names_the_files_written(as_json, tmp_path, monkeypatch, capsys):
    """An interrupt while ``--write-gguf`` writes the 4-layer file: that file is removed, the 2-layer
    one is kept and named, in the JSON (marked as every interrupted result is) or the text report."""
    import dataclasses

    from ds4tui.engine import synthetic

    shrunk = dict(n_embd=256, n_head=4, head_dim=128, value_dim=128, q_lora_rank=128, o_lora_rank=64, o_groups=2,
                  n_expert=8, n_ff_exp=256, indexer_n_head=2, indexer_top_k=4, compress_ratios=(4, 16))
    real, real_configs, real_write = synthetic.flash_models, synthetic.flash_configs, synthetic.write_gguf
    monkeypatch.setattr(synthetic, "flash_models", lambda **kw: real(**{**kw, **shrunk}))
    monkeypatch.setattr(synthetic, "flash_configs", lambda **kw: real_configs(**{**kw, **shrunk}))

    def write_gguf(path, arch, meta, plan):  # Ctrl-C as the 4-layer file's last tensor is read
        if "4-layers" in str(path):
            plan = [*plan[:-1], dataclasses.replace(plan[-1], load=_raise_interrupt)]
        return real_write(path, arch, meta, plan)

    monkeypatch.setattr(synthetic, "write_gguf", write_gguf)
    out = tmp_path / "files"
    rc, stdout, err = _bench(capsys, "--synthetic", "flash", "--write-gguf", str(out), *(["--json"] if as_json else []))
    assert rc == 130
    assert sorted(p.name for p in out.iterdir()) == ["flash-2-layers.gguf"]  # no partial file left
    error = "interrupted after writing 1 of 2 files"
    if as_json:
        r = json.loads(stdout)
        assert (r["ok"], r["interrupted"], r["error"], r["files_planned"]) == (False, True, error, 2)
        assert r["wrote"] == {"2": str(out / "flash-2-layers.gguf")}
        assert r["not_written"] == [str(out / "flash-4-layers.gguf")]
        where = 'in the JSON on stdout (marked "ok": false, "interrupted": true)'
    else:
        assert stdout == f"INTERRUPTED after writing 1 of 2 files\n2 layers: {out / 'flash-2-layers.gguf'}\n"
        where = 'above (headed "INTERRUPTED")'
    assert err.endswith(f"ds4tui bench: {error}; the files written are {where}\nds4tui: interrupted\n")


def _raise_interrupt():
    raise KeyboardInterrupt


def tensor_bytes_ok(file_bytes: int, tensors: int) -> bool:
    """A GGUF holds its tensors plus metadata (the tokenizer: a few MiB)."""
    return tensors < file_bytes < tensors + (64 << 20)


def test_synthetic_flash_write_gguf_checks_the_folder_before_building(tmp_path, monkeypatch, capsys):
    """A file given as the folder, a folder that cannot be created and too little free space are
    each one line, exit 1, before any weights are built (building takes minutes at full width)."""
    import shutil
    from collections import namedtuple

    from ds4tui.engine import synthetic

    def never(**_):
        raise AssertionError("weights built before the folder was checked")

    monkeypatch.setattr(synthetic, "flash_models", never)
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert cli_main(["bench", "--synthetic", "flash", "--write-gguf", str(a_file)]) == 1
    assert f"{a_file}: not a folder" in capsys.readouterr().err
    assert cli_main(["bench", "--synthetic", "flash", "--write-gguf", str(a_file / "sub")]) == 1
    assert f"{a_file / 'sub'}: cannot create or use this folder" in capsys.readouterr().err
    need = sum(synthetic.tensor_bytes(c) for c in synthetic.flash_configs()) + (64 << 20)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(need, 0, need - 1))
    assert cli_main(["bench", "--synthetic", "flash", "--write-gguf", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert f"{need / 2**30:.1f} GiB needed for the two files" in err and "free" in err
    assert 13.5 < need / 2**30 < 14.5  # the full-width pair: about 5.2 + 8.9 GiB of tensors
    assert not (tmp_path / "d").exists()  # the folder it made for nothing is gone again
    assert cli_main(["bench", "--synthetic", "flash", "--write-gguf", " "]) == 2
    assert "--write-gguf needs a folder name (got an empty one)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--contexts", "5,3"], "argument --contexts: 5 is too small: each context must be at least 16 tokens (found 5,3)"),
    (["--contexts", "32,3"], "argument --contexts: 3 is too small: each context must be at least 16 tokens (found 32,3)"),
    (["--contexts", "4096,2048"], "argument --contexts: 2048 comes after 4096: give the contexts in ascending order, "
                                  "each once (found 4096,2048)"),
    (["--contexts", "2048,2048"], "argument --contexts: 2048 comes after 2048: give the contexts in ascending order, "
                                  "each once (found 2048,2048)"),
    (["--ctx", "8"], "argument --ctx: 8 is too small: each context must be at least 16 tokens (found 8)"),
])
def test_synthetic_flash_context_errors_are_usage_errors(argv, message, monkeypatch, capsys):
    from ds4tui.engine import gpu, synthetic

    def never(*a, **k):
        raise AssertionError("the device was probed or the weights built before the usage error")

    monkeypatch.setattr(synthetic, "flash_models", never)
    monkeypatch.setattr(gpu, "probe", never)
    rc = cli_main(["bench", "--synthetic", "flash", "--backend", "hip", *argv])
    assert (rc, capsys.readouterr().err) == (2, f"ds4tui bench: error: {message}\n")


def test_synthetic_flash_without_a_device_says_what_to_do(monkeypatch, capsys):
    from ds4tui.engine import gpu, synthetic

    def never(**_):
        raise AssertionError("weights built without a device")

    monkeypatch.setattr(synthetic, "flash_models", never)
    monkeypatch.setattr(gpu, "probe", lambda library=None: (None, "no device: a test without a GPU"))
    rc = cli_main(["bench", "--synthetic", "flash", "--backend", "hip", "--contexts", "2048,4096"])
    assert (rc, capsys.readouterr().err) == (1, "ds4tui bench: error: --synthetic flash: no device: a test without a "
                                                "GPU (it times the GPU backend: `ds4tui doctor` says what is missing; "
                                                "--write-gguf DIR writes the same models without a GPU, for another "
                                                "engine to time)\n")


def test_verify_ratio_times_the_rows_it_names(tiny_q2, capsys, monkeypatch):
    """tools/verify_ratio.py: a pass wider than its 200-token prompt is that wide (it once cut every
    pass to the prompt's 200 rows and labelled it with the asked width), and a width past MAX_ROWS is
    a usage error naming --rows."""
    import importlib.util
    from pathlib import Path

    import ds4tui.engine.backend as B

    spec = importlib.util.spec_from_file_location(
        "verify_ratio", Path(__file__).resolve().parent.parent / "tools" / "verify_ratio.py")
    vr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vr)
    with pytest.raises(SystemExit) as e:
        vr.main([str(tiny_q2["model"]), "--rows", str(vr.MAX_ROWS + 1)])
    assert e.value.code == 2 and "argument --rows: at most 4096 rows" in capsys.readouterr().err
    widths = []
    orig = B.NativeBackend.eval

    def counting(self, ids, mode, pending):
        widths.append(len(ids))
        return orig(self, ids, mode, pending)

    monkeypatch.setattr(B.NativeBackend, "eval", counting)
    assert vr.main([str(tiny_q2["model"]), "--rows", "230", "--rounds", "1", "--threads", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 230
    assert {1, 230} <= set(widths) and max(widths) == 230
