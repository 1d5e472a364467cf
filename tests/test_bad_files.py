"""Bad input gets a specific error naming the file, the key or tensor, the expected and found values."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

from ds4tui.cli import main as cli_main
from ds4tui.devtools import make_test_model as mtm
from ds4tui.engine import gguf_model as gm
from ds4tui.engine import layout as L
from ds4tui.engine.gguf_model import DS4Model, SupportModel

from gguf_edit import rewrite, to_dflash


@pytest.fixture(scope="module")
def model(tiny_q2) -> str:
    return tiny_q2["model"]


def _expect(path, exc_type, *fragments):
    with pytest.raises(exc_type) as ei:
        DS4Model(path)
    msg = str(ei.value)
    assert str(path) in msg
    for f in fragments:
        assert f in msg, (f, msg)
    return ei.value


def test_a_short_file_is_named_for_what_it_is(tmp_path):
    """A few bytes of text are not a GGUF; a few bytes that begin as one are a truncated GGUF."""
    text = tmp_path / "notes.gguf"
    text.write_bytes(b"hello\n")
    _expect(text, gm.GGUFFormatError, "not a GGUF file: 6 bytes beginning b'hell'")
    head = tmp_path / "head.gguf"
    head.write_bytes(b"GGUF\x03")
    _expect(head, gm.TruncatedFileError, "file is truncated: 5 bytes, a GGUF header needs at least 24 (a download or "
            "copy that stopped early?): re-download or re-convert it")
    # the magic and version whole, the tensor and metadata counts cut: the same short header, not a
    # 16-byte "string or array" read at offset 8 (8 to 15 bytes) or a read up to offset 24 (16 to 23)
    for n in (8, 12, 16, 23):
        cut = tmp_path / f"head{n}.gguf"
        cut.write_bytes((b"GGUF\x03\x00\x00\x00" + bytes(range(1, 17)))[:n])
        _expect(cut, gm.TruncatedFileError, f"file is truncated: {n} bytes, a GGUF header needs at least 24 (a "
                "download or copy that stopped early?): re-download or re-convert it")


def test_truncated_in_tensor_data(model, tmp_path):
    data = open(model, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    e = _expect(cut, gm.TruncatedFileError, "file is truncated or damaged: tensor", "needs bytes",
                f"the file has {len(data) - 1000} bytes (a download or copy that stopped early?): re-download or "
                f"re-convert it")
    assert isinstance(e, gm.GGUFFormatError)


def test_truncated_in_header(model, tmp_path):
    cut = tmp_path / "head.gguf"
    cut.write_bytes(open(model, "rb").read(5000))
    _expect(cut, gm.TruncatedFileError, "file is truncated")
    tiny = tmp_path / "tiny.gguf"
    tiny.write_bytes(b"GGU")
    _expect(tiny, gm.TruncatedFileError, "3 bytes")


def _patched(model, dst, offset: int, value: bytes):
    data = bytearray(open(model, "rb").read())
    data[offset : offset + len(value)] = value
    dst.write_bytes(bytes(data))
    return dst, len(data)


def test_absurd_header_counts_are_not_called_truncation(model, tmp_path, capsys):
    """A full-length file whose tensor or metadata count is damaged: the message gives the count, the
    file size and the per-entry minimum, not a read offset far past the end."""
    n_kv = int.from_bytes(open(model, "rb").read(24)[16:24], "little")
    n_tensors = int.from_bytes(open(model, "rb").read(24)[8:16], "little")
    flip, size = _patched(model, tmp_path / "m_flip.gguf", 8, b"\xff" * 8)
    e = _expect(flip, gm.GGUFFormatError,
                f"the GGUF header says {2**64 - 1} tensors and {n_kv} metadata entries, more than a file of "
                f"{size} bytes can hold (each tensor needs at least 24 bytes of header, each metadata entry "
                f"at least 13; these need {24 + (2**64 - 1) * 24 + n_kv * 13})",
                "the header is damaged, the file is cut short, or this is not a GGUF file; re-download or re-convert it")
    assert not isinstance(e, gm.TruncatedFileError)
    kv, _ = _patched(model, tmp_path / "kv.gguf", 16, (2**32 - 1).to_bytes(8, "little"))
    _expect(kv, gm.GGUFFormatError, f"says {n_tensors} tensors and {2**32 - 1} metadata entries")
    rc = cli_main(["inspect", str(flip)])
    err = capsys.readouterr().err
    assert rc == 1 and f"{flip}: the GGUF header says {2**64 - 1} tensors" in err and "truncated" not in err


def test_absurd_string_and_array_lengths(model, tmp_path):
    """A damaged length of a key string, a string array or a scalar array is named with the
    offset and the size it asks for; the file may as well be cut short there, so both are said."""
    r = gm.open_gguf(model)
    size = len(r.data)
    key, _ = _patched(model, tmp_path / "key.gguf", 24, b"\xff" * 8)  # the first metadata key's length
    _expect(key, gm.TruncatedFileError,
                f"file is truncated or its header is damaged: the GGUF header asks for a string or array of {2**64 - 1} elements ({2**64 - 1} bytes) at offset 32, "
                f"more than a file of {size} bytes can hold; re-download or re-convert it")
    for name, what in (("tokenizer.ggml.tokens", "an array of 4294967296 strings (at least 34359738368 bytes)"),
                       ("tokenizer.ggml.token_type", "a string or array of 4294967296 elements (17179869184 bytes)")):
        f = r.fields[name]
        alen_at = f.offset + 8 + len(name) + 4 + 4  # key length, key, value type, element type
        assert int.from_bytes(r.data[alen_at : alen_at + 8].tobytes(), "little") == len(f.data)
        bad, _ = _patched(model, tmp_path / "arr.gguf", alen_at, (2**32).to_bytes(8, "little"))
        _expect(bad, gm.TruncatedFileError, f"the GGUF header asks for {what} at offset {alen_at + 8}, "
                f"more than a file of {size} bytes can hold")


def test_wrong_magic_and_version(tmp_path, model):
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGML" + open(model, "rb").read(100)[4:])
    _expect(bad, gm.GGUFFormatError, "wrong magic: expected b'GGUF', found b'GGML'")
    v2 = tmp_path / "v2.gguf"
    head = bytearray(open(model, "rb").read(100))
    head[4:8] = (2).to_bytes(4, "little")
    v2.write_bytes(bytes(head))
    _expect(v2, gm.GGUFFormatError, "unsupported GGUF version: expected 3, found 2")


def test_missing_file_and_directory(tmp_path):
    _expect(tmp_path / "nope.gguf", gm.ModelFileError, "no such file")
    _expect(tmp_path, gm.ModelFileError, "is a directory")


def test_a_pipe_or_a_device_is_refused_without_reading_it(tmp_path):
    """A named pipe given as a model blocked the open until something wrote to it (a hang); a device is
    no model either: both are refused by what they are, before any read."""
    import os

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    _expect(fifo, gm.ModelFileError, "expected a .gguf file, found a pipe (FIFO)")
    _expect("/dev/null", gm.ModelFileError, "expected a .gguf file, found a character device")


def test_wrong_architecture(model, tmp_path):
    p = rewrite(model, tmp_path / "arch.gguf", arch="llama")
    _expect(p, gm.ArchitectureError, "general.architecture: expected 'deepseek4', found 'llama'")


def test_support_file_given_as_model_says_so(tiny_q2):
    _expect(tiny_q2["support"], gm.ArchitectureError, "found 'deepseek4-dspark'", "pass it with --mtp")
    with pytest.raises(gm.ArchitectureError, match="this is a target model"):
        SupportModel(tiny_q2["model"], tiny_q2["config"])


def test_missing_key(model, tmp_path):
    p = rewrite(model, tmp_path / "nokey.gguf", drop_keys=["deepseek4.expert_count"])
    e = _expect(p, gm.MissingKeyError, "metadata key 'deepseek4.expert_count': missing (expected u32)")
    assert e.key == "deepseek4.expert_count"


def test_wrong_key_type(model, tmp_path):
    p = rewrite(model, tmp_path / "ktype.gguf", set_keys={"deepseek4.block_count": (6, V.INT32, None)})
    _expect(p, gm.KeyTypeError, "'deepseek4.block_count': wrong GGUF type: expected u32, found INT32")
    p = rewrite(model, tmp_path / "ktype2.gguf",
                set_keys={"deepseek4.swiglu_clamp_exp": ([10] * 6, V.ARRAY, V.INT32)})
    _expect(p, gm.KeyTypeError, "'deepseek4.swiglu_clamp_exp': wrong GGUF type: expected f32[], found array of INT32")


def test_bad_key_values(model, tmp_path):
    p = rewrite(model, tmp_path / "gate.gguf", set_keys={"deepseek4.expert_gating_func": (2, V.UINT32, None)})
    _expect(p, gm.KeyValueError, "'deepseek4.expert_gating_func': expected 4 (sqrt-softplus), found 2")
    p = rewrite(model, tmp_path / "used.gguf", set_keys={"deepseek4.expert_used_count": (20, V.UINT32, None)})
    _expect(p, gm.KeyValueError, "'deepseek4.expert_used_count': expected <= expert_count 16, found 20")
    p = rewrite(model, tmp_path / "ratios.gguf",
                set_keys={"deepseek4.attention.compress_ratios": ([0, 0, 4], V.ARRAY, V.INT32)})
    _expect(p, gm.KeyValueError, "expected at least 6 entries (block_count), found 3")
    p = rewrite(model, tmp_path / "ctx0.gguf", set_keys={"deepseek4.context_length": (0, V.UINT64, None)})
    _expect(p, gm.KeyValueError, "'deepseek4.context_length': expected a positive value, found 0")
    p = rewrite(model, tmp_path / "vocab.gguf", set_keys={"deepseek4.vocab_size": (129000, V.UINT32, None)})
    _expect(p, gm.KeyValueError, "'tokenizer.ggml.tokens': expected 129000 entries (deepseek4.vocab_size), found 129280")


def test_missing_tensor(model, tmp_path):
    p = rewrite(model, tmp_path / "notensor.gguf", drop_tensors=["blk.3.attn_kv.weight"])
    e = _expect(p, gm.MissingTensorError, "tensor 'blk.3.attn_kv.weight': missing (KV projection; expected numpy "
                                          "shape [128, 256], GGUF ne [256, 128])")
    assert e.tensor == "blk.3.attn_kv.weight"


def test_wrong_dims(model, tmp_path):
    p = rewrite(model, tmp_path / "dims.gguf",
                replace_tensors={"blk.3.attn_sinks.weight": (np.zeros(4, np.float32), None)})
    _expect(p, gm.TensorShapeError, "tensor 'blk.3.attn_sinks.weight': wrong dims: expected numpy shape [8] "
                                    "(GGUF ne [8]), found [4] (GGUF ne [4])")


def test_wrong_type(model, tmp_path):
    p = rewrite(model, tmp_path / "type.gguf",
                replace_tensors={"blk.0.ffn_gate_tid2eid.weight": (np.zeros((129280, 6), np.float32), None)})
    _expect(p, gm.TensorTypeError, "tensor 'blk.0.ffn_gate_tid2eid.weight': wrong type: expected index (I32), found F32")
    from ds4tui.engine.quants import quantize

    q = quantize(np.ones((256, 256), np.float32), T.Q8_0)
    p = rewrite(model, tmp_path / "type2.gguf", replace_tensors={"blk.2.attn_compressor_kv.weight": (q, T.Q8_0)})
    _expect(p, gm.TensorTypeError, "tensor 'blk.2.attn_compressor_kv.weight': wrong type: expected float "
                                   "(F32/F16/BF16), found Q8_0")


def test_gate_up_type_mismatch(model, tmp_path):
    from ds4tui.engine.quants import quantize

    q = quantize(np.ones((16, 256, 256), np.float32), T.Q8_0)
    p = rewrite(model, tmp_path / "gu.gguf", replace_tensors={"blk.4.ffn_up_exps.weight": (q, T.Q8_0)})
    _expect(p, gm.TensorTypeError, "'blk.4.ffn_up_exps.weight': wrong type: expected IQ2_XXS (the type of "
                                   "blk.4.ffn_gate_exps.weight; routed gate and up must match), found Q8_0")


def test_nonfinite_target_weight_when_checked(model, tmp_path):
    bad = np.ones(256, np.float32)
    bad[7] = np.nan
    p = rewrite(model, tmp_path / "nan.gguf", replace_tensors={"blk.1.ffn_norm.weight": (bad, None)})
    DS4Model(p)  # a full NaN scan of an 80 GB target is opt-in (inspect --check-finite)
    with pytest.raises(gm.NonFiniteError, match=r"'blk\.1\.ffn_norm\.weight': 1 non-finite"):
        DS4Model(p, check_finite=True)


# ---- support files ------------------------------------------------------------------------

def _support(tmp_path, name, **overrides):
    c = mtm.tiny_config()
    return mtm.write_support(tmp_path / name, c, 0, types="f16", **overrides)


def _reasons(s: SupportModel) -> str:
    return "\n".join(p.message for p in s.problems)


def test_support_expert_count_mismatch(tiny_q2, tmp_path):
    p = _support(tmp_path, "experts.gguf", n_expert=8)
    s = SupportModel(p, tiny_q2["config"])
    assert not s.compatible
    assert "expert count: support has 8 experts (mtp.0.ffn_gate_inp.weight), target deepseek4.expert_count = 16" \
        in _reasons(s)
    assert "expert count: support metadata 'dspark.expert_count' = 8, target has 16" in _reasons(s)
    c = s.counts()
    assert c["invalid"] > 0 and c["metadata_errors"] == 1  # tensors disagree; so does the metadata key
    with pytest.raises(gm.SupportInvalidError) as ei:
        s.require_compatible()
    assert str(p) in str(ei.value) and "support has 8 experts" in str(ei.value)


def test_support_hidden_size_mismatch(tiny_q2, tmp_path):
    p = _support(tmp_path, "hidden.gguf", n_embd=512)
    s = SupportModel(p, tiny_q2["config"])
    assert "hidden size: support has 512 (mtp.0.attn_norm.weight), target deepseek4.embedding_length = 256" \
        in _reasons(s)
    assert not s.compatible


def test_support_vocab_mismatch(tiny_q2, tmp_path):
    p = _support(tmp_path, "vocab.gguf", n_vocab=1000)
    s = SupportModel(p, tiny_q2["config"])
    assert "vocab: support has 1000 rows (mtp.2.markov_head.markov_w1.weight), target deepseek4.vocab_size = 129280" \
        in _reasons(s)


def test_support_capture_layer_out_of_range(tiny_q2, tmp_path):
    p = rewrite(tiny_q2["support"], tmp_path / "cap.gguf",
                set_keys={"dspark.target_layer_ids": ([3, 4, 6], V.ARRAY, V.UINT32)})
    s = SupportModel(p, tiny_q2["config"])
    assert "metadata key 'dspark.target_layer_ids': capture layer 6 expected 0..5 (< target block_count 6)" in _reasons(s)
    assert s.counts()["metadata_errors"] == 1 and not s.compatible


def test_support_noise_token_out_of_range(tiny_q2, tmp_path):
    p = rewrite(tiny_q2["support"], tmp_path / "noise.gguf",
                set_keys={"dspark.noise_token_id": (129280, V.UINT32, None)})
    s = SupportModel(p, tiny_q2["config"])
    assert "metadata key 'dspark.noise_token_id': noise token id expected 0..129279 (< target vocab 129280), " \
           "found 129280" in _reasons(s)


def test_support_block_size_and_missing_tensor(tiny_q2, tmp_path):
    p = rewrite(tiny_q2["support"], tmp_path / "block.gguf", set_keys={"dspark.block_size": (17, V.UINT32, None)},
                drop_tensors=["mtp.1.attn_kv.weight"])
    s = SupportModel(p, tiny_q2["config"])
    c = s.counts()
    assert (c["metadata_errors"], c["missing"], c["tensors"]) == (1, 1, 80)
    assert "block size expected 1..16, found 17" in _reasons(s)
    assert "tensor 'mtp.1.attn_kv.weight': missing" in _reasons(s)


def test_support_nan_weights_refused(tiny_q2, tmp_path):
    bad = np.ones(256, np.float32)
    bad[[3, 9]] = [np.nan, np.inf]
    p = rewrite(tiny_q2["support"], tmp_path / "nan.gguf", replace_tensors={"mtp.1.attn_norm.weight": (bad, None)})
    s = SupportModel(p, tiny_q2["config"])
    assert s.counts()["nonfinite"] == 1
    assert "tensor 'mtp.1.attn_norm.weight': 2 non-finite (NaN/Inf) values in F32 data" in _reasons(s)
    assert s.summary_line().endswith("nonfinite=1")


def test_dflash_names_are_accepted(tiny_q2, tmp_path):
    """llama.cpp's DSpark GGUF naming (spec dspark.md §12) maps onto the same 81 tensors."""
    s = SupportModel(to_dflash(tiny_q2["support"], tmp_path / "dflash.gguf"), tiny_q2["config"])
    assert s.compatible, _reasons(s)
    assert s.meta.target_layer_ids == (3, 4, 5)
    assert s.counts()["markov_rank"] == 32 and s.present == 81


