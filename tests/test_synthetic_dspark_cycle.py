"""``bench --synthetic flash --dspark-cycle``: the DSpark cycle (propose + verify of 1 + block rows)
against a plain decode, on the synthetic Flash layers with a synthetic support model attached.

Run here on the cpu backend with the layers shrunk (as the other synthetic benchmark tests do):
the engine's own cycles run for real (every cycle must propose and verify a full block), while
the timings the arithmetic is checked on are replaced by known values, since a shrunk layer's
cost on a shared machine is below the timing noise.  Nothing asserts a speed.
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
