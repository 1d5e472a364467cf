"""The environment variables ds4tui honours, read and checked in one place: the command line's edge.

The engine layer reads no variable; what a variable sets is passed in as an argument
(``Engine(gpu_layout=, gpu_library=)``, ``Engine.session(scheduler=, max_draft=, print_stats=)``,
the app's telemetry choice).  :func:`read_environment` reads every variable that changes what runs,
checks its value and returns the :class:`Settings` that ``chat``, ``generate`` and ``bench`` pass
through; a bad value is a :class:`BadVariable` that names the variable, the value and the accepted
values (the command line prints it and exits with status 2, like a bad flag, before any model
loads).  :func:`report` describes every variable for ``ds4tui doctor``, the ones that only say
where files are too (those are read where they are used: ``DS4TUI_DEMO_DIR`` and
``XDG_CACHE_HOME`` by the demo, bench and scheduler prices caches, ``HSA_OVERRIDE_GFX_VERSION`` by the ROCm runtime;
a relative ``DS4TUI_DEMO_DIR`` is a bad value too, while a relative ``XDG_CACHE_HOME`` is ignored, as its spec says).

Not a command: ``ds4tui/commands/<name>.py`` modules are commands, this one serves them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from ds4tui.engine.stats import MAX_BLOCK  # the largest block; the support model's own is checked on attach
from ds4tui.engine.telemetry import BACKEND_NAMES as TELEMETRY


class BadVariable(ValueError):
    """An environment variable holds a value ds4tui does not accept: the message names it, the value,
    the accepted values and, for a variable of :data:`VARIABLES` with an ``example``, how to set one
    or go back to the default (:func:`what_to_do`)."""

    def __init__(self, name: str, value: str, accepted: str):
        self.name, self.value, self.accepted = name, value, accepted
        todo = what_to_do(name)
        super().__init__(f"{name}={value!r}: expected {accepted}" + (f"; {todo}" if todo else ""))


def what_to_do(name: str) -> str:
    """How to give the variable ``name`` an accepted value: ``set one of them (`export
    DS4_DSPARK_SCHEDULER=0`), or unset it for the default: 1``; "" for a variable whose accepted
    values say it already (DS4TUI_DEMO_DIR) or that is not checked."""
    var = next((v for v in VARIABLES if v.name == name), None)
    if var is None or var.example is None:
        return ""
    default = "" if var.default == "unset" else f" for the default: {var.default}"
    return f"set one of them (`export {name}={var.example}`), or unset it{default}"


@dataclass(frozen=True)
class Settings:
    """What the variables set (the defaults when none is set)."""

    #: DS4_DSPARK_SCHEDULER: the adaptive scheduler on at the start of a DSpark session.
    dspark_scheduler: bool = True
    #: DS4_DSPARK_MAX_DRAFT_TOKENS: drafts per cycle at the start (0: the support model's block size).
    dspark_max_draft: int = 0
    #: DS4_DSPARK_STATS: print ds4's stats line when a DSpark session closes (None: unset, which
    #: prints nothing at close; generate then prints the line at its end, and DS4_DSPARK_STATS=0 stops that too).
    dspark_stats: bool | None = None
    #: DS4TUI_GPU_LAYOUT: the device layout of the weight matrices ("planar" or "ggml").
    gpu_layout: str = "planar"
    #: DS4TUI_GPU_LIB: the GPU backend library to load instead of the built one (None: the built one).
    gpu_library: str | None = None
    #: DS4TUI_PREFILL_GEMM: prefill products on the GPU's matrix units ("auto", "off", "bf16", "f16").
    prefill_gemm: str = "auto"
    #: DS4TUI_TELEMETRY: the memory telemetry source of the chat app (None: chosen by the backend).
    telemetry: str | None = None
    #: --gpu-graphs (a flag of chat, generate and bench, no variable): decode and verify passes
    #: replayed from graphs on the GPU backend ("off" or "on"; spec platform.md §8).
    gpu_graphs: str = "off"
    #: --scheduler-prices (a flag of chat, generate and bench, no variable): where a new session's
    #: DSpark scheduler starts (spec dspark.md §7.4): "fresh", "engine" or "saved" (the default:
    #: the prices of earlier runs, in a file under :func:`scheduler_prices_dir`).
    scheduler_prices: str = "saved"
    #: --draft-vocab (a flag of chat, generate and bench, no variable): the tokens DSpark's drafter
    #: proposes from ("auto", "full" or a count as text; spec dspark.md §2.6).
    draft_vocab: str = "auto"
    #: --verify-head (a flag of chat, generate and bench, no variable): which rows of a DSpark verify get
    #: the LM head ("auto", "lazy" or "all"; spec dspark.md §3.4).
    verify_head: str = "auto"
    #: --amx (a flag of chat, generate and bench, no variable): Q8_0 products on the AMX tiles ("auto",
    #: "on" or "off"; spec ds4.md §2.9.6).
    amx: str = "auto"

    def price_options(self) -> dict:
        """Keyword arguments of ``Engine`` for the scheduler's prices (the mode, the saved files' folder)."""
        return {"scheduler_prices": self.scheduler_prices, "prices_dir": scheduler_prices_dir()}

    def session_options(self) -> dict:
        """Keyword arguments of ``Engine.session`` (the starting DSpark knobs, the stats line)."""
        return {"scheduler": self.dspark_scheduler, "max_draft": self.dspark_max_draft,
                "print_stats": bool(self.dspark_stats)}

    def engine_options(self) -> dict:
        """Keyword arguments of ``Engine`` (the GPU weight layout and library, the prefill GEMM, graphs,
        the draft vocabulary, the verify's LM head, the AMX tiles)."""
        return {"gpu_layout": self.gpu_layout, "gpu_library": self.gpu_library, "prefill_gemm": self.prefill_gemm,
                "gpu_graphs": self.gpu_graphs, "draft_vocab": self.draft_vocab, "verify_head": self.verify_head,
                "amx": self.amx}

    def check_block(self, block: int, support=None) -> None:
        """:class:`BadVariable` when DS4_DSPARK_MAX_DRAFT_TOKENS is more than the ``block`` drafts of
        the attached support model (the file ``support``, named when given; the one check that needs
        the support model)."""
        if block and self.dspark_max_draft > block:
            raise BadVariable("DS4_DSPARK_MAX_DRAFT_TOKENS", str(self.dspark_max_draft),
                              max_draft_accepted(block, support))


def print_error_json(message: str) -> None:
    """A failure of a command given ``--json`` on stdout, as every command's failures are: one line,
    ``{"ok": false, "error": message}`` (the message is on stderr too)."""
    import json

    print(json.dumps({"ok": False, "error": message}), flush=True)


def max_draft_accepted(block: int | None = None, support=None) -> str:
    """What DS4_DSPARK_MAX_DRAFT_TOKENS accepts, in the words of every message about it: the
    engine's bound is the attached support model's block size (``dspark.c`` refuses a larger
    ``max_draft``), and no support model has a block above :data:`MAX_BLOCK`
    (``DS4_DSPARK_MAX_BLOCK``).  With ``block`` known, its number (and the file ``support``)."""
    if block is None:
        return (f"0 (the support model's block size) or an integer 1..the support model's block size (5 for the demo's "
                f"and DS4 Flash's drafters; no block is larger than {MAX_BLOCK})")
    of = f"the block size of {support}" if support is not None else "the support model's block size"
    return f"0 (the support model's block size) or an integer 1..{block} ({of})"


_MODEL_HINT = " (argument MODEL: expected a DS4 model GGUF; check the path, or leave MODEL out for the bundled demo model)"
_SUPPORT_HINT = " (argument --mtp: expected a DSpark support GGUF; check the path)"


def argument_hint(exc, model: "str | None", support: "str | None") -> str:
    """What :func:`file_error` adds to ``exc``'s message: the argument that named the file and what to
    do, or only the argument where the message already says what to do (a damaged file), or nothing
    (a message that names its argument already, or a file no argument named: the demo's)."""
    import os

    if getattr(exc, "path", None) is None or "(argument " in str(exc):  # no file (non-finite logits), or said
        return ""

    def named(path: "str | None") -> bool:
        return path is not None and os.path.abspath(path) == os.path.abspath(exc.path)

    if "re-download or re-convert" in str(exc):  # a damaged file says what to do: only which argument named it
        return " (argument --mtp)" if named(support) else " (argument MODEL)" if named(model) else ""
    return _SUPPORT_HINT if named(support) else _MODEL_HINT if named(model) else ""


def file_error(exc, model: "str | None", support: "str | None") -> str:
    """The message of ``exc`` (a :class:`ModelFileError` raised loading a file that opens but is not
    what its argument expects: not a GGUF, cut short, another architecture) with the argument that
    named the file and what to do, as :func:`check_model_path` and :func:`check_support_path` give
    them for a path that does not open; the message as it is for any other file (the demo's)."""
    return str(exc) + argument_hint(exc, model, support)


def check_model_path(path: str) -> None:
    """The one check of a MODEL path in ``generate``, ``chat``, ``bench`` and ``tokenize``, made as
    early as :func:`check_support_path`: :class:`ModelFileError` naming the path, the argument and
    what to do (``MISSING: no such file (argument MODEL: expected a DS4 model GGUF; check the path, or
    leave MODEL out for the bundled demo model)``)."""
    from ds4tui.engine.gguf_model import check_readable

    check_readable(path, _MODEL_HINT)


def check_support_path(path: str) -> None:
    """The one check of a ``--mtp`` file in ``generate``, ``chat`` and ``bench``, made before a demo
    is unpacked, a medium model built or a model loaded (a real model's load takes minutes): the path
    and what the file holds by itself, without the model.  Raises :class:`ModelFileError` when
    ``path`` cannot be opened for reading (no such file, a directory, the OS's reason: ``MISSING: no
    such file (argument --mtp: expected a DSpark support GGUF; check the path)``), and the error
    loading it beside the model would raise when it is not a GGUF, is damaged or cut short, or is of
    another architecture, such as a target model (:func:`~ds4tui.engine.gguf_model.open_support`: a
    :class:`GGUFFormatError`, :class:`TruncatedFileError` or :class:`ArchitectureError`, its message
    ending as :func:`file_error` ends it).  Whether the file fits the model is checked as it loads."""
    from ds4tui.engine.gguf_model import ModelFileError, check_readable, open_support

    check_readable(path, _SUPPORT_HINT)
    try:
        open_support(path)
    except ModelFileError as exc:  # its own class, its message ended as loading it would end it
        hint = argument_hint(exc, None, path)
        if hint:
            exc.detail += hint
            exc.args = (str(exc) + hint,)
        raise


def check_support_block(support, max_draft: int | None, settings: Settings) -> None:
    """Before any model loads: a ``--max-draft`` (ValueError) or ``DS4_DSPARK_MAX_DRAFT_TOKENS``
    (:class:`BadVariable`) above the block size the support file ``support`` declares in its
    metadata, and a ``--draft-vocab N`` (ValueError) the file's draft vocabulary cannot meet.  Nothing
    is checked when there is no support file, or when it cannot be read as one or its block size
    cannot be read (loading it then says why: a file error, status 1, not a usage error)."""
    from ds4tui.engine.gguf_model import support_block_size, support_draft_vocab_size

    if support is not None and settings.draft_vocab not in ("auto", "full"):  # a count, against the file's list
        listed, want = support_draft_vocab_size(support), int(settings.draft_vocab)
        if listed == 0:
            raise ValueError(f"argument --draft-vocab: {want}: {support} has no draft vocabulary (metadata key "
                             f"'ds4tui.draft_vocab'); `ds4tui draft-vocab` adds one, or choose full or auto")
        if listed is not None and want > listed:
            raise ValueError(f"argument --draft-vocab: {want}: {support} lists {listed} tokens; choose at most "
                             f"{listed}, or full for the whole vocabulary")
    block = support_block_size(support) if support is not None else None
    if block is None:
        return
    if max_draft is not None and max_draft > block:
        raise ValueError(f"argument --max-draft: expected 1..{block} (the block size of {support}), found {max_draft}; "
                         f"give --max-draft 1..{block}, or leave it out for drafts of up to the block size")
    settings.check_block(block, support)


def backend_chosen(engine) -> str:
    """The line ``generate`` and ``bench`` print on stderr for ``--backend auto``: the engine's
    ``backend_note`` (the GPU it runs, or in plain words why it runs on the CPU) and, on the CPU, where
    the whole reason is (``ds4tui doctor``; the JSON's ``backend_detail``)."""
    if engine.backend_detail:
        return f"{engine.backend_note} (`ds4tui doctor` says why in full)"
    return engine.backend_note


def backend_unavailable(backend: str, exc: Exception) -> str:
    """The one line ``generate`` and ``bench`` print when ``--backend BACKEND`` cannot run (exit
    status 1): the engine's reason, then what to do (--backend auto only where the GPU failed: auto
    and cpu fail for want of the cpu engine itself, which auto needs too).  A native engine that is not
    built is the line ``ds4tui doctor`` prints, whatever the backend: it names the command that builds it."""
    from ds4tui.engine.errors import NativeNotBuiltError, OptionUnavailableError

    if isinstance(exc, (NativeNotBuiltError, OptionUnavailableError)):  # no backend runs, or an option that
        return str(exc)  # cannot run here: the line says it, as it is
    auto = "--backend auto runs on the cpu when the GPU cannot; " if backend == "hip" else ""
    return f"--backend {backend}: {exc} ({auto}`ds4tui doctor` says what is missing)"


def check_backend_options(backend: str, activations: str, prefill_gemm_flag: str | None,
                          settings: Settings) -> None:
    """Before any model loads: ValueError (a usage error, exit status 2) naming the flag or variable
    when the backend cannot run what the options ask for: ``--activations q8`` on the reference
    backend (8-bit activations are a cpu and hip path, spec ds4.md §2.9.5), and a prefill GEMM of
    bf16/f16 (``--prefill-gemm``, else DS4TUI_PREFILL_GEMM in ``settings``) on the cpu or reference
    backend (the GPU's matrix units, spec platform.md §7), ``--gpu-graphs on`` (``settings``) on
    the cpu or reference backend (graphs replay device kernels, spec platform.md §8), and
    ``--verify-head lazy`` (``settings``) on the hip or reference backend (spec dspark.md §3.4), and
    ``--amx on`` (``settings``) on the hip or reference backend or with ``--activations f32`` (the AMX
    tiles multiply a CPU's 8-bit activations, spec ds4.md §2.9.6).
    ``backend`` auto is never refused here: q8 runs on either backend it picks, and the command
    notes a prefill GEMM, graphs or a lazy verify head that the backend it chose does not apply
    (:func:`gpu_options_not_applied`)."""
    if activations == "q8" and backend == "reference":
        raise ValueError(f"argument --activations: q8 runs on the cpu and hip backends, found --backend {backend} "
                         f"(use --backend cpu, hip or auto, or --activations f32)")
    gemm = settings.prefill_gemm
    if gemm in ("bf16", "f16") and backend in ("cpu", "reference"):
        if prefill_gemm_flag is not None:
            raise ValueError(f"argument --prefill-gemm: {gemm} runs on the GPU backend only, found --backend "
                             f"{backend} (use --prefill-gemm off or auto, or --backend hip or auto)")
        raise ValueError(f"DS4TUI_PREFILL_GEMM={gemm!r}: {gemm} runs on the GPU backend only, found --backend "
                         f"{backend} (unset it or use --prefill-gemm off, or --backend hip or auto)")
    if settings.gpu_graphs == "on" and backend in ("cpu", "reference"):
        raise ValueError(f"argument --gpu-graphs: on runs on the GPU backend only (graphs replay device kernels), "
                         f"found --backend {backend} (use --gpu-graphs off, or --backend hip or auto)")
    if settings.verify_head == "lazy" and backend in ("hip", "reference"):
        why = ("its verify computes every row's LM head in one pass on the device" if backend == "hip"
               else "it does not draft")
        raise ValueError(f"argument --verify-head: lazy runs on the cpu backend only ({why}), found --backend "
                         f"{backend} (use --verify-head auto or all, or --backend cpu or auto)")
    if settings.amx == "on" and backend in ("hip", "reference"):
        raise ValueError(f"argument --amx: on runs on the cpu backend only (the AMX tiles are a CPU's), found --backend "
                         f"{backend} (use --amx auto or off, or --backend cpu or auto)")
    if settings.amx == "on" and activations == "f32":
        raise ValueError("argument --amx: on multiplies 8-bit activations, found --activations f32 (use --activations "
                         "q8 or auto, or --amx off)")


def gpu_options_not_applied(settings: Settings, engine, prefill_gemm_flag: str | None = None) -> list[str]:
    """What the backend-specific options asked for that the opened ``engine`` does not apply
    (``--backend auto`` on a machine that ran the cpu, a GPU that refused them, or ``--verify-head
    lazy`` where auto chose the GPU), one phrase each, for a note on stderr or the app's welcome
    line: ``--prefill-gemm bf16 does not apply, prefill_gemm is off: ...``."""
    out = []
    if settings.prefill_gemm in ("bf16", "f16") and engine.prefill_gemm != settings.prefill_gemm:
        source = (f"--prefill-gemm {settings.prefill_gemm}" if prefill_gemm_flag is not None
                  else f"DS4TUI_PREFILL_GEMM={settings.prefill_gemm}")
        out.append(f"{source} does not apply, prefill_gemm is {engine.prefill_gemm_note}")
    if settings.gpu_graphs == "on" and engine.gpu_graphs != "on":
        out.append(f"--gpu-graphs on does not apply, graphs are {engine.gpu_graphs_note}")
    if settings.verify_head == "lazy" and getattr(engine, "verify_head", "lazy") != "lazy":
        out.append(f"--verify-head lazy does not apply, the verify head is {engine.verify_head_note}")
    if settings.amx == "on" and getattr(engine, "amx", "on") != "on":
        out.append(f"--amx on does not apply, amx is {engine.amx_note}")
    return out


def xdg_cache_home(environ: Mapping[str, str] | None = None) -> tuple[Path, str | None]:
    """The user's cache folder, the one rule of every ds4tui cache (the demo, bench --medium, the
    scheduler prices): ``$XDG_CACHE_HOME`` when it is an absolute path, else ``~/.cache``, because
    the XDG Base Directory spec calls a relative path invalid and says to ignore it.  Second: why a
    set value was ignored (None when it was not), for ``ds4tui doctor``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME", "")
    default = Path.home() / ".cache"
    if not base:
        return default, None
    if not os.path.isabs(base):
        return default, (f"XDG_CACHE_HOME={base} is ignored: expected an absolute path, found a relative one (the XDG "
                         f"Base Directory spec calls it invalid), so the caches are under {default}; set it to an "
                         f"absolute path, or unset it")
    return Path(base), None


def cache_root() -> Path:
    """``ds4tui``'s folder in the user's cache folder (:func:`xdg_cache_home`)."""
    return xdg_cache_home()[0] / "ds4tui"


def scheduler_prices_dir() -> Path:
    """The folder of the saved DSpark scheduler prices (``--scheduler-prices saved``, spec dspark.md §7.4)."""
    return cache_root() / "scheduler-prices"


def settings_of(args) -> Settings:
    """The settings ``ds4tui.cli.main`` read for a command (``args.settings``); the defaults when
    the command runs without them (called from Python)."""
    return getattr(args, "settings", None) or Settings()


def _switch(v: str) -> bool:
    return v == "1"


def _max_draft(v: str) -> int:
    return int(v)


@dataclass(frozen=True)
class Variable:
    """One variable: ``accepted`` (in words; None: any text) and ``check`` (the text → True when it
    is accepted); ``default`` is what applies when it is unset or empty; ``field`` is the
    :class:`Settings` field it sets and ``parse`` the value for it (None: read where it is used)."""

    name: str
    effect: str
    default: str
    accepted: str | None = None
    check: Callable[[str], bool] | None = None
    field: str | None = None
    parse: Callable[[str], object] = str
    #: an accepted value, for the what-to-do of a bad one (None: the accepted values say it already)
    example: str | None = None
    #: for ``doctor`` only: the value → what is wrong with it (None: nothing) where the commands take
    #: any value and fail later, where it is used (a library path that names no file)
    problem: Callable[[str], str | None] | None = None


def _gpu_library_problem(value: str) -> str | None:
    """What is wrong with a DS4TUI_GPU_LIB value: a path that names no file."""
    if os.path.isfile(value):
        return None
    what = "is a folder" if os.path.isdir(value) else "no such file"
    return (f"DS4TUI_GPU_LIB={value}: {what}, so the GPU backend is unavailable (--backend auto runs on the CPU, "
            f"--backend hip fails); unset it to load the library the build made")


#: What DS4TUI_DEMO_DIR accepts: a relative path would unpack the demo pair under whatever folder a
#: command starts in (a second copy per folder), so it is refused as a bad value, as every ds4tui
#: variable's is (XDG_CACHE_HOME, not ds4tui's, is ignored when relative, as its spec says).
DEMO_DIR_ACCEPTED = ("an absolute path, found a relative one (it would unpack the demo pair under whatever folder a "
                     "command starts in): give the full path, or unset it")


VARIABLES: tuple[Variable, ...] = (
    Variable("DS4_DSPARK_SCHEDULER", "DSpark's adaptive scheduler at the start of a session (F3 / --no-scheduler "
             "change it)", "1", "0 (off) or 1 (on)", lambda v: v in ("0", "1"), "dspark_scheduler", _switch, "0"),
    Variable("DS4_DSPARK_MAX_DRAFT_TOKENS", "DSpark drafts per cycle at the start of a session (--max-draft, "
             "F9/F10 change it)", "0 (the block size)", max_draft_accepted(),
             lambda v: v.isascii() and v.isdigit() and int(v) <= MAX_BLOCK, "dspark_max_draft", _max_draft, "0"),
    Variable("DS4_DSPARK_STATS", "print ds4's DSpark stats line to stderr when a session closes (unset: "
             "generate still prints it at its end; 0: no line at all)", "unset",
             "0 (off) or 1 (on)", lambda v: v in ("0", "1"), "dspark_stats", _switch, "1"),
    Variable("DS4TUI_GPU_LAYOUT", "device layout of the weight matrices on the GPU backend", "planar",
             "planar (the default) or ggml", lambda v: v in ("planar", "ggml"), "gpu_layout", example="ggml"),
    Variable("DS4TUI_PREFILL_GEMM", "prefill products on the GPU's matrix units through the vendor BLAS, a "
             "numerics option (spec platform.md §7; --prefill-gemm wins)", "auto",
             "auto (bf16 when the BLAS loads, else off), off, bf16 or f16",
             lambda v: v in ("auto", "off", "bf16", "f16"), "prefill_gemm", example="off"),
    Variable("DS4TUI_GPU_LIB", "GPU backend library to load instead of the one the build made", "the built library",
             None, None, "gpu_library", problem=_gpu_library_problem),
    Variable("DS4TUI_TELEMETRY", "memory telemetry source of the chat app (--telemetry wins)",
             "chosen by the backend", ", ".join(TELEMETRY) + " (any case)",
             lambda v: v.strip().lower() in TELEMETRY, "telemetry", lambda v: v.strip().lower(), "rss"),
    Variable("DS4TUI_DEMO_DIR", "where the bundled demo model is unpacked", "$XDG_CACHE_HOME/ds4tui/demo",
             DEMO_DIR_ACCEPTED, os.path.isabs),
    Variable("XDG_CACHE_HOME", "cache folder of the demo model, bench --medium and the saved DSpark scheduler prices "
             "(an absolute path)", "~/.cache"),
    Variable("HSA_OVERRIDE_GFX_VERSION", "ROCm runtime: load code objects of this gfx version instead of the "
             "device's (a mismatch with the build fails)", "the device's own"),
)


def read_environment(environ: Mapping[str, str] | None = None) -> Settings:
    """The :class:`Settings` the variables in ``environ`` (default ``os.environ``) ask for;
    :class:`BadVariable` for the first one whose value is not accepted.  An empty value counts as
    unset."""
    env = os.environ if environ is None else environ
    kw: dict = {}
    for var in VARIABLES:
        value = env.get(var.name, "")
        if not value:
            continue
        if var.check is not None and not var.check(value):
            raise BadVariable(var.name, value, var.accepted or "")
        if var.field is not None:
            kw[var.field] = var.parse(value)
    return Settings(**kw)


def report(environ: Mapping[str, str] | None = None) -> list[dict]:
    """One entry per variable for ``ds4tui doctor``: ``name``, ``value`` (None when unset),
    ``in_force`` ("default: ..." when unset), ``effect``, ``error`` (the :class:`BadVariable`
    message, or None), ``ignored`` (why a value set is not used: a relative XDG_CACHE_HOME; or None) and
    ``problem`` (what is wrong with a value the commands take but that fails where it is used: a
    DS4TUI_GPU_LIB that names no file; or None)."""
    env = os.environ if environ is None else environ
    out = []
    for var in VARIABLES:
        value = env.get(var.name) or None
        error = None
        if value is not None and var.check is not None and not var.check(value):
            error = str(BadVariable(var.name, value, var.accepted or ""))
        problem = var.problem(value) if error is None and value is not None and var.problem is not None else None
        in_force = f"default: {var.default}" if value is None else value
        in_use, ignored = xdg_cache_home(env) if var.name == "XDG_CACHE_HOME" else (None, None)
        if ignored:
            in_force = f"ignored ({value} is a relative path): {in_use} in force"
        out.append({"name": var.name, "value": value, "in_force": in_force, "effect": var.effect,
                    "checked": var.field is not None or var.check is not None, "error": error, "ignored": ignored,
                    "problem": problem})
    return out


def greedy_sampling_notes(temp: float, top_k: int, top_p: float, min_p: float, seed: int) -> list[str]:
    """``[note]`` when sampling flags were given away from their defaults (--top-k 0, --top-p 1,
    --min-p 0, --seed 0) while --temp is 0: greedy decoding takes the argmax and reads none of them;
    [] otherwise.  (``chat`` takes no such note: its temperature can be raised in the app, where the
    others then apply.)"""
    if temp > 0:
        return []
    given = [f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
             for flag, value, default in (("--top-k", top_k, 0), ("--top-p", top_p, 1.0), ("--min-p", min_p, 0.0),
                                          ("--seed", seed, 0)) if value != default]
    if not given:
        return []
    listed = given[0] if len(given) == 1 else ", ".join(given[:-1]) + " and " + given[-1]
    return [f"{listed} {'has' if len(given) == 1 else 'have'} no effect at --temp 0: greedy decoding (the default) "
            f"takes the most likely token (give --temp > 0 to sample)"]


def draft_vocab_notes(settings: "Settings | None", engine) -> list[str]:
    """Notes on the draft vocabulary (spec dspark.md §2.6) that a command prints on stderr: a
    ``--draft-vocab`` choice that has no effect (no support model drafts) and a support file's list
    that could not be used (``auto`` then drafts from the whole vocabulary)."""
    settings = settings or Settings()
    out = _no_drafter_note("--draft-vocab", settings.draft_vocab, engine)
    if getattr(engine, "draft_vocab_problem", ""):
        out.append(engine.draft_vocab_problem)
    return out


def verify_head_notes(settings: "Settings | None", engine) -> list[str]:
    """The note a command prints on stderr for a ``--verify-head`` choice (spec dspark.md §3.4) that
    has no effect because no support model drafts (none given, refused, or the reference backend);
    [] otherwise."""
    return _no_drafter_note("--verify-head", (settings or Settings()).verify_head, engine)


def scheduler_prices_notes(value: "str | None", engine) -> list[str]:
    """The note a command prints on stderr for a ``--scheduler-prices`` the user gave (``value``; None:
    not given) that has no effect because no support model drafts (spec dspark.md §7.4: only a
    session with an attached support model starts from or keeps prices); [] otherwise."""
    return [] if value is None else _no_drafter_note("--scheduler-prices", value, engine)


def _no_drafter_note(flag: str, value: str, engine) -> list[str]:
    """``[note]`` when a DSpark flag other than ``auto`` has no effect because ``engine`` has no
    drafting support model, with what to do: --mtp, except on the reference backend, which never
    attaches one (generate without MODEL leaves the demo's drafter out there); [] otherwise."""
    if value == "auto" or getattr(engine, "support_status", "none") == "attached":
        return []
    why = ("the reference backend does not draft" if getattr(engine, "backend", None) == "reference"
           else "give one with --mtp")
    return [f"{flag} {value} has no effect: no DSpark support model drafts ({why})"]
