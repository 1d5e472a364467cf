"""Python side of the engine: open a model on a backend, run sessions, read stats and memory.

``Engine(model, backend="cpu" | "hip" | "auto" | "reference", numerics="ds4" | "transformers")``
opens a validated DS4 GGUF.  On the ``cpu`` and ``hip`` backends the native engine (``ds4tui._native``, C API in
``ds4tui/native/ds4_engine.h``) gets a descriptor built here — the configuration and a table of
tensors pointing into the memory-mapped file — so C never parses files.  The ``reference``
backend runs the numpy reference (:mod:`ds4tui.engine.reference`) behind the same interface, so
``generate`` and the tests can compare the two.  The backend's part of each session call goes
through a small protocol (:mod:`ds4tui.engine.backend`): the session itself keeps the tokens, the
locks, chunked prefill, rollback and the checks.

A :class:`Session` holds one sequence: ``prefill(ids)`` in chunks (progress callback,
cancellation between chunks), ``step()`` for one decode cycle, ``generate()`` as an iterator of
token ids, sampling knobs, and snapshots of the engine's counters (:class:`Stats`) and memory
(:class:`Memory`).  Native calls release the GIL (cffi's default), so a worker thread can decode
while the UI thread runs.

Decode layout (spec dspark.md §2.5, the reference layout): ``step()`` samples the next token from
the last logits and returns it; that token is *pending* — emitted but not yet run through the
model — and is run first by the next ``step()`` or ``prefill()``.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ds4tui.engine.backend import (  # re-exported: the names this module always had
    DEFAULT_SCHEDULER_POLICY,
    STEP_MANY_OUT,
    STEP_MAX,
    DSparkKnobs,
    KnobEvent,
    Memory,
    NativeBackend,
    ReferenceBackend,
    SamplingParams,
    SessionBackend,
    Stats,
    check_policy,
    sample_reference,
)
from ds4tui.engine.errors import (  # re-exported: the names this module always had
    BackendUnavailableError,
    OptionUnavailableError,
    NativeNotBuiltError,
    SchedulerPricesError,
    CancelledError,
    ContextOverflowError,
    DeviceError,
    DraftVocabError,
    EngineError,
    ModelFileError,
    NonFiniteError,
    StateError,
    TokenRangeError,
    native_error,
)
from ds4tui.engine import memplan, prices
from ds4tui.engine.draft_vocab import check_draft_vocab, resolve as resolve_draft_vocab
from ds4tui.engine.gguf_model import DS4Model, SupportModel
from ds4tui.engine.layout import DS4Config
from ds4tui.engine.stats import DSparkStats, format_line

BACKENDS = ("cpu", "hip", "auto", "reference")
#: ds4_engine.h's DS4_MAX_THREADS.
MAX_THREADS = 256
NUMERICS = ("ds4", "transformers")
#: Device layouts of the weight matrices (ds4_engine.h's DS4_GPU_LAYOUT_*, in value order).
GPU_LAYOUTS = ("planar", "ggml")
#: Matmul activations (spec ds4.md §2.9.5): float32, or 8-bit for Q8_0, Q2_K and IQ2_XXS matrices (CPU backend).
ACTIVATIONS = ("f32", "q8")


def auto_activations(backend: str) -> tuple[str, str]:
    """What ``activations="auto"`` means on ``backend`` (spec ds4.md §2.9.5), and the note that says it:
    8-bit activations on the cpu (as ds4's and llama.cpp's CPU paths compute, and about 1.8x the
    float32 prefill there), float32 on the GPU and reference backends."""
    if backend == "cpu":
        return "q8", ("auto: q8 on the cpu backend (8-bit activations for Q8_0, Q2_K and IQ2_XXS matrices, as ds4 "
                      "and llama.cpp compute on a CPU; --activations f32 keeps float32)")
    if backend == "reference":
        return "f32", "auto: f32 on the reference backend (its only activations)"
    return "f32", f"auto: f32 on the {backend} backend (--activations q8 for 8-bit activations)"


#: The amx option (ds4_engine.h's DS4_AMX_*, in value order; spec ds4.md §2.9.6).
AMX = ("off", "on")


def amx_available() -> tuple[bool, str]:
    """Whether this CPU and operating system run the amx option's kernels (AMX-INT8, and the tile
    state granted by the kernel), and why not (the native engine's own probe, ``ds4_cpu_amx``;
    asking grants this process the tile state).  (False, reason) without the native engine."""
    try:
        n = _native()
    except BackendUnavailableError as exc:
        return False, f"the native engine is not built ({exc})"
    why = n.ffi.new("char[256]")
    ok = bool(n.lib.ds4_cpu_amx(why, 256))
    return ok, n.ffi.string(why).decode("utf-8", "replace")


#: The share of the memory the model files leave (the machine's RAM less their bytes, which the kernel maps)
#: that ``amx="auto"`` lets the repacked copies take; beyond it auto is off, keeping the rest for the KV
#: cache, the scratch and the page cache of the mapped weights (spec ds4.md §2.9.6).
AMX_AUTO_SHARE = 0.25


def amx_copy_bytes(tensors: dict) -> int:
    """About what the amx option repacks of a GGUF's ``tensors`` (``DS4Model.tensors``' TensorInfo), in bytes:
    every two-dimensional Q8_0 matrix but the token embedding whose rows are whole groups of 16 and whose
    columns whole tiles of 64 (the engine's ``ds4_cpu_amx_eligible``), each as many bytes as the matrix.
    A drafter's draft-vocabulary head, gathered at open, comes on top (a few MiB)."""
    from gguf import GGMLQuantizationType as T

    return sum(int(t.nbytes) for name, t in tensors.items()
               if t.type == T.Q8_0 and len(t.shape) == 2 and name != "token_embd.weight"
               and t.shape[0] % 16 == 0 and t.shape[1] % 64 == 0)


def memory_total() -> int | None:
    """The machine's RAM in bytes (``sysconf``), None where it cannot say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def auto_amx(backend: str, activations: str, *, copies: int | None = None, files: int = 0,
             total: int | None = None) -> tuple[str, str]:
    """What ``amx="auto"`` means on ``backend`` with the matmul ``activations`` in force (spec ds4.md
    §2.9.6), and the note that says it: on where the cpu backend multiplies 8-bit activations and
    the CPU has AMX-INT8 (the same results; a copy of the repacked matrices in memory), else off
    with the reason; off too where the copies (``copies`` bytes, :func:`amx_copy_bytes`) would take more
    than :data:`AMX_AUTO_SHARE` of what the model files (``files`` bytes) leave of the machine's
    ``total`` bytes of RAM (the 81 GB model's copies are several GB)."""
    if backend != "cpu":
        return "off", f"auto: off on the {backend} backend (the AMX tiles are a CPU's)"
    if activations != "q8":
        return "off", ("auto: off with f32 activations (the tiles multiply 8-bit activations: --activations q8 "
                       "with --amx on)")
    ok, why = amx_available()
    if not ok:
        return "off", f"auto: off: {why}"
    if copies is not None and total:
        allowed = AMX_AUTO_SHARE * max(0, total - files)
        if copies > allowed:
            from ds4tui.engine.telemetry import format_bytes

            return "off", (f"auto: off: the repacked copies would take about {format_bytes(copies)} beside "
                           f"{format_bytes(files)} of model files in {format_bytes(total)} of memory (auto allows "
                           f"{AMX_AUTO_SHARE:.0%} of what the files leave, {format_bytes(int(allowed))}); --amx on "
                           f"makes them anyway")
    return "on", ("auto: on: this CPU has AMX-INT8, so the Q8_0 matrices are repacked for its tiles and multiplied "
                  "there (the same results; a verify's LM head costs about its weight read; --amx off keeps the "
                  "mapped rows alone)")


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask where the platform has one (Linux:
    ``taskset``, a container's cpuset), else ``os.cpu_count()``; 1 when neither is known."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_note(n_threads: int) -> str:
    """The note on an engine's thread count: ``n_threads`` (the worker threads it runs, as asked; 0
    asks for one per :func:`usable_cores`, which never draws the note) above the usable cores means
    the workers share cores, which is usually slower, and the note says so with the ``--threads``
    value that uses each core once; "" when they fit.  Nothing is changed: the count asked for runs."""
    cores = usable_cores()
    if n_threads <= cores:
        return ""
    return (f"{n_threads} threads asked on {cores} usable {'core' if cores == 1 else 'cores'}: the workers share "
            f"cores, which is usually slower; --threads {cores} uses each core once")


#: The verify_head option (ds4_engine.h's DS4_VERIFY_HEAD_*, in value order; spec dspark.md §3.4): a DSpark
#: verify's LM head for every row, or for the first VERIFY_HEAD_FIRST rows and the rest only when acceptance
#: reaches them (cpu backend).
VERIFY_HEADS = ("all", "lazy")
#: Rows of the LM head a lazy verify computes first (ds4_engine.h's DS4_VERIFY_HEAD_FIRST).
VERIFY_HEAD_FIRST = 3
#: Why the hip backend verifies every row (the note of verify_head there).
_HIP_VERIFY = ("the hip backend's verify computes the LM head of every row in one pass, and its greedy picks run on "
               "the device")


def auto_verify_head(backend: str, activations: str) -> tuple[str, str]:
    """What ``verify_head="auto"`` means on ``backend`` with the matmul ``activations`` in force (spec
    dspark.md §3.4), and the note that says it: lazy on the cpu with f32 activations, where the LM
    head's product is bound by its arithmetic (rows 3-5 cost 1.4 ms of a 5.1 ms verify of the demo
    pair on 2 threads, so rows that acceptance never reads are worth skipping: a lazy verify 14 %
    cheaper); all on the cpu with q8 activations, where it is bound by reading its weights (three
    rows cost nearly what six do, and the later rows' own product reads the weights again: a lazy
    verify about 5 % dearer; tools/cpu_notes.md 2026-12-03); all on the hip backend (its verify
    runs as one pass on the device) and on the reference backend (which does not draft)."""
    if backend == "cpu" and activations == "f32":
        return "lazy", (f"auto: lazy on the cpu backend with f32 activations (a DSpark verify computes the LM head of "
                        f"its first {VERIFY_HEAD_FIRST} rows, and of the others only when their drafts were all "
                        f"accepted; --verify-head all computes every row)")
    if backend == "cpu":
        return "all", ("auto: all on the cpu backend with q8 activations (their LM head costs its weight read: three "
                       "rows cost nearly what six do, and the later rows' own product would read the weights again; "
                       "--verify-head lazy computes the later rows only when acceptance reaches them)")
    if backend == "reference":
        return "all", "auto: all on the reference backend (it does not draft)"
    return "all", f"auto: all on the {backend} backend ({_HIP_VERIFY}; lazy runs on the cpu backend)"


#: The prefill_gemm numerics option (ds4_engine.h's DS4_PREFILL_GEMM_*, in value order; spec platform.md §7).
PREFILL_GEMMS = ("off", "bf16", "f16", "auto")
#: The gpu_graphs option (ds4_engine.h's DS4_GPU_GRAPHS_*, in value order; spec platform.md §8).
GPU_GRAPHS = ("off", "on")
#: Passes of at least this many tokens take the prefill GEMM (ds4_engine.h's DS4_PREFILL_GEMM_MIN_ROWS).
PREFILL_GEMM_MIN_ROWS = 32
#: Passes of at most this many rows replay from graphs under gpu_graphs on (ds4_engine.h's DS4_GRAPH_MAX_ROWS).
GRAPH_MAX_ROWS = 17
#: A session's default batch size, the prefill chunk, by backend (spec ds4.md §2.8): a GPU prefills
#: 2048 tokens per pass (each pass dequantises nearly every expert once, so longer chunks amortise
#: it; attention, indexer and LM-head scratch stay at 256-row tiles); the CPU keeps 256.
DEFAULT_BATCH = {"hip": memplan.GPU_DEFAULT_BATCH}
DEFAULT_BATCH_OTHER = memplan.DEFAULT_BATCH


def _native():
    try:
        from ds4tui import _native
    except ImportError as exc:
        raise NativeNotBuiltError(native_not_built()) from exc
    return _native


def require_native(backend: str) -> None:
    """:class:`NativeNotBuiltError` (its message says what to run) when ``backend`` runs in the native
    engine, as every backend but ``"reference"`` (numpy) does, and ``ds4tui._native`` does not import.
    The commands call it before slow work that opening the engine would only refuse after: unpacking
    the demo pair (99 MiB on first use), building the medium model, reading a model's metadata."""
    if backend != "reference":
        _native()


def native_not_built() -> str:
    """Why ``ds4tui._native`` does not import, with what to do, as one line.  When the ds4tui that
    Python imported is a source tree without the built library while another ds4tui on ``sys.path``
    (the installed one) has it (``python -m ds4tui`` run from a clone after a plain ``pip install .``:
    ``-m`` searches the current folder first), the line names both folders, since building is then
    not what is missing."""
    from importlib.machinery import EXTENSION_SUFFIXES

    import ds4tui

    def built(folder: Path) -> bool:
        return any((folder / f"_native{suffix}").is_file() for suffix in EXTENSION_SUFFIXES)

    here = Path(ds4tui.__file__).resolve().parent
    for entry in sys.path if not built(here) else ():  # a library that is there but fails to load: not this case
        other = Path(entry or os.curdir).resolve() / "ds4tui"
        if other != here and built(other):
            where = (" from the current folder, which `python -m` searches before the installed packages"
                     if here.parent == Path.cwd().resolve() else " first on sys.path")
            return (f"the native engine (ds4tui._native) is not built in {here}, the ds4tui that Python imported{where}; "
                    f"the ds4tui installed in {other.parent} has it: run the `ds4tui` command, or `python -m ds4tui` "
                    f"from another folder, or build this tree with `python build_native.py` (or `pip install -e .`)")
    return "the native engine (ds4tui._native) is not built: run `pip install -e .` or `python build_native.py`"


def _model(model: str | os.PathLike | DS4Model) -> DS4Model:
    return model if isinstance(model, DS4Model) else DS4Model(model)


class Engine:
    """A DS4 model opened on a backend.

    ``model``: GGUF path or opened :class:`DS4Model` (validated on open; the ``ModelFileError``
    subclasses name file, tensor, expected and found values).  ``backend``: ``"cpu"`` (native C),
    ``"hip"`` (the native engine with the dlopen'ed GPU library, :mod:`ds4tui.engine.gpu`: weights
    in device memory; :class:`BackendUnavailableError` says exactly why when it cannot run: no
    toolchain at build time, library failed to load, no device, wrong arch), ``"auto"`` (hip when
    it can run, else cpu; ``backend`` then says which and ``backend_note`` why, in plain words, with the
    whole reason in ``backend_detail``) or ``"reference"``
    (numpy).  ``progress(done, total)`` (hip) is called with bytes as weights are uploaded.
    ``numerics``: ``"ds4"`` or ``"transformers"`` (spec ds4.md §2.9).  ``n_threads`` 0 = one per
    usable core (the affinity mask, :func:`usable_cores`); more than the usable cores run as asked and ``threads_note`` says so.  ``gpu_layout`` (hip): the device layout of the weight matrices, ``"planar"`` (Q8_0,
    Q2_K and IQ2_XXS rows of a 16-byte multiple with their codes apart from their scales) or
    ``"ggml"`` (the file's rows everywhere; results differ only by float32 rounding order).
    ``gpu_library`` (hip, auto): the GPU backend library to load instead of the one the build made.
    ``activations``: ``"f32"`` (float32 activations for every weight type) or ``"q8"`` (8-bit
    activations for Q8_0, Q2_K and IQ2_XXS matrices, spec ds4.md §2.9.5: cpu and hip; the reference
    backend refuses it by name).  ``prefill_gemm`` (spec platform.md §7): forward passes of at least
    ``PREFILL_GEMM_MIN_ROWS`` tokens multiply the planar Q8_0 / Q2_K / IQ2_XXS matrices on the
    GPU's matrix units through the vendor's BLAS (cuBLAS / rocBLAS, loaded at run time) with
    activations and weights rounded to ``"bf16"`` or ``"f16"`` (float32 sums); ``"off"``: float32
    kernels everywhere; ``"auto"`` (default): bf16 when the BLAS loads, else off.  After open,
    ``prefill_gemm`` is the mode in force (``"off"``, ``"bf16"`` or ``"f16"``) and
    ``prefill_gemm_note`` says why (the library, or what was missing); bf16/f16 on the cpu or
    reference backend, or without the BLAS, raise :class:`BackendUnavailableError`.
    ``gpu_graphs`` (spec platform.md §8): ``"on"`` replays every pass of at most
    ``GRAPH_MAX_ROWS`` rows (decode steps, DSpark verify passes) on the hip backend from one graph
    per pass shape instead of launching its kernels one by one (the same kernels, so the same
    logits bit for bit); ``"off"`` (default): plain launches.  The properties ``gpu_graphs`` (the
    mode in force, ``"on"`` or ``"off"``) and ``gpu_graphs_note`` (why) are read live: a capture
    the runtime refuses turns it off for the engine with the reason; the cpu and reference
    backends launch no kernels, so it is off there.
    ``verify_head`` (spec dspark.md §3.4): which rows of a DSpark verify pass get the LM head:
    ``"all"`` (every row, in the pass), ``"lazy"`` (the first ``VERIFY_HEAD_FIRST`` rows, and the
    others in one product only when the drafts of those rows were all accepted, as acceptance never
    reads a later row: the same tokens, draws and logits bit for bit, a cheaper verify where the
    head's product is bound by its arithmetic; cpu backend only, :class:`BackendUnavailableError` on
    hip and reference) or ``"auto"`` (default: lazy on the cpu with f32 activations, all elsewhere,
    :func:`auto_verify_head`).  After open ``verify_head`` is the mode in force and ``verify_head_note``
    says why (a lazy that ``backend="auto"`` could not apply on hip runs all, and says so).
    ``amx`` (spec ds4.md §2.9.6): ``"on"`` repacks, at open, the Q8_0 matrices that products read whole
    (rows a multiple of 16, columns of 64; not the embedding) into the layout of Intel's AMX tiles and
    multiplies them there: the same logits bit for bit, a copy as large as the rows repacked
    (``memory().amx_copies``, bytes); cpu backend with q8 activations only
    (:class:`BackendUnavailableError` otherwise, :class:`OptionUnavailableError` on a CPU or kernel
    without AMX-INT8); ``"off"``: the other kernels; ``"auto"`` (default): on where the cpu backend
    multiplies q8 activations and :func:`amx_available`, else off.  After open ``amx`` is the mode in
    force and ``amx_note`` says why (:func:`auto_amx`).
    ``scheduler_prices`` (spec dspark.md §7.4, :mod:`ds4tui.engine.prices`): where a new session's
    DSpark scheduler starts: ``"fresh"`` (default: it measures what a verify costs and how often
    drafts are accepted by drafting once), ``"engine"`` (from what this engine's earlier sessions
    measured, merged when each closes) or ``"saved"`` (as engine, and kept between runs in a JSON
    file under ``prices_dir`` keyed by the model and support files and the options; a file that
    cannot be used is ignored and ``scheduler_prices_note`` says why).  ``scheduler_prices_file``
    is that file (None unless saved).
    The GGUF stays memory-mapped while the engine lives.  Nothing here reads the environment: the
    command line passes what its variables set (``ds4tui.commands.environment``).
    """

    def __init__(self, model: str | os.PathLike | DS4Model, *, backend: str = "cpu", numerics: str = "ds4",
                 n_threads: int = 0, support: str | os.PathLike | SupportModel | None = None,
                 progress: Callable[[int, int], None] | None = None, gpu_layout: str = "planar",
                 gpu_library: str | os.PathLike | None = None, activations: str = "f32",
                 prefill_gemm: str = "auto", gpu_graphs: str = "off", scheduler_prices: str = "fresh",
                 prices_dir: str | os.PathLike | None = None, draft_vocab: "str | int | Sequence[int]" = "auto",
                 verify_head: str = "auto", amx: str = "auto"):
        # the other work on the machine is measured from here, or from the command's start when that was
        # recent (prices.open_mark; loading the model is this process's own CPU time, left out): kept
        # verify times measured under another load are re-timed
        self._cpu_mark = prices.open_mark()
        self._other_work: float | None = None  # the cores other work kept busy, as last measured
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
        if gpu_layout not in GPU_LAYOUTS:
            raise ValueError(f"gpu_layout must be one of {', '.join(GPU_LAYOUTS)}, got {gpu_layout!r}")
        self.gpu_layout = gpu_layout
        if activations not in ACTIVATIONS and activations != "auto":
            raise ValueError(f"activations must be auto or one of {', '.join(ACTIVATIONS)}, got {activations!r}")
        if activations == "q8" and backend == "reference":
            raise BackendUnavailableError("8-bit activations (q8) run on the cpu and hip backends; the reference "
                                          "backend keeps float32 activations (use --activations f32, or --backend cpu)")
        #: the matmul activations in force (spec ds4.md §2.9.4-§2.9.5): "f32" or "q8"; ``auto`` resolves
        #: by the backend once it is known (q8 on the cpu, f32 elsewhere) and ``activations_note`` says so
        self.activations = "f32" if activations == "auto" else activations
        self.activations_note = f"{activations}: chosen"
        if prefill_gemm not in PREFILL_GEMMS:
            raise ValueError(f"prefill_gemm must be one of {', '.join(PREFILL_GEMMS)}, got {prefill_gemm!r}")
        if prefill_gemm in ("bf16", "f16") and backend in ("cpu", "reference"):
            raise BackendUnavailableError(f"prefill_gemm {prefill_gemm} runs on the GPU backend only; the {backend} "
                                          f"backend keeps float32 products (use --prefill-gemm off or auto, or "
                                          f"--backend hip)")
        self._prefill_gemm_wanted = prefill_gemm
        if gpu_graphs not in GPU_GRAPHS:
            raise ValueError(f"gpu_graphs must be one of {', '.join(GPU_GRAPHS)}, got {gpu_graphs!r}")
        self._gpu_graphs_wanted = gpu_graphs
        if verify_head not in VERIFY_HEADS and verify_head != "auto":
            raise ValueError(f"verify_head must be auto or one of {', '.join(VERIFY_HEADS)}, got {verify_head!r}")
        if verify_head == "lazy" and backend in ("hip", "reference"):
            raise BackendUnavailableError(f"verify_head lazy runs on the cpu backend only; "
                                          + (_HIP_VERIFY if backend == "hip" else "the reference backend does not draft")
                                          + " (use --verify-head auto or all, or --backend cpu)")
        #: the verify_head mode in force (spec dspark.md §3.4): "all" or "lazy"; ``auto`` resolves by the
        #: backend and the activations once they are known and ``verify_head_note`` says so
        self.verify_head = "all" if verify_head == "auto" else verify_head
        self.verify_head_note = f"{verify_head}: chosen"
        if amx not in AMX and amx != "auto":
            raise ValueError(f"amx must be auto or one of {', '.join(AMX)}, got {amx!r}")
        if amx == "on" and backend in ("hip", "reference"):
            raise BackendUnavailableError(f"amx on runs on the cpu backend only (the AMX tiles are a CPU's; "
                                          f"use --amx auto or off, or --backend cpu)")
        if amx == "on" and activations == "f32":
            raise BackendUnavailableError("amx on multiplies 8-bit activations: it needs --activations q8 (or auto "
                                          "on the cpu backend); use --amx off with f32")
        #: the amx option in force (spec ds4.md §2.9.6): "on" or "off"; ``auto`` resolves by the backend,
        #: the activations and the CPU once they are known and ``amx_note`` says so
        self.amx = "off" if amx == "auto" else amx
        self.amx_note = f"{amx}: chosen"
        if scheduler_prices not in prices.MODES:
            raise ValueError(f"scheduler_prices must be one of {', '.join(prices.MODES)}, got {scheduler_prices!r}")
        if scheduler_prices == "saved" and prices_dir is None:
            raise ValueError("scheduler_prices 'saved' needs prices_dir, the folder of the saved prices")
        self._draft_vocab_wanted = check_draft_vocab(draft_vocab)
        #: tokens the drafter proposes from (spec dspark.md §2.6): 0 = the whole vocabulary (no support
        #: model, ``full``, or a support file without a list under ``auto``)
        self.draft_vocab = 0
        self.draft_vocab_note = "full: no support model drafts"
        #: why the support file's draft vocabulary could not be used ("": none, or it could)
        self.draft_vocab_problem = ""
        self.scheduler_prices = scheduler_prices
        self.scheduler_prices_note = "fresh: every session measures its own prices"
        self.scheduler_prices_file: Path | None = None
        #: the saved prices file could not be used or written ("": no problem); the note says the rest
        self.scheduler_prices_problem = ""
        self._unusable_at_open = False  # the saved file could not be used when the engine opened
        self._prices_dir = prices_dir
        self._prices: prices.SchedulerPrices | None = None
        self._prices_from = "fresh"
        self._prices_lock = threading.Lock()
        self.prefill_gemm = "off"
        if not isinstance(n_threads, (int, np.integer)) or isinstance(n_threads, bool) or not 0 <= n_threads <= MAX_THREADS:
            raise ValueError(f"n_threads must be an integer 0..{MAX_THREADS} (0 = one per core), got {n_threads!r}")
        self.backend_note = ""
        #: why ``auto`` could not run the GPU, in full (the backend's build, the runtime's words); ""
        #: when it did, or when the backend was not auto
        self.backend_detail = ""
        self.threads_note = ""  # the native engine sets it once its thread count is known
        self.gpu_info = None
        self._gpu_library: str | None = None
        if backend != "reference":  # the cpu and the GPU backends both run in the native engine: a missing
            _native()  # one is said as `ds4tui doctor` says it, before the GPU is looked at
        if backend in ("hip", "auto"):
            from ds4tui.engine import gpu

            info, why = gpu.probe(gpu_library)
            refused = None
            if not why:  # the memory plan and, on AMD, a first device pass in a child: before any upload
                model = _model(model)
                refused = gpu.admit(model, support, info, self._draft_vocab_extra(model, support))
                if refused is not None and backend == "hip":
                    raise refused
                why = str(refused or "")
            if why:  # the backend named by its build, as `ds4tui doctor` names it (CUDA or ROCm)
                if backend == "hip":
                    raise BackendUnavailableError(gpu.unavailable(info, why, gpu_library))
                # plain words first; the whole reason, as --backend hip would give it, kept beside them
                self.backend_note = f"no usable GPU ({gpu.plain_reason(info, gpu_library, refused)}): running on the CPU"
                self.backend_detail = gpu.unavailable(info, why, gpu_library)
                backend = "cpu"
            else:
                self.gpu_info = info
                self._gpu_library = info.library
                self.backend_note = (f"hip: {info.device_name} ({info.device_arch}) through {info.library}"
                                     + (" (chosen by auto)" if backend == "auto" else ""))
                backend = "hip"
        self.model = _model(model)
        self.config: DS4Config = self.model.config
        self.backend = backend
        if activations == "auto":
            self.activations, self.activations_note = auto_activations(backend)
        if amx == "auto":
            copies, files = (self._amx_copies_and_files(support)
                             if backend == "cpu" and self.activations == "q8" and amx_available()[0] else (None, 0))
            self.amx, self.amx_note = auto_amx(backend, self.activations, copies=copies, files=files,
                                               total=memory_total())
        elif amx == "on" and backend != "cpu":  # --backend auto chose the GPU: said, not refused
            self.amx, self.amx_note = "off", "off: amx on runs on the cpu backend only, and the GPU was chosen"
        elif amx == "on":  # f32 was refused above, and auto is q8 on the cpu
            ok, why = amx_available()
            if not ok:
                raise OptionUnavailableError(f"--amx on: {why} (use --amx auto or off; `ds4tui doctor` says whether "
                                             f"this CPU has AMX)")
        if verify_head == "auto":
            self.verify_head, self.verify_head_note = auto_verify_head(backend, self.activations)
        elif verify_head == "lazy" and backend != "cpu":  # --backend auto chose the GPU: said, not refused
            self.verify_head = "all"
            self.verify_head_note = f"all: lazy runs on the cpu backend only, and {_HIP_VERIFY}"
        self.prefill_gemm_note = f"off: the {backend} backend keeps float32 products"
        self.numerics = numerics
        self._handle = None
        self._closed = False
        self._keep: list = []
        self._sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()
        self.support: SupportModel | None = None
        self.support_status = "none"
        self.support_message = ""
        if support is not None and backend == "reference":
            raise BackendUnavailableError("DSpark drafting needs --backend cpu (or hip); the reference "
                                          "backend decodes target-only")
        if backend == "reference":
            from ds4tui.engine.reference import ReferenceModel

            self._ref = ReferenceModel(self.model, numerics=numerics)
            self.n_threads = 1
            return
        n = _native()
        self._ffi, self._lib = n.ffi, n.lib
        # 0 = one per core this process may run on (its affinity mask: taskset, a container's cpuset),
        # counted here and given to the engine as a number (the engine's own 0 counts online cores)
        self._open_native(int(n_threads) or min(usable_cores(), MAX_THREADS), progress)
        if support is not None:
            self._attach_support(support)
        self._open_prices()

    def _amx_copies_and_files(self, support) -> tuple[int, int]:
        """What the amx option's copies of the model and ``support`` (a path or SupportModel, or None) would
        take (:func:`amx_copy_bytes`), and the bytes of their files (a synthetic model, in memory: its
        tensors'), for :func:`auto_amx`."""
        copies = amx_copy_bytes(self.model.tensors)
        path = str(self.model.path)
        files = (os.path.getsize(path) if os.path.isfile(path)
                 else sum(int(t.nbytes) for t in self.model.tensors.values()))
        support_path = support.path if isinstance(support, SupportModel) else support
        if support_path is not None and os.path.isfile(support_path):
            from ds4tui.engine.gguf_model import open_gguf, tensor_table

            copies += amx_copy_bytes(tensor_table(open_gguf(support_path)))
            files += os.path.getsize(support_path)
        return copies, files

    # -- native descriptor ---------------------------------------------------------------------
    def _open_native(self, n_threads: int, progress: Callable[[int, int], None] | None = None) -> None:
        ffi, lib, c = self._ffi, self._lib, self.config
        keep = self._keep
        cfg = ffi.new("ds4_model_config *")
        for name, ctype in ffi.typeof("ds4_model_config").fields:  # every scalar field, by name, from DS4Config
            if ctype.type.kind == "primitive" and hasattr(c, name):
                setattr(cfg, name, float(getattr(c, name)) if ctype.type.cname == "float" else int(getattr(c, name)))
        if c.rope_scaling_type not in ("yarn", "none"):
            raise EngineError(f"{self.model.path}: rope.scaling.type '{c.rope_scaling_type}' is not supported "
                              f"(expected 'yarn')")
        cfg.rope_yarn = int(c.rope_scaling_type == "yarn")
        ratios = ffi.new("int32_t[]", list(c.compress_ratios[: c.n_layer]))
        clamp = ffi.new("float[]", list(c.swiglu_clamp[: c.n_layer]))
        clamp_sh = ffi.new("float[]", list((c.swiglu_clamp_shexp or c.swiglu_clamp)[: c.n_layer]))
        cfg.compress_ratios, cfg.swiglu_clamp, cfg.swiglu_clamp_shexp = ratios, clamp, clamp_sh
        infos = list(self.model.tensors.values())
        table = self._table(self.model.tensors)
        opt = ffi.new("ds4_engine_options *", {"backend": 1 if self.backend == "hip" else 0, "n_threads": n_threads,
                                               "numerics": NUMERICS.index(self.numerics),
                                               "gpu_layout": GPU_LAYOUTS.index(self.gpu_layout),
                                               "activations": ACTIVATIONS.index(self.activations),
                                               "prefill_gemm": PREFILL_GEMMS.index(self._prefill_gemm_wanted
                                                                                   if self.backend == "hip" else "off"),
                                               "gpu_graphs": GPU_GRAPHS.index(self._gpu_graphs_wanted),
                                               "verify_head": VERIFY_HEADS.index(self.verify_head),
                                               "amx": AMX.index(self.amx)})
        if self.backend == "hip":
            libpath = ffi.new("char[]", self._gpu_library.encode())
            keep.append(libpath)
            opt.gpu_library = libpath
            if progress is not None:
                cb = ffi.callback("void(void *, uint64_t, uint64_t)",
                                  lambda _ctx, done, total: progress(int(done), int(total)))
                keep.append(cb)
                opt.progress = cb
        out = ffi.new("ds4_engine **")
        err = ffi.new("char[1024]")
        keep += [cfg, ratios, clamp, clamp_sh]
        rc = lib.ds4_engine_open(cfg, table, len(infos), opt, out, err, 1024)
        if rc != 0:
            msg = f"{self.model.path}: {ffi.string(err).decode('utf-8', 'replace')}"
            raise (BackendUnavailableError if rc == -9 else EngineError)(msg)
        self._handle = out[0]
        self.n_threads = int(lib.ds4_engine_n_threads(self._handle))
        #: "" unless the worker threads outnumber the usable cores (:func:`threads_note` says so)
        self.threads_note = threads_note(self.n_threads)
        if self.backend == "hip":
            note = ffi.new("char[512]")
            self.prefill_gemm = PREFILL_GEMMS[int(lib.ds4_engine_prefill_gemm(self._handle, note, 512))]
            self.prefill_gemm_note = ffi.string(note).decode("utf-8", "replace")

    @property
    def gpu_graphs(self) -> str:
        """The gpu_graphs mode in force, ``"on"`` or ``"off"`` (spec platform.md §8; live: a
        refused capture turns it off)."""
        return self._gpu_graphs()[0]

    @property
    def gpu_graphs_note(self) -> str:
        """What the gpu_graphs mode does here, or why it is off."""
        return self._gpu_graphs()[1]

    def set_gpu_graphs(self, mode: str) -> None:
        """Switch the gpu_graphs option between passes (``"off"`` or ``"on"``; spec platform.md §8),
        e.g. for a side-by-side timing on one engine; graphs already captured are kept.
        ``ValueError`` for another mode, :class:`BackendUnavailableError` for ``"on"`` on the cpu
        or reference backend."""
        if mode not in GPU_GRAPHS:
            raise ValueError(f"gpu_graphs must be one of {', '.join(GPU_GRAPHS)}, got {mode!r}")
        if self.backend != "hip":
            if mode == "on":
                raise BackendUnavailableError(f"gpu_graphs on: the {self.backend} backend launches no kernels")
            return
        self._check_open()
        err = self._ffi.new("char[512]")
        if self._lib.ds4_engine_set_gpu_graphs(self._handle, GPU_GRAPHS.index(mode), err, 512) != 0:
            raise EngineError(self._ffi.string(err).decode("utf-8", "replace"))

    def _gpu_graphs(self) -> tuple[str, str]:
        if self.backend != "hip" or self._handle is None or self._closed:
            return "off", f"off: the {self.backend} backend launches no kernels"
        ffi, lib = self._ffi, self._lib
        note = ffi.new("char[768]")
        mode = GPU_GRAPHS[int(lib.ds4_engine_gpu_graphs(self._handle, note, 768))]
        return mode, ffi.string(note).decode("utf-8", "replace")

    def _table(self, tensors: dict):
        """A ds4_tensor_desc[] over ``tensors`` (name → TensorInfo; data stays in the mapping)."""
        ffi = self._ffi
        infos = list(tensors.items())
        table = ffi.new("ds4_tensor_desc[]", len(infos))
        for i, (tname, info) in enumerate(infos):
            name = ffi.new("char[]", tname.encode())
            buf = ffi.from_buffer(info.raw_bytes())
            self._keep += [name, buf]
            d = table[i]
            d.name, d.type, d.n_dims = name, int(info.type), len(info.shape)
            for j, ne in enumerate(info.ne[:4]):
                d.ne[j] = ne
            for j in range(len(info.shape), 4):
                d.ne[j] = 1
            d.data, d.nbytes = buf, info.nbytes
        self._keep.append(table)
        return table

    def _attach_support(self, support) -> None:
        """Validate and attach a DSpark support GGUF (spec dspark.md §4, §12).  A file that fails
        validation is refused: the engine keeps running target-only, ``support_status`` is
        ``"refused"``, ``support_message`` says why and every cycle counts as ``support_invalid``.
        An unreadable file (not a GGUF, truncated) raises its ``ModelFileError``."""
        ffi, lib = self._ffi, self._lib
        sm = support if isinstance(support, SupportModel) else SupportModel(support, self.config)
        self.support = sm
        if not sm.compatible:
            # a shape mismatch against the target says most (e.g. "support has 8 experts ..., target ... 16")
            first = next((p for p in sm.problems if p.kind == "mismatch"), sm.problems[0]).message
            more = len(sm.problems) - 1
            why = (f"{sm.path}: support model refused for drafting ({sm.summary_line()}): {first}"
                   + (f" (and {more} more problem{'s' if more > 1 else ''}: `ds4tui inspect {self.model.path} "
                      f"--mtp {sm.path}` lists them)" if more else ""))
            lib.ds4_engine_refuse_support(self._handle, why.encode()[:1000])
            self.support_status, self.support_message = "refused", why
            return
        m = sm.meta
        vocab, self.draft_vocab_note = resolve_draft_vocab(self._draft_vocab_wanted, sm, self.config.n_vocab)
        listed = sm.summary()["draft_vocab"]
        if listed is not None and listed["problem"]:  # auto fell back to the whole vocabulary: said, not silent
            self.draft_vocab_problem = (f"{sm.path}: its draft vocabulary ({listed['key']}) cannot be used: "
                                        f"{listed['problem']}; drafting from the whole vocabulary")
        ids = ffi.new("int32_t[]", list(m.target_layer_ids))
        vd = ffi.new("int32_t[]", vocab) if vocab else ffi.NULL
        cfg = ffi.new("ds4_support_config *", {"n_stages": m.n_stages, "block_size": m.block_size,
                                               "markov_rank": m.markov_rank, "noise_token": m.noise_token_id,
                                               "n_capture": len(m.target_layer_ids), "capture_layers": ids,
                                               "n_draft_vocab": len(vocab), "draft_vocab": vd})
        self._keep += [ids, cfg, vd]
        table = self._table(sm.tensors)
        err = ffi.new("char[1024]")
        rc = lib.ds4_engine_attach_support(self._handle, cfg, table, len(sm.tensors), err, 1024)
        if rc != 0:
            self.support_status = "refused"
            self.support_message = f"{sm.path}: support model refused for drafting: " + ffi.string(err).decode(
                "utf-8", "replace")
            lib.ds4_engine_refuse_support(self._handle, self.support_message.encode()[:1000])
            return
        self.support_status = "attached"
        self.support_message = f"{sm.path}: {sm.summary_line()}"
        self.draft_vocab = len(vocab)

    def _draft_vocab_extra(self, model: DS4Model, support) -> int:
        """Bytes of draft-vocabulary row copies the hip backend would hold (spec dspark.md §2.6,
        :func:`memplan.draft_vocab_bytes`), for the fit check before anything is uploaded.  0 without a support model, for the whole
        vocabulary, or when the support model or the choice is refused (the attach says why)."""
        if support is None or self._draft_vocab_wanted == "full":
            return 0
        try:
            sm = support if isinstance(support, SupportModel) else SupportModel(support, model.config,
                                                                               check_finite=False)
            if not sm.compatible:
                return 0
            vocab, _ = resolve_draft_vocab(self._draft_vocab_wanted, sm, model.config.n_vocab)
        except (DraftVocabError, ModelFileError, OSError, ValueError):
            return 0
        return memplan.draft_vocab_bytes(model, sm, len(vocab))

    def _open_prices(self) -> None:
        """Where new sessions' schedulers start (``scheduler_prices``, spec dspark.md §7.4): with
        ``saved``, read the file of this engine's :func:`~ds4tui.engine.prices.identity`; a file that
        cannot be used is ignored (fresh) and ``scheduler_prices_note`` says why."""
        mode = self.scheduler_prices
        if mode == "fresh":
            return
        if self.support_status != "attached":
            self.scheduler_prices_note = f"{mode}: no support model drafts, nothing to price"
            return
        if mode == "engine":
            self.scheduler_prices_note = "engine: a new session starts from the prices of this engine's earlier ones"
            return
        ident = prices.identity(self)
        path = prices.file_for(self._prices_dir, ident)
        self.scheduler_prices_file, self._prices_ident = path, ident
        try:
            kept = prices.load(path, ident)
        except SchedulerPricesError as exc:
            # a folder in the file's place or a folder that cannot be used stops the write too: said
            # now with its remedy; anything else is known only when a session closes and tries
            self.scheduler_prices_problem = f"{exc}; ignored: the scheduler starts fresh. {prices.read_advice(path)}"
            self.scheduler_prices_note = f"saved: {self.scheduler_prices_problem}"
            self._unusable_at_open = True
            return
        if kept is None or not kept.learnt:
            self.scheduler_prices_note = (f"saved: no prices yet in {path} (a session that closes writes them, "
                                          f"if it can)")
            return
        self._prices, self._prices_from = kept, "saved"
        retime = prices.retime_reason(kept, time.time(), self._measure_other_work())
        self.scheduler_prices_note = f"saved: from {path} ({kept.summary()})" + (f"; {retime}" if retime else "")

    def _measure_other_work(self) -> float | None:
        """The cores other processes kept busy since the engine began to open or its last session
        closed (:func:`~ds4tui.engine.prices.other_work`), or as last measured when that was too short
        a time to tell; None when never measured."""
        other = prices.other_work(self._cpu_mark, prices.cpu_mark())
        if other is not None:
            self._other_work = other
        return self._other_work

    def _keep_prices(self, start: "prices.SchedulerPrices | None", end: "prices.SchedulerPrices | None",
                     other: float | None = None, left_out: tuple = ((), False), life: float | None = None,
                     mark: tuple | None = None) -> None:
        """A session that began from ``start`` ended with ``end``: merge into the engine's prices
        and, with ``saved``, write the file; ``scheduler_prices_note`` then says where they stand (the
        file written, or with ``engine`` the prices kept in memory), and a write that fails is said in
        words in ``scheduler_prices_problem`` and the note (:func:`~ds4tui.engine.prices.write_problem`);
        a write that succeeds clears the problem (a file that could not be used at open is then replaced,
        and the note says so); ``other``: the other work the session saw at its start; ``life``: the
        other work over its life, when that could be told: kept with the times it measured in place of
        ``other``, and the engine's last measurement from now on (a session that follows at once
        compares the kept times with it); ``left_out``: the stale kept times left out of its start
        (``SchedulerPrices.merged``); ``mark``: the :func:`~ds4tui.engine.prices.cpu_mark` taken as
        the session closed (None: take one).  ``fresh`` keeps nothing."""
        self._cpu_mark = prices.cpu_mark() if mark is None else mark  # the next session measures from here
        if life is not None:
            self._other_work = other = life
        if end is None or not end.learnt or self.scheduler_prices == "fresh":
            return
        with self._prices_lock:
            self._prices = (self._prices or prices.SchedulerPrices()).merged(start, end, other=other,
                                                                             left_out=left_out)
            self._prices_from = "engine"
            if self.scheduler_prices == "engine":  # where the sessions left them, in memory only
                self.scheduler_prices_note = (f"engine: the sessions so far left {self._prices.summary()} for the "
                                              f"later ones (kept in memory, no file written)")
                return
            try:
                prices.save(self.scheduler_prices_file, self._prices_ident, self._prices)
            except OSError as exc:
                self.scheduler_prices_problem = prices.write_problem(self.scheduler_prices_file, exc)
                self.scheduler_prices_note = f"saved: {self.scheduler_prices_problem}"
            else:
                self.scheduler_prices_problem = ""
                self.scheduler_prices_note = (f"saved: in {self.scheduler_prices_file} ({self._prices.summary()})"
                                              + ("; it replaced the file that could not be used at the start"
                                                 if self._unusable_at_open else ""))

    @property
    def kept_prices(self) -> "prices.SchedulerPrices | None":
        """The prices a new session starts from (None: fresh), with their counts as carried over."""
        with self._prices_lock:
            kept = self._prices
        return kept.capped() if kept is not None and self.scheduler_prices != "fresh" else None

    @property
    def block_size(self) -> int:
        """The drafter's block size (0 without an attached support model)."""
        return int(self.support.meta.block_size) if self.support_status == "attached" else 0

    # -- public --------------------------------------------------------------------------------
    def session(self, n_ctx: int = 4096, *, n_batch: int | None = None, scheduler: bool = True, max_draft: int = 0,
                policy: str = DEFAULT_SCHEDULER_POLICY, print_stats: bool = False) -> "Session":
        """A new session with room for ``n_ctx`` tokens (capped at the model's context length)
        and forward passes of at most ``n_batch`` tokens (prefill chunk size; default
        :data:`DEFAULT_BATCH` for the backend: 2048 on a GPU, 256 otherwise, at most ``n_ctx``;
        spec ds4.md §2.8).

        With a support model attached, ``scheduler``, ``max_draft`` (0: the block size) and
        ``policy`` (the scheduler's, one of :data:`~ds4tui.engine.backend.SCHEDULER_POLICIES`, spec
        dspark.md §7.6) are the DSpark knobs the session starts with (in force from the first cycle,
        not logged as a change; ds4's ``DS4_DSPARK_SCHEDULER`` and ``DS4_DSPARK_MAX_DRAFT_TOKENS``);
        ``ValueError`` for a ``max_draft`` above the block size or another policy.  ``print_stats``: when the session closes after
        any DSpark activity, print ds4's stats line to stderr (ds4's ``DS4_DSPARK_STATS``)."""
        self._check_open()
        default_batch = n_batch is None
        if default_batch:
            n_batch = DEFAULT_BATCH.get(self.backend, DEFAULT_BATCH_OTHER)
        for name, v in (("context size", n_ctx), ("batch size", n_batch)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 1 <= v <= 2**31 - 1:
                raise ValueError(f"{name} must be an integer 1 .. 2^31-1, got {v!r}")
        if n_ctx > self.config.context_length:
            raise ValueError(f"context size {n_ctx} exceeds the model's context length {self.config.context_length}")
        if not isinstance(scheduler, (bool, np.bool_)):
            raise ValueError(f"scheduler must be True or False, got {scheduler!r}")
        check_policy(policy)
        if isinstance(max_draft, (bool, np.bool_)) or not isinstance(max_draft, (int, np.integer)) or max_draft < 0:
            raise ValueError(f"max draft length must be an integer >= 0 (0: the block size), got {max_draft!r}")
        if self.support_status == "attached" and max_draft > self.block_size:
            raise ValueError(f"max draft length {max_draft} exceeds the support model's block size {self.block_size} "
                             f"(use 1..{self.block_size}, or 0 for the block size)")
        n_ctx, n_batch = int(n_ctx), int(n_batch)
        if default_batch:
            n_batch = min(n_batch, n_ctx)
        if self.backend == "reference":
            backend: SessionBackend = ReferenceBackend(self._ref, n_ctx, self.memory().weights)
        else:
            knobs = None
            if self.support_status == "attached":
                knobs = DSparkKnobs(enabled=True, scheduler=bool(scheduler), threshold=0.0, max_draft=int(max_draft),
                                    policy=policy)
            backend = NativeBackend(self._ffi, self._lib, self._handle, n_ctx, n_batch, self.config.n_vocab, knobs)
        s = Session(self, n_ctx, n_batch, backend, print_stats=bool(print_stats),
                    prices_start=self._start_prices(backend))
        self._sessions.add(s)
        return s

    def _start_prices(self, backend: SessionBackend) -> tuple:
        """Start ``backend``'s scheduler from the prices the engine keeps now (spec dspark.md §7.4),
        leaving out the stale times; returns (the prices it started from or None, where they came from:
        "fresh", "saved" or "engine", why times were left out or "", the other work measured, the kept
        prices before any were left out or None: what a left-out time is measured against)."""
        if self.scheduler_prices == "fresh" or self.support_status != "attached":
            return None, "fresh", "", None, None
        other = self._measure_other_work()
        with self._prices_lock:
            kept, source = self._prices, self._prices_from
        if kept is None or not kept.learnt:
            return None, "fresh", "", other, None
        whole, now = kept.capped(), time.time()
        retime = prices.retime_reason(whole, now, other)
        start = whole.without_stale(now, other) if retime else whole
        backend.set_prices(start, kept=True)
        return start, source, retime, other, whole

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"{self.model.path}: the engine is closed")

    def memory(self) -> Memory:
        """Engine-level bytes (weights and small tensors expanded at open)."""
        self._check_open()
        if self.backend == "reference":
            return Memory(weights=sum(t.nbytes for t in self.model.tensors.values()))
        m = self._ffi.new("ds4_memory *")
        self._lib.ds4_engine_memory(self._handle, m)
        return Memory(m.weights, m.kv, m.compressor, m.scratch, m.device, m.amx)

    def close(self) -> None:
        """Free the engine and every session made from it (their calls then raise EngineError)."""
        if self._closed:
            return
        for s in list(self._sessions):
            s.close()
        if self._handle is not None:
            self._lib.ds4_engine_close(self._handle)
            self._handle = None
        self._closed = True

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


@dataclass
class _TakenBack:
    """What :meth:`Session.rewind` took back from the engine's counters, which only grow: emitted
    tokens, accepted drafts, the moves of their cycles between ``accepted_len_hist`` bins and
    out of ``pos_accepted`` rows (bin/row → change), and how many cycles lost drafts (``cut``,
    reported as ``stop_cut``)."""

    tokens: int = 0
    drafts: int = 0
    cut: int = 0
    hist: dict[int, int] = field(default_factory=dict)
    pos: dict[int, int] = field(default_factory=dict)

    def apply(self, st: DSparkStats) -> DSparkStats:
        """``st`` as the session's user sees it: without the drafts taken back."""
        if not self.drafts:
            return st

        def moved(counts: tuple[int, ...], change: dict[int, int]) -> tuple[int, ...]:
            out = list(counts) + [0] * (max(change, default=-1) + 1 - len(counts))
            for i, d in change.items():
                out[i] += d
            return tuple(out)

        price = self.drafts * st.t_decode_ms if st.t_decode_measured else 0.0
        return replace(st, accepted_draft=st.accepted_draft - self.drafts, stop_cut=st.stop_cut + self.cut,
                       accepted_len_hist=moved(st.accepted_len_hist, self.hist),
                       pos_accepted=moved(st.pos_accepted, self.pos),
                       saved=st.saved - price, net_saved=st.net_saved - price)


class Session:
    """One sequence on an :class:`Engine` (see the module docstring for the decode layout).

    ``tokens``: ids in the KV cache, in order; ``pending``: the emitted token not yet run (or None).
    The session keeps these, the locks and the checks; ``backend`` (a
    :class:`~ds4tui.engine.backend.SessionBackend`: the C engine's session, or the numpy reference)
    does the backend's part of each call.
    Thread use: calls that change the session (prefill, step, truncate, sampling) are serialised by
    a lock, so a second thread waits rather than corrupting the state; :meth:`cancel` may be called
    from any thread at any time.  After the engine is closed every call raises :class:`EngineError`.
    """

    def __init__(self, engine: Engine, n_ctx: int, n_batch: int, backend: SessionBackend, *,
                 print_stats: bool = False, prices_start: tuple = (None, "fresh", "", None, None)):
        self.engine = engine
        #: the other work while the session runs is measured from here to its close: its times were
        #: taken under that load (spec dspark.md §7.4)
        self._life_mark = prices.cpu_mark()
        self._take_prices_start(prices_start)
        self.print_stats = print_stats
        self.config = engine.config
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.backend = backend
        self.tokens: list[int] = []
        self.pending: int | None = None
        self._cancel = threading.Event()
        self._lock = threading.RLock()
        self._knob_lock = threading.Lock()  # knobs change while a step holds _lock (C has its own mutex)
        self._closed = False
        self._sampling = SamplingParams()
        self.last_accepted = 0
        # [accepted drafts, tokens still emitted, cut by a rewind] of the cycles since the last prefill or truncate
        # (enough of them to cover a rewind), and what rewinds took back from the counters
        self._cycles: list[list[int]] = []
        self._taken = _TakenBack()

    def _alive(self) -> None:
        if self._closed:
            raise EngineError("the session's engine is closed")

    # -- checks --------------------------------------------------------------------------------
    def _ids(self, ids: Iterable[int]) -> list[int]:
        if isinstance(ids, (str, bytes)):
            raise TypeError("token ids must be a sequence of integers, not a string")
        out = []
        V = self.config.n_vocab
        for i, t in enumerate(ids):
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                raise TypeError(f"token ids must be integers, got {t!r} at index {i}")
            if not 0 <= int(t) < V:
                raise TokenRangeError(f"token id {int(t)} at index {i} is outside the vocabulary 0..{V - 1}")
            out.append(int(t))
        return out

    def _room(self, n_new: int) -> None:
        have = len(self.tokens) + (self.pending is not None)
        if have + n_new > self.n_ctx:
            raise ContextOverflowError(f"context overflow: {have} tokens in the session + {n_new} new > context size "
                                       f"{self.n_ctx} (start a new chat or raise --ctx)")

    # -- public --------------------------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        """Tokens in the KV cache (the pending token not counted)."""
        return len(self.tokens)

    def prefill(self, ids: Sequence[int], *, chunk: int | None = None, logits: str = "last",
                progress: Callable[[int, int], None] | None = None) -> np.ndarray | None:
        """Run ``ids`` (after the pending token, if any) in chunks of ``chunk`` (default and
        maximum: the batch size) and return logits: ``"last"`` → ``[V]`` of the last token,
        ``"all"`` → ``[len(ids), V]``, ``"none"`` → None.

        ``progress(done, total)`` is called after each chunk.  :meth:`cancel` (from any thread)
        stops between chunks or inside one (at a layer boundary) with :class:`CancelledError`:
        the session then goes back to where it was before this call when that is at most one
        batch back, else it is emptied (``kept`` says how many tokens remain).  Raises
        :class:`ContextOverflowError` / :class:`TokenRangeError` / ``TypeError`` before
        anything runs; an empty ``ids`` with no pending token raises ``ValueError``.
        """
        with self._lock:
            return self._prefill(ids, chunk, logits, progress)

    def _prefill(self, ids, chunk, logits, progress):
        ids = self._ids(ids)
        if logits not in ("last", "all", "none"):
            raise ValueError(f"logits must be 'last', 'all' or 'none', got {logits!r}")
        if chunk is not None and (isinstance(chunk, bool) or int(chunk) != chunk or chunk < 1):
            raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
        chunk = min(int(chunk or self.n_batch), self.n_batch)
        if not ids and self.pending is None:
            raise ValueError("empty prompt: nothing to prefill")
        self._room(len(ids))
        self._alive()
        self._cycles.clear()  # the pending token runs now: a rewind cannot take it back any more
        start = len(self.tokens)
        had_pending = self.pending is not None
        parts = [ids[i:i + chunk] for i in range(0, len(ids), chunk)] or [[]]
        rows: list[np.ndarray] = []
        done = 0
        try:
            for k, part in enumerate(parts):
                if self._cancel.is_set():
                    raise CancelledError("cancelled")
                last = k == len(parts) - 1
                if logits == "all":
                    mode = "all" if part else "none"
                else:
                    mode = "last" if (last and logits == "last") else "none"
                r = self.backend.eval(part, mode, self.pending)  # the pending token runs first
                if self.pending is not None:
                    self.tokens.append(self.pending)
                    self.pending = None
                self.tokens.extend(part)
                done += len(part)
                if r is not None:
                    rows.append(r)
                if progress is not None:
                    progress(done, len(ids))
        except CancelledError:
            self.clear_cancel()  # consumed (the C engine clears its flag when it stops a pass)
            self._rollback(start + (1 if had_pending and len(self.tokens) > start else 0))
            raise CancelledError("prefill cancelled", kept=len(self.tokens)) from None
        if logits == "last":
            return rows[-1][-1]
        if logits == "all":
            return np.concatenate(rows) if rows else np.zeros((0, self.config.n_vocab), np.float32)
        return None

    def _rollback(self, start: int) -> None:
        """After a cancel: back to ``start`` tokens (or empty when that is more than a batch back)."""
        back = len(self.tokens) - start
        if back <= 0:
            return  # the engine already left the cache as it was
        target = start if back <= self.n_batch else 0
        self.backend.truncate(target)
        del self.tokens[target:]
        self.pending = None

    def step(self, max_out: int = STEP_MAX) -> list[int]:
        """One decode cycle; returns the emitted ids (the last one is the new pending token).

        Without DSpark: run the pending token, sample the next, return ``[next]``.  With DSpark
        (a support model attached and enabled; spec dspark.md §2.5): the pending token is the
        anchor, the drafter proposes, one target pass verifies ``[anchor, drafts]`` and the step
        returns the accepted drafts followed by the next sampled token, so ``len(result) - 1``
        tokens came from accepted drafts.  ``max_out`` (1..64) is the caller's remaining budget:
        drafts are clipped so that at most ``max_out`` ids come back.

        Raises :class:`StateError` before any prompt, :class:`ContextOverflowError` when the
        pending token does not fit, :class:`CancelledError` if cancelled (the session is unchanged).
        """
        if isinstance(max_out, bool) or int(max_out) != max_out or not 1 <= max_out <= STEP_MAX:
            raise ValueError(f"max_out must be an integer 1..{STEP_MAX}, got {max_out!r}")
        with self._lock:
            self._ready_to_step()
            try:
                out = self.backend.step(int(max_out), self.pending)
            except CancelledError:
                self.clear_cancel()  # consumed
                raise
            self._record(out)
            return out

    def _ready_to_step(self) -> None:
        """Raise unless a cycle can run: the session is open and the pending token has a position."""
        self._alive()
        if self.pending is not None and len(self.tokens) + 1 > self.n_ctx:
            raise ContextOverflowError(f"context full: all positions of the context size {self.n_ctx} hold "
                                       f"tokens, so the next token cannot be run (start a new chat or raise --ctx)")

    def _record(self, out: list[int]) -> None:
        """Book one cycle's emitted ids (the last one the new pending token)."""
        if self.pending is not None:
            self.tokens.append(self.pending)
        self.tokens.extend(out[:-1])
        self.pending = out[-1]
        self.last_accepted = len(out) - 1
        self._cycles.append([len(out) - 1, len(out), 0])  # accepted drafts, emitted ids, cut by a rewind
        while len(self._cycles) > STEP_MAX:  # a rewind takes back at most STEP_MAX tokens
            self._cycles.pop(0)

    def step_many(self, max_out: int, *, max_cycles: int = STEP_MAX, budget_s: float = 0.0,
                  stop: Iterable[int] = ()) -> tuple[list[list[int]], EngineError | KeyboardInterrupt | None]:
        """Decode cycles back to back, each exactly a :meth:`step` with the budget left, in as few
        engine calls as the backend allows (one for the native engine: the interpreter is not
        needed between cycles; spec ux.md §2.4).

        Stops after a cycle when ``max_cycles`` cycles ran, ``max_out`` ids (at most 256) were
        emitted, the cycle emitted an id of ``stop``, ``budget_s`` seconds have passed (0: no time
        limit), :meth:`cancel` was called (the request stays for the next call) or the next cycle's
        token would not fit the context.  Returns ``(cycles, error)``: each completed cycle's
        emitted ids, and the :class:`EngineError` that stopped a later cycle (None if none; the
        cycles before it stand).  An error in the first cycle is raised as :meth:`step` raises it
        (the session is unchanged).  A KeyboardInterrupt (a signal) that comes after cycles have
        completed is returned as ``error`` too, their tokens booked: the caller raises it once it
        has taken them (:class:`~ds4tui.engine.decode.DecodeLoop` does), so that what it holds, the
        session and the engine's counters cover the same tokens."""
        if isinstance(max_out, bool) or int(max_out) != max_out or not 1 <= max_out <= STEP_MANY_OUT:
            raise ValueError(f"max_out must be an integer 1..{STEP_MANY_OUT}, got {max_out!r}")
        if isinstance(max_cycles, bool) or int(max_cycles) != max_cycles or max_cycles < 1:
            raise ValueError(f"max_cycles must be a positive integer, got {max_cycles!r}")
        stop = frozenset(int(t) for t in stop)
        many = getattr(self.backend, "step_many", None)
        if many is None:  # a backend without it: one step at a time, the same stopping rules
            return self._step_each(int(max_out), int(max_cycles), float(budget_s), stop)
        with self._lock:
            self._ready_to_step()
            try:
                cycles, error = many(int(max_out), int(max_cycles), float(budget_s), stop, self.pending)
            except CancelledError:
                self.clear_cancel()  # consumed
                raise
            for out in cycles:
                self._record(out)
            if isinstance(error, CancelledError):
                self.clear_cancel()
            return cycles, error

    def _step_each(self, max_out: int, max_cycles: int, budget_s: float,
                   stop: frozenset[int]) -> tuple[list[list[int]], EngineError | KeyboardInterrupt | None]:
        t0, cycles, emitted = time.perf_counter(), [], 0
        while len(cycles) < max_cycles and emitted < max_out:
            if cycles and (self._cancel.is_set() or (budget_s > 0 and time.perf_counter() - t0 >= budget_s)
                           or (self.pending is not None and len(self.tokens) + 1 > self.n_ctx)):
                break
            try:
                out = self.step(min(STEP_MAX, max_out - emitted))
            except (EngineError, KeyboardInterrupt) as exc:
                if not cycles:
                    raise
                return cycles, exc
            cycles.append(out)
            emitted += len(out)
            if stop.intersection(out):
                break
        return cycles, None

    def generate(self, prompt: Sequence[int] | None = None, *, max_tokens: int = 256,
                 stop: Iterable[int] = (), progress: Callable[[int, int], None] | None = None) -> Iterator[int]:
        """Prefill ``prompt`` (if given) and yield up to ``max_tokens`` sampled ids, stopping after an
        id in ``stop`` (the decode loop of :mod:`ds4tui.engine.decode`: a stop among accepted drafts
        leaves the session and its counters as if decoding had stopped there).  Cancellation ends
        the iterator with :class:`CancelledError`, a full context with
        :class:`ContextOverflowError`."""
        from ds4tui.engine.decode import DecodeLoop

        loop = DecodeLoop(self, max_tokens, stop=stop)
        if prompt is not None:
            self.prefill(prompt, progress=progress)
        for cycle in loop:
            yield from cycle.tokens
        if loop.reason == "cancelled":
            raise loop.error
        if loop.reason == "ctx":
            raise ContextOverflowError(f"context full: all positions of the context size {self.n_ctx} hold tokens, "
                                       f"so the next token cannot be run (start a new chat or raise --ctx)")

    def rewind(self, k: int) -> None:
        """Take back the last ``k`` emitted tokens (1 <= k <= 64): the pending token and the k - 1
        tokens before it leave the session, and the token emitted before them becomes pending, as
        if decoding had stopped there (used when a stop token is among accepted drafts).

        The engine's counters cannot be lowered, so the session records what it took back:
        :meth:`stats` no longer counts the taken-back tokens as decoded, and :meth:`dspark_stats`
        no longer counts the taken-back drafts as accepted (in ``accepted_draft``,
        ``accepted_len_hist``, ``pos_accepted``, ``saved`` and ``net_saved``).  A cycle's outcome —
        full or partial — and what it proposed stay as the verifier decided (spec dspark.md §6.1:
        every draft it verified matched, or some did); ``stop_cut`` counts the cycles that lost
        drafts this way, so a full cycle of k drafts whose accepted length is now below k is
        accounted for (:meth:`DSparkStats.check_invariants`)."""
        with self._lock:
            self._alive()
            if self.pending is None or not 1 <= k <= min(STEP_MAX, len(self.tokens)):
                raise ValueError(f"cannot take back {k} emitted tokens (pending={self.pending}, "
                                 f"{len(self.tokens)} in the cache)")
            keep = len(self.tokens) - k
            tok = self.tokens[keep]
            self.backend.truncate(keep)
            del self.tokens[keep:]
            self.backend.set_pending(tok)
            self.pending = tok
            self._take_back(k)

    def _take_back(self, k: int) -> None:
        """Record that the last ``k`` emitted tokens were taken back (see :meth:`rewind`)."""
        t = self._taken
        while k and self._cycles:
            cycle = self._cycles[-1]
            accepted, emitted, _ = cycle
            n = min(k, emitted)
            before, after = min(accepted, emitted), min(accepted, emitted - n)
            if after < before:  # drafts of this cycle leave: it now counts `after` accepted ones
                t.cut += not cycle[2]  # (a cycle is one stop_cut, however often it is cut)
                cycle[2] = 1
                t.drafts += before - after
                t.hist[before] = t.hist.get(before, 0) - 1
                t.hist[after] = t.hist.get(after, 0) + 1
                for row in range(after, before):
                    t.pos[row] = t.pos.get(row, 0) - 1
            t.tokens += n
            k -= n
            cycle[1] = emitted - n
            if cycle[1] == 0:
                self._cycles.pop()

    def truncate(self, n: int) -> None:
        """Forget every token at position >= ``n`` (at most one batch back, or all: ``n`` = 0)."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            raise TypeError(f"truncate length must be an integer, got {n!r}")
        n = int(n)
        with self._lock:
            self._alive()
            if not 0 <= n <= len(self.tokens):
                raise ValueError(f"cannot truncate a session of {len(self.tokens)} tokens to {n}")
            if n == len(self.tokens) and n:
                return  # nothing to forget; the pending token and the logits stay
            if n and len(self.tokens) - n > self.n_batch:
                raise ValueError(f"cannot take back {len(self.tokens) - n} tokens: at most {self.n_batch} (the "
                                 f"batch size) can be taken back, or all of them (truncate to 0)")
            self.backend.truncate(n)
            del self.tokens[n:]
            self.pending = None
            self._cycles.clear()

    def bench_fill(self, n: int, filler: int = 0) -> None:
        """Benchmarks only: advance to ``n`` tokens without running them (``ds4_session_bench_fill``):
        the compressed rows of the skipped windows repeat the rows already written, so the next pass
        reads and selects over as many rows as after a real prefill of ``n`` tokens, with repeated
        values.  ``filler`` stands for the skipped ids.  Needs at least the largest compression
        ratio (128 on Flash) of prefilled tokens; ``ValueError`` for ``n`` outside the tokens so far
        .. the context; :class:`StateError` with a support model or on the reference backend."""
        n = int(n)
        with self._lock:
            self._alive()
            if not len(self.tokens) <= n <= self.n_ctx:
                raise ValueError(f"bench fill to {n} tokens: expected {len(self.tokens)} .. {self.n_ctx}")
            self.backend.bench_fill(n)
            self.tokens.extend([int(filler)] * (n - len(self.tokens)))
            self.pending = None
            self._cycles.clear()

    def reset(self) -> None:
        """Empty the session (keeps sampling settings and counters)."""
        self.truncate(0)

    def cancel(self) -> None:
        """Stop the running prefill/step as soon as possible (thread-safe).  The request is sticky
        until a call stops because of it: if nothing is running, or the running call is past its
        last check, the next prefill or step stops instead, so a cancel is never lost;
        :meth:`clear_cancel` withdraws it, e.g. at the start of a new turn.  A closed session
        ignores it (under the lock that :meth:`close` frees the native session under, so a cancel
        from another thread never reaches a freed one)."""
        with self._knob_lock:
            if not self._closed:
                self._cancel.set()
                self.backend.cancel(True)

    def clear_cancel(self) -> None:
        """Withdraw a pending :meth:`cancel` that no call has consumed."""
        with self._knob_lock:
            if not self._closed:
                self._cancel.clear()
                self.backend.cancel(False)

    @property
    def sampling(self) -> SamplingParams:
        return self._sampling

    def set_sampling(self, params: SamplingParams) -> None:
        """Apply sampling settings from the next step on (``ValueError`` for bad values)."""
        params = params.validate()
        with self._lock:
            self._alive()
            self.backend.set_sampling(params)
            self._sampling = params

    def stats(self) -> Stats:
        """A snapshot of the session's counters (``n_decode_tokens`` without the tokens that
        :meth:`rewind` took back)."""
        self._alive()
        st = self.backend.stats()
        return replace(st, n_decode_tokens=st.n_decode_tokens - self._taken.tokens) if self._taken.tokens else st

    def reset_stats(self) -> None:
        """Zero the counters (the DSpark ones too)."""
        with self._lock:
            self._alive()
            self.backend.reset_stats()
            self._taken = _TakenBack()
            self._cycles.clear()

    def memory(self) -> Memory:
        """Bytes held by the engine and this session."""
        self._alive()
        return self.backend.memory()

    # -- DSpark --------------------------------------------------------------------------------
    @property
    def has_dspark(self) -> bool:
        """True when the engine has a support model attached (or refused: then every cycle
        reports ``support_invalid``)."""
        return self.engine.support_status != "none"

    @property
    def dspark(self) -> DSparkKnobs:
        """The knobs as last set (they apply from the next cycle on).  Does not wait for a running
        step.  :class:`StateError` without a support model."""
        with self._knob_lock:
            self._alive()
            return self.backend.knobs()

    def set_dspark(self, *, enabled: bool | None = None, scheduler: bool | None = None,
                   threshold: float | None = None, max_draft: int | None = None,
                   policy: str | None = None) -> DSparkKnobs:
        """Change DSpark's knobs (thread-safe; a running step finishes with the old ones, the next
        cycle uses the new ones, and the engine logs the change with that cycle's number).

        ``threshold`` in [0, 1], ``max_draft`` in 1..block size, ``policy`` one of
        :data:`~ds4tui.engine.backend.SCHEDULER_POLICIES` (spec dspark.md §7.6).  Raises ``ValueError`` for bad
        values and :class:`StateError` without a support model or when enabling a refused one.
        Returns the knobs now requested.  Does not wait for a running prefill or step."""
        for name, v in (("enabled", enabled), ("scheduler", scheduler)):
            if v is not None and not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {v!r}")
        if threshold is not None and (isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, (
                int, float, np.integer, np.floating)) or not math.isfinite(threshold) or not 0 <= threshold <= 1):
            raise ValueError(f"confidence threshold must be a number in [0, 1], got {threshold!r}")
        if max_draft is not None and (isinstance(max_draft, (bool, np.bool_)) or not isinstance(
                max_draft, (int, np.integer))):
            raise ValueError(f"max draft length must be an integer, got {max_draft!r}")
        if policy is not None:
            check_policy(policy)
        with self._knob_lock:
            self._alive()
            k = self.backend.knobs()
            change: dict = {}
            if enabled is not None:
                change["enabled"] = bool(enabled)
            if scheduler is not None:
                change["scheduler"] = bool(scheduler)
            if threshold is not None:
                change["threshold"] = float(np.float32(threshold))  # the engine holds it as float32
            if max_draft is not None:
                if not 1 <= int(max_draft) <= STEP_MAX:
                    raise ValueError(f"max draft length must be 1..the support block size, got {max_draft}")
                change["max_draft"] = int(max_draft)
            if policy is not None:
                change["policy"] = policy
            k = replace(k, **change)
            self.backend.set_knobs(k)
            return k

    def dspark_stats(self) -> DSparkStats:
        """A consistent snapshot of the DSpark counters (all zero without a support model), without
        the drafts that :meth:`rewind` took back.  Taken between steps: from another thread it
        waits for the running step to finish."""
        with self._lock:
            self._alive()
            return self._taken.apply(self.backend.dspark_stats())

    def dspark_events(self, last: int = 256) -> list[KnobEvent]:
        """The knob changes the engine applied (at most the latest ``last``), oldest first."""
        self._alive()
        return self.backend.dspark_events(last)

    def last_proposal(self) -> tuple[list[int], list[float]]:
        """The last drafter pass: ``(drafts, confidences)`` — the draft ids after the confidence
        cut (before budget/scheduler cuts) and the raw, uncalibrated c_k it computed (spec
        dspark.md §2.4; computed up to the first one below the threshold)."""
        self._alive()
        return self.backend.last_proposal()

    def _prices_to_keep(self) -> "prices.SchedulerPrices | None":
        """The scheduler's prices as the engine keeps them: a plain decode's is the session's mean
        over at least :data:`~ds4tui.engine.prices.KEEP_MIN_DECODES` plain decodes rather than the
        moving average's last value, which one decode stalled near the end moves by up to 20 %
        (spec dspark.md §7.4)."""
        end = self.backend.prices()
        st = self.backend.dspark_stats()
        if end is not None and st.t_decode_measured and st.no_draft + st.invalid >= prices.KEEP_MIN_DECODES:
            end = replace(end, t_ver={**end.t_ver, 1: st.t_decode_ms})
        return end

    def set_scheduler_prices(self, kept: "prices.SchedulerPrices") -> None:
        """Start the DSpark scheduler from ``kept`` (spec dspark.md §7.4): its next cycle is a plain
        decode that re-times t_ver(1), then it decides with these prices and counts, used as given
        (prices the engine keeps between sessions are checked against that decode instead: kept
        times measured where a decode cost over twice as much are dropped).
        :class:`StateError` without an attached support model; ValueError naming a field out of
        range (a time not finite and > 0, hit[k] > reached[k])."""
        with self._lock:
            self._alive()
            self.backend.set_prices(kept)
            self._prices_start = None  # not the engine's: all of it is news to the engine when kept
            self._prices_kept = None

    def restart_scheduler_prices(self) -> None:
        """Start the DSpark scheduler again from the prices the engine keeps now, as
        :meth:`Engine.session` does (``scheduler_prices_at_start``, ``scheduler_prices_retime`` and
        ``scheduler_other_work`` follow), so that a session made before another one closed starts
        from what that one measured (the chat's new context: the new session is made before the old
        one is freed).  Nothing happens with ``fresh`` prices or without a support model.
        :class:`StateError` once the session has run a cycle."""
        with self._lock:
            self._alive()
            if self.tokens or self.pending is not None:
                raise StateError("the scheduler's prices can be restarted only before the session's first pass")
            self._take_prices_start(self.engine._start_prices(self.backend))

    def _take_prices_start(self, start: tuple) -> None:
        """Where the scheduler's prices started, as ``Engine._start_prices`` returns it."""
        #: the prices the session started from (None: fresh), what its close merges against;
        #: where they came from (spec dspark.md §7.4): "fresh", "saved" (the engine's file) or "engine"
        #: (an earlier session of the engine); why the kept verify and proposal times were left out of
        #: the start, so that its first drafted cycle re-times them ("" when they were not;
        #: prices.retime_reason); the cores other processes kept busy just before the session (None:
        #: not known), kept with the times it measures (prices.other_work); the kept prices before any
        #: were left out (None: fresh), what ``scheduler_prices_retimed`` reports against
        (self._prices_start, self.scheduler_prices_at_start, self.scheduler_prices_retime,
         self.scheduler_other_work, self._prices_kept) = start

    def scheduler_prices(self) -> "prices.SchedulerPrices | None":
        """The DSpark scheduler's prices and acceptance counts as they stand (spec dspark.md §7.4);
        None without a support model."""
        with self._lock:
            self._alive()
            return self.backend.prices() if self.has_dspark else None

    def _prices_left_out(self) -> tuple:
        """The kept verify widths and whether the proposal time that were left out of the session's
        start as stale (``SchedulerPrices.merged``'s ``left_out``): what the kept prices held and the
        start did not."""
        kept, start = self._prices_kept, self._prices_start
        if kept is None or start is None:
            return (), False
        return (tuple(sorted(set(kept.t_ver) - set(start.t_ver))),
                kept.t_prop is not None and start.t_prop is None)

    def scheduler_prices_retimed(self) -> list[dict]:
        """The kept times this session's scheduler started with, or left out of its start as stale
        (``scheduler_prices_retime``), that its drafting has timed again so far (spec dspark.md §7.4,
        In-session): ``[{"time": "verify(6)", "kept_ms": 4.12, "now_ms": 3.05}, …]``, verify widths (2
        rows or more) in order and ``"proposal"`` last, ms as the scheduler holds them (a first cheaper
        sample replaces a kept time, a dearer one starts its moving average, a time left out is the
        session's own).  ``[]`` when the session started fresh, from prices set directly
        (:meth:`set_scheduler_prices`), or has re-timed none yet; the kept decode time t_ver(1) is
        never listed (every start re-times it, spec §7.4)."""
        kept = self._prices_kept
        now = self.scheduler_prices() if kept is not None else None
        if now is None:
            return []
        out = [{"time": f"verify({n})", "kept_ms": kept.t_ver[n], "now_ms": now.t_ver[n]}
               for n in sorted(kept.t_ver) if n > 1 and n in now.t_ver and now.t_ver[n] != kept.t_ver[n]]
        if kept.t_prop is not None and now.t_prop is not None and now.t_prop != kept.t_prop:
            out.append({"time": "proposal", "kept_ms": kept.t_prop, "now_ms": now.t_prop})
        return out

    def dspark_fail_op(self, op: str | None) -> None:
        """Test hook: make the named drafter op fail on every pass (None: none).  The cycle is
        then counted as ``chain_fail`` with the op's name and decoding continues target-only."""
        self._alive()
        self.backend.fail_op(op)

    def close(self) -> None:
        """Free the session now.  With ``print_stats`` (``Engine.session``) and any DSpark activity,
        the ds4-compatible stats line is printed to stderr first (as ds4 does with
        ``DS4_DSPARK_STATS``)."""
        with self._lock:
            if self._closed:
                return
            if self.has_dspark and self.print_stats:
                st = self.dspark_stats()
                if st.cycles or st.propose:
                    print(format_line(st), file=sys.stderr, flush=True)
            if self.engine.support_status == "attached" and self.engine.scheduler_prices != "fresh":
                # the load its passes ran under: over the session's life (the time before it, measured at
                # its start, is too short to tell when it follows the engine's open or another session)
                mark = prices.cpu_mark()
                self.engine._keep_prices(self._prices_start, self._prices_to_keep(), self.scheduler_other_work,
                                         left_out=self._prices_left_out(),
                                         life=prices.other_work(self._life_mark, mark), mark=mark)
            with self._knob_lock:
                self._closed = True
                self.backend.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
