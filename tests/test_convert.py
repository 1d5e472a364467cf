"""The checkpoint → GGUF converter: both naming schemes, both config.json forms, FP8/FP4 sources, errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ds4tui.cli import main as cli_main
from ds4tui.engine.convert import ConversionError, HFCheckpoint, config_from_hf, convert
from ds4tui.engine.gguf_model import DS4Model


def _release_name(name: str) -> str:
    """save_pretrained name → the original DeepSeek release name (spec ds4.md §3.4)."""
    globals_ = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
                "model.hc_head.hc_fn": "hc_head_fn", "model.hc_head.hc_base": "hc_head_base",
                "model.hc_head.hc_scale": "hc_head_scale", "head.weight": "head.weight"}
    if name in globals_:
        return globals_[name]
    name = name.removeprefix("model.")
    return name.replace(".attn.norm.weight", ".attn.kv_norm.weight")


def _release_config(tf_cfg: dict) -> dict:
    """The release form of config.json: compress_ratios (+MTP slot), num_hash_layers, rope_scaling."""
    c = {k: v for k, v in tf_cfg.items() if k not in ("layer_types", "compress_rates", "mlp_layer_types",
                                                       "rope_parameters", "qk_rope_head_dim")}
    rates = tf_cfg["compress_rates"]
    c["compress_ratios"] = [rates.get(t, 0) for t in tf_cfg["layer_types"]] + [0]
    c["num_hash_layers"] = tf_cfg["mlp_layer_types"].count("hash_moe")
    comp = tf_cfg["rope_parameters"]["compress"]
    c["rope_scaling"] = {"type": "yarn", "factor": comp["factor"], "beta_fast": comp["beta_fast"],
                         "beta_slow": comp["beta_slow"],
                         "original_max_position_embeddings": comp["original_max_position_embeddings"]}
    c["rope_theta"] = tf_cfg["rope_parameters"]["main"]["rope_theta"]
    c["compress_rope_theta"] = comp["rope_theta"]
    return c


def test_release_names_and_config_give_the_same_gguf(small_f32, tmp_path):
    hf = Path(small_f32["hf"])
    tensors = load_file(str(hf / "model.safetensors"))
    rel = tmp_path / "release"
    rel.mkdir()
    save_file({_release_name(k): v for k, v in tensors.items()}, str(rel / "model.safetensors"))
    tf_cfg = json.loads((hf / "config.json").read_text())
    (rel / "config.json").write_text(json.dumps(_release_config(tf_cfg)))
    assert config_from_hf(_release_config(tf_cfg)) == config_from_hf(tf_cfg)
    out = convert(rel, tmp_path / "release.gguf", types="f32", tokenizer_json=hf / "tokenizer.json",
                  name="ds4-tiny-seed1")
    a, b = DS4Model(out), DS4Model(small_f32["model"])
    assert a.config == b.config
    assert list(a.tensors) == list(b.tensors)
    for name in a.tensors:
        np.testing.assert_array_equal(np.asarray(a.tensors[name].data), np.asarray(b.tensors[name].data),
                                      err_msg=name)


def _write_raw_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """safetensors file with arbitrary dtypes (BF16, F8_E4M3, F8_E8M0), laid out per the format."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_fp8_bf16_fp4_sources_decode(tmp_path):
    """FP8 E4M3 with 128x128 E8M0 block scales, BF16, and packed FP4 E2M1 experts (spec ds4.md §3.4)."""
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text("{}")
    fp8 = bytearray(2 * 256)
    codes = [0x38, 0x40, 0x3C, 0xB8, 0x01, 0x7E, 0x00, 0x80]  # 1, 2, 1.5, -1, 2^-9, 448, 0, -0
    fp8[: len(codes)] = bytes(codes)
    fp8[128:130] = bytes([0x38, 0x40])  # second 128-column block: scaled by 2
    fp8[256] = 0x38  # row 1, same first block
    scales = bytes([127, 128])  # E8M0: 2^0, 2^1
    bf16 = struct.pack("<2H", 0x3F80, 0xC000)  # 1.0, -2.0
    fp4 = bytes([0x21, 0xF9])  # low nibble = even element: [0.5, 1.0, -0.5, -6.0]
    _write_raw_safetensors(d / "model.safetensors", {
        "w.weight": ("F8_E4M3", [2, 256], bytes(fp8)),
        "w.scale": ("F8_E8M0", [1, 2], scales),
        "b.weight": ("BF16", [2], bf16),
        "e.weight": ("I8", [1, 2], fp4),
        "e.scale": ("F8_E8M0", [1, 1], bytes([129])),  # ×4
    })
    ck = HFCheckpoint(d)
    w = ck.float32("w.weight")
    assert w.dtype == np.float32 and w.shape == (2, 256)
    np.testing.assert_array_equal(w[0, :8], [1, 2, 1.5, -1, 2.0 ** -9, 448, 0, 0])
    assert np.signbit(w[0, 7])
    np.testing.assert_array_equal(w[0, 128:130], [2, 4])
    assert w[1, 0] == 1 and np.count_nonzero(w) == 9  # 6 + 2 in row 0, 1 in row 1
    np.testing.assert_array_equal(ck.float32("b.weight"), [1.0, -2.0])
    np.testing.assert_array_equal(ck.float32("e.weight"), [[2.0, 4.0, -2.0, -24.0]])


