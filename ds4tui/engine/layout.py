"""The DS4 (DeepSeek V4) GGUF layout: metadata keys, configuration and the tensor inventory.

One table drives both the writer (``convert``) and the validator (``gguf_model``), so the two
cannot drift apart.  Everything is parameterised by :class:`DS4Config`; nothing here hard-codes
the Flash constants (spec ds4.md §1 gives them, §6 the tiny test configuration).

Shapes are numpy order, outermost first (a weight ``[out, in]``); GGUF lists the same dims
innermost first (``ne``), i.e. reversed (spec ds4.md §3.3).

Sources: spec ds4.md §3.2 (metadata keys and their GGUF types), §3.3 (tensor inventory),
§3.6 (rules that llama.cpp's ``deepseek4`` loader adds), §2.4 (compressor shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gguf import GGMLQuantizationType as T

ARCH = "deepseek4"
SUPPORT_ARCH = "deepseek4-dspark"

#: llama.cpp's ``LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS`` (spec ds4.md §3.2).
GATING_SQRT_SOFTPLUS = 4

#: Compress ratio of compressed-sparse-attention layers (lane pairs + indexer; spec ds4.md §2.4).
CSA_RATIO = 4


class LayerKind(str, Enum):
    """Attention type of a layer, derived from its compress ratio (spec ds4.md §7)."""

    SWA = "SWA"  # ratio 0: sliding-window attention only
    CSA = "CSA"  # ratio 4: compressed sparse attention with the lightning indexer
    HCA = "HCA"  # any other ratio: heavily compressed attention


class MetaType(str, Enum):
    """Accepted GGUF value types of a metadata key (spec ds4.md §3.2)."""

    U32 = "u32"  # written as UINT32; ds4's model_get_u32 accepts only UINT32
    U64 = "u64"  # written as UINT32; accepts UINT32 or UINT64
    F32 = "f32"  # written as FLOAT32; accepts FLOAT32/FLOAT64/UINT32/INT32
    BOOL = "bool"
    STR = "str"
    I32_ARRAY = "i32[]"  # written as INT32 array; accepts INT32 or UINT32 elements
    F32_ARRAY = "f32[]"  # written as FLOAT32 array; accepts FLOAT32 or FLOAT64


@dataclass(frozen=True)
class MetaKey:
    key: str
    type: MetaType
    field: str  # DS4Config attribute
    required: bool = True


P = ARCH + "."

#: Every model key the engine reads, its accepted type and the config field it fills.
MODEL_KEYS: tuple[MetaKey, ...] = (
    MetaKey(P + "block_count", MetaType.U32, "n_layer"),
    MetaKey(P + "embedding_length", MetaType.U32, "n_embd"),
    MetaKey(P + "vocab_size", MetaType.U32, "n_vocab"),
    MetaKey(P + "attention.head_count", MetaType.U32, "n_head"),
    MetaKey(P + "attention.head_count_kv", MetaType.U32, "n_head_kv"),
    MetaKey(P + "attention.key_length", MetaType.U32, "head_dim"),
    MetaKey(P + "attention.value_length", MetaType.U32, "value_dim"),
    MetaKey(P + "rope.dimension_count", MetaType.U32, "n_rot"),
    MetaKey(P + "attention.q_lora_rank", MetaType.U32, "q_lora_rank"),
    MetaKey(P + "attention.output_lora_rank", MetaType.U32, "o_lora_rank"),
    MetaKey(P + "attention.output_group_count", MetaType.U32, "o_groups"),
    MetaKey(P + "expert_count", MetaType.U32, "n_expert"),
    MetaKey(P + "expert_used_count", MetaType.U32, "n_expert_used"),
    MetaKey(P + "expert_feed_forward_length", MetaType.U32, "n_ff_exp"),
    MetaKey(P + "expert_shared_count", MetaType.U32, "n_expert_shared"),
    MetaKey(P + "hash_layer_count", MetaType.U32, "n_hash_layer"),
    MetaKey(P + "attention.sliding_window", MetaType.U32, "sliding_window"),
    MetaKey(P + "attention.indexer.head_count", MetaType.U32, "indexer_n_head"),
    MetaKey(P + "attention.indexer.key_length", MetaType.U32, "indexer_head_dim"),
    MetaKey(P + "attention.indexer.top_k", MetaType.U32, "indexer_top_k"),
    MetaKey(P + "hyper_connection.count", MetaType.U32, "hc_count"),
    MetaKey(P + "hyper_connection.sinkhorn_iterations", MetaType.U32, "hc_sinkhorn_iters"),
    MetaKey(P + "attention.compress_ratios", MetaType.I32_ARRAY, "compress_ratios"),
    MetaKey(P + "swiglu_clamp_exp", MetaType.F32_ARRAY, "swiglu_clamp"),
    MetaKey(P + "rope.scaling.original_context_length", MetaType.U64, "rope_orig_ctx"),
    MetaKey(P + "rope.freq_base", MetaType.F32, "rope_freq_base"),
    MetaKey(P + "rope.scaling.factor", MetaType.F32, "rope_scaling_factor"),
    MetaKey(P + "rope.scaling.yarn_beta_fast", MetaType.F32, "yarn_beta_fast"),
    MetaKey(P + "rope.scaling.yarn_beta_slow", MetaType.F32, "yarn_beta_slow"),
    MetaKey(P + "attention.compress_rope_freq_base", MetaType.F32, "compress_rope_freq_base"),
    MetaKey(P + "expert_weights_scale", MetaType.F32, "expert_weights_scale"),
    MetaKey(P + "attention.layer_norm_rms_epsilon", MetaType.F32, "rms_eps"),
    MetaKey(P + "hyper_connection.epsilon", MetaType.F32, "hc_eps"),
    MetaKey(P + "expert_weights_norm", MetaType.BOOL, "expert_weights_norm"),
    # Keys ds4 ignores but llama.cpp requires (spec ds4.md §3.2); optional when reading.
    MetaKey(P + "context_length", MetaType.U64, "context_length", required=False),
    MetaKey(P + "expert_gating_func", MetaType.U32, "expert_gating_func", required=False),
    MetaKey(P + "rope.scaling.type", MetaType.STR, "rope_scaling_type", required=False),
    MetaKey(P + "swiglu_clamp_shexp", MetaType.F32_ARRAY, "swiglu_clamp_shexp", required=False),
    MetaKey(P + "expert_group_count", MetaType.U32, "expert_group_count", required=False),
    MetaKey(P + "expert_group_used_count", MetaType.U32, "expert_group_used_count", required=False),
)


@dataclass(frozen=True)
class DS4Config:
    """Hyper-parameters of a DS4 model, as stored in the GGUF metadata (spec ds4.md §1, §3.2).

    Integers are counts or widths in elements; ``compress_ratios`` and ``swiglu_clamp`` hold one
    entry per layer (a longer list in the file, e.g. 44 entries with the MTP slot, is truncated to
    ``n_layer``).
    """

    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_dim: int
    value_dim: int
    n_rot: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_expert_shared: int
    n_hash_layer: int
    sliding_window: int
    indexer_n_head: int
    indexer_head_dim: int
    indexer_top_k: int
    hc_count: int
    hc_sinkhorn_iters: int
    compress_ratios: tuple[int, ...]
    swiglu_clamp: tuple[float, ...]
    rope_orig_ctx: int
    rope_freq_base: float
    rope_scaling_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    compress_rope_freq_base: float
    expert_weights_scale: float
    rms_eps: float
    hc_eps: float
    expert_weights_norm: bool
    context_length: int = 1048576
    expert_gating_func: int = GATING_SQRT_SOFTPLUS
    rope_scaling_type: str = "yarn"
    swiglu_clamp_shexp: tuple[float, ...] | None = None
    expert_group_count: int = 0
    expert_group_used_count: int = 0

    # ---- derived quantities -------------------------------------------------------------
    def layer_kind(self, layer: int) -> LayerKind:
        r = self.compress_ratios[layer]
        if r == 0:
            return LayerKind.SWA
        if r == CSA_RATIO:
            return LayerKind.CSA
        return LayerKind.HCA

    def is_hash_layer(self, layer: int) -> bool:
        """Hash-routed MoE (``tid2eid``) on the first ``n_hash_layer`` layers (spec ds4.md §2.7)."""
        return layer < self.n_hash_layer

    @property
    def hc_mix(self) -> int:
        """Width of one HC control vector: 2·HC + HC² (24 for HC = 4; spec ds4.md §2.1)."""
        return 2 * self.hc_count + self.hc_count * self.hc_count

    @property
    def n_ff_shexp(self) -> int:
        return self.n_ff_exp * self.n_expert_shared

    def schedule(self) -> list[dict]:
        """Per-layer schedule: attention kind, compress ratio and MoE routing."""
        return [
            {
                "layer": i,
                "attention": self.layer_kind(i).value,
                "compress_ratio": self.compress_ratios[i],
                "moe": "hash" if self.is_hash_layer(i) else "topk",
            }
            for i in range(self.n_layer)
        ]


# ---- tensor inventory ---------------------------------------------------------------------

FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})
DENSE_TYPES = FLOAT_TYPES | {T.Q8_0}
ROUTED_TYPES = DENSE_TYPES | {T.Q2_K, T.IQ2_XXS}
INDEX_TYPES = frozenset({T.I32})

#: Names of the type classes, for messages.
TYPE_CLASS_NAMES = {
    FLOAT_TYPES: "float (F32/F16/BF16)",
    DENSE_TYPES: "dense (F32/F16/BF16/Q8_0)",
    ROUTED_TYPES: "routed expert (F32/F16/BF16/Q8_0/Q2_K/IQ2_XXS)",
    INDEX_TYPES: "index (I32)",
}


@dataclass(frozen=True)
class TensorSpec:
    """One expected tensor: GGUF name, numpy-order shape and accepted GGML types.

    ``c_field`` / ``c_bind``: where the native engine keeps it (a member of ``ds4_layer``,
    ``ds4_engine`` or ``ds4_support`` in ds4tui/native/internal.h) and how it binds it: ``"mat"`` a
    weight matrix read where it is mapped, ``"vec"`` a vector or small table dequantised to float,
    ``"idx"`` an I32 table.  build_native.py generates the engine's binding table from these
    (ds4tui/native/tensors.h), so this list is the one inventory of the model's tensors.
    """

    name: str
    shape: tuple[int, ...]
    types: frozenset = field(compare=False)
    role: str = ""  # short description for messages and `inspect`
    layer: int | None = None
    c_field: str = field(default="", compare=False)
    c_bind: str = field(default="", compare=False)

    @property
    def ne(self) -> tuple[int, ...]:
        """GGUF dimension order (innermost first)."""
        return tuple(reversed(self.shape))


def global_tensor_specs(c: DS4Config) -> list[TensorSpec]:
    H, V, HC = c.n_embd, c.n_vocab, c.hc_count
    return [
        TensorSpec("token_embd.weight", (V, H), DENSE_TYPES, "token embedding", None, "token_embd", "mat"),
        TensorSpec("output_hc_fn.weight", (HC, HC * H), FLOAT_TYPES, "output HC head fn", None, "output_hc_fn", "mat"),
        TensorSpec("output_hc_base.weight", (HC,), FLOAT_TYPES, "output HC head base", None, "output_hc_base", "vec"),
        TensorSpec("output_hc_scale.weight", (1,), FLOAT_TYPES, "output HC head scale", None, "output_hc_scale", "vec"),
        TensorSpec("output_norm.weight", (H,), FLOAT_TYPES, "final norm", None, "output_norm", "vec"),
        TensorSpec("output.weight", (V, H), DENSE_TYPES, "LM head", None, "output", "mat"),
    ]


def block_tensor_specs(c: DS4Config, layer: int, prefix: str | None = None, *, draft: bool = False) -> list[TensorSpec]:
    """Tensors of one transformer block (spec ds4.md §3.3).

    ``prefix`` defaults to ``blk.{layer}.``.  ``draft=True`` gives a DSpark drafter stage
    (spec dspark.md §4.2): SWA attention, learned routing with ``exp_probs_b``, and a router
    that may be quantised (DENSE) — never compressors, indexer or ``tid2eid``.
    """
    H, HC, NH, D = c.n_embd, c.hc_count, c.n_head, c.head_dim
    E, F = c.n_expert, c.n_ff_exp
    pre = prefix if prefix is not None else f"blk.{layer}."
    kind = LayerKind.SWA if draft else c.layer_kind(layer)
    hashed = False if draft else c.is_hash_layer(layer)

    def t(suffix: str, shape: tuple[int, ...], types: frozenset, role: str, c: str) -> TensorSpec:
        bind, _, member = c.partition(":")
        return TensorSpec(pre + suffix, shape, types, role, layer, member, bind)

    specs = [
        t("hc_attn_fn.weight", (c.hc_mix, HC * H), FLOAT_TYPES, "HC attention fn", "mat:hc_attn_fn"),
        t("hc_attn_base.weight", (c.hc_mix,), FLOAT_TYPES, "HC attention base", "vec:hc_attn_base"),
        t("hc_attn_scale.weight", (3,), FLOAT_TYPES, "HC attention scale", "vec:hc_attn_scale"),
        t("attn_norm.weight", (H,), FLOAT_TYPES, "attention norm", "vec:attn_norm"),
        t("attn_q_a.weight", (c.q_lora_rank, H), DENSE_TYPES, "Q low-rank A", "mat:q_a"),
        t("attn_q_a_norm.weight", (c.q_lora_rank,), FLOAT_TYPES, "Q low-rank norm", "vec:q_a_norm"),
        t("attn_q_b.weight", (NH * D, c.q_lora_rank), DENSE_TYPES, "Q low-rank B", "mat:q_b"),
        t("attn_kv.weight", (D, H), DENSE_TYPES, "KV projection", "mat:kv"),
        t("attn_kv_a_norm.weight", (D,), FLOAT_TYPES, "KV norm", "vec:kv_norm"),
        t("attn_sinks.weight", (NH,), FLOAT_TYPES, "attention sinks", "vec:sinks"),
        t("attn_output_a.weight", (c.o_groups * c.o_lora_rank, (NH // c.o_groups) * D), DENSE_TYPES,
          "grouped output A", "mat:out_a"),
        t("attn_output_b.weight", (H, c.o_groups * c.o_lora_rank), DENSE_TYPES, "grouped output B", "mat:out_b"),
    ]
    if kind is not LayerKind.SWA:
        ratio = c.compress_ratios[layer]
        coff = 2 if kind is LayerKind.CSA else 1
        specs += [
            t("attn_compressor_kv.weight", (coff * D, H), FLOAT_TYPES, "compressor KV", "mat:comp_kv"),
            t("attn_compressor_gate.weight", (coff * D, H), FLOAT_TYPES, "compressor gate", "mat:comp_gate"),
            t("attn_compressor_ape.weight", (ratio, coff * D), FLOAT_TYPES, "compressor position bias", "vec:comp_ape"),
            t("attn_compressor_norm.weight", (D,), FLOAT_TYPES, "compressor norm", "vec:comp_norm"),
        ]
    if kind is LayerKind.CSA:
        IH, ID = c.indexer_n_head, c.indexer_head_dim
        specs += [
            t("indexer.attn_q_b.weight", (IH * ID, c.q_lora_rank), FLOAT_TYPES, "indexer Q B", "mat:idx_q_b"),
            t("indexer.proj.weight", (IH, H), FLOAT_TYPES, "indexer head weights", "mat:idx_proj"),
            t("indexer_compressor_kv.weight", (2 * ID, H), FLOAT_TYPES, "indexer compressor KV", "mat:idx_comp_kv"),
            t("indexer_compressor_gate.weight", (2 * ID, H), FLOAT_TYPES, "indexer compressor gate",
              "mat:idx_comp_gate"),
            t("indexer_compressor_ape.weight", (CSA_RATIO, 2 * ID), FLOAT_TYPES, "indexer compressor position bias",
              "vec:idx_comp_ape"),
            t("indexer_compressor_norm.weight", (ID,), FLOAT_TYPES, "indexer compressor norm", "vec:idx_comp_norm"),
        ]
    specs += [
        t("hc_ffn_fn.weight", (c.hc_mix, HC * H), FLOAT_TYPES, "HC FFN fn", "mat:hc_ffn_fn"),
        t("hc_ffn_base.weight", (c.hc_mix,), FLOAT_TYPES, "HC FFN base", "vec:hc_ffn_base"),
        t("hc_ffn_scale.weight", (3,), FLOAT_TYPES, "HC FFN scale", "vec:hc_ffn_scale"),
        t("ffn_norm.weight", (H,), FLOAT_TYPES, "FFN norm", "vec:ffn_norm"),
        t("ffn_gate_inp.weight", (E, H), DENSE_TYPES if draft else FLOAT_TYPES, "router", "mat:gate_inp"),
    ]
    if hashed:
        specs.append(t("ffn_gate_tid2eid.weight", (c.n_vocab, c.n_expert_used), INDEX_TYPES, "hash routing table",
                       "idx:tid2eid"))
    else:
        specs.append(t("exp_probs_b.bias", (E,), FLOAT_TYPES, "router selection bias", "vec:exp_bias"))
    specs += [
        t("ffn_gate_exps.weight", (E, F, H), ROUTED_TYPES, "routed experts gate", "mat:gate_exps"),
        t("ffn_up_exps.weight", (E, F, H), ROUTED_TYPES, "routed experts up", "mat:up_exps"),
        t("ffn_down_exps.weight", (E, H, F), ROUTED_TYPES, "routed experts down", "mat:down_exps"),
        t("ffn_gate_shexp.weight", (c.n_ff_shexp, H), DENSE_TYPES, "shared expert gate", "mat:gate_sh"),
        t("ffn_up_shexp.weight", (c.n_ff_shexp, H), DENSE_TYPES, "shared expert up", "mat:up_sh"),
        t("ffn_down_shexp.weight", (H, c.n_ff_shexp), DENSE_TYPES, "shared expert down", "mat:down_sh"),
    ]
    return specs


def model_tensor_specs(c: DS4Config) -> list[TensorSpec]:
    """The complete tensor inventory of a DS4 target GGUF, in writing order."""
    specs = global_tensor_specs(c)[:1]
    for layer in range(c.n_layer):
        specs += block_tensor_specs(c, layer)
    specs += global_tensor_specs(c)[1:]
    return specs


# ---- DSpark support layout (spec dspark.md §4) ----------------------------------------------

#: Metadata aliases of the support file, first hit wins (spec dspark.md §4.1).
SUPPORT_BLOCK_KEYS = ("deepseek4.dspark.block_size", "deepseek4.dspark_block_size", "dspark.block_size",
                      "dflash.block_size")
SUPPORT_RANK_KEYS = ("deepseek4.dspark.markov_rank", "deepseek4.dspark_markov_rank", "dspark.markov_rank")
SUPPORT_NOISE_KEYS = ("deepseek4.dspark.noise_token_id", "deepseek4.dspark_noise_token_id",
                      "dspark.noise_token_id", "dflash.noise_token_id", "tokenizer.ggml.mask_token_id")
SUPPORT_TARGET_KEYS = ("deepseek4.dspark.target_layer_ids", "deepseek4.dspark_target_layer_ids",
                       "dspark.target_layer_ids", "dflash.target_layers")
#: Optional keys our writer adds so a mismatch is caught from metadata too.
SUPPORT_EXPERT_USED_KEYS = ("dspark.expert_used_count", "dflash.expert_used_count")
SUPPORT_EXPERT_COUNT_KEYS = ("dspark.expert_count", "dflash.expert_count")
SUPPORT_EMBD_KEYS = ("dspark.embedding_length", "dflash.embedding_length")

#: Maximum block size a support file may declare (ds4 rejects larger; spec dspark.md §4.3).
MAX_SUPPORT_BLOCK = 16

#: llama.cpp DSpark (``dflash``) root tensor names → our per-stage names (spec dspark.md §12).
#: ``{last}`` is the final stage index.
DFLASH_ROOT_NAMES = {
    "fc.weight": "mtp.0.main_proj.weight",
    "enc.output_norm.weight": "mtp.0.main_norm.weight",
    "output_norm.weight": "mtp.{last}.norm.weight",
    "output_hc_fn.weight": "mtp.{last}.hc_head_fn.weight",
    "output_hc_base.weight": "mtp.{last}.hc_head_base.weight",
    "output_hc_scale.weight": "mtp.{last}.hc_head_scale.weight",
    "markov_w1.weight": "mtp.{last}.markov_head.markov_w1.weight",
    "markov_w2.weight": "mtp.{last}.markov_head.markov_w2.weight",
    "conf_proj.weight": "mtp.{last}.confidence_head.proj.weight",
}


def support_tensor_specs(c: DS4Config, n_stages: int, n_capture: int, rank: int) -> list[TensorSpec]:
    """The DS4 support layout: 24 tensors per stage, 2 on stage 0, 7 on the final stage.

    For 3 stages this is the 81-tensor layout of spec dspark.md §4.2.  Shapes follow the
    target's dimensions; ``n_capture`` target layers feed ``main_proj``; ``rank`` is the Markov rank.
    """
    H, HC, V = c.n_embd, c.hc_count, c.n_vocab
    last = n_stages - 1
    specs: list[TensorSpec] = []
    for s in range(n_stages):
        specs += block_tensor_specs(c, s, prefix=f"mtp.{s}.", draft=True)
        if s == 0:
            specs += [
                TensorSpec("mtp.0.main_proj.weight", (H, n_capture * H), DENSE_TYPES, "capture projection", 0,
                           "main_proj", "mat"),
                TensorSpec("mtp.0.main_norm.weight", (H,), FLOAT_TYPES, "capture norm", 0, "main_norm", "vec"),
            ]
    specs += [
        TensorSpec(f"mtp.{last}.norm.weight", (H,), FLOAT_TYPES, "drafter final norm", last, "norm", "vec"),
        TensorSpec(f"mtp.{last}.hc_head_base.weight", (HC,), FLOAT_TYPES, "drafter HC head base", last, "hc_head_base",
                   "vec"),
        TensorSpec(f"mtp.{last}.hc_head_fn.weight", (HC, HC * H), FLOAT_TYPES, "drafter HC head fn", last, "hc_head_fn",
                   "mat"),
        TensorSpec(f"mtp.{last}.hc_head_scale.weight", (1,), FLOAT_TYPES, "drafter HC head scale", last,
                   "hc_head_scale", "vec"),
        TensorSpec(f"mtp.{last}.markov_head.markov_w1.weight", (V, rank), DENSE_TYPES, "Markov embedding W1", last,
                   "markov_w1", "mat"),
        TensorSpec(f"mtp.{last}.markov_head.markov_w2.weight", (V, rank), DENSE_TYPES, "Markov output W2", last,
                   "markov_w2", "mat"),
        TensorSpec(f"mtp.{last}.confidence_head.proj.weight", (1, H + rank), DENSE_TYPES, "confidence head", last,
                   "conf", "mat"),
    ]
    return specs
