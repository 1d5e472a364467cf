"""``ds4tui.devtools.fit_support``: a fitted support model drafts for real (spec dspark.md §1, §2.4).

Oracle: the numpy reference drafter and ``speculative_generate`` on prompts the fit never saw;
greedy output must equal ``greedy_generate``'s.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4tui.devtools import fit_support as F
from ds4tui.engine import reference as R
from ds4tui.engine.convert import ConversionError
from ds4tui.engine.gguf_model import ArchitectureError, DS4Model, SupportModel

HEADS = ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight")


def _held_out_prompts(model: DS4Model, n: int) -> list[list[int]]:
    return F.random_prompts(model, n, np.random.default_rng(101))  # the fixture fits with seed 0


def test_fitted_file_keeps_everything_but_the_heads(tiny_q2, fitted_support):
    c = tiny_q2["config"]
    old = SupportModel(tiny_q2["support"], c).require_compatible()
    new = SupportModel(fitted_support, c).require_compatible()
    assert new.meta.markov_rank == c.n_embd + F.EXTRA_COLUMNS
    for k in ("block_size", "noise_token_id", "target_layer_ids", "n_stages"):
        assert getattr(new.meta, k) == getattr(old.meta, k), k
    assert set(new.tensors) == set(old.tensors)
    last = f"mtp.{new.meta.n_stages - 1}."
    assert new.tensors[last + HEADS[0]].type.name == "Q8_0"
    assert new.tensors[last + HEADS[1]].type.name == "Q8_0"
    assert new.tensors[last + HEADS[2]].type.name == "F32"
    kept = [n for n in old.tensors if not n.endswith(HEADS)]
    assert len(kept) == len(old.tensors) - 3
    for name in kept:
        a, b = old.tensors[name], new.tensors[name]
        assert (a.type, a.shape) == (b.type, b.shape), name
        assert np.array_equal(a.raw_bytes(), b.raw_bytes()), name


def test_fitted_support_drafts_on_held_out_prompts(tiny_q2, fitted_support):
    """Full, partial and miss_first cycles all occur, ~half the drafts are accepted, output is greedy."""
    model = R.ReferenceModel(tiny_q2["model"])
    drafter = R.ReferenceDrafter(model, fitted_support)
    agg = {"proposed": 0, "accepted": 0, "full": 0, "partial": 0, "miss_first": 0}
    for p in _held_out_prompts(model.model, 2):
        r = R.speculative_generate(model, drafter, p, 32)
        assert r.tokens == R.greedy_generate(model, p, 32)
        for cy in r.cycles:
            n = len(cy.proposed)
            assert n == drafter.block_size  # threshold 0: nothing is cut
            agg["proposed"] += n
            agg["accepted"] += cy.accepted
            kind = "full" if cy.accepted == n else "miss_first" if cy.accepted == 0 else "partial"
            agg[kind] += 1
    assert agg["full"] > 0 and agg["partial"] > 0 and agg["miss_first"] > 0, agg
    assert agg["accepted"] > 0.3 * agg["proposed"], agg  # measured 0.48 (3 prompts × 32 tokens)


def test_confidence_follows_the_bigram_margin(tiny_q2, fitted_support):
    """c = σ(ρ(prev)): below 0.5 after near-tie tokens (the threshold then cuts), high after clear ones."""
    tm = DS4Model(tiny_q2["model"])
    bigram = F.ZeroLayerBigram(tm)
    cand = bigram.emission_order()[:400]  # inside the fixture's 4096 scanned tokens
    _, margin = bigram.top2(cand)
    order = np.argsort(margin, kind="stable")
    low, high = cand[order[:20]], cand[order[-20:]]
    model = R.ReferenceModel(tm)
    drafter = R.ReferenceDrafter(model, fitted_support)
    last = drafter.last
    H = tm.config.n_embd
    w = drafter.w.get(last + HEADS[2]).reshape(-1)
    assert not w[:H].any()  # no h part: the confidence depends on the previous token only
    w1 = drafter.w.get(last + HEADS[0])
    conf = 1.0 / (1.0 + np.exp(-(w1[cand] @ w[H:])))
    assert np.all(np.diff(conf[order]) >= -1e-2)  # monotone in the margin (up to Q8_0 rounding)
    assert conf[order[:20]].max() < 0.5 and conf[order[-20:]].min() > 0.9
    prompt = _held_out_prompts(tm, 1)[0]
    st = model.new_state(64)
    pre = model.prefill(st, prompt, capture=drafter.capture_layers)
    ds = drafter.new_state()
    drafter.add_context(ds, np.arange(len(prompt)), pre.hidden)
    cut = drafter.propose(ds, int(low[0]), threshold=0.5)
    assert cut.tokens == [] and cut.confidence[0] == pytest.approx(conf[order[0]], abs=1e-5)
    kept = drafter.propose(ds, int(high[-1]), threshold=0.5)
    assert kept.tokens and kept.tokens[0] == bigram.next(int(high[-1]))


def test_fit_is_deterministic_and_reports(tiny_q2, tmp_path):
    kw = dict(prompts=2, tokens=8, scan=0, seed=3)
    r1 = F.fit_support(tiny_q2["model"], tiny_q2["support"], tmp_path / "a.gguf", **kw)
    F.fit_support(tiny_q2["model"], tiny_q2["support"], tmp_path / "b.gguf", **kw)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert r1["prompts"] == {"fit": 1, "held_out": 1} and r1["rank"] == 288 and r1["margins"] == 8
    p = r1["predicted"]
    assert p["cycles"] == p["full"] + p["partial"] + p["miss_first"] + p["no_draft"] > 0
    assert 0.0 <= p["accept_rate"] <= 100.0 and r1["alpha"] > 10
    assert str(tmp_path / "a.gguf") in F.summary_line(r1)


def test_bad_inputs_are_named(tiny_q2, tmp_path, capsys):
    model, sup = tiny_q2["model"], tiny_q2["support"]
    with pytest.raises(ValueError, match=r"rank must be at least n_embd \+ 1 = 257.*got 64"):
        F.fit_support(model, sup, tmp_path / "o.gguf", rank=64)
    with pytest.raises(ValueError, match="prompts must be an integer >= 2, got 1"):
        F.fit_support(model, sup, tmp_path / "o.gguf", prompts=1)
    with pytest.raises(ValueError, match="scan must be an integer 0..129280"):
        F.fit_support(model, sup, tmp_path / "o.gguf", scan=-1)
    with pytest.raises(ConversionError, match="is one of the input files"):
        F.fit_support(model, sup, sup)
    with pytest.raises(ConversionError, match="does not exist"):
        F.fit_support(model, sup, tmp_path / "missing" / "o.gguf")
    with pytest.raises(ArchitectureError, match="not a support file"):
        F.fit_support(model, model, tmp_path / "o.gguf")
    assert F.main([str(model), str(sup), str(tmp_path / "o.gguf"), "--rank", "100", "-q"]) == 1
    assert "ds4tui-fit-support: error: rank must be at least n_embd + 1 = 257" in capsys.readouterr().err
    assert not (tmp_path / "o.gguf").exists()
    # the files in the wrong order: it said to pass the support file with --mtp, which this tool does not have
    assert F.main([str(sup), str(model), str(tmp_path / "o.gguf"), "-q"]) == 1
    assert capsys.readouterr().err == (f"ds4tui-fit-support: error: {sup}: general.architecture: expected 'deepseek4', found "
                                       f"'deepseek4-dspark' (this is a DSpark support file: give the target model "
                                       f"first: ds4tui-fit-support MODEL.gguf SUPPORT_IN.gguf OUT.gguf)\n")
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("argv,message", [
    (["--prompts", "1"], "argument --prompts: expected an integer >= 2, found 1"),
    (["--tokens", "7"], "argument --tokens: expected an integer >= 8, found 7"),
    (["--seed", "-1"], "argument --seed: expected an integer >= 0, found -1"),
    (["--scan", "x"], "argument --scan: expected an integer >= 0, found 'x'"),
])
def test_bad_flags_are_usage_errors_before_anything_loads(argv, message, tmp_path, capsys):
    """A bad flag value names the flag and exits 2 before the model is read (the files need not exist)."""
    with pytest.raises(SystemExit) as e:
        F.main([str(tmp_path / "none.gguf"), str(tmp_path / "none2.gguf"), str(tmp_path / "o.gguf"), *argv])
    assert e.value.code == 2 and f"ds4tui-fit-support: error: {message}" in capsys.readouterr().err


def test_an_output_path_that_cannot_be_written_is_a_usage_error(tiny_q2, tmp_path, capsys):
    model, sup = tiny_q2["model"], tiny_q2["support"]
    for out, said in ((tmp_path, "is a folder"), (tmp_path / "missing" / "o.gguf", "does not exist"),
                      (sup, "is one of the input files"), ("", "empty: give the path")):
        with pytest.raises(SystemExit) as e:
            F.main([str(model), str(sup), str(out), "-q"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "ds4tui-fit-support: error: argument out: " in err and said in err


def test_an_existing_output_is_replaced_only_with_force(tiny_q2, tmp_path, monkeypatch, capsys):
    """An existing OUT is refused before anything loads (one line naming it, exit status 2, the file
    unchanged), and replaced by the fitted support file with --force; the function refuses it too
    unless ``overwrite``."""
    model, sup = tiny_q2["model"], tiny_q2["support"]
    out = tmp_path / "fitted.gguf"
    out.write_bytes(b"an earlier fit, kept")
    small = ["--prompts", "2", "--tokens", "8", "--scan", "0", "-q"]
    real = F.DS4Model
    monkeypatch.setattr(F, "DS4Model", lambda *a, **k: pytest.fail("the model was loaded before OUT was checked"))
    assert F.main([str(model), str(sup), str(out), *small]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (f"ds4tui-fit-support: error: argument out: {out} exists: pass "
                                                   f"--force to replace it, or choose another path (nothing was "
                                                   f"written)\n")
    assert out.read_bytes() == b"an earlier fit, kept"
    monkeypatch.setattr(F, "DS4Model", real)
    with pytest.raises(ConversionError, match="already exists"):
        F.fit_support(model, sup, out, prompts=2, tokens=8, scan=0)
    assert out.read_bytes() == b"an earlier fit, kept"
    assert F.main([str(model), str(sup), str(out), *small, "--force"]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: held-out bigram hit ")
    SupportModel(out, tiny_q2["config"]).require_compatible()
    assert sorted(q.name for q in tmp_path.iterdir()) == ["fitted.gguf"]  # no temporary file left beside it


def test_force_is_in_the_help(capsys):
    with pytest.raises(SystemExit) as e:
        F.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "--force replace OUT if it exists" in text
    assert "an existing file is replaced only with --force" in text
