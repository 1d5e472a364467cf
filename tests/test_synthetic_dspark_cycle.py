"""``bench --synthetic flash --dspark-cycle``: the DSpark cycle (propose + verify of 1 + block rows)
against a plain decode, on the synthetic Flash layers with a synthetic support model attached.

Run here on the cpu backend with the layers shrunk (as the other synthetic benchmark tests do):
the engine's own cycles run for real (every cycle must propose and verify a full block), while
the timings the arithmetic is checked on are replaced by known values, since a shrunk layer's
cost on a shared machine is below the timing noise.  Nothing asserts a speed.  An interrupted run
(of the whole synthetic benchmark, with or without the cycle) reports the runs that finished.
"""

from __future__ import annotations

import json
import math

import gguf
import pytest

from ds4tui.cli import main as cli_main
from ds4tui.engine import synthetic
from ds4tui.engine.convert import choose_type
from ds4tui.engine.gguf_model import SupportModel

SHRUNK = dict(n_embd=256, n_head=4, head_dim=128, value_dim=128, q_lora_rank=128, o_lora_rank=64, o_groups=2,
              n_expert=8, n_ff_exp=256, indexer_n_head=2, indexer_top_k=4, compress_ratios=(4, 16))

#: known times the 2- and 4-layer timings are replaced with (ms): per layer decode 2, verify 5
PROPOSE = {2: 3.0, 4: 3.3}


def _decode(n: int) -> float:
    return 10.0 + 2.0 * n


def _verify(n: int) -> float:
    return 20.0 + 5.0 * n


def _fixed_main(model, **kw):
    """The plain decode/verify timing (tested elsewhere) as known numbers, without running it."""
    n = model.config.n_layer
    return {"layers": n, "device_bytes": 0, "gpu_graphs": "off", "gpu_graphs_note": "off",
            "contexts": [{"ctx": c, "decode_ms": _decode(n), "verify_ms": {w: _verify(n) for w in kw["widths"]}}
                         for c in kw["ctxs"]]}


@pytest.fixture
def cycle_runs(monkeypatch):
    """Run the real cycle timing, keep what it measured, hand back known times."""
    real = synthetic._time_cycle
    runs = []

    def known_times(model, support, **kw):
        r = real(model, support, **kw)
        runs.append(r)
        n = r["layers"]
        return {**r, "contexts": [{**c, "propose_ms": PROPOSE[n], "verify_ms": _verify(n), "decode_ms": _decode(n)}
                                  for c in r["contexts"]]}

    monkeypatch.setattr(synthetic, "_time_model", _fixed_main)
    monkeypatch.setattr(synthetic, "_time_cycle", known_times)
    return runs


