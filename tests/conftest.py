"""Shared fixtures: test models are built once per test session (spec ds4.md §6 'tiny')."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4tui.devtools import make_test_model as mtm


@pytest.fixture(scope="session")
def tiny_q2(tmp_path_factory) -> dict:
    """The tiny test model in the q2 mix: {'hf', 'model', 'support', 'config'}."""
    out = tmp_path_factory.mktemp("tiny_q2")
    r = mtm.make(out, config="tiny", seed=0, types="q2")
    r["config"] = mtm.tiny_config()
    return r


@pytest.fixture(scope="session")
def small_f32(tmp_path_factory) -> dict:
    """A 3-layer, 6-expert model written in F32 (exact round-trip checks)."""
    out = tmp_path_factory.mktemp("small_f32")
    r = mtm.make(out, config="tiny", seed=1, layers=3, experts=6, types="f32")
    r["config"] = mtm.tiny_config(layers=3, experts=6)
    return r


@pytest.fixture(scope="session")
def tokenizer_json() -> Path:
    from ds4tui.engine.tokenizer import default_tokenizer_json

    return default_tokenizer_json()


@pytest.fixture(scope="session")
def tiny_f32(tmp_path_factory) -> dict:
    """The tiny test model with F32 tensors: the weights of the golden transformers checkpoint, unrounded."""
    out = tmp_path_factory.mktemp("tiny_f32")
    r = mtm.make(out, config="tiny", seed=0, types="f32")
    r["config"] = mtm.tiny_config()
    return r
