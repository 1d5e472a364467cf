"""The amx option (spec ds4.md §2.9.6): Q8_0 products on Intel's AMX tiles.

The tile kernel must give the q8 arithmetic's bits (spec ds4.md §2.9.5): it is held bit for bit to the
numpy simulation (``ds4tui.engine.quants.matmul_q8``) and to the other kernels at batch sizes 1..19 and
1..3 threads, and an engine with amx on gives the same logits, greedy tokens and DSpark decisions as
with amx off.  Where the CPU has no AMX-INT8 the tests that need the tiles skip, and the option is
refused by name instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants as gq

from ds4tui.engine.errors import BackendUnavailableError
from ds4tui.engine.quants import matmul_q8
from ds4tui.engine.session import AMX, Engine, amx_available, auto_amx
from test_cli_usage import no_engine  # noqa: F401 (the fixture)

# rows a multiple of 16, columns of 64: one chunk (64), an odd number of chunks (192, 320), the demo's
# 8 blocks (256), more than 8 blocks (1024, and 576: 18 blocks, not a multiple of 8)
SHAPES = [(16, 64), (32, 128), (48, 192), (64, 256), (16, 320), (32, 576), (16, 1024)]
HAVE, WHY = amx_available()
needs_amx = pytest.mark.skipif(not HAVE, reason=f"no AMX here: {WHY}")


def _case(rows: int, cols: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    W[3, :32] = 0.0  # a block of zero codes (d = 0)
    raw = gq.quantize(W, T.Q8_0)
    X = rng.standard_normal((n, cols)).astype(np.float32) * rng.uniform(0.01, 10, (n, 1)).astype(np.float32)
    X[0, :32] = 0.0  # a block of zero activations: d = 0
    if n > 1:
        X[1, 32:64] = np.float32(0.5) * (np.arange(32) % 3 - 1)  # values on the rounding ties
    if n > 2 and cols >= 128:
        X[2, 64:96] = np.float32(1e3) * np.sign(np.arange(32) - 15.5)  # full-scale codes: +-127
    return raw, X


def _amx(raw, rows, cols, X, threads):
    from ds4tui._native import ffi, lib

    n = X.shape[0]
    Y = np.full((n, rows), np.nan, np.float32)
    err = ffi.new("char[256]")
    rc = lib.ds4_kernel_matmul_amx(ffi.from_buffer(raw), rows, cols, ffi.cast("const float *", ffi.from_buffer(X)), n,
                                   ffi.cast("float *", ffi.from_buffer(Y)), threads, err, 256)
    return rc, ffi.string(err).decode(), Y


def test_probe_agrees_with_the_cpu_flags():
    """The native probe says yes exactly where Linux lists amx_tile and amx_int8 (and the kernel then
    grants the state); its reason names what is missing."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "amx_int8" in flags and "amx_tile" in flags:
        assert HAVE, WHY
        assert WHY == "AMX-INT8 available"
    else:
        assert not HAVE
        assert re.search(r"AMX|amx", WHY), WHY


@needs_amx
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_tile_kernel_is_the_q8_simulation_bit_for_bit(rows, cols):
    raw, X = _case(rows, cols, 19, rows + cols)
    want = matmul_q8(raw, T.Q8_0, rows, cols, X)
    for threads in (1, 2, 3):
        for n in range(1, 20):
            rc, err, got = _amx(raw, rows, cols, X[:n].copy(), threads)
            assert rc == 0, err
            assert np.array_equal(got, want[:n]), f"{rows}x{cols}, {n} tokens, {threads} threads"


@needs_amx
def test_tile_kernel_refuses_what_it_does_not_take():
    raw, X = _case(16, 64, 2, 1)
    for rows, cols in ((8, 64), (16, 32), (20, 64)):
        rc, err, _ = _amx(raw, rows, cols, X[:, :cols].copy(), 1)
        assert rc != 0
        assert f"got {rows} x {cols}" in err and "multiple of 16" in err and "multiple of 64" in err


