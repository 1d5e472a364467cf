"""Test helper: copy a GGUF with edits (keys dropped/replaced, tensors dropped/replaced).

Built on the gguf package's reader and writer, so the edited files are well-formed GGUFs that
differ from the original only where a test says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, GGUFWriter

from ds4tui.engine.gguf_model import field_value, open_gguf

_SKIP = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture"}


def rewrite(src: str | Path, dst: str | Path, *, arch: str | None = None, drop_keys=(),
            set_keys: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]] | None = None,
            drop_tensors=(), replace_tensors: dict[str, tuple[np.ndarray, T | None]] | None = None) -> Path:
    r = open_gguf(src)
    old_arch = field_value(r.fields["general.architecture"])
    w = GGUFWriter(str(dst), arch=arch or old_arch)
    set_keys = set_keys or {}
    replace_tensors = replace_tensors or {}
    for name, f in r.fields.items():
        if name in _SKIP or name in drop_keys or name in set_keys:
            continue
        main = f.types[0]
        sub = f.types[-1] if main == GGUFValueType.ARRAY else None
        w.add_key_value(name, field_value(f), main, sub)
    for name, (val, vt, sub) in set_keys.items():
        w.add_key_value(name, val, vt, sub)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        if t.name in replace_tensors:
            data, qt = replace_tensors[t.name]
            w.add_tensor(t.name, data, raw_dtype=qt)
            continue
        qt = T(int(t.tensor_type))
        data = np.asarray(t.data)
        if qt in (T.F32, T.F16, T.I32):
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def to_dflash(src: str | Path, dst: str | Path, *, last_stage: int = 2) -> Path:
    """Rewrite a ds4 support GGUF in llama.cpp's ``dflash`` layout (spec dspark.md §12): ``blk.N.``
    stage names, root names for the heads, ``dflash.*`` keys, layer-*input* capture ids (+1)."""
    from ds4tui.engine.layout import DFLASH_ROOT_NAMES

    r = open_gguf(src)
    inverse = {v.format(last=last_stage): k for k, v in DFLASH_ROOT_NAMES.items()}
    ids = [int(x) + 1 for x in field_value(r.fields["dspark.target_layer_ids"])]
    w = GGUFWriter(str(dst), arch="dflash")
    w.add_key_value("dflash.block_size", int(field_value(r.fields["dspark.block_size"])), GGUFValueType.UINT32)
    w.add_key_value("tokenizer.ggml.mask_token_id", int(field_value(r.fields["dspark.noise_token_id"])),
                    GGUFValueType.UINT32)
    w.add_key_value("dflash.target_layers", ids, GGUFValueType.ARRAY, GGUFValueType.INT32)
    for t in r.tensors:
        name = inverse.get(t.name) or ("blk." + t.name[4:] if t.name.startswith("mtp.") else t.name)
        qt = T(int(t.tensor_type))
        w.add_tensor(name, np.asarray(t.data), raw_dtype=None if qt in (T.F32, T.F16) else qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)