def test_missing_checkpoint_tensor_names_it_and_leaves_no_file(small_f32, tmp_path):
    hf = Path(small_f32["hf"])
    tensors = load_file(str(hf / "model.safetensors"))
    del tensors["model.layers.2.attn.indexer.wq_b.weight"]
    d = tmp_path / "broken"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text((hf / "config.json").read_text())
    out = tmp_path / "out.gguf"
    with pytest.raises(ConversionError) as ei:
        convert(d, out, types="f16", tokenizer_json=hf / "tokenizer.json")
    msg = str(ei.value)
    assert "GGUF tensor 'blk.2.indexer.attn_q_b.weight'" in msg
    assert "layers.2.attn.indexer.wq_b.weight" in msg and "model.layers.2.attn.indexer.wq_b.weight" in msg
    assert not out.exists() and list(tmp_path.glob("out.gguf*")) == []


def test_nonfinite_source_weight_is_refused(small_f32, tmp_path):
    hf = Path(small_f32["hf"])
    tensors = load_file(str(hf / "model.safetensors"))
    tensors["model.layers.1.attn.wkv.weight"][3, 5] = np.inf
    d = tmp_path / "inf"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text((hf / "config.json").read_text())
    with pytest.raises(ConversionError, match=r"tensor 'blk\.1\.attn_kv\.weight': 1 non-finite"):
        convert(d, tmp_path / "o.gguf", types="f16", tokenizer_json=hf / "tokenizer.json")


def test_config_errors(small_f32):
    with pytest.raises(ConversionError, match="config.json: missing field 'vocab_size' \\(expected an integer >= 1\\)"):
        config_from_hf({"num_hidden_layers": 2, "hidden_size": 256})
    base = {k: v for k, v in json.loads((Path(small_f32["hf"]) / "config.json").read_text()).items()
            if k not in ("layer_types", "compress_rates")}
    with pytest.raises(ConversionError, match="neither 'compress_ratios' nor 'layer_types'"):
        config_from_hf(base)
    with pytest.raises(ConversionError, match="scoring_func must be 'sqrtsoftplus', found 'softmax'"):
        config_from_hf(base | {"compress_ratios": [0, 0, 0], "scoring_func": "softmax"})


_BAD_CONFIG = [
    ({"num_hidden_layers": None}, "field 'num_hidden_layers': expected an integer >= 1, found null"),
    ({"n_routed_experts": None}, "field 'n_routed_experts': expected an integer >= 1, found null"),
    ({"mlp_layer_types": None}, "field 'mlp_layer_types': expected a list of at least 3 strings (num_hidden_layers), "
                                "found null"),
    ({"hidden_size": -4}, "field 'hidden_size': expected an integer >= 1, found -4"),
    ({"hidden_size": "abc"}, 'field \'hidden_size\': expected an integer >= 1, found "abc"'),
    ({"vocab_size": "big"}, 'field \'vocab_size\': expected an integer >= 1, found "big"'),
    ({"head_dim": 1.5}, "field 'head_dim': expected an integer >= 1, found 1.5"),
    ({"hc_mult": 0}, "field 'hc_mult': expected an integer >= 1, found 0"),
    ({"num_experts_per_tok": 7}, "field 'num_experts_per_tok': expected at most n_routed_experts = 6, found 7"),
    ({"layer_types": ["sliding_attention"]}, "field 'layer_types': expected a list of at least 3 strings "
                                             '(num_hidden_layers), found ["sliding_attention"]'),
    ({"rms_norm_eps": "tiny"}, 'field \'rms_norm_eps\': expected a number > 0, found "tiny"'),
    ({"qk_rope_head_dim": 130}, "field 'qk_rope_head_dim': expected a rotary width that is even and at most "
                                "head_dim = 128 (found width 130), found 130"),
]