def test_option_values_and_auto():
    assert AMX == ("off", "on")
    assert auto_amx("hip", "f32")[0] == "off" and "hip backend" in auto_amx("hip", "f32")[1]
    mode, note = auto_amx("cpu", "f32")
    assert mode == "off" and "--activations q8" in note
    mode, note = auto_amx("cpu", "q8")
    assert mode == ("on" if HAVE else "off"), note
    assert note.startswith("auto: on: this CPU has AMX-INT8") if HAVE else WHY in note


def test_bad_values_are_refused_by_name(tiny_q2):
    with pytest.raises(ValueError, match=r"amx must be auto or one of off, on, got 'yes'"):
        Engine(tiny_q2["model"], amx="yes")
    with pytest.raises(BackendUnavailableError, match=r"amx on multiplies 8-bit activations.*--activations q8"):
        Engine(tiny_q2["model"], activations="f32", amx="on")
    with pytest.raises(BackendUnavailableError, match=r"amx on runs on the cpu backend only"):
        Engine(tiny_q2["model"], backend="reference", amx="on")


@pytest.mark.skipif(HAVE, reason="this CPU has AMX: the refusal is for CPUs without it")
def test_on_without_amx_is_refused_with_the_reason(tiny_q2):
    with pytest.raises(BackendUnavailableError, match=re.escape(WHY)):
        Engine(tiny_q2["model"], activations="q8", amx="on")


def _eligible_bytes(path) -> int:
    """The bytes of the Q8_0 matrices the engine repacks: two dimensions, rows a multiple of 16 and
    columns of 64, all but the token embedding (spec ds4.md §2.9.6)."""
    total = 0
    for t in GGUFReader(str(path)).tensors:
        if t.tensor_type != T.Q8_0 or len(t.shape) != 2 or t.name == "token_embd.weight":
            continue
        cols, rows = int(t.shape[0]), int(t.shape[1])
        if rows % 16 == 0 and cols % 64 == 0:
            total += int(t.n_bytes)
    return total


def test_auto_leaves_the_copies_out_where_they_would_crowd_the_memory(tiny_q2, fitted_support, monkeypatch):
    """The 81 GB model's Q8_0 matrices are several GB: auto makes their copies only within a quarter of what
    the model files leave of the RAM, and says why it did not; the estimate is what the engine repacks."""
    from ds4tui.engine import session as S
    from ds4tui.engine.gguf_model import DS4Model, open_gguf, tensor_table

    assert S.amx_copy_bytes(DS4Model(tiny_q2["model"]).tensors) == _eligible_bytes(tiny_q2["model"])
    assert S.amx_copy_bytes(tensor_table(open_gguf(str(fitted_support)))) == _eligible_bytes(fitted_support)
    monkeypatch.setattr(S, "amx_available", lambda: (True, "AMX-INT8"))
    gib = 1 << 30
    mode, note = S.auto_amx("cpu", "q8", copies=5 * gib, files=81 * gib, total=96 * gib)
    assert (mode, note) == ("off", "auto: off: the repacked copies would take about 5.00 GiB beside 81.00 GiB of "
                                   "model files in 96.00 GiB of memory (auto allows 25% of what the files leave, "
                                   "3.75 GiB); --amx on makes them anyway")
    assert S.auto_amx("cpu", "q8", copies=5 * gib, files=81 * gib, total=128 * gib)[0] == "on"  # 11.75 GiB allowed
    assert S.auto_amx("cpu", "q8", copies=5 * gib, files=81 * gib, total=None)[0] == "on"  # RAM unknown: as before
    monkeypatch.setattr(S, "memory_total", lambda: _eligible_bytes(tiny_q2["model"]) * 3)  # a tiny machine
    eng = Engine(tiny_q2["model"], activations="q8", amx="auto", n_threads=1)
    try:
        assert eng.amx == "off" and eng.amx_note.startswith("auto: off: the repacked copies would take about ")
        assert eng.memory().amx_copies == 0
    finally:
        eng.close()