def test_dspark_cycle_runs_shrunk_on_the_cpu(tmp_path, cycle_runs):
    r = synthetic.run_flash_bench(backend="cpu", ctx=[40, 90], n_decode=3, n_verify=2, dspark_cycle=True,
                                  n_cycles=4, support_dir=tmp_path, log=lambda *_: None, activations="q8", **SHRUNK)
    small_cfg, big_cfg = synthetic.flash_configs(**SHRUNK)

    # the support file: exactly the spec's inventory (3 stages x 24 + 2 + 7), the q2 mix, and compatible
    path = tmp_path / synthetic.SUPPORT_NAME
    specs = synthetic.support_specs(small_cfg)
    got = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert len(specs) == 81 and sorted(got) == sorted(s.name for s in specs)
    assert all(int(got[s.name].tensor_type) == int(choose_type(s, "q2")) for s in specs)
    for cfg in (small_cfg, big_cfg):
        summary = SupportModel(path, cfg).summary()
        assert summary["compatible"] is True, summary["reasons"]
        assert summary["counts"] == {"stages": 3, "block": 5, "markov_rank": 256, "tensors": 81, "missing": 0,
                                     "invalid": 0, "metadata_errors": 0, "nonfinite": 0}
        assert summary["target_layer_ids"] == [0, 1] and summary["noise_token_id"] == 128799
        assert summary["draft_vocab"]["size"] == synthetic.DRAFT_VOCAB_SIZE
    assert summary["tensor_bytes"] == synthetic.support_bytes(small_cfg)

    # what the engine really did: one session per target, every cycle a full block of 5 drafts verified
    assert [run["layers"] for run in cycle_runs] == [2, 4]
    for run in cycle_runs:
        assert run["block_size"] == 5 and run["draft_vocab"] == synthetic.DRAFT_VOCAB_SIZE
        assert [c["ctx"] for c in run["contexts"]] == [40, 90]
        for c in run["contexts"]:
            assert c["drafts_per_cycle"] == [5, 5, 5, 5]
            for k in ("propose_ms", "verify_ms", "spec_total_ms", "decode_ms", "cycle_wall_ms", "decode_wall_ms"):
                assert math.isfinite(c[k]) and c[k] > 0, (k, c[k])
            assert c["spec_total_ms"] >= c["verify_ms"]  # verify + accept + commit
            assert c["propose_stages_ms"]["prop_chain"] > 0 and c["propose_stages_ms"]["prop_markov"] > 0

    # the arithmetic, on the known times
    d = r["dspark_cycle"]
    assert d["knobs"] == {"scheduler": False, "threshold": 0.0, "max_draft": 5}
    assert d["support"]["path"] == str(path) and d["support"]["capture_layers"] == [0, 1]
    assert d["support"]["tensors"] == 81 and (d["decodes"], d["cycles"]) == (3, 4)
    assert d["draft_vocab_note"].startswith(f"auto: {synthetic.DRAFT_VOCAB_SIZE} of 129280 tokens")
    assert [c["ctx"] for c in d["contexts"]] == [40, 90] and d["ctx"] == 40
    for c in d["contexts"]:
        assert [m["layers"] for m in c["measured"]] == [2, 4]
        assert c["propose_ms"] == pytest.approx((PROPOSE[2] + PROPOSE[4]) / 2)
        assert c["propose_4_over_2"] == pytest.approx(PROPOSE[4] / PROPOSE[2])
        assert c["per_layer_ms"] == {"verify_ms": 5.0, "decode_ms": 2.0}
        assert c["fixed_ms"] == {"verify_ms": 20.0, "decode_ms": 10.0}
        assert c["verify_ms"] == pytest.approx(20.0 + 43 * 5.0) and c["decode_ms"] == pytest.approx(10.0 + 43 * 2.0)
        # the ratios from the reported parts
        assert c["cycle_ms"] == pytest.approx(c["propose_ms"] + c["verify_ms"])
        assert c["cycle_over_decode"] == pytest.approx((c["propose_ms"] + c["verify_ms"]) / c["decode_ms"])
        assert c["verify_over_decode"] == pytest.approx(c["verify_ms"] / c["decode_ms"])
        assert c["cycle_over_decode"] == pytest.approx((3.15 + 235.0) / 96.0)
    text = synthetic.render(r)
    assert "DSpark cycle: support of 3 stages, block 5, Markov rank 256, capturing layers 0,1" in text
    assert f"cycle / decode = (propose + verify) / decode = {(3.15 + 235.0) / 96.0:.2f}" in text
    assert f"verify / decode = {235.0 / 96.0:.2f}" in text and "propose        3.15 ms" in text
    json.dumps(r)  # the result is plain JSON


def test_dspark_cycle_noise_is_refused_and_the_temporary_support_removed(tmp_path, monkeypatch):
    """A 4-layer target timed no slower than the 2-layer one cannot be extrapolated (RuntimeError
    naming the DSpark timing); the temporary folder of the support file is gone afterwards."""
    import tempfile

    def flat(model, support, **kw):
        assert support.is_file() and support.parent.parent == tmp_path
        return {"layers": model.config.n_layer, "block_size": 5, "draft_vocab": 0, "draft_vocab_note": "full",
                "contexts": [{"ctx": c, "propose_ms": 1.0, "verify_ms": 5.0, "decode_ms": 2.0} for c in kw["ctxs"]]}

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(synthetic, "_time_model", _fixed_main)
    monkeypatch.setattr(synthetic, "_time_cycle", flat)
    with pytest.raises(RuntimeError, match="with the DSpark support attached, the 4-layer model's verify"):
        synthetic.run_flash_bench(backend="cpu", ctx=40, n_decode=3, dspark_cycle=True, n_cycles=2,
                                  log=lambda *_: None, **SHRUNK)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="DSpark cycles: expected at least 1, found 0"):
        synthetic.run_flash_bench(backend="cpu", ctx=40, dspark_cycle=True, n_cycles=0, **SHRUNK)