@pytest.mark.parametrize("types", ["q8_0", "q2"])
@pytest.mark.parametrize("change,message", _BAD_CONFIG)
def test_bad_config_field_is_one_line_naming_it(small_f32, tmp_path, capsys, change, message, types):
    hf = Path(small_f32["hf"])
    d = tmp_path / "ckpt"
    d.mkdir()
    for f in ("model.safetensors", "tokenizer.json"):
        (d / f).symlink_to(hf / f)
    (d / "config.json").write_text(json.dumps(json.loads((hf / "config.json").read_text()) | change))
    rc = cli_main(["convert", str(d), str(tmp_path / "o.gguf"), "--types", types, "-q"])
    err = capsys.readouterr().err
    assert rc == 1 and err == f"ds4tui convert: error: {d / 'config.json'}: {message}; correct it in config.json\n"
    assert not (tmp_path / "o.gguf").exists()


def test_checkpoint_folder_errors(tmp_path):
    with pytest.raises(ConversionError, match="config.json: missing"):
        HFCheckpoint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConversionError, match="no \\*.safetensors files"):
        HFCheckpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ConversionError, match="truncated safetensors header"):
        HFCheckpoint(tmp_path)


def test_cli_convert(small_f32, tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    rc = cli_main(["convert", small_f32["hf"], str(out), "--types", "q8_0", "-q"])
    assert rc == 0 and capsys.readouterr().out.strip() == str(out)
    m = DS4Model(out)
    assert m.tensors["blk.1.ffn_gate_exps.weight"].type.name == "Q8_0"
    assert m.tensors["token_embd.weight"].type.name == "Q8_0"
    assert m.tensors["blk.1.hc_attn_fn.weight"].type.name == "F16"
    rc = cli_main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "x.gguf"), "-q"])
    assert rc == 1 and f"{tmp_path / 'nowhere'}: no such folder (expected a checkpoint folder" in capsys.readouterr().err
    rc = cli_main(["convert", str(out), str(tmp_path / "x.gguf"), "-q"])  # a file where the folder should be
    assert rc == 1 and f"{out}: not a folder (expected a checkpoint folder" in capsys.readouterr().err
    # the q2 mix keeps the embedding in F16 unless --token-embd-q8 asks for Q8_0 (the demo model's choice)
    for flag, want in (([], "F16"), (["--token-embd-q8"], "Q8_0")):
        out = tmp_path / f"q2{len(flag)}.gguf"
        assert cli_main(["convert", small_f32["hf"], str(out), "--types", "q2", "-q", *flag]) == 0
        capsys.readouterr()
        m = DS4Model(out)
        assert m.tensors["token_embd.weight"].type.name == want
        assert m.tensors["blk.1.ffn_gate_exps.weight"].type.name == "IQ2_XXS"
        assert m.tensors["output.weight"].type.name == "Q8_0"


def test_output_path_checks_happen_before_work(small_f32, tmp_path, capsys):
    hf = small_f32["hf"]
    # a folder, a missing folder, an existing file without --force, and an input file: all refused at once
    rc = cli_main(["convert", hf, str(tmp_path), "-q"])
    assert rc == 1 and "is a folder" in capsys.readouterr().err
    rc = cli_main(["convert", hf, str(tmp_path / "no" / "such" / "o.gguf"), "-q"])
    assert rc == 1 and "does not exist" in capsys.readouterr().err and not (tmp_path / "no").exists()
    existing = tmp_path / "keep.gguf"
    existing.write_bytes(b"precious")
    rc = cli_main(["convert", hf, str(existing), "-q"])
    assert rc == 1 and "already exists (use --force" in capsys.readouterr().err
    assert existing.read_bytes() == b"precious"
    rc = cli_main(["convert", hf, str(Path(hf) / "model.safetensors"), "-q", "--force"])
    assert rc == 1 and "is one of the input files" in capsys.readouterr().err
    rc = cli_main(["convert", hf, str(existing), "-q", "--force", "--types", "f16"])
    assert rc == 0 and DS4Model(existing).config.n_layer == 3


