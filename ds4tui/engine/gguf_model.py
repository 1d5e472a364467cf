"""Open and validate DS4 target GGUFs and DSpark support GGUFs.

Files are read with the ``gguf`` package's memory-mapped :class:`gguf.GGUFReader`; tensor data is
never copied (each :class:`TensorInfo` holds a view into the map).  Validation follows the layout
tables in :mod:`ds4tui.engine.layout` (spec ds4.md §3, dspark.md §4).

Every failure raises a :class:`ModelFileError` subclass whose message names the file, the key or
tensor, the expected and the found value.  A support file is not rejected by exception: its
problems are collected (:class:`SupportModel.problems`), counted in the ds4-style summary
(``stages block markov_rank tensors missing invalid metadata_errors nonfinite``) and turned into a
compatible / not-compatible verdict, so that a user sees every reason at once.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType
from gguf import GGMLQuantizationType as T

from ds4tui.engine import layout as L
from ds4tui.engine.errors import (  # re-exported: the names this module always had
    ArchitectureError,
    GGUFFormatError,
    KeyTypeError,
    KeyValueError,
    MetadataError,
    MissingKeyError,
    MissingTensorError,
    ModelFileError,
    NonFiniteError,
    SupportInvalidError,
    TensorError,
    TensorShapeError,
    TensorTypeError,
    TruncatedFileError,
)
from ds4tui.engine.layout import DS4Config, MetaKey, MetaType, TensorSpec

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3


# ---- low-level reading ----------------------------------------------------------------------

class _CheckedReader(GGUFReader):
    """GGUFReader that turns out-of-bounds reads into :class:`TruncatedFileError`."""

    def __init__(self, path: str):
        self._path = path
        super().__init__(path, "r")

    def _get(self, offset, dtype, count=1, override_order=None):  # noqa: D401 - gguf internal hook
        nbytes = int(count) * np.dtype(dtype).itemsize
        end = int(offset) + nbytes
        if nbytes > len(self.data):  # only a length read from the header asks for more than one item
            raise TruncatedFileError(self._path, _absurd_length(int(offset), int(count), nbytes, len(self.data)))
        if end > len(self.data):
            raise TruncatedFileError(
                self._path,
                f"file is truncated: a read needs bytes up to offset {end} but the file has "
                f"{len(self.data)} bytes{_CUT}",
            )
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs, raw_type):
        # Arrays of strings (the 129280 tokens and 127741 merges) take ~10 s through the generic
        # per-element path, which makes a numpy view per string.  Same field layout, built from
        # cheap memoryview slices (contents() only calls .tobytes() on them): ~0.2 s.
        if GGUFValueType(int(raw_type)) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        itype = GGUFValueType(int(raw_itype[0]))
        alen = self._get(orig_offs + 4, np.uint64)
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:  # scalar arrays (e.g. token_type): one view, split into plain ndarray rows
            n = int(alen[0])
            arr = np.asarray(self._get(orig_offs + 12, nptype, n))
            parts = [raw_itype, alen, *arr.reshape(n, 1)]
            return 12 + arr.nbytes, parts, list(range(2, 2 + n)), [GGUFValueType.ARRAY, itype]
        if itype != GGUFValueType.STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        mv = memoryview(self.data)
        size = len(mv)
        offs = orig_offs + 12
        count = int(alen[0])
        if count * 8 > size - offs:  # each string is at least its 8-byte length
            raise TruncatedFileError(self._path, _absurd_length(offs, count, count * 8, size, strings=True))
        parts: list = [raw_itype, alen]  # then one part per string (its bytes; lengths are implied)
        append = parts.append
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if offs + 8 > size:
                raise TruncatedFileError(self._path, _string_past_end(offs, 8, size))
            (n,) = unpack(mv, offs)
            offs += 8
            if offs + n > size:
                raise TruncatedFileError(self._path, _string_past_end(offs, n, size))
            append(mv[offs : offs + n])
            offs += n
        return offs - orig_offs, parts, list(range(2, 2 + count)), [GGUFValueType.ARRAY, GGUFValueType.STRING]

    def _build_tensors(self, start_offs, fields):
        size = len(self.data)
        for f in fields:
            _, name_data, _, dims, raw_dtype, offset_tensor = f.parts
            name = bytes(name_data).decode("utf-8", "replace")
            try:
                qtype = T(int(raw_dtype[0]))
            except ValueError:
                raise GGUFFormatError(self._path, f"tensor '{name}': unknown GGML type id {int(raw_dtype[0])}") from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            n = int(np.prod(dims.astype(np.int64)))
            if int(dims[0]) % block != 0:
                raise GGUFFormatError(
                    self._path,
                    f"tensor '{name}': ne[0]={int(dims[0])} is not a multiple of the {qtype.name} block size {block}",
                )
            start = int(start_offs) + int(offset_tensor[0])
            end = start + n * type_size // block
            if end > size:
                # an offset or size far past the end says a damaged header entry, not a short copy
                why = _CUT if start <= size else ("; the offset is past the end of the file, so its header is more "
                                                  "likely damaged than the file cut short: re-download or re-convert it")
                raise TruncatedFileError(
                    self._path,
                    f"file is truncated or damaged: tensor '{name}' needs bytes [{start}, {end}) but the file has "
                    f"{size} bytes{why}",
                )
        return super()._build_tensors(start_offs, fields)


#: The fewest header bytes one tensor entry takes (name length 8, n_dims 4, type 4, data offset 8;
#: an empty name and no dims) and one metadata entry takes (key length 8, value type 4, a 1-byte value).
MIN_TENSOR_INFO_BYTES = 24
MIN_KV_BYTES = 13
#: What to do about a file that ends before its own header says it does.
_CUT = " (a download or copy that stopped early?): re-download or re-convert it"
_DAMAGED = ("the header is damaged, the file is cut short, or this is not a GGUF file; "
            "re-download or re-convert it")


#: String arrays up to this many elements are checked as UTF-8 at open (the tokenizer's vocabulary and
#: merges, 100 000s of strings, are checked by the tokenizer that reads them).
CHECKED_STRING_ARRAY = 4096


def _check_strings(p: Path, reader: GGUFReader) -> None:
    """Every metadata string (and the strings of arrays up to :data:`CHECKED_STRING_ARRAY` long) is
    UTF-8 text, else :class:`GGUFFormatError` naming the key: a flipped byte in a string would
    otherwise fail later, where the value is read, as a codec error."""
    for name, f in reader.fields.items():
        if not f.types or f.types[-1] != GGUFValueType.STRING:
            continue
        if f.types[0] == GGUFValueType.ARRAY and len(f.data) > CHECKED_STRING_ARRAY:
            continue
        for i in f.data:
            try:
                bytes(f.parts[i]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise GGUFFormatError(p, _not_utf8(f"metadata key {name!r} holds a string that is", exc)) from None


def _not_utf8(what: str, exc: UnicodeDecodeError) -> str:
    """The damaged-header message for ``what`` (``"metadata key 'x' holds a string that is"``) and the byte
    that is not UTF-8."""
    return (f"the GGUF header is damaged: {what} not UTF-8 text ({exc.reason}: byte "
            f"0x{exc.object[exc.start]:02x}): re-download or re-convert it")


def _string_past_end(offset: int, nbytes: int, size: int) -> str:
    """A string of a metadata array whose ``nbytes`` at ``offset`` run past the end of a ``size``-byte file."""
    return (f"file is truncated or its header is damaged: a string of a metadata array needs {nbytes} bytes at "
            f"offset {offset}, past the end of the file ({size} bytes); re-download or re-convert it")


def _absurd_length(offset: int, count: int, nbytes: int, size: int, strings: bool = False) -> str:
    what = (f"an array of {count} strings (at least {nbytes} bytes)" if strings
            else f"a string or array of {count} elements ({nbytes} bytes)")
    return (f"file is truncated or its header is damaged: the GGUF header asks for {what} at offset "
            f"{offset}, more than a file of {size} bytes can hold; re-download or re-convert it")


def check_header_counts(path, head: bytes, size: int) -> None:
    """Raise :class:`GGUFFormatError` naming ``path`` when the tensor and metadata counts of a
    GGUF header (``head``: its first 24 bytes, little-endian u64 counts at bytes 8 and 16) ask for
    more header bytes than a file of ``size`` bytes holds (each tensor entry at least
    ``MIN_TENSOR_INFO_BYTES``, each metadata entry at least ``MIN_KV_BYTES``)."""
    n_tensors = int.from_bytes(head[8:16], "little")
    n_kv = int.from_bytes(head[16:24], "little")
    need = 24 + n_tensors * MIN_TENSOR_INFO_BYTES + n_kv * MIN_KV_BYTES
    if need > size:
        raise GGUFFormatError(
            path,
            f"the GGUF header says {n_tensors} tensors and {n_kv} metadata entries, more than a file of "
            f"{size} bytes can hold (each tensor needs at least {MIN_TENSOR_INFO_BYTES} bytes of header, "
            f"each metadata entry at least {MIN_KV_BYTES}; these need {need}): {_DAMAGED}",
        )


#: what DS4Model's architecture error adds when the file is a DSpark support file (a command that
#: takes the support file otherwise than with --mtp says its own)
SUPPORT_GIVEN_AS_MODEL = " (this is a DSpark support file: pass it with --mtp)"


def special_file_kind(p: Path) -> str:
    """What a path that is neither a regular file nor a folder names, in words ("a character device")."""
    import stat

    mode = p.stat().st_mode
    return ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "something that is not a regular file")


def check_readable(path: str | os.PathLike, hint: str = "") -> Path:
    """``path`` as a Path when it names a file that can be opened for reading; else
    :class:`ModelFileError` naming it: no such file, a directory, a special file (a named pipe, a
    device), or the OS's reason it cannot be read, with ``hint`` after the reason (e.g. which flag
    named the path).  The first checks of :func:`open_gguf`, for a command that checks its paths
    before long work."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(p, f"no such file{hint}")
    if p.is_dir():
        raise ModelFileError(p, f"is a directory, expected a .gguf file{hint}")
    if not p.is_file():  # a named pipe would block the open until something writes to it
        raise ModelFileError(p, f"expected a .gguf file, found {special_file_kind(p)}{hint}")
    try:
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise ModelFileError(p, f"cannot read: {exc.strerror or exc}{hint}") from None
    return p


