"""Round trip make_test_model → convert → load → validate, and the GGUF layout rules (spec ds4.md §3)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from safetensors.numpy import load_file

from ds4tui.cli import main as cli_main
from ds4tui.devtools import make_test_model as mtm
from ds4tui.engine import layout as L
from ds4tui.engine.gguf_model import DS4Model, SupportModel


@pytest.fixture(scope="module")
def plain_reader(tiny_q2) -> GGUFReader:
    """The gguf package's own reader, unmodified: an independent view of what was written."""
    return GGUFReader(tiny_q2["model"])


def test_tiny_config_is_spec_section_6(tiny_q2):
    m = DS4Model(tiny_q2["model"])
    c = m.config
    want = tiny_q2["config"]
    # floats are stored as GGUF f32 (spec ds4.md §3.2), so compare with f32-rounded values
    f32 = {k: float(np.float32(v)) for k, v in vars(want).items() if isinstance(v, float)}
    f32 |= {k: tuple(float(np.float32(x)) for x in v) for k, v in vars(want).items()
            if isinstance(v, tuple) and v and isinstance(v[0], float)}
    assert c == dataclasses.replace(want, **f32)
    assert c.rms_eps == np.float32(1e-6)
    assert (c.n_layer, c.n_embd, c.n_vocab, c.n_head, c.head_dim, c.n_rot) == (6, 256, 129280, 8, 128, 64)
    assert c.compress_ratios == (0, 0, 4, 16, 4, 16)
    assert (c.q_lora_rank, c.o_groups, c.o_lora_rank, c.sliding_window) == (128, 2, 64, 16)
    assert (c.indexer_n_head, c.indexer_head_dim, c.indexer_top_k) == (16, 128, 8)
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_hash_layer) == (16, 6, 256, 3)
    assert [c.layer_kind(i).value for i in range(6)] == ["SWA", "SWA", "CSA", "HCA", "CSA", "HCA"]


def test_q2_mix_types(tiny_q2):
    """The q2 mix of the released files (spec ds4.md §3.3)."""
    m = DS4Model(tiny_q2["model"])
    t = {n: i.type for n, i in m.tensors.items()}
    assert t["token_embd.weight"] == T.F16
    assert t["output.weight"] == T.Q8_0
    for L_ in range(6):
        p = f"blk.{L_}."
        assert t[p + "ffn_gate_exps.weight"] == T.IQ2_XXS
        assert t[p + "ffn_up_exps.weight"] == T.IQ2_XXS
        assert t[p + "ffn_down_exps.weight"] == T.Q2_K
        for s in ("attn_q_a", "attn_q_b", "attn_kv", "attn_output_a", "attn_output_b", "ffn_gate_shexp",
                  "ffn_up_shexp", "ffn_down_shexp"):
            assert t[p + s + ".weight"] == T.Q8_0, s
        assert t[p + "hc_attn_fn.weight"] == T.F16
        assert t[p + "ffn_gate_inp.weight"] == T.F16
        assert t[p + "attn_norm.weight"] == T.F32
        # exp_probs_b only on routed layers, tid2eid only on hash layers (llama.cpp rule, §3.6)
        assert (p + "exp_probs_b.bias" in t) == (L_ >= 3)
        assert (p + "ffn_gate_tid2eid.weight" in t) == (L_ < 3)
        if L_ < 3:
            assert t[p + "ffn_gate_tid2eid.weight"] == T.I32
    assert t["blk.2.indexer.attn_q_b.weight"] == T.F16
    assert "blk.3.indexer.attn_q_b.weight" not in t
    # 6 global + 2 SWA×24 + CSA-hash 34 + HCA 28 + CSA 34 + HCA 28 (the §3.3 count rule at 6 layers)
    assert len(m.tensors) == 6 + 2 * 24 + 34 + 28 + 34 + 28


