"""Train the bundled demo model (a small DeepSeek V4) and its DSpark drafter, and export both to GGUF.

``python tools/train_demo.py CORPUS_DIR OUT_DIR [--target-seconds S] [--drafter-seconds S] [--seed N]``

Needs ``torch`` and ``transformers`` (>= 5.23, ``DeepseekV4ForCausalLM``), which are not ds4tui
dependencies; runs on one CUDA GPU (``--device cpu`` for a smoke run).  ``CORPUS_DIR`` comes
from ``tools/demo_corpus.py`` (token ids of permissively licensed Python source, train / held-out
split; its compact ``*.u16.xz`` form is read as well).  The defaults are the first run of the chain
that made the shipped pair: 483 s on one H200 (target 250 s, heal 40 s, greedy continuations for
the drafter, drafter 120 s, export and check).  Later runs continued it: the drafter trained on
against the exported target (``--target-gguf``, ``--drafter-init``), the target trained on from its
file (``--target-init``, on the corpus rebuilt with ``--max-function-lines 20 --answer-docstring
summary``), and the shipped drafter trained against the last target on continuations made by the
engine (``tools/engine_continuations.py``, ``--continuations``); README "Retrain" has every command.
``--target-gguf`` rebuilds the target in transformers from the GGUF's dequantised weights (checked
against the numpy reference on held-out tokens), so a drafter can be trained for the shipped
target on a machine that never held its checkpoint; only ``support.gguf`` is written then.
``--save-target`` keeps the healed target (``target.pt``) for ``--resume-target``.  ``--target-init
MODEL.gguf`` continues the training of a target this script made (the shipped one included): the
target starts from the file's dequantised weights (the same rebuild and check as ``--target-gguf``),
trains for ``--target-seconds`` (a fresh optimiser; the learning rate warms up again), and is then
quantised, healed and exported like a new one, so every ``model.gguf`` is also a checkpoint to go on
from; with ``--drafter-init`` the drafter starts from that target's support file.  A drafter run
against a ``--target-gguf`` spends a third of a 10-minute budget making greedy continuations;
``--save-continuations`` writes them to ``OUT/continuations.npz.xz`` (``demo_corpus.save_continuations``:
ids, the target's sha256, lengths, seed) and ``--continuations FILE …`` trains a later run on them
instead (refused for another target, other lengths or the same seed twice).

**Target.**  transformers' own ``DeepseekV4ForCausalLM`` with :func:`demo_config`: the tiny layout
of spec ds4.md §6 (hidden 256, 6 layers: 2 sliding, 2 compressed-sparse with the lightning
indexer, 2 heavily-compressed; 1 hash-routed and 5 learned-routed MoE layers of 16 experts, 6 used;
4 hyper-connection streams) with a 64-token sliding window and indexer top-16, trained from
scratch with AdamW on random 512-token windows of the corpus, bf16 autocast, for a fixed wall-clock
budget (the learning-rate schedule is a function of elapsed time so that the run ends on time).
Token ids that never occur in the training split start (and therefore stay) identical: zero
embedding rows, equal LM-head rows — so the exported GGUF compresses to a fraction of its size.
The loss uses that (``--loss-vocab seen``, the default since 2026-12-03; :class:`SeenHead`): the
log-sum-exp over the vocabulary is taken over the seen ids' logits and one logit for the never-seen
ids, with the same value, gradients and clipped AdamW step as over every row, and a third of the
logits (the float32 logits over 129280 ids were a third of a step's kernel time on an H200 and
what ran out of memory at 192 windows a step; tools/gpu_notes.md).
The hash-routing table gets 6 distinct random experts per seen token.

**Drafter** (spec dspark.md §1-§2, the reference anchor layout of §2.5): 3 stages (sliding-window
attention over the support window + the whole block, non-causal, with sinks; learned-routed MoE;
hyper-connections), block 5, Markov rank 32 (vanilla head), confidence head on ``[h_k ; W1[x_{k-1}]]``
with the pre-norm ``h_k``, capture of the last three target layers (stream means after each layer).
:class:`Drafter` keeps its parameters in the GGUF tensor shapes of
``ds4tui.engine.layout.support_tensor_specs`` and computes exactly what
``ds4tui.engine.reference.ReferenceDrafter`` computes (no FP8 simulation).  Training: frozen target,
random anchors ``a`` in random windows; block input ``[x_a, noise×4]`` at positions ``a … a+4``;
row ``k`` is trained towards the target's distribution at ``a+k`` (the token after ``a+k``):
``0.5·CE(argmax) + 0.5·‖p_d − p_t‖₁ + 1.0·BCE(c_k, hit_k)`` (:class:`LossWeights`; ``hit_k``: the
drafter's argmax equals the target's, which is what greedy verification accepts), rows weighted by
``exp(−k/4)`` (DSpark paper §3.3; released config ``loss_decay_gamma = 4``); the Markov head is
teacher-forced with the target's argmax tokens.  **Self-distillation**: every second batch is
windows of the healed target's own greedy continuations of training prompts (anchors in the
generated part), the text the drafter drafts against when the target decodes greedily.  The
confidence head is then calibrated (temperature scaling against the greedy hits on continuations
of held-out prompts, folded into its weight).

**Quantise and heal.**  The routed experts are then replaced by what their q2-mix bytes decode to
(IQ2_XXS gate/up, Q2_K down: about a third of each weight is rounding error at 2 bits) and every
other parameter trains on for ``--heal-seconds`` with the experts frozen, so the target the drafter
learns from — and the one ``model.gguf`` holds — is the quantised one.  The drafter gets the same
treatment with ``--drafter-heal-seconds``: after its training its routed experts are frozen at q2
values — the bytes of the ``--drafter-init`` file when the drafter did not train before
(``--drafter-seconds 0``), else its trained experts quantised — and every other drafter parameter
trains on (same losses, self-distillation, then calibration); ``support.gguf`` then holds those
experts' bytes exactly as frozen (no re-quantisation) and the healed rest in the usual q2-mix types.
The log measures the drafter at each step on the same held-out anchors (:func:`drafter_heldout`):
``drafter_init`` (the file it started from, as decoded), ``drafter`` (after training, float),
``drafter_heal`` (``after_freezing`` and after healing) and ``drafter_exported`` (every tensor
decoded from the written ``support.gguf``: what the engine runs).

**Export**: the target through ``save_pretrained`` and ds4tui's converter (q2 mix, Q8_0 token
embedding), the drafter through ``write_support_gguf`` (q2 mix).  ``OUT_DIR`` gets
``model.gguf``, ``support.gguf``, ``train_log.json`` (losses, steps, speeds, config, seeds,
versions) and ``hf/`` (the transformers checkpoint).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as _exc:  # not a ds4tui dependency: one line, not a traceback (even for --help)
    raise SystemExit(f"train_demo.py: needs torch and transformers >= 5.23 (DeepseekV4ForCausalLM), which are not "
                     f"ds4tui dependencies ({_exc}); install them, e.g. pip install torch 'transformers>=5.23', "
                     f"on a machine with a CUDA GPU (--device cpu runs a smoke test)") from None

from ds4tui.devtools.make_test_model import hf_config_json, tiny_config
from ds4tui.engine import layout as L
from ds4tui.engine.convert import SupportParams, convert, write_support_gguf
from ds4tui.engine.layout import DS4Config

NOISE_TOKEN = 128799
"""Mask/noise token of the drafter's block (spec dspark.md §2.1)."""
BLOCK = 5
RANK = 32
SEQ = 512


def demo_config() -> DS4Config:
    """The demo model's shape: spec ds4.md §6 'tiny' with a 64-token window, indexer top-16, 1 hash layer."""
    return dataclasses.replace(tiny_config(), sliding_window=64, indexer_top_k=16, n_hash_layer=1)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def lr_at(frac: float, peak: float, warm: float = 0.03) -> float:
    """Linear warm-up over the first ``warm`` of the budget, then cosine to 10 % of ``peak``."""
    if frac < warm:
        return peak * frac / warm
    t = min(1.0, (frac - warm) / (1.0 - warm))
    return peak * (0.1 + 0.45 * (1.0 + math.cos(math.pi * t)))


def timed_steps(opt, params, seconds: float, peak_lr: float, step_fn, head: "SeenHead | None" = None):
    """Optimiser steps until ``seconds`` of wall clock have passed, the learning rate following :func:`lr_at`.

    ``step_fn()`` returns ``(loss, extra)``; yields ``(step, elapsed_s, loss, grad_norm, extra)`` after each
    step (gradients clipped to norm 1 over ``params``).  With ``head`` (a loss from :meth:`SeenHead.loss`)
    the norm also counts the gradient every unseen LM-head row would have had (:meth:`SeenHead.extra_sq`)
    and the unseen rows are set to their representative after each step, so the step is the one the
    full-vocabulary loss takes.
    """
    if seconds <= 0:
        return
    t0, step = time.time(), 0
    while (frac := (time.time() - t0) / seconds) < 1.0:
        for group in opt.param_groups:
            group["lr"] = lr_at(frac, peak_lr)
        loss, extra = step_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if head is None:
            gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        else:
            gn = clip_with_unseen_rows(params, head)
        opt.step()
        if head is not None:
            head.tie()
        step += 1
        yield step, time.time() - t0, float(loss.detach()), float(gn), extra