@pytest.mark.parametrize("argv,name,what", [
    (["{hf}", ""], "out", "the path of the .gguf file to write"),
    (["{hf}", "  "], "out", "the path of the .gguf file to write"),
    (["", "{out}"], "hf_dir", "the checkpoint folder to read"),
])
def test_an_empty_path_is_a_usage_error(argv, name, what, small_f32, tmp_path, capsys, monkeypatch):
    # Path("") is the current folder: it was named as "." (a folder) instead of the empty argument
    monkeypatch.chdir(tmp_path)
    read = []
    monkeypatch.setattr("ds4tui.commands.convert.convert", lambda *a, **k: read.append(a))
    argv = [a.format(hf=small_f32["hf"], out=tmp_path / "o.gguf") for a in argv]
    rc = cli_main(["convert", *argv, "-q"])
    out = capsys.readouterr()
    assert rc == 2 and out.out == "" and read == [] and list(tmp_path.iterdir()) == []
    assert out.err == (f"ds4tui convert: error: argument {name}: expected {what}, found an empty one; give it, e.g. "
                       f"ds4tui convert HF_DIR model.gguf\n")


def test_sigterm_leaves_no_partial_file(small_f32, tmp_path):
    """kill/timeout (SIGTERM) unwinds like Ctrl-C: the temporary .part file is removed."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "t.gguf"
    p = subprocess.Popen([sys.executable, "-m", "ds4tui", "convert", small_f32["hf"], str(out), "--types", "q2"],
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("t.gguf.*.part")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert list(tmp_path.glob("t.gguf.*.part")), "conversion never started writing"
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 143 and "interrupted" in err  # 128 + SIGTERM, as a shell reports it
    assert list(tmp_path.iterdir()) == []


def test_a_killed_converters_part_file_is_removed_by_the_next_run(small_f32, tmp_path):
    """SIGKILL leaves no chance to clean up: the next conversion to the same output removes the
    .part files of converters that no longer run (and leaves a running one's alone)."""
    import os
    import subprocess

    from ds4tui.engine import convert as cv

    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "t.gguf"
    stale = tmp_path / f"t.gguf.{dead.pid}.x1y2.part"
    alive = tmp_path / f"t.gguf.{os.getppid()}.a1b2.part"
    other = tmp_path / "u.gguf.1.zz.part"
    for p in (stale, alive, other):
        p.write_bytes(b"partial")
    assert cv.remove_stale_parts(out) == [stale]
    assert not stale.exists() and alive.exists() and other.exists()


def test_checkpoint_tokenizer_json_is_an_input_and_devices_are_never_replaced(small_f32, tmp_path, capsys):
    hf = small_f32["hf"]
    tok = Path(hf) / "tokenizer.json"
    before = tok.read_bytes()
    rc = cli_main(["convert", hf, str(tok), "-q", "--force"])
    assert rc == 1 and "is one of the input files" in capsys.readouterr().err
    assert tok.read_bytes() == before
    import os

    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    rc = cli_main(["convert", hf, str(fifo), "-q", "--force"])
    assert rc == 1 and "is not a regular file" in capsys.readouterr().err
    assert fifo.is_fifo()


def test_write_errors_name_the_output(small_f32, tmp_path, capsys, monkeypatch):
    """OS errors (read-only folder, disk full) become one line naming the output (root ignores
    folder modes, so the errors are injected)."""
    import errno

    from ds4tui.engine import convert as cv

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cv.tempfile, "mkstemp", refuse)
    rc = cli_main(["convert", small_f32["hf"], str(tmp_path / "o.gguf"), "-q"])
    assert rc == 1 and f"{tmp_path / 'o.gguf'}: cannot write in {tmp_path}: Permission denied" in capsys.readouterr().err
    monkeypatch.undo()

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cv.GGUFWriter, "write_tensor_data", full)
    rc = cli_main(["convert", small_f32["hf"], str(tmp_path / "o.gguf"), "-q"])
    assert rc == 1 and f"{tmp_path / 'o.gguf'}: cannot write: the disk is full (" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

    def short(self, *a, **k):  # how numpy's tofile reports a full disk: no errno, two numbers
        raise OSError("344064 requested and 2464 written")

    monkeypatch.setattr(cv.GGUFWriter, "write_tensor_data", short)
    monkeypatch.setattr("shutil.disk_usage", lambda p: type("U", (), {"free": 2464})())
    rc = cli_main(["convert", small_f32["hf"], str(tmp_path / "o.gguf"), "-q"])
    err = capsys.readouterr().err
    assert rc == 1 and f"cannot write: the disk is full (2464 bytes free in {tmp_path})" in err, err
    assert list(tmp_path.iterdir()) == []