def test_cli_dspark_cycle_end_to_end_on_shrunk_layers(tmp_path, monkeypatch, capsys, cycle_runs):
    """The command line passes --dspark-cycle and --draft-vocab through (here to the cpu backend
    with shrunk layers, the run's backend being hip's job), prints the cycle in the table and the
    JSON; --draft-vocab without --dspark-cycle is a note; --write-gguf DIR --dspark-cycle writes
    the support file beside the two models."""
    real = synthetic.run_flash_bench
    monkeypatch.setattr(synthetic, "run_flash_bench", lambda **kw: real(**{
        **kw, "backend": "cpu", "n_decode": 3, "n_verify": 2, "n_cycles": 3, **SHRUNK}))
    argv = ["bench", "--synthetic", "flash", "--backend", "hip", "--ctx", "40", "--dspark-cycle"]
    assert cli_main([*argv, "--draft-vocab", "full", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["dspark_cycle"]["draft_vocab"] == 0 and r["dspark_cycle"]["draft_vocab_note"].startswith("full")
    assert r["dspark_cycle"]["support"]["path"] is None  # a temporary file, removed
    assert [run["contexts"][0]["drafts_per_cycle"] for run in cycle_runs] == [[5, 5, 5], [5, 5, 5]]
    assert cli_main(argv) == 0
    assert "DSpark cycle: support of 3 stages" in capsys.readouterr().out
    assert cli_main(argv[:-1] + ["--draft-vocab", "full", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["dspark_cycle"] is None
    assert ("ds4tui bench: note: --draft-vocab full has no effect without --dspark-cycle: the synthetic layers draft "
            "nothing") in out.err

    real_models, real_configs = synthetic.flash_models, synthetic.flash_configs
    monkeypatch.setattr(synthetic, "flash_models", lambda **kw: real_models(**{**kw, **SHRUNK}))
    monkeypatch.setattr(synthetic, "flash_configs", lambda **kw: real_configs(**{**kw, **SHRUNK}))
    folder = tmp_path / "files"
    assert cli_main(["bench", "--synthetic", "flash", "--dspark-cycle", "--write-gguf", str(folder), "--json"]) == 0
    wrote = json.loads(capsys.readouterr().out)["wrote"]
    assert wrote == {"2": str(folder / "flash-2-layers.gguf"), "4": str(folder / "flash-4-layers.gguf"),
                     "support": str(folder / synthetic.SUPPORT_NAME)}
    small_cfg, _ = real_configs(**SHRUNK)
    assert SupportModel(wrote["support"], small_cfg).compatible


@pytest.mark.parametrize("argv, message", [
    (["--dspark-cycle"], "--dspark-cycle is an option of --synthetic flash"),
    (["--synthetic", "flash", "--backend", "hip", "--dspark-cycle", "--draft-vocab", "20000"],
     "argument --draft-vocab: 20000: the synthetic support lists 16384 tokens; choose at most 16384, or full for "
     "the whole vocabulary"),
    (["--synthetic", "flash", "--backend", "hip", "--dspark-cycle", "--scheduler-prices", "fresh"],
     "--scheduler-prices is not an option of --synthetic flash (its DSpark cycles run with the scheduler off): drop "
     "it, or use it with --ab"),
])
def test_dspark_cycle_usage_errors(argv, message, monkeypatch, capsys):
    from ds4tui.engine import gpu

    def never(*a, **k):
        raise AssertionError("the device was probed or the weights built before the usage error")

    monkeypatch.setattr(synthetic, "flash_models", never)
    monkeypatch.setattr(gpu, "probe", never)
    assert cli_main(["bench", *argv]) == 2
    assert capsys.readouterr().err == f"ds4tui bench: error: {message}\n"


def test_a_cycle_that_drafts_no_full_block_is_refused(tmp_path, monkeypatch):
    """A drafter op that fails (the engine's test hook) turns every cycle into a plain decode: the
    timing says so by the op's name instead of reporting a cycle that never ran."""
    from ds4tui.engine import session as S

    small, _ = synthetic.flash_models(log=lambda *_: None, **SHRUNK)
    support = synthetic.write_flash_support(tmp_path / synthetic.SUPPORT_NAME, small.config, log=lambda *_: None)
    real_session = S.Engine.session

    def failing(self, *a, **k):
        s = real_session(self, *a, **k)
        s.dspark_fail_op("moe")
        return s

    monkeypatch.setattr(S.Engine, "session", failing)
    with pytest.raises(RuntimeError, match=r"2 layers, context 40: 3 of 3 DSpark cycles did not verify a full block "
                                           r"of 5 drafts \(drafted \[0, 0, 0\]; no-draft reasons \{'disabled': 2, "
                                           r"'chain_fail': 3\}, chain failure in moe\)"):
        synthetic._time_cycle(small, support, backend="cpu", ctxs=[40], n_decode=2, n_cycles=3, log=lambda *_: None,
                              engine_options={}, draft_vocab="auto")


def _interrupt_at(sig: int, message: str, nth: int = 1):
    """A ``log`` that sends ``sig`` to the main thread (where a Ctrl-C lands) with the ``nth`` message
    that starts with ``message`` and waits for it there: the interrupt comes at that point of the run."""
    import signal
    import threading
    import time

    seen = []

    def log(m: str) -> None:
        if m.startswith(message):
            seen.append(m)
            if len(seen) == nth:
                signal.pthread_kill(threading.main_thread().ident, sig)
                time.sleep(60)  # the handler's KeyboardInterrupt ends this at once

    return log


@pytest.mark.parametrize("sig, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_interrupted_json_keeps_the_runs_that_finished(sig, status, tmp_path, monkeypatch, capsys):
    # --contexts 40,90 --json, an interrupt once the 4-layer model is filled to 90 tokens: the 2-layer
    # model's two contexts and the 4-layer model's first are the JSON on stdout, marked interrupted,
    # with nothing extrapolated from them; the status names the signal. As the plain bench's --repeat.
    import signal

    real = synthetic.run_flash_bench
    monkeypatch.setattr(synthetic, "run_flash_bench", lambda **kw: real(**{
        **kw, "backend": "cpu", "n_decode": 3, "n_verify": 2, **SHRUNK,
        "log": _interrupt_at(getattr(signal, sig), "  context ", nth=4)}))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (a shell's
    try:  # background job starts with SIGINT ignored)
        rc = cli_main(["bench", "--synthetic", "flash", "--backend", "hip", "--contexts", "40,90", "--json"])
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capsys.readouterr()
    assert rc == status
    r = json.loads(out)
    assert r["ok"] is False and r["interrupted"] is True and r["error"] == "interrupted after 3 of 4 runs"
    assert (r["runs_planned"], r["runs_finished"]) == (4, 3)
    assert [(x["run"], x["layers"], x["ctx"]) for x in r["runs"]] == [("decode_verify", 2, 40), ("decode_verify", 2, 90),
                                                                     ("decode_verify", 4, 40)]
    for x in r["runs"]:
        assert list(x["verify_ms"]) == ["6"] and x["decode_ms"] > 0 and x["verify_ms"]["6"] > 0
    assert r["synthetic"] == "flash" and r["contexts_planned"] == [40, 90] and r["backend"] == "hip"
    assert r["measured_bandwidth_gbs"] is None  # not measured off the GPU
    for absent in ("contexts", "decode_ms", "per_layer_ms", "decode_tokens_per_s", "verify_over_decode"):
        assert absent not in r  # nothing extrapolated from a partial run
    assert err.endswith('ds4tui bench: interrupted after 3 of 4 runs; the finished runs are in the JSON on stdout '
                        '(marked "ok": false, "interrupted": true)\nds4tui: interrupted\n')


def test_interrupted_before_any_run_writes_the_record_to_out(tmp_path, monkeypatch, capsys):
    # an interrupt as soon as the weights are built, with --out and the text report: the file holds the
    # record of the planned runs (none finished), stdout says so
    import signal

    real = synthetic.run_flash_bench
    monkeypatch.setattr(synthetic, "run_flash_bench", lambda **kw: real(**{
        **kw, "backend": "cpu", "n_decode": 3, "n_verify": 2, **SHRUNK,
        "log": _interrupt_at(signal.SIGTERM, "synthetic Flash weights built")}))
    target = tmp_path / "r.json"
    rc = cli_main(["bench", "--synthetic", "flash", "--backend", "hip", "--ctx", "40", "--dspark-cycle",
                   "--out", str(target)])
    out, err = capsys.readouterr()
    assert rc == 143
    r = json.loads(target.read_text())
    assert (r["ok"], r["interrupted"], r["runs_planned"], r["runs_finished"], r["runs"]) == (False, True, 4, 0, [])
    assert out.splitlines()[0] == ("INTERRUPTED after 0 of 4 runs: the figures below are the finished runs' own, "
                                   "measured on 2 or 4 layers (nothing extrapolated)")
    assert out.splitlines()[-1] == "no run finished"
    assert err.endswith(f"ds4tui bench: interrupted after 0 of 4 runs; no run finished; the record of the planned "
                        f'runs is in {target} (marked "ok": false, "interrupted": true)\nds4tui: interrupted\n')


def test_interrupted_dspark_cycle_reports_each_finished_run(tmp_path, monkeypatch, capsys):
    # --dspark-cycle --prefill-lengths 20, interrupted as the 4-layer target's cycle session opens: the
    # decode/verify and prefill runs of both models and the 2-layer cycle are reported (--out: the
    # JSON; stdout: the text report of the same figures), each as measured
    import signal

    real, real_time = synthetic.run_flash_bench, synthetic._time_model
    monkeypatch.setattr(synthetic, "run_flash_bench", lambda **kw: real(**{
        **kw, "backend": "cpu", "n_decode": 3, "n_verify": 2, "n_cycles": 3, **SHRUNK,
        "log": _interrupt_at(signal.SIGINT, "  4 layers + DSpark support: engine open")}))
    # the real timing (its runs are reported as measured), then known times for the extrapolation that
    # runs before the cycle: a shrunk layer's cost on a shared machine is below the timing noise
    monkeypatch.setattr(synthetic, "_time_model", lambda model, **kw: {**real_time(model, **kw),
                                                                       **_fixed_main(model, **kw)})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    target = tmp_path / "r.json"
    try:
        rc = cli_main(["bench", "--synthetic", "flash", "--backend", "hip", "--ctx", "40", "--dspark-cycle",
                       "--prefill-lengths", "20", "--prefill-batch", "16", "--out", str(target)])
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capsys.readouterr()
    assert rc == 130
    r = json.loads(target.read_text())
    assert (r["runs_planned"], r["runs_finished"], r["dspark_cycle"], r["prefill_lengths"]) == (6, 5, True, [20])
    dv2, dv4, p2, p4, c2 = r["runs"]
    assert [(x["run"], x["layers"]) for x in r["runs"]] == [("decode_verify", 2), ("decode_verify", 4), ("prefill", 2),
                                                            ("prefill", 4), ("dspark_cycle", 2)]
    assert (p2["tokens"], p2["prefill_gemm"], p2["in_force"]) == (20, "auto", "off") and p2["ms"] > 0
    assert c2["ctx"] == 40 and c2["block_size"] == 5 and c2["drafts_per_cycle"] == [5, 5, 5]
    assert c2["propose_ms"] > 0 and c2["verify_ms"] > 0 and c2["decode_ms"] > 0
    assert not list(tmp_path.glob("*.gguf"))  # the temporary support file is gone too
    assert out.splitlines() == [
        "INTERRUPTED after 5 of 6 runs: the figures below are the finished runs' own, measured on 2 or 4 layers "
        "(nothing extrapolated)",
        "synthetic DS4 Flash (q2 mix), hip backend, f32 activations, graphs off; contexts 40",
        *(f"{x['layers']} layers, context 40: decode {x['decode_ms']:.2f} ms, verify(6 rows) {x['verify_ms']['6']:.2f} ms"
          for x in (dv2, dv4)),
        *(f"{x['layers']} layers: prefill 20 tokens, prefill_gemm auto (off): {x['ms']:.0f} ms" for x in (p2, p4)),
        f"2 layers + DSpark support, context 40: decode {c2['decode_ms']:.2f} ms, DSpark cycle: propose "
        f"{c2['propose_ms']:.2f} ms + verify(1+5 rows) {c2['verify_ms']:.2f} ms"]
    assert err.endswith(f"ds4tui bench: interrupted after 5 of 6 runs; the finished runs are in {target} (marked "
                        f"\"ok\": false, \"interrupted\": true)\nds4tui: interrupted\n")