@needs_amx
def test_engine_with_amx_gives_the_same_logits_and_tokens(tiny_q2, fitted_support):
    """Prefill logits, a six-row pass (a verify's shape), greedy decoding and greedy DSpark (its
    decisions too) are the same bits with amx on and off; the memory the copies take is reported."""
    prompt = [(i * 7919 + 13) % 1000 + 100 for i in range(40)]
    out = {}
    for amx in ("off", "on"):
        eng = Engine(tiny_q2["model"], activations="q8", amx=amx, n_threads=2, support=fitted_support)
        assert eng.amx == amx and eng.amx_note == f"{amx}: chosen"
        mem = eng.memory()
        s = eng.session(n_ctx=256, n_batch=16)
        first = np.array(s.prefill(prompt[:30], logits="all")).copy()
        six = np.array(s.backend.eval(prompt[30:36], "all", None)).copy()
        s.close()
        s = eng.session(n_ctx=256, n_batch=16)
        s.prefill(prompt)
        s.set_dspark(scheduler=False)  # every cycle drafts
        toks: list[int] = []
        while len(toks) < 48:
            toks += s.step()
        st = s.dspark_stats()
        stats = (st.proposed, st.accepted_draft, st.full, st.partial, st.miss_first)
        assert st.proposed > 0
        out[amx] = (first, six, toks, stats, mem)
        eng.close()
    off, on = out["off"], out["on"]
    assert off[0].tobytes() == on[0].tobytes()
    assert off[1].shape[0] == 6 and off[1].tobytes() == on[1].tobytes()
    assert off[2] == on[2]
    assert off[3] == on[3]
    assert off[4].amx_copies == 0
    want = _eligible_bytes(tiny_q2["model"]) + _eligible_bytes(fitted_support)
    assert want > 35_000_000  # the LM head (129280 x 256) at least: the test multiplies real matrices
    assert on[4].amx_copies == want
    assert on[4].weights == off[4].weights and on[4].total == off[4].total + want


# ---- the flag, from the command line to the engine ---------------------------------------------------

@pytest.mark.parametrize("command", ["generate", "bench", "chat"])
def test_flag_usage_errors_name_it(command, tiny_q2, capsys, no_engine):
    from test_cli_usage import _run

    base = {"generate": ["generate", str(tiny_q2["model"]), "-p", "hi"], "bench": ["bench", str(tiny_q2["model"])],
            "chat": ["chat", str(tiny_q2["model"])]}[command]
    rc, out, err = _run(capsys, [*base, "--amx", "yes"])
    assert rc == 2 and out == ""
    assert "error: argument --amx: invalid choice: 'yes' (choose from 'auto', 'on', 'off')" in err
    rc, out, err = _run(capsys, [*base, "--amx", "on", "--backend", "hip"])
    assert rc == 2 and err == (f"ds4tui {command}: error: argument --amx: on runs on the cpu backend only (the AMX "
                               f"tiles are a CPU's), found --backend hip (use --amx auto or off, or --backend cpu or "
                               f"auto)\n")
    rc, out, err = _run(capsys, [*base, "--amx", "on", "--activations", "f32"])
    assert rc == 2 and err == (f"ds4tui {command}: error: argument --amx: on multiplies 8-bit activations, found "
                               f"--activations f32 (use --activations q8 or auto, or --amx off)\n")


def test_synthetic_bench_refuses_it(capsys, no_engine):
    from test_cli_usage import _run

    rc, out, err = _run(capsys, ["bench", "--synthetic", "flash", "--backend", "hip", "--amx", "on"])
    assert rc == 2 and "--amx on is not an option of --synthetic flash (it times the GPU backend" in err


def test_generate_json_says_which_ran_and_the_memory_it_took(tiny_q2, capsys):
    from test_cli_usage import _run

    runs = {}
    for amx in ("off", "auto"):
        rc, out, err = _run(capsys, ["generate", str(tiny_q2["model"]), "-p", "hello there", "--raw", "-n", "8",
                                     "--threads", "1", "--backend", "cpu", "--json", "--amx", amx])
        assert rc == 0, err
        runs[amx] = json.loads(out)
    off, auto = runs["off"], runs["auto"]
    assert (off["amx"], off["amx_note"], off["memory"]["amx_copies"]) == ("off", "off: chosen", 0)
    assert (auto["amx"], auto["amx_note"]) == auto_amx("cpu", "q8")
    assert auto["memory"]["amx_copies"] == (_eligible_bytes(tiny_q2["model"]) if HAVE else 0)
    assert auto["generated_ids"] == off["generated_ids"]


