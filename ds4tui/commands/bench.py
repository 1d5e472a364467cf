"""``ds4tui bench [MODEL | --medium]``: prefill and decode speed, bytes per token, bandwidth.

What is measured, in one run:

* **prefill** — a prompt of ``--prompt-tokens`` ids (a fixed English + code text in the model's own
  tokenizer, repeated to length) through :meth:`Session.prefill` with the session's default
  chunking; timed from the call to its return.
* **decode** — after the prefill, ``step()`` once *untimed* (it only samples the first token from the
  prefill's logits; no forward pass), then ``--decode-tokens`` timed greedy steps, each one forward
  pass of one token plus sampling.  Timed token positions: ``P .. P+D-1``.
* **bytes per token** — the inspect estimate (:meth:`DS4Model.bytes_per_token`, spec ds4.md §8): all
  dense tensors, ``n_expert_used/n_expert`` of the routed experts, one embedding row, the LM head,
  and the KV/compressed rows read at the mean timed decode context ``P + (D+1)//2``.
* **effective bandwidth** = bytes per token × decode tokens/s; **memcpy bandwidth** from
  ``ds4_memcpy_bandwidth`` (buffer ≥ 256 MiB and ≥ 4 × the last-level cache, the engine's thread
  count, best of 5; GB/s = 1e9 bytes copied per second) and the ratio of the two; ``bandwidth_note``
  (null or a sentence) says when the bytes a token reads fit in the last-level cache, where the ratio
  may pass 1 (:func:`bandwidth_note`).

With ``--repeat N`` the whole measurement runs N times on one session (reset in between) and the
fastest prefill and fastest decode are reported (``runs`` lists all).  ``--medium`` builds a synthetic
medium model (``make_test_model`` config ``medium``) once into the user cache and reuses it; with
neither MODEL nor ``--medium`` the bundled demo model (:func:`ds4tui.demo.demo_pair`) is measured and
its path goes to stderr.
Errors print one line naming the file and return 1; a usage error (an option out of range for
the model's context length, named with the accepted range) returns 2 before the weights load.

``--ab`` (spec dspark.md §11 item 7) compares three arms on one engine with the support model
attached in every arm, so the memory configuration is the same and only the knob under test
changes: target-only (DSpark disabled), DSpark without the scheduler, DSpark with it.  Each arm
generates ``--tokens`` greedy tokens (default 512; EOS does not stop it) for each of two prompts, a
code request and a prose request, rendered with the chat template in non-thinking mode, each in a
fresh session, the arms in :data:`AB_ARMS`' order for the first prompt and reversed for the second
(``arm_order``; each run's ``position``).  The scheduler arm's sessions start from the prices that
``--scheduler-prices`` gives them (spec dspark.md §7.4; each run's ``scheduler_prices_at_start``):
with ``engine`` or ``saved`` (the default) those of the sessions before it, whatever their arm.
The JSON's ``scheduler_prices_note_at_start`` says where they stood when the engine opened (a saved
file, or none yet) and ``scheduler_prices_note`` where they stand after the run (the file the
sessions' closes wrote, or could not write; with ``engine`` the prices the sessions left in memory);
the text report's ``prices`` line shows both when they differ.
Timed as above: the first step (sampling the prefill's logits) is not timed, every
later step is, and tokens/s counts the tokens those steps emitted.  Per arm and prompt kind it
reports tokens/s and its ratio to the target-only arm, accept rate, tokens per cycle, the stage
times in their own units (``DSparkStats.stage_timing``: each drafter step per drafter pass, verify
per drafted cycle, the plain decode, with the counts) and ds4's stats line, and it checks that the three arms generated the same ids (a
sha256 of each arm's ids); different outputs are an error (exit status 1).
An interrupt (Ctrl-C, SIGTERM, SIGHUP) stops it after the native call it cancels has returned and
keeps the runs that finished (:func:`_partial_ab`; of a plain run's ``--repeat`` runs and of
``--synthetic flash``'s timed runs, :func:`_partial_runs`): they are written where a finished
result would go (``--out``, the JSON or the text report on stdout), marked ``"ok": false,
"interrupted": true`` as every interrupted command's result is (:func:`ds4tui.interrupts.interrupted_result`;
the text report is headed ``INTERRUPTED``), and the exit status is 128 + the signal.  An interrupt
before the first run (the ``--medium`` build, the model's load) gives the record of the planned runs
with none finished (:func:`_before_runs`), one during ``--write-gguf`` the files already complete.
An interrupt after a plain run's last run, while the memcpy bandwidth is measured (most of a short
bench's time: the copy cannot be cancelled, and the command does not wait for it), keeps the whole
result (the fastest run, bytes per token, the effective bandwidth) with ``memcpy_gb_per_s`` and
``bandwidth_ratio`` null and ``memcpy.error`` saying why it was not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ds4tui.commands.environment import (BadVariable, Settings, backend_chosen, backend_unavailable, cache_root,
                                         check_model_path, check_support_block,
                                         check_support_path, draft_vocab_notes, file_error, gpu_options_not_applied,
                                         settings_of)
from ds4tui.engine.backend import DEFAULT_SCHEDULER_POLICY
from ds4tui.engine.decode import DecodeLoop
from ds4tui.engine.draft_vocab import DraftVocabError
from ds4tui.engine.errors import ConversionError
from ds4tui.engine.gguf_model import DS4Model, ModelFileError, special_file_kind
from ds4tui.engine.session import BackendUnavailableError, EngineError, NativeNotBuiltError, require_native
from ds4tui.engine.stats import DSparkStats, format_line
from ds4tui.engine.telemetry import format_bytes, plural
from ds4tui.interrupts import INTERRUPTS, MARKED, interrupted_result, print_whole

_PREFIX = "ds4tui bench:"

#: A small Python function both benchmark prompts contain.
_CODE = """\
def moving_average(values: list[float], window: int) -> list[float]:
    \"\"\"Mean of each run of `window` consecutive values.\"\"\"
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
"""

#: The text a benchmark prompt is made of (tokenised with the model's tokenizer, repeated to length).
PROMPT_TEXT = """\
The quick brown fox jumps over the lazy dog. A benchmark should measure one thing at a time, say
exactly what it timed, and give the same answer when it is run twice on the same machine.

""" + _CODE + """
Memory bandwidth, not arithmetic, bounds single-sequence decoding: every generated token reads the
dense weights, a few experts per layer, the output head and the attention cache once.
"""

#: --ab prompts: a code request and a prose request (spec dspark.md §11 item 7 reports them apart).
AB_PROMPTS = (
    ("code", """\
Here is a Python function:

""" + _CODE + """
Rewrite it as a class `MovingAverage` with an `update(value)` method that returns the current mean, \
add type hints and a docstring, and write pytest tests for windows of 1, 3 and 10."""),
    ("prose", "Write a short essay for a general audience about why the lighthouses of the nineteenth century "
              "were built where they were, who kept them, and what daily life was like for the keepers and "
              "their families through a long winter."),
)
#: The --ab arms: name and the knobs each sets (the others stay at the session's defaults).
AB_ARMS = (
    ("target-only", {"enabled": False}),
    ("dspark-no-scheduler", {"enabled": True, "scheduler": False}),
    ("dspark-scheduler", {"enabled": True, "scheduler": True}),
)
AB_TOKENS = 512
#: The fewest --tokens an A/B run accepts: the first token comes from the prefill and the scheduler's
#: first five cycles are plain decodes in a session with no kept prices (spec dspark.md §7.4), so 16
#: leave its arm 10 tokens to draft in, room for one whole draft of a block of 5 and a cut one; with
#: fewer the arms barely differ and the comparison measures next to nothing.
AB_MIN_TOKENS = 16

MEMCPY_MIN_BYTES = 256 << 20
MEMCPY_REPS = 5

#: What ``--medium`` builds (make_test_model.make arguments); the cache is rebuilt when this changes.
MEDIUM_RECIPE = {"config": "medium", "seed": 0, "types": "q2"}
MEDIUM_MARKER = "bench-medium.json"


class BenchError(Exception):
    """A user-facing problem (bad option combination, unwritable --out)."""


class BenchUsageError(BenchError):
    """An option out of range for the model (``--ctx``, ``--prompt-tokens``, ``--tokens`` against its
    context length), found from the file's metadata before the weights load, or options that cannot
    be used together: exit status 2."""


def _ctx_within_model(ctx: int | None, limit: int, path) -> None:
    """--ctx, when given, at most the model's context length (else :class:`BenchUsageError`)."""
    if ctx is not None and ctx > limit:
        raise BenchUsageError(f"argument --ctx: expected at most {limit} (the context length of {path}), found {ctx}")


# ---- the --medium model ----------------------------------------------------------------------

def medium_dir() -> Path:
    return cache_root() / "bench-medium"


def _medium_recipe() -> dict:
    from ds4tui.devtools import make_test_model as mtm

    cfg = dataclasses.asdict(mtm.CONFIGS[MEDIUM_RECIPE["config"]]())
    return json.loads(json.dumps({**MEDIUM_RECIPE, "model_config": cfg}))


def cached_medium(folder: Path) -> Path | None:
    """``folder/model.gguf`` when a finished build of the current recipe is there, else None."""
    try:
        marker = json.loads((folder / MEDIUM_MARKER).read_text())
        model = folder / "model.gguf"
        if marker.get("recipe") == _medium_recipe() and model.stat().st_size == marker.get("model_bytes"):
            return model
    except (OSError, ValueError, AttributeError):
        pass
    return None