def clip_with_unseen_rows(params, head: "SeenHead", max_norm: float = 1.0) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)`` as if every unseen LM-head row had its gradient
    (the representative's): the same total norm and scale as the full-vocabulary loss's step."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum() + head.extra_sq()
    total = sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.detach().mul_(coef.to(g.dtype))
    return total


class SeenHead:
    """The LM head's cross-entropy over the whole vocabulary, computed from the seen ids' rows.

    Token ids that never occur in the training split keep equal LM-head rows (:func:`build_target`;
    a GGUF this script wrote stores them equal), so their ``n`` logits are one value ``z_u`` and the
    log-sum-exp over the vocabulary is the one over the seen logits and ``z_u + log n``: exact, with a
    ``[N, seen + 1]`` logit matrix instead of ``[N, V]`` (38 136 columns instead of 129 280 on the demo
    corpus).  The representative row (the first unseen id) gets the gradient of one unseen row (the
    merged logit's gradient divided by ``n``), so AdamW moves it as it moves each unseen row under
    the full loss; :meth:`tie` copies it to the others after each step and :meth:`extra_sq` adds
    their ``n - 1`` gradients to the clipping norm.  A target id that is unseen (held-out text) has
    logit ``z_u``: the loss is exact for it too, but its gradient would reach the representative at
    1/n, so the training targets (the train split's ids, seen by definition) are the only ones to
    train on.
    """

    def __init__(self, weight: torch.Tensor, seen: np.ndarray):
        ids, unseen = np.flatnonzero(seen), np.flatnonzero(seen == 0)
        if unseen.size == 0:
            raise ValueError("SeenHead: every token id is seen in training; use the full loss")
        self.weight, self.n = weight, int(unseen.size)
        dev = weight.device
        self.ids = torch.from_numpy(ids).to(dev)
        self.unseen = torch.from_numpy(unseen).to(dev)
        self.rep = int(unseen[0])
        remap = np.full(seen.size, -1, np.int64)
        remap[ids] = np.arange(ids.size)
        self.remap = torch.from_numpy(remap).to(dev)
        with torch.no_grad():
            spread = float((weight[self.unseen] - weight[self.rep]).abs().max())
        if spread > 1e-6:
            raise ValueError(f"SeenHead: the LM head's {self.n} unseen rows differ by up to {spread:g} "
                             "(expected equal rows: a model this script built or exported)")

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy (nats) of ``hidden[..., H]`` (autocast as the caller's) against ``targets``."""
        h = hidden.reshape(-1, hidden.shape[-1])
        t = targets.reshape(-1)
        w_u = self.weight[self.rep]
        w_u = w_u / self.n + (w_u - w_u / self.n).detach()  # the value of w_u, 1/n of its gradient
        z = (h @ self.weight[self.ids].t()).float()
        z_u = (h @ w_u).float()
        lse = torch.logsumexp(torch.cat((z, (z_u + math.log(self.n))[:, None]), dim=1), dim=1)
        col = self.remap[t]
        z_t = torch.where(col >= 0, z.gather(1, col.clamp(min=0)[:, None])[:, 0], z_u)
        return (lse - z_t).mean()

    def extra_sq(self) -> torch.Tensor:
        """The squared norm the other ``n - 1`` unseen rows' gradients add under the full loss."""
        g = self.weight.grad
        if g is None:
            return torch.zeros((), device=self.weight.device)
        return (self.n - 1) * g[self.rep].detach().float().pow(2).sum()

    @torch.no_grad()
    def tie(self) -> None:
        """Copy the representative row to every unseen row."""
        self.weight[self.unseen] = self.weight[self.rep].clone()


def seen_with_distinct_rows(seen: np.ndarray, weight: torch.Tensor) -> tuple[np.ndarray, int]:
    """``seen`` (uint8 ``[V]``) plus every id whose LM-head row (``weight[V, H]``) differs from the row
    most unseen ids share, and how many were added.

    A target read from a GGUF (``--target-init``, ``--target-gguf``) on a corpus whose seen ids differ
    from the one it was trained on holds trained rows for ids this corpus never shows; :class:`SeenHead`
    needs the rows it merges equal and the export ties unseen rows (:func:`tie_unseen`), so those ids
    count as seen (their own logits; as training targets they never occur).  Ids this corpus adds
    already have the shared row.  Raises nothing; ``seen`` is not modified."""
    unseen = np.flatnonzero(seen == 0)
    if unseen.size == 0:
        return seen, 0
    with torch.no_grad():
        rows = weight[torch.from_numpy(unseen).to(weight.device)]
        _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
        distinct = (inverse != int(torch.argmax(counts))).cpu().numpy()
    out = seen.copy()
    out[unseen[distinct]] = 1
    return out, int(distinct.sum())


class Windows:
    """Random ``length``-token windows of a token array (seeded generator, int64 on ``device``)."""

    def __init__(self, tokens: np.ndarray, length: int, device: str, seed: int):
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.length, self.device = length, device
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, n: int) -> torch.Tensor:
        start = torch.randint(0, self.tokens.numel() - self.length, (n,), generator=self.gen)
        idx = start[:, None] + torch.arange(self.length)[None, :]
        return self.tokens[idx].to(self.device)

    def fixed(self, n: int) -> torch.Tensor:
        """``n`` evenly spaced windows (the same every call)."""
        start = torch.linspace(0, self.tokens.numel() - self.length - 1, n).long()
        return self.tokens[start[:, None] + torch.arange(self.length)[None, :]].to(self.device)


# ---- target ----------------------------------------------------------------------------------

def build_target(c: DS4Config, seen: np.ndarray, work: Path, seed: int, device: str):
    import transformers

    torch.manual_seed(seed)
    (work / "hf").mkdir(parents=True, exist_ok=True)
    (work / "hf" / "config.json").write_text(json.dumps(hf_config_json(c), indent=1))
    cfg = transformers.AutoConfig.from_pretrained(str(work / "hf"))
    cfg._attn_implementation = "eager"
    model = transformers.DeepseekV4ForCausalLM(cfg)
    unseen = torch.from_numpy(seen == 0)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        keep = emb[NOISE_TOKEN].clone()
        emb[unseen] = 0.0
        emb[NOISE_TOKEN] = keep  # the drafter's mask input needs a non-zero row
        model.lm_head.weight[unseen] = 0.0
        for i in range(c.n_hash_layer):
            table = torch.stack([torch.randperm(c.n_expert, generator=g)[:c.n_expert_used] for _ in range(c.n_vocab)])
            table[unseen] = torch.arange(c.n_expert_used)
            model.model.layers[i].mlp.gate.tid2eid.copy_(table)
    return model.to(device)


def lm_loss(model, ids: torch.Tensor, head: SeenHead | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over a ``[B, T]`` batch (over the seen ids' rows with ``head``)."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16):
        hidden = model.model(input_ids=ids[:, :-1], use_cache=False).last_hidden_state
        if head is not None:
            return head.loss(hidden, ids[:, 1:])
        logits = model.lm_head(hidden)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def train_target(model, train: Windows, held: torch.Tensor, seconds: float, batch: int, peak_lr: float,
                 label: str = "target", head: SeenHead | None = None) -> dict:
    """AdamW on every parameter that requires grad, for ``seconds`` of wall clock; returns the log.

    With ``head`` the loss is computed over the seen ids' LM-head rows (:class:`SeenHead`: the same
    loss and step as over the whole vocabulary, a fraction of the logits)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in named if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=peak_lr, betas=(0.9, 0.95), eps=1e-8)
    history, tokens = [], 0
    model.train()

    def one() -> tuple[torch.Tensor, dict]:
        return lm_loss(model, train.batch(batch), head), {}

    step, t0 = 0, time.time()
    for step, elapsed, loss, gn, _ in timed_steps(opt, [p for _, p in named], seconds, peak_lr, one, head):
        tokens += batch * (train.length - 1)
        if step % 25 == 0 or step == 1:
            rec = {"step": step, "s": round(elapsed, 1), "tokens": tokens, "lr": opt.param_groups[0]["lr"],
                   "train_loss": round(loss, 4), "grad_norm": round(gn, 3)}
            if step % 100 == 0 or step == 1:
                rec["heldout_loss"] = round(evaluate(model, held), 4)
                model.train()
            history.append(rec)
            log(f"{label} {json.dumps(rec)}")
    final = {"steps": step, "tokens": tokens, "seconds": round(time.time() - t0, 1),
             "heldout_loss": round(evaluate(model, held), 4)}
    log(f"{label} done {json.dumps(final)}")
    return {"history": history, **final}


@torch.no_grad()
def quantize_experts(model) -> tuple[dict, dict]:
    """Replace every routed expert matrix by the values its q2-mix GGUF bytes decode to.

    Gate/up rows become IQ2_XXS, down rows Q2_K (``ds4tui.engine.quants``, the converter's own
    quantiser, block by block along each row).  Returns the full-precision originals (the export
    writes those, and the converter's deterministic quantiser turns them into exactly these values)
    and the relative error per type.
    """
    from gguf import GGMLQuantizationType as QT

    from ds4tui.engine.quants import quantize_with_reconstruction

    originals, err = {}, {"IQ2_XXS": [], "Q2_K": []}
    for i, layer in enumerate(model.model.layers):
        ex = layer.mlp.experts
        originals[i] = (ex.gate_up_proj.detach().clone(), ex.down_proj.detach().clone())
        for param, qt in ((ex.gate_up_proj, QT.IQ2_XXS), (ex.down_proj, QT.Q2_K)):
            x = param.detach().float().cpu().numpy()
            v = quantize_with_reconstruction(x, qt).values
            err[qt.name].append(float(np.abs(v - x).mean() / np.abs(x).mean()))
            param.copy_(torch.from_numpy(v).to(param.device, param.dtype))
    return originals, {k: round(float(np.mean(v)), 4) for k, v in err.items()}


def set_experts(model, values: dict) -> None:
    with torch.no_grad():
        for i, (gu, dn) in values.items():
            model.model.layers[i].mlp.experts.gate_up_proj.copy_(gu)
            model.model.layers[i].mlp.experts.down_proj.copy_(dn)


@contextlib.contextmanager
def full_precision_experts(model, originals: dict | None):
    """Inside the block the model holds the full-precision experts (``originals``); after it, the quantised ones."""
    if not originals:
        yield
        return
    quantised = {i: (l.mlp.experts.gate_up_proj.detach().clone(), l.mlp.experts.down_proj.detach().clone())
                 for i, l in enumerate(model.model.layers)}
    set_experts(model, {i: (a.to(quantised[i][0].device, quantised[i][0].dtype),
                            b.to(quantised[i][1].device, quantised[i][1].dtype)) for i, (a, b) in originals.items()})
    try:
        yield
    finally:
        set_experts(model, quantised)


@torch.no_grad()
def evaluate(model, held: torch.Tensor) -> float:
    model.eval()
    return float(torch.stack([lm_loss(model, held[i:i + 8]) for i in range(0, held.shape[0], 8)]).mean())


def target_from_gguf(c: DS4Config, gguf_path: Path, work: Path, seed: int, device: str,
                     held: np.ndarray, n_check: int = 64):
    """transformers' model holding exactly the weights ``gguf_path`` decodes to (Q8_0 and q2 rows
    dequantised), so that a drafter can be trained on the shipped target without its checkpoint.

    The checkpoint names come from a fresh model's ``save_pretrained`` and the converter's own
    name table (``ds4tui.engine.convert``) read backwards.  Returns ``(model, check)``: ``check``
    compares the model's logits (fp32, eager) with ``ReferenceModel(numerics="transformers")`` on
    the GGUF over ``n_check`` held-out tokens (equal up to float32 rounding when the mapping is
    right); raises ValueError naming the tensor when a checkpoint tensor has no GGUF source.
    """
    import transformers
    from safetensors.torch import save_file

    from ds4tui.engine import convert as C
    from ds4tui.engine.reference import ReferenceModel

    fresh = build_target(c, np.ones(c.n_vocab, np.uint8), work, seed, "cpu")
    fresh.save_pretrained(str(work / "hf_fresh"))
    del fresh
    ckpt = C.HFCheckpoint(work / "hf_fresh")
    src = C._Sources(ckpt, c.n_expert)
    ref = ReferenceModel(gguf_path, numerics="transformers")
    tensors: dict[str, torch.Tensor] = {}
    dtypes = {"I64": torch.int64, "I32": torch.int32}
    for spec in L.model_tensor_specs(ref.config):
        info = ref.w.info(spec.name)
        name = spec.name
        arr = (np.asarray(info.data).reshape(info.shape) if info.type.name in ("I8", "I16", "I32", "I64")
               else np.asarray(ref.w.get(name)))
        if name in C.GLOBAL_SOURCES:
            pairs = [(src._find(C.GLOBAL_SOURCES[name], name), arr)]
        else:
            layer, suffix = int(name.split(".")[1]), name.split(".", 2)[2]
            if suffix in C.EXPERT_SOURCES:
                w = C.EXPERT_SOURCES[suffix]
                pairs = [(src._find(src._layer_cands(layer, f"ffn.experts.{e}.{w}.weight"), name), arr[e])
                         for e in range(spec.shape[0])]
            else:
                pairs = [(src._find([x for leaf in C.LAYER_SOURCES[suffix] for x in src._layer_cands(layer, leaf)],
                                    name), arr)]
        for ck, a in pairs:
            e = ckpt.entries[ck]
            tensors[ck] = torch.from_numpy(np.ascontiguousarray(a).reshape(e.shape)).to(dtypes.get(e.dtype, torch.float32))
    missing = sorted(set(ckpt.entries) - set(tensors))
    if missing:
        raise ValueError(f"{gguf_path}: no GGUF tensor for checkpoint tensors {missing[:5]} (of {len(missing)})")
    (work / "hf_gguf").mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(work / "hf_gguf" / "model.safetensors"), metadata={"format": "pt"})
    (work / "hf_gguf" / "config.json").write_text((work / "hf_fresh" / "config.json").read_text())
    model = transformers.DeepseekV4ForCausalLM.from_pretrained(str(work / "hf_gguf"), attn_implementation="eager",
                                                               dtype=torch.float32)
    ids = [int(t) for t in held[:n_check]]
    with torch.no_grad():
        hf = model.eval()(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()
    r = ref.prefill(ref.new_state(n_check + 8), ids, logits="all")
    check = {"tokens": n_check, "max_abs_logit_diff_vs_reference": float(np.abs(r.logits - hf).max()),
             "logit_std": float(hf.std()), "argmax_agreement": float((r.logits.argmax(-1) == hf.argmax(-1)).mean())}
    log(f"target from {gguf_path}: {json.dumps(check)}")
    return model.to(device), check


def init_drafter_from_gguf(drafter: "Drafter", ref_model: Path, support: Path) -> None:
    """Start ``drafter`` from the tensors ``support`` decodes to (a warm start for more training)."""
    from ds4tui.engine.reference import ReferenceDrafter, ReferenceModel

    rd = ReferenceDrafter(ReferenceModel(ref_model, numerics="transformers"), support)
    with torch.no_grad():
        for s in drafter.specs:
            drafter.p(s.name).copy_(torch.from_numpy(np.asarray(rd.w.get(s.name), np.float32).reshape(s.shape)))


# ---- drafter ---------------------------------------------------------------------------------

def _rms(x: torch.Tensor, eps: float, w: torch.Tensor | None = None) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


class Drafter(nn.Module):
    """The DSpark drafter in torch, parameters named and shaped as the support GGUF's tensors.

    ``forward(ids[S, N], caps[S, N, n_capture·H], anchors[A])`` → ``(logits_base[S, A·B, V],
    h[S, A·B, H])``: ``caps`` are the captured target rows (stream means of the capture layers,
    concatenated in layer order); anchors are positions ``a`` (block at ``a … a+B-1``, context
    ``max(0, a-W) … a-1``).  Follows ``ReferenceDrafter`` (spec dspark.md §2.3-§2.4).
    """

    def __init__(self, c: DS4Config, embed: torch.Tensor, head: torch.Tensor, seen: np.ndarray, seed: int):
        super().__init__()
        self.c = c
        self.specs = L.support_tensor_specs(c, 3, 3, RANK)
        self.embed, self.head = embed, head  # frozen target tensors [V, H]
        g = torch.Generator().manual_seed(seed)
        unseen = torch.from_numpy(seen == 0)
        self.w = nn.ParameterDict()
        for s in self.specs:
            name, shape = s.name, s.shape
            if name.endswith(("_scale.weight",)) or (name.endswith("norm.weight")):
                t = torch.ones(shape)
            elif name.endswith(("_base.weight", "attn_sinks.weight", "exp_probs_b.bias", "confidence_head.proj.weight")):
                t = torch.zeros(shape)
            else:
                t = torch.randn(shape, generator=g) * 0.02
            if "markov" in name:
                t[unseen] = 0.0
            self.w[name.replace(".", "__")] = nn.Parameter(t, requires_grad=not name.endswith("exp_probs_b.bias"))
        half = c.n_rot // 2
        self.register_buffer("freq", (c.rope_freq_base ** (-2.0 * torch.arange(half, dtype=torch.float64) / c.n_rot)).float())

    def p(self, name: str) -> torch.Tensor:
        return self.w[name.replace(".", "__")]

    def tensors(self) -> dict[str, np.ndarray]:
        return {s.name: self.p(s.name).detach().float().cpu().numpy() for s in self.specs}

    def rope(self, x: torch.Tensor, pos: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """Interleaved RoPE on the last ``n_rot`` lanes; ``x[S, T, ..., D]``, ``pos[T]``."""
        ang = pos.float()[:, None] * self.freq[None, :]
        shape = (1, pos.numel()) + (1,) * (x.dim() - 3) + (self.freq.numel(),)
        cos, sin = ang.cos().view(shape), ang.sin().view(shape)
        if inverse:
            sin = -sin
        d = x.shape[-1] - self.c.n_rot
        a, b = x[..., d::2], x[..., d + 1::2]
        tail = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        return torch.cat((x[..., :d], tail), dim=-1)

    def hc_pre(self, X, pre_name):
        c, HC = self.c, self.c.hc_count
        fn, base, scale = (self.p(pre_name + k) for k in ("fn.weight", "base.weight", "scale.weight"))
        m = _rms(X.flatten(-2), c.rms_eps) @ fn.T
        pre = torch.sigmoid(scale[0] * m[..., :HC] + base[:HC]) + c.hc_eps
        post = 2.0 * torch.sigmoid(scale[1] * m[..., HC:2 * HC] + base[HC:2 * HC])
        comb = (scale[2] * m[..., 2 * HC:] + base[2 * HC:]).unflatten(-1, (HC, HC))
        comb = torch.softmax(comb, dim=-1) + c.hc_eps
        comb = comb / (comb.sum(-2, keepdim=True) + c.hc_eps)
        for _ in range(c.hc_sinkhorn_iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + c.hc_eps)
            comb = comb / (comb.sum(-2, keepdim=True) + c.hc_eps)
        return torch.einsum("sta,stad->std", pre, X), post, comb

    @staticmethod
    def hc_post(X, out, post, comb):
        return post[..., None] * out[..., None, :] + torch.einsum("stab,stad->stbd", comb, X)

    def kv(self, pre: str, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.rope(_rms(x @ self.p(pre + "attn_kv.weight").T, self.c.rms_eps, self.p(pre + "attn_kv_a_norm.weight")), pos)

    def moe(self, pre: str, x: torch.Tensor) -> torch.Tensor:
        c = self.c
        scores = torch.sqrt(F.softplus(x @ self.p(pre + "ffn_gate_inp.weight").T))
        idx = torch.topk(scores + self.p(pre + "exp_probs_b.bias"), c.n_expert_used, dim=-1).indices
        wsel = scores.gather(-1, idx)
        wsel = wsel / (wsel.sum(-1, keepdim=True) + 1e-20) * c.expert_weights_scale
        gates = torch.zeros_like(scores).scatter(-1, idx, wsel)  # [S, T, E]
        clamp = c.swiglu_clamp[-1]
        a = torch.einsum("std,efd->stef", x, self.p(pre + "ffn_gate_exps.weight")).clamp(max=clamp)
        b = torch.einsum("std,efd->stef", x, self.p(pre + "ffn_up_exps.weight")).clamp(-clamp, clamp)
        y = torch.einsum("stef,edf,ste->std", F.silu(a) * b, self.p(pre + "ffn_down_exps.weight"), gates)
        cs = c.swiglu_clamp_shexp[-1] if c.swiglu_clamp_shexp else clamp
        sa = (x @ self.p(pre + "ffn_gate_shexp.weight").T).clamp(max=cs)
        sb = (x @ self.p(pre + "ffn_up_shexp.weight").T).clamp(-cs, cs)
        return y + (F.silu(sa) * sb) @ self.p(pre + "ffn_down_shexp.weight").T

    def forward(self, ids: torch.Tensor, caps: torch.Tensor, anchors: torch.Tensor):
        c, S, N = self.c, ids.shape[0], ids.shape[1]
        A, B, NH, D, W = anchors.numel(), BLOCK, c.n_head, c.head_dim, c.sliding_window
        dev = ids.device
        mx = _rms(caps @ self.p("mtp.0.main_proj.weight").T, c.rms_eps, self.p("mtp.0.main_norm.weight"))
        ctx_pos = torch.arange(N, device=dev)
        blk_pos = (anchors[:, None] + torch.arange(B, device=dev)[None, :]).reshape(-1)  # [A·B]
        inputs = torch.full((S, A, B), NOISE_TOKEN, dtype=torch.long, device=dev)
        inputs[:, :, 0] = ids[:, anchors]
        X = self.embed[inputs.reshape(S, A * B)][:, :, None, :].expand(S, A * B, c.hc_count, c.n_embd)
        # visibility [A·B, N + A·B]: the window of context rows before the anchor, and the own block
        a_of_row = anchors.repeat_interleave(B)
        ctx_vis = (ctx_pos[None, :] < a_of_row[:, None]) & (ctx_pos[None, :] >= a_of_row[:, None] - W)
        blk_of_row = torch.arange(A, device=dev).repeat_interleave(B)
        blk_vis = blk_of_row[:, None] == blk_of_row[None, :]
        visible = torch.cat((ctx_vis, blk_vis), dim=1)
        for s in range(3):
            pre = f"mtp.{s}."
            x, post, comb = self.hc_pre(X, pre + "hc_attn_")
            x = _rms(x, c.rms_eps, self.p(pre + "attn_norm.weight"))
            qr = _rms(x @ self.p(pre + "attn_q_a.weight").T, c.rms_eps, self.p(pre + "attn_q_a_norm.weight"))
            q = self.rope(_rms((qr @ self.p(pre + "attn_q_b.weight").T).unflatten(-1, (NH, D)), c.rms_eps), blk_pos)
            keys = torch.cat((self.kv(pre, mx, ctx_pos), self.kv(pre, x, blk_pos)), dim=1)  # [S, N+AB, D]
            sc = torch.einsum("sthd,srd->shtr", q, keys) / math.sqrt(D)
            sc = sc.masked_fill(~visible[None, None], float("-inf"))
            sink = self.p(pre + "attn_sinks.weight").view(1, NH, 1, 1).expand(S, NH, A * B, 1)
            prob = torch.softmax(torch.cat((sc, sink), dim=-1), dim=-1)[..., :-1]
            o = self.rope(torch.einsum("shtr,srd->sthd", prob, keys), blk_pos, inverse=True)
            G, R = c.o_groups, c.o_lora_rank
            wa = self.p(pre + "attn_output_a.weight").view(G, R, -1)
            u = torch.einsum("stgi,gri->stgr", o.reshape(S, A * B, G, -1), wa).reshape(S, A * B, G * R)
            X = self.hc_post(X, u @ self.p(pre + "attn_output_b.weight").T, post, comb)
            x, post, comb = self.hc_pre(X, pre + "hc_ffn_")
            X = self.hc_post(X, self.moe(pre, _rms(x, c.rms_eps, self.p(pre + "ffn_norm.weight"))), post, comb)
        last = "mtp.2."
        f = _rms(X.flatten(-2), c.rms_eps)
        wh = torch.sigmoid(self.p(last + "hc_head_scale.weight")[0] * (f @ self.p(last + "hc_head_fn.weight").T)
                           + self.p(last + "hc_head_base.weight")) + c.hc_eps
        h = torch.einsum("sta,stad->std", wh, X)
        base = _rms(h, c.rms_eps, self.p(last + "norm.weight")) @ self.head.T
        return base, h

    def markov(self, prev: torch.Tensor):
        """``W1[prev]`` and the bias ``W2·W1[prev]`` for token ids ``prev[...]``."""
        m = self.p("mtp.2.markov_head.markov_w1.weight")[prev]
        return m, m @ self.p("mtp.2.markov_head.markov_w2.weight").T

    def confidence_logit(self, h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return torch.cat((h, m), dim=-1) @ self.p("mtp.2.confidence_head.proj.weight").reshape(-1)


def capture(model, capture_layers):
    """Forward hooks that keep the stream mean of each capture layer's output."""
    store: dict[int, torch.Tensor] = {}
    hooks = [model.model.layers[i].register_forward_hook(
        lambda mod, args, out, i=i: store.__setitem__(i, out.float().mean(dim=2))) for i in capture_layers]
    return store, hooks


def drafter_step(model, drafter: Drafter, ids: torch.Tensor, anchors: torch.Tensor, capture_layers, store,
                 w: "LossWeights"):
    """Loss terms of one drafter batch (see the module docstring) and acceptance statistics."""
    S, A, B = ids.shape[0], anchors.numel(), BLOCK
    with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16):
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # [S, N, H], normed
        rows = (anchors[:, None] + torch.arange(B, device=ids.device)[None, :]).reshape(-1)
        tlog = model.lm_head(hidden[:, rows]).float()  # [S, A·B, V]: target at a+k predicts a+k+1
    caps = torch.cat([store[i] for i in capture_layers], dim=-1)
    p_t = torch.softmax(tlog, dim=-1)
    y = tlog.argmax(-1)  # [S, A·B]
    with torch.autocast(ids.device.type, dtype=torch.bfloat16):
        base, h = drafter(ids, caps, anchors)
    prev = torch.cat((ids[:, anchors][:, :, None], y.view(S, A, B)[:, :, :-1]), dim=2).reshape(S, A * B)
    m, bias = drafter.markov(prev)
    logits = base.float() + bias.float()
    logp = torch.log_softmax(logits, dim=-1)
    ce = -logp.gather(-1, y[..., None])[..., 0]
    tv = (logp.exp() - p_t).abs().sum(-1)
    hit_row = (logits.argmax(-1) == y).float()
    if w.confidence == "greedy":
        target_c = hit_row.detach()  # greedy verification accepts row k exactly when the argmaxes agree
    else:
        target_c = (1.0 - 0.5 * tv).clamp(0, 1).detach()  # acceptance probability under sampling
    c_logit = drafter.confidence_logit(h.float(), m.float())
    bce = F.binary_cross_entropy_with_logits(c_logit, target_c, reduction="none")
    k = torch.arange(A * B, device=ids.device) % B
    wk = torch.exp(-k.float() / w.gamma)
    wk = wk / wk.sum()
    loss = ((w.ce * ce + w.tv * tv + w.bce * bce) * wk).sum(-1).mean()
    with torch.no_grad():
        hit = hit_row.view(S, A, B)
        conf = torch.sigmoid(c_logit).view(S, A, B)
        stats = {"ce": float((ce * wk).sum(-1).mean()), "tv": float((tv * wk).sum(-1).mean()),
                 "bce": float((bce * wk).sum(-1).mean()), "hit_per_pos": hit.mean(dim=(0, 1)).tolist(),
                 "accept_len": float(hit.cumprod(-1).sum(-1).mean()),
                 "confidence_per_pos": conf.mean(dim=(0, 1)).tolist()}
    return loss, stats, (c_logit.detach().reshape(-1), hit_row.detach().reshape(-1))


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """Drafter loss: ``ce``·CE(target argmax) + ``tv``·‖p_d − p_t‖₁ + ``bce``·BCE(confidence), rows
    weighted by ``exp(−k/gamma)``; the confidence is trained towards the greedy hit (``"greedy"``) or
    towards ``1 − ½‖p_d − p_t‖₁`` (``"tv"``, the acceptance probability under sampling)."""

    ce: float = 0.5
    tv: float = 0.5
    bce: float = 1.0
    gamma: float = 4.0
    confidence: str = "greedy"


@torch.no_grad()
def generate_greedy(model, prompts: torch.Tensor, n_new: int, chunk: int = 256,
                    seconds: float | None = None, kv_cache: bool = True, bf16: bool = True) -> torch.Tensor:
    """Greedy continuations of ``prompts[S, P]`` by the target: ``[S', P + n_new]`` token ids.

    ``chunk`` sequences at a time under bf16 autocast (float32 with ``bf16=False``); the argmax is
    taken from the last position's logits.  With ``kv_cache`` (``--distill-kv-cache on``, the
    default) the prompt runs once and each new token once against transformers' DeepSeek V4 cache
    (its sliding-window, compressor and indexer states); without it every step runs the whole
    sequence again, ~(P + n_new / 2) times the work a token.  Both pick the same tokens in float32
    (tests/test_train_demo_generate.py); under bf16 a near tie may resolve differently, as any
    change of batch shape can.  With ``seconds``, no new chunk is started once that much wall clock
    has passed, so ``S'`` can be less than ``S`` (a whole number of chunks, at least one).
    """
    model.eval()
    out, t0 = [], time.time()
    for i in range(0, prompts.shape[0], chunk):
        if out and seconds is not None and time.time() - t0 >= seconds:
            break
        ids, cache, step = prompts[i:i + chunk], None, prompts[i:i + chunk]
        for _ in range(n_new):
            with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
                if kv_cache:
                    o = model.model(input_ids=step, past_key_values=cache, use_cache=True)
                    cache = o.past_key_values
                else:
                    o = model.model(input_ids=ids, use_cache=False)
                nxt = model.lm_head(o.last_hidden_state[:, -1]).float().argmax(-1)
            ids, step = torch.cat((ids, nxt[:, None]), dim=1), nxt[:, None]
        out.append(ids)
    return torch.cat(out)


def fit_confidence_scale(logits: torch.Tensor, hits: torch.Tensor) -> tuple[float, float, float]:
    """The scale ``s`` of the confidence logit that minimises the BCE against the greedy hits
    (temperature scaling, grid 0.25…4); returns ``(s, bce_before, bce_after)``."""
    grid = torch.exp(torch.linspace(math.log(0.25), math.log(4.0), 49, device=logits.device))
    losses = torch.stack([F.binary_cross_entropy_with_logits(s * logits, hits) for s in grid])
    best = int(losses.argmin())
    return float(grid[best]), float(F.binary_cross_entropy_with_logits(logits, hits)), float(losses[best])


def calibration(logits: torch.Tensor, hits: torch.Tensor, bins: int = 10) -> float:
    """Expected calibration error of ``sigmoid(logits)`` against the 0/1 ``hits`` (equal-width bins)."""
    p = torch.sigmoid(logits)
    idx = (p * bins).long().clamp(max=bins - 1)
    err = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            err += float(sel.float().mean()) * abs(float(p[sel].mean()) - float(hits[sel].mean()))
    return err


def pick_anchors(n: int, lo: int, count: int, gen: torch.Generator, device) -> torch.Tensor:
    """``count`` sorted distinct anchors in ``lo … n − BLOCK − 1`` (on ``device``)."""
    span = n - BLOCK - lo
    return torch.sort(torch.randperm(span, generator=gen)[:count] + lo).values.to(device)


def train_drafter(model, drafter, train: Windows, held: torch.Tensor, c: DS4Config, seconds: float, batch: int,
                  anchors_per_seq: int, peak_lr: float, seed: int, w: LossWeights,
                  generated: torch.Tensor | None = None, prompt_len: int = 0,
                  held_generated: torch.Tensor | None = None, corpus_every: int = 2,
                  label: str = "drafter") -> dict:
    """Train the drafter's parameters that require grad against the frozen target for ``seconds``.

    With ``generated`` (``[G, P + n]`` greedy continuations of the target, ``P = prompt_len``), every
    batch but each ``corpus_every``-th is windows of those sequences with anchors in the generated
    part (``corpus_every = 2``: every second batch): the drafter learns the target on the target's
    own outputs (self-distillation), which is what it drafts against when the target decodes
    greedily.  Then :func:`drafter_heldout` with calibration: held-out statistics on ``held``
    (corpus windows) and, with ``held_generated``, on greedy continuations of held-out prompts, on
    which the confidence head is calibrated (:func:`fit_confidence_scale`, folded into its weight).
    """
    capture_layers = list(range(c.n_layer - 3, c.n_layer))
    store, hooks = capture(model, capture_layers)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    N = train.length

    def is_generated(step: int) -> bool:
        return generated is not None and step % corpus_every != 1 % corpus_every

    calls = [0]

    def one():
        calls[0] += 1
        if is_generated(calls[0]):
            rows = torch.randint(0, generated.shape[0], (batch,), generator=g)
            ids = generated[rows].to(train.device)
            anchors = pick_anchors(ids.shape[1], prompt_len - 1, anchors_per_seq, g, train.device)
            return drafter_step(model, drafter, ids, anchors, capture_layers, store, w)[:2]
        anchors = pick_anchors(N, 8, anchors_per_seq, g, train.device)
        return drafter_step(model, drafter, train.batch(batch), anchors, capture_layers, store, w)[:2]

    history, step, t0 = [], 0, time.time()
    for step, elapsed, loss, gn, st in timed_steps(opt, params, seconds, peak_lr, one):
        if step % 25 == 0 or step == 1:
            rec = {"step": step, "s": round(elapsed, 1), "loss": round(loss, 4), "grad_norm": round(gn, 3),
                   "batch": "generated" if is_generated(step) else "corpus",
                   **{k: (round(v, 4) if isinstance(v, float) else [round(x, 3) for x in v]) for k, v in st.items()}}
            history.append(rec)
            log(f"{label} {json.dumps(rec)}")
    for h_ in hooks:
        h_.remove()
    seconds_used = round(time.time() - t0, 1)
    out = drafter_heldout(model, drafter, held, c, batch, anchors_per_seq, seed, w, held_generated, prompt_len,
                          calibrate=True)
    log(f"{label} done steps={step} {json.dumps(out)}")
    return {"history": history, "steps": step, "seconds": seconds_used, **out,
            "capture_layers": capture_layers, "loss": dataclasses.asdict(w)}


@torch.no_grad()
def drafter_heldout(model, drafter, held: torch.Tensor, c: DS4Config, batch: int, anchors_per_seq: int, seed: int,
                    w: LossWeights, held_generated: torch.Tensor | None = None, prompt_len: int = 0,
                    calibrate: bool = False) -> dict:
    """Acceptance statistics of ``drafter`` against the frozen target, nothing trained.

    ``heldout``: ``held`` corpus windows (anchors from position 8); ``heldout_generated`` (with
    ``held_generated``): the target's greedy continuations of held-out prompts, anchors in the
    generated part — what greedy decoding drafts against.  Each gives ``accept_len`` (mean accepted
    drafts of a block from a random anchor: the leading run of rows whose argmax equals the
    target's), ``hit_per_pos`` (row ``k``'s argmax equals the target's), the mean confidence per row
    and its calibration error.  ``heldout_generated.cycles_walk`` counts what the engine's greedy
    DSpark (block 5, every cycle drafting) would on those continuations: each cycle drafts from the
    token after the previous cycle's last accepted one, so cycles start where a draft just failed
    (harder text than a random anchor); ``tokens_per_cycle`` and ``per_position_accept`` mean what
    ``tools/eval_demo.py`` reports.  The anchors come from a generator seeded with
    ``seed + 7``, the same for every drafter measured with the same arguments.  ``calibrate``: fit
    the confidence scale on ``held_generated`` and fold it into the confidence head's weight.
    """
    capture_layers = list(range(c.n_layer - 3, c.n_layer))
    store, hooks = capture(model, capture_layers)
    model.eval()

    def held_stats(ids_all: torch.Tensor, lo: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
        ga = torch.Generator().manual_seed(seed + 7)
        anchors = pick_anchors(ids_all.shape[1], lo, anchors_per_seq, ga, ids_all.device)
        res = [drafter_step(model, drafter, ids_all[i:i + batch], anchors, capture_layers, store, w)
               for i in range(0, ids_all.shape[0], batch)]
        st = [r[1] for r in res]
        lg, ht = torch.cat([r[2][0] for r in res]), torch.cat([r[2][1] for r in res])
        return ({"accept_len": float(np.mean([s["accept_len"] for s in st])),
                 "hit_per_pos": np.mean([s["hit_per_pos"] for s in st], axis=0).round(4).tolist(),
                 "confidence_per_pos": np.mean([s["confidence_per_pos"] for s in st], axis=0).round(4).tolist(),
                 "confidence_ece": round(calibration(lg, ht), 4)}, lg, ht)

    def walk(ids_all: torch.Tensor) -> dict:
        """Greedy DSpark cycles as the engine runs them: the first cycle drafts from the first generated
        token, each next one from the token after the last accepted draft (the target's own)."""
        lo = prompt_len  # anchor: the first generated token (the prompt's last logits give it, undrafted)
        anchors = torch.arange(lo, ids_all.shape[1] - BLOCK, device=ids_all.device)
        cycles, accepted, through = 0, 0, np.zeros(BLOCK, np.int64)
        for i in range(0, ids_all.shape[0], max(1, batch // 4)):
            hit = drafter_step(model, drafter, ids_all[i:i + max(1, batch // 4)], anchors, capture_layers, store,
                               w)[2][1].view(-1, anchors.numel(), BLOCK)
            run = hit.cumprod(-1).cpu().numpy().astype(bool)  # [S, A, B]: rows accepted from each anchor
            for r in run:
                a = 0
                while a < anchors.numel():
                    k = int(r[a].sum())
                    cycles, accepted, through = cycles + 1, accepted + k, through + r[a]
                    a += k + 1
        return {"cycles": cycles, "accepted_drafts": accepted,
                "tokens_per_cycle": round((cycles + accepted) / max(cycles, 1), 4),
                "per_position_accept": (through / max(cycles, 1)).round(4).tolist()}

    out = {"heldout": held_stats(held, 8)[0]}
    if held_generated is not None:
        gen_stats, lg, ht = held_stats(held_generated.to(held.device), prompt_len - 1)
        gen_stats["cycles_walk"] = walk(held_generated.to(held.device))
        if calibrate:
            scale, before, after = fit_confidence_scale(lg, ht)
            drafter.p("mtp.2.confidence_head.proj.weight").mul_(scale)
            gen_stats["calibration"] = {"scale": round(scale, 4), "bce_before": round(before, 4),
                                        "bce_after": round(after, 4),
                                        "ece_after": round(calibration(scale * lg, ht), 4)}
        out["heldout_generated"] = gen_stats
    for h_ in hooks:
        h_.remove()
    return out


def routed_expert_names(drafter: "Drafter") -> list[str]:
    """The drafter's routed-expert tensors (gate, up, down of every stage)."""
    return [s.name for s in drafter.specs if s.types == L.ROUTED_TYPES]


def expert_bytes_from_gguf(drafter: "Drafter", support: Path) -> dict:
    """``{name: (type, bytes)}`` of the routed experts as ``support`` stores them (checked against
    the drafter's layout by ``SupportModel``; raises ``SupportInvalidError`` naming the problem)."""
    from ds4tui.engine.gguf_model import SupportModel

    sm = SupportModel(support, drafter.c).require_compatible()
    return {n: (sm.tensors[n].type, sm.tensors[n].raw_bytes().copy()) for n in routed_expert_names(drafter)}


def quantize_drafter_experts(drafter: "Drafter") -> tuple[dict, dict]:
    """The routed experts' q2-mix bytes (IQ2_XXS gate/up, Q2_K down: the converter's quantiser) from
    the drafter's current values: ``({name: (type, bytes)}, relative error per type)``."""
    from ds4tui.engine.convert import choose_type
    from ds4tui.engine.quants import quantize_with_reconstruction

    enc, err = {}, {}
    specs = {s.name: s for s in drafter.specs}
    for name in routed_expert_names(drafter):
        qt = choose_type(specs[name], "q2")
        x = drafter.p(name).detach().float().cpu().numpy()
        q = quantize_with_reconstruction(x, qt)
        enc[name] = (qt, np.ascontiguousarray(q.data).reshape(-1).view(np.uint8))
        err.setdefault(qt.name, []).append(float(np.abs(q.values - x).mean() / np.abs(x).mean()))
    return enc, {k: round(float(np.mean(v)), 4) for k, v in err.items()}


def freeze_experts(drafter: "Drafter", encoded: dict) -> None:
    """Set every routed expert to the values its ``encoded`` bytes decode to and stop training it."""
    import gguf.quants as gq

    with torch.no_grad():
        for name, (qt, data) in encoded.items():
            p = drafter.p(name)
            v = gq.dequantize(np.asarray(data, np.uint8), qt).reshape(tuple(p.shape))
            p.copy_(torch.from_numpy(np.ascontiguousarray(v, np.float32)).to(p.device, p.dtype))
            p.requires_grad_(False)


# ---- export ----------------------------------------------------------------------------------

def tie_unseen(t: torch.Tensor, seen: np.ndarray) -> float:
    """Set the rows of unseen token ids to their mean (they are equal up to rounding); return the max change."""
    unseen = torch.from_numpy(seen == 0).to(t.device)
    with torch.no_grad():
        rows = t[unseen]
        mean = rows.mean(dim=0, keepdim=True)
        change = float((rows - mean).abs().max()) if rows.numel() else 0.0
        t[unseen] = mean.expand_as(rows)
    return change


def export(model, drafter, c: DS4Config, seen: np.ndarray, out: Path, tokenizer_json: str | None,
           originals: dict | None = None, encoded: dict | None = None) -> dict:
    """Write ``model.gguf`` and ``support.gguf``; with ``originals`` the checkpoint gets the full-precision
    experts (whose quantisation is what the model was healed with) and the model keeps the quantised ones.
    ``encoded``: drafter tensors written as these bytes (:func:`write_support`)."""
    info = {"lm_head_unseen_max_change": tie_unseen(model.lm_head.weight, seen)}
    model.to("cpu").float()
    with full_precision_experts(model, originals):
        model.save_pretrained(str(out / "hf"))
    t0 = time.time()
    convert(out / "hf", out / "model.gguf", types="q2", tokenizer_json=tokenizer_json, name="ds4tui-demo",
            overwrite=True, token_embd_q8=True)
    info.update(write_support(drafter, c, seen, out, encoded))
    info.update(export_seconds=round(time.time() - t0, 1), model_bytes=(out / "model.gguf").stat().st_size)
    log(f"export {json.dumps(info)}")
    return info


def write_support(drafter, c: DS4Config, seen: np.ndarray, out: Path, encoded: dict | None = None) -> dict:
    """Write ``out/support.gguf`` in the q2 mix; the tensors in ``encoded`` (``{name: (type, bytes)}``,
    the frozen routed experts of a drafter heal) are copied as those bytes, not re-quantised."""
    info = {"markov_w2_unseen_max_change": tie_unseen(drafter.p("mtp.2.markov_head.markov_w2.weight"), seen)}
    tensors = drafter.tensors()
    params = SupportParams(n_stages=3, block_size=BLOCK, markov_rank=RANK, noise_token_id=NOISE_TOKEN,
                           target_layer_ids=tuple(range(c.n_layer - 3, c.n_layer)))
    write_support_gguf(out / "support.gguf", c, params, lambda spec: tensors[spec.name], types="q2",
                       name="ds4tui-demo-dspark", encoded=encoded)
    info.update(support_bytes=(out / "support.gguf").stat().st_size, tensors_copied_as_bytes=len(encoded or {}))
    return info


def export_support(drafter, c: DS4Config, seen: np.ndarray, out: Path, encoded: dict | None = None) -> dict:
    """Write only ``support.gguf`` (q2 mix) for an existing target."""
    info = write_support(drafter, c, seen, out, encoded)
    log(f"export {json.dumps(info)}")
    return info


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def check(model, out: Path, held: np.ndarray, tokenizer_json: str | None, originals: dict | None = None,
          n_tokens: int = 96) -> dict:
    """Exported files against their sources, on ``n_tokens`` held-out tokens (numpy reference, fp32).

    * an F32 GGUF of the saved checkpoint (full-precision experts), run by
      ``ReferenceModel(numerics="transformers")``, against transformers' logits of the same weights
      (fp32, eager): the conversion is exact;
    * the q2 ``model.gguf`` against transformers' logits of the healed model (quantised experts): the
      rest of the q2 mix (Q8_0 matrices) costs little, and its routed experts decode to exactly the
      healed model's values;
    * the torch :class:`Drafter` loaded with the support GGUF's dequantised tensors against
      ``ReferenceDrafter`` on that GGUF (two anchors, one past the window): base logits, ``h``,
      confidences and the greedy Markov chain.
    """
    from ds4tui.engine.reference import ReferenceDrafter, ReferenceModel

    ids = [int(t) for t in held[:n_tokens]]
    model = model.to("cpu").float().eval()

    def hf_logits() -> np.ndarray:
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()

    want = {"model.gguf": hf_logits()}
    with full_precision_experts(model, originals):
        want["model_f32.gguf"] = hf_logits()
    convert(out / "hf", out / "model_f32.gguf", types="f32", tokenizer_json=tokenizer_json, overwrite=True)
    res: dict = {"tokens": n_tokens}
    for name in ("model_f32.gguf", "model.gguf"):
        hf = want[name]
        ref = ReferenceModel(out / name, numerics="transformers")
        r = ref.prefill(ref.new_state(n_tokens + 8), ids, logits="all")
        res[name] = {"max_abs_logit_diff_vs_transformers": float(np.abs(r.logits - hf).max()),
                     "logit_std": float(hf.std()),
                     "argmax_agreement": float((r.logits.argmax(-1) == hf.argmax(-1)).mean())}
    (out / "model_f32.gguf").unlink()
    ref = ReferenceModel(out / "model.gguf", numerics="transformers")
    diff = 0.0
    for i, layer in enumerate(model.model.layers):
        F_ = ref.config.n_ff_exp
        gu, dn = layer.mlp.experts.gate_up_proj.detach().numpy(), layer.mlp.experts.down_proj.detach().numpy()
        for name, want in (("ffn_gate_exps", gu[:, :F_]), ("ffn_up_exps", gu[:, F_:]), ("ffn_down_exps", dn)):
            diff = max(diff, float(np.abs(ref.w.get(f"blk.{i}.{name}.weight") - want).max()))
    res["experts_gguf_vs_model_max_abs"] = diff
    res.update(check_drafter(ref, out / "support.gguf", ids))
    log(f"check {json.dumps(res)}")
    return res


def check_drafter(ref, support: Path, ids: list[int]) -> dict:
    """The torch :class:`Drafter` loaded with ``support``'s dequantised tensors against
    ``ReferenceDrafter`` on that file, at two anchors of ``ids`` (one past the window)."""
    from ds4tui.engine.reference import ReferenceDrafter

    n_tokens, res = len(ids), {}
    rd = ReferenceDrafter(ref, support)
    r = ref.prefill(ref.new_state(n_tokens + 8), ids, logits="all", capture=rd.capture_layers)
    seen = np.ones(ref.config.n_vocab, np.uint8)
    td = Drafter(ref.config, torch.from_numpy(ref.w.get("token_embd.weight")), torch.from_numpy(ref.w.get("output.weight")),
                 seen, 0)
    with torch.no_grad():
        for s in td.specs:
            td.p(s.name).copy_(torch.from_numpy(np.asarray(rd.w.get(s.name), np.float32).reshape(s.shape)))
    caps = torch.from_numpy(np.concatenate([r.hidden[L] for L in rd.capture_layers], axis=-1))[None]
    for a in (40, n_tokens - BLOCK - 1):
        ds = rd.new_state()
        rd.add_context(ds, np.arange(a), {L: h[:a] for L, h in r.hidden.items()})
        prop = rd.propose(ds, ids[a])
        with torch.no_grad():
            base, h = td(torch.tensor([ids]), caps, torch.tensor([a]))
            prev = torch.tensor([[ids[a]] + prop.greedy[:-1]])
            m, bias = td.markov(prev)
            chain = (base + bias)[0].argmax(-1).tolist()
            conf = torch.sigmoid(td.confidence_logit(h, m))[0].numpy()
        res[f"drafter_anchor_{a}"] = {
            "max_abs_base_logit_diff": float(np.abs(base[0].numpy() - prop.base_logits).max()),
            "base_logit_std": float(prop.base_logits.std()),
            "max_abs_h_diff": float(np.abs(h[0].numpy() - prop.hidden).max()),
            "max_abs_confidence_diff": float(np.abs(conf - prop.confidence).max()),
            "greedy_equal": chain == prop.greedy}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("out", type=Path)
    # defaults: the first run of the chain that made the shipped demo pair (483 s in all on one H200)
    ap.add_argument("--target-seconds", type=float, default=250.0)
    ap.add_argument("--heal-seconds", type=float, default=40.0,
                    help="training of everything but the routed experts after they are quantised")
    ap.add_argument("--heal-lr", type=float, default=1e-3)
    ap.add_argument("--drafter-seconds", type=float, default=120.0)
    ap.add_argument("--batch", type=int, default=48, help="target: windows per step")
    ap.add_argument("--loss-vocab", choices=("seen", "full"), default="seen",
                    help="target: the cross-entropy from the seen ids' LM-head rows and one logit for the never-seen "
                         "ids (their rows are equal: the same loss and step, a third of the logits; SeenHead) or from "
                         "every row (the runs before 2026-12-03)")
    ap.add_argument("--drafter-batch", type=int, default=16)
    ap.add_argument("--anchors", type=int, default=48, help="drafter: anchors per window")
    ap.add_argument("--seq", type=int, default=SEQ)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--drafter-lr", type=float, default=2e-3)
    ap.add_argument("--ce-weight", type=float, default=LossWeights.ce)
    ap.add_argument("--tv-weight", type=float, default=LossWeights.tv)
    ap.add_argument("--confidence-target", choices=("greedy", "tv"), default=LossWeights.confidence)
    ap.add_argument("--distill-sequences", type=int, default=192,
                    help="greedy continuations of training prompts the drafter also trains on (0: none)")
    ap.add_argument("--distill-prompt", type=int, default=128, help="tokens of corpus text before each continuation")
    ap.add_argument("--distill-new", type=int, default=128, help="greedy tokens per continuation")
    ap.add_argument("--heldout-generated", type=int, default=32,
                    help="greedy continuations of held-out prompts (drafter statistics, confidence calibration)")
    ap.add_argument("--heldout-windows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokenizer-json", default=None)
    ap.add_argument("--save-target", action="store_true",
                    help="also write target.pt (healed target + full-precision experts) for --resume-target")
    ap.add_argument("--resume-target", type=Path, default=None,
                    help="target.pt of an earlier run: skip target training and healing, train the drafter")
    ap.add_argument("--target-gguf", type=Path, default=None,
                    help="a model.gguf this script made: train only a drafter for it (the target is rebuilt from "
                         "the file's dequantised weights; only support.gguf is written)")
    ap.add_argument("--target-init", type=Path, default=None,
                    help="a model.gguf this script made (the shipped demo model unpacked, say): the target starts "
                         "from the file's dequantised weights and trains on for --target-seconds, then is quantised "
                         "and healed as usual; use the corpus it was trained on, so its held-out split stays unseen")
    ap.add_argument("--drafter-init", type=Path, default=None,
                    help="with --target-gguf or --target-init: a support.gguf to start the drafter from")
    ap.add_argument("--drafter-heal-seconds", type=float, default=0.0,
                    help="after the drafter's training: its routed experts are frozen at their q2 values (the "
                         "--drafter-init file's bytes when --drafter-seconds is 0, else the trained ones quantised) "
                         "and everything else trains on for this long; the export copies the experts' bytes")
    ap.add_argument("--drafter-heal-lr", type=float, default=1e-3)
    ap.add_argument("--corpus-every", type=int, default=2,
                    help="drafter: every N-th batch is corpus windows, the others greedy continuations (with "
                         "--distill-sequences)")
    ap.add_argument("--distill-chunk", type=int, default=256, help="continuations generated at a time")
    ap.add_argument("--distill-kv-cache", choices=("on", "off"), default="on",
                    help="generate the continuations (and --heldout-generated) with the target's KV cache (on: "
                         "each token runs once) or by re-running the whole sequence for every new token (off, "
                         "the scripts' behaviour before the option); the same tokens in float32")
    ap.add_argument("--distill-budget", type=float, default=None,
                    help="seconds: start no new chunk of training-prompt continuations after this (fewer sequences)")
    ap.add_argument("--save-continuations", action="store_true",
                    help="with --target-gguf: also write the training-prompt continuations this run made to "
                         "OUT/continuations.npz.xz (ids, the target's sha256, prompt and continuation lengths, seed), "
                         "for --continuations in a later drafter run against the same target")
    ap.add_argument("--continuations", type=Path, nargs="+", default=None, metavar="FILE",
                    help="with --target-gguf: train the drafter on these files' continuations (written by "
                         "--save-continuations for the same target, --distill-prompt and --distill-new, each with "
                         "another --seed) instead of making new ones; --distill-sequences is then not used (the "
                         "held-out continuations, --heldout-generated, are still made)")
    a = ap.parse_args(argv)
    given = [f for f, v in (("--target-gguf", a.target_gguf), ("--target-init", a.target_init),
                            ("--resume-target", a.resume_target)) if v]
    if len(given) > 1:
        ap.error(f"{' and '.join(given)} both name the target; give one of them")
    if a.drafter_init and not (a.target_gguf or a.target_init):
        ap.error("--drafter-init needs the target it was trained for: add --target-gguf or --target-init")
    if a.save_continuations and a.continuations:
        ap.error("--save-continuations and --continuations: a run that trains on saved continuations makes none "
                 "to save; give one of them")
    for flag, on in (("--save-continuations", a.save_continuations), ("--continuations", a.continuations)):
        if on and not a.target_gguf:
            ap.error(f"{flag} needs the target as a file: add --target-gguf (continuations belong to one target "
                     "file, named by its sha256)")
    for flag, path in (("--target-gguf", a.target_gguf), ("--target-init", a.target_init),
                       ("--drafter-init", a.drafter_init)):
        if path and not path.is_file():
            ap.error(f"{flag} {path}: no such file (expected a GGUF this script wrote; unpack a shipped *.xz first)")
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from demo_corpus import load_continuations, load_split, save_continuations

    target_sha256 = _sha256(a.target_gguf) if a.target_gguf else None  # read once: the file is ~90 MB
    loaded = None
    if a.continuations:
        try:
            loaded = load_continuations(a.continuations, target_sha256=target_sha256,
                                        prompt_tokens=a.distill_prompt, new_tokens=a.distill_new)
        except ValueError as exc:
            ap.error(f"--continuations {exc}")

    t_start = time.time()
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    a.out.mkdir(parents=True, exist_ok=True)
    c = demo_config()
    seen = np.load(a.corpus / "seen.npy")
    seen[NOISE_TOKEN] = 0  # never in the text; its embedding row is kept random (see build_target)
    train_ids, held_ids = load_split(a.corpus, "train"), load_split(a.corpus, "heldout")
    train = Windows(train_ids, a.seq + 1, a.device, a.seed)
    held = Windows(held_ids, a.seq + 1, a.device, a.seed).fixed(a.heldout_windows)
    model = build_target(c, seen, a.out, a.seed, a.device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"target: {n_params / 1e6:.1f} M parameters on {a.device}; corpus {train_ids.size} + {held_ids.size} tokens")
    report = {"config": dataclasses.asdict(c), "seed": a.seed, "args": {k: str(v) for k, v in vars(a).items()},
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "numpy": np.__version__},
              "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
              "corpus": json.loads((a.corpus / "manifest.json").read_text()), "target_parameters": n_params}
    originals = None
    if a.target_gguf:
        model, report["target_from_gguf"] = target_from_gguf(c, a.target_gguf, a.out, a.seed, a.device, held_ids)
        report["target_from_gguf"].update(path=str(a.target_gguf), sha256=target_sha256)
        seen, report["target_from_gguf"]["seen_ids_added"] = seen_with_distinct_rows(seen, model.lm_head.weight)
    elif a.resume_target:
        saved = torch.load(a.resume_target, map_location=a.device, weights_only=False)
        model.load_state_dict(saved["model"])
        originals = saved["originals"]
        for k in ("target", "expert_quant_rel_error", "heldout_loss_after_quantisation", "heal"):
            report[k] = saved["report"][k]
        log(f"target resumed from {a.resume_target}")
    else:
        if a.target_init:
            model, report["target_init"] = target_from_gguf(c, a.target_init, a.out, a.seed, a.device, held_ids)
            report["target_init"].update(path=str(a.target_init), sha256=_sha256(a.target_init),
                                         heldout_loss=round(evaluate(model, held), 4))
            log(f"target starts from {a.target_init}: held-out loss {report['target_init']['heldout_loss']}")
            seen, report["target_init"]["seen_ids_added"] = seen_with_distinct_rows(seen, model.lm_head.weight)
        head = SeenHead(model.lm_head.weight, seen) if a.loss_vocab == "seen" else None
        report["target"] = train_target(model, train, held, a.target_seconds, a.batch, a.lr, head=head)
        originals, report["expert_quant_rel_error"] = quantize_experts(model)
        report["heldout_loss_after_quantisation"] = round(evaluate(model, held), 4)
        log(f"experts quantised: {report['expert_quant_rel_error']}, held-out loss {report['heldout_loss_after_quantisation']}")
        for name, p in model.named_parameters():
            p.requires_grad_(".experts." not in name)
        report["heal"] = train_target(model, train, held, a.heal_seconds, a.batch, a.heal_lr, label="heal", head=head)
        if a.save_target:
            torch.save({"model": model.state_dict(), "originals": originals,
                        "report": {k: report[k] for k in ("target", "expert_quant_rel_error",
                                                          "heldout_loss_after_quantisation", "heal")}},
                       a.out / "target.pt")
    generated = held_generated = None
    if a.distill_sequences or a.heldout_generated or loaded:
        t0 = time.time()
        P = a.distill_prompt
        hp = Windows(held_ids, P, a.device, a.seed + 4).fixed(a.heldout_generated) if a.heldout_generated else None
        kv = a.distill_kv_cache == "on"
        held_generated = (generate_greedy(model, hp, a.distill_new, a.distill_chunk, kv_cache=kv)
                          if hp is not None else None)
        if loaded:
            generated = torch.from_numpy(loaded[0].astype(np.int64)).to(a.device)
        else:
            prompts = (Windows(train_ids, P, a.device, a.seed + 3).batch(a.distill_sequences)
                       if a.distill_sequences else None)
            generated = (generate_greedy(model, prompts, a.distill_new, a.distill_chunk, a.distill_budget, kv_cache=kv)
                         if prompts is not None else None)
        report["distill"] = {"sequences": 0 if generated is None else int(generated.shape[0]),
                             "sequences_asked": 0 if loaded else a.distill_sequences,
                             "heldout_sequences": a.heldout_generated,
                             "prompt_tokens": P, "new_tokens": a.distill_new, "kv_cache": kv, "seconds": round(time.time() - t0, 1)}
        if loaded:
            report["distill"]["loaded"] = [{"path": str(f), **m} for f, m in zip(a.continuations, loaded[1])]
        if a.save_continuations and generated is not None:  # never with --continuations (refused above)
            report["distill"]["saved"] = save_continuations(
                a.out / "continuations.npz.xz", generated.cpu().numpy(), target_sha256=target_sha256,
                prompt_tokens=P, new_tokens=a.distill_new, seed=a.seed)
        log(f"distill {json.dumps(report['distill'])}")
    drafter = Drafter(c, model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach(), seen, a.seed)
    drafter = drafter.to(a.device)
    dtrain = Windows(train_ids, a.seq, a.device, a.seed + 1)
    dheld = held[:, :a.seq]
    w = LossWeights(ce=a.ce_weight, tv=a.tv_weight, confidence=a.confidence_target)
    stats_args = (c, a.drafter_batch, a.anchors, a.seed, w, held_generated, a.distill_prompt)
    if a.drafter_init:
        init_drafter_from_gguf(drafter, a.target_gguf or a.target_init, a.drafter_init)
        report["drafter_init"] = {"path": str(a.drafter_init), "sha256": _sha256(a.drafter_init),
                                  **drafter_heldout(model, drafter, dheld, *stats_args)}
        log(f"drafter init {json.dumps(report['drafter_init'])}")
    report["drafter"] = train_drafter(model, drafter, dtrain, dheld, c, a.drafter_seconds, a.drafter_batch, a.anchors,
                                      a.drafter_lr, a.seed, w, generated, a.distill_prompt, held_generated,
                                      a.corpus_every)
    encoded = None
    if a.drafter_heal_seconds > 0:
        if a.drafter_init and a.drafter_seconds <= 0:
            encoded, source, rel = expert_bytes_from_gguf(drafter, a.drafter_init), "drafter_init", None
        else:
            (encoded, rel), source = quantize_drafter_experts(drafter), "quantised"
        freeze_experts(drafter, encoded)
        heal = {"experts_from": source, "experts": sorted(encoded), "expert_quant_rel_error": rel,
                "after_freezing": drafter_heldout(model, drafter, dheld, *stats_args)}
        log(f"drafter heal {json.dumps(heal)}")
        heal.update(train_drafter(model, drafter, dtrain, dheld, c, a.drafter_heal_seconds, a.drafter_batch,
                                  a.anchors, a.drafter_heal_lr, a.seed + 11, w, generated, a.distill_prompt,
                                  held_generated, a.corpus_every, label="drafter-heal"))
        report["drafter_heal"] = heal
    drafter.embed = drafter.head = None
    if a.target_gguf:
        report["export"] = export_support(drafter.cpu(), c, seen, a.out, encoded)
        target_file = a.target_gguf
    else:
        report["export"] = export(model, drafter.cpu(), c, seen, a.out, a.tokenizer_json, originals, encoded)
        target_file = a.out / "model.gguf"
        model.to(a.device)
    # the drafter as the engine reads it: every tensor decoded from the written support.gguf
    exported = Drafter(c, model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach(), seen, a.seed)
    init_drafter_from_gguf(exported, target_file, a.out / "support.gguf")
    report["drafter_exported"] = drafter_heldout(model, exported.to(a.device), dheld, *stats_args)
    log(f"drafter exported {json.dumps(report['drafter_exported'])}")
    if encoded:
        written = expert_bytes_from_gguf(exported, a.out / "support.gguf")
        report["drafter_heal"]["experts_bytes_equal"] = all(
            written[n][0] == t and np.array_equal(written[n][1], b) for n, (t, b) in encoded.items())
    del exported
    if a.target_gguf:
        from ds4tui.engine.reference import ReferenceModel
        report["check"] = check_drafter(ReferenceModel(a.target_gguf, numerics="transformers"), a.out / "support.gguf",
                                        [int(t) for t in held_ids[:96]])
        log(f"check {json.dumps(report['check'])}")
    else:
        report["check"] = check(model, a.out, held_ids, a.tokenizer_json, originals)
    report["total_seconds"] = round(time.time() - t_start, 1)
    (a.out / "train_log.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"done in {report['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
