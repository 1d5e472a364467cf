"""Golden logits from Hugging Face transformers' DeepSeek V4 for the tiny test model.

The tiny test model (spec ds4.md §6, ``ds4tui.devtools.make_test_model --config tiny``) is written as
a transformers checkpoint (``hf/``) and converted to a DS4 GGUF.  This tool runs the checkpoint
through transformers' own ``DeepseekV4ForCausalLM`` (fp32, eager attention, no FP8/FP4
simulation) on three fixed chat prompts and stores what our engines must reproduce from the
``--types f32`` GGUF of the same model:

* a full-prompt forward without a cache (logits at every prompt position), and
* ``--gen`` greedy decode steps with a ``DynamicCache`` (prefill the prompt, then one token at a
  time, each time feeding the argmax of the previous logits; no stop at EOS).

Files (``SEED`` = ``--seed``), in ``--out`` (default ``tests/golden``):

``tiny_seedSEED.npz`` (``np.savez_compressed``), for each prompt index ``i`` (0, 1, 2):

    ``p{i}_ids``             int32   [T]          rendered prompt tokens
    ``p{i}_top_ids``         int32   [T, 32]      per prompt position: the 32 largest logits' ids,
    ``p{i}_top_logits``      float32 [T, 32]      sorted by logit descending, equal logits by
                                                  ascending id (no-cache forward)
    ``p{i}_full_pos``        int32   [k]          positions of the complete logit rows below:
    ``p{i}_full``            float32 [k, 129280]  the last prompt position for every prompt, plus
                                                  position 100 for prompt 0 (ascending order)
    ``p{i}_gen_ids``         int32   [G]          greedily generated tokens
    ``p{i}_gen_top_ids``     int32   [G, 32]      row j = the logits that produced generated
    ``p{i}_gen_top_logits``  float32 [G, 32]      token j (row 0: last position of the cached
                                                  prefill; row j > 0: the decode step that fed
                                                  generated token j - 1 at position T - 1 + j)
    ``p0_gen_full``          float32 [1, 129280]  complete logits of the last decode row (prompt 0)

``tiny_seedSEED.json``: config name, seed, GGUF types, sha256 of ``hf/model.safetensors`` (and of
config.json / tokenizer.json) so that a test can tell when the test-model generator changed,
library versions, the prompts (messages and render settings) and token counts, wall times, logit
statistics (max |logit|, std), the smallest top-1/top-2 logit gap per prompt, ties near the top-32
boundary, and transformers' own agreement between its no-cache, cached-prefill and decode paths.

Regenerate (torch and transformers are not dependencies of ds4tui)::

    pip install torch==2.13.0 transformers==5.23.0
    PYTHONPATH=. python tools/golden.py                 # builds the tiny seed-0 model in a temp dir
    PYTHONPATH=. python tools/golden.py --seed 1 --gen 32 --out tests/golden
    PYTHONPATH=. python tools/golden.py --model-dir DIR  # DIR from make_test_model --config tiny
                                                        # (pass the --seed it was made with)

Takes about a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

N_TOP = 32
MID_POS = 100  # extra complete logit row for prompt 0
INSTALL = "pip install torch==2.13.0 transformers==5.23.0"
PROMPT_TOKENS = (200, 300)  # inclusive bounds on every rendered prompt's length

# Three prompts of different character: a coding request with a code block, English prose, and a
# multi-turn chat with a system prompt.  Rendered with render_chat's defaults (think mode) and a
# generation prompt.
PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": (
        "Write a Python function `merge_intervals(intervals)` that takes a list of (start, end) tuples "
        "and returns a new list with all overlapping intervals merged. The input may be unsorted; "
        "do not modify it in place. For example, "
        "merge_intervals([(5, 7), (1, 3), (2, 4), (8, 8), (7, 7)]) should return [(1, 4), (5, 7), (8, 8)].\n\n"
        "Requirements:\n"
        "1. Use type hints (`list[tuple[int, int]]`) and a docstring with a doctest.\n"
        "2. Raise `ValueError` with a helpful message if any interval has start > end.\n"
        "3. Add pytest tests for the empty list, nested intervals and negative numbers.\n\n"
        "Here is my first attempt, which fails on nested intervals:\n\n"
        "```python\n"
        "def merge_intervals(intervals):\n"
        "    intervals.sort()\n"
        "    out = [intervals[0]]\n"
        "    for s, e in intervals[1:]:\n"
        "        if s <= out[-1][1]:\n"
        "            out[-1] = (out[-1][0], e)\n"
        "        else:\n"
        "            out.append((s, e))\n"
        "    return out\n"
        "```\n\n"
        "Please point out every bug in it before giving the corrected version."
    )}],
    [{"role": "user", "content": (
        "I am preparing a short talk for a local astronomy club and would like a clear explanation, in plain "
        "English and without equations, of why the sky is blue during the day but often red or orange at "
        "sunrise and sunset. Most of the audience are retired teachers and curious teenagers, so please avoid "
        "jargon, or explain it the first time you use it. I would like you to cover the following points, "
        "roughly in this order: what sunlight is made of, what happens when light meets the tiny molecules of "
        "nitrogen and oxygen in the air, why shorter wavelengths are scattered much more strongly than longer "
        "ones, and why we do not see a violet sky even though violet light is scattered even more than blue. "
        "Then explain how the longer path through the atmosphere near the horizon changes the colours we see, "
        "and why volcanic eruptions, wildfire smoke or dust storms can make sunsets especially vivid. Finish "
        "with one simple demonstration I could do in front of the group with a glass of water, a few drops of "
        "milk and a torch, and tell me what the audience should notice when looking at the beam from the side "
        "and from the end. Keep the whole answer to about five short paragraphs, and use one everyday analogy "
        "that a teenager would remember the next day."
    )}],
    [{"role": "system", "content": (
        "You are a friendly travel assistant for a small bicycle touring company in the Netherlands. Answer "
        "briefly, give distances in kilometres, and always mention whether a route is suitable for children."
    )},
     {"role": "user", "content": (
         "Hi! We are a family of four with two kids aged 9 and 12. Can we cycle from Amsterdam to Haarlem "
         "in a day?"
     )},
     {"role": "assistant", "content": (
         "Yes, easily. The direct route is about 25 km on flat, separated cycle paths, so with breaks it takes "
         "two to three hours. It is well suited to children of 9 and 12, as long as they are used to riding "
         "for an hour at a time. A nicer option is the 35 km route through Spaarnwoude recreation park, which "
         "has playgrounds and a pancake restaurant halfway."
     )},
     {"role": "user", "content": (
         "Great, the park route sounds lovely. Two more questions: can we rent a child seat or a tandem "
         "attachment for a smaller cousin who might join us, and what should we do if it starts raining "
         "heavily halfway? Also, is it easy to take the bikes back to Amsterdam on the train in the evening, "
         "and do we need special tickets for them?"
     )}],
]


class GoldenError(RuntimeError):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def top_k_sorted(rows: np.ndarray, k: int = N_TOP) -> tuple[np.ndarray, np.ndarray, int]:
    """Top ``k`` of each row, by value descending and, for equal values, by ascending id.

    Returns (ids int32 [N, k], values float32 [N, k], number of rows in which two of the k + 1
    largest values are equal, i.e. where the order or the membership depends on the tie rule).
    """
    n, v = rows.shape
    ids = np.empty((n, k), np.int32)
    vals = np.empty((n, k), np.float32)
    ties = 0
    for r in range(n):
        row = rows[r]
        kth = np.partition(row, v - (k + 1))[v - (k + 1)]  # (k+1)-th largest value
        cand = np.flatnonzero(row >= kth)
        order = cand[np.lexsort((cand, -row[cand]))]
        top = row[order[: k + 1]]
        ties += bool(np.any(top[1:] == top[:-1]))
        ids[r] = order[:k]
        vals[r] = row[order[:k]]
    return ids, vals, ties


def top2_gap(top_logits: np.ndarray) -> tuple[float, int]:
    """Smallest top-1 minus top-2 logit over the rows, and the row where it occurs."""
    gaps = top_logits[:, 0].astype(np.float64) - top_logits[:, 1]
    j = int(np.argmin(gaps))
    return float(gaps[j]), j


class _Stats:
    """Running max |x|, mean and std (float64) over all logits seen."""

    def __init__(self) -> None:
        self.n = 0
        self.s = 0.0
        self.ss = 0.0
        self.max_abs = 0.0

    def add(self, a: np.ndarray) -> None:
        a64 = a.astype(np.float64)
        self.n += a64.size
        self.s += float(a64.sum())
        self.ss += float(np.square(a64).sum())
        self.max_abs = max(self.max_abs, float(np.abs(a64).max()))

    def as_dict(self) -> dict:
        mean = self.s / self.n
        return {"count": self.n, "max_abs": self.max_abs, "mean": mean,
                "std": math.sqrt(max(self.ss / self.n - mean * mean, 0.0))}


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def collect_warnings(into: list[str]):
    """Record Python warnings and WARNING+ log records of transformers (also still shown)."""
    handler = _Collect()
    log = logging.getLogger("transformers")
    log.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            log.removeHandler(handler)
    into.extend(handler.messages)
    into.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    for msg in handler.messages:
        print(f"  transformers: {msg}", file=sys.stderr)
    for w in caught:
        print(f"  warning: {w.category.__name__}: {w.message}", file=sys.stderr)


def verify_loaded(torch, model, info: dict, checkpoint: Path) -> dict:
    """Every persistent parameter/buffer came from the checkpoint; the rope config is DS4's."""
    from safetensors.numpy import load_file

    bad = {k: sorted(map(str, v)) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
           if (v := info.get(k))}
    if bad:
        raise GoldenError(f"transformers did not load the checkpoint cleanly: {bad}")
    ck = {k: v for k, v in load_file(str(checkpoint)).items() if not k.startswith("mtp.")}
    sd = model.state_dict()  # persistent parameters and buffers (rotary tables are computed)
    not_f32 = [k for k, v in sd.items() if v.is_floating_point() and v.dtype != torch.float32]
    if not_f32:
        raise GoldenError(f"not float32 after loading: {not_f32[:5]}")
    n_sd = sum(v.numel() for v in sd.values())
    n_ck = sum(v.size for v in ck.values())
    if n_sd != n_ck:
        raise GoldenError(f"model holds {n_sd} values, checkpoint {n_ck}")

    # Tensors are renamed and fused (experts) on load, so compare order-free sums of all float
    # values; an entry left at its initialisation would change them.
    def sums(arrays):
        s = ss = 0.0
        for a in arrays:
            a64 = np.asarray(a, np.float64)
            s += float(a64.sum())
            ss += float(np.square(a64).sum())
        return s, ss

    sd_float = [v.numpy() for v in sd.values() if v.is_floating_point()]
    ck_float = [v for v in ck.values() if v.dtype.kind == "f"]
    (s1, q1), (s2, q2) = sums(sd_float), sums(ck_float)
    if not (math.isclose(s1, s2, rel_tol=1e-9, abs_tol=1e-6) and math.isclose(q1, q2, rel_tol=1e-9)):
        raise GoldenError(f"float values differ from the checkpoint: sum {s1} vs {s2}, sum of squares {q1} vs {q2}")

    # tid2eid is a buffer that transformers initialises to zeros (everything to expert 0).
    hash_layers = [i for i, t in enumerate(model.config.mlp_layer_types) if t == "hash_moe"]
    for i in hash_layers:
        got = sd[f"model.layers.{i}.mlp.gate.tid2eid"].numpy()
        want = ck[f"model.layers.{i}.ffn.gate.tid2eid"]
        if not np.array_equal(got, want) or not got.any():
            raise GoldenError(f"layer {i}: tid2eid is not the checkpoint's (nonzero entries: {np.count_nonzero(got)})")
    # The head is not tied to the embedding.
    for tf_name, ck_name in (("lm_head.weight", "head.weight"), ("model.embed_tokens.weight", "model.embed_tokens.weight")):
        if not np.array_equal(sd[tf_name].numpy(), ck[ck_name]):
            raise GoldenError(f"{tf_name} is not the checkpoint's {ck_name}")

    rope = model.config.rope_parameters
    if set(rope) != {"main", "compress"}:
        raise GoldenError(f"rope_parameters has keys {sorted(rope)}, expected main and compress")
    comp = rope["compress"]
    if comp.get("rope_type") != "yarn" or comp.get("attention_factor") != 1.0:
        raise GoldenError(f"compress rope is {comp}, expected yarn with attention_factor 1.0")
    return {"checkpoint_tensors": len(ck), "model_state_entries": len(sd), "values": n_sd,
            "hash_layers_tid2eid_checked": hash_layers, "rope_parameters": rope}


