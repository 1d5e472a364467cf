"""The test checkpoint loads in Hugging Face transformers' DeepSeek V4 exactly as written.

Needs torch and transformers >= 5.17 (not dependencies of ds4tui); skipped where they are missing.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DeepseekV4ForCausalLM"):
    pytest.skip("this transformers has no DeepseekV4ForCausalLM", allow_module_level=True)


def test_checkpoint_loads_without_missing_or_unexpected_keys(small_f32):
    from safetensors.numpy import load_file

    model, info = transformers.DeepseekV4ForCausalLM.from_pretrained(
        small_f32["hf"], output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    cfg = model.config
    assert cfg.layer_types == ["sliding_attention", "sliding_attention", "compressed_sparse_attention"]
    assert cfg.rope_parameters["compress"]["rope_type"] == "yarn"
    assert cfg.rope_parameters["compress"]["attention_factor"] == 1.0
    sd = model.state_dict()
    ck = load_file(small_f32["hf"] + "/model.safetensors")
    np.testing.assert_array_equal(sd["model.layers.1.self_attn.kv_norm.weight"].numpy(),
                                  ck["model.layers.1.attn.norm.weight"])
    np.testing.assert_array_equal(sd["model.layers.2.mlp.experts.gate_up_proj"][4, 256:].numpy(),
                                  ck["model.layers.2.ffn.experts.4.w3.weight"])
    with torch.no_grad():
        logits = model(torch.tensor([[0, 3476, 477, 260, 11502]])).logits[0, -1]
    assert torch.isfinite(logits).all() and logits.std() > 1.0  # not flat (spec ds4.md §6)