def open_gguf(path: str | os.PathLike) -> GGUFReader:
    """Memory-map a GGUF v3 file with the ``gguf`` package, with precise errors.

    Raises :class:`ModelFileError` (:func:`check_readable`), :class:`GGUFFormatError` /
    :class:`TruncatedFileError` naming the file.
    """
    p = check_readable(path)
    size = p.stat().st_size
    try:
        with open(p, "rb") as fh:
            head = fh.read(24)
    except OSError as exc:
        raise ModelFileError(p, f"cannot read: {exc.strerror or exc}") from None
    if len(head) < 8 and GGUF_MAGIC[:len(head)] != head[:4]:  # a short file that does not begin as a GGUF
        raise GGUFFormatError(p, f"not a GGUF file: {size} bytes beginning {head[:4]!r} (a GGUF begins with b'GGUF')")
    if size == 0:
        raise TruncatedFileError(p, f"the file is empty (0 bytes): a GGUF header needs at least 24 bytes{_CUT}")
    if len(head) < 8:
        raise TruncatedFileError(p, f"file is truncated: {size} bytes, a GGUF header needs at least 24{_CUT}")
    if head[:4] != GGUF_MAGIC:
        raise GGUFFormatError(p, f"wrong magic: expected b'GGUF', found {head[:4]!r} (not a GGUF file)")
    version = int.from_bytes(head[4:8], "little")
    if version != GGUF_VERSION:
        raise GGUFFormatError(p, f"unsupported GGUF version: expected {GGUF_VERSION}, found {version}")
    if len(head) < 24:  # the magic and version are there, the counts are not
        raise TruncatedFileError(p, f"file is truncated: {size} bytes, a GGUF header needs at least 24{_CUT}")
    check_header_counts(p, head, size)
    try:
        reader = _CheckedReader(str(p))
        _check_strings(p, reader)
        return reader
    except ModelFileError:
        raise
    except UnicodeDecodeError as exc:  # a key or string value that is not UTF-8 text: a flipped byte
        raise GGUFFormatError(p, _not_utf8("a metadata name or string is", exc)) from None
    except (ValueError, IndexError, KeyError, OverflowError) as exc:
        raise GGUFFormatError(p, f"the GGUF header is damaged ({exc}): re-download or re-convert it") from None