def test_f32_round_trip_is_exact(small_f32):
    """Every GGUF tensor equals the checkpoint tensor(s) it came from (no transposes, §3.4)."""
    m = DS4Model(small_f32["model"])
    ck = load_file(str(small_f32["hf"]) + "/model.safetensors")
    assert ck["model.layers.0.ffn.gate.tid2eid"].dtype == np.int64
    checked = 0
    for spec in L.model_tensor_specs(m.config):
        info = m.tensors[spec.name]
        want = mtm.saved_names(spec, np.zeros(spec.shape, np.float32))
        got = np.asarray(info.data)
        if len(want) == 1:
            (src,) = want
            np.testing.assert_array_equal(got, ck[src].astype(got.dtype), err_msg=spec.name)
        else:  # routed experts: stacked along the outermost axis in expert order
            for e, src in enumerate(want):
                np.testing.assert_array_equal(got[e], ck[src], err_msg=f"{spec.name}[{e}]")
        checked += 1
    assert checked == len(m.specs)
    # the KV norm comes from save_pretrained's 'attn.norm.weight' spelling
    np.testing.assert_array_equal(m.tensors["blk.1.attn_kv_a_norm.weight"].data,
                                  ck["model.layers.1.attn.norm.weight"])


def _block_bound(qt: T, x: np.ndarray) -> np.ndarray:
    """A per-element error bound for dequant(quant(x)) (format reasoning, see test_quants.py)."""
    if qt == T.Q8_0:
        blocks = x.reshape(-1, 32)
        d = np.abs(blocks).max(axis=1, keepdims=True) / 127
        return np.broadcast_to(d * 0.5 + np.abs(blocks) * 2.0 ** -10 + 1e-12, blocks.shape).reshape(x.shape)
    raise AssertionError(qt)


def test_q2_values_decode_within_bounds(tiny_q2):
    """Quantised tensors decode (gguf.quants) close to the checkpoint's float weights."""
    m = DS4Model(tiny_q2["model"])
    ck = load_file(tiny_q2["hf"] + "/model.safetensors")
    q = m.tensors["blk.4.attn_q_b.weight"]
    x = ck["model.layers.4.attn.wq_b.weight"]
    y = dequantize(np.asarray(q.data), q.type).reshape(x.shape)
    assert np.all(np.abs(y - x) <= _block_bound(T.Q8_0, x))
    emb = m.tensors["token_embd.weight"]
    np.testing.assert_array_equal(np.asarray(emb.data), ck["model.embed_tokens.weight"].astype(np.float16))
    gate = m.tensors["blk.3.ffn_gate_exps.weight"]
    xg = np.stack([ck[f"model.layers.3.ffn.experts.{e}.w1.weight"] for e in range(16)])
    yg = dequantize(np.asarray(gate.data), gate.type).reshape(xg.shape)
    rel = np.sqrt(np.mean((yg - xg) ** 2) / np.mean(xg ** 2))
    assert rel < 0.6, rel  # IQ2_XXS at 2.06 bits/weight: see test_quants.py for the measured level
    assert np.corrcoef(yg.ravel(), xg.ravel())[0, 1] > 0.8
    down = m.tensors["blk.3.ffn_down_exps.weight"]
    xd = np.stack([ck[f"model.layers.3.ffn.experts.{e}.w2.weight"] for e in range(16)])
    yd = dequantize(np.asarray(down.data), down.type).reshape(xd.shape)
    assert np.corrcoef(yd.ravel(), xd.ravel())[0, 1] > 0.9
    tid = m.tensors["blk.0.ffn_gate_tid2eid.weight"]
    np.testing.assert_array_equal(np.asarray(tid.data), ck["model.layers.0.ffn.gate.tid2eid"].astype(np.int32))
    rows = np.asarray(tid.data)
    assert all(len(set(r)) == 6 for r in rows[:1000])  # distinct experts per token (§6)