def medium_model(folder: Path | None = None) -> Path:
    """The medium benchmark model: reused from ``folder`` (default :func:`medium_dir`) when complete,
    else built there (progress on stderr).  The build goes to a temporary sibling folder that is
    renamed into place only when finished, so an interrupted build leaves nothing half-made."""
    from ds4tui.devtools import make_test_model as mtm

    folder = Path(folder) if folder is not None else medium_dir()
    found = cached_medium(folder)
    if found is not None:
        return found
    recipe = _medium_recipe()
    c = recipe["model_config"]
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=folder.parent))
    except OSError as exc:
        raise BenchError(f"{folder}: cannot create the model cache: {exc.strerror or exc}") from None
    print(f"{_PREFIX} building the medium model (hidden {c['n_embd']}, {c['n_layer']} layers, {c['n_expert']} "
          f"experts, {recipe['types']}) in {folder}; this happens once and takes several minutes",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        made = mtm.make(tmp, config=recipe["config"], seed=recipe["seed"], types=recipe["types"], quiet=False)
        shutil.rmtree(tmp / "hf", ignore_errors=True)  # the f32 checkpoint (GBs); the GGUFs are what is used
        model = tmp / Path(made["model"]).name
        (tmp / MEDIUM_MARKER).write_text(json.dumps({"recipe": recipe, "model_bytes": model.stat().st_size},
                                                    indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the cache folder need not be
        if folder.exists() or folder.is_symlink():  # a stale or unfinished earlier build
            if folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder)
            else:
                folder.unlink()
        try:
            os.replace(tmp, folder)
        except OSError:
            if cached_medium(folder) is None:  # not another process finishing the same build first
                raise
    except OSError as exc:
        raise BenchError(f"{folder}: cannot build the medium model: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{_PREFIX} medium model ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    found = cached_medium(folder)
    if found is None:
        raise BenchError(f"{folder}: the medium model build did not leave a complete model")
    return found


def medium_support(model: Path) -> Path:
    """The support model of the medium benchmark model: ``support.gguf`` beside it (the build
    writes one), else written there now (random weights for the medium configuration; written to a
    temporary name first, so that the file exists only when complete)."""
    from ds4tui.devtools import make_test_model as mtm

    path = Path(model).parent / "support.gguf"
    if path.is_file():
        return path
    print(f"{_PREFIX} writing the medium model's support file {path}", file=sys.stderr, flush=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        c = mtm.CONFIGS[MEDIUM_RECIPE["config"]]()
        mtm.write_support(tmp, c, MEDIUM_RECIPE["seed"], types=MEDIUM_RECIPE["types"])
        os.replace(tmp, path)
    except OSError as exc:
        raise BenchError(f"{path}: cannot write the support model: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


# ---- measurement helpers -----------------------------------------------------------------------

def prompt_ids(model: DS4Model, n: int) -> tuple[list[int], str]:
    """``n`` deterministic prompt ids: :data:`PROMPT_TEXT` in the model's tokenizer, repeated to length
    (fallback: fixed-seed random ids over the vocabulary when the tokenizer cannot be built)."""
    from ds4tui.engine.tokenizer import Tokenizer, TokenizerError

    try:
        ids = Tokenizer.from_gguf(model.reader).encode(PROMPT_TEXT, parse_special=False)
        if ids:
            return (ids * (n // len(ids) + 1))[:n], "text"
    except TokenizerError:
        pass
    rng = np.random.default_rng(0)
    return [int(t) for t in rng.integers(0, model.config.n_vocab, n)], "random"


def _llc_bytes() -> int:
    """Size of the largest (last-level) CPU cache from sysfs; 0 when unknown."""
    best = (0, 0)
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in root.glob("index*"):
        try:
            level = int((idx / "level").read_text())
            text = (idx / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        try:
            size = int(text.rstrip("KMGkmg")) * mult
        except ValueError:
            continue
        best = max(best, (level, size))
    return best[1]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:
        available = os.cpu_count()
    return {"platform": platform.platform(), "machine": platform.machine(), "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(), "cpus_available": available, "llc_bytes": _llc_bytes(),
            "python": platform.python_version()}


def _memcpy_record(n_threads: int) -> dict:
    """The ``memcpy`` object of a result before its figure: what the measurement copies."""
    return {"gb_per_s": None, "buffer_bytes": max(MEMCPY_MIN_BYTES, 4 * _llc_bytes()), "reps": MEMCPY_REPS,
            "n_threads": n_threads}


def memcpy_bandwidth(n_threads: int) -> dict:
    """``ds4_memcpy_bandwidth`` over a buffer of at least 256 MiB and 4 × the last-level cache."""
    out = _memcpy_record(n_threads)
    size = out["buffer_bytes"]
    try:
        from ds4tui._native import lib
    except ImportError:
        out["error"] = "the native library (ds4tui._native) is not built"
        return out
    gbs = float(lib.ds4_memcpy_bandwidth(size, MEMCPY_REPS, n_threads))
    if gbs > 0:
        out["gb_per_s"] = gbs
    else:
        out["error"] = f"ds4_memcpy_bandwidth failed (code {gbs:g})"
    return out


#: The signals that interrupt a command (ds4tui.interrupts turns each into one KeyboardInterrupt).
_INTERRUPTS = set(INTERRUPTS)


def _in_worker(fn, on_interrupt, may_leave=None):
    """Run ``fn()`` in a thread so that Ctrl-C / SIGTERM reach the main thread at once even while a
    native call runs; on an interrupt call ``on_interrupt()`` (cancel), wait until ``fn`` has
    returned, and re-raise.  The wait is on an event that ``fn``'s thread sets as its last step, not
    on ``Thread.join``: on Python 3.11 and 3.12 a join interrupted by a signal marks the thread as
    stopped while it still runs, and a later join then returns at once, so the caller would free the
    engine under a native call (``ds4_session_create``) that is still running.  ``may_leave()``
    (checked while waiting) true: ``fn`` no longer uses anything the caller frees (bench's memcpy
    measurement, which copies buffers of its own and cannot be cancelled), so the interrupt is
    re-raised at once and ``fn`` is left to finish on its own."""
    box: dict = {}
    done = threading.Event()

    def work():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            box["error"] = exc
        finally:
            done.set()

    # the interrupting signals wait while the thread starts (an interrupt inside Thread.start would
    # leave it running unwatched); the thread keeps them blocked, so they always reach this one
    held = hasattr(signal, "pthread_sigmask")
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _INTERRUPTS) if held else None
    t = threading.Thread(target=work, name="ds4tui-bench", daemon=True)
    t.start()
    try:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one that came meanwhile is raised here
        while not done.wait(0.1):  # a timeout: a signal that another thread took still gets seen
            pass
    except KeyboardInterrupt:
        while True:  # a second Ctrl-C cancels again and still waits: the native objects outlive the call
            try:
                on_interrupt()
                while not done.wait(0.1) and not (may_leave is not None and may_leave()):
                    pass
                break
            except KeyboardInterrupt:
                continue
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def _status(text: str) -> None:
    """A self-overwriting phase line on a terminal's stderr (nothing when stderr is not a terminal)."""
    if sys.stderr.isatty():
        print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)


def measure(session, ids: list[int], n_decode: int, repeat: int, runs: list | None = None) -> list[dict]:
    """Time prefill and decode ``repeat`` times (see the module docstring for what is timed) and return
    the runs, one dict each (seconds and tokens/s of the prefill and of the decode).  Each run is
    appended to ``runs`` (when given) as it finishes, so that a caller keeps the finished ones when a
    :meth:`Session.cancel` stops the rest: a cancelled prefill raises :class:`CancelledError`, a
    cancelled decode ends the measurement without its run."""
    runs = [] if runs is None else runs
    for r in range(repeat):
        if r:
            session.reset()
        tag = f" (run {r + 1}/{repeat})" if repeat > 1 else ""
        _status(f"prefill {len(ids)} tokens{tag}...")
        t0 = time.perf_counter()
        session.prefill(ids)
        t1 = time.perf_counter()
        loop = DecodeLoop(session, 1 + n_decode)  # target-only: one token per cycle
        cycles = iter(loop)
        next(cycles, None)  # samples the first token from the prefill logits: no forward pass, not timed
        _status(f"decode {n_decode} tokens{tag}...")
        t2 = time.perf_counter()
        for _ in cycles:
            pass
        t3 = time.perf_counter()
        if loop.reason == "cancelled":  # cut short: not a finished run
            return runs
        runs.append({"prefill_seconds": t1 - t0, "prefill_tokens_per_s": len(ids) / (t1 - t0),
                     "decode_seconds": t3 - t2, "decode_tokens_per_s": n_decode / (t3 - t2)})
    return runs


def _tell(say, note, backend_note: str, notes: list[str]) -> None:
    """Before measuring: the backend's note to ``say`` (the command prints it for ``--backend auto``
    only, as ``generate`` does), then every other note to ``note`` (printed whatever the backend; ``say``
    when no ``note`` is given)."""
    if say is not None and backend_note:
        say(backend_note)
    for text in notes:
        if note is not None:
            note(text)
        elif say is not None:
            say(text)


def run_bench(model: DS4Model, *, backend: str, numerics: str, activations: str = "auto", n_threads: int,
              n_prompt: int, n_decode: int,
              ctx: int | None, repeat: int, medium: bool, settings: Settings | None = None,
              say=None, note=None) -> dict:
    """Open an engine on ``model``, measure, and return the result object (see ``ds4tui bench --help``).
    ``settings``: what the environment variables set (default: their defaults); ``say(text)``: told
    which backend ran and why, before measuring; ``note(text)`` (else ``say``): told what GPU option the
    engine does not apply, a ``--draft-vocab`` that has no effect and more threads than usable cores
    (:func:`ds4tui.engine.session.threads_note`), whatever the backend."""
    settings = settings or Settings()
    from ds4tui.engine.session import Engine

    need = n_prompt + n_decode + 1  # prompt, the timed tokens, and the last emitted (pending) token
    limit = model.config.context_length
    _ctx_within_model(ctx, limit, model.path)
    if need > limit:  # (before --ctx: a --ctx that cannot reach the sum is not the one to change)
        raise BenchUsageError(_token_counts_past(n_prompt, n_decode, limit, model.path))
    if ctx is not None and ctx < need:
        raise BenchUsageError(f"argument --ctx: expected at least {need} (--prompt-tokens {n_prompt} + "
                              f"--decode-tokens {n_decode} + 1), found {ctx}")
    # given, or sized by the run (compare then takes it as following from the token counts)
    ctx_note = (f"--ctx {ctx}: given" if ctx is not None else
                f"auto: --prompt-tokens {n_prompt} + --decode-tokens {n_decode} + 1 (no --ctx)")
    if ctx is None:
        ctx = need
    ids, prompt_kind = prompt_ids(model, n_prompt)
    engine = Engine(model, backend=backend, numerics=numerics, activations=activations, n_threads=n_threads,
                    **settings.engine_options())
    backend, backend_note = engine.backend, engine.backend_note  # auto: the one chosen, and why
    backend_detail = engine.backend_detail  # auto on the cpu: the GPU's whole reason
    activations, activations_note = engine.activations, engine.activations_note  # auto: resolved by the backend
    threads_note = engine.threads_note  # more threads than usable cores: run as asked, said
    _tell(say, note, backend_chosen(engine), ([threads_note] if threads_note else [])
          + gpu_options_not_applied(settings, engine) + draft_vocab_notes(settings, engine))
    try:
        session = engine.session(ctx, **settings.session_options())
        runs: list[dict] = []  # the runs that finished: kept when an interrupt stops the rest
        stopping = threading.Event()
        measuring_memcpy = threading.Event()  # the runs are done: the session is no longer used

        def work():
            measure(session, ids, n_decode, repeat, runs)
            if stopping.is_set():  # interrupted: no memcpy measurement to wait for
                return None
            measuring_memcpy.set()
            _status("memcpy bandwidth...")
            return memcpy_bandwidth(engine.n_threads)

        def stop():
            stopping.set()
            session.cancel()

        interrupted = False
        try:
            # an interrupt during the memcpy measurement (most of a short bench's time) is not kept
            # waiting for it: it cannot be cancelled and it uses none of the engine's objects
            mc = _in_worker(work, stop, may_leave=measuring_memcpy.is_set)
        except KeyboardInterrupt:  # the worker has returned, or measures the memcpy bandwidth on its own
            interrupted = True
        finally:
            _status("")
        memory = session.memory().to_dict()
        n_threads_used = engine.n_threads
        gemm, gemm_note = engine.prefill_gemm, engine.prefill_gemm_note
        graphs, graphs_note = engine.gpu_graphs, engine.gpu_graphs_note
        amx, amx_note = engine.amx, engine.amx_note
        chunk = session.n_batch
    finally:
        engine.close()

    header = {"model": _model_info(model, medium), "backend": backend, "backend_note": backend_note,
              "backend_detail": backend_detail, "numerics": numerics, "activations": activations,
              "activations_note": activations_note, "amx": amx, "amx_note": amx_note,
              "prefill_gemm": gemm, "prefill_gemm_note": gemm_note, "gpu_graphs": graphs,
              "gpu_graphs_note": graphs_note, "prefill_chunk": chunk, "n_threads": n_threads_used,
              "threads_note": threads_note, "prompt_tokens": n_prompt, "prompt": prompt_kind,
              "decode_tokens": n_decode, "ctx": ctx, "ctx_note": ctx_note, "repeat": repeat}
    if interrupted and len(runs) < repeat:
        raise BenchInterrupted(_partial_runs(runs, repeat, header))
    if interrupted:  # after the last run: the runs and their fastest are whole, the memcpy figure is not
        during = measuring_memcpy.is_set()
        error = (f"interrupted while measuring the memcpy bandwidth, after {repeat} of {repeat} runs" if during
                 else f"interrupted after {repeat} of {repeat} runs, before the memcpy bandwidth was measured")
        mc = dict(_memcpy_record(n_threads_used), error="not measured: " + (
            "interrupted while it was measured (every run had finished)" if during
            else "interrupted before it was measured (every run had finished)"))
    decode_ctx = n_prompt + (n_decode + 1) // 2  # mean context of the timed decode steps (P+1 .. P+D)
    bpt = model.bytes_per_token(decode_ctx)
    prefill_tps = max(r["prefill_tokens_per_s"] for r in runs)
    decode_tps = max(r["decode_tokens_per_s"] for r in runs)
    effective = bpt["total"] * decode_tps / 1e9
    memcpy_gbs = mc["gb_per_s"]
    result = {
        "ok": True,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **header,
        "prefill_tokens_per_s": prefill_tps,
        "decode_tokens_per_s": decode_tps,
        "decode_timing": "greedy decode cycles 2..D+1 after the prefill (in batches of one C call), one forward "
                         "pass each; cycle 1 (sampling the prefill's logits) is not timed",
        "bytes_per_token": bpt["total"],
        "bytes_per_token_detail": {"weights": bpt["weights"], "kv": bpt["kv"], "at_ctx": decode_ctx},
        "effective_gb_per_s": effective,
        "memcpy_gb_per_s": memcpy_gbs,
        "bandwidth_ratio": effective / memcpy_gbs if memcpy_gbs else None,
        "memcpy": mc,
        "memory": memory,
        "machine": machine_info(),
        "runs": runs,
    }
    result["bandwidth_note"] = bandwidth_note(result)
    if interrupted:
        del result["ok"]
        raise BenchInterrupted(interrupted_result(error, **result, runs_planned=repeat, runs_finished=repeat))
    return result


# ---- --ab ----------------------------------------------------------------------------------------

def ids_sha256(ids: list[int]) -> str:
    """sha256 of the ids written as decimal numbers joined by commas."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def _token_counts_past(n_prompt: int, n_decode: int, limit: int, path) -> str:
    """The usage error of ``--prompt-tokens`` + ``--decode-tokens`` + 1 past the model's context length
    ``limit``: the count that cannot fit beside one token of the other, else the larger, with its maximum."""
    prompt_fits, decode_fits = n_prompt + 2 <= limit, n_decode + 2 <= limit
    if not prompt_fits and not decode_fits:
        return (f"arguments --prompt-tokens {n_prompt} and --decode-tokens {n_decode}: each is more than the context "
                f"length {limit} of {path} holds (their sum + 1 must be at most {limit})")
    if not decode_fits or (prompt_fits and n_decode > n_prompt):
        return (f"argument --decode-tokens: expected at most {limit - n_prompt - 1} (the context length {limit} of "
                f"{path} less --prompt-tokens {n_prompt} + 1), found {n_decode}")
    return (f"argument --prompt-tokens: expected at most {limit - n_decode - 1} (the context length {limit} of "
            f"{path} less --decode-tokens {n_decode} + 1), found {n_prompt}")


def sum_stats(parts: list[DSparkStats]) -> DSparkStats:
    """The counters of several sessions added up (histograms bin by bin).  ``t_decode_ms`` is the
    cycle-weighted mean of the parts that timed a plain decode (``t_decode_measured``; a part that
    timed none has 0 there, which is no price), 0 when none did; ``chain_fail_op`` is the last
    non-empty one.  A part that timed no plain decode has ``saved`` and ``net_saved`` 0 (unknown):
    where another part gave a price, its own are priced at it as the engine prices a session's
    (spec dspark.md §6: accepted drafts × t_decode; its drafted cycles' 1 + accepted decodes less its
    proposals and speculative steps), so that the sums cover every part (they covered the timed parts'
    drafts only, beside ``t_decode_measured`` true)."""
    if not parts:
        return DSparkStats()
    total = _sum_parts(parts)
    unpriced = [p for p in parts if not p.t_decode_measured]
    if not total.t_decode_measured or not unpriced:
        return total
    td = total.t_decode_ms
    saved = sum(p.accepted_draft * td for p in unpriced)
    net = sum((p.cycles - p.no_draft + p.accepted_draft) * td - (p.propose + p.spec_total) for p in unpriced)
    return dataclasses.replace(total, saved=total.saved + saved, net_saved=total.net_saved + net)


def _sum_parts(parts: list[DSparkStats]) -> DSparkStats:
    kw: dict = {}
    for name in DSparkStats.__dataclass_fields__:
        vals = [getattr(p, name) for p in parts]
        if name == "block_size":
            kw[name] = max(vals)
        elif name == "t_decode_ms":
            timed = [p for p in parts if p.t_decode_measured]
            cycles = sum(p.cycles for p in timed)
            kw[name] = sum(p.t_decode_ms * p.cycles for p in timed) / cycles if cycles else 0.0
        elif name == "t_decode_measured":
            kw[name] = any(vals)
        elif name == "chain_fail_op":
            kw[name] = next((v for v in reversed(vals) if v), "")
        elif isinstance(vals[0], tuple):
            n = max(len(v) for v in vals)
            kw[name] = tuple(sum(v[i] for v in vals if i < len(v)) for i in range(n))
        elif isinstance(vals[0], dict):
            kw[name] = {k: sum(v.get(k, 0) for v in vals) for k in vals[0]}
        else:
            kw[name] = sum(vals)
    return DSparkStats(**kw)


def _ab_one(engine, ctx: int, ids: list[int], n_tokens: int, knobs: dict, current: list,
            session_options: dict | None = None, stopping: threading.Event | None = None) -> dict:
    """One greedy run of ``n_tokens`` tokens after ``ids`` in a fresh session (made with
    ``session_options``) with ``knobs``; the session is ``current[0]`` while it lives, and when
    ``stopping`` is set (an interrupt that came while no session was current) it is cancelled at once.
    ``stop_reason`` in the result: the decode loop's (``"cancelled"`` for a run an interrupt cut short)."""
    from ds4tui.engine.session import SamplingParams

    session = engine.session(ctx, **(session_options or {}))
    current[0] = session
    try:
        if stopping is not None and stopping.is_set():
            session.cancel()  # its prefill stops at once: the run ends here
        session.set_sampling(SamplingParams())  # greedy
        session.set_dspark(**knobs)
        applied = session.dspark
        t0 = time.perf_counter()
        session.prefill(ids)
        t1 = time.perf_counter()
        loop = DecodeLoop(session, n_tokens)  # no stop token: EOS does not end a run
        cycles = iter(loop)
        n_untimed = len(next(cycles).tokens)  # samples the prefill's logits: not timed
        t2 = time.perf_counter()
        for _ in cycles:
            pass
        t3 = time.perf_counter()
        out, drafted, reason = loop.ids, loop.n_draft, loop.reason
        st = session.dspark_stats()
        priced, retime = session.scheduler_prices_at_start, session.scheduler_prices_retime
        other, retimed = session.scheduler_other_work, session.scheduler_prices_retimed()
        memory = session.memory().to_dict()
    finally:
        current[0] = None
        session.close()
    timed = len(out) - n_untimed
    return {"knobs": applied.to_dict(), "prompt_tokens": len(ids), "generated_tokens": len(out),
            "prefill_seconds": t1 - t0, "decode_seconds": t3 - t2, "decode_tokens": timed,
            "tokens_per_s": timed / (t3 - t2) if t3 > t2 and timed else None,
            "from_draft": drafted, "scheduler_prices_at_start": priced, "scheduler_prices_retime": retime or None,
            "scheduler_other_work_cores": other, "scheduler_prices_retimed": retimed,
            "ids_sha256": ids_sha256(out), "generated_ids": out, "stats": st, "memory": memory,
            "stop_reason": reason}


def ab_arm_order(n_prompts: int) -> list[tuple[str, ...]]:
    """The order the arms run in for each prompt: :data:`AB_ARMS`' order for the first, reversed for
    the second, and so on, so that no arm always runs first (when the target-only arm always ran
    first, its plain decodes were 0.82-0.87x as fast as the scheduler arm's in 640-token runs on a
    2-core machine, tools/cpu_notes.md)."""
    names = tuple(name for name, _ in AB_ARMS)
    return [names if i % 2 == 0 else names[::-1] for i in range(n_prompts)]


def _arm_summary(runs: list[dict], st: DSparkStats) -> dict:
    """Figures of an arm (or a run): tokens/s and the DSpark ones derived from ``st``."""
    tokens = sum(r["decode_tokens"] for r in runs)
    seconds = sum(r["decode_seconds"] for r in runs)
    return {"decode_tokens": tokens, "decode_seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 and tokens else None,
            # None where nothing was proposed (the target-only arm): a rate of no drafts is no 0 %
            "accept_rate": st.accept_rate if st.proposed else None, "tokens_per_cycle": st.tokens_per_cycle,
            "stage_timing": st.stage_timing(), "dspark_line": format_line(st),
            "dspark_stats": st.to_dict()}


def _accept(rate: float | None) -> str:
    """An accept-rate cell of the A/B tables (8 wide): the percentage, or "-" where nothing was proposed."""
    return f"{'-':>8}" if rate is None else f"{rate:7.2f}%"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _model_info(model: DS4Model, medium: bool) -> dict:
    """The model block of the JSON report."""
    c = model.config
    return {"path": str(model.path), "name": model.name, "file_bytes": model.file_bytes, "medium": medium,
            "n_layer": c.n_layer, "n_embd": c.n_embd, "n_vocab": c.n_vocab, "n_expert": c.n_expert,
            "n_expert_used": c.n_expert_used}


def run_ab(model: DS4Model, support: Path, *, backend: str, numerics: str, activations: str = "auto", n_threads: int,
           n_tokens: int,
           ctx: int | None, medium: bool, settings: Settings | None = None, say=None, note=None,
           policy: str | None = None) -> dict:
    """Open one engine with ``support`` attached and run the three arms of :data:`AB_ARMS` on both
    prompts of :data:`AB_PROMPTS` (see the module docstring), the scheduler's arm with ``policy`` (one
    of ``SCHEDULER_POLICIES``; None: the default, spec dspark.md §7.6); returns the result object.
    ``say(text)``: told which backend ran and why, before measuring.  ``note(text)`` (else ``say``):
    told what GPU option the engine does not apply, more threads than usable cores and what the support
    file's draft vocabulary could not give, whatever the backend, and every scheduler prices problem, the saved file that cannot be
    used at the start and a write that failed at the end (also in the result).
    ``settings``: what the environment variables set (default: their defaults)."""
    settings = settings or Settings()
    from ds4tui.engine.session import Engine
    from ds4tui.engine.tokenizer import Tokenizer, render_chat

    tok = Tokenizer.from_gguf(model.reader)
    prompts = [(kind, text, render_chat(tok, [{"role": "user", "content": text}], think=False))
               for kind, text in AB_PROMPTS]
    need = max(len(ids) for _, _, ids in prompts) + n_tokens  # the last emitted token is never run
    limit = model.config.context_length
    _ctx_within_model(ctx, limit, model.path)
    if need > limit:  # (before --ctx: a --ctx that cannot reach the sum is not the one to change)
        raise BenchUsageError(f"argument --tokens: expected at most {limit - (need - n_tokens)} (the context length "
                              f"{limit} of {model.path} less the longest prompt's {need - n_tokens} tokens), "
                              f"found {n_tokens}")
    if ctx is not None and ctx < need:
        raise BenchUsageError(f"argument --ctx: expected at least {need} (the longest prompt's {need - n_tokens} "
                              f"tokens + --tokens {n_tokens}; known once the prompts are tokenized), found {ctx}")
    if ctx is None:
        ctx = need
    engine = Engine(model, backend=backend, numerics=numerics, activations=activations, n_threads=n_threads, support=support,
                    **settings.engine_options(), **settings.price_options())
    backend, backend_note = engine.backend, engine.backend_note  # auto: the one chosen, and why
    backend_detail = engine.backend_detail  # auto on the cpu: the GPU's whole reason
    activations, activations_note = engine.activations, engine.activations_note  # auto: resolved by the backend
    threads_note = engine.threads_note  # more threads than usable cores: run as asked, said
    prices_note_at_start = engine.scheduler_prices_note  # the sessions' closes rewrite it (saved: the file)
    problem_at_start = engine.scheduler_prices_problem
    _tell(say, note, backend_chosen(engine), ([threads_note] if threads_note else [])
          + gpu_options_not_applied(settings, engine) + draft_vocab_notes(settings, engine))
    if note is not None and problem_at_start:
        note(problem_at_start)
    try:
        if engine.support_status != "attached":
            raise BenchError(f"an A/B run needs a support model that drafts: {engine.support_message}")
        block = engine.block_size
        settings.check_block(block, support)
        session_options = settings.session_options()
        support_info = {"path": str(support), "status": engine.support_status, "message": engine.support_message,
                        "block_size": block}
        current: list = [None]
        stopping = threading.Event()
        arm_order = ab_arm_order(len(prompts))

        # what has finished, in the order it ran: (arm, kind, run); kept when an interrupt stops the rest
        finished: list[tuple[str, str, dict]] = []

        def work():
            # prompts outer, arms inner: a machine that slowly speeds up or slows down (thermal,
            # neighbours) then biases every arm alike instead of the arm that runs last; and the
            # arms' order alternates from one prompt to the next (arm_order): the arm that runs
            # first after a prefill is not always the same one
            for kind, ids, order in zip([k for k, _, _ in prompts], [i for _, _, i in prompts], arm_order):
                for position, name in enumerate(order):
                    knobs = {**dict(AB_ARMS)[name], "policy": policy or DEFAULT_SCHEDULER_POLICY}
                    _status(f"{name}: {kind} prompt, {n_tokens} tokens...")
                    run = _ab_one(engine, ctx, ids, n_tokens, knobs, current, session_options, stopping)
                    if run.pop("stop_reason") == "cancelled":  # cut short by the interrupt: not a finished run
                        return
                    finished.append((name, kind, {"kind": kind, "position": position, **run}))

        def stop():  # the flag first: a session made after this read of current[0] sees it
            stopping.set()
            if current[0] is not None:
                current[0].cancel()

        interrupted = False
        try:
            _in_worker(work, stop)
        except KeyboardInterrupt:  # the worker has returned: the runs that finished are kept
            interrupted = True
        finally:
            _status("")
        n_threads_used = engine.n_threads
        graphs, graphs_note = engine.gpu_graphs, engine.gpu_graphs_note
    finally:
        engine.close()
    if note is not None and engine.scheduler_prices_problem and engine.scheduler_prices_problem != problem_at_start:
        note(engine.scheduler_prices_problem)  # a write that failed: in the prices line and the JSON too
    prices_info = {"scheduler_prices": engine.scheduler_prices, "scheduler_prices_note_at_start": prices_note_at_start,
                   "scheduler_prices_note": engine.scheduler_prices_note,
                   "scheduler_prices_file": None if engine.scheduler_prices_file is None
                   else str(engine.scheduler_prices_file),
                   "scheduler_prices_problem": engine.scheduler_prices_problem or None,
                   "draft_vocab": engine.draft_vocab, "draft_vocab_note": engine.draft_vocab_note,
                   "verify_head": engine.verify_head, "verify_head_note": engine.verify_head_note,
                   "amx": engine.amx, "amx_note": engine.amx_note}

    if interrupted:
        raise BenchInterrupted(_partial_ab(finished, arm_order, prompts, {
            "model": _model_info(model, medium), "support": support_info, "backend": backend,
            "backend_note": backend_note, "backend_detail": backend_detail, "numerics": numerics,
            "activations": activations,
            "activations_note": activations_note, "gpu_graphs": graphs,
            "gpu_graphs_note": graphs_note, **prices_info, "n_threads": n_threads_used, "threads_note": threads_note,
            "ctx": ctx, "tokens": n_tokens}))
    arms = [(name, [r for n, _, r in finished if n == name]) for name, _ in AB_ARMS]
    base = {r["kind"]: r for r in arms[0][1]}
    out_arms = []
    for name, runs in arms:
        for r in runs:
            st = r.pop("stats")
            r.update(_arm_summary([r], st))
            r["ratio_to_target"] = _ratio(r["tokens_per_s"], base[r["kind"]]["tokens_per_s"])
        total = sum_stats([DSparkStats.from_dict(r["dspark_stats"]) for r in runs])
        arm = {"name": name, "knobs": runs[0]["knobs"], "memory": runs[0]["memory"], **_arm_summary(runs, total),
               "ids_sha256": ids_sha256([t for r in runs for t in r["generated_ids"]]), "runs": runs}
        out_arms.append(arm)
    for arm in out_arms:
        arm["ratio_to_target"] = _ratio(arm["tokens_per_s"], out_arms[0]["tokens_per_s"])
    ref = out_arms[0]["stage_timing"]  # the target-only arm: every cycle a plain decode
    for arm in out_arms[1:]:
        arm["verify_over_target_decode"] = verify_over_reference(arm["stage_timing"], ref)
    mismatches = []
    for kind, _, _ in prompts:
        want = base[kind]["generated_ids"]
        for arm in out_arms[1:]:
            got = next(r for r in arm["runs"] if r["kind"] == kind)["generated_ids"]
            if got != want:
                at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                mismatches.append({"kind": kind, "arm": arm["name"], "first_difference": at,
                                   "target_only": want[at] if at < len(want) else None,
                                   "arm_id": got[at] if at < len(got) else None})
    return {
        "ok": True,
        "mode": "ab",
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": _model_info(model, medium),
        "support": support_info,
        "backend": backend,
        "backend_note": backend_note,
        "backend_detail": backend_detail,
        "numerics": numerics,
        "activations": activations,
        "activations_note": activations_note,
        "gpu_graphs": graphs,
        "gpu_graphs_note": graphs_note,
        **prices_info,
        "n_threads": n_threads_used,
        "threads_note": threads_note,
        "ctx": ctx,
        "tokens": n_tokens,
        "arm_order": [{"kind": kind, "order": list(order)} for (kind, _, _), order in zip(prompts, arm_order)],
        "sampling": "greedy",
        "timing": "per prompt: a fresh session, prefill, one untimed step (it samples the prefill's logits), then "
                  "timed steps until the tokens are generated; tokens/s = tokens emitted by the timed steps / "
                  "their time",
        "prompts": [{"kind": kind, "text": text, "template": "chat, non-thinking", "prompt_tokens": len(ids)}
                    for kind, text, ids in prompts],
        "arms": out_arms,
        "outputs_identical": not mismatches,
        "mismatches": mismatches,
        "memory_identical": all(a["memory"] == out_arms[0]["memory"] for a in out_arms),
        "noise_note": ab_noise_note([r["decode_seconds"] for a in out_arms for r in a["runs"]], n_tokens),
        "machine": machine_info(),
    }


#: A timed run shorter than this (s) gets :func:`ab_noise_note`.
AB_SHORT_RUN_S = 2.0


def ab_noise_note(seconds: list[float], tokens: int | None = None) -> str | None:
    """What a ``bench --ab`` whose timed runs (``seconds``: each run's decode time) are short can and
    cannot show, as one sentence; None when every run decoded for :data:`AB_SHORT_RUN_S` or longer.
    Each ratio to target-only is one run against one run: on a 2-core machine shared with other work
    a run of under a second moved by up to a third between two benches of the same build
    (tools/cpu_notes.md), so one bench resolves large effects only.  ``tokens`` (the run's
    ``--tokens``): the note says how many would make the shortest run last long enough, rounded up
    to a multiple of 64."""
    timed = [x for x in seconds if x and x > 0]
    if not timed or min(timed) >= AB_SHORT_RUN_S:
        return None
    lo, hi = min(timed), max(timed)
    runs = f"the shortest run decoded for {lo:.2f} s" + ("" if f"{lo:.2f}" == f"{hi:.2f}" else f" (the longest {hi:.2f} s)")
    long = f"{AB_SHORT_RUN_S:g} s or more"
    give = (f"give --tokens {-(-int(tokens * AB_SHORT_RUN_S / lo) // 64) * 64} or more (runs of {long})" if tokens
            else f"give --tokens so that runs last {long}")
    return (f"{runs}: a run this short moves by up to a third with other work on the machine, so a ratio to "
            f"target-only from one bench resolves large effects only; for a few percent, {give} and compare "
            f"several benches (ds4tui compare)")


class BenchInterrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C, SIGTERM, SIGHUP) stopped ``bench``: ``result`` is the partial result
    (:func:`_partial_runs`, :func:`_partial_ab` for ``--ab``), written as a finished run's would be
    before the command exits 130."""

    def __init__(self, result: dict):
        super().__init__("interrupted")
        self.result = result


def _partial_runs(finished: list[dict], planned: int, header: dict) -> dict:
    """The result of a run that an interrupt stopped, a plain one's ``--repeat`` runs or
    ``--synthetic flash``'s timed runs: ``ok`` false, ``interrupted`` true, how many of the
    ``planned`` runs finished, and their own figures in ``runs`` (an empty list when none did), after
    ``header`` (what was asked).  Nothing is derived from them (no fastest run, bandwidth or memcpy
    figure, no extrapolation to 43 layers): the memcpy bandwidth is measured after the last run, an
    extrapolation takes both synthetic models.  (A plain run interrupted after its last run keeps its
    whole result instead, the memcpy figure marked not measured: :func:`run_bench`.)"""
    return interrupted_result(
        f"interrupted after {len(finished)} of {planned} runs",
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **header,
        runs_planned=planned,
        runs_finished=len(finished),
        runs=finished,
        machine=machine_info(),
    )


def _partial_ab(finished: list[tuple[str, str, dict]], arm_order, prompts, header: dict) -> dict:
    """The result of an A/B run that an interrupt stopped: ``ok`` false, ``interrupted`` true, which
    runs (arm and prompt kind) finished and which did not, and each finished run's own figures
    (tokens/s, accept rate, stage timings, stats, generated ids) in ``runs``, in the order they ran.
    Nothing is derived across runs (no arm totals, no ratios to the target-only arm, no output check):
    those need runs that did not happen."""
    planned = [(name, kind) for (kind, _, _), order in zip(prompts, arm_order) for name in order]
    done = {(name, kind) for name, kind, _ in finished}
    runs = []
    for name, kind, r in finished:
        r = dict(r)
        st = r.pop("stats")
        runs.append({"arm": name, **r, **_arm_summary([r], st)})
    return interrupted_result(
        f"interrupted after {len(finished)} of {len(planned)} runs",
        mode="ab",
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **header,
        arm_order=[{"kind": kind, "order": list(order)} for (kind, _, _), order in zip(prompts, arm_order)],
        sampling="greedy",
        prompts=[{"kind": kind, "text": text, "template": "chat, non-thinking", "prompt_tokens": len(ids)}
                 for kind, text, ids in prompts],
        runs_planned=len(planned),
        runs_finished=len(finished),
        finished=[{"arm": name, "kind": kind} for name, kind, _ in finished],
        not_finished=[{"arm": name, "kind": kind} for name, kind in planned if (name, kind) not in done],
        runs=runs,
        machine=machine_info(),
    )


def _before_runs(args, path, stage: str) -> dict:
    """The result of a run that an interrupt stopped before its first run began (``stage`` says
    where: the ``--medium`` build, the model's load, the engine's opening): what
    :func:`_partial_runs` and :func:`_partial_ab` give when no run finished, as far as it is known
    before the model is open (its path, the backend asked for)."""
    planned = ([{"arm": name, "kind": kind} for (kind, _), order in zip(AB_PROMPTS, ab_arm_order(len(AB_PROMPTS)))
                for name in order] if args.ab else None)
    n = len(planned) if planned is not None else args.repeat
    return interrupted_result(
        f"interrupted after 0 of {n} runs, {stage}",
        **({"mode": "ab"} if args.ab else {}),
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        model={"path": None if path is None else str(path), "medium": bool(args.medium)},
        backend=args.backend,
        runs_planned=n,
        runs_finished=0,
        **({"finished": [], "not_finished": planned} if args.ab else {}),
        runs=[],
        machine=machine_info(),
    )


# ---- output ------------------------------------------------------------------------------------


def bandwidth_note(r: dict) -> str | None:
    """Why ``bandwidth_ratio`` is no measure of memory efficiency, where it is not: on the CPU backend, when
    the bytes a token reads (``bytes_per_token``) fit in the last-level cache (``machine.llc_bytes``), a
    decode reads them from the cache, not from memory, and the ratio may pass 1 (the bundled demo model on
    most CPUs).  None otherwise."""
    llc, bpt = r["machine"].get("llc_bytes"), r["bytes_per_token"]
    if r.get("backend") != "cpu" or not llc or bpt > llc:
        return None
    return (f"the {format_bytes(bpt)} a token reads fit in the CPU's last-level cache ({format_bytes(llc)}): "
            f"decode reads them from the cache, not from memory, so effective / memcpy can pass 1 and does not "
            f"measure memory efficiency here (a model larger than the cache does)")


def render_text(r: dict) -> str:
    m, mem, mach, mc = r["model"], r["memory"], r["machine"], r["memcpy"]
    b = r["bytes_per_token_detail"]
    best = " (fastest of %d runs)" % r["repeat"] if r["repeat"] > 1 else ""
    prefill_s = min(x["prefill_seconds"] for x in r["runs"])
    decode_s = min(x["decode_seconds"] for x in r["runs"])
    memcpy = (f"{mc['gb_per_s']:10.2f} GB/s   bytes copied a second, the best of {mc['reps']} copies of a "
              f"{format_bytes(mc['buffer_bytes'])} buffer, {plural(mc['n_threads'], 'thread')}" if mc["gb_per_s"]
              else f"{'-':>10}        {mc.get('error', 'not measured')}")
    ratio = f"{r['bandwidth_ratio']:10.3f}        effective / memcpy" if r["bandwidth_ratio"] is not None else \
        f"{'-':>10}"
    rows = [
        ("model", f"{m['path']}  ({m['name']}, {format_bytes(m['file_bytes'])})"),
        ("engine", f"{r['backend']} backend, {r['numerics']} numerics, {r.get('activations', 'f32')} activations"
                   f"{', amx' if r.get('amx') == 'on' else ''}, "
                   f"{plural(r['n_threads'], 'thread')}, context {r['ctx']}"
                   + (f", prefill chunks of {r['prefill_chunk']}" if r.get("prefill_chunk") else "") + "; prefill-gemm "
                   f"{r.get('prefill_gemm_note') or r.get('prefill_gemm', 'off')}"
                   + (f"; graphs {r['gpu_graphs_note']}" if r.get("backend") == "hip" and r.get("gpu_graphs_note")
                      else "")),
        ("machine", f"{mach['cpu']}, {mach['cpus_available']} of {mach['cpu_count']} CPUs, {mach['platform']}"),
        ("memory", f"{format_bytes(mem['total'])}  (weights {format_bytes(mem['weights'])}, KV window ring {format_bytes(mem['kv'])}, "
                   f"compressed KV {format_bytes(mem['compressor'])}, scratch {format_bytes(mem['scratch'])}"
                   + (f", amx copies {format_bytes(mem['amx_copies'])}" if mem.get("amx_copies") else "")
                   + (f", device {format_bytes(mem['device'])}" if mem.get("device") else "") + ")"),
        ("prefill", f"{r['prefill_tokens_per_s']:10.2f} tok/s  {r['prompt_tokens']} tokens in {prefill_s:.3f} s{best}"),
        ("decode", f"{r['decode_tokens_per_s']:10.2f} tok/s  {r['decode_tokens']} tokens in {decode_s:.3f} s{best}"),
        ("bytes/token", f"{format_bytes(r['bytes_per_token']):>10}        weights {format_bytes(b['weights'])} + KV "
                        f"{format_bytes(b['kv'])} at context {b['at_ctx']}"),
        ("effective", f"{r['effective_gb_per_s']:10.2f} GB/s   bytes/token x decode tok/s"),
        ("memcpy", memcpy),
        ("ratio", ratio),
    ]
    if r.get("bandwidth_note"):
        rows.append(("", r["bandwidth_note"]))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _num(v: float | None, fmt: str, width: int) -> str:
    return f"{v:{width}{fmt}}" if v is not None else f"{'-':>{width}}"


def _prices_line(r: dict) -> str:
    """Where the scheduler's prices started and, when the run changed that, where they ended."""
    start, end = r.get("scheduler_prices_note_at_start"), r.get("scheduler_prices_note", "fresh")
    return end if not start or start == end else f"at the start {start}; after the run {end}"


def render_ab_text(r: dict) -> str:
    m, sup = r["model"], r["support"]
    mem = r["arms"][0]["memory"]
    same = "the same in every arm" if r["memory_identical"] else "DIFFERS between arms"
    lines = [
        f"model    {m['path']}  ({m['name']}, {format_bytes(m['file_bytes'])})",
        f"support  {sup['message']}",
        f"drafts   from {r.get('draft_vocab_note') or 'the whole vocabulary'} (--draft-vocab)",
        f"verify   LM head {r.get('verify_head_note') or 'all: every row'} (--verify-head)",
        f"engine   {r['backend']} backend, {r['numerics']} numerics, {r.get('activations', 'f32')} activations"
        f"{', amx' if r.get('amx') == 'on' else ''}, "
        f"{plural(r['n_threads'], 'thread')}, context {r['ctx']}, "
        f"memory {format_bytes(mem['total'])} ({same})"
        + (f"; graphs {r['gpu_graphs_note']}" if r.get("backend") == "hip" and r.get("gpu_graphs_note") else ""),
        "prompts  " + ", ".join(f"{p['kind']} {p['prompt_tokens']} tokens" for p in r["prompts"])
        + f" (chat template, non-thinking); {r['tokens']} greedy tokens per prompt and arm",
        "order    " + "; ".join(f"{o['kind']}: {', '.join(o['order'])}" for o in r.get("arm_order", [])),
        f"prices   {_prices_line(r)}",
        "",
    ]
    name_w = max(len(a["name"]) for a in r["arms"])
    lines.append(f"{'arm':<{name_w}}  {'prompt':<6} {'tok/s':>9} {'vs target':>9} {'accept':>8} {'tok/cycle':>9} "
                 f"{'cycles':>7}  ids sha256")
    for a in r["arms"]:
        for row in a["runs"] + [dict(a, kind="all")]:
            st = row["dspark_stats"]
            ratio = _num(row["ratio_to_target"], ".3f", 8) + "x" if row["ratio_to_target"] else f"{'-':>9}"
            lines.append(f"{a['name']:<{name_w}}  {row['kind']:<6} {_num(row['tokens_per_s'], '.2f', 9)} {ratio} "
                         f"{_accept(row['accept_rate'])} {row['tokens_per_cycle']:9.3f} {st['cycles']:7d}  "
                         f"{row['ids_sha256'][:16]}")
    for a in r["arms"]:
        k = a["knobs"]
        lines += ["", f"{a['name']}: enabled={int(k['enabled'])} scheduler={int(k['scheduler'])} "
                      f"threshold={k['threshold']:g} max_draft={k['max_draft']}"
                      + (f" policy={k['policy']}" if "policy" in k else ""),
                  "  " + a["dspark_line"],
                  "  " + stage_timing_line(a["stage_timing"], a.get("verify_over_target_decode"))]
    lines.append("")
    if r["outputs_identical"]:
        lines.append(f"greedy outputs: identical in all {len(r['arms'])} arms (" + ", ".join(
            f"{row['kind']} {row['ids_sha256'][:16]}" for row in r["arms"][0]["runs"]) + ")")
    else:
        lines.append("greedy outputs: DIFFERENT: " + "; ".join(
            f"{x['arm']} {x['kind']} from token {x['first_difference']}" for x in r["mismatches"]))
    if r.get("noise_note"):
        lines.append(f"note: {r['noise_note']}")
    return "\n".join(lines)


def render_partial_text(r: dict) -> str:
    """The text report of an interrupted plain run (:func:`_partial_runs`): each finished run's own
    figures; interrupted after its last run (before or while the memcpy bandwidth was measured), the
    whole report under its heading."""
    if "decode_tokens_per_s" in r:  # every run finished: the fastest run is kept
        return (f"INTERRUPTED {r['error'][len('interrupted '):]}: every run finished (the figures below are "
                f"whole); the memcpy bandwidth and the ratio were not measured\n" + render_text(r))
    m = r["model"]
    lines = [f"INTERRUPTED after {r['runs_finished']} of {r['runs_planned']} runs: the figures below are the finished "
             f"runs' own (no fastest run, no bandwidth)",
             f"model    {m['path']}  ({m['name']}, {format_bytes(m['file_bytes'])})",
             f"engine   {r['backend']} backend, {r['numerics']} numerics, {plural(r['n_threads'], 'thread')}, "
             f"context {r['ctx']}; prompt {r['prompt_tokens']} tokens, decode {r['decode_tokens']} tokens", ""]
    for i, x in enumerate(r["runs"], 1):
        lines.append(f"run {i}    prefill {x['prefill_tokens_per_s']:10.2f} tok/s   decode "
                     f"{x['decode_tokens_per_s']:10.2f} tok/s")
    if not r["runs"]:
        lines.append("no run finished")
    return "\n".join(lines)


def render_before_runs_text(r: dict) -> str:
    """The text report of a run that an interrupt stopped before its first run (:func:`_before_runs`)."""
    m = r["model"]
    return "\n".join([f"INTERRUPTED {r['error'][len('interrupted '):]}: nothing was measured",
                      f"model    {m['path'] or 'the medium model (not built yet)'}"])


def render_ab_partial_text(r: dict) -> str:
    """The text report of an interrupted A/B run (:func:`_partial_ab`): the finished runs' own
    figures, and which runs did not finish."""
    m = r["model"]
    lines = [
        f"INTERRUPTED after {r['runs_finished']} of {r['runs_planned']} runs: the figures below are the finished "
        f"runs' own (no arm totals, no ratios to the target-only arm, no output check)",
        f"model    {m['path']}  ({m['name']}, {format_bytes(m['file_bytes'])})",
        f"support  {r['support']['message']}",
        f"engine   {r['backend']} backend, {r['numerics']} numerics, {r.get('activations', 'f32')} activations"
        f"{', amx' if r.get('amx') == 'on' else ''}, "
        f"{plural(r['n_threads'], 'thread')}, context {r['ctx']}; {r['tokens']} greedy tokens per prompt and arm",
        "",
    ]
    if r["runs"]:
        name_w = max(len(x["arm"]) for x in r["runs"])
        lines.append(f"{'arm':<{name_w}}  {'prompt':<6} {'tok/s':>9} {'accept':>8} {'tok/cycle':>9} {'cycles':>7}  "
                     f"ids sha256")
        for x in r["runs"]:
            lines.append(f"{x['arm']:<{name_w}}  {x['kind']:<6} {_num(x['tokens_per_s'], '.2f', 9)} "
                         f"{_accept(x['accept_rate'])} {x['tokens_per_cycle']:9.3f} {x['dspark_stats']['cycles']:7d}  "
                         f"{x['ids_sha256'][:16]}")
    else:
        lines.append("no run finished")
    lines.append("not finished: " + (", ".join(f"{x['arm']} ({x['kind']} prompt)" for x in r["not_finished"])
                                     or "none"))
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def verify_over_reference(t: dict, ref: dict) -> dict | None:
    """What one verify of an arm (``t``, a ``stage_timing``) costs in plain decodes of the
    target-only arm (``ref``): ``{"ratio", "plain_decodes"}``, when that arm timed more plain
    decodes than this one (a DSpark arm times few: with the scheduler off, one at most), else None."""
    v, d = t.get("verify_ms_per_drafted_cycle"), ref.get("decode_ms_per_plain_decode")
    if not v or not d or ref.get("plain_decodes", 0) <= t.get("plain_decodes", 0):
        return None
    return {"ratio": v / d, "plain_decodes": ref["plain_decodes"]}


def stage_timing_line(t: dict, reference: dict | None = None) -> str:
    """``DSparkStats.stage_timing`` on one line: ms per drafter pass of each non-zero drafter step
    and their sum, ms per drafted cycle of verify (and the rows it ran and computed the LM head of,
    spec dspark.md §3.4) and ms per plain decode, with the counts; one
    verify in plain decodes, of the target-only arm when ``reference``
    (:func:`verify_over_reference`) is given."""
    steps = " ".join(f"{s}={_ms(v)}" for s, v in t["ms_per_drafter_pass"].items() if v and s != "propose")
    if reference is not None:
        tail = (f"; verify = {reference['ratio']:.2f} decodes of the target-only arm "
                f"({reference['plain_decodes']} decodes)")
    elif t["verify_over_decode"] is not None:
        tail = f"; verify = {t['verify_over_decode']:.2f} decodes"
    else:
        tail = ""
    passes = t["drafter_passes"]
    return (f"ms per drafter pass ({passes} {'pass' if passes == 1 else 'passes'}): {steps + ' ' if steps else ''}"
            f"propose={_ms(t['ms_per_drafter_pass']['propose'])}; "
            f"verify per drafted cycle ({plural(t['drafted_cycles'], 'cycle')}) {_ms(t['verify_ms_per_drafted_cycle'])} ms"
            + (f" (LM head of {t['verify_head_rows_per_drafted_cycle']:.2f} of {t['verify_rows_per_drafted_cycle']:.2f} "
               f"rows)" if t.get("verify_head_rows_per_drafted_cycle") is not None else "") + "; "
            f"plain decode ({plural(t['plain_decodes'], 'decode')}) {_ms(t['decode_ms_per_plain_decode'])} ms" + tail)


def _fail(message: str, args, exc: BaseException | None = None, status: int = 1) -> int:
    """The error on stderr (with ``--json`` also ``{"ok": false, "error", "error_type"}`` on stdout)
    and the exit status."""
    if args.json:
        print(json.dumps({"ok": False, "error": message, "error_type": type(exc).__name__ if exc else "BenchError"}))
    print(f"{_PREFIX} error: {message}", file=sys.stderr)
    return status


def _usage_fail(message: str, args) -> int:
    """A usage error (options that cannot be used together, a value out of range): :func:`_fail`
    with exit status 2, as argparse's."""
    return _fail(message, args, BenchUsageError(message), status=2)


def _write_out(path: str, text: str) -> None:
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the folder's own trouble (read-only file system): the error below names it
            pass
        raise BenchError(f"--out {path}: cannot write the result there: {exc.strerror or exc}") from None


#: Options of the plain benchmark and their defaults (None in the parser, so that --ab can refuse them).
PLAIN_DEFAULTS = {"prompt_tokens": 256, "decode_tokens": 64, "repeat": 1}


def _usage_error(args) -> str | None:
    """Why the options cannot be used together (None when they can)."""
    for flag, value in (("--contexts", args.contexts), ("--verify-widths", args.verify_widths),
                        ("--fill", None if args.fill == "repeat" else args.fill),
                        ("--write-gguf", getattr(args, "write_gguf", None)),
                        ("--dspark-cycle", getattr(args, "dspark_cycle", None) or None)):
        if value is not None:
            return f"{flag} is an option of --synthetic flash"
    if args.ab:
        given = [f"--{k.replace('_', '-')}" for k in PLAIN_DEFAULTS if getattr(args, k) is not None]
        if given:
            return (f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to --ab (it runs its own code "
                    f"and prose prompts, once each; --tokens N sets how many tokens each answer generates)")
        if args.tokens is not None and args.tokens < AB_MIN_TOKENS:
            return (f"argument --tokens: expected at least {AB_MIN_TOKENS} (the first token comes from the prefill and "
                    f"the scheduler arm's first cycles are plain decodes, five with no kept prices: fewer leave it too "
                    f"few tokens to draft in for the arms to compare), found {args.tokens}; the default "
                    f"{AB_TOKENS} measures well")
        if args.mtp is None and args.model is not None:
            return "--ab needs a support model: add --mtp SUPPORT.gguf (or use --medium, which builds one)"
        return None
    for flag, value in (("--mtp", args.mtp), ("--tokens", args.tokens), ("--draft-vocab", args.draft_vocab),
                        ("--scheduler-prices", args.scheduler_prices),
                        ("--scheduler-policy", getattr(args, "scheduler_policy", None)),
                        ("--verify-head", getattr(args, "verify_head", None))):  # the plain run attaches no support model
        if value is not None:
            return f"{flag} is an option of the A/B run: add --ab"
    return None


def _path_problem(flag: str, value: str | None) -> ModelFileError | None:
    """Why the file a path flag names cannot be read, or (``--mtp``) is not a DSpark support GGUF by
    its own contents (None when it can and is, or when the flag is not given): checked before anything
    is unpacked, built or loaded (:func:`~ds4tui.commands.environment.check_support_path`)."""
    if value is None:
        return None
    try:
        check_model_path(value) if flag == "MODEL" else check_support_path(value)
    except ModelFileError as exc:
        return exc
    return None


def _out_problem(path: str) -> str | None:
    """Why the ``--out`` file cannot be written (None when it can): checked before the run by
    creating and removing a file in its folder.  An existing GGUF (the model or support file given,
    the demo's, any other) is never replaced by a result, nor is a device or a pipe.  Each reason is
    a usage error (exit status 2, as draft-vocab's ``--out``): the flag's value is what to change."""
    p = Path(path)
    head = f"--out {path}: cannot write the result there"
    if not path.strip():  # Path("") is the current folder, which the message below would name as found
        return "argument --out: expected a file name, found an empty one; give a file name, e.g. --out bench.json"
    if p.is_dir():
        return f"{head}: expected a file name, found a folder; give a file name, e.g. --out {p / 'bench.json'}"
    if p.exists() and not p.is_file():  # a device (/dev/null, /dev/stdout) or a pipe: the result's file
        # would take its name (replacing /dev/null as root), so refused before the run, as draft-vocab does
        return (f"{head}: expected a file name, found {special_file_kind(p)}, which the result would replace; give "
                f"a file name of its own, e.g. --out bench.json (--json prints the result on stdout)")
    if p.is_file():
        try:
            with open(p, "rb") as fh:
                magic = fh.read(4)
        except OSError:
            magic = b""
        if magic == b"GGUF":
            return (f"{head}: expected a result file, found a GGUF file (a model or support file), which the result "
                    f"would replace; give a file name of its own, e.g. --out {p.with_suffix('.json')}")
    parent = p.parent
    if not parent.is_dir():
        return (f"{head}: its folder {parent} does not exist (or is not a folder); create it, or give --out a "
                f"path in an existing folder")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{p.name}.probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return (f"{head}: its folder {parent} is not writable (creating a file there failed: "
                f"{exc.strerror or exc}); give --out a path in a folder you can write")
    return None


def _emit(args, result: dict, render) -> int | None:
    """Write the JSON to ``--out`` (if given) and print JSON or ``render(result)``; an exit status
    if the file cannot be written, else None.  A result that cannot be written is not lost: its JSON
    goes to stdout and the error to stderr (exit status 1)."""
    text = json.dumps(result, indent=2)
    if args.out is not None:
        try:
            _write_out(args.out, text + "\n")
        except BenchError as exc:
            print_whole(text)
            print(f"{_PREFIX} error: {exc}; the result is the JSON above on stdout: save it from there "
                  f"(and give --out a path that can be written next time)", file=sys.stderr)
            return 1
    print_whole(text if args.json else render(result))
    return None


def _emit_interrupted(args, result: dict, render=None, what: str | None = None) -> int:
    """Write an interrupted run's partial result where a finished one would go (``--out``, stdout;
    the text report by ``render``, by default the plain or A/B run's), say on stderr how far it got
    and where its runs are (``what`` names them), marked as the reader finds them there: the JSON's
    ``"ok": false, "interrupted": true``, the text report's heading ``INTERRUPTED``, and return 130
    (the command line then names the signal in the status)."""
    render = render or (render_ab_partial_text if result.get("mode") == "ab" else render_partial_text)
    failed = _emit(args, result, render)
    where = (f"in {args.out}" if args.out is not None and failed is None
             else "in the JSON on stdout" if args.json or failed is not None else "above")
    what = what or ("every run finished; the runs and the fastest run's figures are" if "decode_tokens_per_s" in result
                    else "the finished runs are" if result.get("runs_finished")
                    else "no run finished; the record of the planned runs is")
    mark = '(headed "INTERRUPTED")' if where == "above" else MARKED
    print(f"{_PREFIX} {result['error']}; {what} {where} {mark}", file=sys.stderr, flush=True)
    return 130


def run_synthetic(args: argparse.Namespace) -> int:
    """``--synthetic flash``: full-width synthetic layers (ds4tui.engine.synthetic)."""
    from ds4tui.engine import synthetic

    if args.ab or args.mtp is not None:
        return _usage_fail("--synthetic runs no A/B (drop --ab/--mtp)", args)
    if args.scheduler_prices is not None:  # no scheduler runs: the cycles are forced to a full block
        return _usage_fail("--scheduler-prices is not an option of --synthetic flash (its DSpark cycles run with "
                           "the scheduler off): drop it, or use it with --ab", args)
    if getattr(args, "verify_head", None) is not None:  # the GPU backend's verify: every row, and the cycle's
        # verify is timed as the full block's
        return _usage_fail("--verify-head is not an option of --synthetic flash (its DSpark cycles verify every "
                           "row of a full block on the GPU backend): drop it, or use it with --ab", args)
    if getattr(args, "amx", None) == "on":  # it times the GPU backend, where the AMX tiles are not
        return _usage_fail("--amx on is not an option of --synthetic flash (it times the GPU backend; the AMX tiles "
                           "are a CPU's): drop it, or use it without --synthetic", args)
    if getattr(args, "write_gguf", None) is not None:
        if not args.write_gguf.strip():
            return _usage_fail("--write-gguf needs a folder name (got an empty one)", args)
        cycle = bool(getattr(args, "dspark_cycle", False))
        names = [*map(str, synthetic.GGUF_NAMES), "support"][:len(synthetic.GGUF_NAMES) + cycle]
        written: list[Path] = []  # the files that are complete: kept when an interrupt stops the rest

        def render(r: dict) -> str:
            return "\n".join(([f"INTERRUPTED after writing {len(r['wrote'])} of {r['files_planned']} files"]
                              if r.get("interrupted") else [])
                             + [f"{n} layers: {p}" if n.isdigit() else f"DSpark support: {p}" for n, p in r["wrote"].items()])

        try:
            synthetic.write_flash_ggufs(args.write_gguf, support=cycle, written=written,
                                        log=lambda m: print(m, file=sys.stderr, flush=True))
        except KeyboardInterrupt:  # the file being written is removed; the complete ones are kept and named
            result = interrupted_result(
                f"interrupted after writing {len(written)} of {len(names)} files",
                files_planned=len(names), wrote={k: str(p) for k, p in zip(names, written)},
                not_written=[str(Path(args.write_gguf) / (synthetic.GGUF_NAMES[int(n)] if n.isdigit()
                                                          else synthetic.SUPPORT_NAME)) for n in names[len(written):]])
            return _emit_interrupted(args, result, render, what=("the files written are" if written
                                                                 else "no file was written; the record is"))
        except (ConversionError, EngineError, OSError, ValueError) as exc:
            return _fail(f"--write-gguf {args.write_gguf}: {exc}", args, exc)
        result = {"ok": True, "wrote": {k: str(p) for k, p in zip(names, written)}}
        return _emit(args, result, render) or 0
    backend = "hip" if args.backend == "auto" else args.backend
    if backend != "hip":
        return _usage_fail(f"--synthetic flash times the GPU backend (full-width layers, about 9 GiB of weights "
                           f"built on the host): add --backend hip (--backend {args.backend} given)", args)
    contexts = args.contexts or [args.ctx or 2048]
    flag = "--contexts" if args.contexts else "--ctx"
    for i, c in enumerate(contexts):
        why = (f"{c} is too small: each context must be at least {synthetic.MIN_CONTEXT} tokens" if c < synthetic.MIN_CONTEXT
               else f"{c} comes after {contexts[i - 1]}: give the contexts in ascending order, each once"
               if i and c <= contexts[i - 1] else None)
        if why:
            return _usage_fail(f"argument {flag}: {why} (found {','.join(map(str, contexts))})", args)
    # without --dspark-cycle the synthetic layers draft nothing: no draft vocabulary to choose
    opts = {k: v for k, v in settings_of(args).engine_options().items()
            if k not in ("draft_vocab", "verify_head", "amx")}
    cycle = bool(getattr(args, "dspark_cycle", False))
    vocab = getattr(args, "draft_vocab", None)
    if cycle and vocab not in (None, "auto", "full") and int(vocab) > synthetic.DRAFT_VOCAB_SIZE:
        return _usage_fail(f"argument --draft-vocab: {vocab}: the synthetic support lists "
                           f"{synthetic.DRAFT_VOCAB_SIZE} tokens; choose at most {synthetic.DRAFT_VOCAB_SIZE}, or full "
                           f"for the whole vocabulary", args)
    if not cycle and vocab is not None:
        print(f"{_PREFIX} note: --draft-vocab {vocab} has no effect without --dspark-cycle: the synthetic layers "
              f"draft nothing", file=sys.stderr)
    lengths = getattr(args, "prefill_lengths", None) or ()
    modes = ("off", opts["prefill_gemm"]) if getattr(args, "prefill_ab", False) and opts["prefill_gemm"] != "off" else None
    # auto: the synthetic layers run on the GPU, where auto is f32
    activations = {"auto": "f32"}.get(getattr(args, "activations", "f32"), getattr(args, "activations", "f32"))
    progress = synthetic.Progress()  # the runs that finished: kept when an interrupt stops the rest
    try:
        result = synthetic.run_flash_bench(backend=backend, ctx=contexts, fill=args.fill,
                                           verify_widths=args.verify_widths,
                                           log=lambda m: print(m, file=sys.stderr, flush=True),
                                           prefill_lengths=lengths, prefill_batch=getattr(args, "prefill_batch", 2048),
                                           prefill_modes=modes, activations=activations,
                                           dspark_cycle=cycle, draft_vocab=vocab or "auto", progress=progress, **opts)
    except KeyboardInterrupt:  # the engines are closed: the runs that finished are written as a result would be
        header = {"synthetic": "flash", "backend": backend, "contexts_planned": contexts, "fill": args.fill,
                  "verify_widths": args.verify_widths, "prefill_lengths": list(lengths),
                  "prefill_gemm": opts["prefill_gemm"], "activations": activations, "gpu_graphs": opts["gpu_graphs"],
                  "dspark_cycle": cycle, "draft_vocab": vocab or "auto",
                  "measured_bandwidth_gbs": progress.measured_bandwidth_gbs}
        return _emit_interrupted(args, _partial_runs(progress.finished, progress.planned, header),
                                 synthetic.render_partial)
    except BackendUnavailableError as exc:
        return _fail(f"--synthetic flash: {exc} (it times the GPU backend: `ds4tui doctor` says what is missing; "
                     f"--write-gguf DIR writes the same models without a GPU, for another engine to time)", args, exc)
    except (ConversionError, EngineError, RuntimeError, ValueError) as exc:
        return _fail(f"--synthetic flash: {exc}", args, exc)
    return _emit(args, result, synthetic.render) or 0


def _use_demo(args: argparse.Namespace) -> int | None:
    """No MODEL and no --medium: benchmark the bundled demo model (for --ab with its support model unless
    --mtp names another), unpacked on first use, and say so on stderr; an exit status when it cannot."""
    from ds4tui.demo import DemoError, demo_pair, stderr_progress

    try:
        pair = demo_pair(None if args.json else stderr_progress)
    except DemoError as exc:
        return _fail(str(exc), args, exc)
    if pair is None:
        return _fail("no MODEL given and this build has no bundled demo model: give a DS4 GGUF, or --medium",
                     args, status=2)
    for line in pair.repaired:  # a damaged file unpacked again: said, with --json too
        print(f"{_PREFIX} note: {line}", file=sys.stderr, flush=True)
    args.model = str(pair.model)
    note = f"no MODEL given: benchmarking the bundled demo model {pair.model}"
    if args.ab and args.mtp is None:
        args.mtp = str(pair.support)
        note += f" with its DSpark support model {pair.support}"
    print(f"{_PREFIX} {note}", file=sys.stderr, flush=True)
    return None


def run(args: argparse.Namespace) -> int:
    if args.out is not None:  # before anything runs: a result that cannot be written is a run lost
        why = _out_problem(args.out)
        if why:  # a bad value of the flag (a folder, a device, a GGUF, a folder that takes no file): status 2
            return _usage_fail(why, args)
    if getattr(args, "synthetic", None):
        return run_synthetic(args)
    why = _usage_error(args)
    if why:
        return _usage_fail(why, args)
    for k, v in PLAIN_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for flag, value in (("MODEL", args.model), ("--mtp", args.mtp)):  # before a demo unpack or a --medium build
        problem = _path_problem(flag, value)
        if problem is not None:
            return _fail(str(problem), args, problem)
    try:  # the engine itself, before a demo unpack (99 MiB on first use) or a --medium build
        require_native(args.backend)
    except NativeNotBuiltError as exc:
        return _fail(backend_unavailable(args.backend, exc), args, exc)
    path = args.model
    if path is None and not args.medium:
        failed = _use_demo(args)
        if failed is not None:
            return failed
        path = args.model

    def say(note: str) -> None:  # which backend auto chose and why, and the GPU options it does not apply
        if args.backend == "auto":
            print(f"{_PREFIX} {note}", file=sys.stderr, flush=True)

    if args.ab and args.mtp is not None:  # before anything loads
        try:
            check_support_block(args.mtp, None, settings_of(args))
        except ValueError as exc:  # a --draft-vocab count the file cannot meet, or a bad variable: a usage error
            return _fail(str(exc), args, exc, status=2)
    stage = "before the first run began (the model loading, the engine opening)"  # for an interrupt before any run
    try:
        if args.medium:
            stage = "while building the medium model (the next run builds it afresh)"
            path = medium_model()
            stage = "before the first run began (the model loading, the engine opening)"
        model = DS4Model(path)
        if args.ab:
            support = Path(args.mtp) if args.mtp is not None else medium_support(Path(path))
            result = run_ab(model, support, backend=args.backend, numerics=args.numerics, activations=args.activations,
                            n_threads=args.threads,
                            n_tokens=args.tokens or AB_TOKENS, ctx=args.ctx, medium=bool(args.medium),
                            settings=settings_of(args), say=say, policy=args.scheduler_policy,
                            note=lambda text: print(f"{_PREFIX} note: {text}", file=sys.stderr, flush=True))
        else:
            result = run_bench(model, backend=args.backend, numerics=args.numerics, activations=args.activations,
                               n_threads=args.threads,
                               n_prompt=args.prompt_tokens, n_decode=args.decode_tokens, ctx=args.ctx,
                               repeat=args.repeat, medium=bool(args.medium), settings=settings_of(args), say=say,
                               note=lambda text: print(f"{_PREFIX} note: {text}", file=sys.stderr, flush=True))
    except BadVariable as exc:  # a usage error, as a bad flag
        return _fail(str(exc), args, exc, status=2)
    except ModelFileError as exc:  # a file named on the command line that is not what its argument wants
        return _fail(file_error(exc, args.model, args.mtp), args, exc)
    except DraftVocabError as exc:  # a choice the support file cannot meet: a usage error, as a bad flag
        return _fail(f"argument --draft-vocab: {exc.detail}", args, exc, status=2)
    except BackendUnavailableError as exc:  # the backend's fault, not the model file's
        return _fail(backend_unavailable(args.backend, exc), args, exc)
    except EngineError as exc:
        msg = str(exc)
        return _fail(msg if msg.startswith(str(path)) else f"{path}: {msg}", args, exc)
    except BenchInterrupted as exc:  # the runs that finished are written as a finished result would be
        return _emit_interrupted(args, exc.result)
    except KeyboardInterrupt:  # before any run began: the record of the planned runs, as when none finished
        return _emit_interrupted(args, _before_runs(args, path, stage), render_before_runs_text)
    except BenchUsageError as exc:  # a usage error, as a bad flag: status 2, before the weights load
        return _fail(str(exc), args, exc, status=2)
    except BenchError as exc:
        return _fail(str(exc), args, exc)
    failed = _emit(args, result, render_ab_text if args.ab else render_text)
    if failed is not None:
        return failed
    if args.ab and not result["outputs_identical"]:
        print(f"{_PREFIX} error: the greedy outputs of the arms differ: " + "; ".join(
            f"{x['arm']} ({x['kind']} prompt) from token {x['first_difference']}" for x in result["mismatches"]),
            file=sys.stderr)
        return 1
    return 0