_INT_TYPES = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
              GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}

#: Accepted GGUF value types per MetaType (spec ds4.md §3.2: what ds4's readers take).
_ACCEPT: dict[MetaType, tuple[set, set | None]] = {
    MetaType.U32: ({GGUFValueType.UINT32}, None),
    MetaType.U64: ({GGUFValueType.UINT32, GGUFValueType.UINT64}, None),
    MetaType.F32: ({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64, GGUFValueType.UINT32, GGUFValueType.INT32}, None),
    MetaType.BOOL: ({GGUFValueType.BOOL}, None),
    MetaType.STR: ({GGUFValueType.STRING}, None),
    MetaType.I32_ARRAY: ({GGUFValueType.ARRAY}, {GGUFValueType.UINT32, GGUFValueType.INT32}),
    MetaType.F32_ARRAY: ({GGUFValueType.ARRAY}, {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}),
}


def _type_name(f) -> str:
    if not f.types:
        return "?"
    if f.types[0] == GGUFValueType.ARRAY:
        return f"array of {f.types[-1].name}" if len(f.types) > 1 else "empty array"
    return f.types[0].name


def field_value(f) -> Any:
    """Python value of a GGUF field (scalar, str, or list)."""
    if f.types and f.types[0] == GGUFValueType.ARRAY and len(f.types) == 1:
        return []
    v = f.contents()
    if isinstance(v, np.generic):
        v = v.item()
    return v


def one_byte_away(name: str, names) -> str:
    """``"; the file has 'OTHER', one byte away from it: …"`` when ``names`` holds a name of the same
    length that differs from ``name`` in one character (a flipped byte of a key or tensor name, which
    would otherwise read as a missing one), else ``""``."""
    for other in names:
        if len(other) == len(name) and other != name and sum(a != b for a, b in zip(other, name)) == 1:
            return (f"; the file has '{other}', one byte away from it: the file is damaged (re-download or "
                    f"re-convert it)")
    return ""


def missing_key(reader: GGUFReader, path, key: str, expected: str) -> MissingKeyError:
    """The error for a metadata key the file lacks: ``missing (expected …)``, and the key one byte away
    from it when the file has one (:func:`one_byte_away`)."""
    return MissingKeyError(path, key, f"missing (expected {expected}){one_byte_away(key, reader.fields)}")


def read_key(reader: GGUFReader, path, mk: MetaKey) -> Any:
    """Read one metadata key with type checking; None when absent and optional."""
    f = reader.fields.get(mk.key)
    if f is None:
        if mk.required:
            raise missing_key(reader, path, mk.key, mk.type.value)
        return None
    outer, inner = _ACCEPT[mk.type]
    if not f.types or f.types[0] not in outer or (inner is not None and len(f.types) > 1 and f.types[-1] not in inner):
        raise KeyTypeError(path, mk.key, f"wrong GGUF type: expected {mk.type.value}, found {_type_name(f)}")
    v = field_value(f)
    if mk.type is MetaType.I32_ARRAY:
        return tuple(int(x) for x in v)
    if mk.type is MetaType.F32_ARRAY:
        return tuple(float(x) for x in v)
    if mk.type is MetaType.F32:
        return float(v)
    if mk.type in (MetaType.U32, MetaType.U64):
        return int(v)
    return v


def _first_key(reader: GGUFReader, keys: Iterable[str]) -> tuple[str | None, Any]:
    for k in keys:
        f = reader.fields.get(k)
        if f is not None:
            return k, f
    return None, None


def context_length_of(path: str | os.PathLike) -> int | None:
    """The context length a DS4 GGUF declares (``deepseek4.context_length``, default 1048576 when
    the key is absent), from its metadata alone, so that ``--ctx`` is checked before any model
    loads; None when the file or the key cannot be read (loading the file then reports why)."""
    try:
        f = open_gguf(path).fields.get(L.ARCH + ".context_length")
        if f is None:
            return DS4Config.__dataclass_fields__["context_length"].default
        v = field_value(f)
        return int(v) if isinstance(v, (int, np.integer)) and int(v) > 0 else None
    except (ModelFileError, OSError, ValueError, TypeError):
        return None


def support_block_size(path: str | os.PathLike) -> int | None:
    """The block size a DSpark support GGUF declares (spec dspark.md §4.1), read from its metadata
    alone, so that options bounded by it are checked before any model loads; None when the file
    or the key cannot be read (loading the file then reports why)."""
    try:
        _, f = _first_key(open_gguf(path), L.SUPPORT_BLOCK_KEYS)
        v = field_value(f) if f is not None else None
        return int(v) if isinstance(v, (int, np.integer)) and 0 < int(v) <= L.MAX_SUPPORT_BLOCK else None
    except (ModelFileError, OSError, ValueError, TypeError):
        return None


def support_draft_vocab_size(path: str | os.PathLike) -> int | None:
    """How many tokens the draft vocabulary of a DSpark support GGUF lists (spec dspark.md §2.6),
    read from its metadata alone, so that ``--draft-vocab N`` is checked before any model loads;
    0 when the support file has no list; None when the file cannot be read as a support GGUF (not a
    GGUF, damaged or cut short, or of another architecture, such as a target model: loading it then
    reports why, which a complaint about its list would hide)."""
    from ds4tui.engine.draft_vocab import KEY

    try:
        reader = open_gguf(path)
        arch = reader.fields.get("general.architecture")
        if arch is None or str(field_value(arch)) not in (L.SUPPORT_ARCH, "dflash"):
            return None
        f = reader.fields.get(KEY)
        return 0 if f is None else len(field_value(f))
    except (ModelFileError, OSError, ValueError, TypeError):
        return None