def test_no_overwrite_is_atomic(small_f32, tmp_path):
    """Without --force an output that appears while converting is not replaced (hard-link commit)."""
    from ds4tui.engine import convert as cv

    out = tmp_path / "race.gguf"
    real = cv.write_model_metadata

    def sneaky(w, *a, **k):  # another writer creates the file after the up-front check
        out.write_bytes(b"theirs")
        return real(w, *a, **k)

    cv.write_model_metadata = sneaky
    try:
        with pytest.raises(ConversionError, match="was created by someone else while converting"):
            convert(small_f32["hf"], out, types="f16")
    finally:
        cv.write_model_metadata = real
    assert out.read_bytes() == b"theirs" and list(tmp_path.iterdir()) == [out]


def _valid_blocks(rng: np.random.Generator, shape: tuple[int, ...], qt) -> np.ndarray:
    """Random GGML bytes of ``qt`` (IQ2_XXS or Q2_K) for ``shape`` whose block scales are finite (0.01)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

    block, size = GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, (int(np.prod(shape)) // block, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    for at in ((0,) if qt == QT.IQ2_XXS else (size - 4, size - 2)):  # IQ2_XXS: d first; Q2_K: d, dmin last
        b[:, at:at + 2] = d
    return b.reshape(-1)


def test_support_writer_copies_encoded_experts_byte_for_byte(tmp_path):
    """A drafter whose routed experts stay at an earlier file's q2 bytes while the rest was trained on:
    the experts come out as the very bytes read from that file (no re-quantisation), everything
    else as the q2 mix writes its float weights."""
    from gguf import GGMLQuantizationType as QT

    from ds4tui.devtools.make_test_model import random_weight, support_params, tiny_config
    from ds4tui.engine import layout as L
    from ds4tui.engine.convert import choose_type, encode_tensor, write_support_gguf
    from ds4tui.engine.gguf_model import SupportModel

    c, params = tiny_config(), support_params(tiny_config())
    specs = L.support_tensor_specs(c, 3, 3, 32)
    routed = [s for s in specs if s.types == L.ROUTED_TYPES]
    assert len(routed) == 9
    rng = np.random.default_rng(0)
    first = {s.name: (choose_type(s, "q2"), _valid_blocks(rng, s.shape, choose_type(s, "q2"))) for s in routed}
    weights = {s.name: random_weight(s, rng, c) for s in specs}
    write_support_gguf(tmp_path / "a.gguf", c, params, lambda s: weights[s.name], types="q2", encoded=first)
    a = SupportModel(tmp_path / "a.gguf", c).require_compatible()
    kept = {s.name: (a.tensors[s.name].type, a.tensors[s.name].raw_bytes()) for s in routed}
    healed = {s.name: w * 1.5 for s, w in ((s, weights[s.name]) for s in specs)}
    asked = []
    write_support_gguf(tmp_path / "b.gguf", c, params, lambda s: asked.append(s.name) or healed[s.name], types="q2",
                       encoded=kept)
    b = SupportModel(tmp_path / "b.gguf", c).require_compatible()
    assert not set(asked) & set(kept) and len(asked) == len(specs) - 9
    for s in routed:
        assert b.tensors[s.name].type == first[s.name][0] == (QT.Q2_K if "down" in s.name else QT.IQ2_XXS)
        assert np.array_equal(b.tensors[s.name].raw_bytes(), first[s.name][1])
    for name in ("mtp.0.attn_q_a.weight", "mtp.2.markov_head.markov_w1.weight", "mtp.1.hc_ffn_fn.weight"):
        info = b.tensors[name]
        want = encode_tensor(healed[name], info.type, name).reshape(-1).view(np.uint8)
        assert np.array_equal(info.raw_bytes(), want), name

    gate = "mtp.0.ffn_gate_exps.weight"
    with pytest.raises(ConversionError, match=f"encoded tensor '{gate}': type Q2_K, but --types q2 writes it as IQ2_XXS"):
        write_support_gguf(tmp_path / "c.gguf", c, params, lambda s: weights[s.name], types="q2",
                           encoded={gate: (QT.Q2_K, first[gate][1])})
    with pytest.raises(ConversionError, match=f"encoded tensor '{gate}': 100 bytes, expected"):
        write_support_gguf(tmp_path / "c.gguf", c, params, lambda s: weights[s.name], types="q2",
                           encoded={gate: (QT.IQ2_XXS, first[gate][1][:100])})
    with pytest.raises(ConversionError, match="encoded tensor 'blk.0.ffn_gate_exps.weight' is not a tensor"):
        write_support_gguf(tmp_path / "c.gguf", c, params, lambda s: weights[s.name], types="q2",
                           encoded={"blk.0.ffn_gate_exps.weight": first[gate]})
    assert not (tmp_path / "c.gguf").exists()