def run_prompt(torch, model, ids: list[int], n_gen: int, vocab: int) -> dict:
    from transformers import DynamicCache

    t = len(ids)
    x = torch.tensor([ids], dtype=torch.long)
    r: dict = {"seconds": {}}

    with torch.no_grad():
        t0 = time.perf_counter()
        full = model(input_ids=x, use_cache=False).logits[0].numpy().copy()  # [T, V]
        t1 = time.perf_counter()
        cache = DynamicCache(config=model.config)
        pre = model(input_ids=x, past_key_values=cache, use_cache=True,
                    position_ids=torch.arange(t).unsqueeze(0)).logits[0].numpy()
        t2 = time.perf_counter()
        if cache.get_seq_length() != t:
            raise GoldenError(f"cache holds {cache.get_seq_length()} tokens after a {t}-token prefill")
        gen_rows = np.empty((n_gen, vocab), np.float32)
        gen_rows[0] = pre[-1]
        gen_ids: list[int] = []
        for j in range(n_gen):
            tok = int(top_k_sorted(gen_rows[j : j + 1], 1)[0][0, 0])  # argmax, lowest id on ties
            gen_ids.append(tok)
            if j + 1 == n_gen:
                break
            pos = t + j
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True,
                        position_ids=torch.tensor([[pos]])).logits[0, -1]
            gen_rows[j + 1] = out.numpy()
        t3 = time.perf_counter()
        # The same sequence in one no-cache forward: transformers' prefill vs its own decode path.
        xx = torch.tensor([ids + gen_ids[:-1]], dtype=torch.long)
        again = model(input_ids=xx, use_cache=False).logits[0, t - 1 :].numpy()
        t4 = time.perf_counter()

    if not (np.isfinite(full).all() and np.isfinite(gen_rows).all()):
        raise GoldenError("non-finite logits")
    r["seconds"] = {"forward_no_cache": t1 - t0, "prefill_cached": t2 - t1, "decode": t3 - t2,
                    "decode_per_token": (t3 - t2) / max(n_gen - 1, 1), "check_forward_no_cache": t4 - t3}
    r["full"], r["gen_rows"], r["gen_ids"] = full, gen_rows, gen_ids
    r["tf_consistency"] = {
        "gen0_cached_vs_no_cache_last_row_max_abs": float(np.abs(gen_rows[0] - full[-1]).max()),
        "prefill_cached_vs_no_cache_all_rows_max_abs": float(np.abs(pre - full).max()),
        "decode_rows_vs_no_cache_forward_max_abs": float(np.abs(gen_rows - again).max()),
        "decode_rows_vs_no_cache_forward_same_argmax": bool(
            np.array_equal(np.argmax(gen_rows, axis=1), np.argmax(again, axis=1))),
    }
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/golden.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/golden", help="output folder (default tests/golden)")
    ap.add_argument("--seed", type=int, default=0, help="test-model seed (default 0)")
    ap.add_argument("--gen", type=int, default=32, help="greedy decode steps per prompt (default 32)")
    ap.add_argument("--model-dir", help="existing make_test_model --config tiny output (its hf/ folder is used); "
                                        "default: build one in a temporary folder")
    a = ap.parse_args(argv)
    if a.seed < 0:
        ap.error(f"--seed must be >= 0, got {a.seed}")
    if a.gen < 1:
        ap.error(f"--gen must be >= 1, got {a.gen}")

    try:
        import torch
        import transformers
    except ImportError as exc:
        print(f"golden: error: needs torch and transformers ({exc}); install them with: {INSTALL}", file=sys.stderr)
        return 2
    if not hasattr(transformers, "DeepseekV4ForCausalLM"):
        print(f"golden: error: transformers {transformers.__version__} has no DeepseekV4ForCausalLM; "
              f"install a newer one with: {INSTALL}", file=sys.stderr)
        return 2

    from ds4tui.devtools.make_test_model import VOCAB, hf_config_json, make, tiny_config
    from ds4tui.engine.tokenizer import Tokenizer, render_chat

    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    notes: list[str] = []
    t_start = time.perf_counter()
    load_start = os.getloadavg()

    with contextlib.ExitStack() as stack:
        if a.model_dir:
            model_dir = Path(a.model_dir)
        else:
            model_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ds4-golden-")))
            print(f"building the tiny test model (seed {a.seed}, f32) in {model_dir}", file=sys.stderr)
            t0 = time.perf_counter()
            make(model_dir, config="tiny", seed=a.seed, types="f32")
            times["make_test_model"] = time.perf_counter() - t0
        hf = model_dir / "hf"
        cfg_disk = json.loads((hf / "config.json").read_text())
        if cfg_disk != json.loads(json.dumps(hf_config_json(tiny_config()))):
            raise GoldenError(f"{hf}/config.json is not the 'tiny' configuration")
        hashes = {name: sha256_file(hf / name) for name in ("model.safetensors", "config.json", "tokenizer.json")}

        print(f"loading {hf} into transformers {transformers.__version__}", file=sys.stderr)
        t0 = time.perf_counter()
        with collect_warnings(notes):
            model, info = transformers.DeepseekV4ForCausalLM.from_pretrained(
                str(hf), output_loading_info=True, attn_implementation="eager", dtype=torch.float32)
        model.eval()
        times["load"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded = verify_loaded(torch, model, info, hf / "model.safetensors")
        times["verify_load"] = time.perf_counter() - t0

        tok = Tokenizer.from_tokenizer_json(hf / "tokenizer.json")
        arrays: dict[str, np.ndarray] = {}
        stats = _Stats()
        prompts_meta = []
        for i, messages in enumerate(PROMPTS):
            ids = render_chat(tok, messages, add_generation_prompt=True)
            t = len(ids)
            if not PROMPT_TOKENS[0] <= t <= PROMPT_TOKENS[1]:
                raise GoldenError(f"prompt {i} renders to {t} tokens, outside {PROMPT_TOKENS}")
            print(f"prompt {i}: {t} tokens, forward + {a.gen} decode steps", file=sys.stderr)
            with collect_warnings(notes):
                r = run_prompt(torch, model, ids, a.gen, VOCAB)
            t0 = time.perf_counter()
            full, gen_rows = r["full"], r["gen_rows"]
            top_ids, top_logits, ties = top_k_sorted(full)
            gen_top_ids, gen_top_logits, gen_ties = top_k_sorted(gen_rows)
            if gen_top_ids[:, 0].tolist() != r["gen_ids"]:
                raise GoldenError(f"prompt {i}: generated ids are not the argmax of their rows")
            full_pos = sorted({MID_POS, t - 1}) if i == 0 else [t - 1]
            arrays[f"p{i}_ids"] = np.asarray(ids, np.int32)
            arrays[f"p{i}_top_ids"] = top_ids
            arrays[f"p{i}_top_logits"] = top_logits
            arrays[f"p{i}_full_pos"] = np.asarray(full_pos, np.int32)
            arrays[f"p{i}_full"] = np.ascontiguousarray(full[full_pos], np.float32)
            arrays[f"p{i}_gen_ids"] = np.asarray(r["gen_ids"], np.int32)
            arrays[f"p{i}_gen_top_ids"] = gen_top_ids
            arrays[f"p{i}_gen_top_logits"] = gen_top_logits
            if i == 0:
                arrays["p0_gen_full"] = np.ascontiguousarray(gen_rows[-1:], np.float32)
            stats.add(full)
            stats.add(gen_rows)
            gp, gp_at = top2_gap(top_logits)
            gg, gg_at = top2_gap(gen_top_logits)
            r["seconds"]["top_k"] = time.perf_counter() - t0
            prompts_meta.append({
                "messages": messages, "n_tokens": t, "n_tokens_mod_4": t % 4, "n_tokens_mod_16": t % 16,
                "full_pos": full_pos, "gen_ids": r["gen_ids"], "gen_text": tok.decode(r["gen_ids"]),
                "min_top2_gap": min(gp, gg),
                "min_top2_gap_prefill": {"gap": gp, "position": gp_at},
                "min_top2_gap_decode": {"gap": gg, "row": gg_at},
                "rows_with_ties_in_top33": {"prefill": ties, "decode": gen_ties},
                "max_abs_logit": float(max(np.abs(full).max(), np.abs(gen_rows).max())),
                "tf_consistency": r["tf_consistency"],
                "seconds": {k: round(v, 3) for k, v in r["seconds"].items()},
            })
            del r, full, gen_rows

    npz = out / f"tiny_seed{a.seed}.npz"
    t0 = time.perf_counter()
    np.savez_compressed(npz, **arrays)
    times["write_npz"] = time.perf_counter() - t0
    times["total"] = time.perf_counter() - t_start
    meta = {
        "config": "tiny", "seed": a.seed, "gguf_types": "f32", "vocab": VOCAB,
        "sha256": hashes, "model_dir": None if not a.model_dir else str(a.model_dir),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "transformers_settings": {"class": "DeepseekV4ForCausalLM", "dtype": "float32", "attn_implementation": "eager",
                                  "torch_threads": torch.get_num_threads(), "cache": "DynamicCache"},
        "render": {"function": "ds4tui.engine.tokenizer.render_chat", "think": True, "add_generation_prompt": True,
                   "tokenizer": "hf/tokenizer.json"},
        "n_top": N_TOP, "n_gen": a.gen, "top_order": "logit descending, equal logits by ascending id",
        "greedy": "argmax (lowest id on ties), no stop at EOS",
        "loaded": loaded, "warnings": notes,
        "logits": stats.as_dict(),
        "prompts": prompts_meta,
        "seconds": {k: round(v, 3) for k, v in times.items()},
        # wall times are only meaningful on an otherwise idle machine: torch's threads slow down
        # many times over when another process takes one of the cores
        "machine": {"cpu_count": os.cpu_count(), "load_average_1min": {"start": round(load_start[0], 2),
                                                                       "end": round(os.getloadavg()[0], 2)}},
        "files": {"npz": npz.name, "npz_bytes": npz.stat().st_size,
                  "arrays": {k: [str(v.dtype), list(v.shape)] for k, v in arrays.items()}},
    }
    js = out / f"tiny_seed{a.seed}.json"
    js.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    folder_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())

    print(f"wrote {npz} ({npz.stat().st_size / 1e6:.2f} MB) and {js} ({js.stat().st_size / 1e3:.1f} kB); "
          f"{out} holds {folder_bytes / 1e6:.2f} MB")
    print(f"model.safetensors sha256 {hashes['model.safetensors']}")
    print(f"logits: max |x| {stats.max_abs:.3f}, std {stats.as_dict()['std']:.3f}; times: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in times.items())
          + f" (1-min load average {meta['machine']['load_average_1min']['start']} at start, "
            f"{meta['machine']['load_average_1min']['end']} at end, {os.cpu_count()} CPUs)")
    for i, p in enumerate(prompts_meta):
        c = p["tf_consistency"]
        print(f"prompt {i}: {p['n_tokens']} tokens, min top-2 gap {p['min_top2_gap']:.2e} "
              f"(prefill {p['min_top2_gap_prefill']['gap']:.2e}, decode {p['min_top2_gap_decode']['gap']:.2e}), "
              f"tie rows {p['rows_with_ties_in_top33']}, "
              f"tf cached vs no-cache row 0 {c['gen0_cached_vs_no_cache_last_row_max_abs']:.1e}, "
              f"decode vs no-cache {c['decode_rows_vs_no_cache_forward_max_abs']:.1e}; "
              f"forward {p['seconds']['forward_no_cache']:.1f}s, decode {p['seconds']['decode']:.1f}s")
    if notes:
        print(f"{len(notes)} warning(s) recorded in {js.name}")
    if folder_bytes > 5_000_000:
        print(f"golden: warning: {out} holds {folder_bytes / 1e6:.2f} MB (> 5 MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except GoldenError as exc:
        print(f"golden: error: {exc}", file=sys.stderr)
        raise SystemExit(1)