# ---- tensor table ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a memory-mapped GGUF.

    ``shape`` is numpy order (outermost first), ``ne`` GGUF order; ``offset`` is the absolute
    byte offset of the data in the file; ``data`` is a read-only view into the map (uint8 bytes
    for quantised types, the element dtype for F32/F16/I32).
    """

    name: str
    type: T
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    data: np.ndarray = field(repr=False, compare=False)

    @property
    def ne(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def raw_bytes(self) -> np.ndarray:
        """The tensor's bytes as a flat uint8 view (no copy)."""
        return np.asarray(self.data).reshape(-1).view(np.uint8)


def tensor_table(reader: GGUFReader) -> dict[str, TensorInfo]:
    return {
        t.name: TensorInfo(
            name=t.name,
            type=T(int(t.tensor_type)),
            shape=tuple(int(d) for d in reversed(t.shape.tolist())),
            offset=int(t.data_offset),
            nbytes=int(t.n_bytes),
            data=t.data,
        )
        for t in reader.tensors
    }


def _types_text(types: frozenset) -> str:
    return L.TYPE_CLASS_NAMES.get(types) or "/".join(sorted(t.name for t in types))


def check_tensor(path, spec: TensorSpec, info: TensorInfo | None, names=()) -> None:
    """Raise the specific TensorError if ``info`` does not satisfy ``spec``; a missing tensor's error
    names a tensor of ``names`` one byte away from it (:func:`one_byte_away`)."""
    if info is None:
        raise MissingTensorError(path, spec.name, f"missing ({spec.role}; expected numpy shape {list(spec.shape)}, "
                                                  f"GGUF ne {list(spec.ne)}){one_byte_away(spec.name, names)}")
    if info.shape != spec.shape:
        raise TensorShapeError(path, spec.name, f"wrong dims: expected numpy shape {list(spec.shape)} "
                                                f"(GGUF ne {list(spec.ne)}), found {list(info.shape)} "
                                                f"(GGUF ne {list(info.ne)})")
    if info.type not in spec.types:
        raise TensorTypeError(path, spec.name, f"wrong type: expected {_types_text(spec.types)}, found {info.type.name}")


#: f16 scale fields of quantised blocks: GGML type → (block bytes, byte offsets of f16 scales).
#: A NaN/Inf scale makes its whole block non-finite (spec ds4.md §5 block layouts).
_BLOCK_SCALES = {T.Q8_0: (34, (0,)), T.Q2_K: (84, (80, 82)), T.IQ2_XXS: (66, (0,))}