def test_doctor_lists_the_option_and_this_cpu(capsys):
    from ds4tui.cli import main as cli_main

    assert cli_main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    d = r["amx"]
    assert d["default"] == "auto" and d["choices"] == ["auto", "on", "off"]
    assert (d["available"], d["reason"]) == (HAVE, WHY)
    assert d["here"] == auto_amx(r["auto_backend"], "q8" if r["auto_backend"] == "cpu" else "f32")[0]
    assert cli_main(["doctor"]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("amx"))
    assert f"auto by default (here {d['here']}, on the " in line
    assert ("this CPU: AMX-INT8 available" if HAVE else f"this CPU: {WHY}") in line


def test_chat_passes_it_to_the_engine(tiny_q2):
    import dataclasses

    from ds4tui import cli
    from ds4tui.commands.chat import options_from_args
    from ds4tui.commands.environment import Settings
    from ds4tui.engine import worker as W

    args = cli.build_parser().parse_args(["chat", str(tiny_q2["model"]), "--amx", "off"])
    args.settings = dataclasses.replace(Settings(), amx="off")  # as cli.main sets it from the flag
    assert options_from_args(args).amx == "off"
    chat = W.ChatEngine(tiny_q2["model"], backend="cpu", n_ctx=64, amx="off")
    try:
        assert (chat.info.amx, chat.info.amx_note) == ("off", "off: chosen")
    finally:
        chat.close()


def test_on_where_the_cpu_cannot_is_an_error_naming_the_flag(tiny_q2, capsys, monkeypatch):
    """A CPU or kernel without the tiles (simulated: the probe says no): the error names --amx on and
    the reason, not the backend, and exits 1; auto runs off and says why."""
    from ds4tui.engine import session as S
    from ds4tui.engine.errors import OptionUnavailableError
    from test_cli_usage import _run

    monkeypatch.setattr(S, "amx_available", lambda: (False, "this CPU has no AMX-INT8 (simulated)"))
    with pytest.raises(OptionUnavailableError, match=r"^--amx on: this CPU has no AMX-INT8 \(simulated\) \(use "):
        Engine(tiny_q2["model"], activations="q8", amx="on")
    rc, out, err = _run(capsys, ["generate", str(tiny_q2["model"]), "-p", "hi", "-n", "2", "--backend", "cpu",
                                 "--amx", "on"])
    assert rc == 1 and err.splitlines()[-1] == (
        "ds4tui generate: error: --amx on: this CPU has no AMX-INT8 (simulated) (use --amx auto or off; "
        "`ds4tui doctor` says whether this CPU has AMX)")
    eng = Engine(tiny_q2["model"], activations="q8")
    try:
        assert (eng.amx, eng.amx_note) == ("off", "auto: off: this CPU has no AMX-INT8 (simulated)")
        assert eng.memory().amx_copies == 0
    finally:
        eng.close()


@needs_amx
def test_bench_text_counts_the_copies_in_its_memory_line(tiny_q2, capsys):
    from test_cli_usage import _run

    rc, out, err = _run(capsys, ["bench", str(tiny_q2["model"]), "--backend", "cpu", "--threads", "1",
                                 "--prompt-tokens", "8", "--decode-tokens", "2", "--amx", "on"])
    assert rc == 0, err
    line = next(t for t in out.splitlines() if t.startswith("memory"))
    assert "amx copies " in line
    rc, out, err = _run(capsys, ["bench", str(tiny_q2["model"]), "--backend", "cpu", "--threads", "1",
                                 "--prompt-tokens", "8", "--decode-tokens", "2", "--amx", "off"])
    assert rc == 0 and "amx copies" not in next(t for t in out.splitlines() if t.startswith("memory"))