def test_metadata_types_follow_spec_3_2(plain_reader):
    """Exact GGUF value types: ds4 and llama.cpp both check them (spec ds4.md §3.2, §3.6)."""
    r = plain_reader
    f = r.fields
    V = GGUFValueType

    def typ(k):
        return f[k].types[0], (f[k].types[-1] if f[k].types[0] == V.ARRAY else None)

    for mk in L.MODEL_KEYS:
        if mk.field in ("expert_group_count", "expert_group_used_count"):
            assert mk.key not in f
            continue
        assert mk.key in f, mk.key
        want = {L.MetaType.U32: (V.UINT32, None), L.MetaType.U64: (V.UINT32, None), L.MetaType.F32: (V.FLOAT32, None),
                L.MetaType.BOOL: (V.BOOL, None), L.MetaType.STR: (V.STRING, None),
                L.MetaType.I32_ARRAY: (V.ARRAY, V.INT32), L.MetaType.F32_ARRAY: (V.ARRAY, V.FLOAT32)}[mk.type]
        assert typ(mk.key) == want, mk.key
    assert list(f["deepseek4.attention.compress_ratios"].contents()) == [0, 0, 4, 16, 4, 16, 0]  # + MTP slot
    assert list(f["deepseek4.swiglu_clamp_exp"].contents()) == [10.0] * 6  # exactly block_count
    assert f["deepseek4.expert_gating_func"].contents() == 4
    assert f["deepseek4.rope.scaling.type"].contents() == "yarn"
    assert f["deepseek4.rope.scaling.original_context_length"].contents() == 65536
    assert f["deepseek4.context_length"].contents() == 1048576
    assert f["general.architecture"].contents() == "deepseek4"
    assert f["general.alignment"].contents() == 32
    assert f["tokenizer.ggml.model"].contents() == "gpt2"
    assert f["tokenizer.ggml.pre"].contents() == "joyai-llm"
    assert typ("tokenizer.ggml.token_type") == (V.ARRAY, V.INT32)
    assert (f["tokenizer.ggml.bos_token_id"].contents(), f["tokenizer.ggml.eos_token_id"].contents()) == (0, 1)
    assert len(f["tokenizer.ggml.tokens"].data) == 129280
    assert len(f["tokenizer.ggml.merges"].data) == 127741
    assert "deepseek4.nextn_predict_layers" not in f


def test_tensor_data_is_contiguous_in_info_order(plain_reader):
    """ggml's gguf loader: offset i = sum of padded sizes of tensors 0..i-1; names < 64 bytes."""
    r = plain_reader
    expected = None
    for t in r.tensors:
        assert len(t.name.encode()) < 64
        if expected is None:
            expected = t.data_offset
            start = t.data_offset
            assert (start % 32) == 0
        assert t.data_offset == expected, t.name
        block, size = GGML_QUANT_SIZES[t.tensor_type]
        assert t.n_bytes == int(np.prod(t.shape)) // block * size
        expected = t.data_offset + (t.n_bytes + 31) // 32 * 32