def nonfinite_count(info: TensorInfo, chunk_bytes: int = 1 << 24) -> int:
    """Number of NaN/Inf values in an F32/F16/BF16 tensor, or of NaN/Inf f16 block scales in a
    Q8_0/Q2_K/IQ2_XXS tensor (0 for other types); scanned in chunks of the memory map."""
    raw = info.raw_bytes()
    if info.type in _BLOCK_SCALES:
        block, offsets = _BLOCK_SCALES[info.type]
        blocks = raw.reshape(-1, block)
        step = max(1, chunk_bytes // block)
        bad = 0
        for i in range(0, blocks.shape[0], step):
            chunk = blocks[i : i + step]
            for off in offsets:
                bits = np.ascontiguousarray(chunk[:, off : off + 2]).view("<u2").reshape(-1)
                bad += int(np.count_nonzero((bits & 0x7C00) == 0x7C00))
        return bad
    # all exponent bits set = Inf or NaN, per IEEE layout of each type
    if info.type == T.F32:
        dt, exp_mask = np.dtype("<u4"), 0x7F800000
    elif info.type == T.F16:
        dt, exp_mask = np.dtype("<u2"), 0x7C00
    elif info.type == T.BF16:
        dt, exp_mask = np.dtype("<u2"), 0x7F80
    else:
        return 0
    mask = dt.type(exp_mask)
    step = (chunk_bytes // dt.itemsize) * dt.itemsize
    bad = 0
    for i in range(0, raw.size, step):
        bad += int(np.count_nonzero((raw[i : i + step].view(dt) & mask) == mask))
    return bad


def _nonfinite_unit(t: T) -> str:
    return f"block scales in {t.name} data" if t in _BLOCK_SCALES else f"values in {t.name} data"


# ---- the target model -----------------------------------------------------------------------

def _validate_config(path, c: DS4Config) -> None:
    """Value checks that keep the engine's assumptions true; names the key and the values."""

    def bad(key: str, msg: str):
        raise KeyValueError(path, L.P + key, msg)

    positive = ["n_layer", "n_embd", "n_vocab", "n_head", "head_dim", "n_rot", "q_lora_rank", "o_lora_rank",
                "o_groups", "n_expert", "n_expert_used", "n_ff_exp", "n_expert_shared", "sliding_window",
                "indexer_n_head", "indexer_head_dim", "indexer_top_k", "hc_count", "hc_sinkhorn_iters",
                "rope_orig_ctx", "context_length"]
    key_of = {mk.field: mk.key[len(L.P):] for mk in L.MODEL_KEYS}
    for name in positive:
        if getattr(c, name) <= 0:
            bad(key_of[name], f"expected a positive value, found {getattr(c, name)}")
    if c.n_head_kv != 1:
        bad("attention.head_count_kv", f"expected 1 (one shared K=V head), found {c.n_head_kv}")
    if c.value_dim != c.head_dim:
        bad("attention.value_length", f"expected {c.head_dim} (= attention.key_length, V = K), found {c.value_dim}")
    if c.n_rot % 2 or c.n_rot > c.head_dim:
        bad("rope.dimension_count", f"expected an even value <= attention.key_length {c.head_dim}, found {c.n_rot}")
    if c.n_rot > c.indexer_head_dim:
        bad("attention.indexer.key_length", f"expected >= rope.dimension_count {c.n_rot}, found {c.indexer_head_dim}")
    if c.n_head % c.o_groups:
        bad("attention.output_group_count", f"expected a divisor of attention.head_count {c.n_head}, found {c.o_groups}")
    if c.n_expert_used > c.n_expert:
        bad("expert_used_count", f"expected <= expert_count {c.n_expert}, found {c.n_expert_used}")
    if c.n_hash_layer > c.n_layer:
        bad("hash_layer_count", f"expected <= block_count {c.n_layer}, found {c.n_hash_layer}")
    if len(c.compress_ratios) < c.n_layer:
        bad("attention.compress_ratios", f"expected at least {c.n_layer} entries (block_count), found {len(c.compress_ratios)}")
    for i, r in enumerate(c.compress_ratios[: c.n_layer]):
        if r < 0:
            bad("attention.compress_ratios", f"entry {i}: expected 0 (SWA), 4 (CSA) or a positive HCA ratio, found {r}")
    if len(c.swiglu_clamp) < c.n_layer:
        bad("swiglu_clamp_exp", f"expected {c.n_layer} entries (block_count), found {len(c.swiglu_clamp)}")
    if c.swiglu_clamp_shexp is not None and len(c.swiglu_clamp_shexp) < c.n_layer:
        bad("swiglu_clamp_shexp", f"expected {c.n_layer} entries (block_count), found {len(c.swiglu_clamp_shexp)}")
    for name in ("rope_freq_base", "rope_scaling_factor", "compress_rope_freq_base", "expert_weights_scale",
                 "rms_eps", "hc_eps", "yarn_beta_fast", "yarn_beta_slow"):
        v = getattr(c, name)
        if not np.isfinite(v) or v <= 0:
            bad(key_of[name], f"expected a finite positive value, found {v}")
    if c.expert_gating_func != L.GATING_SQRT_SOFTPLUS:
        bad("expert_gating_func", f"expected {L.GATING_SQRT_SOFTPLUS} (sqrt-softplus), found {c.expert_gating_func}")
    if c.rope_scaling_type != "yarn":
        bad("rope.scaling.type", f"expected 'yarn', found {c.rope_scaling_type!r}")
    if c.expert_group_count != 0 or c.expert_group_used_count != 0:
        bad("expert_group_count", f"expected absent or 0 (no expert groups), found {c.expert_group_count}/"
                                  f"{c.expert_group_used_count}")


def read_config(reader: GGUFReader, path) -> DS4Config:
    values: dict[str, Any] = {}
    for mk in L.MODEL_KEYS:
        v = read_key(reader, path, mk)
        if v is not None:
            values[mk.field] = v
    cfg = DS4Config(**values)
    _validate_config(path, cfg)  # sees the stored list lengths
    # Longer lists (e.g. the 44-entry compress_ratios with the MTP slot) are cut to n_layer.
    n = cfg.n_layer
    shexp = cfg.swiglu_clamp_shexp
    return dataclasses.replace(cfg, compress_ratios=cfg.compress_ratios[:n], swiglu_clamp=cfg.swiglu_clamp[:n],
                               swiglu_clamp_shexp=shexp[:n] if shexp is not None else None)


class DS4Model:
    """A validated DS4 target GGUF (``general.architecture = deepseek4``).

    Attributes: ``path``, ``reader`` (the gguf reader, memory-mapped), ``config``
    (:class:`DS4Config`), ``tensors`` (name → :class:`TensorInfo`), ``extra_tensors`` (names not
    in the layout: ds4 ignores them, llama.cpp refuses the file), ``warnings`` (list of str).

    Raises the :class:`ModelFileError` subclass for the first problem found.
    """

    def __init__(self, path: str | os.PathLike, *, check_finite: bool = False,
                 support_hint: str = SUPPORT_GIVEN_AS_MODEL):
        """``support_hint``: what the architecture error adds when ``path`` is a DSpark support file
        (a command that takes the support file otherwise than with ``--mtp`` says its own form)."""
        self.path = Path(path)
        self.reader = open_gguf(self.path)
        self.warnings: list[str] = []
        arch_f = self.reader.fields.get("general.architecture")
        if arch_f is None:
            raise missing_key(self.reader, self.path, "general.architecture", f"'{L.ARCH}'")
        arch = field_value(arch_f)
        if arch != L.ARCH:
            hint = support_hint if arch in (L.SUPPORT_ARCH, "dflash") else ""
            raise ArchitectureError(self.path, f"general.architecture: expected '{L.ARCH}', found '{arch}'{hint}")
        self.config = read_config(self.reader, self.path)
        self._check_vocab()
        self.tensors = tensor_table(self.reader)
        self.specs = L.model_tensor_specs(self.config)
        for spec in self.specs:
            check_tensor(self.path, spec, self.tensors.get(spec.name), self.tensors)
        for layer in range(self.config.n_layer):
            g = self.tensors[f"blk.{layer}.ffn_gate_exps.weight"]
            u = self.tensors[f"blk.{layer}.ffn_up_exps.weight"]
            if g.type != u.type:
                raise TensorTypeError(self.path, u.name, f"wrong type: expected {g.type.name} (the type of {g.name}; "
                                                         f"routed gate and up must match), found {u.type.name}")
        known = {s.name for s in self.specs}
        self.extra_tensors = sorted(set(self.tensors) - known)
        if self.extra_tensors:
            self.warnings.append(f"{len(self.extra_tensors)} tensor(s) not in the DS4 layout are ignored "
                                 f"(llama.cpp would refuse the file): {', '.join(self.extra_tensors[:5])}")
        if check_finite:
            bad = [(s.name, n) for s in self.specs if (n := nonfinite_count(self.tensors[s.name]))]
            if bad:
                name, n = bad[0]
                more = "".join(f"; '{o}': {k}" for o, k in bad[1:])
                raise NonFiniteError(self.path, name, f"{n} non-finite (NaN/Inf) "
                                                      f"{_nonfinite_unit(self.tensors[name].type)}{more}")

    def _check_vocab(self) -> None:
        c = self.config
        f = self.reader.fields.get("tokenizer.ggml.tokens")
        if f is None:
            raise missing_key(self.reader, self.path, "tokenizer.ggml.tokens", f"{c.n_vocab} strings")
        if not f.types or f.types[0] != GGUFValueType.ARRAY or f.types[-1] != GGUFValueType.STRING:
            raise KeyTypeError(self.path, "tokenizer.ggml.tokens", f"wrong GGUF type: expected array of STRING, "
                                                                    f"found {_type_name(f)}")
        if len(f.data) != c.n_vocab:
            raise KeyValueError(self.path, "tokenizer.ggml.tokens",
                                f"expected {c.n_vocab} entries (deepseek4.vocab_size), found {len(f.data)}")
        m = self.reader.fields.get("tokenizer.ggml.merges")
        if m is None:
            raise missing_key(self.reader, self.path, "tokenizer.ggml.merges", "an array of merge strings")
        if not m.types or m.types[0] != GGUFValueType.ARRAY or m.types[-1] != GGUFValueType.STRING:
            raise KeyTypeError(self.path, "tokenizer.ggml.merges", f"wrong GGUF type: expected array of STRING, "
                                                                    f"found {_type_name(m)}")

    # ---- summaries ----------------------------------------------------------------------
    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensorError(self.path, name, "missing") from None

    @property
    def name(self) -> str:
        f = self.reader.fields.get("general.name")
        return str(field_value(f)) if f is not None else self.path.stem

    @property
    def file_bytes(self) -> int:
        return self.path.stat().st_size

    def quant_mix(self) -> dict[str, dict[str, int]]:
        """Per GGML type: number of tensors, elements and bytes (layout tensors only)."""
        mix: dict[str, dict[str, int]] = {}
        for spec in self.specs:
            info = self.tensors[spec.name]
            m = mix.setdefault(info.type.name, {"tensors": 0, "elements": 0, "bytes": 0})
            m["tensors"] += 1
            m["elements"] += info.n_elements
            m["bytes"] += info.nbytes
        return dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"]))

    def bytes_per_token(self, ctx: int) -> dict[str, int]:
        """Estimated bytes read to decode one token at context ``ctx`` (spec ds4.md §8).

        Weights: every dense tensor once, ``n_expert_used / n_expert`` of each routed expert
        tensor, one embedding row, the indexer scoring weights only when more compressed rows exist
        than ``indexer_top_k``.  KV: f32 rows as ds4's GPU path stores them (§8.2).
        Returns a dict with ``weights``, ``kv`` and ``total``.
        """
        c = self.config
        weights = 0
        for spec in self.specs:
            info = self.tensors[spec.name]
            if spec.name == "token_embd.weight":
                weights += info.nbytes // c.n_vocab
            elif "_exps." in spec.name:
                weights += info.nbytes * c.n_expert_used // c.n_expert
            elif spec.name.endswith("ffn_gate_tid2eid.weight"):
                weights += c.n_expert_used * 4
            elif spec.name.endswith(("indexer.attn_q_b.weight", "indexer.proj.weight")):
                if ctx // L.CSA_RATIO > c.indexer_top_k:
                    weights += info.nbytes
            else:
                weights += info.nbytes
        kv = 0
        row = c.head_dim * 4
        for layer in range(c.n_layer):
            kv += min(ctx, c.sliding_window) * row
            kind = c.layer_kind(layer)
            ratio = c.compress_ratios[layer]
            if kind is L.LayerKind.CSA:
                n_comp = ctx // ratio
                kv += min(n_comp, c.indexer_top_k) * row
                if n_comp > c.indexer_top_k:
                    kv += n_comp * c.indexer_head_dim * 4
            elif kind is L.LayerKind.HCA:
                kv += (ctx // ratio) * row
        return {"weights": weights, "kv": kv, "total": weights + kv}

    def summary(self, ctx: int = 4096) -> dict:
        c = self.config
        sched = c.schedule()
        kinds = [s["attention"] for s in sched]
        return {
            "path": str(self.path),
            "name": self.name,
            "architecture": L.ARCH,
            "file_bytes": self.file_bytes,
            "tensor_bytes": sum(self.tensors[s.name].nbytes for s in self.specs),
            "n_tensors": len(self.tensors),
            "dims": {
                "n_layer": c.n_layer, "n_embd": c.n_embd, "n_vocab": c.n_vocab, "n_head": c.n_head,
                "head_dim": c.head_dim, "n_rot": c.n_rot, "q_lora_rank": c.q_lora_rank,
                "o_groups": c.o_groups, "o_lora_rank": c.o_lora_rank, "n_expert": c.n_expert,
                "n_expert_used": c.n_expert_used, "n_expert_shared": c.n_expert_shared, "n_ff_exp": c.n_ff_exp,
                "n_hash_layer": c.n_hash_layer, "sliding_window": c.sliding_window,
                "indexer_n_head": c.indexer_n_head, "indexer_head_dim": c.indexer_head_dim,
                "indexer_top_k": c.indexer_top_k, "hc_count": c.hc_count, "context_length": c.context_length,
            },
            "schedule": sched,
            "layer_counts": {k: kinds.count(k) for k in ("SWA", "CSA", "HCA")} | {
                "hash_moe": sum(1 for s in sched if s["moe"] == "hash"),
                "topk_moe": sum(1 for s in sched if s["moe"] == "topk")},
            "quant_mix": self.quant_mix(),
            "ctx": ctx,
            "bytes_per_token": self.bytes_per_token(ctx),
            "extra_tensors": self.extra_tensors,
            "warnings": list(self.warnings),
        }


# ---- the DSpark support model --------------------------------------------------------------

@dataclass(frozen=True)
class Problem:
    """One reason a support file cannot draft. ``kind`` is the summary counter it adds to."""

    kind: str  # "missing" | "invalid" | "metadata_errors" | "nonfinite" | "mismatch"
    message: str
    tensor: str | None = None
    key: str | None = None


@dataclass
class SupportMeta:
    block_size: int | None = None
    markov_rank: int | None = None
    noise_token_id: int | None = None
    target_layer_ids: tuple[int, ...] = ()
    n_stages: int = 0


def open_support(path: str | os.PathLike) -> tuple[GGUFReader, str]:
    """Open a DSpark support GGUF and return its reader and ``general.architecture``
    (``deepseek4-dspark`` or ``dflash``): the checks of the file alone, which need no target model,
    made first by :class:`SupportModel` and by a command that checks its ``--mtp`` file before long
    work (a demo unpack, a model build or load).  Raises :class:`ModelFileError` (:func:`check_readable`),
    :class:`GGUFFormatError` / :class:`TruncatedFileError` (:func:`open_gguf`: not a GGUF, damaged or
    cut short), or :class:`ArchitectureError` naming the file, the expected and the found architecture
    (a target model given as its support file is named as one)."""
    p = Path(path)
    reader = open_gguf(p)
    arch_f = reader.fields.get("general.architecture")
    architecture = str(field_value(arch_f)) if arch_f is not None else None
    if architecture not in (L.SUPPORT_ARCH, "dflash"):
        hint = " (this is a target model, not a support file)" if architecture == L.ARCH else ""
        found = f"found '{architecture}'" if arch_f is not None else "the key is missing"
        raise ArchitectureError(p, f"general.architecture: expected '{L.SUPPORT_ARCH}' or 'dflash', {found}{hint}")
    return reader, architecture


class SupportModel:
    """A DSpark support GGUF checked against its target (spec dspark.md §4).

    Accepts ds4's layout (``general.architecture = deepseek4-dspark``, ``mtp.N.*`` tensors) and
    llama.cpp's ``dflash`` layout (``blk.N.*`` plus root names; its target-layer ids are layer
    inputs and are shifted by −1 to post-layer ids).  Problems are collected, never raised, except
    for an unreadable file; :meth:`require_compatible` raises :class:`SupportInvalidError`.
    """

    def __init__(self, path: str | os.PathLike, target: DS4Config, *, check_finite: bool = True):
        self.path = Path(path)
        self.target = target
        self.problems: list[Problem] = []
        self.reader, self.architecture = open_support(self.path)
        raw = tensor_table(self.reader)
        self.tensors = self._canonical_names(raw)
        self.meta = self._read_meta()
        self.present = 0
        self._check_against_target()
        self.specs: list[TensorSpec] = []
        if self.meta.n_stages > 0 and self.meta.markov_rank:
            self.specs = L.support_tensor_specs(target, self.meta.n_stages, max(1, len(self.meta.target_layer_ids)),
                                                self.meta.markov_rank)
            self._check_tensors()
        if check_finite:
            for info in self.tensors.values():
                n = nonfinite_count(info)
                if n:
                    self._add("nonfinite", f"tensor '{info.name}': {n} non-finite (NaN/Inf) "
                                           f"{_nonfinite_unit(info.type)}", tensor=info.name)

    # -- helpers --
    def _add(self, kind: str, message: str, *, tensor: str | None = None, key: str | None = None) -> None:
        self.problems.append(Problem(kind, message, tensor, key))

    def _canonical_names(self, raw: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
        if self.architecture != "dflash":
            return raw
        stages = [int(n.split(".")[1]) for n in raw if n.startswith("blk.") and n.split(".")[1].isdigit()]
        last = max(stages) if stages else 0
        out = {}
        for name, info in raw.items():
            if name.startswith("blk."):
                new = "mtp." + name[4:]
            else:
                new = L.DFLASH_ROOT_NAMES.get(name, name).format(last=last)
            out[new] = info
        return out

    def _none_of(self, keys: Iterable[str]) -> str:
        """``none of the keys A, B, C is present``, and the key one byte away from one of them when the
        file has one (:func:`one_byte_away`)."""
        keys = list(keys)
        near = next((hint for hint in (one_byte_away(k, self.reader.fields) for k in keys) if hint), "")
        return f"none of the keys {', '.join(keys)} is present{near}"

    def _int_key(self, keys: Iterable[str], what: str) -> tuple[str | None, int | None]:
        k, f = _first_key(self.reader, keys)
        if f is None:
            return None, None
        if not f.types or f.types[0] not in _INT_TYPES:
            self._add("metadata_errors", f"metadata key '{k}' ({what}): wrong GGUF type: expected an integer, "
                                         f"found {_type_name(f)}", key=k)
            return k, None
        return k, int(field_value(f))

    def _read_meta(self) -> SupportMeta:
        m = SupportMeta()
        stage_ids = {int(n.split(".")[1]) for n in self.tensors if n.startswith("mtp.") and n.split(".")[1].isdigit()}
        m.n_stages = (max(stage_ids) + 1) if stage_ids else 0
        if m.n_stages == 0:
            self._add("missing", "no drafter stage tensors (mtp.N.* or blk.N.*) found")
        k, m.block_size = self._int_key(L.SUPPORT_BLOCK_KEYS, "block size")
        if k is None:
            self._add("metadata_errors", f"block size: {self._none_of(L.SUPPORT_BLOCK_KEYS)}", key=L.SUPPORT_BLOCK_KEYS[2])
        elif m.block_size is not None and not (0 < m.block_size <= L.MAX_SUPPORT_BLOCK):
            self._add("metadata_errors", f"metadata key '{k}': block size expected 1..{L.MAX_SUPPORT_BLOCK}, "
                                         f"found {m.block_size}", key=k)
        k, m.markov_rank = self._int_key(L.SUPPORT_RANK_KEYS, "Markov rank")
        w1 = next((i for n, i in self.tensors.items() if n.endswith("markov_head.markov_w1.weight")), None)
        if k is None and w1 is not None:
            m.markov_rank = w1.ne[0]  # spec dspark.md §4.1: inferred from markov_w1 ne0
        elif k is None:
            self._add("metadata_errors", "Markov rank: no rank key and no markov_w1 tensor to infer it from",
                      key=L.SUPPORT_RANK_KEYS[2])
        if m.markov_rank is not None and m.markov_rank <= 0:
            self._add("metadata_errors", f"metadata key '{k}': Markov rank expected > 0, found {m.markov_rank}", key=k)
            m.markov_rank = None
        k, m.noise_token_id = self._int_key(L.SUPPORT_NOISE_KEYS, "noise token id")
        if k is None:
            self._add("metadata_errors", f"noise token id: {self._none_of(L.SUPPORT_NOISE_KEYS)}",
                      key=L.SUPPORT_NOISE_KEYS[2])
        elif m.noise_token_id is not None and not (0 <= m.noise_token_id < self.target.n_vocab):
            self._add("metadata_errors", f"metadata key '{k}': noise token id expected 0..{self.target.n_vocab - 1} "
                                         f"(< target vocab {self.target.n_vocab}), found {m.noise_token_id}", key=k)
        k, f = _first_key(self.reader, L.SUPPORT_TARGET_KEYS)
        if f is None:
            self._add("metadata_errors", f"capture layers: {self._none_of(L.SUPPORT_TARGET_KEYS)}",
                      key=L.SUPPORT_TARGET_KEYS[2])
        elif f.types[0] != GGUFValueType.ARRAY or f.types[-1] not in (GGUFValueType.UINT32, GGUFValueType.INT32):
            self._add("metadata_errors", f"metadata key '{k}': wrong GGUF type: expected array of UINT32/INT32, "
                                         f"found {_type_name(f)}", key=k)
        else:
            ids = [int(x) for x in field_value(f)]
            if k == "dflash.target_layers":  # layer-input ids → post-layer ids (spec dspark.md §12)
                ids = [i - 1 if i > 0 else i for i in ids]
            m.target_layer_ids = tuple(ids)
            if not ids:
                self._add("metadata_errors", f"metadata key '{k}': capture layer list is empty", key=k)
            for i in ids:
                if not (0 <= i < self.target.n_layer):
                    self._add("metadata_errors", f"metadata key '{k}': capture layer {i} expected 0..{self.target.n_layer - 1} "
                                                 f"(< target block_count {self.target.n_layer})", key=k)
            if any(b <= a for a, b in zip(ids, ids[1:])):
                self._add("metadata_errors", f"metadata key '{k}': capture layers must be strictly increasing, "
                                             f"found {ids}", key=k)
        return m

    def _check_against_target(self) -> None:
        """Dimension checks against the target, before the per-tensor shape checks."""
        t = self.target
        c_f = {}
        for keys, name, want in ((L.SUPPORT_EXPERT_COUNT_KEYS, "expert count", t.n_expert),
                                 (L.SUPPORT_EXPERT_USED_KEYS, "experts used", t.n_expert_used),
                                 (L.SUPPORT_EMBD_KEYS, "hidden size", t.n_embd)):
            k, v = self._int_key(keys, name)
            c_f[name] = v
            if k is not None and v is not None and v != want:
                self._add("metadata_errors", f"{name}: support metadata '{k}' = {v}, target has {want}", key=k)
        norm = self.tensors.get("mtp.0.attn_norm.weight")
        if norm is not None and norm.shape[0] != t.n_embd:
            self._add("mismatch", f"hidden size: support has {norm.shape[0]} (mtp.0.attn_norm.weight), target "
                                  f"deepseek4.embedding_length = {t.n_embd}", tensor=norm.name)
        router = self.tensors.get("mtp.0.ffn_gate_inp.weight")
        if router is not None and router.shape[0] != t.n_expert:
            self._add("mismatch", f"expert count: support has {router.shape[0]} experts (mtp.0.ffn_gate_inp.weight), "
                                  f"target deepseek4.expert_count = {t.n_expert}", tensor=router.name)
        w1 = next((i for n, i in self.tensors.items() if n.endswith("markov_head.markov_w1.weight")), None)
        if w1 is not None and w1.shape[0] != t.n_vocab:
            self._add("mismatch", f"vocab: support has {w1.shape[0]} rows ({w1.name}), target "
                                  f"deepseek4.vocab_size = {t.n_vocab}", tensor=w1.name)
        if w1 is not None and self.meta.markov_rank and w1.shape[1] != self.meta.markov_rank:
            self._add("metadata_errors", f"Markov rank: metadata says {self.meta.markov_rank}, {w1.name} has "
                                         f"{w1.shape[1]}", tensor=w1.name)

    def _check_tensors(self) -> None:
        reported = {p.tensor for p in self.problems if p.tensor}
        for spec in self.specs:
            info = self.tensors.get(spec.name)
            if info is None:
                self._add("missing", f"tensor '{spec.name}': missing ({spec.role}){one_byte_away(spec.name, self.tensors)}",
                          tensor=spec.name)
                continue
            self.present += 1
            if spec.name in reported:
                continue
            try:
                check_tensor(self.path, spec, info)
            except TensorError as exc:
                self._add("invalid", exc.detail, tensor=spec.name)
        for s in range(self.meta.n_stages):
            g = self.tensors.get(f"mtp.{s}.ffn_gate_exps.weight")
            u = self.tensors.get(f"mtp.{s}.ffn_up_exps.weight")
            if g is not None and u is not None and g.type != u.type:
                self._add("invalid", f"tensor '{u.name}': routed gate and up types differ ({g.type.name} vs "
                                     f"{u.type.name})", tensor=u.name)

    # -- verdict --
    def counts(self) -> dict[str, int]:
        kinds = [p.kind for p in self.problems]
        return {
            "stages": self.meta.n_stages,
            "block": self.meta.block_size or 0,
            "markov_rank": self.meta.markov_rank or 0,
            "tensors": self.present,
            "missing": kinds.count("missing"),
            "invalid": kinds.count("invalid") + kinds.count("mismatch"),
            "metadata_errors": kinds.count("metadata_errors"),
            "nonfinite": kinds.count("nonfinite"),
        }

    @property
    def compatible(self) -> bool:
        return not self.problems

    def summary_line(self) -> str:
        """The ds4-style summary: ``stages=3 block=5 markov_rank=256 tensors=81 missing=0 ...``."""
        return " ".join(f"{k}={v}" for k, v in self.counts().items())

    def summary(self) -> dict:
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "counts": self.counts(),
            "noise_token_id": self.meta.noise_token_id,
            "target_layer_ids": list(self.meta.target_layer_ids),
            "compatible": self.compatible,
            "reasons": [p.message for p in self.problems],
            "tensor_bytes": sum(i.nbytes for i in self.tensors.values()),
            "draft_vocab": self._draft_vocab_summary(),
        }

    def _draft_vocab_summary(self) -> dict | None:
        """The file's draft vocabulary (spec dspark.md §2.6): its size, or why it cannot be used; None
        when the file has none."""
        from ds4tui.engine import draft_vocab as DV

        ids, why = DV.file_list(self)
        if ids is None and not why:
            return None
        if ids is not None:
            why = DV.list_problem(ids, self.target.n_vocab)
        return {"key": DV.KEY, "size": None if ids is None else len(ids), "problem": why or None}

    def require_compatible(self) -> "SupportModel":
        if self.problems:
            raise SupportInvalidError(self.path, self.problems)
        return self