def test_inspect_reports_bad_files(tiny_q2, tmp_path, capsys):
    p = _support(tmp_path, "experts.gguf", n_expert=8)
    rc = cli_main(["inspect", tiny_q2["model"], "--mtp", str(p)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "verdict       NOT compatible" in out and "support has 8 experts" in out
    # the memory plan leaves it out and says why: a support model was given, and it is not compatible
    assert "(the support model given is NOT compatible: " in out and "no support model given" not in out
    rc = cli_main(["inspect", tiny_q2["model"], "--mtp", str(p), "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 1 and obj["ok"] is False and obj["support"]["compatible"] is False
    junk = tmp_path / "junk.gguf"
    shutil.copyfile(__file__, junk)
    rc = cli_main(["inspect", str(junk)])
    err = capsys.readouterr().err
    assert rc == 1 and "ds4tui inspect: error:" in err and "wrong magic" in err and str(junk) in err


def test_inspect_names_mtp_and_says_what_a_bare_or_empty_support_file_lacks(tiny_q2, tmp_path, capsys):
    """A GGUF without general.architecture was "found 'None'", an empty file "truncated: 0 bytes", and
    inspect's errors for the --mtp file named neither the flag nor what it expects (generate, chat and
    bench did)."""
    bare = tmp_path / "bare.gguf"
    bare.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))  # GGUF v3: no tensors, no keys
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    rc = cli_main(["inspect", tiny_q2["model"], "--mtp", str(bare)])
    assert (rc, capsys.readouterr().err) == (
        1, f"ds4tui inspect: error: {bare}: general.architecture: expected 'deepseek4-dspark' or 'dflash', the key "
           f"is missing (argument --mtp: expected a DSpark support GGUF; check the path)\n")
    rc = cli_main(["inspect", str(bare), "--mtp", str(bare)])  # the same file: MODEL's load fails first
    err = capsys.readouterr().err
    assert rc == 1 and "(argument --mtp" not in err and "general.architecture" in err
    rc = cli_main(["inspect", tiny_q2["model"], "--mtp", str(empty), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["error_type"] == "TruncatedFileError" and out["error"] == (
        f"{empty}: the file is empty (0 bytes): a GGUF header needs at least 24 bytes (a download or copy that "
        f"stopped early?): re-download or re-convert it (argument --mtp)")


def test_check_finite_lists_every_bad_tensor(model, tmp_path):
    bad = np.ones(256, np.float32)
    bad[0] = np.inf
    p = rewrite(model, tmp_path / "nan2.gguf", replace_tensors={"blk.1.ffn_norm.weight": (bad, None),
                                                               "blk.4.attn_norm.weight": (bad, None)})
    with pytest.raises(gm.NonFiniteError) as ei:
        DS4Model(p, check_finite=True)
    assert "'blk.1.ffn_norm.weight': 1 non-finite" in str(ei.value) and "'blk.4.attn_norm.weight': 1" in str(ei.value)


def test_inspect_ctx_must_be_positive(tiny_q2, capsys):
    with pytest.raises(SystemExit) as ei:
        cli_main(["inspect", tiny_q2["model"], "--ctx", "0"])
    assert ei.value.code == 2 and "expected a positive integer, found 0" in capsys.readouterr().err
    rc = cli_main(["inspect", tiny_q2["model"], "--ctx", "2000000", "--json"])
    assert rc == 2 and "argument --ctx: expected 1..1048576" in capsys.readouterr().err


def test_check_finite_sees_nan_block_scales(model, tmp_path):
    """A NaN f16 scale makes a whole Q8_0 / Q2_K / IQ2_XXS block NaN; the scan reads the scales."""
    r = gm.open_gguf(model)
    edits = {}
    for name, off in (("blk.0.attn_q_a.weight", 0), ("blk.0.ffn_down_exps.weight", 82),
                      ("blk.0.ffn_gate_exps.weight", 0)):
        t = next(t for t in r.tensors if t.name == name)
        data = np.array(t.data)
        flat = data.reshape(-1)
        flat[off : off + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
        edits[name] = (data, T(int(t.tensor_type)))
    p = rewrite(model, tmp_path / "scales.gguf", replace_tensors=edits)
    with pytest.raises(gm.NonFiniteError) as ei:
        DS4Model(p, check_finite=True)
    msg = str(ei.value)
    assert "'blk.0.attn_q_a.weight': 1 non-finite (NaN/Inf) block scales in Q8_0 data" in msg
    assert "'blk.0.ffn_gate_exps.weight': 1" in msg and "'blk.0.ffn_down_exps.weight': 1" in msg


def test_unreadable_file_is_a_clean_error(model, tmp_path, monkeypatch):
    """A file the user may not read (injected: root ignores file modes)."""
    import builtins
    import errno

    real_open = builtins.open
    locked = tmp_path / "locked.gguf"
    shutil.copyfile(model, locked)

    def guarded(file, *a, **k):
        if str(file) == str(locked):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded)
    _expect(locked, gm.ModelFileError, "cannot read: Permission denied")


def test_a_damaged_header_is_called_damaged_with_what_to_do(model, tmp_path):
    """One byte flipped in the header: a metadata string that is not UTF-8, or a tensor offset far past
    the end, is named as damage (not only as a short copy), with what to do."""
    from gguf import GGUFReader

    data = bytearray(open(model, "rb").read())
    r = GGUFReader(model)
    key = next(f for f in r.fields.values() if f.name.startswith("general."))
    name_at = int(key.offset) + 8  # the key's bytes follow its 8-byte length
    bad = bytearray(data)
    bad[name_at] = 0xBB  # not a UTF-8 start byte
    p = tmp_path / "utf8.gguf"
    p.write_bytes(bytes(bad))
    _expect(p, gm.GGUFFormatError, "the GGUF header is damaged: a metadata name or string is not UTF-8 text",
            "byte 0xbb", "re-download or re-convert it")
    t = r.tensors[0]
    off_at = int(t.field.offset) + sum(int(x.nbytes) for x in t.field.parts[:-1])  # the entry's data offset
    bad = bytearray(data)
    bad[off_at + 7] = 0x61  # the offset's top byte: ~7e18 bytes in
    p = tmp_path / "offset.gguf"
    p.write_bytes(bytes(bad))
    _expect(p, gm.TruncatedFileError, "file is truncated or damaged: tensor", "the offset is past the end of the "
            "file, so its header is more likely damaged than the file cut short: re-download or re-convert it")


def test_a_damaged_string_value_is_named_at_open_not_where_it_is_read(model, tmp_path):
    """A flipped byte inside a metadata string's value (general.architecture's): the open names the key
    and the damage, so no command meets it later as a codec error or a traceback."""
    from gguf import GGUFReader

    data = bytearray(open(model, "rb").read())
    f = GGUFReader(model).fields["general.architecture"]
    at = int(f.offset) + sum(int(x.nbytes) for x in f.parts[:-1])  # the value's first byte
    data[at + 1] = 0xFF
    p = tmp_path / "value.gguf"
    p.write_bytes(bytes(data))
    _expect(p, gm.GGUFFormatError, "the GGUF header is damaged: metadata key 'general.architecture' holds a "
            "string that is not UTF-8 text", "byte 0xff", "re-download or re-convert it")


def test_a_flipped_byte_in_a_key_or_tensor_name_is_named_as_damage(model, tmp_path):
    """A flipped byte inside a metadata key's or a tensor's name reads as a key or tensor the file
    lacks: the message names the name one byte away from it and calls the file damaged."""
    from gguf import GGUFReader

    data = bytes(open(model, "rb").read())
    r = GGUFReader(model)
    key = r.fields["deepseek4.block_count"]
    at = int(key.offset) + 8 + len("deepseek4.")  # the key's bytes follow its 8-byte length
    p = tmp_path / "key.gguf"
    p.write_bytes(data[:at] + b"c" + data[at + 1:])  # "block_count" -> "clock_count"
    _expect(p, gm.MissingKeyError, "deepseek4.block_count", "missing (expected",
            "the file has 'deepseek4.clock_count', one byte away from it: the file is damaged (re-download or "
            "re-convert it)")
    t = next(t for t in r.tensors if t.name == "blk.0.attn_norm.weight")
    at = int(t.field.offset) + 8  # the name's bytes follow its 8-byte length
    p = tmp_path / "tensor.gguf"
    p.write_bytes(data[:at] + b"c" + data[at + 1:])  # "blk.0..." -> "clk.0..."
    _expect(p, gm.MissingTensorError, "blk.0.attn_norm.weight", "the file has 'clk.0.attn_norm.weight', one byte "
            "away from it")


def test_a_damaged_model_names_its_argument_without_pointing_at_the_path(model, tmp_path, capsys):
    """generate on a file with a flipped byte in a key name: the damage message says what to do; the
    argument that named the file follows it, without "check the path", which would point elsewhere."""
    from gguf import GGUFReader

    data = bytes(open(model, "rb").read())
    at = int(GGUFReader(model).fields["deepseek4.block_count"].offset) + 8 + len("deepseek4.")
    p = tmp_path / "key.gguf"
    p.write_bytes(data[:at] + b"c" + data[at + 1:])
    assert cli_main(["generate", str(p), "-p", "hi", "-n", "2"]) == 1
    err = capsys.readouterr().err
    assert err.rstrip().endswith("one byte away from it: the file is damaged (re-download or re-convert it) "
                                 "(argument MODEL)") and "check the path" not in err


def test_a_flipped_byte_in_a_tokenizer_key_is_named_as_damage(model, tmp_path):
    """The tokenizer's keys are read by the tokenizer: a flipped byte there is named as damage too."""
    from gguf import GGUFReader

    from ds4tui.engine.tokenizer import Tokenizer, TokenizerError

    data = bytes(open(model, "rb").read())
    at = int(GGUFReader(model).fields["tokenizer.ggml.token_type"].offset) + 8 + len("tokenizer.ggml.")
    p = tmp_path / "tok.gguf"
    p.write_bytes(data[:at] + b"T" + data[at + 1:])  # "token_type" -> "Token_type"
    with pytest.raises(TokenizerError, match="missing GGUF key 'tokenizer.ggml.token_type'.*the file has "
                                             "'tokenizer.ggml.Token_type', one byte away from it: the file is damaged"):
        Tokenizer.from_gguf(p)


def test_a_flipped_byte_in_a_support_key_is_named_as_damage(tiny_q2, tmp_path):
    """A support file whose block-size key has a flipped byte: none of the keys is present, and the
    problem names the key one byte away from one of them."""
    from gguf import GGUFReader

    src = tiny_q2["support"]
    r = GGUFReader(src)
    name = next(k for k in L.SUPPORT_BLOCK_KEYS if k in r.fields)
    at = int(r.fields[name].offset) + 8 + name.rindex("block") + 1
    data = bytes(open(src, "rb").read())
    p = tmp_path / "support_key.gguf"
    flipped = name[:name.rindex("block") + 1] + "L" + name[name.rindex("block") + 2:]
    p.write_bytes(data[:at] + b"L" + data[at + 1:])  # "block_size" -> "bLock_size"
    s = SupportModel(p, tiny_q2["config"])
    assert not s.compatible
    assert f"none of the keys {', '.join(L.SUPPORT_BLOCK_KEYS)} is present; the file has '{flipped}', one byte " \
           f"away from it: the file is damaged" in _reasons(s)


def test_inspect_checks_the_tokenizer_ids_that_generate_reads(model, tmp_path, capsys):
    """inspect passed a model whose eos id is no token (generate then refused it): it reads the
    tokenizer.ggml.* keys as generate does, and names the key, the value and the range."""
    p = rewrite(model, tmp_path / "eos.gguf", set_keys={"tokenizer.ggml.eos_token_id": (4_000_000_000, V.UINT32, None)})
    rc = cli_main(["inspect", str(p)])
    err = capsys.readouterr().err
    assert rc == 1 and err == (f"ds4tui inspect: error: {p}: tokenizer.ggml.eos_token_id 4000000000 is not a token id "
                               f"(0..129279)\n")
    rc = cli_main(["inspect", str(p), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["ok"] is False and out["error_type"] == "TokenizerError"
