"""Shared fixtures: test models are built once per test session (spec ds4.md §6 'tiny')."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4tui.devtools import make_test_model as mtm


def _make(tmp_path_factory, folder: str, **kw) -> dict:
    """``make_test_model.make`` into a fresh temp folder; adds the model's ``config``."""
    r = mtm.make(tmp_path_factory.mktemp(folder), config="tiny", **kw)
    r["config"] = mtm.tiny_config(**{k: kw[k] for k in ("layers", "experts") if k in kw})
    return r


@pytest.fixture(scope="session")
def tiny_q2(tmp_path_factory) -> dict:
    """The tiny test model in the q2 mix: {'hf', 'model', 'support', 'config'}."""
    return _make(tmp_path_factory, "tiny_q2", seed=0, types="q2")


@pytest.fixture(scope="session")
def small_f32(tmp_path_factory) -> dict:
    """A 3-layer, 6-expert model written in F32 (exact round-trip checks)."""
    return _make(tmp_path_factory, "small_f32", seed=1, layers=3, experts=6, types="f32")


@pytest.fixture(scope="session")
def tiny_f32(tmp_path_factory) -> dict:
    """The tiny test model with F32 tensors: the weights of the golden transformers checkpoint, unrounded."""
    return _make(tmp_path_factory, "tiny_f32", seed=0, types="f32")


@pytest.fixture(scope="session")
def tokenizer_json() -> Path:
    from ds4tui.engine.tokenizer import default_tokenizer_json

    return default_tokenizer_json()


@pytest.fixture(scope="session")
def fitted_support(tiny_q2, tmp_path_factory) -> Path:
    """``tiny_q2``'s support GGUF with its Markov and confidence heads fitted to the model
    (``ds4tui.devtools.fit_support``: a small fit, 6 prompts × 24 tokens, margins of 4096 tokens),
    so that greedy DSpark decoding sees full, partial and miss_first cycles (~50 % accepted)."""
    from ds4tui.devtools.fit_support import fit_support

    out = tmp_path_factory.mktemp("fitted_support") / "support.gguf"
    fit_support(tiny_q2["model"], tiny_q2["support"], out, prompts=6, tokens=24, scan=4096, seed=0)
    return out


@pytest.fixture(autouse=True)
def _scheduler_prices_in_tmp(tmp_path_factory, monkeypatch):
    """The commands save DSpark scheduler prices by default (spec dspark.md §7.4): in a folder of
    the test's own, never the user's cache."""
    from ds4tui.commands import environment

    folder = tmp_path_factory.mktemp("scheduler_prices")
    monkeypatch.setattr(environment, "scheduler_prices_dir", lambda: folder)