def test_inspect_json_schedule_and_bytes(tiny_q2, plain_reader, capsys):
    rc = cli_main(["inspect", tiny_q2["model"], "--mtp", tiny_q2["support"], "--json", "--ctx", "200"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True
    m = out["model"]
    assert [s["attention"] for s in m["schedule"]] == ["SWA", "SWA", "CSA", "HCA", "CSA", "HCA"]
    assert [s["compress_ratio"] for s in m["schedule"]] == [0, 0, 4, 16, 4, 16]
    assert [s["moe"] for s in m["schedule"]] == ["hash"] * 3 + ["topk"] * 3
    assert m["layer_counts"] == {"SWA": 2, "CSA": 2, "HCA": 2, "hash_moe": 3, "topk_moe": 3}
    r = plain_reader
    assert m["tensor_bytes"] == sum(int(t.n_bytes) for t in r.tensors)
    by_type: dict[str, int] = {}
    for t in r.tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    assert {k: v["bytes"] for k, v in m["quant_mix"].items()} == by_type
    # bytes per token, from the tensor table by the §8 rule: all dense tensors, 6/16 of the experts,
    # one embedding row, 6 tid2eid ids; at ctx 200 there are 50 CSA rows > top-8, so the indexer runs.
    size = {t.name: int(t.n_bytes) for t in r.tensors}
    w = 0
    for n, b in size.items():
        if n == "token_embd.weight":
            w += b // 129280
        elif "_exps." in n:
            w += b * 6 // 16
        elif "tid2eid" in n:
            w += 6 * 4
        else:
            w += b
    assert m["bytes_per_token"]["weights"] == w
    # KV (f32 rows of 128): 6 layers × 16 raw rows; CSA: top-8 rows + 50 index keys of 128; HCA: 12 rows
    kv = 6 * 16 * 512 + 2 * (8 * 512 + 50 * 512) + 2 * (12 * 512)
    assert m["bytes_per_token"]["kv"] == kv
    s = out["support"]
    assert s["compatible"] is True
    assert s["counts"] == {"stages": 3, "block": 5, "markov_rank": 32, "tensors": 81, "missing": 0, "invalid": 0,
                           "metadata_errors": 0, "nonfinite": 0}
    assert s["target_layer_ids"] == [3, 4, 5] and s["noise_token_id"] == 128799


def test_inspect_text(tiny_q2, capsys):
    rc = cli_main(["inspect", tiny_q2["model"], "--mtp", tiny_q2["support"]])
    text = capsys.readouterr().out
    assert rc == 0
    assert "schedule      0-1 SWA/hash  2 CSA(4)/hash  3 HCA(16)/topk  4 CSA(4)/topk  5 HCA(16)/topk" in text
    assert "stages=3 block=5 markov_rank=32 tensors=81 missing=0 invalid=0 metadata_errors=0 nonfinite=0" in text
    assert "verdict       compatible" in text


def test_support_layout_is_81_tensors(tiny_q2):
    s = SupportModel(tiny_q2["support"], tiny_q2["config"])
    assert s.compatible and s.present == 81
    assert s.summary_line() == "stages=3 block=5 markov_rank=32 tensors=81 missing=0 invalid=0 metadata_errors=0 nonfinite=0"
    t = s.tensors
    assert t["mtp.0.main_proj.weight"].shape == (256, 3 * 256)
    assert t["mtp.2.markov_head.markov_w1.weight"].ne == (32, 129280)
    assert t["mtp.2.confidence_head.proj.weight"].ne == (256 + 32, 1)
    assert t["mtp.1.ffn_gate_exps.weight"].type == T.IQ2_XXS
    assert t["mtp.1.ffn_down_exps.weight"].type == T.Q2_K
    assert t["mtp.0.attn_output_a.weight"].type == T.Q8_0
    assert t["mtp.0.hc_attn_fn.weight"].type == T.F16
    assert "mtp.0.ffn_gate_tid2eid.weight" not in t  # drafter stages use learned routing


def test_make_test_model_is_deterministic(tmp_path):
    a = mtm.make(tmp_path / "a", config="tiny", seed=7, layers=3, experts=6, types="f16")
    b = mtm.make(tmp_path / "b", config="tiny", seed=7, layers=3, experts=6, types="f16")
    c = mtm.make(tmp_path / "c", config="tiny", seed=8, layers=3, experts=6, types="f16")
    ra = open(a["model"], "rb").read()
    assert ra == open(b["model"], "rb").read()
    assert open(a["support"], "rb").read() == open(b["support"], "rb").read()
    assert ra != open(c["model"], "rb").read()


def test_tiny128_for_llama_cpp_cross_checks(tmp_path):
    """HCA ratio 128 (llama.cpp's only HCA ratio) and head 256 (≠ indexer key length 128, see make_test_model)."""
    r = mtm.make(tmp_path, config="tiny128", seed=3, types="f16")
    m = DS4Model(r["model"])
    assert m.config.compress_ratios == (0, 0, 4, 128, 4, 128)
    assert (m.config.head_dim, m.config.indexer_head_dim) == (256, 128)
    assert m.tensors["blk.3.attn_compressor_ape.weight"].shape == (128, 256)
    assert m.tensors["blk.2.attn_compressor_ape.weight"].shape == (4, 512)
    assert SupportModel(r["support"], m.config).compatible


def test_make_test_model_sigterm_and_file_modes(tmp_path):
    """Killing the test-model maker leaves no .part file; the checkpoint is readable by others."""
    import os
    import signal
    import stat
    import subprocess
    import sys
    import time

    out = tmp_path / "m"
    p = subprocess.Popen([sys.executable, "-m", "ds4tui.devtools.make_test_model", str(out), "-q", "--layers", "3",
                          "--experts", "6"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("*.part")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert list(out.glob("*.part")), "never started writing the GGUF"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((out / "hf" / "model.safetensors").stat().st_mode) == 0o666 & ~umask
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 130 and "interrupted" in err
    assert list(out.glob("*.part")) == []
